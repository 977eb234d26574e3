//! The key table an OSD holds: every entity's data key, caps and generation, as the monitor
//! sends it (`GET /v1/auth/data-keys`, the keys sealed for that OSD). OSDs check handshakes
//! against it and close connections whose entity it no longer holds at the same generation.

use crate::caps::Caps;
use crate::entity::EntityName;
use crate::error::AuthError;
use crate::secret::{open_blob, KeyBinding, Secret};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use fastblock_types::api::AuthDataKeysResponse;
use fastblock_types::auth::AuthMode;
use std::collections::HashMap;

#[derive(Debug, Clone)]
pub struct TableEntry {
    pub data_key: Secret,
    pub caps: Caps,
    pub generation: u64,
}

#[derive(Debug, Clone, Default)]
pub struct KeyTable {
    pub epoch: u64,
    pub mode: AuthMode,
    pub entries: HashMap<EntityName, TableEntry>,
}

impl KeyTable {
    /// Opens the monitor's answer with the OSD's own entity key.
    pub fn from_response(
        resp: &AuthDataKeysResponse,
        own_key: &Secret,
    ) -> Result<KeyTable, AuthError> {
        let mut entries = HashMap::with_capacity(resp.entities.len());
        for e in &resp.entities {
            let entity: EntityName = e.entity.parse()?;
            let sealed = STANDARD.decode(&e.sealed_data_key).map_err(|err| {
                AuthError::Malformed(format!("sealed data key of {entity}: {err}"))
            })?;
            // Bound to its entity, caps, generation and this table's epoch: an entry relabelled
            // (a client's key named `osd.N` with caps `osd`) or taken from an older table does
            // not open.
            let binding = KeyBinding {
                entity: &e.entity,
                caps: &e.caps,
                generation: e.generation,
                epoch: resp.epoch,
            };
            let plain = open_blob(own_key, &sealed, &binding)?;
            let bytes: [u8; 32] = plain.as_slice().try_into().map_err(|_| {
                AuthError::Malformed(format!("data key of {entity} is {} bytes", plain.len()))
            })?;
            entries.insert(
                entity,
                TableEntry {
                    data_key: Secret::from_bytes(bytes),
                    caps: e.caps.parse()?,
                    generation: e.generation,
                },
            );
        }
        Ok(KeyTable {
            epoch: resp.epoch,
            mode: resp.mode,
            entries,
        })
    }

    pub fn data_key(&self, entity: &EntityName) -> Option<Secret> {
        self.entries.get(entity).map(|e| e.data_key.clone())
    }

    /// Whether a connection authenticated as `entity` at `generation` may stay open.
    pub fn still_valid(&self, entity: &EntityName, generation: u64) -> bool {
        self.entries
            .get(entity)
            .is_some_and(|e| e.generation == generation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secret::{seal_blob, KeyBinding};
    use fastblock_types::api::AuthDataKeyEntry;

    #[test]
    fn a_table_opens_with_the_osds_key_only() {
        let osd_key = Secret::generate().unwrap();
        let client_key = Secret::generate().unwrap();
        let resp = AuthDataKeysResponse {
            epoch: 4,
            mode: AuthMode::Sign,
            entities: vec![AuthDataKeyEntry {
                entity: "client.vm".into(),
                caps: "pool=a".into(),
                generation: 2,
                sealed_data_key: STANDARD.encode(
                    seal_blob(
                        &osd_key,
                        client_key.data_key().as_bytes(),
                        &KeyBinding {
                            entity: "client.vm",
                            caps: "pool=a",
                            generation: 2,
                            epoch: 4,
                        },
                    )
                    .unwrap(),
                ),
            }],
        };
        let t = KeyTable::from_response(&resp, &osd_key).unwrap();
        let vm: EntityName = "client.vm".parse().unwrap();
        assert_eq!(t.data_key(&vm), Some(client_key.data_key()));
        assert!(t.still_valid(&vm, 2) && !t.still_valid(&vm, 1));
        assert!(!t.still_valid(&EntityName::admin(), 0));
        assert!(KeyTable::from_response(&resp, &Secret::generate().unwrap()).is_err());
        // Relabelled as an OSD with caps osd, or replayed as another table: refused.
        let mut relabelled = resp.clone();
        relabelled.entities[0].entity = "osd.3".into();
        relabelled.entities[0].caps = "osd".into();
        assert!(KeyTable::from_response(&relabelled, &osd_key).is_err());
        let mut replayed = resp.clone();
        replayed.epoch = 5;
        assert!(KeyTable::from_response(&replayed, &osd_key).is_err());
    }
}

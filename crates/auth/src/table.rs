//! The entity table an OSD holds: every entity's caps and generation, no keys, as the monitor
//! sends it (`GET /v1/auth/entities`, in an answer signed for that OSD and bound to its call).
//! OSDs judge tickets against it ([`EntityTable::judge`]: a ticket issued before a rotation,
//! a change of caps or a removal the table knows of is refused) and close connections whose
//! entity it no longer holds at the same generation and caps.

use crate::caps::Caps;
use crate::entity::EntityName;
use crate::error::AuthError;
use crate::ticket::TicketClaims;
use fastblock_types::api::AuthEntitiesResponse;
use fastblock_types::auth::AuthMode;
use std::collections::HashMap;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableEntry {
    pub caps: Caps,
    pub generation: u64,
}

#[derive(Debug, Clone, Default)]
pub struct EntityTable {
    /// The key table's epoch (`auth.epoch` of the map) this was read at.
    pub epoch: u64,
    pub mode: AuthMode,
    pub entries: HashMap<EntityName, TableEntry>,
}

/// Why a ticket that opened is still refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TicketRefusal {
    /// Issued before a rotation or a change of caps this table knows of: the holder may get a
    /// new one (if it still holds a valid key). Retryable.
    Stale(String),
    /// Its entity was removed (or never existed at this table's epoch). Final.
    Revoked(String),
}

impl EntityTable {
    pub fn from_response(resp: &AuthEntitiesResponse) -> Result<EntityTable, AuthError> {
        let mut entries = HashMap::with_capacity(resp.entities.len());
        for e in &resp.entities {
            let entity: EntityName = e.entity.parse()?;
            entries.insert(
                entity,
                TableEntry {
                    caps: e.caps.parse()?,
                    generation: e.generation,
                },
            );
        }
        Ok(EntityTable {
            epoch: resp.epoch,
            mode: resp.mode,
            entries,
        })
    }

    /// Whether a ticket that opened at this OSD may be used given what this table knows. A
    /// ticket newer than the table is taken as it is (the monitor issued it after the table
    /// was read; the next table judges the connection again through [`Self::still_valid`]).
    pub fn judge(&self, claims: &TicketClaims) -> Result<(), TicketRefusal> {
        if claims.auth_epoch > self.epoch {
            return Ok(());
        }
        let Some(entry) = self.entries.get(&claims.entity) else {
            return Err(TicketRefusal::Revoked(format!(
                "{} is not in this OSD's key table (epoch {}): removed",
                claims.entity, self.epoch
            )));
        };
        if entry.generation != claims.generation || entry.caps.to_string() != claims.caps {
            return Err(TicketRefusal::Stale(format!(
                "the ticket of {} was issued at key generation {} (table epoch {}); the key table (epoch {}) has generation {}: get a new ticket",
                claims.entity, claims.generation, claims.auth_epoch, self.epoch, entry.generation
            )));
        }
        Ok(())
    }

    /// Whether a connection authenticated as `entity` at `generation` with `caps`, on a ticket
    /// of table epoch `ticket_epoch`, may stay open.
    pub fn still_valid(
        &self,
        entity: &EntityName,
        generation: u64,
        caps: &Caps,
        ticket_epoch: u64,
    ) -> bool {
        ticket_epoch > self.epoch
            || self
                .entries
                .get(entity)
                .is_some_and(|e| e.generation == generation && &e.caps == caps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fastblock_types::api::AuthEntityEntry;
    use fastblock_types::OsdId;

    fn table() -> EntityTable {
        EntityTable::from_response(&AuthEntitiesResponse {
            epoch: 4,
            mode: AuthMode::Sign,
            entities: vec![AuthEntityEntry {
                entity: "client.vm".into(),
                caps: "pool=a".into(),
                generation: 2,
            }],
        })
        .unwrap()
    }

    fn claims(entity: &str, generation: u64, caps: &str, auth_epoch: u64) -> TicketClaims {
        TicketClaims {
            entity: entity.parse().unwrap(),
            caps: caps.into(),
            generation,
            auth_epoch,
            target: OsdId(1),
            expires_unix_s: 0,
        }
    }

    #[test]
    fn tickets_are_judged_against_what_the_table_knows() {
        let t = table();
        assert_eq!(t.judge(&claims("client.vm", 2, "pool=a", 4)), Ok(()));
        assert_eq!(t.judge(&claims("client.vm", 2, "pool=a", 3)), Ok(()));
        // Rotated since (generation 1 was the old key), caps changed, removed.
        assert!(matches!(
            t.judge(&claims("client.vm", 1, "pool=a", 3)),
            Err(TicketRefusal::Stale(_))
        ));
        assert!(matches!(
            t.judge(&claims("client.vm", 2, "pool=*", 4)),
            Err(TicketRefusal::Stale(_))
        ));
        assert!(matches!(
            t.judge(&claims("client.gone", 1, "admin", 4)),
            Err(TicketRefusal::Revoked(_))
        ));
        // Newer than the table: the monitor issued it after; taken.
        assert_eq!(t.judge(&claims("client.new", 1, "admin", 5)), Ok(()));

        let vm: EntityName = "client.vm".parse().unwrap();
        let a: Caps = "pool=a".parse().unwrap();
        assert!(t.still_valid(&vm, 2, &a, 4));
        assert!(!t.still_valid(&vm, 1, &a, 3));
        assert!(!t.still_valid(&vm, 2, &"admin".parse().unwrap(), 4));
        assert!(!t.still_valid(&EntityName::admin(), 1, &a, 4));
        assert!(t.still_valid(&EntityName::admin(), 1, &a, 5));
    }
}

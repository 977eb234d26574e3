//! The key table sealed at rest: each entity's key is stored in etcd encrypted with
//! AES-256-GCM under a key derived from the monitor secret (`crate::secret`), so what etcd
//! holds (its files, its peer traffic, a backup) does not give a key to whoever reads it
//! without the monitors' secret file. `docs/etcd-keys.md` writes the format down byte by byte.
//!
//! The associated data binds the entity name, its caps and its generation: a sealed key moved
//! to another entity, given other caps or put back at another generation does not open, and
//! the load that meets it fails (naming the entity) instead of serving a forged table.
//!
//! The monitor works on the clear form ([`ClearEntity`], what `crate::keys` encodes) and
//! seals at the etcd boundary (`crate::store`, `crate::backup`): each write draws a fresh
//! nonce, so comparing stored values would see a change at every commit; comparing clear
//! forms sees only real ones.

use crate::secret::MonSecret;
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};

/// The first byte of a sealed key: the format, so a later one can be told apart.
pub const SEALED_FORMAT_V1: u8 = 1;
/// The first bytes of the associated data, so it cannot be mistaken for any other use of the
/// key.
pub const AAD_CONTEXT: &[u8] = b"fastblock key table v1";

/// One entity of the key table in clear, as the monitor encodes it and as monitors before
/// the seal stored it: the entity key in base64.
#[derive(Debug, Serialize, Deserialize)]
pub struct ClearEntity {
    pub key: String,
    pub caps: String,
    pub generation: u64,
}

/// One entity as stored by a monitor with the seal: `sealed` is base64 of
/// `format (1) || nonce (12) || AES-256-GCM(key) || tag (16)`.
#[derive(Debug, Serialize, Deserialize)]
struct SealedEntity {
    sealed: String,
    caps: String,
    generation: u64,
}

/// Either stored form; which one is told by the field present.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoredEntity {
    key: Option<String>,
    sealed: Option<String>,
    caps: String,
    generation: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error(
        "entity {entity}: its key was sealed under another monitor secret (or altered in \
         etcd) and does not open with this monitor's (--mon-secret-file); every monitor must \
         be given the same secret file"
    )]
    WrongSecret { entity: String },
    #[error("entity {entity}: its key is sealed but this monitor has no monitor secret")]
    NoSecret { entity: String },
    #[error("entity {entity}: not a key table entry: {reason}")]
    Format { entity: String, reason: String },
    #[error("the operating system's random number generator failed")]
    Random,
}

/// The AES-256-GCM key of the key table, derived from the monitor secret.
pub struct KeyTableSeal {
    key: LessSafeKey,
    rng: SystemRandom,
}

impl std::fmt::Debug for KeyTableSeal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyTableSeal(..)")
    }
}

/// What an entry's associated data is made of: the context, then the entity name and the
/// caps, each after its length (u32, little-endian: the workspace's lints allow no other
/// byte order), then the generation (u64, little-endian).
fn aad(entity: &str, caps: &str, generation: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(AAD_CONTEXT.len() + entity.len() + caps.len() + 16);
    out.extend_from_slice(AAD_CONTEXT);
    for part in [entity, caps] {
        let len = u32::try_from(part.len()).expect("entity names and caps are short");
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(part.as_bytes());
    }
    out.extend_from_slice(&generation.to_le_bytes());
    out
}

impl KeyTableSeal {
    pub fn new(secret: &MonSecret) -> KeyTableSeal {
        let unbound = UnboundKey::new(&AES_256_GCM, &secret.key_table_key())
            .expect("AES-256-GCM takes a 32-byte key");
        KeyTableSeal {
            key: LessSafeKey::new(unbound),
            rng: SystemRandom::new(),
        }
    }

    /// Seals `key` for `entity` with these caps at this generation (base64, as stored).
    pub fn seal(
        &self,
        entity: &str,
        caps: &str,
        generation: u64,
        key: &[u8],
    ) -> Result<String, SealError> {
        let mut nonce = [0u8; NONCE_LEN];
        self.rng.fill(&mut nonce).map_err(|_| SealError::Random)?;
        let mut out = Vec::with_capacity(1 + NONCE_LEN + key.len() + AES_256_GCM.tag_len());
        out.push(SEALED_FORMAT_V1);
        out.extend_from_slice(&nonce);
        let mut body = key.to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad(entity, caps, generation)),
                &mut body,
            )
            .map_err(|_| SealError::Random)?;
        out.extend_from_slice(&body);
        Ok(STANDARD.encode(out))
    }

    /// The key sealed in `sealed` (base64), if it was sealed under this key for exactly this
    /// entity, caps and generation.
    pub fn open(
        &self,
        entity: &str,
        caps: &str,
        generation: u64,
        sealed: &str,
    ) -> Result<Vec<u8>, SealError> {
        let format = |reason: &str| SealError::Format {
            entity: entity.to_string(),
            reason: reason.to_string(),
        };
        let bytes = STANDARD
            .decode(sealed)
            .map_err(|_| format("the sealed key is not base64"))?;
        let min = 1 + NONCE_LEN + aead::AES_256_GCM.tag_len();
        if bytes.len() < min {
            return Err(format("the sealed key is too short"));
        }
        if bytes[0] != SEALED_FORMAT_V1 {
            return Err(format("the sealed key has an unknown format"));
        }
        let nonce: [u8; NONCE_LEN] = bytes[1..1 + NONCE_LEN].try_into().expect("length checked");
        let mut body = bytes[1 + NONCE_LEN..].to_vec();
        let plain = self
            .key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad(entity, caps, generation)),
                &mut body,
            )
            .map_err(|_| SealError::WrongSecret {
                entity: entity.to_string(),
            })?;
        Ok(plain.to_vec())
    }

    /// The stored form of an entity whose clear form (`ClearEntity` JSON) is `clear`.
    pub fn seal_value(&self, entity: &str, clear: &str) -> Result<String, SealError> {
        let c: ClearEntity = serde_json::from_str(clear).map_err(|e| SealError::Format {
            entity: entity.to_string(),
            reason: e.to_string(),
        })?;
        let key = STANDARD.decode(&c.key).map_err(|_| SealError::Format {
            entity: entity.to_string(),
            reason: "the key is not base64".to_string(),
        })?;
        let sealed = SealedEntity {
            sealed: self.seal(entity, &c.caps, c.generation, &key)?,
            caps: c.caps,
            generation: c.generation,
        };
        Ok(serde_json::to_string(&sealed).expect("a sealed entity serializes"))
    }
}

/// An entity's stored value brought to its clear form.
#[derive(Debug)]
pub struct Opened {
    /// `ClearEntity` JSON, as `crate::keys` encodes it.
    pub clear: String,
    /// It was stored in clear (by a monitor before the seal): to be rewritten sealed.
    pub was_clear: bool,
}

/// Opens the stored value of `entity`: a sealed one with `seal`, one in clear (written before
/// the seal) as it is.
pub fn open_value(
    seal: Option<&KeyTableSeal>,
    entity: &str,
    stored: &str,
) -> Result<Opened, SealError> {
    let format = |reason: String| SealError::Format {
        entity: entity.to_string(),
        reason,
    };
    let s: StoredEntity = serde_json::from_str(stored).map_err(|e| format(e.to_string()))?;
    let (key, was_clear) = match (s.key, s.sealed) {
        (Some(key), None) => (key, true),
        (None, Some(sealed)) => {
            let seal = seal.ok_or_else(|| SealError::NoSecret {
                entity: entity.to_string(),
            })?;
            let key = seal.open(entity, &s.caps, s.generation, &sealed)?;
            (STANDARD.encode(key), false)
        }
        _ => return Err(format("neither a key nor a sealed key".to_string())),
    };
    let clear = ClearEntity {
        key,
        caps: s.caps,
        generation: s.generation,
    };
    Ok(Opened {
        clear: serde_json::to_string(&clear).expect("an entity serializes"),
        was_clear,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secret::MON_SECRET_BYTES;

    fn seal(byte: u8) -> KeyTableSeal {
        KeyTableSeal::new(&MonSecret::from_bytes([byte; MON_SECRET_BYTES]))
    }

    const CLEAR: &str =
        r#"{"key":"AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA=","caps":"admin","generation":3}"#;

    #[test]
    fn a_sealed_value_opens_to_its_clear_form_and_hides_the_key() {
        let s = seal(1);
        let stored = s.seal_value("client.admin", CLEAR).unwrap();
        assert!(!stored.contains("AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA="));
        let again = s.seal_value("client.admin", CLEAR).unwrap();
        assert_ne!(stored, again, "a fresh nonce per write");
        let opened = open_value(Some(&s), "client.admin", &stored).unwrap();
        assert_eq!(opened.clear, CLEAR);
        assert!(!opened.was_clear);
        let legacy = open_value(Some(&s), "client.admin", CLEAR).unwrap();
        assert_eq!(legacy.clear, CLEAR);
        assert!(legacy.was_clear);
    }

    #[test]
    fn a_sealed_key_does_not_open_elsewhere_or_under_another_secret() {
        let s = seal(1);
        let stored = s.seal_value("client.admin", CLEAR).unwrap();
        let e = open_value(Some(&seal(2)), "client.admin", &stored).unwrap_err();
        assert!(matches!(e, SealError::WrongSecret { .. }), "{e}");
        assert!(e.to_string().contains("--mon-secret-file"), "{e}");
        // Moved to another entity.
        let e = open_value(Some(&s), "client.eve", &stored).unwrap_err();
        assert!(matches!(e, SealError::WrongSecret { .. }), "{e}");
        // Replayed at another generation, or given other caps.
        for (from, to) in [
            (r#""generation":3"#, r#""generation":4"#),
            (r#""caps":"admin""#, r#""caps":"pool=a""#),
        ] {
            let altered = stored.replace(from, to);
            assert_ne!(altered, stored);
            let e = open_value(Some(&s), "client.admin", &altered).unwrap_err();
            assert!(matches!(e, SealError::WrongSecret { .. }), "{e}");
        }
        let e = open_value(None, "client.admin", &stored).unwrap_err();
        assert!(matches!(e, SealError::NoSecret { .. }), "{e}");
    }
}

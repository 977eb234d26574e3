//! The monitor secret: 32 random bytes in a file of mode 0600 (`--mon-secret-file`, default
//! `<data dir>/mon.secret`), the same file on every monitor of a cluster, as Ceph's mon keyring
//! is (`docs/security.md`, "etcd").
//!
//! Nothing uses the secret itself: each use gets its own key derived from it with HKDF-SHA256
//! under a label of its own ([`MonSecret::key_table_key`] seals the key table in etcd,
//! [`MonSecret::etcd_root_password`] is the own etcd's `root` password), so a derived value
//! that leaks (the password, typed into an `etcdctl`) tells nothing of the others.
//!
//! The derivation is standard HKDF (RFC 5869) with the salt [`HKDF_SALT`], so it can be
//! reproduced outside this crate (`scripts/mon-etcdctl.sh` derives the password in python3).

use fastblock_auth::{write_private, Existing, Secret};
use ring::hkdf;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

pub const MON_SECRET_BYTES: usize = fastblock_auth::secret::SECRET_BYTES;
/// HKDF's salt for every derivation from the monitor secret.
pub const HKDF_SALT: &[u8] = b"fastblock monitor secret v1";
/// HKDF info of the key that seals the key table (`crate::key_seal`).
pub const LABEL_KEY_TABLE: &[u8] = b"fastblock key table seal v1";
/// HKDF info of the own etcd member's `root` password (`crate::etcd_auth`).
pub const LABEL_ETCD_ROOT: &[u8] = b"fastblock etcd root password v1";
/// HKDF info of the seed of the Ed25519 key of the etcd members' peer CA (`crate::etcd_tls`).
pub const LABEL_ETCD_PEER_CA: &[u8] = b"fastblock etcd peer ca v1";

#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error(
        "the monitor secret {path} does not exist: with several monitors, copy the file of \
         the first one to every monitor (mode 0600) and give it with --mon-secret-file"
    )]
    Missing { path: PathBuf },
    #[error("reading the monitor secret {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the monitor secret {path} is readable by others (mode {mode:o}): it must be 0600 \
         (chmod 600 {path}), see --mon-secret-file"
    )]
    Permissions { path: PathBuf, mode: u32 },
    #[error(
        "the monitor secret {path} holds {len} bytes, not {MON_SECRET_BYTES}: not a monitor \
         secret (--mon-secret-file)"
    )]
    Length { path: PathBuf, len: usize },
    #[error("creating the monitor secret {path}: {source}")]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the operating system's random number generator failed")]
    Random,
}

/// The secret: a [`Secret`], whose `Debug` never prints it and which is wiped when dropped.
#[derive(Debug)]
pub struct MonSecret(Secret);

impl MonSecret {
    pub fn from_bytes(bytes: [u8; MON_SECRET_BYTES]) -> MonSecret {
        MonSecret(Secret::from_bytes(bytes))
    }

    /// Reads the secret at `path`: a file of exactly [`MON_SECRET_BYTES`] bytes that neither
    /// its group nor others may read.
    pub fn load(path: &Path) -> Result<MonSecret, SecretError> {
        let read = |source| SecretError::Read {
            path: path.to_path_buf(),
            source,
        };
        let meta = match std::fs::metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(SecretError::Missing {
                    path: path.to_path_buf(),
                })
            }
            other => other.map_err(read)?,
        };
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(SecretError::Permissions {
                path: path.to_path_buf(),
                mode,
            });
        }
        let bytes = std::fs::read(path).map_err(read)?;
        let bytes: [u8; MON_SECRET_BYTES] =
            bytes
                .as_slice()
                .try_into()
                .map_err(|_| SecretError::Length {
                    path: path.to_path_buf(),
                    len: bytes.len(),
                })?;
        Ok(MonSecret::from_bytes(bytes))
    }

    /// Reads the secret at `path`, or, if there is none and `may_create`, makes one there
    /// (mode 0600). Only a monitor that is its cluster's sole member may create it: with
    /// several, each would make its own and they could not read each other's key table.
    pub fn load_or_create(path: &Path, may_create: bool) -> Result<MonSecret, SecretError> {
        match MonSecret::load(path) {
            Err(SecretError::Missing { .. }) if may_create => {}
            other => return other,
        }
        let secret = Secret::generate().map_err(|_| SecretError::Random)?;
        let created = write_private(path, secret.as_bytes(), Existing::Keep).map_err(|source| {
            SecretError::Create {
                path: path.to_path_buf(),
                source,
            }
        })?;
        if !created {
            // Another process created it first: read what is there, which is what every
            // later start reads.
            return MonSecret::load(path);
        }
        tracing::warn!(
            path = %path.display(),
            "created a new monitor secret: keep it, every monitor of this cluster needs it"
        );
        MonSecret::load(path)
    }

    /// The AES-256-GCM key that seals the entity keys stored in etcd.
    pub fn key_table_key(&self) -> [u8; 32] {
        self.derive(LABEL_KEY_TABLE)
    }

    /// The password of the own etcd member's `root` user: 64 hex digits.
    pub fn etcd_root_password(&self) -> String {
        self.derive(LABEL_ETCD_ROOT)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// The seed of the Ed25519 key that signs the etcd members' peer certificates: the same
    /// on every monitor of the cluster, so each can issue its own member's certificate and
    /// trust the others' without any file but the secret (`crate::etcd_tls`).
    pub fn etcd_peer_ca_seed(&self) -> [u8; 32] {
        self.derive(LABEL_ETCD_PEER_CA)
    }

    fn derive(&self, label: &[u8]) -> [u8; 32] {
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, HKDF_SALT).extract(self.0.as_bytes());
        let mut out = [0u8; 32];
        prk.expand(&[label], hkdf::HKDF_SHA256)
            .and_then(|okm| okm.fill(&mut out))
            .expect("32 bytes is within HKDF-SHA256's output limit");
        out
    }
}

/// The `root` password of the own etcd of the monitors whose secret is `path`: what a test or
/// a tool gives `etcdctl --user root --password`.
pub fn etcd_root_password(path: &Path) -> Result<String, SecretError> {
    Ok(MonSecret::load(path)?.etcd_root_password())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("mon-secret-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn created_once_with_mode_0600_then_read_back() {
        let d = dir("create");
        let path = d.join("mon.secret");
        assert!(matches!(
            MonSecret::load_or_create(&path, false),
            Err(SecretError::Missing { .. })
        ));
        let first = MonSecret::load_or_create(&path, true).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(meta.len(), MON_SECRET_BYTES as u64);
        let again = MonSecret::load_or_create(&path, true).unwrap();
        assert_eq!(first.0, again.0, "an existing secret is never replaced");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_readable_or_short_file_is_refused() {
        let d = dir("refuse");
        let path = d.join("mon.secret");
        std::fs::write(&path, [7u8; MON_SECRET_BYTES]).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let e = MonSecret::load(&path).unwrap_err();
        assert!(
            matches!(e, SecretError::Permissions { mode: 0o640, .. }),
            "{e}"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(MonSecret::load(&path).is_ok());
        std::fs::write(&path, [7u8; 31]).unwrap();
        let e = MonSecret::load(&path).unwrap_err();
        assert!(matches!(e, SecretError::Length { len: 31, .. }), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// The derivation is RFC 5869 HKDF-SHA256: one block, T(1) = HMAC(PRK, info || 0x01), with
    /// PRK = HMAC(salt, secret), which `scripts/mon-etcdctl.sh` reproduces in python3.
    #[test]
    fn derived_values_are_hkdf_and_distinct_per_label() {
        use ring::hmac;
        let secret = MonSecret::from_bytes([1u8; MON_SECRET_BYTES]);
        let prk = hmac::sign(
            &hmac::Key::new(hmac::HMAC_SHA256, HKDF_SALT),
            secret.0.as_bytes(),
        );
        let prk = hmac::Key::new(hmac::HMAC_SHA256, prk.as_ref());
        let t1 = |label: &[u8]| {
            let mut msg = label.to_vec();
            msg.push(1);
            hmac::sign(&prk, &msg).as_ref().to_vec()
        };
        assert_eq!(secret.key_table_key().to_vec(), t1(LABEL_KEY_TABLE));
        let hex: String = t1(LABEL_ETCD_ROOT)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(secret.etcd_root_password(), hex);
        assert_ne!(t1(LABEL_KEY_TABLE), t1(LABEL_ETCD_ROOT));
    }
}

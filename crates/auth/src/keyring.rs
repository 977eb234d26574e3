//! The keyring file: the keys an entity (or an operator) holds.
//!
//! Format (Ceph's, so operators recognise it), UTF-8 text:
//!
//! ```text
//! # comments start with '#' or ';'
//! [client.admin]
//!     key = 5rVZ2s0c0H3m1o0m4F3y8cB6v7r8a9b0c1d2e3f4g5h=
//!     caps = admin
//! ```
//!
//! One section per entity; `key` is required, `caps` is informational (the monitor's key table
//! decides). The file must not be readable by group or others: a key in a world-readable
//! file is a key everyone on the host has, so such a file is refused with the `chmod` that
//! fixes it. Files are written whole to a temporary file with mode 0600 and renamed over.
//!
//! Where daemons and the CLI look: `--keyring PATH`, else `$FASTBLOCK_KEYRING`, else
//! [`DEFAULT_KEYRING_PATH`].

use crate::caps::Caps;
use crate::entity::EntityName;
use crate::error::AuthError;
use crate::secret::Secret;
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

pub const DEFAULT_KEYRING_PATH: &str = "/etc/fastblock/keyring";
pub const KEYRING_ENV: &str = "FASTBLOCK_KEYRING";
/// Larger files are not keyrings (thousands of entries fit).
const KEYRING_BYTES_MAX: u64 = 4 << 20;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyringEntry {
    pub key: Secret,
    pub caps: Option<Caps>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Keyring {
    pub entries: BTreeMap<EntityName, KeyringEntry>,
}

/// The keyring path to use: the explicit one, else `$FASTBLOCK_KEYRING`, else the default.
pub fn resolve_path(explicit: Option<&Path>) -> PathBuf {
    if let Some(p) = explicit {
        return p.to_path_buf();
    }
    match std::env::var_os(KEYRING_ENV) {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from(DEFAULT_KEYRING_PATH),
    }
}

impl Keyring {
    pub fn single(entity: EntityName, key: Secret, caps: Option<Caps>) -> Keyring {
        let mut k = Keyring::default();
        k.entries.insert(entity, KeyringEntry { key, caps });
        k
    }

    pub fn get(&self, entity: &EntityName) -> Option<&KeyringEntry> {
        self.entries.get(entity)
    }

    /// The key of `entity`, or an error naming the file and the entity.
    pub fn key_for(&self, path: &Path, entity: &EntityName) -> Result<&Secret, AuthError> {
        self.get(entity)
            .map(|e| &e.key)
            .ok_or_else(|| AuthError::NoKeyFor {
                path: path.display().to_string(),
                entity: entity.clone(),
            })
    }

    pub fn parse(text: &str, path: &Path) -> Result<Keyring, AuthError> {
        let err = |line: usize, why: String| AuthError::Keyring {
            path: path.display().to_string(),
            why: format!("line {line}: {why}"),
        };
        let mut ring = Keyring::default();
        let mut current: Option<(EntityName, Option<Secret>, Option<Caps>, usize)> = None;
        let finish = |cur: Option<(EntityName, Option<Secret>, Option<Caps>, usize)>,
                      ring: &mut Keyring|
         -> Result<(), AuthError> {
            if let Some((entity, key, caps, line)) = cur {
                let key = key.ok_or_else(|| err(line, format!("[{entity}] has no key")))?;
                if ring
                    .entries
                    .insert(entity.clone(), KeyringEntry { key, caps })
                    .is_some()
                {
                    return Err(err(line, format!("[{entity}] appears twice")));
                }
            }
            Ok(())
        };
        for (i, raw) in text.lines().enumerate() {
            let line_no = i + 1;
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
                continue;
            }
            if let Some(section) = line.strip_prefix('[') {
                let name = section
                    .strip_suffix(']')
                    .ok_or_else(|| err(line_no, "a section header ends with ']'".into()))?;
                let entity: EntityName = name
                    .trim()
                    .parse()
                    .map_err(|e: AuthError| err(line_no, e.to_string()))?;
                finish(current.take(), &mut ring)?;
                current = Some((entity, None, None, line_no));
                continue;
            }
            let (k, v) = line
                .split_once('=')
                .ok_or_else(|| err(line_no, "expected `key = value`".into()))?;
            let Some(cur) = current.as_mut() else {
                return Err(err(line_no, "a setting before the first [entity]".into()));
            };
            match k.trim() {
                "key" => {
                    cur.1 = Some(
                        Secret::from_base64(v.trim()).map_err(|e| err(line_no, e.to_string()))?,
                    )
                }
                "caps" => {
                    let text = v.trim().trim_matches('"');
                    cur.2 = Some(
                        text.parse()
                            .map_err(|e: AuthError| err(line_no, e.to_string()))?,
                    )
                }
                other => return Err(err(line_no, format!("unknown setting {other:?}"))),
            }
        }
        finish(current.take(), &mut ring)?;
        Ok(ring)
    }

    pub fn to_text(&self) -> String {
        let mut out = String::from("# fastblock keyring: keep it secret (mode 0600)\n");
        for (entity, e) in &self.entries {
            out.push_str(&format!("[{entity}]\n\tkey = {}\n", e.key.to_base64()));
            if let Some(caps) = &e.caps {
                out.push_str(&format!("\tcaps = \"{caps}\"\n"));
            }
        }
        out
    }

    /// Reads a keyring, refusing one that group or others can read.
    pub fn load(path: &Path) -> Result<Keyring, AuthError> {
        let err = |why: String| AuthError::Keyring {
            path: path.display().to_string(),
            why,
        };
        let meta = std::fs::metadata(path).map_err(|e| err(e.to_string()))?;
        if !meta.is_file() {
            return Err(err("not a regular file".into()));
        }
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(err(format!(
                "mode {mode:04o} lets others read the keys; run `chmod 600 {}`",
                path.display()
            )));
        }
        if meta.len() > KEYRING_BYTES_MAX {
            return Err(err(format!(
                "{} bytes is larger than a keyring can be ({KEYRING_BYTES_MAX})",
                meta.len()
            )));
        }
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        Keyring::parse(&text, path)
    }

    /// Writes the keyring with mode 0600 (to a temporary file, synced, then renamed over).
    pub fn save(&self, path: &Path) -> Result<(), AuthError> {
        crate::private_file::write_private(
            path,
            self.to_text().as_bytes(),
            crate::private_file::Existing::Replace,
        )
        .map(|_| ())
        .map_err(|e| AuthError::Keyring {
            path: path.display().to_string(),
            why: e.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("fb-keyring-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_keyring_round_trips_with_mode_0600() {
        let d = tmpdir("rt");
        let p = d.join("keyring");
        let mut ring = Keyring::single(
            EntityName::admin(),
            Secret::generate().unwrap(),
            Some(Caps::admin()),
        );
        ring.entries.insert(
            "osd.2".parse().unwrap(),
            KeyringEntry {
                key: Secret::generate().unwrap(),
                caps: None,
            },
        );
        ring.save(&p).unwrap();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(Keyring::load(&p).unwrap(), ring);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_readable_keyring_and_bad_text_are_refused_with_the_cause() {
        let d = tmpdir("bad");
        let p = d.join("keyring");
        Keyring::single(EntityName::admin(), Secret::generate().unwrap(), None)
            .save(&p)
            .unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = Keyring::load(&p).unwrap_err().to_string();
        assert!(e.contains("chmod 600"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();

        let path = Path::new("k");
        for (text, want) in [
            ("key = x\n", "before the first"),
            ("[client.a]\n", "has no key"),
            ("[client.a]\nkey = AAAA\n", "bytes, expected 32"),
            ("[mon.a]\n", "client.NAME or osd.N"),
            ("[client.a]\ncolour = blue\n", "unknown setting"),
            ("[client.a\n", "ends with ']'"),
        ] {
            let e = Keyring::parse(text, path).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
        let k = Secret::generate().unwrap().to_base64();
        let twice = format!("[client.a]\nkey = {k}\n[client.a]\nkey = {k}\n");
        assert!(Keyring::parse(&twice, path)
            .unwrap_err()
            .to_string()
            .contains("twice"));
    }
}

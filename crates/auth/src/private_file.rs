//! Files only their owner may read (mode 0600): keyrings, the monitor secret, key-table
//! backups. One writer for all of them, so that none is ever seen half-written or, for a
//! moment, with a wider mode: the bytes go to a temporary file in the same directory, created
//! with mode 0600 and synced, which then takes the final name in one step, and the directory
//! is synced so the name survives a crash.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// What to do when the final name is taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Existing {
    /// Replace it (a rename over it): a keyring saved again, a backup rewritten.
    Replace,
    /// Keep it and leave ours (a hard link, which refuses to replace): a secret that several
    /// processes may try to create at once, where the first one must win for all.
    Keep,
}

/// Writes `bytes` to `path` with mode 0600, creating its directory if needed. Returns whether
/// `path` now holds these bytes: false only with [`Existing::Keep`] when a file was there.
pub fn write_private(path: &Path, bytes: &[u8], existing: Existing) -> std::io::Result<bool> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir)?;
    let name = path.file_name().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} is not a file name", path.display()),
        )
    })?;
    let tmp = dir.join(format!(
        ".{}.tmp.{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let _ = std::fs::remove_file(&tmp);
    let placed = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        match existing {
            Existing::Replace => std::fs::rename(&tmp, path).map(|()| true),
            Existing::Keep => match std::fs::hard_link(&tmp, path) {
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
                other => other.map(|()| true),
            },
        }
    })();
    // After a rename there is nothing left under the temporary name; after a link or a
    // failure there is, and it must go.
    let _ = std::fs::remove_file(&tmp);
    let placed = placed?;
    std::fs::File::open(&dir)?.sync_all()?;
    Ok(placed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("fb-private-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn replace_writes_0600_and_replaces() {
        let d = dir("replace");
        let p = d.join("sub").join("keyring");
        assert!(write_private(&p, b"first", Existing::Replace).unwrap());
        assert_eq!(mode(&p), 0o600);
        assert!(write_private(&p, b"second", Existing::Replace).unwrap());
        assert_eq!(std::fs::read(&p).unwrap(), b"second");
        assert_eq!(mode(&p), 0o600);
        let left: Vec<_> = std::fs::read_dir(p.parent().unwrap()).unwrap().collect();
        assert_eq!(left.len(), 1, "a temporary file was left: {left:?}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn keep_never_replaces_what_is_there() {
        let d = dir("keep");
        let p = d.join("mon.secret");
        assert!(write_private(&p, b"first", Existing::Keep).unwrap());
        assert!(!write_private(&p, b"second", Existing::Keep).unwrap());
        assert_eq!(std::fs::read(&p).unwrap(), b"first");
        assert_eq!(mode(&p), 0o600);
        let left: Vec<_> = std::fs::read_dir(&d).unwrap().collect();
        assert_eq!(left.len(), 1, "a temporary file was left: {left:?}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_path_without_a_file_name_is_refused() {
        let e = write_private(Path::new("/"), b"x", Existing::Replace).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    }
}

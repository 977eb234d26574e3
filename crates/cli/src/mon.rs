//! `mon backup FILE`: a backup of the monitors' state, written so that it is whole or absent
//! and readable by its owner only (it holds the key table).

use crate::command::{Command, Invocation, Style};
use anyhow::{Context, Result};
use fastblock_monclient::MonClient;
use fastblock_types::units::format_size;
use std::io::Write;
use std::path::Path;

pub async fn execute(inv: &Invocation, client: &MonClient, out: &mut dyn Write) -> Result<()> {
    let Command::MonBackup(file) = &inv.command else {
        unreachable!("mon::execute called with {:?}", inv.command);
    };
    let backup = client.mon_backup().await?;
    let text = serde_json::to_vec_pretty(&backup).expect("a backup serializes");
    write_private(file, &text)?;
    match inv.style {
        Style::Json => writeln!(
            out,
            "{}",
            serde_json::json!({
                "file": file,
                "epoch": backup.epoch,
                "revision": backup.revision,
                "keys": backup.keys.len(),
                "bytes": text.len(),
                "taken_unix_ms": backup.taken_unix_ms,
            })
        )?,
        _ => writeln!(
            out,
            "backed up epoch {} (etcd revision {}): {} keys, {} to {}",
            backup.epoch,
            backup.revision,
            backup.keys.len(),
            format_size(text.len() as u64),
            file.display()
        )?,
    }
    Ok(())
}

/// Writes `bytes` to `path` with mode 0600: into a new file beside it, synced, then renamed
/// over `path` and the directory synced, so that a crash leaves the old file or the new one,
/// never a part.
fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    fastblock_auth::write_private(path, bytes, fastblock_auth::Existing::Replace)
        .map(|_| ())
        .with_context(|| format!("writing the backup to {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::write_private;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_file_is_private_and_replaced_whole() {
        let dir = std::env::temp_dir().join(format!("mon-backup-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("backup.json");
        write_private(&path, b"first").unwrap();
        write_private(&path, b"second").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(left.len(), 1, "no temporary file left: {left:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

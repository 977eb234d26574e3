//! The OSD's identity beside its data: `<data>.osd.json` = `{"format":1,"id":N,"uuid":"..",
//! "shards":S}`. Written once by `--mkfs` (durably: temp file, fsync, rename, fsync dir) and
//! read at every start; the store's superblock holds the same uuid, so a swapped disk or a
//! stale identity file is caught before the OSD boots.

use anyhow::{bail, Context, Result};
use fastblock_types::OsdId;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    pub format: u32,
    pub id: OsdId,
    pub uuid: String,
    /// Fixed at mkfs: the device is split into this many regions, one store per shard.
    pub shards: u32,
}

pub fn identity_path(data: &Path) -> PathBuf {
    let mut p = data.as_os_str().to_owned();
    p.push(".osd.json");
    PathBuf::from(p)
}

impl Identity {
    pub fn load(data: &Path) -> Result<Identity> {
        let path = identity_path(data);
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "reading {} (was the OSD created with --mkfs?)",
                path.display()
            )
        })?;
        let id: Identity =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        if id.format != 1 {
            bail!(
                "{}: unsupported identity format {}",
                path.display(),
                id.format
            );
        }
        if id.shards == 0 || id.id.0 == 0 {
            bail!("{}: invalid identity {id:?}", path.display());
        }
        Ok(id)
    }

    pub fn save(&self, data: &Path) -> Result<()> {
        let path = identity_path(data);
        let tmp = path.with_extension("json.tmp");
        let mut f =
            std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        f.write_all(serde_json::to_string_pretty(self)?.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        let dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        std::fs::File::open(dir)?.sync_all()?;
        Ok(())
    }

    pub fn uuid_bytes(&self) -> Result<[u8; 16]> {
        Ok(*uuid::Uuid::parse_str(&self.uuid)
            .with_context(|| format!("invalid uuid {}", self.uuid))?
            .as_bytes())
    }
}

//! The OSD's own key and the entity table it checks peers against.
//!
//! `mkfs` writes the OSD's keyring beside its identity (`<data>.keyring`, mode 0600, entity
//! `osd.N`); the daemon signs its monitor calls with it, opens the tickets peers present with
//! the service key derived from it, and asks the monitor for its own tickets to other OSDs.
//! It holds no other entity's key. The control task fetches the entity table (caps and
//! generations, no keys) whenever the map's `auth.epoch` moves and publishes it through a
//! [`SharedKeyTable`], which the shards read to judge tickets and close revoked connections.

use anyhow::{Context, Result};
use fastblock_auth::{EntityName, EntityTable, Keyring, Secret};
use fastblock_types::OsdId;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

/// The current entity table, replaced whole (readers clone the inner `Arc` and drop the lock).
pub type SharedKeyTable = Arc<RwLock<Arc<EntityTable>>>;

pub fn new_shared() -> SharedKeyTable {
    Arc::new(RwLock::new(Arc::new(EntityTable::default())))
}

/// The table now.
pub fn current(shared: &SharedKeyTable) -> Arc<EntityTable> {
    shared.read().unwrap_or_else(|p| p.into_inner()).clone()
}

pub fn publish(shared: &SharedKeyTable, table: EntityTable) {
    *shared.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(table);
}

/// `<data>.keyring`: where mkfs writes the OSD's key.
pub fn keyring_path(data: &Path) -> PathBuf {
    let mut p = data.as_os_str().to_owned();
    p.push(".keyring");
    PathBuf::from(p)
}

/// The OSD's credentials: `osd.N`'s key from `explicit` or `<data>.keyring`. `None` if
/// neither file exists (a cluster in auth mode `none`; the monitor says so if it needs one).
pub fn osd_credentials(
    data: &Path,
    explicit: Option<&Path>,
    id: OsdId,
) -> Result<Option<(EntityName, Secret)>> {
    let path = explicit.map_or_else(|| keyring_path(data), Path::to_path_buf);
    if explicit.is_none() && !path.exists() {
        return Ok(None);
    }
    let entity = EntityName::Osd(id);
    let ring = Keyring::load(&path)?;
    let key = ring
        .key_for(&path, &entity)
        .with_context(|| format!("loading the key of {entity}"))?
        .clone();
    Ok(Some((entity, key)))
}

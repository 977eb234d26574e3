//! The key table the OSD checks data-plane handshakes against, shared by the control task
//! (which refreshes it from the monitor when the map's `auth.epoch` moves) and the shards
//! (which read it at every handshake, and close connections it no longer allows).

use fastblock_auth::KeyTable;
use std::sync::{Arc, RwLock};

/// Replaced whole on every refresh: readers take the inner `Arc` and never hold the lock.
pub type SharedKeyTable = Arc<RwLock<Arc<KeyTable>>>;

/// An empty table (no entity can authenticate until the first refresh).
pub fn empty() -> SharedKeyTable {
    Arc::new(RwLock::new(Arc::new(KeyTable::default())))
}

/// The current table.
pub fn current(keys: &SharedKeyTable) -> Arc<KeyTable> {
    keys.read()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .clone()
}

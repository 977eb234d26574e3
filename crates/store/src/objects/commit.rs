//! The metadata half of a flush, as a value that can run on another thread.
//!
//! A flush makes applied state durable in two steps: the data blocks (written, then one
//! fdatasync), then one redb commit of the changed block map, object sizes, applied indexes,
//! snapshot records and the WAL's durable LSN. The redb commit writes one 4 KiB page per
//! touched B-tree node and syncs the metadata file: a few milliseconds for 200 ms of random
//! 4 KiB writes on the test VM, all of it a stall of the shard thread when done inline. So
//! [`Objects::flush_prepare`] copies the changes into a [`MetaCommit`], [`MetaCommit::run`]
//! runs anywhere (the store's flusher thread), and [`Objects::flush_finish`] takes it back.
//!
//! While the commit runs, the owning thread keeps applying. Its dirty maps are left as they
//! are (they still overlay the flushed map for every read, whatever state redb is in), so no
//! read ever sees a half-committed map. `flush_finish` then drops from the dirty maps exactly
//! the entries whose value is still the one committed: an entry changed again meanwhile stays
//! dirty for the next flush. Blocks freed before the prepare are released at the finish, when
//! the map that no longer references them is durable; blocks freed later wait for the next
//! flush.
//!
//! The block cache (`block_cache.rs`) holds flushed entries, and only this commit changes the
//! flushed map, so `flush_finish` gives every block-map key the commit wrote its committed
//! value there. While the commit runs, the cache may hold a key's old value, but the key is
//! dirty until the finish, and lookups ask the dirty map first.

use super::image_snaps::SnapBlockKey;
use super::meta;
use super::{BlockKey, BlockVal, ObjKey, Objects};
use crate::error::Result;
use fastblock_types::PgId;
use redb::Database;
use std::collections::BTreeMap;
use std::sync::Arc;

/// One prepared metadata commit (see the module doc). `Send`: built and finished on the
/// owning thread, run on any.
pub struct MetaCommit {
    db: Arc<Database>,
    blocks: BTreeMap<BlockKey, Option<BlockVal>>,
    objects: BTreeMap<ObjKey, Option<u64>>,
    applied: BTreeMap<u64, Option<u64>>,
    snapshots: BTreeMap<u64, Option<Vec<u8>>>,
    snap_blocks: BTreeMap<SnapBlockKey, Option<BlockVal>>,
    image_snaps: BTreeMap<(u64, u64), Option<Vec<u8>>>,
    copied: BTreeMap<ObjKey, Option<()>>,
    wal_durable_lsn: u64,
    /// Blocks the committed map no longer references: free once it is durable.
    free: Vec<u64>,
    /// The applied indexes the commit makes durable (`flushed_applied_index` afterwards).
    applied_index: BTreeMap<PgId, u64>,
}

impl MetaCommit {
    /// Writes the changes in one redb transaction and commits it (durably). Touches nothing
    /// but the database, so it may run while the owner keeps applying.
    pub fn run(&self) -> Result<()> {
        let tx = self.db.begin_write()?;
        {
            let mut blocks = tx.open_table(meta::BLOCKS)?;
            for (k, v) in &self.blocks {
                match v {
                    Some(v) => blocks.insert(k, v)?,
                    None => blocks.remove(k)?,
                };
            }
            let mut objects = tx.open_table(meta::OBJECTS)?;
            for (k, v) in &self.objects {
                match v {
                    Some(v) => objects.insert(k, v)?,
                    None => objects.remove(k)?,
                };
            }
            let mut applied = tx.open_table(meta::APPLIED)?;
            for (k, v) in &self.applied {
                match v {
                    Some(v) => applied.insert(k, v)?,
                    None => applied.remove(k)?,
                };
            }
            let mut snaps = tx.open_table(meta::SNAPSHOTS)?;
            for (k, v) in &self.snapshots {
                match v {
                    Some(v) => snaps.insert(k, v.as_slice())?,
                    None => snaps.remove(k)?,
                };
            }
            let mut kept = tx.open_table(meta::SNAP_BLOCKS)?;
            for (k, v) in &self.snap_blocks {
                match v {
                    Some(v) => kept.insert(k, v)?,
                    None => kept.remove(k)?,
                };
            }
            let mut states = tx.open_table(meta::IMAGE_SNAPS)?;
            for (k, v) in &self.image_snaps {
                match v {
                    Some(v) => states.insert(k, v.as_slice())?,
                    None => states.remove(k)?,
                };
            }
            let mut copied = tx.open_table(meta::COPIED)?;
            for (k, v) in &self.copied {
                match v {
                    Some(()) => copied.insert(k, 1u8)?,
                    None => copied.remove(k)?,
                };
            }
            let mut m = tx.open_table(meta::META)?;
            m.insert(
                meta::KEY_FLUSHED_LSN,
                &self.wal_durable_lsn.to_le_bytes()[..],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Block-map entries the commit writes (metrics: how much a flush carries).
    pub fn block_entries(&self) -> usize {
        self.blocks.len()
    }
}

/// Removes from `dirty` the entries whose value is still the committed one.
fn settle<K: Ord, V: PartialEq>(dirty: &mut BTreeMap<K, V>, committed: BTreeMap<K, V>) {
    for (k, v) in committed {
        if dirty.get(&k) == Some(&v) {
            dirty.remove(&k);
        }
    }
}

impl Objects {
    /// Step 1 of a flush, on the owning thread: writes the staged data and syncs it (the
    /// commit must not reference blocks that are not durable), then copies the changes into
    /// a [`MetaCommit`]. At most one may be outstanding.
    pub fn flush_prepare(
        &mut self,
        disk: &mut dyn crate::disk::Disk,
        wal_durable_lsn: u64,
    ) -> Result<MetaCommit> {
        assert!(
            !self.commit_outstanding,
            "a metadata commit is already outstanding"
        );
        self.submit_staged(disk, true)?;
        self.commit_outstanding = true;
        self.committing_free_blocks = self.pending_free.len() as u64;
        Ok(MetaCommit {
            db: self.db.clone(),
            blocks: self.dirty_blocks.clone(),
            objects: self.dirty_objects.clone(),
            applied: self.dirty_applied.clone(),
            snapshots: self.dirty_snapshots.clone(),
            snap_blocks: self.dirty_snap_blocks.clone(),
            image_snaps: self.dirty_image_snaps.clone(),
            copied: self.dirty_copied.clone(),
            wal_durable_lsn,
            free: std::mem::take(&mut self.pending_free),
            applied_index: self.applied.clone(),
        })
    }

    /// Step 3, after [`MetaCommit::run`] succeeded: the committed block-map entries become
    /// the block cache's values, the committed entries leave the dirty maps, the blocks the
    /// old map referenced are freed, and the flushed applied indexes advance.
    pub fn flush_finish(&mut self, commit: MetaCommit) {
        assert!(self.commit_outstanding, "no metadata commit outstanding");
        self.commit_outstanding = false;
        self.committing_free_blocks = 0;
        // The cached read view predates the commit; reads must see the new map once the
        // entries it holds leave the dirty maps.
        self.blocks_view = None;
        self.snap_blocks_view = None;
        let MetaCommit {
            blocks,
            objects,
            applied,
            snapshots,
            snap_blocks,
            image_snaps,
            copied,
            free,
            applied_index,
            ..
        } = commit;
        // The cache holds flushed values, and these are now flushed (an entry changed again
        // since the prepare stays dirty below and hides its cached value until the next).
        for (k, v) in &blocks {
            self.block_cache.update(k, *v);
        }
        settle(&mut self.dirty_blocks, blocks);
        settle(&mut self.dirty_objects, objects);
        settle(&mut self.dirty_applied, applied);
        settle(&mut self.dirty_snapshots, snapshots);
        settle(&mut self.dirty_snap_blocks, snap_blocks);
        settle(&mut self.dirty_image_snaps, image_snaps);
        settle(&mut self.dirty_copied, copied);
        for b in free {
            self.alloc.free(b);
        }
        self.flushed_applied = applied_index;
    }

    /// Whether a prepared commit has not been finished yet.
    pub fn commit_outstanding(&self) -> bool {
        self.commit_outstanding
    }
}

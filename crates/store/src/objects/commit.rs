//! The metadata half of a flush, as a value that can run on another thread.
//!
//! A flush makes applied state durable in two steps: the data blocks (written, then one
//! fdatasync), then one redb commit of the changed block map, object sizes, applied indexes,
//! snapshot records and the WAL's durable LSN. The redb commit writes one 4 KiB page per
//! touched B-tree node and syncs the metadata file: a few milliseconds for 200 ms of random
//! 4 KiB writes on the test VM, all of it a stall of the shard thread when done inline. So
//! [`Objects::flush_prepare`] takes the changes into a [`MetaCommit`], [`MetaCommit::run`]
//! runs anywhere (the store's flusher thread; with a disk that can sync from there, it syncs
//! the data first), and [`Objects::flush_finish`] takes it back.
//!
//! While the commit runs, the owning thread keeps applying. The prepare takes the dirty maps
//! whole, without copying them; the block-map changes stay visible to every read as the
//! committing layer of their [`Overlay`](super::overlay::Overlay), under the changes applied
//! since, whatever state redb is in, so no read ever sees a half-committed map.
//! `flush_finish` drops that layer: an entry changed again meanwhile is in the newer layer
//! for the next flush. The other dirty maps are written only by flushes, never read, so the
//! prepare simply takes them. Blocks freed before the prepare are released at the finish,
//! when the map that no longer references them is durable; blocks freed later wait for the
//! next flush.
//!
//! The block cache (`block_cache.rs`) holds flushed entries, and only this commit changes the
//! flushed map, so `flush_finish` gives every block-map key the commit wrote its committed
//! value there. While the commit runs, the cache may hold a key's old value, but the key is
//! in the committing layer until the finish, and lookups ask both layers first.

use super::image_snaps::SnapBlockKey;
use super::meta;
use super::{BlockKey, BlockVal, ObjKey, Objects};
use crate::disk::{DataSync, Disk};
use crate::error::Result;
use crate::wal::writer::io_err;
use fastblock_types::PgId;
use redb::Database;
use std::collections::BTreeMap;
use std::sync::Arc;

/// One prepared metadata commit (see the module doc). `Send`: built and finished on the
/// owning thread, run on any.
pub struct MetaCommit {
    db: Arc<Database>,
    /// Shared with the committing layer of the owner's overlay until the finish.
    blocks: Arc<BTreeMap<BlockKey, Option<BlockVal>>>,
    objects: BTreeMap<ObjKey, Option<u64>>,
    applied: BTreeMap<u64, Option<u64>>,
    snapshots: BTreeMap<u64, Option<Vec<u8>>>,
    snap_blocks: Arc<BTreeMap<SnapBlockKey, Option<BlockVal>>>,
    image_snaps: BTreeMap<(u64, u64), Option<Vec<u8>>>,
    copied: BTreeMap<ObjKey, Option<()>>,
    wal_durable_lsn: u64,
    /// Makes the data blocks the commit references durable, before the commit (`None`: the
    /// prepare synced them already).
    data_sync: Option<Box<dyn DataSync>>,
    /// Blocks the committed map no longer references: free once it is durable.
    free: Vec<u64>,
    /// The applied indexes the commit makes durable (`flushed_applied_index` afterwards).
    applied_index: BTreeMap<PgId, u64>,
}

impl MetaCommit {
    /// Syncs the data the commit references (if the prepare left that to it), then writes
    /// the changes in one redb transaction and commits it (durably). Touches nothing but the
    /// database and the device's sync, so it may run while the owner keeps applying.
    pub fn run(&mut self) -> Result<()> {
        if let Some(sync) = self.data_sync.as_mut() {
            sync.sync().map_err(|e| io_err("data sync", 0, e))?;
        }
        let tx = self.db.begin_write()?;
        {
            let mut blocks = tx.open_table(meta::BLOCKS)?;
            for (k, v) in self.blocks.iter() {
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
            for (k, v) in self.snap_blocks.iter() {
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

impl Objects {
    /// Step 1 of a flush, on the owning thread: writes the staged data (the commit must not
    /// reference blocks that are not durable), then takes the changes into a [`MetaCommit`].
    /// The data's sync is the commit's first step when the disk can sync from another thread
    /// ([`Disk::data_sync`]); the staged data then goes out as a background write, and the
    /// commit may run only once the background writes started so far completed (the caller
    /// checks [`Disk::background_written`] with the mark it takes right after, or waits). Otherwise it is written and synced here. At most
    /// one may be outstanding.
    pub fn flush_prepare(
        &mut self,
        disk: &mut dyn Disk,
        wal_durable_lsn: u64,
    ) -> Result<MetaCommit> {
        assert!(
            !self.commit_outstanding,
            "a metadata commit is already outstanding"
        );
        let data_sync = disk.data_sync();
        match data_sync {
            // The handle's sync covers completed writes only: the caller waits for the
            // background writes (`Disk::background_written`) before the commit runs.
            Some(_) if self.background_writes => {
                if !self.stage.runs.is_empty() {
                    self.stage_out(disk)?;
                }
            }
            Some(_) => self.submit_staged(disk, false)?,
            None => self.submit_staged(disk, true)?,
        }
        self.commit_outstanding = true;
        self.committing_free_blocks = self.pending_free.len() as u64;
        Ok(MetaCommit {
            db: self.db.clone(),
            blocks: self.dirty_blocks.begin_commit(),
            objects: std::mem::take(&mut self.dirty_objects),
            applied: std::mem::take(&mut self.dirty_applied),
            snapshots: std::mem::take(&mut self.dirty_snapshots),
            snap_blocks: self.dirty_snap_blocks.begin_commit(),
            image_snaps: std::mem::take(&mut self.dirty_image_snaps),
            copied: std::mem::take(&mut self.dirty_copied),
            wal_durable_lsn,
            data_sync,
            free: std::mem::take(&mut self.pending_free),
            applied_index: self.applied.clone(),
        })
    }

    /// Step 3, after [`MetaCommit::run`] succeeded: the committed block-map entries become
    /// the block cache's values, the committing layers go (what they held is the flushed
    /// map now), the blocks the old map referenced are freed, and the flushed applied
    /// indexes advance.
    pub fn flush_finish(&mut self, commit: MetaCommit) {
        assert!(self.commit_outstanding, "no metadata commit outstanding");
        self.commit_outstanding = false;
        self.committing_free_blocks = 0;
        // The cached read view predates the commit; reads must see the new map once its
        // committing layer goes.
        self.blocks_view = None;
        self.snap_blocks_view = None;
        let MetaCommit {
            blocks,
            free,
            applied_index,
            ..
        } = commit;
        // The cache holds flushed values, and these are now flushed (an entry changed again
        // since the prepare is in the newer layer, which hides its cached value until the
        // next flush).
        for (k, v) in blocks.iter() {
            self.block_cache.update(k, *v);
        }
        self.dirty_blocks.end_commit();
        self.dirty_snap_blocks.end_commit();
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

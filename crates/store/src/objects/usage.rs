//! Space accounting, in memory: per (PG, image), the objects of the head, the data blocks the
//! head maps, and the blocks kept for each image snapshot (`image_snaps.rs`).
//!
//! Why counters and not a scan: a PG leader reports its PG's usage with every heartbeat and
//! answers `image info` for every image, and a scan of the block map is as long as the data
//! is large (256 Ki entries per GiB). The counters are rebuilt from the tables at open (which
//! reads them whole anyway, to rebuild the allocator) and follow every change of the head map,
//! the kept map and the object list: `Objects::set_head`, `Objects::set_kept` and the object
//! list's insert and remove are the only places that change them, and
//! [`Objects::verify_usage`] checks them against a full scan (the model-based tests call it).

use super::image_snaps::SnapBlockKey;
use super::{meta, BlockKey, BlockVal, ObjKey, Objects};
use crate::error::{Error, Result};
use crate::wal::record::pg_to_u64;
use fastblock_types::{ImageId, PgId};
use redb::ReadableTable;
use std::collections::BTreeMap;

/// What one image (or a whole PG) holds in one PG, in objects and 4 KiB data blocks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageUsage {
    /// Objects of the head (written or copied up, not deleted).
    pub objects: u64,
    /// Data blocks the head maps.
    pub head_blocks: u64,
    /// Snapshot id -> blocks kept under it: the blocks removing that snapshot alone would
    /// free or hand to an older one (for a whole PG, the ids of several images mix: use
    /// [`ImageUsage::kept_blocks`]).
    pub kept_blocks_by_snap: BTreeMap<u64, u64>,
}

impl ImageUsage {
    /// Blocks kept for snapshots, in all.
    pub fn kept_blocks(&self) -> u64 {
        self.kept_blocks_by_snap.values().sum()
    }

    /// Every data block: the head's and the snapshots'.
    pub fn blocks(&self) -> u64 {
        self.head_blocks + self.kept_blocks()
    }

    fn is_empty(&self) -> bool {
        self.objects == 0 && self.head_blocks == 0 && self.kept_blocks_by_snap.is_empty()
    }
}

/// The counters of every (PG, image) of a store.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Usage {
    by_image: BTreeMap<(u64, u64), ImageUsage>,
}

fn apply(count: &mut u64, delta: i64, what: &str, key: (u64, u64)) {
    let next = count.checked_add_signed(delta);
    *count = next.unwrap_or_else(|| {
        panic!(
            "usage of (pg {:#x}, image {}): {what} {count} {delta:+}",
            key.0, key.1
        )
    });
}

impl Usage {
    fn entry(&mut self, key: (u64, u64)) -> &mut ImageUsage {
        self.by_image.entry(key).or_default()
    }

    fn settle(&mut self, key: (u64, u64)) {
        if self.by_image.get(&key).is_some_and(ImageUsage::is_empty) {
            self.by_image.remove(&key);
        }
    }

    pub(super) fn add_head(&mut self, key: &BlockKey, delta: i64) {
        let k = (key.0, key.1);
        apply(&mut self.entry(k).head_blocks, delta, "head blocks", k);
        self.settle(k);
    }

    pub(super) fn add_kept(&mut self, key: &SnapBlockKey, delta: i64) {
        let k = (key.0, key.1);
        let by_snap = &mut self.entry(k).kept_blocks_by_snap;
        let count = by_snap.entry(key.4).or_insert(0);
        apply(count, delta, "kept blocks", k);
        if *count == 0 {
            by_snap.remove(&key.4);
        }
        self.settle(k);
    }

    pub(super) fn add_object(&mut self, key: &ObjKey, delta: i64) {
        let k = (key.0, key.1);
        apply(&mut self.entry(k).objects, delta, "objects", k);
        self.settle(k);
    }

    /// One image in one PG.
    pub(super) fn image(&self, pg: PgId, image: ImageId) -> ImageUsage {
        self.by_image
            .get(&(pg_to_u64(pg), image.0))
            .cloned()
            .unwrap_or_default()
    }

    /// Every image of one PG, summed (snapshot ids of different images mix in
    /// `kept_blocks_by_snap`; only its sum means something).
    pub(super) fn pg(&self, pg: PgId) -> ImageUsage {
        let p = pg_to_u64(pg);
        let mut sum = ImageUsage::default();
        for u in self.by_image.range((p, 0)..=(p, u64::MAX)).map(|(_, u)| u) {
            sum.objects += u.objects;
            sum.head_blocks += u.head_blocks;
            for (snap, n) in &u.kept_blocks_by_snap {
                *sum.kept_blocks_by_snap.entry(*snap).or_insert(0) += n;
            }
        }
        sum
    }
}

impl Objects {
    /// Changes one head block-map entry from `old` (its current value) to `new`, and the
    /// counters with it. Every change of the head map goes through here.
    pub(super) fn set_head(&mut self, key: BlockKey, old: Option<BlockVal>, new: Option<BlockVal>) {
        let delta = i64::from(new.is_some()) - i64::from(old.is_some());
        if delta != 0 {
            self.usage.add_head(&key, delta);
        }
        self.dirty_blocks.insert(key, new);
    }

    /// Changes one kept entry from `old` (its current value) to `new`, and the counters
    /// with it. Every change of the kept map goes through here.
    pub(super) fn set_kept(
        &mut self,
        key: SnapBlockKey,
        old: Option<BlockVal>,
        new: Option<BlockVal>,
    ) {
        let delta = i64::from(new.is_some()) - i64::from(old.is_some());
        if delta != 0 {
            self.usage.add_kept(&key, delta);
        }
        self.dirty_snap_blocks.insert(key, new);
    }

    /// What `image` holds in `pg`.
    pub fn image_usage(&self, pg: PgId, image: ImageId) -> ImageUsage {
        self.usage.image(pg, image)
    }

    /// What every image holds in `pg`, summed.
    pub fn pg_usage(&self, pg: PgId) -> ImageUsage {
        self.usage.pg(pg)
    }

    /// Counts the tables at open (flushed state: nothing is dirty yet).
    pub(super) fn count_usage(
        tx: &redb::ReadTransaction,
        objects: &BTreeMap<ObjKey, u64>,
    ) -> Result<Usage> {
        let mut usage = Usage::default();
        for row in tx.open_table(meta::BLOCKS)?.iter()? {
            usage.add_head(&row?.0.value(), 1);
        }
        for row in tx.open_table(meta::SNAP_BLOCKS)?.iter()? {
            usage.add_kept(&row?.0.value(), 1);
        }
        for k in objects.keys() {
            usage.add_object(k, 1);
        }
        Ok(usage)
    }

    /// Recounts everything from the tables overlaid with the applied changes and compares
    /// with the counters: an error names the first difference. A full scan: for tests.
    pub fn verify_usage(&self) -> Result<()> {
        let mut head: BTreeMap<BlockKey, Option<BlockVal>> = BTreeMap::new();
        let mut kept: BTreeMap<SnapBlockKey, Option<BlockVal>> = BTreeMap::new();
        {
            let tx = self.db.begin_read()?;
            for row in tx.open_table(meta::BLOCKS)?.iter()? {
                let (k, v) = row?;
                head.insert(k.value(), Some(v.value()));
            }
            for row in tx.open_table(meta::SNAP_BLOCKS)?.iter()? {
                let (k, v) = row?;
                kept.insert(k.value(), Some(v.value()));
            }
        }
        self.dirty_blocks.overlay_all(&mut head);
        self.dirty_snap_blocks.overlay_all(&mut kept);
        let mut scanned = Usage::default();
        for k in head.iter().filter(|(_, v)| v.is_some()).map(|(k, _)| k) {
            scanned.add_head(k, 1);
        }
        for k in kept.iter().filter(|(_, v)| v.is_some()).map(|(k, _)| k) {
            scanned.add_kept(k, 1);
        }
        for k in self.objects.keys() {
            scanned.add_object(k, 1);
        }
        if scanned == self.usage {
            return Ok(());
        }
        let keys: std::collections::BTreeSet<_> = scanned
            .by_image
            .keys()
            .chain(self.usage.by_image.keys())
            .collect();
        for k in keys {
            let (want, have) = (scanned.by_image.get(k), self.usage.by_image.get(k));
            if want != have {
                return Err(Error::Meta(format!(
                    "usage of (pg {:#x}, image {}): counted {have:?}, scanned {want:?}",
                    k.0, k.1
                )));
            }
        }
        unreachable!("the counters differ in no key")
    }
}

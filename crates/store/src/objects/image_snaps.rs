//! Image snapshots in the object store: redirect-on-write, per 4 KiB block.
//!
//! The store is copy-on-write already: every applied write puts its blocks in newly allocated
//! places and frees the old ones after the next flush. A snapshot keeps an old block instead of
//! freeing it: no data is copied when a snapshot is taken, the first write of a block after it
//! moves the old block's map entry (not its data) under the snapshot, and later writes of that
//! block free what they replace as before. `docs/design/snapshots.md` is the reference.
//!
//! State, per (PG, image), applied through the PG's log so that every replica holds the same:
//! - `seq`: the highest snapshot id ever created for the image (ids are given by the monitor,
//!   per image, increasing, never reused); `live`: the snapshots not removed.
//! - Every head block's value carries its **birth**: the image's `seq` when it was written.
//!   A block born at `b` belongs to every snapshot `s > b` taken before it was replaced.
//! - When a head block born at `b` is replaced (write, discard, delete, rollback) while a live
//!   snapshot `s` with `b < s` exists, its entry moves to the `snap_blocks` table under the
//!   largest such `s` (the newest snapshot that sees it), keeping its physical block and
//!   checksum (the checksum covers the block's identity, which does not change).
//! - Reading block `k` of snapshot `t`: the `snap_blocks` entry of `k` with the smallest id
//!   `>= t`, else the head block; if that version was born at or after `t`, the block was a
//!   hole when `t` was taken (every version alive at `t` is kept under `t` or newer, every
//!   older one under an id below `t`).
//! - Removing snapshot `t` moves each entry kept under `t` to the largest live snapshot that
//!   also sees it (its id between the entry's birth and `t`), or frees it.
//!
//! The birth is packed in the high bits of the block map's physical-block field (so the head
//! map's format, the block cache and a store without snapshots are unchanged): bits 0..40
//! are the physical block, bits 40..61 the birth. So a data region holds at most 2^40 blocks
//! (4 PiB) and an image at most [`IMAGE_SNAP_ID_MAX`] snapshot ids.

use super::transfer::{BlockVersion, ChunkVersions};
use super::{block_crc, meta, obj_key, BlockKey, BlockVal, Objects, BS};
use crate::disk::{AlignedBuf, Disk};
use crate::error::{Error, ObjectId, Result};
use crate::wal::record::pg_to_u64;
use fastblock_types::{ImageId, PgId};
use redb::ReadableTable;
use std::collections::{BTreeMap, BTreeSet};

/// Bits of the physical block number in a block-map value.
const PHYS_BITS: u32 = 40;
const PHYS_MASK: u64 = (1 << PHYS_BITS) - 1;
/// Data blocks a store may have: physical block numbers must fit in [`PHYS_BITS`].
pub const DATA_BLOCKS_MAX: u64 = 1 << PHYS_BITS;
/// The highest snapshot id an image may have: the birth must stay below bit 61, which the
/// block cache uses for its own flags.
pub const IMAGE_SNAP_ID_MAX: u64 = (1 << 20) - 1;

pub(super) use super::meta::SnapBlockKey;

/// The physical block of a block-map value.
pub(super) fn phys_of(v: BlockVal) -> u64 {
    v.0 & PHYS_MASK
}

/// The image's snapshot sequence when the block was written.
pub(super) fn birth_of(v: BlockVal) -> u64 {
    (v.0 >> PHYS_BITS) & IMAGE_SNAP_ID_MAX
}

/// Bit of a block-map value marking the copy damaged (`damage.rs`): above the birth, below
/// the block cache's flags.
pub(super) const DAMAGED_BIT: u64 = 1 << 60;
const _: () = assert!(IMAGE_SNAP_ID_MAX << PHYS_BITS < DAMAGED_BIT);

/// Whether the copy is marked damaged: it reads as a checksum mismatch whatever its bytes.
pub(super) fn is_marked_damaged(v: BlockVal) -> bool {
    v.0 & DAMAGED_BIT != 0
}

/// A block-map value for a block at `phys` born at `birth`.
pub(super) fn pack(phys: u64, birth: u64, crc: u32) -> BlockVal {
    debug_assert!(phys <= PHYS_MASK && birth <= IMAGE_SNAP_ID_MAX);
    (phys | (birth << PHYS_BITS), crc)
}

/// The snapshots of one image in one PG.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageSnaps {
    /// The highest snapshot id created (0: none ever).
    pub seq: u64,
    /// Snapshots created and not removed.
    pub live: BTreeSet<u64>,
}

impl ImageSnaps {
    /// Encoding in the `image_snaps` table: seq u64 LE, count u32 LE, then the live ids u64 LE.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(12 + 8 * self.live.len());
        v.extend_from_slice(&self.seq.to_le_bytes());
        v.extend_from_slice(&(self.live.len() as u32).to_le_bytes());
        for s in &self.live {
            v.extend_from_slice(&s.to_le_bytes());
        }
        v
    }

    pub fn decode(bytes: &[u8]) -> Result<ImageSnaps> {
        let bad = || Error::Meta(format!("image snapshot record of {} bytes", bytes.len()));
        if bytes.len() < 12 {
            return Err(bad());
        }
        let seq = u64::from_le_bytes(bytes[0..8].try_into().expect("8 bytes"));
        let count = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes")) as usize;
        if bytes.len() != 12 + 8 * count {
            return Err(bad());
        }
        let live: BTreeSet<u64> = bytes[12..]
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        if live.len() != count || live.last().is_some_and(|l| *l > seq) {
            return Err(bad());
        }
        Ok(ImageSnaps { seq, live })
    }

    /// The snapshot a head block born at `birth` moves to when it is replaced: the newest
    /// live snapshot taken after it was written.
    fn keeper(&self, birth: u64) -> Option<u64> {
        self.live.range(birth + 1..).next_back().copied()
    }
}

impl Objects {
    /// The snapshot state of `image` in `pg`.
    pub fn image_snaps(&self, pg: PgId, image: ImageId) -> ImageSnaps {
        self.image_snaps
            .get(&(pg_to_u64(pg), image.0))
            .cloned()
            .unwrap_or_default()
    }

    /// Images of `pg` with snapshot state, and that state.
    pub fn image_snaps_of_pg(&self, pg: PgId) -> Vec<(ImageId, ImageSnaps)> {
        let p = pg_to_u64(pg);
        self.image_snaps
            .range((p, 0)..=(p, u64::MAX))
            .map(|(k, v)| (ImageId(k.1), v.clone()))
            .collect()
    }

    pub(super) fn set_image_snaps(&mut self, key: (u64, u64), state: ImageSnaps) {
        if state == ImageSnaps::default() {
            self.image_snaps.remove(&key);
            self.dirty_image_snaps.insert(key, None);
        } else {
            self.dirty_image_snaps.insert(key, Some(state.encode()));
            self.image_snaps.insert(key, state);
        }
    }

    /// Takes snapshot `snap` of `image` in `pg`: from now on, a block the image holds is kept
    /// for it when it is replaced. No data moves. Applying the same snapshot again (a log
    /// replay) changes nothing; an id at or below one already created is refused.
    pub fn image_snap_create(&mut self, pg: PgId, image: ImageId, snap: u64) -> Result<()> {
        if snap == 0 || snap > IMAGE_SNAP_ID_MAX {
            return Err(Error::InvalidArgument(format!(
                "snapshot id {snap} of image {image} is outside 1..={IMAGE_SNAP_ID_MAX}"
            )));
        }
        let key = (pg_to_u64(pg), image.0);
        let mut state = self.image_snaps.get(&key).cloned().unwrap_or_default();
        if state.seq == snap && state.live.contains(&snap) {
            return Ok(());
        }
        if snap <= state.seq {
            return Err(Error::InvalidArgument(format!(
                "PG {pg}: snapshot {snap} of image {image} is not newer than snapshot {} taken before",
                state.seq
            )));
        }
        state.seq = snap;
        state.live.insert(snap);
        self.set_image_snaps(key, state);
        Ok(())
    }

    /// Replaces a head block's value: the old block is kept for the newest live snapshot that
    /// sees it, or released. Every path that unmaps or remaps a head block comes here.
    pub(super) fn retire(&mut self, pg: PgId, key: &BlockKey, old: BlockVal) -> Result<()> {
        let keeper = if self.image_snaps.is_empty() {
            None
        } else {
            self.image_snaps
                .get(&(key.0, key.1))
                .and_then(|s| s.keeper(birth_of(old)))
        };
        let Some(snap) = keeper else {
            self.release(pg, phys_of(old));
            return Ok(());
        };
        let sk = (key.0, key.1, key.2, key.3, snap);
        // Already kept: only while the log is replayed over a PG snapshot transfer's copy,
        // which holds the versions the sender kept later on (`design/snapshots.md`,
        // "Catch-up"). The copied version is the one the snapshot saw; the block replaced
        // now may be a merge of a replayed partial write with newer bytes, so it goes.
        if self.kept_value(&sk)?.is_some() {
            self.release(pg, phys_of(old));
            return Ok(());
        }
        self.set_kept(sk, None, Some(old));
        Ok(())
    }

    /// The current value of one kept entry: the applied changes, else the flushed table.
    pub(super) fn kept_value(&mut self, sk: &SnapBlockKey) -> Result<Option<BlockVal>> {
        if let Some(v) = self.dirty_snap_blocks.get(sk) {
            return Ok(*v);
        }
        if self.snap_blocks_view.is_none() {
            self.snap_blocks_view = Some(self.db.begin_read()?.open_table(meta::SNAP_BLOCKS)?);
        }
        let table = self.snap_blocks_view.as_ref().expect("opened");
        Ok(table.get(sk)?.map(|g| g.value()))
    }

    /// The birth of a block written now: the image's snapshot sequence.
    pub(super) fn birth_now(&self, key: &BlockKey) -> u64 {
        if self.image_snaps.is_empty() {
            return 0;
        }
        self.image_snaps.get(&(key.0, key.1)).map_or(0, |s| s.seq)
    }

    /// Every `snap_blocks` entry with a key in `lo..=hi`: flushed table overlaid with the
    /// applied changes.
    pub(super) fn snap_entries(
        &self,
        lo: SnapBlockKey,
        hi: SnapBlockKey,
    ) -> Result<BTreeMap<SnapBlockKey, BlockVal>> {
        let mut map: BTreeMap<SnapBlockKey, Option<BlockVal>> = BTreeMap::new();
        {
            let tx = self.db.begin_read()?;
            let t = tx.open_table(meta::SNAP_BLOCKS)?;
            for row in t.range(lo..=hi)? {
                let (k, v) = row?;
                map.insert(k.value(), Some(v.value()));
            }
        }
        self.dirty_snap_blocks.overlay_range(lo..=hi, &mut map);
        Ok(map
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .collect())
    }

    fn live_snaps(&self, pg: PgId, image: ImageId) -> Result<&ImageSnaps> {
        self.image_snaps
            .get(&(pg_to_u64(pg), image.0))
            .ok_or(Error::NoSuchImageSnap { pg, image, snap: 0 })
    }

    /// What block `key` holds in snapshot `snap` (which must be live): `None` is a hole.
    fn resolve_in_snap(&mut self, key: &BlockKey, snap: u64) -> Result<Option<BlockVal>> {
        Ok(self.resolve_blocks_in_snap(std::slice::from_ref(key), snap)?[0])
    }

    /// [`Objects::resolve_in_snap`] for consecutive blocks of one object, with one scan of
    /// the kept entries and one head lookup for all of them.
    fn resolve_blocks_in_snap(
        &mut self,
        keys: &[BlockKey],
        snap: u64,
    ) -> Result<Vec<Option<BlockVal>>> {
        let (Some(first), Some(last)) = (keys.first(), keys.last()) else {
            return Ok(Vec::new());
        };
        debug_assert!(keys
            .windows(2)
            .all(|w| w[0].3 + 1 == w[1].3 && w[0].2 == w[1].2));
        let kept = self.snap_entries(
            (first.0, first.1, first.2, first.3, snap),
            (last.0, last.1, last.2, last.3, u64::MAX),
        )?;
        // The first version of a block that was still there when `snap` was taken (kept
        // under `snap` or a newer snapshot, else the head) is what `snap` saw, if it was
        // already born then; if it was born later, the block was a hole at `snap`. The scan
        // is in key order, so a block's entries come by increasing snapshot id.
        let mut first_kept: BTreeMap<u32, BlockVal> = BTreeMap::new();
        for (sk, v) in kept.into_iter().filter(|(sk, _)| sk.4 >= snap) {
            first_kept.entry(sk.3).or_insert(v);
        }
        let heads = self.lookup_many(keys)?;
        Ok(keys
            .iter()
            .zip(heads)
            .map(|(k, head)| {
                first_kept
                    .get(&k.3)
                    .copied()
                    .or(head)
                    .filter(|v| birth_of(*v) < snap)
            })
            .collect())
    }

    fn check_live(&self, pg: PgId, image: ImageId, snap: u64) -> Result<()> {
        if self.live_snaps(pg, image)?.live.contains(&snap) {
            Ok(())
        } else {
            Err(Error::NoSuchImageSnap { pg, image, snap })
        }
    }

    /// Reads `buf.len()` bytes at `offset_bytes` of `object` as snapshot `snap` saw them.
    /// Holes read as zeros; every block read is checked against its checksum.
    pub fn read_image_snap(
        &mut self,
        disk: &mut dyn Disk,
        pg: PgId,
        object: ObjectId,
        snap: u64,
        offset_bytes: u64,
        buf: &mut [u8],
    ) -> Result<()> {
        super::check_range(offset_bytes, buf.len() as u64)?;
        self.check_live(pg, object.image, snap)?;
        self.submit_staged(disk, false)?;
        let ok = obj_key(pg, object);
        let end = offset_bytes + buf.len() as u64;
        let keys: Vec<BlockKey> = (offset_bytes / BS..end.div_ceil(BS))
            .map(|b| (ok.0, ok.1, ok.2, b as u32))
            .collect();
        let vals = self.resolve_blocks_in_snap(&keys, snap)?;
        let blocks = self.read_resolved(disk, &keys, &vals)?;
        let used = blocks.scatter(0, offset_bytes, buf);
        assert_eq!(used, keys.len());
        Ok(())
    }

    /// Removes snapshot `snap` of `image` in `pg`: each block kept under it moves to the
    /// newest older live snapshot that also sees it, or is freed (after the next flush).
    /// Removing a snapshot that is not live changes nothing (a replay, or a snapshot whose
    /// creation never reached this PG). Returns the blocks freed.
    pub fn image_snap_remove(&mut self, pg: PgId, image: ImageId, snap: u64) -> Result<u64> {
        let key = (pg_to_u64(pg), image.0);
        let Some(mut state) = self.image_snaps.get(&key).cloned() else {
            return Ok(0);
        };
        if !state.live.remove(&snap) {
            return Ok(0);
        }
        let kept = self.snap_entries(
            (key.0, key.1, 0, 0, 0),
            (key.0, key.1, u64::MAX, u32::MAX, u64::MAX),
        )?;
        let mut freed = 0;
        for (sk, v) in kept.into_iter().filter(|(sk, _)| sk.4 == snap) {
            self.set_kept(sk, Some(v), None);
            match state.live.range(birth_of(v) + 1..snap).next_back() {
                Some(older) => {
                    let to = (sk.0, sk.1, sk.2, sk.3, *older);
                    match self.kept_value(&to)? {
                        None => self.set_kept(to, None, Some(v)),
                        // Two versions of the block kept, under the removed snapshot and
                        // under the older one (only after a catch-up replay, which may keep
                        // a version the sender freed): the older snapshot reads its own, and
                        // no live snapshot reads the other any more.
                        Some(_) => {
                            self.release(pg, phys_of(v));
                            freed += 1;
                        }
                    }
                }
                None => {
                    self.release(pg, phys_of(v));
                    freed += 1;
                }
            }
        }
        self.set_image_snaps(key, state);
        Ok(freed)
    }

    /// Makes the head of `object` what snapshot `snap` holds: every block that differs is
    /// copied from the snapshot into a new block (the replaced head blocks are kept for newer
    /// snapshots or freed, like any write), blocks the snapshot did not have are unmapped.
    /// Returns the blocks copied.
    pub fn image_snap_rollback(
        &mut self,
        disk: &mut dyn Disk,
        pg: PgId,
        object: ObjectId,
        snap: u64,
    ) -> Result<u64> {
        self.check_live(pg, object.image, snap)?;
        let ok = obj_key(pg, object);
        // Blocks the head maps, and blocks kept for this snapshot or a newer one.
        let mut blocks: BTreeSet<u32> = self
            .object_blocks(ok)?
            .into_iter()
            .map(|(k, _)| k.3)
            .collect();
        let kept = self.snap_entries(
            (ok.0, ok.1, ok.2, 0, 0),
            (ok.0, ok.1, ok.2, u32::MAX, u64::MAX),
        )?;
        blocks.extend(kept.keys().filter(|sk| sk.4 >= snap).map(|sk| sk.3));
        // Every change first, so that a full data region refuses the rollback before it
        // changed anything (all replicas then agree that it failed).
        let mut changes: Vec<(BlockKey, Option<BlockVal>, Option<BlockVal>)> = Vec::new();
        let mut end_bytes = 0;
        for b in blocks {
            let key = (ok.0, ok.1, ok.2, b);
            let target = self.resolve_in_snap(&key, snap)?;
            let head = self.lookup_many(std::slice::from_ref(&key))?[0];
            if target.is_some() {
                end_bytes = (u64::from(b) + 1) * BS;
            }
            if target != head {
                changes.push((key, target, head));
            }
        }
        let copies = changes.iter().filter(|c| c.1.is_some()).count() as u64;
        let mut physs = self.allocate_blocks(copies)?.into_iter();
        let mut data = AlignedBuf::zeroed(BS as usize);
        for (key, target, head) in changes {
            let new = match target {
                None => None,
                Some(v) => {
                    self.submit_staged(disk, false)?;
                    match self.read_block(disk, pg, &key, v, &mut data) {
                        Ok(()) => {}
                        // The snapshot's copy here is bad (noted for repair): this block is
                        // marked damaged (a hole gets a damaged block), and the repair brings
                        // what the rollback made of it on the replicas with a good copy.
                        Err(e) if e.bad_block().is_some() => {
                            let marked = match head {
                                Some(h) => super::damage::marked_damaged(h),
                                None => {
                                    let phys = physs.next().expect("one block per copy");
                                    let at = self.stage_block(disk, phys)?;
                                    self.stage.buf[at..at + BS as usize].fill(0);
                                    let zeros = &self.stage.buf[at..at + BS as usize];
                                    let crc = super::damage::damaged_crc(&key, zeros);
                                    pack(phys, self.birth_now(&key), crc)
                                }
                            };
                            self.set_head(key, head, Some(marked));
                            continue;
                        }
                        Err(e) => return Err(e),
                    }
                    let phys = physs.next().expect("one block allocated per copy");
                    let at = self.stage_block(disk, phys)?;
                    self.stage.buf[at..at + BS as usize].copy_from_slice(&data);
                    debug_assert_eq!(block_crc(&key, &data), v.1);
                    Some(pack(phys, self.birth_now(&key), v.1))
                }
            };
            if let Some(old) = head {
                self.retire(pg, &key, old)?;
            }
            self.set_head(key, head, new);
        }
        // Blocks allocated for copies skipped above: never written, never referenced.
        for phys in physs {
            self.alloc.free(phys);
        }
        if end_bytes > 0 {
            self.touch_object(ok, end_bytes);
        }
        Ok(copies)
    }

    /// Drops every snapshot of every image of `pg` and frees the blocks they keep (PG
    /// removal, and a PG about to be replaced by a snapshot install).
    pub(super) fn image_snaps_drop_pg(&mut self, pg: PgId) -> Result<()> {
        self.image_snaps_drop(pg, None)
    }

    /// Drops every snapshot of `image` (or of every image, `None`) in `pg` and frees the
    /// blocks they keep: the image is removed (its snapshots were removed before it; their
    /// trims may still be on their way, and find nothing left to do).
    pub fn image_snaps_drop(&mut self, pg: PgId, image: Option<ImageId>) -> Result<()> {
        let p = pg_to_u64(pg);
        let (lo, hi) = image.map_or((0, u64::MAX), |i| (i.0, i.0));
        let kept = self.snap_entries((p, lo, 0, 0, 0), (p, hi, u64::MAX, u32::MAX, u64::MAX))?;
        for (sk, v) in kept {
            self.set_kept(sk, Some(v), None);
            self.release(pg, phys_of(v));
        }
        let keys: Vec<(u64, u64)> = self
            .image_snaps
            .range((p, lo)..=(p, hi))
            .map(|(k, _)| *k)
            .collect();
        for k in keys {
            self.set_image_snaps(k, ImageSnaps::default());
        }
        Ok(())
    }

    /// What a PG snapshot transfer sends of `object` at `offset_bytes..+len_bytes` (4 KiB
    /// aligned): every version of its blocks, the head's and those kept for image
    /// snapshots, read now (see `transfer.rs` for why at one instant). Every block read is
    /// checked against its checksum.
    pub fn transfer_read(
        &mut self,
        disk: &mut dyn Disk,
        pg: PgId,
        object: ObjectId,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> Result<ChunkVersions> {
        super::check_range(offset_bytes, len_bytes)?;
        if !offset_bytes.is_multiple_of(BS) || !len_bytes.is_multiple_of(BS) || len_bytes == 0 {
            return Err(Error::InvalidArgument(format!(
                "transfer read {offset_bytes}+{len_bytes} is not 4 KiB aligned"
            )));
        }
        self.submit_staged(disk, false)?;
        let ok = obj_key(pg, object);
        let (first, end) = (
            (offset_bytes / BS) as u32,
            ((offset_bytes + len_bytes) / BS) as u32,
        );
        let keys: Vec<BlockKey> = (first..end).map(|b| (ok.0, ok.1, ok.2, b)).collect();
        let mut found: Vec<(BlockKey, u64, BlockVal)> = Vec::new();
        for (k, v) in keys.iter().zip(self.lookup_many(&keys)?) {
            if let Some(v) = v {
                found.push((*k, 0, v));
            }
        }
        let kept = self.snap_entries(
            (ok.0, ok.1, ok.2, first, 0),
            (ok.0, ok.1, ok.2, end - 1, u64::MAX),
        )?;
        for (sk, v) in kept {
            found.push(((sk.0, sk.1, sk.2, sk.3), sk.4, v));
        }
        let mut block = AlignedBuf::zeroed(BS as usize);
        let mut versions = Vec::with_capacity(found.len());
        for (k, snap, v) in found {
            // A bad copy is sent as damaged rather than failing the transfer (the damage is
            // noted: the owner repairs this copy, and the receiver's with it).
            let damaged = match self.read_block(disk, pg, &k, v, &mut block) {
                Ok(()) => false,
                Err(e) if e.bad_block().is_some() => {
                    block.fill(0);
                    true
                }
                Err(e) => return Err(e),
            };
            versions.push(BlockVersion {
                block: k.3,
                birth: u32::try_from(birth_of(v)).expect("births fit 21 bits"),
                snap,
                damaged,
                data: block.to_vec(),
            });
        }
        Ok(ChunkVersions {
            head_exists: self.objects.contains_key(&ok),
            copied: self.copied.contains(&ok),
            len_bytes,
            versions,
        })
    }

    /// Every object of `pg` with blocks kept for image snapshots, and the bytes up to its
    /// last kept block: what a PG snapshot transfer covers besides the head's objects.
    pub fn kept_extents(&self, pg: PgId) -> Result<Vec<(ObjectId, u64)>> {
        let p = pg_to_u64(pg);
        let kept =
            self.snap_entries((p, 0, 0, 0, 0), (p, u64::MAX, u64::MAX, u32::MAX, u64::MAX))?;
        let mut ends: BTreeMap<(u64, u64), u64> = BTreeMap::new();
        for sk in kept.keys() {
            let end = ends.entry((sk.1, sk.2)).or_insert(0);
            *end = (*end).max((u64::from(sk.3) + 1) * BS);
        }
        Ok(ends
            .into_iter()
            .map(|((image, index), end)| {
                let object = ObjectId {
                    image: ImageId(image),
                    index,
                };
                (object, end)
            })
            .collect())
    }

    /// Loads the snapshot tables at open: marks the kept blocks used and returns the state.
    pub(super) fn load_image_snaps(
        tx: &redb::ReadTransaction,
        alloc: &mut super::alloc::Allocator,
    ) -> Result<BTreeMap<(u64, u64), ImageSnaps>> {
        for row in tx.open_table(meta::SNAP_BLOCKS)?.iter()? {
            let (k, v) = row?;
            let phys = phys_of(v.value());
            if phys >= alloc.block_count() {
                return Err(Error::Meta(format!(
                    "snapshot block map points past the data region: {phys}"
                )));
            }
            if !alloc.mark_used(phys) {
                return Err(Error::Meta(format!(
                    "block {phys} is referenced twice ({:?})",
                    k.value()
                )));
            }
        }
        let mut out = BTreeMap::new();
        for row in tx.open_table(meta::IMAGE_SNAPS)?.iter()? {
            let (k, v) = row?;
            out.insert(k.value(), ImageSnaps::decode(v.value())?);
        }
        Ok(out)
    }
}

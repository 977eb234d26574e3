//! The object store: thin, copy-on-write, checksummed 4 KiB blocks in the data region, with
//! the block map in redb.
//!
//! - [`alloc`]: the free-space bitmap (rebuilt from the block map at open).
//! - [`meta`]: redb tables and their keys.
//! - `block_cache`: the hot part of the flushed block map, in memory.
//! - `allocation`: which ranges of an object hold data blocks (block status).
//!
//! Every applied write goes to newly allocated blocks, never over a block that the last
//! flushed metadata references. So the data writes need no sync of their own and may be torn
//! by a crash: until the next flush commits the new block map, the old map (and old blocks)
//! stay valid, and log replay re-applies the writes. Blocks that the new map no longer
//! references are freed only after the flush commits (`pending_free`).
//!
//! Each block's crc32c covers its identity (PG, object, block index) and its 4 KiB, so a
//! misdirected write or read is caught like a bit flip.

pub mod alloc;
mod allocation;
mod block_cache;
mod clones;
mod commit;
mod damage;
mod image_snaps;
pub mod meta;
mod overlay;
mod scrub;
mod snapshot;
pub mod transfer;
mod usage;

pub use block_cache::BlockCacheStats;
pub use commit::MetaCommit;
pub use damage::{DamageCounts, DamagedBlock};
pub use image_snaps::{ImageSnaps, DATA_BLOCKS_MAX, IMAGE_SNAP_ID_MAX};
pub use scrub::{ScrubDigest, ScrubFindings, SCRUB_GROUP_BLOCKS};
pub use snapshot::SnapshotRecord;
pub use usage::ImageUsage;

use crate::disk::{AlignedBuf, BackgroundRun, Disk, ReadOp, WriteOp};
use crate::error::{Error, ObjectId, Result, SpaceArea};
use crate::superblock::Superblock;
use crate::wal::record::pg_to_u64;
use crate::wal::writer::io_err;
use alloc::Allocator;
use block_cache::BlockCache;
use fastblock_types::units::BLOCK_SIZE_BYTES;
use fastblock_types::{ImageId, PgId};
use image_snaps::{pack, phys_of, SnapBlockKey};
use overlay::Overlay;
use redb::{Database, ReadableTable, ReadableTableMetadata};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Objects are at most this large (the largest image object size).
pub const OBJECT_SIZE_MAX_BYTES: u64 = 64 << 20;
const BS: u64 = BLOCK_SIZE_BYTES;

/// The most data space a write (or a copy-up piece) of `len_bytes` at `offset_bytes` takes
/// when applied: every 4 KiB block it touches is written anew (copy-on-write), partial ones
/// included. The shard counts this in flight from admission until the write is answered.
pub fn write_allocates_bytes(offset_bytes: u64, len_bytes: u64) -> u64 {
    if len_bytes == 0 {
        return 0;
    }
    let end = offset_bytes.saturating_add(len_bytes);
    (end.div_ceil(BS) - offset_bytes / BS) * BS
}

/// The most data space a discard or write-zeroes of `len_bytes` at `offset_bytes` takes when
/// applied ([`Objects::zero`]): whole blocks are unmapped, but a partially covered block at
/// either end is rewritten with zeros into a new block, so up to two blocks.
pub fn zero_allocates_bytes(offset_bytes: u64, len_bytes: u64) -> u64 {
    if len_bytes == 0 {
        return 0;
    }
    let end = offset_bytes.saturating_add(len_bytes);
    let (full_lo, full_hi) = (offset_bytes.div_ceil(BS), end / BS);
    if full_lo >= full_hi {
        return write_allocates_bytes(offset_bytes, len_bytes);
    }
    let head = u64::from(offset_bytes < full_lo * BS);
    let tail = u64::from(end > full_hi * BS);
    (head + tail) * BS
}

type BlockKey = (u64, u64, u64, u32);
/// (physical block | birth << 40, crc32c): see `image_snaps.rs` for the birth.
type BlockVal = (u64, u32);
type ObjKey = (u64, u64, u64);

/// Blocks read by [`Objects::read_resolved`], in the order of their keys.
pub(super) struct ResolvedBlocks {
    data: AlignedBuf,
    /// Key index -> block slot in `data`; `usize::MAX`: a hole.
    slot_of: Vec<usize>,
}

impl ResolvedBlocks {
    /// Copies the bytes `offset_bytes..offset_bytes + buf.len()` of one object into `buf`,
    /// from the blocks of keys `first_key..` (one per 4 KiB block the range touches; holes
    /// read as zeros). Returns the keys used.
    pub(super) fn scatter(&self, first_key: usize, offset_bytes: u64, buf: &mut [u8]) -> usize {
        let end = offset_bytes + buf.len() as u64;
        let mut k = first_key;
        for b in offset_bytes / BS..end.div_ceil(BS) {
            let lo = (b * BS).max(offset_bytes);
            let hi = ((b + 1) * BS).min(end);
            let dst = &mut buf[(lo - offset_bytes) as usize..(hi - offset_bytes) as usize];
            match self.slot_of[k] {
                usize::MAX => dst.fill(0),
                n => {
                    let src = n * BS as usize + (lo - b * BS) as usize;
                    dst.copy_from_slice(&self.data[src..src + dst.len()]);
                }
            }
            k += 1;
        }
        k - first_key
    }
}

/// How [`Objects::write_as`] writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum WriteAs {
    /// A client's write: born now, what it replaces kept for the snapshots that see it.
    Write,
    /// A copy-up into a clone's head: parent data, born before every snapshot (birth 0),
    /// replacing only an earlier copy of itself (`clones.rs`).
    CopyUpHead,
}

/// One read of a batch.
pub struct ObjectRead<'a> {
    pub pg: PgId,
    pub object: ObjectId,
    pub offset_bytes: u64,
    pub buf: &'a mut [u8],
}

/// Applied data waiting to be written (contiguous runs of new blocks).
struct Stage {
    buf: AlignedBuf,
    used_bytes: usize,
    /// (physical block, offset in buf, length in bytes)
    runs: Vec<(u64, usize, usize)>,
}

pub struct Objects {
    /// Shared with the flusher thread while a [`MetaCommit`] runs.
    db: Arc<Database>,
    alloc: Allocator,
    data_offset_bytes: u64,
    /// Block-map changes not flushed yet (see `overlay.rs`).
    dirty_blocks: Overlay<BlockKey, Option<BlockVal>>,
    dirty_objects: BTreeMap<ObjKey, Option<u64>>,
    /// Every object and its highest written byte (flushed table + dirty changes), kept in
    /// memory: one small entry per object (256 Ki objects for 1 TiB of 4 MiB objects), so
    /// that applying and listing never read the objects table.
    objects: BTreeMap<ObjKey, u64>,
    /// Flushed block-map entries looked up recently, so that most lookups need no redb
    /// (see `block_cache.rs`; `commit.rs` keeps it in step with each flush).
    block_cache: BlockCache,
    /// A read view of the flushed block map for the cache's misses, reused until the next
    /// flush (opening a read transaction per applied write was measurable).
    blocks_view: Option<redb::ReadOnlyTable<BlockKey, BlockVal>>,
    /// The same for the blocks kept for image snapshots.
    snap_blocks_view: Option<redb::ReadOnlyTable<SnapBlockKey, BlockVal>>,
    dirty_applied: BTreeMap<u64, Option<u64>>,
    applied: BTreeMap<PgId, u64>,
    flushed_applied: BTreeMap<PgId, u64>,
    pending_free: Vec<u64>,
    /// Blocks of the outstanding [`MetaCommit`]'s `free`: no longer pending, not yet free.
    committing_free_blocks: u64,
    stage: Stage,
    /// Write a full stage in the background (see `Disk::write_background`).
    background_writes: bool,
    /// Snapshots being received, per PG: blocks written but referenced by nothing durable
    /// until `snapshot_install` (see `snapshot.rs`).
    receiving: BTreeMap<PgId, snapshot::Receiving>,
    /// Snapshot records to write (Some) or delete (None) at the next flush.
    dirty_snapshots: BTreeMap<u64, Option<Vec<u8>>>,
    /// A [`MetaCommit`] was prepared and not finished (see `commit.rs`).
    commit_outstanding: bool,
    /// Snapshot state per (pg, image), all of it in memory (see `image_snaps.rs`).
    image_snaps: BTreeMap<(u64, u64), image_snaps::ImageSnaps>,
    /// Snapshot states to write (Some, encoded) or delete (None) at the next flush.
    dirty_image_snaps: BTreeMap<(u64, u64), Option<Vec<u8>>>,
    /// Changes to the blocks kept for snapshots, not flushed yet.
    dirty_snap_blocks: Overlay<SnapBlockKey, Option<BlockVal>>,
    /// Objects of clones copied up from their parent (`clones.rs`), and changes to flush.
    copied: std::collections::BTreeSet<ObjKey>,
    dirty_copied: BTreeMap<ObjKey, Option<()>>,
    /// Objects and blocks per (PG, image), kept in step with every change (`usage.rs`).
    usage: usage::Usage,
    /// Bad blocks found and not yet handed to the owner, and the counters (`damage.rs`).
    damage: damage::Damage,
}

fn obj_key(pg: PgId, o: ObjectId) -> ObjKey {
    (pg_to_u64(pg), o.image.get(), o.index)
}

fn block_crc(key: &BlockKey, data: &[u8]) -> u32 {
    let mut id = [0u8; 28];
    id[0..8].copy_from_slice(&key.0.to_le_bytes());
    id[8..16].copy_from_slice(&key.1.to_le_bytes());
    id[16..24].copy_from_slice(&key.2.to_le_bytes());
    id[24..28].copy_from_slice(&key.3.to_le_bytes());
    crc32c::crc32c_append(crc32c::crc32c(&id), data)
}

fn check_range(offset_bytes: u64, len_bytes: u64) -> Result<()> {
    match offset_bytes.checked_add(len_bytes) {
        Some(end) if end <= OBJECT_SIZE_MAX_BYTES => Ok(()),
        _ => Err(Error::InvalidArgument(format!(
            "range {offset_bytes}+{len_bytes} exceeds the object size limit of {OBJECT_SIZE_MAX_BYTES} bytes"
        ))),
    }
}

impl Objects {
    pub fn open(
        db: Database,
        sb: &Superblock,
        stage_bytes_max: usize,
        background_writes: bool,
        block_cache_entries_max: usize,
    ) -> Result<Self> {
        if sb.data_blocks() > DATA_BLOCKS_MAX {
            return Err(Error::InvalidArgument(format!(
                "a data region of {} blocks is more than the {DATA_BLOCKS_MAX} a store can address",
                sb.data_blocks()
            )));
        }
        meta::create_missing_tables(&db)?;
        let mut alloc = Allocator::new(sb.data_blocks());
        let mut applied = BTreeMap::new();
        let mut objects = BTreeMap::new();
        let image_snaps;
        let copied;
        let usage;
        {
            let tx = db.begin_read()?;
            image_snaps = Self::load_image_snaps(&tx, &mut alloc)?;
            copied = Self::load_copied(&tx)?;
            let blocks = tx.open_table(meta::BLOCKS)?;
            for row in blocks.iter()? {
                let (k, v) = row?;
                let phys = phys_of(v.value());
                if phys >= alloc.block_count() {
                    return Err(Error::Meta(format!(
                        "block map points past the data region: {phys}"
                    )));
                }
                if !alloc.mark_used(phys) {
                    return Err(Error::Meta(format!(
                        "block {phys} is referenced twice ({:?})",
                        k.value()
                    )));
                }
            }
            for row in tx.open_table(meta::OBJECTS)?.iter()? {
                let (k, v) = row?;
                objects.insert(k.value(), v.value());
            }
            usage = Self::count_usage(&tx, &objects)?;
            for row in tx.open_table(meta::APPLIED)?.iter()? {
                let (k, v) = row?;
                applied.insert(crate::wal::record::pg_from_u64(k.value()), v.value());
            }
        }
        Ok(Objects {
            db: Arc::new(db),
            alloc,
            data_offset_bytes: sb.data_offset_bytes,
            dirty_blocks: Overlay::new(),
            dirty_objects: BTreeMap::new(),
            objects,
            block_cache: BlockCache::new(block_cache_entries_max),
            blocks_view: None,
            snap_blocks_view: None,
            dirty_applied: BTreeMap::new(),
            flushed_applied: applied.clone(),
            applied,
            pending_free: Vec::new(),
            committing_free_blocks: 0,
            stage: Stage {
                buf: AlignedBuf::zeroed(stage_bytes_max.next_multiple_of(BS as usize)),
                used_bytes: 0,
                runs: Vec::new(),
            },
            background_writes,
            receiving: BTreeMap::new(),
            dirty_snapshots: BTreeMap::new(),
            commit_outstanding: false,
            image_snaps,
            dirty_image_snaps: BTreeMap::new(),
            dirty_snap_blocks: Overlay::new(),
            copied,
            dirty_copied: BTreeMap::new(),
            usage,
            damage: damage::Damage::default(),
        })
    }

    pub fn db(&self) -> &Database {
        &self.db
    }

    pub fn free_blocks(&self) -> u64 {
        self.alloc.free_blocks()
    }

    /// Blocks that flushes will give back: unmapped since the last flush began, and those of
    /// a metadata commit still running (free when it finishes). Counting the latter keeps
    /// free plus pending from dipping while a flush runs.
    pub fn pending_free_blocks(&self) -> u64 {
        self.pending_free.len() as u64 + self.committing_free_blocks
    }

    pub fn applied_index(&self, pg: PgId) -> u64 {
        self.applied.get(&pg).copied().unwrap_or(0)
    }

    pub fn flushed_applied_index(&self, pg: PgId) -> u64 {
        self.flushed_applied.get(&pg).copied().unwrap_or(0)
    }

    pub fn set_applied(&mut self, pg: PgId, index: u64) -> Result<()> {
        let cur = self.applied_index(pg);
        if index < cur {
            return Err(Error::InvalidArgument(format!(
                "PG {pg}: applied index may not go back from {cur} to {index}"
            )));
        }
        self.applied.insert(pg, index);
        self.dirty_applied.insert(pg_to_u64(pg), Some(index));
        Ok(())
    }

    /// The current value of each key: the dirty map's, else the flushed map's (from the
    /// block cache, else from redb, which then fills the cache).
    ///
    /// A key missing from both layers of the dirty map is not in a metadata commit still
    /// running (its layer stays until `flush_finish`), so the flushed value read here is the
    /// same whether the view predates that commit or not.
    fn lookup_many(&mut self, keys: &[BlockKey]) -> Result<Vec<Option<BlockVal>>> {
        let mut out = Vec::with_capacity(keys.len());
        for k in keys {
            if let Some(v) = self.dirty_blocks.get(k) {
                out.push(*v);
                continue;
            }
            if let Some(v) = self.block_cache.get(k) {
                out.push(v);
                continue;
            }
            if self.blocks_view.is_none() {
                self.blocks_view = Some(self.db.begin_read()?.open_table(meta::BLOCKS)?);
            }
            let table = self.blocks_view.as_ref().expect("opened");
            let v = table.get(k)?.map(|g| g.value());
            self.block_cache.fill(*k, v);
            out.push(v);
        }
        Ok(out)
    }

    /// Hits, misses and evictions of the block cache.
    pub fn block_cache_stats(&self) -> BlockCacheStats {
        self.block_cache.stats()
    }

    fn touch_object(&mut self, k: ObjKey, end: u64) {
        let e = self.objects.entry(k).or_insert_with(|| {
            self.usage.add_object(&k, 1);
            0
        });
        *e = (*e).max(end);
        self.dirty_objects.insert(k, Some(*e));
    }

    /// The staged writes as disk operations (handed to the WAL commit so that they share its
    /// submission). Call [`Objects::clear_stage`] after they succeeded.
    pub fn staged_writes(&self) -> Vec<WriteOp<'_>> {
        self.stage
            .runs
            .iter()
            .map(|&(phys, at, len)| WriteOp {
                offset_bytes: self.data_offset_bytes + phys * BS,
                buf: &self.stage.buf[at..at + len],
            })
            .collect()
    }

    pub fn clear_stage(&mut self) {
        self.stage.runs.clear();
        self.stage.used_bytes = 0;
    }

    pub fn submit_staged(&mut self, disk: &mut dyn Disk, sync: bool) -> Result<()> {
        if self.stage.runs.is_empty() && !sync {
            return Ok(());
        }
        let writes = self.staged_writes();
        let at = writes.first().map_or(0, |w| w.offset_bytes);
        disk.write_many(&writes, sync)
            .map_err(|e| io_err("data write", at, e))?;
        self.clear_stage();
        Ok(())
    }

    /// Hands the full stage to the disk as a background write (it streams out while the
    /// WAL keeps committing) and starts a fresh stage buffer.
    fn stage_out(&mut self, disk: &mut dyn Disk) -> Result<()> {
        let cap = self.stage.buf.len();
        let buf = std::mem::replace(&mut self.stage.buf, AlignedBuf::zeroed(cap));
        let runs: Vec<BackgroundRun> = self
            .stage
            .runs
            .drain(..)
            .map(|(phys, at, len)| BackgroundRun {
                buf_offset: at,
                len,
                disk_offset_bytes: self.data_offset_bytes + phys * BS,
            })
            .collect();
        self.stage.used_bytes = 0;
        let at = runs.first().map_or(0, |r| r.disk_offset_bytes);
        disk.write_background(buf, &runs)
            .map_err(|e| io_err("data write", at, e))
    }

    /// Reserves 4 KiB in the stage for physical block `phys`; returns its offset in the
    /// stage buffer.
    fn stage_block(&mut self, disk: &mut dyn Disk, phys: u64) -> Result<usize> {
        if self.stage.used_bytes + BS as usize > self.stage.buf.len() {
            if self.background_writes {
                self.stage_out(disk)?;
            } else {
                self.submit_staged(disk, false)?;
            }
        }
        let at = self.stage.used_bytes;
        self.stage.used_bytes += BS as usize;
        match self.stage.runs.last_mut() {
            Some((p, off, len)) if *p + (*len as u64 / BS) == phys && *off + *len == at => {
                *len += BS as usize;
            }
            _ => self.stage.runs.push((phys, at, BS as usize)),
        }
        Ok(at)
    }

    /// Reads one mapped block from disk and checks it. A bad copy (checksum mismatch, read
    /// error) is noted for repair and returned as [`Error::bad_block`]; the engine goes on.
    fn read_block(
        &mut self,
        disk: &mut dyn Disk,
        pg: PgId,
        key: &BlockKey,
        val: BlockVal,
        out: &mut AlignedBuf,
    ) -> Result<()> {
        debug_assert_eq!(pg_to_u64(pg), key.0, "a block key of another PG");
        // A background write's error surfaces in the next read: it is a write error, fatal.
        disk.wait_background()
            .map_err(|e| io_err("data write", 0, e))?;
        let at = self.data_offset_bytes + phys_of(val) * BS;
        let read = disk.read(at, out);
        self.check_block(key, val, out, read)
    }

    /// What one block read (`read`, into `data`) says of the copy `val` maps `key` to: `Ok`,
    /// or the bad block, noted for repair.
    fn check_block(
        &mut self,
        key: &BlockKey,
        val: BlockVal,
        data: &[u8],
        read: std::io::Result<()>,
    ) -> Result<()> {
        let (phys, crc) = (phys_of(val), val.1);
        let pg = crate::wal::record::pg_from_u64(key.0);
        let object = ObjectId {
            image: ImageId(key.1),
            index: key.2,
        };
        let block_index = u64::from(key.3);
        let err = match read {
            Err(source) => Error::BlockUnreadable {
                pg,
                object,
                block_index,
                physical_block: phys,
                source,
            },
            Ok(()) if image_snaps::is_marked_damaged(val) || block_crc(key, data) != crc => {
                Error::Checksum {
                    pg,
                    object,
                    block_index,
                    physical_block: phys,
                }
            }
            Ok(()) => return Ok(()),
        };
        self.damage.note(&err);
        Err(err)
    }

    /// Allocates `count` data blocks (in as few runs as the free space allows), or refuses
    /// with `NoSpace` before anything changed.
    pub(super) fn allocate_blocks(&mut self, count: u64) -> Result<Vec<u64>> {
        let extents = self.alloc.allocate(count).ok_or(Error::NoSpace {
            area: SpaceArea::Data,
            needed_bytes: count * BS,
            free_bytes: self.alloc.free_blocks() * BS,
        })?;
        Ok(extents
            .iter()
            .flat_map(|e| e.start_block..e.start_block + e.block_count)
            .collect())
    }

    /// Applies a write: new blocks are allocated for every block it touches (partial blocks
    /// are merged with their old content). Not durable until the next flush; replayable.
    pub fn write(
        &mut self,
        disk: &mut dyn Disk,
        pg: PgId,
        object: ObjectId,
        offset_bytes: u64,
        data: &[u8],
    ) -> Result<()> {
        self.write_as(disk, pg, object, offset_bytes, data, WriteAs::Write)
    }

    /// [`Objects::write`], or a copy-up's write into the head (`clones.rs`).
    pub(super) fn write_as(
        &mut self,
        disk: &mut dyn Disk,
        pg: PgId,
        object: ObjectId,
        offset_bytes: u64,
        data: &[u8],
        how: WriteAs,
    ) -> Result<()> {
        let len = data.len() as u64;
        check_range(offset_bytes, len)?;
        if len == 0 {
            return Ok(());
        }
        let (pgk, ok) = (pg_to_u64(pg), obj_key(pg, object));
        let end = offset_bytes + len;
        let first_block = offset_bytes / BS;
        let block_count = end.div_ceil(BS) - first_block;
        let keys: Vec<BlockKey> = (0..block_count)
            .map(|i| (pgk, ok.1, ok.2, (first_block + i) as u32))
            .collect();
        let olds = self.lookup_many(&keys)?;
        // Old content of partially covered edge blocks, read before anything changes. An
        // edge whose copy here is bad cannot be merged: that block is left as it is (still
        // bad, noted for repair), and the repair brings the block as the replicas with a
        // good copy merged it, this write included (`docs/design/repair.md`). Failing the
        // apply instead would fail it again at every replay: a crash loop.
        let mut edges: BTreeMap<u64, AlignedBuf> = BTreeMap::new();
        let mut bad_edges: Vec<u64> = Vec::new();
        for (i, old) in olds.iter().enumerate() {
            let b = first_block + i as u64;
            let covered = offset_bytes <= b * BS && (b + 1) * BS <= end;
            if !covered {
                let mut buf = AlignedBuf::zeroed(BS as usize);
                if let Some(v) = old {
                    self.submit_staged(disk, false)?;
                    match self.read_block(disk, pg, &keys[i], *v, &mut buf) {
                        Ok(()) => {}
                        Err(e) if e.bad_block().is_some() => {
                            bad_edges.push(b);
                            continue;
                        }
                        Err(e) => return Err(e),
                    }
                }
                edges.insert(b, buf);
            }
        }
        let mut physs = self
            .allocate_blocks(block_count - bad_edges.len() as u64)?
            .into_iter();
        let birth = match how {
            WriteAs::Write => self.birth_now(&keys[0]),
            WriteAs::CopyUpHead => 0,
        };
        for i in 0..block_count as usize {
            let b = first_block + i as u64;
            if bad_edges.contains(&b) {
                continue;
            }
            let phys = physs.next().expect("a block allocated per block written");
            let at = self.stage_block(disk, phys)?;
            let dst = &mut self.stage.buf[at..at + BS as usize];
            // A block without an edge entry is covered whole by `data` (copied next), so
            // its stage bytes need no zeroing first.
            if let Some(old) = edges.get(&b) {
                dst.copy_from_slice(old);
            }
            let lo = (b * BS).max(offset_bytes);
            let hi = ((b + 1) * BS).min(end);
            dst[(lo - b * BS) as usize..(hi - b * BS) as usize]
                .copy_from_slice(&data[(lo - offset_bytes) as usize..(hi - offset_bytes) as usize]);
            let crc = block_crc(&keys[i], dst);
            self.set_head(keys[i], olds[i], Some(pack(phys, birth, crc)));
        }
        for (key, old) in keys.iter().zip(&olds) {
            if bad_edges.contains(&u64::from(key.3)) {
                // Left as it was, but surely bad from now on: a copy that read back bad only
                // once (a transient error) would otherwise hold the block without this write
                // and pass its checksum, a lost write (`damage.rs`).
                let old = old.expect("a bad edge block is mapped");
                self.set_head(*key, Some(old), Some(damage::marked_damaged(old)));
                continue;
            }
            match (old, how) {
                (Some(old), WriteAs::Write) => self.retire(pg, key, *old)?,
                // What a copy-up replaces in the head is an earlier copy of the same parent
                // bytes (a copy-up cut short and redone, or raced): no snapshot needs it.
                (Some(old), WriteAs::CopyUpHead) => self.release(pg, phys_of(*old)),
                (None, _) => {}
            }
        }
        self.touch_object(ok, end);
        Ok(())
    }

    /// Discard / write-zeroes: whole blocks are unmapped (space given back at the next
    /// flush), partial blocks are rewritten with zeros. Reads of the range return zeros.
    pub fn zero(
        &mut self,
        disk: &mut dyn Disk,
        pg: PgId,
        object: ObjectId,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> Result<()> {
        check_range(offset_bytes, len_bytes)?;
        if len_bytes == 0 {
            return Ok(());
        }
        let end = offset_bytes + len_bytes;
        let full_lo = offset_bytes.div_ceil(BS);
        let full_hi = end / BS;
        if full_lo >= full_hi {
            return self.write(disk, pg, object, offset_bytes, &vec![0; len_bytes as usize]);
        }
        if offset_bytes < full_lo * BS {
            self.write(
                disk,
                pg,
                object,
                offset_bytes,
                &vec![0; (full_lo * BS - offset_bytes) as usize],
            )?;
        }
        if end > full_hi * BS {
            self.write(
                disk,
                pg,
                object,
                full_hi * BS,
                &vec![0; (end - full_hi * BS) as usize],
            )?;
        }
        let ok = obj_key(pg, object);
        let keys: Vec<BlockKey> = (full_lo..full_hi)
            .map(|b| (ok.0, ok.1, ok.2, b as u32))
            .collect();
        let olds = self.lookup_many(&keys)?;
        for (k, old) in keys.iter().zip(olds) {
            if let Some(old) = old {
                self.retire(pg, k, old)?;
                self.set_head(*k, Some(old), None);
            }
        }
        self.touch_object(ok, end);
        Ok(())
    }

    /// Every mapped block of one object: (key, value), flushed map overlaid with dirty.
    fn object_blocks(&self, ok: ObjKey) -> Result<Vec<(BlockKey, BlockVal)>> {
        let lo = (ok.0, ok.1, ok.2, 0u32);
        let hi = (ok.0, ok.1, ok.2, u32::MAX);
        let mut map: BTreeMap<BlockKey, Option<BlockVal>> = BTreeMap::new();
        {
            let tx = self.db.begin_read()?;
            let t = tx.open_table(meta::BLOCKS)?;
            for row in t.range(lo..=hi)? {
                let (k, v) = row?;
                map.insert(k.value(), Some(v.value()));
            }
        }
        self.dirty_blocks.overlay_range(lo..=hi, &mut map);
        Ok(map
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .collect())
    }

    /// Deletes an object of the head: its blocks are kept for the snapshots that see them,
    /// or freed. A clone's object keeps its copied mark (its snapshots read it from the
    /// clone, not the parent): [`Objects::forget_copies`] drops the marks with the image.
    pub fn delete(&mut self, pg: PgId, object: ObjectId) -> Result<()> {
        let ok = obj_key(pg, object);
        for (k, old) in self.object_blocks(ok)? {
            self.retire(pg, &k, old)?;
            self.set_head(k, Some(old), None);
        }
        if self.objects.remove(&ok).is_some() {
            self.usage.add_object(&ok, -1);
        }
        self.dirty_objects.insert(ok, None);
        Ok(())
    }

    /// Objects of a PG, in (image, index) order.
    pub fn list(&self, pg: PgId) -> Result<Vec<ObjectId>> {
        let p = pg_to_u64(pg);
        let (lo, hi) = ((p, 0u64, 0u64), (p, u64::MAX, u64::MAX));
        Ok(self
            .objects
            .range(lo..=hi)
            .map(|(k, _)| ObjectId {
                image: ImageId(k.1),
                index: k.2,
            })
            .collect())
    }

    /// Objects of `image` in a PG whose index is in `indexes`, with their sizes (highest byte
    /// ever written), in index order.
    pub fn image_objects(
        &self,
        pg: PgId,
        image: ImageId,
        indexes: std::ops::Range<u64>,
    ) -> Vec<(ObjectId, u64)> {
        if indexes.is_empty() {
            return Vec::new();
        }
        let p = pg_to_u64(pg);
        self.sizes_in((p, image.0, indexes.start), (p, image.0, indexes.end - 1))
    }

    /// Objects of a PG with their sizes (highest byte ever written), in (image, index) order.
    pub fn sizes(&self, pg: PgId) -> Vec<(ObjectId, u64)> {
        let p = pg_to_u64(pg);
        self.sizes_in((p, 0, 0), (p, u64::MAX, u64::MAX))
    }

    /// Objects with keys in `lo..=hi` and their sizes, in key order.
    fn sizes_in(&self, lo: (u64, u64, u64), hi: (u64, u64, u64)) -> Vec<(ObjectId, u64)> {
        self.objects
            .range(lo..=hi)
            .map(|(k, end)| {
                let object = ObjectId {
                    image: ImageId(k.1),
                    index: k.2,
                };
                (object, *end)
            })
            .collect()
    }

    /// PGs with an applied index or objects here.
    pub fn pgs_with_state(&self) -> Vec<PgId> {
        let mut pgs: std::collections::BTreeSet<PgId> = self.applied.keys().copied().collect();
        pgs.extend(
            self.objects
                .keys()
                .map(|k| crate::wal::record::pg_from_u64(k.0)),
        );
        pgs.into_iter().collect()
    }

    /// Deletes every object of the PG and forgets its applied index.
    pub fn delete_pg(&mut self, pg: PgId) -> Result<()> {
        // Snapshots first, so that deleting the objects frees their blocks instead of
        // keeping them for a snapshot.
        self.image_snaps_drop_pg(pg)?;
        for o in self.list(pg)? {
            self.delete(pg, o)?;
        }
        self.forget_copies(pg, None);
        self.applied.remove(&pg);
        self.dirty_applied.insert(pg_to_u64(pg), None);
        self.dirty_snapshots.insert(pg_to_u64(pg), None);
        self.snapshot_abort(pg);
        Ok(())
    }

    /// Reads a batch of ranges with one device submission. Unwritten ranges read as zeros;
    /// every block read is checked against its checksum.
    pub fn read_many(&mut self, disk: &mut dyn Disk, reqs: &mut [ObjectRead<'_>]) -> Result<()> {
        self.submit_staged(disk, false)?;
        let mut keys = Vec::new();
        for r in reqs.iter() {
            check_range(r.offset_bytes, r.buf.len() as u64)?;
            let ok = obj_key(r.pg, r.object);
            let end = r.offset_bytes + r.buf.len() as u64;
            for b in r.offset_bytes / BS..end.div_ceil(BS) {
                keys.push((ok.0, ok.1, ok.2, b as u32));
            }
        }
        let vals = self.lookup_many(&keys)?;
        let blocks = self.read_resolved(disk, &keys, &vals)?;
        let mut k = 0;
        for r in reqs.iter_mut() {
            k += blocks.scatter(k, r.offset_bytes, r.buf);
        }
        assert_eq!(k, keys.len());
        Ok(())
    }

    /// Reads the blocks `vals` maps `keys` to (a `None` is a hole) with one device
    /// submission, each checked against its checksum. If the submission fails, each block
    /// is read alone to find the bad ones. Every bad block is noted for repair; the first is
    /// the error.
    pub(super) fn read_resolved(
        &mut self,
        disk: &mut dyn Disk,
        keys: &[BlockKey],
        vals: &[Option<BlockVal>],
    ) -> Result<ResolvedBlocks> {
        assert_eq!(keys.len(), vals.len());
        // A background write's error surfaces in the next read: it is a write error, fatal.
        disk.wait_background()
            .map_err(|e| io_err("data write", 0, e))?;
        let mapped: Vec<usize> = (0..keys.len()).filter(|i| vals[*i].is_some()).collect();
        let mut data = AlignedBuf::zeroed(mapped.len() * BS as usize);
        let batch = {
            let mut ops: Vec<ReadOp<'_>> = Vec::with_capacity(mapped.len());
            for (chunk, i) in data.chunks_mut(BS as usize).zip(&mapped) {
                let phys = phys_of(vals[*i].expect("mapped"));
                ops.push(ReadOp {
                    offset_bytes: self.data_offset_bytes + phys * BS,
                    buf: chunk,
                });
            }
            disk.read_many(&mut ops)
        };
        let mut slot_of = vec![usize::MAX; keys.len()];
        let mut first_bad = None;
        for (n, i) in mapped.iter().enumerate() {
            slot_of[*i] = n;
            let val = vals[*i].expect("mapped");
            let block = &mut data[n * BS as usize..(n + 1) * BS as usize];
            let read = match &batch {
                Ok(()) => Ok(()),
                Err(_) => disk.read(self.data_offset_bytes + phys_of(val) * BS, block),
            };
            if let Err(e) = self.check_block(&keys[*i], val, block, read) {
                first_bad.get_or_insert(e);
            }
        }
        match first_bad {
            Some(e) => Err(e),
            None => Ok(ResolvedBlocks { data, slot_of }),
        }
    }

    /// Makes every applied change durable: data first (written + fdatasync), then the block
    /// map, object list, applied indexes and `wal_durable_lsn` in one redb commit; then frees
    /// the blocks the old map referenced. The same three steps as a background flush
    /// (`commit.rs`), run inline.
    pub fn flush(&mut self, disk: &mut dyn Disk, wal_durable_lsn: u64) -> Result<()> {
        let mut commit = self.flush_prepare(disk, wal_durable_lsn)?;
        disk.wait_background()
            .map_err(|e| io_err("data write", 0, e))?;
        commit.run()?;
        self.flush_finish(commit);
        Ok(())
    }

    /// Number of mapped blocks in the flushed map (tests and metrics).
    pub fn flushed_block_count(&self) -> Result<u64> {
        let tx = self.db.begin_read()?;
        Ok(tx.open_table(meta::BLOCKS)?.len()?)
    }
}

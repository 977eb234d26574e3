//! The engine facade: one device, its WAL, its object store and its metadata database, with
//! fail-stop error handling. This is what an OSD shard's event loop drives.

use crate::disk::{AlignedBuf, Disk, UringDisk, UringOptions};
use crate::error::{Error, ObjectId, Result};
use crate::flusher::{Finished, FlushRunner, Flusher};
use crate::objects::{
    meta, BlockCacheStats, ImageSnaps, ImageUsage, MetaCommit, ObjectRead, Objects,
};
use crate::superblock::{Superblock, SUPERBLOCK_SIZE_BYTES};
use crate::wal::writer::io_err;
use crate::wal::{PgLog, Wal, WalOptions};
use fastblock_types::{ImageId, PgId};
use raft::eraftpb::{ConfState, Entry, HardState};
use redb::{Database, StorageBackend};
use std::path::{Path, PathBuf};

/// Geometry chosen at mkfs.
#[derive(Clone, Debug)]
pub struct MkfsOptions {
    pub osd_uuid: [u8; 16],
    pub segment_size_bytes: u64,
    pub segment_count: u32,
    pub batch_bytes_max: u64,
    /// Format even if the device holds data.
    pub force: bool,
}

impl MkfsOptions {
    pub fn new(osd_uuid: [u8; 16]) -> Self {
        MkfsOptions {
            osd_uuid,
            segment_size_bytes: 64 << 20,
            segment_count: 16,
            batch_bytes_max: 4 << 20,
            force: false,
        }
    }
}

/// Run-time tunables (not part of the format).
#[derive(Clone, Debug)]
pub struct StoreOptions {
    pub wal: WalOptions,
    /// Applied data buffered before it is written out: a full stage goes to the disk as a
    /// background write (`background_data_writes`), what is left at a flush is written and
    /// synced on the owner's thread before the flush can start. So this bounds how long a
    /// flush holds the shard: at the former 4 MiB, random 4 KiB writes (each a new block)
    /// left up to a second of applied data for the flush, whose start took 10 ms (median) to
    /// 29 ms on the test VM and showed in the QD1 write tail; at 256 KiB it takes about 1 ms
    /// (3-replica QD1 writes, A/B on one cluster: p99.9 13.0/10.8 ms -> 4.4/4.6 ms, p99
    /// 1.5-1.8 -> 1.2-1.3 ms; QD32 and 1 MiB sequential writes unchanged or better).
    pub stage_bytes_max: usize,
    pub meta_cache_bytes: usize,
    /// Write a full stage of applied data in the background, overlapping the next commits
    /// (`Disk::write_background`), instead of waiting for it.
    pub background_data_writes: bool,
    /// Write applied data with each WAL commit (see [`Store::commit`]). Off by default:
    /// measured slower here (the device serves the data writes ahead of the fdatasync).
    pub data_with_commit: bool,
    /// Flushed block-map entries (one per 4 KiB block, or per hole looked up) kept in memory
    /// so that applying and reading need no redb lookup (`objects/block_cache.rs`). Each
    /// costs 60 bytes when the cache is full (a 40-byte slot in an array kept at most 2/3
    /// full), so the default, 1 Mi entries (4 GiB of data blocks), is 60 MiB per store when
    /// full (measured: 60 MiB resident for 1 Mi entries). The array grows by doubling as
    /// entries arrive (while it doubles, old and new are held at once). 0: no cache.
    pub block_cache_entries_max: usize,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            wal: WalOptions::default(),
            stage_bytes_max: 256 << 10,
            meta_cache_bytes: 64 << 20,
            data_with_commit: false,
            background_data_writes: true,
            block_cache_entries_max: 1 << 20,
        }
    }
}

/// Bytes at the start of the device that must be zero for mkfs without `force`.
const EMPTY_CHECK_BYTES: u64 = 1 << 20;

pub struct Store<D: Disk> {
    disk: D,
    sb: Superblock,
    wal: Wal,
    objects: Objects,
    failed: bool,
    data_with_commit: bool,
    /// Runs flushes' metadata commits off the owning thread, once started
    /// ([`Store::start_flusher`]).
    flusher: Option<Box<dyn FlushRunner>>,
    /// A flush finished but not yet reported by [`Store::flush_poll`].
    flush_done: Option<FlushDone>,
    /// A prepared metadata commit whose data is still being written in the background, and
    /// the disk's mark of those writes: it goes to the flusher once the disk completed them
    /// ([`Store::flush_poll`]), so that starting a flush never waits for a data write.
    flush_awaiting_writes: Option<(MetaCommit, u64)>,
}

/// A flush begun with [`Store::flush_begin`] is durable: `flushed_applied_index` has
/// advanced, and compaction may follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlushDone {
    /// Block-map entries it committed.
    pub block_entries: usize,
    /// How long the metadata commit took on the flusher thread (`None`: it ran inline).
    pub commit_time: Option<std::time::Duration>,
}

fn open_db(meta: impl StorageBackend, cache_bytes: usize) -> Result<Database> {
    Ok(Database::builder()
        .set_cache_size(cache_bytes)
        .create_with_backend(meta)?)
}

impl<D: Disk> Store<D> {
    /// Formats the device and its metadata database. Refuses a device whose first MiB is not
    /// all zeros, or a non-empty metadata file, unless `force`.
    pub fn mkfs(
        mut disk: D,
        meta_backend: impl StorageBackend,
        opts: &MkfsOptions,
        options: StoreOptions,
    ) -> Result<Self> {
        let sb = Superblock::layout(
            opts.osd_uuid,
            disk.size_bytes(),
            opts.segment_size_bytes,
            opts.segment_count,
            opts.batch_bytes_max,
        )?;
        if !opts.force {
            let n = EMPTY_CHECK_BYTES.min(disk.size_bytes());
            let mut buf = AlignedBuf::zeroed(n as usize);
            disk.read(0, &mut buf)
                .map_err(|e| io_err("mkfs read", 0, e))?;
            let meta_len = meta_backend.len().map_err(|e| io_err("meta len", 0, e))?;
            if buf.iter().any(|b| *b != 0) || meta_len != 0 {
                return Err(Error::NotEmpty { checked_bytes: n });
            }
        } else {
            meta_backend
                .set_len(0)
                .map_err(|e| io_err("meta truncate", 0, e))?;
            // Invalidate an old superblock first, so a crash mid-mkfs never leaves the old
            // superblock pointing at a half-formatted WAL.
            let zero = AlignedBuf::zeroed(SUPERBLOCK_SIZE_BYTES as usize);
            disk.write(0, &zero, true)
                .map_err(|e| io_err("mkfs write", 0, e))?;
        }
        let wal = Wal::format(&mut disk, &sb, options.wal.clone())?;
        let db = open_db(meta_backend, options.meta_cache_bytes)?;
        meta::create(&db, &sb.osd_uuid)?;
        let mut block = AlignedBuf::zeroed(SUPERBLOCK_SIZE_BYTES as usize);
        block.copy_from_slice(&sb.encode());
        disk.write(0, &block, true)
            .map_err(|e| io_err("superblock write", 0, e))?;
        let objects = Objects::open(
            db,
            &sb,
            options.stage_bytes_max,
            options.background_data_writes,
            options.block_cache_entries_max,
        )?;
        Ok(Store {
            disk,
            sb,
            wal,
            objects,
            failed: false,
            data_with_commit: options.data_with_commit,
            flusher: None,
            flush_done: None,
            flush_awaiting_writes: None,
        })
    }

    /// Opens a formatted device: superblock, metadata, WAL replay, allocator rebuild.
    pub fn open(
        mut disk: D,
        meta_backend: impl StorageBackend,
        options: StoreOptions,
    ) -> Result<Self> {
        let mut block = AlignedBuf::zeroed(SUPERBLOCK_SIZE_BYTES as usize);
        disk.read(0, &mut block)
            .map_err(|e| io_err("superblock read", 0, e))?;
        let sb = Superblock::decode(&block)?;
        if disk.size_bytes() < sb.device_size_bytes {
            return Err(Error::DeviceTooSmall {
                expected_bytes: sb.device_size_bytes,
                actual_bytes: disk.size_bytes(),
            });
        }
        let db = open_db(meta_backend, options.meta_cache_bytes)?;
        let loaded = meta::load(&db)?;
        if loaded.osd_uuid != sb.osd_uuid {
            return Err(Error::UuidMismatch {
                expected: hex(&sb.osd_uuid),
                found: hex(&loaded.osd_uuid),
            });
        }
        let wal = Wal::recover(&mut disk, &sb, options.wal.clone())?;
        if wal.durable_lsn() < loaded.flushed_lsn {
            return Err(Error::LogTruncated {
                end_lsn: wal.durable_lsn(),
                flushed_lsn: loaded.flushed_lsn,
            });
        }
        let objects = Objects::open(
            db,
            &sb,
            options.stage_bytes_max,
            options.background_data_writes,
            options.block_cache_entries_max,
        )?;
        let mut store = Store {
            disk,
            sb,
            wal,
            objects,
            failed: false,
            data_with_commit: options.data_with_commit,
            flusher: None,
            flush_done: None,
            flush_awaiting_writes: None,
        };
        store.finish_snapshot_installs()?;
        store.finish_pg_removals()?;
        Ok(store)
    }

    /// A snapshot install commits its objects first and its WAL record second; a crash in
    /// between leaves a snapshot record newer than the PG's log, which is finished here.
    fn finish_snapshot_installs(&mut self) -> Result<()> {
        let mut finished = false;
        for r in self.objects.snapshot_records()? {
            let behind = self.wal.pg(r.pg).is_none_or(|l| l.snap_index < r.index)
                && self.objects.applied_index(r.pg) == r.index;
            if behind {
                tracing::warn!(pg = %r.pg, index = r.index, "finishing an interrupted snapshot install");
                self.wal
                    .apply_snapshot(&mut self.disk, r.pg, r.index, r.term, &r.conf_state)?;
                finished = true;
            }
        }
        if finished {
            self.wal.commit(&mut self.disk, &[])?;
        }
        Ok(())
    }

    /// A PG removal commits its WAL record first and the metadata (objects, applied index) at
    /// the flush after it; a crash in between leaves metadata of a PG the log no longer knows,
    /// which is removed here. Otherwise a PG hosted here again later starts with an empty log
    /// and that stale applied index, and raft-rs panics (found by the simulator, seed
    /// 13976630064239420130).
    fn finish_pg_removals(&mut self) -> Result<()> {
        let stale: Vec<PgId> = self
            .objects
            .pgs_with_state()
            .into_iter()
            .filter(|pg| self.wal.pg(*pg).is_none())
            .collect();
        if stale.is_empty() {
            return Ok(());
        }
        for pg in stale {
            tracing::warn!(%pg, "finishing an interrupted PG removal");
            self.objects.delete_pg(pg)?;
        }
        self.flush_inner()
    }

    /// Runs `f` unless the engine has failed; a fatal error from `f` fails the engine.
    fn guard<T>(&mut self, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        if self.failed {
            return Err(Error::PreviousIo);
        }
        let r = f(self);
        if let Err(e) = &r {
            if e.is_fatal() {
                tracing::error!(error = %e, "storage engine stopped after an I/O error");
                self.failed = true;
            }
        }
        r
    }

    /// [`Store::guard`] for an operation that allocates data blocks: if the data region is
    /// full while blocks wait to be freed (unmapped by overwrites, discards and deletes since
    /// the last flush), flushes to give them back and runs `f` once more. The shard admits
    /// writes against free plus pending-free space (`fastblock_shard::space`), so every
    /// entry point that allocates goes through here, or an admitted operation would fail
    /// `NoSpace` while the room it was admitted against waits for a flush. `f` either
    /// changes nothing when it fails `NoSpace` (an allocation comes before any change) or is
    /// safe to run again (a discard's second partial block, after its first was rewritten).
    fn guard_allocating<T>(&mut self, mut f: impl FnMut(&mut Self) -> Result<T>) -> Result<T> {
        self.guard(|s| match f(s) {
            Err(Error::NoSpace { .. }) if s.objects.pending_free_blocks() > 0 => {
                s.flush_inner()?;
                f(s)
            }
            r => r,
        })
    }

    pub fn superblock(&self) -> &Superblock {
        &self.sb
    }

    pub fn wal(&self) -> &Wal {
        &self.wal
    }

    pub fn is_failed(&self) -> bool {
        self.failed
    }

    /// Direct access for tests and tools (corruption injection, statistics).
    pub fn disk_mut(&mut self) -> &mut D {
        &mut self.disk
    }

    // ---- WAL: everything below is pending until `commit` ----

    /// Appends Raft entries (a conflicting suffix is truncated first).
    pub fn append_entries(&mut self, pg: PgId, entries: &[Entry]) -> Result<()> {
        self.guard(|s| s.wal.append_entries(&mut s.disk, pg, entries))
    }

    pub fn set_hard_state(&mut self, pg: PgId, hs: &HardState) -> Result<()> {
        self.guard(|s| s.wal.set_hard_state(&mut s.disk, pg, hs))
    }

    /// Records the configuration; the first call creates the PG's log.
    pub fn set_conf_state(&mut self, pg: PgId, cs: &ConfState) -> Result<()> {
        self.guard(|s| s.wal.set_conf_state(&mut s.disk, pg, cs))
    }

    /// Installs a snapshot's metadata (the PG layer has written the objects).
    pub fn apply_snapshot(
        &mut self,
        pg: PgId,
        index: u64,
        term: u64,
        cs: &ConfState,
    ) -> Result<()> {
        self.guard(|s| s.wal.apply_snapshot(&mut s.disk, pg, index, term, cs))
    }

    /// Stages one chunk of a snapshot being received (see `objects/snapshot.rs`). As
    /// [`Store::write_object`], a full data region with blocks waiting to be freed (an
    /// aborted transfer's staging, say) flushes once and retries.
    pub fn snapshot_write(
        &mut self,
        pg: PgId,
        transfer: u64,
        object: ObjectId,
        offset_bytes: u64,
        data: &[u8],
    ) -> Result<()> {
        self.guard_allocating(|s| {
            s.objects
                .snapshot_write(&mut s.disk, pg, transfer, object, offset_bytes, data)
        })
    }

    /// Stages one chunk of a PG snapshot transfer: every version of the blocks of one range
    /// of `object` (see `Objects::snapshot_stage`). A full data region flushes once and
    /// retries, as [`Store::snapshot_write`] does.
    pub fn snapshot_stage(
        &mut self,
        pg: PgId,
        transfer: u64,
        object: ObjectId,
        offset_bytes: u64,
        chunk: &crate::objects::transfer::ChunkVersions,
    ) -> Result<()> {
        self.guard_allocating(|s| {
            s.objects
                .snapshot_stage(&mut s.disk, pg, transfer, object, offset_bytes, chunk)
        })
    }

    /// Stages the image snapshot state of `image` for a PG snapshot transfer.
    pub fn snapshot_image_snaps(
        &mut self,
        pg: PgId,
        transfer: u64,
        image: ImageId,
        state: ImageSnaps,
    ) {
        self.objects
            .snapshot_image_snaps(pg, transfer, image, state);
    }

    /// What a PG snapshot transfer sends of one range of `object`: every version of its
    /// blocks, read now (see `Objects::transfer_read`).
    pub fn transfer_read(
        &mut self,
        pg: PgId,
        object: ObjectId,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> Result<crate::objects::transfer::ChunkVersions> {
        self.guard(|s| {
            s.objects
                .transfer_read(&mut s.disk, pg, object, offset_bytes, len_bytes)
        })
    }

    /// Every object of `pg` with blocks kept for image snapshots, and the bytes up to its
    /// last kept block.
    pub fn kept_extents(&mut self, pg: PgId) -> Result<Vec<(ObjectId, u64)>> {
        self.guard(|s| s.objects.kept_extents(pg))
    }

    /// Every image of `pg` with image snapshot state, and that state.
    pub fn image_snaps_of_pg(&self, pg: PgId) -> Vec<(ImageId, ImageSnaps)> {
        self.objects.image_snaps_of_pg(pg)
    }

    /// Stages that `object` exists though a chunk of it held only zeros (see
    /// `Objects::snapshot_touch`).
    pub fn snapshot_touch(&mut self, pg: PgId, transfer: u64, object: ObjectId, offset_bytes: u64) {
        self.objects
            .snapshot_touch(pg, transfer, object, offset_bytes);
    }

    /// The transfer whose chunks are staged for `pg`, if any.
    pub fn snapshot_receiving(&self, pg: PgId) -> Option<u64> {
        self.objects.snapshot_receiving(pg)
    }

    pub fn snapshot_abort(&mut self, pg: PgId) {
        self.objects.snapshot_abort(pg);
    }

    /// Bytes a snapshot being staged for `pg` shares with the PG's objects.
    pub fn snapshot_shared_bytes(&self, pg: PgId) -> u64 {
        self.objects.snapshot_shared_bytes(pg)
    }

    /// Installs the staged snapshot of `pg` at `index`/`term` with configuration `cs`,
    /// replacing the PG's objects and log. The objects, applied index and a snapshot record
    /// become durable in one metadata commit (flush) before the WAL record is queued; the
    /// caller commits the WAL. A crash between the two is finished at open.
    pub fn install_snapshot(
        &mut self,
        pg: PgId,
        index: u64,
        term: u64,
        cs: &ConfState,
    ) -> Result<()> {
        self.guard(|s| {
            let record = crate::objects::SnapshotRecord {
                pg,
                index,
                term,
                conf_state: cs.clone(),
            };
            s.objects.snapshot_install(pg, &record)?;
            s.flush_inner()?;
            s.wal.apply_snapshot(&mut s.disk, pg, index, term, cs)
        })
    }

    /// PGs with a log in this store.
    pub fn pg_ids(&self) -> Vec<PgId> {
        self.wal.pg_ids().collect()
    }

    /// Drops log entries up to `index`, which must be applied and flushed.
    pub fn compact(&mut self, pg: PgId, index: u64) -> Result<()> {
        self.guard(|s| {
            let flushed = s.objects.flushed_applied_index(pg);
            if index > flushed {
                return Err(Error::CompactBeyondFlushed {
                    pg,
                    index,
                    flushed_applied: flushed,
                });
            }
            s.wal.compact(&mut s.disk, pg, index)
        })
    }

    /// Removes a PG: its log (pending until commit) and its objects (until flush).
    pub fn remove_pg(&mut self, pg: PgId) -> Result<()> {
        self.guard(|s| {
            s.wal.remove_pg(&mut s.disk, pg)?;
            s.objects.delete_pg(pg)
        })
    }

    /// Group commit: one write of the pending batch and one fdatasync. Returns the durable
    /// LSN.
    ///
    /// Applied data staged since the last commit rides along in the same submission when
    /// `data_with_commit` is set (the fdatasync is chained to the WAL write only, so it does
    /// not wait for the data); otherwise it stays in the stage until the stage is full, a read
    /// needs it, or flush.
    pub fn commit(&mut self) -> Result<u64> {
        self.guard(|s| {
            if !s.data_with_commit {
                return s.wal.commit(&mut s.disk, &[]);
            }
            let extra = s.objects.staged_writes();
            let lsn = s.wal.commit(&mut s.disk, &extra)?;
            drop(extra);
            s.objects.clear_stage();
            Ok(lsn)
        })
    }

    /// Group commit without waiting: submits the pending batch with its fdatasync and
    /// returns the LSN that is durable once [`Store::commit_reap`] reports it. Applied data
    /// is not carried along (with `data_with_commit` this commits synchronously instead).
    /// Several commits may be in flight; they are reported durable in submission order.
    pub fn commit_submit(&mut self) -> Result<u64> {
        if self.data_with_commit {
            return self.commit();
        }
        self.guard(|s| s.wal.commit_submit(&mut s.disk))
    }

    /// The durable LSN after collecting the commits the disk finished (never blocks).
    pub fn commit_reap(&mut self) -> Result<u64> {
        self.guard(|s| s.wal.reap(&mut s.disk, false))
    }

    /// WAL commits submitted and not yet reported durable.
    pub fn commits_in_flight(&self) -> usize {
        self.wal.commits_in_flight()
    }

    /// `(first_index, last_index)` of a PG's log (`(1, 0)` for an unknown PG).
    pub fn log_bounds(&self, pg: PgId) -> (u64, u64) {
        self.wal
            .pg(pg)
            .map_or((1, 0), |l| (l.first_index(), l.last_index()))
    }

    /// Whether the PG's log holds a configuration-change entry after `index` (reads the
    /// entries from disk where they are no longer cached). Used when deciding whether a
    /// replica the map no longer lists may be deleted (`fastblock_pg::retention`).
    pub fn has_conf_change_after(&mut self, pg: PgId, index: u64) -> Result<bool> {
        let (first, last) = self.log_bounds(pg);
        let low = index.saturating_add(1).max(first);
        if low > last {
            return Ok(false);
        }
        let entries = self.entries(pg, low, last + 1, None)?;
        Ok(entries
            .iter()
            .any(|e| e.get_entry_type() != raft::eraftpb::EntryType::EntryNormal))
    }

    pub fn pg_log(&self, pg: PgId) -> Option<&PgLog> {
        self.wal.pg(pg)
    }

    /// Entries `[low, high)` of a PG, limited to about `max_size_bytes`.
    pub fn entries(
        &mut self,
        pg: PgId,
        low: u64,
        high: u64,
        max_size_bytes: Option<u64>,
    ) -> Result<Vec<Entry>> {
        self.guard(|s| s.wal.entries(&mut s.disk, pg, low, high, max_size_bytes))
    }

    // ---- objects: applied state, durable at the next flush ----

    /// Applies a write. If the data region is full but blocks wait to be freed, flushes once
    /// and retries; otherwise returns [`Error::NoSpace`] with nothing changed.
    pub fn write_object(
        &mut self,
        pg: PgId,
        object: ObjectId,
        offset_bytes: u64,
        data: &[u8],
    ) -> Result<()> {
        self.guard_allocating(|s| s.objects.write(&mut s.disk, pg, object, offset_bytes, data))
    }

    /// Discard / write-zeroes: the range reads as zeros, whole blocks are given back. A range
    /// with unaligned ends rewrites its partial end blocks into new blocks (at most
    /// [`zero_allocates_bytes`](crate::objects::zero_allocates_bytes)), flushing first like a
    /// write if the data region is full but blocks wait to be freed.
    pub fn zero_object(
        &mut self,
        pg: PgId,
        object: ObjectId,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> Result<()> {
        self.guard_allocating(|s| {
            s.objects
                .zero(&mut s.disk, pg, object, offset_bytes, len_bytes)
        })
    }

    // ---- objects of clones (`objects/clones.rs`), applied through the log ----

    /// Whether `object` of a clone holds its own data (copied up from its parent).
    pub fn is_copied(&self, pg: PgId, object: ObjectId) -> bool {
        self.objects.is_copied(pg, object)
    }

    /// One piece of a copy-up: written unless the object is marked copied already (then
    /// nothing happens); returns whether it wrote. Flushes first like a write if the data
    /// region is full but blocks wait to be freed.
    pub fn copy_up(
        &mut self,
        pg: PgId,
        object: ObjectId,
        offset_bytes: u64,
        data: &[u8],
        runs: &[(u64, fastblock_types::clone_data::CopyUpTarget)],
    ) -> Result<bool> {
        self.guard_allocating(|s| {
            s.objects
                .copy_up(&mut s.disk, pg, object, offset_bytes, data, runs)
        })
    }

    /// Marks `object` of a clone copied: it is read from the clone from now on.
    pub fn copy_up_done(&mut self, pg: PgId, object: ObjectId) -> Result<()> {
        self.guard(|s| {
            s.objects.copy_up_done(pg, object);
            Ok(())
        })
    }

    // ---- image snapshots (`objects/image_snaps.rs`), applied through the log ----

    /// Takes snapshot `snap` of `image` in `pg` (no data moves).
    pub fn image_snap_create(&mut self, pg: PgId, image: ImageId, snap: u64) -> Result<()> {
        self.guard(|s| s.objects.image_snap_create(pg, image, snap))
    }

    /// Removes snapshot `snap` of `image` in `pg`; returns the blocks freed (at the next
    /// flush).
    pub fn image_snap_remove(&mut self, pg: PgId, image: ImageId, snap: u64) -> Result<u64> {
        self.guard(|s| s.objects.image_snap_remove(pg, image, snap))
    }

    /// Makes the head of `object` equal to snapshot `snap`; returns the blocks copied.
    /// Flushes first like a write if the data region is full but blocks wait to be freed.
    pub fn image_snap_rollback(&mut self, pg: PgId, object: ObjectId, snap: u64) -> Result<u64> {
        self.guard_allocating(|s| s.objects.image_snap_rollback(&mut s.disk, pg, object, snap))
    }

    /// Reads `object` as snapshot `snap` saw it.
    pub fn read_image_snap(
        &mut self,
        pg: PgId,
        object: ObjectId,
        snap: u64,
        offset_bytes: u64,
        buf: &mut [u8],
    ) -> Result<()> {
        self.guard(|s| {
            s.objects
                .read_image_snap(&mut s.disk, pg, object, snap, offset_bytes, buf)
        })
    }

    /// The snapshot state of `image` in `pg`.
    pub fn image_snaps(&self, pg: PgId, image: ImageId) -> ImageSnaps {
        self.objects.image_snaps(pg, image)
    }

    /// What `image` holds in `pg`: objects, head blocks, blocks kept per snapshot (applied
    /// state, from counters kept in memory).
    pub fn image_usage(&self, pg: PgId, image: ImageId) -> ImageUsage {
        self.objects.image_usage(pg, image)
    }

    /// What every image holds in `pg`, summed.
    pub fn pg_usage(&self, pg: PgId) -> ImageUsage {
        self.objects.pg_usage(pg)
    }

    /// Checks the usage counters against a full scan of the block maps (tests).
    pub fn verify_usage(&self) -> Result<()> {
        self.objects.verify_usage()
    }

    pub fn delete_object(&mut self, pg: PgId, object: ObjectId) -> Result<()> {
        self.guard(|s| s.objects.delete(pg, object))
    }

    /// Deletes what `pg` holds of `image` in the image bytes `from_bytes..to_bytes`: objects
    /// that start inside the range go, the object the range starts in is zeroed from
    /// `from_bytes` to its end (a shrink to a size that is not a whole number of objects).
    /// Returns the objects deleted or cut. Deterministic: every member applies the same.
    pub fn reclaim_image_range(
        &mut self,
        pg: PgId,
        image: ImageId,
        from_bytes: u64,
        to_bytes: u64,
        object_size_bytes: u64,
    ) -> Result<u64> {
        assert!(
            object_size_bytes > 0 && from_bytes < to_bytes,
            "empty reclaim"
        );
        let first = from_bytes / object_size_bytes;
        let cut = from_bytes % object_size_bytes;
        // A removed image goes whole: objects beyond its last size too (a clone's deep
        // copy-up may have made some for its snapshots), its snapshot state, the blocks its
        // removed snapshots still keep, and its copied marks.
        let end = if from_bytes == 0 {
            u64::MAX
        } else {
            to_bytes.div_ceil(object_size_bytes)
        };
        if from_bytes == 0 {
            // Snapshots first, so that deleting the objects frees their blocks instead of
            // keeping them for a snapshot whose trim is still on its way.
            self.guard(|s| s.objects.image_snaps_drop(pg, Some(image)))?;
        }
        let objects: Vec<(ObjectId, u64)> = self.objects.image_objects(pg, image, first..end);
        let mut touched = 0;
        for (object, size_bytes) in objects {
            if object.index == first && cut > 0 {
                if size_bytes > cut {
                    self.zero_object(pg, object, cut, object_size_bytes - cut)?;
                    touched += 1;
                }
            } else {
                self.delete_object(pg, object)?;
                touched += 1;
            }
        }
        if from_bytes == 0 {
            self.guard(|s| {
                s.objects.forget_image_copies(pg, image);
                Ok(())
            })?;
        }
        Ok(touched)
    }

    /// Applies a repair (`objects/damage.rs`): the versions of the blocks of `object` in
    /// `offset_bytes..+chunk.len_bytes` become `chunk`'s, read from a good replica. Returns
    /// the versions rewritten here (0 where this copy was good). Flushes once if the data
    /// region is full but blocks wait to be freed, like a write.
    pub fn repair_blocks(
        &mut self,
        pg: PgId,
        object: ObjectId,
        offset_bytes: u64,
        chunk: &crate::ChunkVersions,
    ) -> Result<u64> {
        self.guard_allocating(|s| {
            s.objects
                .repair_blocks(&mut s.disk, pg, object, offset_bytes, chunk)
        })
    }

    /// The next objects a scrub of `pg` covers after `after` (see
    /// `Objects::scrub_next_objects`).
    pub fn scrub_next_objects(
        &self,
        pg: PgId,
        after: Option<ObjectId>,
        bytes_max: u64,
        count_max: usize,
    ) -> Vec<ObjectId> {
        self.objects
            .scrub_next_objects(pg, after, bytes_max, count_max)
    }

    /// This replica's scrub digests of `pg`'s objects in `first..=last`, and with `deep` its
    /// data read back and checked (`objects/scrub.rs`).
    pub fn scrub_digests(
        &mut self,
        pg: PgId,
        first: ObjectId,
        last: ObjectId,
        deep: bool,
    ) -> Result<crate::ScrubFindings> {
        self.guard(|s| s.objects.scrub_digests(&mut s.disk, pg, first, last, deep))
    }

    /// Bad blocks found since the last call (each once): the owner has them repaired.
    pub fn take_damaged(&mut self) -> Vec<crate::DamagedBlock> {
        self.objects.take_damaged()
    }

    /// Bad blocks found and block versions repaired since the engine opened.
    pub fn damage_counts(&self) -> crate::DamageCounts {
        self.objects.damage_counts()
    }

    pub fn read_object(
        &mut self,
        pg: PgId,
        object: ObjectId,
        offset_bytes: u64,
        buf: &mut [u8],
    ) -> Result<()> {
        self.read_objects(&mut [ObjectRead {
            pg,
            object,
            offset_bytes,
            buf,
        }])
    }

    /// Reads many ranges with one device submission.
    pub fn read_objects(&mut self, reqs: &mut [ObjectRead<'_>]) -> Result<()> {
        self.guard(|s| s.objects.read_many(&mut s.disk, reqs))
    }

    /// The ranges of the object's `offset_bytes..offset_bytes + len_bytes` backed by data
    /// blocks, in order (see `Objects::allocated_ranges`).
    pub fn allocated_ranges(
        &mut self,
        pg: PgId,
        object: ObjectId,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> Result<Vec<(u64, u64)>> {
        self.guard(|s| {
            s.objects
                .allocated_ranges(pg, object, offset_bytes, len_bytes)
        })
    }

    pub fn list_objects(&mut self, pg: PgId) -> Result<Vec<ObjectId>> {
        self.guard(|s| s.objects.list(pg))
    }

    /// Objects of a PG with their sizes (highest byte ever written).
    pub fn object_sizes(&self, pg: PgId) -> Vec<(ObjectId, u64)> {
        self.objects.sizes(pg)
    }

    /// Records that every entry up to `index` of the PG has been applied.
    pub fn set_applied(&mut self, pg: PgId, index: u64) -> Result<()> {
        self.guard(|s| s.objects.set_applied(pg, index))
    }

    pub fn applied_index(&self, pg: PgId) -> u64 {
        self.objects.applied_index(pg)
    }

    /// The applied index that survives a crash; log entries up to it may be compacted.
    pub fn flushed_applied_index(&self, pg: PgId) -> u64 {
        self.objects.flushed_applied_index(pg)
    }

    /// Hits, misses and evictions of the in-memory block-map cache since the store opened.
    pub fn block_cache_stats(&self) -> BlockCacheStats {
        self.objects.block_cache_stats()
    }

    /// Head blocks in the flushed block map (tests: what the head holds, apart from the
    /// blocks snapshots keep).
    pub fn flushed_block_count(&mut self) -> Result<u64> {
        self.guard(|s| s.objects.flushed_block_count())
    }

    pub fn free_data_bytes(&self) -> u64 {
        self.objects.free_blocks() * fastblock_types::units::BLOCK_SIZE_BYTES
    }

    /// Data space that flushes give back: blocks unmapped by overwrites, discards and deletes
    /// and not free yet (including those of a flush whose metadata commit is running).
    pub fn pending_free_bytes(&self) -> u64 {
        self.objects.pending_free_blocks() * fastblock_types::units::BLOCK_SIZE_BYTES
    }

    /// Makes applied state durable: the pending WAL batch (if any) is committed, then data
    /// write + fdatasync, then one metadata commit. Afterwards `flushed_applied_index` has
    /// advanced and compaction may follow.
    pub fn flush(&mut self) -> Result<()> {
        self.guard(|s| s.flush_inner())
    }

    /// From now on [`Store::flush_begin`] runs the metadata commit on a thread of its own
    /// (named `name`), calling `notify` when one is done so the owner looks with
    /// [`Store::flush_poll`]. The OSD does this; the simulator and tests flush inline.
    pub fn start_flusher(&mut self, name: String, notify: Box<dyn Fn() + Send>) -> Result<()> {
        if self.flusher.is_none() {
            self.flusher = Some(Box::new(Flusher::start(name, notify)?));
        }
        Ok(())
    }

    /// From now on [`Store::flush_begin`] hands metadata commits to `runner` (the simulator's,
    /// which decides when each one finishes). Replaces no running commit: call it before the
    /// first flush.
    pub fn set_flush_runner(&mut self, runner: Box<dyn FlushRunner>) {
        assert!(
            !self.flush_in_flight(),
            "flush runner replaced with a commit in flight"
        );
        self.flusher = Some(runner);
    }

    /// Whether a begun flush waits for its data writes before its commit can go to the
    /// flusher: the owner should call [`Store::flush_poll`] again soon (after its next wake-up).
    pub fn flush_awaits_writes(&self) -> bool {
        self.flush_awaiting_writes.is_some()
    }

    /// Whether a flush's metadata commit is running on the flusher thread, or waits for its
    /// data writes to be handed there.
    pub fn flush_in_flight(&self) -> bool {
        self.flush_awaiting_writes.is_some() || self.flusher.as_ref().is_some_and(|f| f.busy())
    }

    /// Starts a flush: commits pending WAL records, writes the applied data, and hands the
    /// data's sync and the metadata commit to the flusher thread (or, without one, runs them
    /// inline). With a disk that writes in the background, the hand-over waits for those
    /// writes to complete: [`Store::flush_poll`] makes it, and
    /// [`Store::flush_awaits_writes`] says whether it is still to be made.
    /// Returns `false`, doing nothing, while the previous one is still running.
    /// [`Store::flush_poll`] reports it once it is durable.
    pub fn flush_begin(&mut self) -> Result<bool> {
        self.guard(|s| {
            if s.flush_in_flight() {
                return Ok(false);
            }
            // Pending records and commits in flight become durable first (`Wal::commit`
            // waits for those): flushed state never runs ahead of the log (see flush_inner).
            s.wal.commit(&mut s.disk, &[])?;
            let lsn = s.wal.durable_lsn();
            let mut commit = s.objects.flush_prepare(&mut s.disk, lsn)?;
            match s.flusher.as_mut() {
                Some(_) => {
                    s.flush_awaiting_writes = Some((commit, s.disk.background_mark()));
                    s.hand_over_when_written(false)?;
                }
                None => {
                    s.disk
                        .wait_background()
                        .map_err(|e| io_err("data write", 0, e))?;
                    commit.run()?;
                    let block_entries = commit.block_entries();
                    s.objects.flush_finish(commit);
                    s.flush_done = Some(FlushDone {
                        block_entries,
                        commit_time: None,
                    });
                }
            }
            Ok(true)
        })
    }

    /// A flush that became durable since the last call, if any (never blocks). Each
    /// [`Store::flush_begin`] that returned `true` is reported once.
    pub fn flush_poll(&mut self) -> Result<Option<FlushDone>> {
        self.guard(|s| {
            if let Some(done) = s.flush_done.take() {
                return Ok(Some(done));
            }
            s.hand_over_when_written(false)?;
            match s.flusher.as_mut().and_then(|f| f.try_finished()) {
                Some(finished) => s.finish_background(finished).map(Some),
                None => Ok(None),
            }
        })
    }

    fn finish_background(&mut self, finished: Finished) -> Result<FlushDone> {
        finished.result?;
        let commit = finished
            .commit
            .expect("a commit that succeeded comes back with its result");
        let block_entries = commit.block_entries();
        self.objects.flush_finish(commit);
        Ok(FlushDone {
            block_entries,
            commit_time: Some(finished.commit_time),
        })
    }

    /// Hands the commit awaiting its data writes to the flusher once the disk completed the
    /// background writes started before its prepare ended (with `wait`, after waiting for
    /// them): writes of applies since do not hold it.
    fn hand_over_when_written(&mut self, wait: bool) -> Result<()> {
        let Some((_, mark)) = self.flush_awaiting_writes else {
            return Ok(());
        };
        let written = if wait {
            self.disk.wait_background().map(|()| true)
        } else {
            self.disk.background_written(mark)
        }
        .map_err(|e| io_err("data write", 0, e))?;
        if written {
            let (commit, _) = self.flush_awaiting_writes.take().expect("checked above");
            self.flusher
                .as_mut()
                .expect("a commit awaits its writes only with a flush runner")
                .submit(commit);
        }
        Ok(())
    }

    /// Waits for a running background commit and finishes it (reported by the next
    /// [`Store::flush_poll`]).
    fn flush_wait(&mut self) -> Result<()> {
        self.hand_over_when_written(true)?;
        if let Some(finished) = self.flusher.as_mut().and_then(|f| f.wait()) {
            let done = self.finish_background(finished)?;
            self.flush_done = Some(done);
        }
        Ok(())
    }

    fn flush_inner(&mut self) -> Result<()> {
        self.flush_wait()?;
        // Records still pending (a hard state whose caller chose not to commit it yet) become
        // durable first, so flushed state never runs ahead of the log records before it: applying
        // queues WAL records too (the configuration of an applied membership change), and a
        // crash must not leave such an entry applied with the old configuration (found by the
        // simulator, seed 16774686455695070254).
        // `Wal::commit` also waits for the commits in flight (a hard state in one of them
        // may carry the commit index the flushed applied index relies on).
        self.wal.commit(&mut self.disk, &[])?;
        let lsn = self.wal.durable_lsn();
        self.objects.flush(&mut self.disk, lsn)
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The metadata file that goes with a data file or device: `<path>.meta`.
pub fn meta_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".meta");
    PathBuf::from(p)
}

impl Store<UringDisk> {
    /// Opens (or with `mkfs`, formats) a store on a file or block device, with its metadata
    /// in `meta` (default `<path>.meta`).
    pub fn open_path(
        path: &Path,
        meta: Option<&Path>,
        mkfs: Option<&MkfsOptions>,
        uring: UringOptions,
        options: StoreOptions,
    ) -> Result<Self> {
        let meta = meta.map_or_else(|| meta_path(path), Path::to_path_buf);
        let disk = UringDisk::open(path, uring).map_err(|e| io_err("open", 0, e))?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&meta)
            .map_err(|e| io_err("meta open", 0, e))?;
        let backend = redb::backends::FileBackend::new(file)?;
        match mkfs {
            Some(m) => Store::mkfs(disk, backend, m, options),
            None => Store::open(disk, backend, options),
        }
    }
}

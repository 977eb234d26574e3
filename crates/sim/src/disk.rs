//! A node's device and metadata file: the store's [`SimDisk`] and [`SimFile`] (which keep a
//! "written" and a "durable" image and crash by dropping or tearing unsynced writes) behind
//! thin wrappers that add the simulator's two disk faults.
//!
//! - **Crash fuse**: armed with a count of I/O calls; the call that blows it performs its
//!   writes unsynced and fails, and every later call fails. The store fail-stops, and the
//!   simulator crashes the node at once, so a crash can land between any two I/Os of a WAL
//!   commit, a flush or a redb transaction.
//! - **Slow commit**: when `defer_syncs` is set (the cluster sets it for the core's
//!   `WalCommit` step on a slow node), the WAL commit's submission ([`Disk::submit_durable`])
//!   writes its data unsynced and stays in flight (owed), as on the OSD's io_uring disk; the
//!   flag clears. Otherwise a submission is synced at once. The core keeps the commit in
//!   flight until the simulated fdatasync completes: the cluster calls
//!   [`NodeDisk::complete_sync`] (one owed commit becomes durable and reportable), then steps
//!   `WalDurable`, whose [`Disk::reap_durable`] reports it. A crash in between tears the
//!   commit at sector granularity: the torn WAL tail the store's recovery must cut. A
//!   synchronous sync while commits are owed covers them too (every sync covers everything
//!   written before it), so they become reportable.
//!
//! - **Bad blocks** ([`BadBlocks`], which outlive crashes): sectors of the data region whose
//!   reads fail until a write covers them (latent sector errors), and a misdirected write
//!   armed by the cluster: the next write of a client's block to the data region lands on a
//!   nearby block instead, so the intended block keeps its stale bytes and the other one is
//!   overwritten. Flipped bytes (silent corruption) need no wrapper: the cluster changes the
//!   image itself ([`fastblock_store::SimImage::corrupt`]). The store's checksums cover each
//!   block's identity and bytes, so every one of these reads back as a bad copy.
//!
//! Both wrappers share one [`DiskFaults`]; redb requires its backend to be `Send + Sync`, hence
//! the `Arc<Mutex<_>>` (there are no threads).

use crate::model::{decode_block, Found, BLOCK_BYTES};
use fastblock_store::disk::{
    write_durable_now, DataSync, OwnedWrite, ReadOp, Reaped, Submitted, WriteOp,
};
use fastblock_store::{Disk, SimDisk, SimFile};
use fastblock_types::rng::SplitMix64;
use fastblock_types::OsdId;
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

/// The sector size of the simulated device: the unit of a latent sector error.
pub const SECTOR_BYTES: u64 = 512;
const BS: u64 = BLOCK_BYTES as u64;
/// How far from its target a misdirected write lands, at most, in blocks.
const MISDIRECT_BLOCKS_MAX: u64 = 64;

/// The image blocks (image byte offset / 4 KiB) whose copy on some node may be bad, and that
/// node: a block is made bad on at most one node in a run, so that every block keeps a good
/// copy on every other replica (the simulator's rule, `cluster/bad_blocks.rs`).
pub type Claims = Arc<Mutex<BTreeMap<u64, OsdId>>>;

/// Whether `osd` may make a bad copy of image block `block`: no other node has one.
pub fn may_claim(claims: &BTreeMap<u64, OsdId>, block: u64, osd: OsdId) -> bool {
    claims.get(&block).is_none_or(|o| *o == osd)
}

/// The image block a device block holds, if it holds a client's stamped block.
pub fn stamped_block(bytes: &[u8]) -> Option<(u64, u64)> {
    // The stamp's magic first: most blocks of a device are not stamped.
    if bytes[..8] != *b"FBSIMBK1" {
        return None;
    }
    match decode_block(bytes) {
        Found::Write { offset, write, .. } => Some((offset / BS, write)),
        Found::Zeros | Found::Garbage(_) => None,
    }
}

/// A misdirected write armed on a node: it lands on the next write of a client's block to the
/// data region whose image block the node may claim.
#[derive(Debug)]
pub struct Misdirect {
    pub osd: OsdId,
    pub claims: Claims,
    pub seed: u64,
}

/// A misdirected write that happened: the block meant for `target` (all bytes offsets on the
/// device) was written at `landed`.
#[derive(Clone, Copy, Debug)]
pub struct Misdirected {
    pub target: u64,
    pub landed: u64,
}

/// A node's bad blocks: what its disk does wrong with data blocks. Outlives crashes.
#[derive(Debug, Default)]
pub struct BadBlocks {
    /// The data region, `[start, end)` in device bytes: bad blocks are only ever made here
    /// (a bad WAL record or superblock is another failure, tested by the store's own tests).
    pub data: (u64, u64),
    /// Sectors (device byte offsets) whose reads fail until a write covers them.
    pub unreadable: BTreeSet<u64>,
    pub misdirect: Option<Misdirect>,
    /// Misdirected writes done and not yet counted by the cluster.
    pub misdirected: Vec<Misdirected>,
}

impl BadBlocks {
    fn read_fails(&self, offset: u64, len: u64) -> bool {
        self.unreadable.range(offset..offset + len).next().is_some()
    }

    /// A write reached `offset..offset + len`: the drive remaps the sectors it covers.
    fn written(&mut self, offset: u64, len: u64) {
        if self.unreadable.range(offset..offset + len).next().is_some() {
            self.unreadable
                .retain(|s| !(offset..offset + len).contains(s));
        }
    }

    /// Where the armed misdirected write lands in `writes`, if it does now: (index of the
    /// write, block offset within it, where it lands). `image` is the device as written.
    fn misdirect_target(&self, writes: &[WriteOp<'_>], image: &[u8]) -> Option<(usize, u64, u64)> {
        let m = self.misdirect.as_ref()?;
        let claims = m.claims.lock().unwrap_or_else(|e| e.into_inner());
        let (start, end) = self.data;
        let in_batch = |at: u64| {
            writes
                .iter()
                .any(|w| (w.offset_bytes..w.offset_bytes + w.buf.len() as u64).contains(&at))
        };
        let mut rng = SplitMix64::new(m.seed);
        for (i, w) in writes.iter().enumerate() {
            let len = w.buf.len() as u64;
            if w.offset_bytes < start || w.offset_bytes + len > end {
                continue;
            }
            if (w.offset_bytes - start) % BS != 0 || len % BS != 0 {
                continue;
            }
            for k in 0..len / BS {
                let bytes = &w.buf[(k * BS) as usize..((k + 1) * BS) as usize];
                let Some((block, _)) = stamped_block(bytes) else {
                    continue;
                };
                if !may_claim(&claims, block, m.osd) {
                    continue;
                }
                let target = w.offset_bytes + k * BS;
                for _ in 0..8 {
                    let d = 1 + rng.below(MISDIRECT_BLOCKS_MAX);
                    let landed = if rng.below(2) == 0 {
                        target.checked_sub(d * BS)
                    } else {
                        target.checked_add(d * BS)
                    };
                    let Some(landed) = landed.filter(|l| *l >= start && l + BS <= end) else {
                        continue;
                    };
                    if in_batch(landed) {
                        continue;
                    }
                    let old = &image[landed as usize..(landed + BS) as usize];
                    if stamped_block(old).is_some_and(|(b, _)| !may_claim(&claims, b, m.osd)) {
                        continue;
                    }
                    return Some((i, k * BS, landed));
                }
            }
        }
        None
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fuse {
    Intact,
    /// This call is the crash point.
    BlowsNow,
    /// An earlier call was.
    Blown,
}

#[derive(Debug, Default)]
pub struct DiskFaults {
    /// I/O calls left before the crash point; `Some(0)` blows on the next call.
    pub fuse: Option<u64>,
    /// The fuse blew: every call fails until the node is crashed and reopened.
    pub blown: bool,
    /// Where the fuse blew (for probes): "disk read", "disk write", "meta write", ...
    pub blown_at: Option<&'static str>,
    /// Defer the next commit submission's sync (one-shot: cleared by it).
    pub defer_syncs: bool,
    /// Commits submitted whose sync has not completed yet.
    pub owed: usize,
    /// Commits durable and not yet reported by `reap_durable`.
    pub durable_unreported: usize,
    pub bad: BadBlocks,
}

pub type SharedFaults = Arc<Mutex<DiskFaults>>;

fn lock(f: &SharedFaults) -> MutexGuard<'_, DiskFaults> {
    f.lock().unwrap_or_else(|e| e.into_inner())
}

fn crash_point() -> io::Error {
    io::Error::other("simulated crash point")
}

impl DiskFaults {
    /// Power loss: every fault of the running node is gone, but its bad sectors stay bad (an
    /// armed misdirected write is dropped with the writes in flight).
    pub fn after_crash(&mut self) {
        let mut bad = std::mem::take(&mut self.bad);
        bad.misdirect = None;
        *self = DiskFaults {
            bad,
            ..DiskFaults::default()
        };
    }

    /// Counts one I/O call; true if this call is the crash point (or after it).
    fn fuse_blows(&mut self, what: &'static str) -> bool {
        self.fuse_state(what) != Fuse::Intact
    }

    fn fuse_state(&mut self, what: &'static str) -> Fuse {
        if self.blown {
            return Fuse::Blown;
        }
        match self.fuse.as_mut() {
            Some(0) => {
                self.blown = true;
                self.blown_at = Some(what);
                self.fuse = None;
                Fuse::BlowsNow
            }
            Some(n) => {
                *n -= 1;
                Fuse::Intact
            }
            None => Fuse::Intact,
        }
    }
}

/// The device of a node.
#[derive(Clone, Debug)]
pub struct NodeDisk {
    pub inner: SimDisk,
    pub faults: SharedFaults,
}

impl NodeDisk {
    /// The simulated fdatasync of the oldest owed commit completed: the sync happens now
    /// (covering everything written), and that one commit becomes reportable.
    pub fn complete_sync(&mut self) -> io::Result<()> {
        let mut f = lock(&self.faults);
        if f.owed == 0 {
            return Ok(());
        }
        f.owed -= 1;
        f.durable_unreported += 1;
        drop(f);
        self.inner.sync()
    }
}

/// A node's [`DataSync`] (the flush's data sync, run when the simulator releases the flush):
/// a crash point like any sync, and like any sync it covers the owed WAL commits.
struct NodeSync {
    inner: Box<dyn DataSync>,
    faults: SharedFaults,
}

impl DataSync for NodeSync {
    fn sync(&mut self) -> io::Result<()> {
        let mut f = lock(&self.faults);
        if f.fuse_blows("data sync") {
            return Err(crash_point());
        }
        f.durable_unreported += std::mem::take(&mut f.owed);
        drop(f);
        self.inner.sync()
    }
}

impl Disk for NodeDisk {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn data_sync(&self) -> Option<Box<dyn DataSync>> {
        Some(Box::new(NodeSync {
            inner: self.inner.data_sync()?,
            faults: self.faults.clone(),
        }))
    }

    fn read_many(&mut self, reads: &mut [ReadOp<'_>]) -> io::Result<()> {
        let f = &mut *lock(&self.faults);
        if f.fuse_blows("disk read") {
            return Err(crash_point());
        }
        if reads
            .iter()
            .any(|r| f.bad.read_fails(r.offset_bytes, r.buf.len() as u64))
        {
            return Err(io::Error::other("simulated latent sector error"));
        }
        self.inner.read_many(reads)
    }

    fn write_many(&mut self, writes: &[WriteOp<'_>], sync: bool) -> io::Result<()> {
        let mut f = lock(&self.faults);
        match f.fuse_state(if sync { "disk sync" } else { "disk write" }) {
            Fuse::Intact => {}
            Fuse::Blown => return Err(crash_point()),
            Fuse::BlowsNow => {
                // The crash lands while these writes are in flight: they reach the device
                // unsynced, so the crash keeps, drops or tears each of them.
                drop(f);
                self.inner.write_many(writes, false)?;
                return Err(crash_point());
            }
        }
        if sync {
            // Covers the commits in flight too.
            f.durable_unreported += std::mem::take(&mut f.owed);
        }
        let landing = if f.bad.misdirect.is_some() {
            f.bad.misdirect_target(writes, self.inner.image().bytes())
        } else {
            None
        };
        let Some((index, within, landed)) = landing else {
            for w in writes {
                f.bad.written(w.offset_bytes, w.buf.len() as u64);
            }
            drop(f);
            return self.inner.write_many(writes, sync);
        };
        // The drive puts one block of write `index` at `landed`: its target keeps its old
        // bytes (stale, or the bad copy it was), and `landed` loses its own.
        let m = f.bad.misdirect.take().expect("armed");
        let w = &writes[index];
        let target = w.offset_bytes + within;
        let moved = &w.buf[within as usize..(within + BS) as usize];
        let image = self.inner.image();
        let overwritten = stamped_block(&image.bytes()[landed as usize..(landed + BS) as usize]);
        drop(image);
        let mut claims = m.claims.lock().unwrap_or_else(|e| e.into_inner());
        claims.insert(stamped_block(moved).expect("a stamped block").0, m.osd);
        if let Some((old, _)) = overwritten {
            claims.insert(old, m.osd);
        }
        drop(claims);
        f.bad.misdirected.push(Misdirected { target, landed });
        let mut ops: Vec<WriteOp<'_>> = Vec::with_capacity(writes.len() + 2);
        for (i, op) in writes.iter().enumerate() {
            if i != index {
                ops.push(WriteOp {
                    offset_bytes: op.offset_bytes,
                    buf: op.buf,
                });
                continue;
            }
            let (head, rest) = op.buf.split_at(within as usize);
            let tail = &rest[BS as usize..];
            for (offset_bytes, buf) in [
                (op.offset_bytes, head),
                (landed, moved),
                (target + BS, tail),
            ] {
                if !buf.is_empty() {
                    ops.push(WriteOp { offset_bytes, buf });
                }
            }
        }
        for op in &ops {
            f.bad.written(op.offset_bytes, op.buf.len() as u64);
        }
        drop(f);
        self.inner.write_many(&ops, sync)
    }

    fn submit_durable(&mut self, writes: Vec<OwnedWrite>) -> io::Result<Submitted> {
        let mut f = lock(&self.faults);
        if !std::mem::take(&mut f.defer_syncs) {
            drop(f);
            return write_durable_now(self, writes);
        }
        match f.fuse_state("disk write") {
            Fuse::Intact => {}
            Fuse::Blown => return Err(crash_point()),
            Fuse::BlowsNow => {
                drop(f);
                let ops = as_ops(&writes);
                self.inner.write_many(&ops, false)?;
                return Err(crash_point());
            }
        }
        f.owed += 1;
        for w in &writes {
            f.bad.written(w.offset_bytes, w.buf.len() as u64);
        }
        drop(f);
        self.inner.write_many(&as_ops(&writes), false)?;
        Ok(Submitted::InFlight)
    }

    fn reap_durable(&mut self, wait: bool) -> io::Result<Reaped> {
        if wait && lock(&self.faults).owed > 0 {
            self.sync()?;
        }
        let mut f = lock(&self.faults);
        if f.blown {
            return Err(crash_point());
        }
        Ok(Reaped {
            count: std::mem::take(&mut f.durable_unreported),
            bufs: Vec::new(),
        })
    }

    fn discard(&mut self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        if lock(&self.faults).fuse_blows("disk discard") {
            return Err(crash_point());
        }
        self.inner.discard(offset_bytes, len_bytes)
    }
}

/// The metadata file (redb's backend) of a node.
#[derive(Clone, Debug)]
pub struct NodeFile {
    pub inner: SimFile,
    pub faults: SharedFaults,
}

impl redb::StorageBackend for NodeFile {
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }

    fn read(&self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        if lock(&self.faults).fuse_blows("meta read") {
            return Err(crash_point());
        }
        self.inner.read(offset, len)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        if lock(&self.faults).fuse_blows("meta set_len") {
            return Err(crash_point());
        }
        self.inner.set_len(len)
    }

    fn sync_data(&self, eventual: bool) -> io::Result<()> {
        if lock(&self.faults).fuse_blows("meta sync") {
            return Err(crash_point());
        }
        self.inner.sync_data(eventual)
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        match lock(&self.faults).fuse_state("meta write") {
            Fuse::Intact => {}
            Fuse::Blown => return Err(crash_point()),
            Fuse::BlowsNow => {
                // In flight at the crash: unsynced, kept, dropped or torn by the crash.
                self.inner.write(offset, data)?;
                return Err(crash_point());
            }
        }
        self.inner.write(offset, data)
    }
}

fn as_ops(writes: &[OwnedWrite]) -> Vec<WriteOp<'_>> {
    writes
        .iter()
        .map(|w| WriteOp {
            offset_bytes: w.offset_bytes,
            buf: &w.buf[..],
        })
        .collect()
}

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
//! Both wrappers share one [`DiskFaults`]; redb requires its backend to be `Send + Sync`, hence
//! the `Arc<Mutex<_>>` (there are no threads).

use fastblock_store::disk::{write_durable_now, OwnedWrite, ReadOp, Reaped, Submitted, WriteOp};
use fastblock_store::{Disk, SimDisk, SimFile};
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

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
}

pub type SharedFaults = Arc<Mutex<DiskFaults>>;

fn lock(f: &SharedFaults) -> MutexGuard<'_, DiskFaults> {
    f.lock().unwrap_or_else(|e| e.into_inner())
}

fn crash_point() -> io::Error {
    io::Error::other("simulated crash point")
}

impl DiskFaults {
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

impl Disk for NodeDisk {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn read_many(&mut self, reads: &mut [ReadOp<'_>]) -> io::Result<()> {
        if lock(&self.faults).fuse_blows("disk read") {
            return Err(crash_point());
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
        drop(f);
        self.inner.write_many(writes, sync)
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

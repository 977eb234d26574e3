//! The only door from the engine to a disk: a small synchronous trait with two
//! implementations, [`UringDisk`] (O_DIRECT + io_uring, production) and [`SimDisk`] (memory,
//! "written" vs "durable" images, seeded crashes; tests and the simulator), and one wrapper,
//! [`FaultyDisk`] (fails, delays or corrupts another disk's operations by the rules of a
//! [`FaultPlan`] replaceable at runtime; tests on real processes, a no-op without rules).
//!
//! All offsets and lengths are multiples of [`SECTOR_SIZE_BYTES`] and all buffers handed to a
//! disk are [`AlignedBuf`]s or slices of them, so O_DIRECT never needs a bounce copy.
//!
//! Batching is part of the contract: `read_many` and `write_many` hand the device many
//! operations in one submission (one `io_uring_enter`), and `write_many(.., sync: true)` makes
//! them durable with one fdatasync. That is what group commit is built on.

mod aligned;
mod faulty;
mod inflight;
mod sim;
mod uring;

pub use aligned::AlignedBuf;
pub use faulty::{
    FaultCounts, FaultKind, FaultOp, FaultPlan, FaultRule, FaultRuleError, FaultyDisk,
    FAULT_DELAY_MS_MAX, FAULT_RULES_MAX,
};
pub use sim::{Prng, SimDisk, SimFile, SimImage};
pub use uring::{CompletionWait, SyncMode, UringDisk, UringOptions};

use fastblock_types::units::SECTOR_SIZE_BYTES;
use std::io;

/// One read of a batch.
pub struct ReadOp<'a> {
    pub offset_bytes: u64,
    pub buf: &'a mut [u8],
}

/// One write of a batch.
pub struct WriteOp<'a> {
    pub offset_bytes: u64,
    pub buf: &'a [u8],
}

/// One run of a background write: `len` bytes at `buf_offset` of the buffer go to
/// `disk_offset_bytes`.
#[derive(Clone, Copy, Debug)]
pub struct BackgroundRun {
    pub buf_offset: usize,
    pub len: usize,
    pub disk_offset_bytes: u64,
}

/// A write whose buffer the disk owns until it is durable (see [`Disk::submit_durable`]).
pub struct OwnedWrite {
    pub offset_bytes: u64,
    /// Written whole.
    pub buf: AlignedBuf,
}

/// How [`Disk::submit_durable`] went.
pub enum Submitted {
    /// Durable already (a disk that syncs synchronously); the buffers come back.
    Durable(Vec<AlignedBuf>),
    /// In flight: [`Disk::reap_durable`] reports it.
    InFlight,
}

/// Submissions [`Disk::reap_durable`] found durable since the last call.
#[derive(Default)]
pub struct Reaped {
    /// How many, always the oldest ones in flight: durability is reported in submission
    /// order, so a submission reported durable means every earlier one is too.
    pub count: usize,
    /// Their buffers, for reuse.
    pub bufs: Vec<AlignedBuf>,
}

/// Makes a disk's completed writes durable from another thread: the flush's data sync runs
/// on the flusher thread, beside its metadata commit, instead of holding the thread that owns
/// the disk (see [`Disk::data_sync`]).
pub trait DataSync: Send {
    /// Makes every write of the disk that completed before this call durable, as
    /// [`Disk::sync`] would (background writes still in flight are not covered).
    fn sync(&mut self) -> io::Result<()>;
}

/// A fixed-size block device or preallocated file.
///
/// Durability contract (what `Ok` means if the machine crashes right after):
/// - a write that returned `Ok` without a later successful sync may be lost, survive whole, or
///   survive torn: any subset of its sectors may hold the new bytes, the others the old ones.
///   Sectors (512 B) are the atomic unit, never smaller.
/// - once `sync` (or `write_many(.., sync: true)`) returns `Ok`, every write that returned
///   `Ok` before it, and the writes of that same call, are durable.
/// - an `Err` leaves the state of the written range unknown; callers must fail-stop.
///
/// [`UringDisk`] with [`SyncMode::NoFlushBenchmarkOnly`] keeps this contract against a
/// killed process only, not against a power loss or host crash: it never flushes the
/// device (measurement only).
pub trait Disk {
    /// Size of the device in bytes, fixed for the life of the handle.
    fn size_bytes(&self) -> u64;

    /// Reads every op (possibly concurrently). `Ok` means every buffer is filled. Reads see all
    /// earlier writes of this handle, synced or not.
    fn read_many(&mut self, reads: &mut [ReadOp<'_>]) -> io::Result<()>;

    /// Writes every op (possibly concurrently, in any order; ops must not overlap). With
    /// `sync`, all of them and all earlier writes are durable when this returns `Ok`;
    /// without, see the trait's contract for unsynced writes.
    fn write_many(&mut self, writes: &[WriteOp<'_>], sync: bool) -> io::Result<()>;

    /// Writes `durable` and makes them durable as `write_many(durable, true)` does, while the
    /// `background` writes run alongside: they are written when this returns `Ok`, but not
    /// necessarily durable (the sync need not wait for them). Lets the WAL commit carry
    /// applied data without its fdatasync waiting on it.
    fn write_durable_with(
        &mut self,
        durable: &[WriteOp<'_>],
        background: &[WriteOp<'_>],
    ) -> io::Result<()> {
        if !background.is_empty() {
            self.write_many(background, false)?;
        }
        self.write_many(durable, true)
    }

    /// Starts writing `runs` of `buf` and may return before they are done; the disk owns
    /// `buf` until then. Until they complete they are "in flight": `read_many`,
    /// `write_many(.., sync: true)`, `sync` and `wait_background` wait for them first, so
    /// reads see them and syncs cover them; `write_many(.., false)` and
    /// `write_durable_with` do not (that is the point: applied data streams out while the
    /// WAL commits). An error of a background write is returned by the call that waits for
    /// it. Durability: like an unsynced write. Default: written synchronously.
    fn write_background(&mut self, buf: AlignedBuf, runs: &[BackgroundRun]) -> io::Result<()> {
        let writes: Vec<WriteOp<'_>> = runs
            .iter()
            .map(|r| WriteOp {
                offset_bytes: r.disk_offset_bytes,
                buf: &buf[r.buf_offset..r.buf_offset + r.len],
            })
            .collect();
        self.write_many(&writes, false)
    }

    /// Starts writing `writes` and making them durable, and may return before they are
    /// (several WAL group commits in flight at once). Until reported durable they are
    /// "in flight": reads of their ranges are the caller's to avoid, and
    /// `write_many(.., sync: true)`, `sync` and `write_durable_with` wait for them first, so a
    /// synchronous sync still covers every earlier write. A failed submission is reported by
    /// the `reap_durable` that finds it; the caller must then fail-stop. Default: synchronous.
    fn submit_durable(&mut self, writes: Vec<OwnedWrite>) -> io::Result<Submitted> {
        write_durable_now(self, writes)
    }

    /// Reports the submissions of [`Disk::submit_durable`] that became durable since the last
    /// call, oldest first. With `wait`, waits until every one in flight is. Default: nothing
    /// is ever in flight.
    fn reap_durable(&mut self, wait: bool) -> io::Result<Reaped> {
        let _ = wait;
        Ok(Reaped::default())
    }

    /// Waits for every background write; returns the first error among them.
    fn wait_background(&mut self) -> io::Result<()> {
        Ok(())
    }

    /// A mark of the background writes started so far, for [`Disk::background_written`].
    /// Default: background writes are synchronous, so none is ever in flight.
    fn background_mark(&self) -> u64 {
        0
    }

    /// Whether every background write started before `mark` was taken has completed,
    /// without waiting (completions that arrived are collected; writes started later do not
    /// count); returns the first error of a background write.
    fn background_written(&mut self, mark: u64) -> io::Result<bool> {
        let _ = mark;
        Ok(true)
    }

    /// A handle that syncs this disk from another thread, if the disk has one; `None` makes
    /// the owner sync on its own thread. Writes must have completed (`write_many` returned,
    /// `wait_background` done) before the handle's sync can cover them.
    fn data_sync(&self) -> Option<Box<dyn DataSync>> {
        None
    }

    /// Makes every earlier successful write durable (fdatasync).
    fn sync(&mut self) -> io::Result<()> {
        self.write_many(&[], true)
    }

    /// Tells the device the range is unused. Afterwards the range reads as either its old
    /// content or zeros, also after a crash; the engine never relies on which.
    fn discard(&mut self, offset_bytes: u64, len_bytes: u64) -> io::Result<()>;

    fn read(&mut self, offset_bytes: u64, buf: &mut [u8]) -> io::Result<()> {
        self.read_many(&mut [ReadOp { offset_bytes, buf }])
    }

    fn write(&mut self, offset_bytes: u64, buf: &[u8], sync: bool) -> io::Result<()> {
        self.write_many(&[WriteOp { offset_bytes, buf }], sync)
    }
}

/// [`Disk::submit_durable`] done synchronously: written and synced before returning.
pub fn write_durable_now<D: Disk + ?Sized>(
    disk: &mut D,
    writes: Vec<OwnedWrite>,
) -> io::Result<Submitted> {
    let ops: Vec<WriteOp<'_>> = writes
        .iter()
        .map(|w| WriteOp {
            offset_bytes: w.offset_bytes,
            buf: &w.buf[..],
        })
        .collect();
    disk.write_durable_with(&ops, &[])?;
    drop(ops);
    Ok(Submitted::Durable(
        writes.into_iter().map(|w| w.buf).collect(),
    ))
}

/// Checks the alignment preconditions shared by every implementation. A violation is an engine
/// bug, so it panics rather than returning an error.
pub(crate) fn assert_io_aligned(what: &str, offset_bytes: u64, len_bytes: u64, size_bytes: u64) {
    assert!(
        offset_bytes.is_multiple_of(SECTOR_SIZE_BYTES),
        "{what}: offset {offset_bytes} not sector aligned"
    );
    assert!(
        len_bytes.is_multiple_of(SECTOR_SIZE_BYTES),
        "{what}: length {len_bytes} not sector aligned"
    );
    assert!(
        offset_bytes
            .checked_add(len_bytes)
            .is_some_and(|end| end <= size_bytes),
        "{what}: range {offset_bytes}+{len_bytes} past the device end {size_bytes}"
    );
}

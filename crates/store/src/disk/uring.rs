//! The production disk: O_DIRECT on a regular file or block device, driven through io_uring
//! synchronously (submit a batch, wait for all of it). If the ring cannot be set up (old
//! kernel, seccomp, RLIMIT_MEMLOCK) it falls back to pread/pwrite with O_DIRECT and logs why.

use super::inflight::{CommitSync, InFlight, WRITES_PER_COMMIT_MAX};
use super::{
    assert_io_aligned, write_durable_now, AlignedBuf, BackgroundRun, DataSync, Disk, OwnedWrite,
    ReadOp, Reaped, Submitted, WriteOp,
};
use io_uring::{opcode, squeue, types, IoUring};
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How `write_many(.., sync: true)` makes a batch durable. Which is fastest depends on the
/// kernel, device and file system, so the benchmark can measure each (`--sync`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncMode {
    /// The writes, then an fdatasync in the same submission: chained to the WAL write
    /// (IOSQE_IO_LINK) in `write_durable_with`, draining all writes (IOSQE_IO_DRAIN) otherwise.
    Fdatasync,
    /// Each write carries RWF_DSYNC; no separate fdatasync. The default: one completion per
    /// commit, and on the 2-vCPU VM of docs/benchmarks.md 93 µs per commit against
    /// `TwoStep`'s 118 at one writer (bench/store-bench.sh, 2026-11-24).
    DsyncWrites,
    /// The writes through the ring, then fdatasync(2) called directly (no io-wq hop).
    FdatasyncSyscall,
    /// The writes, waited for, then a separate `IORING_OP_FSYNC` submission (what fio's
    /// io_uring engine does with `fdatasync=1`). It beat the single linked submission by
    /// ~20 % at one writer on the test VM (115 vs 140 µs per commit).
    TwoStep,
    /// MEASUREMENT ONLY, never for data: no device flush at all. The writes are the same
    /// O_DIRECT writes as with `DsyncWrites`, and a sync or commit still returns (or is
    /// reported) only once they completed, in the same order and through the same code path,
    /// but no write carries RWF_DSYNC and no fdatasync is issued, so "durable" means "accepted
    /// by the device", perhaps only into its volatile cache: a power loss or host crash loses
    /// acknowledged writes (a killed process loses nothing, the writes are the kernel's).
    /// Skipped: every flush this disk would issue (WAL commits, the sync of applied data
    /// before a metadata commit, segment rolls, [`Disk::sync`]). Kept: what does not go
    /// through this disk (redb's fsync of the metadata file, [`UringDisk::create_file`]).
    /// It lets a benchmark show the software's own latency and CPU beside the durable
    /// figures, the row to hold against a peer that runs without flushes; the OSD refuses it
    /// unless the benchmark acknowledges the loss (`fastblock-osd --wal-sync`).
    NoFlushBenchmarkOnly,
}

#[derive(Clone, Debug)]
pub struct UringOptions {
    pub ring_entries: u32,
    pub sync_mode: SyncMode,
    /// Skip io_uring and use pread/pwrite (tests the fallback path).
    pub force_fallback: bool,
}

impl Default for UringOptions {
    fn default() -> Self {
        UringOptions {
            ring_entries: 128,
            sync_mode: SyncMode::DsyncWrites,
            force_fallback: false,
        }
    }
}

pub struct UringDisk {
    file: File,
    ring: Option<IoUring>,
    size_bytes: u64,
    options: UringOptions,
    background: Background,
    /// WAL commits submitted without waiting ([`Disk::submit_durable`]).
    commits: InFlight,
    /// Some write since the last fdatasync was not itself durable. With
    /// [`SyncMode::DsyncWrites`], RWF_DSYNC makes only its own write durable (a FUA write
    /// does not flush the device cache), so `write_many(.., sync: true)`, which promises
    /// every earlier write, adds an fdatasync when this is set.
    unsynced: bool,
    /// fdatasyncs issued (tests check which calls sync).
    fdatasyncs: u64,
    /// fdatasyncs issued through [`Disk::data_sync`] handles, on other threads.
    handle_fdatasyncs: Arc<AtomicU64>,
    /// Writes issued with RWF_DSYNC (tests check which modes flush).
    dsync_writes: u64,
    /// An eventfd is registered with the ring (see [`UringDisk::register_eventfd`]).
    eventfd_registered: bool,
}

impl Drop for UringDisk {
    fn drop(&mut self) {
        // Never free a buffer the kernel may still read from.
        if self.ring.is_some() {
            if let Err(e) = self.wait_background() {
                tracing::error!(error = %e, "background write failed at close");
            }
            if let Err(e) = self.wait_commits() {
                tracing::error!(error = %e, "WAL commit failed at close");
            }
        }
    }
}

/// Tags the user data of background writes, so that foreground waits can tell them apart.
const BACKGROUND_TAG: u64 = 1 << 63;

/// What [`UringDisk::wait_completion`] saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompletionWait {
    /// The ring holds a completion (false: the timeout passed or a signal came first).
    pub ready: bool,
    /// A completion was posted while the eventfd's signal was on, so the eventfd may be
    /// signalled: the caller drains it before its event loop waits on it again.
    pub signalled: bool,
}

/// Buffers of background writes in flight at most; one more waits for the oldest.
const BACKGROUND_BUFS_MAX: usize = 2;

/// Background writes in flight: their buffers (kept alive until the kernel is done) and the
/// first error, reported by the next call that waits for them.
#[derive(Default)]
struct Background {
    /// buffer id -> (buffer, ops still in flight)
    bufs: BTreeMap<u64, (AlignedBuf, usize)>,
    /// op user data -> (buffer id, expected bytes)
    ops: BTreeMap<u64, (u64, usize)>,
    next_op: u64,
    next_buf: u64,
    error: Option<io::Error>,
}

/// Resubmissions of a batch whose entries a signal interrupted, before the error is returned.
const INTERRUPTED_RETRIES_MAX: u32 = 64;

/// An entry that ended without effect because of a signal (see [`UringDisk::run`]).
fn interrupted_op(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::ECANCELED)
    )
}

impl Background {
    fn complete(&mut self, user_data: u64, res: i32) {
        let (buf, expect) = self
            .ops
            .remove(&user_data)
            .expect("completion of an unknown background write");
        if res < 0 {
            self.error.get_or_insert(io::Error::from_raw_os_error(-res));
        } else if res as usize != expect {
            self.error.get_or_insert(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("short background write: {res} of {expect} bytes"),
            ));
        }
        let entry = self
            .bufs
            .get_mut(&buf)
            .expect("buffer of a background write");
        entry.1 -= 1;
        if entry.1 == 0 {
            self.bufs.remove(&buf);
        }
    }
}

impl std::fmt::Debug for UringDisk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringDisk")
            .field("size_bytes", &self.size_bytes)
            .field("uring", &self.ring.is_some())
            .finish()
    }
}

const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;

impl UringDisk {
    /// Opens an existing file or block device with O_DIRECT. A regular file must already have
    /// its final size (see [`UringDisk::create_file`]).
    /// fdatasyncs issued so far (io_uring or syscall).
    pub fn fdatasync_count(&self) -> u64 {
        self.fdatasyncs + self.commits.fsyncs + self.handle_fdatasyncs.load(Ordering::Relaxed)
    }

    /// Writes issued with RWF_DSYNC so far (io_uring only; the fallback has no such flag).
    pub fn dsync_write_count(&self) -> u64 {
        self.dsync_writes + self.commits.dsync_writes
    }

    /// Whether a sync flushes the device: false only with
    /// [`SyncMode::NoFlushBenchmarkOnly`].
    fn flushes(&self) -> bool {
        self.options.sync_mode != SyncMode::NoFlushBenchmarkOnly
    }

    /// Has the kernel signal `eventfd` when operations complete while WAL commits are in
    /// flight, so that an event loop can wait for them (then call [`Disk::reap_durable`]).
    /// With no commit in flight the signal is switched off (`IORING_CQ_EVENTFD_DISABLED`, a
    /// flag in the shared ring, no system call): the reads and synchronous writes this disk
    /// waits for itself would otherwise wake the loop once more for nothing (measured: two
    /// loop iterations per 4 KiB read instead of one). Fails without io_uring, where every
    /// commit is synchronous and nothing needs waiting for.
    pub fn register_eventfd(&mut self, eventfd: std::os::fd::RawFd) -> io::Result<()> {
        match &mut self.ring {
            Some(ring) => {
                ring.submitter().register_eventfd(eventfd)?;
                self.eventfd_registered = true;
                self.update_eventfd_signal();
                Ok(())
            }
            None => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "no io_uring: WAL commits are synchronous",
            )),
        }
    }

    /// Signals the eventfd exactly while commits are in flight. Called before a commit's
    /// operations are submitted (so its completions signal) and after finished commits are
    /// taken (so later synchronous completions do not).
    fn update_eventfd_signal(&mut self) {
        if !self.eventfd_registered {
            return;
        }
        let Some(ring) = self.ring.as_mut() else {
            return;
        };
        let cq = ring.completion();
        if self.commits.is_empty() {
            cq.disable_eventfd();
        } else {
            cq.enable_eventfd();
        }
    }

    /// Whether a WAL commit completion waits to be reported ([`Disk::reap_durable`]): on the
    /// ring, or taken off it already by another call. The owner's loop checks this on its
    /// timer, since a completion that came while the eventfd's signal was off, then taken
    /// off the ring by a read or a look at the background writes, would never signal.
    pub fn commits_reportable(&mut self) -> bool {
        let Some(ring) = self.ring.as_mut() else {
            return false;
        };
        !self.commits.is_empty() && (!ring.completion().is_empty() || self.commits.front_finished())
    }

    /// Blocks until the ring holds a completion or `timeout` passes, in one system call
    /// (`io_uring_enter` with `GETEVENTS` and a timeout), with the eventfd's signal switched
    /// off meanwhile: the completions this thread waits for on the ring need not also wake its
    /// event loop. It replaces waiting on the eventfd with `poll`, which cost three system
    /// calls per WAL commit (the completion's task work interrupts the `poll`, which restarts,
    /// then a `read` drains the eventfd). The completions stay in the ring for
    /// [`Disk::reap_durable`]. `None` when this disk cannot wait on its ring (no io_uring, or a
    /// kernel without `IORING_FEAT_EXT_ARG`, before 5.11): wait on the eventfd instead.
    pub fn wait_completion(&mut self, timeout: Duration) -> io::Result<Option<CompletionWait>> {
        let Some(ring) = self.ring.as_mut() else {
            return Ok(None);
        };
        if !ring.params().is_feature_ext_arg() {
            return Ok(None);
        }
        // A completion already there was posted with the signal on (it is on while commits
        // are in flight): the eventfd may be signalled.
        if !ring.completion().is_empty() {
            return Ok(Some(CompletionWait {
                ready: true,
                signalled: self.eventfd_registered,
            }));
        }
        // A commit whose completion another call took off the ring already (a read, or a look
        // at the background writes) waits to be reported: its completion may have come while
        // the signal was off, so no eventfd will tell.
        if self.commits.front_finished() {
            return Ok(Some(CompletionWait {
                ready: true,
                signalled: false,
            }));
        }
        ring.completion().disable_eventfd();
        // One may have been posted before the signal went off.
        let mut wait = CompletionWait {
            ready: !ring.completion().is_empty(),
            signalled: false,
        };
        wait.signalled = wait.ready && self.eventfd_registered;
        if !wait.ready {
            let ts = types::Timespec::from(timeout);
            let args = types::SubmitArgs::new().timespec(&ts);
            match ring.submitter().submit_with_args(1, &args) {
                Ok(_) => {}
                // The timeout, a signal, or a ring busy with completions the loop has not
                // taken: the caller looks at what is there and goes on.
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::ETIME | libc::EINTR | libc::EBUSY | libc::EAGAIN)
                    ) => {}
                Err(e) => {
                    self.update_eventfd_signal();
                    return Err(e);
                }
            }
            wait.ready = !ring.completion().is_empty();
        }
        self.update_eventfd_signal();
        // One posted between the look above and the signal coming back on signalled
        // nothing: report it here, or only the owner's next timer would find it. (One posted
        // just after may have signalled: the caller drains, which is harmless if not.)
        if !wait.ready {
            if let Some(ring) = self.ring.as_mut() {
                wait.ready = !ring.completion().is_empty();
                wait.signalled = wait.ready && self.eventfd_registered;
            }
        }
        Ok(Some(wait))
    }

    pub fn open(path: &Path, options: UringOptions) -> io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)?;
        let meta = file.metadata()?;
        let size_bytes = if meta.file_type().is_block_device() {
            let mut size: u64 = 0;
            // SAFETY: BLKGETSIZE64 writes one u64 through the valid pointer we pass.
            let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut size as *mut u64) };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
            size
        } else {
            meta.len()
        };
        let ring = if options.force_fallback {
            None
        } else {
            match IoUring::new(options.ring_entries) {
                Ok(r) => Some(r),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e,
                        "io_uring setup failed; falling back to pread/pwrite with O_DIRECT");
                    None
                }
            }
        };
        let commit_sync = match options.sync_mode {
            SyncMode::DsyncWrites => CommitSync::DsyncWrites,
            SyncMode::NoFlushBenchmarkOnly => CommitSync::Skipped,
            SyncMode::Fdatasync | SyncMode::FdatasyncSyscall | SyncMode::TwoStep => {
                CommitSync::Fdatasync
            }
        };
        let commits = InFlight::new(types::Fd(file.as_raw_fd()), commit_sync);
        Ok(UringDisk {
            file,
            commits,
            ring,
            size_bytes: size_bytes - size_bytes % super::SECTOR_SIZE_BYTES,
            options,
            background: Background::default(),
            unsynced: false,
            fdatasyncs: 0,
            handle_fdatasyncs: Arc::new(AtomicU64::new(0)),
            dsync_writes: 0,
            eventfd_registered: false,
        })
    }

    /// Creates (or extends) a regular file of `size_bytes` and writes zeros over all of it,
    /// so that later O_DIRECT overwrites and fdatasync never have to convert unwritten
    /// extents (on ext4 that conversion costs a journal commit per sync).
    pub fn create_file(path: &Path, size_bytes: u64) -> io::Result<()> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(libc::O_DIRECT)
            .open(path)?;
        file.set_len(size_bytes)?;
        let chunk = super::AlignedBuf::zeroed(1 << 20);
        let mut pos = 0;
        while pos < size_bytes {
            let n = (size_bytes - pos).min(chunk.len() as u64) as usize;
            file.write_all_at(&chunk[..n], pos)?;
            pos += n as u64;
        }
        file.sync_all()
    }

    pub fn uses_io_uring(&self) -> bool {
        self.ring.is_some()
    }

    /// Submits `sqes` (at most the ring size) and waits for all of them.
    /// Runs `sqes` to completion; resubmits them all (reads and writes of the same buffers at
    /// the same offsets, and syncs, are idempotent) when an entry ended without effect because
    /// of a signal: -EINTR or -EAGAIN from the operation, or -ECANCELED for the entries linked
    /// after it. Seen under load with a signal storm (`tests/uring_signals.rs`).
    fn run(
        ring: &mut IoUring,
        background: &mut Background,
        commits: &mut InFlight,
        sqes: &[(squeue::Entry, usize)],
    ) -> io::Result<()> {
        let mut attempts = 0;
        loop {
            match Self::run_once(ring, background, commits, sqes) {
                Err(e) if interrupted_op(&e) && attempts < INTERRUPTED_RETRIES_MAX => {
                    attempts += 1;
                }
                other => return other,
            }
        }
    }

    fn run_once(
        ring: &mut IoUring,
        background: &mut Background,
        commits: &mut InFlight,
        sqes: &[(squeue::Entry, usize)],
    ) -> io::Result<()> {
        {
            let mut sq = ring.submission();
            for (sqe, _) in sqes {
                // SAFETY: every buffer referenced by the entries outlives this call, which
                // waits for all completions before returning.
                unsafe { sq.push(sqe) }.map_err(|_| io::Error::other("submission queue full"))?;
            }
        }
        // Wait until every entry has completed. A signal (ptrace, SIGCHLD, a profiler) can end
        // the wait early with EINTR or with fewer completions: wait again, never give up on
        // entries the kernel still owns (their buffers must outlive them).
        let mut first_err = None;
        let mut seen = 0;
        while seen < sqes.len() {
            match ring.submit_and_wait(sqes.len() - seen) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
                Err(e) => {
                    // The entries may still be in flight; wait for them before returning so
                    // no buffer is freed under the kernel.
                    for _ in 0..10_000 {
                        if seen == sqes.len() {
                            return Err(e);
                        }
                        let _ = ring.submit_and_wait(sqes.len() - seen);
                        let cqes: Vec<_> = ring.completion().collect();
                        for cqe in cqes {
                            if cqe.user_data() & BACKGROUND_TAG != 0 {
                                background.complete(cqe.user_data(), cqe.result());
                            } else if InFlight::owns(cqe.user_data()) {
                                commits.complete(cqe.user_data(), cqe.result());
                            } else {
                                seen += 1;
                            }
                        }
                    }
                    // Freeing buffers the kernel may still write to is not an option: stop.
                    panic!(
                        "io_uring failed ({e}) with {} entries still in flight",
                        sqes.len() - seen
                    );
                }
            }
            let cqes: Vec<_> = ring.completion().collect();
            for cqe in cqes {
                if cqe.user_data() & BACKGROUND_TAG != 0 {
                    background.complete(cqe.user_data(), cqe.result());
                    continue;
                }
                if InFlight::owns(cqe.user_data()) {
                    commits.complete(cqe.user_data(), cqe.result());
                    continue;
                }
                seen += 1;
                let (_, expect) = sqes[cqe.user_data() as usize];
                let res = cqe.result();
                if res < 0 {
                    let e = io::Error::from_raw_os_error(-res);
                    // A real error outranks an interrupted entry (which is retried).
                    if first_err.as_ref().is_none_or(interrupted_op) && !interrupted_op(&e) {
                        first_err = Some(e);
                    } else {
                        first_err.get_or_insert(e);
                    }
                } else if res as usize != expect {
                    first_err.get_or_insert(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("short I/O: {res} of {expect} bytes"),
                    ));
                }
            }
            // Commits whose writes completed meanwhile start their fdatasync now.
            commits.push(ring)?;
        }
        assert_eq!(
            seen,
            sqes.len(),
            "io_uring returned more completions than submissions"
        );

        first_err.map_or(Ok(()), Err)
    }

    /// Handles the completions waiting in the ring while no synchronous batch is running:
    /// background writes and commits in flight (whose next operations go out).
    fn route_async(
        ring: &mut IoUring,
        background: &mut Background,
        commits: &mut InFlight,
    ) -> io::Result<()> {
        let cqes: Vec<_> = ring.completion().collect();
        for cqe in cqes {
            if cqe.user_data() & BACKGROUND_TAG != 0 {
                background.complete(cqe.user_data(), cqe.result());
            } else {
                assert!(
                    InFlight::owns(cqe.user_data()),
                    "foreground completion while only background writes and commits are in flight"
                );
                commits.complete(cqe.user_data(), cqe.result());
            }
        }
        commits.push(ring)
    }

    /// Waits for at least one completion (a signal or a busy ring just retries), then handles
    /// what arrived ([`UringDisk::route_async`]).
    fn wait_async(
        ring: &mut IoUring,
        background: &mut Background,
        commits: &mut InFlight,
    ) -> io::Result<()> {
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
            Err(e) => return Err(e),
        }
        Self::route_async(ring, background, commits)
    }

    /// Waits until every commit in flight finished (durable or failed); they stay queued for
    /// [`Disk::reap_durable`] to report.
    fn wait_commits_finished(&mut self) -> io::Result<()> {
        let Some(ring) = self.ring.as_mut() else {
            return Ok(());
        };
        while !self.commits.all_finished() {
            Self::wait_async(ring, &mut self.background, &mut self.commits)?;
        }
        Ok(())
    }

    /// [`UringDisk::wait_commits_finished`], failing if one of them failed.
    fn wait_commits(&mut self) -> io::Result<()> {
        if self.commits.is_empty() {
            return Ok(());
        }
        self.wait_commits_finished()?;
        match self.commits.failure() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn chunk_len(&self) -> usize {
        // Leave room for the trailing fsync.
        (self.options.ring_entries as usize)
            .saturating_sub(1)
            .max(1)
    }

    /// `write_many`, where `cover_earlier: false` asks only `writes` to be durable (a WAL
    /// commit), not every earlier write (a flush of applied data).
    fn write_batch(
        &mut self,
        writes: &[WriteOp<'_>],
        sync: bool,
        cover_earlier: bool,
    ) -> io::Result<()> {
        if sync {
            // A sync covers every earlier write, background ones and commits in flight
            // included.
            self.wait_background()?;
            self.wait_commits()?;
        }
        // What a sync adds to waiting for the writes: the flush, unless flushes are skipped
        // (`SyncMode::NoFlushBenchmarkOnly`, which keeps everything else).
        let flush = sync && self.flushes();
        for w in writes {
            assert_io_aligned("write", w.offset_bytes, w.buf.len() as u64, self.size_bytes);
            assert_eq!(w.buf.as_ptr() as usize % 512, 0, "unaligned write buffer");
        }
        let fd = types::Fd(self.file.as_raw_fd());
        let chunk = self.chunk_len();
        let dsync = self.options.sync_mode == SyncMode::DsyncWrites;
        let Some(ring) = self.ring.as_mut() else {
            for w in writes {
                self.file.write_all_at(w.buf, w.offset_bytes)?;
            }
            if flush {
                self.file.sync_data()?;
                self.fdatasyncs += 1;
                self.unsynced = false;
            } else if !writes.is_empty() {
                self.unsynced = true;
            }
            return Ok(());
        };
        // RWF_DSYNC covers only its own writes: an fdatasync too when earlier writes are owed.
        let dsync_fsync = dsync && (writes.is_empty() || (cover_earlier && self.unsynced));
        let groups: Vec<&[WriteOp<'_>]> = if writes.is_empty() {
            vec![&[]]
        } else {
            writes.chunks(chunk).collect()
        };
        let group_count = groups.len();
        for (g, group) in groups.into_iter().enumerate() {
            let last = g + 1 == group_count;
            let mut sqes: Vec<_> = group
                .iter()
                .enumerate()
                .map(|(i, w)| {
                    let mut op = opcode::Write::new(fd, w.buf.as_ptr(), w.buf.len() as u32)
                        .offset(w.offset_bytes);
                    if flush && dsync {
                        op = op.rw_flags(libc::RWF_DSYNC);
                    }
                    (op.build().user_data(i as u64), w.buf.len())
                })
                .collect();
            if flush && dsync {
                self.dsync_writes += sqes.len() as u64;
            }
            // With RWF_DSYNC every write is durable on completion, so only a bare sync (no
            // writes at all) needs an fdatasync.
            let syscall = self.options.sync_mode == SyncMode::FdatasyncSyscall;
            if last && flush && self.options.sync_mode == SyncMode::TwoStep && !sqes.is_empty() {
                Self::run(ring, &mut self.background, &mut self.commits, &sqes)?;
                sqes.clear();
                self.fdatasyncs += 1;
                let fsync = opcode::Fsync::new(fd)
                    .flags(types::FsyncFlags::DATASYNC)
                    .build()
                    .user_data(0);
                sqes.push((fsync, 0));
                Self::run(ring, &mut self.background, &mut self.commits, &sqes)?;
                continue;
            }
            if last && flush && !syscall && (!dsync || dsync_fsync) {
                let i = sqes.len() as u64;
                self.fdatasyncs += 1;
                let fsync = opcode::Fsync::new(fd)
                    .flags(types::FsyncFlags::DATASYNC)
                    .build()
                    .flags(squeue::Flags::IO_DRAIN)
                    .user_data(i);
                sqes.push((fsync, 0));
            }
            if !sqes.is_empty() {
                Self::run(ring, &mut self.background, &mut self.commits, &sqes)?;
            }
            if last && flush && syscall {
                self.file.sync_data()?;
                self.fdatasyncs += 1;
            }
        }
        if flush && (!dsync || dsync_fsync) {
            // Background writes were waited for above: the fdatasync covered everything.
            self.unsynced = false;
        } else if !flush && !writes.is_empty() {
            self.unsynced = true;
        }
        Ok(())
    }
}

/// [`UringDisk`]'s [`DataSync`]: fdatasync(2) on a duplicate of its descriptor, from the
/// calling thread (the flusher's). Skipped, like every device flush, in
/// [`SyncMode::NoFlushBenchmarkOnly`].
struct FileSync {
    file: File,
    flushes: bool,
    count: Arc<AtomicU64>,
}

impl DataSync for FileSync {
    fn sync(&mut self) -> io::Result<()> {
        if self.flushes {
            self.file.sync_data()?;
            self.count.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

impl Disk for UringDisk {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn data_sync(&self) -> Option<Box<dyn DataSync>> {
        // Without a duplicate descriptor the owner syncs on its own thread, as before.
        let file = self.file.try_clone().ok()?;
        Some(Box::new(FileSync {
            file,
            flushes: self.flushes(),
            count: self.handle_fdatasyncs.clone(),
        }))
    }

    fn read_many(&mut self, reads: &mut [ReadOp<'_>]) -> io::Result<()> {
        // Reads must see background writes (a CoW block may be read right after its apply).
        self.wait_background()?;
        for r in reads.iter() {
            assert_io_aligned("read", r.offset_bytes, r.buf.len() as u64, self.size_bytes);
            assert_eq!(r.buf.as_ptr() as usize % 512, 0, "unaligned read buffer");
        }
        let fd = types::Fd(self.file.as_raw_fd());
        let chunk = self.chunk_len();
        let Some(ring) = self.ring.as_mut() else {
            for r in reads.iter_mut() {
                self.file.read_exact_at(r.buf, r.offset_bytes)?;
            }
            return Ok(());
        };
        for group in reads.chunks_mut(chunk) {
            let sqes: Vec<_> = group
                .iter_mut()
                .enumerate()
                .map(|(i, r)| {
                    let len = r.buf.len();
                    let sqe = opcode::Read::new(fd, r.buf.as_mut_ptr(), len as u32)
                        .offset(r.offset_bytes)
                        .build()
                        .user_data(i as u64);
                    (sqe, len)
                })
                .collect();
            Self::run(ring, &mut self.background, &mut self.commits, &sqes)?;
        }
        Ok(())
    }

    fn write_many(&mut self, writes: &[WriteOp<'_>], sync: bool) -> io::Result<()> {
        self.write_batch(writes, sync, true)
    }

    fn write_durable_with(
        &mut self,
        durable: &[WriteOp<'_>],
        background: &[WriteOp<'_>],
    ) -> io::Result<()> {
        // Durable after the commits in flight, as every sync is.
        self.wait_commits()?;
        let total = durable.len() + background.len() + 1;
        let flush = self.flushes();
        let Some(ring) = self.ring.as_mut() else {
            for w in background.iter().chain(durable) {
                self.file.write_all_at(w.buf, w.offset_bytes)?;
            }
            if flush {
                self.file.sync_data()?;
                self.fdatasyncs += 1;
                self.unsynced = false;
            } else if !background.is_empty() || !durable.is_empty() {
                self.unsynced = true;
            }
            return Ok(());
        };
        let linked = self.options.sync_mode == SyncMode::Fdatasync;
        let two_step = self.options.sync_mode == SyncMode::TwoStep;
        if !(linked || two_step) || durable.is_empty() || total > self.options.ring_entries as usize
        {
            if !background.is_empty() {
                self.write_many(background, false)?;
            }
            // Only the durable writes are promised (RWF_DSYNC needs no fdatasync for them).
            return self.write_batch(durable, true, false);
        }
        if two_step {
            // All writes in one submission, then the fdatasync on its own.
            let all: Vec<WriteOp<'_>> = background
                .iter()
                .chain(durable)
                .map(|w| WriteOp {
                    offset_bytes: w.offset_bytes,
                    buf: w.buf,
                })
                .collect();
            self.write_many(&all, false)?;
            // The fdatasync on its own, not waiting for background writes: the WAL batch is
            // what must be durable here.
            let fd = types::Fd(self.file.as_raw_fd());
            self.fdatasyncs += 1;
            let fsync = opcode::Fsync::new(fd)
                .flags(types::FsyncFlags::DATASYNC)
                .build()
                .user_data(0);
            let ring = self.ring.as_mut().expect("checked above");
            Self::run(ring, &mut self.background, &mut self.commits, &[(fsync, 0)])?;
            self.unsynced = false;
            return Ok(());
        }
        for w in background.iter().chain(durable) {
            assert_io_aligned("write", w.offset_bytes, w.buf.len() as u64, self.size_bytes);
            assert_eq!(w.buf.as_ptr() as usize % 512, 0, "unaligned write buffer");
        }
        let fd = types::Fd(self.file.as_raw_fd());
        let mut sqes = Vec::with_capacity(total);
        for w in background {
            let op =
                opcode::Write::new(fd, w.buf.as_ptr(), w.buf.len() as u32).offset(w.offset_bytes);
            sqes.push((op.build().user_data(sqes.len() as u64), w.buf.len()));
        }
        // The durable writes form a chain ending in the fdatasync (IOSQE_IO_LINK), so the
        // sync starts when they are done and does not wait for the background writes.
        for w in durable {
            let op =
                opcode::Write::new(fd, w.buf.as_ptr(), w.buf.len() as u32).offset(w.offset_bytes);
            let sqe = op
                .build()
                .flags(squeue::Flags::IO_LINK)
                .user_data(sqes.len() as u64);
            sqes.push((sqe, w.buf.len()));
        }
        self.fdatasyncs += 1;
        let fsync = opcode::Fsync::new(fd)
            .flags(types::FsyncFlags::DATASYNC)
            .build()
            .user_data(sqes.len() as u64);
        sqes.push((fsync, 0));
        if !background.is_empty() {
            // Not linked to the fdatasync: they may complete after it.
            self.unsynced = true;
        }
        Self::run(ring, &mut self.background, &mut self.commits, &sqes)
    }

    fn write_background(&mut self, buf: AlignedBuf, runs: &[BackgroundRun]) -> io::Result<()> {
        if self.ring.is_none() || runs.len() + 1 >= self.options.ring_entries as usize {
            let writes: Vec<WriteOp<'_>> = runs
                .iter()
                .map(|r| WriteOp {
                    offset_bytes: r.disk_offset_bytes,
                    buf: &buf[r.buf_offset..r.buf_offset + r.len],
                })
                .collect();
            return self.write_many(&writes, false);
        }
        if runs.is_empty() {
            return Ok(());
        }
        self.unsynced = true;
        for r in runs {
            assert!(
                r.buf_offset + r.len <= buf.len(),
                "background run outside its buffer"
            );
            assert_io_aligned(
                "background write",
                r.disk_offset_bytes,
                r.len as u64,
                self.size_bytes,
            );
        }
        if self.background.bufs.len() >= BACKGROUND_BUFS_MAX {
            self.wait_background()?;
        }
        let fd = types::Fd(self.file.as_raw_fd());
        let id = self.background.next_buf;
        self.background.next_buf += 1;
        let ring = self.ring.as_mut().expect("checked");
        {
            let mut sq = ring.submission();
            if sq.capacity() - sq.len() < runs.len() {
                drop(sq);
                // No room: make it synchronous rather than overflow the ring.
                let writes: Vec<WriteOp<'_>> = runs
                    .iter()
                    .map(|r| WriteOp {
                        offset_bytes: r.disk_offset_bytes,
                        buf: &buf[r.buf_offset..r.buf_offset + r.len],
                    })
                    .collect();
                return self.write_many(&writes, false);
            }
            for r in runs {
                let user_data = BACKGROUND_TAG | self.background.next_op;
                self.background.next_op += 1;
                let ptr = buf[r.buf_offset..].as_ptr();
                let sqe = opcode::Write::new(fd, ptr, r.len as u32)
                    .offset(r.disk_offset_bytes)
                    .build()
                    .user_data(user_data);
                // SAFETY: the buffer moves into `self.background` below and stays there (its
                // heap allocation does not move) until every write of it has completed.
                unsafe { sq.push(&sqe) }.map_err(|_| io::Error::other("submission queue full"))?;
                self.background.ops.insert(user_data, (id, r.len));
            }
        }
        self.background.bufs.insert(id, (buf, runs.len()));
        match ring.submit() {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn wait_background(&mut self) -> io::Result<()> {
        while !self.background.ops.is_empty() {
            let ring = self.ring.as_mut().expect("background writes need the ring");
            Self::wait_async(ring, &mut self.background, &mut self.commits)?;
        }
        match self.background.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn background_mark(&self) -> u64 {
        self.background.next_buf
    }

    fn background_written(&mut self, mark: u64) -> io::Result<bool> {
        if let Some(ring) = self.ring.as_mut() {
            Self::route_async(ring, &mut self.background, &mut self.commits)?;
        }
        if let Some(e) = self.background.error.take() {
            return Err(e);
        }
        // Buffer ids grow with each background write; a buffer leaves the map when its
        // last write completed.
        Ok(self.background.bufs.range(..mark).next().is_none())
    }

    fn submit_durable(&mut self, writes: Vec<OwnedWrite>) -> io::Result<Submitted> {
        let asynchronous = self.ring.is_some()
            && self.options.sync_mode != SyncMode::FdatasyncSyscall
            && writes.len() <= WRITES_PER_COMMIT_MAX
            && !writes.is_empty();
        if !asynchronous {
            return write_durable_now(self, writes);
        }
        for w in &writes {
            assert_io_aligned(
                "commit write",
                w.offset_bytes,
                w.buf.len() as u64,
                self.size_bytes,
            );
        }
        self.commits.add(
            writes
                .into_iter()
                .map(|w| (w.offset_bytes, w.buf))
                .collect(),
        );
        self.update_eventfd_signal();
        let ring = self.ring.as_mut().expect("checked");
        self.commits.push(ring)?;
        Ok(Submitted::InFlight)
    }

    fn reap_durable(&mut self, wait: bool) -> io::Result<Reaped> {
        if let Some(ring) = self.ring.as_mut() {
            Self::route_async(ring, &mut self.background, &mut self.commits)?;
            if wait {
                self.wait_commits_finished()?;
            }
        }
        let taken = self.commits.take_done();
        self.update_eventfd_signal();
        let (count, bufs) = taken?;
        Ok(Reaped { count, bufs })
    }

    fn discard(&mut self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        assert_io_aligned("discard", offset_bytes, len_bytes, self.size_bytes);
        let is_blockdev = self.file.metadata()?.file_type().is_block_device();
        let fd = self.file.as_raw_fd();
        let rc = if is_blockdev {
            const BLKDISCARD: libc::c_ulong = 0x1277;
            let range: [u64; 2] = [offset_bytes, len_bytes];
            // SAFETY: BLKDISCARD reads two u64 from the valid pointer.
            unsafe { libc::ioctl(fd, BLKDISCARD, range.as_ptr()) }
        } else {
            // SAFETY: plain syscall on an fd we own.
            unsafe {
                libc::fallocate(
                    fd,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    offset_bytes as libc::off_t,
                    len_bytes as libc::off_t,
                )
            }
        };
        if rc != 0 {
            let e = io::Error::last_os_error();
            // Discard is advisory; a device without support is not an error.
            if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
                return Ok(());
            }
            return Err(e);
        }
        Ok(())
    }
}

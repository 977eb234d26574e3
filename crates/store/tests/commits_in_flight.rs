//! WAL group commits submitted without waiting (`Store::commit_submit`) on the real io_uring
//! disk, in every sync mode (the measurement-only one without flushes too): several are in
//! flight at once, they are reported durable in order, the ring's eventfd signals their
//! completion, synchronous commits and flushes wait for them, segments roll under them, each
//! mode flushes as it says, and everything reads back after a reopen.
#![allow(clippy::field_reassign_with_default)]

mod common;
use common::*;
use fastblock_store::disk::SyncMode;
use fastblock_store::{Store, UringDisk, UringOptions};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Commits in flight at most, as the OSD's `--wal-commits-in-flight`.
const IN_FLIGHT_MAX: usize = 3;
/// How long a commit may take before the test gives up on it.
const COMMIT_WAIT_MAX: Duration = Duration::from_secs(10);

fn eventfd() -> OwnedFd {
    // SAFETY: eventfd(2) with valid flags; checked below.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    assert!(fd >= 0, "eventfd: {}", std::io::Error::last_os_error());
    // SAFETY: a new descriptor nothing else owns.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Waits (bounded) until the eventfd is readable, then empties it.
fn wait_signalled(fd: &OwnedFd) {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut p, 1, COMMIT_WAIT_MAX.as_millis() as i32) };
    assert_eq!(n, 1, "no completion signalled within {COMMIT_WAIT_MAX:?}");
    let mut counter = [0u8; 8];
    // SAFETY: reads at most 8 bytes into a buffer of 8.
    unsafe { libc::read(fd.as_raw_fd(), counter.as_mut_ptr().cast(), 8) };
}

/// Empties the eventfd; whether it held a signal.
fn drain(fd: &OwnedFd) -> bool {
    let mut counter = [0u8; 8];
    // SAFETY: reads at most 8 bytes into a buffer of 8 (non-blocking descriptor).
    unsafe { libc::read(fd.as_raw_fd(), counter.as_mut_ptr().cast(), 8) == 8 }
}

/// Reaps until `lsn` is durable, waiting on the eventfd between attempts.
fn wait_durable(s: &mut Store<UringDisk>, fd: Option<&OwnedFd>, lsn: u64) {
    let deadline = Instant::now() + COMMIT_WAIT_MAX;
    let mut last = 0;
    loop {
        let durable = s.commit_reap().unwrap();
        assert!(durable >= last, "durable LSN went back: {durable} < {last}");
        last = durable;
        if durable >= lsn {
            return;
        }
        assert!(Instant::now() < deadline, "LSN {lsn} never became durable");
        match fd {
            Some(fd) => wait_signalled(fd),
            None => std::thread::sleep(Duration::from_millis(1)),
        }
    }
}

fn uring_options(sync_mode: SyncMode) -> UringOptions {
    UringOptions {
        sync_mode,
        ..UringOptions::default()
    }
}

/// A new store on a 4 MiB file in its own directory, with an eventfd registered with its ring.
fn open_on_file(name: &str, sync_mode: SyncMode) -> (PathBuf, Store<UringDisk>, OwnedFd) {
    let dir =
        std::env::temp_dir().join(format!("fastblock-inflight-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("osd.img");
    UringDisk::create_file(&path, 4 << 20).unwrap();
    let mut s = Store::open_path(
        &path,
        None,
        Some(&small_mkfs()),
        uring_options(sync_mode),
        options(),
    )
    .unwrap();
    let efd = eventfd();
    s.disk_mut().register_eventfd(efd.as_raw_fd()).unwrap();
    (dir, s, efd)
}

fn run(name: &str, sync_mode: SyncMode, asynchronous: bool) {
    let (dir, mut s, efd) = open_on_file(name, sync_mode);
    let path = dir.join("osd.img");
    let syncs_before = s.disk_mut().fdatasync_count();
    let dsync_writes_before = s.disk_mut().dsync_write_count();
    let segments_before = s.wal().current_segment_seq();
    let mut submitted: Vec<u64> = Vec::new();
    let mut overlapped = 0;
    // 120 commits of 4 KiB entries roll through several 64 KiB segments; compaction behind
    // the flushes keeps the ring from filling.
    for i in 1..=120u64 {
        let p = pg((i % 3) as u32);
        let idx = s.log_bounds(p).1 + 1;
        s.append_entries(p, &[entry(idx, 1, 4096)]).unwrap();
        let lsn = s.commit_submit().unwrap();
        assert!(
            submitted.last().is_none_or(|l| *l < lsn),
            "{name}: LSNs of commits must grow"
        );
        submitted.push(lsn);
        let in_flight = s.commits_in_flight();
        if asynchronous {
            assert!(in_flight >= 1, "{name}: commit {i} did not go in flight");
        } else {
            assert_eq!(
                in_flight, 0,
                "{name}: a synchronous commit stayed in flight"
            );
            assert_eq!(s.wal().durable_lsn(), lsn, "{name}: synchronous commit");
        }
        overlapped += usize::from(in_flight > 1);
        if in_flight >= IN_FLIGHT_MAX {
            let oldest = submitted[submitted.len() - in_flight];
            wait_durable(&mut s, Some(&efd), oldest);
            assert!(
                s.commits_in_flight() < in_flight,
                "{name}: reaping freed nothing"
            );
        }
        s.set_applied(p, idx).unwrap();
        if i % 20 == 0 {
            // A flush makes the applied state durable only behind the log: it waits for the
            // commits in flight.
            s.flush().unwrap();
            assert_eq!(
                s.commits_in_flight(),
                0,
                "{name}: flush left commits in flight"
            );
            assert_eq!(s.wal().durable_lsn(), lsn, "{name}: flush behind the log");
            for q in 0..3 {
                let applied = s.log_bounds(pg(q)).1;
                s.compact(pg(q), applied.saturating_sub(2)).unwrap();
            }
        }
    }
    if asynchronous {
        assert!(overlapped > 0, "{name}: never two commits in flight");
    }
    wait_durable(&mut s, Some(&efd), *submitted.last().unwrap());
    assert_eq!(s.commits_in_flight(), 0);
    if asynchronous {
        // With nothing in flight, the disk's own synchronous operations do not signal: an
        // event loop is woken by commits only.
        drain(&efd);
        let p = pg(1);
        let idx = s.log_bounds(p).1 + 1;
        s.append_entries(p, &[entry(idx, 1, 4096)]).unwrap();
        s.commit().unwrap();
        assert!(
            !drain(&efd),
            "{name}: a synchronous commit signalled the eventfd"
        );
        // A commit in flight signals again.
        s.append_entries(p, &[entry(idx + 1, 1, 4096)]).unwrap();
        let lsn = s.commit_submit().unwrap();
        wait_durable(&mut s, Some(&efd), lsn);
        assert_eq!(s.commits_in_flight(), 0);
    }
    assert!(
        s.wal().current_segment_seq() >= segments_before + 3,
        "{name}: the workload should roll segments under commits in flight"
    );
    let syncs = s.disk_mut().fdatasync_count() - syncs_before;
    let dsync_writes = s.disk_mut().dsync_write_count() - dsync_writes_before;
    match sync_mode {
        SyncMode::DsyncWrites => {
            assert!(
                dsync_writes >= 120,
                "{name}: {dsync_writes} RWF_DSYNC writes for 120 commits"
            );
        }
        // Commits in flight, flushes and segment rolls alike flush nothing.
        SyncMode::NoFlushBenchmarkOnly => {
            assert_eq!(
                (syncs, dsync_writes),
                (0, 0),
                "{name}: fdatasyncs and RWF_DSYNC writes"
            );
        }
        SyncMode::TwoStep | SyncMode::Fdatasync | SyncMode::FdatasyncSyscall => {
            assert!(syncs >= 120, "{name}: {syncs} fdatasyncs for 120 commits");
            assert_eq!(dsync_writes, 0, "{name}: RWF_DSYNC writes");
        }
    }
    // A synchronous commit behind commits in flight waits for them.
    let p = pg(0);
    let idx = s.log_bounds(p).1 + 1;
    s.append_entries(p, &[entry(idx, 1, 4096)]).unwrap();
    let first = s.commit_submit().unwrap();
    let idx2 = idx + 1;
    s.append_entries(p, &[entry(idx2, 1, 4096)]).unwrap();
    let second = s.commit().unwrap();
    assert!(second > first);
    assert_eq!(
        s.commits_in_flight(),
        0,
        "{name}: sync commit left one in flight"
    );
    let logs: Vec<(u64, u64)> = (0..3).map(|q| s.log_bounds(pg(q))).collect();
    drop(s);
    let mut s = Store::open_path(&path, None, None, uring_options(sync_mode), options()).unwrap();
    for q in 0..3u32 {
        assert_eq!(
            s.log_bounds(pg(q)),
            logs[q as usize],
            "{name}: PG {q} after reopen"
        );
        let (first, last) = logs[q as usize];
        for e in s.entries(pg(q), first, last + 1, None).unwrap() {
            assert_eq!(
                e,
                entry(e.index, 1, 4096),
                "{name}: PG {q} entry {}",
                e.index
            );
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn two_step_commits_go_in_flight() {
    run("two-step", SyncMode::TwoStep, true);
}

#[test]
fn linked_mode_commits_go_in_flight() {
    run("linked", SyncMode::Fdatasync, true);
}

#[test]
fn dsync_commits_go_in_flight() {
    run("dsync", SyncMode::DsyncWrites, true);
}

/// Measurement only: the same commits in flight, reported once their writes completed.
#[test]
fn no_flush_benchmark_only_commits_go_in_flight() {
    run("no-flush", SyncMode::NoFlushBenchmarkOnly, true);
}

#[test]
fn syscall_mode_commits_synchronously() {
    run("syscall", SyncMode::FdatasyncSyscall, false);
}

/// A simulated disk whose commit submissions stay in flight (written, not synced) until a
/// waiting reap: a crash can then leave a torn commit with an intact later one behind it.
struct DeferDisk {
    inner: fastblock_store::SimDisk,
    owed: usize,
}

impl fastblock_store::Disk for DeferDisk {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_many(
        &mut self,
        reads: &mut [fastblock_store::disk::ReadOp<'_>],
    ) -> std::io::Result<()> {
        self.inner.read_many(reads)
    }
    fn write_many(
        &mut self,
        writes: &[fastblock_store::disk::WriteOp<'_>],
        sync: bool,
    ) -> std::io::Result<()> {
        self.inner.write_many(writes, sync)
    }
    fn discard(&mut self, offset_bytes: u64, len_bytes: u64) -> std::io::Result<()> {
        self.inner.discard(offset_bytes, len_bytes)
    }
    fn submit_durable(
        &mut self,
        writes: Vec<fastblock_store::disk::OwnedWrite>,
    ) -> std::io::Result<fastblock_store::disk::Submitted> {
        for w in &writes {
            self.inner.write(w.offset_bytes, &w.buf, false)?;
        }
        self.owed += 1;
        Ok(fastblock_store::disk::Submitted::InFlight)
    }
    fn reap_durable(&mut self, wait: bool) -> std::io::Result<fastblock_store::disk::Reaped> {
        if !wait {
            return Ok(Default::default());
        }
        self.inner.sync()?;
        Ok(fastblock_store::disk::Reaped {
            count: std::mem::take(&mut self.owed),
            bufs: Vec::new(),
        })
    }
}

/// Two commits in flight at a crash, the first torn and the second intact: replay cuts both
/// (nothing vouches for them), and erases the second, so that a later batch written at the
/// tail that ends exactly where the stale one starts does not bring it back.
#[test]
fn a_commit_left_behind_a_torn_one_is_erased_at_replay() {
    let disk = fastblock_store::SimDisk::new(DEVICE_BYTES);
    let meta = fastblock_store::SimFile::new();
    let mut s = Store::mkfs(
        DeferDisk {
            inner: disk.clone(),
            owed: 0,
        },
        meta.clone(),
        &small_mkfs(),
        options(),
    )
    .unwrap();
    let p = pg(0);
    let mut cs = raft::eraftpb::ConfState::default();
    cs.voters = vec![1];
    s.set_conf_state(p, &cs).unwrap();
    s.commit().unwrap();
    s.append_entries(p, &[entry(1, 1, 4096), entry(2, 1, 4096)])
        .unwrap();
    let a = s.commit_submit().unwrap();
    s.append_entries(p, &[entry(3, 1, 4096), entry(4, 1, 4096)])
        .unwrap();
    let b = s.commit_submit().unwrap();
    assert!(b > a);
    assert_eq!(s.commits_in_flight(), 2);
    // The machine stops: the first commit's record of entry 1 is torn, the second commit
    // reached the disk whole.
    let (offset, _) = s.wal().entry_disk_range(p, 1).unwrap();
    drop(s);
    disk.image().corrupt(offset + 64, |b| b[0] ^= 0xFF);

    let mut s = reopen(&disk, &meta).unwrap();
    assert_eq!(s.log_bounds(p), (1, 0), "both commits in flight are cut");
    // The same records again: the new batch ends exactly where the stale one begins.
    s.append_entries(p, &[entry(1, 1, 4096), entry(2, 1, 4096)])
        .unwrap();
    s.commit().unwrap();
    drop(s);
    let s = reopen(&disk, &meta).unwrap();
    assert_eq!(
        s.log_bounds(p),
        (1, 2),
        "the stale commit after the torn one came back into the log"
    );
}

/// Goal: the OSD's commit wait on the ring itself (`UringDisk::wait_completion`) returns when
/// a commit completes, leaves the completion for `commit_reap`, and keeps the eventfd quiet
/// (the event loop must not wake again for a completion its thread already waited for);
/// with nothing in flight it returns at the timeout. The OSD's default mode (`RWF_DSYNC`
/// writes), where a commit is mostly one completion.
#[test]
fn a_commit_wait_on_the_ring_returns_at_the_completion_without_signalling() {
    let (dir, mut s, efd) = open_on_file("ringwait", SyncMode::DsyncWrites);
    // Nothing in flight: the slice ends, nothing is ready.
    let started = Instant::now();
    let wait = s
        .disk_mut()
        .wait_completion(Duration::from_millis(20))
        .unwrap()
        .expect("this kernel waits on the ring (IORING_FEAT_EXT_ARG)");
    assert!(!wait.ready && !wait.signalled, "{wait:?}");
    assert!(started.elapsed() >= Duration::from_millis(15));
    assert!(started.elapsed() < COMMIT_WAIT_MAX);
    let (mut quiet, mut waited) = (0, 0);
    for i in 1..=40u64 {
        let p = pg((i % 3) as u32);
        let idx = s.log_bounds(p).1 + 1;
        s.append_entries(p, &[entry(idx, 1, 4096)]).unwrap();
        let lsn = s.commit_submit().unwrap();
        // Until the commit is durable, wait for its completions on the ring itself.
        let deadline = Instant::now() + COMMIT_WAIT_MAX;
        while s.commit_reap().unwrap() < lsn {
            assert!(Instant::now() < deadline, "commit {i} never completed");
            let wait = s
                .disk_mut()
                .wait_completion(Duration::from_millis(10))
                .unwrap()
                .expect("ring wait");
            if wait.ready {
                waited += 1;
                // Posted while the signal was off: the eventfd stays quiet. (A completion
                // the wait found already there was posted with it on.)
                let signalled = drain(&efd);
                assert!(
                    signalled || !wait.signalled,
                    "commit {i}: the wait reports a signal the eventfd does not hold"
                );
                quiet += usize::from(!signalled);
            }
        }
        s.set_applied(p, idx).unwrap();
        if i % 10 == 0 {
            s.flush().unwrap();
            for q in 0..3 {
                let applied = s.log_bounds(pg(q)).1;
                s.compact(pg(q), applied.saturating_sub(2)).unwrap();
            }
        }
    }
    assert!(waited > 0, "no commit went in flight");
    // A completion posted before the wait began, or after it returned (a commit of two
    // writes, across a segment's end), signals; those the thread waited for must not. Most
    // commits are one write that takes longer than the call to the wait: waiting on the
    // eventfd instead, every one of them signals.
    assert!(
        quiet * 2 > waited,
        "{quiet} of {waited} commit waits left the eventfd quiet"
    );
    drop(s);
    std::fs::remove_dir_all(&dir).unwrap();
}

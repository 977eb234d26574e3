//! The real disk in all its modes (io_uring two-step and linked fdatasync, RWF_DSYNC writes,
//! the pread/pwrite fallback, and the measurement-only mode without flushes) runs the same
//! workload on a real file and reads it back after a reopen, so the fallback path and the
//! batched submissions are exercised, not just compiled.
#![allow(clippy::field_reassign_with_default)]

mod common;
use common::*;
use fastblock_store::disk::SyncMode;
use fastblock_store::{Store, StoreOptions, UringDisk, UringOptions};

/// Device flushes the disk issued (both handles of a round trip together).
#[derive(Debug, Default, PartialEq, Eq)]
struct Flushes {
    fdatasyncs: u64,
    dsync_writes: u64,
}

impl Flushes {
    fn add(&mut self, disk: &UringDisk) {
        self.fdatasyncs += disk.fdatasync_count();
        self.dsync_writes += disk.dsync_write_count();
    }
}

/// Formats, writes, commits, flushes and reads back, then reopens (WAL recovery) and reads the
/// log back. Returns the flushes it took.
fn round_trip(name: &str, uring: UringOptions, data_with_commit: bool) -> Flushes {
    let mut flushes = Flushes::default();
    let dir = std::env::temp_dir().join(format!("fastblock-uring-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("osd.img");
    UringDisk::create_file(&path, 4 << 20).unwrap();
    let opts = StoreOptions {
        data_with_commit,
        ..options()
    };
    let mut s = Store::open_path(
        &path,
        None,
        Some(&small_mkfs()),
        uring.clone(),
        opts.clone(),
    )
    .unwrap();
    assert_eq!(s.disk_mut().uses_io_uring(), !uring.force_fallback);
    for i in 1..=50u64 {
        let p = pg((i % 3) as u32);
        let idx = s.log_bounds(p).1 + 1;
        s.append_entries(p, &[entry(idx, 1, 4096)]).unwrap();
        // A 16 KiB batch holds three 4 KiB entries.
        if i % 3 == 0 {
            s.commit().unwrap();
        }
        s.write_object(p, obj(i % 5), (i % 7) * 4096, &pattern(i, 4096))
            .unwrap();
        s.set_applied(p, idx).unwrap();
        if i % 10 == 0 {
            s.flush().unwrap();
        }
    }
    s.commit().unwrap();
    s.flush().unwrap();
    let mut batch = vec![vec![0u8; 4096]; 3];
    {
        let mut reqs: Vec<_> = batch
            .iter_mut()
            .enumerate()
            .map(|(k, buf)| fastblock_store::ObjectRead {
                pg: pg(((48 + k as u64) % 3) as u32),
                object: obj((48 + k as u64) % 5),
                offset_bytes: ((48 + k as u64) % 7) * 4096,
                buf,
            })
            .collect();
        s.read_objects(&mut reqs).unwrap();
    }
    for (k, buf) in batch.iter().enumerate() {
        assert_eq!(
            buf,
            &pattern(48 + k as u64, 4096),
            "{name}: batched read {k}"
        );
    }
    flushes.add(s.disk_mut());
    drop(s);
    let mut s = Store::open_path(&path, None, None, uring, opts).unwrap();
    for p in 0..3 {
        let (first, last) = s.log_bounds(pg(p));
        let es = s.entries(pg(p), first, last + 1, None).unwrap();
        let want = (1..=50u64).filter(|i| i % 3 == u64::from(p)).count();
        assert_eq!(es.len(), want, "{name}: PG {p}");
        for e in es {
            assert_eq!(e, entry(e.index, 1, 4096));
        }
    }
    flushes.add(s.disk_mut());
    drop(s);
    std::fs::remove_dir_all(&dir).ok();
    flushes
}

#[test]
fn io_uring_two_step() {
    let o = UringOptions {
        sync_mode: SyncMode::TwoStep,
        ..UringOptions::default()
    };
    round_trip("twostep", o.clone(), false);
    round_trip("twostep-data", o, true);
}

#[test]
fn io_uring_linked_fsync() {
    let o = UringOptions {
        sync_mode: SyncMode::Fdatasync,
        ..UringOptions::default()
    };
    round_trip("linked", o.clone(), false);
    round_trip("linked-data", o, true);
}

#[test]
fn io_uring_dsync_writes_default() {
    assert_eq!(UringOptions::default().sync_mode, SyncMode::DsyncWrites);
    round_trip("dsync", UringOptions::default(), false);
    round_trip("dsync-data", UringOptions::default(), true);
}

#[test]
fn pread_pwrite_fallback() {
    let o = UringOptions {
        force_fallback: true,
        ..UringOptions::default()
    };
    round_trip("fallback", o, true);
}

/// Goal: `SyncMode::NoFlushBenchmarkOnly` issues no fdatasync and no RWF_DSYNC write on any
/// path (mkfs, WAL commits, flushes of applied data, recovery; io_uring and the fallback),
/// while everything still reads back, also after a reopen. Method: the round trip, counting
/// the disk's flushes; the default mode, run the same way, must count some of both, so the
/// counters do see flushes.
#[test]
fn no_flush_benchmark_only_flushes_nothing_and_reads_back() {
    let no_flush = UringOptions {
        sync_mode: SyncMode::NoFlushBenchmarkOnly,
        ..UringOptions::default()
    };
    let none = Flushes::default();
    assert_eq!(round_trip("noflush", no_flush.clone(), false), none);
    assert_eq!(round_trip("noflush-data", no_flush.clone(), true), none);
    let fallback = UringOptions {
        force_fallback: true,
        ..no_flush
    };
    assert_eq!(round_trip("noflush-fallback", fallback, false), none);

    let durable = round_trip("dsync-counted", UringOptions::default(), false);
    assert!(
        durable.fdatasyncs > 0 && durable.dsync_writes > 0,
        "the default mode should flush: {durable:?}"
    );
    let durable_fallback = UringOptions {
        force_fallback: true,
        ..UringOptions::default()
    };
    let fallback = round_trip("fallback-counted", durable_fallback, false);
    assert!(
        fallback.fdatasyncs > 0,
        "the fallback should fdatasync: {fallback:?}"
    );
}

/// Goal: with RWF_DSYNC writes, a sync that promises every earlier write (a flush of applied
/// data) still issues an fdatasync when earlier writes were not durable (RWF_DSYNC on a FUA
/// device makes only its own write durable), while a WAL commit (only its own writes
/// promised) and a sync with nothing owed need none. Method: count fdatasyncs per call.
#[test]
fn dsync_writes_sync_earlier_writes_only_when_promised() {
    use fastblock_store::disk::{Disk, WriteOp};
    let dir = std::env::temp_dir().join(format!("fastblock-dsync-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("disk.img");
    UringDisk::create_file(&path, 1 << 20).unwrap();
    let mut d = UringDisk::open(
        &path,
        UringOptions {
            sync_mode: SyncMode::DsyncWrites,
            ..UringOptions::default()
        },
    )
    .unwrap();
    let buf = fastblock_store::disk::AlignedBuf::zeroed(4096);
    let w = |off: u64| WriteOp {
        offset_bytes: off,
        buf: &buf,
    };
    let syncs = |d: &UringDisk| d.fdatasync_count();
    // Nothing owed: a durable write is its own sync.
    d.write_many(&[w(0)], true).unwrap();
    assert_eq!(syncs(&d), 0);
    // A WAL-style commit with a non-durable write beside it: only the durable one promised.
    d.write_durable_with(&[w(4096)], &[w(8192)]).unwrap();
    assert_eq!(syncs(&d), 0);
    // Now a sync that promises every earlier write: the one at 8192 is owed.
    d.write_many(&[w(12288)], true).unwrap();
    assert_eq!(syncs(&d), 1);
    // Paid: the next durable write needs no fdatasync.
    d.write_many(&[w(16384)], true).unwrap();
    assert_eq!(syncs(&d), 1);
    // A plain non-durable write, then a bare sync.
    d.write_many(&[w(20480)], false).unwrap();
    d.sync().unwrap();
    assert_eq!(syncs(&d), 2);
    drop(d);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A 4 MiB file under a directory of its own (`name` in it), opened with the default options.
fn fresh_disk(name: &str) -> (std::path::PathBuf, UringDisk) {
    let dir = std::env::temp_dir().join(format!("fastblock-uring-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("osd.img");
    UringDisk::create_file(&path, 4 << 20).unwrap();
    let d = UringDisk::open(&path, UringOptions::default()).unwrap();
    (dir, d)
}

/// Goal: the io_uring disk tells when the background writes started before a mark have
/// completed, without waiting and without counting later ones (a flush's commit is handed to
/// the flusher on this), and its `data_sync` handle syncs from another thread. Method: two
/// background writes on a real file, a mark between them; poll (bounded) until the first is
/// reported written; sync through the handle on a thread; read both back.
#[test]
fn background_writes_are_reported_written_by_mark() {
    use fastblock_store::disk::{AlignedBuf, BackgroundRun};
    use fastblock_store::Disk;
    let (dir, mut d) = fresh_disk("marks");
    assert!(d.uses_io_uring());
    let before = d.background_mark();
    assert!(d.background_written(before).unwrap(), "nothing in flight");
    let len = 64 << 10;
    let write = |d: &mut UringDisk, at: u64, seed: u64| {
        let mut buf = AlignedBuf::zeroed(len);
        buf.copy_from_slice(&pattern(seed, len));
        let run = BackgroundRun {
            buf_offset: 0,
            len,
            disk_offset_bytes: at,
        };
        d.write_background(buf, &[run]).unwrap();
    };
    write(&mut d, 0, 1);
    let mark = d.background_mark();
    assert!(mark > before);
    write(&mut d, 1 << 20, 2);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !d.background_written(mark).unwrap() {
        assert!(
            std::time::Instant::now() < deadline,
            "the first write never reported"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let mut sync = d.data_sync().expect("a duplicate descriptor");
    let syncs = d.fdatasync_count();
    std::thread::spawn(move || sync.sync())
        .join()
        .unwrap()
        .unwrap();
    assert_eq!(d.fdatasync_count(), syncs + 1, "synced through the handle");
    let mut back = AlignedBuf::zeroed(len);
    d.read(0, &mut back).unwrap();
    assert!(back[..] == pattern(1, len)[..]);
    d.read(1 << 20, &mut back).unwrap();
    assert!(
        back[..] == pattern(2, len)[..],
        "reads wait for the later write"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// Goal: a WAL commit whose completion another call took off the ring (a look at the
/// background writes, a read) is still reported: `wait_completion` returns at once, and
/// `commits_reportable` says so. Before, such a completion that came while the eventfd's
/// signal was off was never reported until another commit completed (a shard that had
/// reached its commits in flight then stopped taking input). Method: a commit in flight on a
/// real file; `background_written` polls the ring until the completion is taken off it.
#[test]
fn a_commit_completion_taken_off_the_ring_by_another_call_is_still_reported() {
    use fastblock_store::disk::{AlignedBuf, OwnedWrite};
    use fastblock_store::Disk;
    let (dir, mut d) = fresh_disk("taken");
    let mut buf = AlignedBuf::zeroed(4096);
    buf.copy_from_slice(&pattern(3, 4096));
    let submitted = d
        .submit_durable(vec![OwnedWrite {
            offset_bytes: 8192,
            buf,
        }])
        .unwrap();
    assert!(matches!(
        submitted,
        fastblock_store::disk::Submitted::InFlight
    ));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        // Takes every completion off the ring (none of them a background write's).
        assert!(d.background_written(d.background_mark()).unwrap());
        if d.commits_reportable() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the commit never completed"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let started = std::time::Instant::now();
    let wait = d
        .wait_completion(std::time::Duration::from_secs(5))
        .unwrap()
        .expect("a ring that can wait");
    assert!(wait.ready, "the finished commit counts as ready");
    assert!(started.elapsed() < std::time::Duration::from_secs(1));
    assert_eq!(d.reap_durable(false).unwrap().count, 1);
    assert!(!d.commits_reportable());
    std::fs::remove_dir_all(&dir).ok();
}

//! Flushes whose metadata commit runs on the flusher thread while the owner keeps writing,
//! overwriting and deleting (`objects/commit.rs`): reads stay exact throughout, nothing is
//! lost or leaked across the handover, and a reopen sees the last flush.
// raft-rs messages (rust-protobuf) are built field by field, as raft-rs itself does.
#![allow(clippy::field_reassign_with_default)]

mod common;
use common::*;
use fastblock_store::Store;
use fastblock_types::rng::SplitMix64;
use raft::eraftpb::ConfState;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

const OBJECTS: u64 = 4;
const BLOCKS_PER_OBJECT: u64 = 8;
const BS: usize = 4096;

type Model = BTreeMap<(u64, u64), Vec<u8>>;

fn check(s: &mut Store<fastblock_store::SimDisk>, model: &Model, when: &str) {
    for o in 0..OBJECTS {
        let mut buf = vec![0u8; BS * BLOCKS_PER_OBJECT as usize];
        s.read_object(pg(0), obj(o), 0, &mut buf).unwrap();
        for b in 0..BLOCKS_PER_OBJECT {
            let got = &buf[b as usize * BS..(b as usize + 1) * BS];
            match model.get(&(o, b)) {
                Some(want) => assert!(got == &want[..], "{when}: object {o} block {b} differs"),
                None => assert!(
                    got.iter().all(|x| *x == 0),
                    "{when}: object {o} block {b} is not zeros"
                ),
            }
        }
    }
}

/// Goal: the dirty-map overlay keeps every read exact while a commit of an older state runs,
/// entries changed during the commit stay dirty for the next one, and blocks are freed exactly
/// once. Method: rounds of random writes and deletes, a background flush begun every
/// round (when the previous one is done) and polled; reads checked against a model each
/// round; at the end the free-block count must match a fresh allocator rebuilt from the
/// durable map at reopen, and the data must match the model.
#[test]
fn writes_during_a_background_commit_are_neither_lost_nor_leaked() {
    let (disk, meta, mut s) = new_sim(DEVICE_BYTES);
    let notified = Arc::new(AtomicUsize::new(0));
    let n = notified.clone();
    s.start_flusher(
        "test-flusher".into(),
        Box::new(move || {
            n.fetch_add(1, Ordering::Relaxed);
        }),
    )
    .unwrap();
    // The PG must have a log, or reopening takes its objects for an interrupted removal.
    let mut cs = ConfState::default();
    cs.voters = vec![1];
    s.set_conf_state(pg(0), &cs).unwrap();
    s.append_entries(pg(0), &[entry(1, 1, 10)]).unwrap();
    s.commit().unwrap();
    let mut rng = SplitMix64::new(42);
    let mut model: Model = BTreeMap::new();
    let (mut begun, mut done, mut overlapped) = (0, 0, 0);
    // At least 40 rounds, and on until a few commits finished and a write overlapped one
    // (a loaded machine may not schedule the flusher thread for a while).
    let mut round = 0u64;
    while round < 40 || done < 5 || overlapped == 0 {
        round += 1;
        assert!(round < 20_000, "the flusher thread made no progress");
        for _ in 0..6 {
            let o = rng.next_u64() % OBJECTS;
            if rng.next_u64().is_multiple_of(10) {
                s.delete_object(pg(0), obj(o)).unwrap();
                model.retain(|(mo, _), _| *mo != o);
            } else {
                let b = rng.next_u64() % BLOCKS_PER_OBJECT;
                let data = pattern(rng.next_u64(), BS);
                s.write_object(pg(0), obj(o), b * BS as u64, &data).unwrap();
                model.insert((o, b), data);
            }
            if s.flush_in_flight() {
                overlapped += 1;
            }
        }
        s.set_applied(pg(0), round).unwrap();
        check(&mut s, &model, "while a commit may run");
        if let Some(d) = s.flush_poll().unwrap() {
            assert!(d.commit_time.is_some(), "ran on the flusher thread");
            done += 1;
        }
        if s.flush_begin().unwrap() {
            begun += 1;
        }
    }
    // A synchronous flush waits for the running commit, then commits the rest.
    s.flush().unwrap();
    while s.flush_poll().unwrap().is_some() {
        done += 1;
    }
    assert_eq!(begun, done, "every begun flush is reported once");
    assert!(begun >= 5 && overlapped > 0);
    // The flusher thread wakes its owner after it published the commit's end, so the last
    // wake-up may still be on its way when `flush_poll` has already seen the end.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while notified.load(Ordering::Relaxed) < begun {
        assert!(
            std::time::Instant::now() < deadline,
            "{} wake-ups for {begun} commits",
            notified.load(Ordering::Relaxed)
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    check(&mut s, &model, "after the last flush");
    assert_eq!(s.flushed_applied_index(pg(0)), round);
    assert_eq!(s.pending_free_bytes(), 0);
    let free = s.free_data_bytes();
    drop(s);
    let mut s = reopen(&disk, &meta).unwrap();
    assert_eq!(
        s.free_data_bytes(),
        free,
        "free space after reopen (rebuilt from the durable block map) differs: a block was leaked or freed twice"
    );
    check(&mut s, &model, "after reopen");
    assert_eq!(s.flushed_applied_index(pg(0)), round);
}

/// A store whose flushes' commits wait for the test ([`HeldRunner`]), with one PG that has
/// a log, every block of its objects written with patterns of `seed`, and applied index 1.
fn held_flush_of_every_block<D: fastblock_store::Disk + 'static>(
    s: &mut Store<D>,
    seed: u64,
) -> (std::rc::Rc<std::cell::RefCell<HeldRunner>>, Model) {
    let runner = std::rc::Rc::new(std::cell::RefCell::new(HeldRunner::default()));
    s.set_flush_runner(Box::new(Held(runner.clone())));
    let mut cs = ConfState::default();
    cs.voters = vec![1];
    s.set_conf_state(pg(0), &cs).unwrap();
    s.append_entries(pg(0), &[entry(1, 1, 10)]).unwrap();
    s.commit().unwrap();
    let mut model: Model = BTreeMap::new();
    for o in 0..OBJECTS {
        for b in 0..BLOCKS_PER_OBJECT {
            let data = pattern(seed * 1000 + o * 10 + b, BS);
            s.write_object(pg(0), obj(o), b * BS as u64, &data).unwrap();
            model.insert((o, b), data);
        }
    }
    s.set_applied(pg(0), 1).unwrap();
    (runner, model)
}

/// Goal: a flush's data sync runs with its metadata commit, off the owner's thread
/// (`Disk::data_sync`), and still covers every block the commit references. Method: writes,
/// then a flush whose commit is held: the owner issued no sync. Once the commit ran, a crash
/// (each unsynced write dropped, kept or torn by its seed) loses none of the flushed data: a
/// data sync missing or run after the commit fails the read-back on some seed.
#[test]
fn the_data_sync_runs_with_the_commit_and_covers_its_blocks() {
    for seed in 0..16u64 {
        let (disk, meta, mut s) = new_sim(DEVICE_BYTES);
        let (runner, model) = held_flush_of_every_block(&mut s, seed);
        let syncs = disk.image().syncs;
        assert!(s.flush_begin().unwrap());
        assert_eq!(
            disk.image().syncs,
            syncs,
            "the owner left the data's sync to the commit"
        );
        assert!(s.flush_poll().unwrap().is_none(), "the commit is held");
        runner.borrow_mut().release = true;
        assert!(s.flush_poll().unwrap().is_some());
        assert!(disk.image().syncs > syncs, "the commit synced the data");
        drop(s);
        crash(&disk, &meta, seed);
        let mut s = reopen(&disk, &meta).unwrap();
        assert_eq!(s.flushed_applied_index(pg(0)), 1);
        check(&mut s, &model, &format!("after a crash (seed {seed})"));
    }
}

/// A simulated disk whose background writes stay in flight until the test completes them
/// (`done`), as the io_uring disk's do until the device answers.
struct SlowBackground {
    inner: fastblock_store::SimDisk,
    /// (id, buffer, runs) of each write in flight; ids count up from 0.
    in_flight: Arc<std::sync::Mutex<Vec<InFlightWrite>>>,
    next_id: u64,
}

type InFlightWrite = (u64, fastblock_store::disk::AlignedBuf, Vec<BackgroundRun>);

use fastblock_store::disk::{BackgroundRun, DataSync, ReadOp, WriteOp};

impl SlowBackground {
    /// The device finishes every background write (unsynced, as a write completes).
    fn complete(&self) -> std::io::Result<()> {
        complete_writes(&self.inner, &self.in_flight, u64::MAX)
    }
}

/// The device finishes the background writes in flight whose id is below `before`.
fn complete_writes(
    disk: &fastblock_store::SimDisk,
    in_flight: &std::sync::Mutex<Vec<InFlightWrite>>,
    before: u64,
) -> std::io::Result<()> {
    let mut inner = disk.clone();
    let mut writes = in_flight.lock().unwrap();
    for (_, buf, runs) in writes.iter().filter(|w| w.0 < before) {
        for r in runs {
            fastblock_store::Disk::write(
                &mut inner,
                r.disk_offset_bytes,
                &buf[r.buf_offset..r.buf_offset + r.len],
                false,
            )?;
        }
    }
    writes.retain(|w| w.0 >= before);
    Ok(())
}

impl fastblock_store::Disk for SlowBackground {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_many(&mut self, reads: &mut [ReadOp<'_>]) -> std::io::Result<()> {
        self.complete()?;
        self.inner.read_many(reads)
    }
    fn write_many(&mut self, writes: &[WriteOp<'_>], sync: bool) -> std::io::Result<()> {
        if sync {
            self.complete()?;
        }
        self.inner.write_many(writes, sync)
    }
    fn write_background(
        &mut self,
        buf: fastblock_store::disk::AlignedBuf,
        runs: &[BackgroundRun],
    ) -> std::io::Result<()> {
        self.in_flight
            .lock()
            .unwrap()
            .push((self.next_id, buf, runs.to_vec()));
        self.next_id += 1;
        Ok(())
    }
    fn wait_background(&mut self) -> std::io::Result<()> {
        self.complete()
    }
    fn background_mark(&self) -> u64 {
        self.next_id
    }
    fn background_written(&mut self, mark: u64) -> std::io::Result<bool> {
        Ok(self.in_flight.lock().unwrap().iter().all(|w| w.0 >= mark))
    }
    fn data_sync(&self) -> Option<Box<dyn DataSync>> {
        self.inner.data_sync()
    }
    fn discard(&mut self, offset_bytes: u64, len_bytes: u64) -> std::io::Result<()> {
        self.inner.discard(offset_bytes, len_bytes)
    }
}

/// Goal: starting a flush never waits for a data write, and its commit (which syncs the data
/// first) goes to the flusher only once every background write completed, since a sync
/// covers completed writes only. Method: a disk that holds background writes until told; a
/// flush begun with the last staged data still in flight stays with the store, is handed
/// over at the first poll after the writes completed, and its data survives a crash.
#[test]
fn a_flush_goes_to_the_flusher_once_its_data_writes_completed() {
    let disk = fastblock_store::SimDisk::new(DEVICE_BYTES);
    let meta = fastblock_store::SimFile::new();
    let slow = SlowBackground {
        inner: disk.clone(),
        in_flight: Arc::default(),
        next_id: 0,
    };
    let in_flight = slow.in_flight.clone();
    let mut opts = options();
    opts.background_data_writes = true;
    let mut s = Store::mkfs(slow, meta.clone(), &small_mkfs(), opts).unwrap();
    let (runner, model) = held_flush_of_every_block(&mut s, 7);
    assert!(s.flush_begin().unwrap());
    assert!(
        !in_flight.lock().unwrap().is_empty(),
        "the last staged data went out as a background write"
    );
    assert!(s.flush_awaits_writes());
    assert!(
        runner.borrow().held.is_none(),
        "not handed over before its writes completed"
    );
    assert!(s.flush_in_flight(), "no second flush meanwhile");
    assert!(!s.flush_begin().unwrap());
    assert!(s.flush_poll().unwrap().is_none());
    assert!(runner.borrow().held.is_none());
    // Applies go on and stage out a write of their own, which stays in flight.
    let first_later = in_flight.lock().unwrap().last().unwrap().0 + 1;
    for b in 0..BLOCKS_PER_OBJECT * 3 {
        let data = pattern(b + 99, BS);
        s.write_object(pg(0), obj(OBJECTS + 1), b * BS as u64, &data)
            .unwrap();
    }
    assert!(
        in_flight.lock().unwrap().iter().any(|w| w.0 >= first_later),
        "a later stage is in flight"
    );
    // The device completes the flush's writes, not the later one: the next poll hands the
    // commit over.
    complete_writes(&disk, &in_flight, first_later).unwrap();
    assert!(!in_flight.lock().unwrap().is_empty());
    assert!(
        s.flush_poll().unwrap().is_none(),
        "handed over, held by the runner"
    );
    assert!(!s.flush_awaits_writes());
    assert!(runner.borrow().held.is_some());
    runner.borrow_mut().release = true;
    assert!(s.flush_poll().unwrap().is_some());
    drop(s);
    crash(&disk, &meta, 7);
    let mut s = reopen(&disk, &meta).unwrap();
    assert_eq!(s.flushed_applied_index(pg(0)), 1);
    check(&mut s, &model, "after a crash");
}

//! A full disk gives a typed `NoSpace`, changes nothing, and writes succeed again once space
//! is freed (objects deleted; the engine flushes to give their blocks back).
// raft-rs messages (rust-protobuf) are built field by field, as raft-rs itself does.
#![allow(clippy::field_reassign_with_default)]

mod common;
use common::*;
use fastblock_store::{
    Error, MkfsOptions, SpaceArea, Store, StoreOptions, UringDisk, UringOptions,
};
use fastblock_types::units::BLOCK_SIZE_BYTES;

const CHUNK: usize = 64 << 10;

/// Fills the store with 64 KiB writes to distinct objects until NoSpace, then checks that
/// every accepted write reads back, frees half, and writes again.
fn fill_free_refill<D: fastblock_store::Disk>(s: &mut Store<D>) {
    // A PG with objects has a log (objects of a PG the log does not know are the remains of
    // an interrupted removal, cleaned up at open).
    s.append_entries(pg(0), &[entry(1, 1, 10)]).unwrap();
    s.commit().unwrap();
    let mut written = Vec::new();
    let err = loop {
        let i = written.len() as u64;
        match s.write_object(pg(0), obj(i), 0, &pattern(i, CHUNK)) {
            Ok(()) => written.push(i),
            Err(e) => break e,
        }
        if i % 8 == 7 {
            s.flush().unwrap();
        }
        assert!(written.len() < 10_000, "disk never filled");
    };
    assert!(
        matches!(
            err,
            Error::NoSpace {
                area: SpaceArea::Data,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(!s.is_failed(), "NoSpace must not stop the engine");
    assert!(s.free_data_bytes() < CHUNK as u64);
    // The failed write changed nothing: the object it targeted does not exist.
    let next = written.len() as u64;
    assert!(!s.list_objects(pg(0)).unwrap().contains(&obj(next)));
    let mut buf = vec![0u8; CHUNK];
    for &i in &written {
        s.read_object(pg(0), obj(i), 0, &mut buf).unwrap();
        assert_eq!(
            buf,
            pattern(i, CHUNK),
            "object {i} damaged by the full disk"
        );
    }
    // Free half the objects; the next write flushes (to give the blocks back) and succeeds.
    for &i in written.iter().filter(|i| *i % 2 == 0) {
        s.delete_object(pg(0), obj(i)).unwrap();
    }
    for k in 0..(written.len() as u64 / 2) {
        s.write_object(pg(0), obj(100_000 + k), 0, &pattern(100_000 + k, CHUNK))
            .unwrap();
    }
    s.flush().unwrap();
    for &i in written.iter().filter(|i| *i % 2 == 1) {
        s.read_object(pg(0), obj(i), 0, &mut buf).unwrap();
        assert_eq!(buf, pattern(i, CHUNK));
    }
    for k in 0..(written.len() as u64 / 2) {
        s.read_object(pg(0), obj(100_000 + k), 0, &mut buf).unwrap();
        assert_eq!(buf, pattern(100_000 + k, CHUNK));
    }
}

#[test]
fn simulated_disk_full_then_freed() {
    let (disk, meta, mut s) = new_sim(2 << 20);
    fill_free_refill(&mut s);
    drop(s);
    let s = reopen(&disk, &meta).unwrap();
    assert!(s.free_data_bytes() < 2 * CHUNK as u64 + BLOCK_SIZE_BYTES);
}

#[test]
fn real_file_full_then_freed() {
    let dir = std::env::temp_dir().join(format!("fastblock-nospace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("small.img");
    UringDisk::create_file(&path, 3 << 20).unwrap();
    let mkfs = MkfsOptions {
        force: false,
        ..small_mkfs()
    };
    let mut s = Store::open_path(
        &path,
        None,
        Some(&mkfs),
        UringOptions::default(),
        StoreOptions::default(),
    )
    .unwrap();
    fill_free_refill(&mut s);
    drop(s);
    let mut s = Store::open_path(
        &path,
        None,
        None,
        UringOptions::default(),
        StoreOptions::default(),
    )
    .unwrap();
    let mut buf = vec![0u8; CHUNK];
    s.read_object(pg(0), obj(1), 0, &mut buf).unwrap();
    assert_eq!(buf, pattern(1, CHUNK));
    std::fs::remove_dir_all(&dir).ok();
}

/// Goal: space that flushes give back never disappears from the count while a flush's
/// metadata commit runs (the blocks it frees are neither pending nor free until it
/// finishes): the shard admits writes against free plus pending, and a dip would refuse a
/// write right after a discard. Method: delete an object, begin a flush whose commit is
/// held, and count; then let it finish.
#[test]
fn blocks_being_freed_by_a_running_flush_still_count() {
    let (_disk, _meta, mut s) = new_sim(DEVICE_BYTES);
    let runner = std::rc::Rc::new(std::cell::RefCell::new(HeldRunner::default()));
    s.set_flush_runner(Box::new(Held(runner.clone())));
    s.append_entries(pg(0), &[entry(1, 1, 10)]).unwrap();
    s.commit().unwrap();
    s.write_object(pg(0), obj(1), 0, &pattern(1, CHUNK))
        .unwrap();
    s.flush().unwrap();
    s.delete_object(pg(0), obj(1)).unwrap();
    let free = s.free_data_bytes();
    assert_eq!(s.pending_free_bytes(), CHUNK as u64);
    assert!(s.flush_begin().unwrap());
    assert!(s.flush_in_flight(), "the commit is held");
    assert_eq!(s.free_data_bytes(), free);
    assert_eq!(
        s.pending_free_bytes(),
        CHUNK as u64,
        "the running commit's blocks still count"
    );
    runner.borrow_mut().release = true;
    assert!(s.flush_poll().unwrap().is_some());
    assert_eq!(s.free_data_bytes(), free + CHUNK as u64);
    assert_eq!(s.pending_free_bytes(), 0);
}

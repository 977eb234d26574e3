//! Every operation that allocates data blocks finds the space that flushes give back: when the
//! data region is full but blocks wait to be freed (deleted, discarded or overwritten since the
//! last flush), the store flushes and retries instead of failing `NoSpace`. The shard admits
//! operations against free plus pending-free space (`fastblock_shard::space`), so an
//! operation that failed here would fail an apply and stop the shard.
// raft-rs messages (rust-protobuf) are built field by field, as raft-rs itself does.
#![allow(clippy::field_reassign_with_default)]

mod common;
use common::*;
use fastblock_store::objects::{write_allocates_bytes, zero_allocates_bytes};
use fastblock_store::{Error, SimDisk, Store};
use fastblock_types::clone_data::CopyUpTarget;
use fastblock_types::units::BLOCK_SIZE_BYTES;
use fastblock_types::ImageId;

const CHUNK: usize = 64 << 10;
/// Objects the filler writes are numbered from here, apart from the test's own.
const FILL_BASE: u64 = 1_000;

fn new_store() -> Store<SimDisk> {
    let (_disk, _meta, mut s) = new_sim(2 << 20);
    // A PG with objects has a log (objects of a PG the log does not know are the remains of
    // an interrupted removal, cleaned up at open).
    s.append_entries(pg(0), &[entry(1, 1, 10)]).unwrap();
    s.commit().unwrap();
    s
}

/// Writes 4 KiB objects until the data region is full (nothing pending), then deletes the
/// first of them: the region is full, and one object's blocks wait for a flush.
fn full_with_one_block_pending(s: &mut Store<SimDisk>) {
    let mut i = FILL_BASE;
    loop {
        match s.write_object(pg(0), obj(i), 0, &pattern(i, 4096)) {
            Ok(()) => i += 1,
            Err(Error::NoSpace { .. }) => break,
            Err(e) => panic!("{e:?}"),
        }
        assert!(i < FILL_BASE + 10_000, "disk never filled");
    }
    s.flush().unwrap();
    assert_eq!(s.free_data_bytes(), 0, "the region is full");
    s.delete_object(pg(0), obj(FILL_BASE)).unwrap();
    assert_eq!(s.pending_free_bytes(), BLOCK_SIZE_BYTES);
}

/// Goal: a discard with unaligned ends (its partial block is rewritten into a new block)
/// succeeds on a full region with blocks pending. Method: fill, free one block, discard the
/// middle of a block of an object written first.
#[test]
fn an_unaligned_discard_flushes_for_the_pending_space() {
    let mut s = new_store();
    s.write_object(pg(0), obj(1), 0, &pattern(1, 8192)).unwrap();
    full_with_one_block_pending(&mut s);
    s.zero_object(pg(0), obj(1), 100, 200)
        .expect("the pending block is given back");
    let mut buf = vec![0u8; 8192];
    s.read_object(pg(0), obj(1), 0, &mut buf).unwrap();
    let mut want = pattern(1, 8192);
    want[100..300].fill(0);
    assert_eq!(buf, want);
}

/// Goal: a rollback (which copies the snapshot's blocks into the head) succeeds on a full
/// region with blocks pending. Method: write an object, snapshot it, delete its head (its
/// blocks stay, kept for the snapshot), fill, free one block, roll back.
#[test]
fn a_rollback_flushes_for_the_pending_space() {
    let mut s = new_store();
    s.write_object(pg(0), obj(1), 0, &pattern(1, 4096)).unwrap();
    s.image_snap_create(pg(0), ImageId(1), 1).unwrap();
    s.delete_object(pg(0), obj(1)).unwrap();
    full_with_one_block_pending(&mut s);
    assert_eq!(
        s.image_snap_rollback(pg(0), obj(1), 1)
            .expect("the pending block is given back"),
        1
    );
    let mut buf = vec![0u8; 4096];
    s.read_object(pg(0), obj(1), 0, &mut buf).unwrap();
    assert_eq!(buf, pattern(1, 4096));
}

/// Goal: a copy-up piece succeeds on a full region with blocks pending. Method: fill, free
/// one block, copy one block up into the head of an object not written before.
#[test]
fn a_copy_up_flushes_for_the_pending_space() {
    let mut s = new_store();
    full_with_one_block_pending(&mut s);
    let data = pattern(7, 4096);
    let wrote = s
        .copy_up(pg(0), obj(1), 0, &data, &[(4096, CopyUpTarget::Head)])
        .expect("the pending block is given back");
    assert!(wrote);
    let mut buf = vec![0u8; 4096];
    s.read_object(pg(0), obj(1), 0, &mut buf).unwrap();
    assert_eq!(buf, data);
}

/// Goal: the bounds the shard admits writes and discards by (`write_allocates_bytes`,
/// `zero_allocates_bytes`) are what applying them takes from the free space. Method: for
/// ranges aligned and not, over a written object, apply the operation and compare the
/// drop in free bytes (freed blocks come back only at the next flush).
#[test]
fn writes_and_discards_take_what_the_admission_bounds_say() {
    let ranges: &[(u64, u64)] = &[
        (0, 4096),
        (0, 1),
        (100, 200),
        (4000, 200),
        (4096, 8192),
        (100, 8192),
        (100, 4096 * 3 - 100),
        (0, CHUNK as u64),
        (5000, 30_000),
    ];
    for &(offset, len) in ranges {
        let mut s = new_store();
        s.write_object(pg(0), obj(1), 0, &pattern(1, CHUNK))
            .unwrap();
        s.flush().unwrap();
        let free = s.free_data_bytes();
        s.zero_object(pg(0), obj(1), offset, len).unwrap();
        assert_eq!(
            free - s.free_data_bytes(),
            zero_allocates_bytes(offset, len),
            "discard {offset}+{len}"
        );
        s.flush().unwrap();
        let free = s.free_data_bytes();
        s.write_object(pg(0), obj(1), offset, &pattern(2, len as usize))
            .unwrap();
        assert_eq!(
            free - s.free_data_bytes(),
            write_allocates_bytes(offset, len),
            "write {offset}+{len}"
        );
    }
}

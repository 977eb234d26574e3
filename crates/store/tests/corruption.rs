//! Damage on disk is never silent. Each test builds a store on the simulated disk, damages
//! bytes the way a failing disk or a crash would, reopens, and expects the documented
//! outcome: a torn tail is cut cleanly, damage before the tail is `LogCorrupt`, a damaged data
//! block is `Checksum`, a log shorter than what was flushed is `LogTruncated`.
// raft-rs messages (rust-protobuf) are built field by field, as raft-rs itself does.
#![allow(clippy::field_reassign_with_default)]

mod common;
use common::*;
use fastblock_store::{Error, SimDisk, SimFile, Store};

/// Five committed batches of one entry each for PG 0. Returns the disk ranges of the entries.
fn five_batches() -> (SimDisk, SimFile, Vec<(u64, u32)>) {
    let (disk, meta, mut s) = new_sim(DEVICE_BYTES);
    let mut ranges = Vec::new();
    for i in 1..=5 {
        s.append_entries(pg(0), &[entry(i, 1, 1000)]).unwrap();
        s.commit().unwrap();
        ranges.push(s.wal().entry_disk_range(pg(0), i).unwrap());
    }
    drop(s);
    (disk, meta, ranges)
}

fn flip(disk: &SimDisk, at: u64) {
    disk.image().corrupt(at, |b| b[0] ^= 0x04);
}

#[test]
fn flipped_bit_before_the_tail_is_a_loud_error() {
    let (disk, meta, ranges) = five_batches();
    let (at, len) = ranges[2];
    flip(&disk, at + u64::from(len) / 2);
    match reopen(&disk, &meta) {
        Err(Error::LogCorrupt { reason, .. }) => assert!(reason.contains("durable"), "{reason}"),
        Err(e) => panic!("expected LogCorrupt, got {e}"),
        Ok(_) => panic!("corruption before the tail was skipped silently"),
    }
}

#[test]
fn flipped_bit_in_the_tail_batch_is_cut() {
    let (disk, meta, ranges) = five_batches();
    let (at, len) = ranges[4];
    flip(&disk, at + u64::from(len) - 3);
    let mut s = reopen(&disk, &meta).expect("a torn tail is not an error");
    assert_eq!(s.log_bounds(pg(0)), (1, 4));
    assert_eq!(s.entries(pg(0), 1, 5, None).unwrap().len(), 4);
    // The log continues cleanly after the cut, and survives another reopen.
    s.append_entries(pg(0), &[entry(5, 2, 10)]).unwrap();
    s.commit().unwrap();
    drop(s);
    let mut s = reopen(&disk, &meta).unwrap();
    assert_eq!(s.entries(pg(0), 5, 6, None).unwrap()[0], entry(5, 2, 10));
}

#[test]
fn damaged_entry_read_from_disk_is_a_loud_error() {
    let (disk, meta, ranges) = five_batches();
    let mut s = reopen(&disk, &meta).unwrap();
    // Damage after recovery validated the log: the read itself must notice.
    let (at, _) = ranges[1];
    flip(&disk, at + 40);
    match s.entries(pg(0), 2, 3, None) {
        Err(Error::LogCorrupt { .. }) => {}
        other => panic!("expected LogCorrupt, got {other:?}"),
    }
}

#[test]
fn zeroed_segment_tail_of_a_full_segment_is_corruption() {
    // Fill more than one segment so that segment 1 is followed by segment 2.
    let (disk, meta, mut s) = new_sim(DEVICE_BYTES);
    let mut ranges = Vec::new();
    for i in 1..=30 {
        s.append_entries(pg(0), &[entry(i, 1, 3000)]).unwrap();
        s.commit().unwrap();
        ranges.push(s.wal().entry_disk_range(pg(0), i).unwrap());
    }
    assert!(s.wal().live_segment_count() >= 2);
    drop(s);
    // "Truncate" the first segment: zero everything from entry 5 to the segment end.
    let (at, _) = ranges[4];
    let seg_end = 8192 + (64 << 10);
    disk.image()
        .corrupt(at, |b| b[..(seg_end - at) as usize].fill(0));
    match reopen(&disk, &meta) {
        Err(Error::LogCorrupt { reason, .. }) => {
            assert!(reason.contains("next segment"), "{reason}")
        }
        other => panic!("expected LogCorrupt, got {:?}", other.err()),
    }
}

#[test]
fn log_shorter_than_the_flushed_point_is_reported() {
    let (disk, meta, mut s) = new_sim(DEVICE_BYTES);
    for i in 1..=3 {
        s.append_entries(pg(0), &[entry(i, 1, 500)]).unwrap();
        s.commit().unwrap();
    }
    s.flush().unwrap();
    let (at, _) = s.wal().entry_disk_range(pg(0), 3).unwrap();
    drop(s);
    flip(&disk, at + 50);
    match reopen(&disk, &meta) {
        Err(Error::LogTruncated { .. }) => {}
        other => panic!("expected LogTruncated, got {:?}", other.err()),
    }
}

#[test]
fn flipped_bit_in_an_object_block_is_a_checksum_error() {
    let (disk, meta, mut s) = new_sim(DEVICE_BYTES);
    // A PG with objects has a log (objects of a PG the log does not know are the remains of
    // an interrupted removal, cleaned up at open).
    s.append_entries(pg(0), &[entry(1, 1, 10)]).unwrap();
    s.commit().unwrap();
    s.write_object(pg(0), obj(0), 0, &pattern(1, 8192)).unwrap();
    s.flush().unwrap();
    let data_offset = s.superblock().data_offset_bytes;
    drop(s);
    // The first write lands in the first two data blocks; damage the second.
    flip(&disk, data_offset + 4096 + 100);
    let mut s = reopen(&disk, &meta).unwrap();
    let mut buf = vec![0u8; 4096];
    s.read_object(pg(0), obj(0), 0, &mut buf)
        .expect("undamaged block reads");
    match s.read_object(pg(0), obj(0), 4096, &mut buf) {
        Err(Error::Checksum { block_index: 1, .. }) => {}
        other => panic!("expected a checksum error on block 1, got {other:?}"),
    }
    assert!(!s.is_failed(), "a checksum error is not an I/O error");
}

#[test]
fn damaged_superblock_and_short_device_are_refused() {
    let (disk, meta, s) = new_sim(DEVICE_BYTES);
    drop(s);
    let bytes = disk.image().bytes().to_vec();
    let short = SimDisk::from_bytes(bytes[..bytes.len() / 2].to_vec());
    match Store::open(short, meta.clone(), options()) {
        Err(Error::DeviceTooSmall { .. }) => {}
        other => panic!("expected DeviceTooSmall, got {:?}", other.err()),
    }
    flip(&disk, 20);
    match reopen(&disk, &meta) {
        Err(Error::BadSuperblock(_)) => {}
        other => panic!("expected BadSuperblock, got {:?}", other.err()),
    }
}

#[test]
fn mkfs_refuses_a_non_empty_device_unless_forced() {
    let (disk, meta, s) = new_sim(DEVICE_BYTES);
    drop(s);
    match Store::mkfs(disk.clone(), meta.clone(), &small_mkfs(), options()) {
        Err(Error::NotEmpty { .. }) => {}
        other => panic!("expected NotEmpty, got {:?}", other.err()),
    }
    let mut forced = small_mkfs();
    forced.force = true;
    let s = Store::mkfs(disk.clone(), meta.clone(), &forced, options()).unwrap();
    drop(s);
    reopen(&disk, &meta).unwrap();
}

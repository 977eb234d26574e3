//! Bad block copies: never a failed engine, always noted, repaired in place from a good
//! replica's versions (`objects/damage.rs`).
// raft-rs messages (rust-protobuf) are built field by field, as raft-rs itself does.
#![allow(clippy::field_reassign_with_default)]

mod common;
use common::*;
use fastblock_store::disk::{SimDisk, SimFile};
use fastblock_store::{DamagedBlock, Error, Store};
use raft::eraftpb::ConfState;

/// Two replicas of PG 0 with object 0 written whole (three blocks, pattern 1) and flushed:
/// its blocks are the first three data blocks on both disks.
fn two_replicas() -> Vec<(SimDisk, SimFile, Store<SimDisk>)> {
    (0..2)
        .map(|_| {
            let (disk, meta, mut s) = new_sim(DEVICE_BYTES);
            let mut cs = ConfState::default();
            cs.voters = vec![1, 2, 3];
            s.set_conf_state(pg(0), &cs).unwrap();
            s.append_entries(pg(0), &[entry(1, 1, 10)]).unwrap();
            s.commit().unwrap();
            s.write_object(pg(0), obj(0), 0, &pattern(1, 3 * 4096))
                .unwrap();
            s.set_applied(pg(0), 1).unwrap();
            s.flush().unwrap();
            (disk, meta, s)
        })
        .collect()
}

/// Flips a byte of data block `phys` on the disk under `s`.
fn corrupt_block(disk: &SimDisk, s: &Store<SimDisk>, phys: u64) {
    let at = s.superblock().data_offset_bytes + phys * 4096 + 100;
    disk.image().corrupt(at, |b| b[0] ^= 0x40);
}

fn read(s: &mut Store<SimDisk>, offset: u64, len: usize) -> fastblock_store::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    s.read_object(pg(0), obj(0), offset, &mut buf).map(|()| buf)
}

/// Block 1 of object 0, bad where `two_replicas` put it: data block 1.
fn block1() -> DamagedBlock {
    DamagedBlock {
        pg: pg(0),
        object: obj(0),
        block: 1,
        unreadable: false,
        physical_block: 1,
    }
}

#[test]
fn a_bad_block_is_noted_and_counted_and_the_engine_goes_on() {
    let mut r = two_replicas();
    let (disk, _meta, s) = &mut r[0];
    corrupt_block(disk, s, 1);
    match read(s, 0, 3 * 4096) {
        Err(e @ Error::Checksum { .. }) => {
            assert_eq!(e.bad_block(), Some((pg(0), obj(0), 1)));
        }
        other => panic!("expected a checksum error, got {other:?}"),
    }
    assert!(!s.is_failed());
    assert_eq!(s.take_damaged(), vec![block1()]);
    assert!(s.take_damaged().is_empty(), "each note is handed over once");
    assert_eq!(s.damage_counts().checksum_errors, 1);
    // The good blocks around it still read.
    assert_eq!(read(s, 0, 4096).unwrap(), pattern(1, 4096));
    assert_eq!(read(s, 8192, 4096).unwrap(), pattern(1, 3 * 4096)[8192..]);
}

#[test]
fn a_partial_write_over_a_bad_block_leaves_it_bad_and_the_repair_brings_the_merge() {
    let mut r = two_replicas();
    {
        let (disk, _meta, s) = &mut r[0];
        corrupt_block(disk, s, 1);
    }
    // The same partial write on both replicas: 200 bytes inside block 1, and a write that
    // covers block 2 whole and block 1's tail.
    let patch = pattern(7, 200);
    let tail = pattern(8, 4096 + 96);
    for (_, _, s) in r.iter_mut() {
        s.write_object(pg(0), obj(0), 4096 + 100, &patch)
            .expect("a partial write over a bad block is not an error");
        s.write_object(pg(0), obj(0), 8192 - 96, &tail).unwrap();
        s.set_applied(pg(0), 3).unwrap();
        assert!(!s.is_failed());
    }
    let (bad, good) = r.split_at_mut(1);
    let (good, bad) = (&mut good[0].2, &mut bad[0]);
    let (bad_disk, bad_meta, bad) = (&bad.0, &bad.1, &mut bad.2);
    assert_eq!(bad.take_damaged(), vec![block1()]);
    assert!(matches!(read(bad, 4096, 4096), Err(Error::Checksum { .. })));
    // Block 2, written whole, is good on the damaged replica too.
    assert_eq!(
        read(bad, 8192, 4096).unwrap(),
        read(good, 8192, 4096).unwrap()
    );

    let chunk = good.transfer_read(pg(0), obj(0), 4096, 4096).unwrap();
    assert!(chunk.versions.iter().all(|v| !v.damaged));
    assert_eq!(bad.repair_blocks(pg(0), obj(0), 4096, &chunk).unwrap(), 1);
    assert_eq!(
        good.repair_blocks(pg(0), obj(0), 4096, &chunk).unwrap(),
        0,
        "a good copy is kept"
    );
    let want = read(good, 0, 3 * 4096).unwrap();
    assert_eq!(&want[4096 + 100..4096 + 300], &patch[..]);
    assert_eq!(read(bad, 0, 3 * 4096).unwrap(), want);
    assert_eq!(bad.damage_counts().versions_repaired, 1);
    bad.verify_usage().unwrap();

    // Durable after a flush, and the bad copy's block is given back.
    bad.flush().unwrap();
    let free = bad.free_data_bytes();
    drop(std::mem::replace(bad, reopen(bad_disk, bad_meta).unwrap()));
    assert_eq!(read(bad, 0, 3 * 4096).unwrap(), want);
    assert_eq!(bad.free_data_bytes(), free);
}

#[test]
fn a_replayed_partial_write_over_a_bad_block_does_not_fail_the_open() {
    let mut r = two_replicas();
    let (disk, meta, s) = &mut r[0];
    corrupt_block(disk, s, 1);
    s.append_entries(pg(0), &[entry(2, 1, 10)]).unwrap();
    s.commit().unwrap();
    s.write_object(pg(0), obj(0), 4096 + 10, &pattern(3, 10))
        .unwrap();
    drop(std::mem::replace(s, reopen(disk, meta).unwrap()));
    // The shard replays entry 2 after the open: the same write, again without an error.
    s.write_object(pg(0), obj(0), 4096 + 10, &pattern(3, 10))
        .unwrap();
    assert!(!s.is_failed());
    assert_eq!(s.take_damaged(), vec![block1()]);
}

#[test]
fn every_version_of_a_block_is_repaired_with_its_snapshot() {
    let mut r = two_replicas();
    let image = obj(0).image;
    {
        let (disk, _meta, s) = &mut r[0];
        corrupt_block(disk, s, 1);
    }
    for (_, _, s) in r.iter_mut() {
        s.image_snap_create(pg(0), image, 1).unwrap();
        // Over block 1 after the snapshot: the good replica keeps the old block for it; the
        // damaged one cannot merge and leaves its bad block where it is.
        s.write_object(pg(0), obj(0), 4096 + 2048, &pattern(5, 100))
            .unwrap();
    }
    let (bad, good) = r.split_at_mut(1);
    let (good, bad) = (&mut good[0].2, &mut bad[0].2);
    let chunk = good.transfer_read(pg(0), obj(0), 4096, 4096).unwrap();
    assert_eq!(
        chunk.versions.len(),
        2,
        "the head and the version kept for snapshot 1"
    );
    assert_eq!(bad.repair_blocks(pg(0), obj(0), 4096, &chunk).unwrap(), 2);
    assert_eq!(
        read(bad, 0, 3 * 4096).unwrap(),
        read(good, 0, 3 * 4096).unwrap()
    );
    let mut a = vec![0u8; 3 * 4096];
    let mut b = vec![0u8; 3 * 4096];
    good.read_image_snap(pg(0), obj(0), 1, 0, &mut a).unwrap();
    bad.read_image_snap(pg(0), obj(0), 1, 0, &mut b).unwrap();
    assert_eq!(a, b);
    assert_eq!(
        a,
        pattern(1, 3 * 4096),
        "the snapshot shows the bytes before the write"
    );
    bad.verify_usage().unwrap();
}

#[test]
fn a_transfer_sends_a_bad_block_as_damaged_and_the_receiver_keeps_it_bad() {
    let mut r = two_replicas();
    let (disk, _meta, s) = &mut r[0];
    corrupt_block(disk, s, 1);
    let chunk = s.transfer_read(pg(0), obj(0), 0, 3 * 4096).unwrap();
    let damaged: Vec<u32> = chunk
        .versions
        .iter()
        .filter(|v| v.damaged)
        .map(|v| v.block)
        .collect();
    assert_eq!(damaged, vec![1]);
    assert_eq!(
        s.take_damaged(),
        vec![block1()],
        "the sender repairs its own copy"
    );
    // Round trip through the chunk encoding, as on the wire.
    let chunk = fastblock_store::ChunkVersions::decode(&chunk.encode()).unwrap();

    let (_d, _m, mut c) = new_sim(DEVICE_BYTES);
    c.snapshot_stage(pg(0), 9, obj(0), 0, &chunk).unwrap();
    let mut cs = ConfState::default();
    cs.voters = vec![1, 2, 3];
    c.install_snapshot(pg(0), 5, 1, &cs).unwrap();
    c.commit().unwrap();
    let mut buf = vec![0u8; 4096];
    c.read_object(pg(0), obj(0), 0, &mut buf).unwrap();
    assert_eq!(buf, pattern(1, 4096));
    assert!(matches!(
        c.read_object(pg(0), obj(0), 4096, &mut buf),
        Err(Error::Checksum { block_index: 1, .. })
    ));
    // A repair from a good copy replaces it.
    let good = r[1].2.transfer_read(pg(0), obj(0), 4096, 4096).unwrap();
    assert_eq!(c.repair_blocks(pg(0), obj(0), 4096, &good).unwrap(), 1);
    c.read_object(pg(0), obj(0), 0, &mut buf).unwrap();
    let mut all = vec![0u8; 3 * 4096];
    c.read_object(pg(0), obj(0), 0, &mut all).unwrap();
    assert_eq!(all, pattern(1, 3 * 4096));
}

#[test]
fn a_repair_with_a_damaged_or_misplaced_version_is_refused() {
    let mut r = two_replicas();
    let (_disk, _meta, s) = &mut r[0];
    let mut chunk = s.transfer_read(pg(0), obj(0), 4096, 4096).unwrap();
    chunk.versions[0].damaged = true;
    assert!(matches!(
        s.repair_blocks(pg(0), obj(0), 4096, &chunk),
        Err(Error::InvalidArgument(_))
    ));
    chunk.versions[0].damaged = false;
    chunk.versions[0].block = 5;
    assert!(matches!(
        s.repair_blocks(pg(0), obj(0), 4096, &chunk),
        Err(Error::InvalidArgument(_))
    ));
    assert!(!s.is_failed());
    assert_eq!(read(s, 0, 3 * 4096).unwrap(), pattern(1, 3 * 4096));
}

#[test]
fn a_block_that_read_back_bad_once_under_a_partial_write_stays_bad_until_repaired() {
    use fastblock_store::disk::{FaultKind, FaultOp};
    use fastblock_store::{FaultPlan, FaultRule, FaultyDisk};
    let plan = FaultPlan::new();
    let disk = FaultyDisk::new(SimDisk::new(DEVICE_BYTES), plan.clone());
    let mut s = Store::mkfs(disk, SimFile::new(), &small_mkfs(), options()).unwrap();
    let mut cs = ConfState::default();
    cs.voters = vec![1, 2, 3];
    s.set_conf_state(pg(0), &cs).unwrap();
    s.append_entries(pg(0), &[entry(1, 1, 10)]).unwrap();
    s.commit().unwrap();
    s.write_object(pg(0), obj(0), 0, &pattern(1, 3 * 4096))
        .unwrap();
    s.flush().unwrap();
    // One read of data comes back corrupted (a transient error: the device's bytes are fine).
    let data = s.superblock().data_offset_bytes;
    plan.set_rules(
        1,
        vec![FaultRule::new(FaultOp::Read, FaultKind::Corrupt)
            .with_range(data..data + 3 * 4096)
            .with_fires_max(1)],
    )
    .unwrap();
    s.write_object(pg(0), obj(0), 4096 + 100, &pattern(2, 50))
        .unwrap();
    assert_eq!(plan.fired().total(), 1, "the fault fired");
    assert_eq!(s.take_damaged().len(), 1);
    // A second partial write over it cannot merge either (it must not unmark the block).
    s.write_object(pg(0), obj(0), 4096 + 300, &pattern(3, 50))
        .unwrap();
    // The block's copy is intact on the device but lacks the writes: it must not pass for
    // current, now or after a flush.
    for _ in 0..2 {
        let mut buf = vec![0u8; 4096];
        assert!(matches!(
            s.read_object(pg(0), obj(0), 4096, &mut buf),
            Err(Error::Checksum { block_index: 1, .. })
        ));
        s.flush().unwrap();
    }
    assert!(!s.is_failed());
}

//! Moving a PG's live entries forward (re-appending them at the head of the WAL) frees the
//! segment that pinned the ring, and a crash at any point keeps the PG's log exactly as it
//! was: the shard core does this for a PG that cannot commit (`fastblock_shard::wal_space`).
// raft-rs messages (rust-protobuf) are built field by field, as raft-rs itself does.
#![allow(clippy::field_reassign_with_default)]

mod common;
use common::*;
use raft::eraftpb::{ConfState, Entry};

/// Appends `entries` in runs of 4 (each fits a 16 KiB batch), committing after each run.
fn append_in_runs(s: &mut fastblock_store::Store<fastblock_store::SimDisk>, entries: &[Entry]) {
    for run in entries.chunks(4) {
        s.append_entries(pg(0), run).unwrap();
        s.commit().unwrap();
    }
}

/// PGs 0 and 1 on one voter; PG 0 logs 10 entries (two batches' worth) that never get
/// compacted.
fn stuck_store() -> (
    fastblock_store::SimDisk,
    fastblock_store::SimFile,
    fastblock_store::Store<fastblock_store::SimDisk>,
    Vec<Entry>,
) {
    let (disk, meta, mut s) = new_sim(DEVICE_BYTES);
    let mut cs = ConfState::default();
    cs.voters = vec![1];
    for p in 0..2 {
        s.set_conf_state(pg(p), &cs).unwrap();
    }
    let stuck: Vec<Entry> = (1..=10).map(|i| entry(i, 1, 3000)).collect();
    append_in_runs(&mut s, &stuck);
    (disk, meta, s, stuck)
}

/// PG 0 logs 10 entries (two batches' worth) that never get compacted; PG 1 writes and compacts until the WAL
/// (6 segments of 64 KiB) is nearly full behind PG 0's pin.
fn pinned_store() -> (
    fastblock_store::SimDisk,
    fastblock_store::SimFile,
    fastblock_store::Store<fastblock_store::SimDisk>,
    Vec<Entry>,
) {
    let (disk, meta, mut s, stuck) = stuck_store();
    let mut index = 1;
    while s.wal().free_segment_count() > 1 {
        s.commit().unwrap();
        s.append_entries(pg(1), &[entry(index, 1, 8 << 10)])
            .unwrap();
        s.commit().unwrap();
        s.set_applied(pg(1), index).unwrap();
        if index % 4 == 0 {
            s.flush().unwrap();
            s.compact(pg(1), index).unwrap();
        }
        index += 1;
        assert!(index < 10_000, "the WAL never filled");
    }
    (disk, meta, s, stuck)
}

#[test]
fn moving_entries_forward_frees_the_pinned_segment() {
    let (_disk, _meta, mut s, stuck) = pinned_store();
    let (oldest, pgs) = s.wal().oldest_pinned_segment().expect("a pinned segment");
    assert_eq!(pgs, vec![pg(0)]);
    append_in_runs(&mut s, &stuck);
    assert_eq!(s.log_bounds(pg(0)), (1, 10));
    // The old segment holds nothing live any more.
    let after = s.wal().oldest_pinned_segment();
    assert!(
        after.as_ref().is_none_or(|(seq, _)| *seq > oldest),
        "{after:?}"
    );
    assert_eq!(s.entries(pg(0), 1, 11, None).unwrap(), stuck);
}

#[test]
fn a_crash_during_or_after_the_move_keeps_the_log() {
    // Moving an entry whose index and term the log holds replaces its record and nothing
    // else, so a move cut short by a crash (some runs durable, the rest lost or torn) leaves
    // every entry readable from its old or its new record.
    for seed in 0..36u64 {
        let (disk, meta, mut s, stuck) = pinned_store();
        match seed % 3 {
            0 => {
                // Durable, then the ring moves on over the freed segment (with one free slot
                // before the move, 20 entries of 8 KiB need it).
                append_in_runs(&mut s, &stuck);
                let next = s.log_bounds(pg(1)).1 + 1;
                for index in next..next + 20 {
                    // Compaction records are pending: commit them, so the entry may roll.
                    s.commit().unwrap();
                    s.append_entries(pg(1), &[entry(index, 1, 8 << 10)])
                        .unwrap();
                    s.commit().unwrap();
                    s.set_applied(pg(1), index).unwrap();
                    s.flush().unwrap();
                    s.compact(pg(1), index).unwrap();
                }
            }
            1 => {
                // The first run durable, the second pending at the crash.
                append_in_runs(&mut s, &stuck[..4]);
                s.append_entries(pg(0), &stuck[4..8]).unwrap();
            }
            _ => {
                // Nothing durable: the moved records are lost or torn by the crash.
                s.append_entries(pg(0), &stuck[..4]).unwrap();
            }
        }
        drop(s);
        crash(&disk, &meta, seed);
        let mut s = reopen(&disk, &meta).unwrap_or_else(|e| panic!("seed {seed}: reopen: {e}"));
        assert_eq!(s.log_bounds(pg(0)), (1, 10), "seed {seed}");
        assert_eq!(s.entries(pg(0), 1, 11, None).unwrap(), stuck, "seed {seed}");
    }
}

/// Goal: a move split over two segments replays. The segment holding the first part starts
/// with a checkpoint that lists the PG's entries; once the old segment is dead the log starts
/// there, and replay knows those entries only as placeholders (terms unknown). A moved entry
/// replayed as a fresh one dropped the placeholders after it, and the next segment's
/// checkpoint then disagreed with the replayed log (`LogCorrupt`; simulator, seed
/// 16595073271290314718). Moves are recorded as such (`EntryMoved`) and only relocate.
#[test]
fn a_move_split_over_two_segments_replays_from_either() {
    let (disk, meta, mut s, stuck) = stuck_store();
    let pg1_write = |s: &mut fastblock_store::Store<fastblock_store::SimDisk>, index: u64| {
        s.commit().unwrap();
        s.append_entries(pg(1), &[entry(index, 1, 8 << 10)])
            .unwrap();
        s.commit().unwrap();
        s.set_applied(pg(1), index).unwrap();
        s.flush().unwrap();
        s.compact(pg(1), index).unwrap();
    };
    // Two segments on, so that the first part does not share the originals' segment.
    let mut index = 1;
    let start_seq = s.wal().current_segment_seq();
    while s.wal().current_segment_seq() < start_seq + 2 {
        pg1_write(&mut s, index);
        index += 1;
    }
    append_in_runs(&mut s, &stuck[..4]);
    let first_part_seq = s.wal().current_segment_seq();
    while s.wal().current_segment_seq() == first_part_seq {
        pg1_write(&mut s, index);
        index += 1;
    }
    append_in_runs(&mut s, &stuck[4..]);
    // The ring comes round until every slot holds a segment from the first part's on: the
    // originals' slot is reused, so the log starts at the first part's segment.
    let segments = u64::from(s.superblock().segment_count);
    while s.wal().current_segment_seq() < first_part_seq + segments - 1 {
        pg1_write(&mut s, index);
        index += 1;
    }
    drop(s);
    let mut s = reopen(&disk, &meta).unwrap_or_else(|e| panic!("reopen: {e}"));
    assert_eq!(s.log_bounds(pg(0)), (1, 10));
    assert_eq!(s.entries(pg(0), 1, 11, None).unwrap(), stuck);
}

//! Snapshots of a clone in the storage engine: a model-based test with crashes.
//!
//! One clone image of 3 objects reads a parent snapshot (fixed patterns) within its overlap.
//! The test drives the engine as the client library and the PG leader do: a write first
//! copies its object up (the parent's bytes, placed by `copy_up_runs` from the overlaps of
//! the head and of each snapshot), a copy-up may be cut short, a shrink cuts the overlap
//! and deletes the tail, a rollback copies up first when the snapshot read more of the
//! parent than the head now does. Reads go where a client's would: to the clone if the
//! object is copied up, else to the parent within the overlap of the version read.
//!
//! The model keeps what every version reads, byte for byte: the head and each snapshot as
//! it was taken. Every read of the head and of every snapshot must equal it, through
//! crashes (the model then returns to the last flush), and at the end the blocks in use
//! are the head's plus the kept ones, and all of them are free once everything is removed.

// raft-rs messages (rust-protobuf) are built field by field, as raft-rs itself does.
#![allow(clippy::field_reassign_with_default)]

mod common;
use common::*;
use fastblock_store::{ObjectId, SimDisk, Store, StoreOptions};
use fastblock_types::clone_data::{copy_up_runs, CopyUpTarget};
use fastblock_types::{ImageId, PgId, SnapId};
use proptest::prelude::*;
use std::collections::BTreeMap;

const OBJ: u64 = 64 << 10;
const OBJECTS: u64 = 3;
const SIZE: u64 = OBJ * OBJECTS;
const BLOCK: u64 = 4096;
const IMAGE: ImageId = ImageId(7);
/// Copy-ups go in pieces of this much (each a log entry for the OSD).
const PIECE: u64 = 16 << 10;

fn the_pg() -> PgId {
    pg(0)
}

fn object(index: u64) -> ObjectId {
    ObjectId {
        image: IMAGE,
        index,
    }
}

/// The parent snapshot's bytes (the whole image: the clone was made at its size).
fn parent() -> Vec<u8> {
    pattern(0xC10E, SIZE as usize)
}

#[derive(Clone, Debug)]
enum Op {
    Write {
        obj: u64,
        off: u64,
        len: u64,
        seed: u64,
    },
    /// A copy-up: whole (as `flatten` does), or cut short before its mark.
    CopyUp {
        obj: u64,
        whole: bool,
    },
    Snap,
    SnapRemove {
        pick: usize,
    },
    /// Shrink to `blocks` 4 KiB blocks (at least one: cutting the overlap), then grow back.
    Shrink {
        blocks: u64,
    },
    Rollback {
        obj: u64,
        pick: usize,
    },
    ReadHead {
        obj: u64,
    },
    ReadSnap {
        pick: usize,
        obj: u64,
    },
    Flush,
    Crash {
        seed: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let obj = 0..OBJECTS;
    prop_oneof![
        6 => (obj.clone(), 0..OBJ, 1..20_000u64, any::<u64>()).prop_map(|(obj, off, len, seed)| {
            Op::Write { obj, off, len: len.min(OBJ - off), seed }
        }),
        2 => (obj.clone(), any::<bool>()).prop_map(|(obj, whole)| Op::CopyUp { obj, whole }),
        3 => Just(Op::Snap),
        1 => any::<usize>().prop_map(|pick| Op::SnapRemove { pick }),
        1 => (1..=SIZE / BLOCK).prop_map(|blocks| Op::Shrink { blocks }),
        1 => (obj.clone(), any::<usize>()).prop_map(|(obj, pick)| Op::Rollback { obj, pick }),
        3 => obj.clone().prop_map(|obj| Op::ReadHead { obj }),
        3 => (any::<usize>(), obj.clone()).prop_map(|(pick, obj)| Op::ReadSnap { pick, obj }),
        2 => Just(Op::Flush),
        1 => any::<u64>().prop_map(|seed| Op::Crash { seed }),
    ]
}

/// What every version of the clone reads, and the overlaps that decide where a copy-up
/// puts the parent's bytes.
#[derive(Clone, Debug, PartialEq)]
struct Model {
    /// The head's overlap with the parent.
    head_overlap: u64,
    head: Vec<u8>,
    seq: u64,
    /// Snapshot id -> (its overlap, the image as it read then).
    snaps: BTreeMap<u64, (u64, Vec<u8>)>,
}

impl Model {
    fn new() -> Model {
        Model {
            head_overlap: SIZE,
            head: parent(),
            seq: 0,
            snaps: BTreeMap::new(),
        }
    }

    fn snap_at(&self, pick: usize) -> Option<u64> {
        let n = self.snaps.len();
        (n > 0).then(|| *self.snaps.keys().nth(pick % n).expect("in range"))
    }
}

/// Object `obj` as a client reads it from version `snap` (0: the head) whose overlap is
/// `overlap`: from the clone if copied up, else the parent within the overlap.
fn client_read(s: &mut Store<SimDisk>, snap: u64, overlap: u64, obj: u64) -> Vec<u8> {
    let mut buf = vec![0xEE; OBJ as usize];
    if s.is_copied(the_pg(), object(obj)) {
        match snap {
            0 => s.read_object(the_pg(), object(obj), 0, &mut buf),
            snap => s.read_image_snap(the_pg(), object(obj), snap, 0, &mut buf),
        }
        .expect("read of the clone");
        return buf;
    }
    let start = obj * OBJ;
    let from_parent = overlap.saturating_sub(start).min(OBJ) as usize;
    buf[..from_parent].copy_from_slice(&parent()[start as usize..start as usize + from_parent]);
    buf[from_parent..].fill(0);
    buf
}

/// Copies object `obj` up as the client does (the parent's bytes as far as any version
/// reads them, in pieces) and as the leader places them; `mark`: finish with the mark.
fn copy_up(s: &mut Store<SimDisk>, m: &Model, obj: u64, mark: bool) {
    if s.is_copied(the_pg(), object(obj)) {
        return;
    }
    let reach = m
        .snaps
        .values()
        .map(|(ov, _)| *ov)
        .fold(m.head_overlap, u64::max);
    let snaps: Vec<(SnapId, u64)> = m
        .snaps
        .iter()
        .map(|(id, (ov, _))| (SnapId(*id), *ov))
        .collect();
    let (start, end) = (obj * OBJ, ((obj + 1) * OBJ).min(reach));
    let mut at = start;
    while at < end {
        let piece_end = (at + PIECE).min(end);
        let runs: Vec<(u64, CopyUpTarget)> = copy_up_runs(at, piece_end, m.head_overlap, &snaps)
            .into_iter()
            .map(|(e, t)| (e - start, t))
            .collect();
        let data = &parent()[at as usize..piece_end as usize];
        s.copy_up(the_pg(), object(obj), at - start, data, &runs)
            .expect("copy-up piece");
        at = piece_end;
    }
    if mark {
        s.copy_up_done(the_pg(), object(obj)).expect("copy-up mark");
    }
}

fn step(s: &mut Store<SimDisk>, m: &mut Model, flushed: &mut Model, op: &Op) {
    match op.clone() {
        Op::Write {
            obj,
            off,
            len,
            seed,
        } => {
            copy_up(s, m, obj, true);
            let data = pattern(seed, len as usize);
            s.write_object(the_pg(), object(obj), off, &data)
                .expect("write");
            let at = (obj * OBJ + off) as usize;
            m.head[at..at + len as usize].copy_from_slice(&data);
        }
        Op::CopyUp { obj, whole } => copy_up(s, m, obj, whole),
        Op::Snap => {
            m.seq += 1;
            s.image_snap_create(the_pg(), IMAGE, m.seq)
                .expect("snapshot");
            m.snaps.insert(m.seq, (m.head_overlap, m.head.clone()));
        }
        Op::SnapRemove { pick } => {
            let Some(id) = m.snap_at(pick) else { return };
            s.image_snap_remove(the_pg(), IMAGE, id).expect("remove");
            m.snaps.remove(&id);
        }
        Op::Shrink { blocks } => {
            let to = blocks * BLOCK;
            if to < SIZE {
                s.reclaim_image_range(the_pg(), IMAGE, to, SIZE, OBJ)
                    .expect("reclaim");
            }
            m.head_overlap = m.head_overlap.min(to);
            m.head[to as usize..].fill(0);
        }
        Op::Rollback { obj, pick } => {
            let Some(id) = m.snap_at(pick) else { return };
            let (snap_overlap, content) = m.snaps[&id].clone();
            let (start, end) = (obj * OBJ, (obj + 1) * OBJ);
            if start < snap_overlap && end > m.head_overlap {
                copy_up(s, m, obj, true);
            }
            s.image_snap_rollback(the_pg(), object(obj), id)
                .expect("rollback");
            m.head[start as usize..end as usize]
                .copy_from_slice(&content[start as usize..end as usize]);
        }
        Op::ReadHead { obj } => {
            let got = client_read(s, 0, m.head_overlap, obj);
            let start = (obj * OBJ) as usize;
            assert!(
                got == m.head[start..start + OBJ as usize],
                "head, object {obj}"
            );
        }
        Op::ReadSnap { pick, obj } => {
            let Some(id) = m.snap_at(pick) else { return };
            let (overlap, content) = &m.snaps[&id];
            let got = client_read(s, id, *overlap, obj);
            let start = (obj * OBJ) as usize;
            assert!(
                got == content[start..start + OBJ as usize],
                "snapshot {id}, object {obj}"
            );
        }
        Op::Flush => {
            s.flush().expect("flush");
            *flushed = m.clone();
        }
        Op::Crash { .. } => unreachable!("run() crashes the store itself"),
    }
    s.verify_usage().expect("usage counters");
}

fn check_all(s: &mut Store<SimDisk>, m: &Model) {
    for obj in 0..OBJECTS {
        step(s, &mut m.clone(), &mut m.clone(), &Op::ReadHead { obj });
        for id in m.snaps.keys() {
            let (overlap, content) = &m.snaps[id];
            let got = client_read(s, *id, *overlap, obj);
            let start = (obj * OBJ) as usize;
            assert!(
                got == content[start..start + OBJ as usize],
                "snapshot {id}, object {obj}"
            );
        }
    }
}

fn run(ops: &[Op]) {
    let opts: StoreOptions = options();
    let (disk, meta, mut s) = new_sim_with(16 << 20, opts.clone());
    // The PG must be known to the log, or opening after a crash removes its objects.
    s.append_entries(the_pg(), &[entry(1, 1, 8)])
        .expect("append");
    s.commit().expect("commit");
    s.flush().expect("flush");
    let empty_free_bytes = s.free_data_bytes();
    let mut m = Model::new();
    let mut flushed = m.clone();
    for op in ops {
        match op {
            Op::Crash { seed } => {
                drop(s);
                crash(&disk, &meta, *seed);
                s = reopen_with(&disk, &meta, opts.clone()).expect("recovery");
                m = flushed.clone();
                s.verify_usage().expect("usage counted at open");
            }
            op => step(&mut s, &mut m, &mut flushed, op),
        }
    }
    check_all(&mut s, &m);
    // A deep flatten: every object copied up for every version, then the parent is gone
    // and every version still reads the same.
    for obj in 0..OBJECTS {
        copy_up(&mut s, &m, obj, true);
    }
    check_all(&mut s, &m);
    s.flush().expect("flush");
    let usage = s.image_usage(the_pg(), IMAGE);
    assert_eq!(
        empty_free_bytes - s.free_data_bytes(),
        usage.blocks() * BLOCK,
        "blocks in use = the image's head and kept blocks"
    );
    // Removing every snapshot, then the image, gives every block back.
    for id in m.snaps.keys() {
        s.image_snap_remove(the_pg(), IMAGE, *id).expect("remove");
    }
    s.reclaim_image_range(the_pg(), IMAGE, 0, SIZE, OBJ)
        .expect("image removal");
    assert!(
        !s.is_copied(the_pg(), object(0)),
        "the marks go with the image"
    );
    s.flush().expect("flush");
    s.flush().expect("flush");
    assert_eq!(s.free_data_bytes(), empty_free_bytes, "blocks leaked");
    s.verify_usage().expect("usage");
}

fn cases() -> u32 {
    std::env::var("FASTBLOCK_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(48)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn every_version_of_a_clone_reads_as_taken_through_copy_ups_shrinks_rollbacks_and_crashes(
        ops in prop::collection::vec(op(), 1..60),
    ) {
        run(&ops);
    }
}

/// The cases the design names (`docs/design/snapshots.md`, "Snapshots of clones"), spelled
/// out: a snapshot of an object not copied up reads the parent; copied up later, it reads
/// the same from the clone; a shrink after the snapshot leaves it the parent's tail, which
/// a copy-up keeps for it alone.
#[test]
fn a_copy_up_after_a_snapshot_and_a_shrink_keeps_the_tail_for_the_snapshot_only() {
    let mut m = Model::new();
    let mut flushed = m.clone();
    let (_d, _m, mut s) = new_sim(16 << 20);
    s.append_entries(the_pg(), &[entry(1, 1, 8)]).unwrap();
    s.commit().unwrap();
    let ops = [
        Op::Snap,
        Op::Shrink {
            blocks: (OBJ + OBJ / 2) / BLOCK,
        },
        Op::Snap,
        Op::Write {
            obj: 1,
            off: 0,
            len: 4096,
            seed: 9,
        },
        Op::ReadSnap { pick: 0, obj: 1 },
        Op::ReadSnap { pick: 1, obj: 1 },
        Op::ReadHead { obj: 1 },
    ];
    for op in &ops {
        step(&mut s, &mut m, &mut flushed, op);
    }
    // Object 1: its first half is head (parent bytes, then the write), its second half
    // kept for snapshot 1 alone (snapshot 2's overlap ends mid-object).
    let usage = s.image_usage(the_pg(), IMAGE);
    assert_eq!(usage.head_blocks, OBJ / 2 / BLOCK);
    assert_eq!(
        usage.kept_blocks_by_snap,
        BTreeMap::from([(1, OBJ / 2 / BLOCK), (2, 1)]),
        "the tail for snapshot 1; the block the write replaced for both"
    );
}

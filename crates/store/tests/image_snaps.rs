//! Image snapshots in the storage engine: a model-based test with crashes, and the space
//! rules (a snapshot costs nothing until a block is replaced, a rewrite costs nothing more,
//! removal frees what no other snapshot needs).
//!
//! The model holds, per image, the head of every object and a full copy of every live
//! snapshot taken. Random writes, discards, deletes, snapshots, removals, rollbacks, flushes
//! and crashes run against the engine on the simulated disk and against the model; every
//! read of the head and of every snapshot must equal the model, after a crash the engine
//! must hold exactly the state of the last flush, and at the end the blocks in use must be
//! exactly the head's blocks plus the blocks the snapshots keep (nothing leaked), and all of
//! them come back once the snapshots and objects are gone.

// raft-rs messages (rust-protobuf) are built field by field, as raft-rs itself does.
#![allow(clippy::field_reassign_with_default)]

mod common;
use common::*;
use fastblock_store::{Error, ObjectId, SimDisk, Store, StoreOptions};
use fastblock_types::{ImageId, PgId};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

const OBJ_BYTES: usize = 64 << 10;
const OBJECTS: u64 = 3;
const IMAGES: u64 = 2;

fn the_pg() -> PgId {
    pg(0)
}

fn object(image: u64, index: u64) -> ObjectId {
    ObjectId {
        image: ImageId(image),
        index,
    }
}

#[derive(Clone, Debug)]
enum Op {
    Write {
        img: u64,
        obj: u64,
        off: u64,
        len: u64,
        seed: u64,
    },
    Zero {
        img: u64,
        obj: u64,
        off: u64,
        len: u64,
    },
    Delete {
        img: u64,
        obj: u64,
    },
    SnapCreate {
        img: u64,
    },
    SnapRemove {
        img: u64,
        pick: usize,
    },
    Rollback {
        img: u64,
        obj: u64,
        pick: usize,
    },
    ReadHead {
        img: u64,
        obj: u64,
        off: u64,
        len: u64,
    },
    ReadSnap {
        img: u64,
        pick: usize,
        obj: u64,
        off: u64,
        len: u64,
    },
    Flush,
    Crash {
        seed: u64,
    },
}

fn range() -> impl Strategy<Value = (u64, u64)> {
    (0..OBJ_BYTES as u64).prop_flat_map(|off| (Just(off), 1..=(OBJ_BYTES as u64 - off).min(20_000)))
}

fn op() -> impl Strategy<Value = Op> {
    let img = 1..=IMAGES;
    let obj = 0..OBJECTS;
    prop_oneof![
        8 => (img.clone(), obj.clone(), range(), any::<u64>())
            .prop_map(|(img, obj, (off, len), seed)| Op::Write { img, obj, off, len, seed }),
        2 => (img.clone(), obj.clone(), range())
            .prop_map(|(img, obj, (off, len))| Op::Zero { img, obj, off, len }),
        1 => (img.clone(), obj.clone()).prop_map(|(img, obj)| Op::Delete { img, obj }),
        3 => img.clone().prop_map(|img| Op::SnapCreate { img }),
        1 => (img.clone(), any::<usize>()).prop_map(|(img, pick)| Op::SnapRemove { img, pick }),
        1 => (img.clone(), obj.clone(), any::<usize>())
            .prop_map(|(img, obj, pick)| Op::Rollback { img, obj, pick }),
        3 => (img.clone(), obj.clone(), range())
            .prop_map(|(img, obj, (off, len))| Op::ReadHead { img, obj, off, len }),
        3 => (img.clone(), any::<usize>(), obj.clone(), range())
            .prop_map(|(img, pick, obj, (off, len))| Op::ReadSnap { img, pick, obj, off, len }),
        2 => Just(Op::Flush),
        1 => any::<u64>().prop_map(|seed| Op::Crash { seed }),
    ]
}

/// The state one image holds: its head and its live snapshots.
#[derive(Clone, Debug, Default, PartialEq)]
struct ImageModel {
    seq: u64,
    /// Object index -> content (absent: never written, reads zeros).
    head: BTreeMap<u64, Vec<u8>>,
    /// Snapshot id -> the head as it was when the snapshot was taken.
    snaps: BTreeMap<u64, BTreeMap<u64, Vec<u8>>>,
}

impl ImageModel {
    fn obj(&mut self, i: u64) -> &mut Vec<u8> {
        self.head.entry(i).or_insert_with(|| vec![0; OBJ_BYTES])
    }

    fn snap_at(&self, pick: usize) -> Option<u64> {
        let n = self.snaps.len();
        (n > 0).then(|| *self.snaps.keys().nth(pick % n).expect("in range"))
    }
}

type Model = BTreeMap<u64, ImageModel>;

fn read_head(s: &mut Store<SimDisk>, img: u64, obj: u64, off: u64, len: u64) -> Vec<u8> {
    let mut buf = vec![0xEE; len as usize];
    s.read_object(the_pg(), object(img, obj), off, &mut buf)
        .expect("read of the head");
    buf
}

fn read_snap(s: &mut Store<SimDisk>, img: u64, snap: u64, obj: u64, off: u64, len: u64) -> Vec<u8> {
    let mut buf = vec![0xEE; len as usize];
    s.read_image_snap(the_pg(), object(img, obj), snap, off, &mut buf)
        .expect("read of a snapshot");
    buf
}

fn zeros_or(content: Option<&Vec<u8>>, off: u64, len: u64) -> Vec<u8> {
    match content {
        Some(c) => c[off as usize..(off + len) as usize].to_vec(),
        None => vec![0; len as usize],
    }
}

/// Applies one op to the engine and the model, then checks the usage counters against a
/// scan of the block maps.
fn step(s: &mut Store<SimDisk>, m: &mut Model, flushed: &mut Model, op: &Op) {
    apply_op(s, m, flushed, op);
    if let Err(e) = s.verify_usage() {
        panic!("after {op:?}: {e}");
    }
}

fn apply_op(s: &mut Store<SimDisk>, m: &mut Model, flushed: &mut Model, op: &Op) {
    match op.clone() {
        Op::Write {
            img,
            obj,
            off,
            len,
            seed,
        } => {
            let data = pattern(seed, len as usize);
            s.write_object(the_pg(), object(img, obj), off, &data)
                .expect("write");
            let im = m.entry(img).or_default();
            im.obj(obj)[off as usize..(off + len) as usize].copy_from_slice(&data);
        }
        Op::Zero { img, obj, off, len } => {
            s.zero_object(the_pg(), object(img, obj), off, len)
                .expect("zero");
            let im = m.entry(img).or_default();
            im.obj(obj)[off as usize..(off + len) as usize].fill(0);
        }
        Op::Delete { img, obj } => {
            s.delete_object(the_pg(), object(img, obj)).expect("delete");
            m.entry(img).or_default().head.remove(&obj);
        }
        Op::SnapCreate { img } => {
            let im = m.entry(img).or_default();
            let id = im.seq + 1;
            s.image_snap_create(the_pg(), ImageId(img), id)
                .expect("snapshot");
            // Taking the same snapshot again (a replayed log entry) changes nothing.
            s.image_snap_create(the_pg(), ImageId(img), id)
                .expect("snapshot again");
            im.seq = id;
            let copy = im.head.clone();
            im.snaps.insert(id, copy);
        }
        Op::SnapRemove { img, pick } => {
            let im = m.entry(img).or_default();
            let Some(id) = im.snap_at(pick) else { return };
            s.image_snap_remove(the_pg(), ImageId(img), id)
                .expect("snapshot removal");
            im.snaps.remove(&id);
            let mut buf = [0u8; 512];
            assert!(
                matches!(
                    s.read_image_snap(the_pg(), object(img, 0), id, 0, &mut buf),
                    Err(Error::NoSuchImageSnap { .. })
                ),
                "a removed snapshot must not be readable"
            );
            assert_eq!(
                s.image_snap_remove(the_pg(), ImageId(img), id)
                    .expect("removing again"),
                0,
                "removing a removed snapshot frees nothing more"
            );
        }
        Op::Rollback { img, obj, pick } => {
            let im = m.entry(img).or_default();
            let Some(id) = im.snap_at(pick) else { return };
            s.image_snap_rollback(the_pg(), object(img, obj), id)
                .expect("rollback");
            match im.snaps[&id].get(&obj).cloned() {
                Some(c) => {
                    im.head.insert(obj, c);
                }
                None => {
                    im.head.remove(&obj);
                }
            }
        }
        Op::ReadHead { img, obj, off, len } => {
            let got = read_head(s, img, obj, off, len);
            let want = zeros_or(m.entry(img).or_default().head.get(&obj), off, len);
            assert!(
                got == want,
                "head of image {img} object {obj} at {off}+{len}"
            );
        }
        Op::ReadSnap {
            img,
            pick,
            obj,
            off,
            len,
        } => {
            let im = m.entry(img).or_default();
            let Some(id) = im.snap_at(pick) else { return };
            let want = zeros_or(im.snaps[&id].get(&obj), off, len);
            let got = read_snap(s, img, id, obj, off, len);
            assert!(
                got == want,
                "snapshot {id} of image {img} object {obj} at {off}+{len}"
            );
        }
        Op::Flush => {
            s.flush().expect("flush");
            *flushed = m.clone();
        }
        Op::Crash { .. } => unreachable!("run() crashes the store itself"),
    }
}

/// What a crash needs: the simulated devices and the options to reopen with.
struct Ctx {
    disk: SimDisk,
    meta: fastblock_store::SimFile,
    opts: StoreOptions,
}

impl Ctx {
    /// Crashes the devices under `s` (dropped first: nothing of it may write afterwards) and
    /// opens the store again.
    fn crash(&self, s: Store<SimDisk>, seed: u64) -> Store<SimDisk> {
        drop(s);
        crash(&self.disk, &self.meta, seed);
        reopen_with(&self.disk, &self.meta, self.opts.clone()).expect("recovery")
    }
}

/// Every byte of every object of the head and of every live snapshot equals the model.
fn check_all(s: &mut Store<SimDisk>, m: &Model) {
    for img in 1..=IMAGES {
        let empty = ImageModel::default();
        let im = m.get(&img).unwrap_or(&empty);
        let state = s.image_snaps(the_pg(), ImageId(img));
        assert_eq!(
            state.live,
            im.snaps.keys().copied().collect::<BTreeSet<u64>>(),
            "live snapshots of image {img}"
        );
        for obj in 0..OBJECTS {
            let got = read_head(s, img, obj, 0, OBJ_BYTES as u64);
            assert!(
                got == zeros_or(im.head.get(&obj), 0, OBJ_BYTES as u64),
                "head of image {img} object {obj}"
            );
            for (id, snap) in &im.snaps {
                let got = read_snap(s, img, *id, obj, 0, OBJ_BYTES as u64);
                assert!(
                    got == zeros_or(snap.get(&obj), 0, OBJ_BYTES as u64),
                    "snapshot {id} of image {img} object {obj}"
                );
            }
        }
    }
}

/// Blocks in use (after a flush) are exactly the head's plus the snapshots' kept blocks.
fn check_space(s: &mut Store<SimDisk>, empty_free_bytes: u64) {
    s.flush().expect("flush");
    let mut kept = 0;
    let mut head_counted = 0;
    for img in 1..=IMAGES {
        let usage = s.image_usage(the_pg(), ImageId(img));
        kept += usage.kept_blocks();
        head_counted += usage.head_blocks;
    }
    let whole_pg = s.pg_usage(the_pg());
    assert_eq!(whole_pg.kept_blocks(), kept, "the PG's sum of kept blocks");
    assert_eq!(
        whole_pg.head_blocks, head_counted,
        "the PG's sum of head blocks"
    );
    let head = s.flushed_block_count().expect("block count");
    assert_eq!(
        head_counted, head,
        "head blocks counted and in the flushed map"
    );
    assert_eq!(
        s.pending_free_bytes(),
        0,
        "a flush gives back every pending block"
    );
    assert_eq!(
        empty_free_bytes - s.free_data_bytes(),
        (head + kept) * 4096,
        "blocks in use = head {head} + kept {kept}"
    );
}

fn run(ops: &[Op], block_cache_entries_max: usize) {
    let opts = StoreOptions {
        block_cache_entries_max,
        ..options()
    };
    let (disk, meta, mut s) = new_sim_with(16 << 20, opts.clone());
    // The PG must be known to the log, or opening after a crash removes its objects.
    s.append_entries(the_pg(), &[entry(1, 1, 8)])
        .expect("append");
    s.commit().expect("commit");
    s.flush().expect("flush");
    let empty_free_bytes = s.free_data_bytes();
    let ctx = Ctx { disk, meta, opts };
    let mut m = Model::new();
    let mut flushed = Model::new();
    for op in ops {
        match op {
            Op::Crash { seed } => {
                s = ctx.crash(s, *seed);
                m = flushed.clone();
                s.verify_usage().expect("usage counted at open");
            }
            op => step(&mut s, &mut m, &mut flushed, op),
        }
    }
    check_all(&mut s, &m);
    check_space(&mut s, empty_free_bytes);
    // What was flushed survives a crash whole.
    s = ctx.crash(s, 7);
    check_all(&mut s, &m);
    check_space(&mut s, empty_free_bytes);
    // Removing every snapshot and object gives every block back.
    for img in 1..=IMAGES {
        for id in s.image_snaps(the_pg(), ImageId(img)).live {
            s.image_snap_remove(the_pg(), ImageId(img), id)
                .expect("remove");
        }
        for obj in 0..OBJECTS {
            s.delete_object(the_pg(), object(img, obj)).expect("delete");
        }
    }
    s.flush().expect("flush");
    s.flush().expect("flush");
    assert_eq!(s.free_data_bytes(), empty_free_bytes, "blocks leaked");
}

fn cases() -> u32 {
    std::env::var("FASTBLOCK_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(32)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn snapshots_read_as_taken_through_writes_removals_rollbacks_and_crashes(
        ops in prop::collection::vec(op(), 1..70),
        cache in prop_oneof![Just(8usize), Just(StoreOptions::default().block_cache_entries_max)],
    ) {
        run(&ops, cache);
    }
}

#[test]
fn a_snapshot_costs_one_kept_block_per_block_replaced_and_rewrites_cost_nothing_more() {
    let (_d, _m, mut s) = new_sim(16 << 20);
    s.append_entries(the_pg(), &[entry(1, 1, 8)]).unwrap();
    s.commit().unwrap();
    s.flush().unwrap();
    let empty = s.free_data_bytes();
    let o = object(1, 0);
    s.write_object(the_pg(), o, 0, &pattern(1, OBJ_BYTES))
        .unwrap();
    s.flush().unwrap();
    assert_eq!(empty - s.free_data_bytes(), 16 * 4096);
    // Taking a snapshot moves no data and takes no space.
    s.image_snap_create(the_pg(), ImageId(1), 1).unwrap();
    s.flush().unwrap();
    assert_eq!(empty - s.free_data_bytes(), 16 * 4096);
    // The first write of a block keeps the old one; rewriting it keeps nothing more.
    for seed in 2..6 {
        s.write_object(the_pg(), o, 4096, &pattern(seed, 4096))
            .unwrap();
        s.flush().unwrap();
        assert_eq!(
            empty - s.free_data_bytes(),
            17 * 4096,
            "after rewrite {seed}"
        );
    }
    let usage = s.image_usage(the_pg(), ImageId(1));
    assert_eq!(usage.kept_blocks_by_snap, BTreeMap::from([(1, 1)]));
    assert_eq!((usage.objects, usage.head_blocks), (1, 16));
    // A discard after the snapshot does not free the snapshot's blocks.
    s.zero_object(the_pg(), o, 0, OBJ_BYTES as u64).unwrap();
    s.flush().unwrap();
    assert_eq!(empty - s.free_data_bytes(), 16 * 4096);
    let mut buf = vec![0; OBJ_BYTES];
    s.read_image_snap(the_pg(), o, 1, 0, &mut buf).unwrap();
    assert!(
        buf == pattern(1, OBJ_BYTES),
        "the snapshot still reads as taken"
    );
    // Removing the only snapshot frees what it kept.
    assert_eq!(s.image_snap_remove(the_pg(), ImageId(1), 1).unwrap(), 16);
    s.flush().unwrap();
    s.flush().unwrap();
    assert_eq!(s.free_data_bytes(), empty);
}

#[test]
fn removing_a_middle_snapshot_hands_its_blocks_to_the_older_one() {
    let (_d, _m, mut s) = new_sim(16 << 20);
    s.append_entries(the_pg(), &[entry(1, 1, 8)]).unwrap();
    s.commit().unwrap();
    let o = object(1, 0);
    let img = ImageId(1);
    s.write_object(the_pg(), o, 0, &pattern(1, 4096)).unwrap();
    s.image_snap_create(the_pg(), img, 1).unwrap();
    s.image_snap_create(the_pg(), img, 2).unwrap();
    s.write_object(the_pg(), o, 0, &pattern(2, 4096)).unwrap();
    // Kept under 2, the newest snapshot that sees it; snapshot 1 reads it from there.
    assert_eq!(
        s.image_usage(the_pg(), img).kept_blocks_by_snap,
        BTreeMap::from([(2, 1)])
    );
    assert_eq!(s.image_snap_remove(the_pg(), img, 2).unwrap(), 0);
    assert_eq!(
        s.image_usage(the_pg(), img).kept_blocks_by_snap,
        BTreeMap::from([(1, 1)])
    );
    let mut buf = vec![0; 4096];
    s.read_image_snap(the_pg(), o, 1, 0, &mut buf).unwrap();
    assert!(buf == pattern(1, 4096));
    // Ids only grow: an id at or below one taken before is refused.
    assert!(matches!(
        s.image_snap_create(the_pg(), img, 2),
        Err(Error::InvalidArgument(_))
    ));
}

/// Ops that a transfer test runs (no crashes: the transfer is between two live stores).
fn live_op() -> impl Strategy<Value = Op> {
    op().prop_filter("no crash", |o| !matches!(o, Op::Crash { .. }))
}

/// One chunk a PG snapshot transfer sends: image snapshot states first, then every version
/// of 16 KiB of an object (head or kept) at a time.
#[derive(Clone, Debug)]
enum Chunk {
    /// Captured when the transfer is planned: the state as of the snapshot's index.
    State(u64, fastblock_store::ImageSnaps),
    Blocks {
        object: ObjectId,
        offset: u64,
        len: u64,
    },
}

fn plan(s: &mut Store<SimDisk>) -> Vec<Chunk> {
    const CHUNK_BYTES: u64 = 16 << 10;
    let mut out: Vec<Chunk> = s
        .image_snaps_of_pg(the_pg())
        .into_iter()
        .map(|(image, state)| Chunk::State(image.0, state))
        .collect();
    let mut extents: BTreeMap<ObjectId, u64> = s
        .object_sizes(the_pg())
        .into_iter()
        .map(|(o, size)| (o, size.next_multiple_of(4096)))
        .collect();
    for (o, end) in s.kept_extents(the_pg()).unwrap() {
        let e = extents.entry(o).or_insert(0);
        *e = (*e).max(end);
    }
    for (object, size) in extents {
        let mut offset = 0;
        while offset < size {
            let len = CHUNK_BYTES.min(size - offset);
            out.push(Chunk::Blocks {
                object,
                offset,
                len,
            });
            offset += len;
        }
    }
    out
}

fn send(from: &mut Store<SimDisk>, to: &mut Store<SimDisk>, chunk: &Chunk) {
    match chunk {
        Chunk::State(image, state) => {
            to.snapshot_image_snaps(the_pg(), 1, ImageId(*image), state.clone());
        }
        &Chunk::Blocks {
            object,
            offset,
            len,
        } => {
            let versions = from.transfer_read(the_pg(), object, offset, len).unwrap();
            // Through the wire encoding, as the OSD sends it.
            let versions = fastblock_store::ChunkVersions::decode(&versions.encode()).unwrap();
            to.snapshot_stage(the_pg(), 1, object, offset, &versions)
                .unwrap();
        }
    }
}

/// A PG snapshot transfer (catch-up of a new member) carries the image snapshots: chunks
/// are read from the sender while it keeps applying (a fuzzy copy), the receiver installs
/// them and replays what the sender applied meanwhile, and from then on both read the same
/// head and snapshots as the model, through more writes, snapshots and removals on both.
fn run_transfer(before: &[Op], during: &[(usize, Op)], after: &[Op]) {
    let (_d, _m, mut a) = new_sim(16 << 20);
    let (_d2, _m2, mut b) = new_sim(16 << 20);
    for s in [&mut a, &mut b] {
        s.append_entries(the_pg(), &[entry(1, 1, 8)]).unwrap();
        s.commit().unwrap();
    }
    // The receiver holds older state of its own, which the install replaces.
    b.write_object(the_pg(), object(1, 0), 0, &pattern(99, 8192))
        .unwrap();
    b.image_snap_create(the_pg(), ImageId(2), 5).unwrap();
    let mut m = Model::new();
    let mut flushed = Model::new();
    for op in before {
        step(&mut a, &mut m, &mut flushed, op);
    }
    let chunks = plan(&mut a);
    let mut replay = Vec::new();
    let mut during = during.iter().peekable();
    for (n, chunk) in chunks.iter().enumerate() {
        while let Some((_, op)) = during.next_if(|(at, _)| *at <= n) {
            step(&mut a, &mut m, &mut flushed, op);
            replay.push(op.clone());
        }
        send(&mut a, &mut b, chunk);
    }
    for (_, op) in during {
        step(&mut a, &mut m, &mut flushed, op);
        replay.push(op.clone());
    }
    // Reads are not in the log: the receiver replays only what changes state. (Its states
    // part way through the replay mix the copy's later data with the replayed ops, so a
    // read there would be checked against no state the sender ever had.)
    replay.retain(|op| !matches!(op, Op::ReadHead { .. } | Op::ReadSnap { .. }));
    let mut cs = raft::eraftpb::ConfState::default();
    cs.voters = vec![1, 2, 3];
    b.install_snapshot(the_pg(), 10, 1, &cs).unwrap();
    b.commit().unwrap();
    // The log after the snapshot's index, replayed on the receiver.
    let mut mb = Model::new();
    let mut flushed_b = Model::new();
    // The receiver's model starts where the sender's was when the transfer began: replaying
    // the same ops on it must end where the sender's did.
    let mut m0 = Model::new();
    let mut f0 = Model::new();
    let (_d3, _m3, mut scratch) = new_sim(16 << 20);
    scratch.append_entries(the_pg(), &[entry(1, 1, 8)]).unwrap();
    scratch.commit().unwrap();
    for op in before {
        step(&mut scratch, &mut m0, &mut f0, op);
    }
    mb.clone_from(&m0);
    for op in &replay {
        step(&mut b, &mut mb, &mut flushed_b, op);
    }
    // Reads may have added empty entries to the sender's model: equal up to those.
    let without_empty = |m: &Model| -> Model {
        m.iter()
            .filter(|(_, im)| **im != ImageModel::default())
            .map(|(k, v)| (*k, v.clone()))
            .collect()
    };
    assert!(
        without_empty(&mb) == without_empty(&m),
        "the replayed model ends where the sender's did"
    );
    b.verify_usage()
        .expect("usage after the install and the replay");
    check_all(&mut a, &m);
    check_all(&mut b, &m);
    for op in after {
        step(&mut a, &mut m, &mut flushed, op);
        step(&mut b, &mut mb, &mut flushed_b, op);
    }
    check_all(&mut a, &m);
    check_all(&mut b, &mb);
    b.flush().unwrap();
    check_all(&mut b, &mb);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn a_pg_snapshot_transfer_carries_image_snapshots_through_a_fuzzy_copy(
        before in prop::collection::vec(live_op(), 0..40),
        during in prop::collection::vec((0usize..40, live_op()), 0..15),
        after in prop::collection::vec(live_op(), 0..25),
    ) {
        let mut during = during;
        during.sort_by_key(|(at, _)| *at);
        run_transfer(&before, &during, &after);
    }
}

/// An image removed while the trims of its removed snapshots are still on their way (the
/// monitor removed the snapshots, then the image): the removal frees the blocks those
/// snapshots keep and drops the image's snapshot state; the late trim finds nothing to do.
#[test]
fn removing_an_image_frees_what_its_pending_snapshot_trims_would() {
    let (_d, _m, mut s) = new_sim(16 << 20);
    s.append_entries(the_pg(), &[entry(1, 1, 8)]).unwrap();
    s.commit().unwrap();
    s.flush().unwrap();
    let empty = s.free_data_bytes();
    let img = ImageId(1);
    for obj in 0..OBJECTS {
        s.write_object(the_pg(), object(1, obj), 0, &pattern(obj, OBJ_BYTES))
            .unwrap();
    }
    s.image_snap_create(the_pg(), img, 1).unwrap();
    s.write_object(the_pg(), object(1, 0), 0, &pattern(9, OBJ_BYTES))
        .unwrap();
    assert_eq!(s.image_usage(the_pg(), img).kept_blocks(), 16);
    s.reclaim_image_range(
        the_pg(),
        img,
        0,
        OBJECTS * OBJ_BYTES as u64,
        OBJ_BYTES as u64,
    )
    .unwrap();
    assert_eq!(
        s.image_usage(the_pg(), img),
        fastblock_store::ImageUsage::default()
    );
    assert_eq!(
        s.image_snaps(the_pg(), img),
        fastblock_store::ImageSnaps::default()
    );
    assert_eq!(
        s.image_snap_remove(the_pg(), img, 1).unwrap(),
        0,
        "the late trim"
    );
    s.verify_usage().unwrap();
    s.flush().unwrap();
    s.flush().unwrap();
    assert_eq!(s.free_data_bytes(), empty, "blocks leaked");
}

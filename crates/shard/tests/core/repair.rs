//! Bad block copies repaired from a good replica through the log (`crate::repair`).

use crate::harness::{self, pg, read, write, Cluster};
use fastblock_shard::Input;
use fastblock_types::OsdId;
use fastblock_wire::{Reply, Request, Status};

/// Three replicas of PG 0, object 0 written whole (three blocks, byte 7) and flushed on
/// every OSD, so that each disk holds it in its first three data blocks. Returns the
/// cluster, the leader and a follower.
fn three_with_an_object() -> (Cluster, u32, u32) {
    let mut c = Cluster::new(&[1, 2, 3]);
    c.map(harness::map(1, &[1, 2, 3], &[(0, &[1, 2, 3], &[])]));
    let leads = |c: &Cluster, id: u32| c.core(id).replica(pg(0)).is_some_and(|r| r.is_leader());
    for _ in 0..100 {
        if (1..=3).any(|id| leads(&c, id)) {
            break;
        }
        c.tick();
    }
    let l = (1..=3).find(|id| leads(&c, *id)).expect("a leader");
    let f = (1..=3).find(|id| *id != l).expect("a follower");
    let w = c.request(l, write(pg(0), 0, 0, &[7u8; 3 * 4096], 1));
    for _ in 0..10 {
        if c.reply(w).is_some() {
            break;
        }
        c.tick();
    }
    assert_eq!(c.reply(w), Some(&Reply::Ok));
    // Every member applies it (the commit reaches the followers with the next append or
    // heartbeat), then flushes it to disk.
    for _ in 0..5 {
        c.tick();
    }
    for id in 1..=3 {
        c.step(id, Input::FlushDue);
    }
    c.settle();
    (c, l, f)
}

/// Flips a bit of data block `phys` on `id`'s disk.
fn corrupt(c: &Cluster, id: u32, phys: u64) {
    let data_offset = c.core(id).store().superblock().data_offset_bytes;
    c.disks[&OsdId(id)].corrupt(data_offset + phys * 4096 + 17);
}

/// What `id`'s replica holds of object 0 (its own copy, past the PG).
fn replica_copy(c: &mut Cluster, id: u32) -> Reply {
    let now = c.now;
    let eff = c.step(
        id,
        Input::Request {
            conn: 9,
            request_id: 9_000 + u64::from(id),
            req: Request::ReplicaRead {
                addr: harness::addr(pg(0), 0),
                offset: 0,
                length: 3 * 4096,
            },
            arrived: now,
        },
    );
    eff.replies[0].2.clone()
}

fn status(reply: Option<&Reply>) -> Option<Status> {
    match reply {
        Some(Reply::Error { status, .. }) => Some(*status),
        _ => None,
    }
}

#[test]
fn a_bad_block_on_the_leader_is_read_back_from_a_follower_and_rewritten() {
    let (mut c, l, f) = three_with_an_object();
    corrupt(&c, l, 1);
    let r = c.request(l, read(pg(0), 0, 0, 3 * 4096, 1));
    for _ in 0..3 {
        if c.reply(r).is_some() {
            break;
        }
        c.tick();
    }
    assert_eq!(
        status(c.reply(r)),
        Some(Status::Repairing),
        "retryable while the repair runs: {:?}",
        c.reply(r)
    );
    // The leader fetches the block from a follower and logs the repair.
    for _ in 0..5 {
        c.tick();
    }
    let counts = c.core(l).repair_counts();
    assert_eq!((counts.started, counts.repaired, counts.failed), (1, 1, 0));
    let r = c.request(l, read(pg(0), 0, 0, 3 * 4096, 1));
    for _ in 0..3 {
        if c.reply(r).is_some() {
            break;
        }
        c.tick();
    }
    assert_eq!(c.reply(r), Some(&Reply::Data(vec![7u8; 3 * 4096].into())));
    // The leader's own copy is good again, and equal to the others.
    for id in 1..=3 {
        assert_eq!(
            replica_copy(&mut c, id),
            Reply::Data(vec![7u8; 3 * 4096].into())
        );
        assert!(c.core(id).failure().is_none());
    }
    assert_eq!(c.core(l).store().damage_counts().versions_repaired, 1);
    assert_eq!(
        c.core(f).store().damage_counts().versions_repaired,
        0,
        "good copies are kept"
    );
}

#[test]
fn a_partial_write_over_a_bad_block_on_a_follower_is_repaired_not_a_crash() {
    let (mut c, l, f) = three_with_an_object();
    corrupt(&c, f, 2);
    let w = c.request(l, write(pg(0), 0, 2 * 4096 + 100, &[9u8; 100], 1));
    for _ in 0..10 {
        c.tick();
    }
    assert_eq!(c.reply(w), Some(&Reply::Ok));
    assert!(c.core(f).failure().is_none(), "the follower applied it");
    assert_eq!(c.core(f).repair_counts().reported, 1);
    assert_eq!(c.core(l).repair_counts().repaired, 1);
    let mut want = vec![7u8; 3 * 4096];
    want[2 * 4096 + 100..2 * 4096 + 200].fill(9);
    for id in 1..=3 {
        assert_eq!(
            replica_copy(&mut c, id),
            Reply::Data(want.clone().into()),
            "osd {id}"
        );
    }
}

#[test]
fn a_block_bad_on_every_replica_fails_its_repair_and_reads_answer_checksum() {
    let (mut c, l, _) = three_with_an_object();
    for id in 1..=3 {
        corrupt(&c, id, 0);
    }
    let r = c.request(l, read(pg(0), 0, 0, 4096, 1));
    for _ in 0..10 {
        c.tick();
    }
    assert_eq!(status(c.reply(r)), Some(Status::Repairing));
    assert_eq!(c.core(l).repair_counts().failed, 1);
    let r = c.request(l, read(pg(0), 0, 0, 4096, 1));
    for _ in 0..3 {
        if c.reply(r).is_some() {
            break;
        }
        c.tick();
    }
    assert_eq!(status(c.reply(r)), Some(Status::Checksum));
    // The other blocks still read, and nothing stopped.
    let r = c.request(l, read(pg(0), 0, 4096, 8192, 1));
    for _ in 0..3 {
        if c.reply(r).is_some() {
            break;
        }
        c.tick();
    }
    assert_eq!(c.reply(r), Some(&Reply::Data(vec![7u8; 8192].into())));
    for id in 1..=3 {
        assert!(c.core(id).failure().is_none());
    }
}

// ---- scrub ----

/// The map of `three_with_an_object` at `epoch`, asking for scrub `id` of PG 0.
fn scrub_map(epoch: u64, id: u64, deep: bool) -> std::sync::Arc<fastblock_types::map::ClusterMap> {
    let mut m = (*harness::map(epoch, &[1, 2, 3], &[(0, &[1, 2, 3], &[])])).clone();
    m.scrub_requests.insert(
        id,
        fastblock_types::map::ScrubRequest {
            id,
            pg: pg(0),
            deep,
        },
    );
    std::sync::Arc::new(m)
}

fn scrub_report(c: &Cluster, id: u32) -> Option<fastblock_types::api::PgScrubReport> {
    c.core(id)
        .stats()
        .into_iter()
        .find(|s| s.pg == Some(pg(0)))
        .and_then(|s| s.scrub)
}

/// Ticks (delivering frames) until the leader's report says scrub request `id` is done.
fn scrub_until_done(c: &mut Cluster, l: u32, id: u64) -> fastblock_types::api::PgScrubReport {
    for _ in 0..50 {
        if let Some(r) = scrub_report(c, l).filter(|r| r.request_done >= id && !r.running) {
            return r;
        }
        c.tick();
    }
    panic!("scrub {id} not done: {:?}", scrub_report(c, l));
}

#[test]
fn a_light_scrub_repairs_a_replica_that_disagrees_from_the_majority() {
    let (mut c, l, f) = three_with_an_object();
    // The follower's copy of block 1 goes bad, and a partial write over it cannot merge
    // there; its report to the leader is lost, so the copies disagree in their checksums.
    corrupt(&c, f, 1);
    let w = c.request(l, write(pg(0), 0, 4096 + 8, &[3u8; 8], 1));
    for _ in 0..10 {
        c.wire.retain(|(_, _, r)| !matches!(r, Request::Repair(_)));
        if !c.deliver_one() {
            c.tick_only();
        }
    }
    assert_eq!(c.reply(w), Some(&Reply::Ok));
    assert_eq!(c.core(l).repair_counts().started, 0, "the report was lost");
    let mut want = vec![7u8; 3 * 4096];
    want[4096 + 8..4096 + 16].fill(3);
    assert_ne!(replica_copy(&mut c, f), Reply::Data(want.clone().into()));

    c.map(scrub_map(2, 1, false));
    let report = scrub_until_done(&mut c, l, 1);
    assert_eq!(report.scrubs, 1);
    assert_eq!(report.deep_scrubs, 0);
    assert_eq!(
        report.inconsistent_blocks, 16,
        "the 64 KiB group of the bad block"
    );
    for _ in 0..10 {
        c.tick();
    }
    let report = scrub_report(&c, l).unwrap();
    assert_eq!(
        report.repaired_blocks, report.inconsistent_blocks,
        "{report:?}"
    );
    for id in 1..=3 {
        assert_eq!(
            replica_copy(&mut c, id),
            Reply::Data(want.clone().into()),
            "osd {id}"
        );
    }
    // Only the bad copy was rewritten.
    assert_eq!(c.core(f).store().damage_counts().versions_repaired, 1);
    assert_eq!(c.core(l).store().damage_counts().versions_repaired, 0);
}

#[test]
fn bit_rot_only_a_deep_scrub_sees_is_repaired() {
    let (mut c, l, f) = three_with_an_object();
    corrupt(&c, f, 2);
    c.map(scrub_map(2, 1, false));
    let light = scrub_until_done(&mut c, l, 1);
    assert_eq!(
        light.inconsistent_blocks, 0,
        "the checksums agree: {light:?}"
    );
    let mut m = (*scrub_map(3, 2, true)).clone();
    m.scrub_requests.remove(&1);
    c.map(std::sync::Arc::new(m));
    let deep = scrub_until_done(&mut c, l, 2);
    assert_eq!(
        (deep.scrubs, deep.deep_scrubs, deep.last_deep),
        (2, 1, true)
    );
    for _ in 0..10 {
        c.tick();
    }
    let deep = scrub_report(&c, l).unwrap();
    assert_eq!(
        (deep.inconsistent_blocks, deep.repaired_blocks),
        (1, 1),
        "{deep:?}"
    );
    assert_eq!(
        replica_copy(&mut c, f),
        Reply::Data(vec![7u8; 3 * 4096].into())
    );
    assert_eq!(c.core(f).store().damage_counts().versions_repaired, 1);
}

#[test]
fn a_snapshot_transfer_carries_a_bad_block_as_damaged_and_the_new_member_gets_it_repaired() {
    let mut c = Cluster::new(&[1, 2, 3]);
    c.map(harness::map(1, &[1, 2, 3], &[(0, &[1, 2], &[])]));
    let leads = |c: &Cluster, id: u32| c.core(id).replica(pg(0)).is_some_and(|r| r.is_leader());
    for _ in 0..100 {
        if leads(&c, 1) || leads(&c, 2) {
            break;
        }
        c.tick();
    }
    let l = (1..=2).find(|id| leads(&c, *id)).expect("a leader");
    for i in 0..4u64 {
        let w = c.request(l, write(pg(0), i, 0, &[i as u8 + 1; 8192], 1));
        for _ in 0..10 {
            if c.reply(w).is_some() {
                break;
            }
            c.tick();
        }
        assert_eq!(c.reply(w), Some(&Reply::Ok));
    }
    for _ in 0..5 {
        c.tick();
    }
    // On disk, then compacted, so that OSD 3 needs a snapshot.
    c.step(l, Input::FlushDue);
    c.settle();
    corrupt(&c, l, 1);
    c.map(harness::map(2, &[1, 2, 3], &[(0, &[1, 2], &[1, 2, 3])]));
    for _ in 0..60 {
        c.tick();
    }
    assert!(
        c.effects[&OsdId(3)]
            .iter()
            .any(|e| !e.snapshots_installed.is_empty()),
        "osd 3 installed a snapshot despite the bad block"
    );
    assert!(
        c.core(l).repair_counts().repaired >= 1,
        "{:?}",
        c.core(l).repair_counts()
    );
    // Object 0's second block was the bad one: the new member holds it as the others do.
    let now = c.now;
    let eff = c.step(
        3,
        Input::Request {
            conn: 9,
            request_id: 9_999,
            req: Request::ReplicaRead {
                addr: harness::addr(pg(0), 0),
                offset: 0,
                length: 8192,
            },
            arrived: now,
        },
    );
    assert_eq!(eff.replies[0].2, Reply::Data(vec![1u8; 8192].into()));
    for id in 1..=3 {
        assert!(c.core(id).failure().is_none());
    }
}

//! What a shard finds of its PGs after a power loss.

use crate::harness::{self, pg, write, Cluster};
use fastblock_shard::Input;
use fastblock_types::{OsdId, PgId};
use fastblock_wire::{Reply, Request};
use protobuf::Message as _;
use raft::eraftpb::{Message, MessageType};

/// Whether `req` is a Raft batch carrying a `MsgSnapshot` of `pg`.
fn carries_snapshot_of(req: &Request, pg: PgId) -> bool {
    let Request::RaftBatch { msgs, .. } = req else {
        return false;
    };
    msgs.iter().any(|e| {
        e.pg == pg
            && Message::parse_from_bytes(&e.msg)
                .is_ok_and(|m| m.get_msg_type() == MessageType::MsgSnapshot)
    })
}

/// Goal: an applied index the store makes durable is never ahead of the durable commit index,
/// whatever flushes in the round that applies it. A follower learns a commit index from the
/// leader's next append; in the same round another PG of the shard installs a snapshot, whose
/// objects (and every PG's applied index) the store makes durable at once. Had the round
/// applied before it staged the hard state carrying that commit index, the flush would make
/// the applied index durable while the commit index still waited for the WAL commit; a power
/// loss before that commit then left an applied index past the log's commit index, and
/// raft-rs refused to open the PG ("applied(747) is out of range [prev_applied(739),
/// min(committed(746), persisted(747))]": seed 249999389376033725, osd 4, pg 1.7 beside
/// pg 1.4's snapshot).
#[test]
fn an_apply_is_never_flushed_ahead_of_the_commit_index_that_allowed_it() {
    let (snap_pg, other_pg) = (pg(0), pg(1));
    let mut c = Cluster::new(&[1, 2]);
    c.map(harness::map(
        1,
        &[1, 2],
        &[(0, &[1], &[]), (1, &[1, 2], &[])],
    ));
    c.elect(1, snap_pg);
    c.elect(1, other_pg);
    for i in 0..6 {
        let id = c.request(1, write(snap_pg, i, 0, &[i as u8 + 1; 8192], 1));
        assert_eq!(c.reply(id), Some(&Reply::Ok));
    }
    // The leader compacts its log of `snap_pg`, so that osd 2, joining it, needs a snapshot.
    c.step(1, Input::FlushDue);
    c.map(harness::map(
        2,
        &[1, 2],
        &[(0, &[1], &[1, 2]), (1, &[1, 2], &[])],
    ));
    // The transfer runs; the `MsgSnapshot` that ends it is held back.
    let mut snapshot = Vec::new();
    for _ in 0..100 {
        snapshot =
            c.settle_holding(|_, to, req| to == OsdId(2) && carries_snapshot_of(req, snap_pg));
        if !snapshot.is_empty() {
            break;
        }
        c.tick_only();
    }
    assert!(!snapshot.is_empty(), "the leader sent osd 2 its snapshot");
    // A write of `other_pg`: osd 2 makes its entry durable and acknowledges it, the leader
    // commits and answers; osd 2 does not know yet that it is committed.
    let w = c.request(1, write(other_pg, 0, 0, &[9u8; 4096], 2));
    c.settle();
    assert_eq!(c.reply(w), Some(&Reply::Ok));
    let follower = |c: &Cluster| c.core(2).replica(other_pg).expect("hosted").commit_index();
    let committed = c.core(1).replica(other_pg).expect("hosted").commit_index();
    assert!(
        follower(&c) < committed,
        "osd 2 learns the commit index from the next append"
    );
    // The next write's append carries it; it reaches osd 2 with the snapshot, in one step.
    c.request(1, write(other_pg, 1, 0, &[9u8; 4096], 2));
    let append = c.settle_holding(|_, to, _| to == OsdId(2));
    assert!(!append.is_empty(), "the leader sent osd 2 its next append");
    c.auto_commit = false;
    let inputs = snapshot
        .into_iter()
        .chain(append)
        .map(|(from, _, req)| c.peer_input(from, req))
        .collect();
    let eff = c.step_batch(2, inputs);
    assert!(
        eff.applied
            .iter()
            .any(|a| a.pg == other_pg && a.index == committed.0),
        "osd 2 applied the entry that step told it committed"
    );
    // The snapshot's install flushed the store: its PG's applied index is durable.
    assert!(c.core(2).store().flushed_applied_index(snap_pg) > 0);
    // Power fails before the WAL commit of that round is durable.
    assert!(eff.wal_commit_due);
    c.step_raw(2, Input::WalCommit);
    c.crash_and_restart(2);
    {
        let store = c.core(2).store();
        let commit = store
            .pg_log(other_pg)
            .expect("osd 2 holds a log of the PG")
            .hard_state
            .commit;
        let applied = store.applied_index(other_pg);
        assert!(
            applied <= commit,
            "applied index {applied} past the durable commit index {commit}"
        );
    }
    // osd 2 reopened both PGs and catches up.
    c.auto_commit = true;
    for _ in 0..20 {
        c.tick();
    }
    for p in [snap_pg, other_pg] {
        let leader = c.core(1).replica(p).expect("hosted").applied();
        assert_eq!(
            c.core(2).replica(p).expect("hosted").applied(),
            leader,
            "{p}: osd 2 applied what the leader did"
        );
    }
}

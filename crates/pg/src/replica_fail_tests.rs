//! A replica that fails on an undecodable committed entry answers every op it holds: the
//! driver tracks each op until its answer, so one left unanswered would stay in the OSD's op
//! tracker (and its byte budgets) for good, and its client would wait out its timeout.

use super::*;
use crate::op::ObjectRef;
use bytes::Bytes;
use fastblock_types::{ImageId, PoolId};
use raft::eraftpb::ConfState;
use raft::storage::MemStorage;
use std::collections::BTreeMap;

const PG: PgId = PgId {
    pool: PoolId(1),
    seq: 0,
};

fn write_op(index: u64) -> ClientOp {
    ClientOp::Write {
        object: ObjectRef {
            image: ImageId(1),
            index,
        },
        offset: 0,
        data: Bytes::from(vec![7u8; 512]),
    }
}

/// Performs outputs as the OSD does (persist, then apply) until quiet; returns the answers.
fn drive(
    r: &mut PgReplica<MemStorage>,
    storage: &MemStorage,
    mut out: Output,
) -> BTreeMap<u64, OpOutcome> {
    let mut replies = BTreeMap::new();
    for _ in 0..100 {
        for (op, outcome) in out.replies.drain(..) {
            assert!(
                replies.insert(op.0, outcome).is_none(),
                "op {} answered twice",
                op.0
            );
        }
        let writes: Vec<LogWrite> = out.log_writes.drain(..).collect();
        let applied = out.apply.drain(..).map(|a| a.index()).last();
        if writes.is_empty() && applied.is_none() {
            return replies;
        }
        let mut next = Output::default();
        if let Some(last) = writes.last().map(|w| w.ready_number) {
            for w in &writes {
                storage.wl().append(&w.entries).unwrap();
                if let Some(hs) = &w.hard_state {
                    storage.wl().set_hardstate(hs.clone());
                }
            }
            r.on_persisted(last, &mut next);
        }
        if let Some(index) = applied {
            r.on_applied(index, &mut next);
        }
        out = next;
    }
    panic!("the replica never went quiet");
}

#[test]
fn failing_on_a_committed_entry_answers_every_op_it_holds() {
    let storage = MemStorage::new_with_conf_state(ConfState::from((vec![1], vec![])));
    let mut r =
        PgReplica::new(PG, OsdId(1), storage.clone(), 0, PgConfig::default(), 1).expect("replica");
    let mut out = Output::default();
    // Nothing persisted yet: the leader's first entry of its term is not committed, so all
    // below is pending when the undecodable entry commits, in one ready, with the others.
    r.campaign(&mut out);
    assert!(r.is_leader(), "a single voter leads at once");
    r.propose(OpId(10), &write_op(0), &mut out);
    // An entry `ClientOp::encode` never writes, tracked like a proposal: the failing entry's
    // own op, whose outcome `handle_committed` moves to `completed` before decoding it.
    let mut msg = Message::default();
    msg.set_msg_type(MessageType::MsgPropose);
    msg.from = 1;
    msg.mut_entries().push(Entry {
        context: Bytes::from_static(b"not an op header"),
        ..Entry::default()
    });
    r.node.raft.step(msg).expect("leader takes the proposal");
    let bad_index = r.node.raft.raft_log.last_index();
    r.proposals
        .push_back((bad_index, r.node.raft.term, OpId(11)));
    // A read deferred until the term's first entry commits, and a later proposal.
    r.read(OpId(12), 0, &mut out);
    r.propose(OpId(13), &write_op(1), &mut out);
    assert_eq!(
        r.pending_ops(),
        4,
        "four ops pending before anything persists"
    );

    let replies = drive(&mut r, &storage, out);
    assert!(
        r.failed.is_some(),
        "the replica failed on entry {bad_index}"
    );
    assert_eq!(
        replies.get(&10),
        Some(&OpOutcome::Applied),
        "an entry before the failing one is applied and answered as such"
    );
    for op in [11, 12, 13] {
        assert!(
            matches!(
                replies.get(&op),
                Some(OpOutcome::Failed(PgError::Failed(_)))
            ),
            "op {op} answered failed, got {:?}",
            replies.get(&op)
        );
    }
    assert_eq!(r.pending_ops(), 0, "nothing left waiting in the replica");
    assert!(r.completed.is_empty(), "no outcome left unreleased");
}

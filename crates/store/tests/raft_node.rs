//! raft-rs drives a PG through `PgStorage`: a single-voter group elects itself, commits and
//! applies proposals (entries and hard state persisted with one commit per Ready, writes
//! applied to objects), then restarts from the reopened store and keeps its log, its hard
//! state and its applied index (raft paper §5.2/§5.3: persisted state survives restarts).
#![allow(clippy::field_reassign_with_default)]

mod common;
use common::*;
use fastblock_store::{PgStorage, SimDisk, Store};
use raft::eraftpb::ConfState;
use raft::{Config, RawNode, Storage};
use std::cell::RefCell;
use std::rc::Rc;

type Shared = Rc<RefCell<Store<SimDisk>>>;

fn node(store: &Shared, applied: u64) -> RawNode<PgStorage<SimDisk>> {
    let cfg = Config {
        id: 1,
        applied,
        ..Config::default()
    };
    let logger = raft::default_logger();
    RawNode::new(&cfg, PgStorage::new(store.clone(), pg(0)), &logger).expect("raw node")
}

/// One Ready round, as an OSD shard would do it: persist, commit once, apply, advance.
fn handle_ready(n: &mut RawNode<PgStorage<SimDisk>>, store: &Shared) -> usize {
    if !n.has_ready() {
        return 0;
    }
    let mut rd = n.ready();
    let mut applied = 0;
    {
        let mut s = store.borrow_mut();
        s.append_entries(pg(0), rd.entries()).unwrap();
        if let Some(hs) = rd.hs() {
            s.set_hard_state(pg(0), hs).unwrap();
        }
        s.commit().unwrap();
        for e in rd.take_committed_entries() {
            if !e.data.is_empty() {
                s.write_object(
                    pg(0),
                    obj(0),
                    (e.index % 16) * 4096,
                    &pattern(e.index, 4096),
                )
                .unwrap();
                applied += 1;
            }
            s.set_applied(pg(0), e.index).unwrap();
        }
    }
    let mut light = n.advance(rd);
    {
        let mut s = store.borrow_mut();
        if let Some(c) = light.commit_index() {
            let mut hs = s.pg_log(pg(0)).unwrap().hard_state.clone();
            hs.commit = c;
            s.set_hard_state(pg(0), &hs).unwrap();
            s.commit().unwrap();
        }
        for e in light.take_committed_entries() {
            if !e.data.is_empty() {
                s.write_object(
                    pg(0),
                    obj(0),
                    (e.index % 16) * 4096,
                    &pattern(e.index, 4096),
                )
                .unwrap();
                applied += 1;
            }
            s.set_applied(pg(0), e.index).unwrap();
        }
    }
    n.advance_apply();
    applied
}

#[test]
fn raft_elects_commits_applies_and_restarts_from_the_store() {
    let (disk, meta, s) = new_sim(DEVICE_BYTES);
    let store: Shared = Rc::new(RefCell::new(s));
    let mut cs = ConfState::default();
    cs.voters = vec![1];
    store.borrow_mut().set_conf_state(pg(0), &cs).unwrap();
    store.borrow_mut().commit().unwrap();

    let mut n = node(&store, 0);
    n.campaign().unwrap();
    let mut applied = 0;
    for _ in 0..10 {
        applied += handle_ready(&mut n, &store);
    }
    assert!(n.raft.state == raft::StateRole::Leader);
    for i in 0..40u8 {
        n.propose(vec![], vec![i; 100]).unwrap();
        applied += handle_ready(&mut n, &store);
        if i == 20 {
            // Flush, then compact what is applied: raft must then be served from the
            // compacted log without the dropped entries.
            let mut s = store.borrow_mut();
            s.flush().unwrap();
            let to = s.flushed_applied_index(pg(0));
            s.compact(pg(0), to - 1).unwrap();
            s.commit().unwrap();
        }
    }
    for _ in 0..5 {
        applied += handle_ready(&mut n, &store);
    }
    assert_eq!(applied, 40);
    let (first, last) = store.borrow().log_bounds(pg(0));
    assert!(first > 1, "compaction took effect");
    let commit = n.raft.raft_log.committed;
    assert_eq!(commit, last);
    store.borrow_mut().flush().unwrap();
    let flushed = store.borrow().flushed_applied_index(pg(0));
    assert_eq!(flushed, last);
    drop(n);
    drop(store);

    // Restart: the reopened store gives raft its state back.
    crash(&disk, &meta, 99);
    let s = reopen(&disk, &meta).unwrap();
    assert_eq!(s.log_bounds(pg(0)), (first, last));
    let store: Shared = Rc::new(RefCell::new(s));
    let storage = PgStorage::new(store.clone(), pg(0));
    let st = storage.initial_state().unwrap();
    assert_eq!(st.hard_state.commit, commit);
    assert_eq!(st.conf_state.voters, vec![1]);
    assert_eq!(storage.term(last).unwrap(), n_term(&storage, last));
    assert!(matches!(
        storage.entries(
            first - 1,
            last + 1,
            None,
            raft::GetEntriesContext::empty(false)
        ),
        Err(raft::Error::Store(raft::StorageError::Compacted))
    ));
    let es = storage
        .entries(first, last + 1, None, raft::GetEntriesContext::empty(false))
        .unwrap();
    assert_eq!(es.len() as u64, last - first + 1);
    let mut n = node(&store, flushed);
    n.campaign().unwrap();
    for _ in 0..10 {
        handle_ready(&mut n, &store);
    }
    n.propose(vec![], vec![7; 10]).unwrap();
    handle_ready(&mut n, &store);
    handle_ready(&mut n, &store);
    assert!(
        n.raft.raft_log.committed > commit,
        "the restarted node commits new entries"
    );
    let mut buf = vec![0u8; 4096];
    // The last entry before the restart was a proposal; its write was flushed.
    store
        .borrow_mut()
        .read_object(pg(0), obj(0), (last % 16) * 4096, &mut buf)
        .unwrap();
    assert_eq!(buf, pattern(last, 4096));
}

fn n_term(storage: &PgStorage<SimDisk>, i: u64) -> u64 {
    let e = storage
        .entries(i, i + 1, None, raft::GetEntriesContext::empty(false))
        .unwrap();
    e[0].term
}

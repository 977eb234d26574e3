//! Unit tests of the shard core itself: no sockets, no threads, no clock; cores on the
//! store's in-memory disk, stepped by `harness::Cluster`.

mod harness;
mod repair;
mod restart;
mod space;

use fastblock_shard::flush::FLUSH_WAL_IDLE_WAIT_MAX_US;
use fastblock_shard::{Effects, Input, Micros, Report, Stage};
use fastblock_types::OsdId;
use fastblock_wire::{Reply, Request, SnapVerdict, Status};
use harness::{pg, read, single_with, write, Cluster};

fn status(reply: Option<&Reply>) -> Option<Status> {
    match reply {
        Some(Reply::Error { status, .. }) => Some(*status),
        Some(_) => Some(Status::Ok),
        None => None,
    }
}

/// One OSD leading PG 0 alone.
fn single() -> Cluster {
    single_with(|_| {})
}

/// One OSD leading PG 0 alone, with two WAL commits allowed in flight, so that inputs keep coming while one is.
fn two_in_flight() -> Cluster {
    single_with(|cfg| cfg.wal_commits_in_flight_max = 2)
}

// ---- admission ----

#[test]
fn a_write_is_answered_and_read_back() {
    let mut c = single();
    let w = c.request(1, write(pg(0), 3, 4096, &[7u8; 4096], 1));
    assert_eq!(c.reply(w), Some(&Reply::Ok));
    let r = c.request(1, read(pg(0), 3, 4096, 4096, 1));
    c.settle();
    for _ in 0..3 {
        if c.reply(r).is_some() {
            break;
        }
        c.tick();
    }
    assert_eq!(c.reply(r), Some(&Reply::Data(vec![7u8; 4096].into())));
}

#[test]
fn reads_ready_in_one_step_are_read_in_one_batch_and_each_gets_its_own_data() {
    let mut c = single();
    for object in 0..8u64 {
        let w = c.request(1, write(pg(0), object, 0, &[object as u8 + 1; 4096], 1));
        assert_eq!(c.reply(w), Some(&Reply::Ok));
    }
    // Eight written objects and one never written (a hole reads as zeros), all in one step.
    let mut reqs: Vec<Request> = (0..8u64).map(|o| read(pg(0), o, 0, 4096, 1)).collect();
    reqs.push(read(pg(0), 100, 0, 4096, 1));
    let ids = c.request_batch(1, reqs);
    c.settle();
    for _ in 0..5 {
        if ids.iter().all(|&r| c.reply(r).is_some()) {
            break;
        }
        c.tick();
    }
    for (object, &r) in ids.iter().enumerate() {
        let want = if object < 8 { object as u8 + 1 } else { 0 };
        assert_eq!(
            c.reply(r),
            Some(&Reply::Data(vec![want; 4096].into())),
            "read {object}"
        );
    }
    assert!(
        c.probe(1, |p| p.reads_batched) >= 1,
        "the step's reads went to the store one at a time"
    );
    assert_eq!(c.probe(1, |p| p.read_batches_retried), 0);
}

/// Goal: a mutation sent to one leadership of a PG is never applied by another, even a later
/// leadership of the same OSD (bytes that waited in its socket buffer while it lost and
/// regained leadership: `docs/data-path.md` section 4). Method: one OSD leads in term t1 and
/// applies a write naming t1; it restarts and leads again in a later term; a write naming t1,
/// and one naming no term, are refused with `NotLeader` naming the OSD and its new term, and
/// leave the object as it was; the same write naming the new term is applied.
#[test]
fn a_leader_refuses_a_mutation_naming_another_term_and_applies_one_naming_its_own() {
    let mut c = single();
    let t1 = c.core(1).replica(pg(0)).unwrap().term().0;
    assert!(t1 > 0);
    let w = c.request(1, write(pg(0), 3, 0, &[1u8; 4096], 1).with_term(t1));
    assert_eq!(c.reply(w), Some(&Reply::Ok));
    c.crash_and_restart(1);
    c.elect(1, pg(0));
    let t2 = c.core(1).replica(pg(0)).unwrap().term().0;
    assert!(t2 > t1, "a new leadership, a new term ({t1} then {t2})");
    let fenced = |c: &Cluster, request_id: u64| match c.reply(request_id) {
        Some(Reply::Error {
            status: Status::NotLeader,
            leader: Some(hint),
            ..
        }) => hint.osd == OsdId(1) && hint.term == t2,
        _ => false,
    };
    let late = c.request(1, write(pg(0), 3, 0, &[2u8; 4096], 1).with_term(t1));
    c.settle();
    assert!(fenced(&c, late), "{:?}", c.reply(late));
    let unknown = c.request_as_is(1, write(pg(0), 3, 0, &[3u8; 4096], 1));
    c.settle();
    assert!(fenced(&c, unknown), "{:?}", c.reply(unknown));
    let newer = c.request(1, write(pg(0), 3, 0, &[4u8; 4096], 1).with_term(t2 + 1));
    c.settle();
    assert!(fenced(&c, newer), "{:?}", c.reply(newer));
    assert_eq!(c.probe(1, |p| p.stale_term), 3);
    let read_back = |c: &mut Cluster| {
        let r = c.request(1, read(pg(0), 3, 0, 4096, 1));
        for _ in 0..5 {
            c.settle();
            if c.reply(r).is_some() {
                break;
            }
            c.tick();
        }
        c.reply(r).cloned()
    };
    assert_eq!(read_back(&mut c), Some(Reply::Data(vec![1u8; 4096].into())));
    // The hint's term is what the client names next: applied.
    let retry = c.request(1, write(pg(0), 3, 0, &[2u8; 4096], 1).with_term(t2));
    c.settle();
    assert_eq!(c.reply(retry), Some(&Reply::Ok));
    assert_eq!(read_back(&mut c), Some(Reply::Data(vec![2u8; 4096].into())));
    // GetLeader names the term too.
    let g = c.request(
        1,
        Request::GetLeader {
            pg: pg(0),
            epoch: fastblock_types::Epoch(1),
        },
    );
    match c.reply(g) {
        Some(Reply::Leader(hint)) => assert_eq!((hint.osd, hint.term), (OsdId(1), t2)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn malformed_and_misrouted_requests_are_refused_with_their_status() {
    let mut c = single();
    // Beyond the request size limit.
    let big = c.request(1, read(pg(0), 0, 0, 9 << 20, 1));
    assert_eq!(status(c.reply(big)), Some(Status::InvalidArgument));
    // A PG the map does not have.
    let unknown = c.request(1, write(pg(9), 0, 0, &[1u8; 512], 1));
    assert_eq!(status(c.reply(unknown)), Some(Status::NoSuchPg));
    // A write larger than a WAL batch (64 KiB here) can never be logged.
    let huge = c.request(1, write(pg(0), 0, 0, &vec![1u8; 128 << 10], 1));
    assert_eq!(status(c.reply(huge)), Some(Status::InvalidArgument));
    // An undecodable payload: unknown kinds and bad fields are told apart by type.
    let eff = c.step(
        1,
        Input::BadRequest {
            conn: harness::CLIENT,
            request_id: 99,
            error: fastblock_wire::WireError::UnknownKind(200),
        },
    );
    assert!(matches!(
        eff.replies.as_slice(),
        [(
            _,
            99,
            Reply::Error {
                status: Status::UnknownOp,
                ..
            }
        )]
    ));
}

/// Moves PG 0 from OSD 1 to OSD 2 the way the monitor does: a target membership (epoch
/// `epoch`), the leader's joint-consensus change, then the map recording the new members.
fn remap_pg0_from_1_to_2(c: &mut Cluster, epoch: u64) {
    c.map(harness::map(epoch, &[1, 2], &[(0, &[1], &[2])]));
    for _ in 0..300 {
        let finished = c.reports.iter().any(|(_, r)| {
            matches!(r, Report::MembershipFinished { pg: p, req } if *p == pg(0) && req.voters == vec![OsdId(2)])
        });
        if finished {
            break;
        }
        c.tick();
    }
    c.map(harness::map(epoch + 1, &[1, 2], &[(0, &[2], &[])]));
    for _ in 0..100 {
        if c.core(1).replica(pg(0)).is_none() {
            break;
        }
        c.tick();
    }
}

#[test]
fn a_client_with_an_old_map_never_gets_an_answer_from_a_replica_that_left() {
    // Epoch 1: PG 0 on OSD 1. Epochs 2-3: it moves to OSD 2, and OSD 1 removes its replica.
    let mut c = Cluster::new(&[1, 2]);
    c.map(harness::map(1, &[1, 2], &[(0, &[1], &[])]));
    c.elect(1, pg(0));
    let w = c.request(1, write(pg(0), 0, 0, &[5u8; 512], 1));
    assert_eq!(c.reply(w), Some(&Reply::Ok));
    remap_pg0_from_1_to_2(&mut c, 2);
    assert!(c.core(1).replica(pg(0)).is_none(), "osd 1 removed pg 0");
    assert!(c.core(2).replica(pg(0)).is_some_and(|r| r.is_leader()));
    // A client still at epoch 1 reads and writes at OSD 1: StaleEpoch, never data.
    let r = c.request(1, read(pg(0), 0, 0, 512, 1));
    assert_eq!(status(c.reply(r)), Some(Status::StaleEpoch));
    let w = c.request(1, write(pg(0), 0, 0, &[6u8; 512], 1));
    assert_eq!(status(c.reply(w)), Some(Status::StaleEpoch));
    // A client ahead of OSD 1's map hears StaleEpoch too (OSD 1 is behind: retry).
    let ahead = c.request(1, read(pg(0), 0, 0, 512, 9));
    assert_eq!(status(c.reply(ahead)), Some(Status::StaleEpoch));
    // At the same epoch, a PG the map places elsewhere is simply not ready here.
    let same = c.request(1, read(pg(0), 0, 0, 512, 3));
    assert_eq!(status(c.reply(same)), Some(Status::NotReady));
    assert!(c.probe(1, |p| p.stale_epoch) >= 3);
    // The client that refreshed its map reads the data at OSD 2.
    let r = c.request(2, read(pg(0), 0, 0, 512, 3));
    for _ in 0..3 {
        if c.reply(r).is_some() {
            break;
        }
        c.tick();
    }
    assert_eq!(c.reply(r), Some(&Reply::Data(vec![5u8; 512].into())));
}

/// PG 0 on OSDs 1 and 2 (it needs both to commit), PG 1 on OSD 1 alone, both led by OSD 1;
/// then OSD 2 goes silent, so PG 0 can no longer commit.
fn stuck_pg0_beside_pg1() -> Cluster {
    let mut c = Cluster::new(&[1, 2]);
    c.map(harness::map(
        1,
        &[1, 2],
        &[(0, &[1, 2], &[]), (1, &[1], &[])],
    ));
    c.elect(1, pg(0));
    c.elect(1, pg(1));
    c.cut.insert(OsdId(2));
    c
}

#[test]
fn a_pg_that_cannot_commit_refuses_writes_alone() {
    let mut c = stuck_pg0_beside_pg1();
    let chunk = vec![3u8; 32 << 10];
    let mut busy = None;
    for i in 0..64 {
        let id = c.request(1, write(pg(0), i, 0, &chunk, 1));
        if let Some(Status::Busy) = status(c.reply(id)) {
            busy = Some(i);
            break;
        }
        assert!(c.reply(id).is_none(), "no answer without a majority");
    }
    let busy = busy.expect("pg 0 refuses writes once its share of the WAL is taken");
    // The PG budget (one 256 KiB segment here) is what stopped it.
    assert_eq!(busy, 8, "8 writes of 32 KiB fill a 256 KiB per-PG budget");
    assert!(c.probe(1, |p| p.pg_log_full) >= 1);
    // PG 1 on the same shard keeps serving.
    let other = c.request(1, write(pg(1), 0, 0, &chunk, 1));
    assert_eq!(c.reply(other), Some(&Reply::Ok));
}

#[test]
fn a_connection_closing_frees_its_inflight_count() {
    let mut c = Cluster::with(&[1, 2], |id| {
        let mut cfg = harness::config(id);
        // Above the connection's limit, so that the connection's limit is what refuses.
        cfg.pg.pending_ops_max = 2 * fastblock_shard::CONN_INFLIGHT_OPS_MAX;
        cfg
    });
    c.map(harness::map(1, &[1, 2], &[(0, &[1, 2], &[])]));
    c.elect(1, pg(0));
    // Without OSD 2 no read index is confirmed: reads stay in flight.
    c.cut.insert(OsdId(2));
    // Past the lease, so that reads wait for a quorum that never answers.
    for _ in 0..3 {
        c.tick();
    }
    let max = fastblock_shard::CONN_INFLIGHT_OPS_MAX as u64;
    for i in 0..max {
        let id = c.request(1, read(pg(0), i, 0, 512, 1));
        assert!(c.reply(id).is_none(), "read {i} answered without a quorum");
    }
    let over = c.request(1, read(pg(0), 0, 0, 512, 1));
    assert_eq!(status(c.reply(over)), Some(Status::Busy));
    // The client goes away: a new connection with the same id starts from zero.
    c.step(
        1,
        Input::Closed {
            conn: harness::CLIENT,
        },
    );
    let again = c.request(1, read(pg(0), 0, 0, 512, 1));
    assert!(c.reply(again).is_none(), "admitted again after the close");
}

#[test]
fn a_pg_that_cannot_commit_does_not_fill_the_wal_for_the_others() {
    // PG 0 needs OSDs 1 and 2; OSD 2 goes silent with PG 0's writes logged, uncommitted, in
    // the oldest WAL segment. PG 1 on OSD 1 alone then writes four times the WAL's size.
    let mut c = stuck_pg0_beside_pg1();
    for i in 0..4 {
        c.request(1, write(pg(0), i, 0, &[1u8; 32 << 10], 1));
    }
    let (first, last) = c.core(1).store().log_bounds(pg(0));
    let chunk = vec![2u8; 32 << 10];
    // 8 MiB through a 2 MiB WAL.
    for i in 0..256u64 {
        let id = c.request(1, write(pg(1), i % 16, 0, &chunk, 1));
        assert_eq!(c.reply(id), Some(&Reply::Ok), "write {i} to pg 1");
        if i % 32 == 0 {
            c.tick();
        }
    }
    assert!(
        !c.reports.iter().any(|(_, r)| matches!(r, Report::Fatal(_))),
        "the shard never stopped"
    );
    assert!(
        c.probe(1, |p| p.log_rewrites) > 0,
        "pg 0's entries were moved"
    );
    // PG 0 kept its uncommitted writes (only what it had applied was compacted): nothing
    // was lost, only moved.
    let applied = c.core(1).replica(pg(0)).expect("hosted").applied().0;
    let (first_after, last_after) = c.core(1).store().log_bounds(pg(0));
    assert_eq!(last_after, last);
    assert!(
        first >= 1 && first_after <= applied + 1 && last - applied >= 4,
        "{first_after}..{last_after}, applied {applied}"
    );
}

// ---- the WAL commit cycle, apply ordering ----

#[test]
fn a_write_is_answered_only_after_its_commit_is_durable() {
    let mut c = single();
    c.auto_commit = false;
    let id = c.request(1, write(pg(0), 1, 0, &[9u8; 512], 1));
    assert!(c.reply(id).is_none());
    assert!(c.core(1).commit_pending());
    assert!(
        !c.core(1).inputs_wait_for_commit(),
        "a commit due is the runtime's to step, not to wait for"
    );
    // The runtime must step WalCommit next; meanwhile inputs wait in the core.
    let queued = c.request(1, write(pg(0), 2, 0, &[8u8; 512], 1));
    let eff = c.step(1, Input::WalCommit);
    assert!(eff.wal_commit_submitted.is_some());
    let timed = |eff: &Effects| eff.stages.iter().any(|(s, _)| *s == Stage::WalCommit);
    assert!(
        !timed(&eff),
        "the commit stage ends when it is durable, not submitted"
    );
    assert!(c.reply(id).is_none(), "written but not durable: no answer");
    assert_eq!(c.core(1).commits_in_flight(), 1);
    // One commit in flight is all this core allows: the runtime may block on the disk.
    assert!(c.core(1).inputs_wait_for_commit());
    // A wake-up before the disk finished the commit completes nothing.
    c.step_raw(1, Input::WalDurable);
    assert!(
        c.reply(id).is_none(),
        "the disk has not finished the commit"
    );
    assert_eq!(c.core(1).commits_in_flight(), 1);
    let eff = c.step(1, Input::WalDurable);
    assert!(timed(&eff), "the durable commit is timed");
    // Durable and committed (one member): applied and answered; the queued write went on.
    assert_eq!(c.reply(id), Some(&Reply::Ok));
    assert!(c.reply(queued).is_none() || c.reply(queued) == Some(&Reply::Ok));
    c.finish_commits(1);
    assert_eq!(c.reply(queued), Some(&Reply::Ok));
    assert_eq!(c.core(1).commits_in_flight(), 0);
    assert!(
        !c.core(1).inputs_wait_for_commit(),
        "nothing in flight: inputs are taken at once"
    );
}

/// Goal: a shard whose disk fails stops (fail-stop) without handing its clients an I/O
/// error the cluster can still serve: the write it was committing and every later request
/// are answered with the retryable `NotReady`, so the client finds the PG's other replicas.
#[test]
fn a_shard_whose_disk_fails_sends_its_clients_to_the_other_replicas() {
    let mut c = single();
    c.auto_commit = false;
    let pending = c.request(1, write(pg(0), 1, 0, &[9u8; 512], 1));
    assert!(c.reply(pending).is_none());
    c.disks[&OsdId(1)].fail_writes();
    c.step(1, Input::WalCommit);
    assert!(
        c.reports.iter().any(|(_, r)| matches!(r, Report::Fatal(_))),
        "the failed commit stops the shard"
    );
    assert_eq!(status(c.reply(pending)), Some(Status::NotReady));
    let later = c.request(1, read(pg(0), 1, 0, 512, 1));
    assert_eq!(status(c.reply(later)), Some(Status::NotReady));
    assert!(Status::NotReady.is_retryable());
}

#[test]
fn two_commits_in_flight_complete_in_order_and_only_when_durable() {
    let mut c = two_in_flight();
    c.auto_commit = false;
    let first = c.request(1, write(pg(0), 1, 0, &[1u8; 512], 1));
    assert!(c.step(1, Input::WalCommit).wal_commit_submitted.is_some());
    assert!(
        !c.core(1).inputs_wait_for_commit(),
        "one of two in flight: the core still takes inputs"
    );
    // The core keeps serving while the first commit is in flight: a second one goes out.
    let second = c.request(1, write(pg(0), 2, 0, &[2u8; 512], 1));
    assert!(c.core(1).commit_pending());
    let eff = c.step(1, Input::WalCommit);
    assert!(eff.wal_commit_submitted.is_some());
    assert_eq!(c.core(1).commits_in_flight(), 2);
    assert!(c.core(1).inputs_wait_for_commit());
    assert!(eff.probes.commits_overlapped > 0);
    assert!(c.reply(first).is_none() && c.reply(second).is_none());
    // A third waits in the core: two are in flight.
    let third = c.request(1, write(pg(0), 3, 0, &[3u8; 512], 1));
    assert_eq!(c.core(1).commits_in_flight(), 2);
    c.step(1, Input::WalDurable);
    let answered: Vec<u64> = c.replies.iter().map(|(_, id, _)| *id).collect();
    let at = |id: u64| answered.iter().position(|x| *x == id);
    assert!(
        at(first).is_some() && at(first) < at(second),
        "answered in log order: {answered:?}"
    );
    c.finish_commits(1);
    assert_eq!(c.reply(third), Some(&Reply::Ok));
}

#[test]
fn a_durability_notice_without_a_commit_changes_nothing() {
    let mut c = single();
    let eff = c.step_raw(1, Input::WalDurable);
    assert!(eff.replies.is_empty() && eff.peers.is_empty() && !eff.wal_commit_due);
    assert!(!c.core(1).commit_pending());
}

#[test]
fn entries_apply_in_log_order_and_commit_only_hard_states_skip_the_sync() {
    let mut c = single();
    let mut ids = Vec::new();
    for v in 1..=5u8 {
        ids.push(c.request(1, write(pg(0), 0, 0, &[v; 512], 1)));
    }
    for id in &ids {
        assert_eq!(c.reply(*id), Some(&Reply::Ok));
    }
    let applied: Vec<u64> = c.effects[&OsdId(1)]
        .iter()
        .flat_map(|e| e.applied.iter().filter(|a| a.pg == pg(0)).map(|a| a.index))
        .collect();
    assert!(
        applied.windows(2).all(|w| w[1] == w[0] + 1),
        "gapless, in order: {applied:?}"
    );
    let r = c.request(1, read(pg(0), 0, 0, 512, 1));
    for _ in 0..3 {
        if c.reply(r).is_some() {
            break;
        }
        c.tick();
    }
    assert_eq!(c.reply(r), Some(&Reply::Data(vec![5u8; 512].into())));
    // After a write commits, the hard state that moves only the commit index is not synced.
    assert!(c.probe(1, |p| p.must_sync_skipped) > 0);
}

#[test]
#[should_panic(expected = "time went backwards")]
fn time_never_goes_back() {
    let mut c = single();
    c.now = Micros(c.now.0 - 1);
    c.step(1, Input::Tick);
}

/// A tick that waited in the core for a commit keeps its place among the inputs: a leader's
/// heartbeat that arrived after it is handled after it. Handled the other way round, the tick
/// (due before the heartbeat) would count as the follower's first tick after it and shorten
/// the time it refuses votes, which a leader lease relies on (`fastblock_types::lease`).
#[test]
fn a_deferred_tick_is_handled_before_the_inputs_that_came_after_it() {
    let mut c = Cluster::new(&[1, 2]);
    c.map(harness::map(1, &[1, 2], &[(0, &[1, 2], &[])]));
    c.elect(1, pg(0));
    c.auto_commit = false;
    // OSD 2 appends a write and starts its commit, which stays in flight: it takes no input.
    c.request(1, write(pg(0), 0, 0, &[1u8; 512], 1));
    c.finish_commits(1);
    c.settle();
    c.step(2, Input::WalCommit);
    assert!(c.core(2).inputs_wait_for_commit());
    // A tick, then the leader's heartbeat: both wait.
    c.step_raw(2, Input::Tick);
    for _ in 0..harness::config(OsdId(1)).pg.heartbeat_ticks {
        c.step(1, Input::Tick);
    }
    assert!(
        c.wire
            .iter()
            .any(|(from, to, _)| *from == OsdId(1) && *to == OsdId(2)),
        "the leader sent osd 2 a heartbeat"
    );
    c.settle();
    let follower = |c: &Cluster| {
        c.core(2)
            .replica(pg(0))
            .expect("hosted")
            .raw_node()
            .raft
            .election_elapsed
    };
    c.step(2, Input::WalDurable);
    c.finish_commits(2);
    assert!(!c.core(2).replica(pg(0)).expect("hosted").is_leader());
    assert_eq!(
        follower(&c),
        0,
        "the heartbeat, handled last, restarted the follower's count"
    );
}

// ---- flush and compaction ----

#[test]
fn a_flush_lets_the_log_be_compacted_behind_it() {
    let mut c = single();
    for i in 0..40 {
        let id = c.request(1, write(pg(0), i % 4, 0, &[i as u8; 4096], 1));
        assert_eq!(c.reply(id), Some(&Reply::Ok));
    }
    let (first_before, last) = c.core(1).store().log_bounds(pg(0));
    // No flush runner: the store commits inline and the core compacts at once (once the
    // last apply's hard state is committed: the flush waits for an idle WAL).
    c.step(1, Input::FlushDue);
    let (first_after, _) = c.core(1).store().log_bounds(pg(0));
    let flushed = c.core(1).store().flushed_applied_index(pg(0));
    assert!(flushed >= last - 1, "flushed {flushed}, last {last}");
    // Compacted to `log_retain_entries` (4) behind the flushed applied index.
    assert!(first_after > first_before);
    assert_eq!(first_after, flushed - 4 + 1);
    // Nothing applied since: the next timer does nothing.
    assert!(!c.step(1, Input::FlushDue).flush_started);
}

#[test]
fn routine_flushes_drop_the_retained_tail_once_half_the_wal_is_used() {
    // A tail of 1,024 entries of 32 KiB is 16 times the 2 MiB WAL: kept whole, it would pin
    // the ring until the pressed-WAL relief (a flush inline on the shard's thread).
    let mut c = single_with(|cfg| cfg.log_retain_entries = 1024);
    let segments = u64::from(c.core(1).store().superblock().segment_count);
    let free = |c: &Cluster| c.core(1).store().wal().free_segment_count();
    let chunk = vec![3u8; 32 << 10];
    let (first_before, _) = c.core(1).store().log_bounds(pg(0));
    // A quarter of the WAL: while more than half of it is free, flushes keep the tail.
    for i in 0..16u64 {
        let id = c.request(1, write(pg(0), i, 0, &chunk, 1));
        assert_eq!(c.reply(id), Some(&Reply::Ok));
        c.step(1, Input::FlushDue);
    }
    assert!(free(&c) > segments / 2, "{} segments free", free(&c));
    assert!(c.core(1).store().flushed_applied_index(pg(0)) > 16);
    assert_eq!(
        c.core(1).store().log_bounds(pg(0)).0,
        first_before,
        "the tail was kept"
    );
    // 8 MiB more through the 2 MiB WAL.
    for i in 0..256u64 {
        let id = c.request(1, write(pg(0), i % 16, 0, &chunk, 1));
        assert_eq!(c.reply(id), Some(&Reply::Ok), "write {i}");
        if i % 8 == 0 {
            c.step(1, Input::FlushDue);
        }
        assert!(
            free(&c) > segments / fastblock_shard::wal_space::WAL_FREE_SHARE_DIVISOR + 1,
            "write {i}: the WAL reached the pressed level"
        );
    }
    assert_eq!(c.probe(1, |p| p.wal_pressure), 0, "never relieved inline");
    let flushed = c.core(1).store().flushed_applied_index(pg(0));
    let (first, _) = c.core(1).store().log_bounds(pg(0));
    assert!(
        first > flushed.saturating_sub(1024) + 1,
        "compacted past the retained tail: first {first}, flushed {flushed}"
    );
}

/// [`two_in_flight`] after one write was answered (something to flush), with the WAL commit
/// of a second write in flight (and `auto_commit` off); returns the second write's id.
fn applied_then_a_commit_in_flight() -> (Cluster, u64) {
    let mut c = two_in_flight();
    let done = c.request(1, write(pg(0), 1, 0, &[1u8; 4096], 1));
    assert_eq!(c.reply(done), Some(&Reply::Ok));
    c.auto_commit = false;
    let pending = c.request(1, write(pg(0), 2, 0, &[2u8; 4096], 1));
    c.step(1, Input::WalCommit);
    assert_eq!(c.core(1).commits_in_flight(), 1);
    (c, pending)
}

/// Goal: a flush never holds the shard's thread for a WAL commit in flight (starting one
/// makes the WAL durable first): a due flush waits until the commit completed, and starts
/// right after, in the same step.
#[test]
fn a_due_flush_waits_for_the_wal_commit_in_flight() {
    let (mut c, pending) = applied_then_a_commit_in_flight();
    let flushed = c.core(1).store().flushed_applied_index(pg(0));
    let eff = c.step_raw(1, Input::FlushDue);
    assert!(
        !eff.flush_started,
        "no flush while a WAL commit is in flight"
    );
    assert_eq!(c.core(1).store().flushed_applied_index(pg(0)), flushed);
    // The commit completes; the flush starts once nothing more is due (one member: the
    // apply's hard state is one more commit).
    let mut started = c.step(1, Input::WalDurable).flush_started;
    for _ in 0..4 {
        if started || !c.core(1).commit_pending() {
            break;
        }
        if c.core(1).commits_in_flight() == 0 {
            started |= c.step(1, Input::WalCommit).flush_started;
        }
        started |= c.step(1, Input::WalDurable).flush_started;
    }
    assert!(started, "the waiting flush starts once the WAL is idle");
    assert_eq!(c.reply(pending), Some(&Reply::Ok));
    assert!(c.core(1).store().flushed_applied_index(pg(0)) > flushed);
}

/// Goal: a shard whose WAL is never idle still flushes, once the wait is up.
#[test]
fn a_due_flush_waits_for_an_idle_wal_no_longer_than_its_bound() {
    let (mut c, _) = applied_then_a_commit_in_flight();
    assert!(!c.step_raw(1, Input::FlushDue).flush_started);
    c.now = Micros(c.now.0 + FLUSH_WAL_IDLE_WAIT_MAX_US / 2);
    assert!(
        !c.step_raw(1, Input::FlushDue).flush_started,
        "still within the wait"
    );
    c.now = Micros(c.now.0 + FLUSH_WAL_IDLE_WAIT_MAX_US / 2);
    assert_eq!(c.core(1).commits_in_flight(), 1, "the WAL is still busy");
    assert!(
        c.step_raw(1, Input::FlushDue).flush_started,
        "the wait is up: the flush starts with the commit in flight"
    );
}

// ---- hosting ----

#[test]
fn hosting_follows_the_map_and_ignores_an_older_one() {
    let mut c = Cluster::new(&[1, 2]);
    c.map(harness::map(
        3,
        &[1, 2],
        &[(0, &[1], &[]), (1, &[2], &[]), (2, &[1], &[])],
    ));
    let hosted: Vec<_> = c.core(1).hosted().collect();
    assert_eq!(hosted, vec![pg(0), pg(2)]);
    // An older map changes nothing.
    c.map(harness::map(2, &[1, 2], &[(0, &[2], &[])]));
    assert_eq!(c.core(1).hosted().count(), 2);
    assert_eq!(c.core(1).map_epoch().0, 3);
    c.elect(1, pg(2));
    let w = c.request(1, write(pg(2), 0, 0, &[4u8; 4096], 3));
    assert_eq!(c.reply(w), Some(&Reply::Ok));
    // The pool shrinks to two PGs (as if pg 2 were deleted): its replica and data go.
    c.map(harness::map(4, &[1, 2], &[(0, &[1], &[]), (1, &[2], &[])]));
    assert_eq!(c.core(1).hosted().collect::<Vec<_>>(), vec![pg(0)]);
    assert!(c.core(1).store().pg_log(pg(2)).is_none(), "log removed");
    assert!(c.effects[&OsdId(1)]
        .iter()
        .any(|e| e.removed == vec![pg(2)]));
}

/// A pool the map lists without its PG map (the monitor found the key missing in etcd and
/// fenced the pool) keeps its replicas and their data; deleting the pool removes them.
#[test]
fn a_pool_without_its_pg_map_keeps_its_replicas_until_deleted() {
    let mut c = single();
    let w = c.request(1, write(pg(0), 0, 0, &[7u8; 4096], 1));
    assert_eq!(c.reply(w), Some(&Reply::Ok));
    let mut damaged = (*harness::map(5, &[1], &[(0, &[1], &[])])).clone();
    damaged.pgmaps.clear();
    c.map(std::sync::Arc::new(damaged.clone()));
    assert_eq!(c.core(1).hosted().collect::<Vec<_>>(), vec![pg(0)]);
    assert!(c.core(1).store().pg_log(pg(0)).is_some(), "log kept");
    let r = c.request(1, read(pg(0), 0, 0, 4096, 5));
    assert!(
        matches!(c.reply(r), Some(Reply::Data(d)) if d[..] == [7u8; 4096][..]),
        "data still served: {:?}",
        c.reply(r)
    );
    // The pool is deleted: now its replica goes.
    damaged.epoch = fastblock_types::Epoch(6);
    damaged.pools.clear();
    c.map(std::sync::Arc::new(damaged));
    assert_eq!(c.core(1).hosted().count(), 0);
    assert!(c.core(1).store().pg_log(pg(0)).is_none(), "log removed");
}

#[test]
fn a_new_leader_reports_itself_until_the_map_records_it() {
    let mut c = single();
    let reported = c
        .reports
        .iter()
        .filter(|(o, r)| {
            *o == OsdId(1) && matches!(r, Report::LeaderElected { pg: p, .. } if *p == pg(0))
        })
        .count();
    assert!(reported >= 1);
    // The map does not record it yet: the next map makes it report again.
    c.map(harness::map(2, &[1], &[(0, &[1], &[])]));
    let again = c
        .reports
        .iter()
        .filter(|(_, r)| matches!(r, Report::LeaderElected { .. }))
        .count();
    assert_eq!(again, reported + 1);
}

// ---- recovery ----

#[test]
fn a_new_member_gets_a_snapshot_of_the_objects_and_serves_them() {
    let mut c = Cluster::new(&[1, 2]);
    c.map(harness::map(1, &[1, 2], &[(0, &[1], &[])]));
    c.elect(1, pg(0));
    for i in 0..6 {
        let id = c.request(1, write(pg(0), i, 0, &[i as u8 + 1; 8192], 1));
        assert_eq!(c.reply(id), Some(&Reply::Ok));
    }
    // Let the leader compact its log so the new member needs a snapshot.
    c.step(1, Input::FlushDue);
    // Target membership: OSDs 1 and 2.
    c.map(harness::map(2, &[1, 2], &[(0, &[1], &[1, 2])]));
    for _ in 0..100 {
        if !c
            .effects
            .get(&OsdId(2))
            .is_some_and(|l| l.iter().any(|e| !e.snapshots_installed.is_empty()))
        {
            c.tick();
        }
    }
    assert!(
        c.probe(1, |p| p.transfers_started) >= 1,
        "a transfer started"
    );
    assert!(
        c.effects[&OsdId(2)]
            .iter()
            .any(|e| !e.snapshots_installed.is_empty()),
        "osd 2 installed a snapshot"
    );
    // Its copy of every object is the leader's.
    for i in 0..6u64 {
        let eff = c.step(
            2,
            Input::Request {
                conn: 5,
                request_id: 500 + i,
                req: Request::ReplicaRead {
                    addr: harness::addr(pg(0), i),
                    offset: 0,
                    length: 8192,
                },
                arrived: c.now,
            },
        );
        assert_eq!(
            eff.replies[0].2,
            Reply::Data(vec![i as u8 + 1; 8192].into()),
            "object {i} on osd 2"
        );
    }
}

#[test]
fn snapshot_chunks_respect_the_rate_limit() {
    let mut c = Cluster::with(&[1, 2], |id| {
        let mut cfg = harness::config(id);
        // 64 KiB/s: at most a tenth of a second of burst (6.4 KiB) plus one 16 KiB chunk.
        cfg.recovery.bytes_per_sec = 64 << 10;
        cfg
    });
    c.map(harness::map(1, &[1, 2], &[(0, &[1], &[])]));
    c.elect(1, pg(0));
    for i in 0..8 {
        let id = c.request(1, write(pg(0), i, 0, &[9u8; 32 << 10], 1));
        assert_eq!(c.reply(id), Some(&Reply::Ok));
    }
    c.step(1, Input::FlushDue);
    c.map(harness::map(2, &[1, 2], &[(0, &[1], &[1, 2])]));
    let start = c.now;
    for _ in 0..20 {
        c.tick();
    }
    let chunk_bytes = c
        .core(1)
        .stats()
        .first()
        .map_or(0, |s| s.recovery_done_bytes);
    let elapsed_s = c.now.since(start) as f64 / 1e6;
    let allowed =
        (64u64 << 10) as f64 * elapsed_s + (64u64 << 10) as f64 / 10.0 + (16 << 10) as f64 * 2.0;
    assert!(chunk_bytes > 0, "recovery made progress");
    assert!(
        (chunk_bytes as f64) <= allowed,
        "sent {chunk_bytes} bytes in {elapsed_s} s, limit {allowed}"
    );
}

/// Goal: the staging of an aborted snapshot transfer comes back at the next flush timer,
/// though the replica applied nothing (a member that only receives transfers, each aborted
/// by a newer one, filled its data area: simulator seed 624121348245308800). Method: osd 2,
/// a target member of PG 0, stages a chunk of one transfer, then the first chunk of a newer
/// one; the flush timer must run a flush that frees the first transfer's blocks.
#[test]
fn a_flush_gives_back_an_aborted_transfers_staging_though_nothing_was_applied() {
    let mut c = Cluster::new(&[1, 2]);
    c.map(harness::map(1, &[1, 2], &[(0, &[1], &[1, 2])]));
    let chunk = |transfer: u64| first_chunk(transfer, 8192);
    for (request_id, transfer) in [(1, 100), (2, 101)] {
        let eff = c.step(
            2,
            Input::Request {
                conn: 9,
                request_id,
                req: chunk(transfer),
                arrived: c.now,
            },
        );
        assert!(
            eff.peers.iter().any(|p| matches!(
                p.req,
                Request::SnapAck {
                    verdict: SnapVerdict::Staged,
                    ..
                }
            )),
            "transfer {transfer}: chunk staged"
        );
    }
    assert!(c.core(2).store().pending_free_bytes() >= 8192);
    let eff = c.step(2, Input::FlushDue);
    assert!(eff.flush_started, "frees waiting start a flush");
    assert_eq!(c.core(2).store().pending_free_bytes(), 0);
    // Nothing applied and nothing to free: the next timer does nothing.
    assert!(!c.step(2, Input::FlushDue).flush_started);
}

// ---- fencing and reclaim (`fastblock_shard::reclaim`) ----

/// Epoch `epoch` of a one-OSD map whose image table holds the harness image at `size_bytes`
/// (objects of 64 KiB), ids below `next_id` given out, and `reclaim` pending.
fn map_with_images(
    epoch: u64,
    size_bytes: Option<u64>,
    next_id: u64,
    reclaim: Vec<fastblock_types::map::ReclaimEntry>,
) -> std::sync::Arc<fastblock_types::map::ClusterMap> {
    use fastblock_types::map::{ImageExtent, ImageTable};
    let mut m = (*harness::map(epoch, &[1], &[(0, &[1], &[])])).clone();
    m.images = Some(ImageTable {
        next_id,
        images: size_bytes
            .map(|size_bytes| {
                let extent = ImageExtent {
                    size_bytes,
                    object_size_bytes: 64 << 10,
                    parent_overlap_bytes: None,
                };
                (harness::IMAGE, extent)
            })
            .into_iter()
            .collect(),
    });
    m.reclaim = reclaim.into_iter().map(|e| (e.id, e)).collect();
    std::sync::Arc::new(m)
}

#[test]
fn the_image_table_fences_io_and_a_newer_client_map_is_told_to_retry() {
    let mut c = single();
    let id = harness::IMAGE.0;
    c.map(map_with_images(2, Some(128 << 10), id + 1, Vec::new()));
    // Object 1 ends at 128 KiB: allowed; object 2 is beyond the image.
    let ok = c.request(1, write(pg(0), 1, 0, &[1u8; 512], 2));
    assert_eq!(c.reply(ok), Some(&Reply::Ok));
    let beyond = c.request(1, write(pg(0), 2, 0, &[1u8; 512], 2));
    assert_eq!(status(c.reply(beyond)), Some(Status::OutOfRange));
    // A client whose map is newer (the image grew since): retry, not a final error.
    let newer = c.request(1, read(pg(0), 2, 0, 512, 5));
    assert_eq!(status(c.reply(newer)), Some(Status::StaleEpoch));
    // The image removed: refused whatever the client's epoch.
    c.map(map_with_images(3, None, id + 1, Vec::new()));
    for epoch in [1, 3, 9] {
        let r = c.request(1, read(pg(0), 1, 0, 512, epoch));
        assert_eq!(
            status(c.reply(r)),
            Some(Status::NoSuchImage),
            "epoch {epoch}"
        );
    }
    assert!(c.probe(1, |p| p.fenced) >= 5);
}

#[test]
fn a_reclaim_is_applied_through_the_log_and_reported_once_per_pg() {
    let mut c = single();
    let id = harness::IMAGE.0;
    c.map(map_with_images(2, Some(256 << 10), id + 1, Vec::new()));
    for object in 0..4 {
        let w = c.request(1, write(pg(0), object, 0, &[7u8; 40 << 10], 2));
        assert_eq!(c.reply(w), Some(&Reply::Ok));
    }
    // Shrunk to 100 KiB: object 1 is cut at 36 KiB, objects 2 and 3 go.
    let entry = shrink_entry(7, 100 << 10, 3);
    c.map(map_with_images(
        3,
        Some(100 << 10),
        id + 1,
        vec![entry.clone()],
    ));
    c.tick();
    let done = |c: &Cluster| {
        c.reports
            .iter()
            .filter(|(_, r)| matches!(r, Report::ReclaimDone { pg: p, id: 7 } if *p == pg(0)))
            .count()
    };
    assert_eq!(done(&c), 1, "the leader reports the PG done");
    assert_eq!(c.probe(1, |p| p.reclaims_applied), 1);
    let objects: Vec<u64> = c
        .core(1)
        .store()
        .object_sizes(pg(0))
        .into_iter()
        .map(|(o, _)| o.index)
        .collect();
    assert_eq!(objects, vec![0, 1], "objects past the cut are deleted");
    // Ticks before the retry interval do not report again; the map showing the PG done ends it.
    for _ in 0..5 {
        c.tick();
    }
    assert_eq!(done(&c), 1);
    let mut finished = entry;
    finished.done_pgs.insert(pg(0).seq);
    c.map(map_with_images(4, Some(100 << 10), id + 1, vec![finished]));
    c.tick();
    assert_eq!(done(&c), 1);
    // Grown again (the monitor allows it once the reclaim is gone): the cut object keeps its
    // head and reads zeros from the cut (36 KiB into it) on.
    c.map(map_with_images(5, Some(256 << 10), id + 1, Vec::new()));
    let r = c.request(1, read(pg(0), 1, 32 << 10, 8 << 10, 5));
    let mut want = vec![7u8; 4 << 10];
    want.resize(8 << 10, 0);
    assert!(
        c.reply(r) == Some(&Reply::Data(want.into())),
        "the tail past the cut reads zeros"
    );
}

#[test]
fn a_map_older_than_an_applied_reclaim_admits_no_io_until_the_newer_map_arrives() {
    let mut c = single();
    let id = harness::IMAGE.0;
    c.map(map_with_images(2, Some(256 << 10), id + 1, Vec::new()));
    let w = c.request(1, write(pg(0), 0, 0, &[7u8; 4096], 2));
    assert_eq!(c.reply(w), Some(&Reply::Ok));
    // A reclaim recorded at epoch 9 reaches this leader through its log while its own map
    // is at epoch 3 (as when an earlier leader proposed it): the map may still show the
    // image's old size, so nothing is admitted from it.
    let entry = shrink_entry(4, 128 << 10, 9);
    c.map(map_with_images(3, Some(256 << 10), id + 1, vec![entry]));
    c.tick();
    assert_eq!(c.probe(1, |p| p.reclaims_applied), 1);
    for r in [
        c.request(1, write(pg(0), 3, 0, &[1u8; 4096], 3)),
        c.request(1, read(pg(0), 0, 0, 4096, 3)),
    ] {
        assert_eq!(status(c.reply(r)), Some(Status::StaleEpoch));
    }
    // The map of the reclaim's epoch (the image at its new size) lets IO in again, and it
    // refuses the range the reclaim deleted.
    c.map(map_with_images(9, Some(128 << 10), id + 1, Vec::new()));
    let r = c.request(1, read(pg(0), 0, 0, 4096, 9));
    assert_eq!(c.reply(r), Some(&Reply::Data(vec![7u8; 4096].into())));
    let beyond = c.request(1, write(pg(0), 3, 0, &[1u8; 4096], 9));
    assert_eq!(status(c.reply(beyond)), Some(Status::OutOfRange));
}

// ---- backfill reservation (`fastblock_shard::recovery`) ----

/// The first chunk of a transfer from osd 1 to osd 2 for PG 0, announcing `total_bytes`.
fn first_chunk(transfer: u64, total_bytes: u64) -> Request {
    Request::SnapChunk(fastblock_wire::SnapChunk {
        from: OsdId(1),
        to: OsdId(2),
        pg: pg(0),
        transfer,
        index: 10,
        term: 1,
        seq: 0,
        last: false,
        image: harness::addr(pg(0), 0).image,
        object_index: 0,
        offset: 0,
        total_bytes,
        // Two head blocks, in the transfer chunk's encoding.
        data: fastblock_store::ChunkVersions {
            head_exists: true,
            copied: false,
            len_bytes: 8192,
            versions: (0..2)
                .map(|block| fastblock_store::BlockVersion {
                    block,
                    birth: 0,
                    snap: 0,
                    damaged: false,
                    data: vec![7u8; 4096],
                })
                .collect(),
        }
        .encode()
        .into(),
    })
}

/// Delivers `req` to `id` as a frame from a peer; returns that step's effects.
fn from_peer(c: &mut Cluster, id: u32, req: Request) -> Effects {
    let arrived = c.now;
    c.step(
        id,
        Input::Request {
            conn: 9,
            request_id: 0,
            req,
            arrived,
        },
    )
}

/// Ticks until `done` holds (at most `ticks_max` ticks of 100 ms).
fn tick_until(c: &mut Cluster, ticks_max: usize, what: &str, done: impl Fn(&Cluster) -> bool) {
    for _ in 0..ticks_max {
        if done(c) {
            return;
        }
        c.tick();
    }
    panic!("{what}: not within {ticks_max} ticks");
}

fn ack_verdict(eff: &Effects) -> Option<SnapVerdict> {
    eff.peers.iter().find_map(|p| match p.req {
        Request::SnapAck { verdict, .. } => Some(verdict),
        _ => None,
    })
}

/// Goal: a member reserves room for a whole snapshot before it stages any of it, refuses
/// one it cannot hold (saying how much it has), and that room is not given to client writes
/// while the transfer runs.
#[test]
fn a_snapshot_is_refused_too_full_unless_its_whole_size_can_be_reserved() {
    let mut c = Cluster::new(&[1, 2]);
    // Osd 1 is cut off: only the test's chunks reach osd 2.
    c.cut.insert(OsdId(1));
    c.map(harness::map(1, &[1, 2], &[(0, &[1], &[1, 2])]));
    let free = c.core(2).store().free_data_bytes();
    let reserve = c.core(2).config().data_reserve_bytes;
    let room = free - reserve;
    let eff = from_peer(&mut c, 2, first_chunk(100, room + (1 << 20)));
    match ack_verdict(&eff) {
        Some(SnapVerdict::TooFull { free_bytes }) => assert_eq!(free_bytes, room),
        other => panic!("expected TooFull, got {other:?}"),
    }
    assert_eq!(
        c.core(2).store().free_data_bytes(),
        free,
        "nothing was staged for the refused transfer"
    );
    assert_eq!(c.probe(2, |p| p.backfill_refused), 1);
    // One that fits is staged, and its room is held: client writes on osd 2 see it taken.
    let eff = from_peer(&mut c, 2, first_chunk(101, room - (16 << 10)));
    assert_eq!(ack_verdict(&eff), Some(SnapVerdict::Staged));
    c.map(harness::map(
        2,
        &[1, 2],
        &[(0, &[1], &[1, 2]), (1, &[2], &[])],
    ));
    c.elect(2, pg(1));
    // 16 KiB of the room are not reserved: a 32 KiB write does not fit beside the transfer.
    let w = c.request(2, write(pg(1), 0, 0, &[1u8; 32 << 10], 2));
    assert_eq!(status(c.reply(w)), Some(Status::NoSpace));
    let w = c.request(2, write(pg(1), 0, 0, &[1u8; 8 << 10], 2));
    assert_eq!(
        c.reply(w),
        Some(&Reply::Ok),
        "a write that fits beside it is taken"
    );
}

/// Goal: a leader whose member refused a snapshot for lack of space reports it
/// (`backfill_too_full`), sends nothing more until its retry time, and tries again then.
#[test]
fn a_leader_waits_after_a_too_full_refusal_and_reports_it() {
    let mut c = Cluster::new(&[1, 2]);
    c.map(harness::map(1, &[1, 2], &[(0, &[1], &[])]));
    c.elect(1, pg(0));
    for object in 0..10 {
        let w = c.request(1, write(pg(0), object, 0, &[3u8; 32 << 10], 1));
        assert_eq!(c.reply(w), Some(&Reply::Ok));
    }
    // Fill osd 2 so that the PG cannot be reserved there: a second PG it leads alone.
    c.map(harness::map(2, &[1, 2], &[(0, &[1], &[]), (1, &[2], &[])]));
    c.elect(2, pg(1));
    let reserve = c.core(2).config().data_reserve_bytes;
    let mut object = 0;
    while c.core(2).store().free_data_bytes() > reserve + (256 << 10) {
        let w = c.request(2, write(pg(1), object, 0, &[9u8; 32 << 10], 2));
        assert_eq!(c.reply(w), Some(&Reply::Ok), "filling osd 2");
        object += 1;
    }
    // PG 0 gains osd 2: the leader's snapshot is refused.
    c.map(harness::map(
        3,
        &[1, 2],
        &[(0, &[1], &[1, 2]), (1, &[2], &[])],
    ));
    tick_until(&mut c, 400, "a too-full refusal", |c| {
        !c.core(1).backfill_too_full().is_empty()
    });
    let refused = c.core(1).backfill_too_full();
    assert_eq!(refused.len(), 1);
    assert_eq!((refused[0].pg, refused[0].osd), (pg(0), OsdId(2)));
    assert!(refused[0].needed_bytes >= 10 * (32 << 10));
    assert!(refused[0].free_bytes < refused[0].needed_bytes);
    // No chunk goes to osd 2 before the retry time; after it, a new transfer is tried.
    let retry_ticks = (fastblock_shard::recovery::BACKFILL_RETRY_MS / 100) as usize;
    let started = c.probe(1, |p| p.transfers_started);
    for _ in 0..retry_ticks / 2 {
        c.tick();
    }
    assert_eq!(c.probe(1, |p| p.transfers_started), started);
    tick_until(
        &mut c,
        retry_ticks,
        "a new transfer after the retry time",
        |c| c.probe(1, |p| p.transfers_started) > started,
    );
    assert!(c.probe(1, |p| p.backfill_too_full) >= 2);
}

/// Goal: a new leader admits no write before it has applied the log it inherited (a reclaim
/// committed by the leader before it may be in it, and the fencing must see it), and the
/// writes that arrive meanwhile wait instead of failing. Method: osd 1 leads PG 0 of three,
/// then is cut off; the moment another OSD wins the election (frames delivered one at a
/// time), the remaining follower is cut off too, so the new leader cannot commit its term's
/// first entry. A write sent to it gets no answer; once the follower is back, it is
/// answered Ok.
#[test]
fn a_new_leader_holds_writes_until_it_applied_the_log_it_inherited() {
    let mut c = Cluster::new(&[1, 2, 3]);
    let mut m = (*harness::map(1, &[1, 2, 3], &[(0, &[1, 2, 3], &[])])).clone();
    m.images = map_with_images(1, Some(1 << 30), harness::IMAGE.0 + 1, Vec::new())
        .images
        .clone();
    c.map(std::sync::Arc::new(m));
    let leads = |c: &Cluster, id: u32| c.core(id).replica(pg(0)).is_some_and(|r| r.is_leader());
    tick_until(&mut c, 100, "a leader", |c| (1..=3).any(|id| leads(c, id)));
    let first = (1..=3).find(|id| leads(&c, *id)).unwrap();
    let w = c.request(first, write(pg(0), 0, 0, &[1u8; 4096], 1));
    c.settle();
    assert_eq!(c.reply(w), Some(&Reply::Ok));
    c.cut.insert(OsdId(first));
    let others: Vec<u32> = (1..=3).filter(|id| *id != first).collect();
    let mut new = None;
    for _ in 0..100_000 {
        new = others.iter().copied().find(|id| leads(&c, *id));
        if new.is_some() {
            break;
        }
        if !c.deliver_one() {
            c.tick_only();
        }
    }
    let new = new.expect("one of the others is elected");
    let follower = others.into_iter().find(|id| *id != new).unwrap();
    c.cut.insert(OsdId(follower));
    let last_index = |c: &Cluster| {
        let r = c.core(new).replica(pg(0)).unwrap();
        r.raw_node().raft.raft_log.last_index()
    };
    let before = last_index(&c);
    let w = c.request(new, write(pg(0), 1, 0, &[2u8; 4096], 1));
    c.settle();
    assert_eq!(c.reply(w), None, "held, not refused");
    assert_eq!(last_index(&c), before, "not proposed yet");
    assert!(c.probe(new, |p| p.held_for_term) >= 1);
    c.cut.remove(&OsdId(follower));
    for _ in 0..50 {
        if c.reply(w).is_some() {
            break;
        }
        c.tick();
    }
    assert_eq!(c.reply(w), Some(&Reply::Ok));
}

/// Goal: a leader report leaves only once everything staged before it is durable (the
/// monitor drops members by it; a configuration applied from a commit index that was not yet
/// durable must not reach it: simulator seed 9952412769498548792 with --membership). Method:
/// two commits allowed in flight; a write's commit is submitted and not durable when a new
/// map makes the leader report again: the report waits for the commit.
#[test]
fn a_leader_report_waits_until_what_was_staged_before_it_is_durable() {
    let mut c = two_in_flight();
    c.auto_commit = false;
    let w = c.request(1, write(pg(0), 1, 0, &[1u8; 512], 1));
    let eff = c.step(1, Input::WalCommit);
    assert!(eff.wal_commit_submitted.is_some());
    assert_eq!(c.core(1).commits_in_flight(), 1);
    let leader_reports = |eff: &Effects| {
        eff.reports
            .iter()
            .filter(|r| matches!(r, Report::LeaderElected { .. }))
            .count()
    };
    let eff = c.step(1, Input::Map(harness::map(2, &[1], &[(0, &[1], &[])])));
    assert_eq!(
        leader_reports(&eff),
        0,
        "held: the write's commit is not durable"
    );
    let eff = c.step(1, Input::WalDurable);
    assert_eq!(leader_reports(&eff), 1, "released with the commit");
    assert_eq!(c.reply(w), Some(&Reply::Ok));
}

/// Goal: a configuration a leader reports survives the leader's crash right after the report
/// (the monitor drops members by it, and a dropped member deletes its replica). The report
/// of leaving a joint configuration is made from the very ready whose hard state carries the
/// commit index of the leave-joint entry; that hard state moves only the commit index, so it
/// needs no sync of its own, and the report must wait for it to be durable all the same
/// (simulator seed 3856582366863085052 with --membership: the report went out first, the
/// leader crashed, came back joint, and needed the vote of the member that was gone).
/// Method: PG 0 moves from OSD 1 to OSD 2; OSD 2, the new leader, commits the leave-joint
/// entry on OSD 1's acknowledgement. The moment OSD 2 has reported the configuration without
/// OSD 1, OSD 2 loses power; the map then records the report, and OSD 1 is cut off (its
/// replica is gone). OSD 2, restarted, has the configuration it reported and leads the PG
/// alone.
#[test]
fn a_reported_configuration_survives_a_crash_of_the_leader_right_after_the_report() {
    let mut c = Cluster::new(&[1, 2]);
    c.map(harness::map(1, &[1, 2], &[(0, &[1], &[])]));
    c.elect(1, pg(0));
    let w = c.request(1, write(pg(0), 0, 0, &[5u8; 512], 1));
    assert_eq!(c.reply(w), Some(&Reply::Ok));
    c.map(harness::map(2, &[1, 2], &[(0, &[1], &[2])]));
    let left_joint = |c: &Cluster| {
        c.reports.iter().any(|(o, r)| {
            *o == OsdId(2)
                && match r {
                    Report::LeaderElected { pg: p, req } => {
                        *p == pg(0) && req.voters == [OsdId(2)] && req.voters_outgoing.is_empty()
                    }
                    Report::MembershipFinished { pg: p, req } => {
                        *p == pg(0) && req.voters == [OsdId(2)]
                    }
                    _ => false,
                }
        })
    };
    let mut steps = 0;
    while !left_joint(&c) {
        steps += 1;
        assert!(
            steps < 100_000,
            "osd 2 never reported leaving the joint state"
        );
        if !c.deliver_one() {
            c.tick_only();
        }
    }
    c.crash_and_restart(2);
    // The monitor records the report; osd 1, no longer a member, deletes its replica (it is
    // cut off as well, so that its vote cannot help whatever the timing of the removal).
    c.cut.insert(OsdId(1));
    c.map(harness::map(3, &[1, 2], &[(0, &[2], &[])]));
    let conf = c
        .core(2)
        .replica(pg(0))
        .expect("osd 2 hosts pg 0")
        .raw_node()
        .raft
        .prs()
        .conf()
        .to_conf_state();
    assert!(
        conf.voters == [2] && conf.voters_outgoing.is_empty(),
        "osd 2 came back with another configuration than it reported: {conf:?}"
    );
    tick_until(&mut c, 100, "osd 2 leading pg 0 alone", |c| {
        c.core(2).replica(pg(0)).is_some_and(|r| r.is_leader())
    });
    let r = c.request(2, read(pg(0), 0, 0, 512, 3));
    tick_until(&mut c, 10, "the read answered", |c| c.reply(r).is_some());
    assert_eq!(c.reply(r), Some(&Reply::Data(vec![5u8; 512].into())));
}

/// Reclaim `id` of the test image (64 KiB objects, 256 KiB before the shrink) cut to
/// `from_bytes`, recorded at map epoch `epoch`.
fn shrink_entry(id: u64, from_bytes: u64, epoch: u64) -> fastblock_types::map::ReclaimEntry {
    fastblock_types::map::ReclaimEntry {
        id,
        pool: pg(0).pool,
        image: harness::IMAGE,
        image_name: "img".into(),
        object_size_bytes: 64 << 10,
        from_bytes,
        to_bytes: 256 << 10,
        reason: "image shrunk".into(),
        epoch: fastblock_types::Epoch(epoch),
        done_pgs: Default::default(),
    }
}

// ---- image snapshots (`fastblock_shard::snaps`) ----

/// The one-OSD map of `map_with_images` with snapshot 1 of the harness image in `state`
/// (absent: `None`), and trim entry `trim` pending.
fn map_with_snap(
    epoch: u64,
    state: Option<fastblock_types::map::SnapState>,
    trim: Option<u64>,
) -> std::sync::Arc<fastblock_types::map::ClusterMap> {
    use fastblock_types::map::{SnapInfo, SnapTrimEntry};
    use fastblock_types::SnapId;
    let image = harness::IMAGE;
    let mut m = (*map_with_images(epoch, Some(256 << 10), image.0 + 1, Vec::new())).clone();
    let pool = harness::addr(pg(0), 0).pg.pool;
    if let Some(state) = state {
        let snap = SnapInfo {
            id: SnapId(1),
            pool,
            image,
            image_name: "img".into(),
            name: "s1".into(),
            state,
            size_bytes: 256 << 10,
            object_size_bytes: 64 << 10,
            created_epoch: fastblock_types::Epoch(epoch),
            protected: false,
            done_pgs: Default::default(),
            started_at_ms: 0,
            parent_overlap_bytes: None,
        };
        m.snaps.insert(image, vec![snap]);
    }
    if let Some(id) = trim {
        let entry = SnapTrimEntry {
            id,
            pool,
            image,
            image_name: "img".into(),
            snap: SnapId(1),
            reason: "removed".into(),
            epoch: fastblock_types::Epoch(epoch),
            done_pgs: Default::default(),
        };
        m.snap_trims.insert(id, entry);
    }
    std::sync::Arc::new(m)
}

fn snap_read(object: u64, length: u32, epoch: u64) -> Request {
    Request::SnapRead {
        addr: harness::addr(pg(0), object),
        offset: 0,
        length,
        epoch: fastblock_types::Epoch(epoch),
        snap: 1,
    }
}

/// Goal: a snapshot the map shows `creating` is marked through the PG's log and confirmed
/// once; from its mark until the map shows it `created`, writes to the image are refused
/// with the retryable `SnapInProgress` (reads go on); the snapshot then reads what was
/// written before the mark whatever is written after; a rollback brings that back; a trim
/// removes it (reads of it are refused `NoSuchSnap`) and is confirmed once.
#[test]
fn a_snapshot_is_marked_holds_writes_until_created_reads_as_taken_and_is_trimmed() {
    use fastblock_types::map::SnapState;
    let mut c = single();
    c.map(map_with_snap(2, None, None));
    let before = c.request(1, write(pg(0), 0, 0, &[1u8; 8192], 2));
    assert_eq!(c.reply(before), Some(&Reply::Ok));
    c.map(map_with_snap(3, Some(SnapState::Creating), None));
    c.tick();
    let marked = |c: &Cluster| {
        c.reports
            .iter()
            .filter(|(_, r)| matches!(r, Report::SnapMarked { snap: 1, .. }))
            .count()
    };
    assert_eq!(marked(&c), 1, "the leader confirms the mark");
    assert!(c
        .core(1)
        .store()
        .image_snaps(pg(0), harness::IMAGE)
        .live
        .contains(&1));
    let held = c.request(1, write(pg(0), 0, 0, &[2u8; 4096], 3));
    assert_eq!(status(c.reply(held)), Some(Status::SnapInProgress));
    let r = c.request(1, read(pg(0), 0, 0, 4096, 3));
    assert_eq!(c.reply(r), Some(&Reply::Data(vec![1u8; 4096].into())));
    // Created: writes go again; the snapshot keeps what was there before the mark.
    c.map(map_with_snap(4, Some(SnapState::Created), None));
    let after = c.request(1, write(pg(0), 0, 0, &[2u8; 4096], 4));
    assert_eq!(c.reply(after), Some(&Reply::Ok));
    let s = c.request(1, snap_read(0, 8192, 4));
    assert_eq!(c.reply(s), Some(&Reply::Data(vec![1u8; 8192].into())));
    let h = c.request(1, read(pg(0), 0, 0, 4096, 4));
    assert_eq!(c.reply(h), Some(&Reply::Data(vec![2u8; 4096].into())));
    // Rollback through the log.
    let rb = c.request(
        1,
        Request::Rollback {
            addr: harness::addr(pg(0), 0),
            epoch: fastblock_types::Epoch(4),
            term: 0,
            snap: 1,
        },
    );
    assert_eq!(c.reply(rb), Some(&Reply::Ok));
    let h = c.request(1, read(pg(0), 0, 0, 8192, 4));
    assert_eq!(c.reply(h), Some(&Reply::Data(vec![1u8; 8192].into())));
    // Removed: the trim is applied and confirmed, the snapshot is gone.
    c.map(map_with_snap(5, None, Some(9)));
    c.tick();
    let trimmed = c
        .reports
        .iter()
        .filter(|(_, r)| matches!(r, Report::SnapTrimmed { id: 9, .. }))
        .count();
    assert_eq!(trimmed, 1);
    let gone = c.request(1, snap_read(0, 4096, 5));
    assert_eq!(status(c.reply(gone)), Some(Status::NoSuchSnap));
    let rb = c.request(
        1,
        Request::Rollback {
            addr: harness::addr(pg(0), 0),
            epoch: fastblock_types::Epoch(5),
            term: 0,
            snap: 1,
        },
    );
    assert_eq!(status(c.reply(rb)), Some(Status::NoSuchSnap));
    assert_eq!(marked(&c), 1, "confirmed once");
}

/// `map_with_snap`, with the harness image a clone whose head overlap is
/// `head_overlap_bytes` and snapshot 1 (if listed) taken at `snap_overlap_bytes`.
fn map_with_clone_snap(
    epoch: u64,
    state: Option<fastblock_types::map::SnapState>,
    trim: Option<u64>,
    head_overlap_bytes: u64,
    snap_overlap_bytes: u64,
) -> std::sync::Arc<fastblock_types::map::ClusterMap> {
    let mut m = (*map_with_snap(epoch, state, trim)).clone();
    let table = m.images.as_mut().expect("an image table");
    let extent = table.images.get_mut(&harness::IMAGE).expect("the image");
    extent.parent_overlap_bytes = Some(head_overlap_bytes);
    for s in m.snaps.values_mut().flatten() {
        s.parent_overlap_bytes = Some(snap_overlap_bytes);
    }
    std::sync::Arc::new(m)
}

fn copy_up(object: u64, offset: u32, data: &[u8], epoch: u64) -> Request {
    Request::CopyUp {
        addr: harness::addr(pg(0), object),
        offset,
        epoch: fastblock_types::Epoch(epoch),
        term: 0,
        data: data.to_vec().into(),
    }
}

/// Goal: a snapshot read of a clone sends the reader to the parent for an object the clone
/// had not copied up, within the snapshot's overlap; a copy-up placed by the leader keeps
/// the parent's bytes beyond the head's overlap for the snapshot (the head reads zeros
/// there); a map that does not show the snapshot answers `StaleEpoch` (it cannot tell), one
/// that shows its trim `NoSuchSnap`; a copy-up for an image that is not a clone, or not in
/// whole blocks, is refused.
#[test]
fn snapshot_reads_of_a_clone_go_to_the_parent_until_a_copy_up_placed_for_every_version() {
    use fastblock_types::map::SnapState;
    const OBJ: u64 = 64 << 10;
    let mut c = single();
    // A plain image refuses copy-ups.
    c.map(map_with_snap(2, None, None));
    let r = c.request(1, copy_up(0, 0, &[7u8; 4096], 2));
    assert_eq!(status(c.reply(r)), Some(Status::InvalidArgument));
    // A clone reading its parent below 64 KiB (object 0); snapshot 1 read below 128 KiB.
    c.map(map_with_clone_snap(
        3,
        Some(SnapState::Creating),
        None,
        OBJ,
        2 * OBJ,
    ));
    c.tick();
    c.map(map_with_clone_snap(
        4,
        Some(SnapState::Created),
        None,
        OBJ,
        2 * OBJ,
    ));
    for object in [0, 1] {
        let r = c.request(1, snap_read(object, 4096, 4));
        assert_eq!(
            status(c.reply(r)),
            Some(Status::ObjectAbsent),
            "object {object}: the parent's, within the snapshot's overlap"
        );
    }
    // Beyond the snapshot's overlap the clone's own blocks are the answer (zeros here).
    let r = c.request(1, snap_read(2, 4096, 4));
    assert_eq!(c.reply(r), Some(&Reply::Data(vec![0u8; 4096].into())));
    // Object 1 lies beyond the head's overlap: its copy-up is kept for the snapshot only.
    let unaligned = c.request(1, copy_up(1, 512, &[9u8; 4096], 4));
    assert_eq!(status(c.reply(unaligned)), Some(Status::InvalidArgument));
    let piece = c.request(1, copy_up(1, 0, &[9u8; 8192], 4));
    assert_eq!(c.reply(piece), Some(&Reply::Ok));
    let done = c.request(
        1,
        Request::CopyUpDone {
            addr: harness::addr(pg(0), 1),
            epoch: fastblock_types::Epoch(4),
            term: 0,
        },
    );
    assert_eq!(c.reply(done), Some(&Reply::Ok));
    let r = c.request(1, snap_read(1, 8192, 4));
    assert_eq!(c.reply(r), Some(&Reply::Data(vec![9u8; 8192].into())));
    let h = c.request(1, read(pg(0), 1, 0, 8192, 4));
    assert_eq!(c.reply(h), Some(&Reply::Data(vec![0u8; 8192].into())));
    let usage = c.core(1).store().image_usage(pg(0), harness::IMAGE);
    assert_eq!((usage.head_blocks, usage.kept_blocks()), (0, 2));
    // A map without the snapshot cannot tell; one with its trim says it is gone.
    c.map(map_with_clone_snap(5, None, None, OBJ, 2 * OBJ));
    let r = c.request(1, snap_read(0, 4096, 5));
    assert_eq!(status(c.reply(r)), Some(Status::StaleEpoch));
    c.map(map_with_clone_snap(6, None, Some(3), OBJ, 2 * OBJ));
    let r = c.request(1, snap_read(0, 4096, 6));
    assert_eq!(status(c.reply(r)), Some(Status::NoSuchSnap));
}

// ---- op tracker ----

/// Goal: every kind of read the client sends reaches the op tracker's historic ops once
/// answered, not only data reads: allocation queries, snapshot reads and clone reads too,
/// whatever they answer (here: no such snapshot, an object not copied up).
#[test]
fn every_kind_of_read_answered_reaches_the_historic_ops() {
    let mut c = single();
    let w = c.request(1, write(pg(0), 0, 0, &[1u8; 4096], 1));
    assert_eq!(c.reply(w), Some(&Reply::Ok));
    let epoch = fastblock_types::Epoch(1);
    let reqs = vec![
        read(pg(0), 0, 0, 4096, 1),
        Request::Allocation {
            addr: harness::addr(pg(0), 0),
            offset: 0,
            length: 4096,
            epoch,
        },
        snap_read(0, 4096, 1),
        Request::CloneRead {
            addr: harness::addr(pg(0), 0),
            offset: 0,
            length: 4096,
            epoch,
        },
    ];
    let ids = c.request_batch(1, reqs);
    c.settle();
    for _ in 0..5 {
        if ids.iter().all(|&r| c.reply(r).is_some()) {
            break;
        }
        c.tick();
    }
    assert!(ids.iter().all(|&r| c.reply(r).is_some()), "all answered");
    let report = c.core(1).ops_report(u64::MAX);
    assert_eq!(report.in_flight, 0);
    let mut kinds: Vec<&str> = report.slowest.iter().map(|o| o.kind.as_str()).collect();
    kinds.sort_unstable();
    assert_eq!(
        kinds,
        ["allocation", "clone_read", "read", "snap_read", "write"]
    );
    for op in report.slowest.iter().filter(|o| o.kind != "write") {
        let names: Vec<&str> = op.stages.iter().map(|s| s.stage.as_str()).collect();
        assert_eq!(names, ["queue", "read_index", "read"], "{}", op.kind);
    }
}

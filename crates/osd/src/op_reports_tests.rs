use super::*;
use fastblock_types::api::{OpStage, TrackedOp};
use fastblock_types::{PgId, PoolId};

fn op(shard: u32, duration_us: u64) -> TrackedOp {
    TrackedOp {
        shard,
        pg: PgId {
            pool: PoolId(1),
            seq: shard,
        },
        kind: "write".into(),
        request_id: 1,
        duration_us,
        stage: "replication".into(),
        stages: vec![
            OpStage {
                stage: "queued".into(),
                us: 100,
            },
            OpStage {
                stage: "replication".into(),
                us: duration_us - 100,
            },
        ],
    }
}

fn report(shard: u32, in_flight: u64, complaint_ms: u64) -> OsdOps {
    OsdOps {
        complaint_time_ms: complaint_ms,
        in_flight,
        slow: 0,
        oldest: (0..in_flight).map(|i| op(shard, 1_000 + i)).collect(),
        slowest: Vec::new(),
    }
}

/// Two shards; returns their command queues' receiving ends too.
fn two_shards() -> (
    Vec<mpsc::UnboundedSender<ShardCommand>>,
    Vec<mpsc::UnboundedReceiver<ShardCommand>>,
) {
    (0..2).map(|_| mpsc::unbounded_channel()).unzip()
}

fn take_request(rx: &mut mpsc::UnboundedReceiver<ShardCommand>) -> oneshot::Sender<OsdOps> {
    match rx.try_recv() {
        Ok(ShardCommand::Ops { reply, .. }) => reply,
        _ => panic!("an ops request was sent"),
    }
}

#[test]
fn a_shard_stuck_past_the_complaint_time_reports_its_ops_aged_and_slow() {
    let (_complaint_tx, complaint) = watch::channel(Duration::from_secs(1));
    let (txs, mut rxs) = two_shards();
    let mut reports = OpReports::new(2, complaint);
    let t0 = Instant::now();

    reports.ask_at(&txs, t0);
    take_request(&mut rxs[0]).send(report(0, 2, 1_000)).unwrap();
    take_request(&mut rxs[1]).send(report(1, 1, 1_000)).unwrap();
    let first = reports.collect_at(t0).expect("both answered");
    assert_eq!((first.in_flight, first.slow), (3, 0));

    // Shard 0 answers again; shard 1 is stuck in a disk call: its request stays unanswered
    // (its reply sender alive, so the oneshot stays empty).
    reports.ask_at(&txs, t0);
    take_request(&mut rxs[0]).send(report(0, 0, 1_000)).unwrap();
    let stuck_reply = take_request(&mut rxs[1]);

    // Not stuck for the complaint time yet: its last answer as it was.
    let early = reports
        .collect_at(t0 + Duration::from_millis(500))
        .expect("a report");
    assert_eq!((early.in_flight, early.slow), (1, 0));
    assert_eq!(early.oldest[0].duration_us, 1_000);

    let later = t0 + Duration::from_secs(3);
    let stuck = reports.collect_at(later).expect("a report");
    assert_eq!(stuck.in_flight, 1);
    assert_eq!(stuck.slow, 1, "the stuck shard's op in flight is slow");
    let aged = &stuck.oldest[0];
    assert_eq!(aged.shard, 1);
    assert_eq!(
        aged.duration_us,
        3_000_000 + 1_000,
        "aged by the time stuck"
    );
    assert_eq!(
        aged.stages.last().map(|s| s.us),
        Some(3_000_000 + 900),
        "the time stuck is spent in the stage it was in"
    );
    assert_eq!(aged.stages[0].us, 100, "earlier stages unchanged");

    // Once it answers, its own report counts again.
    stuck_reply.send(report(1, 0, 1_000)).unwrap();
    let after = reports.collect_at(later).expect("a report");
    assert_eq!((after.in_flight, after.slow), (0, 0));
}

#[test]
fn the_report_carries_the_complaint_time_in_force_not_the_largest_asked() {
    let (complaint_tx, complaint) = watch::channel(Duration::from_secs(3600));
    let (txs, mut rxs) = two_shards();
    let mut reports = OpReports::new(2, complaint);
    let t0 = Instant::now();
    reports.ask_at(&txs, t0);
    take_request(&mut rxs[0])
        .send(report(0, 0, 3_600_000))
        .unwrap();
    take_request(&mut rxs[1])
        .send(report(1, 0, 3_600_000))
        .unwrap();
    assert_eq!(
        reports.collect_at(t0).map(|r| r.complaint_time_ms),
        Some(3_600_000)
    );

    complaint_tx.send(Duration::from_secs(1)).unwrap();
    reports.ask_at(&txs, t0);
    take_request(&mut rxs[0]).send(report(0, 0, 1_000)).unwrap();
    // Shard 1 has not answered the new request: its last answer carries the old value.
    let _pending = take_request(&mut rxs[1]);
    assert_eq!(
        reports.collect_at(t0).map(|r| r.complaint_time_ms),
        Some(1_000)
    );
}

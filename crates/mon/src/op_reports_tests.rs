use super::*;
use fastblock_types::api::{OpStage, TrackedOp, TRACKED_OPS_LISTED_MAX, TRACKED_OP_STAGES_MAX};
use fastblock_types::map::OsdInfo;
use fastblock_types::{Epoch, PgId, PoolId};

/// The monitor's `--osd-down-after` in these tests.
const DOWN_AFTER_MS: u64 = 10_000;

fn osd(id: u32, up: bool) -> OsdInfo {
    OsdInfo {
        id: OsdId(id),
        uuid: format!("uuid-{id}"),
        host: String::new(),
        address: String::new(),
        port: 0,
        shards: 1,
        capacity_bytes: 0,
        up,
        is_in: true,
        pending_create: false,
        boot_epoch: Epoch(1),
        config: String::new(),
        lease_timing: None,
    }
}

fn map(osds: &[(u32, bool)]) -> ClusterMap {
    let mut m = ClusterMap::default();
    for &(id, up) in osds {
        std::sync::Arc::make_mut(&mut m.osds).insert(OsdId(id), osd(id, up));
    }
    m
}

fn tracked(stages: usize) -> TrackedOp {
    TrackedOp {
        shard: 0,
        pg: PgId::new(PoolId(1), 0),
        kind: "write".into(),
        request_id: 1,
        duration_us: 5_000_000,
        stage: "wal_commit".into(),
        stages: (0..stages)
            .map(|i| OpStage {
                stage: format!("s{i}"),
                us: 1,
            })
            .collect(),
    }
}

fn slow_report() -> OsdOps {
    OsdOps {
        complaint_time_ms: 1_000,
        in_flight: 1,
        slow: 1,
        oldest: vec![tracked(2)],
        slowest: Vec::new(),
    }
}

#[test]
fn a_heartbeat_interval_longer_than_five_seconds_keeps_slow_ops_raised() {
    let mut r = OpReports::default();
    let m = map(&[(1, true)]);
    r.record(OsdId(1), 0, Some(slow_report()));
    // Heartbeats 8 s apart, under the monitor's 10 s down-after: the OSD stays up and its
    // report stays in force until the next one.
    for now in [0, 5_001, 8_000, DOWN_AFTER_MS] {
        assert!(
            r.slow(&m, now, DOWN_AFTER_MS).contains_key(&OsdId(1)),
            "raised at {now} ms"
        );
    }
}

#[test]
fn a_stale_report_raises_nothing() {
    let mut r = OpReports::default();
    let m = map(&[(1, true)]);
    r.record(OsdId(1), 0, Some(slow_report()));
    // Past the down-after the OSD heartbeats no more, even if not marked down yet.
    assert!(r.slow(&m, DOWN_AFTER_MS + 1, DOWN_AFTER_MS).is_empty());
    // Still served, with its age.
    let served = r.of(OsdId(1), DOWN_AFTER_MS + 1).expect("kept");
    assert_eq!(served.report_age_ms, DOWN_AFTER_MS + 1);
}

#[test]
fn a_down_or_missing_osd_raises_nothing() {
    let mut r = OpReports::default();
    r.record(OsdId(1), 0, Some(slow_report()));
    r.record(OsdId(2), 0, Some(slow_report()));
    let m = map(&[(1, false)]);
    assert!(
        r.slow(&m, 0, DOWN_AFTER_MS).is_empty(),
        "1 down, 2 not in the map"
    );
    let m = map(&[(1, false), (2, true)]);
    let raised: Vec<OsdId> = r.slow(&m, 0, DOWN_AFTER_MS).into_keys().collect();
    assert_eq!(raised, [OsdId(2)]);
}

#[test]
fn a_heartbeat_without_ops_forgets_the_last_report() {
    let mut r = OpReports::default();
    let m = map(&[(1, true)]);
    r.record(OsdId(1), 0, Some(slow_report()));
    r.record(OsdId(1), 1_000, None);
    assert!(r.slow(&m, 1_000, DOWN_AFTER_MS).is_empty());
    assert!(r.of(OsdId(1), 1_000).is_none());
}

#[test]
fn a_report_is_stored_within_the_bounds_an_osd_keeps() {
    let mut r = OpReports::default();
    let huge = OsdOps {
        oldest: vec![tracked(50); 1_000],
        slowest: vec![tracked(50); 1_000],
        ..slow_report()
    };
    r.record(OsdId(1), 0, Some(huge));
    let kept = r.of(OsdId(1), 0).expect("kept").ops;
    assert_eq!(kept.oldest.len(), TRACKED_OPS_LISTED_MAX);
    assert_eq!(kept.slowest.len(), TRACKED_OPS_LISTED_MAX);
    assert!(kept
        .oldest
        .iter()
        .chain(&kept.slowest)
        .all(|o| o.stages.len() == TRACKED_OP_STAGES_MAX));
}

//! A pool damaged in etcd (its PG map key missing, its PG map naming an OSD that does not
//! exist) is reported in health and fenced, and nothing else stops: OSD liveness still marks
//! OSDs down and out, the other pools are repaired and take changes, and `pool rm` of the
//! damaged pool works. The states are built as `Keyspace::decode` would load them.

mod common;

use common::{boot_request, op};
use fastblock_mon_core::damage::PoolDamage;
use fastblock_mon_core::health::{health, DaemonCheck};
use fastblock_mon_core::liveness::{Liveness, LivenessConfig, LivenessEvent};
use fastblock_mon_core::{MonState, Reporter};
use fastblock_types::api::*;
use fastblock_types::map::FailureDomain;
use fastblock_types::{LogIndex, OsdId, PgId, PoolId, Term};

const MIB: u64 = 1 << 20;
const GOOD: PoolId = PoolId(1);
const BAD: PoolId = PoolId(2);

/// Runs one operation as the service does: on a copy, then `finish`.
/// Four OSDs, pools "good" (id 1) and "bad" (id 2) of 8 PGs of 3 replicas, an image in each.
fn cluster() -> MonState {
    let mut s = MonState::default();
    for i in 0..4u32 {
        let req = boot_request(i, None);
        let id = op(&mut s, |s| s.apply_id(&req.uuid)).unwrap();
        op(&mut s, |s| s.boot(id, &req)).unwrap();
    }
    for name in ["good", "bad"] {
        op(&mut s, |s| {
            s.create_pool(&CreatePoolRequest {
                name: name.into(),
                pg_count: 8,
                size: 3,
                failure_domain: FailureDomain::Osd,
            })
        })
        .unwrap();
        op(&mut s, |s| {
            s.create_image(&CreateImageRequest {
                pool: name.into(),
                name: "img".into(),
                size_bytes: 16 * MIB,
                object_size_bytes: Some(MIB),
            })
        })
        .unwrap();
    }
    assert!(s.damaged_pools().is_empty());
    s
}

/// The cluster as loaded from an etcd that lost the key `pgmaps/2`.
fn without_bad_pgmap() -> MonState {
    let mut s = cluster();
    s.map.pgmaps.remove(&BAD).expect("pool 2 had a PG map");
    s.refresh_damage();
    s
}

fn pools_hold(s: &MonState, osd: OsdId) -> Vec<PgId> {
    s.map.pgs_of_osd(osd)
}

#[test]
fn a_missing_pg_map_is_reported_in_health_naming_the_pool_and_the_key() {
    let s = without_bad_pgmap();
    // What etcd can hold never makes the invariant check panic.
    s.check_invariants();
    assert_eq!(s.validate(), Ok(()));
    assert_eq!(
        s.damaged_pools().into_iter().collect::<Vec<_>>(),
        vec![(BAD, PoolDamage::PgMapMissing)]
    );
    let h = health(&s, &[]);
    assert_eq!(h.status, "HEALTH_ERR");
    let check = h
        .checks
        .iter()
        .find(|c| c.code == "POOL_PGMAP_MISSING")
        .unwrap_or_else(|| panic!("no POOL_PGMAP_MISSING check in {:?}", h.checks))
        .to_string();
    assert!(check.contains("pool 2 (\"bad\")"), "{check}");
    assert!(check.contains("pgmaps/2"), "{check}");
    // The daemon's own checks come first and count too.
    let task = DaemonCheck {
        err: false,
        text: "x failed 1 time, last 70s ago: y".into(),
    };
    let h = health(&cluster(), std::slice::from_ref(&task));
    assert_eq!(
        (h.status, h.checks[0].to_string().as_str()),
        (
            "HEALTH_WARN",
            "MON_TASK_FAILED: x failed 1 time, last 70s ago: y"
        )
    );
}

/// The monitor's liveness task on a damaged state: an OSD that stops heartbeating is marked
/// down, then out; the good pool's PGs that held it get a replacement; the bad pool is left
/// as it is; the OSD comes back (boot: rebalance) without a panic either.
#[test]
fn liveness_still_marks_osds_down_and_out_and_repairs_the_other_pools() {
    let mut s = without_bad_pgmap();
    let config = LivenessConfig {
        osd_down_after_ms: 1_000,
        osd_out_after_ms: 2_000,
    };
    let mut live = Liveness::new(config);
    let silent = OsdId(4);
    let held = pools_hold(&s, silent);
    assert!(
        held.iter().any(|pg| pg.pool == GOOD),
        "osd 4 holds good PGs"
    );
    let mut now = 0;
    let mut seen = Vec::new();
    while now <= 4_000 {
        for osd in 1..=3 {
            live.heartbeat(OsdId(osd), now);
        }
        let events = live.tick(&s, now);
        for e in &events {
            op(&mut s, |s| match *e {
                LivenessEvent::Down(id) => s.mark_down(id),
                LivenessEvent::Up(id) => s.mark_up(id),
                LivenessEvent::Out(id) => s.mark_out(id),
            })
            .unwrap();
        }
        seen.extend(events);
        now += 250;
    }
    assert_eq!(
        seen,
        vec![LivenessEvent::Down(silent), LivenessEvent::Out(silent)]
    );
    let osd = &s.map.osds[&silent];
    assert!(!osd.up && !osd.is_in);
    for pg in held.iter().filter(|pg| pg.pool == GOOD) {
        let info = s.map.pg(*pg).unwrap();
        assert!(
            !info.newosdlist.is_empty() && !info.newosdlist.contains(&silent),
            "pg {pg} not repaired: {info:?}"
        );
    }
    assert!(
        !s.map.pgmaps.contains_key(&BAD),
        "the bad pool stays as it is"
    );
    // Back up and in: cancels remaps, repairs and rebalances, all pools but the bad one.
    op(&mut s, |s| s.boot(silent, &boot_request(3, None))).unwrap();
    assert!(s.map.osds[&silent].is_in);
    assert_eq!(s.damaged_pools().len(), 1);
}

#[test]
fn changes_to_the_damaged_pool_are_refused_and_the_other_pool_takes_them() {
    let mut s = without_bad_pgmap();
    let image = |pool: &str, name: &str| CreateImageRequest {
        pool: pool.into(),
        name: name.into(),
        size_bytes: 16 * MIB,
        object_size_bytes: None,
    };
    let refused = [
        op(&mut s, |s| s.create_image(&image("bad", "new")).map(|_| ())).unwrap_err(),
        op(&mut s, |s| s.remove_image("bad", "img").map(|_| ())).unwrap_err(),
        op(&mut s, |s| {
            s.resize_image(
                "bad",
                "img",
                &ResizeImageRequest {
                    size_bytes: 32 * MIB,
                    allow_shrink: false,
                },
            )
            .map(|_| ())
        })
        .unwrap_err(),
        op(&mut s, |s| {
            s.leader_elected(
                PgId::new(BAD, 0),
                &LeaderElectedRequest {
                    leader: OsdId(1),
                    term: Term(6),
                    conf_index: LogIndex(0),
                    voters: vec![OsdId(1), OsdId(2), OsdId(3)],
                    voters_outgoing: vec![],
                    learners: vec![],
                },
                Reporter::Osd(OsdId(1)),
            )
            .map(|_| ())
        })
        .unwrap_err(),
    ];
    for e in &refused {
        assert_eq!(e.code, ErrorCode::PoolDamaged, "{e}");
        assert!(!e.retryable);
        assert!(e.message.contains("POOL_PGMAP_MISSING"), "{e}");
        assert!(e.message.contains("pgmaps/2"), "{e}");
    }
    // The image is still there, unchanged; the good pool takes changes.
    assert_eq!(s.image("bad", "img").unwrap().size_bytes, 16 * MIB);
    op(&mut s, |s| s.create_image(&image("good", "new"))).unwrap();
    // pool rm of the damaged pool works, and the damage goes with it.
    let epoch = s.map.epoch;
    op(&mut s, |s| s.delete_pool("bad", true)).unwrap();
    assert!(s.map.epoch > epoch);
    assert!(s.damaged_pools().is_empty());
    assert!(s.image("bad", "img").is_err());
    let h = health(&s, &[]);
    assert_ne!(h.status, "HEALTH_ERR", "{:?}", h.checks);
    assert!(
        !h.checks.iter().any(|c| c.code.starts_with("POOL_")),
        "{:?}",
        h.checks
    );
}

/// A PG map naming an OSD that does not exist is damage too: reported and fenced, while the
/// other pool is still repaired when an OSD goes out.
#[test]
fn a_pg_map_naming_an_unknown_osd_is_fenced() {
    let mut s = cluster();
    let pg = s.map.pgmaps.get_mut(&BAD).unwrap().pgs.get_mut(&3).unwrap();
    pg.osdlist[0] = OsdId(99);
    // As a load does: the derived fields follow the facts, and the damage is looked for.
    s.derive_pg_states();
    s.refresh_damage();
    s.check_invariants();
    let damage = s.damaged_pools();
    assert!(
        matches!(&damage[&BAD], PoolDamage::PgMapInconsistent(why) if why.contains("unknown osd 99")),
        "{damage:?}"
    );
    let h = health(&s, &[]);
    assert_eq!(h.status, "HEALTH_ERR");
    assert!(
        h.checks
            .iter()
            .any(|c| c.to_string().starts_with("POOL_PGMAP_DAMAGED: pool 2")),
        "{:?}",
        h.checks
    );
    let bad_before = s.map.pgmaps[&BAD].clone();
    let held = pools_hold(&s, OsdId(1));
    op(&mut s, |s| s.mark_out(OsdId(1))).unwrap();
    for pg in held.iter().filter(|pg| pg.pool == GOOD) {
        assert!(!s.map.pg(*pg).unwrap().newosdlist.is_empty(), "pg {pg}");
    }
    let mut bad_after = s.map.pgmaps[&BAD].clone();
    // Only derived fields may change in the fenced pool (its PG states follow the OSDs).
    for (seq, pg) in bad_after.pgs.iter_mut() {
        pg.state = bad_before.pgs[seq].state;
        pg.version = bad_before.pgs[seq].version;
    }
    bad_after.version = bad_before.version;
    assert_eq!(bad_after, bad_before, "no target set in the fenced pool");
}

#[test]
#[should_panic(expected = "an operation damaged pool 1")]
fn an_operation_that_damages_a_pool_is_a_monitor_bug() {
    let mut s = cluster();
    let _ = op(&mut s, |s| {
        s.map.pgmaps.remove(&GOOD);
        Ok(())
    });
}

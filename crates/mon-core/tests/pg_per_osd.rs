//! `max_pg_per_osd` in the monitor core (`fastblock_mon_core::pg_per_osd`): a pool over the
//! limit is refused with the count, the limit and what fits, and nothing changes; a second
//! pool counts the first one's PGs; health warns about OSDs over a lowered limit.

mod common;

use common::{boot_osds, op};
use fastblock_mon_core::health::health;
use fastblock_mon_core::limits::PG_PER_OSD_MAX_DEFAULT;
use fastblock_mon_core::pg_per_osd::pgs_per_osd;
use fastblock_mon_core::MonState;
use fastblock_types::api::{CreatePoolRequest, ErrorCode};
use fastblock_types::map::FailureDomain;

fn pool(name: &str, pg_count: u32) -> CreatePoolRequest {
    CreatePoolRequest {
        name: name.into(),
        pg_count,
        size: 3,
        failure_domain: FailureDomain::Osd,
    }
}

fn four_osds() -> MonState {
    let mut s = MonState::default();
    boot_osds(&mut s, 4);
    s
}

#[test]
fn a_pool_over_the_limit_is_refused_naming_the_count_and_the_limit() {
    let mut s = four_osds();
    let before = s.clone();
    let e = op(&mut s, |s| {
        s.create_pool_within(&pool("big", 4096), PG_PER_OSD_MAX_DEFAULT)
    })
    .unwrap_err();
    assert_eq!(e.code, ErrorCode::TooManyPgs);
    // 4,096 PGs of 3 on 4 OSDs: 3,072 each; 333 fit.
    assert!(e.message.contains("would put 3072 PG replicas"), "{e}");
    assert!(e.message.contains("max_pg_per_osd 250"), "{e}");
    assert!(e.message.contains("about 333 fit"), "{e}");
    assert_eq!(s, before, "a refused pool changes nothing");
    // Within the limit: created, and a second pool counts the first one's PGs.
    op(&mut s, |s| {
        s.create_pool_within(&pool("a", 256), PG_PER_OSD_MAX_DEFAULT)
    })
    .unwrap();
    assert_eq!(pgs_per_osd(&s.map).values().sum::<u32>(), 256 * 3);
    let e = op(&mut s, |s| {
        s.create_pool_within(&pool("b", 128), PG_PER_OSD_MAX_DEFAULT)
    })
    .unwrap_err();
    assert!(e.message.contains("about 77 fit"), "{e}");
    op(&mut s, |s| {
        s.create_pool_within(&pool("b", 64), PG_PER_OSD_MAX_DEFAULT)
    })
    .unwrap();
    op(&mut s, |s| s.create_pool_within(&pool("c", 4096), 4096 * 3)).unwrap();
}

#[test]
fn health_warns_about_osds_over_the_limit() {
    let mut s = four_osds();
    op(&mut s, |s| {
        s.create_pool_within(&pool("a", 256), PG_PER_OSD_MAX_DEFAULT)
    })
    .unwrap();
    let mut h = health(&s, &[]);
    h.add_too_many_pgs(&s.map, PG_PER_OSD_MAX_DEFAULT);
    assert!(h.checks.iter().all(|c| c.code != "TOO_MANY_PGS"), "{h:?}");
    // The limit lowered: every OSD carries 192.
    h.add_too_many_pgs(&s.map, 100);
    let c = h.checks.iter().find(|c| c.code == "TOO_MANY_PGS").unwrap();
    assert_eq!(
        c.summary,
        "4 osds carry more than 100 PG replicas (max_pg_per_osd)"
    );
    assert_eq!(c.detail[0], "osd.1 carries 192 PG replicas");
    assert_eq!(h.status, "HEALTH_WARN");
}

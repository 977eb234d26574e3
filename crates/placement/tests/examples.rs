//! Small, readable examples of placement, repair and rebalance on hand-built clusters.

mod common;

use common::*;
use fastblock_placement::{load, place_pool, rebalance, repair, PlacementError};
use fastblock_types::map::FailureDomain;
use fastblock_types::OsdId;
use std::collections::BTreeSet;

use Status::{In, Out, Pending};

/// Three OSDs, eight PGs of size 3: every PG holds all three OSDs, and the preferred leaders
/// split 3/3/2.
#[test]
fn three_osds_eight_pgs_size_three() {
    let osds = cluster(&[vec![In], vec![In], vec![In]]);
    let lists = place_pool(&spec(1, 8, 3, FailureDomain::Osd), &osds).unwrap();
    for list in &lists {
        let set: BTreeSet<OsdId> = list.iter().copied().collect();
        assert_eq!(set, BTreeSet::from([OsdId(1), OsdId(2), OsdId(3)]));
    }
    let counts = load(&as_map(&lists));
    let mut primaries: Vec<u32> = counts.values().map(|c| c.1).collect();
    primaries.sort_unstable();
    assert_eq!(primaries, vec![2, 3, 3]);
    assert!(counts.values().all(|c| c.0 == 8));
}

/// Six OSDs on three hosts, host domain, size 3: every PG has one OSD on each host; each OSD
/// holds half of the PGs, and leaders are spread within one.
#[test]
fn six_osds_three_hosts_host_domain() {
    let osds = cluster(&[vec![In, In], vec![In, In], vec![In, In]]);
    let lists = place_pool(&spec(1, 64, 3, FailureDomain::Host), &osds).unwrap();
    for list in &lists {
        assert!(
            distinct_domains(FailureDomain::Host, list, &osds),
            "{list:?}"
        );
    }
    let map = as_map(&lists);
    let counts = target_loads(&map, &osds);
    assert!(counts.values().all(|c| c.0 == 32), "{counts:?}");
    assert!(spreads(&map, &osds).1 <= 1);
}

/// Out and pending OSDs are never chosen; down OSDs are (being down is temporary).
#[test]
fn only_in_created_osds_are_targets() {
    let mut osds = cluster(&[vec![In, Out, Pending, In]]);
    osds.get_mut(&OsdId(4)).unwrap().up = false;
    let lists = place_pool(&spec(1, 16, 2, FailureDomain::Osd), &osds).unwrap();
    for list in &lists {
        let mut sorted = list.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, vec![OsdId(1), OsdId(4)]);
    }
}

/// Too few domains is an error that says how many exist; a zero size or PG count is invalid.
#[test]
fn impossible_pools_are_errors() {
    let osds = cluster(&[vec![In, In, In], vec![In]]);
    assert_eq!(
        place_pool(&spec(1, 8, 3, FailureDomain::Host), &osds),
        Err(PlacementError::NotEnoughDomains {
            size: 3,
            available: 2,
            domain: FailureDomain::Host
        })
    );
    assert!(place_pool(&spec(1, 8, 3, FailureDomain::Osd), &osds).is_ok());
    assert!(matches!(
        place_pool(&spec(1, 8, 0, FailureDomain::Osd), &osds),
        Err(PlacementError::Invalid(_))
    ));
    assert!(matches!(
        place_pool(&spec(1, 0, 1, FailureDomain::Osd), &osds),
        Err(PlacementError::Invalid(_))
    ));
}

/// Different pools on the same cluster do not all start on the same OSDs.
#[test]
fn pools_differ() {
    let osds = cluster(&[vec![In; 3], vec![In; 3], vec![In; 3]]);
    let firsts: BTreeSet<Vec<OsdId>> = (1..=8)
        .map(|pool| place_pool(&spec(pool, 4, 2, FailureDomain::Osd), &osds).unwrap()[0].clone())
        .collect();
    assert!(firsts.len() > 4, "{firsts:?}");
}

/// Four OSDs, size 3; OSD 2 goes out: each PG that held it gets OSD 2's slot filled by the
/// OSD it lacked, and nothing else changes. With only three OSDs, an out member stays (the PG
/// is degraded, not shrunk); a short PG is filled.
#[test]
fn repair_replaces_in_place_or_keeps_the_out_member() {
    let mut osds = cluster(&[vec![In], vec![In], vec![In], vec![In]]);
    let s = spec(1, 8, 3, FailureDomain::Osd);
    let before = as_map(&place_pool(&s, &osds).unwrap());
    osds.get_mut(&OsdId(2)).unwrap().is_in = false;
    let changes = repair(&s, &before, &osds);
    for (seq, old) in &before {
        match old.iter().position(|&o| o == OsdId(2)) {
            None => assert!(!changes.contains_key(seq)),
            Some(p) => {
                let new = &changes[seq];
                let missing = [1, 3, 4].map(OsdId).into_iter().find(|o| !old.contains(o));
                assert_eq!(Some(new[p]), missing);
                assert_eq!(new.len(), 3);
            }
        }
    }

    let mut small = cluster(&[vec![In], vec![In], vec![In]]);
    let before = as_map(&[vec![OsdId(1), OsdId(2), OsdId(3)], vec![OsdId(3)]]);
    small.get_mut(&OsdId(2)).unwrap().is_in = false;
    let changes = repair(&s, &before, &small);
    assert!(
        !changes.contains_key(&0),
        "no candidate: the out member stays"
    );
    assert_eq!(changes[&1].len(), 2, "the short PG gets the only free OSD");
    assert_eq!(
        changes[&1][0],
        OsdId(3),
        "existing members keep their position"
    );
}

/// A fourth OSD joins three OSDs holding eight PGs of size 2: it receives its fair share
/// (4 of 16) with exactly four moves, and only movable PGs change.
#[test]
fn rebalance_fills_a_new_osd_with_its_fair_share() {
    let mut osds = cluster(&[vec![In], vec![In], vec![In]]);
    let s = spec(1, 8, 2, FailureDomain::Osd);
    let before = as_map(&place_pool(&s, &osds).unwrap());
    osds.insert(OsdId(4), osd(4, "host-3", In));
    let all: BTreeSet<u32> = (0..8).collect();
    let changes = rebalance(&s, &before, &osds, &all, usize::MAX);
    let after = merged(&before, &changes);
    assert_eq!(target_loads(&after, &osds)[&OsdId(4)].0, 4);
    assert_eq!(moved_positions(&before, &changes), 4);
    assert_eq!(spreads(&after, &osds).0, 0);
    // The new OSD also takes a fair share of the preferred leaders.
    assert!(
        spreads(&after, &osds).1 <= 1,
        "{:?}",
        target_loads(&after, &osds)
    );

    let some: BTreeSet<u32> = (0..4).collect();
    let changes = rebalance(&s, &before, &osds, &some, 2);
    assert!(changes.keys().all(|s| some.contains(s)));
    assert_eq!(moved_positions(&before, &changes), 2);
    assert!(rebalance(&s, &before, &osds, &all, 0).is_empty());
}

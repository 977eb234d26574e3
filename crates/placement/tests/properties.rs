//! Property tests over random clusters: 1..=12 hosts of 1..=4 OSDs, some out or pending,
//! pg_count 1..=256, size 1..=3, both failure domains. Each property states the bound it holds
//! the algorithms to; `docs/design/placement.md` explains why each bound holds.

mod common;

use common::*;
use fastblock_placement::{place_pool, rebalance, repair, PlacementError};
use fastblock_types::map::FailureDomain;
use fastblock_types::osd_table::OsdTable;
use fastblock_types::OsdId;
use proptest::prelude::*;
use std::collections::BTreeSet;

/// 96 cases per property keeps the suite near a second; `PROPTEST_CASES=5000` for a soak run.
fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(96);
    ProptestConfig {
        cases,
        // Random clusters often have too few domains for the pool size; a long soak must not
        // stop on the number of such skipped cases.
        max_global_rejects: cases.saturating_mul(4).max(1024),
        ..ProptestConfig::default()
    }
}

/// Host balance with unequal hosts: OSDs inside a host are within 1 of each other, and for any
/// hosts a and b, `l_a / w_a <= (l_b + 1) / w_b + 1` (loads l, target-OSD counts w), unless b
/// already holds a member of every PG and so cannot take more.
fn check_weighted_hosts(
    lists: &std::collections::BTreeMap<u32, Vec<OsdId>>,
    osds: &OsdTable,
    pg_count: u32,
) -> Result<(), TestCaseError> {
    let loads = target_loads(lists, osds);
    let mut per_host: std::collections::BTreeMap<String, Vec<u32>> = Default::default();
    for (osd, (members, _)) in &loads {
        per_host
            .entry(osds[osd].host.clone())
            .or_default()
            .push(*members);
    }
    for (host, members) in &per_host {
        prop_assert!(
            spread(members.iter().copied()) <= 1,
            "{} {:?}",
            host,
            members
        );
    }
    for (a, la) in &per_host {
        for (b, lb) in &per_host {
            let (la_sum, wa) = (la.iter().sum::<u32>() as u64, la.len() as u64);
            let (lb_sum, wb) = (lb.iter().sum::<u32>() as u64, lb.len() as u64);
            if lb_sum == pg_count as u64 {
                continue;
            }
            prop_assert!(
                la_sum * wb <= (lb_sum + 1) * wa + wa * wb,
                "host {} {:?} vs host {} {:?}",
                a,
                la,
                b,
                lb
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    /// Goal: every placed PG is well formed. Method: place a random pool on a random cluster;
    /// it fails exactly when there are fewer domains than replicas, and otherwise every PG has
    /// `size` placement-target members in distinct domains. Same input, same output.
    #[test]
    fn place_pool_is_well_formed_and_deterministic(
        hosts in hosts_strategy(), domain in domain_strategy(),
        pool in 1u32..=5, pg_count in 1u32..=256, size in 1u32..=3,
    ) {
        let osds = cluster(&hosts);
        let spec = spec(pool, pg_count, size, domain);
        let available = domain_count(domain, &osds);
        let result = place_pool(&spec, &osds);
        prop_assert_eq!(&result, &place_pool(&spec, &osds));
        if available < size {
            prop_assert_eq!(
                result,
                Err(PlacementError::NotEnoughDomains { size, available, domain })
            );
            return Ok(());
        }
        let lists = result.unwrap();
        prop_assert_eq!(lists.len(), pg_count as usize);
        let targets: BTreeSet<OsdId> = targets_of(&osds).into_iter().collect();
        for list in &lists {
            prop_assert_eq!(list.len(), size as usize);
            prop_assert!(distinct_domains(domain, list, &osds), "{:?}", list);
            prop_assert!(list.iter().all(|o| targets.contains(o)), "{:?}", list);
        }
    }

    /// Goal: the `Osd` domain spreads members and preferred leaders within 1. Method: place
    /// and count per target OSD, idle OSDs included.
    #[test]
    fn osd_domain_spread_is_at_most_one(
        hosts in hosts_strategy(), pool in 1u32..=5, pg_count in 1u32..=256, size in 1u32..=3,
    ) {
        let osds = cluster(&hosts);
        let spec = spec(pool, pg_count, size, FailureDomain::Osd);
        prop_assume!(domain_count(FailureDomain::Osd, &osds) >= size);
        let lists = as_map(&place_pool(&spec, &osds).unwrap());
        let (members, primaries) = spreads(&lists, &osds);
        prop_assert!(members <= 1, "member spread {}", members);
        prop_assert!(primaries <= 1, "primary spread {}", primaries);
    }

    /// Goal: with hosts of equal size, the `Host` domain spreads members within 1 per host and
    /// per OSD, and primaries within 1 per OSD.
    #[test]
    fn host_domain_with_equal_hosts_spreads_within_one(
        host_count in 1usize..=12, per_host in 1usize..=4,
        pool in 1u32..=5, pg_count in 1u32..=256, size in 1u32..=3,
    ) {
        prop_assume!(host_count as u32 >= size);
        let osds = cluster(&vec![vec![Status::In; per_host]; host_count]);
        let spec = spec(pool, pg_count, size, FailureDomain::Host);
        let lists = as_map(&place_pool(&spec, &osds).unwrap());
        let hosts = host_loads(&lists, &osds);
        prop_assert!(spread(hosts.values().copied()) <= 1, "hosts {:?}", hosts);
        let (members, primaries) = spreads(&lists, &osds);
        prop_assert!(members <= 1, "member spread {}", members);
        prop_assert!(primaries <= 1, "primary spread {}", primaries);
    }

    /// Goal: with hosts of unequal size, OSDs inside a host stay within 1 of each other, and
    /// big hosts carry more: no host's load per OSD exceeds another's by more than 1 member
    /// per OSD plus one, unless the lighter host already holds a member of every PG.
    #[test]
    fn host_domain_with_unequal_hosts_is_weighted(
        hosts in hosts_strategy(), pool in 1u32..=5, pg_count in 1u32..=256, size in 1u32..=3,
    ) {
        let osds = cluster(&hosts);
        let spec = spec(pool, pg_count, size, FailureDomain::Host);
        prop_assume!(domain_count(FailureDomain::Host, &osds) >= size);
        let lists = as_map(&place_pool(&spec, &osds).unwrap());
        check_weighted_hosts(&lists, &osds, pg_count)?;
    }

    /// Goal: repair after one OSD goes out moves only what it must. Method: place, mark one
    /// target OSD out, repair; only PGs that held it change, only at its position, domains
    /// stay distinct, and with the `Osd` domain the member spread stays within 2.
    #[test]
    fn repair_after_one_out_changes_only_that_member(
        hosts in hosts_strategy(), domain in domain_strategy(),
        pool in 1u32..=5, pg_count in 1u32..=256, size in 1u32..=3, pick in any::<prop::sample::Index>(),
    ) {
        let mut osds = cluster(&hosts);
        let spec = spec(pool, pg_count, size, domain);
        prop_assume!(domain_count(domain, &osds) >= size);
        let before = as_map(&place_pool(&spec, &osds).unwrap());
        let victim = *pick.get(&targets_of(&osds));
        osds.get_mut(&victim).unwrap().is_in = false;
        let changes = repair(&spec, &before, &osds);
        prop_assert_eq!(&changes, &repair(&spec, &before, &osds));
        let can_replace = domain_count(domain, &osds) >= size;
        for (seq, old) in &before {
            let Some(new) = changes.get(seq) else {
                prop_assert!(!old.contains(&victim) || !can_replace, "pg {} not repaired", seq);
                continue;
            };
            let position = old.iter().position(|&o| o == victim);
            prop_assert!(position.is_some(), "pg {} did not hold the victim", seq);
            let position = position.unwrap();
            prop_assert_eq!(new.len(), old.len());
            for (p, (a, b)) in old.iter().zip(new).enumerate() {
                prop_assert_eq!(p == position, a != b, "pg {} {:?} -> {:?}", seq, old, new);
            }
            prop_assert!(distinct_domains(domain, new, &osds), "{:?}", new);
        }
        if domain == FailureDomain::Osd && can_replace {
            let after = merged(&before, &changes);
            let (members, _) = spreads(&after, &osds);
            prop_assert!(members <= 2, "member spread {} after repair", members);
        }
    }

    /// Goal: a new empty OSD gets its fair share with about that many moves. Method: place,
    /// add an OSD (on a new host, or on an existing host for the `Host` domain), rebalance with
    /// every PG movable; count changed positions.
    #[test]
    fn rebalance_after_adding_an_osd_is_near_minimal(
        hosts in hosts_strategy(), domain in domain_strategy(), new_host in any::<prop::sample::Index>(),
        on_new_host in any::<bool>(), pool in 1u32..=5, pg_count in 1u32..=256, size in 1u32..=3,
    ) {
        let mut osds = cluster(&hosts);
        let spec = spec(pool, pg_count, size, domain);
        prop_assume!(domain_count(domain, &osds) >= size);
        let before = as_map(&place_pool(&spec, &osds).unwrap());
        let id = osds.keys().last().unwrap().get() + 1;
        let host = if on_new_host {
            "host-new".to_string()
        } else {
            format!("host-{}", new_host.index(hosts.len()))
        };
        osds.insert(OsdId(id), osd(id, &host, Status::In));
        let movable: BTreeSet<u32> = before.keys().copied().collect();
        let changes = rebalance(&spec, &before, &osds, &movable, usize::MAX);
        prop_assert_eq!(&changes, &rebalance(&spec, &before, &osds, &movable, usize::MAX));
        let after = merged(&before, &changes);
        for list in after.values() {
            prop_assert!(distinct_domains(domain, list, &osds), "{:?}", list);
        }
        let total = pg_count * size;
        let n = targets_of(&osds).len() as u32;
        let fair = total.div_ceil(n) as usize;
        let moves = moved_positions(&before, &changes);
        let new_load = target_loads(&after, &osds)[&OsdId(id)].0 as usize;
        // Nearly every move lands on the new OSD: its final load is the minimum number of moves.
        // With the `Host` domain a host that already holds most PGs can only be reached through
        // chains (A -> C, C -> host), so the bound there is looser.
        if domain == FailureDomain::Osd {
            prop_assert!(moves <= new_load + 2, "moves {} new osd holds {}", moves, new_load);
            prop_assert!(moves <= fair + 2, "moves {} fair {}", moves, fair);
            prop_assert!(spreads(&after, &osds).0 <= 1, "spread {:?}", spreads(&after, &osds));
        } else {
            prop_assert!(moves <= 2 * new_load + 2, "moves {} new osd holds {}", moves, new_load);
            check_weighted_hosts(&after, &osds, pg_count)?;
        }
    }

    /// Goal: an OSD that goes out and comes back in is repaired away and then rebalanced back
    /// with about its fair share of moves, ending with spread within 1 (`Osd` domain).
    #[test]
    fn out_then_in_round_trip(
        hosts in hosts_strategy(), domain in domain_strategy(),
        pool in 1u32..=5, pg_count in 1u32..=256, size in 1u32..=3, pick in any::<prop::sample::Index>(),
    ) {
        let mut osds = cluster(&hosts);
        let spec = spec(pool, pg_count, size, domain);
        prop_assume!(!targets_of(&osds).is_empty());
        let victim = *pick.get(&targets_of(&osds));
        osds.get_mut(&victim).unwrap().is_in = false;
        prop_assume!(domain_count(domain, &osds) >= size);
        osds.get_mut(&victim).unwrap().is_in = true;
        let placed = as_map(&place_pool(&spec, &osds).unwrap());
        osds.get_mut(&victim).unwrap().is_in = false;
        let repaired = merged(&placed, &repair(&spec, &placed, &osds));
        prop_assert!(repaired.values().all(|l| !l.contains(&victim)));
        osds.get_mut(&victim).unwrap().is_in = true;
        let movable: BTreeSet<u32> = repaired.keys().copied().collect();
        let changes = rebalance(&spec, &repaired, &osds, &movable, usize::MAX);
        let after = merged(&repaired, &changes);
        let fair = (pg_count * size).div_ceil(targets_of(&osds).len() as u32) as usize;
        let moves = moved_positions(&repaired, &changes);
        let back = target_loads(&after, &osds)[&victim].0 as usize;
        if domain == FailureDomain::Osd {
            prop_assert!(moves <= back + 2, "moves {} returning osd holds {}", moves, back);
            prop_assert!(moves <= fair + 2, "moves {} fair {}", moves, fair);
            prop_assert!(spreads(&after, &osds).0 <= 1, "spread {:?}", spreads(&after, &osds));
        } else {
            prop_assert!(moves <= 2 * back + 2, "moves {} returning osd holds {}", moves, back);
            check_weighted_hosts(&after, &osds, pg_count)?;
        }
    }

    /// Goal: rebalance respects `movable` and `moves_max`. Method: random subset movable and a
    /// random move budget after adding an OSD; nothing outside the subset changes, and no more
    /// positions change than the budget allows.
    #[test]
    fn rebalance_respects_movable_and_budget(
        hosts in hosts_strategy(), domain in domain_strategy(), pool in 1u32..=5,
        pg_count in 1u32..=256, size in 1u32..=3, mask in any::<u64>(), moves_max in 0usize..=16,
    ) {
        let mut osds = cluster(&hosts);
        let spec = spec(pool, pg_count, size, domain);
        prop_assume!(domain_count(domain, &osds) >= size);
        let before = as_map(&place_pool(&spec, &osds).unwrap());
        let id = osds.keys().last().unwrap().get() + 1;
        osds.insert(OsdId(id), osd(id, "host-new", Status::In));
        let movable: BTreeSet<u32> = before.keys().copied().filter(|s| mask >> (s % 64) & 1 == 1).collect();
        let changes = rebalance(&spec, &before, &osds, &movable, moves_max);
        prop_assert!(changes.keys().all(|s| movable.contains(s)));
        prop_assert!(moved_positions(&before, &changes) <= moves_max);
        for (seq, list) in &changes {
            prop_assert_ne!(list, &before[seq]);
            prop_assert!(distinct_domains(domain, list, &osds), "{:?}", list);
        }
    }
}

//! Repair: replace members that stopped being placement targets, and fill short PGs.
//!
//! Each replacement takes the removed member's position, so the members that stay keep theirs
//! (and a preferred leader stays the preferred leader). A PG for which no candidate exists keeps
//! its out member: it stays degraded rather than shrinking, and a later call (after an OSD comes
//! in) repairs it. Candidates are chosen with the same rule as initial placement, against the
//! pool's current loads, updated after every replacement of this call.

use crate::choose::{choose_member, Loads};
use crate::domains::{domain_key, Topology};
use crate::PoolSpec;
use fastblock_types::map::FailureDomain;
use fastblock_types::osd_table::OsdTable;
use fastblock_types::OsdId;
use std::collections::BTreeMap;

pub fn repair(
    spec: &PoolSpec,
    targets: &BTreeMap<u32, Vec<OsdId>>,
    osds: &OsdTable,
) -> BTreeMap<u32, Vec<OsdId>> {
    let topo = Topology::new(spec.failure_domain, osds);
    let mut loads = Loads::new(&topo, topo.member_loads(targets.values()));
    let mut changed = BTreeMap::new();
    let mut filled: Vec<(u32, usize)> = Vec::new();
    for (&seq, members) in targets {
        let mut list = members.clone();
        let mut inserted: Vec<usize> = Vec::new();
        replace_non_targets(spec, &topo, osds, &mut loads, seq, &mut list, &mut inserted);
        while list.len() < spec.size as usize {
            let used = used_domains(&topo, osds, &list, None);
            let Some(i) = choose_member(&topo, &loads, spec.pool.get(), seq, &used) else {
                break;
            };
            loads.add(&topo, i);
            list.push(topo.osds[i]);
            inserted.push(list.len() - 1);
        }
        if list != *members {
            assert!(!inserted.is_empty());
            assert_inserted_distinct(spec, osds, seq, &list, &inserted);
            filled.extend(inserted.iter().map(|&p| (seq, p)));
            changed.insert(seq, list);
        } else {
            assert!(inserted.is_empty());
        }
    }
    improve(spec, &topo, osds, targets, &mut changed, &filled);
    changed
}

/// Greedy choices made PG by PG can pile replacements on a few OSDs. Moves a slot this call
/// filled to an allowed OSD holding at least two memberships fewer, until no such move exists
/// (each move lowers the sum of squared loads, so this ends). Only filled slots move, so members
/// that stayed keep their places; in the Host domain a slot moves only within its host, so host
/// balance is untouched.
fn improve(
    spec: &PoolSpec,
    topo: &Topology,
    osds: &OsdTable,
    targets: &BTreeMap<u32, Vec<OsdId>>,
    changed: &mut BTreeMap<u32, Vec<OsdId>>,
    filled: &[(u32, usize)],
) {
    // Loads by target index (a filled slot always holds a target).
    let mut load = vec![0u64; topo.osds.len()];
    for (seq, list) in targets {
        for osd in changed.get(seq).unwrap_or(list) {
            if let Some(i) = topo.target_index(*osd) {
                load[i] += 1;
            }
        }
    }
    let index_of = |osd: OsdId| {
        topo.target_index(osd)
            .expect("a filled slot holds a placement target")
    };
    let moves_max = filled.len() * topo.osds.len();
    for _ in 0..moves_max {
        // No move gains anything unless some filled slot's OSD holds two more than the least
        // loaded target: checked first, as it is the common case and costs one pass.
        let least = load.iter().copied().min().unwrap_or(0);
        let worth = filled
            .iter()
            .any(|&(seq, position)| load[index_of(changed[&seq][position])] >= least + 2);
        if !worth {
            return;
        }
        let mut best: Option<(u32, usize, usize, u64)> = None;
        for &(seq, position) in filled {
            let list = &changed[&seq];
            let current = index_of(list[position]);
            if load[current] < least + 2 {
                continue;
            }
            let candidates: &[usize] = match spec.failure_domain {
                // A slot moves only within its host: host balance is untouched.
                FailureDomain::Host => &topo.domains[topo.osd_domain[current]].members,
                FailureDomain::Osd => &all_targets(topo),
            };
            let used = match spec.failure_domain {
                FailureDomain::Osd => Some(used_domains(topo, osds, list, Some(position))),
                FailureDomain::Host => None,
            };
            for &candidate in candidates {
                let allowed = match &used {
                    Some(used) => !used[topo.osd_domain[candidate]],
                    None => !list.contains(&topo.osds[candidate]),
                };
                let gain = load[current].saturating_sub(load[candidate]);
                if allowed && gain >= 2 && best.is_none_or(|b| gain > b.3) {
                    best = Some((seq, position, candidate, gain));
                }
            }
        }
        let Some((seq, position, candidate, _)) = best else {
            return;
        };
        let list = changed
            .get_mut(&seq)
            .expect("filled slots are in changed PGs");
        load[index_of(list[position])] -= 1;
        load[candidate] += 1;
        list[position] = topo.osds[candidate];
        assert_inserted_distinct(spec, osds, seq, list, &[position]);
    }
}

/// Every target index, `0..osds.len()`.
fn all_targets(topo: &Topology) -> Vec<usize> {
    (0..topo.osds.len()).collect()
}

/// Replaces every non-target member for which a candidate exists, in position order. A slot
/// that finds no candidate is retried after the others, because replacing a later out member
/// can free the domain it was blocking.
fn replace_non_targets(
    spec: &PoolSpec,
    topo: &Topology,
    osds: &OsdTable,
    loads: &mut Loads,
    seq: u32,
    list: &mut [OsdId],
    inserted: &mut Vec<usize>,
) {
    loop {
        let mut progress = false;
        for position in 0..list.len() {
            if topo.target_index(list[position]).is_some() {
                continue;
            }
            let used = used_domains(topo, osds, list, Some(position));
            if let Some(i) = choose_member(topo, loads, spec.pool.get(), seq, &used) {
                loads.add(topo, i);
                list[position] = topo.osds[i];
                inserted.push(position);
                progress = true;
            }
        }
        if !progress {
            return;
        }
    }
}

/// Per-domain flags: the domains occupied by the members of `list`, except position `skip`.
/// Out members still occupy their domain (they stay in the list until replaced).
fn used_domains(
    topo: &Topology,
    osds: &OsdTable,
    list: &[OsdId],
    skip: Option<usize>,
) -> Vec<bool> {
    let mut used = vec![false; topo.domains.len()];
    for (position, &osd) in list.iter().enumerate() {
        if Some(position) == skip {
            continue;
        }
        if let Some(d) = topo.domain_of(osd, osds) {
            used[d] = true;
        }
    }
    used
}

/// Every member this call put in shares its domain with no other member. (Members that were
/// already there are the caller's; a bad input list is not made worse, and not asserted on.)
fn assert_inserted_distinct(
    spec: &PoolSpec,
    osds: &OsdTable,
    seq: u32,
    list: &[OsdId],
    inserted: &[usize],
) {
    for &p in inserted {
        let key = domain_key(spec.failure_domain, list[p], osds);
        for (q, &other) in list.iter().enumerate() {
            assert!(
                q == p || domain_key(spec.failure_domain, other, osds) != key,
                "pool {} pg {seq}: new member {} shares a domain with {other}: {list:?}",
                spec.pool,
                list[p]
            );
        }
    }
}

//! Initial placement of every PG of a new pool.
//!
//! Greedy, one PG at a time in seq order: pick `size` distinct domains by smallest marginal
//! weighted load, the least-loaded OSD inside each, and the member with the fewest primaries
//! so far as the preferred leader. Then a primary pass ([`crate::primaries`]) removes any
//! remaining primary imbalance by swapping positions within PGs.
//!
//! Why the greedy member choice is balanced: with equal domain weights, picking the `size`
//! least-loaded of `D >= size` domains keeps all domain loads within one of each other (if the
//! loads are `k` and `k + 1`, the chosen ones are the `k`s first). Inside a domain, OSDs are
//! filled least-loaded first, so they stay within one too; with equal-size domains that gives a
//! per-OSD spread of at most 1 overall.

use crate::choose::{choose_member, Loads};
use crate::domains::{domains_distinct, Topology};
use crate::primaries::balance_primaries;
use crate::{hash, PlacementError, PoolSpec};
use fastblock_types::osd_table::OsdTable;
use fastblock_types::OsdId;

pub fn place_pool(spec: &PoolSpec, osds: &OsdTable) -> Result<Vec<Vec<OsdId>>, PlacementError> {
    spec.validate()?;
    let topo = Topology::new(spec.failure_domain, osds);
    let available = u32::try_from(topo.domains.len()).unwrap_or(u32::MAX);
    if available < spec.size {
        return Err(PlacementError::NotEnoughDomains {
            size: spec.size,
            available,
            domain: spec.failure_domain,
        });
    }
    let pool = spec.pool.get();
    let mut loads = Loads::new(&topo, vec![0; topo.osds.len()]);
    let mut primaries = vec![0u64; topo.osds.len()];
    let mut lists: Vec<Vec<OsdId>> = Vec::with_capacity(spec.pg_count as usize);
    let forced = saturated_domains(&topo, spec.size);
    for seq in 0..spec.pg_count {
        let mut used = vec![false; topo.domains.len()];
        let mut chosen: Vec<usize> = Vec::with_capacity(spec.size as usize);
        for &d in &forced {
            // Only domain `d` is open: choose_member picks its least-loaded OSD.
            let only_d: Vec<bool> = (0..topo.domains.len()).map(|x| x != d).collect();
            let i = choose_member(&topo, &loads, pool, seq, &only_d).expect("domain is not empty");
            used[d] = true;
            loads.add(&topo, i);
            chosen.push(i);
        }
        while chosen.len() < spec.size as usize {
            let i = choose_member(&topo, &loads, pool, seq, &used)
                .expect("enough domains was checked above");
            used[topo.osd_domain[i]] = true;
            loads.add(&topo, i);
            chosen.push(i);
        }
        // The preferred leader: fewest primaries, then fewest members, then the hash.
        let lead = (0..chosen.len())
            .min_by_key(|&p| {
                let i = chosen[p];
                (
                    primaries[i],
                    loads.osd[i],
                    hash::tie(pool, seq, u64::from(topo.osds[i].get())),
                )
            })
            .expect("size >= 1");
        chosen.swap(0, lead);
        primaries[chosen[0]] += 1;
        lists.push(chosen.iter().map(|&i| topo.osds[i]).collect());
    }
    balance_primaries(&mut lists);

    assert_eq!(lists.len(), spec.pg_count as usize);
    for (seq, list) in lists.iter().enumerate() {
        assert_eq!(
            list.len(),
            spec.size as usize,
            "pool {} pg {seq}",
            spec.pool
        );
        assert!(
            domains_distinct(spec.failure_domain, list, osds),
            "pool {} pg {seq}: replicas share a failure domain: {list:?}",
            spec.pool
        );
        assert!(list.iter().all(|o| topo.target_index(*o).is_some()));
    }
    Ok(lists)
}

/// Domains whose weighted share is at least one member of every PG (water-filling: a domain
/// holding more OSDs than its `1 / size` share can take at most one member per PG, and its
/// excess share goes to the others, which may saturate in turn). They go into every PG first;
/// left to the greedy rule, a saturated domain can miss a PG, which then lands on a small
/// domain far above its share.
fn saturated_domains(topo: &Topology, size: u32) -> Vec<usize> {
    let mut forced: Vec<usize> = Vec::new();
    loop {
        let slots = u64::from(size) - forced.len() as u64;
        let weight: u64 = (0..topo.domains.len())
            .filter(|d| !forced.contains(d))
            .map(|d| topo.domains[d].weight())
            .sum();
        if slots == 0 || weight == 0 {
            return forced;
        }
        let newly: Vec<usize> = (0..topo.domains.len())
            .filter(|d| !forced.contains(d) && topo.domains[*d].weight() * slots >= weight)
            .collect();
        if newly.is_empty() {
            return forced;
        }
        forced.extend(newly);
        if forced.len() as u64 >= u64::from(size) {
            forced.truncate(size as usize);
            return forced;
        }
    }
}

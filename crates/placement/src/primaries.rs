//! Balancing preferred leaders (position 0) without changing any PG's member set.
//!
//! Choosing a primary for every PG among its own members is a *semi-matching* problem (each PG
//! is assigned to one of its members). An assignment minimises every convex cost of the
//! per-OSD primary counts at once, in particular the spread, if and only if there is no
//! *cost-reducing path*: a chain `u -> v1 -> ... -> v` where each step moves the primary of a
//! PG led by the previous OSD to another member of that PG, ending at an OSD `v` with
//! `count(v) <= count(u) - 2` (Harvey, Ladner, Lovász, Tamir, "Semi-matchings for bipartite
//! graphs and load balancing", 2006). Shifting along such a path lowers `u` by one, raises `v`
//! by one and leaves the OSDs in between unchanged, so the sum of squares falls by at least 2
//! and the loop terminates.
//!
//! When member counts are balanced within 1 (`Osd` domain, or hosts of equal size), a primary
//! assignment with spread at most 1 exists (Hall's condition holds for the floor and the ceiling
//! of the mean), so the fixpoint has primary spread at most 1.

use fastblock_types::OsdId;
use std::collections::{BTreeMap, VecDeque};

/// Reorders members so that position 0 of each list is balanced across OSDs. Only swaps
/// positions within a list: every list keeps its member set.
pub(crate) fn balance_primaries(lists: &mut [Vec<OsdId>]) {
    // Dense indices for the OSDs that appear anywhere.
    let ids: Vec<OsdId> = {
        let mut v: Vec<OsdId> = lists.iter().flatten().copied().collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    let index: BTreeMap<OsdId, usize> = ids.iter().enumerate().map(|(i, &o)| (o, i)).collect();
    let mut count = vec![0u64; ids.len()];
    // led[u] = PGs whose primary is u (kept as a list; entries are removed on shift).
    let mut led: Vec<Vec<usize>> = vec![Vec::new(); ids.len()];
    for (pg, list) in lists.iter().enumerate() {
        if let Some(first) = list.first() {
            let u = index[first];
            count[u] += 1;
            led[u].push(pg);
        }
    }
    while let Some(path) = find_reducing_path(lists, &index, &count, &led) {
        apply_path(lists, &index, &mut count, &mut led, &path);
    }
}

/// A reducing path as its steps `(pg, new primary index)`, in order from the overloaded OSD.
type Path = Vec<(usize, usize)>;

fn find_reducing_path(
    lists: &[Vec<OsdId>],
    index: &BTreeMap<OsdId, usize>,
    count: &[u64],
    led: &[Vec<usize>],
) -> Option<Path> {
    // Start from the most loaded OSDs first (ties: lowest index), so big imbalances go first.
    // A path ends at an OSD with at least two fewer primaries than its start, so only starts
    // two above the least loaded OSD can have one: once the spread is 1 or less, no search
    // runs at all (each search visits up to every PG).
    let least = count.iter().copied().min().unwrap_or(0);
    let mut starts: Vec<usize> = (0..count.len())
        .filter(|&u| count[u] >= least + 2)
        .collect();
    starts.sort_by_key(|&u| (std::cmp::Reverse(count[u]), u));
    for &start in &starts {
        // Breadth-first search; parent[v] = (previous OSD, PG) of the step into v.
        let mut parent: Vec<Option<(usize, usize)>> = vec![None; count.len()];
        let mut seen = vec![false; count.len()];
        seen[start] = true;
        let mut queue = VecDeque::from([start]);
        while let Some(u) = queue.pop_front() {
            for &pg in &led[u] {
                for member in &lists[pg][1..] {
                    let v = index[member];
                    if seen[v] {
                        continue;
                    }
                    seen[v] = true;
                    parent[v] = Some((u, pg));
                    if count[v] + 2 <= count[start] {
                        let mut path = Vec::new();
                        let mut at = v;
                        while let Some((prev, pg)) = parent[at] {
                            path.push((pg, at));
                            at = prev;
                        }
                        assert_eq!(at, start);
                        path.reverse();
                        return Some(path);
                    }
                    queue.push_back(v);
                }
            }
        }
    }
    None
}

fn apply_path(
    lists: &mut [Vec<OsdId>],
    index: &BTreeMap<OsdId, usize>,
    count: &mut [u64],
    led: &mut [Vec<usize>],
    path: &Path,
) {
    assert!(!path.is_empty());
    let first = index[&lists[path[0].0][0]];
    let last = path[path.len() - 1].1;
    let before = (count[first], count[last]);
    for &(pg, to) in path {
        let from = index[&lists[pg][0]];
        let position = lists[pg]
            .iter()
            .position(|o| index[o] == to)
            .expect("the new primary is a member of the PG");
        assert!(position > 0);
        lists[pg].swap(0, position);
        led[from].retain(|&p| p != pg);
        led[to].push(pg);
        count[from] -= 1;
        count[to] += 1;
    }
    // Only the two ends changed, and the spread between them shrank.
    assert_eq!(count[first] + 1, before.0);
    assert_eq!(count[last], before.1 + 1);
    assert!(count[last] <= count[first] + 1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spreads_primaries_of_identical_sets() {
        // Three PGs over the same three OSDs, all led by OSD 1: one each afterwards.
        let mut lists = vec![vec![OsdId(1), OsdId(2), OsdId(3)]; 3];
        balance_primaries(&mut lists);
        let mut firsts: Vec<u32> = lists.iter().map(|l| l[0].get()).collect();
        firsts.sort_unstable();
        assert_eq!(firsts, vec![1, 2, 3]);
        for list in &lists {
            let mut sorted = list.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, vec![OsdId(1), OsdId(2), OsdId(3)]);
        }
    }

    #[test]
    fn shifts_along_a_chain() {
        // OSD 1 leads two PGs; the only way to relieve it is 1 -> 2 in PG a, 2 -> 3 in PG b.
        let mut lists = vec![
            vec![OsdId(1), OsdId(2)],
            vec![OsdId(1)],
            vec![OsdId(2), OsdId(3)],
        ];
        balance_primaries(&mut lists);
        assert_eq!(lists[0][0], OsdId(2));
        assert_eq!(lists[1][0], OsdId(1));
        assert_eq!(lists[2][0], OsdId(3));
    }
}

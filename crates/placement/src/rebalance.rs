//! Rebalance with few moves: one member of one PG at a time, from a loaded place to a light one.
//!
//! Two levels, so that the `Host` domain balances hosts before OSDs:
//!
//! 1. **Domain moves.** Among all ordered pairs of domains (A, B), those where moving one member
//!    from A to B lowers the potential `Φ = Σ load² / weight` (weight = the domain's number of
//!    placement-target OSDs) are tried best first: the move changes Φ by
//!    `(2·l_B + 1) / w_B − (2·l_A − 1) / w_A`. With equal weights that is "from the most loaded
//!    to the least loaded, when they differ by 2 or more". The member leaves A's most loaded OSD
//!    that has a usable PG, and goes to B's least loaded OSD. A PG is usable if it is in
//!    `movable`, holds that OSD, and has no other member in B.
//! 2. **OSD moves inside a domain**, only when no domain move is possible: from the most to the
//!    least loaded OSD of one domain when they differ by 2 or more (same domain, so the PG's
//!    domains do not change).
//!
//! Every move strictly lowers Φ, or keeps Φ and strictly lowers the sum of squared OSD loads, so
//! the loop ends even without `moves_max`. With the `Osd` domain and every PG movable the result
//! has spread at most 1: if the most loaded OSD `a` and the least loaded `b` differ by 2 or more,
//! some PG holds `a` and not `b` (otherwise `b` would hold at least as many), so a move exists.
//!
//! Out members are ignored: they carry no load and are never moved (that is repair's job), but
//! they still occupy their domain in their PG.

use crate::choose::Loads;
use crate::domains::{domains_distinct, Topology};
use crate::{hash, PoolSpec};
use fastblock_types::osd_table::OsdTable;
use fastblock_types::OsdId;
use std::collections::{BTreeMap, BTreeSet};

pub fn rebalance(
    spec: &PoolSpec,
    targets: &BTreeMap<u32, Vec<OsdId>>,
    osds: &OsdTable,
    movable: &BTreeSet<u32>,
    moves_max: usize,
) -> BTreeMap<u32, Vec<OsdId>> {
    let topo = Topology::new(spec.failure_domain, osds);
    let mut state = State::new(spec, &topo, osds, targets, movable);
    for _ in 0..moves_max {
        let Some(m) = state.find_domain_move().or_else(|| state.find_osd_move()) else {
            break;
        };
        state.apply(m);
    }
    let mut changed = BTreeMap::new();
    for seq in state.touched {
        let list = &state.lists[&seq];
        if list != &targets[&seq] {
            assert!(
                movable.contains(&seq),
                "pool {} pg {seq} is not movable",
                spec.pool
            );
            changed.insert(seq, list.clone());
        }
    }
    changed
}

/// One move: position `position` of PG `seq` goes from OSD index `from` to OSD index `to`.
#[derive(Clone, Copy, Debug)]
struct Move {
    seq: u32,
    position: usize,
    from: usize,
    to: usize,
}

struct State<'a> {
    spec: &'a PoolSpec,
    topo: &'a Topology,
    osds: &'a OsdTable,
    lists: BTreeMap<u32, Vec<OsdId>>,
    loads: Loads,
    primaries: Vec<u64>,
    /// Per target OSD index: the movable PGs it is a member of.
    movable_of: Vec<BTreeSet<u32>>,
    touched: BTreeSet<u32>,
}

impl<'a> State<'a> {
    fn new(
        spec: &'a PoolSpec,
        topo: &'a Topology,
        osds: &'a OsdTable,
        targets: &BTreeMap<u32, Vec<OsdId>>,
        movable: &BTreeSet<u32>,
    ) -> State<'a> {
        let loads = Loads::new(topo, topo.member_loads(targets.values()));
        let mut primaries = vec![0u64; topo.osds.len()];
        let mut movable_of = vec![BTreeSet::new(); topo.osds.len()];
        for (&seq, list) in targets {
            if let Some(i) = list.first().and_then(|o| topo.target_index(*o)) {
                primaries[i] += 1;
            }
            if movable.contains(&seq) {
                for osd in list {
                    if let Some(i) = topo.target_index(*osd) {
                        movable_of[i].insert(seq);
                    }
                }
            }
        }
        State {
            spec,
            topo,
            osds,
            lists: targets.clone(),
            loads,
            primaries,
            movable_of,
            touched: BTreeSet::new(),
        }
    }

    fn find_domain_move(&self) -> Option<Move> {
        let domains = &self.topo.domains;
        // (numerator, denominator, a, b) of the gain −ΔΦ = (2·l_A − 1)/w_A − (2·l_B + 1)/w_B.
        let mut pairs: Vec<(i128, i128, usize, usize)> = Vec::new();
        for (a, da) in domains.iter().enumerate() {
            let la = i128::from(self.loads.domain[a]);
            if la == 0 {
                continue;
            }
            let wa = i128::from(da.weight());
            for (b, db) in domains.iter().enumerate() {
                let wb = i128::from(db.weight());
                let lb = i128::from(self.loads.domain[b]);
                let numerator = (2 * la - 1) * wb - (2 * lb + 1) * wa;
                if a != b && numerator > 0 {
                    pairs.push((numerator, wa * wb, a, b));
                }
            }
        }
        // Best gain first; ties by domain index for determinism.
        pairs.sort_by(|x, y| {
            (y.0 * x.1)
                .cmp(&(x.0 * y.1))
                .then((x.2, x.3).cmp(&(y.2, y.3)))
        });
        pairs
            .into_iter()
            .find_map(|(_, _, a, b)| self.move_between(a, b))
    }

    /// A move from domain `a` to domain `b`: from `a`'s most loaded OSD that has a usable PG to
    /// `b`'s least loaded OSD.
    fn move_between(&self, a: usize, b: usize) -> Option<Move> {
        let pool = self.spec.pool.get();
        let to = self.topo.domains[b]
            .members
            .iter()
            .copied()
            .min_by_key(|&i| (self.loads.osd[i], tie_osd(pool, self.topo.osds[i]), i))?;
        let mut sources = self.topo.domains[a].members.clone();
        sources.sort_by_key(|&i| (std::cmp::Reverse(self.loads.osd[i]), i));
        sources
            .into_iter()
            .find_map(|from| self.best_pg_move(from, to))
    }

    /// Inside one domain, from the most to the least loaded OSD when they differ by 2 or more.
    fn find_osd_move(&self) -> Option<Move> {
        let mut pairs: Vec<(u64, usize, usize)> = Vec::new();
        for domain in &self.topo.domains {
            for &from in &domain.members {
                for &to in &domain.members {
                    let (lf, lt) = (self.loads.osd[from], self.loads.osd[to]);
                    if lf >= lt + 2 {
                        pairs.push((lf - lt, from, to));
                    }
                }
            }
        }
        pairs.sort_by_key(|&(gap, from, to)| (std::cmp::Reverse(gap), from, to));
        pairs
            .into_iter()
            .find_map(|(_, from, to)| self.best_pg_move(from, to))
    }

    /// The best movable PG to move from OSD `from` to OSD `to`, if any. Prefers moving a
    /// position-0 member when that also evens out preferred leaders, and avoids moving one
    /// when it would unbalance them.
    fn best_pg_move(&self, from: usize, to: usize) -> Option<Move> {
        let pool = self.spec.pool.get();
        let to_domain = self.topo.osd_domain[to];
        let mut best: Option<((u8, u64), Move)> = None;
        for &seq in &self.movable_of[from] {
            let list = &self.lists[&seq];
            let from_id = self.topo.osds[from];
            let position = list
                .iter()
                .position(|&o| o == from_id)
                .expect("indexed member");
            let blocked = list.iter().enumerate().any(|(p, &o)| {
                p != position && self.topo.domain_of(o, self.osds) == Some(to_domain)
            });
            if blocked {
                continue;
            }
            let rank = match position {
                0 if self.primaries[from] >= self.primaries[to] + 2 => 0,
                0 => 2,
                _ => 1,
            };
            let key = (
                rank,
                hash::tie(pool, seq, u64::from(self.topo.osds[to].get())),
            );
            if best.as_ref().is_none_or(|(k, _)| key < *k) {
                best = Some((
                    key,
                    Move {
                        seq,
                        position,
                        from,
                        to,
                    },
                ));
            }
        }
        best.map(|(_, m)| m)
    }

    fn apply(&mut self, m: Move) {
        let (from_id, to_id) = (self.topo.osds[m.from], self.topo.osds[m.to]);
        let list = self.lists.get_mut(&m.seq).expect("move of a known PG");
        assert_eq!(
            list[m.position], from_id,
            "pool {} pg {}",
            self.spec.pool, m.seq
        );
        assert!(
            !list.contains(&to_id),
            "pool {} pg {}",
            self.spec.pool,
            m.seq
        );
        let before = domains_distinct(self.spec.failure_domain, list, self.osds);
        list[m.position] = to_id;
        // A move never makes a PG's domains collide (a PG that already collided is not fixed).
        assert!(
            !before || domains_distinct(self.spec.failure_domain, list, self.osds),
            "pool {} pg {}: move {from_id} -> {to_id} breaks failure domains: {list:?}",
            self.spec.pool,
            m.seq
        );
        self.loads.remove(self.topo, m.from);
        self.loads.add(self.topo, m.to);
        if m.position == 0 {
            self.primaries[m.from] -= 1;
            self.primaries[m.to] += 1;
        }
        assert!(self.movable_of[m.from].remove(&m.seq));
        assert!(self.movable_of[m.to].insert(m.seq));
        self.touched.insert(m.seq);
    }
}

/// Tie-break of destination OSDs, independent of any PG.
fn tie_osd(pool: u32, osd: OsdId) -> u64 {
    hash::tie(pool, u32::MAX, u64::from(osd.get()))
}

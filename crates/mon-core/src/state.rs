//! [`MonState`]: everything the monitor persists, and the derivation of PG states.

use fastblock_types::map::{
    ClusterMap, Counters, ImageInfo, PgInfo, ReclaimEntry, SnapInfo, SnapTrimEntry,
};
use fastblock_types::osd_table::UpOsds;
use fastblock_types::pg_table::PgChange;
use fastblock_types::{Epoch, ImageId, OsdId, PgState, PoolId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// Work the monitor owes but has not done yet, persisted so a new leader picks it up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pending {
    /// An OSD came in while `norebalance` was set: rebalance when the flag is cleared.
    pub rebalance_deferred: bool,
}

/// The whole persisted monitor state. Each field maps to etcd keys (see `docs/etcd-keys.md`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MonState {
    pub map: ClusterMap,
    /// Images keyed by (pool, name): names are unique per pool.
    pub images: BTreeMap<(PoolId, String), ImageInfo>,
    pub reclaim: BTreeMap<u64, ReclaimEntry>,
    /// Live snapshots per image, sorted by id (`crate::snap_ops`).
    pub snaps: BTreeMap<ImageId, Vec<SnapInfo>>,
    /// Snapshots whose data the PGs must drop, by trim id.
    pub snap_trims: BTreeMap<u64, SnapTrimEntry>,
    pub counters: Counters,
    pub pending: Pending,
    /// The key table (the mode and its epoch are in `map.auth`).
    pub auth: crate::auth_ops::AuthTable,
    /// Operators' scrub requests and their id counter (`crate::scrub_ops`).
    pub scrubs: crate::scrub_ops::ScrubRecords,
    /// The pools a state loaded from etcd holds damaged (`crate::damage`), found once by
    /// [`MonState::refresh_damage`]; not persisted.
    pub damage: BTreeMap<PoolId, crate::damage::PoolDamage>,
}

impl MonState {
    /// The epoch the current operation will publish.
    pub fn next_epoch(&self) -> Epoch {
        Epoch(self.map.epoch.0 + 1)
    }

    /// Ends every operation: re-derives PG states from their facts, bumps the version of every
    /// PG that changed and of its pool, and bumps the epoch if anything at all changed since
    /// `before`. Returns whether anything changed.
    pub fn finish(&mut self, before: &MonState) -> bool {
        self.derive_pg_states_since(before);
        self.derive_data_map();
        self.derive_full_osds();
        self.forget_damage_of_removed_pools();
        // Versions: a PG whose facts changed gets its old version plus one, and its pool too.
        // Only the chunks an operation changed are compared (`PgTable::diff`).
        for (pool_id, pgmap) in self.map.pgmaps.iter_mut() {
            let Some(old_map) = before.map.pgmaps.get(pool_id) else {
                continue; // a new pool: its PGs and map keep the versions they were made with
            };
            let mut pool_changed = false;
            let versions: Vec<(u32, u64)> = old_map
                .pgs
                .diff(&pgmap.pgs)
                .into_iter()
                .filter_map(|change| match change {
                    PgChange::Changed(seq, old, new) => {
                        let facts = pg_facts_differ(old, new);
                        pool_changed |= facts;
                        let version = old.version + u64::from(facts);
                        (new.version != version).then_some((seq, version))
                    }
                    _ => None,
                })
                .collect();
            for (seq, version) in versions {
                if let Some(pg) = pgmap.pgs.get_mut(&seq) {
                    pg.version = version;
                }
            }
            pgmap.version = old_map.version + u64::from(pool_changed);
        }
        self.map.epoch = before.map.epoch;
        let changed = self != before;
        if changed {
            self.map.epoch = before.next_epoch();
        }
        self.check_invariants();
        if changed {
            self.check_no_new_damage(before);
        }
        changed
    }

    /// Sets every PG's state bits from its facts (see `PgState`): `creating` until a leader
    /// reported, `remapped` while a target is pending, `down` when the up members are no Raft
    /// majority of the members, `undersize` when fewer up members than the pool size remain.
    /// A target the members have reached is cleared, and `released` is kept
    /// (`crate::report_checks::released_after`). Only the PGs whose derived fields change are
    /// written, so the PG tables keep sharing the chunks nothing changed in.
    pub fn derive_pg_states(&mut self) {
        let up = UpOsds::of(&self.map.osds);
        for (pool_id, pgmap) in self.map.pgmaps.iter_mut() {
            let size = self.map.pools.get(pool_id).map_or(0, |p| p.size) as usize;
            let updates: Vec<(u32, PgInfo)> = pgmap
                .pgs
                .iter()
                .filter_map(|(seq, pg)| derived(pg, &up, size).map(|next| (*seq, next)))
                .collect();
            for (seq, next) in updates {
                pgmap.pgs.insert(seq, next);
            }
        }
    }

    /// [`MonState::derive_pg_states`] for what changed since `before` only: the PGs whose
    /// facts changed, and every PG of an OSD that came up, went down, appeared or went (of a
    /// pool whose size changed or that is new: all). A PG's derived fields depend on nothing
    /// else, so the result is the same as deriving every PG; an operation that changes one
    /// PG no longer costs a pass over all of them.
    pub fn derive_pg_states_since(&mut self, before: &MonState) {
        let up = UpOsds::of(&self.map.osds);
        let was_up = UpOsds::of(&before.map.osds);
        let moved: Vec<OsdId> = self
            .map
            .osds
            .keys()
            .chain(before.map.osds.keys())
            .copied()
            .filter(|id| up.is_up(*id) != was_up.is_up(*id))
            .collect();
        let moved = UpOsds::from_ids(&moved);
        for (pool_id, pgmap) in self.map.pgmaps.iter_mut() {
            let size = self.map.pools.get(pool_id).map_or(0, |p| p.size);
            let old = before.map.pgmaps.get(pool_id);
            let same_size = before
                .map
                .pools
                .get(pool_id)
                .is_some_and(|p| p.size == size);
            let size = size as usize;
            let mut seqs: BTreeSet<u32> = BTreeSet::new();
            match old {
                Some(old) if same_size => {
                    seqs.extend(old.pgs.diff(&pgmap.pgs).iter().map(PgChange::seq));
                    if !moved.is_empty() {
                        seqs.extend(
                            pgmap
                                .pgs
                                .iter()
                                .filter(|(_, pg)| pg.osdlist.iter().any(|o| moved.is_up(*o)))
                                .map(|(seq, _)| *seq),
                        );
                    }
                }
                _ => seqs.extend(pgmap.pgs.keys().copied()),
            }
            let updates: Vec<(u32, PgInfo)> = seqs
                .into_iter()
                .filter_map(|seq| {
                    let pg = pgmap.pgs.get(&seq)?;
                    derived(pg, &up, size).map(|next| (seq, next))
                })
                .collect();
            for (seq, next) in updates {
                pgmap.pgs.insert(seq, next);
            }
        }
        #[cfg(debug_assertions)]
        {
            let mut all = self.clone();
            all.derive_pg_states();
            debug_assert!(
                all.map.pgmaps == self.map.pgmaps,
                "deriving what changed must equal deriving every PG"
            );
        }
    }

    /// Asserts the state invariants; a failure is a monitor bug, never bad input: a state
    /// loaded from etcd has passed [`MonState::validate`], and damage confined to one pool
    /// (see [`crate::damage`]) is reported and fenced, not asserted on.
    pub fn check_invariants(&self) {
        if let Err(e) = self.validate() {
            panic!(
                "monitor state invariant broken at epoch {}: {e}",
                self.map.epoch
            );
        }
    }

    /// The state invariants that are not confined to one pool, as an error: what a state
    /// loaded from etcd must satisfy before the monitor acts on it (a damaged or hand-edited
    /// store is reported, not a panic). Damage confined to one pool passes: it is found by
    /// [`MonState::damaged_pools`] and fenced.
    pub fn validate(&self) -> Result<(), String> {
        let check = |ok: bool, what: String| if ok { Ok(()) } else { Err(what) };
        for (pool_id, pgmap) in &self.map.pgmaps {
            check(
                pgmap.pool == *pool_id,
                format!("PG map {pool_id} names pool {}", pgmap.pool),
            )?;
        }
        for osd in self.map.osds.keys() {
            check(
                osd.0 >= 1 && osd.0 < self.counters.next_osd_id,
                format!("osd id {osd} not below counter"),
            )?;
        }
        // Pool ids of every record, the pool's own or not: a new pool must never take the id
        // of records left behind.
        let pool_ids = self
            .map
            .pools
            .keys()
            .chain(self.map.pgmaps.keys())
            .chain(self.images.keys().map(|(pool, _)| pool));
        for pool in pool_ids {
            check(
                pool.0 >= 1 && pool.0 < self.counters.next_pool_id,
                format!("pool id {pool} not below counter"),
            )?;
        }
        for image in self.images.values() {
            check(
                image.id.0 < self.counters.next_image_id,
                format!("image id {} not below counter", image.id),
            )?;
        }
        for id in self.reclaim.keys() {
            check(
                *id < self.counters.next_reclaim_id,
                format!("reclaim id {id} not below counter"),
            )?;
        }
        self.validate_snaps()?;
        self.validate_scrubs()
    }

    /// Asserts that an operation damaged no pool: damage comes only from etcd, and pools
    /// damaged there are fenced from every change (a failure is a monitor bug). Looks at what
    /// the operation changed: the PGs it changed, the pools it made, the OSDs it removed.
    fn check_no_new_damage(&self, before: &MonState) {
        let osds_removed = before
            .map
            .osds
            .keys()
            .any(|id| !self.map.osds.contains_key(id));
        let new = |pool: PoolId, damage: crate::damage::PoolDamage| -> ! {
            panic!(
                "monitor bug at epoch {}: an operation damaged pool {pool}: {}",
                self.map.epoch,
                self.describe_damage(pool, &damage)
            )
        };
        for pool in self.map.pools.keys() {
            if !self.damage.contains_key(pool) && !self.map.pgmaps.contains_key(pool) {
                new(*pool, crate::damage::PoolDamage::PgMapMissing);
            }
        }
        for (pool, pgmap) in &self.map.pgmaps {
            if self.damage.contains_key(pool) {
                continue;
            }
            match before.map.pgmaps.get(pool) {
                Some(old) if !osds_removed => {
                    for change in old.pgs.diff(&pgmap.pgs) {
                        match change {
                            PgChange::Added(seq, pg) | PgChange::Changed(seq, _, pg) => {
                                if let Some(d) = self.pg_damage(*pool, seq, pg) {
                                    new(*pool, d);
                                }
                            }
                            PgChange::Removed(..) => new(
                                *pool,
                                crate::damage::PoolDamage::PgMapInconsistent(
                                    "a PG was removed".into(),
                                ),
                            ),
                        }
                    }
                }
                _ => {
                    if let Some(d) = self.find_pool_damage(*pool) {
                        new(*pool, d);
                    }
                }
            }
        }
    }

    /// The member list a PG is moving to: its target if remapped, else its current members.
    pub fn target_of(pg: &PgInfo) -> &Vec<OsdId> {
        if pg.newosdlist.is_empty() {
            &pg.osdlist
        } else {
            &pg.newosdlist
        }
    }
}

/// Set equality of member lists (order is only a leader preference). Without allocating: it
/// runs for every PG of every operation.
pub fn same_members(a: &[OsdId], b: &[OsdId]) -> bool {
    a.iter().all(|x| b.contains(x)) && b.iter().all(|x| a.contains(x))
}

/// A PG with its derived fields as they should be (see [`MonState::derive_pg_states`]), or
/// `None` when they are already: found without allocating, as it runs for every PG.
fn derived(pg: &PgInfo, osds: &UpOsds, size: usize) -> Option<PgInfo> {
    let reached = !pg.newosdlist.is_empty() && same_members(&pg.osdlist, &pg.newosdlist);
    let up = pg.osdlist.iter().filter(|id| osds.is_up(**id)).count();
    let down = up * 2 <= pg.osdlist.len();
    let undersize = !down && (up < size || pg.osdlist.len() < size);
    let remapped = !pg.newosdlist.is_empty() && !reached;
    let state = PgState::derive(pg.leader.is_none(), undersize, down, remapped);
    let mut next: Option<PgInfo> = None;
    if reached {
        next.get_or_insert_with(|| pg.clone()).newosdlist.clear();
    }
    let basis = next.as_ref().unwrap_or(pg);
    if let Some(released) = crate::report_checks::released_after(basis) {
        next.get_or_insert_with(|| pg.clone()).released = released;
    }
    if state != pg.state {
        next.get_or_insert_with(|| pg.clone()).state = state;
    }
    next
}

fn pg_facts_differ(a: &PgInfo, b: &PgInfo) -> bool {
    a.state != b.state
        || a.osdlist != b.osdlist
        || a.newosdlist != b.newosdlist
        || a.leader != b.leader
        || a.leader_term != b.leader_term
        || a.conf_index != b.conf_index
}

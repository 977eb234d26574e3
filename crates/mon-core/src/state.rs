//! [`MonState`]: everything the monitor persists, and the derivation of PG states.

use fastblock_types::map::{
    ClusterMap, Counters, ImageInfo, PgInfo, ReclaimEntry, SnapInfo, SnapTrimEntry,
};
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
        self.derive_pg_states();
        self.derive_data_map();
        self.derive_full_osds();
        for (pool_id, pgmap) in self.map.pgmaps.iter_mut() {
            let old_map = before.map.pgmaps.get(pool_id);
            let mut pool_changed = old_map.is_none();
            for (seq, pg) in pgmap.pgs.iter_mut() {
                let old = old_map.and_then(|m| m.pgs.get(seq));
                if let Some(old) = old {
                    if pg_facts_differ(old, pg) {
                        pg.version = old.version + 1;
                        pool_changed = true;
                    } else {
                        pg.version = old.version;
                    }
                }
            }
            if let Some(old_map) = old_map {
                pgmap.version = old_map.version + u64::from(pool_changed);
            }
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
    pub fn derive_pg_states(&mut self) {
        let osds = &self.map.osds;
        for (pool_id, pgmap) in self.map.pgmaps.iter_mut() {
            let size = self.map.pools.get(pool_id).map_or(0, |p| p.size) as usize;
            for pg in pgmap.pgs.values_mut() {
                if same_members(&pg.osdlist, &pg.newosdlist) {
                    pg.newosdlist.clear();
                }
                crate::report_checks::note_released(pg);
                let up = pg
                    .osdlist
                    .iter()
                    .filter(|id| osds.get(id).is_some_and(|o| o.up))
                    .count();
                let down = up * 2 <= pg.osdlist.len();
                let undersize = !down && (up < size || pg.osdlist.len() < size);
                pg.state = PgState::derive(
                    pg.leader.is_none(),
                    undersize,
                    down,
                    !pg.newosdlist.is_empty(),
                );
            }
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
    /// damaged there are fenced from every change (a failure is a monitor bug).
    fn check_no_new_damage(&self, before: &MonState) {
        let damaged_before = before.damaged_pools();
        for (pool, damage) in self.damaged_pools() {
            assert!(
                damaged_before.contains_key(&pool),
                "monitor bug at epoch {}: an operation damaged pool {pool}: {}",
                self.map.epoch,
                self.describe_damage(pool, &damage)
            );
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

/// Set equality of member lists (order is only a leader preference).
pub fn same_members(a: &[OsdId], b: &[OsdId]) -> bool {
    let a: BTreeSet<_> = a.iter().collect();
    let b: BTreeSet<_> = b.iter().collect();
    a == b
}

fn pg_facts_differ(a: &PgInfo, b: &PgInfo) -> bool {
    a.state != b.state
        || a.osdlist != b.osdlist
        || a.newosdlist != b.newosdlist
        || a.leader != b.leader
        || a.leader_term != b.leader_term
        || a.conf_index != b.conf_index
}

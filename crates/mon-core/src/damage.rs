//! Damage confined to one pool, in a state loaded from etcd (a hand edit, a partial restore, a
//! bug of another version): found here, reported in health, and fenced, so that the rest of
//! the cluster keeps working. One damaged pool must never stop the monitor from marking OSDs
//! down or serving the other pools.
//!
//! Fenced means: the monitor changes nothing in a damaged pool (no repair, rebalance or PG
//! report is applied to it, no image is created, removed or resized in it) and answers such
//! requests with `pool_damaged`; `pool rm` still deletes it. OSDs keep the PGs of a pool that
//! the map lists without a PG map as they are (see `fastblock_shard::hosting`), so restoring
//! the key brings the pool back with its data.
//!
//! The monitor itself never damages a pool: [`MonState::finish`] asserts that an operation
//! adds no damage.

use crate::state::MonState;
use crate::{err, OpResult};
use fastblock_types::api::ErrorCode;
use fastblock_types::map::PgInfo;
use fastblock_types::PoolId;
use std::collections::{BTreeMap, BTreeSet};

/// What is wrong with one pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolDamage {
    /// The pool exists, its PG map does not (the key `pgmaps/<pool id>` is missing).
    PgMapMissing,
    /// The PG map does not fit the pool: PG numbers other than `0..pg_count`, or a PG that
    /// repeats an OSD or names one that does not exist. The text says which.
    PgMapInconsistent(String),
    /// A PG map or images whose pool does not exist (the key `pools/<pool id>` is missing).
    PoolMissing,
}

impl PoolDamage {
    /// The stable code a health check starts with.
    pub fn code(&self) -> &'static str {
        match self {
            PoolDamage::PgMapMissing => "POOL_PGMAP_MISSING",
            PoolDamage::PgMapInconsistent(_) => "POOL_PGMAP_DAMAGED",
            PoolDamage::PoolMissing => "POOL_MISSING",
        }
    }
}

impl MonState {
    /// Every damaged pool, by id. Empty for every state the monitor produces itself.
    pub fn damaged_pools(&self) -> BTreeMap<PoolId, PoolDamage> {
        self.damage.clone()
    }

    /// What is wrong with `pool`, if anything (a pool that does not exist at all is not
    /// damaged). From [`MonState::refresh_damage`]'s findings: damage comes only with a state
    /// loaded from etcd, so it is looked for once then, not at every PG report (a scan of the
    /// pool's PGs each time).
    pub fn pool_damage(&self, pool: PoolId) -> Option<PoolDamage> {
        self.damage.get(&pool).cloned()
    }

    /// Looks for damage in every pool, and keeps what it finds for [`MonState::pool_damage`]:
    /// run on every state loaded from etcd (`Keyspace::decode`), and by tests that damage a
    /// state by hand.
    pub fn refresh_damage(&mut self) {
        let ids: BTreeSet<PoolId> = self
            .map
            .pools
            .keys()
            .chain(self.map.pgmaps.keys())
            .copied()
            .chain(self.images.keys().map(|(pool, _)| *pool))
            .collect();
        self.damage = ids
            .into_iter()
            .filter_map(|id| self.find_pool_damage(id).map(|d| (id, d)))
            .collect();
    }

    /// Forgets the damage of pools that are gone (deleted: the only way out of damage short of
    /// repairing etcd and reloading).
    pub(crate) fn forget_damage_of_removed_pools(&mut self) {
        let (pools, pgmaps, images) = (&self.map.pools, &self.map.pgmaps, &self.images);
        self.damage.retain(|pool, _| {
            pools.contains_key(pool)
                || pgmaps.contains_key(pool)
                || images.keys().any(|(p, _)| p == pool)
        });
    }

    /// What is wrong with `pool` as it is now, looked for in all of its PGs.
    pub fn find_pool_damage(&self, pool: PoolId) -> Option<PoolDamage> {
        let pgmap = self.map.pgmaps.get(&pool);
        let Some(info) = self.map.pools.get(&pool) else {
            let has_images = self.images.keys().any(|(p, _)| *p == pool);
            return (pgmap.is_some() || has_images).then_some(PoolDamage::PoolMissing);
        };
        let Some(pgmap) = pgmap else {
            return Some(PoolDamage::PgMapMissing);
        };
        if !pgmap.pgs.keys().copied().eq(0..info.pg_count) {
            return Some(PoolDamage::PgMapInconsistent(format!(
                "the pool has {} PGs, its PG map {}",
                info.pg_count,
                pgmap.pgs.len()
            )));
        }
        pgmap
            .pgs
            .iter()
            .find_map(|(seq, pg)| self.pg_damage(pool, *seq, pg))
    }

    /// What is wrong with one PG's member lists: a repeated OSD, or one that does not exist.
    pub(crate) fn pg_damage(&self, pool: PoolId, seq: u32, pg: &PgInfo) -> Option<PoolDamage> {
        for list in [&pg.osdlist, &pg.newosdlist, &pg.learners] {
            let repeated = list.iter().enumerate().any(|(i, o)| list[..i].contains(o));
            if repeated {
                return Some(PoolDamage::PgMapInconsistent(format!(
                    "pg {pool}.{seq} repeats an OSD"
                )));
            }
            if let Some(osd) = list.iter().find(|o| !self.map.osds.contains_key(o)) {
                return Some(PoolDamage::PgMapInconsistent(format!(
                    "pg {pool}.{seq} names unknown osd {osd}"
                )));
            }
        }
        None
    }

    /// Refuses a change to a damaged pool with `pool_damaged`, saying what is wrong.
    pub(crate) fn check_pool_usable(&self, pool: PoolId) -> OpResult<()> {
        match self.pool_damage(pool) {
            None => Ok(()),
            Some(damage) => err(
                ErrorCode::PoolDamaged,
                format!(
                    "{}; the pool is fenced until repaired (only pool rm works)",
                    self.describe_damage(pool, &damage)
                ),
            ),
        }
    }

    /// One line about `damage` that names the pool and the etcd key concerned (relative to
    /// the monitor's key prefix), starting with the damage's code.
    pub fn describe_damage(&self, pool: PoolId, damage: &PoolDamage) -> String {
        format!("{}: {}", damage.code(), self.damage_summary(pool, damage))
    }

    /// What is damaged, without the code (the summary of the pool's health check).
    pub fn damage_summary(&self, pool: PoolId, damage: &PoolDamage) -> String {
        let name = self
            .map
            .pools
            .get(&pool)
            .map(|p| format!("pool {pool} ({:?})", p.name))
            .unwrap_or_else(|| format!("pool {pool}"));
        match damage {
            PoolDamage::PgMapMissing => {
                format!("{name} has no PG map: etcd key pgmaps/{pool} is missing")
            }
            PoolDamage::PgMapInconsistent(why) => {
                format!("{name}: its PG map (etcd key pgmaps/{pool}) is inconsistent: {why}")
            }
            PoolDamage::PoolMissing => {
                format!("{name} has a PG map or images but no pool record: etcd key pools/{pool} is missing")
            }
        }
    }
}

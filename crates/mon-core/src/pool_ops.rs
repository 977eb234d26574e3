//! Pools and the PG targets: create, delete, repair after out, rebalance after in.

use crate::limits::{PG_COUNT_MAX, POOL_SIZE_MAX};
use crate::state::{same_members, MonState};
use crate::{err, OpResult};
use fastblock_placement::{PlacementError, PoolSpec};
use fastblock_types::api::{CreatePoolRequest, ErrorCode};
use fastblock_types::map::{PgInfo, PgMap, PoolInfo};
use fastblock_types::names::validate_name;
use fastblock_types::{LogIndex, OsdId, PgState, PoolId, Term};
use std::collections::{BTreeMap, BTreeSet};

fn spec_of(pool: &PoolInfo) -> PoolSpec {
    PoolSpec {
        pool: pool.id,
        pg_count: pool.pg_count,
        size: pool.size,
        failure_domain: pool.failure_domain,
    }
}

impl MonState {
    pub fn pool_by_name(&self, name: &str) -> OpResult<&PoolInfo> {
        match self.map.pool_by_name(name) {
            Some(pool) => Ok(pool),
            None => err(
                ErrorCode::PoolNotFound,
                format!("pool {name:?} does not exist"),
            ),
        }
    }

    pub fn create_pool(&mut self, req: &CreatePoolRequest) -> OpResult<PoolInfo> {
        if let Err(e) = validate_name(&req.name) {
            return err(ErrorCode::InvalidArgument, format!("pool name: {e}"));
        }
        if req.pg_count == 0 || req.pg_count > PG_COUNT_MAX {
            return err(
                ErrorCode::InvalidArgument,
                format!(
                    "pg count {} must be between 1 and {PG_COUNT_MAX}",
                    req.pg_count
                ),
            );
        }
        if req.size == 0 || req.size > POOL_SIZE_MAX {
            return err(
                ErrorCode::InvalidArgument,
                format!(
                    "pool size {} must be between 1 and {POOL_SIZE_MAX}",
                    req.size
                ),
            );
        }
        if self.map.pool_by_name(&req.name).is_some() {
            return err(
                ErrorCode::PoolExists,
                format!("pool {:?} already exists", req.name),
            );
        }
        let id = PoolId(self.counters.next_pool_id);
        let spec = PoolSpec {
            pool: id,
            pg_count: req.pg_count,
            size: req.size,
            failure_domain: req.failure_domain,
        };
        let placed = match fastblock_placement::place_pool(&spec, &self.map.osds) {
            Ok(placed) => placed,
            Err(e @ PlacementError::NotEnoughDomains { available, .. }) => {
                let code = if available == 0 {
                    ErrorCode::NotEnoughOsds
                } else {
                    ErrorCode::NotEnoughDomains
                };
                return err(code, e.to_string());
            }
            Err(e @ PlacementError::Invalid(_)) => {
                return err(ErrorCode::InvalidArgument, e.to_string())
            }
        };
        assert_eq!(
            placed.len(),
            req.pg_count as usize,
            "placement returned a wrong PG count"
        );
        self.counters.next_pool_id += 1;
        let pool = PoolInfo {
            id,
            name: req.name.clone(),
            pg_count: req.pg_count,
            size: req.size,
            failure_domain: req.failure_domain,
            created_epoch: self.next_epoch(),
        };
        let pgs = placed
            .into_iter()
            .enumerate()
            .map(|(seq, members)| {
                assert_eq!(
                    members.len(),
                    req.size as usize,
                    "placement returned a short PG"
                );
                let pg = PgInfo {
                    version: 1,
                    state: PgState::CREATING,
                    osdlist: members,
                    newosdlist: Vec::new(),
                    learners: Vec::new(),
                    joint_voters: Vec::new(),
                    released: Vec::new(),
                    restored: false,
                    leader: None,
                    leader_term: Term(0),
                    conf_index: LogIndex(0),
                };
                (seq as u32, pg)
            })
            .collect();
        self.map.pools.insert(id, pool.clone());
        self.map.pgmaps.insert(
            id,
            PgMap {
                pool: id,
                version: 1,
                pgs,
            },
        );
        Ok(pool)
    }

    /// Deletes a pool, its PGs, its images and their snapshots. OSDs drop the PGs of a pool
    /// that left the map. Refused while the pool holds images unless `force`, because it
    /// destroys their data, and refused while images of other pools are cloned from its own.
    /// A damaged pool (`crate::damage`) can be deleted too: that is the one change it takes.
    pub fn delete_pool(&mut self, name: &str, force: bool) -> OpResult<PoolInfo> {
        let pool = self.pool_by_name(name)?.clone();
        let images = self.images.keys().filter(|(p, _)| *p == pool.id).count();
        if images > 0 && !force {
            return err(
                ErrorCode::InvalidArgument,
                format!(
                    "pool {name:?} holds {images} image(s); remove them first or delete with force"
                ),
            );
        }
        // Even with force: a clone in another pool would be left reading from a parent that
        // is gone.
        let clones = self.clones_outside_pool(pool.id);
        if !clones.is_empty() {
            let names: Vec<String> = clones
                .iter()
                .map(|c| format!("{}/{}", c.pool_name, c.name))
                .collect();
            return err(
                ErrorCode::SnapInUse,
                format!(
                    "pool {name:?} holds the parents of {} clone(s) in other pools: {}; flatten or remove them first",
                    names.len(),
                    names.join(", ")
                ),
            );
        }
        self.map.pools.remove(&pool.id);
        self.map.pgmaps.remove(&pool.id);
        self.images.retain(|(p, _), _| *p != pool.id);
        self.reclaim.retain(|_, r| r.pool != pool.id);
        self.forget_snaps_of_pool(pool.id);
        self.forget_scrubs_of_pool(pool.id);
        Ok(pool)
    }

    /// The pools placement may change: every pool but the damaged ones, which are fenced
    /// (`crate::damage`).
    fn placeable_pools(&self) -> Vec<PoolInfo> {
        self.map
            .pools
            .values()
            .filter(|p| self.pool_damage(p.id).is_none())
            .cloned()
            .collect()
    }

    /// Each PG's target members; `None` for a pool without a PG map.
    fn current_targets(&self, pool: PoolId) -> Option<BTreeMap<u32, Vec<OsdId>>> {
        let pgmap = self.map.pgmaps.get(&pool)?;
        Some(
            pgmap
                .pgs
                .iter()
                .map(|(seq, pg)| (*seq, MonState::target_of(pg).clone()))
                .collect(),
        )
    }

    fn set_targets(&mut self, pool: PoolId, changes: BTreeMap<u32, Vec<OsdId>>) {
        let Some(pgmap) = self.map.pgmaps.get_mut(&pool) else {
            return;
        };
        for (seq, target) in changes {
            let pg = pgmap
                .pgs
                .get_mut(&seq)
                .expect("placement changed an unknown PG");
            pg.newosdlist = if same_members(&pg.osdlist, &target) {
                Vec::new()
            } else {
                target
            };
        }
    }

    /// Replaces out members in every PG's target (only that member), and fills short PGs.
    pub fn repair_all(&mut self) {
        for pool in self.placeable_pools() {
            let Some(targets) = self.current_targets(pool.id) else {
                continue;
            };
            let changes = fastblock_placement::repair(&spec_of(&pool), &targets, &self.map.osds);
            self.set_targets(pool.id, changes);
        }
    }

    /// Evens out PG members over OSDs, moving only PGs that are fully active.
    pub fn rebalance_all(&mut self) {
        self.derive_pg_states();
        for pool in self.placeable_pools() {
            let (Some(targets), Some(pgmap)) =
                (self.current_targets(pool.id), self.map.pgmaps.get(&pool.id))
            else {
                continue;
            };
            let movable: BTreeSet<u32> = pgmap
                .pgs
                .iter()
                .filter(|(_, pg)| pg.state.is_active())
                .map(|(seq, _)| *seq)
                .collect();
            let changes = fastblock_placement::rebalance(
                &spec_of(&pool),
                &targets,
                &self.map.osds,
                &movable,
                pool.pg_count as usize,
            );
            self.set_targets(pool.id, changes);
        }
    }

    /// A remap that replaced members which are all back (up and in) is no longer needed: the
    /// target goes back to the current members. Remaps made by a rebalance (whose members were
    /// all in when it started) are left alone, because `returned` is not among their members.
    pub fn cancel_unneeded_remaps_for(&mut self, returned: OsdId) {
        let placeable: BTreeMap<PoolId, usize> = self
            .placeable_pools()
            .iter()
            .map(|p| (p.id, p.size as usize))
            .collect();
        let osds = &self.map.osds;
        for pgmap in self.map.pgmaps.values_mut() {
            let Some(&size) = placeable.get(&pgmap.pool) else {
                continue;
            };
            // Found first, then changed: changing through `values_mut` would copy every chunk
            // of the pool (`PgTable`) at every OSD that comes back.
            let cancelled: Vec<u32> = pgmap
                .pgs
                .iter()
                .filter(|(_, pg)| {
                    let replaced_returned =
                        pg.osdlist.contains(&returned) && !pg.newosdlist.contains(&returned);
                    let all_back = pg.osdlist.iter().all(|id| {
                        osds.get(id)
                            .is_some_and(|o| o.up && o.is_placement_target())
                    });
                    !pg.newosdlist.is_empty()
                        && replaced_returned
                        && all_back
                        && pg.osdlist.len() >= size
                })
                .map(|(seq, _)| *seq)
                .collect();
            for seq in cancelled {
                if let Some(pg) = pgmap.pgs.get_mut(&seq) {
                    pg.newosdlist.clear();
                }
            }
        }
    }
}

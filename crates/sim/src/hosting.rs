//! Which PGs a node hosts: every PG whose current or target members include it. Mirrors
//! `crates/osd/src/shard/hosting.rs` (`Shard::on_map`, `host_pg`, `remove_pg`,
//! `maybe_report_leader`) function by function; the simulator has one shard per node.

use crate::node::{Effects, Running, PG_INIT_INDEX, PG_INIT_TERM};
use fastblock_pg::{OpId, OpOutcome, PgError, PgReplica};
use fastblock_store::PgStorage;
use fastblock_types::map::{ClusterMap, PgInfo};
use fastblock_types::PgId;
use raft::eraftpb::ConfState;
use std::collections::BTreeMap;

impl Running {
    /// `Shard::on_map`.
    pub(crate) fn on_map(&mut self, map: &ClusterMap, eff: &mut Effects) {
        if map.epoch < self.map_epoch || self.failed.is_some() {
            return;
        }
        self.map_epoch = map.epoch;
        let me = self.me;
        let mut desired: BTreeMap<PgId, PgInfo> = BTreeMap::new();
        for (pool, pgmap) in &map.pgmaps {
            for (seq, info) in &pgmap.pgs {
                if info.osdlist.contains(&me)
                    || info.newosdlist.contains(&me)
                    || info.learners.contains(&me)
                {
                    desired.insert(PgId::new(*pool, *seq), info.clone());
                }
            }
        }
        // PGs the map does not list this node for, hosted or left in the store while it was
        // down: the replica goes unless its own state says it is still a member
        // (`fastblock_pg::retention`); such a replica is hosted.
        let mut gone: Vec<PgId> = self
            .pgs
            .keys()
            .filter(|pg| !desired.contains_key(pg))
            .copied()
            .collect();
        let orphans: Vec<PgId> = self
            .store
            .borrow()
            .pg_ids()
            .into_iter()
            .filter(|pg| !desired.contains_key(pg) && !self.pgs.contains_key(pg))
            .collect();
        gone.extend(orphans);
        for pg in gone {
            if let (Some(r), Some(info)) = (
                self.pgs.get(&pg),
                map.pgmaps.get(&pg.pool).and_then(|m| m.pgs.get(&pg.seq)),
            ) {
                eff.note(|| {
                    format!(
                        "pg {pg}: not in the map's members {:?} / target {:?} (recorded term {} conf {}); replica term {} last {} voters {:?} member {}",
                        info.osdlist,
                        info.newosdlist,
                        info.leader_term,
                        info.conf_index,
                        r.term(),
                        r.raw_node().raft.raft_log.last_index(),
                        r.voters(),
                        r.has_member(me)
                    )
                });
            }
            if let Some(info) = map
                .pgmaps
                .get(&pg.pool)
                .and_then(|m| m.pgs.get(&pg.seq))
                .filter(|info| self.keeps_replica(pg, info))
            {
                eff.note(|| format!("pg {pg}: not listed but still a member: kept"));
                if !self.pgs.contains_key(&pg) {
                    if let Err(e) = self.host_pg(pg, info, eff) {
                        self.fail(format!("opening pg {pg}: {e}"), eff);
                        return;
                    }
                }
                continue;
            }
            self.remove_pg(pg, eff);
            if self.failed.is_some() {
                return;
            }
        }
        for (pg, info) in &desired {
            if !self.pgs.contains_key(pg) {
                if let Err(e) = self.host_pg(*pg, info, eff) {
                    self.fail(format!("opening pg {pg}: {e}"), eff);
                    return;
                }
            }
            if let Some(r) = self.pgs.get_mut(pg) {
                let target = (!info.newosdlist.is_empty()).then(|| info.newosdlist.clone());
                r.set_target(target);
            }
            self.maybe_report_leader(*pg, info, eff);
        }
    }

    /// `hosting.rs` `keeps_replica`.
    fn keeps_replica(&self, pg: PgId, info: &PgInfo) -> bool {
        let mut store = self.store.borrow_mut();
        // An unreadable log keeps the replica: deleting is the step that cannot be undone.
        let conf_change_after = store
            .has_conf_change_after(pg, info.conf_index.0)
            .unwrap_or(true);
        let keep = fastblock_pg::retention::keeps_replica(
            u64::from(self.me.0),
            store.pg_log(pg).map(|l| &l.conf_state),
            store.applied_index(pg),
            conf_change_after,
            info.conf_index.0,
        );
        keep
    }

    /// `hosting.rs` `host_pg`: a new PG's initial members start from the same configuration
    /// at `PG_INIT_INDEX`; a member added later starts empty and gets a snapshot.
    fn host_pg(&mut self, pg: PgId, info: &PgInfo, eff: &mut Effects) -> Result<(), String> {
        let me = self.me;
        {
            let mut store = self.store.borrow_mut();
            let fresh = store.pg_log(pg).is_none();
            if fresh && info.leader.is_none() && info.osdlist.contains(&me) {
                let voters: Vec<u64> = info.osdlist.iter().map(|o| u64::from(o.0)).collect();
                let cs = ConfState::from((voters, vec![]));
                store
                    .apply_snapshot(pg, PG_INIT_INDEX, PG_INIT_TERM, &cs)
                    .and_then(|_| store.commit().map(|_| ()))
                    .map_err(|e| e.to_string())?;
            }
        }
        let (first, applied) = {
            let store = self.store.borrow();
            (store.log_bounds(pg).0, store.applied_index(pg))
        };
        let applied = applied.max(first.saturating_sub(1));
        let storage = PgStorage::new(self.store.clone(), pg);
        let replica = PgReplica::new(pg, me, storage, applied, self.cfg.pg, self.cfg.pg_seed)
            .map_err(|e| e.to_string())?;
        eff.note(|| format!("pg {pg}: hosting (applied {applied})"));
        eff.opened.push((pg, applied));
        self.pgs.insert(pg, replica);
        Ok(())
    }

    /// `hosting.rs` `remove_pg`.
    fn remove_pg(&mut self, pg: PgId, eff: &mut Effects) {
        eff.note(|| format!("pg {pg}: removing"));
        self.pgs.remove(&pg);
        self.forget_recovery(pg);
        let ops = self.ops_of(pg);
        for op in ops {
            self.complete(
                OpId(op),
                OpOutcome::Failed(PgError::NotLeader { leader: None }),
                eff,
            );
        }
        // Flushed at once, so that the removal of its snapshot record is durable with the
        // log's.
        let result = {
            let mut store = self.store.borrow_mut();
            store
                .remove_pg(pg)
                .and_then(|_| store.commit().map(|_| ()))
                .and_then(|_| store.flush())
        };
        match result {
            Ok(()) => eff.removed.push(pg),
            Err(e) => self.fail(format!("removing pg {pg}: {e}"), eff),
        }
    }

    /// `hosting.rs` `maybe_report_leader`.
    fn maybe_report_leader(&mut self, pg: PgId, info: &PgInfo, eff: &mut Effects) {
        let Some(report) = self.pgs.get(&pg).and_then(|r| r.leader_report()) else {
            return;
        };
        let recorded = info.leader == Some(self.me)
            && (info.leader_term, info.conf_index) >= (report.term, report.conf_index);
        if !recorded {
            eff.leader_reports.push((pg, report));
        }
    }
}

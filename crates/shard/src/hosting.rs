//! Which PGs this shard hosts: every PG whose current or target members include this OSD and
//! that hashes to this shard. Created, reopened after a restart, or deleted as the map says;
//! never deleted because its pool's PG map is missing from the map (a damaged pool).

use crate::core::{HostedPg, ShardCore};
use crate::error::{Cause, Operation, ShardFailure};
use crate::io::Effects;
use fastblock_pg::{OpId, OpOutcome, PgError, PgReplica};
use fastblock_store::{Disk, PgStorage};
use fastblock_types::api::PgIoCounters;
use fastblock_types::map::{ClusterMap, PgInfo};
use fastblock_types::route::pg_shard;
use fastblock_types::{Epoch, PgId};
use raft::eraftpb::ConfState;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Index and term at which a brand-new PG's log starts, with its initial configuration as
/// snapshot metadata. A member added later starts empty (index 0), so the leader's log does
/// not reach back far enough for it and the leader sends a snapshot carrying the configuration
/// (the same trick as TiKV's RAFT_INIT_LOG_INDEX).
pub const PG_INIT_INDEX: u64 = 5;
pub const PG_INIT_TERM: u64 = 5;

impl<D: Disk + 'static> ShardCore<D> {
    pub(crate) fn on_map(&mut self, map: Arc<ClusterMap>, eff: &mut Effects) {
        if map.epoch < self.map.epoch || self.failed.is_some() {
            return;
        }
        self.map = map.clone();
        let me = self.cfg.osd;
        let mut desired: BTreeMap<PgId, PgInfo> = BTreeMap::new();
        for (pool, pgmap) in &map.pgmaps {
            for (seq, info) in &pgmap.pgs {
                let pg = PgId::new(*pool, *seq);
                if pg_shard(pg, self.cfg.count) != self.cfg.index {
                    continue;
                }
                if info.osdlist.contains(&me)
                    || info.newosdlist.contains(&me)
                    || info.learners.contains(&me)
                {
                    desired.insert(pg, info.clone());
                }
            }
        }
        // PGs the map does not list this OSD for, hosted or left in the store while it was
        // down: the replica goes unless its own state says it is still a member the map has
        // not caught up with (`fastblock_pg::retention`); such a replica is hosted.
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
        // A pool the map lists without a PG map is damaged in the monitor's store (its key
        // was lost), not deleted: its PGs stay as they are, neither removed nor changed, so
        // that restoring the key brings the pool back with its data (`fastblock_mon_core::
        // damage`). Deleting the pool removes it from the map, and then its PGs go.
        let fenced =
            |pg: &PgId| map.pools.contains_key(&pg.pool) && !map.pgmaps.contains_key(&pg.pool);
        gone.retain(|pg| !fenced(pg));
        for pg in gone {
            let info = map.pgmaps.get(&pg.pool).and_then(|m| m.pgs.get(&pg.seq));
            if let Some(info) = info.filter(|info| self.keeps_replica(pg, info)) {
                if !self.pgs.contains_key(&pg) {
                    if let Err(f) = self.host_pg(pg, info, eff) {
                        self.fail(f, eff);
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
                if let Err(f) = self.host_pg(*pg, info, eff) {
                    self.fail(f, eff);
                    return;
                }
            }
            if let Some(h) = self.pgs.get_mut(pg) {
                let target = (!info.newosdlist.is_empty()).then(|| info.newosdlist.clone());
                h.replica.set_target(target);
            }
            self.maybe_report_leader(*pg, info, eff);
        }
        self.drive_reclaims(eff);
        self.drive_snaps(eff);
    }

    /// Whether this OSD, not listed for `pg` by the map, is still a member by its own durable
    /// state (see `fastblock_pg::retention`).
    fn keeps_replica(&self, pg: PgId, info: &PgInfo) -> bool {
        let mut store = self.store.borrow_mut();
        // An unreadable log keeps the replica: deleting is the step that cannot be undone.
        let conf_change_after = store
            .has_conf_change_after(pg, info.conf_index.0)
            .unwrap_or(true);
        let keep = fastblock_pg::retention::keeps_replica(
            u64::from(self.cfg.osd.0),
            store.pg_log(pg).map(|l| &l.conf_state),
            store.applied_index(pg),
            conf_change_after,
            info.conf_index.0,
        );
        if keep {
            tracing::debug!(%pg, conf_index = info.conf_index.0, "not listed by the map but still a member: replica kept");
        }
        keep
    }

    fn host_pg(&mut self, pg: PgId, info: &PgInfo, eff: &mut Effects) -> Result<(), ShardFailure> {
        let me = self.cfg.osd;
        let open_err = |e| ShardFailure::store(Operation::OpenPg, Some(pg), e);
        {
            let mut store = self.store.borrow_mut();
            let fresh = store.pg_log(pg).is_none();
            if fresh && info.leader.is_none() && info.osdlist.contains(&me) {
                // A new PG: every initial member starts from the same configuration.
                let voters: Vec<u64> = info.osdlist.iter().map(|o| u64::from(o.0)).collect();
                let cs = ConfState::from((voters, vec![]));
                store
                    .apply_snapshot(pg, PG_INIT_INDEX, PG_INIT_TERM, &cs)
                    .map_err(open_err)?;
                store.commit().map_err(open_err)?;
            }
        }
        let (first, applied, commit) = {
            let store = self.store.borrow();
            let commit = store.pg_log(pg).map_or(0, |l| l.hard_state.commit);
            (store.log_bounds(pg).0, store.applied_index(pg), commit)
        };
        let applied = applied.max(first.saturating_sub(1));
        // Only committed entries are applied, and their commit index reaches the WAL before
        // a flush makes the applied index durable (`ShardCore::round`): raft-rs refuses to
        // open a PG whose applied index is past the log's commit index (found by the
        // simulator, seed 249999389376033725, after a crash).
        assert!(
            applied <= commit,
            "pg {pg} osd {me}: the store's applied index {applied} is past the commit index \
             {commit} of its log"
        );
        let storage = PgStorage::new(self.store.clone(), pg);
        let replica = PgReplica::new(pg, me, storage, applied, self.cfg.pg, self.cfg.pg_seed)
            .map_err(|e| ShardFailure {
                during: Operation::OpenPg,
                pg: Some(pg),
                cause: Cause::Raft(Arc::new(e)),
            })?;
        tracing::info!(%pg, applied, "hosting pg");
        eff.opened.push((pg, applied));
        self.pgs.insert(
            pg,
            HostedPg {
                replica,
                io: PgIoCounters::default(),
                reclaim_epoch: Epoch(0),
            },
        );
        Ok(())
    }

    fn remove_pg(&mut self, pg: PgId, eff: &mut Effects) {
        tracing::info!(%pg, "removing pg");
        self.pgs.remove(&pg);
        self.outs.remove(&pg);
        self.forget_recovery(pg);
        let ops: Vec<u64> = self
            .ops
            .iter()
            .filter(|(_, p)| p.pg == pg)
            .map(|(id, _)| *id)
            .collect();
        for op in ops {
            self.complete(
                OpId(op),
                OpOutcome::Failed(PgError::NotLeader { leader: None }),
                eff,
            );
        }
        self.forget_pg(pg);
        // Flushed at once, so that the removal of its snapshot record is durable with the
        // log's (a crash in between could otherwise bring the log back at open).
        let result = {
            let mut store = self.store.borrow_mut();
            store
                .remove_pg(pg)
                .and_then(|_| store.commit().map(|_| ()))
                .and_then(|_| store.flush())
        };
        match result {
            Ok(()) => eff.removed.push(pg),
            Err(e) => self.fail(ShardFailure::store(Operation::RemovePg, Some(pg), e), eff),
        }
    }

    /// A leader whose report the monitor has not recorded (lost, or sent before the monitor
    /// failed over) reports again.
    fn maybe_report_leader(&mut self, pg: PgId, info: &PgInfo, eff: &mut Effects) {
        let Some(report) = self.pgs.get(&pg).and_then(|h| h.replica.leader_report()) else {
            return;
        };
        // The configuration index counts too: a leader that changed the configuration after
        // its election (a learner added or removed, a cancelled change) must report again, or
        // the map keeps listing the old members (found by the simulator, seeds
        // 168834178531793517 and 11252641923367751158).
        let recorded = info.leader == Some(self.cfg.osd)
            && (info.leader_term, info.conf_index) >= (report.term, report.conf_index);
        if !recorded {
            self.report_leader(pg, report, eff);
        }
    }
}

//! Reports from PG leaders (reference section 4.5, without its races).
//!
//! The Raft configuration is the truth about a PG's members; the monitor's `osdlist` follows
//! it. Each report carries the leader's term and the index of the configuration entry it
//! describes; a report older than the last accepted one (lower term, or same term and lower
//! configuration index) is stale and ignored, so delayed or reordered messages cannot move the
//! monitor's view backwards.

use crate::state::{same_members, MonState};
use crate::{err, OpResult};
use fastblock_types::api::{ErrorCode, LeaderElectedRequest, MembershipFinishedRequest};
use fastblock_types::map::PgInfo;
use fastblock_types::{LogIndex, OsdId, PgId, Term};
use std::collections::BTreeSet;

impl MonState {
    fn pg_mut(&mut self, pg: PgId) -> OpResult<&mut PgInfo> {
        // A damaged pool is fenced: its PG map (if any) is not to be trusted or changed.
        self.check_pool_usable(pg.pool)?;
        match self
            .map
            .pgmaps
            .get_mut(&pg.pool)
            .and_then(|m| m.pgs.get_mut(&pg.seq))
        {
            Some(info) => Ok(info),
            None => err(ErrorCode::PgNotFound, format!("pg {pg} does not exist")),
        }
    }

    fn check_members(&self, pg: PgId, leader: OsdId, lists: &[&[OsdId]]) -> OpResult<()> {
        for list in lists {
            let distinct: BTreeSet<_> = list.iter().collect();
            if distinct.len() != list.len() {
                return err(
                    ErrorCode::InvalidArgument,
                    format!("pg {pg}: repeated member"),
                );
            }
            for osd in *list {
                if !self.map.osds.contains_key(osd) {
                    return err(
                        ErrorCode::InvalidArgument,
                        format!("pg {pg}: member osd {osd} does not exist"),
                    );
                }
            }
        }
        if !self.map.osds.contains_key(&leader) {
            return err(
                ErrorCode::OsdNotFound,
                format!("pg {pg}: leader osd {leader} does not exist"),
            );
        }
        Ok(())
    }

    fn check_fresh(pg_id: PgId, pg: &PgInfo, term: Term, conf_index: LogIndex) -> OpResult<()> {
        if (term, conf_index) < (pg.leader_term, pg.conf_index) {
            return err(
                ErrorCode::StaleReport,
                format!(
                    "pg {pg_id}: report for term {term} conf index {conf_index} is older than \
                     term {} conf index {}",
                    pg.leader_term, pg.conf_index
                ),
            );
        }
        Ok(())
    }

    /// A PG replica became leader, or a leader's configuration changed. `creating` ends;
    /// `osdlist` follows the reported voters (the outgoing voters while the group is joint,
    /// until the change finishes) and `learners` the other members; a target that the group
    /// already reached is cleared.
    pub fn leader_elected(&mut self, pg_id: PgId, req: &LeaderElectedRequest) -> OpResult<PgInfo> {
        if req.voters.is_empty() {
            return err(
                ErrorCode::InvalidArgument,
                format!("pg {pg_id}: empty voter list"),
            );
        }
        self.check_members(
            pg_id,
            req.leader,
            &[&req.voters, &req.voters_outgoing, &req.learners],
        )?;
        let pg = self.pg_mut(pg_id)?;
        Self::check_fresh(pg_id, pg, req.term, req.conf_index)?;
        if !req.voters.contains(&req.leader) && !req.voters_outgoing.contains(&req.leader) {
            return err(
                ErrorCode::InvalidArgument,
                format!("pg {pg_id}: leader {} is not a voter", req.leader),
            );
        }
        pg.leader = Some(req.leader);
        pg.leader_term = req.term;
        pg.conf_index = req.conf_index;
        pg.osdlist = if req.voters_outgoing.is_empty() {
            req.voters.clone()
        } else {
            req.voters_outgoing.clone()
        };
        pg.learners = others(&pg.osdlist, &[&req.voters, &req.learners]);
        if same_members(&pg.osdlist, &pg.newosdlist) {
            pg.newosdlist.clear();
        }
        Ok(pg.clone())
    }

    /// The leader finished a membership change: `osdlist` becomes the new voters; the target is
    /// cleared if it was reached, or kept if it moved on meanwhile (another out), so the leader
    /// drives the next change.
    pub fn membership_finished(
        &mut self,
        pg_id: PgId,
        req: &MembershipFinishedRequest,
    ) -> OpResult<PgInfo> {
        if req.voters.is_empty() {
            return err(
                ErrorCode::InvalidArgument,
                format!("pg {pg_id}: empty voter list"),
            );
        }
        self.check_members(pg_id, req.leader, &[&req.voters, &req.learners])?;
        let pg = self.pg_mut(pg_id)?;
        Self::check_fresh(pg_id, pg, req.term, req.conf_index)?;
        pg.leader = Some(req.leader);
        pg.leader_term = req.term;
        pg.conf_index = req.conf_index;
        pg.osdlist = req.voters.clone();
        pg.learners = others(&pg.osdlist, &[&req.learners]);
        if same_members(&pg.osdlist, &pg.newosdlist) {
            pg.newosdlist.clear();
        }
        Ok(pg.clone())
    }
}

/// The members in `lists` that `osdlist` does not name, sorted and distinct.
fn others(osdlist: &[OsdId], lists: &[&[OsdId]]) -> Vec<OsdId> {
    let named: BTreeSet<OsdId> = osdlist.iter().copied().collect();
    let rest: BTreeSet<OsdId> = lists
        .iter()
        .flat_map(|l| l.iter().copied())
        .filter(|o| !named.contains(o))
        .collect();
    rest.into_iter().collect()
}

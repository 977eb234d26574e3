//! Reports from PG leaders (reference section 4.5, without its races).
//!
//! The Raft configuration is the truth about a PG's members; the monitor's `osdlist` follows
//! it. Each report carries the leader's term and the index of the configuration entry it
//! describes; a report older than the last accepted one (lower term, or same term and lower
//! configuration index) is stale and ignored, so delayed or reordered messages cannot move the
//! monitor's view backwards. A report of a new term whose configuration is older than the
//! recorded one (a new leader that has not applied the whole log yet) records the leader but
//! keeps the members. Every report is checked against its sender and against the record
//! first ([`crate::report_checks`]).

use crate::report_checks::{check_against_record, check_sender, Reported, Reporter, Verdict};
use crate::state::{same_members, MonState};
use crate::{err, OpResult};
use fastblock_types::api::{ErrorCode, LeaderElectedRequest, MembershipFinishedRequest};
use fastblock_types::map::PgInfo;
use fastblock_types::{OsdId, PgId};
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

    /// The rules every report passes (`crate::report_checks`), then the record: a report at
    /// least as new as the recorded configuration sets the members, an older one of a new
    /// term only the leader and its term. `lists` are the report's member lists as sent.
    fn record_report(
        &mut self,
        pg_id: PgId,
        r: &Reported,
        lists: &[&[OsdId]],
        reporter: Reporter,
    ) -> OpResult<PgInfo> {
        check_sender(pg_id, r, reporter)?;
        if r.osdlist.is_empty() {
            return err(
                ErrorCode::InvalidArgument,
                format!("pg {pg_id}: empty voter list"),
            );
        }
        self.check_members(pg_id, r.leader, lists)?;
        if !r.osdlist.contains(&r.leader) && !r.joint_voters.contains(&r.leader) {
            return err(
                ErrorCode::InvalidArgument,
                format!("pg {pg_id}: leader {} is not a voter", r.leader),
            );
        }
        let pg = self.pg_mut(pg_id)?;
        let verdict = check_against_record(pg_id, pg, r)?;
        pg.leader = Some(r.leader);
        pg.leader_term = r.term;
        if verdict == Verdict::Record {
            pg.restored = false;
            pg.conf_index = r.conf_index;
            pg.osdlist = r.osdlist.clone();
            pg.joint_voters = r.joint_voters.clone();
            pg.learners = others(&pg.osdlist, &[&r.members]);
            if same_members(&pg.osdlist, &pg.newosdlist) {
                pg.newosdlist.clear();
            }
        }
        Ok(pg.clone())
    }

    /// A PG replica became leader, or a leader's configuration changed. `creating` ends;
    /// `osdlist` follows the reported voters (the outgoing voters while the group is joint,
    /// with the incoming ones in `joint_voters`, until the change finishes) and `learners` the
    /// other members; a target that the group already reached is cleared.
    pub fn leader_elected(
        &mut self,
        pg_id: PgId,
        req: &LeaderElectedRequest,
        reporter: Reporter,
    ) -> OpResult<PgInfo> {
        let joint = !req.voters_outgoing.is_empty();
        let lists = [&req.voters[..], &req.voters_outgoing, &req.learners];
        let r = Reported {
            leader: req.leader,
            term: req.term,
            conf_index: req.conf_index,
            osdlist: if joint {
                req.voters_outgoing.clone()
            } else {
                req.voters.clone()
            },
            joint_voters: if joint {
                req.voters.clone()
            } else {
                Vec::new()
            },
            members: lists.concat(),
        };
        self.record_report(pg_id, &r, &lists, reporter)
    }

    /// The leader finished a membership change: `osdlist` becomes the new voters; the target is
    /// cleared if it was reached, or kept if it moved on meanwhile (another out), so the leader
    /// drives the next change.
    pub fn membership_finished(
        &mut self,
        pg_id: PgId,
        req: &MembershipFinishedRequest,
        reporter: Reporter,
    ) -> OpResult<PgInfo> {
        let r = Reported {
            leader: req.leader,
            term: req.term,
            conf_index: req.conf_index,
            osdlist: req.voters.clone(),
            joint_voters: Vec::new(),
            members: [&req.voters[..], &req.learners].concat(),
        };
        self.record_report(pg_id, &r, &[&req.voters, &req.learners], reporter)
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

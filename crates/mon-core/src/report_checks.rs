//! Whether a PG leader's report may be recorded: checked against its sender and against what
//! the monitor recorded before, so that one buggy or hostile report cannot take a PG's members
//! away (the members it drops would delete their replicas) or fence out every genuine report
//! (a term near 2^64-1).
//!
//! Each rule follows from how genuine leaders report (`fastblock_pg::membership`,
//! `fastblock_pg::replica`):
//! - Raft has at most one leader per term, and every replica runs pre-vote, so terms rise by
//!   one per real election: a report names the recorded leader when it carries the recorded
//!   term, and raises the term by at most [`REPORT_TERM_STEP_MAX`].
//! - A leader reports the configuration it applied, and applied configurations are committed:
//!   the configuration at a given index is the same whoever reports it, and a higher index
//!   describes a later one. A leader hosts the PG in the configuration it reports, which the
//!   monitor's record (`osdlist`, `newosdlist`, `learners`) names unless it is older than the
//!   recorded one; then the report is stale.
//! - Voters leave only by leaving a joint configuration `incoming ∧ outgoing` that the leader
//!   entered towards a target the monitor set (`newosdlist`); a leader always leaves a joint
//!   configuration, whatever the target is by then (`fastblock_pg::membership`). So a member of
//!   the recorded voters (`osdlist`, and `joint_voters` while joint) may be dropped only if
//!   some target the monitor published while it was a member leaves it out:
//!   - the current target;
//!   - the recorded joint configuration (it is outgoing only), so a target that moved or was
//!     cancelled after the group reported entering it still lets the group leave it;
//!   - a target published earlier and since withdrawn or moved (`PgInfo::released`, kept by
//!     [`note_released`]). The joint report is not always seen: the leader reports only its
//!     latest configuration, so entering and leaving in quick succession sends the second
//!     report alone, and a report can be lost. And the leader acts on the target of the map it
//!     has, which can be older than the monitor's: it can enter a joint configuration towards a
//!     target the monitor has already cancelled (the OSD that went out came back in). Either
//!     way the group leaves towards a target the monitor no longer names, and the report that
//!     says so is genuine (found by simulator seed 17722765049566651514).
//!
//! After a restore from a monitor backup (`PgInfo::restored`, `fastblock_mon::backup`) the
//! record can be older than the PG in any way (members moved since the backup was taken), so
//! the first report at a configuration index at least the recorded one is recorded as it is,
//! past the hosting and members rules; the sender, term and staleness rules still apply.
//!
//! Why a forged report still cannot take members away: every member it drops must be one the
//! monitor itself decided, at some point while it was a member, to move off the PG (an out, a
//! rebalance): a report cannot remove a member no target ever left out, nor one that has become
//! a member again since (`released` is cleared of an OSD once a recorded configuration no
//! longer names it, so re-added members start afresh). A released member can be dropped by a
//! report of the PG's own leader only (the sender rule): that leader can make the same change
//! through Raft itself, so the rule costs nothing against it and keeps every other OSD out.

use crate::limits::REPORT_TERM_STEP_MAX;
use crate::{err, OpResult};
use fastblock_types::api::ErrorCode;
use fastblock_types::map::PgInfo;
use fastblock_types::{LogIndex, OsdId, PgId, Term};
use std::collections::BTreeSet;

/// Who sent a PG report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reporter {
    /// An OSD the API authenticated: it may only report for itself.
    Osd(OsdId),
    /// The cluster runs without authentication (auth mode `none`): the sender is not checked,
    /// every other rule still is.
    Unauthenticated,
}

/// A report of either kind, as the rules and the record read it.
#[derive(Clone, Debug)]
pub(crate) struct Reported {
    pub leader: OsdId,
    pub term: Term,
    pub conf_index: LogIndex,
    /// The voters while not joint, the outgoing voters while joint.
    pub osdlist: Vec<OsdId>,
    /// The incoming voters while joint, empty otherwise.
    pub joint_voters: Vec<OsdId>,
    /// Every member the configuration names (voters of both halves and learners).
    pub members: Vec<OsdId>,
}

/// What a report that passed the rules changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The configuration is at least as new as the recorded one: record all of it.
    Record,
    /// A new term whose leader has not yet applied the recorded configuration: record the
    /// leader and its term; the recorded members stay (they are newer).
    LeaderOnly,
}

/// The sender rule: an authenticated OSD reports only as the leader itself.
pub(crate) fn check_sender(pg: PgId, r: &Reported, reporter: Reporter) -> OpResult<()> {
    match reporter {
        Reporter::Osd(osd) if osd != r.leader => err(
            ErrorCode::PermissionDenied,
            format!(
                "pg {pg}: osd {osd} sent a report naming osd {} as leader: an OSD reports only \
                 for itself",
                r.leader
            ),
        ),
        _ => Ok(()),
    }
}

/// The confirmation rule: a reclaim, snapshot-mark or snapshot-trim confirmation for `pg`
/// comes from an OSD the recorded PG names (`osdlist`, `joint_voters`, `newosdlist` or
/// `learners`). Only the PG's leader applies these entries and confirms them, and the leader
/// hosts the PG; an OSD the PG does not name has nothing of it to confirm, and a confirmation
/// it sent would let the monitor drop a reclaim the PG never did, or create a snapshot
/// without the PG's mark (`docs/security.md`). A genuine leader the record does not name yet
/// (its leader report not recorded) is refused once and confirms again (the shard core
/// repeats a confirmation the monitor still waits for).
pub(crate) fn check_confirmer(pg_id: PgId, pg: &PgInfo, reporter: Reporter) -> OpResult<()> {
    let Reporter::Osd(osd) = reporter else {
        return Ok(());
    };
    if pg.names(osd) {
        return Ok(());
    }
    err(
        ErrorCode::ImplausibleReport,
        format!(
            "pg {pg_id}: osd {osd} confirmed work for a PG whose members [{}] (target [{}], \
             learners [{}]) do not include it",
            list(&pg.osdlist),
            list(&pg.newosdlist),
            list(&pg.learners)
        ),
    )
}

/// The rules that compare a report with the recorded PG; see the module documentation.
pub(crate) fn check_against_record(pg_id: PgId, pg: &PgInfo, r: &Reported) -> OpResult<Verdict> {
    let implausible =
        |rule: String| err(ErrorCode::ImplausibleReport, format!("pg {pg_id}: {rule}"));
    if (r.term, r.conf_index) < (pg.leader_term, pg.conf_index) {
        return err(
            ErrorCode::StaleReport,
            format!(
                "pg {pg_id}: report for term {} conf index {} is older than term {} conf index {}",
                r.term, r.conf_index, pg.leader_term, pg.conf_index
            ),
        );
    }
    if r.term.0 - pg.leader_term.0 > REPORT_TERM_STEP_MAX {
        return implausible(format!(
            "report for term {} raises the recorded term {} by more than {REPORT_TERM_STEP_MAX}, \
             the most genuine elections do between two reports",
            r.term, pg.leader_term
        ));
    }
    if let Some(recorded) = pg
        .leader
        .filter(|l| r.term == pg.leader_term && *l != r.leader)
    {
        return implausible(format!(
            "osd {} reports leading term {}, which osd {recorded} leads: Raft has one leader per \
             term",
            r.leader, r.term
        ));
    }
    if pg.restored && r.conf_index >= pg.conf_index {
        // Restored from a backup (`PgInfo::restored`): the record may be older than the PG's
        // configuration in any way, so the leader's report is the only account of it there
        // is. The sender, term and staleness rules above still hold.
        return Ok(Verdict::Record);
    }
    let hosts = pg.osdlist.contains(&r.leader)
        || pg.newosdlist.contains(&r.leader)
        || pg.learners.contains(&r.leader);
    if r.conf_index < pg.conf_index {
        // A new term (the older pair is stale above) whose leader has not applied the
        // recorded configuration yet: its members are older than the recorded ones.
        if !hosts {
            return err(
                ErrorCode::StaleReport,
                format!(
                    "pg {pg_id}: osd {} reports conf index {}, older than the recorded {}, \
                     whose members do not include it",
                    r.leader, r.conf_index, pg.conf_index
                ),
            );
        }
        return Ok(Verdict::LeaderOnly);
    }
    if !hosts {
        return implausible(format!(
            "leader osd {} does not host the pg: the monitor records members {}, target {}, \
             learners {}",
            r.leader,
            list(&pg.osdlist),
            list(&pg.newosdlist),
            list(&pg.learners)
        ));
    }
    let reported: BTreeSet<OsdId> = r.osdlist.iter().chain(&r.joint_voters).copied().collect();
    let dropped: Vec<OsdId> = pg
        .osdlist
        .iter()
        .chain(&pg.joint_voters)
        .filter(|o| !reported.contains(o))
        .copied()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let left_out = |o: &OsdId| {
        (!pg.newosdlist.is_empty() && !pg.newosdlist.contains(o))
            || (!pg.joint_voters.is_empty() && !pg.joint_voters.contains(o))
            || pg.released.contains(o)
    };
    let unexplained: Vec<OsdId> = dropped.iter().filter(|o| !left_out(o)).copied().collect();
    if !unexplained.is_empty() {
        return implausible(format!(
            "report for term {} conf index {} drops voters {} of {} (incoming {}), which \
             neither the target {}, a recorded joint configuration nor an earlier target \
             (released {}) leaves out",
            r.term,
            r.conf_index,
            list(&unexplained),
            list(&pg.osdlist),
            list(&pg.joint_voters),
            list(&pg.newosdlist),
            list(&pg.released)
        ));
    }
    Ok(Verdict::Record)
}

/// What `pg.released` should be (see the module documentation): the recorded voters the
/// current target leaves out, added; the OSDs the recorded configuration no longer names as
/// voters, dropped. `None` when it is already that (the common case, found without
/// allocating). Applied to every state the monitor publishes (`MonState::derive_pg_states`,
/// which every operation's `finish` runs), so every target a leader can have seen is
/// accounted for. Bounded by the PG's voters: it never holds a non-member.
pub(crate) fn released_after(pg: &PgInfo) -> Option<Vec<OsdId>> {
    let is_voter = |o: &OsdId| pg.osdlist.contains(o) || pg.joint_voters.contains(o);
    let left_out = |o: &OsdId| !pg.newosdlist.is_empty() && !pg.newosdlist.contains(o);
    let stale = pg.released.iter().any(|o| !is_voter(o));
    let missing = pg
        .osdlist
        .iter()
        .chain(&pg.joint_voters)
        .any(|o| left_out(o) && !pg.released.contains(o));
    if !stale && !missing {
        return None;
    }
    let mut released: BTreeSet<OsdId> = pg
        .released
        .iter()
        .filter(|o| is_voter(o))
        .copied()
        .collect();
    released.extend(
        pg.osdlist
            .iter()
            .chain(&pg.joint_voters)
            .filter(|o| left_out(o)),
    );
    let released: Vec<OsdId> = released.into_iter().collect();
    debug_assert!(released.iter().all(is_voter));
    Some(released)
}

/// `[1, 2, 3]`: OSD ids as the CLI and the map show them.
fn list(osds: &[OsdId]) -> String {
    let ids: Vec<String> = osds.iter().map(|o| o.to_string()).collect();
    format!("[{}]", ids.join(", "))
}

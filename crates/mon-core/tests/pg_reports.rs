//! PG leaders' reports: the sequences genuine leaders send are recorded (election, a joint
//! change, its end, a target that moves or is cancelled mid-change, a new leader behind the
//! recorded configuration), and reports that no genuine leader sends are refused with the rule
//! they break, changing nothing (`crate::report_checks`).

mod common;

use common::{boot_request, op, uuid};
use fastblock_mon_core::limits::REPORT_TERM_STEP_MAX;
use fastblock_mon_core::{MonState, OpResult, Reporter};
use fastblock_types::api::*;
use fastblock_types::map::{FailureDomain, PgInfo};
use fastblock_types::{LogIndex, OsdId, PgId, PoolId, Term};

const PG: PgId = PgId {
    pool: PoolId(1),
    seq: 0,
};

/// `osds` OSDs on their own hosts, one pool of size 3 with one PG.
fn cluster(osds: u32) -> MonState {
    let mut s = MonState::default();
    for i in 0..osds {
        let id = op(&mut s, |s| s.apply_id(&uuid(i))).unwrap();
        op(&mut s, |s| s.boot(id, &boot_request(i, None))).unwrap();
    }
    op(&mut s, |s| {
        s.create_pool(&CreatePoolRequest {
            name: "p".into(),
            pg_count: 1,
            size: 3,
            failure_domain: FailureDomain::Osd,
        })
    })
    .unwrap();
    s
}

fn info(s: &MonState) -> PgInfo {
    s.map.pg(PG).unwrap().clone()
}

fn sorted(mut v: Vec<OsdId>) -> Vec<OsdId> {
    v.sort();
    v
}

/// A leader report as the PG replica sends it (`voters` is the incoming half while joint).
struct Conf<'a> {
    term: u64,
    conf: u64,
    voters: &'a [OsdId],
    outgoing: &'a [OsdId],
    learners: &'a [OsdId],
}

fn elected(s: &mut MonState, from: Reporter, leader: OsdId, c: Conf) -> OpResult<PgInfo> {
    let req = LeaderElectedRequest {
        leader,
        term: Term(c.term),
        conf_index: LogIndex(c.conf),
        voters: c.voters.to_vec(),
        voters_outgoing: c.outgoing.to_vec(),
        learners: c.learners.to_vec(),
    };
    op(s, |s| s.leader_elected(PG, &req, from))
}

fn finished(
    s: &mut MonState,
    leader: OsdId,
    term: u64,
    conf: u64,
    voters: &[OsdId],
) -> OpResult<PgInfo> {
    let req = MembershipFinishedRequest {
        leader,
        term: Term(term),
        conf_index: LogIndex(conf),
        voters: voters.to_vec(),
        learners: Vec::new(),
    };
    op(s, |s| {
        s.membership_finished(PG, &req, Reporter::Osd(leader))
    })
}

fn conf<'a>(
    term: u64,
    conf: u64,
    voters: &'a [OsdId],
    outgoing: &'a [OsdId],
    learners: &'a [OsdId],
) -> Conf<'a> {
    Conf {
        term,
        conf,
        voters,
        outgoing,
        learners,
    }
}

fn plain(term: u64, conf: u64, voters: &[OsdId]) -> Conf<'_> {
    Conf {
        term,
        conf,
        voters,
        outgoing: &[],
        learners: &[],
    }
}

/// Asserts the report is refused with `code`, names the PG, and changes nothing.
fn refused(
    s: &mut MonState,
    code: ErrorCode,
    f: impl FnOnce(&mut MonState) -> OpResult<PgInfo>,
) -> ApiError {
    let before = s.clone();
    let e = f(s).expect_err("refused");
    assert_eq!(e.code, code, "{e}");
    assert!(e.message.contains("pg 1.0"), "{e}");
    assert_eq!(*s, before, "a refused report changes nothing");
    e
}

/// The PG's three members, elected with `members[0]` leading at term 6.
fn elected_cluster(osds: u32) -> (MonState, Vec<OsdId>) {
    let mut s = cluster(osds);
    let o = info(&s).osdlist;
    let a = o[0];
    elected(&mut s, Reporter::Osd(a), a, plain(6, 5, &o)).unwrap();
    assert_eq!(info(&s).leader, Some(a));
    (s, o)
}

/// Marks `osd` out; returns the PG's new target and the member it brought in.
fn out(s: &mut MonState, osd: OsdId) -> (Vec<OsdId>, OsdId) {
    op(s, |s| s.mark_out(osd)).unwrap();
    let pg = info(s);
    assert!(!pg.newosdlist.is_empty() && !pg.newosdlist.contains(&osd));
    let new = *pg
        .newosdlist
        .iter()
        .find(|o| !pg.osdlist.contains(o))
        .expect("a replacement");
    (pg.newosdlist, new)
}

/// The report of issue 16: one member claims term and index 2^64-1 with itself as the only
/// voter. Without the checks it took the other two members out of the map (they deleted their
/// replicas) and fenced out every genuine report for good.
#[test]
fn the_report_that_took_a_pg_away_is_refused_and_genuine_ones_still_land() {
    let (mut s, o) = elected_cluster(3);
    let a = o[0];
    let e = refused(&mut s, ErrorCode::ImplausibleReport, |s| {
        elected(s, Reporter::Osd(a), a, plain(u64::MAX, u64::MAX, &[a]))
    });
    assert!(e.message.contains(&u64::MAX.to_string()), "{e}");
    assert!(e.message.contains("raises the recorded term 6"), "{e}");
    // Within the term bound, the voter set still may not drop two members.
    let e = refused(&mut s, ErrorCode::ImplausibleReport, |s| {
        elected(s, Reporter::Osd(a), a, plain(7, 9, &[a]))
    });
    assert!(e.message.contains("drops voters"), "{e}");
    let (x, y) = (o[1].min(o[2]), o[1].max(o[2]));
    assert!(
        e.message.contains(&format!("drops voters [{x}, {y}]")),
        "{e}"
    );
    let b = o[1];
    let pg = elected(&mut s, Reporter::Osd(b), b, plain(7, 9, &o)).unwrap();
    assert_eq!((pg.leader, pg.leader_term), (Some(b), Term(7)));
    assert_eq!(pg.osdlist, o);
}

#[test]
fn a_report_for_another_osd_is_permission_denied() {
    let (mut s, o) = elected_cluster(3);
    let e = refused(&mut s, ErrorCode::PermissionDenied, |s| {
        elected(s, Reporter::Osd(o[2]), o[1], plain(7, 9, &o))
    });
    assert_eq!(e.code.http_status(), 403);
    assert!(e
        .message
        .contains(&format!("osd {} sent a report naming osd {}", o[2], o[1])));
    let req = MembershipFinishedRequest {
        leader: o[1],
        term: Term(7),
        conf_index: LogIndex(9),
        voters: o.clone(),
        learners: Vec::new(),
    };
    refused(&mut s, ErrorCode::PermissionDenied, |s| {
        s.membership_finished(PG, &req, Reporter::Osd(o[0]))
    });
    // Without authentication the sender is not checked; the other rules still are.
    let pg = elected(&mut s, Reporter::Unauthenticated, o[1], plain(7, 9, &o)).unwrap();
    assert_eq!(pg.leader, Some(o[1]));
    refused(&mut s, ErrorCode::ImplausibleReport, |s| {
        elected(s, Reporter::Unauthenticated, o[1], plain(8, 9, &[o[1]]))
    });
}

#[test]
fn a_leader_that_does_not_host_the_pg_is_refused() {
    let (mut s, o) = elected_cluster(4);
    let x = s
        .map
        .osds
        .keys()
        .copied()
        .find(|id| !o.contains(id))
        .unwrap();
    let voters = [o.clone(), vec![x]].concat();
    let e = refused(&mut s, ErrorCode::ImplausibleReport, |s| {
        elected(s, Reporter::Osd(x), x, plain(7, 9, &voters))
    });
    assert!(
        e.message
            .contains(&format!("leader osd {x} does not host the pg")),
        "{e}"
    );
}

#[test]
fn the_term_rises_by_at_most_the_bound() {
    let (mut s, o) = elected_cluster(3);
    let a = o[0];
    let too_far = 6 + REPORT_TERM_STEP_MAX + 1;
    refused(&mut s, ErrorCode::ImplausibleReport, |s| {
        elected(s, Reporter::Osd(a), a, plain(too_far, 5, &o))
    });
    let pg = elected(&mut s, Reporter::Osd(a), a, plain(too_far - 1, 5, &o)).unwrap();
    assert_eq!(pg.leader_term, Term(too_far - 1));
}

#[test]
fn one_term_has_one_leader_and_older_reports_are_stale() {
    let (mut s, o) = elected_cluster(3);
    let e = refused(&mut s, ErrorCode::ImplausibleReport, |s| {
        elected(s, Reporter::Osd(o[1]), o[1], plain(6, 9, &o))
    });
    assert!(e.message.contains("one leader per term"), "{e}");
    refused(&mut s, ErrorCode::StaleReport, |s| {
        elected(s, Reporter::Osd(o[1]), o[1], plain(5, 9, &o))
    });
    refused(&mut s, ErrorCode::StaleReport, |s| {
        elected(s, Reporter::Osd(o[0]), o[0], plain(6, 4, &o))
    });
}

/// A member taken out by a report that no target or joint configuration explains.
#[test]
fn a_voter_dropped_without_a_recorded_change_is_refused() {
    let (mut s, o) = elected_cluster(4);
    let (target, new) = out(&mut s, o[2]);
    // The target leaves out o[2] only: dropping o[1] too is refused, with learners or not.
    let e = refused(&mut s, ErrorCode::ImplausibleReport, |s| {
        elected(s, Reporter::Osd(o[0]), o[0], plain(6, 9, &[o[0], new]))
    });
    assert!(
        e.message.contains(&format!("drops voters [{}]", o[1])),
        "{e}"
    );
    // A finished report naming a voter set that drops o[1].
    refused(&mut s, ErrorCode::ImplausibleReport, |s| {
        finished(s, o[0], 6, 9, &[o[0], new])
    });
    // The target's members are fine.
    let pg = finished(&mut s, o[0], 6, 9, &target).unwrap();
    assert_eq!(sorted(pg.osdlist), sorted(target));
}

/// Out, learner added, joint, left, finished: each report is recorded as the leader sends it.
#[test]
fn a_joint_change_is_recorded_and_finished() {
    let (mut s, o) = elected_cluster(4);
    let a = o[0];
    let (target, new) = out(&mut s, o[2]);
    let me = Reporter::Osd(a);
    let pg = elected(&mut s, me, a, conf(6, 10, &o, &[], &[new])).unwrap();
    assert_eq!(
        (pg.osdlist.clone(), pg.learners.clone()),
        (o.clone(), vec![new])
    );
    assert!(pg.joint_voters.is_empty());
    let pg = elected(&mut s, me, a, conf(6, 11, &target, &o, &[])).unwrap();
    assert_eq!(pg.osdlist, o, "the outgoing voters while joint");
    assert_eq!(pg.joint_voters, target);
    assert_eq!(pg.learners, vec![new]);
    assert_eq!(pg.newosdlist, target);
    let pg = elected(&mut s, me, a, plain(6, 12, &target)).unwrap();
    assert_eq!(pg.osdlist, target);
    assert!(pg.joint_voters.is_empty() && pg.newosdlist.is_empty() && pg.learners.is_empty());
    let pg = finished(&mut s, a, 6, 12, &target).unwrap();
    assert_eq!(pg.osdlist, target);
}

/// The OSD comes back in after the group entered the joint configuration: the target is
/// cancelled, but the group still leaves the joint state towards the old target (a leader
/// always leaves first), and that report drops the outgoing member the joint record names.
#[test]
fn a_joint_change_whose_target_was_cancelled_still_ends() {
    let (mut s, o) = elected_cluster(4);
    let a = o[0];
    let (target, _) = out(&mut s, o[2]);
    let joint = Conf {
        term: 6,
        conf: 11,
        voters: &target,
        outgoing: &o,
        learners: &[],
    };
    elected(&mut s, Reporter::Osd(a), a, joint).unwrap();
    op(&mut s, |s| s.mark_in(o[2])).unwrap();
    let pg = info(&s);
    assert!(pg.newosdlist.is_empty(), "target cancelled: {pg:?}");
    let pg = elected(&mut s, Reporter::Osd(a), a, plain(6, 12, &target)).unwrap();
    assert_eq!(pg.osdlist, target);
    assert!(pg.joint_voters.is_empty());
}

/// A second out while the group is joint moves the target; the group leaves the joint state to
/// the first target, then walks to the second.
#[test]
fn a_target_moved_mid_change_is_followed() {
    let (mut s, o) = elected_cluster(5);
    let a = o[0];
    let me = Reporter::Osd(a);
    let (first, new) = out(&mut s, o[2]);
    let joint = Conf {
        term: 6,
        conf: 11,
        voters: &first,
        outgoing: &o,
        learners: &[],
    };
    elected(&mut s, me, a, joint).unwrap();
    op(&mut s, |s| s.mark_out(new)).unwrap();
    let second = info(&s).newosdlist;
    assert!(
        !second.contains(&new) && !second.contains(&o[2]),
        "{second:?}"
    );
    let newer = *second.iter().find(|x| !first.contains(x)).unwrap();
    let pg = elected(&mut s, me, a, plain(6, 12, &first)).unwrap();
    assert_eq!(
        (pg.osdlist, pg.newosdlist.clone()),
        (first.clone(), second.clone())
    );
    let learner = Conf {
        term: 6,
        conf: 13,
        voters: &first,
        outgoing: &[],
        learners: &[newer],
    };
    elected(&mut s, me, a, learner).unwrap();
    let joint = Conf {
        term: 6,
        conf: 14,
        voters: &second,
        outgoing: &first,
        learners: &[],
    };
    elected(&mut s, me, a, joint).unwrap();
    let pg = finished(&mut s, a, 6, 15, &second).unwrap();
    assert_eq!(pg.osdlist, second);
    assert!(pg.newosdlist.is_empty() && pg.joint_voters.is_empty());
}

/// A new leader reports the configuration it applied, which may be older than the recorded
/// one: it is recorded as the leader, the newer members stay; a removed member that has not
/// applied its removal yet is stale.
#[test]
fn a_new_leader_behind_the_recorded_configuration_records_only_itself() {
    let (mut s, o) = elected_cluster(4);
    let a = o[0];
    let (target, _) = out(&mut s, o[2]);
    let joint = Conf {
        term: 6,
        conf: 11,
        voters: &target,
        outgoing: &o,
        learners: &[],
    };
    elected(&mut s, Reporter::Osd(a), a, joint).unwrap();
    elected(&mut s, Reporter::Osd(a), a, plain(6, 12, &target)).unwrap();
    let b = o[1];
    let behind = Conf {
        term: 7,
        conf: 11,
        voters: &target,
        outgoing: &o,
        learners: &[],
    };
    let pg = elected(&mut s, Reporter::Osd(b), b, behind).unwrap();
    assert_eq!(
        (pg.leader, pg.leader_term, pg.conf_index),
        (Some(b), Term(7), LogIndex(12))
    );
    assert_eq!(pg.osdlist, target);
    assert!(pg.joint_voters.is_empty());
    let gone = o[2];
    let e = refused(&mut s, ErrorCode::StaleReport, |s| {
        elected(s, Reporter::Osd(gone), gone, plain(8, 5, &o))
    });
    assert!(e.message.contains("whose members do not include it"), "{e}");
}

/// Issue 34, simulator seed 17722765049566651514: the leader adds the target's new member as a
/// learner and reports it; the OSD that went out comes back in, so the monitor cancels the
/// target; the leader, acting on its older map, enters the joint configuration and leaves it
/// in quick succession, and only the second report is sent. That report drops the member the
/// cancelled target left out, and it is genuine: it is recorded.
#[test]
fn a_change_finished_after_its_target_was_cancelled_and_its_joint_report_superseded() {
    let (mut s, o) = elected_cluster(4);
    let a = o[0];
    let me = Reporter::Osd(a);
    let (target, new) = out(&mut s, o[2]);
    elected(&mut s, me, a, conf(6, 32, &o, &[], &[new])).unwrap();
    op(&mut s, |s| s.mark_in(o[2])).unwrap();
    let pg = info(&s);
    assert!(pg.newosdlist.is_empty(), "target cancelled: {pg:?}");
    assert!(
        pg.joint_voters.is_empty(),
        "the joint state was never reported"
    );
    assert_eq!(
        pg.released,
        vec![o[2]],
        "the cancelled target left o[2] out"
    );
    elected(&mut s, me, a, plain(6, 34, &target)).unwrap();
    let pg = info(&s);
    assert!(
        pg.released.is_empty(),
        "{pg:?}: the dropped member is no longer a voter"
    );
    assert_eq!(sorted(pg.osdlist), sorted(target.clone()));
    assert!(pg.learners.is_empty() && pg.newosdlist.is_empty());
}

/// A member a published target left out stays droppable while it remains a voter of the
/// recorded configuration; members no target ever left out stay protected, before and after.
#[test]
fn only_members_a_published_target_left_out_may_be_dropped() {
    let (mut s, o) = elected_cluster(5);
    let a = o[0];
    let me = Reporter::Osd(a);
    let (target, new) = out(&mut s, o[2]);
    op(&mut s, |s| s.mark_in(o[2])).unwrap();
    assert_eq!(info(&s).released, vec![o[2]]);
    // o[1] was never left out by any target: dropping it is refused, o[2] or not.
    let e = refused(&mut s, ErrorCode::ImplausibleReport, |s| {
        elected(s, me, a, plain(6, 9, &[a, o[2], new]))
    });
    assert!(
        e.message.contains(&format!("drops voters [{}]", o[1])),
        "{e}"
    );
    assert!(e.message.contains(&format!("released [{}]", o[2])), "{e}");
    // The genuine report completing the withdrawn change is recorded, and released empties.
    elected(&mut s, me, a, plain(6, 9, &target)).unwrap();
    let pg = info(&s);
    assert!(pg.released.is_empty(), "{pg:?}");
    // Now no member of the new configuration was ever left out by a target.
    let e = refused(&mut s, ErrorCode::ImplausibleReport, |s| {
        elected(s, me, a, plain(6, 10, &[a, o[1]]))
    });
    assert!(e.message.contains(&format!("drops voters [{new}]")), "{e}");
}

/// After a restore from a backup (`PgInfo::restored`) the record may be older than the PG in
/// any way: the first report at or past the recorded configuration is recorded as it is, even
/// from a leader the record does not name and dropping members no target left out; the
/// sender, term and staleness rules still hold, and the usual rules apply again afterwards.
#[test]
fn a_restored_pg_takes_its_leaders_next_report_as_its_configuration() {
    let (mut s, o) = elected_cluster(5);
    let others: Vec<OsdId> = s
        .map
        .osds
        .keys()
        .copied()
        .filter(|id| !o.contains(id))
        .collect();
    let (x, y) = (others[0], others[1]);
    s.map
        .pgmaps
        .get_mut(&PG.pool)
        .unwrap()
        .pgs
        .get_mut(&PG.seq)
        .unwrap()
        .restored = true;
    // Still refused: another OSD speaking for x, and a report older than the record.
    refused(&mut s, ErrorCode::PermissionDenied, |s| {
        elected(s, Reporter::Osd(o[0]), x, plain(9, 20, &[x, y, o[0]]))
    });
    refused(&mut s, ErrorCode::StaleReport, |s| {
        elected(s, Reporter::Osd(x), x, plain(5, 20, &[x, y, o[0]]))
    });
    // The members moved to x, y and o[0] since the backup: recorded as reported.
    let moved = [x, y, o[0]];
    elected(&mut s, Reporter::Osd(x), x, plain(9, 20, &moved)).unwrap();
    let pg = info(&s);
    assert_eq!(pg.osdlist, moved.to_vec());
    assert_eq!((pg.leader, pg.restored), (Some(x), false));
    // From now on the usual rules: dropping y, which no target left out, is refused.
    refused(&mut s, ErrorCode::ImplausibleReport, |s| {
        elected(s, Reporter::Osd(x), x, plain(9, 21, &[x, o[0]]))
    });
}

//! The next step of a membership change, as a pure decision.
//!
//! The monitor names a target voter set (a PG's `newosdlist`); the PG leader walks the Raft
//! configuration there in steps that each keep the group available and safe:
//!
//! 1. add every missing target member as a learner (one simple change each);
//! 2. wait until every learner of the target has caught up (it received a snapshot if the log
//!    no longer reached back for it, then the log up to near the leader's last index);
//! 3. enter the joint configuration `old ∧ target` (ConfChangeV2, explicit transition), after
//!    handing leadership to a caught-up voter of the target if the leader is itself leaving;
//! 4. leave the joint configuration (an empty ConfChangeV2);
//! 5. remove learners the target does not name; then report the change finished.
//!
//! Without a target (none, or the monitor cancelled the change) a joint configuration is left
//! and learners are removed.
//!
//! The decision depends only on the current configuration and the followers' progress, never
//! on what this leader did before, so any leader (a new one after a crash, or one that missed
//! a step) continues an interrupted change from wherever the log left it. A joint
//! configuration is always left first, whatever the target, so a leader never stays joint.

use fastblock_types::OsdId;
use std::collections::{BTreeMap, BTreeSet};

/// A learner counts as caught up when its matched index is within this many entries of the
/// leader's last index, and it is being replicated to (not probed or snapshotted).
pub const CATCHUP_SLACK_ENTRIES: u64 = 64;

/// What the leader knows about one member's replication.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberProgress {
    pub matched: u64,
    /// In the replicate state (the log is streaming to it): not probing, not snapshotting.
    pub replicating: bool,
}

/// The configuration and progress the decision reads.
#[derive(Clone, Debug, Default)]
pub struct ConfView {
    pub voters: BTreeSet<OsdId>,
    /// Non-empty while joint.
    pub voters_outgoing: BTreeSet<OsdId>,
    pub learners: BTreeSet<OsdId>,
    pub progress: BTreeMap<OsdId, MemberProgress>,
    pub last_index: u64,
}

/// One step for the leader to take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing to do now (waiting for a learner, or no target).
    Wait,
    AddLearner(OsdId),
    RemoveLearner(OsdId),
    /// Enter the joint configuration: these become the voters (the current ones remain the
    /// outgoing half until `LeaveJoint`).
    EnterJoint {
        voters: Vec<OsdId>,
    },
    LeaveJoint,
    /// This leader leaves the group: hand leadership to this caught-up voter first.
    TransferLeader(OsdId),
    /// The configuration is the target.
    Done,
}

impl ConfView {
    fn caught_up(&self, osd: OsdId) -> bool {
        self.progress
            .get(&osd)
            .is_some_and(|p| p.replicating && p.matched + CATCHUP_SLACK_ENTRIES >= self.last_index)
    }

    /// The most advanced caught-up member of `among` other than `me`.
    fn best_successor(&self, me: OsdId, among: &BTreeSet<OsdId>) -> Option<OsdId> {
        among
            .iter()
            .filter(|o| **o != me && self.caught_up(**o))
            .max_by_key(|o| (self.progress[o].matched, std::cmp::Reverse(**o)))
            .copied()
    }
}

/// The next step towards `target` for leader `me`. `target` is `None` when the monitor wants
/// no change; a joint configuration is still left then.
pub fn next_step(me: OsdId, view: &ConfView, target: Option<&BTreeSet<OsdId>>) -> Step {
    if !view.voters_outgoing.is_empty() {
        if !view.voters.contains(&me) {
            // Leaving the joint configuration would leave a leader outside the group.
            return match view.best_successor(me, &view.voters) {
                Some(next) => Step::TransferLeader(next),
                None => Step::Wait,
            };
        }
        return Step::LeaveJoint;
    }
    let Some(target) = target else {
        // No change wanted (none, or the monitor cancelled one, e.g. the OSD that went out
        // came back in): learners left from a change go, so the configuration is the voters
        // the monitor lists and no learner keeps a replica nobody accounts for.
        return match view.learners.iter().next() {
            Some(learner) => Step::RemoveLearner(*learner),
            None => Step::Wait,
        };
    };
    if target.is_empty() {
        return Step::Wait; // never remove every voter
    }
    if let Some(missing) = target
        .iter()
        .find(|o| !view.voters.contains(o) && !view.learners.contains(o))
    {
        return Step::AddLearner(*missing);
    }
    if *target != view.voters {
        if target
            .iter()
            .any(|o| view.learners.contains(o) && !view.caught_up(*o))
        {
            return Step::Wait;
        }
        if !target.contains(&me) {
            // Hand over to a voter that stays, so the new leader drives the rest. If no
            // current voter stays (a full replacement), enter joint and hand over from there.
            let staying: BTreeSet<OsdId> = view.voters.intersection(target).copied().collect();
            if let Some(next) = view.best_successor(me, &staying) {
                return Step::TransferLeader(next);
            }
        }
        return Step::EnterJoint {
            voters: target.iter().copied().collect(),
        };
    }
    if let Some(extra) = view.learners.iter().find(|o| !target.contains(o)) {
        return Step::RemoveLearner(*extra);
    }
    Step::Done
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ids: &[u32]) -> BTreeSet<OsdId> {
        ids.iter().map(|i| OsdId(*i)).collect()
    }

    fn view(voters: &[u32], outgoing: &[u32], learners: &[u32], caught: &[u32]) -> ConfView {
        let mut progress = BTreeMap::new();
        for id in voters.iter().chain(outgoing).chain(learners) {
            let up = caught.contains(id);
            progress.insert(
                OsdId(*id),
                MemberProgress {
                    matched: if up { 100 } else { 0 },
                    replicating: up,
                },
            );
        }
        ConfView {
            voters: set(voters),
            voters_outgoing: set(outgoing),
            learners: set(learners),
            progress,
            last_index: 100,
        }
    }

    #[test]
    fn replaces_one_member_in_order() {
        let me = OsdId(1);
        let t = set(&[1, 2, 4]);
        let v = view(&[1, 2, 3], &[], &[], &[1, 2, 3]);
        assert_eq!(next_step(me, &v, Some(&t)), Step::AddLearner(OsdId(4)));
        let v = view(&[1, 2, 3], &[], &[4], &[1, 2, 3]);
        assert_eq!(next_step(me, &v, Some(&t)), Step::Wait);
        let v = view(&[1, 2, 3], &[], &[4], &[1, 2, 3, 4]);
        assert_eq!(
            next_step(me, &v, Some(&t)),
            Step::EnterJoint {
                voters: vec![OsdId(1), OsdId(2), OsdId(4)]
            }
        );
        let v = view(&[1, 2, 4], &[1, 2, 3], &[], &[1, 2, 3, 4]);
        assert_eq!(next_step(me, &v, Some(&t)), Step::LeaveJoint);
        let v = view(&[1, 2, 4], &[], &[], &[1, 2, 4]);
        assert_eq!(next_step(me, &v, Some(&t)), Step::Done);
    }

    #[test]
    fn a_leaving_leader_hands_over_first() {
        let me = OsdId(3);
        let t = set(&[1, 2, 4]);
        let v = view(&[1, 2, 3], &[], &[4], &[1, 2, 3, 4]);
        assert_eq!(next_step(me, &v, Some(&t)), Step::TransferLeader(OsdId(1)));
        // Full replacement: joint first, then hand over inside the joint configuration.
        let t = set(&[4, 5, 6]);
        let v = view(&[1, 2, 3], &[], &[4, 5, 6], &[1, 2, 3, 4, 5, 6]);
        assert_eq!(
            next_step(OsdId(1), &v, Some(&t)),
            Step::EnterJoint {
                voters: vec![OsdId(4), OsdId(5), OsdId(6)]
            }
        );
        let v = view(&[4, 5, 6], &[1, 2, 3], &[], &[1, 2, 3, 4, 5, 6]);
        assert_eq!(
            next_step(OsdId(1), &v, Some(&t)),
            Step::TransferLeader(OsdId(4))
        );
    }

    #[test]
    fn joint_is_left_even_without_a_target() {
        let v = view(&[1, 2, 4], &[1, 2, 3], &[], &[1, 2, 4]);
        assert_eq!(next_step(OsdId(1), &v, None), Step::LeaveJoint);
        let v = view(&[1, 2, 3], &[], &[], &[1, 2, 3]);
        assert_eq!(next_step(OsdId(1), &v, None), Step::Wait);
    }

    /// A cancelled change (the target cleared while a learner was being caught up) removes
    /// the learner rather than leaving it in the configuration for good.
    #[test]
    fn learners_go_when_the_target_is_cancelled() {
        let v = view(&[1, 2, 3], &[], &[4], &[1, 2, 3]);
        assert_eq!(next_step(OsdId(1), &v, None), Step::RemoveLearner(OsdId(4)));
    }

    #[test]
    fn stale_learners_are_removed_and_targets_may_move() {
        let t = set(&[1, 2, 3]);
        let v = view(&[1, 2, 3], &[], &[5], &[1, 2, 3]);
        assert_eq!(
            next_step(OsdId(1), &v, Some(&t)),
            Step::RemoveLearner(OsdId(5))
        );
        // The target moved on while a learner was catching up: add the new one too.
        let t = set(&[1, 2, 6]);
        let v = view(&[1, 2, 3], &[], &[5], &[1, 2, 3]);
        assert_eq!(
            next_step(OsdId(1), &v, Some(&t)),
            Step::AddLearner(OsdId(6))
        );
        let v = view(&[1, 2, 3], &[], &[5, 6], &[1, 2, 3, 6]);
        assert_eq!(
            next_step(OsdId(1), &v, Some(&t)),
            Step::EnterJoint {
                voters: vec![OsdId(1), OsdId(2), OsdId(6)]
            }
        );
        let v = view(&[1, 2, 6], &[], &[5], &[1, 2, 6]);
        assert_eq!(
            next_step(OsdId(1), &v, Some(&t)),
            Step::RemoveLearner(OsdId(5))
        );
    }

    #[test]
    fn never_empties_the_group() {
        let v = view(&[1, 2, 3], &[], &[], &[1, 2, 3]);
        assert_eq!(next_step(OsdId(1), &v, Some(&BTreeSet::new())), Step::Wait);
    }
}

//! When an OSD may delete its replica of a PG, as a pure decision.
//!
//! The monitor lists a PG's members (`osdlist`, the target `newosdlist`, and `learners`: the
//! other members of the Raft configuration the leader last reported). An OSD the map does not
//! name may still be a member, because the map lags the configuration: a leader adds a learner
//! and the monitor hears of it a moment later, or the monitor cancels a change (an OSD came back
//! in) while the learner is being caught up. A member that deleted its replica while the leader
//! counted it (its matched index) would come back empty and raft-rs would stop on a commit index
//! past its log (found by the simulator, seeds 15207592191153939403 and 14109521515791744902);
//! a voter that did so would lose acknowledged writes.
//!
//! So the replica goes only if its own durable state says it holds nothing the group counts on.
//! The map's configuration index `C` comes from a committed configuration that does not name
//! this OSD. The replica keeps its data if its configuration names it and either
//! - it applied up to `C` or past it: it applied the change that removed it, so being named
//!   again means it was added back afterwards (a new member's snapshot is past `C` too); or
//! - its log holds a configuration change after `C`, which may be its own re-addition.
//!
//! Otherwise it is a new member that never received its snapshot (its configuration does not
//! name it), a removed member that applied its removal, or one that never learned of it: the
//! leader stops sending to a member once it applies the member's removal, and the entries it
//! sent before that (up to and after the removal entry) leave the member believing it still
//! belongs (the simulator's most common leftover replica). Nothing it acknowledged after `C`
//! re-added it, and a later re-addition starts from a fresh progress.
//!
//! One window remains: the leader re-adds the member (fresh progress) and matches its old log
//! before the monitor hears of the re-add, and in that moment the monitor cancels the change and
//! the member deletes. The member then comes back empty while the leader counts entries it had;
//! `PgReplica::step` does not step the heartbeat that would make raft-rs stop but answers it,
//! so the leader resumes sending: its appends fail the log-matching check and it probes back
//! to what the member has, or sends a snapshot.

use raft::eraftpb::ConfState;

/// Whether an OSD the map no longer lists must keep its replica of a PG that still exists.
/// `conf` and `applied` are the replica's durable configuration and applied index (`None`: no
/// log at all); `conf_change_after` says whether its log holds a configuration change after
/// `map_conf_index`, the configuration index the map records for the PG.
pub fn keeps_replica(
    me: u64,
    conf: Option<&ConfState>,
    applied: u64,
    conf_change_after: bool,
    map_conf_index: u64,
) -> bool {
    let Some(cs) = conf else {
        return false;
    };
    let named = cs.voters.contains(&me)
        || cs.voters_outgoing.contains(&me)
        || cs.learners.contains(&me)
        || cs.learners_next.contains(&me);
    named && (applied >= map_conf_index || conf_change_after)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cs(voters: &[u64], learners: &[u64]) -> ConfState {
        ConfState::from((voters.to_vec(), learners.to_vec()))
    }

    #[test]
    fn a_member_added_back_after_the_maps_configuration_keeps_its_replica() {
        // A learner that received its snapshot (applied past the map's index).
        assert!(keeps_replica(4, Some(&cs(&[1, 2, 3], &[4])), 20, false, 12));
        // A removed member whose log holds a later change (perhaps its re-addition).
        assert!(keeps_replica(3, Some(&cs(&[1, 2, 3], &[])), 10, true, 12));
    }

    #[test]
    fn a_replica_outside_its_configuration_goes() {
        assert!(!keeps_replica(4, Some(&cs(&[1, 2, 3], &[])), 20, true, 12));
        assert!(!keeps_replica(4, Some(&ConfState::default()), 0, false, 0));
        assert!(!keeps_replica(4, None, 0, false, 0));
    }

    #[test]
    fn a_removed_member_that_never_learned_of_its_removal_goes() {
        // Its log ends past the removal entry (sent before the leader applied it), but no
        // configuration change follows the map's.
        assert!(!keeps_replica(3, Some(&cs(&[1, 2, 3], &[])), 11, false, 12));
    }
}

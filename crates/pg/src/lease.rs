//! The leader lease: reads a leader may serve without a heartbeat round.
//!
//! A read index confirmed by a quorum proves that, when the round was *asked* (time `t`), a
//! quorum still followed this leader: each of them heard from it at or after `t`. raft-rs
//! (with check-quorum) makes a follower refuse votes and pre-votes for `election_ticks` of its
//! own ticks after it last heard from its leader (`in_lease` in `Raft::step`). So no other
//! leader can be elected before `t` + (those ticks, at their fastest), and until then this
//! leader's committed state is the latest: it may answer reads at its commit index without
//! asking again. `lease_ms` is that window minus a margin; the OSD takes it from
//! `fastblock_types::lease::LeaseTiming::lease_ms` (`election_ticks - 2` ticks by default; a
//! stalled follower ticks late, which lengthens its refusal, not ours). The followers count
//! with their own OSD's tick and election ticks: the monitor refuses the boot of an OSD whose
//! settings would let a lease outlast another OSD's refusal (`LeaseTiming::lease_fits`).
//!
//! What would let another leader in early, and how each is closed:
//! - A follower that restarts forgets its leader and would vote at once: a replica refuses
//!   votes for its first `election_ticks` ticks after opening (`PgReplica::step`), whether or
//!   not it has a lease of its own.
//! - A leadership transfer makes the transferee campaign with `force`, which skips the
//!   followers' refusal: once this leader starts one, the lease is void for the rest of its
//!   term (a `MsgTimeoutNow` may arrive late).
//! - A configuration change can make a quorum of nodes that never confirmed the lease: the
//!   lease is void when one is applied, and only rounds asked afterwards renew it.
//! - A clock that stood still: only `PgReplica::read`, given the driver's clock of that
//!   moment, serves from the lease; a read deferred to later in the driver's round (which may
//!   block in an fdatasync for as long as a disk stalls) asks a quorum.
//!
//! The rounds err the safe way: a round's start is the clock when it was asked, never later
//! than when its heartbeats leave.
//!
//! Why not raft-rs's `LeaseBased` read option: it trusts check-quorum, which the leader runs
//! only every election timeout, so a cut-off leader kept serving for up to twice the timeout
//! (the simulator found the stale read, `isolated_leader_serves_no_stale_read`).

/// The read-index context of a lease renewal (client reads use their op id, never this).
pub const RENEW_CTX: u64 = u64::MAX;

#[derive(Clone, Debug, Default)]
pub struct Lease {
    /// The lease's length (0: no lease; every read asks a quorum).
    lease_ms: u64,
    /// The term the lease belongs to, and until when it holds (driver time, ms).
    term: u64,
    until_ms: u64,
    /// A transfer started in this term: no lease until the next term.
    void_term: Option<u64>,
    /// Bumped by every applied configuration change; a round asked before it does not renew.
    generation: u64,
    /// When a renewal round was asked (and its generation), if one is out.
    renewal: Option<(u64, u64)>,
    /// When a read last used the lease (renewals only run while reads use it).
    used_ms: Option<u64>,
}

impl Lease {
    pub fn new(lease_ms: u64) -> Lease {
        Lease {
            lease_ms,
            ..Lease::default()
        }
    }

    pub fn enabled(&self) -> bool {
        self.lease_ms > 0
    }

    /// Whether a leader of `term` may serve a read at `now_ms` without a round (the caller
    /// also checks that it leads and has committed an entry of its term).
    pub fn holds(&self, term: u64, now_ms: u64) -> bool {
        self.enabled()
            && self.term == term
            && now_ms < self.until_ms
            && self.void_term != Some(term)
    }

    /// A read used the lease at `now_ms`.
    pub fn used(&mut self, now_ms: u64) {
        self.used_ms = Some(now_ms);
    }

    /// The generation to remember with a round asked now.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// A round asked at `asked_ms` (in `generation`) was confirmed by a quorum in `term`.
    pub fn confirmed(&mut self, term: u64, asked_ms: u64, generation: u64) {
        if !self.enabled() || generation != self.generation || self.void_term == Some(term) {
            return;
        }
        let until = asked_ms.saturating_add(self.lease_ms);
        if self.term != term {
            self.term = term;
            self.until_ms = until;
        } else {
            self.until_ms = self.until_ms.max(until);
        }
    }

    /// This leader started a leadership transfer in `term`.
    pub fn void_for_term(&mut self, term: u64) {
        self.void_term = Some(term);
        self.until_ms = 0;
    }

    /// A configuration change was applied.
    pub fn configuration_changed(&mut self) {
        self.generation += 1;
        self.until_ms = 0;
        self.renewal = None;
    }

    /// Leadership was lost: forget the renewal in flight.
    pub fn lost_leadership(&mut self) {
        self.renewal = None;
        self.used_ms = None;
    }

    /// Whether a leader of `term` should ask a renewal round at `now_ms`: reads used the
    /// lease within its length, less than half of it is left, and no renewal is out (or the
    /// last one is older than a lease: lost).
    pub fn wants_renewal(&self, term: u64, now_ms: u64) -> bool {
        if !self.enabled() || self.void_term == Some(term) {
            return false;
        }
        let recently_used = self
            .used_ms
            .is_some_and(|u| now_ms.saturating_sub(u) < self.lease_ms);
        let running_out = self.term != term || self.until_ms < now_ms + self.lease_ms / 2;
        let renewal_out = self
            .renewal
            .is_some_and(|(at, _)| now_ms.saturating_sub(at) < self.lease_ms);
        recently_used && running_out && !renewal_out
    }

    pub fn renewal_asked(&mut self, now_ms: u64) {
        self.renewal = Some((now_ms, self.generation));
    }

    /// The renewal round was confirmed in `term`.
    pub fn renewal_confirmed(&mut self, term: u64) {
        if let Some((asked, generation)) = self.renewal.take() {
            self.confirmed(term, asked, generation);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disabled_never_holds() {
        let mut l = Lease::new(0);
        l.confirmed(1, 0, 0);
        assert!(!l.holds(1, 1));
        l.used(1);
        assert!(!l.wants_renewal(1, 1));
    }

    #[test]
    fn holds_from_the_ask_for_its_length_in_its_term_only() {
        let mut l = Lease::new(800);
        assert!(!l.holds(3, 0));
        l.confirmed(3, 1_000, l.generation());
        assert!(l.holds(3, 1_000));
        assert!(l.holds(3, 1_799));
        assert!(
            !l.holds(3, 1_800),
            "measured from the ask, not the confirmation"
        );
        assert!(!l.holds(4, 1_100), "another term");
        // A later confirmation of an older ask never shortens it.
        l.confirmed(3, 900, l.generation());
        assert!(l.holds(3, 1_750));
    }

    #[test]
    fn a_transfer_voids_the_rest_of_the_term() {
        let mut l = Lease::new(800);
        l.confirmed(3, 1_000, l.generation());
        l.void_for_term(3);
        assert!(!l.holds(3, 1_100));
        l.confirmed(3, 1_200, l.generation());
        assert!(!l.holds(3, 1_300), "no renewal in the voided term");
        l.confirmed(4, 1_400, l.generation());
        assert!(l.holds(4, 1_500), "the next term starts clean");
    }

    #[test]
    fn a_configuration_change_voids_it_and_older_rounds_do_not_renew() {
        let mut l = Lease::new(800);
        let g = l.generation();
        l.confirmed(3, 1_000, g);
        l.configuration_changed();
        assert!(!l.holds(3, 1_100));
        l.confirmed(3, 1_050, g);
        assert!(!l.holds(3, 1_100), "asked under the old configuration");
        l.confirmed(3, 1_100, l.generation());
        assert!(l.holds(3, 1_150));
    }

    #[test]
    fn renews_only_while_used_and_running_out() {
        let mut l = Lease::new(800);
        l.confirmed(3, 1_000, l.generation());
        assert!(!l.wants_renewal(3, 1_500), "unused");
        l.used(1_450);
        assert!(l.wants_renewal(3, 1_500), "300 ms of 800 left");
        assert!(!l.wants_renewal(3, 1_200), "more than half left");
        l.renewal_asked(1_500);
        assert!(!l.wants_renewal(3, 1_600), "one out already");
        l.renewal_confirmed(3);
        assert!(l.holds(3, 2_299));
        assert!(!l.wants_renewal(3, 2_260), "unused for a lease length");
        l.used(2_250);
        l.renewal_asked(2_250);
        l.used(3_000);
        assert!(
            l.wants_renewal(3, 3_100),
            "a renewal older than a lease is lost"
        );
    }
}

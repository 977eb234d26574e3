//! Lease timing: whether one OSD's leaders end their read leases before another OSD could vote
//! for a new leader (`docs/design/osd.md`, "Reads").
//!
//! A PG leader with lease reads answers reads without a quorum round for `lease_ms` after a
//! quorum confirmed it (`fastblock_pg::lease`). That is safe because every member that confirmed
//! refuses votes for a while after hearing from the leader (raft-rs check-quorum: until its
//! `election_ticks`-th tick). The leader counts its lease with its own settings and clock, each
//! member its refusal with its own, and each OSD takes `--tick`, `--election-ticks` and
//! `--lease-reads` on its own command line. So the monitor refuses the boot of an OSD whose
//! timing does not fit that of every other OSD in the map, both ways
//! ([`LeaseTiming::lease_fits`]): PGs move between any OSDs.
//!
//! The numbers, for the OSD's runtime (a tokio interval with `MissedTickBehavior::Delay`; the
//! shard core handles a tick in the order it arrived among the other inputs):
//! - A member refuses votes until its `election_ticks`-th tick after the message, and the first
//!   of them may come right after it: `election_ticks - 1` intervals at least. Ticks never come
//!   early, except that tokio keeps its schedule for a tick fired up to
//!   [`TICK_SCHEDULE_SLACK_MS`] late, so the first tick after a message may be one that was due
//!   that much before it ([`LeaseTiming::vote_refusal_min_ms`]).
//! - The leader counts from when it asked the round, before any member heard it, on its own
//!   clock; the two clocks may run at slightly different rates, so a lease must stay
//!   [`CLOCK_RATE_MARGIN_PERCENT`] below the window it relies on.
//! - An OSD's own lease is the shorter of `election_ticks - 2` ticks (800 ms by default) and its
//!   own window less that margin, so equal settings always fit ([`LeaseTiming::lease_ms`]).
//! - An OSD with lease reads off serves no lease read, but its refusal still bounds the other
//!   OSDs' leases (a replica refuses votes after it opens too, lease reads on or off).

use serde::{Deserialize, Serialize};
use std::fmt;

/// How much earlier than a whole tick after a message the first tick may come: tokio's
/// `Interval` keeps its schedule for a tick that fires at most 5 ms late (and reschedules from
/// the late tick beyond that), so the next one is due less than a tick after it.
pub const TICK_SCHEDULE_SLACK_MS: u64 = 5;

/// How far (percent) a lease stays below the vote-refusal window it relies on, for two hosts'
/// clocks that run at different rates. NTP slews a clock by at most 500 ppm, so two disciplined
/// clocks differ by about 0.1 %; 5 % also covers undisciplined and virtual machines' clocks,
/// and leaves the default lease (800 ms against an 895 ms window) as it was.
pub const CLOCK_RATE_MARGIN_PERCENT: u64 = 5;

/// The longest Raft tick accepted. A tick is a fraction of the election timeout, so above this
/// the setting is almost certainly a unit left out (`--tick 100` is 100 s).
pub const TICK_MS_MAX: u64 = 10_000;

/// Fewest election ticks: a lease of `election_ticks - 2` ticks needs 3, and a PG replica needs
/// more than twice its heartbeat ticks (at least 1) anyway.
pub const ELECTION_TICKS_MIN: u64 = 3;

/// Most election ticks: far beyond a useful timeout even at a 1 ms tick, and it keeps raft-rs's
/// randomized timeout (`[election_ticks, 2 * election_ticks)`) and the lease arithmetic in range.
pub const ELECTION_TICKS_MAX: u64 = 10_000;

/// The settings of one OSD that its PGs' leases depend on, as it reports them at boot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseTiming {
    /// Length of a Raft tick (`--tick`).
    pub tick_ms: u64,
    /// Ticks after hearing from its leader (or after opening) during which a replica refuses
    /// votes; followers campaign after `[election_ticks, 2 * election_ticks)` (`--election-ticks`).
    pub election_ticks: u64,
    /// Whether this OSD's leaders answer reads under a lease (`--lease-reads`).
    pub lease_reads: bool,
}

/// An out-of-range [`LeaseTiming`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LeaseTimingError {
    #[error(
        "tick {0} ms is not within 1..={TICK_MS_MAX} ms (a bare number is seconds: `--tick 100` \
         is 100 s)"
    )]
    Tick(u64),
    #[error("election ticks {0} is not within {ELECTION_TICKS_MIN}..={ELECTION_TICKS_MAX}")]
    ElectionTicks(u64),
}

/// A leader's lease that could outlast a member's refusal to vote.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "a leader with {leader} holds a read lease for {lease_ms} ms, but a member with {member} may \
     vote for another leader {window_ms} ms after hearing from it (a lease must stay \
     {CLOCK_RATE_MARGIN_PERCENT}% below that)"
)]
pub struct LeaseConflict {
    pub leader: LeaseTiming,
    pub member: LeaseTiming,
    pub lease_ms: u64,
    pub window_ms: u64,
}

impl LeaseTiming {
    pub fn validate(&self) -> Result<(), LeaseTimingError> {
        if !(1..=TICK_MS_MAX).contains(&self.tick_ms) {
            return Err(LeaseTimingError::Tick(self.tick_ms));
        }
        if !(ELECTION_TICKS_MIN..=ELECTION_TICKS_MAX).contains(&self.election_ticks) {
            return Err(LeaseTimingError::ElectionTicks(self.election_ticks));
        }
        Ok(())
    }

    /// The shortest time a replica with these settings refuses votes after hearing from its
    /// leader (or after opening), on its own clock (see the module doc).
    pub fn vote_refusal_min_ms(&self) -> u64 {
        self.election_ticks
            .saturating_sub(1)
            .saturating_mul(self.tick_ms)
            .saturating_sub(TICK_SCHEDULE_SLACK_MS)
    }

    /// How long a leader with these settings answers reads after a confirmed round (0: lease
    /// reads off, or a window too short to hold one): `election_ticks - 2` ticks, or less if
    /// that would not stay [`CLOCK_RATE_MARGIN_PERCENT`] below its own refusal window.
    pub fn lease_ms(&self) -> u64 {
        if !self.lease_reads {
            return 0;
        }
        let by_ticks = self
            .election_ticks
            .saturating_sub(2)
            .saturating_mul(self.tick_ms);
        let by_window = u128::from(self.vote_refusal_min_ms()) * 100
            / u128::from(100 + CLOCK_RATE_MARGIN_PERCENT);
        // by_window is below vote_refusal_min_ms, a u64.
        by_ticks.min(by_window as u64)
    }

    /// Whether a leader with these settings may hold its lease in a PG where `member` (another
    /// OSD's settings) votes.
    pub fn lease_fits(&self, member: &LeaseTiming) -> Result<(), LeaseConflict> {
        let lease_ms = self.lease_ms();
        let window_ms = member.vote_refusal_min_ms();
        if u128::from(lease_ms) * u128::from(100 + CLOCK_RATE_MARGIN_PERCENT)
            <= u128::from(window_ms) * 100
        {
            Ok(())
        } else {
            Err(LeaseConflict {
                leader: *self,
                member: *member,
                lease_ms,
                window_ms,
            })
        }
    }

    /// Whether OSDs with these two settings may serve PGs together: each one's lease fits the
    /// other's refusal.
    pub fn check_compatible(&self, other: &LeaseTiming) -> Result<(), LeaseConflict> {
        self.lease_fits(other)?;
        other.lease_fits(self)
    }
}

/// As the OSD's flags: `--tick 100ms --election-ticks 10 --lease-reads true`.
impl fmt::Display for LeaseTiming {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "--tick {}ms --election-ticks {} --lease-reads {}",
            self.tick_ms, self.election_ticks, self.lease_reads
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn timing(tick_ms: u64, election_ticks: u64, lease_reads: bool) -> LeaseTiming {
        LeaseTiming {
            tick_ms,
            election_ticks,
            lease_reads,
        }
    }

    #[test]
    fn the_default_lease_is_election_ticks_less_two() {
        let t = timing(100, 10, true);
        assert_eq!(t.vote_refusal_min_ms(), 895);
        assert_eq!(t.lease_ms(), 800);
        assert_eq!(timing(100, 10, false).lease_ms(), 0);
        assert_eq!(
            t.to_string(),
            "--tick 100ms --election-ticks 10 --lease-reads true"
        );
    }

    #[test]
    fn a_long_timeout_keeps_the_margin_and_a_tiny_one_holds_no_lease() {
        // 998 ticks would outlast 999 ticks less 5 % by far more than a tick.
        let long = timing(100, 1000, true);
        assert_eq!(long.lease_ms(), (999 * 100 - 5) * 100 / 105);
        assert!(long.lease_ms() < 998 * 100);
        // 2 ms less the schedule slack leaves nothing to hold a lease in.
        assert_eq!(timing(1, 3, true).lease_ms(), 0);
    }

    #[test]
    fn a_longer_tick_elsewhere_is_refused_both_ways() {
        let cluster = timing(100, 10, true);
        let slow = timing(200, 10, true);
        let e = slow.check_compatible(&cluster).unwrap_err();
        assert_eq!((e.leader, e.member), (slow, cluster));
        assert_eq!((e.lease_ms, e.window_ms), (1600, 895));
        let e = cluster.check_compatible(&slow).unwrap_err();
        assert_eq!(
            e.leader, slow,
            "whichever side asks, the long lease is the conflict"
        );
        assert!(e.to_string().contains("--tick 200ms"), "{e}");
        assert!(e.to_string().contains("895 ms"), "{e}");
    }

    #[test]
    fn a_member_without_lease_reads_still_bounds_the_others() {
        let cluster = timing(100, 10, true);
        // Its own lease is 0, but it votes again after 445 ms: the cluster's 800 ms outlast it.
        let fast = timing(50, 10, false);
        let e = fast.check_compatible(&cluster).unwrap_err();
        assert_eq!((e.leader, e.member), (cluster, fast));
        // A longer refusal with no lease of its own fits.
        assert_eq!(timing(100, 20, false).check_compatible(&cluster), Ok(()));
    }

    #[test]
    fn different_settings_fit_when_both_leases_stay_inside() {
        // 40 ms x 12: lease min(400, 435 / 1.05) = 400, window 435; 50 ms x 10: 400 and 445.
        let a = timing(40, 12, true);
        let b = timing(50, 10, true);
        assert_eq!(a.check_compatible(&b), Ok(()));
        // 110 ms x 10 leases 880 ms, over 895 ms less 5 %.
        assert!(timing(110, 10, true)
            .check_compatible(&timing(100, 10, true))
            .is_err());
    }

    #[test]
    fn validation_bounds_tick_and_election_ticks() {
        assert_eq!(timing(100, 10, true).validate(), Ok(()));
        assert_eq!(
            timing(0, 10, true).validate(),
            Err(LeaseTimingError::Tick(0))
        );
        assert_eq!(
            timing(100_000, 10, true).validate(),
            Err(LeaseTimingError::Tick(100_000))
        );
        assert_eq!(
            timing(100, 2, true).validate(),
            Err(LeaseTimingError::ElectionTicks(2))
        );
        assert_eq!(
            timing(100, ELECTION_TICKS_MAX + 1, true).validate(),
            Err(LeaseTimingError::ElectionTicks(ELECTION_TICKS_MAX + 1))
        );
        // Old monitors and tests may hand out-of-range values to the rule: no overflow.
        let huge = timing(u64::MAX, u64::MAX, true);
        assert!(huge.lease_ms() < huge.vote_refusal_min_ms());
    }

    fn any_timing() -> impl Strategy<Value = LeaseTiming> {
        (
            1..=TICK_MS_MAX,
            ELECTION_TICKS_MIN..=ELECTION_TICKS_MAX,
            any::<bool>(),
        )
            .prop_map(|(t, e, l)| timing(t, e, l))
    }

    proptest! {
        #[test]
        fn equal_settings_always_fit(t in any_timing()) {
            prop_assert_eq!(t.check_compatible(&t), Ok(()));
        }

        #[test]
        fn compatibility_is_symmetric(a in any_timing(), b in any_timing()) {
            prop_assert_eq!(a.check_compatible(&b).is_ok(), b.check_compatible(&a).is_ok());
        }

        #[test]
        fn a_fitting_lease_ends_before_the_window_even_at_the_margin(
            a in any_timing(),
            b in any_timing(),
        ) {
            if a.lease_fits(&b).is_ok() {
                // The leader's clock may run up to the margin slow against the member's.
                let stretched = a.lease_ms() as f64 * (1.0 + CLOCK_RATE_MARGIN_PERCENT as f64 / 100.0);
                prop_assert!(stretched <= b.vote_refusal_min_ms() as f64);
            }
        }
    }
}

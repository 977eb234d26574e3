//! The client's retry decisions, pure: what a reply means ([`classify`]), and how long to wait
//! before the next attempt ([`Pacer`], [`Backoff`]). No clock, no I/O, no randomness of their
//! own (the caller seeds the jitter), so the async request loop (`retry`) and the simulator's
//! clients make the same decisions, one in real time, the other in virtual time. The table
//! they implement is in `docs/data-path.md`.

use fastblock_types::OsdId;
use fastblock_wire::{LeaderHint, Reply, Status};
use std::time::Duration;

/// First backoff pause. Small: the common retryable cases (a leader just elected, one `Busy`)
/// clear within a millisecond or two.
pub const BACKOFF_FIRST: Duration = Duration::from_millis(2);
/// Longest backoff pause: bounds how late a request notices that a PG has healed.
pub const BACKOFF_MAX: Duration = Duration::from_millis(250);
/// Redirects (`NotLeader` with a hint, a newer map) followed at once, without a pause. More in
/// a row means leadership is moving (an election): back off instead of ping-ponging between
/// OSDs.
pub const REDIRECTS_IMMEDIATE_MAX: u32 = 3;

const _: () = assert!(BACKOFF_FIRST.as_nanos() > 0);
const _: () = assert!(BACKOFF_FIRST.as_nanos() <= BACKOFF_MAX.as_nanos());

/// What a reply means for the request, before any cache is touched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Done,
    /// `NotLeader` with a hint naming another OSD, or the same OSD in a newer term than the
    /// request named (the term fence): follow it, naming the hint's term.
    Redirect(LeaderHint),
    /// The OSD may not lead the PG (any more): forget the cached leader, back off, rediscover.
    Rediscover,
    /// The map is behind (or this OSD has no replica): refresh it, forget the leader; retry at
    /// once if the map moved, else back off.
    RefreshMap,
    /// Same leader, later (backpressure, a slow commit).
    BackOff,
    /// Not retryable: the caller gets the error.
    Fail(Status, String),
}

/// Classifies `reply`, which OSD `asked` sent to a request naming leader term `term` (0:
/// unknown, and for requests that name none).
///
/// A `NotLeader` naming `asked` itself in a newer term is a redirect to the same OSD: it
/// leads, in another term than the request named (`docs/wire-protocol.md` 3.1, "Term
/// fencing"). It cannot loop: each such redirect names a strictly newer term than the last
/// attempt, and [`Pacer`] backs off after [`REDIRECTS_IMMEDIATE_MAX`] redirects in a row.
pub fn classify(reply: &Reply, asked: OsdId, term: u64) -> Verdict {
    let Reply::Error {
        status,
        leader,
        message,
    } = reply
    else {
        return Verdict::Done;
    };
    match status {
        Status::NotLeader => match leader {
            Some(hint) if hint.osd.get() != 0 && hint.osd != asked => {
                Verdict::Redirect(hint.clone())
            }
            Some(hint) if hint.osd == asked && hint.term > term => Verdict::Redirect(hint.clone()),
            _ => Verdict::Rediscover,
        },
        // Not active yet (electing, recovering): the leader may be about to change.
        Status::NotReady => Verdict::Rediscover,
        Status::NoSuchPg | Status::StaleEpoch => Verdict::RefreshMap,
        Status::Busy | Status::Timeout => Verdict::BackOff,
        // A new retryable status from a newer OSD: retrying is what it asks for.
        status if status.is_retryable() => Verdict::BackOff,
        status => Verdict::Fail(*status, message.clone()),
    }
}

/// When the next attempt goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retry {
    /// Something changed (a redirect to a new leader, a newer map): at once, unless too many
    /// redirects came in a row.
    Now,
    /// Nothing changed that makes the next attempt likelier to succeed: after a pause.
    Later,
}

/// Paces the attempts of one object request: a few immediate redirects, then exponential
/// backoff. One per request; the caller checks its own deadline.
#[derive(Debug)]
pub struct Pacer {
    backoff: Backoff,
    redirects_in_row: u32,
}

impl Pacer {
    /// `seed` drives the jitter: different per request, so that clients retrying after the
    /// same event spread out.
    pub fn new(seed: u64) -> Self {
        Pacer {
            backoff: Backoff::new(seed),
            redirects_in_row: 0,
        }
    }

    /// The pause before the next attempt (zero: at once).
    pub fn pause(&mut self, retry: Retry) -> Duration {
        match retry {
            Retry::Now => {
                self.redirects_in_row += 1;
                if self.redirects_in_row <= REDIRECTS_IMMEDIATE_MAX {
                    return Duration::ZERO;
                }
            }
            Retry::Later => self.redirects_in_row = 0,
        }
        self.backoff.next_pause()
    }
}

/// Exponential backoff with "equal jitter": each pause is half the current step plus a random
/// part of the other half.
#[derive(Debug)]
pub struct Backoff {
    step: Duration,
    rng: u64,
}

impl Backoff {
    pub fn new(seed: u64) -> Self {
        Backoff {
            step: BACKOFF_FIRST,
            rng: seed | 1,
        }
    }

    /// The next pause; the step doubles up to [`BACKOFF_MAX`].
    pub fn next_pause(&mut self) -> Duration {
        // xorshift64: enough for jitter, no dependency.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let half = self.step / 2;
        let jitter_nanos = self.rng % (half.as_nanos() as u64 + 1);
        let pause = half + Duration::from_nanos(jitter_nanos);
        self.step = (self.step * 2).min(BACKOFF_MAX);
        pause
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(status: Status, leader: Option<LeaderHint>) -> Reply {
        Reply::error(status, leader, "m")
    }

    fn hint(osd: u32) -> LeaderHint {
        LeaderHint {
            osd: OsdId(osd),
            address: "127.0.0.1".into(),
            port: 2,
            term: 0,
        }
    }

    fn hint_in(osd: u32, term: u64) -> LeaderHint {
        LeaderHint { term, ..hint(osd) }
    }

    #[test]
    fn the_same_osd_in_a_newer_term_is_followed_at_once_and_an_older_one_is_not() {
        let asked = OsdId(1);
        // The leader refused the request's term 3 (or an unknown term) and names its own, 5.
        for sent in [0, 3] {
            assert_eq!(
                classify(&error(Status::NotLeader, Some(hint_in(1, 5))), asked, sent),
                Verdict::Redirect(hint_in(1, 5))
            );
        }
        // Not newer than what was sent: no news, so no immediate retry.
        for sent in [5, 6] {
            assert_eq!(
                classify(&error(Status::NotLeader, Some(hint_in(1, 5))), asked, sent),
                Verdict::Rediscover
            );
        }
        // Another OSD is followed whatever its term.
        assert_eq!(
            classify(&error(Status::NotLeader, Some(hint_in(2, 1))), asked, 5),
            Verdict::Redirect(hint_in(2, 1))
        );
        // Redirects, of the same OSD or not, are counted: a leader whose term keeps moving
        // gets a few immediate retries, then backoff.
        let mut pacer = Pacer::new(3);
        for _ in 0..REDIRECTS_IMMEDIATE_MAX {
            assert_eq!(pacer.pause(Retry::Now), Duration::ZERO);
        }
        assert!(pacer.pause(Retry::Now) > Duration::ZERO);
    }

    #[test]
    fn classification_follows_the_data_path_table() {
        let t = OsdId(1);
        assert_eq!(classify(&Reply::Ok, t, 0), Verdict::Done);
        assert_eq!(
            classify(&Reply::Data(Default::default()), t, 0),
            Verdict::Done
        );
        assert_eq!(
            classify(&error(Status::NotLeader, Some(hint(2))), t, 0),
            Verdict::Redirect(hint(2))
        );
        // A hint naming the OSD that refused, or nobody, is no hint.
        assert_eq!(
            classify(&error(Status::NotLeader, Some(hint(1))), t, 0),
            Verdict::Rediscover
        );
        assert_eq!(
            classify(&error(Status::NotLeader, Some(hint(0))), t, 0),
            Verdict::Rediscover
        );
        assert_eq!(
            classify(&error(Status::NotLeader, None), t, 0),
            Verdict::Rediscover
        );
        assert_eq!(
            classify(&error(Status::NotReady, None), t, 0),
            Verdict::Rediscover
        );
        assert_eq!(
            classify(&error(Status::NoSuchPg, None), t, 0),
            Verdict::RefreshMap
        );
        assert_eq!(
            classify(&error(Status::StaleEpoch, None), t, 0),
            Verdict::RefreshMap
        );
        assert_eq!(classify(&error(Status::Busy, None), t, 0), Verdict::BackOff);
        assert_eq!(
            classify(&error(Status::Timeout, None), t, 0),
            Verdict::BackOff
        );
        for status in [
            Status::InvalidArgument,
            Status::OutOfRange,
            Status::NoSpace,
            Status::IoError,
            Status::Checksum,
            Status::Internal,
            Status::UnknownOp,
            Status::NoSuchImage,
        ] {
            assert_eq!(
                classify(&error(status, None), t, 0),
                Verdict::Fail(status, "m".into())
            );
        }
        // Every retryable status is retried, every other one fails.
        for status in Status::ALL.into_iter().filter(|s| *s != Status::Ok) {
            let verdict = classify(&error(status, None), t, 0);
            assert_eq!(
                matches!(verdict, Verdict::Fail(..)),
                !status.is_retryable(),
                "{status:?}"
            );
        }
    }

    #[test]
    fn backoff_doubles_with_jitter_up_to_the_cap() {
        let mut backoff = Backoff::new(42);
        let mut step = BACKOFF_FIRST;
        for _ in 0..20 {
            let pause = backoff.next_pause();
            assert!(
                pause >= step / 2 && pause <= step,
                "{pause:?} for step {step:?}"
            );
            step = (step * 2).min(BACKOFF_MAX);
        }
        assert_eq!(step, BACKOFF_MAX);
    }

    #[test]
    fn a_few_redirects_go_at_once_then_the_pacer_backs_off() {
        let mut pacer = Pacer::new(7);
        for _ in 0..REDIRECTS_IMMEDIATE_MAX {
            assert_eq!(pacer.pause(Retry::Now), Duration::ZERO);
        }
        let first = pacer.pause(Retry::Now);
        assert!(first >= BACKOFF_FIRST / 2, "{first:?}");
        // A pause resets the run of redirects; the backoff keeps growing.
        let later = pacer.pause(Retry::Later);
        assert!(later >= BACKOFF_FIRST, "{later:?}");
        assert_eq!(pacer.pause(Retry::Now), Duration::ZERO);
    }
}

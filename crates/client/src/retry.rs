//! The life of one object request: find the leader, send, classify the reply, and retry
//! retryable failures with backoff until the deadline. The rules (which statuses, which cache
//! is invalidated, the backoff schedule) are the table in `docs/data-path.md`.

use crate::cluster::{Cluster, Counters};
use crate::leader::reply_name;
use crate::route::Target;
use crate::ClientError;
use fastblock_types::{Epoch, PgId};
use fastblock_wire::{LeaderHint, Reply, Request, Status};
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::time::Instant;

/// First backoff pause. Small: the common retryable cases (a leader just elected, one `Busy`)
/// clear within a millisecond or two.
pub(crate) const BACKOFF_FIRST: Duration = Duration::from_millis(2);
/// Longest backoff pause: bounds how late a request notices that a PG has healed.
pub(crate) const BACKOFF_MAX: Duration = Duration::from_millis(250);
/// Redirects (`NotLeader` with a hint) followed at once, without a pause. More in a row means
/// leadership is moving (an election): back off instead of ping-ponging between OSDs.
const REDIRECTS_IMMEDIATE_MAX: u32 = 3;

const _: () = assert!(BACKOFF_FIRST.as_nanos() > 0);
const _: () = assert!(BACKOFF_FIRST.as_nanos() <= BACKOFF_MAX.as_nanos());

/// Exponential backoff with "equal jitter": each pause is half the current step plus a random
/// part of the other half, so that clients retrying after the same event spread out.
pub(crate) struct Backoff {
    step: Duration,
    rng: u64,
}

impl Backoff {
    pub(crate) fn new(seed: u64) -> Self {
        Backoff {
            step: BACKOFF_FIRST,
            rng: seed | 1,
        }
    }

    /// The next pause; the step doubles up to [`BACKOFF_MAX`].
    pub(crate) fn next_pause(&mut self) -> Duration {
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

/// What to do after one attempt.
#[derive(Debug)]
pub(crate) enum Step {
    Done(Reply),
    Fail(ClientError),
    /// Retry at once (a redirect to a new leader, a newer map).
    RetryNow(String),
    /// Retry after a backoff pause.
    RetryLater(String),
}

/// What a reply means for the request, before any cache is touched. Pure, so that the table
/// of `docs/data-path.md` is pinned by a test.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Done,
    /// `NotLeader` with a hint naming another OSD: follow it.
    Redirect(LeaderHint),
    /// The OSD may not lead the PG (any more): forget the cached leader, back off, rediscover.
    Rediscover,
    /// The map is behind (or this OSD has no replica): refresh it, forget the leader, back off.
    RefreshMap,
    /// Same leader, later (backpressure, a slow commit).
    BackOff,
    Fail(Status, String),
}

pub(crate) fn classify(reply: &Reply, target: &Target) -> Verdict {
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
            Some(hint) if hint.osd.get() != 0 && hint.osd != target.osd => {
                Verdict::Redirect(hint.clone())
            }
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

impl Cluster {
    /// Runs one object request for `pg` to completion. `build` makes the request for the
    /// current map epoch (it is rebuilt for every attempt). Holds one in-flight slot for the
    /// whole time.
    pub(crate) async fn execute(
        &self,
        pg: PgId,
        build: &(dyn Fn(Epoch) -> Request + Sync),
    ) -> Result<Reply, ClientError> {
        let Ok(_slot) = self.inflight.acquire().await else {
            return Err(ClientError::Protocol("the client is shutting down".into()));
        };
        Counters::bump(&self.counters.object_requests);
        let deadline = Instant::now() + self.config.op_deadline;
        let seed = self.backoff_seed.fetch_add(0x9e37_79b9, Ordering::Relaxed);
        let mut backoff = Backoff::new(seed);
        let mut redirects_in_row = 0u32;
        let mut last = String::from("no attempt finished before the deadline");
        let mut first = true;
        loop {
            let now = Instant::now();
            if now >= deadline {
                Counters::bump(&self.counters.timeouts);
                return Err(ClientError::Timeout {
                    pg,
                    deadline: self.config.op_deadline,
                    last,
                });
            }
            if !first {
                Counters::bump(&self.counters.retries);
            }
            first = false;
            let attempt_timeout = self.config.attempt_timeout.min(deadline - now);
            match self.attempt(pg, build, attempt_timeout).await {
                Step::Done(reply) => return Ok(reply),
                Step::Fail(error) => return Err(error),
                Step::RetryNow(why) => {
                    tracing::debug!(pg = %pg, "retrying at once: {why}");
                    last = why;
                    redirects_in_row += 1;
                    if redirects_in_row <= REDIRECTS_IMMEDIATE_MAX {
                        continue;
                    }
                }
                Step::RetryLater(why) => {
                    tracing::debug!(pg = %pg, "retrying after a pause: {why}");
                    last = why;
                    redirects_in_row = 0;
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            tokio::time::sleep(backoff.next_pause().min(left)).await;
        }
    }

    async fn attempt(
        &self,
        pg: PgId,
        build: &(dyn Fn(Epoch) -> Request + Sync),
        timeout: Duration,
    ) -> Step {
        let target = match self.leader_target(pg, timeout).await {
            Ok(target) => target,
            Err(why) => return Step::RetryLater(why),
        };
        let conn = match self.pool.get(&target.address, target.port).await {
            Ok((conn, fresh)) => {
                if fresh {
                    Counters::bump(&self.counters.connects);
                }
                conn
            }
            Err(why) => {
                self.cache.forget_leader(pg, target.osd);
                return Step::RetryLater(format!("{target}: {why}"));
            }
        };
        let epoch = self.cache.epoch();
        let reply = match conn.call(&build(epoch), timeout).await {
            Ok(reply) => reply,
            Err(e) => {
                self.cache.forget_leader(pg, target.osd);
                return Step::RetryLater(format!("{target}: {e}"));
            }
        };
        self.on_reply(pg, &target, epoch, reply).await
    }

    async fn on_reply(&self, pg: PgId, target: &Target, epoch: Epoch, reply: Reply) -> Step {
        match classify(&reply, target) {
            Verdict::Done => Step::Done(reply),
            Verdict::Redirect(hint) => {
                Counters::bump(&self.counters.redirects);
                match self.maybe_learn_leader(pg, &hint) {
                    Some(leader) => Step::RetryNow(format!("{target}: not leader, try {leader}")),
                    None => {
                        self.cache.forget_leader(pg, target.osd);
                        Step::RetryLater(format!("{target}: not leader, unusable hint {hint:?}"))
                    }
                }
            }
            Verdict::Rediscover => {
                self.cache.forget_leader(pg, target.osd);
                Step::RetryLater(format!("{target}: {}", describe(&reply)))
            }
            Verdict::RefreshMap => {
                self.cache.forget_leader(pg, target.osd);
                self.refresh_map("an OSD answered NoSuchPg or StaleEpoch")
                    .await;
                let why = format!("{target}: {} at epoch {epoch}", describe(&reply));
                if self.cache.epoch() > epoch {
                    Step::RetryNow(why)
                } else {
                    Step::RetryLater(why)
                }
            }
            Verdict::BackOff => Step::RetryLater(format!("{target}: {}", describe(&reply))),
            Verdict::Fail(status, message) => Step::Fail(ClientError::Io {
                pg,
                osd: target.osd,
                status,
                message,
            }),
        }
    }
}

fn describe(reply: &Reply) -> String {
    match reply {
        Reply::Error {
            status, message, ..
        } if message.is_empty() => format!("{status:?}"),
        Reply::Error {
            status, message, ..
        } => format!("{status:?} ({message})"),
        other => reply_name(other).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fastblock_types::OsdId;

    fn target(osd: u32) -> Target {
        Target {
            osd: OsdId(osd),
            address: "127.0.0.1".into(),
            port: 1,
        }
    }

    fn error(status: Status, leader: Option<LeaderHint>) -> Reply {
        Reply::error(status, leader, "m")
    }

    fn hint(osd: u32) -> LeaderHint {
        LeaderHint {
            osd: OsdId(osd),
            address: "127.0.0.1".into(),
            port: 2,
        }
    }

    #[test]
    fn classification_follows_the_data_path_table() {
        let t = target(1);
        assert_eq!(classify(&Reply::Ok, &t), Verdict::Done);
        assert_eq!(
            classify(&Reply::Data(Default::default()), &t),
            Verdict::Done
        );
        assert_eq!(
            classify(&error(Status::NotLeader, Some(hint(2))), &t),
            Verdict::Redirect(hint(2))
        );
        // A hint naming the OSD that refused, or nobody, is no hint.
        assert_eq!(
            classify(&error(Status::NotLeader, Some(hint(1))), &t),
            Verdict::Rediscover
        );
        assert_eq!(
            classify(&error(Status::NotLeader, Some(hint(0))), &t),
            Verdict::Rediscover
        );
        assert_eq!(
            classify(&error(Status::NotLeader, None), &t),
            Verdict::Rediscover
        );
        assert_eq!(
            classify(&error(Status::NotReady, None), &t),
            Verdict::Rediscover
        );
        assert_eq!(
            classify(&error(Status::NoSuchPg, None), &t),
            Verdict::RefreshMap
        );
        assert_eq!(
            classify(&error(Status::StaleEpoch, None), &t),
            Verdict::RefreshMap
        );
        assert_eq!(classify(&error(Status::Busy, None), &t), Verdict::BackOff);
        assert_eq!(
            classify(&error(Status::Timeout, None), &t),
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
        ] {
            assert_eq!(
                classify(&error(status, None), &t),
                Verdict::Fail(status, "m".into())
            );
        }
        // Every retryable status is retried, every other one fails.
        for status in Status::ALL.into_iter().filter(|s| *s != Status::Ok) {
            let verdict = classify(&error(status, None), &t);
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
}

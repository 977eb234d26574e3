//! The life of one object request: find the leader, send, classify the reply, and retry
//! retryable failures with backoff until the deadline. The decisions are `policy`'s (pure,
//! shared with the simulator); this loop carries them out in real time and keeps the caches.

use crate::cluster::{Cluster, Counters};
use crate::leader::reply_name;
use crate::policy::{classify, Pacer, Retry, Verdict};
use crate::route::Target;
use crate::ClientError;
use fastblock_types::{Epoch, PgId};
use fastblock_wire::{Reply, Request};
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::time::Instant;

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

impl Cluster {
    /// Runs one object request for `pg` to completion. `build` makes the request for the
    /// current map epoch (it is rebuilt for every attempt; a mutation's term is set here, to
    /// the term of the leader each attempt goes to). Holds one in-flight slot for the whole
    /// time.
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
        let mut pacer = Pacer::new(seed);
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
            let pause = match self.attempt(pg, build, attempt_timeout).await {
                Step::Done(reply) => return Ok(reply),
                Step::Fail(error) => return Err(error),
                Step::RetryNow(why) => {
                    tracing::debug!(pg = %pg, "retrying at once: {why}");
                    last = why;
                    pacer.pause(Retry::Now)
                }
                Step::RetryLater(why) => {
                    tracing::debug!(pg = %pg, "retrying after a pause: {why}");
                    last = why;
                    pacer.pause(Retry::Later)
                }
            };
            if !pause.is_zero() {
                let left = deadline.saturating_duration_since(Instant::now());
                tokio::time::sleep(pause.min(left)).await;
            }
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
            Err(crate::leader::NoLeader::Final(e)) => return Step::Fail(e),
            Err(crate::leader::NoLeader::Retry(why)) => return Step::RetryLater(why),
        };
        let mode = self.cache.map().auth.mode;
        let conn = match self
            .pool
            .get(&target.address, target.port, target.osd, mode)
            .await
        {
            Ok((conn, fresh)) => {
                if fresh {
                    Counters::bump(&self.counters.connects);
                }
                conn
            }
            Err(crate::conn::ConnectError::Refused { status, message }) => {
                if self.refusal_may_pass(status).await {
                    return Step::RetryLater(format!(
                        "{target}: {message}; the monitor accepts this client's key: \
                         retrying with a new ticket"
                    ));
                }
                return Step::Fail(ClientError::Auth {
                    target: target.to_string(),
                    status,
                    message,
                });
            }
            Err(why) => {
                self.cache.forget_leader(pg, target.osd);
                return Step::RetryLater(format!("{target}: {why}"));
            }
        };
        let sent = self.cache.map();
        let epoch = sent.epoch;
        // A leader cut off from the network answers nothing: without the race below the
        // request would wait out its whole attempt timeout even after the map shows the PG's
        // new leader. Abandoning the call closes its connection with a reset, as a timeout
        // does, so the request's undelivered bytes never reach the old leader after the retry
        // (`conn::PendingGuard`, docs/data-path.md section 4).
        // A mutation names the term of the leadership it is sent to; the leader refuses any
        // other (`docs/wire-protocol.md` 3.1, "Term fencing").
        let request = build(epoch).with_term(target.term);
        let reply = tokio::select! {
            result = conn.call(&request, timeout) => match result {
                Ok(reply) => reply,
                Err(e) => {
                    self.cache.forget_leader(pg, target.osd);
                    return Step::RetryLater(format!("{target}: {e}"));
                }
            },
            why = self.cache.leader_moved(&sent, pg, target.osd) => {
                self.cache.forget_leader(pg, target.osd);
                return Step::RetryNow(format!("{target}: no reply yet and {why}"));
            }
        };
        self.on_reply(pg, &target, epoch, reply).await
    }

    async fn on_reply(&self, pg: PgId, target: &Target, epoch: Epoch, reply: Reply) -> Step {
        match classify(&reply, target.osd, target.term) {
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
            Verdict::Fail(status, message) if crate::leader::is_auth_refusal(status) => {
                Step::Fail(ClientError::Auth {
                    target: target.to_string(),
                    status: Some(status),
                    message,
                })
            }
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

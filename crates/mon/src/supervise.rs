//! Supervision of the monitor's background tasks: no task dies silently.
//!
//! Every long-running task is started by [`Supervisor::spawn`] with a [`Policy`]. When it
//! fails — it returns an error, it panics (seen through its `JoinHandle`), or it returns
//! while the monitor is not shutting down — the failure is logged with the task's name,
//! counted, and then:
//!
//! - [`Policy::Restart`]: the task is started again after a back-off that doubles from
//!   [`BACKOFF_MIN`] up to [`BACKOFF_MAX`] (and starts over once a run lasted
//!   [`BACKOFF_RESET_AFTER`]). For tasks whose state lives elsewhere (etcd, the leader's
//!   context), so a new run picks up where the old one stopped.
//! - [`Policy::ExitDaemon`]: the failure goes to the receiver [`Supervisor::new`] returned;
//!   the server shuts the monitor down and exits non-zero with the failure as its message.
//!   For failures no retry can fix.
//!
//! Failures are shown as `MON_TASK_FAILED` health checks ([`Supervisor::checks`]): ERR while
//! the last one is recent ([`FAILURE_RECENT`]), WARN after that. Counts are kept for the
//! process's lifetime. Failures that are not a task's (a request handler that panicked, the
//! etcd member exiting) are recorded with [`Supervisor::record`].
//!
//! Panics are caught only because the workspace builds with `panic = "unwind"` (see
//! `docs/design/monitor.md`, "Supervision").

use fastblock_mon_core::health::DaemonCheck;
use std::any::Any;
use std::collections::BTreeMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// First wait before a failed task is started again.
pub const BACKOFF_MIN: Duration = Duration::from_millis(100);
/// Longest wait before a failed task is started again.
pub const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// A run that lasted this long resets the back-off: its failure was not a crash loop.
pub const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(60);
/// A failure this recent makes the health check an error, not a warning. Longer than
/// [`BACKOFF_MAX`], so a task that keeps failing stays an error.
pub const FAILURE_RECENT: Duration = Duration::from_secs(60);

/// What happens after a task failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    Restart,
    ExitDaemon,
}

/// A failure that ends the monitor.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{task} failed: {reason}")]
pub struct TaskFailure {
    pub task: &'static str,
    pub reason: String,
    /// The task failed with a [`Misconfiguration`].
    pub misconfigured: bool,
}

/// An error no restart can fix, of this host's or this monitor's configuration (another etcd
/// on the own member's address): the monitor exits with status 2, which its systemd unit does
/// not restart (`RestartPreventExitStatus=2`), instead of failing the same way every 5 s.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct Misconfiguration(Box<dyn std::error::Error + Send + Sync>);

impl Misconfiguration {
    pub fn new(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        Misconfiguration(Box::new(e))
    }
}

/// Whether the monitor ends for a [`Misconfiguration`] (exit status 2): `e` is one, holds one,
/// or is the [`TaskFailure`] of a task that failed with one.
pub fn is_misconfiguration(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.is::<Misconfiguration>()
            || c.downcast_ref::<TaskFailure>()
                .is_some_and(|f| f.misconfigured)
    })
}

#[derive(Clone, Debug)]
struct Record {
    failures: u64,
    last_reason: String,
    last_at: Instant,
}

pub struct Supervisor {
    records: Mutex<BTreeMap<&'static str, Record>>,
    fatal: mpsc::UnboundedSender<TaskFailure>,
    shutdown: watch::Receiver<bool>,
}

impl Supervisor {
    /// A supervisor whose tasks stop when `shutdown` turns true, and the receiver of the
    /// failures that must end the monitor.
    pub fn new(
        shutdown: watch::Receiver<bool>,
    ) -> (Arc<Supervisor>, mpsc::UnboundedReceiver<TaskFailure>) {
        let (fatal, failures) = mpsc::unbounded_channel();
        let sup = Supervisor {
            records: Mutex::new(BTreeMap::new()),
            fatal,
            shutdown,
        };
        (Arc::new(sup), failures)
    }

    /// Runs `make()` as task `name` until the monitor shuts down, supervised by `policy`.
    /// `make` is called again for every restart. The task must return once `shutdown` (the
    /// receiver given to [`Supervisor::new`]) turns true; returning earlier is a failure.
    pub fn spawn<F, Fut>(
        self: &Arc<Self>,
        name: &'static str,
        policy: Policy,
        mut make: F,
    ) -> JoinHandle<()>
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        let sup = self.clone();
        tokio::spawn(async move {
            let mut shutdown = sup.shutdown.clone();
            let mut backoff = BACKOFF_MIN;
            loop {
                let started = Instant::now();
                let outcome = tokio::spawn(make()).await;
                if *shutdown.borrow() {
                    return;
                }
                let misconfigured = matches!(&outcome, Ok(Err(e)) if is_misconfiguration(e));
                let reason = match outcome {
                    Ok(Ok(())) => "returned while the monitor was not stopping".to_string(),
                    Ok(Err(e)) => format!("{e:#}"),
                    Err(e) if e.is_panic() => {
                        format!("panicked: {}", panic_message(&*e.into_panic()))
                    }
                    Err(e) => format!("cancelled: {e}"),
                };
                let failures = sup.record(name, &reason);
                if policy == Policy::ExitDaemon {
                    tracing::error!(task = name, "{reason}; stopping the monitor");
                    let _ = sup.fatal.send(TaskFailure {
                        task: name,
                        reason,
                        misconfigured,
                    });
                    return;
                }
                if started.elapsed() >= BACKOFF_RESET_AFTER {
                    backoff = BACKOFF_MIN;
                }
                tracing::error!(task = name, failures, ?backoff, "{reason}; restarting");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = shutdown.wait_for(|stop| *stop) => return,
                }
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        })
    }

    /// Counts one failure of `what` (a task, or something that is not one); returns how many
    /// it has had.
    pub fn record(&self, what: &'static str, reason: &str) -> u64 {
        let mut records = self.records.lock().unwrap_or_else(|p| p.into_inner());
        let record = records.entry(what).or_insert(Record {
            failures: 0,
            last_reason: String::new(),
            last_at: Instant::now(),
        });
        record.failures += 1;
        record.last_reason = reason.to_string();
        record.last_at = Instant::now();
        record.failures
    }

    /// One line of `MON_TASK_FAILED` per task that ever failed, in name order.
    pub fn checks(&self) -> Vec<DaemonCheck> {
        let records = self.records.lock().unwrap_or_else(|p| p.into_inner());
        records
            .iter()
            .map(|(name, r)| {
                let ago = r.last_at.elapsed();
                let times = if r.failures == 1 { "time" } else { "times" };
                DaemonCheck {
                    err: ago < FAILURE_RECENT,
                    text: format!(
                        "{name} failed {} {times}, last {}s ago: {}",
                        r.failures,
                        ago.as_secs(),
                        r.last_reason
                    ),
                }
            })
            .collect()
    }
}

pub use fastblock_types::panics::panic_message;

/// A future that turns a panic while it is polled into an error carrying the payload, so
/// that one failed request does not take its connection (or more) with it.
pub struct CatchUnwind<F> {
    inner: Pin<Box<F>>,
}

impl<F: Future> CatchUnwind<F> {
    pub fn new(inner: F) -> Self {
        CatchUnwind {
            inner: Box::pin(inner),
        }
    }
}

impl<F: Future> Future for CatchUnwind<F> {
    type Output = Result<F::Output, Box<dyn Any + Send>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = self.inner.as_mut();
        // The future is never polled again after it panicked: this returns Ready.
        match std::panic::catch_unwind(AssertUnwindSafe(|| inner.poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(out)) => Poll::Ready(Ok(out)),
            Err(payload) => Poll::Ready(Err(payload)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A task that panics twice is started again each time (after a back-off) and then runs;
    /// health shows the count and the last panic; shutdown ends it without a failure.
    #[tokio::test]
    async fn a_panicking_task_is_restarted_and_counted() {
        let (stop_tx, stop) = watch::channel(false);
        let (sup, mut fatal) = Supervisor::new(stop.clone());
        let runs = Arc::new(AtomicU32::new(0));
        let counted = runs.clone();
        let handle = sup.spawn("test task", Policy::Restart, move || {
            let run = counted.fetch_add(1, Ordering::SeqCst) + 1;
            let mut stop = stop.clone();
            async move {
                if run <= 2 {
                    panic!("boom {run}");
                }
                let _ = stop.wait_for(|s| *s).await;
                Ok(())
            }
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        while runs.load(Ordering::SeqCst) < 3 {
            assert!(Instant::now() < deadline, "task not restarted twice");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let checks = sup.checks();
        assert_eq!(checks.len(), 1, "{checks:?}");
        assert!(checks[0].err);
        assert!(
            checks[0]
                .text
                .starts_with("test task failed 2 times, last "),
            "{checks:?}"
        );
        assert!(checks[0].text.ends_with("panicked: boom 2"), "{checks:?}");
        stop_tx.send_replace(true);
        tokio::time::timeout(Duration::from_secs(5), handle)
            .await
            .expect("supervisor ends on shutdown")
            .unwrap();
        assert_eq!(runs.load(Ordering::SeqCst), 3);
        assert!(fatal.try_recv().is_err(), "a restarted task is not fatal");
    }

    /// A task whose failure cannot be retried reports it to the daemon, once.
    #[tokio::test]
    async fn a_fatal_task_failure_reaches_the_daemon() {
        let (_stop_tx, stop) = watch::channel(false);
        let (sup, mut fatal) = Supervisor::new(stop);
        let runs = Arc::new(AtomicU32::new(0));
        let counted = runs.clone();
        sup.spawn("server", Policy::ExitDaemon, move || {
            counted.fetch_add(1, Ordering::SeqCst);
            async { Err(anyhow::anyhow!("listener closed")) }
        });
        let failure = tokio::time::timeout(Duration::from_secs(5), fatal.recv())
            .await
            .expect("failure reported")
            .expect("channel open");
        assert_eq!(
            failure,
            TaskFailure {
                task: "server",
                reason: "listener closed".into(),
                misconfigured: false,
            }
        );
        tokio::time::sleep(BACKOFF_MIN * 3).await;
        assert_eq!(runs.load(Ordering::SeqCst), 1, "not restarted");
        assert!(sup.checks()[0].text.contains("server failed 1 time, last"));
    }

    /// A task that fails with a misconfiguration (even under context) ends the monitor marked
    /// so, and the monitor's error says so too (exit status 2); any other failure does not.
    #[tokio::test]
    async fn a_misconfiguration_is_told_apart() {
        #[derive(Debug, thiserror::Error)]
        #[error("another etcd holds 127.0.0.1:2379")]
        struct Held;
        let (_stop_tx, stop) = watch::channel(false);
        let (sup, mut fatal) = Supervisor::new(stop);
        sup.spawn("etcd member supervisor", Policy::ExitDaemon, || async {
            Err(anyhow::Error::from(Misconfiguration::new(Held)).context("supervising"))
        });
        let failure = tokio::time::timeout(Duration::from_secs(5), fatal.recv())
            .await
            .unwrap()
            .unwrap();
        assert!(failure.misconfigured, "{failure:?}");
        assert_eq!(
            failure.reason,
            "supervising: another etcd holds 127.0.0.1:2379"
        );
        assert!(is_misconfiguration(&anyhow::Error::from(failure)));
        assert!(!is_misconfiguration(&anyhow::anyhow!("listener closed")));
        let plain = TaskFailure {
            task: "API server",
            reason: "listener closed".into(),
            misconfigured: false,
        };
        assert!(!is_misconfiguration(&anyhow::Error::from(plain)));
    }

    /// A task that returns while the monitor is not stopping has failed too.
    #[tokio::test]
    async fn an_early_return_is_a_failure() {
        let (_stop_tx, stop) = watch::channel(false);
        let (sup, mut fatal) = Supervisor::new(stop);
        sup.spawn("ticker", Policy::ExitDaemon, || async { Ok(()) });
        let failure = tokio::time::timeout(Duration::from_secs(5), fatal.recv())
            .await
            .unwrap()
            .unwrap();
        assert!(failure.reason.contains("returned while"), "{failure}");
    }

    #[tokio::test]
    async fn catch_unwind_turns_a_panic_into_an_error() {
        let ok = CatchUnwind::new(async { 7 }).await;
        assert_eq!(ok.ok(), Some(7));
        let failed = CatchUnwind::new(async {
            tokio::task::yield_now().await;
            panic!("handler bug");
        })
        .await;
        let payload = failed.expect_err("the panic is caught");
        assert_eq!(panic_message(&*payload), "handler bug");
    }
}

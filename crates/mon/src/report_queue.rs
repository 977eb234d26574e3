//! Group commit of the OSDs' report batches (`POST /v1/osds/{id}/reports`): the batches that
//! arrive while the last commit was being made, or within [`REPORT_COMMIT_INTERVAL`] of it, are
//! applied in one operation and committed in one etcd transaction, one epoch. After an OSD
//! dies, every new leader of its PGs reports; one batch per OSD, and one commit for all the
//! batches of a moment, make that a few epochs instead of one per PG.

use crate::service::Monitor;
use fastblock_mon_core::Reporter;
use fastblock_types::api::{ApiError, ErrorCode, OsdReport};
use fastblock_types::Epoch;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch, Mutex};
use tokio::time::Instant;

/// Batches waiting for the committer: one per OSD at most in the normal course (an OSD sends
/// its next batch once the last is answered); past this, a batch is refused with `busy`.
pub const REPORT_QUEUE_BATCHES_MAX: usize = 8192;
/// The least time between two commits of reports: what arrives meanwhile joins the next one.
pub const REPORT_COMMIT_INTERVAL: Duration = Duration::from_millis(50);

type Answer = Result<(Epoch, Vec<Option<ApiError>>), ApiError>;

/// A batch waiting for the committer, with where its answer goes.
pub struct Waiting {
    reporter: Reporter,
    reports: Vec<OsdReport>,
    answer: oneshot::Sender<Answer>,
}

/// The handlers' end of the queue.
#[derive(Clone)]
pub struct ReportQueue {
    tx: mpsc::Sender<Waiting>,
}

/// The committer's end; shared so that a restarted committer task takes it over.
pub type ReportQueueRx = Arc<Mutex<mpsc::Receiver<Waiting>>>;

pub fn report_queue() -> (ReportQueue, ReportQueueRx) {
    let (tx, rx) = mpsc::channel(REPORT_QUEUE_BATCHES_MAX);
    (ReportQueue { tx }, Arc::new(Mutex::new(rx)))
}

impl ReportQueue {
    /// Queues a batch and waits for the commit that records it: the epoch, and one result per
    /// report.
    pub async fn submit(&self, reporter: Reporter, reports: Vec<OsdReport>) -> Answer {
        let (answer, rx) = oneshot::channel();
        let waiting = Waiting {
            reporter,
            reports,
            answer,
        };
        self.tx.try_send(waiting).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => ApiError::new(
                ErrorCode::Busy,
                format!("{REPORT_QUEUE_BATCHES_MAX} report batches wait already; send it again"),
            ),
            mpsc::error::TrySendError::Closed(_) => {
                ApiError::new(ErrorCode::Unavailable, "the monitor is stopping")
            }
        })?;
        rx.await.unwrap_or_else(|_| {
            Err(ApiError::new(
                ErrorCode::Unavailable,
                "the report committer stopped before answering; send it again",
            ))
        })
    }
}

/// Applies and commits queued batches until `shutdown`, one operation per round.
pub async fn run(
    mon: Arc<Monitor>,
    rx: ReportQueueRx,
    mut shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let mut rx = rx.lock().await;
    let mut last_commit = Instant::now() - REPORT_COMMIT_INTERVAL;
    loop {
        let first = tokio::select! {
            w = rx.recv() => match w {
                Some(w) => w,
                None => return Ok(()),
            },
            _ = shutdown.changed() => return Ok(()),
        };
        tokio::time::sleep_until(last_commit + REPORT_COMMIT_INTERVAL).await;
        let mut round = vec![first];
        while let Ok(w) = rx.try_recv() {
            round.push(w);
        }
        let outcome = mon
            .apply(|state, _| {
                Ok(round
                    .iter()
                    .map(|w| state.apply_reports(w.reporter, &w.reports))
                    .collect::<Vec<_>>())
            })
            .await;
        last_commit = Instant::now();
        let epoch = mon.published_epoch();
        match outcome {
            Ok(results) => {
                for (w, results) in round.into_iter().zip(results) {
                    let _ = w.answer.send(Ok((epoch, results)));
                }
            }
            Err(e) => {
                for w in round {
                    let _ = w.answer.send(Err(e.clone()));
                }
            }
        }
    }
}

//! Gathering the shards' op tracker reports for the heartbeat (`docs/operations.md`, "Slow
//! ops").
//!
//! A shard answers between two steps of its loop, so a shard stuck in a slow disk call
//! answers late: exactly when its report matters. The heartbeat must not wait for it (its
//! silence would take the OSD down), nor lose the answer when it comes: each shard has at
//! most one request outstanding, its answer is taken whenever it has arrived, and every
//! heartbeat sends the last answer of each shard.
//!
//! A shard stuck for the complaint time or longer would otherwise show the ages of its last
//! answer for as long as it stays stuck, and no slow op. Its ops cannot finish while it is
//! stuck, so its last answer is sent aged by the time since it arrived (a lower bound of how
//! much older they are), with every op in flight counted slow.

use crate::shard::ShardCommand;
use fastblock_types::api::OsdOps;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, watch};

pub struct OpReports {
    /// The complaint time, settable at runtime: each request to the shards takes its value
    /// then.
    complaint_time: watch::Receiver<Duration>,
    /// Per shard: the request not yet answered, with when it was sent.
    pending: Vec<Option<(Instant, oneshot::Receiver<OsdOps>)>>,
    /// Per shard: the last answer, with when it was taken.
    last: Vec<Option<(Instant, OsdOps)>>,
}

impl OpReports {
    pub fn new(shards: usize, complaint_time: watch::Receiver<Duration>) -> OpReports {
        OpReports {
            complaint_time,
            pending: (0..shards).map(|_| None).collect(),
            last: vec![None; shards],
        }
    }

    fn complaint_time(&self) -> Duration {
        *self.complaint_time.borrow()
    }

    /// Asks every shard that has no request outstanding for a report.
    pub fn ask(&mut self, shards: &[mpsc::UnboundedSender<ShardCommand>]) {
        self.ask_at(shards, Instant::now());
    }

    fn ask_at(&mut self, shards: &[mpsc::UnboundedSender<ShardCommand>], now: Instant) {
        let complaint_us = micros(self.complaint_time());
        for (shard, pending) in shards.iter().zip(self.pending.iter_mut()) {
            if pending.is_some() {
                continue;
            }
            let (reply, rx) = oneshot::channel();
            let cmd = ShardCommand::Ops {
                complaint_us,
                reply,
            };
            if shard.send(cmd).is_ok() {
                *pending = Some((now, rx));
            }
        }
    }

    /// Takes the answers that arrived and returns the OSD's report: every shard's last
    /// answer merged, aged for a shard stuck since (`None` before any shard answered).
    pub fn collect(&mut self) -> Option<OsdOps> {
        self.collect_at(Instant::now())
    }

    fn collect_at(&mut self, now: Instant) -> Option<OsdOps> {
        let complaint_time = self.complaint_time();
        let mut merged: Option<OsdOps> = None;
        for (pending, last) in self.pending.iter_mut().zip(self.last.iter_mut()) {
            if let Some((_, rx)) = pending {
                match rx.try_recv() {
                    Ok(report) => {
                        *last = Some((now, report));
                        *pending = None;
                    }
                    Err(oneshot::error::TryRecvError::Empty) => {}
                    Err(oneshot::error::TryRecvError::Closed) => *pending = None,
                }
            }
            let Some((taken, report)) = last else {
                continue;
            };
            let stuck = pending
                .as_ref()
                .is_some_and(|(sent, _)| now.saturating_duration_since(*sent) >= complaint_time);
            let report = if stuck {
                aged(report.clone(), now.saturating_duration_since(*taken))
            } else {
                report.clone()
            };
            merged.get_or_insert_with(OsdOps::default).merge(report);
        }
        // The shards' answers carry the value of when they were asked (merging keeps the
        // largest): the report shows the one in force now.
        if let Some(m) = &mut merged {
            m.complaint_time_ms = u64::try_from(complaint_time.as_millis()).unwrap_or(u64::MAX);
        }
        merged
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A stuck shard's last answer, `lag` later: its ops in flight are that much older, in the
/// stage they were in, and all slow.
fn aged(mut report: OsdOps, lag: Duration) -> OsdOps {
    let lag_us = micros(lag);
    for op in &mut report.oldest {
        op.duration_us = op.duration_us.saturating_add(lag_us);
        if let Some(stage) = op.stages.last_mut() {
            stage.us = stage.us.saturating_add(lag_us);
        }
    }
    report.slow = report.in_flight;
    report
}

#[cfg(test)]
#[path = "op_reports_tests.rs"]
mod tests;

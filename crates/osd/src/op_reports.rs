//! Gathering the shards' op tracker reports for the heartbeat (`docs/operations.md`, "Slow
//! ops").
//!
//! A shard answers between two steps of its loop, so a shard stuck in a slow disk call
//! answers late: exactly when its report matters. The heartbeat must not wait for it (its
//! silence would take the OSD down), nor lose the answer when it comes: each shard has at
//! most one request outstanding, its answer is taken whenever it has arrived, and every
//! heartbeat sends the last answer of each shard.

use crate::shard::ShardCommand;
use fastblock_types::api::OsdOps;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch};

pub struct OpReports {
    /// The complaint time, settable at runtime: each request to the shards takes its value
    /// then.
    complaint_time: watch::Receiver<Duration>,
    /// Per shard: the request not yet answered, and the last answer.
    pending: Vec<Option<oneshot::Receiver<OsdOps>>>,
    last: Vec<Option<OsdOps>>,
}

impl OpReports {
    pub fn new(shards: usize, complaint_time: watch::Receiver<Duration>) -> OpReports {
        OpReports {
            complaint_time,
            pending: (0..shards).map(|_| None).collect(),
            last: vec![None; shards],
        }
    }

    fn complaint_us(&self) -> u64 {
        u64::try_from(self.complaint_time.borrow().as_micros()).unwrap_or(u64::MAX)
    }

    /// Asks every shard that has no request outstanding for a report.
    pub fn ask(&mut self, shards: &[mpsc::UnboundedSender<ShardCommand>]) {
        let complaint_us = self.complaint_us();
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
                *pending = Some(rx);
            }
        }
    }

    /// Takes the answers that arrived and returns the OSD's report: every shard's last
    /// answer merged (`None` before any shard answered).
    pub fn collect(&mut self) -> Option<OsdOps> {
        for (pending, last) in self.pending.iter_mut().zip(self.last.iter_mut()) {
            let Some(rx) = pending else { continue };
            match rx.try_recv() {
                Ok(report) => {
                    *last = Some(report);
                    *pending = None;
                }
                Err(oneshot::error::TryRecvError::Empty) => {}
                Err(oneshot::error::TryRecvError::Closed) => *pending = None,
            }
        }
        let complaint_time_ms = self.complaint_us() / 1000;
        let mut merged: Option<OsdOps> = None;
        for report in self.last.iter().flatten() {
            merged
                .get_or_insert_with(|| OsdOps {
                    complaint_time_ms,
                    ..OsdOps::default()
                })
                .merge(report.clone());
        }
        merged
    }
}

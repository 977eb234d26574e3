//! What one simulated daemon received from the monitor's map endpoint: each answer's kind
//! (whole map or delta), its body's bytes, the epoch held after it and when. Scenarios read
//! windows of this log to compute their figures.

use fastblock_types::Epoch;
use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Instant;

/// Answers kept per daemon: far more than one run's epochs at the sizes measured (a rolling
/// restart of 1,000 OSDs is some 5,000 epochs); the oldest are dropped beyond it.
const ANSWERS_KEPT_MAX: usize = 50_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AnswerKind {
    Full,
    Delta,
}

#[derive(Clone, Copy, Debug)]
pub struct Answer {
    pub at: Instant,
    pub kind: AnswerKind,
    pub bytes: u64,
    /// The epoch the daemon holds after applying it.
    pub epoch: Epoch,
}

/// A daemon's log of map answers that moved its map forward (answers that found it up to
/// date carry no map and are not logged).
#[derive(Default)]
pub struct MapCounters {
    inner: Mutex<VecDeque<Answer>>,
}

impl MapCounters {
    pub fn record(&self, answer: Answer) {
        let mut log = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if log.len() == ANSWERS_KEPT_MAX {
            log.pop_front();
        }
        log.push_back(answer);
    }

    /// The epoch held now (0 before the first map).
    pub fn epoch(&self) -> Epoch {
        let log = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        log.back().map_or(Epoch(0), |a| a.epoch)
    }

    /// When the daemon first held `epoch` or a later one, if it has.
    pub fn reached(&self, epoch: Epoch) -> Option<Instant> {
        let log = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        log.iter().find(|a| a.epoch >= epoch).map(|a| a.at)
    }

    /// The answers received in `[from, to]`.
    pub fn window(&self, from: Instant, to: Instant) -> Vec<Answer> {
        let log = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        log.iter()
            .filter(|a| a.at >= from && a.at <= to)
            .copied()
            .collect()
    }

    /// Whole maps received since `since` that were not the daemon's first answer.
    pub fn fulls_after_first(&self, since: Instant) -> usize {
        let log = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        log.iter()
            .skip(1)
            .filter(|a| a.at >= since && a.kind == AnswerKind::Full)
            .count()
    }
}

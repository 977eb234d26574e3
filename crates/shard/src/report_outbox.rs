//! What an OSD owes the monitor, sent in batches (`POST /v1/osds/{id}/reports`): the reports
//! of its shards wait here until the next batch, the newest configuration of a PG replacing an
//! older one still waiting, and a report the monitor could not take yet (no leader, etcd out of
//! space) waits for the next batch instead of being lost. The OSD and the simulator's nodes
//! keep one each: the same decisions of what to send again and what to drop.

use fastblock_types::api::{ApiError, OsdReport, REPORT_BATCH_ITEMS_MAX};
use fastblock_types::{ImageId, PgId};
use std::collections::BTreeMap;

/// What one report is about: a PG's configuration (a newer one replaces an older), or one
/// confirmation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Key {
    Config(PgId),
    Reclaim(PgId, u64),
    Snap(PgId, ImageId, u64),
    Trim(PgId, u64),
}

fn key(r: &OsdReport) -> Key {
    match r {
        OsdReport::LeaderElected { pg, .. } | OsdReport::MembershipFinished { pg, .. } => {
            Key::Config(*pg)
        }
        OsdReport::ReclaimDone { pg, id } => Key::Reclaim(*pg, *id),
        OsdReport::SnapMarked { pg, image, snap } => Key::Snap(*pg, *image, *snap),
        OsdReport::SnapTrimmed { pg, id } => Key::Trim(*pg, *id),
    }
}

/// The (term, configuration index) a configuration report describes.
fn position(r: &OsdReport) -> Option<(u64, u64)> {
    match r {
        OsdReport::LeaderElected { req, .. } => Some((req.term.0, req.conf_index.0)),
        OsdReport::MembershipFinished { req, .. } => Some((req.term.0, req.conf_index.0)),
        _ => None,
    }
}

/// See the module documentation.
#[derive(Clone, Debug, Default)]
pub struct ReportOutbox {
    pending: BTreeMap<Key, OsdReport>,
}

/// What became of a batch's reports ([`ReportOutbox::settle`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settled {
    /// Taken by the monitor.
    pub taken: usize,
    /// Refused for a reason another try would not change (stale, unknown entry, a rule
    /// broken), with the reason: for the log.
    pub dropped: Vec<(OsdReport, ApiError)>,
    /// Waiting for the next batch (refused for now: no leader, etcd out of space, ...).
    pub again: usize,
}

impl ReportOutbox {
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// Adds a report. A PG's configuration replaces the one waiting unless that one is newer
    /// (a leader reports every configuration it applies; the monitor needs the last).
    pub fn push(&mut self, report: OsdReport) {
        let k = key(&report);
        if let (Some(waiting), Some(new)) = (self.pending.get(&k), position(&report)) {
            if position(waiting).is_some_and(|old| old > new) {
                return;
            }
        }
        self.pending.insert(k, report);
    }

    /// The next batch: the reports waiting, at most [`REPORT_BATCH_ITEMS_MAX`], taken out (they
    /// come back through [`ReportOutbox::settle`] or [`ReportOutbox::requeue`] if need be).
    pub fn take_batch(&mut self) -> Vec<OsdReport> {
        let keys: Vec<Key> = self
            .pending
            .keys()
            .take(REPORT_BATCH_ITEMS_MAX)
            .copied()
            .collect();
        keys.into_iter()
            .filter_map(|k| self.pending.remove(&k))
            .collect()
    }

    /// Takes the monitor's answers to `sent` (one per report, in order): a report refused for
    /// now waits again, unless a newer one for the same thing arrived meanwhile.
    pub fn settle(&mut self, sent: Vec<OsdReport>, results: Vec<Option<ApiError>>) -> Settled {
        assert_eq!(
            sent.len(),
            results.len(),
            "the monitor answers every report of a batch"
        );
        let mut settled = Settled::default();
        for (report, result) in sent.into_iter().zip(results) {
            match result {
                None => settled.taken += 1,
                Some(e) if e.retryable => {
                    settled.again += 1;
                    self.push_back(report);
                }
                Some(e) => settled.dropped.push((report, e)),
            }
        }
        settled
    }

    /// A batch that did not reach the monitor (or whose answer was lost): every report waits
    /// again.
    pub fn requeue(&mut self, sent: Vec<OsdReport>) {
        for report in sent {
            self.push_back(report);
        }
    }

    /// Puts back a report sent earlier, unless something newer for the same thing is waiting.
    fn push_back(&mut self, report: OsdReport) {
        let k = key(&report);
        if self.pending.contains_key(&k) && position(&report).is_none() {
            return; // the same confirmation, waiting already
        }
        self.push(report);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fastblock_types::api::{ErrorCode, LeaderElectedRequest};
    use fastblock_types::{LogIndex, OsdId, PoolId, Term};

    fn leader(seq: u32, term: u64, conf: u64) -> OsdReport {
        OsdReport::LeaderElected {
            pg: PgId::new(PoolId(1), seq),
            req: LeaderElectedRequest {
                leader: OsdId(1),
                term: Term(term),
                conf_index: LogIndex(conf),
                voters: vec![OsdId(1)],
                voters_outgoing: Vec::new(),
                learners: Vec::new(),
            },
        }
    }

    #[test]
    fn the_newest_configuration_of_a_pg_is_sent_once() {
        let mut o = ReportOutbox::default();
        o.push(leader(0, 5, 10));
        o.push(leader(0, 5, 12));
        o.push(leader(0, 5, 11)); // older: ignored
        o.push(OsdReport::ReclaimDone {
            pg: PgId::new(PoolId(1), 0),
            id: 3,
        });
        let batch = o.take_batch();
        assert_eq!(batch.len(), 2);
        assert_eq!(batch[0], leader(0, 5, 12));
        assert!(o.is_empty());
    }

    #[test]
    fn refused_for_now_waits_refused_for_good_is_dropped() {
        let mut o = ReportOutbox::default();
        o.push(leader(0, 5, 10));
        o.push(leader(1, 5, 10));
        o.push(leader(2, 5, 10));
        let batch = o.take_batch();
        // Meanwhile a newer configuration of PG 1.
        o.push(leader(1, 6, 11));
        let settled = o.settle(
            batch,
            vec![
                None,
                Some(ApiError::new(ErrorCode::MonStoreFull, "full")),
                Some(ApiError::new(ErrorCode::StaleReport, "stale")),
            ],
        );
        assert_eq!(
            (settled.taken, settled.again, settled.dropped.len()),
            (1, 1, 1)
        );
        // PG 1's newer report is what waits, not the one refused.
        assert_eq!(o.take_batch(), vec![leader(1, 6, 11)]);
        // A batch lost on the way: all of it waits again.
        o.push(leader(3, 1, 1));
        let batch = o.take_batch();
        o.requeue(batch.clone());
        assert_eq!(o.take_batch(), batch);
    }

    #[test]
    fn a_batch_is_bounded() {
        let mut o = ReportOutbox::default();
        for seq in 0..(REPORT_BATCH_ITEMS_MAX as u32 + 10) {
            o.push(leader(seq, 1, 1));
        }
        assert_eq!(o.take_batch().len(), REPORT_BATCH_ITEMS_MAX);
        assert_eq!(o.len(), 10);
    }
}

//! Raft safety, asserted as the run goes (the image model in [`crate::model`] checks reads;
//! the cluster checks convergence in the liveness phase):
//! - election safety: at most one leader per (PG, term), across all nodes and restarts;
//! - state-machine safety: every replica applies the same entry (term and content hash) at a
//!   given index of a PG, whoever applies it and whenever;
//! - each replica applies committed entries in order without gaps, from the applied index it
//!   opened with.

use crate::node::AppliedEntry;
use fastblock_types::{OsdId, PgId};
use std::collections::BTreeMap;

#[derive(Debug, Default)]
pub struct Safety {
    leaders: BTreeMap<(PgId, u64), OsdId>,
    /// PG → index → (term, content hash, result hash) of the committed entry.
    committed: BTreeMap<PgId, BTreeMap<u64, (u64, u32, u32)>>,
    /// Entries applied with the same content but another result than elsewhere (a
    /// configuration change refused on one replica, taken on another).
    pub results_differ: u64,
    /// (node, PG) → last index applied by the current incarnation.
    last_applied: BTreeMap<(OsdId, PgId), u64>,
    pub entries_checked: u64,
}

impl Safety {
    pub fn on_leader(&mut self, pg: PgId, term: u64, node: OsdId) -> Result<(), String> {
        match self.leaders.insert((pg, term), node) {
            Some(other) if other != node => Err(format!(
                "election safety: pg {pg} has two leaders in term {term}: osd {other} and osd {node}"
            )),
            _ => Ok(()),
        }
    }

    /// A replica (re)opened with this applied index.
    pub fn on_open(&mut self, node: OsdId, pg: PgId, applied: u64) {
        self.last_applied.insert((node, pg), applied);
    }

    pub fn on_applied(&mut self, node: OsdId, e: &AppliedEntry) -> Result<(), String> {
        let pg = e.pg;
        if e.snapshot {
            // An installed snapshot: the replica continues after its index, which is beyond
            // anything it applied (raft-rs restores only snapshots past its commit index).
            if let Some(last) = self.last_applied.get(&(node, pg)) {
                if e.index <= *last {
                    return Err(format!(
                        "pg {pg} osd {node}: installed a snapshot at {} after applying {last}",
                        e.index
                    ));
                }
            }
            self.last_applied.insert((node, pg), e.index);
            return Ok(());
        }
        self.entries_checked += 1;
        if let Some(last) = self.last_applied.get(&(node, pg)) {
            if e.index != last + 1 {
                return Err(format!(
                    "pg {pg} osd {node}: applied index {} after {last} (gap or repeat)",
                    e.index
                ));
            }
        }
        self.last_applied.insert((node, pg), e.index);
        if e.term == 0 {
            return Err(format!(
                "pg {pg} osd {node}: applied index {} has no term in the log",
                e.index
            ));
        }
        let log = self.committed.entry(pg).or_default();
        match log.get(&e.index) {
            None => {
                log.insert(e.index, (e.term, e.hash, e.result));
                Ok(())
            }
            Some(&(term, hash, result)) if term == e.term && hash == e.hash => {
                if result != e.result {
                    self.results_differ += 1;
                }
                Ok(())
            }
            Some(&(term, hash, _)) => Err(format!(
                "state-machine safety: pg {pg} index {}: osd {node} applied term {} hash {:#010x}, \
                 but term {term} hash {hash:#010x} was applied there before",
                e.index, e.term, e.hash
            )),
        }
    }
}

//! Raft safety, asserted as the run goes (the image model in [`crate::model`] checks reads;
//! the cluster checks convergence in the liveness phase):
//! - election safety: at most one leader per (PG, term), across all nodes and restarts;
//! - state-machine safety: every replica applies the same entry (term and content hash) at a
//!   given index of a PG, whoever applies it and whenever;
//! - each replica applies committed entries in order without gaps, from the applied index it
//!   opened with.

use fastblock_pg::Apply;
use fastblock_shard::AppliedRecord;
use fastblock_types::{OsdId, PgId};
use std::collections::BTreeMap;

/// A committed entry a replica applied, or a snapshot it installed (`snapshot`: the replica
/// continues after `index`), in the order they happened.
#[derive(Clone, Copy, Debug)]
pub struct AppliedEntry {
    pub pg: PgId,
    pub index: u64,
    pub term: u64,
    /// The entry's content.
    pub hash: u32,
    /// What applying it did: the operation, or the configuration it produced (0: none, the
    /// change was refused).
    pub result: u32,
    pub snapshot: bool,
}

impl AppliedEntry {
    /// The checker's record of an entry the core applied.
    pub fn applied(r: &AppliedRecord) -> AppliedEntry {
        // The entry's content: a client operation as decoded, or the raw entry (empty, or a
        // configuration change: what the leader proposed, whatever applying it did here).
        let hash = match (&r.apply, &r.entry) {
            (Apply::Op { .. }, _) => apply_hash(&r.apply),
            (Apply::Noop { .. }, Some(e)) => {
                crc32c::crc32c_append(crc32c::crc32c(&[e.get_entry_type() as u8]), &e.data)
            }
            (Apply::Noop { .. }, None) => 0,
        };
        AppliedEntry {
            pg: r.pg,
            index: r.index,
            term: r.term,
            hash,
            result: apply_hash(&r.apply),
            snapshot: false,
        }
    }

    /// The checker's record of a snapshot a replica installed at `index`.
    pub fn snapshot(pg: PgId, index: u64) -> AppliedEntry {
        AppliedEntry {
            pg,
            index,
            term: 0,
            hash: 0,
            result: 0,
            snapshot: true,
        }
    }
}

/// The hash of what applying an entry did, as the checker compares it across replicas.
fn apply_hash(a: &Apply) -> u32 {
    match a {
        Apply::Op { op, .. } => {
            let (ctx, data) = op.encode();
            crc32c::crc32c_append(crc32c::crc32c(&ctx), &data)
        }
        Apply::Noop {
            conf_state: None, ..
        } => 0,
        Apply::Noop {
            conf_state: Some(cs),
            ..
        } => {
            // raft-rs lists members in hash-set order, which differs between replicas with
            // different histories: compare the sets.
            let mut crc = 1u32;
            for list in [
                &cs.voters,
                &cs.learners,
                &cs.voters_outgoing,
                &cs.learners_next,
            ] {
                let mut ids = list.clone();
                ids.sort_unstable();
                for id in ids {
                    crc = crc32c::crc32c_append(crc, &id.to_le_bytes());
                }
                crc = crc32c::crc32c_append(crc, &[0xFF]);
            }
            crc32c::crc32c_append(crc, &[u8::from(cs.auto_leave)]) | 1
        }
    }
}

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

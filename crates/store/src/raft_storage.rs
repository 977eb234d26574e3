//! Reading the log back (entry cache first, then the disk) and `raft::Storage` per PG.
//!
//! raft-rs owns its storage and calls it through `&self`, while reading an evicted entry
//! needs the device. A shard's store is single-threaded, so [`PgStorage`] shares it through
//! `Rc<RefCell<_>>`: the caller must not hold a borrow of the store across calls into raft.

use crate::disk::{AlignedBuf, Disk};
use crate::error::{Error, Result};
use crate::store::Store;
use crate::wal::record;
use crate::wal::writer::io_err;
use crate::wal::Wal;
use fastblock_types::units::SECTOR_SIZE_BYTES;
use fastblock_types::PgId;
use raft::eraftpb::{Entry, Snapshot};
use raft::{GetEntriesContext, RaftState, StorageError};
use std::cell::RefCell;
use std::rc::Rc;

impl Wal {
    /// Reads one entry, from the cache or from its record on disk (checksum verified).
    pub(crate) fn read_entry(&self, disk: &mut dyn Disk, pg: PgId, index: u64) -> Result<Entry> {
        let log = self.pg(pg).ok_or(Error::PgNotFound(pg))?;
        if let Some(e) = log.cached(index) {
            return Ok(e.clone());
        }
        let meta = log.meta(index).ok_or_else(|| {
            Error::InvalidArgument(format!("PG {pg}: entry {index} is not in the log"))
        })?;
        let loc = meta.loc.expect("recovered logs have no holes");
        let seg_base = self.sb.segment_offset_bytes(self.segment_slot(loc.seq));
        let start = u64::from(loc.offset_bytes);
        let lo = start - start % SECTOR_SIZE_BYTES;
        let hi = (start + u64::from(loc.len_bytes)).next_multiple_of(SECTOR_SIZE_BYTES);
        let mut buf = AlignedBuf::zeroed((hi - lo) as usize);
        disk.read(seg_base + lo, &mut buf)
            .map_err(|e| io_err("WAL entry read", seg_base + lo, e))?;
        let at = (start - lo) as usize;
        let bad = |reason: String| Error::LogCorrupt {
            segment_seq: loc.seq,
            offset_bytes: start,
            reason,
        };
        let rec = record::decode(&buf[at..at + loc.len_bytes as usize])
            .map_err(|e| bad(format!("PG {pg} entry {index}: {e:?}")))?;
        if !rec.kind.is_entry() || rec.pg != pg || rec.lsn != meta.lsn {
            return Err(bad(format!(
                "PG {pg} entry {index}: record is not this entry"
            )));
        }
        let e = record::decode_entry(rec.payload)
            .filter(|e| e.index == index && e.term == meta.term)
            .ok_or_else(|| bad(format!("PG {pg} entry {index}: payload does not match")))?;
        Ok(e)
    }

    /// Entries `[low, high)` limited to `max_size_bytes` (at least one entry).
    pub(crate) fn entries(
        &mut self,
        disk: &mut dyn Disk,
        pg: PgId,
        low: u64,
        high: u64,
        max_size_bytes: Option<u64>,
    ) -> Result<Vec<Entry>> {
        // An entry no longer cached is read from its record; if that record's commit is
        // still in flight (an entry moved forward), wait for it so the read sees it.
        let uncached_in_flight = !self.in_flight.is_empty()
            && self.pg(pg).is_some_and(|l| {
                (low..high.min(l.cache_first_index()))
                    .any(|i| l.meta(i).is_some_and(|m| m.lsn > self.durable_lsn))
            });
        if uncached_in_flight {
            self.reap(disk, true)?;
        }
        let mut out = Vec::with_capacity((high.saturating_sub(low)) as usize);
        let mut size = 0u64;
        for i in low..high {
            let e = self.read_entry(disk, pg, i)?;
            size += crate::wal::entry_bytes(&e);
            if !out.is_empty() && max_size_bytes.is_some_and(|m| size > m) {
                break;
            }
            out.push(e);
        }
        Ok(out)
    }
}

/// `raft::Storage` for one PG of a shared store.
pub struct PgStorage<D: Disk> {
    store: Rc<RefCell<Store<D>>>,
    pg: PgId,
}

impl<D: Disk> PgStorage<D> {
    pub fn new(store: Rc<RefCell<Store<D>>>, pg: PgId) -> Self {
        PgStorage { store, pg }
    }
}

fn other(e: Error) -> raft::Error {
    raft::Error::Store(StorageError::Other(Box::new(e)))
}

impl<D: Disk> raft::Storage for PgStorage<D> {
    fn initial_state(&self) -> raft::Result<RaftState> {
        let s = self.store.borrow();
        let log = s.wal().pg(self.pg);
        Ok(log.map_or_else(RaftState::default, |l| {
            RaftState::new(l.hard_state.clone(), l.conf_state.clone())
        }))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        let mut s = self.store.borrow_mut();
        let (first, last) = s.log_bounds(self.pg);
        if low < first {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        assert!(
            high <= last + 1,
            "PG {}: entries up to {high} requested, last is {last}",
            self.pg
        );
        let max = max_size.into().filter(|m| *m != u64::MAX);
        s.entries(self.pg, low, high, max).map_err(other)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        let s = self.store.borrow();
        let (first, last) = s.log_bounds(self.pg);
        let log = s.wal().pg(self.pg);
        if idx + 1 < first {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if idx > last {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        Ok(log.and_then(|l| l.term(idx)).unwrap_or(0))
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.store.borrow().log_bounds(self.pg).0)
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.store.borrow().log_bounds(self.pg).1)
    }

    /// The store keeps no snapshot data: the OSD streams the live objects after this
    /// metadata, and the receiver replays the log after it (see `fastblock_pg::transfer` for
    /// why that copy is exact). So the metadata is the current applied index, whose
    /// configuration is the store's (recorded as entries are applied), and the log after it
    /// is still here (compaction stays behind applied).
    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        let s = self.store.borrow();
        let Some(log) = s.wal().pg(self.pg) else {
            return Err(raft::Error::Store(
                StorageError::SnapshotTemporarilyUnavailable,
            ));
        };
        let applied = s.applied_index(self.pg);
        if applied < request_index || applied < log.snap_index {
            return Err(raft::Error::Store(
                StorageError::SnapshotTemporarilyUnavailable,
            ));
        }
        let Some(term) = log.term(applied) else {
            return Err(raft::Error::Store(
                StorageError::SnapshotTemporarilyUnavailable,
            ));
        };
        let mut snap = Snapshot::default();
        let m = snap.mut_metadata();
        m.index = applied;
        m.term = term;
        m.set_conf_state(log.conf_state.clone());
        Ok(snap)
    }
}

//! The write-ahead log shared by all PGs of an OSD shard.
//!
//! - [`record`]: record layout and payloads (entries, hard state, conf state, compaction,
//!   snapshot, PG removal, checkpoint).
//! - [`segment`]: segment and batch headers.
//! - [`writer`]: appends into the pending batch, segment roll and recycling, group commit.
//! - [`recovery`]: replay from the anchor, tail cut, loud errors for damage before the tail.
//!
//! In memory the WAL keeps, per PG, the Raft hard state, conf state, compaction point and an
//! index of live entries (term, LSN, disk location), plus a bounded cache of recent entries.
//! Invariants (asserted): the pending batch is empty whenever a segment is rolled, so the
//! checkpoint written at the start of every segment equals the durable state; an entry's
//! segment stays live while the entry is; LSNs are dense and increase by one per record.

pub mod record;
pub mod recovery;
pub mod segment;
pub mod writer;

use crate::disk::AlignedBuf;
use crate::superblock::{Anchor, Superblock};
use fastblock_types::PgId;
use raft::eraftpb::{ConfState, Entry, HardState};
use std::collections::{BTreeMap, VecDeque};

/// Where a record lives: segment sequence number, byte offset in the segment, total length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Loc {
    pub seq: u64,
    pub offset_bytes: u32,
    pub len_bytes: u32,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct EntryMeta {
    pub term: u64,
    pub lsn: u64,
    /// `None` only during replay, for entries that the start checkpoint lists but whose
    /// records are in segments before the start (they must be compacted before replay ends).
    pub loc: Option<Loc>,
}

/// What [`PgLog::push`] did with an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pushed {
    /// Appended at the end (after truncating a conflicting suffix).
    Appended,
    /// The same entry (index and term) now lives in the new record; nothing else changed.
    Moved,
    /// It would leave a gap, or lies at or below the compaction point.
    Rejected,
}

/// Live segments: sequence number to slot and number of live entries it holds.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SegmentInfo {
    pub slot: u32,
    pub live_entries: u64,
}

pub(crate) type Segments = BTreeMap<u64, SegmentInfo>;

/// One PG's log state.
#[derive(Clone, Debug, Default)]
pub struct PgLog {
    pub hard_state: HardState,
    pub conf_state: ConfState,
    pub snap_index: u64,
    pub snap_term: u64,
    pub(crate) entries: VecDeque<EntryMeta>,
    /// A suffix of the log (the newest entries), bounded by `cache_bytes_max_per_pg`.
    pub(crate) cache: VecDeque<Entry>,
    pub(crate) cache_bytes: u64,
}

impl PgLog {
    pub fn first_index(&self) -> u64 {
        self.snap_index + 1
    }

    pub fn last_index(&self) -> u64 {
        self.snap_index + self.entries.len() as u64
    }

    pub(crate) fn meta(&self, index: u64) -> Option<&EntryMeta> {
        if index <= self.snap_index {
            return None;
        }
        self.entries.get((index - self.snap_index - 1) as usize)
    }

    pub fn term(&self, index: u64) -> Option<u64> {
        if index == self.snap_index {
            return Some(self.snap_term);
        }
        self.meta(index).map(|m| m.term)
    }

    pub(crate) fn cache_first_index(&self) -> u64 {
        self.last_index() + 1 - self.cache.len() as u64
    }

    pub(crate) fn cached(&self, index: u64) -> Option<&Entry> {
        let first = self.cache_first_index();
        if index < first || index > self.last_index() {
            return None;
        }
        let e = &self.cache[(index - first) as usize];
        assert_eq!(e.index, index, "entry cache out of step");
        Some(e)
    }

    fn release(segments: &mut Segments, m: &EntryMeta) {
        if let Some(loc) = m.loc {
            let s = segments
                .get_mut(&loc.seq)
                .unwrap_or_else(|| panic!("entry in unknown segment {}", loc.seq));
            assert!(
                s.live_entries > 0,
                "segment {} live count underflow",
                loc.seq
            );
            s.live_entries -= 1;
        }
    }

    /// Drops entries with index >= `index` (a conflicting suffix).
    pub(crate) fn truncate_from(&mut self, index: u64, segments: &mut Segments) {
        assert!(
            index > self.snap_index,
            "truncate below the compaction point"
        );
        while self.last_index() >= index {
            let m = self.entries.pop_back().expect("non-empty");
            Self::release(segments, &m);
            if self.cache.back().is_some_and(|e| e.index >= index) {
                let e = self.cache.pop_back().expect("non-empty");
                self.cache_bytes -= entry_bytes(&e);
            }
        }
        while self.cache.back().is_some_and(|e| e.index >= index) {
            let e = self.cache.pop_back().expect("non-empty");
            self.cache_bytes -= entry_bytes(&e);
        }
    }

    /// Appends one entry after truncating anything at or after its index; or, if the log holds
    /// an entry with the same index and term, moves that entry to the new record without
    /// touching the entries after it (Raft's log matching: same index and term, same entry;
    /// raft-rs persists only entries that conflict or extend, so this happens only when a
    /// shard moves live entries forward to free an old segment). Returns `Rejected` if the
    /// index would leave a gap or lies at or below the compaction point.
    pub(crate) fn push(&mut self, index: u64, meta: EntryMeta, segments: &mut Segments) -> Pushed {
        if index <= self.snap_index || index > self.last_index() + 1 {
            return Pushed::Rejected;
        }
        if let Some(loc) = meta.loc {
            segments
                .get_mut(&loc.seq)
                .unwrap_or_else(|| panic!("entry in unknown segment {}", loc.seq))
                .live_entries += 1;
        }
        let slot = (index - self.snap_index - 1) as usize;
        if self.entries.get(slot).is_some_and(|m| m.term == meta.term) {
            let old = std::mem::replace(&mut self.entries[slot], meta);
            Self::release(segments, &old);
            return Pushed::Moved;
        }
        self.truncate_from(index, segments);
        self.entries.push_back(meta);
        assert_eq!(self.last_index(), index);
        Pushed::Appended
    }

    /// Replay of a moved entry: gives entry `index` its new location. The log holds it with
    /// the same term, or as a placeholder of the start checkpoint (term unknown), which it
    /// fills; nothing after it is dropped. `false` if the log holds no such entry.
    pub(crate) fn relocate(
        &mut self,
        index: u64,
        meta: EntryMeta,
        segments: &mut Segments,
    ) -> bool {
        if index <= self.snap_index {
            return false;
        }
        let slot = (index - self.snap_index - 1) as usize;
        let Some(old) = self.entries.get(slot) else {
            return false;
        };
        let placeholder = old.term == 0 && old.loc.is_none();
        if !placeholder && old.term != meta.term {
            return false;
        }
        if let Some(loc) = meta.loc {
            segments
                .get_mut(&loc.seq)
                .unwrap_or_else(|| panic!("entry in unknown segment {}", loc.seq))
                .live_entries += 1;
        }
        let old = std::mem::replace(&mut self.entries[slot], meta);
        Self::release(segments, &old);
        true
    }

    pub(crate) fn push_cache(&mut self, e: Entry) {
        assert_eq!(
            e.index,
            self.last_index(),
            "cache must track the log's last entry"
        );
        if self.cache.back().is_some_and(|c| c.index + 1 != e.index) {
            self.clear_cache();
        }
        self.cache_bytes += entry_bytes(&e);
        self.cache.push_back(e);
    }

    /// Evicts the oldest cached entries that are already durable.
    pub(crate) fn trim_cache(&mut self, bytes_max: u64, durable_lsn: u64) {
        while self.cache_bytes > bytes_max {
            let Some(front) = self.cache.front() else {
                break;
            };
            let durable = self.meta(front.index).is_some_and(|m| m.lsn <= durable_lsn);
            if !durable {
                break;
            }
            let e = self.cache.pop_front().expect("non-empty");
            self.cache_bytes -= entry_bytes(&e);
        }
    }

    fn clear_cache(&mut self) {
        self.cache.clear();
        self.cache_bytes = 0;
    }

    /// Drops entries up to and including `index` and moves the compaction point there.
    pub(crate) fn compact(&mut self, index: u64, term: u64, segments: &mut Segments) {
        if index <= self.snap_index {
            return;
        }
        while self.snap_index < index {
            match self.entries.pop_front() {
                Some(m) => Self::release(segments, &m),
                None => {
                    self.snap_index = index;
                    break;
                }
            }
            self.snap_index += 1;
        }
        self.snap_term = term;
        while self.cache.front().is_some_and(|e| e.index <= index) {
            let e = self.cache.pop_front().expect("non-empty");
            self.cache_bytes -= entry_bytes(&e);
        }
    }

    /// Installs a snapshot: every entry goes, the log restarts after `index`.
    pub(crate) fn apply_snapshot(
        &mut self,
        index: u64,
        term: u64,
        cs: ConfState,
        segments: &mut Segments,
    ) {
        while let Some(m) = self.entries.pop_front() {
            Self::release(segments, &m);
        }
        self.clear_cache();
        self.snap_index = index;
        self.snap_term = term;
        self.conf_state = cs;
        // As raft-rs MemStorage does: a snapshot implies its index is committed.
        self.hard_state.commit = self.hard_state.commit.max(index);
        self.hard_state.term = self.hard_state.term.max(term);
    }

    pub(crate) fn release_all(&mut self, segments: &mut Segments) {
        while let Some(m) = self.entries.pop_front() {
            Self::release(segments, &m);
        }
        self.clear_cache();
    }
}

pub(crate) fn entry_bytes(e: &Entry) -> u64 {
    (e.data.len() + e.context.len() + 48) as u64
}

/// Tunables of the WAL that are not part of the on-disk format.
#[derive(Clone, Debug)]
pub struct WalOptions {
    /// Bound of each PG's entry cache; older entries are read back from disk.
    pub cache_bytes_max_per_pg: u64,
}

impl Default for WalOptions {
    fn default() -> Self {
        WalOptions {
            cache_bytes_max_per_pg: 4 << 20,
        }
    }
}

/// The WAL of one device.
pub struct Wal {
    pub(crate) sb: Superblock,
    pub(crate) options: WalOptions,
    pub(crate) pgs: BTreeMap<PgId, PgLog>,
    pub(crate) segments: Segments,
    /// The segment sequence number each slot holds (None: never used or unreadable).
    pub(crate) slot_seq: Vec<Option<u64>>,
    pub(crate) anchor: Anchor,
    pub(crate) cur_seq: u64,
    pub(crate) cur_slot: u32,
    /// Byte offset in the current segment where the next batch starts.
    pub(crate) cur_offset_bytes: u64,
    pub(crate) next_lsn: u64,
    pub(crate) durable_lsn: u64,
    /// The pending batch: header space, then records. `batch_body_bytes` are used.
    pub(crate) batch_buf: AlignedBuf,
    pub(crate) batch_body_bytes: usize,
    pub(crate) batch_records: u32,
    pub(crate) batch_first_lsn: u64,
    /// Segment header and checkpoint batch of a segment opened for the pending batch.
    pub(crate) roll_prefix: Option<AlignedBuf>,
    /// The last LSN of each commit submitted and not yet reported durable, oldest first.
    pub(crate) in_flight: std::collections::VecDeque<u64>,
    /// Batch buffers back from finished commits, for the next ones.
    pub(crate) spare_bufs: Vec<AlignedBuf>,
}

impl Wal {
    pub fn pg(&self, pg: PgId) -> Option<&PgLog> {
        self.pgs.get(&pg)
    }

    pub fn pg_ids(&self) -> impl Iterator<Item = PgId> + '_ {
        self.pgs.keys().copied()
    }

    /// The highest LSN known durable.
    pub fn durable_lsn(&self) -> u64 {
        self.durable_lsn
    }

    /// The highest LSN given to a record so far (staged, in flight or durable): a record
    /// staged now is durable once [`Wal::durable_lsn`] reaches this.
    pub fn staged_lsn(&self) -> u64 {
        self.next_lsn.saturating_sub(1)
    }

    /// The highest LSN handed to the disk (durable or in flight).
    pub fn submitted_lsn(&self) -> u64 {
        self.in_flight.back().copied().unwrap_or(self.durable_lsn)
    }

    /// Commits submitted and not yet reported durable.
    pub fn commits_in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Bytes of records waiting for `commit`.
    pub fn pending_bytes(&self) -> u64 {
        self.batch_body_bytes as u64
    }

    /// Oldest segment still holding a live entry (or the current one).
    pub(crate) fn live_start_seq(&self) -> u64 {
        self.segments
            .iter()
            .find(|(_, s)| s.live_entries > 0)
            .map_or(self.cur_seq, |(seq, _)| *seq)
            .min(self.cur_seq)
    }

    /// Sequence number of the segment being written: how far the log has advanced (the
    /// OSD flushes early after a few segments, so that a burst does not fill the WAL).
    pub fn current_segment_seq(&self) -> u64 {
        self.cur_seq
    }

    /// Segments the log currently occupies (for tests and metrics).
    pub fn live_segment_count(&self) -> u64 {
        self.cur_seq - self.live_start_seq() + 1
    }

    /// Bytes of the records of `pg`'s live entries (what moving them forward writes).
    pub fn live_entry_bytes(&self, pg: PgId) -> u64 {
        self.pgs.get(&pg).map_or(0, |l| {
            l.entries
                .iter()
                .filter_map(|m| m.loc)
                .map(|loc| u64::from(loc.len_bytes))
                .sum()
        })
    }

    /// Segment slots the log does not occupy: how many more segments it can open before
    /// the WAL is full.
    pub fn free_segment_count(&self) -> u64 {
        u64::from(self.sb.segment_count).saturating_sub(self.live_segment_count())
    }

    /// The oldest segment still holding a live entry, if it is not the one being written:
    /// with the PGs whose entries keep it live. The WAL is a ring, so that segment pins every
    /// later one; moving those PGs' entries forward (re-appending them, see
    /// `Store::append_entries`) frees it once the new records are durable (a segment is
    /// reused only at a roll, and a roll only happens with the pending batch committed).
    pub fn oldest_pinned_segment(&self) -> Option<(u64, Vec<PgId>)> {
        let oldest = self.live_start_seq();
        if oldest >= self.cur_seq {
            return None;
        }
        let pgs = self
            .pgs
            .iter()
            .filter(|(_, l)| {
                l.entries
                    .iter()
                    .any(|m| m.loc.is_some_and(|loc| loc.seq == oldest))
            })
            .map(|(pg, _)| *pg)
            .collect();
        Some((oldest, pgs))
    }

    /// Device byte offset and length of an entry's record (tests and tools).
    pub fn entry_disk_range(&self, pg: PgId, index: u64) -> Option<(u64, u32)> {
        let loc = self.pg(pg)?.meta(index)?.loc?;
        let base = self
            .sb
            .segment_offset_bytes(self.segments.get(&loc.seq)?.slot);
        Some((base + u64::from(loc.offset_bytes), loc.len_bytes))
    }

    pub(crate) fn segment_slot(&self, seq: u64) -> u32 {
        self.segments
            .get(&seq)
            .unwrap_or_else(|| panic!("segment {seq} is not live"))
            .slot
    }
}

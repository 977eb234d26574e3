//! Appending records to the pending batch, rolling and recycling segments, and group commit.
//!
//! Every mutation validates first and changes nothing on error. A record's final disk
//! location is known when it is appended: the segment roll is decided when the first record
//! of a batch arrives (the batch is then empty and a roll first waits for the commits in
//! flight, so the in-memory state equals the durable state and can be checkpointed into the
//! new segment).
//!
//! Group commits are synchronous ([`Wal::commit`]) or submitted ([`Wal::commit_submit`]) and
//! collected later ([`Wal::reap`]); the durable LSN moves only over commits the disk
//! reported durable, in submission order.

use super::record::{self, PgCheckpoint, RecordKind, RECORD_HEADER_BYTES};
use super::segment::{BatchHeader, SegmentHeader, BATCH_HEADER_BYTES, SEGMENT_HEADER_BYTES};
use super::{EntryMeta, Loc, PgLog, Pushed, SegmentInfo, Wal};
use crate::disk::{AlignedBuf, Disk, OwnedWrite, Submitted, WriteOp};
use crate::error::{Error, Result, SpaceArea};
use crate::superblock::Anchor;
use fastblock_types::units::SECTOR_SIZE_BYTES;
use fastblock_types::PgId;
use raft::eraftpb::{ConfState, Entry, HardState};
use std::io;

/// Tail of every segment kept for records that free space (compaction, snapshot, PG
/// removal), so that a full log can always be compacted.
pub const SEGMENT_SLACK_BYTES: u64 = 4096;

impl Wal {
    /// Makes room for records of `record_bytes` in total (headers included) in the pending
    /// batch, rolling to a new segment if the batch is empty and they do not fit the current
    /// one. Changes nothing on error. Records that free log space (`frees_space`) may use the
    /// last [`SEGMENT_SLACK_BYTES`] of a segment, so that compaction is always possible even
    /// when every segment is full.
    fn reserve(
        &mut self,
        disk: &mut dyn Disk,
        record_bytes: usize,
        frees_space: bool,
    ) -> Result<()> {
        let max = self.sb.batch_bytes_max as usize;
        if BATCH_HEADER_BYTES + record_bytes > max {
            return Err(Error::InvalidArgument(format!(
                "records of {record_bytes} bytes exceed the batch limit of {max} bytes"
            )));
        }
        let batch_full = |pending: usize| Error::BatchFull {
            pending_bytes: pending as u64,
            batch_bytes_max: max as u64,
        };
        if BATCH_HEADER_BYTES + self.batch_body_bytes + record_bytes > max {
            return Err(batch_full(self.batch_body_bytes));
        }
        // The roll is decided at a batch's first record, for the largest batch, so that a
        // batch never hits the segment end and `BatchFull` only ever means the batch limit.
        // A space-freeing record may instead use the slack of the current segment: that is
        // what lets a full log compact without a free segment to roll into.
        let fits = |w: &Wal, limit: u64| {
            let end =
                w.batch_offset() + (BATCH_HEADER_BYTES + w.batch_body_bytes + record_bytes) as u64;
            end.next_multiple_of(SECTOR_SIZE_BYTES) <= limit
        };
        let seg = self.sb.segment_size_bytes;
        let limit = if frees_space {
            seg
        } else {
            seg - SEGMENT_SLACK_BYTES
        };
        if self.batch_records == 0 && self.roll_prefix.is_none() {
            let worst = self.cur_offset_bytes + (max as u64).next_multiple_of(SECTOR_SIZE_BYTES);
            if worst > seg - SEGMENT_SLACK_BYTES && !(frees_space && fits(self, seg)) {
                self.roll(disk)?;
            }
        }
        if !fits(self, limit) {
            // Only after a space-freeing record opened the batch near the segment end.
            assert!(self.batch_records > 0, "a fresh segment holds any batch");
            return Err(batch_full(self.batch_body_bytes));
        }
        if self.batch_records == 0 {
            self.batch_first_lsn = self.next_lsn;
        }
        Ok(())
    }

    /// Writes one record into the pending batch; returns its location.
    fn put(&mut self, pg: PgId, kind: RecordKind, payload: &[&[u8]]) -> Loc {
        let start = BATCH_HEADER_BYTES + self.batch_body_bytes;
        let payload_len: usize = payload.iter().map(|p| p.len()).sum();
        let end = start + RECORD_HEADER_BYTES + payload_len;
        assert!(
            end <= self.batch_buf.capacity(),
            "reserve() admitted an oversized record"
        );
        if self.batch_buf.len() < end {
            // `encode_into` writes every byte of start..end (asserted below), the header
            // is written at sealing and the padding zeroed there: no need to zero first.
            self.batch_buf.set_len_for_overwrite(end);
        }
        let lsn = self.next_lsn;
        let n = record::encode_into(&mut self.batch_buf[start..end], lsn, pg, kind, payload);
        assert_eq!(n, end - start);
        self.next_lsn += 1;
        self.batch_records += 1;
        self.batch_body_bytes += n;
        let offset = self.batch_offset() + start as u64;
        Loc {
            seq: self.cur_seq,
            offset_bytes: u32::try_from(offset).expect("segment offsets fit u32"),
            len_bytes: n as u32,
        }
    }

    /// Where the pending batch will be written in the current segment.
    fn batch_offset(&self) -> u64 {
        match &self.roll_prefix {
            Some(p) => p.len() as u64,
            None => self.cur_offset_bytes,
        }
    }

    fn pg_mut(&mut self, pg: PgId) -> &mut PgLog {
        self.pgs.entry(pg).or_default()
    }

    /// Appends Raft entries of one PG. They must be contiguous; the first may overwrite a
    /// conflicting suffix (everything from its index on is dropped).
    pub fn append_entries(
        &mut self,
        disk: &mut dyn Disk,
        pg: PgId,
        entries: &[Entry],
    ) -> Result<()> {
        let Some(first) = entries.first() else {
            return Ok(());
        };
        let (snap, last) = self
            .pgs
            .get(&pg)
            .map_or((0, 0), |l| (l.snap_index, l.last_index()));
        if first.index <= snap || first.index > last + 1 {
            return Err(Error::InvalidArgument(format!(
                "PG {pg}: entry {} does not fit a log with compaction point {snap} and last index {last}",
                first.index
            )));
        }
        for w in entries.windows(2) {
            if w[1].index != w[0].index + 1 || w[1].term < w[0].term {
                return Err(Error::InvalidArgument(format!(
                    "PG {pg}: entries {} and {} are not contiguous",
                    w[0].index, w[1].index
                )));
            }
        }
        let total: usize = entries
            .iter()
            .map(|e| RECORD_HEADER_BYTES + record::entry_payload_bytes(e))
            .sum();
        self.reserve(disk, total, false)?;
        for e in entries {
            let fixed = record::entry_fixed(e);
            // An entry the log holds with the same term is a move: its record says so, so
            // that replay relocates it without dropping what follows, even where the start
            // checkpoint left only a placeholder of unknown term.
            let moved = self
                .pgs
                .get(&pg)
                .and_then(|l| l.meta(e.index))
                .is_some_and(|m| m.term == e.term);
            let kind = if moved {
                RecordKind::EntryMoved
            } else {
                RecordKind::Entry
            };
            let loc = self.put(pg, kind, &[&fixed, &e.context, &e.data]);
            let meta = EntryMeta {
                term: e.term,
                lsn: self.next_lsn - 1,
                loc: Some(loc),
            };
            let cache_max = self.options.cache_bytes_max_per_pg;
            let durable = self.durable_lsn;
            let segments = &mut self.segments;
            let log = self.pgs.entry(pg).or_default();
            match log.push(e.index, meta, segments) {
                Pushed::Appended => {
                    assert!(
                        !moved,
                        "pg {pg}: entry {} recorded as moved was appended",
                        e.index
                    );
                    log.push_cache(e.clone());
                    log.trim_cache(cache_max, durable);
                }
                // The cache (a suffix of the log) holds the same entry, or it is read back
                // from its new record once that is written.
                Pushed::Moved => {}
                Pushed::Rejected => panic!("validated entry rejected"),
            }
        }
        Ok(())
    }

    pub fn set_hard_state(&mut self, disk: &mut dyn Disk, pg: PgId, hs: &HardState) -> Result<()> {
        let payload = record::encode_hard_state(hs);
        self.reserve(disk, RECORD_HEADER_BYTES + payload.len(), false)?;
        self.put(pg, RecordKind::HardState, &[&payload]);
        self.pg_mut(pg).hard_state = hs.clone();
        Ok(())
    }

    /// Records the PG's current configuration (also creates the PG's log).
    pub fn set_conf_state(&mut self, disk: &mut dyn Disk, pg: PgId, cs: &ConfState) -> Result<()> {
        let mut payload = Vec::new();
        record::put_conf_state(&mut payload, cs);
        self.reserve(disk, RECORD_HEADER_BYTES + payload.len(), false)?;
        self.put(pg, RecordKind::ConfState, &[&payload]);
        self.pg_mut(pg).conf_state = cs.clone();
        Ok(())
    }

    /// Drops entries up to `index` (which must be in the log). The caller checks that their
    /// effects are flushed.
    pub fn compact(&mut self, disk: &mut dyn Disk, pg: PgId, index: u64) -> Result<()> {
        let log = self.pgs.get(&pg).ok_or(Error::PgNotFound(pg))?;
        if index <= log.snap_index {
            return Ok(());
        }
        let term = log.term(index).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "PG {pg}: compact to {index} past last index {}",
                log.last_index()
            ))
        })?;
        let mut payload = Vec::new();
        crate::codec::put_u64(&mut payload, index);
        crate::codec::put_u64(&mut payload, term);
        self.reserve(disk, RECORD_HEADER_BYTES + payload.len(), true)?;
        self.put(pg, RecordKind::Compact, &[&payload]);
        let segments = &mut self.segments;
        self.pgs
            .get_mut(&pg)
            .expect("checked")
            .compact(index, term, segments);
        Ok(())
    }

    /// Installs a received snapshot's metadata: the log restarts after `index`.
    pub fn apply_snapshot(
        &mut self,
        disk: &mut dyn Disk,
        pg: PgId,
        index: u64,
        term: u64,
        cs: &ConfState,
    ) -> Result<()> {
        let mut payload = Vec::new();
        crate::codec::put_u64(&mut payload, index);
        crate::codec::put_u64(&mut payload, term);
        record::put_conf_state(&mut payload, cs);
        self.reserve(disk, RECORD_HEADER_BYTES + payload.len(), true)?;
        self.put(pg, RecordKind::Snapshot, &[&payload]);
        let segments = &mut self.segments;
        self.pgs
            .entry(pg)
            .or_default()
            .apply_snapshot(index, term, cs.clone(), segments);
        Ok(())
    }

    /// Forgets a PG's log entirely.
    pub fn remove_pg(&mut self, disk: &mut dyn Disk, pg: PgId) -> Result<()> {
        if !self.pgs.contains_key(&pg) {
            return Ok(());
        }
        self.reserve(disk, RECORD_HEADER_BYTES, true)?;
        self.put(pg, RecordKind::PgRemove, &[]);
        let mut log = self.pgs.remove(&pg).expect("checked");
        log.release_all(&mut self.segments);
        Ok(())
    }

    /// The checkpoint of every PG's state, as written at the start of each segment.
    pub(crate) fn checkpoint(&self) -> Vec<PgCheckpoint> {
        self.pgs
            .iter()
            .map(|(pg, l)| PgCheckpoint {
                pg: record::pg_to_u64(*pg),
                hard_state: l.hard_state.clone(),
                conf_state: l.conf_state.clone(),
                snap_index: l.snap_index,
                snap_term: l.snap_term,
                last_index: l.last_index(),
            })
            .collect()
    }

    /// Opens the next segment for the pending batch. Only called with an empty batch.
    pub(crate) fn roll(&mut self, disk: &mut dyn Disk) -> Result<()> {
        assert_eq!(self.batch_records, 0, "roll with a pending batch");
        assert!(self.roll_prefix.is_none(), "double roll");
        // Recovery reads a segment before the last as ending exactly where the next one says:
        // a torn batch of this segment behind a durable next one would be corruption, not a
        // tail. So no commit of this segment may be in flight when the next one is written.
        self.reap(disk, true)?;
        let live_start = self.live_start_seq();
        let slot = match self.free_slot() {
            Some(s) => s,
            None if live_start > self.anchor.log_start_seq => {
                // Dead segments exist but the durable anchor still covers them: advance it
                // (one extra write and sync per roll at most) before reusing any.
                let anchor = Anchor {
                    generation: self.anchor.generation + 1,
                    log_start_seq: live_start,
                };
                let buf = aligned_copy(&anchor.encode(&self.sb.osd_uuid));
                disk.write(Anchor::copy_offset_bytes(anchor.generation), &buf, true)
                    .map_err(|e| io_err("anchor write", 0, e))?;
                self.anchor = anchor;
                self.segments.retain(|seq, _| *seq >= live_start);
                self.free_slot().expect("advancing the anchor frees a slot")
            }
            None => {
                return Err(Error::NoSpace {
                    area: SpaceArea::Wal,
                    needed_bytes: self.sb.segment_size_bytes,
                    free_bytes: 0,
                })
            }
        };
        let seq = self.cur_seq + 1;
        let header = SegmentHeader {
            seq,
            first_lsn: self.next_lsn,
            prev_end_offset_bytes: self.cur_offset_bytes,
            slot,
        };
        let ckpt = record::encode_checkpoint(&self.checkpoint());
        let ckpt_bytes = BATCH_HEADER_BYTES + RECORD_HEADER_BYTES + ckpt.len();
        let prefix_bytes = (SEGMENT_HEADER_BYTES as usize + ckpt_bytes)
            .next_multiple_of(SECTOR_SIZE_BYTES as usize);
        if prefix_bytes as u64
            + self.sb.batch_bytes_max.next_multiple_of(SECTOR_SIZE_BYTES)
            + SEGMENT_SLACK_BYTES
            > self.sb.segment_size_bytes
        {
            return Err(Error::InvalidArgument(format!(
                "checkpoint of {} PGs ({ckpt_bytes} bytes) does not fit a segment",
                self.pgs.len()
            )));
        }
        let mut prefix = AlignedBuf::zeroed(prefix_bytes);
        prefix[..SEGMENT_HEADER_BYTES as usize].copy_from_slice(&header.encode(&self.sb.osd_uuid));
        let batch_at = SEGMENT_HEADER_BYTES as usize;
        let n = record::encode_into(
            &mut prefix[batch_at + BATCH_HEADER_BYTES..],
            self.next_lsn,
            fastblock_types::PgId::new(fastblock_types::PoolId(0), 0),
            RecordKind::Checkpoint,
            &[&ckpt],
        );
        BatchHeader {
            body_bytes: n as u32,
            record_count: 1,
            first_lsn: self.next_lsn,
            segment_seq: seq,
            durable_lsn: self.durable_lsn,
        }
        .write(&mut prefix[batch_at..]);
        self.next_lsn += 1;
        self.slot_seq[slot as usize] = Some(seq);
        self.segments.insert(
            seq,
            SegmentInfo {
                slot,
                live_entries: 0,
            },
        );
        self.cur_seq = seq;
        self.cur_slot = slot;
        self.cur_offset_bytes = prefix_bytes as u64;
        self.roll_prefix = Some(prefix);
        tracing::debug!(seq, slot, "WAL rolled to a new segment");
        Ok(())
    }

    /// A slot whose segment is older than the durable anchor (or was never used).
    fn free_slot(&self) -> Option<u32> {
        let start = self.anchor.log_start_seq;
        (0..self.sb.segment_count).find(|s| match self.slot_seq[*s as usize] {
            None => true,
            Some(seq) => seq < start,
        })
    }

    /// Finishes the pending batch's header in `batch_buf`; returns the batch's offset in
    /// the current segment and its padded length.
    fn seal_batch(&mut self) -> (u64, usize) {
        let batch_offset = self.batch_offset();
        let header = BatchHeader {
            body_bytes: self.batch_body_bytes as u32,
            record_count: self.batch_records,
            first_lsn: self.batch_first_lsn,
            segment_seq: self.cur_seq,
            // Only what is known durable now: a batch submitted while an earlier one is in
            // flight must not vouch for it (recovery reads this as "synced before me").
            durable_lsn: self.durable_lsn,
        };
        assert_eq!(
            header.first_lsn + u64::from(header.record_count),
            self.next_lsn,
            "LSNs not dense"
        );
        let used = BATCH_HEADER_BYTES + self.batch_body_bytes;
        let padded = header.padded_bytes() as usize;
        assert!(
            batch_offset + padded as u64 <= self.sb.segment_size_bytes,
            "batch overflows its segment"
        );
        // The padding is zeroed here (recovery must not read stale bytes as records).
        self.batch_buf.set_len_for_overwrite(padded);
        self.batch_buf[used..padded].fill(0);
        header.write(&mut self.batch_buf);
        (batch_offset, padded)
    }

    /// The sealed batch went to the disk: the next one starts behind it.
    fn batch_sent(&mut self, batch_offset: u64, padded: usize) {
        self.roll_prefix = None;
        self.cur_offset_bytes = batch_offset + padded as u64;
        self.batch_body_bytes = 0;
        self.batch_records = 0;
        self.batch_buf.resize(0);
    }

    /// Writes the pending batch (and the new segment's prefix, and `extra` writes such as
    /// applied object data) in one submission with one fdatasync, and waits for it. Commits
    /// still in flight become durable first, so the durable LSN never passes one. Returns the
    /// durable LSN.
    pub fn commit(&mut self, disk: &mut dyn Disk, extra: &[WriteOp<'_>]) -> Result<u64> {
        self.reap(disk, true)?;
        if self.batch_records == 0 {
            assert!(self.roll_prefix.is_none(), "rolled for an empty batch");
            if !extra.is_empty() {
                disk.write_many(extra, false)
                    .map_err(|e| io_err("data write", extra[0].offset_bytes, e))?;
            }
            return Ok(self.durable_lsn);
        }
        let (batch_offset, padded) = self.seal_batch();
        let seg_base = self.sb.segment_offset_bytes(self.cur_slot);
        let mut writes = Vec::with_capacity(2);
        if let Some(prefix) = &self.roll_prefix {
            writes.push(WriteOp {
                offset_bytes: seg_base,
                buf: &prefix[..],
            });
        }
        writes.push(WriteOp {
            offset_bytes: seg_base + batch_offset,
            buf: &self.batch_buf[..padded],
        });
        disk.write_durable_with(&writes, extra)
            .map_err(|e| io_err("WAL commit", seg_base + batch_offset, e))?;
        self.batch_sent(batch_offset, padded);
        self.durable_lsn = self.next_lsn - 1;
        Ok(self.durable_lsn)
    }

    /// Submits the pending batch (and the new segment's prefix) with its sync and returns
    /// without waiting: several group commits can be in flight. Returns the LSN that is
    /// durable once [`Wal::reap`] has seen this commit finish (the last submitted one if
    /// nothing is pending).
    pub fn commit_submit(&mut self, disk: &mut dyn Disk) -> Result<u64> {
        if self.batch_records == 0 {
            assert!(self.roll_prefix.is_none(), "rolled for an empty batch");
            return Ok(self.submitted_lsn());
        }
        let (batch_offset, padded) = self.seal_batch();
        let seg_base = self.sb.segment_offset_bytes(self.cur_slot);
        // The disk owns the batch's buffer until it is durable; the next batch fills another.
        let capacity = self.batch_buf.capacity();
        let next = self
            .spare_bufs
            .pop()
            .unwrap_or_else(|| AlignedBuf::zeroed(capacity));
        let batch = std::mem::replace(&mut self.batch_buf, next);
        assert_eq!(batch.len(), padded, "sealed batch length");
        let mut writes = Vec::with_capacity(2);
        if let Some(prefix) = self.roll_prefix.take() {
            writes.push(OwnedWrite {
                offset_bytes: seg_base,
                buf: prefix,
            });
        }
        writes.push(OwnedWrite {
            offset_bytes: seg_base + batch_offset,
            buf: batch,
        });
        let lsn = self.next_lsn - 1;
        let submitted = disk
            .submit_durable(writes)
            .map_err(|e| io_err("WAL commit", seg_base + batch_offset, e))?;
        self.batch_sent(batch_offset, padded);
        match submitted {
            Submitted::Durable(bufs) => {
                // A synchronous sync covered every earlier write: those in flight are
                // durable too, and are collected (in order) before the durable LSN moves.
                self.reap(disk, true)?;
                self.durable_lsn = lsn;
                self.recycle(bufs);
            }
            Submitted::InFlight => self.in_flight.push_back(lsn),
        }
        Ok(lsn)
    }

    /// Collects the commits the disk finished since the last call (all of them with `wait`)
    /// and returns the durable LSN.
    pub fn reap(&mut self, disk: &mut dyn Disk, wait: bool) -> Result<u64> {
        while !self.in_flight.is_empty() {
            let reaped = disk
                .reap_durable(wait)
                .map_err(|e| io_err("WAL commit", 0, e))?;
            assert!(
                reaped.count <= self.in_flight.len(),
                "{} commits reported durable, {} in flight",
                reaped.count,
                self.in_flight.len()
            );
            for _ in 0..reaped.count {
                let lsn = self.in_flight.pop_front().expect("counted above");
                assert!(lsn > self.durable_lsn, "durable LSN went back");
                self.durable_lsn = lsn;
            }
            self.recycle(reaped.bufs);
            if !wait {
                break;
            }
        }
        Ok(self.durable_lsn)
    }

    /// Keeps buffers of finished batches for the next ones (a segment prefix is dropped).
    fn recycle(&mut self, bufs: Vec<AlignedBuf>) {
        for b in bufs {
            if b.capacity() == self.batch_buf.capacity() && self.spare_bufs.len() < SPARE_BUFS_MAX {
                self.spare_bufs.push(b);
            }
        }
    }
}

/// Batch buffers kept for reuse: one per commit in flight is plenty.
const SPARE_BUFS_MAX: usize = 4;

pub(crate) fn io_err(op: &'static str, offset_bytes: u64, source: io::Error) -> Error {
    Error::Io {
        op,
        offset_bytes,
        source,
    }
}

pub(crate) fn aligned_copy(b: &[u8]) -> AlignedBuf {
    let mut a = AlignedBuf::zeroed(b.len());
    a.copy_from_slice(b);
    a
}

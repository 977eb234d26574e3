//! Formatting an empty WAL and replaying an existing one.
//!
//! Replay starts at the anchor's `log_start_seq`, whose first batch is a checkpoint of every
//! PG, and walks segments `start, start+1, ..` while their headers are intact. Inside a
//! segment it follows batches while each has the right magic, segment, LSN and checksum.
//! - A segment before the last must end exactly where the next segment's header says it
//!   ended; anything else is corruption before the tail ([`Error::LogCorrupt`]).
//! - In the last segment, the first invalid batch is the tail, unless a later intact batch in
//!   that segment says (through its `durable_lsn`) that the invalid one had been synced: then
//!   it is corruption, reported loudly, never skipped.
//! - Intact batches after the tail that vouch for nothing are commits that were in flight
//!   together with the torn one (several can be). They are cut with it, and their headers
//!   are zeroed and synced before the log takes a new write: otherwise a later batch written
//!   at the tail could end exactly where one of them starts, and the next replay would take
//!   that stale batch (with the LSNs that follow) for part of the log.

use super::record::RECORD_HEADER_BYTES;
use super::record::{self, PgCheckpoint, RawRecord, RecordKind};
use super::segment::{
    BatchHeader, SegmentHeader, BATCH_HEADER_BYTES, INDEX_MAX, SEGMENT_HEADER_BYTES,
};
use super::writer::io_err;
use super::{EntryMeta, Loc, PgLog, Pushed, SegmentInfo, Segments, Wal, WalOptions};
use crate::codec::Reader;
use crate::disk::{AlignedBuf, Disk, ReadOp};
use crate::error::{Error, Result};
use crate::superblock::{Anchor, Superblock, ANCHOR_OFFSET_BYTES};
use fastblock_types::units::{BLOCK_SIZE_BYTES, SECTOR_SIZE_BYTES};
use std::collections::BTreeMap;

fn corrupt(segment_seq: u64, offset_bytes: u64, reason: impl Into<String>) -> Error {
    Error::LogCorrupt {
        segment_seq,
        offset_bytes,
        reason: reason.into(),
    }
}

impl Wal {
    fn empty(sb: &Superblock, options: WalOptions, anchor: Anchor) -> Wal {
        Wal {
            sb: sb.clone(),
            options,
            pgs: BTreeMap::new(),
            segments: Segments::new(),
            slot_seq: vec![None; sb.segment_count as usize],
            anchor,
            cur_seq: 0,
            cur_slot: 0,
            cur_offset_bytes: 0,
            next_lsn: 1,
            durable_lsn: 0,
            batch_buf: AlignedBuf::zeroed((sb.batch_bytes_max + SECTOR_SIZE_BYTES) as usize),
            batch_body_bytes: 0,
            batch_records: 0,
            batch_first_lsn: 1,
            roll_prefix: None,
            in_flight: std::collections::VecDeque::new(),
            spare_bufs: Vec::new(),
        }
    }

    /// Writes an empty log: every slot header zeroed, the anchor, and segment 1 with an empty
    /// checkpoint; synced before returning.
    pub fn format(disk: &mut dyn Disk, sb: &Superblock, options: WalOptions) -> Result<Wal> {
        let zero = AlignedBuf::zeroed(SEGMENT_HEADER_BYTES as usize);
        for slot in 0..sb.segment_count {
            disk.write(sb.segment_offset_bytes(slot), &zero, false)
                .map_err(|e| io_err("WAL format", sb.segment_offset_bytes(slot), e))?;
        }
        let anchor = Anchor {
            generation: 1,
            log_start_seq: 1,
        };
        let mut block = AlignedBuf::zeroed(BLOCK_SIZE_BYTES as usize);
        let other = Anchor::copy_offset_bytes(0) - ANCHOR_OFFSET_BYTES;
        let this = Anchor::copy_offset_bytes(1) - ANCHOR_OFFSET_BYTES;
        assert_ne!(other, this);
        block[this as usize..this as usize + SECTOR_SIZE_BYTES as usize]
            .copy_from_slice(&anchor.encode(&sb.osd_uuid));
        disk.write(ANCHOR_OFFSET_BYTES, &block, false)
            .map_err(|e| io_err("WAL format", ANCHOR_OFFSET_BYTES, e))?;
        let mut wal = Wal::empty(sb, options, anchor);
        wal.roll_for_format(disk)?;
        Ok(wal)
    }

    fn roll_for_format(&mut self, disk: &mut dyn Disk) -> Result<()> {
        // Reuse the ordinary roll path, then write its prefix on its own.
        self.roll(disk)?;
        let prefix = self.roll_prefix.take().expect("rolled");
        disk.write(self.sb.segment_offset_bytes(self.cur_slot), &prefix, true)
            .map_err(|e| io_err("WAL format", 0, e))?;
        self.durable_lsn = self.next_lsn - 1;
        Ok(())
    }

    /// Rebuilds the WAL state from disk.
    pub fn recover(disk: &mut dyn Disk, sb: &Superblock, options: WalOptions) -> Result<Wal> {
        let uuid = sb.osd_uuid;
        let mut block = AlignedBuf::zeroed(BLOCK_SIZE_BYTES as usize);
        disk.read(ANCHOR_OFFSET_BYTES, &mut block)
            .map_err(|e| io_err("anchor read", ANCHOR_OFFSET_BYTES, e))?;
        let anchor = Anchor::decode_block(&block, &uuid)
            .ok_or_else(|| corrupt(0, ANCHOR_OFFSET_BYTES, "no valid WAL anchor"))?;
        let headers = read_segment_headers(disk, sb)?;
        let mut wal = Wal::empty(sb, options, anchor);
        let mut by_seq: BTreeMap<u64, SegmentHeader> = BTreeMap::new();
        for (slot, h) in headers.iter().enumerate() {
            if let Some(h) = h {
                wal.slot_seq[slot] = Some(h.seq);
                if by_seq.insert(h.seq, *h).is_some() {
                    return Err(corrupt(h.seq, 0, "two slots hold the same segment"));
                }
            }
        }
        let start = anchor.log_start_seq;
        if !by_seq.contains_key(&start) {
            return Err(corrupt(start, 0, "the anchor's start segment is missing"));
        }
        let mut last = start;
        while by_seq.contains_key(&(last + 1)) {
            last += 1;
        }
        if let Some((seq, _)) = by_seq.range(last + 2..).next() {
            return Err(corrupt(
                *seq,
                0,
                format!("segment {} is missing before it", last + 1),
            ));
        }
        for seq in start..=last {
            wal.segments.insert(
                seq,
                SegmentInfo {
                    slot: by_seq[&seq].slot,
                    live_entries: 0,
                },
            );
        }
        let mut replay = Replay {
            wal,
            expected_lsn: by_seq[&start].first_lsn,
        };
        let mut seg = AlignedBuf::zeroed(sb.segment_size_bytes as usize);
        for seq in start..=last {
            let h = by_seq[&seq];
            if h.first_lsn != replay.expected_lsn {
                return Err(corrupt(
                    seq,
                    0,
                    format!(
                        "segment starts at LSN {} but the log continues at {}",
                        h.first_lsn, replay.expected_lsn
                    ),
                ));
            }
            let base = sb.segment_offset_bytes(h.slot);
            disk.read(base, &mut seg)
                .map_err(|e| io_err("WAL replay read", base, e))?;
            let end = replay.segment(seq, &seg)?;
            match end {
                None if seq == last && seq > start => {
                    // The roll into this segment was torn: it holds nothing durable.
                    replay.wal.slot_seq[h.slot as usize] = None;
                    replay.wal.segments.remove(&seq);
                    let prev = by_seq[&(seq - 1)];
                    replay.finish_at(seq - 1, prev.slot, h.prev_end_offset_bytes);
                    break;
                }
                None => {
                    return Err(corrupt(
                        seq,
                        SEGMENT_HEADER_BYTES,
                        "segment has no checkpoint",
                    ))
                }
                Some(end) if seq < last => {
                    let said = by_seq[&(seq + 1)].prev_end_offset_bytes;
                    if end != said {
                        return Err(corrupt(
                            seq,
                            end,
                            format!("segment ends at byte {end} but the next segment says {said}"),
                        ));
                    }
                }
                Some(end) => {
                    let stale = check_tail(seq, &seg, end, replay.expected_lsn)?;
                    erase_stale_batches(disk, base, seq, &stale)?;
                    replay.finish_at(seq, h.slot, end);
                }
            }
        }
        let wal = replay.wal;
        for (pg, log) in &wal.pgs {
            if let Some(i) = log.entries.iter().position(|m| m.loc.is_none()) {
                return Err(corrupt(
                    start,
                    0,
                    format!(
                        "PG {pg}: entry {} is listed by the checkpoint but not in the log",
                        log.snap_index + 1 + i as u64
                    ),
                ));
            }
        }
        Ok(wal)
    }
}

fn read_segment_headers(
    disk: &mut dyn Disk,
    sb: &Superblock,
) -> Result<Vec<Option<SegmentHeader>>> {
    let n = SEGMENT_HEADER_BYTES as usize;
    let mut buf = AlignedBuf::zeroed(n * sb.segment_count as usize);
    let mut reads: Vec<ReadOp<'_>> = buf
        .chunks_mut(n)
        .enumerate()
        .map(|(slot, b)| ReadOp {
            offset_bytes: sb.segment_offset_bytes(slot as u32),
            buf: b,
        })
        .collect();
    disk.read_many(&mut reads)
        .map_err(|e| io_err("WAL header read", 0, e))?;
    Ok(buf
        .chunks(n)
        .enumerate()
        .map(|(slot, b)| SegmentHeader::decode(b, &sb.osd_uuid).filter(|h| h.slot as usize == slot))
        .collect())
}

/// Decodes the batch at `pos` if it is intact and continues the log at `expected_lsn`.
fn parse_batch(
    seg: &[u8],
    pos: u64,
    seq: u64,
    expected_lsn: u64,
) -> Option<(BatchHeader, Vec<RawRecord<'_>>)> {
    let at = usize::try_from(pos).ok()?;
    let h = BatchHeader::peek(seg.get(at..)?)?;
    if h.segment_seq != seq || h.first_lsn != expected_lsn || h.record_count == 0 {
        return None;
    }
    let end = pos.checked_add(h.padded_bytes())?;
    if end > seg.len() as u64 || !h.verify(&seg[at..]) {
        return None;
    }
    let mut records = Vec::with_capacity(h.record_count as usize);
    let mut p = at + BATCH_HEADER_BYTES;
    let body_end = p + h.body_bytes as usize;
    while p < body_end {
        let rec = record::decode(&seg[p..body_end]).ok()?;
        if rec.lsn != expected_lsn + records.len() as u64 {
            return None;
        }
        p += rec.total_bytes;
        records.push(rec);
    }
    (records.len() == h.record_count as usize).then_some((h, records))
}

/// Whether an intact later batch of this segment vouches that the damaged one was durable
/// (an error). Otherwise returns the offsets of the intact later batches: commits in flight
/// at the stop, cut with the tail.
fn check_tail(seq: u64, seg: &[u8], end: u64, expected_lsn: u64) -> Result<Vec<u64>> {
    let mut stale = Vec::new();
    let mut p = end + SECTOR_SIZE_BYTES;
    while p + BATCH_HEADER_BYTES as u64 <= seg.len() as u64 {
        let b = &seg[p as usize..];
        if let Some(h) = BatchHeader::peek(b) {
            let fits = p + h.padded_bytes() <= seg.len() as u64;
            if h.segment_seq == seq && fits && h.verify(b) {
                if h.durable_lsn >= expected_lsn {
                    return Err(corrupt(seq, end, format!(
                        "damaged batch at LSN {expected_lsn}, but a later batch at byte {p} was written after it was durable")));
                }
                stale.push(p);
            }
        }
        p += SECTOR_SIZE_BYTES;
    }
    Ok(stale)
}

/// Zeroes the first sector (the header) of each stale batch at `offsets` of the segment at
/// `base`, and syncs, so no later replay can take one for part of the log.
fn erase_stale_batches(disk: &mut dyn Disk, base: u64, seq: u64, offsets: &[u64]) -> Result<()> {
    if offsets.is_empty() {
        return Ok(());
    }
    tracing::warn!(
        segment = seq,
        batches = offsets.len(),
        "WAL replay: erasing batches written after the torn tail (commits in flight at the stop)"
    );
    let zero = AlignedBuf::zeroed(SECTOR_SIZE_BYTES as usize);
    for off in offsets {
        disk.write(base + off, &zero, false)
            .map_err(|e| io_err("WAL tail erase", base + off, e))?;
    }
    disk.sync().map_err(|e| io_err("WAL tail erase", base, e))
}

struct Replay {
    wal: Wal,
    expected_lsn: u64,
}

impl Replay {
    /// Replays one segment; returns where its valid batches end, or `None` if it has no
    /// valid first (checkpoint) batch.
    fn segment(&mut self, seq: u64, seg: &[u8]) -> Result<Option<u64>> {
        let mut pos = SEGMENT_HEADER_BYTES;
        let mut first = true;
        while let Some((h, records)) = parse_batch(seg, pos, seq, self.expected_lsn) {
            for (i, rec) in records.iter().enumerate() {
                let offset = pos as usize
                    + BATCH_HEADER_BYTES
                    + records[..i].iter().map(|r| r.total_bytes).sum::<usize>();
                let loc = Loc {
                    seq,
                    offset_bytes: offset as u32,
                    len_bytes: rec.total_bytes as u32,
                };
                if first != (rec.kind == RecordKind::Checkpoint) {
                    return Err(corrupt(
                        seq,
                        offset as u64,
                        "checkpoint record out of place",
                    ));
                }
                first = false;
                self.apply(rec, loc)?;
            }
            self.expected_lsn += u64::from(h.record_count);
            pos += h.padded_bytes();
        }
        Ok((!first).then_some(pos))
    }

    fn finish_at(&mut self, seq: u64, slot: u32, end: u64) {
        let w = &mut self.wal;
        w.cur_seq = seq;
        w.cur_slot = slot;
        w.cur_offset_bytes = end;
        w.next_lsn = self.expected_lsn;
        w.durable_lsn = self.expected_lsn - 1;
        w.batch_first_lsn = self.expected_lsn;
    }

    fn apply(&mut self, rec: &RawRecord<'_>, loc: Loc) -> Result<()> {
        let bad = |what: &str| {
            corrupt(
                loc.seq,
                u64::from(loc.offset_bytes),
                format!("{what} record of PG {} unreadable", rec.pg),
            )
        };
        let wal = &mut self.wal;
        let mut r = Reader::new(rec.payload);
        match rec.kind {
            RecordKind::Checkpoint => {
                let pgs =
                    record::decode_checkpoint(rec.payload).ok_or_else(|| bad("checkpoint"))?;
                // A checkpoint cannot list more entries than the WAL could hold.
                let wal_bytes = wal.sb.segment_size_bytes * u64::from(wal.sb.segment_count);
                let entries_max = wal_bytes / RECORD_HEADER_BYTES as u64;
                if pgs
                    .iter()
                    .any(|p| p.last_index > INDEX_MAX || p.last_index - p.snap_index > entries_max)
                {
                    return Err(bad("checkpoint"));
                }
                if loc.seq == wal.anchor.log_start_seq {
                    install_checkpoint(wal, pgs);
                } else if pgs != wal.checkpoint() {
                    return Err(corrupt(
                        loc.seq,
                        u64::from(loc.offset_bytes),
                        "checkpoint disagrees with the replayed log",
                    ));
                }
            }
            kind @ (RecordKind::Entry | RecordKind::EntryMoved) => {
                let (index, term) = record::entry_index_term(rec.payload)
                    .filter(|(i, _)| *i <= INDEX_MAX)
                    .ok_or_else(|| bad("entry"))?;
                if record::decode_entry(rec.payload).is_none() {
                    return Err(bad("entry"));
                }
                let meta = EntryMeta {
                    term,
                    lsn: rec.lsn,
                    loc: Some(loc),
                };
                let segments = &mut wal.segments;
                let log = wal.pgs.entry(rec.pg).or_default();
                if kind == RecordKind::EntryMoved {
                    // A move of an entry the log holds (perhaps as a placeholder of the start
                    // checkpoint): relocated, nothing after it dropped. Taking it for a fresh
                    // entry dropped the placeholders after it, and the next checkpoint then
                    // disagreed with the replayed log (simulator, seed 16595073271290314718).
                    if !log.relocate(index, meta, segments) {
                        return Err(corrupt(
                            loc.seq,
                            u64::from(loc.offset_bytes),
                            format!(
                                "PG {}: moved entry {index} (term {term}) is not in the log",
                                rec.pg
                            ),
                        ));
                    }
                } else if log.push(index, meta, segments) == Pushed::Rejected {
                    return Err(corrupt(
                        loc.seq,
                        u64::from(loc.offset_bytes),
                        format!(
                            "PG {}: entry {index} does not follow last index {}",
                            rec.pg,
                            log.last_index()
                        ),
                    ));
                }
            }
            RecordKind::HardState => {
                let hs = record::read_hard_state(&mut r)
                    .filter(|_| r.is_empty())
                    .ok_or_else(|| bad("hard state"))?;
                wal.pgs.entry(rec.pg).or_default().hard_state = hs;
            }
            RecordKind::ConfState => {
                let cs = record::read_conf_state(&mut r)
                    .filter(|_| r.is_empty())
                    .ok_or_else(|| bad("conf state"))?;
                wal.pgs.entry(rec.pg).or_default().conf_state = cs;
            }
            RecordKind::Compact => {
                let (index, term) = (r.u64(), r.u64());
                let (Some(index @ 0..=INDEX_MAX), Some(term), true) = (index, term, r.is_empty())
                else {
                    return Err(bad("compact"));
                };
                let segments = &mut wal.segments;
                wal.pgs
                    .entry(rec.pg)
                    .or_default()
                    .compact(index, term, segments);
            }
            RecordKind::Snapshot => {
                let (index, term) = (r.u64(), r.u64());
                let cs = record::read_conf_state(&mut r);
                let (Some(index @ 0..=INDEX_MAX), Some(term), Some(cs), true) =
                    (index, term, cs, r.is_empty())
                else {
                    return Err(bad("snapshot"));
                };
                let segments = &mut wal.segments;
                wal.pgs
                    .entry(rec.pg)
                    .or_default()
                    .apply_snapshot(index, term, cs, segments);
            }
            RecordKind::PgRemove => {
                if let Some(mut log) = wal.pgs.remove(&rec.pg) {
                    log.release_all(&mut wal.segments);
                }
            }
        }
        Ok(())
    }
}

fn install_checkpoint(wal: &mut Wal, pgs: Vec<PgCheckpoint>) {
    assert!(wal.pgs.is_empty(), "start checkpoint must come first");
    for p in pgs {
        let mut log = PgLog {
            hard_state: p.hard_state,
            conf_state: p.conf_state,
            snap_index: p.snap_index,
            snap_term: p.snap_term,
            ..PgLog::default()
        };
        for _ in p.snap_index..p.last_index {
            log.entries.push_back(EntryMeta {
                term: 0,
                lsn: 0,
                loc: None,
            });
        }
        wal.pgs.insert(record::pg_from_u64(p.pg), log);
    }
}

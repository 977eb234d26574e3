//! Log records: a 32-byte header (crc32c, length, LSN, PG, kind) and a kind-specific payload.
//! Records are packed back to back inside a batch; nothing but the batch is aligned.

use crate::codec::{self, get_u32, get_u64, set_u32, set_u64, Reader};
use fastblock_types::{PgId, PoolId};
use raft::eraftpb::{ConfState, Entry, EntryType, HardState};

pub const RECORD_HEADER_BYTES: usize = 32;
/// Fixed part of an entry payload: index, term, entry type, context length.
pub const ENTRY_FIXED_BYTES: usize = 24;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum RecordKind {
    Entry = 1,
    HardState = 2,
    ConfState = 3,
    Compact = 4,
    Snapshot = 5,
    PgRemove = 6,
    Checkpoint = 7,
    /// An entry the PG holds with this index and term, written again at the head of the log
    /// (a move, to free its old segment). Same payload as `Entry`; replay only relocates it
    /// (or fills a checkpoint placeholder) and drops nothing after it.
    EntryMoved = 8,
}

impl RecordKind {
    /// Whether the record carries a Raft entry (written fresh or moved).
    pub fn is_entry(self) -> bool {
        matches!(self, RecordKind::Entry | RecordKind::EntryMoved)
    }

    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => RecordKind::Entry,
            2 => RecordKind::HardState,
            3 => RecordKind::ConfState,
            4 => RecordKind::Compact,
            5 => RecordKind::Snapshot,
            6 => RecordKind::PgRemove,
            7 => RecordKind::Checkpoint,
            8 => RecordKind::EntryMoved,
            _ => return None,
        })
    }
}

pub fn pg_to_u64(pg: PgId) -> u64 {
    (u64::from(pg.pool.get()) << 32) | u64::from(pg.seq)
}

pub fn pg_from_u64(v: u64) -> PgId {
    PgId::new(PoolId((v >> 32) as u32), v as u32)
}

/// Appends a record with `payload_len` bytes of payload written by `fill` to `out` at `at`,
/// and returns the record's total length.
pub fn encode_into(
    out: &mut [u8],
    lsn: u64,
    pg: PgId,
    kind: RecordKind,
    payload: &[&[u8]],
) -> usize {
    let payload_len: usize = payload.iter().map(|p| p.len()).sum();
    let total = RECORD_HEADER_BYTES + payload_len;
    assert!(out.len() >= total, "record does not fit its buffer");
    let hdr = &mut out[..RECORD_HEADER_BYTES];
    hdr.fill(0);
    set_u32(
        hdr,
        4,
        u32::try_from(payload_len).expect("record payload fits u32"),
    );
    set_u64(hdr, 8, lsn);
    set_u64(hdr, 16, pg_to_u64(pg));
    hdr[24] = kind as u8;
    let mut pos = RECORD_HEADER_BYTES;
    for p in payload {
        out[pos..pos + p.len()].copy_from_slice(p);
        pos += p.len();
    }
    let crc = crc32c::crc32c(&out[4..total]);
    set_u32(out, 0, crc);
    total
}

/// A record as found on disk, borrowed from the read buffer.
#[derive(Debug)]
pub struct RawRecord<'a> {
    pub lsn: u64,
    pub pg: PgId,
    pub kind: RecordKind,
    pub payload: &'a [u8],
    pub total_bytes: usize,
}

/// Why a record could not be decoded.
#[derive(Debug, PartialEq, Eq)]
pub enum RecordError {
    Short,
    Checksum,
    UnknownKind(u8),
}

pub fn decode(buf: &[u8]) -> Result<RawRecord<'_>, RecordError> {
    let payload_len = get_u32(buf, 4).ok_or(RecordError::Short)? as usize;
    let total = RECORD_HEADER_BYTES
        .checked_add(payload_len)
        .ok_or(RecordError::Short)?;
    if buf.len() < total {
        return Err(RecordError::Short);
    }
    let crc = get_u32(buf, 0).ok_or(RecordError::Short)?;
    if crc != crc32c::crc32c(&buf[4..total]) {
        return Err(RecordError::Checksum);
    }
    let kind = RecordKind::from_u8(buf[24]).ok_or(RecordError::UnknownKind(buf[24]))?;
    Ok(RawRecord {
        lsn: get_u64(buf, 8).ok_or(RecordError::Short)?,
        pg: pg_from_u64(get_u64(buf, 16).ok_or(RecordError::Short)?),
        kind,
        payload: &buf[RECORD_HEADER_BYTES..total],
        total_bytes: total,
    })
}

/// The fixed part of an entry payload; context and data follow it.
pub fn entry_fixed(e: &Entry) -> [u8; ENTRY_FIXED_BYTES] {
    let mut b = [0u8; ENTRY_FIXED_BYTES];
    set_u64(&mut b, 0, e.index);
    set_u64(&mut b, 8, e.term);
    set_u32(&mut b, 16, e.get_entry_type() as u32);
    set_u32(
        &mut b,
        20,
        u32::try_from(e.context.len()).expect("context fits u32"),
    );
    b
}

pub fn entry_payload_bytes(e: &Entry) -> usize {
    ENTRY_FIXED_BYTES + e.context.len() + e.data.len()
}

pub fn decode_entry(payload: &[u8]) -> Option<Entry> {
    let mut r = Reader::new(payload);
    let index = r.u64()?;
    let term = r.u64()?;
    let entry_type = match r.u32()? {
        0 => EntryType::EntryNormal,
        1 => EntryType::EntryConfChange,
        2 => EntryType::EntryConfChangeV2,
        _ => return None,
    };
    let context_len = r.u32()? as usize;
    let context = r.bytes(context_len)?;
    let data = r.bytes(r.remaining())?;
    let mut e = Entry::default();
    e.index = index;
    e.term = term;
    e.set_entry_type(entry_type);
    e.context = context.to_vec().into();
    e.data = data.to_vec().into();
    Some(e)
}

/// (index, term) of an entry payload without copying its data.
pub fn entry_index_term(payload: &[u8]) -> Option<(u64, u64)> {
    Some((get_u64(payload, 0)?, get_u64(payload, 8)?))
}

pub fn encode_hard_state(hs: &HardState) -> Vec<u8> {
    let mut b = Vec::with_capacity(24);
    codec::put_u64(&mut b, hs.term);
    codec::put_u64(&mut b, hs.vote);
    codec::put_u64(&mut b, hs.commit);
    b
}

pub(crate) fn read_hard_state(r: &mut Reader<'_>) -> Option<HardState> {
    let mut hs = HardState::default();
    hs.term = r.u64()?;
    hs.vote = r.u64()?;
    hs.commit = r.u64()?;
    Some(hs)
}

pub fn put_conf_state(b: &mut Vec<u8>, cs: &ConfState) {
    codec::put_u64_list(b, &cs.voters);
    codec::put_u64_list(b, &cs.learners);
    codec::put_u64_list(b, &cs.voters_outgoing);
    codec::put_u64_list(b, &cs.learners_next);
    codec::put_u8(b, u8::from(cs.auto_leave));
}

pub(crate) fn read_conf_state(r: &mut Reader<'_>) -> Option<ConfState> {
    let mut cs = ConfState::default();
    cs.voters = r.u64_list()?;
    cs.learners = r.u64_list()?;
    cs.voters_outgoing = r.u64_list()?;
    cs.learners_next = r.u64_list()?;
    cs.auto_leave = match r.u8()? {
        0 => false,
        1 => true,
        _ => return None,
    };
    Some(cs)
}

/// The durable state of one PG's log, written whole into every segment's checkpoint.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PgCheckpoint {
    pub pg: u64,
    pub hard_state: HardState,
    pub conf_state: ConfState,
    pub snap_index: u64,
    pub snap_term: u64,
    pub last_index: u64,
}

pub fn encode_checkpoint(pgs: &[PgCheckpoint]) -> Vec<u8> {
    let mut b = Vec::new();
    codec::put_u32(&mut b, u32::try_from(pgs.len()).expect("PG count fits u32"));
    for p in pgs {
        codec::put_u64(&mut b, p.pg);
        b.extend_from_slice(&encode_hard_state(&p.hard_state));
        codec::put_u64(&mut b, p.snap_index);
        codec::put_u64(&mut b, p.snap_term);
        codec::put_u64(&mut b, p.last_index);
        put_conf_state(&mut b, &p.conf_state);
    }
    b
}

pub fn decode_checkpoint(payload: &[u8]) -> Option<Vec<PgCheckpoint>> {
    let mut r = Reader::new(payload);
    let n = r.u32()? as usize;
    // Each PG takes at least 73 bytes; refuse counts the payload cannot hold.
    if n > payload.len() / 73 + 1 {
        return None;
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let pg = r.u64()?;
        let hard_state = read_hard_state(&mut r)?;
        let snap_index = r.u64()?;
        let snap_term = r.u64()?;
        let last_index = r.u64()?;
        let conf_state = read_conf_state(&mut r)?;
        if last_index < snap_index {
            return None;
        }
        out.push(PgCheckpoint {
            pg,
            hard_state,
            conf_state,
            snap_index,
            snap_term,
            last_index,
        });
    }
    r.is_empty().then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_record_round_trips_and_detects_flips() {
        let mut e = Entry::default();
        e.index = 7;
        e.term = 3;
        e.data = vec![9u8; 100].into();
        e.context = vec![1, 2].into();
        let pg = PgId::new(PoolId(2), 5);
        let mut buf = vec![0u8; 256];
        let n = encode_into(
            &mut buf,
            42,
            pg,
            RecordKind::Entry,
            &[&entry_fixed(&e), &e.context, &e.data],
        );
        let rec = decode(&buf[..n]).unwrap();
        assert_eq!((rec.lsn, rec.pg, rec.kind), (42, pg, RecordKind::Entry));
        assert_eq!(decode_entry(rec.payload).unwrap(), e);
        for byte in 0..n {
            let mut bad = buf.clone();
            bad[byte] ^= 0x10;
            assert!(
                decode(&bad[..n]).is_err(),
                "flip at byte {byte} not detected"
            );
        }
    }

    #[test]
    fn checkpoint_round_trips() {
        let mut cs = ConfState::default();
        cs.voters = vec![1, 2, 3];
        let mut hs = HardState::default();
        hs.term = 4;
        let pgs = vec![PgCheckpoint {
            pg: 9,
            hard_state: hs,
            conf_state: cs,
            snap_index: 10,
            snap_term: 2,
            last_index: 20,
        }];
        assert_eq!(decode_checkpoint(&encode_checkpoint(&pgs)).unwrap(), pgs);
        assert!(decode_checkpoint(&[0xff, 0xff, 0xff, 0xff]).is_none());
    }
}

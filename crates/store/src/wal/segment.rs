//! Segment headers (one sector at the start of each WAL segment) and batch headers (40 bytes
//! before each group-committed batch of records).

use crate::codec::{get_u32, get_u64, set_u32, set_u64};
use fastblock_types::units::SECTOR_SIZE_BYTES;

pub const SEGMENT_MAGIC: [u8; 8] = *b"FBWALSEG";
pub const SEGMENT_HEADER_BYTES: u64 = SECTOR_SIZE_BYTES;
pub const SEGMENT_VERSION: u32 = 1;

/// Bounds on numbers read from disk, far beyond any real log, so that arithmetic on them can
/// never overflow whatever garbage a damaged disk holds.
pub const SEQ_MAX: u64 = u64::MAX / 4;
pub const LSN_MAX: u64 = u64::MAX / 4;
pub const INDEX_MAX: u64 = u64::MAX / 4;

pub const BATCH_MAGIC: u32 = 0xB47C_4B01;
pub const BATCH_HEADER_BYTES: usize = 40;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentHeader {
    pub seq: u64,
    pub first_lsn: u64,
    /// Where the valid data of segment `seq - 1` ends (its next batch offset), so that replay
    /// can tell a damaged middle segment from a cleanly ended one. 0 for the first segment.
    pub prev_end_offset_bytes: u64,
    pub slot: u32,
}

impl SegmentHeader {
    pub fn encode(&self, osd_uuid: &[u8; 16]) -> Vec<u8> {
        let mut b = vec![0u8; SEGMENT_HEADER_BYTES as usize];
        b[0..8].copy_from_slice(&SEGMENT_MAGIC);
        set_u32(&mut b, 12, SEGMENT_VERSION);
        b[16..32].copy_from_slice(osd_uuid);
        set_u64(&mut b, 32, self.seq);
        set_u64(&mut b, 40, self.first_lsn);
        set_u64(&mut b, 48, self.prev_end_offset_bytes);
        set_u32(&mut b, 56, self.slot);
        let crc = crc32c::crc32c(&b[12..]);
        set_u32(&mut b, 8, crc);
        b
    }

    /// `None` unless this is an intact header of this OSD's log.
    pub fn decode(b: &[u8], osd_uuid: &[u8; 16]) -> Option<Self> {
        let n = SEGMENT_HEADER_BYTES as usize;
        if b.len() < n || b[0..8] != SEGMENT_MAGIC || &b[16..32] != osd_uuid {
            return None;
        }
        if get_u32(b, 8)? != crc32c::crc32c(&b[12..n]) || get_u32(b, 12)? != SEGMENT_VERSION {
            return None;
        }
        let h = SegmentHeader {
            seq: get_u64(b, 32)?,
            first_lsn: get_u64(b, 40)?,
            prev_end_offset_bytes: get_u64(b, 48)?,
            slot: get_u32(b, 56)?,
        };
        let sane = (1..=SEQ_MAX).contains(&h.seq) && (1..=LSN_MAX).contains(&h.first_lsn);
        sane.then_some(h)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchHeader {
    pub body_bytes: u32,
    pub record_count: u32,
    pub first_lsn: u64,
    pub segment_seq: u64,
    /// Every LSN up to this one was durable before this batch was written. A damaged batch
    /// whose LSNs a later intact batch vouches for is corruption, not a torn tail.
    pub durable_lsn: u64,
}

impl BatchHeader {
    /// Fills the header in front of `body` (which starts at `buf[BATCH_HEADER_BYTES..]`).
    pub fn write(&self, buf: &mut [u8]) {
        let end = BATCH_HEADER_BYTES + self.body_bytes as usize;
        set_u32(buf, 0, BATCH_MAGIC);
        set_u32(buf, 8, self.body_bytes);
        set_u32(buf, 12, self.record_count);
        set_u64(buf, 16, self.first_lsn);
        set_u64(buf, 24, self.segment_seq);
        set_u64(buf, 32, self.durable_lsn);
        let crc = crc32c::crc32c(&buf[8..end]);
        set_u32(buf, 4, crc);
    }

    /// Reads the header fields only (no body check): `None` if the magic is wrong.
    pub fn peek(buf: &[u8]) -> Option<Self> {
        if get_u32(buf, 0)? != BATCH_MAGIC {
            return None;
        }
        Some(BatchHeader {
            body_bytes: get_u32(buf, 8)?,
            record_count: get_u32(buf, 12)?,
            first_lsn: get_u64(buf, 16)?,
            segment_seq: get_u64(buf, 24)?,
            durable_lsn: get_u64(buf, 32)?,
        })
    }

    /// Checks the batch checksum; `buf` must hold the header and the whole body.
    pub fn verify(&self, buf: &[u8]) -> bool {
        let end = BATCH_HEADER_BYTES + self.body_bytes as usize;
        match (buf.get(8..end), get_u32(buf, 4)) {
            (Some(covered), Some(crc)) => crc32c::crc32c(covered) == crc,
            _ => false,
        }
    }

    /// Bytes the batch occupies on disk, padded to a sector.
    pub fn padded_bytes(&self) -> u64 {
        (BATCH_HEADER_BYTES as u64 + u64::from(self.body_bytes)).next_multiple_of(SECTOR_SIZE_BYTES)
    }
}

//! The superblock (byte 0 of the device) and the WAL anchor (the two sectors after it).
//! Layouts are in `docs/design/store-format.md`; every integer is little-endian.

use crate::codec::{get_u32, get_u64, set_u32, set_u64};
use crate::error::{Error, Result};
use fastblock_types::units::{BLOCK_SIZE_BYTES, SECTOR_SIZE_BYTES};

pub const SUPERBLOCK_MAGIC: [u8; 8] = *b"FBSTORE\0";
pub const FORMAT_VERSION: u32 = 1;
/// Bytes reserved for the superblock at offset 0.
pub const SUPERBLOCK_SIZE_BYTES: u64 = BLOCK_SIZE_BYTES;
/// The anchor's two alternating copies live in the block after the superblock.
pub const ANCHOR_OFFSET_BYTES: u64 = SUPERBLOCK_SIZE_BYTES;
pub const ANCHOR_MAGIC: [u8; 8] = *b"FBANCHOR";
/// Where the WAL region starts: after the superblock block and the anchor block.
pub const WAL_OFFSET_BYTES: u64 = 2 * BLOCK_SIZE_BYTES;

// The superblock and each anchor copy must fit their slots, or a torn write could mix them.
const _: () = assert!(SUPERBLOCK_SIZE_BYTES.is_multiple_of(SECTOR_SIZE_BYTES));
const _: () = assert!(2 * SECTOR_SIZE_BYTES <= BLOCK_SIZE_BYTES);

/// The static description of a formatted device, written once by mkfs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub osd_uuid: [u8; 16],
    pub device_size_bytes: u64,
    pub segment_size_bytes: u64,
    pub segment_count: u32,
    pub data_offset_bytes: u64,
    pub data_size_bytes: u64,
    pub batch_bytes_max: u64,
}

impl Superblock {
    /// Lays the regions out on a device of `device_size_bytes`.
    pub fn layout(
        osd_uuid: [u8; 16],
        device_size_bytes: u64,
        segment_size_bytes: u64,
        segment_count: u32,
        batch_bytes_max: u64,
    ) -> Result<Self> {
        let bad = |m: String| Err(Error::InvalidArgument(m));
        if !segment_size_bytes.is_multiple_of(BLOCK_SIZE_BYTES) || segment_size_bytes == 0 {
            return bad(format!(
                "segment size {segment_size_bytes} is not a multiple of 4 KiB"
            ));
        }
        if segment_count < 3 {
            return bad("at least 3 WAL segments are needed to recycle them".into());
        }
        // A batch plus a segment header plus a checkpoint batch must fit an empty segment.
        if batch_bytes_max < BLOCK_SIZE_BYTES || batch_bytes_max * 4 > segment_size_bytes {
            return bad(format!(
                "batch size {batch_bytes_max} must be >= 4 KiB and <= a quarter of the segment size"
            ));
        }
        let data_offset_bytes = WAL_OFFSET_BYTES + segment_size_bytes * u64::from(segment_count);
        let data_size_bytes = device_size_bytes.saturating_sub(data_offset_bytes)
            / BLOCK_SIZE_BYTES
            * BLOCK_SIZE_BYTES;
        if data_size_bytes < 16 * BLOCK_SIZE_BYTES {
            return bad(format!(
                "device of {device_size_bytes} bytes too small for a WAL of {segment_count} x {segment_size_bytes} bytes"
            ));
        }
        Ok(Superblock {
            osd_uuid,
            device_size_bytes,
            segment_size_bytes,
            segment_count,
            data_offset_bytes,
            data_size_bytes,
            batch_bytes_max,
        })
    }

    pub fn data_blocks(&self) -> u64 {
        self.data_size_bytes / BLOCK_SIZE_BYTES
    }

    pub fn segment_offset_bytes(&self, slot: u32) -> u64 {
        assert!(slot < self.segment_count);
        WAL_OFFSET_BYTES + u64::from(slot) * self.segment_size_bytes
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; SUPERBLOCK_SIZE_BYTES as usize];
        b[0..8].copy_from_slice(&SUPERBLOCK_MAGIC);
        set_u32(&mut b, 12, FORMAT_VERSION);
        b[16..32].copy_from_slice(&self.osd_uuid);
        set_u64(&mut b, 32, self.device_size_bytes);
        set_u32(&mut b, 40, BLOCK_SIZE_BYTES as u32);
        set_u32(&mut b, 44, SECTOR_SIZE_BYTES as u32);
        set_u64(&mut b, 48, WAL_OFFSET_BYTES);
        set_u64(&mut b, 56, self.segment_size_bytes);
        set_u32(&mut b, 64, self.segment_count);
        set_u64(&mut b, 72, self.data_offset_bytes);
        set_u64(&mut b, 80, self.data_size_bytes);
        set_u64(&mut b, 88, self.batch_bytes_max);
        let crc = crc32c::crc32c(&b[12..]);
        set_u32(&mut b, 8, crc);
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self> {
        let bad = |m: &str| Error::BadSuperblock(m.to_string());
        if b.len() < SUPERBLOCK_SIZE_BYTES as usize || b[0..8] != SUPERBLOCK_MAGIC {
            return Err(bad("no fastblock superblock (wrong magic)"));
        }
        let crc = get_u32(b, 8).ok_or_else(|| bad("short"))?;
        if crc != crc32c::crc32c(&b[12..SUPERBLOCK_SIZE_BYTES as usize]) {
            return Err(bad("checksum mismatch"));
        }
        let version = get_u32(b, 12).ok_or_else(|| bad("short"))?;
        if version != FORMAT_VERSION {
            return Err(Error::BadSuperblock(format!(
                "format version {version}, this build reads {FORMAT_VERSION}"
            )));
        }
        let u64_at = |at| get_u64(b, at).ok_or_else(|| bad("short"));
        if get_u32(b, 40) != Some(BLOCK_SIZE_BYTES as u32)
            || get_u32(b, 44) != Some(SECTOR_SIZE_BYTES as u32)
            || u64_at(48)? != WAL_OFFSET_BYTES
        {
            return Err(bad("block, sector or WAL offset differ from this build"));
        }
        let mut osd_uuid = [0u8; 16];
        osd_uuid.copy_from_slice(&b[16..32]);
        let sb = Superblock {
            osd_uuid,
            device_size_bytes: u64_at(32)?,
            segment_size_bytes: u64_at(56)?,
            segment_count: get_u32(b, 64).ok_or_else(|| bad("short"))?,
            data_offset_bytes: u64_at(72)?,
            data_size_bytes: u64_at(80)?,
            batch_bytes_max: u64_at(88)?,
        };
        // Re-derive the layout so that a superblock with a valid checksum but impossible
        // geometry is still refused.
        let check = Superblock::layout(
            sb.osd_uuid,
            sb.device_size_bytes,
            sb.segment_size_bytes,
            sb.segment_count,
            sb.batch_bytes_max,
        )
        .map_err(|e| Error::BadSuperblock(format!("impossible geometry: {e}")))?;
        if check != sb {
            return Err(bad("regions do not match the geometry"));
        }
        Ok(sb)
    }
}

/// The durable lower bound of the live WAL: recovery replays segments from `log_start_seq`.
/// Two copies alternate so that a torn anchor write always leaves the previous one intact.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Anchor {
    pub generation: u64,
    pub log_start_seq: u64,
}

impl Anchor {
    pub fn copy_offset_bytes(generation: u64) -> u64 {
        ANCHOR_OFFSET_BYTES + (generation % 2) * SECTOR_SIZE_BYTES
    }

    pub fn encode(&self, osd_uuid: &[u8; 16]) -> Vec<u8> {
        let mut b = vec![0u8; SECTOR_SIZE_BYTES as usize];
        b[0..8].copy_from_slice(&ANCHOR_MAGIC);
        b[12..28].copy_from_slice(osd_uuid);
        set_u64(&mut b, 32, self.generation);
        set_u64(&mut b, 40, self.log_start_seq);
        let crc = crc32c::crc32c(&b[12..]);
        set_u32(&mut b, 8, crc);
        b
    }

    /// Decodes one copy; `None` if it is not a valid anchor of this OSD.
    pub fn decode(b: &[u8], osd_uuid: &[u8; 16]) -> Option<Self> {
        if b.len() < SECTOR_SIZE_BYTES as usize || b[0..8] != ANCHOR_MAGIC {
            return None;
        }
        if get_u32(b, 8)? != crc32c::crc32c(&b[12..SECTOR_SIZE_BYTES as usize]) {
            return None;
        }
        if &b[12..28] != osd_uuid {
            return None;
        }
        let a = Anchor {
            generation: get_u64(b, 32)?,
            log_start_seq: get_u64(b, 40)?,
        };
        (1..=crate::wal::segment::SEQ_MAX)
            .contains(&a.log_start_seq)
            .then_some(a)
    }

    /// The newer of the two copies in the anchor block.
    pub fn decode_block(block: &[u8], osd_uuid: &[u8; 16]) -> Option<Self> {
        let s = SECTOR_SIZE_BYTES as usize;
        let a = Anchor::decode(&block[0..s], osd_uuid);
        let b = Anchor::decode(&block[s..2 * s], osd_uuid);
        match (a, b) {
            (Some(a), Some(b)) => Some(if a.generation >= b.generation { a } else { b }),
            (a, b) => a.or(b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn superblock_round_trips_and_rejects_flips() {
        let sb = Superblock::layout([7; 16], 64 << 20, 1 << 20, 8, 64 << 10).unwrap();
        let enc = sb.encode();
        assert_eq!(Superblock::decode(&enc).unwrap(), sb);
        for bit in [0usize, 70, 100, 8 * 200, 8 * 4000] {
            let mut bad = enc.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(
                Superblock::decode(&bad).is_err(),
                "flip of bit {bit} not detected"
            );
        }
    }

    #[test]
    fn anchor_picks_newest_valid_copy() {
        let uuid = [3; 16];
        let mut block = vec![0u8; 4096];
        let a1 = Anchor {
            generation: 1,
            log_start_seq: 5,
        };
        let a2 = Anchor {
            generation: 2,
            log_start_seq: 9,
        };
        block[512..1024].copy_from_slice(&a1.encode(&uuid));
        block[0..512].copy_from_slice(&a2.encode(&uuid));
        assert_eq!(Anchor::decode_block(&block, &uuid), Some(a2));
        block[40] ^= 1; // tear the newer copy
        assert_eq!(Anchor::decode_block(&block, &uuid), Some(a1));
        assert_eq!(Anchor::decode_block(&block, &[4; 16]), None);
    }
}

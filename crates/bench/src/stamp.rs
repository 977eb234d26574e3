//! Stamped data: every 4 KiB block a bench write sends says which image, which byte offset and
//! which write (sequence number) it belongs to, so that a read can tell a stale block (an older
//! write), a misplaced one (another offset or image), a corrupt one and a never-written one
//! apart, which a constant pattern cannot.
//!
//! Block layout (little-endian):
//!
//! | bytes | field |
//! |---|---|
//! | 0..8 | magic `FBSTAMP1` |
//! | 8..16 | image id |
//! | 16..24 | byte offset of this block in the image |
//! | 24..32 | sequence number of the write |
//! | 32..36 | crc32c of the whole block with this field zero |
//! | 36..40 | zero |
//! | 40..4096 | bytes from a PRNG seeded by (image, offset, seq) |
//!
//! Why a PRNG fill: every block's content differs, so data landing at the wrong place or an
//! old version is caught by the crc and the fields together, and the payload does not
//! compress or deduplicate to nothing.

use bytes::{Bytes, BytesMut};
use std::fmt;

pub const BLOCK_BYTES: usize = 4096;
const MAGIC: [u8; 8] = *b"FBSTAMP1";
const CRC_AT: usize = 32;
const FILL_AT: usize = 40;

const _: () = assert!(BLOCK_BYTES as u64 == crate::config::STAMP_BLOCK_BYTES);
const _: () = assert!(FILL_AT % 8 == 0 && (BLOCK_BYTES - FILL_AT) % 8 == 0);

/// Which write a block belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    pub image: u64,
    pub offset: u64,
    pub seq: u64,
}

impl fmt::Display for Stamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "image {} offset {} seq {}",
            self.image, self.offset, self.seq
        )
    }
}

/// What is wrong with a block that was read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mismatch {
    /// All zeros: no write ever reached it.
    Unwritten,
    /// Not a stamp at all (no magic).
    NoStamp,
    /// A stamp whose crc does not match its bytes: damaged data.
    Corrupt { stored: u32, computed: u32 },
    /// A valid stamp of another image or another offset: misplaced data.
    Misplaced { found: Stamp },
    /// A valid stamp of this block, but not the last write acknowledged there.
    WrongSeq { expected: u64, found: Stamp },
}

impl Mismatch {
    /// Older than expected: an acknowledged write was lost (or a read served stale data).
    pub fn is_stale(&self) -> bool {
        matches!(self, Mismatch::WrongSeq { expected, found } if found.seq < *expected)
    }
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mismatch::Unwritten => f.write_str("found an all-zero block (never written)"),
            Mismatch::NoStamp => f.write_str("found data without a stamp"),
            Mismatch::Corrupt { stored, computed } => write!(
                f,
                "found a corrupt stamp (crc32c stored {stored:#010x}, computed {computed:#010x})"
            ),
            Mismatch::Misplaced { found } => write!(f, "found a misplaced block: {found}"),
            Mismatch::WrongSeq { expected, found } if found.seq < *expected => {
                write!(f, "found a stale block: {found} (expected seq {expected})")
            }
            Mismatch::WrongSeq { expected, found } => {
                write!(
                    f,
                    "found a newer block than recorded: {found} (expected seq {expected})"
                )
            }
        }
    }
}

/// splitmix64: a tiny, well-mixed PRNG step; also used for offsets.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn block_crc(block: &[u8]) -> u32 {
    let crc = crc32c::crc32c(&block[..CRC_AT]);
    let crc = crc32c::crc32c_append(crc, &[0u8; 4]);
    crc32c::crc32c_append(crc, &block[CRC_AT + 4..])
}

/// Writes the stamped block for `stamp` into `block` (exactly [`BLOCK_BYTES`]).
pub fn fill_block(block: &mut [u8], stamp: Stamp) {
    assert_eq!(block.len(), BLOCK_BYTES);
    block[..8].copy_from_slice(&MAGIC);
    block[8..16].copy_from_slice(&stamp.image.to_le_bytes());
    block[16..24].copy_from_slice(&stamp.offset.to_le_bytes());
    block[24..32].copy_from_slice(&stamp.seq.to_le_bytes());
    block[CRC_AT..FILL_AT].fill(0);
    let mut state = stamp.image ^ stamp.offset.rotate_left(21) ^ stamp.seq.rotate_left(42);
    for chunk in block[FILL_AT..].chunks_exact_mut(8) {
        chunk.copy_from_slice(&splitmix64(&mut state).to_le_bytes());
    }
    let crc = block_crc(block);
    block[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
}

/// The data of one IO of `len` bytes at `offset` (a multiple of [`BLOCK_BYTES`]), every block
/// stamped with `seq`.
pub fn stamped_io(image: u64, offset: u64, len: usize, seq: u64) -> Bytes {
    assert_eq!(len % BLOCK_BYTES, 0);
    let mut data = BytesMut::zeroed(len);
    for (i, block) in data.chunks_exact_mut(BLOCK_BYTES).enumerate() {
        let stamp = Stamp {
            image,
            offset: offset + (i * BLOCK_BYTES) as u64,
            seq,
        };
        fill_block(block, stamp);
    }
    data.freeze()
}

fn le_u64(bytes: &[u8]) -> u64 {
    let mut raw = [0u8; 8];
    raw.copy_from_slice(&bytes[..8]);
    u64::from_le_bytes(raw)
}

/// Reads the stamp of `block` after checking its magic and crc.
pub fn read_stamp(block: &[u8]) -> Result<Stamp, Mismatch> {
    assert_eq!(block.len(), BLOCK_BYTES);
    if block[..8] != MAGIC {
        if block.iter().all(|b| *b == 0) {
            return Err(Mismatch::Unwritten);
        }
        return Err(Mismatch::NoStamp);
    }
    let mut stored = [0u8; 4];
    stored.copy_from_slice(&block[CRC_AT..CRC_AT + 4]);
    let stored = u32::from_le_bytes(stored);
    let computed = block_crc(block);
    if stored != computed {
        return Err(Mismatch::Corrupt { stored, computed });
    }
    Ok(Stamp {
        image: le_u64(&block[8..]),
        offset: le_u64(&block[16..]),
        seq: le_u64(&block[24..]),
    })
}

/// Checks that `block`, read at `offset` of `image`, carries a valid stamp of that place and,
/// when `expected_seq` is given, of that write.
pub fn check_block(
    block: &[u8],
    image: u64,
    offset: u64,
    expected_seq: Option<u64>,
) -> Result<Stamp, Mismatch> {
    let found = read_stamp(block)?;
    if found.image != image || found.offset != offset {
        return Err(Mismatch::Misplaced { found });
    }
    match expected_seq {
        Some(expected) if found.seq != expected => Err(Mismatch::WrongSeq { expected, found }),
        _ => Ok(found),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_verifies_against_its_own_stamp() {
        let data = stamped_io(7, 8192, 2 * BLOCK_BYTES, 42);
        let (a, b) = data.split_at(BLOCK_BYTES);
        assert_eq!(
            check_block(a, 7, 8192, Some(42)),
            Ok(Stamp {
                image: 7,
                offset: 8192,
                seq: 42
            })
        );
        assert!(check_block(b, 7, 8192 + 4096, Some(42)).is_ok());
        assert!(check_block(b, 7, 8192 + 4096, None).is_ok());
        assert_ne!(a[FILL_AT..], b[FILL_AT..], "the fill differs per block");
    }

    #[test]
    fn a_stale_sequence_is_detected() {
        let old = stamped_io(7, 0, BLOCK_BYTES, 3);
        let mismatch = check_block(&old, 7, 0, Some(5)).unwrap_err();
        assert!(mismatch.is_stale());
        assert!(mismatch.to_string().contains("stale"), "{mismatch}");
        assert!(mismatch.to_string().contains("seq 3"), "{mismatch}");
        let newer = check_block(&stamped_io(7, 0, BLOCK_BYTES, 9), 7, 0, Some(5)).unwrap_err();
        assert!(!newer.is_stale());
    }

    #[test]
    fn a_misplaced_block_is_detected() {
        let other_offset = stamped_io(7, 4096, BLOCK_BYTES, 1);
        assert!(matches!(
            check_block(&other_offset, 7, 0, Some(1)),
            Err(Mismatch::Misplaced { found }) if found.offset == 4096
        ));
        let other_image = stamped_io(8, 0, BLOCK_BYTES, 1);
        assert!(matches!(
            check_block(&other_image, 7, 0, None),
            Err(Mismatch::Misplaced { found }) if found.image == 8
        ));
    }

    #[test]
    fn corruption_zeros_and_foreign_data_are_detected() {
        let mut block = stamped_io(7, 0, BLOCK_BYTES, 1).to_vec();
        block[1000] ^= 1;
        assert!(matches!(
            check_block(&block, 7, 0, None),
            Err(Mismatch::Corrupt { .. })
        ));
        // A header field changed without fixing the crc is corruption too.
        let mut block = stamped_io(7, 0, BLOCK_BYTES, 1).to_vec();
        block[24] = 2;
        assert!(matches!(
            check_block(&block, 7, 0, None),
            Err(Mismatch::Corrupt { .. })
        ));
        assert_eq!(
            check_block(&[0u8; BLOCK_BYTES], 7, 0, None),
            Err(Mismatch::Unwritten)
        );
        assert_eq!(
            check_block(&[0x55u8; BLOCK_BYTES], 7, 0, None),
            Err(Mismatch::NoStamp)
        );
    }

    #[test]
    fn the_layout_is_stable() {
        // Golden: a change here makes old images unverifiable.
        let block = stamped_io(1, 0, BLOCK_BYTES, 1);
        assert_eq!(&block[..8], b"FBSTAMP1");
        assert_eq!(le_u64(&block[8..]), 1);
        assert_eq!(le_u64(&block[24..]), 1);
        assert_eq!(
            block_crc(&block),
            u32::from_le_bytes(block[32..36].try_into().unwrap())
        );
    }
}

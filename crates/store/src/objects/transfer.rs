//! The payload of one PG snapshot transfer chunk: every version of the blocks of one range
//! of one object, read at one instant on the sender (`Objects::transfer_read`) and staged on
//! the receiver (`Objects::snapshot_stage`).
//!
//! Why every version at once: the copy is fuzzy (the sender keeps applying while it sends,
//! and the receiver replays the log after the snapshot's index over it). Replaying a write
//! over a block whose copy is newer is harmless for the head, but the blocks kept for image
//! snapshots are made by the writes themselves: a block's head and its kept versions must be
//! copied at the same instant, or a write between the two copies would keep a version
//! nowhere (`docs/design/snapshots.md`, "Catch-up").
//!
//! Layout (little-endian): flags u32 (bit 0: the object exists in the head, so the receiver
//! lists it even if this range holds no head block; bit 1: the object is a clone's object
//! copied up from its parent, `clones.rs`), count u32, the range's length in
//! bytes u64 (a multiple of 4 KiB; the range starts at the chunk's offset), then `count`
//! versions:
//! block index u32 (within the object), birth u32 (bit 31: the version is damaged, see
//! below), snapshot id u64 (0: the head; else the snapshot the block is kept for), 4096 data
//! bytes.
//!
//! A damaged version: the sender's copy of that version did not read back (a checksum
//! mismatch or a read error). Its data bytes are zeros and carry no meaning; the receiver
//! stores the version as damaged (it reads as a bad block) so that it is repaired from a
//! good replica like any other bad block, rather than the whole transfer giving up on one
//! block (`docs/design/repair.md`). The sender repairs its own copy too.

use crate::error::{Error, Result};
use fastblock_types::units::BLOCK_SIZE_BYTES;

const BS: usize = BLOCK_SIZE_BYTES as usize;
const VERSION_HEADER_BYTES: usize = 16;
const FLAG_HEAD_EXISTS: u32 = 1;
const FLAG_COPIED: u32 = 2;
/// Bit of a version's birth field that marks it damaged (births use 21 bits).
const BIRTH_DAMAGED: u32 = 1 << 31;
const HEADER_BYTES: usize = 16;

/// One version of one block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockVersion {
    /// Block index within the object.
    pub block: u32,
    /// The image's snapshot sequence when the block was written.
    pub birth: u32,
    /// 0: the head's block; else the image snapshot it is kept for.
    pub snap: u64,
    /// The sender's copy did not read back: `data` is zeros, the receiver keeps the version
    /// as a bad block to be repaired.
    pub damaged: bool,
    pub data: Vec<u8>,
}

/// What one chunk carries of one object range.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChunkVersions {
    pub head_exists: bool,
    /// The object is a clone's object that holds its own data (copied up).
    pub copied: bool,
    /// Bytes of the object range the chunk covers (from the chunk's offset).
    pub len_bytes: u64,
    pub versions: Vec<BlockVersion>,
}

impl ChunkVersions {
    pub fn encode(&self) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(HEADER_BYTES + self.versions.len() * (VERSION_HEADER_BYTES + BS));
        let mut flags = 0;
        if self.head_exists {
            flags |= FLAG_HEAD_EXISTS;
        }
        if self.copied {
            flags |= FLAG_COPIED;
        }
        out.extend_from_slice(&flags.to_le_bytes());
        out.extend_from_slice(&(self.versions.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.len_bytes.to_le_bytes());
        for v in &self.versions {
            assert_eq!(v.data.len(), BS, "a block version is one block");
            out.extend_from_slice(&v.block.to_le_bytes());
            assert!(v.birth & BIRTH_DAMAGED == 0, "births use 21 bits");
            let birth = v.birth | if v.damaged { BIRTH_DAMAGED } else { 0 };
            out.extend_from_slice(&birth.to_le_bytes());
            out.extend_from_slice(&v.snap.to_le_bytes());
            out.extend_from_slice(&v.data);
        }
        out
    }

    /// Decodes a payload; a malformed one (a damaged or forged chunk) is an error, never a
    /// panic.
    pub fn decode(bytes: &[u8]) -> Result<ChunkVersions> {
        let bad = |why: &str| Error::InvalidArgument(format!("transfer chunk payload: {why}"));
        if bytes.len() < HEADER_BYTES {
            return Err(bad("shorter than its 16-byte header"));
        }
        let flags = u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes"));
        if flags & !(FLAG_HEAD_EXISTS | FLAG_COPIED) != 0 {
            return Err(bad("unknown flags"));
        }
        let count = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes")) as usize;
        let len_bytes = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
        let each = VERSION_HEADER_BYTES + BS;
        if Some(bytes.len() - HEADER_BYTES) != count.checked_mul(each) {
            return Err(bad("length does not match its version count"));
        }
        let versions = bytes[HEADER_BYTES..]
            .chunks_exact(each)
            .map(|c| {
                let birth = u32::from_le_bytes(c[4..8].try_into().expect("4 bytes"));
                BlockVersion {
                    block: u32::from_le_bytes(c[0..4].try_into().expect("4 bytes")),
                    birth: birth & !BIRTH_DAMAGED,
                    snap: u64::from_le_bytes(c[8..16].try_into().expect("8 bytes")),
                    damaged: birth & BIRTH_DAMAGED != 0,
                    data: c[16..].to_vec(),
                }
            })
            .collect();
        Ok(ChunkVersions {
            head_exists: flags & FLAG_HEAD_EXISTS != 0,
            copied: flags & FLAG_COPIED != 0,
            len_bytes,
            versions,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trips(head in any::<bool>(), copied in any::<bool>(), len in any::<u64>(), vs in prop::collection::vec((any::<u32>(), 0u32..BIRTH_DAMAGED, any::<u64>(), any::<bool>(), any::<u8>()), 0..5)) {
            let c = ChunkVersions {
                head_exists: head,
                copied,
                len_bytes: len,
                versions: vs.into_iter().map(|(block, birth, snap, damaged, fill)| BlockVersion { block, birth, snap, damaged, data: vec![fill; BS] }).collect(),
            };
            prop_assert_eq!(ChunkVersions::decode(&c.encode()).unwrap(), c);
        }

        #[test]
        fn garbage_is_an_error_not_a_panic(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            let _ = ChunkVersions::decode(&bytes);
        }
    }
}

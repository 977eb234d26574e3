//! The fixed 32-byte frame header: layout, message kinds, parsing and writing.
//!
//! ```text
//! off size field
//! 0   4   magic        0x4B42_4246 (bytes "FBBK")
//! 4   1   version      1
//! 5   1   kind         message kind
//! 6   2   flags        bit 0 SIGNED, bit 1 SEALED (at most one); other bits reserved
//! 8   8   request_id   chosen by the requester, echoed in the reply
//! 16  4   payload_len  bytes after the header
//! 20  4   payload_crc  crc32c of the payload
//! 24  4   reserved     0
//! 28  4   header_crc   crc32c of bytes 0..28
//! ```
//!
//! A frame whose flags are SIGNED or SEALED is followed by a 16-byte authentication tag
//! (`payload_len` does not count it): see `docs/wire-protocol.md`, "Authenticated
//! connections".
//!
//! All integers are little-endian. `magic` and `version` stay at offsets 0 and 4 in every
//! future version, so that any decoder can say "other version" rather than "damaged header".

use crate::WireError;

/// Size of the frame header.
pub const HEADER_BYTES: usize = 32;

/// The header is the only fixed-size part of every frame; the decoder, the documentation and
/// the offsets below all assume 32 bytes, and a 32-byte header keeps a following payload
/// 8-byte aligned relative to the frame start.
const _: () = assert!(HEADER_BYTES == 32);
const _: () = assert!(HEADER_CRC_OFFSET + 4 == HEADER_BYTES);

/// `FBBK` read as a little-endian u32.
pub const MAGIC: u32 = 0x4B42_4246;
// The magic spells "FBBK" in stream order, so a hex dump of a connection shows it.
const _: () = assert!(matches!(MAGIC.to_le_bytes(), [b'F', b'B', b'B', b'K']));

/// The only frame format version this decoder speaks.
pub const VERSION: u8 = 1;

/// Default limit on one frame's payload: the largest IO (a whole 4 MiB object) plus slack
/// for the fixed request fields and for large Raft batches.
pub const PAYLOAD_BYTES_MAX_DEFAULT: u32 = 16 << 20;
// The largest client IO (a 4 MiB object) plus its fixed fields must fit in the default limit,
// or a legal full-object write could never be sent.
const _: () = assert!(4 * (1 << 20) + 64 <= PAYLOAD_BYTES_MAX_DEFAULT as usize);

/// Header flag: the payload travels in clear and a 16-byte tag follows it (`auth: sign`).
pub const FLAG_SIGNED: u16 = 1;
/// Header flag: the payload is encrypted and a 16-byte tag follows it (`auth: secure`).
pub const FLAG_SEALED: u16 = 2;
/// Bytes of the authentication tag after the payload of a SIGNED or SEALED frame.
pub const TAG_BYTES: usize = 16;
/// Header bytes an authentication tag covers: everything before `payload_crc` (which
/// depends on the payload as sent, i.e. on the encryption).
pub const TAG_HEADER_BYTES: usize = 20;
const _: () = assert!(TAG_HEADER_BYTES == PAYLOAD_CRC_OFFSET);

pub(crate) const MAGIC_OFFSET: usize = 0;
pub(crate) const VERSION_OFFSET: usize = 4;
pub(crate) const KIND_OFFSET: usize = 5;
pub(crate) const FLAGS_OFFSET: usize = 6;
pub(crate) const REQUEST_ID_OFFSET: usize = 8;
pub(crate) const PAYLOAD_LEN_OFFSET: usize = 16;
pub(crate) const PAYLOAD_CRC_OFFSET: usize = 20;
pub(crate) const RESERVED_OFFSET: usize = 24;
pub(crate) const HEADER_CRC_OFFSET: usize = 28;

/// Message kinds: requests below 128, the single reply kind at 128. OSD↔OSD kinds start at 32
/// so that a client port can reject them by range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    Write = 1,
    Read = 2,
    Discard = 3,
    WriteZeroes = 4,
    GetLeader = 5,
    ReplicaRead = 6,
    ReplicaDigest = 7,
    Allocation = 8,
    ShardSpace = 9,
    SnapRead = 10,
    Rollback = 11,
    CloneRead = 12,
    CopyUp = 13,
    CopyUpDone = 14,
    Usage = 15,
    AuthHello = 16,
    AuthChallenge = 17,
    AuthProof = 18,
    AuthDone = 19,
    Hello = 32,
    RaftBatch = 33,
    SnapChunk = 34,
    SnapAck = 35,
    Repair = 36,
    Scrub = 37,
    Reply = 128,
}

impl Kind {
    /// Every kind, for tests and exhaustive tables.
    pub const ALL: [Kind; 26] = [
        Kind::Write,
        Kind::Read,
        Kind::Discard,
        Kind::WriteZeroes,
        Kind::GetLeader,
        Kind::ReplicaRead,
        Kind::ReplicaDigest,
        Kind::Allocation,
        Kind::ShardSpace,
        Kind::SnapRead,
        Kind::Rollback,
        Kind::CloneRead,
        Kind::CopyUp,
        Kind::CopyUpDone,
        Kind::Usage,
        Kind::AuthHello,
        Kind::AuthChallenge,
        Kind::AuthProof,
        Kind::AuthDone,
        Kind::Hello,
        Kind::RaftBatch,
        Kind::SnapChunk,
        Kind::SnapAck,
        Kind::Repair,
        Kind::Scrub,
        Kind::Reply,
    ];

    /// The kind with this wire value, if any.
    pub fn from_u8(value: u8) -> Option<Kind> {
        Kind::ALL.into_iter().find(|kind| *kind as u8 == value)
    }

    /// Whether frames of this kind belong to the authentication handshake (kinds 16..=19),
    /// whose payloads `fastblock_auth::handshake` defines.
    pub fn is_handshake(self) -> bool {
        matches!(
            self,
            Kind::AuthHello | Kind::AuthChallenge | Kind::AuthProof | Kind::AuthDone
        )
    }

    /// Whether frames of this kind are sent only between OSDs.
    pub fn is_osd_to_osd(self) -> bool {
        matches!(
            self,
            Kind::Hello
                | Kind::RaftBatch
                | Kind::SnapChunk
                | Kind::SnapAck
                | Kind::Repair
                | Kind::Scrub
        )
    }
}

/// A header that passed every check of [`parse_header`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub kind: Kind,
    pub flags: u16,
    pub request_id: u64,
    pub payload_len: u32,
    pub payload_crc: u32,
}

/// Checks the magic as soon as 4 bytes are buffered and the version as soon as 5 are, so
/// that a peer speaking another protocol is rejected without waiting for a whole header.
pub(crate) fn check_prefix(prefix: &[u8]) -> Result<(), WireError> {
    if let Some(&[b0, b1, b2, b3]) = prefix.get(MAGIC_OFFSET..MAGIC_OFFSET + 4) {
        let magic = u32::from_le_bytes([b0, b1, b2, b3]);
        if magic != MAGIC {
            return Err(WireError::BadMagic(magic));
        }
    }
    if let Some(&version) = prefix.get(VERSION_OFFSET) {
        if version != VERSION {
            return Err(WireError::BadVersion(version));
        }
    }
    Ok(())
}

/// Validates a whole header. Order: magic and version first (they never move, so they name
/// a foreign peer precisely), then the crc (so that every later field is trusted), then flags,
/// reserved word, kind and the payload limit.
pub(crate) fn parse_header(
    bytes: &[u8; HEADER_BYTES],
    payload_bytes_max: u32,
) -> Result<Header, WireError> {
    check_prefix(bytes)?;
    let stored = read_u32(bytes, HEADER_CRC_OFFSET);
    let computed = crc32c::crc32c(&bytes[..HEADER_CRC_OFFSET]);
    if stored != computed {
        return Err(WireError::BadHeaderCrc { stored, computed });
    }
    let flags = u16::from_le_bytes([bytes[FLAGS_OFFSET], bytes[FLAGS_OFFSET + 1]]);
    // SIGNED and SEALED exclude each other: a connection protects its frames one way.
    if !matches!(flags, 0 | FLAG_SIGNED | FLAG_SEALED) {
        return Err(WireError::UnknownFlags(flags));
    }
    let reserved = read_u32(bytes, RESERVED_OFFSET);
    if reserved != 0 {
        return Err(WireError::BadReserved(reserved));
    }
    let kind_byte = bytes[KIND_OFFSET];
    let kind = Kind::from_u8(kind_byte).ok_or(WireError::UnknownKind(kind_byte))?;
    let payload_len = read_u32(bytes, PAYLOAD_LEN_OFFSET);
    if payload_len > payload_bytes_max {
        return Err(WireError::PayloadTooLarge {
            len: payload_len,
            max: payload_bytes_max,
        });
    }
    Ok(Header {
        kind,
        flags,
        request_id: read_u64(bytes, REQUEST_ID_OFFSET),
        payload_len,
        payload_crc: read_u32(bytes, PAYLOAD_CRC_OFFSET),
    })
}

/// Rewrites the header crc of the header at the front of `header` after a field changed.
pub(crate) fn reseal_header(header: &mut [u8]) {
    let crc = crc32c::crc32c(&header[..HEADER_CRC_OFFSET]);
    header[HEADER_CRC_OFFSET..HEADER_BYTES].copy_from_slice(&crc.to_le_bytes());
}

// The readers below take constant field offsets inside the fixed-size header, so their
// indexing cannot go out of bounds whatever the input bytes are.

fn read_u32(bytes: &[u8; HEADER_BYTES], offset: usize) -> u32 {
    let b = bytes;
    u32::from_le_bytes([b[offset], b[offset + 1], b[offset + 2], b[offset + 3]])
}

fn read_u64(bytes: &[u8; HEADER_BYTES], offset: usize) -> u64 {
    u64::from(read_u32(bytes, offset)) | (u64::from(read_u32(bytes, offset + 4)) << 32)
}

/// Builds a header for a payload of `payload_len` bytes with crc `payload_crc`.
pub(crate) fn build_header(
    kind: Kind,
    flags: u16,
    request_id: u64,
    payload_len: u32,
    payload_crc: u32,
) -> [u8; HEADER_BYTES] {
    let mut header = [0u8; HEADER_BYTES];
    header[MAGIC_OFFSET..MAGIC_OFFSET + 4].copy_from_slice(&MAGIC.to_le_bytes());
    header[VERSION_OFFSET] = VERSION;
    header[KIND_OFFSET] = kind as u8;
    header[FLAGS_OFFSET..FLAGS_OFFSET + 2].copy_from_slice(&flags.to_le_bytes());
    header[REQUEST_ID_OFFSET..REQUEST_ID_OFFSET + 8].copy_from_slice(&request_id.to_le_bytes());
    header[PAYLOAD_LEN_OFFSET..PAYLOAD_LEN_OFFSET + 4].copy_from_slice(&payload_len.to_le_bytes());
    header[PAYLOAD_CRC_OFFSET..PAYLOAD_CRC_OFFSET + 4].copy_from_slice(&payload_crc.to_le_bytes());
    header[RESERVED_OFFSET..RESERVED_OFFSET + 4].copy_from_slice(&0u32.to_le_bytes());
    let header_crc = crc32c::crc32c(&header[..HEADER_CRC_OFFSET]);
    header[HEADER_CRC_OFFSET..].copy_from_slice(&header_crc.to_le_bytes());
    header
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_through_their_byte() {
        for kind in Kind::ALL {
            assert_eq!(Kind::from_u8(kind as u8), Some(kind));
        }
        let known = Kind::ALL.map(|kind| kind as u8);
        for byte in 0..=u8::MAX {
            assert_eq!(Kind::from_u8(byte).is_some(), known.contains(&byte));
        }
    }

    #[test]
    fn built_header_parses_back() {
        let header = build_header(Kind::RaftBatch, 0, 0xDEAD_BEEF_0000_0001, 77, 0x1234_5678);
        assert_eq!(&header[..4], b"FBBK");
        let parsed = parse_header(&header, 100).expect("valid header");
        assert_eq!(
            parsed,
            Header {
                kind: Kind::RaftBatch,
                flags: 0,
                request_id: 0xDEAD_BEEF_0000_0001,
                payload_len: 77,
                payload_crc: 0x1234_5678,
            }
        );
        assert_eq!(
            parse_header(&header, 76),
            Err(WireError::PayloadTooLarge { len: 77, max: 76 })
        );
    }
}

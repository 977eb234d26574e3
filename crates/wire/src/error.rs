//! The one error type of the crate.
//!
//! Two families share it, and the receiver treats them differently (see
//! `docs/wire-protocol.md`, "Errors and what a receiver does"):
//! - framing errors, returned by [`crate::FrameDecoder::decode`]: the byte stream can no longer
//!   be trusted to be aligned on frame boundaries, so the caller logs and closes the connection;
//! - payload errors, returned by [`crate::Request::decode`] and [`crate::Reply::decode`]: the
//!   frame was intact but its content is not a valid message, so an OSD answers
//!   `InvalidArgument` (echoing the request id) and keeps serving the connection.

/// A frame or a message payload that is not valid. Every variant carries what a log line
/// needs to tell a bit flip from a peer speaking another protocol or version.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum WireError {
    /// The first four bytes are not `FBBK`: the peer does not speak this protocol (or the
    /// stream lost its frame alignment).
    #[error("bad frame magic {0:#010x}, expected {expected:#010x}", expected = crate::MAGIC)]
    BadMagic(u32),
    /// The peer speaks another version of the frame format.
    #[error("unsupported frame version {0}, this decoder speaks version {supported}", supported = crate::VERSION)]
    BadVersion(u8),
    /// The header's crc32c does not match bytes 0..28: the header was damaged in transit.
    #[error(
        "frame header crc32c mismatch: header says {stored:#010x}, bytes give {computed:#010x}"
    )]
    BadHeaderCrc { stored: u32, computed: u32 },
    /// The payload's crc32c does not match the header's `payload_crc`.
    #[error(
        "frame payload crc32c mismatch (kind {kind}, request id {request_id}, {len} bytes): \
         header says {stored:#010x}, payload gives {computed:#010x}"
    )]
    BadPayloadCrc {
        kind: u8,
        request_id: u64,
        len: u32,
        stored: u32,
        computed: u32,
    },
    /// The header announces a payload larger than this decoder accepts; rejected from the
    /// header alone, before any of the payload is buffered.
    #[error("frame payload of {len} bytes exceeds the limit of {max} bytes")]
    PayloadTooLarge { len: u32, max: u32 },
    /// The header's kind byte names no message kind of this version.
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    /// The header's flags carry bits this version does not define (all bits are reserved).
    #[error("unknown frame flags {0:#06x}")]
    UnknownFlags(u16),
    /// The header's reserved word (bytes 24..28) is not zero. Added beside the variants the
    /// API brief lists: without it a non-zero reserved word would have no precise error.
    #[error("frame header reserved word is {0:#010x}, expected 0")]
    BadReserved(u32),
    /// A payload ended inside the field `what`: the field is `need` bytes long, only `have`
    /// bytes were left.
    #[error("truncated {what}: need {need} bytes, have {have}")]
    Truncated {
        what: &'static str,
        need: usize,
        have: usize,
    },
    /// A well-framed payload whose content is not a valid message: a bad enum value, invalid
    /// UTF-8, a length that disagrees with the payload, a count over its limit, trailing bytes.
    #[error("invalid message: {0}")]
    Invalid(String),
}

impl WireError {
    /// Whether this is a framing error (the connection must be closed) rather than a payload
    /// error (answer `InvalidArgument` and keep serving).
    pub fn is_framing(&self) -> bool {
        match self {
            WireError::BadMagic(_)
            | WireError::BadVersion(_)
            | WireError::BadHeaderCrc { .. }
            | WireError::BadPayloadCrc { .. }
            | WireError::PayloadTooLarge { .. }
            | WireError::UnknownKind(_)
            | WireError::UnknownFlags(_)
            | WireError::BadReserved(_) => true,
            WireError::Truncated { .. } | WireError::Invalid(_) => false,
        }
    }
}

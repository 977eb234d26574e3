//! Incremental frame decoding from a connection's read buffer.

use crate::header::{
    check_prefix, parse_header, Kind, FLAG_SEALED, FLAG_SIGNED, HEADER_BYTES, MAGIC, TAG_BYTES,
    TAG_HEADER_BYTES, VERSION,
};
use crate::WireError;
use bytes::{Buf, Bytes, BytesMut};

/// How a frame is protected (its header flags), with the tag that followed its payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protection {
    /// Flags 0: no tag (connections in `auth: none`, and the handshake frames).
    None,
    /// `SIGNED`: the payload is clear, the tag authenticates header and payload.
    Signed([u8; TAG_BYTES]),
    /// `SEALED`: the payload is encrypted, the tag is the cipher's.
    Sealed([u8; TAG_BYTES]),
}

impl Protection {
    /// The header flags of this protection.
    pub fn flags(&self) -> u16 {
        match self {
            Protection::None => 0,
            Protection::Signed(_) => FLAG_SIGNED,
            Protection::Sealed(_) => FLAG_SEALED,
        }
    }

    pub fn tag(&self) -> Option<&[u8; TAG_BYTES]> {
        match self {
            Protection::None => None,
            Protection::Signed(tag) | Protection::Sealed(tag) => Some(tag),
        }
    }
}

/// One frame: its kind, the requester's id, the payload (verified against its crc32c) and
/// its protection. A protected frame's tag has NOT been checked here: that needs the
/// connection's key (`fastblock_auth::frame::FrameOpener`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub kind: Kind,
    pub request_id: u64,
    pub payload: Bytes,
    pub protection: Protection,
}

/// A frame whose payload is still mutable, so that a `SEALED` payload is decrypted where it
/// lies ([`FrameDecoder::decode_mut`]); [`FrameMut::freeze`] makes it a [`Frame`].
#[derive(Debug)]
pub struct FrameMut {
    pub kind: Kind,
    pub request_id: u64,
    pub payload: BytesMut,
    pub protection: Protection,
}

impl FrameMut {
    /// The header bytes the frame's tag covers (0..20), exactly as they were received: the
    /// decoder accepts only canonical headers, so they are rebuilt from the parsed fields.
    pub fn tag_header(&self) -> [u8; TAG_HEADER_BYTES] {
        tag_header(
            self.kind,
            self.protection.flags(),
            self.request_id,
            self.payload.len(),
        )
    }

    pub fn freeze(self) -> Frame {
        Frame {
            kind: self.kind,
            request_id: self.request_id,
            payload: self.payload.freeze(),
            protection: self.protection,
        }
    }
}

/// Header bytes 0..20 of a frame: magic, version, kind, flags, request id, payload length.
pub fn tag_header(
    kind: Kind,
    flags: u16,
    request_id: u64,
    payload_len: usize,
) -> [u8; TAG_HEADER_BYTES] {
    let mut h = [0u8; TAG_HEADER_BYTES];
    h[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    h[4] = VERSION;
    h[5] = kind as u8;
    h[6..8].copy_from_slice(&flags.to_le_bytes());
    h[8..16].copy_from_slice(&request_id.to_le_bytes());
    // The decoder has checked the length against a u32 limit.
    h[16..20].copy_from_slice(&(payload_len as u32).to_le_bytes());
    h
}

/// Cuts frames out of a read buffer as bytes arrive.
///
/// Contract: `decode` returns `Ok(None)` until a whole frame is buffered and then consumes
/// exactly that frame's bytes; on `Err` it consumes nothing and the connection must be closed
/// (the stream's frame alignment can no longer be trusted). The decoder holds no state
/// between calls except its limit, so partial reads of any size give the same frames.
///
/// Memory: the only allocation is one `reserve` of the missing bytes of a frame whose header
/// has passed every check, so a peer can never make one frame cost more than
/// `HEADER_BYTES + payload_bytes_max`. The payload is `split_to().freeze()` of the read
/// buffer: no copy.
#[derive(Clone, Debug)]
pub struct FrameDecoder {
    payload_bytes_max: u32,
}

impl FrameDecoder {
    /// A decoder that rejects frames with a payload over `payload_bytes_max` bytes
    /// (see [`crate::PAYLOAD_BYTES_MAX_DEFAULT`]).
    pub fn new(payload_bytes_max: u32) -> Self {
        FrameDecoder { payload_bytes_max }
    }

    /// The payload limit this decoder enforces.
    pub fn payload_bytes_max(&self) -> u32 {
        self.payload_bytes_max
    }

    /// Takes the next whole frame from the front of `buf`, if one is buffered.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, WireError> {
        Ok(self.decode_mut(buf)?.map(FrameMut::freeze))
    }

    /// As [`FrameDecoder::decode`], with the payload still mutable (no copy either way).
    pub fn decode_mut(&mut self, buf: &mut BytesMut) -> Result<Option<FrameMut>, WireError> {
        let Some(header_bytes) = buf.first_chunk::<HEADER_BYTES>() else {
            // Reject a foreign protocol from its first bytes rather than waiting for 32.
            check_prefix(buf)?;
            return Ok(None);
        };
        let header = parse_header(header_bytes, self.payload_bytes_max)?;
        let payload_len = header.payload_len as usize;
        let tag_len = if header.flags == 0 { 0 } else { TAG_BYTES };
        let frame_len = HEADER_BYTES + payload_len + tag_len;
        if buf.len() < frame_len {
            // The header is valid and within the limit: make room for the rest of the frame
            // now, so the read loop fills it without repeated reallocations.
            buf.reserve(frame_len - buf.len());
            return Ok(None);
        }
        // A protected frame's payload is covered by its tag, which the connection checks
        // (`fastblock_auth::frame`): its CRC is not checked (nor, sealed, computed by the
        // sender over what it sends).
        let payload = &buf[HEADER_BYTES..HEADER_BYTES + payload_len];
        let computed = if tag_len == 0 {
            crc32c::crc32c(payload)
        } else {
            header.payload_crc
        };
        if computed != header.payload_crc {
            return Err(WireError::BadPayloadCrc {
                kind: header.kind as u8,
                request_id: header.request_id,
                len: header.payload_len,
                stored: header.payload_crc,
                computed,
            });
        }
        buf.advance(HEADER_BYTES);
        let payload = buf.split_to(payload_len);
        assert_eq!(payload.len(), payload_len);
        let protection = if tag_len == 0 {
            Protection::None
        } else {
            let mut tag = [0u8; TAG_BYTES];
            tag.copy_from_slice(&buf[..TAG_BYTES]);
            buf.advance(TAG_BYTES);
            if header.flags == FLAG_SIGNED {
                Protection::Signed(tag)
            } else {
                Protection::Sealed(tag)
            }
        };
        Ok(Some(FrameMut {
            kind: header.kind,
            request_id: header.request_id,
            payload,
            protection,
        }))
    }
}

impl Default for FrameDecoder {
    fn default() -> Self {
        FrameDecoder::new(crate::PAYLOAD_BYTES_MAX_DEFAULT)
    }
}

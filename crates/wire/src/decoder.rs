//! Incremental frame decoding from a connection's read buffer.

use crate::header::{check_prefix, parse_header, Kind, HEADER_BYTES};
use crate::WireError;
use bytes::{Buf, Bytes, BytesMut};

/// One frame: its kind, the requester's id, and the payload (verified against its crc32c).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub kind: Kind,
    pub request_id: u64,
    pub payload: Bytes,
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
        let Some(header_bytes) = buf.first_chunk::<HEADER_BYTES>() else {
            // Reject a foreign protocol from its first bytes rather than waiting for 32.
            check_prefix(buf)?;
            return Ok(None);
        };
        let header = parse_header(header_bytes, self.payload_bytes_max)?;
        let payload_len = header.payload_len as usize;
        let frame_len = HEADER_BYTES + payload_len;
        if buf.len() < frame_len {
            // The header is valid and within the limit: make room for the rest of the frame
            // now, so the read loop fills it without repeated reallocations.
            buf.reserve(frame_len - buf.len());
            return Ok(None);
        }
        let payload = &buf[HEADER_BYTES..frame_len];
        let computed = crc32c::crc32c(payload);
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
        let payload = buf.split_to(payload_len).freeze();
        assert_eq!(payload.len(), payload_len);
        Ok(Some(Frame {
            kind: header.kind,
            request_id: header.request_id,
            payload,
        }))
    }
}

impl Default for FrameDecoder {
    fn default() -> Self {
        FrameDecoder::new(crate::PAYLOAD_BYTES_MAX_DEFAULT)
    }
}

//! Integration tests of the wire format, in one test binary (one link, fast CI):
//! - `roundtrip`: every Request and Reply variant round-trips with arbitrary field values,
//!   also as a stream fed to `FrameDecoder` in random pieces; zero-copy decoding.
//! - `auth`: handshake kinds, SIGNED/SEALED flags and tags, golden bytes of a signed frame.
//! - `corruption`: every kind of damage gives its typed error; encoder assertions.
//! - `golden`: exact bytes of a few frames, checked against an independent crc32c, so that a
//!   layout change cannot slip in unnoticed (`docs/wire-protocol.md` is the spec).
//! - `no_panic`: arbitrary and mutated input never panics, and whatever is accepted has
//!   exactly one encoding.

mod auth;
mod corruption;
mod golden;
mod no_panic;
mod roundtrip;
mod strategies;

use bytes::BytesMut;
use fastblock_wire::{Frame, FrameDecoder, WireError};

/// Decodes exactly one frame from `bytes`, asserting nothing is left over.
pub fn one_frame(bytes: &[u8]) -> Result<Frame, WireError> {
    let mut buf = BytesMut::from(bytes);
    let frame = FrameDecoder::default().decode(&mut buf)?;
    let frame = frame.expect("a whole frame was buffered");
    assert!(buf.is_empty(), "{} bytes left after one frame", buf.len());
    Ok(frame)
}

/// Recomputes the header crc after a test edited header fields.
pub fn reseal_header(frame: &mut [u8]) {
    let crc = crc32c::crc32c(&frame[..28]);
    frame[28..32].copy_from_slice(&crc.to_le_bytes());
}

//! The data-plane decoders on arbitrary bytes must never panic, never allocate beyond the
//! frame limit, and accept only canonical encodings.
//!
//! Run: `cargo +nightly fuzz run wire_decode` (from `fuzz/`). Each input is used three ways:
//! as a raw byte stream fed to `FrameDecoder` in pieces (the first byte picks the piece size),
//! and, after the first byte picks a frame kind, as the payload handed straight to
//! `Request::decode` and `Reply::decode` (behind a valid header, which random bytes would
//! almost never produce). Anything a message decoder accepts must re-encode to the same
//! payload. The same properties run on stable in `crates/wire/tests/wire/no_panic.rs`.
#![no_main]

use fastblock_wire::bytes::{Bytes, BytesMut};
use fastblock_wire::{Frame, FrameDecoder, Kind, Protection, Reply, Request};
use libfuzzer_sys::fuzz_target;

/// Small, so that the fuzzer reaches "payload too large" and whole frames quickly.
const PAYLOAD_BYTES_MAX: u32 = 4096;

fn decode_messages(frame: &Frame) {
    if let Ok(request) = Request::decode(frame) {
        let mut out = BytesMut::new();
        request.encode(frame.request_id, &mut out);
        assert_eq!(&out[32..], &frame.payload[..], "request has two encodings");
    }
    if let Ok(reply) = Reply::decode(frame) {
        let mut out = BytesMut::new();
        reply.encode(frame.request_id, &mut out);
        assert_eq!(&out[32..], &frame.payload[..], "reply has two encodings");
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };

    // 1. The stream path: frames cut out of a read buffer filled in pieces.
    let piece_bytes = usize::from(selector % 64) + 1;
    let mut decoder = FrameDecoder::new(PAYLOAD_BYTES_MAX);
    let mut buf = BytesMut::new();
    'feed: for piece in rest.chunks(piece_bytes) {
        buf.extend_from_slice(piece);
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(frame)) => decode_messages(&frame),
                Ok(None) => break,
                Err(_) => break 'feed,
            }
        }
    }
    assert!(buf.capacity() <= 32 + PAYLOAD_BYTES_MAX as usize + rest.len());

    // 2. The message path: the rest as the payload of a well-framed message of some kind.
    let kind = Kind::ALL[usize::from(selector) % Kind::ALL.len()];
    let frame = Frame {
        kind,
        request_id: 1,
        payload: Bytes::copy_from_slice(rest),
        protection: Protection::None,
    };
    decode_messages(&frame);
});

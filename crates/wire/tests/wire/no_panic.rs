//! Decoders on hostile input: never a panic, and anything accepted has exactly one encoding
//! (re-encoding the decoded message gives back the same payload). `fuzz/fuzz_targets/
//! wire_decode.rs` runs the same properties under libFuzzer.

use crate::strategies::{message, Message};
use bytes::{Bytes, BytesMut};
use fastblock_wire::{Frame, FrameDecoder, Kind, Protection, Reply, Request};
use proptest::collection::vec;
use proptest::prelude::*;

/// Decodes `frame` as a request and as a reply; whatever decodes must re-encode to the same
/// payload, or two encodings would mean the same thing (and one of them a hidden bug).
fn decode_both(frame: &Frame) {
    if let Ok(request) = Request::decode(frame) {
        let mut out = BytesMut::new();
        request.encode(frame.request_id, &mut out);
        assert_eq!(
            &out[32..],
            &frame.payload[..],
            "request re-encodes differently"
        );
    }
    if let Ok(reply) = Reply::decode(frame) {
        let mut out = BytesMut::new();
        reply.encode(frame.request_id, &mut out);
        assert_eq!(
            &out[32..],
            &frame.payload[..],
            "reply re-encodes differently"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    /// Raw bytes through the frame decoder, in pieces, with a small payload limit.
    #[test]
    fn arbitrary_bytes_never_panic_the_frame_decoder(
        bytes in vec(any::<u8>(), 0..600),
        chunk in 1usize..64,
    ) {
        let mut decoder = FrameDecoder::new(256);
        let mut buf = BytesMut::new();
        'feed: for piece in bytes.chunks(chunk) {
            buf.extend_from_slice(piece);
            loop {
                match decoder.decode(&mut buf) {
                    Ok(Some(frame)) => decode_both(&frame),
                    Ok(None) => break,
                    Err(_) => break 'feed,
                }
            }
        }
    }

    /// Arbitrary payloads behind a valid header of every kind: the message decoders see
    /// everything the frame layer lets through.
    #[test]
    fn arbitrary_payloads_never_panic_the_message_decoders(
        kind in prop::sample::select(&Kind::ALL[..]),
        payload in vec(any::<u8>(), 0..400),
    ) {
        decode_both(&Frame { kind, request_id: 3, payload: Bytes::from(payload), protection: Protection::None });
    }

    /// Valid messages with a few bytes overwritten and the crc fixed up: reaches the deep
    /// paths (counts, lengths, UTF-8, enum values) that random bytes rarely get to.
    #[test]
    fn mutated_messages_never_panic_the_message_decoders(
        message in message(),
        edits in vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let mut out = BytesMut::new();
        match &message {
            Message::Request(request) => request.encode(1, &mut out),
            Message::Reply(reply) => reply.encode(1, &mut out),
        }
        let mut payload = out[32..].to_vec();
        prop_assume!(!payload.is_empty());
        for (index, value) in edits {
            let at = index.index(payload.len());
            payload[at] = value;
        }
        let kind = Kind::from_u8(out[5]).expect("encoder wrote a known kind");
        decode_both(&Frame { kind, request_id: 1, payload: Bytes::from(payload), protection: Protection::None });
    }
}

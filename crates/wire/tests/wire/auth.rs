//! Frames of authenticated connections: the handshake kinds, the SIGNED/SEALED flags and the
//! tag after the payload (`docs/wire-protocol.md`, "Authenticated connections"). The
//! cryptography is `fastblock_auth::frame`'s; here the tag is whatever the closure returns,
//! so these tests pin the layout only.

use crate::{one_frame, reseal_header};
use bytes::BytesMut;
use fastblock_types::{Epoch, PgId, PoolId};
use fastblock_wire::{
    encode_frame, protect_frame, tag_header, FrameDecoder, Kind, Protection, Request, Status,
    WireError, TAG_BYTES,
};
use proptest::collection::vec;
use proptest::prelude::*;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

const TAG: [u8; TAG_BYTES] = [
    0xa0, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7, 0xa8, 0xa9, 0xaa, 0xab, 0xac, 0xad, 0xae, 0xaf,
];

fn signed_get_leader() -> (BytesMut, Vec<u8>) {
    let mut out = BytesMut::new();
    Request::GetLeader {
        pg: PgId::new(PoolId(1), 2),
        epoch: Epoch(9),
    }
    .encode(7, &mut out);
    let mut covered = Vec::new();
    protect_frame(&mut out, 0, false, |header, _payload| {
        covered = header.to_vec();
        TAG
    });
    (out, covered)
}

/// Expected bytes from an independent implementation (Python `struct.pack` and a bit-by-bit
/// crc32c following the documented offsets).
#[test]
fn signed_frame_bytes() {
    let (out, covered) = signed_get_leader();
    let expected = concat!(
        // magic, version 1, kind 5 (GetLeader), flags 1 (SIGNED), request id 7
        "4642424b",
        "01",
        "05",
        "0100",
        "0700000000000000",
        // payload_len 16 (the tag not counted), payload_crc, reserved, header_crc (covers flags)
        "10000000",
        "894698d9",
        "00000000",
        "b7df7796",
        // payload: pool 1, seq 2, epoch 9
        "01000000",
        "02000000",
        "0900000000000000",
        // tag
        "a0a1a2a3a4a5a6a7a8a9aaabacadaeaf",
    );
    assert_eq!(hex(&out), expected);
    // The tag covers header bytes 0..20, flags included.
    assert_eq!(hex(&covered), "4642424b01050100070000000000000010000000");
    let frame = one_frame(&out).expect("valid signed frame");
    assert_eq!(frame.protection, Protection::Signed(TAG));
    assert_eq!(frame.payload.len(), 16);
    assert_eq!(
        tag_header(frame.kind, 1, frame.request_id, frame.payload.len()).to_vec(),
        covered
    );
}

#[test]
fn handshake_kind_header_bytes() {
    let mut out = BytesMut::new();
    encode_frame(Kind::AuthChallenge, 1, &[&[0x11; 32]], &mut out);
    assert_eq!(
        hex(&out[..32]),
        "4642424b011100000100000000000000200000008e559b64000000008b0729c9"
    );
    for (kind, byte) in [
        (Kind::AuthHello, 16),
        (Kind::AuthChallenge, 17),
        (Kind::AuthProof, 18),
        (Kind::AuthDone, 19),
    ] {
        assert_eq!(kind as u8, byte);
        assert!(kind.is_handshake() && !kind.is_osd_to_osd());
        // Not requests: a handshake frame after the handshake is a payload error.
        let frame = one_frame(&{
            let mut b = BytesMut::new();
            encode_frame(kind, 3, &[b"x"], &mut b);
            b
        })
        .unwrap();
        assert!(matches!(
            Request::decode(&frame),
            Err(WireError::Invalid(_))
        ));
    }
    assert!(!Kind::Write.is_handshake() && !Kind::Hello.is_handshake());
}

#[test]
fn a_protected_frames_payload_is_judged_by_its_tag_not_its_crc() {
    let mut out = BytesMut::new();
    encode_frame(Kind::Write, 5, &[&[7u8; 100]], &mut out);
    protect_frame(&mut out, 0, true, |_, payload| {
        for b in payload.iter_mut() {
            *b ^= 0x5a;
        }
        TAG
    });
    assert_eq!(out.len(), 32 + 100 + 16);
    // The crc field is the plaintext's, not what is sent: not checked, the tag is.
    let frame = one_frame(&out).expect("a sealed frame decodes for its opener");
    assert_eq!(frame.protection, Protection::Sealed(TAG));
    assert!(frame.payload.iter().all(|b| *b == 7 ^ 0x5a));
    // decode_mut gives a payload to decrypt in place.
    let mut buf = BytesMut::from(&out[..]);
    let mut m = FrameDecoder::default()
        .decode_mut(&mut buf)
        .unwrap()
        .unwrap();
    m.payload.iter_mut().for_each(|b| *b ^= 0x5a);
    assert!(m.freeze().payload.iter().all(|b| *b == 7));
    // A damaged payload: a protected frame goes to its opener (whose tag check fails), an
    // unprotected one is a framing error.
    let mut damaged = out.to_vec();
    damaged[40] ^= 1;
    assert!(one_frame(&damaged).is_ok());
    let mut plain = BytesMut::new();
    encode_frame(Kind::Write, 5, &[&[7u8; 100]], &mut plain);
    plain[40] ^= 1;
    assert!(matches!(
        one_frame(&plain),
        Err(WireError::BadPayloadCrc { .. })
    ));
}

#[test]
fn both_flags_and_reserved_flag_bits_are_rejected_and_a_tag_bit_flip_is_not_a_framing_error() {
    let (out, _) = signed_get_leader();
    for flags in [3u16, 4, 0x8001, 0x0102] {
        let mut bytes = out.to_vec();
        bytes[6..8].copy_from_slice(&flags.to_le_bytes());
        reseal_header(&mut bytes);
        assert_eq!(one_frame(&bytes), Err(WireError::UnknownFlags(flags)));
    }
    // Flipping the flag without resealing: the header crc covers the flags.
    let mut bytes = out.to_vec();
    bytes[6] = 2;
    assert!(matches!(
        one_frame(&bytes),
        Err(WireError::BadHeaderCrc { .. })
    ));
    // The tag is the opener's business: the decoder hands a damaged one on.
    let mut bytes = out.to_vec();
    *bytes.last_mut().unwrap() ^= 1;
    let frame = one_frame(&bytes).unwrap();
    assert_ne!(frame.protection, Protection::Signed(TAG));
}

#[test]
fn a_flagged_frame_waits_for_its_tag() {
    let (out, _) = signed_get_leader();
    let mut decoder = FrameDecoder::default();
    let mut buf = BytesMut::from(&out[..out.len() - 1]);
    assert_eq!(decoder.decode(&mut buf), Ok(None));
    buf.extend_from_slice(&out[out.len() - 1..]);
    assert!(decoder.decode(&mut buf).unwrap().is_some());
    assert!(buf.is_empty());
}

#[test]
fn new_statuses_are_final() {
    for s in [
        Status::AuthRequired,
        Status::AuthFailed,
        Status::PermissionDenied,
    ] {
        assert!(!s.is_retryable(), "{s:?}");
    }
    assert_eq!(Status::AuthRequired as u16, 15);
    assert_eq!(Status::AuthFailed as u16, 16);
    assert_eq!(Status::PermissionDenied as u16, 17);
}

proptest! {
    /// Protected frames of any payload, mixed with plain ones, fed in random pieces: each
    /// comes back whole with its tag, and nothing is left over.
    #[test]
    fn protected_frames_survive_any_split(
        payloads in vec((vec(any::<u8>(), 0..300), 0u8..3), 1..6),
        chunk in 1usize..80,
    ) {
        let mut stream = BytesMut::new();
        for (i, (payload, how)) in payloads.iter().enumerate() {
            let start = stream.len();
            encode_frame(Kind::Write, i as u64, &[payload], &mut stream);
            if *how > 0 {
                protect_frame(&mut stream, start, *how == 2, |_, _| [i as u8; TAG_BYTES]);
            }
        }
        let mut decoder = FrameDecoder::new(512);
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        for piece in stream.chunks(chunk) {
            buf.extend_from_slice(piece);
            while let Some(f) = decoder.decode(&mut buf).unwrap() {
                got.push(f);
            }
        }
        prop_assert!(buf.is_empty());
        prop_assert_eq!(got.len(), payloads.len());
        for (i, (f, (payload, how))) in got.iter().zip(&payloads).enumerate() {
            prop_assert_eq!(&f.payload[..], &payload[..]);
            let want = match how {
                0 => Protection::None,
                1 => Protection::Signed([i as u8; TAG_BYTES]),
                _ => Protection::Sealed([i as u8; TAG_BYTES]),
            };
            prop_assert_eq!(f.protection, want);
        }
    }
}

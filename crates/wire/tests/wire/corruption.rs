//! Every kind of damage gives its own typed error (`docs/wire-protocol.md`, "Errors and what
//! a receiver does"), and the encoders refuse what the protocol cannot carry.

use crate::strategies::{message, Message};
use crate::{one_frame, reseal_header};
use bytes::{Bytes, BytesMut};
use fastblock_types::{Epoch, ImageId, OsdId, PgId, PoolId};
use fastblock_wire::{
    encode_frame, Frame, FrameDecoder, Kind, LeaderHint, ObjectAddr, Protection, RaftEnvelope,
    Reply, Request, Status, WireError, MESSAGE_BYTES_MAX, RAFT_BATCH_ENVELOPES_MAX,
};
use proptest::prelude::*;

fn encoded(message: &Message) -> BytesMut {
    let mut out = BytesMut::new();
    match message {
        Message::Request(request) => request.encode(77, &mut out),
        Message::Reply(reply) => reply.encode(77, &mut out),
    }
    out
}

fn read_frame() -> Vec<u8> {
    let mut out = BytesMut::new();
    Request::Read {
        addr: ObjectAddr {
            pg: PgId::new(PoolId(1), 2),
            image: ImageId(3),
            object_index: 4,
        },
        offset: 4096,
        length: 8192,
        epoch: Epoch(5),
    }
    .encode(42, &mut out);
    out.to_vec()
}

fn frame(kind: Kind, payload: Vec<u8>) -> Frame {
    Frame {
        kind,
        request_id: 1,
        payload: Bytes::from(payload),
        protection: Protection::None,
    }
}

fn is_invalid(result: Result<impl std::fmt::Debug, WireError>, needle: &str) -> bool {
    match result {
        Err(WireError::Invalid(text)) => text.contains(needle),
        other => panic!("expected Invalid({needle:?}), got {other:?}"),
    }
}

proptest! {
    /// One flipped bit anywhere in the header: magic and version are named as such (they are
    /// checked first, to tell a foreign peer from damage), everything else is a crc mismatch.
    #[test]
    fn a_flipped_header_bit_is_detected(message in message(), bit in 0usize..256) {
        let mut bytes = encoded(&message).to_vec();
        bytes[bit / 8] ^= 1 << (bit % 8);
        let result = one_frame(&bytes);
        match bit / 8 {
            0..=3 => prop_assert!(matches!(result, Err(WireError::BadMagic(_))), "{:?}", result),
            4 => prop_assert!(matches!(result, Err(WireError::BadVersion(_))), "{:?}", result),
            _ => prop_assert!(
                matches!(result, Err(WireError::BadHeaderCrc { .. })),
                "{:?}",
                result
            ),
        }
    }

    #[test]
    fn a_flipped_payload_bit_is_detected(message in message(), bit in any::<prop::sample::Index>()) {
        let mut bytes = encoded(&message).to_vec();
        let payload_bits = (bytes.len() - 32) * 8;
        prop_assume!(payload_bits > 0);
        let bit = 32 * 8 + bit.index(payload_bits);
        bytes[bit / 8] ^= 1 << (bit % 8);
        let result = one_frame(&bytes);
        let Err(WireError::BadPayloadCrc { request_id, len, stored, computed, .. }) = result else {
            panic!("expected BadPayloadCrc, got {result:?}");
        };
        prop_assert_eq!(request_id, 77);
        prop_assert_eq!(len as usize, bytes.len() - 32);
        prop_assert_ne!(stored, computed);
    }
}

#[test]
fn another_protocol_is_rejected_from_its_first_four_bytes() {
    let mut buf = BytesMut::from(&b"GET "[..]);
    let error = FrameDecoder::default().decode(&mut buf);
    assert_eq!(
        error,
        Err(WireError::BadMagic(u32::from_le_bytes(*b"GET ")))
    );
    assert_eq!(&buf[..], b"GET ", "nothing consumed on error");
    // Fewer than four bytes of a valid magic are just an incomplete frame.
    let mut buf = BytesMut::from(&b"FBB"[..]);
    assert_eq!(FrameDecoder::default().decode(&mut buf), Ok(None));
}

#[test]
fn another_version_is_rejected() {
    let mut bytes = read_frame();
    bytes[4] = 2;
    reseal_header(&mut bytes);
    assert_eq!(one_frame(&bytes), Err(WireError::BadVersion(2)));
    // Known from five bytes on, before the rest of the header arrives.
    let mut buf = BytesMut::from(&bytes[..5]);
    assert_eq!(
        FrameDecoder::default().decode(&mut buf),
        Err(WireError::BadVersion(2))
    );
}

#[test]
fn unknown_kinds_flags_and_reserved_bits_are_rejected() {
    let mut bytes = read_frame();
    bytes[5] = 99;
    reseal_header(&mut bytes);
    assert_eq!(one_frame(&bytes), Err(WireError::UnknownKind(99)));

    let mut bytes = read_frame();
    bytes[6] = 0x01;
    bytes[7] = 0x80;
    reseal_header(&mut bytes);
    assert_eq!(one_frame(&bytes), Err(WireError::UnknownFlags(0x8001)));

    let mut bytes = read_frame();
    bytes[24] = 1;
    reseal_header(&mut bytes);
    assert_eq!(one_frame(&bytes), Err(WireError::BadReserved(1)));
}

/// The limit is enforced from the header alone: the decoder neither waits for nor makes room
/// for a payload it will not accept.
#[test]
fn an_oversized_payload_is_rejected_before_it_is_buffered() {
    let max = 1 << 20;
    let mut bytes = read_frame();
    bytes[16..20].copy_from_slice(&(max + 1u32).to_le_bytes());
    reseal_header(&mut bytes);
    let mut buf = BytesMut::with_capacity(64);
    buf.extend_from_slice(&bytes[..32]);
    let capacity = buf.capacity();
    let result = FrameDecoder::new(max).decode(&mut buf);
    assert_eq!(
        result,
        Err(WireError::PayloadTooLarge { len: max + 1, max })
    );
    assert_eq!(
        buf.capacity(),
        capacity,
        "no room was reserved for the payload"
    );
    assert_eq!(buf.len(), 32, "nothing consumed");

    // At exactly the limit the frame is accepted, and room for it is reserved once.
    let mut out = BytesMut::new();
    encode_frame(Kind::Write, 1, &[&vec![7u8; max as usize]], &mut out);
    let mut buf = BytesMut::from(&out[..32]);
    let mut decoder = FrameDecoder::new(max);
    assert_eq!(decoder.decode(&mut buf), Ok(None));
    assert!(buf.capacity() >= 32 + max as usize);
    buf.extend_from_slice(&out[32..]);
    assert!(decoder.decode(&mut buf).expect("valid").is_some());
}

#[test]
fn truncated_and_overlong_payloads_are_typed() {
    let payload = one_frame(&read_frame()).expect("valid").payload.to_vec();
    assert_eq!(payload.len(), 48);
    assert_eq!(
        Request::decode(&frame(Kind::Read, payload[..47].to_vec())),
        Err(WireError::Truncated {
            what: "length",
            need: 4,
            have: 3
        })
    );
    assert_eq!(
        Request::decode(&frame(Kind::Read, Vec::new())),
        Err(WireError::Truncated {
            what: "pg pool",
            need: 4,
            have: 0
        })
    );
    let mut long = payload.clone();
    long.push(0);
    assert!(is_invalid(
        Request::decode(&frame(Kind::Read, long)),
        "1 trailing bytes"
    ));
    assert!(is_invalid(
        Reply::decode(&frame(Kind::Reply, vec![0, 0, 0, 0, 0])),
        "trailing"
    ));
}

/// Reads carry no term: the field is reserved, so a read has exactly one encoding.
#[test]
fn a_read_with_a_term_is_invalid() {
    let mut payload = one_frame(&read_frame()).expect("valid").payload.to_vec();
    for kind in [Kind::Read, Kind::Allocation, Kind::CloneRead] {
        assert!(Request::decode(&frame(kind, payload.clone())).is_ok());
    }
    payload[32..40].copy_from_slice(&5u64.to_le_bytes());
    for kind in [Kind::Read, Kind::Allocation, Kind::CloneRead] {
        assert!(is_invalid(
            Request::decode(&frame(kind, payload.clone())),
            "term (reserved in a read) is 0x5, expected 0"
        ));
    }
    // The same bytes as a Discard name term 5.
    let Ok(Request::Discard { term, .. }) = Request::decode(&frame(Kind::Discard, payload)) else {
        panic!("not a discard");
    };
    assert_eq!(term, 5);
}

/// An error reply without a hint has an all-zero hint part, the term included.
#[test]
fn an_error_without_a_hint_but_a_term_is_invalid() {
    let mut out = BytesMut::new();
    Reply::error(Status::NotLeader, None, "m").encode(1, &mut out);
    let mut payload = one_frame(&out).expect("valid").payload.to_vec();
    assert!(Reply::decode(&frame(Kind::Reply, payload.clone())).is_ok());
    payload[16..24].copy_from_slice(&2u64.to_le_bytes());
    assert!(is_invalid(
        Reply::decode(&frame(Kind::Reply, payload)),
        "non-zero hint fields"
    ));
}

#[test]
fn a_write_whose_length_disagrees_with_its_data_is_invalid() {
    let mut out = BytesMut::new();
    Request::Write {
        addr: ObjectAddr {
            pg: PgId::new(PoolId(1), 0),
            image: ImageId(1),
            object_index: 0,
        },
        offset: 0,
        epoch: Epoch(1),
        term: 3,
        data: Bytes::from_static(b"0123456789"),
    }
    .encode(1, &mut out);
    let mut payload = one_frame(&out).expect("valid").payload.to_vec();
    payload[44..48].copy_from_slice(&11u32.to_le_bytes());
    assert!(is_invalid(
        Request::decode(&frame(Kind::Write, payload.clone())),
        "data length says 11 bytes but 10 bytes follow"
    ));
    payload[44..48].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(is_invalid(
        Request::decode(&frame(Kind::Write, payload)),
        "data length"
    ));
}

#[test]
fn raft_batch_counts_and_lengths_are_checked() {
    let batch = |count: u32, table_and_msgs: &[u8]| {
        let mut payload = Vec::new();
        payload.extend_from_slice(&1u32.to_le_bytes());
        payload.extend_from_slice(&2u32.to_le_bytes());
        payload.extend_from_slice(&count.to_le_bytes());
        payload.extend_from_slice(&0u32.to_le_bytes());
        payload.extend_from_slice(table_and_msgs);
        Request::decode(&frame(Kind::RaftBatch, payload))
    };
    // A count over the limit is refused before anything is sized from it.
    assert!(is_invalid(
        batch(RAFT_BATCH_ENVELOPES_MAX + 1, &[]),
        "over the limit"
    ));
    assert!(is_invalid(batch(u32::MAX, &[]), "over the limit"));
    // A count within the limit but beyond the payload is a truncated table.
    assert_eq!(
        batch(1000, &[0; 12]),
        Err(WireError::Truncated {
            what: "envelope table",
            need: 12_000,
            have: 12
        })
    );
    // One envelope claiming 5 message bytes with only 4 present.
    let mut entry = Vec::new();
    entry.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0]);
    entry.extend_from_slice(&5u32.to_le_bytes());
    entry.extend_from_slice(b"abcd");
    assert_eq!(
        batch(1, &entry),
        Err(WireError::Truncated {
            what: "raft message",
            need: 5,
            have: 4
        })
    );
    entry.extend_from_slice(b"ef");
    assert!(is_invalid(batch(1, &entry), "trailing"));
    entry.pop();
    assert!(batch(1, &entry).is_ok());
}

#[test]
fn bad_enum_values_are_invalid() {
    // Unknown status, unknown tag, status Ok on an Error, a status on a non-error reply.
    assert!(is_invalid(
        Reply::decode(&frame(Kind::Reply, vec![0, 0, 99, 0])),
        "unknown status 99"
    ));
    assert!(is_invalid(
        Reply::decode(&frame(Kind::Reply, vec![9, 0, 0, 0])),
        "unknown tag 9"
    ));
    let error_with = |status: u16, has_leader: u8| {
        let mut payload = vec![4, 0];
        payload.extend_from_slice(&status.to_le_bytes());
        payload.extend_from_slice(&[has_leader, 0, 0, 0]);
        payload.extend_from_slice(&[0; 16]);
        Reply::decode(&frame(Kind::Reply, payload))
    };
    assert!(is_invalid(error_with(0, 0), "status Ok"));
    assert!(is_invalid(error_with(1, 2), "has_leader is 2"));
    assert_eq!(
        error_with(1, 0),
        Ok(Reply::Error {
            status: Status::NotLeader,
            leader: None,
            message: String::new()
        })
    );
    assert!(is_invalid(
        Reply::decode(&frame(Kind::Reply, vec![0, 0, 1, 0])),
        "tag 0 with status NotLeader"
    ));
    // Reserved bytes must be zero.
    assert!(is_invalid(
        Reply::decode(&frame(Kind::Reply, vec![0, 1, 0, 0])),
        "reserved"
    ));
    let mut hello = Vec::new();
    hello.extend_from_slice(&3u32.to_le_bytes());
    hello.extend_from_slice(&1u32.to_le_bytes());
    hello.extend_from_slice(&9u64.to_le_bytes());
    assert!(is_invalid(
        Request::decode(&frame(Kind::Hello, hello)),
        "reserved"
    ));
    // A frame of the wrong direction.
    assert!(is_invalid(
        Request::decode(&frame(Kind::Reply, vec![0, 0, 0, 0])),
        "Reply frame"
    ));
    assert!(is_invalid(
        Reply::decode(&frame(Kind::Read, vec![])),
        "Read frame"
    ));
}

#[test]
fn invalid_utf8_is_invalid() {
    // Leader reply with a 2-byte address that is not UTF-8.
    let mut payload = vec![2, 0, 0, 0];
    payload.extend_from_slice(&1u32.to_le_bytes());
    payload.extend_from_slice(&80u16.to_le_bytes());
    payload.extend_from_slice(&2u16.to_le_bytes());
    payload.extend_from_slice(&0u64.to_le_bytes()); // term
    payload.extend_from_slice(&[0xC3, 0x28]);
    assert!(is_invalid(
        Reply::decode(&frame(Kind::Reply, payload)),
        "leader address is not UTF-8"
    ));
    // Error reply whose message is cut in the middle of a character.
    let mut out = BytesMut::new();
    Reply::error(Status::Internal, None, "é").encode(1, &mut out);
    let mut payload = one_frame(&out).expect("valid").payload.to_vec();
    payload.pop();
    payload[6..8].copy_from_slice(&1u16.to_le_bytes());
    assert!(is_invalid(
        Reply::decode(&frame(Kind::Reply, payload)),
        "error message is not UTF-8"
    ));
}

#[test]
fn string_lengths_over_their_limit_are_invalid() {
    let mut payload = vec![4, 0, 12, 0, 0, 0];
    payload.extend_from_slice(&1025u16.to_le_bytes());
    payload.extend_from_slice(&[0; 16]);
    payload.extend_from_slice(&[b'x'; 1025]);
    assert!(is_invalid(
        Reply::decode(&frame(Kind::Reply, payload)),
        "error message is 1025 bytes, limit 1024"
    ));
}

#[test]
fn the_error_constructor_cuts_long_messages_at_a_character_boundary() {
    let long = "é".repeat(MESSAGE_BYTES_MAX); // 2 bytes each
    let Reply::Error { message, .. } = Reply::error(Status::IoError, None, long) else {
        panic!("not an error");
    };
    assert_eq!(message.len(), MESSAGE_BYTES_MAX);
    let odd = format!("x{}", "é".repeat(MESSAGE_BYTES_MAX));
    let Reply::Error { message, .. } = Reply::error(Status::IoError, None, odd) else {
        panic!("not an error");
    };
    assert_eq!(message.len(), MESSAGE_BYTES_MAX - 1);
    let mut out = BytesMut::new();
    Reply::error(Status::IoError, None, message.clone()).encode(1, &mut out);
    assert!(Reply::decode(&one_frame(&out).expect("valid")).is_ok());
}

#[test]
fn retryable_statuses_are_exactly_the_transient_ones() {
    let retryable: Vec<Status> = Status::ALL
        .into_iter()
        .filter(|s| s.is_retryable())
        .collect();
    assert_eq!(
        retryable,
        [
            Status::NotLeader,
            Status::NotReady,
            Status::NoSuchPg,
            Status::Busy,
            Status::StaleEpoch,
            Status::Timeout,
            Status::SnapInProgress,
            Status::Repairing,
            Status::StaleTicket
        ]
    );
    for status in Status::ALL {
        assert_eq!(Status::from_u16(status as u16), Some(status));
    }
    assert_eq!(Status::from_u16(14), Some(Status::NoSuchImage));
    assert_eq!(Status::from_u16(17), Some(Status::PermissionDenied));
    assert_eq!(Status::from_u16(20), Some(Status::ObjectAbsent));
    assert_eq!(Status::from_u16(21), Some(Status::Repairing));
    assert_eq!(Status::from_u16(22), Some(Status::StaleTicket));
    assert_eq!(Status::from_u16(23), None);
}

#[test]
fn framing_and_payload_errors_are_told_apart() {
    assert!(WireError::BadMagic(0).is_framing());
    assert!(WireError::PayloadTooLarge { len: 2, max: 1 }.is_framing());
    assert!(!WireError::Invalid(String::new()).is_framing());
    assert!(!WireError::Truncated {
        what: "x",
        need: 1,
        have: 0
    }
    .is_framing());
}

#[test]
#[should_panic(expected = "must not carry status Ok")]
fn encoding_an_error_with_status_ok_panics() {
    Reply::Error {
        status: Status::Ok,
        leader: None,
        message: String::new(),
    }
    .encode(1, &mut BytesMut::new());
}

#[test]
#[should_panic(expected = "over the limit 1024")]
fn encoding_an_overlong_message_panics() {
    Reply::Error {
        status: Status::Internal,
        leader: None,
        message: "x".repeat(MESSAGE_BYTES_MAX + 1),
    }
    .encode(1, &mut BytesMut::new());
}

#[test]
#[should_panic(expected = "over the limit 255")]
fn encoding_an_overlong_address_panics() {
    Reply::Leader(LeaderHint {
        osd: OsdId(1),
        address: "1".repeat(256),
        port: 1,
        term: 1,
    })
    .encode(1, &mut BytesMut::new());
}

#[test]
#[should_panic(expected = "envelopes over the limit")]
fn encoding_an_oversized_raft_batch_panics() {
    let envelope = RaftEnvelope {
        pg: PgId::new(PoolId(1), 0),
        msg: Bytes::new(),
    };
    Request::RaftBatch {
        from: OsdId(1),
        to: OsdId(2),
        msgs: vec![envelope; RAFT_BATCH_ENVELOPES_MAX as usize + 1],
    }
    .encode(1, &mut BytesMut::new());
}

#[test]
fn digest_counts_are_checked_before_allocating() {
    let digest = |count: u32, entries: &[u8]| {
        let mut payload = vec![3, 0, 0, 0];
        payload.extend_from_slice(&count.to_le_bytes());
        payload.extend_from_slice(&7u64.to_le_bytes());
        payload.extend_from_slice(entries);
        Reply::decode(&frame(Kind::Reply, payload))
    };
    assert!(is_invalid(
        digest(fastblock_wire::DIGEST_OBJECTS_MAX + 1, &[]),
        "over the limit"
    ));
    assert_eq!(
        digest(2, &[0; 28]),
        Err(WireError::Truncated {
            what: "digest entries",
            need: 56,
            have: 28
        })
    );
    assert!(is_invalid(digest(1, &[0; 29]), "trailing"));
    assert!(matches!(
        digest(1, &[0; 28]),
        Ok(Reply::Digest {
            applied_index: 7,
            ..
        })
    ));
}

/// A SnapAck's verdict is 0, 1 or 2, and only "too full" (2) carries free bytes: any other
/// combination has no meaning and is refused, so each ack has one encoding.
#[test]
fn snap_ack_verdicts_and_their_free_bytes_are_checked() {
    let payload = |verdict: u32, free_bytes: u64| {
        let mut p = Vec::new();
        p.extend_from_slice(&2u32.to_le_bytes()); // from
        p.extend_from_slice(&1u32.to_le_bytes()); // to
        p.extend_from_slice(&1u32.to_le_bytes()); // pool
        p.extend_from_slice(&3u32.to_le_bytes()); // seq
        p.extend_from_slice(&9u64.to_le_bytes()); // transfer
        p.extend_from_slice(&0u32.to_le_bytes()); // ack seq
        p.extend_from_slice(&verdict.to_le_bytes());
        p.extend_from_slice(&free_bytes.to_le_bytes());
        p
    };
    let decode = |v, f| Request::decode(&frame(Kind::SnapAck, payload(v, f)));
    match decode(2, 4096) {
        Ok(Request::SnapAck {
            verdict: fastblock_wire::SnapVerdict::TooFull { free_bytes: 4096 },
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        decode(1, 0),
        Ok(Request::SnapAck {
            verdict: fastblock_wire::SnapVerdict::Staged,
            ..
        })
    ));
    assert!(is_invalid(decode(1, 5), "free bytes"));
    assert!(is_invalid(decode(0, 5), "free bytes"));
    assert!(is_invalid(decode(3, 0), "verdict 3"));
}

//! Round trips: `decode(encode(m)) == m` through the real frame decoder, whole and in pieces,
//! and the zero-copy promise of the decoders.

use crate::one_frame;
use crate::strategies::{message, reply, request, Message};
use bytes::{Bytes, BytesMut};
use fastblock_types::{Epoch, ImageId, OsdId, PgId, PoolId};
use fastblock_wire::{
    encode_frame, FrameDecoder, Kind, ObjectAddr, RaftEnvelope, Reply, Request, HEADER_BYTES,
};
use proptest::collection::vec;
use proptest::prelude::*;

fn encode_message(message: &Message, request_id: u64, out: &mut BytesMut) {
    match message {
        Message::Request(request) => request.encode(request_id, out),
        Message::Reply(reply) => reply.encode(request_id, out),
    }
}

/// Asserts that `slice` lies inside the memory of `outer`: proof that it was not copied.
fn assert_within(slice: &[u8], outer: &[u8]) {
    let outer_range = outer.as_ptr_range();
    let slice_range = slice.as_ptr_range();
    assert!(
        outer_range.start <= slice_range.start,
        "slice starts outside"
    );
    assert!(slice_range.end <= outer_range.end, "slice ends outside");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn every_request_round_trips(request in request(), request_id in any::<u64>()) {
        let mut out = BytesMut::new();
        request.encode(request_id, &mut out);
        let frame = one_frame(&out).expect("valid frame");
        prop_assert_eq!(frame.kind, request.kind());
        prop_assert_eq!(frame.request_id, request_id);
        prop_assert_eq!(Request::decode(&frame), Ok(request));
    }

    #[test]
    fn every_reply_round_trips(reply in reply(), request_id in any::<u64>()) {
        let mut out = BytesMut::new();
        reply.encode(request_id, &mut out);
        let frame = one_frame(&out).expect("valid frame");
        prop_assert_eq!(frame.kind, Kind::Reply);
        prop_assert_eq!(frame.request_id, request_id);
        prop_assert_eq!(Reply::decode(&frame), Ok(reply));
    }

    /// Many frames in one stream, arriving in pieces of random sizes (1 byte to a few KiB),
    /// as partial TCP reads do: the same frames come out, in order, and nothing is left.
    #[test]
    fn a_stream_split_anywhere_decodes_to_the_same_frames(
        messages in vec(message(), 1..16),
        chunk_sizes in vec(1usize..3000, 1..64),
    ) {
        let mut stream = BytesMut::new();
        for (index, message) in messages.iter().enumerate() {
            encode_message(message, index as u64, &mut stream);
        }
        let stream = stream.freeze();
        let mut decoder = FrameDecoder::default();
        let mut read_buf = BytesMut::new();
        let mut decoded = Vec::new();
        let mut position = 0;
        let mut chunk = 0;
        while position < stream.len() {
            let size = chunk_sizes[chunk % chunk_sizes.len()].min(stream.len() - position);
            chunk += 1;
            read_buf.extend_from_slice(&stream[position..position + size]);
            position += size;
            while let Some(frame) = decoder.decode(&mut read_buf).expect("valid stream") {
                decoded.push(frame);
            }
        }
        prop_assert!(read_buf.is_empty());
        prop_assert_eq!(decoded.len(), messages.len());
        for (index, (frame, message)) in decoded.iter().zip(&messages).enumerate() {
            prop_assert_eq!(frame.request_id, index as u64);
            let back = match message {
                Message::Request(_) => Message::Request(Request::decode(frame).expect("request")),
                Message::Reply(_) => Message::Reply(Reply::decode(frame).expect("reply")),
            };
            prop_assert_eq!(&back, message);
        }
    }

    /// `encode_frame` with the payload in parts equals one part holding their concatenation.
    #[test]
    fn frame_parts_are_concatenated(parts in vec(vec(any::<u8>(), 0..200), 0..6)) {
        let slices: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        let mut split = BytesMut::new();
        encode_frame(Kind::Write, 9, &slices, &mut split);
        let mut whole = BytesMut::new();
        encode_frame(Kind::Write, 9, &[parts.concat().as_slice()], &mut whole);
        prop_assert_eq!(&split, &whole);
        prop_assert_eq!(one_frame(&split).expect("valid").payload, Bytes::from(parts.concat()));
    }
}

fn addr() -> ObjectAddr {
    ObjectAddr {
        pg: PgId::new(PoolId(1), 2),
        image: ImageId(3),
        object_index: 4,
    }
}

/// The payload is cut out of the read buffer without a copy, and Write's data out of the
/// payload: the whole chain points into the one allocation the socket read into.
#[test]
fn write_data_is_a_slice_of_the_read_buffer() {
    let data = Bytes::from(vec![0xA5u8; 4 << 20]); // a full 4 MiB object
    let request = Request::Write {
        addr: addr(),
        offset: 0,
        epoch: Epoch(7),
        term: 2,
        data,
    };
    let mut read_buf = BytesMut::new();
    request.encode(1, &mut read_buf);
    let allocation = read_buf.as_ptr_range();
    let frame = FrameDecoder::default()
        .decode(&mut read_buf)
        .expect("valid")
        .expect("whole frame");
    let payload_range = frame.payload.as_ptr_range();
    assert!(allocation.start <= payload_range.start && payload_range.end <= allocation.end);
    let Ok(Request::Write { data: decoded, .. }) = Request::decode(&frame) else {
        panic!("not a write");
    };
    assert_eq!(decoded.len(), 4 << 20);
    assert_within(&decoded, &frame.payload);
    // The data is the payload's tail, right after the 48 fixed bytes.
    assert_eq!(decoded.as_ptr(), frame.payload[48..].as_ptr());
    assert_eq!(
        HEADER_BYTES + 48 + (4 << 20),
        allocation.end as usize - allocation.start as usize
    );
}

#[test]
fn raft_messages_and_read_data_are_slices_of_the_payload() {
    let request = Request::RaftBatch {
        from: OsdId(1),
        to: OsdId(2),
        msgs: vec![
            RaftEnvelope {
                pg: PgId::new(PoolId(1), 0),
                msg: Bytes::from_static(b"append entries"),
            },
            RaftEnvelope {
                pg: PgId::new(PoolId(1), 1),
                msg: Bytes::from_static(b"heartbeat"),
            },
        ],
    };
    let mut out = BytesMut::new();
    request.encode(5, &mut out);
    let frame = one_frame(&out).expect("valid");
    let Ok(Request::RaftBatch { msgs, .. }) = Request::decode(&frame) else {
        panic!("not a raft batch");
    };
    for envelope in &msgs {
        assert_within(&envelope.msg, &frame.payload);
    }

    let mut out = BytesMut::new();
    Reply::Data(Bytes::from_static(b"sector data")).encode(6, &mut out);
    let frame = one_frame(&out).expect("valid");
    let Ok(Reply::Data(data)) = Reply::decode(&frame) else {
        panic!("not data");
    };
    assert_eq!(&data[..], b"sector data");
    assert_within(&data, &frame.payload);
}

/// Frames appended to a buffer that already holds data do not disturb it, and each decodes.
#[test]
fn frames_append_to_an_existing_buffer() {
    let mut out = BytesMut::new();
    Reply::Ok.encode(1, &mut out);
    let first_len = out.len();
    let first = out.clone();
    Request::ReplicaDigest {
        pg: PgId::new(PoolId(9), 9),
    }
    .encode(2, &mut out);
    assert_eq!(&out[..first_len], &first[..]);
    let mut decoder = FrameDecoder::default();
    let one = decoder.decode(&mut out).expect("valid").expect("frame");
    let two = decoder.decode(&mut out).expect("valid").expect("frame");
    assert_eq!((one.kind, one.request_id), (Kind::Reply, 1));
    assert_eq!((two.kind, two.request_id), (Kind::ReplicaDigest, 2));
    assert_eq!(decoder.decode(&mut out), Ok(None));
}

/// Every mutation names a term, and only mutations do: `with_term` sets it, `term` reads it.
#[test]
fn mutations_and_only_mutations_carry_a_term() {
    let write = Request::Write {
        addr: addr(),
        offset: 0,
        epoch: Epoch(1),
        term: 0,
        data: Bytes::from_static(b"x"),
    };
    assert_eq!(write.term(), Some(0));
    assert_eq!(write.with_term(6).term(), Some(6));
    let read = Request::Read {
        addr: addr(),
        offset: 0,
        length: 1,
        epoch: Epoch(1),
    };
    assert_eq!(read.clone().with_term(6), read);
    assert_eq!(read.term(), None);
}

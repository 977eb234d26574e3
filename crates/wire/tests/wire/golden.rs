//! Exact bytes of frames, so that any change to the layout in `docs/wire-protocol.md` is a
//! deliberate one. The expected bytes were produced by an independent implementation (a
//! bit-by-bit crc32c and `struct.pack('<...')` following the documented offsets), not by
//! this crate.

use bytes::BytesMut;
use fastblock_types::{Epoch, ImageId, OsdId, PgId, PoolId};
use fastblock_wire::{AllocatedRange, LeaderHint, ObjectAddr, Reply, Request, Status};

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn crc32c_is_the_castagnoli_polynomial() {
    // The standard check value of CRC-32C (iSCSI), so that other implementations agree.
    assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
}

#[test]
fn read_request_bytes() {
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
    let expected = concat!(
        // header: magic "FBBK", version 1, kind 2, flags 0, request id 42,
        "4642424b",
        "01",
        "02",
        "0000",
        "2a00000000000000",
        // payload_len 48, payload_crc, reserved 0, header_crc
        "30000000",
        "85418744",
        "00000000",
        "1a887db1",
        // payload: pool 1, seq 2, image 3, object 4, epoch 5, term 0 (reserved in a read),
        // offset 4096, length 8192
        "01000000",
        "02000000",
        "0300000000000000",
        "0400000000000000",
        "0500000000000000",
        "0000000000000000",
        "00100000",
        "00200000",
    );
    assert_eq!(hex(&out), expected);
}

#[test]
fn write_request_bytes_carry_the_term() {
    let mut out = BytesMut::new();
    Request::Write {
        addr: ObjectAddr {
            pg: PgId::new(PoolId(1), 2),
            image: ImageId(3),
            object_index: 4,
        },
        offset: 4096,
        epoch: Epoch(5),
        term: 9,
        data: bytes::Bytes::from_static(b"abcd"),
    }
    .encode(42, &mut out);
    let expected = concat!(
        // header: kind 1 (Write), request id 42, payload_len 52
        "4642424b",
        "01",
        "01",
        "0000",
        "2a00000000000000",
        "34000000",
        "89ce9297",
        "00000000",
        "8e0f652c",
        // payload: pool 1, seq 2, image 3, object 4, epoch 5, term 9, offset 4096, length 4,
        // then the data
        "01000000",
        "02000000",
        "0300000000000000",
        "0400000000000000",
        "0500000000000000",
        "0900000000000000",
        "00100000",
        "04000000",
        "61626364",
    );
    assert_eq!(hex(&out), expected);
}

#[test]
fn not_leader_reply_bytes() {
    let mut out = BytesMut::new();
    Reply::Error {
        status: Status::NotLeader,
        leader: Some(LeaderHint {
            osd: OsdId(2),
            address: "10.0.0.2".to_owned(),
            port: 6800,
            term: 7,
        }),
        message: "not leader".to_owned(),
    }
    .encode(42, &mut out);
    let expected = concat!(
        // header: kind 128 (Reply), request id 42, payload_len 42
        "4642424b",
        "01",
        "80",
        "0000",
        "2a00000000000000",
        "2a000000",
        "3a910298",
        "00000000",
        "35b0d125",
        // tag 4 (Error), reserved, status 1 (NotLeader), has_leader 1, reserved, message_len 10
        "04",
        "00",
        "0100",
        "01",
        "00",
        "0a00",
        // leader osd 2, port 6800, address_len 8, term 7, address, message
        "02000000",
        "901a",
        "0800",
        "0700000000000000",
        "31302e302e302e32",
        "6e6f74206c6561646572",
    );
    assert_eq!(hex(&out), expected);
}

#[test]
fn allocation_request_bytes() {
    let mut out = BytesMut::new();
    Request::Allocation {
        addr: ObjectAddr {
            pg: PgId::new(PoolId(1), 2),
            image: ImageId(3),
            object_index: 4,
        },
        offset: 0,
        length: 4 << 20,
        epoch: Epoch(5),
    }
    .encode(9, &mut out);
    let expected = concat!(
        // header: kind 8 (Allocation), request id 9, payload_len 48
        "4642424b",
        "01",
        "08",
        "0000",
        "0900000000000000",
        "30000000",
        "33868fc6",
        "00000000",
        "8e820ab5",
        // payload: the object op layout of Read: pool 1, seq 2, image 3, object 4, epoch 5,
        // term 0, offset 0, length 4 MiB
        "01000000",
        "02000000",
        "0300000000000000",
        "0400000000000000",
        "0500000000000000",
        "0000000000000000",
        "00000000",
        "00004000",
    );
    assert_eq!(hex(&out), expected);
}

#[test]
fn allocated_reply_bytes() {
    let mut out = BytesMut::new();
    Reply::Allocated(vec![
        AllocatedRange {
            offset: 0,
            length: 8192,
        },
        AllocatedRange {
            offset: 16384,
            length: 4096,
        },
    ])
    .encode(7, &mut out);
    let expected = concat!(
        // header: kind 128 (Reply), request id 7, payload_len 24
        "4642424b",
        "01",
        "80",
        "0000",
        "0700000000000000",
        "18000000",
        "e226e003",
        "00000000",
        "7191874c",
        // tag 5 (Allocated), reserved, status 0, count 2
        "05",
        "00",
        "0000",
        "02000000",
        // ranges: (0, 8192), (16384, 4096)
        "00000000",
        "00200000",
        "00400000",
        "00100000",
    );
    assert_eq!(hex(&out), expected);
}

//! Transmission against a real server on a socket (in-memory exports): IO in simple and
//! structured replies, replies out of order, holes and block status after a trim, the
//! protocol's errors for malformed requests, limits, and the drain on shutdown.
// NBD fields are big-endian; the tests build them by hand.
#![allow(clippy::big_endian_bytes)]

use fastblock_nbd::consts::*;
use fastblock_nbd::memory::{MemoryExport, MemoryExports};
use fastblock_nbd::testing::*;
use fastblock_nbd::Limits;
use std::time::Duration;

async fn simple_client(server: &TestServer) -> RawClient {
    let mut c = RawClient::connect(server.addr).await;
    c.go("fb/img").await.unwrap();
    c
}

async fn structured_client(server: &TestServer) -> RawClient {
    let mut c = RawClient::connect(server.addr).await;
    c.structured().await;
    let r = c.set_meta("fb/img", &[META_BASE_ALLOCATION]).await;
    assert_eq!(r[0].kind, REP_META_CONTEXT);
    c.go("fb/img").await.unwrap();
    c
}

/// Simple replies (what the kernel gets): write, read back, trim and write-zeroes read as
/// zeros, flush and cache succeed, FUA is accepted.
#[tokio::test]
async fn simple_replies_round_trip() {
    let mut server = TestServer::one(1 << 20).await;
    let mut c = simple_client(&server).await;
    let data = pattern(10_000, 7);
    c.request(CMD_FLAG_FUA, CMD_WRITE, 1, 4000, 10_000, &data)
        .await;
    assert_eq!(c.simple_reply().await, (0, 1));
    c.request(0, CMD_READ, 2, 4000, 10_000, &[]).await;
    assert_eq!(c.simple_reply().await, (0, 2));
    assert_eq!(c.read(10_000).await, data);
    c.request(0, CMD_TRIM, 3, 4096, 4096, &[]).await;
    assert_eq!(c.simple_reply().await, (0, 3));
    c.request(0, CMD_WRITE_ZEROES, 4, 9000, 100, &[]).await;
    assert_eq!(c.simple_reply().await, (0, 4));
    c.request(0, CMD_FLUSH, 5, 0, 0, &[]).await;
    assert_eq!(c.simple_reply().await, (0, 5));
    c.request(0, CMD_CACHE, 6, 0, 4096, &[]).await;
    assert_eq!(c.simple_reply().await, (0, 6));
    c.request(0, CMD_READ, 7, 4000, 10_000, &[]).await;
    assert_eq!(c.simple_reply().await, (0, 7));
    let back = c.read(10_000).await;
    let mut expected = data.clone();
    expected[96..96 + 4096].fill(0);
    expected[5000..5100].fill(0);
    assert_eq!(back, expected);
    assert_eq!(server.export().flushes(), 1);
    // DISC: no reply, the server closes.
    c.request(0, CMD_DISC, 8, 0, 0, &[]).await;
    assert!(c.closed().await);
    server.stop().await;
}

/// Many requests in flight on one connection, answered as they complete: a slow read sent
/// first is answered after fast requests sent behind it.
#[tokio::test]
async fn replies_come_out_of_order() {
    let export = MemoryExport::new("fb/img", 1 << 20).with_slow_read(0, Duration::from_millis(500));
    let mut server = TestServer::start(MemoryExports::new().with(export), Limits::default()).await;
    let mut c = simple_client(&server).await;
    c.request(0, CMD_READ, 100, 0, 512, &[]).await;
    for handle in 1..=8u64 {
        c.request(0, CMD_WRITE, handle, handle * 4096, 4, b"abcd")
            .await;
    }
    let mut order = Vec::new();
    for _ in 0..9 {
        let (error, handle) = c.simple_reply().await;
        assert_eq!(error, 0);
        if handle == 100 {
            c.read(512).await;
        }
        order.push(handle);
    }
    assert_eq!(
        *order.last().unwrap(),
        100,
        "slow read answered last: {order:?}"
    );
    server.stop().await;
}

/// Structured replies: reads send hole chunks for zero blocks (one data chunk with DF),
/// block status reports holes after a trim, errors come as error chunks with a message.
#[tokio::test]
async fn structured_reads_holes_and_block_status() {
    let mut server = TestServer::one(1 << 20).await;
    let mut c = structured_client(&server).await;
    let data = pattern(3 * 4096, 3);
    c.request(0, CMD_WRITE, 1, 8192, 3 * 4096, &data).await;
    assert_eq!(c.simple_reply().await, (0, 1));
    c.request(0, CMD_TRIM, 2, 12288, 4096, &[]).await;
    assert_eq!(c.simple_reply().await, (0, 2));

    // Read 0..32 KiB: zeros, data, zeros (trimmed), data, zeros.
    c.request(0, CMD_READ, 3, 0, 32768, &[]).await;
    let chunks = c.chunks().await;
    let kinds: Vec<u16> = chunks.iter().map(|c| c.kind).collect();
    assert_eq!(
        kinds,
        [
            REPLY_TYPE_OFFSET_HOLE,
            REPLY_TYPE_OFFSET_DATA,
            REPLY_TYPE_OFFSET_HOLE,
            REPLY_TYPE_OFFSET_DATA,
            REPLY_TYPE_OFFSET_HOLE
        ]
    );
    assert!(chunks.iter().all(|c| c.handle == 3));
    c.request(0, CMD_READ, 4, 0, 32768, &[]).await;
    let mut expected = vec![0u8; 32768];
    expected[8192..8192 + 3 * 4096].copy_from_slice(&data);
    expected[12288..16384].fill(0);
    assert_eq!(c.structured_read(0, 32768).await, Ok(expected.clone()));
    c.request(CMD_FLAG_DF, CMD_READ, 5, 0, 32768, &[]).await;
    let chunks = c.chunks().await;
    assert_eq!(chunks.len(), 1);
    assert_eq!(chunks[0].kind, REPLY_TYPE_OFFSET_DATA);
    assert_eq!(&chunks[0].payload[8..], &expected[..]);

    // Block status: hole+zero, data, hole (trimmed), data, hole to the end of the window.
    c.request(0, CMD_BLOCK_STATUS, 6, 0, 32768, &[]).await;
    let chunks = c.chunks().await;
    assert_eq!(chunks.len(), 1);
    assert_eq!(chunks[0].kind, REPLY_TYPE_BLOCK_STATUS);
    let p = &chunks[0].payload;
    assert_eq!(p[..4], META_BASE_ALLOCATION_ID.to_be_bytes());
    let descriptors: Vec<(u32, u32)> = p[4..]
        .chunks(8)
        .map(|d| {
            (
                u32::from_be_bytes(d[..4].try_into().unwrap()),
                u32::from_be_bytes(d[4..].try_into().unwrap()),
            )
        })
        .collect();
    let hole = STATE_HOLE | STATE_ZERO;
    assert_eq!(
        descriptors,
        [
            (8192, hole),
            (4096, 0),
            (4096, hole),
            (4096, 0),
            (12288, hole)
        ]
    );
    // REQ_ONE: one descriptor.
    c.request(CMD_FLAG_REQ_ONE, CMD_BLOCK_STATUS, 7, 0, 32768, &[])
        .await;
    assert_eq!(c.chunks().await[0].payload.len(), 4 + 8);

    // Errors as error chunks: a read past the end.
    c.request(0, CMD_READ, 8, (1 << 20) - 10, 20, &[]).await;
    let chunks = c.chunks().await;
    assert_eq!(chunks[0].kind, REPLY_TYPE_ERROR);
    assert_eq!(chunks[0].payload[..4], EINVAL.to_be_bytes());
    assert!(chunks[0].payload.len() > 6, "error chunks carry a message");
    server.stop().await;
}

/// Malformed requests get the spec's errors and the connection keeps serving: unknown
/// command, unknown flag, DF without structured replies, block status without a context, a
/// write past the end (ENOSPC), an oversized write (EOVERFLOW, payload skipped so framing
/// holds), and NO_HOLE with FAST_ZERO (ENOTSUP: allocating zeros is a plain write).
#[tokio::test]
async fn malformed_requests_get_errors_and_the_session_goes_on() {
    let mut server = TestServer::one(64 << 20).await;
    let mut c = simple_client(&server).await;
    c.request(0, 42, 1, 0, 0, &[]).await;
    assert_eq!(c.simple_reply().await, (EINVAL, 1));
    c.request(1 << 9, CMD_READ, 2, 0, 1, &[]).await;
    assert_eq!(c.simple_reply().await, (EINVAL, 2));
    c.request(CMD_FLAG_DF, CMD_READ, 3, 0, 1, &[]).await;
    assert_eq!(c.simple_reply().await, (EINVAL, 3));
    c.request(0, CMD_BLOCK_STATUS, 4, 0, 1, &[]).await;
    assert_eq!(c.simple_reply().await, (EINVAL, 4));
    c.request(0, CMD_WRITE, 5, 64 << 20, 4, b"abcd").await;
    assert_eq!(c.simple_reply().await, (ENOSPC, 5));
    let big = vec![1u8; PAYLOAD_BYTES_MAX as usize + 1];
    c.request(0, CMD_WRITE, 6, 0, big.len() as u32, &big).await;
    assert_eq!(c.simple_reply().await, (EOVERFLOW, 6));
    c.request(
        CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
        CMD_WRITE_ZEROES,
        7,
        0,
        4096,
        &[],
    )
    .await;
    assert_eq!(c.simple_reply().await, (ENOTSUP, 7));
    // The stream is still in sync: a write and a read work.
    c.request(0, CMD_WRITE, 8, 0, 4, b"wxyz").await;
    assert_eq!(c.simple_reply().await, (0, 8));
    c.request(0, CMD_READ, 9, 0, 4, &[]).await;
    assert_eq!(c.simple_reply().await, (0, 9));
    assert_eq!(c.read(4).await, b"wxyz");
    assert_eq!(server.export().contents()[..4], *b"wxyz");
    server.stop().await;
}

/// WRITE_ZEROES unmaps whole blocks (like TRIM) unless NO_HOLE asks for allocated zeros.
#[tokio::test]
async fn write_zeroes_no_hole_allocates() {
    let mut server = TestServer::one(1 << 20).await;
    let export = server.export();
    let mut c = simple_client(&server).await;
    c.request(0, CMD_WRITE_ZEROES, 1, 0, 8 * 4096, &[]).await;
    assert_eq!(c.simple_reply().await, (0, 1));
    assert_eq!(export.allocated_blocks(), 0);
    c.request(CMD_FLAG_NO_HOLE, CMD_WRITE_ZEROES, 2, 0, 8 * 4096, &[])
        .await;
    assert_eq!(c.simple_reply().await, (0, 2));
    assert_eq!(export.allocated_blocks(), 8);
    assert!(export.contents().iter().all(|b| *b == 0));
    server.stop().await;
}

/// A bad request magic loses the stream's framing: that connection closes, after answering
/// what it had already admitted; another connection on the same export is unaffected.
#[tokio::test]
async fn bad_magic_closes_only_that_connection() {
    let mut server = TestServer::one(1 << 20).await;
    let mut other = simple_client(&server).await;
    let mut c = simple_client(&server).await;
    c.request(0, CMD_WRITE, 1, 0, 4, b"abcd").await;
    c.send(&[0xde; 28]).await;
    assert_eq!(c.simple_reply().await, (0, 1));
    assert!(c.closed().await);
    other.request(0, CMD_READ, 2, 0, 4, &[]).await;
    assert_eq!(other.simple_reply().await, (0, 2));
    assert_eq!(other.read(4).await, b"abcd");
    server.stop().await;
}

/// With two request slots per connection, a burst of 32 slow reads is still answered in
/// full: the reader waits for slots instead of buffering the burst.
#[tokio::test]
async fn a_burst_beyond_the_limits_is_paced_not_buffered() {
    let export = MemoryExport::new("fb/img", 1 << 20).with_slow_read(0, Duration::from_millis(20));
    let limits = Limits {
        inflight_requests_max: 2,
        ..Limits::default()
    };
    let mut server = TestServer::start(MemoryExports::new().with(export), limits).await;
    let mut c = simple_client(&server).await;
    for handle in 0..32u64 {
        c.request(0, CMD_READ, handle, 0, 4096, &[]).await;
    }
    let mut seen = Vec::new();
    for _ in 0..32 {
        let (error, handle) = c.simple_reply().await;
        assert_eq!(error, 0);
        c.read(4096).await;
        seen.push(handle);
    }
    seen.sort_unstable();
    assert_eq!(seen, (0..32).collect::<Vec<_>>());
    server.stop().await;
}

/// Shutdown (SIGTERM in the binary) lets admitted requests finish: a slow read in flight is
/// still answered, then the connection closes and the server returns.
#[tokio::test]
async fn shutdown_drains_in_flight_requests() {
    let export = MemoryExport::new("fb/img", 1 << 20).with_slow_read(0, Duration::from_millis(500));
    let mut server = TestServer::start(MemoryExports::new().with(export), Limits::default()).await;
    let mut c = simple_client(&server).await;
    c.request(0, CMD_READ, 1, 0, 100, &[]).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let stopping = tokio::spawn(async move {
        server.stop().await;
    });
    assert_eq!(c.simple_reply().await, (0, 1));
    assert_eq!(c.read(100).await.len(), 100);
    assert!(c.closed().await);
    tokio::time::timeout(TIMEOUT, stopping)
        .await
        .unwrap()
        .unwrap();
}

/// CAN_MULTI_CONN: writes completed on one connection are read back on another, and a flush
/// on a third covers them (here trivially: the export is durable on completion).
#[tokio::test]
async fn multi_conn_writes_on_one_flush_and_read_on_others() {
    let mut server = TestServer::one(1 << 20).await;
    let mut a = simple_client(&server).await;
    let mut b = simple_client(&server).await;
    let mut f = simple_client(&server).await;
    let data = pattern(8192, 9);
    a.request(0, CMD_WRITE, 1, 4096, 8192, &data).await;
    assert_eq!(a.simple_reply().await, (0, 1));
    f.request(0, CMD_FLUSH, 2, 0, 0, &[]).await;
    assert_eq!(f.simple_reply().await, (0, 2));
    b.request(0, CMD_READ, 3, 4096, 8192, &[]).await;
    assert_eq!(b.simple_reply().await, (0, 3));
    assert_eq!(b.read(8192).await, data);
    server.stop().await;
}

/// A read-only export (a snapshot) says so in its flags and answers writes, trims and
/// write-zeroes with EPERM without changing a byte; reads work.
#[tokio::test]
async fn a_read_only_export_refuses_every_write_with_eperm() {
    let export = MemoryExport::new("fb/img", 1 << 20).read_only();
    let mut server = TestServer::start(MemoryExports::new().with(export), Limits::default()).await;
    let mut c = RawClient::connect(server.addr).await;
    let (_, flags) = c.go("fb/img").await.unwrap();
    assert_ne!(flags & TFLAG_READ_ONLY, 0, "flags {flags:#x}");
    let data = pattern(4096, 3);
    c.request(0, CMD_WRITE, 1, 0, 4096, &data).await;
    assert_eq!(c.simple_reply().await, (EPERM, 1));
    c.request(0, CMD_TRIM, 2, 0, 4096, &[]).await;
    assert_eq!(c.simple_reply().await, (EPERM, 2));
    c.request(0, CMD_WRITE_ZEROES, 3, 0, 4096, &[]).await;
    assert_eq!(c.simple_reply().await, (EPERM, 3));
    c.request(0, CMD_READ, 4, 0, 4096, &[]).await;
    assert_eq!(c.simple_reply().await, (0, 4));
    assert_eq!(c.read(4096).await, vec![0; 4096]);
    assert!(server.export().contents().iter().all(|b| *b == 0));
    server.stop().await;
}

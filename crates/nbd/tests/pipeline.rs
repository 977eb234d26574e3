//! How one connection carries many requests (in-memory exports, a real server on a socket):
//! requests pipelined in one write, replies of concurrent requests as they complete, the
//! admission limits holding requests back until a slot frees, a client that does not read its
//! replies, and the drain of admitted requests at shutdown.
// NBD fields are big-endian; the tests build them by hand.
#![allow(clippy::big_endian_bytes)]

use fastblock_nbd::consts::*;
use fastblock_nbd::memory::{MemoryExport, MemoryExports};
use fastblock_nbd::request::Negotiated;
use fastblock_nbd::testing::*;
use fastblock_nbd::transmission::serve;
use fastblock_nbd::Limits;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

async fn simple_client(server: &TestServer) -> RawClient {
    let mut c = RawClient::connect(server.addr).await;
    c.go("fb/img").await.unwrap();
    c
}

async fn server_with(export: MemoryExport, limits: Limits) -> TestServer {
    TestServer::start(MemoryExports::new().with(export), limits).await
}

/// A client of `fb/img` whose socket receives into a small fixed buffer (64 KiB, doubled by
/// the kernel): replies it does not read stay in the server.
async fn slow_reader(addr: std::net::SocketAddr) -> RawClient {
    let mut c = RawClient::connect_raw_with_receive_buffer(addr, 64 << 10).await;
    c.send(&3u32.to_be_bytes()).await;
    c.go("fb/img").await.unwrap();
    c
}

/// 300 writes of sizes from 1 byte to about 70 KiB (so headers and payloads straddle the
/// server's reads) sent in one write, then 300 reads of the same ranges in one write: every
/// request gets exactly one reply, with its handle, and each read returns what its range holds.
#[tokio::test]
async fn many_requests_in_one_write_get_every_reply() {
    let mut server = TestServer::one(32 << 20).await;
    let mut c = simple_client(&server).await;
    let mut ranges = BTreeMap::new();
    let mut offset = 0u64;
    let mut burst = Vec::new();
    for handle in 0..300u64 {
        let len = 1 + (handle as usize * 7919) % 70_000;
        let data = pattern(len, handle as u8);
        burst.extend(request_bytes(
            0, CMD_WRITE, handle, offset, len as u32, &data,
        ));
        ranges.insert(handle, (offset, data));
        offset += len as u64 + 100;
    }
    c.send(&burst).await;
    let mut answered = Vec::new();
    for _ in 0..300 {
        let (error, handle) = c.simple_reply().await;
        assert_eq!(error, 0, "write {handle}");
        answered.push(handle);
    }
    answered.sort_unstable();
    assert_eq!(answered, (0..300).collect::<Vec<_>>());
    let contents = server.export().contents();
    for (offset, data) in ranges.values() {
        assert_eq!(
            &contents[*offset as usize..*offset as usize + data.len()],
            data
        );
    }

    let mut burst = Vec::new();
    for (handle, (offset, data)) in &ranges {
        burst.extend(request_bytes(
            0,
            CMD_READ,
            1000 + handle,
            *offset,
            data.len() as u32,
            &[],
        ));
    }
    c.send(&burst).await;
    let mut seen = Vec::new();
    for _ in 0..300 {
        let (error, handle) = c.simple_reply().await;
        assert_eq!(error, 0, "read {handle}");
        let (_, data) = &ranges[&(handle - 1000)];
        assert_eq!(&c.read(data.len()).await, data, "data of read {handle}");
        seen.push(handle);
    }
    seen.sort_unstable();
    assert_eq!(seen, (1000..1300).collect::<Vec<_>>());
    server.stop().await;
}

/// Four reads sent together, the first slowest (400, 300, 200, 100 ms): they run at once and
/// are answered in the order they finish, each with its own data, in less time than one after
/// another would take.
#[tokio::test]
async fn concurrent_requests_are_answered_as_they_complete() {
    let mut export = MemoryExport::new("fb/img", 1 << 20);
    for i in 0..4u64 {
        export = export.with_slow_read(i * 4096, Duration::from_millis(400 - 100 * i));
    }
    let mut server = server_with(export, Limits::default()).await;
    let mut c = simple_client(&server).await;
    for i in 0..4u64 {
        c.request(
            0,
            CMD_WRITE,
            10 + i,
            i * 4096,
            4096,
            &pattern(4096, i as u8),
        )
        .await;
        assert_eq!(c.simple_reply().await, (0, 10 + i));
    }
    let burst: Vec<u8> = (0..4u64)
        .flat_map(|i| request_bytes(0, CMD_READ, i, i * 4096, 4096, &[]))
        .collect();
    let started = Instant::now();
    c.send(&burst).await;
    let mut order = Vec::new();
    for _ in 0..4 {
        let (error, handle) = c.simple_reply().await;
        assert_eq!(error, 0);
        assert_eq!(c.read(4096).await, pattern(4096, handle as u8));
        order.push(handle);
    }
    let took = started.elapsed();
    assert_eq!(order, [3, 2, 1, 0], "answered as they finished");
    assert!(
        took < Duration::from_millis(900),
        "ran concurrently: {took:?}"
    );
    server.stop().await;
}

/// At the limit (one request slot; or the byte budget, taken whole by a 32 MiB read), a
/// request sent behind a slow one is not taken until the slow one is answered: the write
/// behind it has not happened 200 ms later, then it is served.
#[tokio::test]
async fn a_request_beyond_the_limits_waits_until_one_finishes() {
    let one_slot = Limits {
        inflight_requests_max: 1,
        ..Limits::default()
    };
    let one_payload = Limits {
        inflight_bytes_max: PAYLOAD_BYTES_MAX,
        ..Limits::default()
    };
    for (limits, read_len) in [(one_slot, 4096), (one_payload, PAYLOAD_BYTES_MAX)] {
        let size = u64::from(PAYLOAD_BYTES_MAX) + (1 << 20);
        let export =
            MemoryExport::new("fb/img", size).with_slow_read(0, Duration::from_millis(600));
        let mut server = server_with(export, limits).await;
        let export = server.export();
        let mut c = simple_client(&server).await;
        let at = size - 4096;
        let mut burst = request_bytes(0, CMD_READ, 1, 0, read_len, &[]);
        burst.extend(request_bytes(0, CMD_WRITE, 2, at, 4, b"abcd"));
        c.send(&burst).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let range = at as usize..at as usize + 4;
        assert_eq!(
            export.contents()[range.clone()],
            [0; 4],
            "{limits:?}: the write waits for room"
        );
        assert_eq!(c.simple_reply().await, (0, 1));
        assert_eq!(c.read(read_len as usize).await.len(), read_len as usize);
        assert_eq!(c.simple_reply().await, (0, 2));
        assert_eq!(export.contents()[range], *b"abcd");
        server.stop().await;
    }
}

/// Waits (bounded) until `count` stops changing for `quiet`; returns its last value.
async fn settled(count: impl Fn() -> u64, quiet: Duration) -> u64 {
    let deadline = Instant::now() + TIMEOUT;
    let mut last = count();
    let mut since = Instant::now();
    while since.elapsed() < quiet {
        assert!(
            Instant::now() < deadline,
            "still changing after {TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = count();
        if now != last {
            last = now;
            since = Instant::now();
        }
    }
    last
}

/// The largest send buffer TCP may grow a socket to (`net.ipv4.tcp_wmem`), 4 MiB if unknown.
fn send_buffer_max_bytes() -> u64 {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_wmem")
        .ok()
        .and_then(|s| s.split_whitespace().nth(2)?.parse().ok())
        .unwrap_or(4 << 20)
}

/// A client that sends many 1 MiB reads and reads no reply: the server runs only as many as
/// its byte budget (32 MiB here) and the socket's buffers hold, then stops taking requests
/// instead of buffering replies; once the client reads, every request is answered.
#[tokio::test]
async fn a_client_that_does_not_read_replies_is_not_buffered_for() {
    const READ_BYTES: u64 = 1 << 20;
    let limits = Limits {
        inflight_requests_max: 1024,
        inflight_bytes_max: PAYLOAD_BYTES_MAX,
        ..Limits::default()
    };
    let mut server = server_with(MemoryExport::new("fb/img", 4 << 20), limits).await;
    let export = server.export();
    let mut c = slow_reader(server.addr).await;
    // What may be held outside the budget: the server's send buffer, the client's receive
    // buffer (64 KiB, doubled by the kernel), and the reply being written.
    let outside = send_buffer_max_bytes() + (128 << 10) + READ_BYTES;
    let bound = (u64::from(PAYLOAD_BYTES_MAX) + outside).div_ceil(READ_BYTES);
    let requests = 2 * bound + 16;
    let burst: Vec<u8> = (0..requests)
        .flat_map(|h| request_bytes(0, CMD_READ, h, 0, READ_BYTES as u32, &[]))
        .collect();
    c.send(&burst).await;
    let served = settled(|| export.reads_served(), Duration::from_millis(500)).await;
    assert!(
        served <= bound,
        "{served} of {requests} reads of 1 MiB served to a client reading nothing (bound {bound})"
    );
    assert!(served >= 8, "the budget was used: {served}");
    let mut seen = Vec::new();
    for _ in 0..requests {
        let (error, handle) = c.simple_reply().await;
        assert_eq!(error, 0);
        c.read(READ_BYTES as usize).await;
        seen.push(handle);
    }
    seen.sort_unstable();
    assert_eq!(seen, (0..requests).collect::<Vec<_>>());
    server.stop().await;
}

/// Shutdown while requests are in flight: every admitted one (a slow read, writes behind it)
/// is answered and done, then the connection closes.
#[tokio::test]
async fn shutdown_drains_every_admitted_request() {
    let export = MemoryExport::new("fb/img", 1 << 20).with_slow_read(0, Duration::from_millis(400));
    let mut server = server_with(export, Limits::default()).await;
    let export = server.export();
    let mut c = simple_client(&server).await;
    let mut burst = request_bytes(0, CMD_READ, 100, 0, 512, &[]);
    for handle in 1..=8u64 {
        burst.extend(request_bytes(
            0,
            CMD_WRITE,
            handle,
            handle * 4096,
            4096,
            &pattern(4096, handle as u8),
        ));
    }
    c.send(&burst).await;
    // Let the server take the burst, then stop it while the read is still running.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let stopping = tokio::spawn(async move { server.stop().await });
    let mut seen = Vec::new();
    for _ in 0..9 {
        let (error, handle) = c.simple_reply().await;
        assert_eq!(error, 0);
        if handle == 100 {
            c.read(512).await;
        }
        seen.push(handle);
    }
    seen.sort_unstable();
    assert_eq!(seen, [1, 2, 3, 4, 5, 6, 7, 8, 100]);
    assert!(c.closed().await);
    tokio::time::timeout(TIMEOUT, stopping)
        .await
        .unwrap()
        .unwrap();
    let contents = export.contents();
    for handle in 1..=8usize {
        assert_eq!(
            contents[handle * 4096..(handle + 1) * 4096],
            pattern(4096, handle as u8)
        );
    }
}

/// Shutdown while requests wait for room (two slots, four slow reads): the two admitted are
/// answered, the two waiting are never run, and the connection ends cleanly (`serve` driven
/// directly on a socket pair, so that its result, or a panic, is seen).
#[tokio::test]
async fn shutdown_at_the_limit_answers_the_admitted_requests_only() {
    let limits = Limits {
        inflight_requests_max: 2,
        ..Limits::default()
    };
    let mut export = MemoryExport::new("fb/img", 1 << 20);
    for i in 0..4u64 {
        export = export.with_slow_read(i * 4096, Duration::from_millis(400));
    }
    let negotiated = Negotiated {
        size_bytes: 1 << 20,
        structured: false,
        allocation_context: false,
    };
    let (ours, theirs) = tokio::net::UnixStream::pair().unwrap();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let serving = tokio::spawn(serve(theirs, export.clone(), negotiated, limits, stopped));
    let mut c = RawClient {
        stream: Box::new(ours),
    };
    let burst: Vec<u8> = (0..4u64)
        .flat_map(|i| request_bytes(0, CMD_READ, i, i * 4096, 4096, &[]))
        .collect();
    c.send(&burst).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.send(true).unwrap();
    let mut seen = Vec::new();
    for _ in 0..2 {
        let (error, handle) = c.simple_reply().await;
        assert_eq!(error, 0);
        c.read(4096).await;
        seen.push(handle);
    }
    seen.sort_unstable();
    assert_eq!(seen, [0, 1]);
    assert!(c.closed().await);
    let served = tokio::time::timeout(TIMEOUT, serving).await.unwrap();
    served
        .expect("serve did not panic")
        .expect("serve ended cleanly");
    assert_eq!(export.reads_served(), 2);
}

/// Shutdown with replies the client never reads: the drain gives up at its timeout (not
/// waiting on the socket forever) and the server stops.
#[tokio::test]
async fn shutdown_gives_up_on_a_client_that_does_not_read_at_the_drain_timeout() {
    let limits = Limits {
        drain_timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let mut server = server_with(MemoryExport::new("fb/img", 4 << 20), limits).await;
    let export = server.export();
    let mut c = slow_reader(server.addr).await;
    let burst: Vec<u8> = (0..64u64)
        .flat_map(|h| request_bytes(0, CMD_READ, h, 0, 1 << 20, &[]))
        .collect();
    c.send(&burst).await;
    settled(|| export.reads_served(), Duration::from_millis(300)).await;
    let started = Instant::now();
    server.stop().await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "stopped after {:?}",
        started.elapsed()
    );
}

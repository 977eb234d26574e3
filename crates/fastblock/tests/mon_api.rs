//! The HTTP API's contracts that the CLI tests do not reach: the map long-poll, Prometheus
//! metrics, and malformed requests answered with our error format while the monitor keeps
//! serving.

mod common;

use common::{http_get, FakeOsd, MonCluster, MonOptions};
use fastblock_types::api::{CreatePoolRequest, ErrorCode};
use fastblock_types::map::FailureDomain;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn raw(addr: &str, request: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf))
        .await
        .unwrap()
        .unwrap();
    String::from_utf8_lossy(&buf).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn map_long_poll_wakes_on_change_and_times_out_without_one() {
    let mons = MonCluster::start(1, MonOptions::default()).await;
    let client = mons.client();
    let epoch = client.map().await.unwrap().epoch;

    let start = Instant::now();
    let idle = client
        .watch_map(epoch, Duration::from_millis(700))
        .await
        .unwrap();
    assert!(idle.map.is_none(), "no change: not-modified answer");
    assert!(
        start.elapsed() >= Duration::from_millis(600),
        "the poll was held"
    );

    let watcher = {
        let c = mons.client();
        tokio::spawn(async move { c.watch_map(epoch, Duration::from_secs(20)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _osd = FakeOsd::register(&mons, "h").await;
    let woke = tokio::time::timeout(Duration::from_secs(5), watcher)
        .await
        .expect("woken promptly")
        .unwrap()
        .unwrap();
    let map = woke.map.expect("the new map");
    assert!(map.epoch > epoch);
    assert_eq!(map.osds.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_health_reflect_the_cluster() {
    let mons = MonCluster::start(1, MonOptions::default()).await;
    let _a = FakeOsd::register(&mons, "h1").await;
    let _b = FakeOsd::register(&mons, "h2").await;
    let client = mons.client();
    let req = CreatePoolRequest {
        name: "p".into(),
        pg_count: 8,
        size: 2,
        failure_domain: FailureDomain::Host,
    };
    client.create_pool(&req).await.unwrap();
    let _ = client.status().await.unwrap();
    let text = http_get(&format!("http://{}/metrics", mons.specs[0].api))
        .await
        .unwrap();
    for line in [
        "fastblock_mon_is_leader 1",
        "fastblock_mon_osds 2",
        "fastblock_mon_osds_up 2",
        "fastblock_mon_osds_in 2",
        "fastblock_mon_pools 1",
        "fastblock_mon_pgs{state=\"creating\"} 8",
        "fastblock_mon_api_latency_seconds_count{method=\"POST\",route=\"/v1/pools\"} 1",
    ] {
        assert!(text.contains(line), "metrics lack {line:?}:\n{text}");
    }
    let health = client.health().await.unwrap();
    assert_eq!(health.status, "HEALTH_WARN", "creating PGs: {health:?}");
    assert!(
        health.checks.iter().any(|c| c.code == "PG_CREATING"),
        "{health:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_clear_errors_and_the_monitor_keeps_serving() {
    // Raw unsigned requests: auth mode none, so that parsing is what answers them
    // (auth_control.rs covers unsigned requests in mode sign).
    let mons = MonCluster::start(
        1,
        MonOptions {
            auth_mode: "none",
            ..MonOptions::default()
        },
    )
    .await;
    let addr = &mons.specs[0].api;
    let bad_json = raw(addr, "POST /v1/pools HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\nConnection: close\r\n\r\n{\"name\":1").await;
    assert!(bad_json.starts_with("HTTP/1.1 400"), "{bad_json}");
    assert!(
        bad_json.contains("\"code\":\"invalid_argument\""),
        "{bad_json}"
    );
    let bad_id = raw(
        addr,
        "POST /v1/osds/abc/out HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(bad_id.contains("invalid osd id"), "{bad_id}");
    let bad_pg = raw(addr, "POST /v1/pgs/1/leader HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}").await;
    assert!(bad_pg.contains("invalid PG id"), "{bad_pg}");
    let unknown = raw(
        addr,
        "GET /v2/nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(unknown.contains("no such endpoint"), "{unknown}");
    let garbage = raw(addr, "\x00\x01garbage\r\n\r\n").await;
    assert!(
        garbage.is_empty() || garbage.starts_with("HTTP/1.1 400"),
        "{garbage}"
    );
    // Still serving, and nothing was created by the bad calls.
    let client = mons.client();
    assert!(client.pools().await.unwrap().is_empty());
    let err = client.apply_id("not-a-uuid").await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::InvalidArgument));
    let uuid = uuid::Uuid::new_v4().to_string();
    client.apply_id(&uuid).await.unwrap();
    let err = client.apply_id(&uuid).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::UuidExists));
}

//! The HTTP API's contracts that the CLI tests do not reach: the map long-poll, Prometheus
//! metrics, and malformed requests answered with our error format while the monitor keeps
//! serving.

mod common;

use common::{http_get, FakeOsd, MonCluster, MonOptions};
use fastblock_types::api::{CreatePoolRequest, ErrorCode};
use fastblock_types::map::FailureDomain;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Sends `request` on a new connection and reads until the monitor closes it (bounded).
async fn raw_bytes(addr: &str, request: &str) -> Vec<u8> {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf))
        .await
        .unwrap()
        .unwrap();
    buf
}

async fn raw(addr: &str, request: &str) -> String {
    String::from_utf8_lossy(&raw_bytes(addr, request).await).to_string()
}

/// A raw GET with `Accept-Encoding: encoding` (none: no header): the answer's head, lower
/// case, and its body as bytes.
async fn raw_get(addr: &str, path: &str, encoding: Option<&str>) -> (String, Vec<u8>) {
    let accept = encoding.map_or(String::new(), |e| format!("Accept-Encoding: {e}\r\n"));
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{accept}Connection: close\r\n\r\n");
    let buf = raw_bytes(addr, &request).await;
    let end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an HTTP head");
    let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
    (head, buf[end + 4..].to_vec())
}

/// A cluster of 4 OSDs with a pool of 256 PGs: a whole map of some 40 KB of JSON. The OSDs
/// heartbeat while held, so that the map stays as it is.
async fn cluster_with_a_pool(auth_mode: &'static str) -> (MonCluster, Vec<FakeOsd>) {
    let mons = MonCluster::start(
        1,
        MonOptions {
            auth_mode,
            ..MonOptions::default()
        },
    )
    .await;
    let mut osds = Vec::new();
    for i in 0..4 {
        osds.push(FakeOsd::register(&mons, &format!("h{i}")).await);
    }
    mons.client()
        .create_pool(&CreatePoolRequest {
            name: "z".into(),
            pg_count: 256,
            size: 2,
            failure_domain: FailureDomain::Osd,
        })
        .await
        .unwrap();
    (mons, osds)
}

/// Large answers go gzipped to a caller that accepts it, and as they are to any other
/// (`docs/mon-api.md`, "Compression"). Method: in `sign` mode the monitor client (which
/// accepts gzip, and checks the answer's signature once decompressed) reads a whole map of
/// 256 PGs, far fewer bytes on the wire than its JSON; in mode `none` a raw caller reads the
/// same map with and without `Accept-Encoding: gzip` and with gzip refused (`q=0`), and a
/// small answer: only the first is gzipped, and it opens to the same JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_answers_are_gzipped_for_callers_that_accept_it() {
    use fastblock_types::map_delta::MapScope;
    use fastblock_types::Epoch;
    let (signed, _osds) = cluster_with_a_pool("sign").await;
    let (answer, wire_bytes) = signed
        .client()
        .map_update_sized(Epoch(0), &MapScope::All, Duration::ZERO)
        .await
        .unwrap();
    let json_bytes = serde_json::to_vec(&answer).unwrap().len();
    // A second holder of the scope gets the answer encoded for the first
    // (`crate::map_answers`), signed for its own call: it verifies and reads the same.
    let (again, again_bytes) = signed
        .client()
        .map_update_sized(Epoch(0), &MapScope::All, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(again_bytes, wire_bytes);
    assert_eq!(serde_json::to_vec(&again).unwrap().len(), json_bytes);
    assert!(again.map.is_some_and(|m| m.epoch == answer.epoch));
    assert!(
        wire_bytes * 4 < json_bytes,
        "{wire_bytes} bytes on the wire for {json_bytes} of JSON"
    );
    let map = answer.map.expect("a whole map on first contact");
    assert_eq!(map.pgmaps.values().map(|p| p.pgs.len()).sum::<usize>(), 256);
    drop(signed);

    let (open, _osds) = cluster_with_a_pool("none").await;
    let addr = &open.specs[0].api;
    let (head, plain) = raw_get(addr, "/v1/map", None).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(!head.contains("content-encoding"), "{head}");
    let (head, packed) = raw_get(addr, "/v1/map", Some("br, gzip")).await;
    assert!(head.contains("content-encoding: gzip"), "{head}");
    assert!(
        packed.len() * 4 < plain.len(),
        "{} of {}",
        packed.len(),
        plain.len()
    );
    let mut opened = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&packed[..]), &mut opened)
        .unwrap();
    assert_eq!(opened, plain, "the gzipped answer opens to the plain one");
    let (head, refused) = raw_get(addr, "/v1/map", Some("gzip;q=0")).await;
    assert!(!head.contains("content-encoding"), "{head}");
    assert_eq!(refused, plain);
    let (head, _) = raw_get(addr, "/status.js", Some("gzip")).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(
        !head.contains("content-encoding"),
        "a small answer as it is: {head}"
    );
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
    let metrics = format!("http://{}/metrics", mons.specs[0].api);
    let woken_answers = |text: String| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix("fastblock_mon_map_wait_answer_seconds_count "))
            .unwrap_or_else(|| panic!("no map answer times in:\n{text}"))
            .trim()
            .parse()
            .expect("a count")
    };
    assert_eq!(
        woken_answers(http_get(&metrics).await.unwrap()),
        0,
        "a poll that ran out of time is not an answer to an epoch"
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
    // The woken poll is timed from the epoch's publication.
    assert!(woken_answers(http_get(&metrics).await.unwrap()) >= 1);
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
        // Twice: the first call of a new client is refused as signed for no incarnation of the
        // monitor's, and signed again for it (docs/security.md, "Monitor calls").
        "fastblock_mon_api_latency_seconds_count{method=\"POST\",route=\"/v1/pools\"} 2",
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

/// Incremental maps over the API (`docs/mon-api.md`, "Incremental maps"): a holder at epoch E
/// gets the changes since E, which give exactly the map the monitor serves whole; scoped to an
/// OSD or to pools, the PGs it does not need are left out; a holder the monitor has no deltas
/// for (here: behind the epoch a restarted monitor loaded, where its log starts) gets a whole
/// map, and one at that epoch gets deltas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn incremental_maps_carry_the_changes_and_a_whole_map_when_too_far_behind() {
    use fastblock_types::map_delta::{MapFollower, MapScope};
    use fastblock_types::PoolId;
    let mut mons = MonCluster::start(1, MonOptions::default()).await;
    let client = mons.client();
    let mut osds = Vec::new();
    for i in 0..4 {
        osds.push(FakeOsd::register(&mons, &format!("h{i}")).await);
    }
    let pool = |name: &str| CreatePoolRequest {
        name: name.into(),
        pg_count: 16,
        size: 2,
        failure_domain: FailureDomain::Osd,
    };
    client.create_pool(&pool("a")).await.unwrap();
    let osd = osds[0].id;
    let mut all = MapFollower::new(MapScope::All);
    let mut mine = MapFollower::new(MapScope::Osd(osd));
    let mut pool_a = MapFollower::new(MapScope::Pools([PoolId(1)].into()));
    let mut stale = MapFollower::new(MapScope::All);
    for f in [&mut all, &mut mine, &mut pool_a, &mut stale] {
        let first = client
            .map_update(f.epoch(), f.scope(), Duration::ZERO)
            .await
            .unwrap();
        assert!(
            first.map.is_some() && first.delta.is_none(),
            "first contact: whole"
        );
        f.apply(first.into_update()).unwrap().expect("a map");
    }
    let e1 = all.epoch();

    // Changes: a second pool, an OSD out (PGs remapped), a flag.
    client.create_pool(&pool("b")).await.unwrap();
    client.osd_out(osds[3].id).await.unwrap();
    client.set_flag("noout", true).await.unwrap();
    let whole = client.map().await.unwrap().map.unwrap();
    assert!(whole.epoch > e1);

    let answer = client
        .map_update(e1, &MapScope::All, Duration::ZERO)
        .await
        .unwrap();
    let delta = answer.delta.clone().expect("a delta from a recent epoch");
    assert!(answer.map.is_none());
    assert_eq!((delta.from, delta.to), (e1, whole.epoch));
    let delta_bytes = serde_json::to_vec(&delta).unwrap().len();
    let whole_bytes = serde_json::to_vec(&whole).unwrap().len();
    assert!(
        delta_bytes < whole_bytes,
        "delta {delta_bytes} B, whole map {whole_bytes} B"
    );
    let followed = all.apply(answer.into_update()).unwrap().unwrap();
    assert_eq!(*followed, whole, "the delta gives the map served whole");

    // Scoped: the OSD's PGs only; the pool's PG map only.
    for (f, scope) in [
        (&mut mine, MapScope::Osd(osd)),
        (&mut pool_a, MapScope::Pools([PoolId(1)].into())),
    ] {
        let answer = client
            .map_update(f.epoch(), &scope, Duration::ZERO)
            .await
            .unwrap();
        assert!(answer.delta.is_some(), "{scope:?}: a delta");
        let m = f.apply(answer.into_update()).unwrap().unwrap();
        assert_eq!(*m, scope.map(&whole), "{scope:?}");
    }
    let mine_map = mine.map().unwrap();
    let pgs: usize = mine_map.pgmaps.values().map(|p| p.pgs.len()).sum();
    let total: usize = whole.pgmaps.values().map(|p| p.pgs.len()).sum();
    assert!(
        pgs > 0 && pgs < total,
        "osd {osd} follows {pgs} of {total} PGs"
    );
    assert_eq!(pool_a.map().unwrap().pgmaps.len(), 1);

    // A restarted monitor keeps deltas from the epoch it loaded on: a holder behind it gets a
    // whole map, one at it a delta.
    mons.kill(0);
    mons.restart(0);
    mons.wait_leader(Duration::from_secs(30)).await;
    let loaded = all.epoch();
    client.set_flag("noout", false).await.unwrap();
    let answer = client
        .map_update(stale.epoch(), &MapScope::All, Duration::ZERO)
        .await
        .unwrap();
    assert!(stale.epoch() < loaded);
    assert!(
        answer.map.is_some() && answer.delta.is_none(),
        "whole when behind the log"
    );
    let from_whole = stale.apply(answer.into_update()).unwrap().unwrap();
    let answer = client
        .map_update(loaded, &MapScope::All, Duration::ZERO)
        .await
        .unwrap();
    let delta = answer.delta.clone().expect("a delta from the loaded epoch");
    assert_eq!(delta.from, loaded);
    let m = all.apply(answer.into_update()).unwrap().unwrap();
    assert!(!m.flags.noout);
    assert_eq!(m, from_whole);
    assert_eq!(*m, client.map().await.unwrap().map.unwrap());
}

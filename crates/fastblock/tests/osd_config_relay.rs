//! `fastblock-client config ... osd.N` from a host without the OSD's admin socket, on real
//! processes: the monitor relays the call in the OSD's heartbeats (docs/operations.md,
//! "Configuration"; docs/mon-api.md, `POST /v1/osds/{id}/config`). The change takes effect in
//! the running OSD, a call made to a follower monitor is served by the leader (which holds the
//! OSD's heartbeats), the endpoint is refused without an admin signature, and a down OSD is
//! reported at once.

mod common;

use common::*;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn debug_lines(log: &str) -> usize {
    log.lines().filter(|l| l.contains(" DEBUG ")).count()
}

/// Opens and drops a TCP connection to the OSD's data port: the shard logs the closed
/// connection at debug level.
async fn poke(port: u16) {
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await;
    drop(stream.expect("connecting to the OSD"));
}

/// One unsigned HTTP/1.1 POST; the raw answer.
async fn unsigned_post(addr: &str, path: &str, body: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(request.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf)).await;
    String::from_utf8_lossy(&buf).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_reaches_an_osd_through_the_monitor() {
    let mons = MonCluster::start(3, MonOptions::default()).await;
    let leader = mons.wait_leader(Duration::from_secs(30)).await;
    // Every call goes to a follower: it must forward it to the leader like any other.
    let follower = mons.endpoints()[(leader + 1) % 3].clone();
    let dir = TempDir::new("osd-config-relay");
    let mut osd = OsdProc::create(&mons, dir.path(), "h0", "1G", 1);
    wait_osds_up(&mons.client(), &[osd.id], Duration::from_secs(60)).await;
    let target = format!("osd.{}", osd.id);
    // The OSD's own socket exists, but not in this "other host's" run directory.
    let elsewhere = dir.path().join("another-host-run");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let elsewhere = elsewhere.to_str().unwrap();
    let config = |args: &[&str]| {
        let mut all = vec!["--mon", &follower, "config"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--run-dir", elsewhere]);
        mons.cli(&all)
    };

    let log_path = osd.proc.as_ref().unwrap().log.clone();
    let read_log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    poke(osd.port).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(debug_lines(&read_log()), 0, "{}", read_log());

    let set = config(&["set", &target, "log_level", "info,fastblock_osd=debug"]);
    let set = set.ok();
    assert!(set.contains("info,fastblock_osd=debug"), "{set}");
    assert!(set.contains("runtime"), "{set}");
    wait_until(
        Duration::from_secs(10),
        "debug lines in the OSD's log",
        || async {
            poke(osd.port).await;
            (debug_lines(&read_log()) > 0).then_some(())
        },
    )
    .await;
    assert!(
        read_log().contains("config call from the monitor"),
        "{}",
        read_log()
    );
    let got = config(&["get", &target, "log_level"]);
    assert_eq!(got.ok().trim(), "info,fastblock_osd=debug");
    // The OSD's refusal comes back as the admin socket's would.
    config(&["set", &target, "wal_sync", "none"]).fails_with("cannot be changed at runtime");

    // Only an administrator's signature opens it.
    let path = format!("/v1/osds/{}/config", osd.id);
    let answer = unsigned_post(&follower, &path, r#"{"op":"show"}"#).await;
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    assert!(answer.contains("auth_required"), "{answer}");

    // A down OSD: refused at once, saying so.
    osd.kill();
    let client = mons.client();
    wait_until(Duration::from_secs(30), "the OSD marked down", || async {
        let osds = client.osds().await.expect("osd list");
        osds.iter().any(|o| o.id == osd.id && !o.up).then_some(())
    })
    .await;
    let start = Instant::now();
    config(&["get", &target, "log_level"]).fails_with(&format!("{target} is down"));
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "took {:?}",
        start.elapsed()
    );
}

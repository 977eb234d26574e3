//! Monitor answers and the auth floor on real processes (`docs/security.md`, "No downgrade" and
//! "Monitor answers"): an attacker between a daemon and its monitor plays its part through a
//! relay that alters, strips or replays the monitor's answers, and a call captured before a
//! monitor restart or a change of leader is replayed after it. Each attack is refused and
//! changes nothing.

mod common;

use common::*;
use fastblock_auth::request::sign_request;
use fastblock_auth::{EntityName, Keyring, Secret};
use fastblock_monclient::{MonClient, MonError};
use fastblock_types::api::{CreatePoolRequest, ErrorCode};
use fastblock_types::map::FailureDomain;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the relay does to each answer of the monitor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tamper {
    /// Rewrites the cluster's auth mode `sign` to `none` in the body (same length).
    Downgrade,
    /// Rewrites the mode and removes the answer's signature.
    DowngradeUnsigned,
    /// Answers every call after the first served one with that call's answer, byte for byte.
    ReplayFirst,
}

/// A relay in front of monitor `upstream` that tampers with its answers (one call per
/// connection: it asks the monitor to close after answering).
struct Relay {
    addr: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reads one HTTP message: its head and a `content-length` body; without one, a request ends
/// at its head and an answer at EOF.
async fn read_message(s: &mut TcpStream, request: bool) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 65536];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map(|v| v.trim().parse::<usize>().unwrap());
            match length {
                Some(length) if buf.len() >= end + 4 + length => {
                    buf.truncate(end + 4 + length);
                    return buf;
                }
                None if request => {
                    buf.truncate(end + 4);
                    return buf;
                }
                _ => {}
            }
        }
        let n = match tokio::time::timeout(Duration::from_secs(20), s.read(&mut chunk)).await {
            Ok(Ok(n)) => n,
            _ => 0,
        };
        if n == 0 {
            return buf;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn replace_all(bytes: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    assert_eq!(from.len(), to.len(), "keeps content-length right");
    let mut out = bytes.to_vec();
    let mut i = 0;
    while i + from.len() <= out.len() {
        if &out[i..i + from.len()] == from {
            out[i..i + from.len()].copy_from_slice(to);
            i += from.len();
        } else {
            i += 1;
        }
    }
    out
}

fn tamper(answer: &[u8], how: Tamper) -> Vec<u8> {
    let downgraded = replace_all(answer, b"\"mode\":\"sign\"", b"\"mode\":\"none\"");
    match how {
        Tamper::Downgrade => downgraded,
        Tamper::DowngradeUnsigned => {
            let text = String::from_utf8_lossy(&downgraded).to_string();
            let (head, body) = text.split_once("\r\n\r\n").unwrap();
            let head: Vec<&str> = head
                .lines()
                .filter(|l| {
                    !l.to_ascii_lowercase()
                        .starts_with("x-fastblock-reply-signature")
                })
                .collect();
            format!("{}\r\n\r\n{body}", head.join("\r\n")).into_bytes()
        }
        Tamper::ReplayFirst => answer.to_vec(),
    }
}

async fn relay(upstream: String, how: Tamper) -> Relay {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let first: Arc<Mutex<Option<Vec<u8>>>> = Arc::default();
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut client, _)) = listener.accept().await else {
                return;
            };
            let (upstream, first) = (upstream.clone(), first.clone());
            tokio::spawn(async move {
                let request = read_message(&mut client, true).await;
                if request.is_empty() {
                    return;
                }
                // One call per connection: the monitor closes after its answer.
                let text = String::from_utf8_lossy(&request).to_string();
                let (line, rest) = text.split_once("\r\n").unwrap();
                let request = format!("{line}\r\nconnection: close\r\n{rest}");
                let mut mon = TcpStream::connect(&upstream).await.unwrap();
                mon.write_all(request.as_bytes()).await.unwrap();
                let answer = read_message(&mut mon, false).await;
                let out = match how {
                    Tamper::ReplayFirst => {
                        let mut held = first.lock().unwrap();
                        match &*held {
                            Some(earlier) => earlier.clone(),
                            None => {
                                if answer.starts_with(b"HTTP/1.1 200") {
                                    *held = Some(answer.clone());
                                }
                                answer
                            }
                        }
                    }
                    other => tamper(&answer, other),
                };
                let _ = client.write_all(&out).await;
                let _ = client.shutdown().await;
            });
        }
    });
    Relay { addr, task }
}

fn admin_key(mons: &MonCluster) -> Secret {
    Keyring::load(&mons.keyring()).unwrap().entries[&EntityName::admin()]
        .key
        .clone()
}

fn admin_through(mons: &MonCluster, addr: &str) -> MonClient {
    MonClient::new(vec![addr.to_string()])
        .with_deadline(Duration::from_secs(5))
        .with_credentials(EntityName::admin(), admin_key(mons))
}

fn assert_refused(result: Result<impl std::fmt::Debug, MonError>, needle: &str) {
    match result {
        Err(e @ MonError::Protocol { .. }) => {
            assert!(e.to_string().contains(needle), "{e}")
        }
        other => panic!("expected a refused answer ({needle}), got {other:?}"),
    }
}

/// A relay rewrites the map's auth mode to `none`, with or without the monitor's signature,
/// or replays an earlier answer: the client, holding a key, refuses each answer; the CLI
/// exits with the reason; the block client does not connect. Through the monitor itself, the
/// same calls work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_altered_or_replayed_monitor_answer_is_refused() {
    let mons = MonCluster::start(1, MonOptions::default()).await;
    let mon = mons.specs[0].api.clone();
    let direct = mons.client();
    assert_eq!(
        direct.map().await.unwrap().map.unwrap().auth.mode,
        fastblock_types::auth::AuthMode::Sign
    );

    let altered = relay(mon.clone(), Tamper::Downgrade).await;
    assert_refused(
        admin_through(&mons, &altered.addr).map().await,
        "signature check failed for the monitor's answer",
    );

    let stripped = relay(mon.clone(), Tamper::DowngradeUnsigned).await;
    assert_refused(
        admin_through(&mons, &stripped.addr).map().await,
        "the answer is not signed",
    );
    let out = mons.cli(&["--mon", &stripped.addr, "--timeout", "5s", "auth", "mode"]);
    out.fails_with("the answer is not signed");
    let config = fastblock_client::ClientConfig {
        monitors: vec![stripped.addr.clone()],
        op_deadline: Duration::from_secs(5),
        ..mons.client_config()
    };
    let refused = fastblock_client::Cluster::connect(config).await;
    let e = refused.err().expect("no connection through the relay");
    assert!(e.to_string().contains("not signed"), "{e}");

    // The first answer is genuine; the same bytes for a later call are not its answer.
    let replaying = relay(mon.clone(), Tamper::ReplayFirst).await;
    let through = admin_through(&mons, &replaying.addr);
    through
        .map()
        .await
        .expect("the first answer is the monitor's");
    assert_refused(
        through.map().await,
        "signature check failed for the monitor's answer",
    );

    // With its floor lowered on purpose, a client takes unsigned answers (a cluster in mode
    // none), but never a signature that does not match.
    let lowered = admin_through(&mons, &stripped.addr)
        .with_auth_floor(Some(fastblock_types::auth::AuthMode::None));
    let map = lowered.map().await.unwrap().map.unwrap();
    assert_eq!(map.auth.mode, fastblock_types::auth::AuthMode::None);
    assert_refused(
        admin_through(&mons, &altered.addr)
            .with_auth_floor(Some(fastblock_types::auth::AuthMode::None))
            .map()
            .await,
        "signature check failed",
    );
    // Nothing changed at the monitor.
    assert_eq!(
        direct.map().await.unwrap().map.unwrap().auth.mode,
        fastblock_types::auth::AuthMode::Sign
    );
}

/// `POST /v1/pools` creating `name`, signed as the admin for incarnation `inc`: the bytes an
/// attacker on the path would capture.
fn captured_pool_create(key: &Secret, inc: &str, name: &str) -> Vec<u8> {
    let body = serde_json::to_string(&CreatePoolRequest {
        name: name.into(),
        pg_count: 4,
        size: 1,
        failure_domain: FailureDomain::Osd,
    })
    .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let h = sign_request(
        &EntityName::admin(),
        key,
        "POST",
        "/v1/pools",
        body.as_bytes(),
        now,
        inc,
    )
    .unwrap();
    let mut head = format!(
        "POST /v1/pools HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in h.pairs() {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    format!("{head}\r\n{body}").into_bytes()
}

async fn send(addr: &str, request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    String::from_utf8_lossy(&read_message(&mut s, false).await).to_string()
}

/// [`send`], again while the monitor answers that no monitor leads (retryable, and refused
/// before the call is looked at: a follower that has not yet heard of the new leader after a
/// restart), for up to 30 s.
async fn send_when_led(addr: &str, request: &[u8]) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let answer = send(addr, request).await;
        if !answer.contains("\"no_leader\"") || std::time::Instant::now() > deadline {
            return answer;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn pool_names(client: &MonClient) -> Vec<String> {
    client
        .pools()
        .await
        .unwrap()
        .into_iter()
        .map(|p| p.name)
        .collect()
}

/// A signed call served once, then its pool deleted: replayed after the monitor restarted,
/// or to the monitor that leads after the first one died, it is refused (`stale_incarnation`)
/// and the pool is not created again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_captured_before_a_restart_or_a_leader_change_is_refused_after_it() {
    let mut mons = MonCluster::start(3, MonOptions::default()).await;
    let _osds = [
        FakeOsd::register(&mons, "h0").await,
        FakeOsd::register(&mons, "h1").await,
        FakeOsd::register(&mons, "h2").await,
    ];
    let admin = mons.client();
    let key = admin_key(&mons);
    let leader = mons.wait_leader(Duration::from_secs(30)).await;
    let leader_addr = mons.specs[leader].api.clone();

    // Restart: captured, served, undone; the leader restarts (it leads again or not).
    let captured = captured_pool_create(&key, &mon_incarnation(&leader_addr).await, "p");
    let first = send(&leader_addr, &captured).await;
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    admin.delete_pool("p", true).await.unwrap();
    mons.kill(leader);
    mons.restart(leader);
    mons.wait_leader(Duration::from_secs(60)).await;
    for spec in &mons.specs {
        let again = send_when_led(&spec.api, &captured).await;
        assert!(again.starts_with("HTTP/1.1 401"), "{again}");
        assert!(again.contains("stale_incarnation"), "{again}");
    }
    assert!(!pool_names(&admin).await.contains(&"p".to_string()));

    // Leader change: captured at the leader, which then dies; replayed to the survivors.
    let leader = mons.wait_leader(Duration::from_secs(60)).await;
    let leader_addr = mons.specs[leader].api.clone();
    let captured = captured_pool_create(&key, &mon_incarnation(&leader_addr).await, "q");
    let first = send(&leader_addr, &captured).await;
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    admin.delete_pool("q", true).await.unwrap();
    mons.kill(leader);
    let new_leader = mons.wait_leader(Duration::from_secs(60)).await;
    assert_ne!(new_leader, leader);
    let again = send_when_led(&mons.specs[new_leader].api, &captured).await;
    assert!(again.contains("stale_incarnation"), "{again}");
    assert!(!pool_names(&admin).await.contains(&"q".to_string()));
    // The monitor client signs again for the new leader by itself.
    admin
        .create_pool(&CreatePoolRequest {
            name: "r".into(),
            pg_count: 4,
            size: 1,
            failure_domain: FailureDomain::Osd,
        })
        .await
        .unwrap();
    assert!(pool_names(&admin).await.contains(&"r".to_string()));
    let code = admin.pool("missing").await.unwrap_err().code();
    assert_eq!(code, Some(ErrorCode::PoolNotFound));
}

/// Real OSDs (floor `sign`, the default with a key) under a monitor switched to mode `none`:
/// they refuse its unsigned answers and keep their map, health raises
/// `AUTH_DOWNGRADE_REFUSED` naming them, a keyed client refuses to connect, and the admin
/// sets the mode back with a floor lowered on purpose; health clears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn osds_refuse_a_downgrade_and_health_says_so() {
    let mons = MonCluster::start(1, MonOptions::default()).await;
    let dir = TempDir::new("auth-floor");
    let osds = start_osds(&mons, dir.path(), 3, "256M", 1, Duration::from_secs(60)).await;
    let admin = mons.client();
    let lowered = admin
        .credentials()
        .cloned()
        .map(|(e, k)| MonClient::new(mons.endpoints()).with_credentials(e, k))
        .unwrap()
        .with_auth_floor(Some(fastblock_types::auth::AuthMode::None));
    // The call that lowers the mode is verified and answered signed, in mode sign.
    mons.cli(&["auth", "mode", "none"]).ok();
    let health = wait_until(Duration::from_secs(20), "AUTH_DOWNGRADE_REFUSED", || {
        let lowered = &lowered;
        async move {
            let h = lowered.health().await.ok()?;
            let check = h
                .checks
                .iter()
                .find(|c| c.code == "AUTH_DOWNGRADE_REFUSED")?
                .clone();
            // Every OSD heartbeats once a second: all three named.
            (check.detail.len() == 3).then_some((h.status, check))
        }
    })
    .await;
    assert_eq!(health.0, "HEALTH_ERR");
    for o in &osds {
        assert!(
            health.1.summary.contains(&format!("osd.{}", o.id)),
            "{}",
            health.1.summary
        );
        // Its next heartbeat's answer, unsigned, is refused and logged.
        wait_until(Duration::from_secs(20), "the OSD's refusal", || {
            let refused = o.all_logs().contains("the answer is not signed");
            async move { refused.then_some(()) }
        })
        .await;
    }
    // A keyed client refuses the cluster; the CLI too, unless its floor is lowered.
    let e = fastblock_client::Cluster::connect(mons.client_config())
        .await
        .err()
        .expect("refused");
    assert!(e.to_string().contains("not signed"), "{e}");
    mons.cli(&["health"]).fails_with("the answer is not signed");
    mons.cli(&["--auth-floor", "none", "auth", "mode", "sign"])
        .ok();
    wait_until(Duration::from_secs(20), "health without the check", || {
        let admin = &admin;
        async move {
            let h = admin.health().await.ok()?;
            (!h.checks.iter().any(|c| c.code == "AUTH_DOWNGRADE_REFUSED")).then_some(())
        }
    })
    .await;
}

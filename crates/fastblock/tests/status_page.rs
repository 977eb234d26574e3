//! The monitor's web status page, rendered by a real headless Chromium against a real cluster
//! (etcd, monitor, three OSDs): the page, served by the monitor without a key, shows HEALTH_OK
//! and every OSD up with its space; after one OSD is killed (SIGKILL by PID) and the monitor
//! marks it down, the same page, refreshing itself (never reloaded), shows that OSD down and
//! the `OSD_DOWN` check naming it. What is read is what the page's script rendered into the
//! DOM, through the DevTools protocol (`common::browser`).
//!
//! The page's data call is `GET /v1/status/public`, the one view a browser without a key may
//! read (`docs/mon-api.md`, "Status page"); the test checks the cluster still refuses the
//! signed views and a write without a key.

mod common;

use common::browser::Browser;
use common::{http_get, pool_with_image, start_osds, wait_until, MonCluster, MonOptions, TempDir};
use fastblock_types::OsdId;
use serde_json::Value;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const WAIT: Duration = Duration::from_secs(60);

/// What the page shows, read from the DOM its script built: the health badge, the checks
/// (code and text), and each OSD row's cells as displayed.
const PAGE_STATE_JS: &str = r##"(() => {
  const badge = document.getElementById("health-status");
  if (!badge) return null; // the page is still loading
  const error = document.getElementById("error");
  return JSON.stringify({
    health: badge.textContent,
    checks: [...document.querySelectorAll("#checks > li")].map((li) => ({
      code: li.dataset.code || "", text: li.textContent })),
    osds: [...document.querySelectorAll("#osds tbody tr")].map((tr) =>
      [...tr.cells].map((td) => td.textContent)),
    pgs: [...document.querySelectorAll("#pg-states tbody tr")].map((tr) =>
      [...tr.cells].map((td) => td.textContent)),
    recovery: [...document.querySelectorAll("#recovery-checks > li")].map((li) => li.textContent),
    etcd: document.getElementById("etcd").textContent,
    error: error.hidden ? "" : error.textContent,
  });
})()"##;

#[derive(Debug)]
struct PageState {
    health: String,
    checks: Vec<(String, String)>,
    /// Per row: `osd.N`, `up`/`down`, `in`/`out`, used, total, use.
    osds: Vec<Vec<String>>,
    /// Per row: state, count.
    pgs: Vec<Vec<String>>,
    /// The PG checks the recovery section lists.
    recovery: Vec<String>,
    /// The monitor database paragraph.
    etcd: String,
    error: String,
}

fn page_state(browser: &mut Browser) -> PageState {
    let raw = browser.eval(PAGE_STATE_JS);
    let Some(raw) = raw.as_str() else {
        return PageState {
            health: "(page not loaded yet)".into(),
            checks: Vec::new(),
            osds: Vec::new(),
            pgs: Vec::new(),
            recovery: Vec::new(),
            etcd: String::new(),
            error: String::new(),
        };
    };
    let v: Value = serde_json::from_str(raw).expect("JSON");
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .expect("an array")
            .iter()
            .map(|s| s.as_str().expect("a string").to_string())
            .collect()
    };
    let rows = |v: &Value| -> Vec<Vec<String>> {
        v.as_array().expect("rows").iter().map(strings).collect()
    };
    PageState {
        health: v["health"].as_str().unwrap_or_default().to_string(),
        checks: v["checks"]
            .as_array()
            .expect("checks")
            .iter()
            .map(|c| {
                let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
                (s("code"), s("text"))
            })
            .collect(),
        osds: rows(&v["osds"]),
        pgs: rows(&v["pgs"]),
        recovery: strings(&v["recovery"]),
        etcd: v["etcd"].as_str().unwrap_or_default().to_string(),
        error: v["error"].as_str().unwrap_or_default().to_string(),
    }
}

fn row(page: &PageState, id: OsdId) -> Option<&Vec<String>> {
    let name = format!("osd.{id}");
    page.osds.iter().find(|r| r.first() == Some(&name))
}

/// Polls the page (bounded) until `done` holds, or fails showing the last state seen.
async fn wait_page(
    browser: &mut Browser,
    what: &str,
    mut done: impl FnMut(&PageState) -> bool,
) -> PageState {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let page = page_state(browser);
        if done(&page) {
            return page;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the page did not show {what} within {WAIT:?}; it shows {page:#?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The HTTP status and body of an unsigned request (a browser's, or anyone's without a key).
async fn unsigned(api: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(api).await.expect("connect");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {api}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.expect("send");
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf))
        .await
        .expect("an answer within 10 s")
        .expect("read");
    let text = String::from_utf8_lossy(&buf).to_string();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_page_in_chromium_shows_an_osd_going_down() {
    // First, so that a machine without Chromium fails at once, saying so.
    let mut browser = Browser::launch();
    let mons = MonCluster::start(
        1,
        MonOptions {
            // Down after 2 s; never out during the test, so OSD_DOWN stays raised.
            osd_out_after: "600s",
            ..MonOptions::default()
        },
    )
    .await;
    let dir = TempDir::new("status-page");
    let mut osds = start_osds(&mons, dir.path(), 3, "256M", 1, WAIT).await;
    let client = mons.client();
    pool_with_image(&client, ("rbd", 8, 3), ("vm", 64 << 20, 4 << 20)).await;
    let api = mons.specs[0].api.clone();

    // Without a key: the page and its view answer; the signed views and writes do not.
    let page = http_get(&format!("http://{api}/")).await.expect("GET /");
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(page.contains("<script src=\"/status.js\""), "{page}");
    assert!(
        page.to_ascii_lowercase()
            .contains("content-security-policy: default-src 'none'; script-src 'self';"),
        "{page}"
    );
    let (code, body) = unsigned(&api, "GET", "/v1/status/public", "").await;
    assert_eq!(code, 200, "{body}");
    let view: Value = serde_json::from_str(&body).expect("the public view is JSON");
    assert_eq!(view["osds"].as_array().map(Vec::len), Some(3), "{view}");
    for secret in ["api_addr", "address", "host", "key", "\"rbd\"", "\"vm\""] {
        assert!(
            !body.contains(secret),
            "the public view carries {secret}: {body}"
        );
    }
    for path in ["/v1/status", "/v1/osds", "/v1/map", "/v1/pools"] {
        let (code, body) = unsigned(&api, "GET", path, "").await;
        assert_eq!(code, 401, "unsigned GET {path}: {body}");
        assert!(body.contains("auth_required"), "{body}");
    }
    let (code, body) = unsigned(&api, "POST", "/v1/osds/0/out", "").await;
    assert_eq!(code, 401, "unsigned out: {body}");
    // Only its GET is open: any other method needs an admin's signature (and is then 405).
    let (code, body) = unsigned(&api, "POST", "/v1/status/public", "{}").await;
    assert_eq!(code, 401, "unsigned POST of the public view: {body}");

    browser.open(&format!("http://{api}/"));
    let ids: Vec<OsdId> = osds.iter().map(|o| o.id).collect();
    let before = wait_page(
        &mut browser,
        "HEALTH_OK, every OSD up and in, etcd compacted",
        |p| {
            p.health == "HEALTH_OK"
                && ids.iter().all(|id| {
                    row(p, *id).is_some_and(|r| r[1] == "up" && r[2] == "in" && r[5].ends_with('%'))
                })
                && p.etcd.contains("compacted to revision")
        },
    )
    .await;
    // The monitor database: the member's file against the default quota, one member.
    assert!(
        before.etcd.contains("of the 2.0 GiB quota") && before.etcd.contains("1 etcd member"),
        "{before:#?}"
    );
    assert!(before.error.is_empty(), "{before:#?}");
    assert_eq!(before.pgs, vec![vec!["active", "8"]], "{before:#?}");
    assert!(before.recovery.is_empty(), "{before:#?}");
    assert!(
        before.checks.iter().all(|(code, _)| code.is_empty()),
        "{before:#?}"
    );

    let victim = osds[1].id;
    osds[1].kill();
    wait_until(WAIT, "the monitor to mark the killed OSD down", || async {
        let list = client.osds().await.ok()?;
        list.iter().any(|o| o.id == victim && !o.up).then_some(())
    })
    .await;
    let after = wait_page(&mut browser, "the killed OSD down and OSD_DOWN", |p| {
        row(p, victim).is_some_and(|r| r[1] == "down" && r[3] == "-")
            && p.checks.iter().any(|(code, text)| {
                code == "OSD_DOWN" && text.contains(&format!("osd.{victim} (host h1) is down"))
            })
    })
    .await;
    eprintln!("the page before the kill: {before:#?}\nafter: {after:#?}");
    assert_eq!(after.health, "HEALTH_WARN", "{after:#?}");
    for id in ids.iter().filter(|id| **id != victim) {
        let r = row(&after, *id).expect("a row per OSD");
        assert_eq!(r[1], "up", "{after:#?}");
    }
    assert!(after.error.is_empty(), "{after:#?}");
    // Every PG lost a replica, and the recovery section names the check that says so.
    assert_eq!(after.pgs, vec![vec!["undersize", "8"]], "{after:#?}");
    assert!(
        after
            .recovery
            .iter()
            .any(|c| c.starts_with("PG_DEGRADED: 8 pgs undersize")),
        "{after:#?}"
    );
    drop(browser);
}

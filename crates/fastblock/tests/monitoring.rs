//! The monitoring files shipped in `deploy/` against a running cluster (etcd, a monitor, three
//! OSDs and an NBD server, all real processes, every daemon on its default metrics address):
//! every metric name the Grafana dashboard's and the alert rules' PromQL expressions use must
//! be exported by some daemon's `/metrics`. Also: the defaults (OSD: the port after its
//! shards' data ports; NBD: its port + 1) serve, and the new counters count the IO done here.
//!
//! The names are read out of PromQL by a small scanner (string literals, label matchers,
//! range selectors, function names, `by (...)` lists and keywords are not metric names). A
//! name is exported when a sample or a `# TYPE` line declares it, with the suffixes the
//! exposition gives its type (`_total` for a counter, `_bucket`, `_sum`, `_count` for a
//! histogram), so a family with no series yet (no health check raised) still counts.

mod common;

use common::{
    free_ports, http_get, start_osds, wait_all_active, wait_until, MonCluster, MonOptions, Proc,
    TempDir,
};
use fastblock_nbd::consts::*;
use fastblock_nbd::testing::{accepts, pattern, RawClient};
use fastblock_types::api::{CreateImageRequest, CreatePoolRequest};
use fastblock_types::map::FailureDomain;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// Names Prometheus makes itself for every target, which no daemon exports.
const PROMETHEUS_NAMES: &[&str] = &["up"];

/// PromQL words that look like names but are not metrics.
const KEYWORDS: &[&str] = &[
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "atan2",
    "inf",
    "nan",
];

/// Keywords followed by a parenthesised list of label names.
const LABEL_LIST_KEYWORDS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// The index just past the bracket that closes the one at `open` (`(`/`)`, `{`/`}`,
/// `[`/`]`), skipping string literals inside.
fn skip_group(chars: &[char], open: usize) -> usize {
    let (o, c) = (chars[open], closing(chars[open]));
    let mut depth = 0;
    let mut i = open;
    while i < chars.len() {
        match chars[i] {
            '"' | '\'' | '`' => i = skip_string(chars, i) - 1,
            x if x == o => depth += 1,
            x if x == c => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    panic!("unbalanced {o} in {}", chars.iter().collect::<String>());
}

fn closing(open: char) -> char {
    match open {
        '(' => ')',
        '{' => '}',
        '[' => ']',
        _ => unreachable!("not a bracket: {open}"),
    }
}

/// The index just past the string literal starting at `start`.
fn skip_string(chars: &[char], start: usize) -> usize {
    let quote = chars[start];
    let mut i = start + 1;
    while i < chars.len() {
        if chars[i] == '\\' && quote != '`' {
            i += 2;
            continue;
        }
        if chars[i] == quote {
            return i + 1;
        }
        i += 1;
    }
    panic!(
        "unterminated string in {}",
        chars.iter().collect::<String>()
    );
}

/// The metric names a PromQL expression selects.
fn promql_metric_names(expr: &str) -> BTreeSet<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' || c == '`' {
            i = skip_string(&chars, i);
        } else if c == '{' || c == '[' {
            // Label matchers and range selectors or subqueries: no metric names inside.
            i = skip_group(&chars, i);
        } else if c.is_ascii_digit() || c == '$' {
            // A number or a duration (`1h`, `0.80`, `1e3`), or a Grafana variable.
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || "._$".contains(chars[i]))
            {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || "_:".contains(chars[i])) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut next = i;
            while next < chars.len() && chars[next].is_whitespace() {
                next += 1;
            }
            // `sum by (le) (...)`: an aggregation with its grouping before its argument.
            let rest: String = chars[next..].iter().take(8).collect();
            let grouped = ["by", "without"].iter().any(|k| {
                rest.strip_prefix(k)
                    .and_then(|r| r.chars().next())
                    .is_some_and(|c| c == '(' || c.is_whitespace())
            });
            let called = chars.get(next) == Some(&'(') || grouped;
            let lower = word.to_ascii_lowercase();
            if LABEL_LIST_KEYWORDS.contains(&lower.as_str()) && called {
                i = skip_group(&chars, next);
            } else if !called && !KEYWORDS.contains(&lower.as_str()) {
                names.insert(word);
            }
            // A name followed by `(` is a function.
        } else {
            i += 1;
        }
    }
    names
}

/// Every name a text exposition declares or samples, with its type's suffixes.
fn exposition_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut words = rest.split_whitespace();
            let (Some(name), Some(kind)) = (words.next(), words.next()) else {
                panic!("bad TYPE line: {line}");
            };
            let suffixes: &[&str] = match kind {
                "counter" => &["_total", "_created"],
                "histogram" => &["_bucket", "_sum", "_count", "_created"],
                "summary" => &["", "_sum", "_count", "_created"],
                _ => &[""],
            };
            names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            names.insert(line[..end].to_string());
        }
    }
    names
}

fn deploy_file(path: &str) -> (PathBuf, String) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy")
        .join(path);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    (path, text)
}

/// Every `"expr"` string of the dashboard's JSON, wherever it is nested.
fn dashboard_exprs(json: &serde_json::Value, out: &mut Vec<String>) {
    match json {
        serde_json::Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("expr", serde_json::Value::String(expr)) => out.push(expr.clone()),
                    _ => dashboard_exprs(value, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| dashboard_exprs(v, out)),
        _ => {}
    }
}

/// Every `expr:` of the alert rules (the file keeps each on one line, as its header says).
fn rule_exprs(yaml: &str) -> Vec<String> {
    let mut exprs = Vec::new();
    for line in yaml.lines() {
        let Some(expr) = line.trim_start().strip_prefix("expr:") else {
            continue;
        };
        let expr = expr.trim();
        assert!(
            !expr.starts_with('|') && !expr.starts_with('>') && !expr.is_empty(),
            "keep alert expressions on one line (the test reads them so): {line}"
        );
        let unquoted = expr
            .strip_prefix('\'')
            .and_then(|e| e.strip_suffix('\''))
            .unwrap_or(expr);
        exprs.push(unquoted.to_string());
    }
    exprs
}

/// The names used by the dashboard and the rules, each with the expressions that use it.
fn used_names() -> Vec<(String, String)> {
    let (path, text) = deploy_file("grafana/fastblock.json");
    let json: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
    let mut exprs = Vec::new();
    dashboard_exprs(&json, &mut exprs);
    assert!(
        exprs.len() >= 20,
        "only {} dashboard expressions",
        exprs.len()
    );
    let (_, rules) = deploy_file("prometheus/alerts.yml");
    let rules = rule_exprs(&rules);
    assert!(rules.len() >= 8, "only {} alert expressions", rules.len());
    let mut used = Vec::new();
    for expr in exprs.iter().chain(&rules) {
        let names = promql_metric_names(expr);
        assert!(!names.is_empty(), "no metric name found in {expr}");
        used.extend(names.into_iter().map(|n| (n, expr.clone())));
    }
    used
}

#[test]
fn promql_names_skip_functions_labels_ranges_and_strings() {
    let names = |e: &str| promql_metric_names(e).into_iter().collect::<Vec<_>>();
    assert_eq!(
        names(
            "histogram_quantile(0.99, sum by (stage, le) \
             (rate(fastblock_osd_stage_latency_us_bucket{stage=\"op_write\"}[$__rate_interval])))"
        ),
        ["fastblock_osd_stage_latency_us_bucket"]
    );
    assert_eq!(
        names("max(fastblock_mon_is_leader) < 1 or absent(fastblock_mon_is_leader)"),
        ["fastblock_mon_is_leader"]
    );
    assert_eq!(
        names("a_total / on (instance) group_left (host) b offset 5m > 0.8e1"),
        ["a_total", "b"]
    );
    assert_eq!(names("up{job=~\"fastblock.*\"} == 0"), ["up"]);
    assert_eq!(
        names("sum without(shard) (x{code='a}b'})"),
        ["x"],
        "a brace inside a label value"
    );
}

#[test]
fn exposition_names_carry_their_types_suffixes() {
    let text = "# TYPE a counter\na_total 1\n# TYPE h histogram\n# TYPE g gauge\n\
                g{x=\"1\"} 2\nbare 3\n# EOF\n";
    let names = exposition_names(text);
    for n in ["a_total", "h_bucket", "h_sum", "h_count", "g", "bare"] {
        assert!(names.contains(n), "{n} missing from {names:?}");
    }
    assert!(!names.contains("a"), "a counter's samples are a_total");
}

/// Body of an HTTP GET (the harness's raw client returns headers too).
async fn scrape(addr: &str) -> String {
    let url = format!("http://{addr}/metrics");
    let response = http_get(&url)
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    assert!(
        response.starts_with("HTTP/1.1 200"),
        "GET {url}: {response}"
    );
    let (_, body) = response.split_once("\r\n\r\n").expect("headers end");
    assert!(body.ends_with("# EOF\n"), "GET {url}: no # EOF: {body}");
    body.to_string()
}

/// The value of the sample `line_prefix` (name and labels) in `text`, if present.
fn sample(text: &str, line_prefix: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(line_prefix))
        .and_then(|rest| rest.trim().parse().ok())
}

/// The sum of every sample of `name` whose labels contain `label` (e.g. `op="write"`).
fn sum_of(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_and_alert_metrics_are_exported_by_a_running_cluster() {
    let used = used_names();
    let mons = MonCluster::start(1, MonOptions::default()).await;
    let dir = TempDir::new("monitoring");
    let osds = start_osds(&mons, dir.path(), 3, "512M", 1, Duration::from_secs(30)).await;
    let client = mons.client();
    client
        .create_pool(&CreatePoolRequest {
            name: "fb3".into(),
            pg_count: 8,
            size: 3,
            failure_domain: FailureDomain::Osd,
        })
        .await
        .unwrap();
    wait_all_active(&client, Duration::from_secs(30)).await;
    client
        .create_image(&CreateImageRequest {
            pool: "fb3".into(),
            name: "img".into(),
            size_bytes: 16 << 20,
            object_size_bytes: Some(4 << 20),
        })
        .await
        .unwrap();

    // The NBD server with no --metrics-addr: metrics on its port + 1.
    let port = free_ports(2);
    let nbd_addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let nbd_metrics = format!("127.0.0.1:{}", port + 1);
    let mut cmd = Command::new(common::bin("fastblock-nbd"));
    cmd.arg("serve")
        .args(["--mon", &mons.endpoints().join(",")])
        .args(["--bind", &nbd_addr.to_string()])
        .env("FASTBLOCK_KEYRING", mons.nbd_keyring(dir.path(), "pool=*"))
        .env("RUST_LOG", "info");
    let _nbd = Proc::spawn("fastblock-nbd", cmd, dir.path().join("nbd.log"));
    wait_until(Duration::from_secs(20), "the NBD server", || async {
        accepts(nbd_addr).await.then_some(())
    })
    .await;

    // Some IO through NBD, so that the per-export and per-OSD counters have something.
    let mut c = RawClient::connect(nbd_addr).await;
    c.go("fb3/img").await.unwrap();
    let data = pattern(8192, 7);
    c.request(0, CMD_WRITE, 1, 4096, data.len() as u32, &data)
        .await;
    assert_eq!(c.simple_reply().await, (0, 1));
    c.request(0, CMD_READ, 2, 4096, data.len() as u32, &[])
        .await;
    assert_eq!(c.simple_reply().await, (0, 2));
    assert_eq!(c.read(data.len()).await, data);

    // Every daemon, each on its default metrics address.
    let mut texts = vec![("mon".to_string(), scrape(&mons.endpoints()[0]).await)];
    for osd in &osds {
        texts.push((format!("osd.{}", osd.id), scrape(&osd.metrics_addr()).await));
    }
    let nbd_text = scrape(&nbd_metrics).await;
    texts.push(("nbd".to_string(), nbd_text.clone()));

    let mut exported = BTreeSet::new();
    for (_, text) in &texts {
        exported.extend(exposition_names(text));
    }
    let missing: Vec<String> = used
        .iter()
        .filter(|(name, _)| !exported.contains(name) && !PROMETHEUS_NAMES.contains(&name.as_str()))
        .map(|(name, expr)| format!("{name} (in: {expr})"))
        .collect();
    assert!(
        missing.is_empty(),
        "metrics used in deploy/ but exported by no daemon:\n{}\nexported: {exported:?}",
        missing.join("\n")
    );
    // Each daemon's metrics are among those used (a scrape of the wrong port would not be).
    for prefix in ["fastblock_mon_", "fastblock_osd_", "fastblock_nbd_"] {
        assert!(
            used.iter().any(|(n, _)| n.starts_with(prefix)),
            "nothing of {prefix} is used"
        );
    }

    // The counters counted this test's IO: the NBD server per export, the OSDs at the PG's
    // leader (one write and one read of one object).
    let export = "export=\"fb3/img\"";
    assert_eq!(
        sample(
            &nbd_text,
            &format!("fastblock_nbd_ops_total{{{export},op=\"write\"}}")
        ),
        Some(1.0),
        "{nbd_text}"
    );
    assert_eq!(
        sample(
            &nbd_text,
            &format!("fastblock_nbd_bytes_total{{{export},op=\"read\"}}")
        ),
        Some(8192.0),
        "{nbd_text}"
    );
    let osd_texts: Vec<&String> = texts
        .iter()
        .filter(|(who, _)| who.starts_with("osd."))
        .map(|(_, t)| t)
        .collect();
    let osd_sum =
        |name: &str, label: &str| -> f64 { osd_texts.iter().map(|t| sum_of(t, name, label)).sum() };
    assert_eq!(osd_sum("fastblock_osd_ops_total", "op=\"write\""), 1.0);
    assert_eq!(osd_sum("fastblock_osd_bytes_total", "op=\"write\""), 8192.0);
    assert_eq!(osd_sum("fastblock_osd_bytes_total", "op=\"read\""), 8192.0);
    // Every PG has one leader; the gauges are refreshed once a tick (50 ms here).
    wait_until(Duration::from_secs(10), "8 PGs led in all", || async {
        let mut led = 0.0;
        for osd in &osds {
            led += sum_of(
                &scrape(&osd.metrics_addr()).await,
                "fastblock_osd_pgs_led",
                "",
            );
        }
        (led == 8.0).then_some(())
    })
    .await;

    // What the OSD-down and health alerts read: a killed OSD shows as in and down, with
    // OSD_DOWN raised, on the monitor's /metrics.
    let mut osds = osds;
    let victim = osds[2].id;
    osds[2].kill();
    let mon = mons.endpoints()[0].clone();
    let down = format!("fastblock_mon_osd_up{{osd=\"{victim}\",host=\"h2\"}} 0");
    let in_ = format!("fastblock_mon_osd_in{{osd=\"{victim}\",host=\"h2\"}} 1");
    wait_until(Duration::from_secs(30), "OSD_DOWN on /metrics", || async {
        let text = scrape(&mon).await;
        let raised =
            text.contains("fastblock_mon_health_check{code=\"OSD_DOWN\",severity=\"warn\"} 1");
        (raised && text.contains(&down) && text.contains(&in_) && !text.contains("health_status 0"))
            .then_some(())
    })
    .await;
}

//! Plain HTTP GETs of the monitor's unsigned pages (`/v1/mon`, `/metrics`), which the signed
//! `MonClient` does not cover, and the etcd gauges read from `/metrics`.

use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Largest page read: `/metrics` carries one series per OSD, some 100 KB at 1,000 OSDs.
const PAGE_BYTES_MAX: u64 = 16 << 20;

/// The body of `GET url` (`http://host:port/path`); HTTP/1.0, so that the answer is not chunked
/// and the server closes the connection after it.
pub async fn http_get(url: &str) -> std::io::Result<String> {
    let rest = url.strip_prefix("http://").unwrap_or(url);
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut s = tokio::net::TcpStream::connect(host).await?;
    s.write_all(format!("GET /{path} HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())
        .await?;
    let mut buf = Vec::new();
    s.take(PAGE_BYTES_MAX).read_to_end(&mut buf).await?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    Ok(match text.split_once("\r\n\r\n") {
        Some((_, body)) => body.to_string(),
        None => text,
    })
}

/// The monitor's view of its etcd member (`fastblock_mon_etcd_*` in `/metrics`).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct EtcdGauges {
    pub db_size_bytes: Option<u64>,
    pub db_size_in_use_bytes: Option<u64>,
    pub revision: Option<u64>,
    pub compacted_revision: Option<u64>,
    /// Bytes put by the largest etcd transaction the monitor made since it started
    /// (`fastblock_mon_etcd_txn_bytes_max`).
    pub txn_bytes_max: Option<u64>,
}

/// The monitor's `/metrics` page (`None`: not read within 5 s). Read once at a scenario's start
/// and once at its end, outside the CPU figures: rendering it costs the monitor some 60 ms at
/// 131,072 PGs (its health checks walk every PG), which in a scenario of one second read
/// once per figure was a tenth of the monitor's CPU in it.
pub async fn metrics_page(api: &str) -> Option<String> {
    tokio::time::timeout(
        std::time::Duration::from_secs(5),
        http_get(&format!("http://{api}/metrics")),
    )
    .await
    .ok()?
    .ok()
}

/// The etcd gauges of a `/metrics` page (each `None` when absent or the page was not read).
pub fn etcd_gauges(page: Option<&str>) -> EtcdGauges {
    page.map(parse_etcd_gauges).unwrap_or_default()
}

fn parse_etcd_gauges(text: &str) -> EtcdGauges {
    let value = |name: &str| {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .find_map(|l| {
                let (key, v) = l.rsplit_once(' ')?;
                let key = key.split('{').next()?;
                let named = key == name || key.ends_with(&format!("_{name}"));
                named.then(|| v.trim().parse::<f64>().ok()).flatten()
            })
            .map(|v| v as u64)
    };
    EtcdGauges {
        db_size_bytes: value("etcd_db_size_bytes"),
        db_size_in_use_bytes: value("etcd_db_size_in_use_bytes"),
        revision: value("etcd_revision"),
        compacted_revision: value("etcd_compacted_revision"),
        txn_bytes_max: value("etcd_txn_bytes_max"),
    }
}

/// One of the monitor's histograms (the map answers woken by an epoch,
/// `fastblock_mon_map_wait_answer_seconds`; its decisions, `fastblock_mon_decide_seconds`):
/// cumulative counts by upper bound in seconds, `+Inf` last.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Buckets {
    pub buckets: Vec<(f64, u64)>,
}

impl Buckets {
    /// The events counted since `before` (the same histogram read earlier); a monitor
    /// restarted in between starts from zero, and its counts are taken whole.
    pub fn since(&self, before: &Buckets) -> Buckets {
        let restarted = self.total() < before.total()
            || self.buckets.len() != before.buckets.len()
            || self
                .buckets
                .iter()
                .zip(&before.buckets)
                .any(|(a, b)| a.1 < b.1);
        if restarted {
            return self.clone();
        }
        Buckets {
            buckets: self
                .buckets
                .iter()
                .zip(&before.buckets)
                .map(|((le, n), (_, m))| (*le, n - m))
                .collect(),
        }
    }

    pub fn total(&self) -> u64 {
        self.buckets.last().map_or(0, |b| b.1)
    }

    /// The least bound, in milliseconds, under which a share `q` (0 to 1) of the events fell
    /// (`None`: none counted; infinite: above the last bound).
    pub fn quantile_ms(&self, q: f64) -> Option<f64> {
        let total = self.total();
        if total == 0 {
            return None;
        }
        let need = (q * total as f64).ceil().max(1.0) as u64;
        self.buckets
            .iter()
            .find(|(_, n)| *n >= need)
            .map(|(le, _)| le * 1e3)
    }
}

/// The map answers' histogram.
pub const MAP_ANSWERS: &str = "fastblock_mon_map_wait_answer_seconds";
/// The decisions' histogram.
pub const DECISIONS: &str = "fastblock_mon_decide_seconds";

/// The histogram `name` of a `/metrics` page (`None`: absent, or the page was not read).
pub fn histogram(page: Option<&str>, name: &str) -> Option<Buckets> {
    parse_histogram(page?, name)
}

fn parse_histogram(text: &str, name: &str) -> Option<Buckets> {
    let prefix = format!("{name}_bucket{{le=\"");
    let mut buckets = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(prefix.as_str()) else {
            continue;
        };
        let (le, count) = rest.split_once("\"} ")?;
        let le = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse().ok()?
        };
        buckets.push((le, count.trim().parse().ok()?));
    }
    (!buckets.is_empty()).then_some(Buckets { buckets })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answer_times_are_read_and_taken_between_two_reads() {
        let page = |a: u64, b: u64, c: u64| {
            format!(
                "# TYPE fastblock_mon_map_wait_answer_seconds histogram\n\
                 fastblock_mon_map_wait_answer_seconds_sum 1.0\n\
                 fastblock_mon_map_wait_answer_seconds_count {c}\n\
                 fastblock_mon_map_wait_answer_seconds_bucket{{le=\"0.001\"}} {a}\n\
                 fastblock_mon_map_wait_answer_seconds_bucket{{le=\"0.0015\"}} {b}\n\
                 fastblock_mon_map_wait_answer_seconds_bucket{{le=\"+Inf\"}} {c}\n"
            )
        };
        let before = parse_histogram(&page(10, 10, 10), MAP_ANSWERS).expect("read");
        let after = parse_histogram(&page(10, 109, 110), MAP_ANSWERS).expect("read");
        let d = after.since(&before);
        assert_eq!(d.total(), 100);
        // 99 answers within 1.5 ms, the last above every bound.
        assert_eq!(d.quantile_ms(0.99), Some(1.5));
        assert_eq!(d.quantile_ms(1.0), Some(f64::INFINITY));
        // A restarted monitor's counts are taken whole.
        let restarted = parse_histogram(&page(3, 3, 3), MAP_ANSWERS).expect("read");
        assert_eq!(restarted.since(&after).quantile_ms(1.0), Some(1.0));
        assert_eq!(Buckets::default().quantile_ms(0.5), None);
        assert_eq!(
            parse_histogram("fastblock_mon_epoch 3\n", MAP_ANSWERS),
            None
        );
        assert_eq!(
            parse_histogram(&page(1, 1, 1), DECISIONS),
            None,
            "another histogram"
        );
    }

    #[test]
    fn gauges_are_read_by_suffix_and_not_confused_with_longer_names() {
        let text = "# HELP x\nfastblock_mon_etcd_db_size_bytes 4096\n\
                    fastblock_mon_etcd_db_size_in_use_bytes 1024\n\
                    fastblock_mon_etcd_revision 77\n\
                    fastblock_mon_etcd_txn_bytes_max 1000\n";
        let g = parse_etcd_gauges(text);
        assert_eq!(g.db_size_bytes, Some(4096));
        assert_eq!(g.db_size_in_use_bytes, Some(1024));
        assert_eq!(g.revision, Some(77));
        assert_eq!(g.compacted_revision, None);
        assert_eq!(g.txn_bytes_max, Some(1000));
    }
}

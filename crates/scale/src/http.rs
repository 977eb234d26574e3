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

/// Reads the etcd gauges from the monitor's `/metrics` (each `None` when absent or not read).
pub async fn etcd_gauges(api: &str) -> EtcdGauges {
    let Ok(Ok(text)) = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        http_get(&format!("http://{api}/metrics")),
    )
    .await
    else {
        return EtcdGauges::default();
    };
    parse_etcd_gauges(&text)
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

#[cfg(test)]
mod tests {
    use super::*;

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

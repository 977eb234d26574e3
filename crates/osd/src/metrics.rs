//! The OSD's Prometheus endpoint: `GET /metrics`, by default on the port after its last shard's
//! data port ([`MetricsAddr`]), in the OpenMetrics text format. What it exports is listed in `docs/metrics.md`; the per-stage
//! histograms are in [`crate::stages`] (timed by the shard core, recorded by each shard's
//! runtime).
//!
//! The server runs on the control runtime, never on a shard thread: a scrape reads the
//! shards' histograms (each behind an uncontended lock) and does not disturb their loops.

use crate::stages::OsdMetrics;
use anyhow::{Context, Result};
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::task::JoinHandle;

/// Where an OSD serves `/metrics` (`--metrics-addr`).
///
/// Why the default is derived from the data port: several OSDs often share a host, so no
/// fixed port suits them all, and an ephemeral port would leave Prometheus nothing to scrape
/// without a discovery service. An OSD already owns `--port` .. `--port + shards - 1`; the
/// next port is the one its operator (and a test harness handing out port ranges) can predict.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MetricsAddr {
    /// The OSD's `--address`, port `--port + shards`.
    #[default]
    AfterDataPorts,
    /// No metrics server (`--metrics-addr none`).
    Off,
    /// This address.
    At(SocketAddr),
}

impl MetricsAddr {
    /// The address to bind, if any, for an OSD reached at `address` whose shard 0 listens on
    /// `port` and which has `shards` shards.
    pub fn resolve(self, address: &str, port: u16, shards: u32) -> Result<Option<SocketAddr>> {
        match self {
            MetricsAddr::Off => Ok(None),
            MetricsAddr::At(addr) => Ok(Some(addr)),
            MetricsAddr::AfterDataPorts => {
                let metrics_port = u16::try_from(u32::from(port) + shards).ok().context(
                    "the default metrics port (--port + shards) is above 65535: \
                     give --metrics-addr ADDR:PORT or --metrics-addr none",
                )?;
                let addr = std::net::ToSocketAddrs::to_socket_addrs(&(address, metrics_port))
                    .with_context(|| format!("resolving {address} for the metrics server"))?
                    .next()
                    .with_context(|| format!("{address} resolves to no address"))?;
                Ok(Some(addr))
            }
        }
    }
}

/// The registry every OSD metric lives in, and the families the shards record into.
pub struct Metrics {
    registry: Registry,
    pub osd: OsdMetrics,
    /// 1 while the OSD skips device flushes (`crate::no_flush`), else 0.
    pub wal_flush_skipped: Gauge,
    /// The map epoch the OSD follows (`crate::control::follow_map`).
    pub map_epoch: Gauge,
    /// Map updates taken: whole maps (first contact, or too far behind) and deltas.
    pub map_full: Counter,
    pub map_deltas: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("fastblock_osd");
        let osd = OsdMetrics::register(&mut registry);
        let wal_flush_skipped = Gauge::default();
        registry.register(
            "wal_flush_skipped",
            "1: --wal-sync no-flush-benchmark-only, measurement only, writes are acknowledged \
             before they are durable and a power loss loses them; 0: flushes as usual",
            wal_flush_skipped.clone(),
        );
        let map_epoch = Gauge::default();
        registry.register(
            "map_epoch",
            "The cluster map epoch this OSD has",
            map_epoch.clone(),
        );
        let map_full = Counter::default();
        registry.register(
            "map_full",
            "Whole cluster maps taken from the monitor: at start, and when the monitor no \
             longer had the changes since the epoch held",
            map_full.clone(),
        );
        let map_deltas = Counter::default();
        registry.register(
            "map_deltas",
            "Incremental maps (the changes since the epoch held) taken from the monitor",
            map_deltas.clone(),
        );
        Metrics {
            registry,
            osd,
            wal_flush_skipped,
            map_epoch,
            map_full,
            map_deltas,
        }
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        encode(&mut text, &self.registry).expect("encoding metrics into a String");
        text
    }
}

/// Binds `addr` and serves `/metrics` until the runtime stops. Returns the bound address
/// (useful with port 0) and the server's task, which the control task watches: it never ends
/// while the OSD runs (axum retries failed accepts), so its end stops the OSD. A bind
/// failure is an error at startup, not later.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
) -> Result<(SocketAddr, JoinHandle<std::io::Result<()>>)> {
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| {
        format!(
            "binding the metrics address {addr} (choose another with --metrics-addr \
                 ADDR:PORT, or none)"
        )
    })?;
    let bound = listener.local_addr()?;
    let app = Router::new().route(
        "/metrics",
        get(move || {
            let metrics = metrics.clone();
            async move {
                (
                    [(
                        header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    metrics.render(),
                )
                    .into_response()
            }
        }),
    );
    let task = tokio::spawn(async move { axum::serve(listener, app).await });
    tracing::info!(%bound, "serving /metrics");
    Ok((bound, task))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_metrics_port_follows_the_data_ports() {
        let at = |s: &str| s.parse::<SocketAddr>().unwrap();
        let default = MetricsAddr::AfterDataPorts;
        assert_eq!(
            default.resolve("127.0.0.1", 6800, 1).unwrap(),
            Some(at("127.0.0.1:6801"))
        );
        assert_eq!(
            default.resolve("10.0.0.7", 6810, 4).unwrap(),
            Some(at("10.0.0.7:6814"))
        );
        assert_eq!(
            MetricsAddr::Off.resolve("127.0.0.1", 6800, 1).unwrap(),
            None
        );
        let given = MetricsAddr::At(at("127.0.0.1:9100"));
        assert_eq!(
            given.resolve("127.0.0.1", 6800, 1).unwrap(),
            Some(at("127.0.0.1:9100"))
        );
        let err = default.resolve("127.0.0.1", 65535, 1).unwrap_err();
        assert!(format!("{err:#}").contains("--metrics-addr"), "{err:#}");
    }
}

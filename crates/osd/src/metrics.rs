//! The OSD's Prometheus endpoint: `GET /metrics` on `--metrics-addr` (off unless given), in
//! the OpenMetrics text format. What it exports is listed in `docs/metrics.md`; the per-stage
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
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::task::JoinHandle;

/// The registry every OSD metric lives in, and the families the shards record into.
pub struct Metrics {
    registry: Registry,
    pub osd: OsdMetrics,
    /// 1 while the OSD skips device flushes (`crate::no_flush`), else 0.
    pub wal_flush_skipped: Gauge,
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
        Metrics {
            registry,
            osd,
            wal_flush_skipped,
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
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the metrics address {addr}"))?;
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

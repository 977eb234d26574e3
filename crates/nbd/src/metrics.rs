//! Per-export IO metrics of the server (`docs/metrics.md`, "NBD server"): [`Metered`] wraps
//! any [`Exports`] so that every export it opens counts its operations, bytes, errors and
//! latency under the export's name; [`NbdMetrics::render`] adds the client library's retry
//! counters, which are the process's (its exports share one cluster connection), and encodes
//! the text exposition that [`serve`] answers `GET /metrics` with.
//!
//! Counting wraps the export instead of living in `execute`, so the protocol code stays
//! unaware of metrics and a test server on in-memory exports can be metered the same way.

use crate::backend::{Export, ExportError, Exports, IoError};
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;
use tokio::task::JoinHandle;

/// The operations counted, as the `op` label says them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Read,
    Write,
    Flush,
    Trim,
    WriteZeroes,
    BlockStatus,
}

impl Op {
    const ALL: [Op; 6] = [
        Op::Read,
        Op::Write,
        Op::Flush,
        Op::Trim,
        Op::WriteZeroes,
        Op::BlockStatus,
    ];

    fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Flush => "flush",
            Op::Trim => "trim",
            Op::WriteZeroes => "write_zeroes",
            Op::BlockStatus => "block_status",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabels {
    export: String,
    op: &'static str,
}

/// The client library's counters of the whole process, in the order of [`client_counts`].
const CLIENT_COUNTERS: [(&str, &str); 4] = [
    (
        "client_object_requests",
        "Object requests the server's cluster client sent to OSDs (all exports)",
    ),
    (
        "client_retries",
        "Object requests retried after a retryable failure (all exports)",
    ),
    (
        "client_redirects",
        "Object requests sent again to another PG leader (all exports)",
    ),
    (
        "client_timeouts",
        "Object requests that failed at their deadline (all exports)",
    ),
];

fn client_counts(s: &fastblock_client::ClientStats) -> [u64; 4] {
    [s.object_requests, s.retries, s.redirects, s.timeouts]
}

/// The registry of the NBD server's metrics (prefix `fastblock_nbd`).
pub struct NbdMetrics {
    registry: Registry,
    ops: Family<OpLabels, Counter>,
    errors: Family<OpLabels, Counter>,
    bytes: Family<OpLabels, Counter>,
    latency: Family<OpLabels, Histogram>,
    client: [Counter; 4],
    /// Held while the client's counts are copied into `client`: two scrapes at once would
    /// otherwise both add the same difference.
    client_sync: std::sync::Mutex<()>,
}

impl Default for NbdMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl NbdMetrics {
    pub fn new() -> NbdMetrics {
        let mut registry = Registry::with_prefix("fastblock_nbd");
        let m = NbdMetrics {
            registry: Registry::default(),
            ops: Family::default(),
            errors: Family::default(),
            bytes: Family::default(),
            // 50 µs to 6.5 s: from a cached read on loopback to a request stuck in retries.
            client_sync: std::sync::Mutex::new(()),
            latency: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.000_05, 2.0, 18))
            }),
            client: Default::default(),
        };
        registry.register("ops", "Requests served per export", m.ops.clone());
        registry.register(
            "errors",
            "Requests answered with an error per export",
            m.errors.clone(),
        );
        registry.register(
            "bytes",
            "Bytes read and written per export (data moved, not trimmed or zeroed ranges)",
            m.bytes.clone(),
        );
        registry.register(
            "op_latency_seconds",
            "Time from a request's execution start to its reply being ready, per export",
            m.latency.clone(),
        );
        for (counter, (name, help)) in m.client.iter().zip(CLIENT_COUNTERS) {
            registry.register(name, help, counter.clone());
        }
        NbdMetrics { registry, ..m }
    }

    /// The text exposition; `client`: the cluster client's counters now, if there is one.
    pub fn render(&self, client: Option<fastblock_client::ClientStats>) -> String {
        if let Some(stats) = client {
            let _copying = self
                .client_sync
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            // The client counts since it connected, as these counters do.
            for (counter, now) in self.client.iter().zip(client_counts(&stats)) {
                let delta = now.saturating_sub(counter.get());
                if delta > 0 {
                    counter.inc_by(delta);
                }
            }
        }
        let mut text = String::new();
        encode(&mut text, &self.registry).expect("encoding metrics into a String");
        text
    }

    fn export(&self, name: &str) -> ExportMeters {
        let meters = |op: Op| {
            let labels = OpLabels {
                export: name.to_string(),
                op: op.name(),
            };
            OpMeters {
                ops: self.ops.get_or_create(&labels).clone(),
                errors: self.errors.get_or_create(&labels).clone(),
                latency: self.latency.get_or_create(&labels).clone(),
                // Only reads and writes move data; the others keep a counter that stays 0.
                bytes: self.bytes.get_or_create(&labels).clone(),
            }
        };
        ExportMeters {
            ops: Op::ALL.map(meters),
        }
    }
}

#[derive(Clone, Debug)]
struct OpMeters {
    ops: Counter,
    errors: Counter,
    latency: Histogram,
    bytes: Counter,
}

/// One export's handles, in the order of [`Op::ALL`].
#[derive(Clone, Debug)]
struct ExportMeters {
    ops: [OpMeters; 6],
}

impl ExportMeters {
    /// Runs `io`, counting it as `op` with `bytes` moved if it succeeds.
    async fn measure<T>(
        &self,
        op: Op,
        bytes: impl FnOnce(&T) -> u64,
        io: impl Future<Output = Result<T, IoError>>,
    ) -> Result<T, IoError> {
        let m = &self.ops[op as usize];
        let started = Instant::now();
        let result = io.await;
        m.latency.observe(started.elapsed().as_secs_f64());
        m.ops.inc();
        match &result {
            Ok(value) => {
                m.bytes.inc_by(bytes(value));
            }
            Err(_) => {
                m.errors.inc();
            }
        }
        result
    }
}

/// Exports whose every export is metered under its name.
pub struct Metered<E> {
    inner: E,
    metrics: Arc<NbdMetrics>,
}

impl<E> Metered<E> {
    pub fn new(inner: E, metrics: Arc<NbdMetrics>) -> Self {
        Metered { inner, metrics }
    }

    pub fn inner(&self) -> &E {
        &self.inner
    }
}

/// An export that counts what it serves.
#[derive(Clone)]
pub struct MeteredExport<X> {
    inner: X,
    meters: Arc<ExportMeters>,
}

impl<E: Exports> Exports for Metered<E> {
    type Export = MeteredExport<E::Export>;

    async fn list(&self) -> Result<Vec<String>, ExportError> {
        self.inner.list().await
    }

    async fn open(&self, name: &str) -> Result<Self::Export, ExportError> {
        let inner = self.inner.open(name).await?;
        Ok(MeteredExport {
            inner,
            meters: Arc::new(self.metrics.export(name)),
        })
    }
}

impl<X: Export> Export for MeteredExport<X> {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn read_only(&self) -> bool {
        self.inner.read_only()
    }

    fn description(&self) -> String {
        self.inner.description()
    }

    async fn read(&self, offset: u64, len: u32) -> Result<Bytes, IoError> {
        let io = self.inner.read(offset, len);
        self.meters
            .measure(Op::Read, |d: &Bytes| d.len() as u64, io)
            .await
    }

    async fn write(&self, offset: u64, data: Bytes) -> Result<(), IoError> {
        let len = data.len() as u64;
        let io = self.inner.write(offset, data);
        self.meters.measure(Op::Write, |_| len, io).await
    }

    async fn discard(&self, offset: u64, len: u64) -> Result<(), IoError> {
        let io = self.inner.discard(offset, len);
        self.meters.measure(Op::Trim, |_| 0, io).await
    }

    async fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), IoError> {
        let io = self.inner.write_zeroes(offset, len);
        self.meters.measure(Op::WriteZeroes, |_| 0, io).await
    }

    async fn flush(&self) -> Result<(), IoError> {
        let io = self.inner.flush();
        self.meters.measure(Op::Flush, |_| 0, io).await
    }

    async fn allocated_ranges(&self, offset: u64, len: u64) -> Result<Vec<(u64, u64)>, IoError> {
        let io = self.inner.allocated_ranges(offset, len);
        self.meters.measure(Op::BlockStatus, |_| 0, io).await
    }
}

/// Where `serve` answers `/metrics` when `--metrics-addr` is not given: the TCP listener's
/// address, the next port (10810 beside the default 10809); 127.0.0.1:10810 without a TCP
/// listener. Derived rather than fixed, so that servers on different NBD ports of one host
/// do not collide; a listener on port 0 gets metrics on port 0 too (any free port, logged).
pub fn default_addr(tcp: Option<SocketAddr>) -> Result<SocketAddr, String> {
    let Some(tcp) = tcp else {
        return Ok(SocketAddr::from((
            [127, 0, 0, 1],
            crate::server::DEFAULT_PORT + 1,
        )));
    };
    if tcp.port() == 0 {
        return Ok(tcp);
    }
    let port = tcp.port().checked_add(1).ok_or_else(|| {
        "the default metrics port (the NBD port + 1) is above 65535: give \
         --metrics-addr ADDR:PORT or --metrics-addr none"
            .to_string()
    })?;
    Ok(SocketAddr::new(tcp.ip(), port))
}

/// Binds `addr` and serves `GET /metrics` with what `render` returns, until the runtime
/// stops. Returns the bound address (for port 0) and the server's task. A bind failure is an
/// error at startup.
pub async fn serve(
    addr: SocketAddr,
    render: impl Fn() -> String + Clone + Send + Sync + 'static,
) -> std::io::Result<(SocketAddr, JoinHandle<std::io::Result<()>>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = Router::new().route(
        "/metrics",
        get(move || {
            let text = render();
            async move {
                (
                    [(
                        header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    text,
                )
                    .into_response()
            }
        }),
    );
    let task = tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((bound, task))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_address_is_the_port_after_the_nbd_port() {
        let at = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert_eq!(
            default_addr(Some(at("10.0.0.5:10809"))),
            Ok(at("10.0.0.5:10810"))
        );
        assert_eq!(default_addr(None), Ok(at("127.0.0.1:10810")));
        assert_eq!(default_addr(Some(at("127.0.0.1:0"))), Ok(at("127.0.0.1:0")));
        let err = default_addr(Some(at("127.0.0.1:65535"))).unwrap_err();
        assert!(err.contains("--metrics-addr"), "{err}");
    }
    use crate::memory::{MemoryExport, MemoryExports};

    #[tokio::test]
    async fn an_export_counts_ops_bytes_errors_and_latency_under_its_name() {
        let metrics = Arc::new(NbdMetrics::new());
        let exports = Metered::new(
            MemoryExports::new().with(MemoryExport::new("disk", 1 << 20)),
            metrics.clone(),
        );
        let disk = exports.open("disk").await.unwrap();
        disk.write(0, Bytes::from(vec![7u8; 8192])).await.unwrap();
        assert_eq!(disk.read(4096, 4096).await.unwrap().len(), 4096);
        // Beyond the end: an error, counted as one.
        assert!(disk.read(1 << 20, 4096).await.is_err());
        let text = metrics.render(None);
        for line in [
            "# TYPE fastblock_nbd_ops counter",
            "fastblock_nbd_ops_total{export=\"disk\",op=\"write\"} 1",
            "fastblock_nbd_ops_total{export=\"disk\",op=\"read\"} 2",
            "fastblock_nbd_errors_total{export=\"disk\",op=\"read\"} 1",
            "fastblock_nbd_bytes_total{export=\"disk\",op=\"write\"} 8192",
            "fastblock_nbd_bytes_total{export=\"disk\",op=\"read\"} 4096",
            "fastblock_nbd_op_latency_seconds_count{export=\"disk\",op=\"read\"} 2",
            "fastblock_nbd_ops_total{export=\"disk\",op=\"flush\"} 0",
            "fastblock_nbd_client_retries_total 0",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }
}

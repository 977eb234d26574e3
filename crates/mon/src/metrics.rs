//! Prometheus `/metrics`: cluster gauges computed from the state at scrape time, plus API
//! request latency.

use fastblock_mon_core::health::pg_state_counts;
use fastblock_mon_core::MonState;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiLabels {
    pub method: String,
    pub route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub state: String,
}

pub struct Metrics {
    registry: Registry,
    pub api_latency_seconds: Family<ApiLabels, Histogram>,
    is_leader: Gauge,
    epoch: Gauge<u64, AtomicU64>,
    osds: Gauge,
    osds_up: Gauge,
    osds_in: Gauge,
    pools: Gauge,
    images: Gauge,
    pgs: Family<StateLabels, Gauge>,
    client_read_bytes: Gauge<f64, AtomicU64>,
    client_write_bytes: Gauge<f64, AtomicU64>,
    client_read_iops: Gauge<f64, AtomicU64>,
    client_write_iops: Gauge<f64, AtomicU64>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("fastblock_mon");
        let api_latency_seconds = Family::<ApiLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0001, 2.0, 18))
        });
        registry.register(
            "api_latency_seconds",
            "Monitor API request latency",
            api_latency_seconds.clone(),
        );
        let m = Metrics {
            registry,
            api_latency_seconds,
            is_leader: Gauge::default(),
            epoch: Gauge::default(),
            osds: Gauge::default(),
            osds_up: Gauge::default(),
            osds_in: Gauge::default(),
            pools: Gauge::default(),
            images: Gauge::default(),
            pgs: Family::default(),
            client_read_bytes: Gauge::default(),
            client_write_bytes: Gauge::default(),
            client_read_iops: Gauge::default(),
            client_write_iops: Gauge::default(),
        };
        let mut m = m;
        let r = &mut m.registry;
        r.register("is_leader", "1 if this monitor leads", m.is_leader.clone());
        r.register("epoch", "Cluster map epoch", m.epoch.clone());
        r.register("osds", "OSDs known", m.osds.clone());
        r.register("osds_up", "OSDs up", m.osds_up.clone());
        r.register("osds_in", "OSDs in", m.osds_in.clone());
        r.register("pools", "Pools", m.pools.clone());
        r.register("images", "Images", m.images.clone());
        r.register("pgs", "PGs per state", m.pgs.clone());
        r.register(
            "cli_read_bytes",
            "Client read bytes per second",
            m.client_read_bytes.clone(),
        );
        r.register(
            "cli_write_bytes",
            "Client write bytes per second",
            m.client_write_bytes.clone(),
        );
        r.register(
            "cli_read_iops",
            "Client read ops per second",
            m.client_read_iops.clone(),
        );
        r.register(
            "cli_write_iops",
            "Client write ops per second",
            m.client_write_iops.clone(),
        );
        m
    }

    /// Refreshes the gauges from the leader's state (or zeroes leadership on a follower) and
    /// renders the text exposition.
    pub fn render(&self, state: Option<(&MonState, fastblock_types::api::IoRates)>) -> String {
        self.is_leader.set(i64::from(state.is_some()));
        if let Some((state, io)) = state {
            let osds = state.map.osds.values();
            self.epoch.set(state.map.epoch.0);
            self.osds.set(state.map.osds.len() as i64);
            self.osds_up
                .set(osds.clone().filter(|o| o.up).count() as i64);
            self.osds_in.set(osds.filter(|o| o.is_in).count() as i64);
            self.pools.set(state.map.pools.len() as i64);
            self.images.set(state.images.len() as i64);
            self.pgs.clear();
            for (name, count) in pg_state_counts(state) {
                self.pgs
                    .get_or_create(&StateLabels { state: name })
                    .set(i64::from(count));
            }
            self.client_read_bytes.set(io.read_bytes_per_sec);
            self.client_write_bytes.set(io.write_bytes_per_sec);
            self.client_read_iops.set(io.read_ops_per_sec);
            self.client_write_iops.set(io.write_ops_per_sec);
        }
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

//! Prometheus `/metrics`: cluster gauges computed from the state at scrape time (the map, the
//! health checks, the OSDs' last space and recovery reports), plus API request latency.
//!
//! Client IO is not here: each OSD counts the ops and bytes it served as a PG leader
//! (`fastblock_osd_ops_total`, `fastblock_osd_bytes_total`), and Prometheus sums and rates
//! them. Rates the monitor derived from heartbeats would only be a coarser copy.

use fastblock_mon_core::health::{pg_state_counts, Health};
use fastblock_mon_core::MonState;
use fastblock_types::api::{OsdSpace, RecoveryStatus, Severity};
use fastblock_types::etcd::EtcdStatus;
use fastblock_types::OsdId;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CheckLabels {
    pub code: String,
    pub severity: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MemberLabels {
    pub member: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AlarmLabels {
    pub member: String,
    pub alarm: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OsdLabels {
    pub osd: u32,
    pub host: String,
}

/// What a scrape of the leader shows, read under the leader's state.
pub struct Scrape<'a> {
    pub state: &'a MonState,
    /// The health checks, as `health` answers them.
    pub health: Health,
    /// The last space report of each OSD that is up.
    pub spaces: BTreeMap<OsdId, OsdSpace>,
    pub recovery: RecoveryStatus,
}

impl Scrape<'_> {
    /// Renders `metrics` with this scrape (under the state's read lock: it borrows the state).
    pub fn render_with(self, metrics: &Metrics) -> String {
        metrics.render(Some(self))
    }
}

/// `HEALTH_OK` 0, `HEALTH_WARN` 1, `HEALTH_ERR` 2 (an alert compares a number).
fn status_value(status: &str) -> i64 {
    match status {
        "HEALTH_OK" => 0,
        "HEALTH_WARN" => 1,
        _ => 2,
    }
}

fn severity_name(s: Severity) -> &'static str {
    match s {
        Severity::Warn => "warn",
        Severity::Err => "err",
    }
}

pub struct Metrics {
    /// What every monitor exports: leadership and its own API latency.
    registry: Registry,
    /// The cluster's gauges, exported by the leader only: a follower (or a monitor that led
    /// before) would otherwise show the values of when it last led, and an alert on them
    /// would fire from a stale copy.
    cluster: Registry,
    pub api_latency_seconds: Family<ApiLabels, Histogram>,
    /// Map long-polls woken by a new epoch: from its publication to the answer leaving the
    /// handlers (`crate::http`'s `time_map_answer`).
    pub map_wait_answer_seconds: Histogram,
    is_leader: Gauge,
    epoch: Gauge<u64, AtomicU64>,
    osds: Gauge,
    osds_up: Gauge,
    osds_in: Gauge,
    pools: Gauge,
    images: Gauge,
    pgs: Family<StateLabels, Gauge>,
    health_status: Gauge,
    health_checks: Family<CheckLabels, Gauge>,
    osd_up: Family<OsdLabels, Gauge>,
    osd_in: Family<OsdLabels, Gauge>,
    osd_total_bytes: Family<OsdLabels, Gauge<u64, AtomicU64>>,
    osd_used_bytes: Family<OsdLabels, Gauge<u64, AtomicU64>>,
    recovering_pgs: Gauge,
    recovery_remaining_bytes: Gauge<u64, AtomicU64>,
    recovery_remaining_objects: Gauge<u64, AtomicU64>,
    etcd: EtcdGauges,
}

/// What this monitor sees of etcd (`crate::etcd_maint`), exported by every monitor: the sizes
/// of the members it looks at (a follower: its own; the leader: all), the quota, revisions,
/// alarms and the upkeep's counts.
#[derive(Default)]
struct EtcdGauges {
    db_size_bytes: Family<MemberLabels, Gauge<u64, AtomicU64>>,
    db_size_in_use_bytes: Family<MemberLabels, Gauge<u64, AtomicU64>>,
    quota_bytes: Gauge<u64, AtomicU64>,
    revision: Gauge<u64, AtomicU64>,
    compacted_revision: Gauge<u64, AtomicU64>,
    last_compaction_timestamp_seconds: Gauge<f64, AtomicU64>,
    alarm: Family<AlarmLabels, Gauge>,
    compactions: Counter,
    defrags: Counter,
    commit_transactions: Counter,
    txn_bytes_max: Gauge<u64, AtomicU64>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Exports the monitor's decision times (`Monitor::decide_seconds`).
    pub fn register_decide_seconds(&mut self, decide_seconds: Histogram) {
        self.registry.register(
            "decide_seconds",
            "Seconds each monitor operation took to decide (placement included)",
            decide_seconds,
        );
    }

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
        // 1 ms to 7.5 s in steps of 1.5x: fine enough that the largest answer time of an
        // event (`fastblock-scale`'s `mon ms`) is known within half again.
        let map_wait_answer_seconds = Histogram::new(exponential_buckets(0.001, 1.5, 23));
        registry.register(
            "map_wait_answer_seconds",
            "Map long-polls woken by a new epoch: seconds from its publication to the answer sent",
            map_wait_answer_seconds.clone(),
        );
        let m = Metrics {
            registry,
            map_wait_answer_seconds,
            cluster: Registry::with_prefix("fastblock_mon"),
            api_latency_seconds,
            is_leader: Gauge::default(),
            epoch: Gauge::default(),
            osds: Gauge::default(),
            osds_up: Gauge::default(),
            osds_in: Gauge::default(),
            pools: Gauge::default(),
            images: Gauge::default(),
            pgs: Family::default(),
            health_status: Gauge::default(),
            health_checks: Family::default(),
            osd_up: Family::default(),
            osd_in: Family::default(),
            osd_total_bytes: Family::default(),
            osd_used_bytes: Family::default(),
            recovering_pgs: Gauge::default(),
            recovery_remaining_bytes: Gauge::default(),
            recovery_remaining_objects: Gauge::default(),
            etcd: EtcdGauges::default(),
        };
        let mut m = m;
        m.registry
            .register("is_leader", "1 if this monitor leads", m.is_leader.clone());
        let (r, e) = (&mut m.registry, &m.etcd);
        r.register(
            "etcd_db_size_bytes",
            "Size of the etcd member's database file (what its quota is checked against)",
            e.db_size_bytes.clone(),
        );
        r.register(
            "etcd_db_size_in_use_bytes",
            "Bytes of the etcd member's database file holding data",
            e.db_size_in_use_bytes.clone(),
        );
        r.register(
            "etcd_quota_bytes",
            "etcd's space quota (--etcd-quota-bytes)",
            e.quota_bytes.clone(),
        );
        r.register("etcd_revision", "etcd's store revision", e.revision.clone());
        r.register(
            "etcd_compacted_revision",
            "Revision the leader last compacted etcd's history to (0: none yet)",
            e.compacted_revision.clone(),
        );
        r.register(
            "etcd_last_compaction_timestamp_seconds",
            "When the leader last compacted etcd's history (Unix time; 0: not yet)",
            e.last_compaction_timestamp_seconds.clone(),
        );
        r.register(
            "etcd_alarm",
            "1 for each alarm etcd has raised (NOSPACE, CORRUPT), by member",
            e.alarm.clone(),
        );
        r.register(
            "etcd_compactions",
            "Compactions of etcd's history this monitor made",
            e.compactions.clone(),
        );
        r.register(
            "etcd_defrags",
            "Defragmentations of etcd members this monitor made",
            e.defrags.clone(),
        );
        r.register(
            "etcd_commit_transactions",
            "etcd transactions this monitor's commits made (a commit too large for one makes \
             several)",
            e.commit_transactions.clone(),
        );
        r.register(
            "etcd_txn_bytes_max",
            "Bytes of keys and values put by the largest etcd transaction this monitor made",
            e.txn_bytes_max.clone(),
        );
        let r = &mut m.cluster;
        r.register("epoch", "Cluster map epoch", m.epoch.clone());
        r.register("osds", "OSDs known", m.osds.clone());
        r.register("osds_up", "OSDs up", m.osds_up.clone());
        r.register("osds_in", "OSDs in", m.osds_in.clone());
        r.register("pools", "Pools", m.pools.clone());
        r.register("images", "Images", m.images.clone());
        r.register("pgs", "PGs per state", m.pgs.clone());
        r.register(
            "health_status",
            "Cluster health: 0 HEALTH_OK, 1 HEALTH_WARN, 2 HEALTH_ERR",
            m.health_status.clone(),
        );
        r.register(
            "health_check",
            "1 for each health check raised now, by code (docs/mon-api.md)",
            m.health_checks.clone(),
        );
        r.register("osd_up", "1 if the OSD is up, else 0", m.osd_up.clone());
        r.register("osd_in", "1 if the OSD is in, else 0", m.osd_in.clone());
        r.register(
            "osd_total_bytes",
            "Data space of the OSD (its last heartbeat, while up)",
            m.osd_total_bytes.clone(),
        );
        r.register(
            "osd_used_bytes",
            "Data space in use on the OSD (its last heartbeat, while up)",
            m.osd_used_bytes.clone(),
        );
        r.register(
            "recovering_pgs",
            "PGs whose leader is copying a snapshot to a member",
            m.recovering_pgs.clone(),
        );
        r.register(
            "recovery_remaining_bytes",
            "Bytes recovery still has to copy",
            m.recovery_remaining_bytes.clone(),
        );
        r.register(
            "recovery_remaining_objects",
            "Objects recovery still has to copy",
            m.recovery_remaining_objects.clone(),
        );
        m
    }

    /// Sets the etcd gauges from what the upkeep last saw, and its counts so far.
    pub fn set_etcd(&self, etcd: &EtcdStatus, counts: &crate::etcd_maint::UpkeepCounts) {
        let e = &self.etcd;
        e.db_size_bytes.clear();
        e.db_size_in_use_bytes.clear();
        for m in etcd.members.iter().filter(|m| m.error.is_none()) {
            let labels = MemberLabels {
                member: m.name.clone(),
            };
            e.db_size_bytes.get_or_create(&labels).set(m.db_size_bytes);
            e.db_size_in_use_bytes
                .get_or_create(&labels)
                .set(m.db_size_in_use_bytes);
        }
        e.quota_bytes.set(etcd.quota_bytes);
        e.revision.set(etcd.revision);
        e.compacted_revision
            .set(etcd.compacted_revision.unwrap_or(0));
        e.last_compaction_timestamp_seconds
            .set(etcd.last_compaction_unix_ms.unwrap_or(0) as f64 / 1000.0);
        e.alarm.clear();
        for a in &etcd.alarms {
            let labels = AlarmLabels {
                member: a.member.clone(),
                alarm: a.alarm.clone(),
            };
            e.alarm.get_or_create(&labels).set(1);
        }
        // Counters only rise: add what the upkeep counted since the last scrape.
        let add = |c: &Counter, total: u64| {
            c.inc_by(total.saturating_sub(c.get()));
        };
        add(&e.compactions, counts.compactions);
        add(&e.defrags, counts.defrags);
        add(&e.commit_transactions, counts.commit_transactions);
        e.txn_bytes_max.set(counts.txn_bytes_max);
    }

    /// Refreshes the gauges from the leader's state (or zeroes leadership on a follower) and
    /// renders the text exposition.
    pub fn render(&self, scrape: Option<Scrape<'_>>) -> String {
        use prometheus_client::encoding::text::{encode_eof, encode_registry};
        self.is_leader.set(i64::from(scrape.is_some()));
        let mut out = String::new();
        // Writing to a String cannot fail.
        if let Some(scrape) = scrape {
            self.refresh(scrape);
            encode_registry(&mut out, &self.cluster).expect("writing to a String");
        }
        encode_registry(&mut out, &self.registry).expect("writing to a String");
        encode_eof(&mut out).expect("writing to a String");
        out
    }

    fn refresh(&self, scrape: Scrape<'_>) {
        let state = scrape.state;
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
        self.health_status.set(status_value(scrape.health.status));
        // Cleared first: a check that cleared must vanish, not stay at its last value.
        self.health_checks.clear();
        for c in &scrape.health.checks {
            let labels = CheckLabels {
                code: c.code.clone(),
                severity: severity_name(c.severity),
            };
            self.health_checks.get_or_create(&labels).set(1);
        }
        for family in [&self.osd_up, &self.osd_in] {
            family.clear();
        }
        self.osd_total_bytes.clear();
        self.osd_used_bytes.clear();
        for o in state.map.osds.values() {
            let labels = OsdLabels {
                osd: o.id.0,
                host: o.host.clone(),
            };
            self.osd_up.get_or_create(&labels).set(i64::from(o.up));
            self.osd_in.get_or_create(&labels).set(i64::from(o.is_in));
            if let Some(space) = scrape.spaces.get(&o.id) {
                self.osd_total_bytes
                    .get_or_create(&labels)
                    .set(space.total_bytes);
                self.osd_used_bytes
                    .get_or_create(&labels)
                    .set(space.total_bytes.saturating_sub(space.free_bytes));
            }
        }
        self.recovering_pgs
            .set(i64::from(scrape.recovery.recovering_pgs));
        self.recovery_remaining_bytes
            .set(scrape.recovery.remaining_bytes);
        self.recovery_remaining_objects
            .set(scrape.recovery.remaining_objects);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fastblock_types::api::HealthCheck;

    fn scrape(state: &MonState) -> Scrape<'_> {
        Scrape {
            state,
            health: Health {
                status: "HEALTH_WARN",
                checks: vec![HealthCheck {
                    code: "OSD_NEARFULL".into(),
                    severity: Severity::Warn,
                    summary: "1 nearfull osd".into(),
                    detail: Vec::new(),
                }],
            },
            spaces: BTreeMap::new(),
            recovery: RecoveryStatus::default(),
        }
    }

    #[test]
    fn the_leader_exports_health_checks_and_a_follower_no_cluster_gauges() {
        let m = Metrics::new();
        let state = MonState::default();
        let text = m.render(Some(scrape(&state)));
        for line in [
            "fastblock_mon_is_leader 1",
            "fastblock_mon_health_status 1",
            "fastblock_mon_health_check{code=\"OSD_NEARFULL\",severity=\"warn\"} 1",
            "# TYPE fastblock_mon_osd_up gauge",
            "# TYPE fastblock_mon_api_latency_seconds histogram",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        assert_eq!(text.matches("# EOF").count(), 1, "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
        // After losing the lead: no stale copy of the checks.
        let text = m.render(None);
        assert!(text.contains("fastblock_mon_is_leader 0"), "{text}");
        assert!(!text.contains("health_check"), "{text}");
        assert!(!text.contains("fastblock_mon_pgs"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}

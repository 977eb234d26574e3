//! Per-stage latency of the IO path, so that a slow stage shows on `/metrics` without a
//! profiler (Curve's per-stage metrics are the model).
//!
//! A client write on the leader passes these stages; each is a histogram in microseconds,
//! labelled by shard:
//!
//! | stage | from | to | per |
//! |---|---|---|---|
//! | `queue` | the request's bytes were read from the socket | proposed to its PG (write) or read index asked (read) | op |
//! | `wal_commit` | the shard's group commit is submitted | the shard hears its WAL write durable | commit |
//! | `replication` | proposed | committed on a majority: the shard starts applying it | write |
//! | `apply` | an apply batch starts | the batch is in the object store (staged) | batch |
//! | `read_index` | read index asked | the lease confirmed it and everything before it is applied | read |
//! | `read` | the object-store read of one op starts | it returned | read |
//! | `reply` | a connection's first unsent reply was queued | all its queued bytes were handed to the socket | flush |
//! | `op_write`, `op_read` | the request's bytes were read | its reply was queued | op |
//! | `raft_queue` | a peer's Raft batch was read | it was stepped into its PGs | batch |
//! | `flush` | the periodic flush starts | applied data and metadata are durable, logs compacted | flush |
//!
//! `replication` includes the leader's own WAL commit, which runs in parallel with the
//! followers' (the appends leave before it), so for a 3-replica write it is
//! max(own commit, network + follower commit + network) plus loop time. `wal_commit_ops`
//! counts log entries per group commit (how much batching there is).
//!
//! Who measures what: the shard core (`fastblock_shard`) times every stage but `reply` on
//! the shard's clock and returns the timings with each step's effects; the runtime
//! (`crate::shard::runtime`) records them here, and measures `reply` (it owns the sockets)
//! and counts loop iterations itself. Observing costs one uncontended lock per stage; the
//! shard thread is the only writer of its histograms, and a scrape only reads them.
//!
//! The store's block-cache counters (hits, misses, evictions) and the shard's IO totals
//! (`fastblock_shard::totals`: client ops and bytes, recovery bytes sent) are copied from the
//! shard after every loop iteration, the PGs it hosts and leads at every tick.

use fastblock_store::BlockCacheStats;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::time::Duration;

/// Bucket bounds in microseconds: 1-2-5 steps from 5 µs to 2 s.
pub const LATENCY_BUCKETS_US: [f64; 18] = [
    5.0,
    10.0,
    20.0,
    50.0,
    100.0,
    200.0,
    500.0,
    1_000.0,
    2_000.0,
    5_000.0,
    10_000.0,
    20_000.0,
    50_000.0,
    100_000.0,
    200_000.0,
    500_000.0,
    1_000_000.0,
    2_000_000.0,
];
/// Bucket bounds of the log entries per group commit.
pub const BATCH_BUCKETS: [f64; 10] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 1024.0];

/// Names and help of the block-cache counters, in the order of [`block_cache_counts`].
const BLOCK_CACHE_COUNTERS: [(&str, &str); 3] = [
    (
        "store_block_cache_hits",
        "Block-map lookups answered by the store's in-memory cache",
    ),
    (
        "store_block_cache_misses",
        "Block-map lookups that went to the store's metadata database",
    ),
    (
        "store_block_cache_evictions",
        "Entries evicted from the store's block cache",
    ),
];

fn block_cache_counts(s: &BlockCacheStats) -> [u64; 3] {
    [s.hits, s.misses, s.evictions]
}

/// Bad block copies and their repairs (`docs/design/repair.md`), per shard since it started.
const INTEGRITY_COUNTERS: [(&str, &str); 7] = [
    (
        "bad_block_checksum_errors",
        "Data blocks read back whose content did not match their checksum",
    ),
    (
        "bad_block_read_errors",
        "Data blocks the device failed to read",
    ),
    (
        "block_versions_repaired",
        "Block versions rewritten here from a good replica",
    ),
    (
        "repairs_started",
        "Repairs of bad block copies this shard led",
    ),
    ("repairs_done", "Repairs this shard led that were applied"),
    (
        "repairs_failed",
        "Repairs this shard led that found no good copy",
    ),
    (
        "bad_blocks_reported",
        "Bad block copies this shard reported to their PG's leader",
    ),
];

/// The counts behind [`INTEGRITY_COUNTERS`], in its order.
pub fn integrity_counts(
    damage: &fastblock_store::DamageCounts,
    repairs: &fastblock_shard::RepairCounts,
) -> [u64; 7] {
    [
        damage.checksum_errors,
        damage.read_errors,
        damage.versions_repaired,
        repairs.started,
        repairs.repaired,
        repairs.failed,
        repairs.reported,
    ]
}

/// The client operations counted by `ops_total` and `bytes_total`.
const IO_OPS: [&str; 2] = ["read", "write"];

/// The stages of [the module doc](self), timed by the shard core.
pub use fastblock_shard::Stage;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabels {
    pub shard: u32,
    pub stage: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShardLabels {
    pub shard: u32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    pub shard: u32,
    pub op: &'static str,
}

/// Client IO, recovery and PG leadership: counters that only grow (rates are Prometheus's to
/// take), and the PGs held now as gauges.
struct IoFamilies {
    ops: Family<OpLabels, Counter>,
    bytes: Family<OpLabels, Counter>,
    recovery_sent_bytes: Family<ShardLabels, Counter>,
    pgs: Family<ShardLabels, Gauge>,
    pgs_led: Family<ShardLabels, Gauge>,
}

impl IoFamilies {
    fn register(registry: &mut Registry) -> IoFamilies {
        let f = IoFamilies {
            ops: Family::default(),
            bytes: Family::default(),
            recovery_sent_bytes: Family::default(),
            pgs: Family::default(),
            pgs_led: Family::default(),
        };
        registry.register(
            "ops",
            "Client operations served (read: answered with data; write: applied)",
            f.ops.clone(),
        );
        registry.register("bytes", "Bytes of the client operations", f.bytes.clone());
        registry.register(
            "recovery_sent_bytes",
            "Bytes of PG snapshots sent to recovering members",
            f.recovery_sent_bytes.clone(),
        );
        registry.register("pgs", "PGs this shard holds a replica of", f.pgs.clone());
        registry.register("pgs_led", "PGs this shard leads", f.pgs_led.clone());
        f
    }

    fn shard(&self, shard: u32) -> ShardIo {
        let labels = ShardLabels { shard };
        let op = |family: &Family<OpLabels, Counter>| {
            IO_OPS.map(|op| family.get_or_create(&OpLabels { shard, op }).clone())
        };
        ShardIo {
            ops: op(&self.ops),
            bytes: op(&self.bytes),
            recovery_sent_bytes: self.recovery_sent_bytes.get_or_create(&labels).clone(),
            pgs: self.pgs.get_or_create(&labels).clone(),
            pgs_led: self.pgs_led.get_or_create(&labels).clone(),
        }
    }
}

/// One shard's handles of [`IoFamilies`].
#[derive(Clone, Debug, Default)]
struct ShardIo {
    /// In the order of [`IO_OPS`].
    ops: [Counter; 2],
    bytes: [Counter; 2],
    recovery_sent_bytes: Counter,
    pgs: Gauge,
    pgs_led: Gauge,
}

/// The OSD's metric families; every shard takes its handles from here.
pub struct OsdMetrics {
    stage_us: Family<StageLabels, Histogram>,
    wal_commit_ops: Family<ShardLabels, Histogram>,
    loop_iterations: Family<ShardLabels, Counter>,
    block_cache: [Family<ShardLabels, Counter>; 3],
    integrity: [Family<ShardLabels, Counter>; 7],
    io: IoFamilies,
}

impl OsdMetrics {
    /// The families, registered in `registry` (which should carry the `fastblock_osd` prefix).
    pub fn register(registry: &mut Registry) -> OsdMetrics {
        let stage_us = Family::<StageLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(LATENCY_BUCKETS_US)
        });
        let wal_commit_ops = Family::<ShardLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(BATCH_BUCKETS)
        });
        let loop_iterations = Family::<ShardLabels, Counter>::default();
        registry.register(
            "stage_latency_us",
            "Latency of each IO stage in microseconds (see docs/metrics.md)",
            stage_us.clone(),
        );
        registry.register(
            "wal_commit_ops",
            "Log entries per WAL group commit",
            wal_commit_ops.clone(),
        );
        registry.register(
            "loop_iterations",
            "Shard loop iterations",
            loop_iterations.clone(),
        );
        let block_cache: [Family<ShardLabels, Counter>; 3] = Default::default();
        for (family, (name, help)) in block_cache.iter().zip(BLOCK_CACHE_COUNTERS) {
            registry.register(name, help, family.clone());
        }
        let integrity: [Family<ShardLabels, Counter>; 7] = Default::default();
        for (family, (name, help)) in integrity.iter().zip(INTEGRITY_COUNTERS) {
            registry.register(name, help, family.clone());
        }
        let io = IoFamilies::register(registry);
        OsdMetrics {
            stage_us,
            wal_commit_ops,
            loop_iterations,
            block_cache,
            integrity,
            io,
        }
    }

    /// The handles of one shard (created on first use, so an idle shard still shows zeros).
    pub fn shard(&self, shard: u32) -> ShardStages {
        let stage = |s: Stage| {
            self.stage_us
                .get_or_create(&StageLabels {
                    shard,
                    stage: s.name(),
                })
                .clone()
        };
        let labels = ShardLabels { shard };
        ShardStages {
            histograms: Stage::ALL.map(stage),
            wal_commit_ops: self.wal_commit_ops.get_or_create(&labels).clone(),
            loop_iterations: self.loop_iterations.get_or_create(&labels).clone(),
            block_cache: self
                .block_cache
                .each_ref()
                .map(|f| f.get_or_create(&labels).clone()),
            integrity: self
                .integrity
                .each_ref()
                .map(|f| f.get_or_create(&labels).clone()),
            io: self.io.shard(shard),
        }
    }
}

/// One shard's handles. Without an [`OsdMetrics`] (tests, tools) they record into histograms
/// nobody reads.
#[derive(Clone, Debug)]
pub struct ShardStages {
    histograms: [Histogram; Stage::ALL.len()],
    wal_commit_ops: Histogram,
    loop_iterations: Counter,
    block_cache: [Counter; 3],
    integrity: [Counter; 7],
    io: ShardIo,
}

impl Default for ShardStages {
    fn default() -> Self {
        ShardStages {
            histograms: Stage::ALL.map(|_| Histogram::new(LATENCY_BUCKETS_US)),
            wal_commit_ops: Histogram::new(BATCH_BUCKETS),
            loop_iterations: Counter::default(),
            block_cache: Default::default(),
            integrity: Default::default(),
            io: ShardIo::default(),
        }
    }
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

impl ShardStages {
    pub fn observe(&self, stage: Stage, took: Duration) {
        // `ALL` lists the stages in declaration order (checked by a test).
        self.histograms[stage as usize].observe(micros(took));
    }

    /// Counts the log entries of one WAL group commit (its time is the `wal_commit` stage,
    /// observed with the other stages).
    pub fn wal_commit(&self, entries: usize) {
        self.wal_commit_ops.observe(entries as f64);
    }

    pub fn iteration(&self) {
        self.loop_iterations.inc();
    }

    /// Brings the block-cache counters up to the store's counts. The store counts since it
    /// opened, and a shard opens its store once, so each counter only adds the difference.
    pub fn store_block_cache(&self, stats: &BlockCacheStats) {
        catch_up(&self.block_cache, block_cache_counts(stats));
    }

    /// Brings the bad-block and repair counters up to the shard's counts ([`integrity_counts`]),
    /// which count since the shard started, as the block cache's do.
    pub fn integrity(&self, counts: [u64; 7]) {
        catch_up(&self.integrity, counts);
    }

    /// Brings the IO counters up to the shard's totals, which count since it started.
    pub fn io_totals(&self, t: &fastblock_shard::IoTotals) {
        catch_up(&self.io.ops, [t.read_ops, t.write_ops]);
        catch_up(&self.io.bytes, [t.read_bytes, t.write_bytes]);
        catch_up(
            std::array::from_ref(&self.io.recovery_sent_bytes),
            [t.recovery_sent_bytes],
        );
    }

    /// Sets the PGs the shard hosts and leads now.
    pub fn pg_counts(&self, c: &fastblock_shard::PgCounts) {
        self.io.pgs.set(i64::try_from(c.hosted).unwrap_or(i64::MAX));
        self.io
            .pgs_led
            .set(i64::try_from(c.led).unwrap_or(i64::MAX));
    }
}

/// Adds to each counter what its count gained since (counts only grow).
fn catch_up<const N: usize>(counters: &[Counter; N], counts: [u64; N]) {
    for (counter, now) in counters.iter().zip(counts) {
        let delta = now.saturating_sub(counter.get());
        if delta > 0 {
            counter.inc_by(delta);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;

    #[test]
    fn all_lists_the_stages_in_declaration_order() {
        for (i, s) in Stage::ALL.iter().enumerate() {
            assert_eq!(*s as usize, i, "{}", s.name());
        }
    }

    #[test]
    fn stages_show_in_the_text_format_per_shard() {
        let mut registry = Registry::with_prefix("fastblock_osd");
        let metrics = OsdMetrics::register(&mut registry);
        let s0 = metrics.shard(0);
        let _s1 = metrics.shard(1);
        s0.observe(Stage::WalCommit, Duration::from_micros(150));
        s0.observe(Stage::WalCommit, Duration::from_micros(300));
        s0.wal_commit(3);
        s0.observe(Stage::Reply, Duration::from_micros(7));
        s0.iteration();
        let stats = BlockCacheStats {
            hits: 5,
            misses: 2,
            evictions: 0,
            entries: 2,
        };
        s0.store_block_cache(&stats);
        s0.store_block_cache(&BlockCacheStats { hits: 9, ..stats });
        let mut text = String::new();
        encode(&mut text, &registry).expect("encodes");
        assert!(text
            .contains("fastblock_osd_stage_latency_us_count{shard=\"0\",stage=\"wal_commit\"} 2"));
        assert!(text.contains(
            "fastblock_osd_stage_latency_us_bucket{le=\"200.0\",shard=\"0\",stage=\"wal_commit\"} 1"
        ));
        assert!(text.contains(
            "fastblock_osd_stage_latency_us_bucket{le=\"10.0\",shard=\"0\",stage=\"reply\"} 1"
        ));
        // Shard 1 is present with zeros, so dashboards see every shard from the start.
        assert!(
            text.contains("fastblock_osd_stage_latency_us_count{shard=\"1\",stage=\"queue\"} 0")
        );
        assert!(text.contains("fastblock_osd_loop_iterations_total{shard=\"0\"} 1"));
        assert!(text.contains("fastblock_osd_wal_commit_ops_sum{shard=\"0\"} 3.0"));
        assert!(text.contains("fastblock_osd_store_block_cache_hits_total{shard=\"0\"} 9"));
        assert!(text.contains("fastblock_osd_store_block_cache_misses_total{shard=\"0\"} 2"));
        assert!(text.contains("fastblock_osd_store_block_cache_evictions_total{shard=\"0\"} 0"));
        assert!(text.contains("fastblock_osd_store_block_cache_hits_total{shard=\"1\"} 0"));
    }

    #[test]
    fn io_totals_are_counters_and_pgs_gauges() {
        let mut registry = Registry::with_prefix("fastblock_osd");
        let metrics = OsdMetrics::register(&mut registry);
        let s0 = metrics.shard(0);
        let totals = fastblock_shard::IoTotals {
            read_ops: 3,
            read_bytes: 12288,
            write_ops: 2,
            write_bytes: 8192,
            recovery_sent_bytes: 1 << 20,
        };
        s0.io_totals(&totals);
        // A second copy of the same totals adds nothing.
        s0.io_totals(&totals);
        s0.pg_counts(&fastblock_shard::PgCounts { hosted: 5, led: 2 });
        let mut text = String::new();
        encode(&mut text, &registry).expect("encodes");
        for line in [
            "# TYPE fastblock_osd_ops counter",
            "fastblock_osd_ops_total{shard=\"0\",op=\"read\"} 3",
            "fastblock_osd_ops_total{shard=\"0\",op=\"write\"} 2",
            "fastblock_osd_bytes_total{shard=\"0\",op=\"read\"} 12288",
            "fastblock_osd_bytes_total{shard=\"0\",op=\"write\"} 8192",
            "fastblock_osd_recovery_sent_bytes_total{shard=\"0\"} 1048576",
            "# TYPE fastblock_osd_pgs_led gauge",
            "fastblock_osd_pgs{shard=\"0\"} 5",
            "fastblock_osd_pgs_led{shard=\"0\"} 2",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }
}

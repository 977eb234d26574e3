//! One row of figures per scenario, how they are computed from the daemons' logs of map
//! answers, and the run's report as a table or JSON. `docs/scale.md` says what each means.

use crate::counters::{AnswerKind, MapCounters};
use crate::http::EtcdGauges;
use crate::procstat::ProcSample;
use serde::Serialize;
use std::sync::Arc;
use std::time::Instant;

/// Map answers of one kind received by the daemons in a scenario's window.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Traffic {
    pub answers: u64,
    pub bytes: u64,
    /// Mean and largest body of one answer (one answer may carry several epochs).
    pub mean_bytes: u64,
    pub max_bytes: u64,
}

impl Traffic {
    fn add(&mut self, bytes: u64) {
        self.answers += 1;
        self.bytes += bytes;
        self.max_bytes = self.max_bytes.max(bytes);
        self.mean_bytes = self.bytes / self.answers;
    }
}

/// PGs and replicas that changed OSD in a scenario, against the least that could have.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Moves {
    /// PGs whose member set changed.
    pub pgs: u64,
    /// PGs that had to change: those with a replica on the OSDs removed (or, on an add,
    /// those the new OSD takes part in).
    pub pgs_min: u64,
    /// (PG, OSD) replicas that are new.
    pub replicas: u64,
    /// Replicas that had to move: those on the OSDs removed (or those the new OSD holds).
    pub replicas_min: u64,
}

/// A functional outcome a scenario checks (the CI test asserts every one).
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    pub what: String,
    pub ok: bool,
    pub detail: String,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Row {
    pub scenario: String,
    /// The event and where its timings start.
    pub event: String,
    /// Epochs the monitor made from the scenario's start until its settled state.
    pub epochs: u64,
    /// Daemons following the map at the end (OSDs running, and clients).
    pub daemons: usize,
    pub full: Traffic,
    pub delta: Traffic,
    /// Map bytes the monitor sent to the daemons in the scenario, summed.
    pub sent_bytes: u64,
    /// The running OSDs among `daemons`, and the part of `sent_bytes` they received.
    pub osds: usize,
    pub osd_sent_bytes: u64,
    /// `sent_bytes` over daemons and epochs.
    pub bytes_per_epoch_per_daemon: f64,
    /// From the event's start to the observer holding the epoch that reflects it.
    pub event_ms: Option<f64>,
    /// From the first daemon holding that epoch (the observer included) to the last running
    /// daemon holding it.
    pub spread_ms: Option<f64>,
    /// The same for half and for 99 % of the daemons.
    pub spread_p50_ms: Option<f64>,
    pub spread_p99_ms: Option<f64>,
    /// The monitor's map answers woken by an epoch in the scenario
    /// (`fastblock_mon_map_wait_answer_seconds`), and the least bucket bound under which 99 %
    /// and all of them were handed to its HTTP server, counted from their epoch's publication (infinite:
    /// above the histogram's last bound).
    pub mon_answers: u64,
    pub mon_answer_p99_ms: Option<f64>,
    pub mon_answer_max_ms: Option<f64>,
    /// The monitor's operations decided in the scenario (`fastblock_mon_decide_seconds`), and
    /// the least bucket bound over the longest: placement's time is in the decisions that
    /// place (the pool's creation, an OSD out or added).
    pub decisions: u64,
    pub decide_max_ms: Option<f64>,
    /// The scenario's wall time until its settled state reached every daemon.
    pub settle_ms: f64,
    /// The monitor's CPU in the scenario, and its memory at the end.
    pub mon_cpu_secs: f64,
    pub mon: ProcSample,
    /// The harness's own CPU in the scenario (every simulated OSD and client: one process on
    /// the same machine as the monitor, so a busy harness lengthens `spread_ms` too).
    pub harness_cpu_secs: f64,
    /// The etcd member's CPU in the scenario, and its memory at the end (`None`: not found).
    pub etcd_cpu_secs: Option<f64>,
    pub etcd_proc: Option<ProcSample>,
    pub etcd: EtcdGauges,
    pub moves: Option<Moves>,
    pub checks: Vec<Check>,
}

/// The answers every daemon of `counters` received in `[from, to]`, by kind.
pub fn traffic(counters: &[Arc<MapCounters>], from: Instant, to: Instant) -> (Traffic, Traffic) {
    let (mut full, mut delta) = (Traffic::default(), Traffic::default());
    for c in counters {
        for a in c.window(from, to) {
            match a.kind {
                AnswerKind::Full => full.add(a.bytes),
                AnswerKind::Delta => delta.add(a.bytes),
            }
        }
    }
    (full, delta)
}

/// The whole run: its options, a row per scenario done, and what stopped it if anything did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    pub osds: u32,
    pub clients: u32,
    pub pg_count: u32,
    pub pool_size: u32,
    pub host_osds: u32,
    pub max_pg_per_osd: u32,
    pub rows: Vec<Row>,
    /// PG reports the simulated OSDs sent, in how many batches, and how many the monitor
    /// refused (with the first refusals' messages).
    pub reports_sent: u64,
    pub report_batches: u64,
    pub reports_refused: u64,
    pub reports_stale: u64,
    pub refusals: Vec<String>,
    /// The error that stopped the run before its last scenario, if any.
    pub error: Option<String>,
}

impl Report {
    /// Every check of every row that failed, and the run's error.
    pub fn failures(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .rows
            .iter()
            .flat_map(|r| {
                r.checks
                    .iter()
                    .filter(|c| !c.ok)
                    .map(move |c| format!("{}: {}: {}", r.scenario, c.what, c.detail))
            })
            .collect();
        out.extend(self.error.clone());
        out
    }

    /// The human table.
    pub fn table(&self) -> String {
        let mut s = format!(
            "fastblock-scale: {} OSDs ({} per host), {} clients, pool of {} PGs x{}, \
             --max-pg-per-osd {}\n",
            self.osds,
            self.host_osds,
            self.clients,
            self.pg_count,
            self.pool_size,
            self.max_pg_per_osd
        );
        s.push_str(&format!(
            "{:<16} {:>6} {:>7} {:>9} {:>9} {:>7} {:>9} {:>9} {:>10} {:>9} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>13}\n",
            "scenario", "epochs", "daemons", "full n", "full avg", "delta n", "delta avg",
            "delta max", "KiB/daemon", "KiB/OSD", "B/ep/dmn", "event ms", "spread", "mon p99", "mon max", "decide", "settle s",
            "mon cpu", "sim cpu", "mon rss", "etcd db/used"
        ));
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0}"));
        for r in &self.rows {
            s.push_str(&format!(
                "{:<16} {:>6} {:>7} {:>9} {:>9} {:>7} {:>9} {:>9} {:>10.1} {:>9.1} {:>9.0} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8.1} {:>8.2} {:>8.2} {:>8.0}M {:>6.1}/{:<6.1}\n",
                r.scenario,
                r.epochs,
                r.daemons,
                r.full.answers,
                r.full.mean_bytes,
                r.delta.answers,
                r.delta.mean_bytes,
                r.delta.max_bytes,
                r.sent_bytes as f64 / 1024.0 / r.daemons.max(1) as f64,
                r.osd_sent_bytes as f64 / 1024.0 / r.osds.max(1) as f64,
                r.bytes_per_epoch_per_daemon,
                ms(r.event_ms),
                ms(r.spread_ms),
                ms(r.mon_answer_p99_ms),
                ms(r.mon_answer_max_ms),
                ms(r.decide_max_ms),
                r.settle_ms / 1000.0,
                r.mon_cpu_secs,
                r.harness_cpu_secs,
                mib(r.mon.rss_peak_bytes),
                mib(r.etcd.db_size_bytes.unwrap_or(0)),
                mib(r.etcd.db_size_in_use_bytes.unwrap_or(0)),
            ));
        }
        for r in &self.rows {
            s.push_str(&format!("- {}: {}", r.scenario, r.event));
            if let Some(m) = r.moves {
                s.push_str(&format!(
                    "; PGs changed {} (least {}), replicas moved {} (least {})",
                    m.pgs, m.pgs_min, m.replicas, m.replicas_min
                ));
            }
            if let (Some(p50), Some(p99)) = (r.spread_p50_ms, r.spread_p99_ms) {
                s.push_str(&format!(
                    "; the epoch reached half the daemons in {p50:.0} ms, 99 % in {p99:.0} ms \
                     ({} answers woken by an epoch)",
                    r.mon_answers
                ));
            }
            s.push('\n');
            for c in r.checks.iter().filter(|c| !c.ok) {
                s.push_str(&format!("  FAILED {}: {}\n", c.what, c.detail));
            }
        }
        s.push_str(&format!(
            "PG reports: {} in {} batches; refused: {} as stale or late (sent again before \
             the map showed them taken, or confirming an entry already finished), {} otherwise\n",
            self.reports_sent, self.report_batches, self.reports_stale, self.reports_refused
        ));
        for r in &self.refusals {
            s.push_str(&format!("  refused: {r}\n"));
        }
        let largest = self.rows.iter().filter_map(|r| r.etcd.txn_bytes_max).max();
        s.push_str(&match largest {
            Some(b) => format!(
                "etcd's largest transaction: {:.1} KiB put (fastblock_mon_etcd_txn_bytes_max)\n",
                b as f64 / 1024.0
            ),
            None => "etcd's largest transaction: not read from the monitor\n".to_string(),
        });
        if let Some(e) = &self.error {
            s.push_str(&format!("STOPPED: {e}\n"));
        }
        s
    }
}

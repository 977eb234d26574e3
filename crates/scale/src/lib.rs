//! The control-plane scale harness (issue 36): one real monitor with its real etcd, N
//! simulated OSDs and M simulated clients in this process, driven through the events that
//! matter at scale, with the figures of each (`docs/scale.md`).
//!
//! Module map:
//! - [`options`]: the run's parameters (the binary's flags) and their checks.
//! - [`cluster`]: the monitor process (and its etcd member) in a temporary directory, killed
//!   by PID on drop.
//! - [`sim_osd`]: a simulated OSD: apply-id, its own key, boot, heartbeats, the map followed in
//!   its scope, PG reports in batches.
//! - [`leader`]: what a simulated OSD reports as the leader of its PGs, from the map (pure).
//! - [`follow`]: following the map through the OSD's own loop (`MapWatch`), logging each
//!   answer's size.
//! - [`counters`]: that log, per daemon.
//! - [`fleet`]: the simulated daemons of a run and the observer (the whole map, as an admin
//!   tool follows it) that timestamps events.
//! - [`scenarios`]: the scenarios, in order, each ending in a settled state.
//! - [`figures`]: the rows of figures and the report (table, JSON).
//! - [`procstat`], [`http`]: the monitor's CPU and memory from `/proc`; its `/metrics` page.
//! - [`error`]: what can stop a run ([`ScaleError`]).

pub mod cluster;
pub mod counters;
pub mod error;
pub mod figures;
pub mod fleet;
pub mod follow;
pub mod http;
pub mod leader;
pub mod options;
pub mod procstat;
pub mod scenarios;
pub mod sim_osd;

pub use error::ScaleError;
pub use figures::Report;
pub use options::Options;

use std::sync::atomic::Ordering;

/// Runs every scenario with `opts` against a monitor started from `mon_bin`. An error before
/// the first scenario (bad options, a monitor that does not start) is returned; one in a
/// scenario stops the run and is in the report's `error`, with the rows done before it.
pub async fn run(opts: &Options) -> Result<Report, ScaleError> {
    opts.check()?;
    let settings = cluster::MonSettings {
        bin: cluster::find_mon_bin(opts.mon_bin.as_deref()),
        osd_down_after: std::time::Duration::from_secs(opts.osd_down_after_secs),
        osd_out_after: std::time::Duration::from_secs(opts.osd_out_after_secs),
        max_pg_per_osd: opts.max_pg_per_osd(),
        keep_dir: opts.keep_dir,
        log_filter: opts.mon_log.clone(),
    };
    let mut mon = cluster::MonProcess::start(&settings, opts.wait()).await?;
    let mut run = scenarios::Run::new(opts, &mut mon);
    let mut report = Report {
        osds: opts.osds,
        clients: opts.clients,
        pg_count: opts.pg_count,
        pool_size: opts.pool_size,
        host_osds: opts.host_osds(),
        max_pg_per_osd: settings.max_pg_per_osd,
        ..Report::default()
    };
    if let Err(e) = scenarios::run_all(&mut run, &mut report.rows).await {
        report.error = Some(format!(
            "{e}; the monitor's log ends with:\n{}",
            run.mon.log_tail()
        ));
    }
    let stats = &run.fleet.stats;
    report.reports_sent = stats.sent.load(Ordering::Relaxed);
    report.report_batches = stats.batches.load(Ordering::Relaxed);
    report.reports_refused = stats.refused.load(Ordering::Relaxed);
    report.reports_stale = stats.stale.load(Ordering::Relaxed);
    report.refusals = stats
        .refusals
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    // The simulated daemons stop before the monitor is killed (its drop, after this).
    drop(run);
    Ok(report)
}

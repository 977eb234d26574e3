//! The scale harness (`crates/scale`, issue 36) at the size CI runs: 12 simulated OSDs, 2
//! simulated clients and a pool of 128 PGs against the real monitor and etcd. Every scenario
//! must end with every running daemon at the epoch that settles it; the outcomes are checked
//! by the harness itself (`Check`s) and here: the stopped host marked down and out and left by
//! every PG, the reclaim gone, the snapshot created, deltas (not whole maps) after first
//! contact. No timing is asserted.

use fastblock_scale::{Options, Report};
use std::path::PathBuf;
use std::time::Duration;

/// Bound of the whole run (each of its waits is bounded by `Options::wait_secs` too).
const RUN_MAX: Duration = Duration::from_secs(900);

fn row<'a>(report: &'a Report, name: &str) -> &'a fastblock_scale::figures::Row {
    report
        .rows
        .iter()
        .find(|r| r.scenario == name)
        .unwrap_or_else(|| panic!("no row {name}:\n{}", report.table()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scale_harness_drives_every_scenario_to_every_daemon() {
    let opts = Options {
        mon_bin: Some(PathBuf::from(env!("CARGO_BIN_EXE_fastblock-mon"))),
        ..Options::small()
    };
    // Dropping the run on timeout kills the monitor by its PID (`MonProcess`'s drop).
    let report = tokio::time::timeout(RUN_MAX, fastblock_scale::run(&opts))
        .await
        .expect("the harness finishes within its bound")
        .expect("the harness starts its monitor");
    let table = report.table();
    assert_eq!(report.error, None, "{table}");
    let names: Vec<&str> = report.rows.iter().map(|r| r.scenario.as_str()).collect();
    assert_eq!(
        names,
        [
            "boot",
            "pool create",
            "host down/out",
            "osd add",
            "image remove",
            "snapshot",
            "mon restart",
            "rolling restart"
        ],
        "{table}"
    );
    assert_eq!(report.failures(), Vec::<String>::new(), "{table}");
    for r in &report.rows {
        assert!(r.epochs > 0, "{}: no epoch made\n{table}", r.scenario);
        assert!(!r.checks.is_empty(), "{}: nothing checked", r.scenario);
    }
    // Every daemon booted got one whole map; later events reach them as deltas.
    let boot = row(&report, "boot");
    assert_eq!(boot.full.answers, u64::from(opts.osds), "{table}");
    for name in ["host down/out", "image remove", "snapshot", "mon restart"] {
        let r = row(&report, name);
        assert_eq!(r.full.answers, 0, "{name}: whole maps sent\n{table}");
        assert!(r.delta.answers >= r.daemons as u64, "{name}: {table}");
    }
    // The monitor timed the long-polls the down mark woke, and the spread's figures are in
    // order (half the daemons, 99 %, all).
    let down = row(&report, "host down/out");
    assert!(down.mon_answers > 0, "no map answer timed\n{table}");
    assert!(down.mon_answer_max_ms.is_some(), "{table}");
    let (p50, p99, all) = (
        down.spread_p50_ms.expect("p50"),
        down.spread_p99_ms.expect("p99"),
        down.spread_ms.expect("spread"),
    );
    assert!(p50 <= p99 && p99 <= all, "{p50} {p99} {all}\n{table}");
    // The pool's placement was timed with its decision.
    let create = row(&report, "pool create");
    assert!(create.decisions > 0, "{table}");
    assert!(create.decide_max_ms.is_some_and(f64::is_finite), "{table}");
    // The stopped host had replicas, and they all moved.
    let moves = row(&report, "host down/out").moves.expect("moves counted");
    assert!(moves.replicas_min > 0, "{table}");
    assert!(moves.replicas >= moves.replicas_min, "{table}");
    let add = row(&report, "osd add").moves.expect("moves counted");
    assert!(add.replicas_min > 0, "the new OSD got no PG\n{table}");
    assert_eq!(report.reports_refused, 0, "{:?}", report.refusals);
}

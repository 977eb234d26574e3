//! Lease timing across OSDs (docs/design/osd.md, "Reads"): a PG leader's read lease is safe only
//! while it ends before any member could vote for another leader, and each OSD counts both with
//! its own `--tick` and `--election-ticks`. An OSD whose settings do not fit the others' is
//! refused at boot by the monitor and exits with that error (status 2, no panic, no retry loop)
//! instead of serving stale reads; settings that differ but fit join, and the refused OSD joins
//! once started with fitting settings. Real monitor, etcd and OSD processes.

mod common;

use common::*;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

/// Waits for `osd`'s process to exit by itself and returns its status; panics (killing it) if it
/// is still running after `timeout`.
async fn wait_exit(osd: &mut OsdProc, timeout: Duration) -> ExitStatus {
    let deadline = Instant::now() + timeout;
    loop {
        let proc = osd.proc.as_mut().expect("started");
        let child = proc.child.as_mut().expect("not reaped");
        if let Some(status) = child.try_wait().expect("try_wait") {
            // Reaped: its PID may be reused, so it must never be signalled again.
            proc.child = None;
            osd.proc = None;
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "osd {} still running after {timeout:?}, not refused:\n{}",
            osd.id,
            osd.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Checks that `osd` was refused for its lease timing: exit status 2, the monitor's message
/// naming its settings and `cluster`'s, and never marked up.
async fn assert_refused(mons: &MonCluster, osd: &mut OsdProc, mine: &str, cluster: &str) {
    let status = wait_exit(osd, Duration::from_secs(30)).await;
    let log = osd.all_logs();
    assert_eq!(status.code(), Some(2), "{log}");
    assert_eq!(
        log.matches("cannot serve PGs with osd").count(),
        1,
        "one clear error: {log}"
    );
    assert!(log.contains(&format!("osd {} ({mine})", osd.id)), "{log}");
    assert!(log.contains(&format!("({cluster})")), "{log}");
    assert!(!log.contains("panicked"), "{log}");
    let osds = mons.client().osds().await.expect("osd list");
    let record = osds.iter().find(|o| o.id == osd.id).expect("applied");
    assert!(!record.up && record.pending_create, "{record:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mismatched_lease_settings_refused() {
    let mons = MonCluster::start(1, MonOptions::default()).await;
    let client = mons.client();
    let dir = TempDir::new("lease-config");
    // The cluster: OSDs at the tests' --tick 50ms --election-ticks 10 (leases of 400 ms; a
    // member may vote again 445 ms after hearing from its leader).
    let cluster = "--tick 50ms --election-ticks 10 --lease-reads true";
    let _osds = start_osds(&mons, dir.path(), 2, "256M", 1, Duration::from_secs(30)).await;

    // 100 ms ticks: its leaders would lease 800 ms, far past the others' 445 ms.
    let mut slow = OsdProc::create_with(&mons, dir.path(), "slow", "256M", &["--tick", "100ms"]);
    let slow_timing = "--tick 100ms --election-ticks 10 --lease-reads true";
    assert_refused(&mons, &mut slow, slow_timing, cluster).await;

    // No lease of its own, but 25 ms ticks: it would vote again after 220 ms, inside the
    // others' leases.
    let mut fast = OsdProc::create_with(
        &mons,
        dir.path(),
        "fast",
        "256M",
        &["--tick", "25ms", "--lease-reads", "false"],
    );
    let fast_timing = "--tick 25ms --election-ticks 10 --lease-reads false";
    assert_refused(&mons, &mut fast, fast_timing, cluster).await;

    // Other settings that fit both ways join: 40 ms x 12 leases 400 ms and refuses for 435 ms.
    let fits = OsdProc::create_with(
        &mons,
        dir.path(),
        "fits",
        "256M",
        &["--tick", "40ms", "--election-ticks", "12"],
    );
    wait_osds_up(&client, &[fits.id], Duration::from_secs(30)).await;

    // The refused OSD, started again with the cluster's settings, joins: nothing was lost.
    slow.extra_args.clear();
    slow.start();
    wait_osds_up(&client, &[slow.id], Duration::from_secs(30)).await;
    let record = client.osds().await.expect("osd list");
    let record = record.iter().find(|o| o.id == slow.id).expect("slow");
    assert_eq!(
        record.lease_timing.map(|t| t.to_string()).as_deref(),
        Some(cluster),
        "the monitor records the settings it checked"
    );
}

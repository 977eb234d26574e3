//! `--wal-sync no-flush-benchmark-only`, the measurement-only mode without device flushes, on
//! a real OSD: refused (exit status 2, the reason, nothing written) unless the environment
//! holds the acknowledgement; with it, the OSD starts, says so in its log, on `/metrics` and
//! in the config it reported at boot, and serves writes, which a SIGKILL (not a power loss)
//! does not lose.

mod common;

use common::{
    free_port, http_get, pool_with_image, stamped_block as block, wait_osds_up, wait_until,
    MonCluster, MonOptions, OsdProc, TempDir, BLOCK,
};
use fastblock_client::Cluster;
use fastblock_osd::no_flush::{ACKNOWLEDGEMENT, ACKNOWLEDGEMENT_VAR};
use fastblock_types::OsdId;
use std::path::Path;
use std::time::{Duration, SystemTime};

const MODE: [&str; 2] = ["--wal-sync", "no-flush-benchmark-only"];
/// The line `/metrics` carries while flushes are skipped (and with `0` otherwise).
const SKIPPED: &str = "\nfastblock_osd_wal_flush_skipped 1\n";
const NOT_SKIPPED: &str = "\nfastblock_osd_wal_flush_skipped 0\n";
const BLOCKS: u64 = 32;

/// The OSD's files (data, metadata, identity, keyring) with their sizes and modification
/// times.
fn osd_files(data: &Path) -> Vec<(String, u64, SystemTime)> {
    let name = data.file_name().unwrap().to_string_lossy().to_string();
    let mut files: Vec<_> = std::fs::read_dir(data.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&name))
        .map(|e| {
            let m = e.metadata().unwrap();
            (
                e.file_name().to_string_lossy().to_string(),
                m.len(),
                m.modified().unwrap(),
            )
        })
        .collect();
    files.sort();
    files
}

/// `/metrics` once it answers with the flush gauge.
async fn metrics(addr: &str) -> String {
    let url = format!("http://{addr}/metrics");
    wait_until(Duration::from_secs(20), "the OSD's /metrics", || {
        let url = url.clone();
        async move {
            http_get(&url)
                .await
                .ok()
                .filter(|t| t.contains("fastblock_osd_wal_flush_skipped"))
        }
    })
    .await
}

/// What the OSD reported at boot about its flushes (`None`: the key is missing).
async fn reported_skipping(mons: &MonCluster, id: OsdId) -> Option<bool> {
    let osds = mons.client().osds().await.expect("osd list");
    let osd = osds.iter().find(|o| o.id == id).expect("the OSD is listed");
    let config: serde_json::Value = serde_json::from_str(&osd.config).expect("config is JSON");
    config.get("wal_flush_skipped").and_then(|v| v.as_bool())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_flush_mode_needs_the_acknowledgement_and_then_says_so() {
    let mons = MonCluster::start(1, MonOptions::default()).await;
    let dir = TempDir::new("noflush");
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    let metrics_args = ["--metrics-addr", metrics_addr.as_str()];
    let mut osd = OsdProc::create_with(&mons, dir.path(), "h0", "256M", &metrics_args);
    let client = mons.client();
    wait_osds_up(&client, &[osd.id], Duration::from_secs(20)).await;
    // The default mode flushes, and says so.
    assert!(metrics(&metrics_addr).await.contains(NOT_SKIPPED));
    assert_eq!(reported_skipping(&mons, osd.id).await, Some(false));
    assert!(osd.stop(), "the OSD did not stop on SIGTERM");

    // Without the acknowledgement, or with anything but its exact text: refused at once as a
    // usage error, before a file is opened.
    let before = osd_files(&osd.data);
    osd.extra_args = [&MODE[..], &metrics_args[..]]
        .concat()
        .into_iter()
        .map(String::from)
        .collect();
    for value in [None, Some("yes"), Some("acknowledged")] {
        osd.extra_env = value
            .map(|v| vec![(ACKNOWLEDGEMENT_VAR.to_string(), v.to_string())])
            .unwrap_or_default();
        osd.start();
        let proc = osd.proc.as_mut().unwrap();
        let status = proc.wait_exit(Duration::from_secs(20));
        let log = std::fs::read_to_string(&proc.log).unwrap_or_default();
        osd.proc = None;
        assert_eq!(
            status.and_then(|s| s.code()),
            Some(2),
            "{value:?}: the OSD should refuse the mode:\n{log}"
        );
        assert!(
            log.contains(&format!("needs {ACKNOWLEDGEMENT_VAR}={ACKNOWLEDGEMENT}"))
                && log.contains("a power loss loses them"),
            "{value:?}: {log}"
        );
        assert!(!log.contains("panicked"), "{value:?}: {log}");
    }
    assert_eq!(
        osd_files(&osd.data),
        before,
        "a refused start wrote something"
    );

    // With it: the OSD starts, warns, and tells /metrics and the monitor.
    osd.extra_env = vec![(ACKNOWLEDGEMENT_VAR.to_string(), ACKNOWLEDGEMENT.to_string())];
    osd.start();
    // The map may still show the stopped run up: wait for this run's boot report.
    wait_until(
        Duration::from_secs(20),
        "the boot of the OSD without flushes",
        || async { (reported_skipping(&mons, osd.id).await == Some(true)).then_some(()) },
    )
    .await;
    assert!(osd.is_running(), "{}", osd.log_tail());
    assert!(metrics(&metrics_addr).await.contains(SKIPPED));
    assert!(
        osd.log_tail()
            .contains("BENCHMARK-ONLY MODE, NOT FOR DATA: --wal-sync no-flush-benchmark-only"),
        "{}",
        osd.log_tail()
    );

    // It serves writes, and a killed process loses none of them (only a power loss would).
    pool_with_image(&client, ("fb", 4, 1), ("img", 16 << 20, 1 << 20)).await;
    {
        let cluster = Cluster::connect(mons.client_config()).await.unwrap();
        let image = cluster.open_image("fb", "img").await.unwrap();
        for b in 0..BLOCKS {
            image.write(b * BLOCK, block(b * BLOCK, 1)).await.unwrap();
        }
    }
    osd.kill();
    osd.start();
    wait_osds_up(&client, &[osd.id], Duration::from_secs(20)).await;
    common::wait_all_active(&client, Duration::from_secs(30)).await;
    let mut config = mons.client_config();
    // Time for the restarted OSD to be elected leader of its PGs again.
    config.op_deadline = Duration::from_secs(30);
    let cluster = Cluster::connect(config).await.unwrap();
    let image = cluster.open_image("fb", "img").await.unwrap();
    for b in 0..BLOCKS {
        let got = image.read(b * BLOCK, BLOCK).await.unwrap();
        assert!(
            got == block(b * BLOCK, 1),
            "block {b} lost across a SIGKILL"
        );
    }
}

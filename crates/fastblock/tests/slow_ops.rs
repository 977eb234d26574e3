//! The op tracker and `SLOW_OPS` on real processes (issue 20, "Op tracker";
//! `docs/operations.md`, "Slow ops"): real etcd, monitor and three OSDs with a 1 s complaint
//! time, one of them made slow by delaying every WAL sync of its disk through the test-only
//! `--fault-injection-file` (`docs/testing.md`), while clients write to every object.
//!
//! Checked: `health` raises `SLOW_OPS` naming the slow OSD; `osd ops` shows an op in flight
//! there for over a second in `wal_commit`; `osd historic-ops` shows a completed write whose
//! slowest stage is `wal_commit`; the op dump is refused to an unsigned caller; the complaint
//! time set at runtime (`config set osd.N op_complaint_time`) takes the slow OSD out of the
//! check and back; and once the delay is removed the check clears, with every write
//! acknowledged.
//!
//! The fault injection holds each WAL commit's completion back by the delay while the
//! shard's thread goes on serving (`docs/testing.md`), as a slow device does. So that the
//! stage that held a write is the WAL commit alone, nothing else waits: the writers write
//! only to PGs the slow OSD leads, fewer of them than the WAL commits it may keep in flight
//! (so no write waits for a commit slot in `queue`), and the periodic flush, whose data sync
//! holds the shard's thread (and would show as `replication` of the ops it delays), is set
//! far beyond the test. Election timeouts (100 ticks of 50 ms) outlast the delay, so the
//! slow OSD keeps leading.

mod common;

use common::faults::{with_fault_file, write_fault_file};
use common::{stamped_block, wait_osds_up, wait_until, MonCluster, MonOptions, OsdProc, TempDir};
use common::{wait_all_active, BLOCK};
use fastblock_client::Cluster;
use fastblock_types::OsdId;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const MIB: u64 = 1 << 20;
const OBJECTS: u64 = 16;
/// Writers at most, each with one write in flight: fewer than `--wal-commits-in-flight`.
const WRITERS_MAX: usize = 4;
const WAIT: Duration = Duration::from_secs(60);
/// Every WAL sync of the slow OSD sleeps this long: twice the complaint time.
const SYNC_DELAY_MS: u64 = 2_000;
const OSD_ARGS: &[&str] = &[
    "--op-complaint-time",
    "1s",
    "--election-ticks",
    "100",
    "--wal-commits-in-flight",
    "8",
    "--flush-interval",
    "1h",
];

fn check<'a>(health: &'a Value, code: &str) -> Option<&'a Value> {
    health["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["code"] == code)
}

fn stage_us(op: &Value, stage: &str) -> u64 {
    op["stages"]
        .as_array()
        .expect("stages")
        .iter()
        .find(|s| s["stage"] == stage)
        .and_then(|s| s["us"].as_u64())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_ops_show_the_osd_the_op_and_its_stage_then_clear() {
    let mons = MonCluster::start(1, MonOptions::default()).await;
    let dir = TempDir::new("slow-ops");
    let mut osds: Vec<OsdProc> = Vec::new();
    let mut fault_files: BTreeMap<OsdId, std::path::PathBuf> = BTreeMap::new();
    for i in 0..3 {
        let mut osd = OsdProc::create_with(&mons, dir.path(), &format!("h{i}"), "256M", OSD_ARGS);
        let file = dir.path().join(format!("faults-{i}.json"));
        with_fault_file(&mut osd, &file);
        fault_files.insert(osd.id, file);
        osds.push(osd);
    }
    let client = mons.client();
    let ids: Vec<OsdId> = osds.iter().map(|o| o.id).collect();
    wait_osds_up(&client, &ids, WAIT).await;
    common::pool_with_image(&client, ("fb", 8, 3), ("img", OBJECTS * MIB, MIB)).await;
    wait_all_active(&client, WAIT).await;

    // The slow OSD: the one that leads the most PGs, so that writes wait for its WAL.
    let map = client.map().await.unwrap().map.expect("a map");
    let mut led: BTreeMap<OsdId, usize> = BTreeMap::new();
    for pgs in map.pgmaps.values() {
        for pg in pgs.pgs.values() {
            if let Some(l) = pg.leader {
                *led.entry(l).or_default() += 1;
            }
        }
    }
    let (&slow, _) = led
        .iter()
        .max_by_key(|(_, n)| **n)
        .expect("PGs have leaders");
    let health = mons.cli(&["health", "--json"]).json();
    assert!(check(&health, "SLOW_OPS").is_none(), "{health}");

    // Writers on objects of PGs the slow OSD leads, each one write at a time, until told to
    // stop.
    let cluster = Cluster::connect(mons.client_config()).await.unwrap();
    let image = Arc::new(cluster.open_image("fb", "img").await.unwrap());
    let objects: Vec<u64> = (0..OBJECTS)
        .filter(|&o| {
            let pg = image.object_pg(o);
            map.pg(pg).and_then(|p| p.leader) == Some(slow)
        })
        .take(WRITERS_MAX)
        .collect();
    assert!(!objects.is_empty(), "no object in a PG osd.{slow} leads");
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let mut writers = Vec::new();
    for &object in &objects {
        let (image, stop, written) = (image.clone(), stop.clone(), written.clone());
        writers.push(tokio::spawn(async move {
            let mut generation = 0;
            while !stop.load(Ordering::Relaxed) {
                generation += 1;
                let offset = object * MIB;
                image
                    .write(offset, stamped_block(offset, generation))
                    .await
                    .unwrap_or_else(|e| panic!("write to object {object}: {e}"));
                written.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            generation
        }));
    }
    write_fault_file(
        &fault_files[&slow],
        &format!(r#"{{"rules": [{{"op": "sync", "kind": {{"delay_ms": {SYNC_DELAY_MS}}}}}]}}"#),
    );

    // SLOW_OPS names the slow OSD, its oldest op waiting for the WAL. (Other OSDs may show
    // slow ops too: a PG whose leader is elsewhere can have the slow OSD as a member.)
    let line = wait_until(WAIT, "SLOW_OPS naming the slow OSD", || async {
        let health = mons.cli(&["health", "--json"]).json();
        let detail = check(&health, "SLOW_OPS")?["detail"].as_array()?.clone();
        let prefix = format!("osd.{slow} has ");
        detail
            .iter()
            .filter_map(Value::as_str)
            .find(|l| l.starts_with(&prefix))
            .map(str::to_string)
    })
    .await;
    assert!(line.contains("in wal_commit"), "{line}");
    let detail = mons.cli(&["health", "--detail"]).ok().to_string();
    assert!(detail.contains("SLOW_OPS: "), "{detail}");

    // An op in flight for over a second, waiting for the slow WAL.
    let id = slow.to_string();
    let stuck = wait_until(WAIT, "an op in flight in wal_commit", || async {
        let ops = mons.cli(&["osd", "ops", &id, "--json"]).json();
        ops["ops"].as_array().expect("ops").iter().find_map(|op| {
            (op["stage"] == "wal_commit" && op["duration_us"].as_u64() >= Some(1_000_000))
                .then(|| op.clone())
        })
    })
    .await;
    assert!(stage_us(&stuck, "wal_commit") >= 1_000_000, "{stuck}");
    let text = mons.cli(&["osd", "ops", &id]).ok().to_string();
    assert!(text.contains("wal_commit"), "{text}");

    // A completed write whose slowest stage was its WAL commit.
    let slowest = wait_until(WAIT, "a historic op over a second", || async {
        let ops = mons.cli(&["osd", "historic-ops", &id, "--json"]).json();
        let first = ops["ops"].as_array().expect("ops").first().cloned()?;
        (first["duration_us"].as_u64()? >= 1_000_000).then_some(first)
    })
    .await;
    assert_eq!(slowest["kind"], "write", "{slowest}");
    assert_eq!(slowest["stage"], "wal_commit", "{slowest}");
    let wal_us = stage_us(&slowest, "wal_commit");
    assert!(wal_us >= SYNC_DELAY_MS * 1000 * 3 / 4, "{slowest}");
    for other in ["queue", "replication", "apply"] {
        assert!(stage_us(&slowest, other) < wal_us, "{slowest}");
    }

    // The dump is for administrators: an unsigned caller is refused (auth mode `sign`).
    let url = format!("http://{}/v1/osds/{slow}/ops", mons.specs[0].api);
    let unsigned = common::http_get(&url).await.expect("GET");
    assert!(unsigned.starts_with("HTTP/1.1 401"), "{unsigned}");
    assert!(!unsigned.contains("wal_commit"), "{unsigned}");

    // The complaint time is settable at runtime: an hour, and the slow OSD's ops are no
    // longer slow while its disk still is; back to a second, and they are again.
    let slow_osd = osds.iter().find(|o| o.id == slow).expect("the slow OSD");
    let entity = format!("osd.{slow}");
    let names_slow = |health: &Value| {
        check(health, "SLOW_OPS").is_some_and(|c| {
            c["detail"]
                .as_array()
                .expect("detail")
                .iter()
                .filter_map(Value::as_str)
                .any(|l| l.starts_with(&format!("{entity} has ")))
        })
    };
    for (value, slow_named) in [("1h", false), ("1s", true)] {
        common::config_cli(
            &slow_osd.run_dir(),
            &["set", &entity, "op_complaint_time", value],
        )
        .ok();
        wait_until(
            WAIT,
            &format!("SLOW_OPS after a complaint time of {value}"),
            || async {
                let health = mons.cli(&["health", "--json"]).json();
                (names_slow(&health) == slow_named).then_some(())
            },
        )
        .await;
    }

    // The delay removed, the slow ops complete and the check clears.
    write_fault_file(&fault_files[&slow], "");
    wait_until(WAIT, "SLOW_OPS cleared", || async {
        let health = mons.cli(&["health", "--json"]).json();
        check(&health, "SLOW_OPS").is_none().then_some(())
    })
    .await;
    let before = written.load(Ordering::Relaxed);
    wait_until(WAIT, "writes going on", || async {
        (written.load(Ordering::Relaxed) > before + objects.len() as u64).then_some(())
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for (object, w) in objects.iter().zip(writers) {
        let generation = w.await.expect("writer");
        let offset = object * MIB;
        let data = image.read(offset, BLOCK).await.expect("read");
        assert!(data == stamped_block(offset, generation), "object {object}");
    }
    drop(osds);
}

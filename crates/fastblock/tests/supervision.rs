//! No silent deaths (issue 15), on real processes: a pool whose PG map key is lost in etcd is
//! reported, not fatal. Health names the pool and the key; changes to that pool get a clear
//! error; the other pool keeps serving IO and taking changes; OSD liveness keeps running (a
//! SIGKILLed OSD is marked down within its timeout, then out); and putting the key back
//! brings the pool back with the data written before, because the OSDs kept its PGs.

mod common;

use bytes::Bytes;
use common::{
    pool_with_image, stamped_block, start_osds, wait_osds_up, wait_until, MonCluster, MonOptions,
};
use common::{TempDir, BLOCK};
use fastblock_client::{Cluster, Image};
use fastblock_monclient::MonClient;
use fastblock_types::api::{CreateImageRequest, ErrorCode};
use fastblock_types::OsdId;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const WAIT: Duration = Duration::from_secs(30);
/// The monitors' `--osd-down-after` (`MonOptions::default()`).
const DOWN_AFTER: Duration = Duration::from_secs(2);

/// Runs `etcdctl ARGS` against monitor `i`'s etcd member (logged in as its root); returns
/// its stdout.
fn etcdctl(mons: &MonCluster, i: usize, args: &[&str]) -> String {
    let out = mons
        .etcdctl(i)
        .args(args)
        .output()
        .expect("running etcdctl (install with scripts/install-deps.sh)");
    assert!(
        out.status.success(),
        "etcdctl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// Eight stamped blocks (generation `generation`) at the start of `image`, written and read
/// back.
async fn write_blocks(image: &Image, generation: u64) {
    for b in 0..8 {
        image
            .write(b * BLOCK, stamped_block(b * BLOCK, generation))
            .await
            .unwrap_or_else(|e| panic!("write of block {b}: {e}"));
    }
    check_blocks(image, generation).await;
}

async fn check_blocks(image: &Image, generation: u64) {
    for b in 0..8 {
        let data: Bytes = image
            .read(b * BLOCK, BLOCK)
            .await
            .unwrap_or_else(|e| panic!("read of block {b}: {e}"));
        assert!(
            data == stamped_block(b * BLOCK, generation),
            "block {b} is not generation {generation}"
        );
    }
}

async fn open(mons: &MonCluster, pool: &str) -> Image {
    let cluster = Cluster::connect(mons.client_config()).await.unwrap();
    cluster.open_image(pool, "img").await.unwrap()
}

/// The health checks, once the monitor answers.
async fn health_checks(client: &MonClient) -> (String, Vec<String>) {
    let health = wait_until(WAIT, "the monitor answers health", || async move {
        client.health().await.ok()
    })
    .await;
    let checks = health.checks.iter().map(|c| c.to_string()).collect();
    (health.status, checks)
}

async fn restart_monitor(mons: &mut MonCluster) {
    assert!(mons.stop(0), "SIGTERM stops the monitor within 20 s");
    mons.restart(0);
    mons.wait_leader(Duration::from_secs(60)).await;
}

async fn osd_state(client: &MonClient, id: OsdId) -> Option<(bool, bool)> {
    let osds = client.osds().await.ok()?;
    osds.iter().find(|o| o.id == id).map(|o| (o.up, o.is_in))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_pg_map_is_reported_not_fatal() {
    let mut mons = MonCluster::start(1, MonOptions::default()).await;
    let dir = TempDir::new("supervision");
    let mut osds = start_osds(&mons, dir.path(), 3, "256M", 1, WAIT).await;
    let client = mons.client();
    pool_with_image(&client, ("good", 4, 3), ("img", 16 * MIB, MIB)).await;
    let bad = pool_with_image(&client, ("bad", 4, 3), ("img", 16 * MIB, MIB)).await;
    write_blocks(&open(&mons, "good").await, 1).await;
    write_blocks(&open(&mons, "bad").await, 1).await;

    // The bad pool's PG map key is lost; the monitor finds out when it loads the state.
    let key = format!("/fastblock/pgmaps/{}", bad.id);
    let saved = etcdctl(&mons, 0, &["get", &key, "--print-value-only"]);
    assert!(saved.contains("\"pgs\""), "the PG map: {saved}");
    assert_eq!(etcdctl(&mons, 0, &["del", &key]).trim(), "1");
    restart_monitor(&mut mons).await;

    // Reported: an error naming the pool and the key.
    let (status, checks) = health_checks(&client).await;
    assert_eq!(status, "HEALTH_ERR", "{checks:?}");
    let check = checks
        .iter()
        .find(|c| c.starts_with("POOL_PGMAP_MISSING: "))
        .unwrap_or_else(|| panic!("no POOL_PGMAP_MISSING check: {checks:?}"));
    assert!(
        check.contains(&format!("pool {} (\"bad\")", bad.id)),
        "{check}"
    );
    assert!(check.contains(&format!("pgmaps/{}", bad.id)), "{check}");

    // Fenced: a change to the bad pool gets a clear error.
    let new_image = |pool: &str| CreateImageRequest {
        pool: pool.into(),
        name: "new".into(),
        size_bytes: 16 * MIB,
        object_size_bytes: None,
    };
    let e = client.create_image(&new_image("bad")).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::PoolDamaged), "{e}");
    assert!(e.to_string().contains("POOL_PGMAP_MISSING"), "{e}");

    // The other pool serves IO and takes changes (the change also publishes a new epoch:
    // the OSDs now see a map without the bad pool's PG map).
    client.create_image(&new_image("good")).await.unwrap();
    let good = open(&mons, "good").await;
    check_blocks(&good, 1).await;
    write_blocks(&good, 2).await;

    // Liveness runs: a SIGKILLed OSD is marked down within its timeout, then out.
    let victim = osds[2].id;
    osds[2].kill();
    let killed = Instant::now();
    wait_until(
        DOWN_AFTER + Duration::from_secs(5),
        "the killed OSD marked down",
        || {
            let client = &client;
            async move { (!osd_state(client, victim).await?.0).then_some(()) }
        },
    )
    .await;
    let down_after = killed.elapsed();
    // The monitor counts from the OSD's last heartbeat, which came up to one heartbeat
    // interval (300 ms, `OSD_TEST_ARGS`) before the kill.
    let earliest = DOWN_AFTER - Duration::from_millis(300);
    assert!(
        down_after >= earliest,
        "marked down after only {down_after:?} (earliest allowed {earliest:?})"
    );
    wait_until(WAIT, "the killed OSD marked out", || {
        let client = &client;
        async move { (osd_state(client, victim).await? == (false, false)).then_some(()) }
    })
    .await;
    // Two of three replicas are left: the good pool still serves.
    write_blocks(&good, 3).await;

    // The key is put back: the pool returns with its data, which the OSDs kept.
    etcdctl(&mons, 0, &["put", &key, saved.trim_end()]);
    restart_monitor(&mut mons).await;
    let (_, checks) = health_checks(&client).await;
    assert!(
        !checks.iter().any(|c| c.starts_with("POOL_")),
        "damage still reported: {checks:?}"
    );
    osds[2].start();
    wait_osds_up(&client, &[victim], WAIT).await;
    check_blocks(&open(&mons, "bad").await, 1).await;
    check_blocks(&good, 3).await;
}

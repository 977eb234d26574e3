//! Scrub on real processes (`docs/design/scrub.md`): bit rot in one replica's data file,
//! which no read meets, is found by a deep scrub an operator asks for and repaired from the
//! other replicas; a block rotten on every replica cannot be, and the monitor raises
//! `PG_INCONSISTENT` until a write replaces it and a scrub finds the PG consistent again.

mod common;

use common::data_file::{find_block, flip_byte};
use common::{
    pool_with_image, stamped_block, start_osds, wait_until, MonCluster, MonOptions, TempDir, BLOCK,
};
use fastblock_client::Cluster;
use fastblock_types::{OsdId, PgId};
use std::time::Duration;

const MIB: u64 = 1 << 20;
const WAIT: Duration = Duration::from_secs(30);
const OBJECTS: u64 = 8;

fn pgid(pg: PgId) -> String {
    format!("{}.{}", pg.pool.get(), pg.seq)
}

/// `pg ls --json`'s scrub state of `pg`.
fn scrub_state(mons: &MonCluster, pg: PgId) -> serde_json::Value {
    let list = mons.cli(&["--json", "pg", "ls"]).json();
    list["pgs"]
        .as_array()
        .expect("a list of PGs")
        .iter()
        .find(|r| format!("{}.{}", r["pgid"]["pool"], r["pgid"]["seq"]) == pgid(pg))
        .map(|r| r["scrub"].clone())
        .unwrap_or_else(|| panic!("no row for pg {pg}: {list}"))
}

/// Asks for a deep scrub of `pg` and waits until the monitor shows one finished after it.
async fn deep_scrub(mons: &MonCluster, pg: PgId) {
    let before = scrub_state(mons, pg)["last_deep_scrub_unix_ms"].as_u64();
    tokio::task::block_in_place(|| mons.cli(&["pg", "deep-scrub", &pgid(pg)])).ok();
    wait_until(WAIT, "the deep scrub reported done", || async move {
        let s = tokio::task::block_in_place(|| scrub_state(mons, pg));
        let after = s["last_deep_scrub_unix_ms"].as_u64();
        (after.is_some() && after != before).then_some(())
    })
    .await;
}

fn health(mons: &MonCluster) -> String {
    tokio::task::block_in_place(|| mons.cli(&["status"])).stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deep_scrub_repairs_bit_rot_and_a_block_lost_everywhere_raises_pg_inconsistent() {
    let mons = MonCluster::start(1, MonOptions::default()).await;
    let dir = TempDir::new("scrub");
    let osds = start_osds(&mons, dir.path(), 3, "256M", 1, WAIT).await;
    let client = mons.client();
    pool_with_image(&client, ("fb", 8, 3), ("img", OBJECTS * MIB, MIB)).await;
    let cluster = Cluster::connect(mons.client_config()).await.unwrap();
    let image = cluster.open_image("fb", "img").await.unwrap();
    let offset = |i: u64| i * MIB + 4 * BLOCK;
    for i in 0..OBJECTS {
        image
            .write(offset(i), stamped_block(offset(i), 1))
            .await
            .unwrap();
    }
    // Two objects in different PGs: one rots on a follower, the other on every replica.
    let rot_one = 0;
    let rot_all = (1..OBJECTS)
        .find(|i| image.object_pg(*i) != image.object_pg(rot_one))
        .expect("objects in two PGs");
    let map = client.map().await.unwrap().map.unwrap();
    let pg_one = image.object_pg(rot_one);
    let info = &map.pgmaps[&pg_one.pool].pgs[&pg_one.seq];
    let follower: OsdId = *info
        .osdlist
        .iter()
        .find(|o| Some(**o) != info.leader)
        .unwrap();
    let path_of = |id: OsdId| osds.iter().find(|o| o.id == id).unwrap().data.clone();
    let block = |i: u64| stamped_block(offset(i), 1);
    let wait_written = |path: std::path::PathBuf, i: u64| async move {
        wait_until(WAIT, "the block in the data region", || {
            let (path, b) = (path.clone(), block(i));
            async move { find_block(&path, &b) }
        })
        .await
    };
    let at = wait_written(path_of(follower), rot_one).await;
    flip_byte(&path_of(follower), at + 7);
    for o in &osds {
        let at = wait_written(o.data.clone(), rot_all).await;
        flip_byte(&o.data, at + 7);
    }

    // The rot on one follower: nothing reads it (reads go to the leader); a deep scrub finds
    // it and the leader repairs it from the majority.
    deep_scrub(&mons, pg_one).await;
    wait_until(WAIT, "the follower's copy rewritten", || {
        let path = path_of(follower);
        async move { find_block(&path, &block(rot_one)) }
    })
    .await;
    let state = scrub_state(&mons, pg_one);
    assert_eq!(state["report"]["inconsistent_blocks"], 1, "{state}");
    assert_eq!(state["report"]["repaired_blocks"], 1, "{state}");
    assert_eq!(
        image.read(offset(rot_one), BLOCK).await.unwrap(),
        block(rot_one)
    );

    // The block rotten everywhere: no good copy, so the health check stays raised.
    let pg_all = image.object_pg(rot_all);
    deep_scrub(&mons, pg_all).await;
    wait_until(WAIT, "PG_INCONSISTENT raised", || async {
        health(&mons).contains("PG_INCONSISTENT").then_some(())
    })
    .await;
    let status = health(&mons);
    assert!(status.contains(&pgid(pg_all)), "{status}");
    assert!(image.read(offset(rot_all), BLOCK).await.is_err());

    // A write replaces the block on every replica; the next scrub finds the PG consistent.
    image
        .write(offset(rot_all), stamped_block(offset(rot_all), 2))
        .await
        .unwrap();
    deep_scrub(&mons, pg_all).await;
    wait_until(WAIT, "PG_INCONSISTENT cleared", || async {
        (!health(&mons).contains("PG_INCONSISTENT")).then_some(())
    })
    .await;
    assert_eq!(
        image.read(offset(rot_all), BLOCK).await.unwrap(),
        stamped_block(offset(rot_all), 2)
    );
}

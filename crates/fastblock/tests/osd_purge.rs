//! `fastblock-client osd purge` on real processes (etcd, a monitor in auth mode `sign`, four
//! OSDs): the refusals of an OSD that is up, in, or still the member of a PG that cannot move
//! (the only replicas it may hold), then the purge once its PGs moved off it; the purged OSD
//! gone from `osd ls`, the map and the key table, its id retired, the data still readable, and
//! its daemon restarted on its old data refused with the reason (exit status 2).

mod common;

use common::{pool_with_image, start_osds, wait_until, MonCluster, MonOptions, TempDir, BLOCK};
use fastblock_client::Cluster;
use fastblock_monclient::MonClient;
use fastblock_types::OsdId;
use std::time::Duration;

use common::stamped_block as block;

/// Exit statuses of `fastblock-client` (docs/cli.md, "Exit status").
const EXIT_NOT_FOUND: i32 = 3;
const EXIT_REFUSED: i32 = 4;

/// Whether any PG of the map names `id` (members, target, learners, incoming voters).
async fn pgs_naming(client: &MonClient, id: OsdId) -> Vec<String> {
    let list = client.pgs(None).await.expect("pg list");
    list.pgs
        .iter()
        .filter(|r| {
            let pg = &r.info;
            [&pg.osdlist, &pg.newosdlist, &pg.learners, &pg.joint_voters]
                .iter()
                .any(|l| l.contains(&id))
        })
        .map(|r| r.pgid.to_string())
        .collect()
}

/// Goal: purge removes a dead OSD for good and refuses whenever it could lose data. Method:
/// stop two OSDs (so PGs holding both cannot move), check the refusals for up, in and still a
/// member, bring one back so every PG moves off the other, purge it, and check that it is gone
/// everywhere, that every block written before is still read back, and that its daemon cannot
/// come back on its old data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_refuses_until_safe_then_removes_the_osd_for_good() {
    let mons = MonCluster::start(1, MonOptions::default()).await;
    let dir = TempDir::new("purge");
    let mut osds = start_osds(&mons, dir.path(), 4, "256M", 1, Duration::from_secs(30)).await;
    let client = mons.client();
    pool_with_image(&client, ("rbd", 16, 3), ("img", 16 << 20, 1 << 20)).await;
    let cluster = Cluster::connect(mons.client_config()).await.unwrap();
    let image = cluster.open_image("rbd", "img").await.unwrap();
    let blocks = (16 << 20) / BLOCK;
    for b in (0..blocks).step_by(7) {
        image.write(b * BLOCK, block(b * BLOCK, 1)).await.unwrap();
    }
    let victim = osds[3].id;
    let helper = osds[2].id;
    let v = victim.to_string();
    // No loopback warning: every monitor is on loopback too (crates/osd/src/reach.rs).
    assert!(
        !osds[3]
            .all_logs()
            .contains("registers the loopback address"),
        "{}",
        osds[3].all_logs()
    );

    // Up (and in): refused.
    let out = mons.cli(&["osd", "purge", &v]);
    out.fails_with(&format!("osd {victim} is up"));
    assert_eq!(out.code, EXIT_REFUSED);

    // Down but in (noout keeps it in): refused. The helper goes down too, so that the PGs
    // holding both have one replica up and cannot move.
    mons.cli(&["set", "noout"]).ok();
    assert!(osds[3].stop() && osds[2].stop());
    wait_until(Duration::from_secs(20), "both OSDs down", || {
        let client = mons.client();
        async move {
            let list = client.osds().await.ok()?;
            list.iter()
                .filter(|o| (o.id == victim || o.id == helper) && !o.up)
                .nth(1)
                .map(|_| ())
        }
    })
    .await;
    let out = mons.cli(&["osd", "purge", &v]);
    out.fails_with(&format!("osd {victim} is in"));
    assert_eq!(out.code, EXIT_REFUSED);

    // Out, but PGs with both stopped OSDs cannot move: refused, naming them.
    mons.cli(&["osd", "out", &v]).ok();
    let stuck: Vec<String> = client
        .pgs(None)
        .await
        .unwrap()
        .pgs
        .iter()
        .filter(|r| r.info.osdlist.contains(&victim) && r.info.osdlist.contains(&helper))
        .map(|r| r.pgid.to_string())
        .collect();
    assert!(!stuck.is_empty(), "balanced placement puts both on some PG");
    let out = mons.cli(&["osd", "purge", &v]);
    out.fails_with(&format!("osd {victim} is still a member of"));
    assert!(out.stderr.contains(&stuck[0]), "{}", out.stderr);
    assert_eq!(out.code, EXIT_REFUSED);

    // The helper comes back: every PG moves off the victim; then the purge goes through.
    osds[2].start();
    wait_until(
        Duration::from_secs(90),
        "PGs moved off the purged OSD",
        || {
            let client = mons.client();
            async move { pgs_naming(&client, victim).await.is_empty().then_some(()) }
        },
    )
    .await;
    let out = mons.cli(&["osd", "purge", &v]);
    assert!(
        out.ok().contains(&format!("purged osd {victim}")),
        "{}",
        out.stdout
    );

    // Gone from `osd ls`, the map and the key table.
    let ls = mons.cli(&["--json", "osd", "ls"]).json();
    let ids: Vec<u64> = ls
        .as_array()
        .expect("an array")
        .iter()
        .map(|o| o["id"].as_u64().expect("an id"))
        .collect();
    assert!(!ids.contains(&u64::from(victim.0)), "{ids:?}");
    assert_eq!(ids.len(), 3, "{ids:?}");
    let map = client.map().await.unwrap().map.expect("a map");
    assert!(!map.osds.contains_key(&victim));
    let keys = mons.cli(&["auth", "ls"]);
    assert!(
        !keys.ok().contains(&format!("osd.{victim}")),
        "{}",
        keys.stdout
    );
    assert!(
        keys.stdout.contains(&format!("osd.{helper}")),
        "{}",
        keys.stdout
    );

    // Purging it again: not found, saying it was purged.
    let out = mons.cli(&["osd", "purge", &v]);
    out.fails_with(&format!("osd {victim} was purged"));
    assert_eq!(out.code, EXIT_NOT_FOUND);

    // Its id is retired: the next OSD gets a new one.
    let next = mons.cli(&["osd", "apply-id", "0b6b3c2e-7d2f-4c59-9a55-8c2f1a1e2b3c"]);
    assert_eq!(next.ok().trim(), (victim.0 + 1).to_string());

    // Nothing written was lost.
    mons.cli(&["unset", "noout"]).ok();
    common::wait_all_active(&client, Duration::from_secs(60)).await;
    for b in (0..blocks).step_by(7) {
        let got = image.read(b * BLOCK, BLOCK).await.unwrap();
        assert!(got == block(b * BLOCK, 1), "block {b} after the purge");
    }

    // Its daemon, restarted on its old data, is refused with the reason and does not retry.
    osds[3].start();
    let status = osds[3]
        .proc
        .as_mut()
        .expect("started")
        .wait_exit(Duration::from_secs(30))
        .unwrap_or_else(|| panic!("the purged OSD kept running: {}", osds[3].log_tail()));
    assert_eq!(status.code(), Some(2), "{}", osds[3].all_logs());
    let logs = osds[3].all_logs();
    assert!(
        logs.contains(&format!("osd {victim} was purged from the cluster")),
        "{logs}"
    );
}

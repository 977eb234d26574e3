//! `max_pg_per_osd` on a real monitor: a pool that would pile more PG replicas on an OSD than
//! the limit is refused through the CLI with the count, the limit and what fits, and nothing is
//! created; the limit changes at runtime through the monitor's admin socket; lowered below
//! what the OSDs carry, `health` warns with TOO_MANY_PGS naming each OSD.

mod common;

use common::{config_cli, FakeOsd, MonCluster, MonOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_over_max_pg_per_osd_is_refused_and_health_warns_past_a_lowered_limit() {
    let mons = MonCluster::start(1, MonOptions::default()).await;
    let mut osds = Vec::new();
    for i in 0..4 {
        osds.push(FakeOsd::register(&mons, &format!("h{i}")).await);
    }
    let client = mons.client();
    // 4,096 PGs of 3 on 4 OSDs: 3,072 replicas each, past the default 250.
    let big = ["pool", "create", "big", "--pg-count", "4096", "--size", "3"];
    let out = mons.cli(&big);
    out.fails_with("would put 3072 PG replicas on osd.");
    assert!(out.stderr.contains("max_pg_per_osd 250"), "{}", out.stderr);
    assert!(out.stderr.contains("about 333 fit"), "{}", out.stderr);
    assert_eq!(out.code, 4, "refused (EXIT_REFUSED): {}", out.stderr);
    assert!(client.pools().await.unwrap().is_empty(), "nothing created");

    // Within the limit.
    mons.cli(&["pool", "create", "a", "--pg-count", "256", "--size", "3"])
        .ok();
    // Raised at runtime: the big pool fits.
    config_cli(&mons.run_dir(), &["set", "mon.a", "max_pg_per_osd", "4096"]).ok();
    mons.cli(&big).ok();
    let health = client.health().await.unwrap();
    assert!(
        health.checks.iter().all(|c| c.code != "TOO_MANY_PGS"),
        "{:?}",
        health.checks
    );

    // Lowered below what every OSD carries (3,264 each): a warning naming each OSD.
    config_cli(&mons.run_dir(), &["set", "mon.a", "max_pg_per_osd", "1000"]).ok();
    let health = client.health().await.unwrap();
    let check = health
        .checks
        .iter()
        .find(|c| c.code == "TOO_MANY_PGS")
        .unwrap_or_else(|| panic!("{:?}", health.checks));
    assert_eq!(
        check.summary,
        "4 osds carry more than 1000 PG replicas (max_pg_per_osd)"
    );
    assert_eq!(check.detail.len(), 4, "{:?}", check.detail);
    assert!(
        check.detail[0].ends_with("carries 3264 PG replicas"),
        "{:?}",
        check.detail
    );
    assert_eq!(health.status, "HEALTH_WARN");
    // A bad value is refused and changes nothing.
    let bad = config_cli(&mons.run_dir(), &["set", "mon.a", "max_pg_per_osd", "0"]);
    assert_ne!(bad.code, 0);
    assert!(bad.stderr.contains("at least 1"), "{}", bad.stderr);
    let again = client.health().await.unwrap();
    assert!(again
        .checks
        .iter()
        .any(|c| c.summary.contains("than 1000 PG")));
}

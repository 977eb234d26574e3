//! A pool of the largest PG count (131,072) on a real monitor and its own etcd: created
//! although its PGs are some 12 MB of JSON (one replica each), far past one etcd request (1.5 MiB), in several
//! transactions none larger than 1 MiB (`docs/etcd-keys.md`, "Large commits"); an OSD out
//! remaps a quarter of them the same way; the state loads whole after the monitor is killed
//! and started again.

mod common;

use common::{config_cli, http_get, wait_until, FakeOsd, MonCluster, MonOptions};
use std::time::Duration;

const PGS: u32 = 131_072;

/// A metric's value on the monitor's `/metrics` (0 if absent).
async fn metric(mons: &MonCluster, name: &str) -> f64 {
    let text = http_get(&format!("http://{}/metrics", mons.endpoints()[0]))
        .await
        .unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_of_131072_pgs_is_created_remapped_and_reloaded_in_bounded_transactions() {
    // Liveness timers far beyond a commit's time: a debug build of the monitor takes seconds
    // to decide and encode an operation on 131,072 PGs, during which heartbeats wait, and
    // this test is about the transactions, not liveness.
    let options = MonOptions {
        osd_down_after: "120s",
        osd_out_after: "600s",
        lease_ttl: "10s",
        ..MonOptions::default()
    };
    let mut mons = MonCluster::start(1, options).await;
    let mut osds = Vec::new();
    for i in 0..4 {
        osds.push(FakeOsd::register(&mons, &format!("h{i}")).await);
    }
    config_cli(
        &mons.run_dir(),
        &["set", "mon.a", "max_pg_per_osd", &PGS.to_string()],
    )
    .ok();
    let txns_before = metric(&mons, "fastblock_mon_etcd_commit_transactions_total").await;
    mons.cli(&[
        "pool",
        "create",
        "huge",
        "--pg-count",
        &PGS.to_string(),
        "--size",
        "1",
    ])
    .ok();
    let client = mons.client();
    let pgs = client.pgs(Some("huge")).await.unwrap();
    assert_eq!(pgs.pgs.len(), PGS as usize);
    let txns = metric(&mons, "fastblock_mon_etcd_commit_transactions_total").await - txns_before;
    assert!(txns >= 8.0, "12 MB of PGs in several transactions: {txns}");
    let largest = metric(&mons, "fastblock_mon_etcd_txn_bytes_max").await;
    assert!(
        largest > 0.0 && largest <= (1u64 << 20) as f64,
        "no transaction over 1 MiB: {largest}"
    );

    // An OSD out: its quarter of the PGs get another member (a PG still `creating` is
    // placed again at once, one that was created gets a target to move to).
    let out = osds[0].id;
    let target = |pg: &fastblock_types::api::PgRow| {
        if pg.info.newosdlist.is_empty() {
            pg.info.osdlist.clone()
        } else {
            pg.info.newosdlist.clone()
        }
    };
    let on_out = pgs
        .pgs
        .iter()
        .filter(|pg| target(pg).contains(&out))
        .count();
    assert!(
        on_out >= (PGS / 4 - PGS / 64) as usize,
        "about a quarter of the PGs on osd.{out}: {on_out}"
    );
    mons.cli(&["osd", "out", &out.to_string()]).ok();
    let pgs = client.pgs(Some("huge")).await.unwrap();
    let left = pgs
        .pgs
        .iter()
        .filter(|pg| target(pg).contains(&out))
        .count();
    assert_eq!(left, 0, "every PG leaves osd.{out}");

    // Killed and started again: the leader loads every PG back, the remaps included.
    let before: Vec<_> = pgs.pgs.iter().map(|pg| (pg.pgid, target(pg))).collect();
    mons.kill(0);
    // Its etcd member dies with it (PR_SET_PDEATHSIG), but a member holding this much data
    // takes a moment to let go of its port; a monitor started before that refuses to start
    // its own member on an address another process holds (as it should).
    let etcd = mons.specs[0]
        .etcd_client
        .trim_start_matches("http://")
        .to_string();
    wait_until(
        Duration::from_secs(30),
        "the old etcd member gone",
        || async { std::net::TcpStream::connect(&etcd).is_err().then_some(()) },
    )
    .await;
    mons.restart(0);
    mons.wait_leader(Duration::from_secs(60)).await;
    let after = wait_until(
        Duration::from_secs(60),
        "the PGs after a restart",
        || async { client.pgs(Some("huge")).await.ok() },
    )
    .await;
    let after: Vec<_> = after.pgs.iter().map(|pg| (pg.pgid, target(pg))).collect();
    assert_eq!(after, before);
}

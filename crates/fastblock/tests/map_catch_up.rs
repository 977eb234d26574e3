//! An OSD that missed many map epochs catches up (issue 36): frozen with SIGSTOP while the map
//! moves on past what the monitor keeps as deltas (2,000 epochs), it takes a whole map when it
//! runs again; frozen for a few epochs, it takes a delta. Either way it ends at the monitor's
//! epoch, serves a pool created while it was frozen, and its replicas match the others'.

mod common;

use common::{
    pool_with_image, start_osds, wait_all_active, wait_replicas_identical, wait_until, MonCluster,
    MonOptions, TempDir,
};
use std::time::Duration;

/// `fastblock_osd_<name>` from an OSD's `/metrics`.
async fn metric(addr: &str, name: &str) -> Option<u64> {
    let text = common::http_get(&format!("http://{addr}/metrics"))
        .await
        .ok()?;
    let prefix = format!("fastblock_osd_{name} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_osd_that_missed_many_epochs_catches_up_by_a_whole_map_or_a_delta() {
    // Down only after a minute: the frozen OSD stays a member, so that what it catches up
    // on is the map alone.
    let mons = MonCluster::start(
        1,
        MonOptions {
            osd_down_after: "60s",
            osd_out_after: "120s",
            ..MonOptions::default()
        },
    )
    .await;
    let dir = TempDir::new("map-catch-up");
    let mut osds = start_osds(&mons, dir.path(), 3, "256M", 1, Duration::from_secs(30)).await;
    let client = mons.client();
    pool_with_image(&client, ("a", 8, 3), ("img", 8 << 20, 1 << 20)).await;
    let lagger = osds[2].metrics_addr();
    let epoch_now = || async { client.map().await.unwrap().epoch.0 };
    let caught_up = |want: u64| {
        let lagger = lagger.clone();
        async move {
            wait_until(
                Duration::from_secs(30),
                "the OSD at the monitor's epoch",
                || {
                    let lagger = lagger.clone();
                    async move { (metric(&lagger, "map_epoch").await? >= want).then_some(()) }
                },
            )
            .await
        }
    };
    caught_up(epoch_now().await).await;
    let full_before = metric(&lagger, "map_full_total").await.unwrap();
    assert_eq!(full_before, 1, "one whole map, at start");

    // Frozen past the deltas the monitor keeps: 2,100 epochs and a new pool.
    osds[2].pause();
    for i in 0..2_100 {
        client.set_flag("noout", i % 2 == 0).await.unwrap();
    }
    client
        .create_pool(&fastblock_types::api::CreatePoolRequest {
            name: "b".into(),
            pg_count: 8,
            size: 3,
            failure_domain: fastblock_types::map::FailureDomain::Osd,
        })
        .await
        .unwrap();
    let target = epoch_now().await;
    osds[2].resume();
    caught_up(target).await;
    assert_eq!(
        metric(&lagger, "map_full_total").await,
        Some(full_before + 1),
        "a whole map when too far behind"
    );

    // Frozen for a few epochs: a delta.
    let deltas_before = metric(&lagger, "map_deltas_total").await.unwrap();
    osds[2].pause();
    for i in 0..5 {
        client.set_flag("noout", i % 2 == 1).await.unwrap();
    }
    let target = epoch_now().await;
    osds[2].resume();
    caught_up(target).await;
    assert_eq!(
        metric(&lagger, "map_full_total").await,
        Some(full_before + 1),
        "no whole map for a few epochs"
    );
    assert!(metric(&lagger, "map_deltas_total").await.unwrap() > deltas_before);

    // The pool made while it was frozen is served with it: every PG active, and written
    // blocks identical on the three replicas.
    client
        .create_image(&fastblock_types::api::CreateImageRequest {
            pool: "b".into(),
            name: "img".into(),
            size_bytes: 8 << 20,
            object_size_bytes: Some(1 << 20),
        })
        .await
        .unwrap();
    wait_all_active(&client, Duration::from_secs(30)).await;
    let cluster = fastblock_client::Cluster::connect(mons.client_config())
        .await
        .unwrap();
    let image = cluster.open_image("b", "img").await.unwrap();
    for i in 0..8u64 {
        let block = common::stamped_block(i << 20, 1);
        image.write(i << 20, block).await.unwrap();
    }
    wait_replicas_identical(&client, Duration::from_secs(30)).await;
}

//! A remap onto an OSD without room on real processes: the target refuses to reserve the
//! PG's snapshot, `health` says `PG_BACKFILL_TOOFULL` naming the PG and the OSD, and once
//! room is made (the data filling it removed) the remap completes by itself and the data is
//! intact.

mod common;

use bytes::Bytes;
use common::{pool_with_image, start_osds, wait_until, MonCluster, MonOptions, TempDir};
use fastblock_client::{ClientError, Cluster};
use fastblock_types::api::{CreateImageRequest, CreatePoolRequest};
use fastblock_types::map::FailureDomain;
use fastblock_types::OsdId;
use fastblock_wire::Status;
use std::time::Duration;

const MIB: u64 = 1 << 20;
const WAIT: Duration = Duration::from_secs(60);

fn pattern(offset: u64, len: u64) -> Bytes {
    (offset..offset + len)
        .map(|i| 1 + ((i / 4096 + i) % 251) as u8)
        .collect::<Vec<u8>>()
        .into()
}

/// Each check as `CODE: summary: detail; detail...`.
async fn health_checks(client: &fastblock_monclient::MonClient) -> Vec<String> {
    let h = client.health().await.expect("health");
    h.checks
        .iter()
        .map(|c| format!("{c}: {}", c.detail.join("; ")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_out_onto_a_full_osd_waits_visibly_and_completes_once_room_is_made() {
    let mons = MonCluster::start(1, MonOptions::default()).await;
    let dir = TempDir::new("toofull");
    let mut osds = start_osds(&mons, dir.path(), 4, "256M", 1, WAIT).await;
    let client = mons.client();
    let ids: Vec<OsdId> = osds.iter().map(|o| o.id).collect();
    let image_bytes = 24 * MIB;
    pool_with_image(&client, ("rep", 8, 3), ("img", image_bytes, MIB)).await;
    let cluster = Cluster::connect(mons.client_config()).await.unwrap();
    let image = cluster.open_image("rep", "img").await.unwrap();
    image.write(0, pattern(0, image_bytes)).await.unwrap();

    // A one-replica pool whose objects on the last OSD fill it until it refuses writes.
    let full = *ids.last().unwrap();
    client
        .create_pool(&CreatePoolRequest {
            name: "fill".into(),
            pg_count: 16,
            size: 1,
            failure_domain: FailureDomain::Osd,
        })
        .await
        .unwrap();
    client
        .create_image(&CreateImageRequest {
            pool: "fill".into(),
            name: "filler".into(),
            size_bytes: 1 << 30,
            object_size_bytes: Some(MIB),
        })
        .await
        .unwrap();
    common::wait_all_active(&client, WAIT).await;
    let filler = cluster.open_image("fill", "filler").await.unwrap();
    let map = client.map().await.unwrap().map.expect("the current map");
    let on_full = |index: u64| {
        let pg = filler.object_pg(index);
        map.pg(pg).is_some_and(|p| p.osdlist == vec![full])
    };
    let mut filled = 0;
    for index in (0..1024).filter(|i| on_full(*i)) {
        match filler.write(index * MIB, pattern(0, MIB)).await {
            Ok(()) => filled += 1,
            Err(ClientError::Io {
                status: Status::NoSpace,
                ..
            }) => break,
            Err(e) => panic!("filling osd {full}: {e}"),
        }
    }
    assert!(
        filled > 8,
        "osd {full} took {filled} MiB before it was full"
    );

    // The first OSD goes out: the PGs it served move, and those that need the full OSD
    // cannot be copied there.
    let out = ids[0];
    client.osd_out(out).await.unwrap();
    let check = wait_until(WAIT, "PG_BACKFILL_TOOFULL in health", || {
        let client = &client;
        async move {
            health_checks(client)
                .await
                .into_iter()
                .find(|c| c.starts_with("PG_BACKFILL_TOOFULL"))
        }
    })
    .await;
    assert!(
        check.contains(&format!("to osd.{}", full.0)),
        "the check names the full OSD: {check}"
    );
    assert!(
        check.contains("pg 1."),
        "the check names a PG of the pool: {check}"
    );
    // The data stays readable meanwhile.
    assert_eq!(image.read(0, MIB).await.unwrap(), pattern(0, MIB));

    // Room is made: the filler goes (its reclaim frees the OSD), and the remap completes.
    client.remove_image("fill", "filler").await.unwrap();
    wait_until(Duration::from_secs(120), "the remap completes", || {
        let client = &client;
        async move {
            let list = client.pgs(Some("rep")).await.ok()?;
            let done = list.pgs.iter().all(|r| {
                r.info.state.is_active()
                    && r.info.newosdlist.is_empty()
                    && !r.info.osdlist.contains(&out)
            });
            let checks = health_checks(client).await;
            (done && !checks.iter().any(|c| c.starts_with("PG_BACKFILL_TOOFULL"))).then_some(())
        }
    })
    .await;
    let got = image.read(0, image_bytes).await.unwrap();
    assert!(
        got == pattern(0, image_bytes),
        "the image reads back intact"
    );
    for osd in &mut osds {
        assert!(osd.is_running(), "osd {} died: {}", osd.id, osd.log_tail());
    }
}

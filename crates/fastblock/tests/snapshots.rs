//! The monitor's snapshot and clone API on a real monitor and a real etcd (`docs/mon-api.md`,
//! "Snapshots"). No OSD applies snap marks here: the test confirms them itself as each PG's
//! leader would (signed as an OSD) while the create call waits, and lets a create time out by
//! leaving PGs unconfirmed.

mod common;

use common::{wait_until, FakeOsd, MonCluster, MonOptions};
use fastblock_monclient::MonClient;
use fastblock_types::api::{CreateImageRequest, CreatePoolRequest, ErrorCode};
use fastblock_types::map::{FailureDomain, SnapState};
use fastblock_types::{ImageId, PgId, PoolId, SnapId};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const WAIT: Duration = Duration::from_secs(30);

async fn pool(client: &MonClient, name: &str, pg_count: u32) -> PoolId {
    client
        .create_pool(&CreatePoolRequest {
            name: name.into(),
            pg_count,
            size: 3,
            failure_domain: FailureDomain::Osd,
        })
        .await
        .unwrap()
        .id
}

async fn image(client: &MonClient, pool: &str, name: &str) -> ImageId {
    client
        .create_image(&CreateImageRequest {
            pool: pool.into(),
            name: name.into(),
            size_bytes: 16 * MIB,
            object_size_bytes: Some(MIB),
        })
        .await
        .unwrap()
        .id
}

fn code_of<T: std::fmt::Debug>(r: Result<T, fastblock_monclient::MonError>) -> (ErrorCode, String) {
    let e = r.expect_err("the call must be refused");
    (e.code().unwrap_or(ErrorCode::Unknown), e.to_string())
}

/// Waits until `pool/name` lists snapshot `snap` (recorded, still creating) and returns its id.
async fn wait_listed(client: &MonClient, pool: &str, name: &str, snap: &str) -> SnapId {
    wait_until(WAIT, "the snapshot to be recorded", || async move {
        let snaps = client.snaps(pool, name).await.ok()?;
        snaps.iter().find(|s| s.name == snap).map(|s| s.id)
    })
    .await
}

/// Takes `pool/img@snap`, confirming every PG of the pool (4) from `osd` while the call waits.
async fn snapshot(mons: &MonCluster, osd: &MonClient, pool: PoolId, img: ImageId, snap: &str) {
    let task = {
        let client = mons.client();
        let snap = snap.to_string();
        tokio::spawn(async move { client.create_snap("p", "img", &snap).await })
    };
    let id = wait_listed(&mons.client(), "p", "img", snap).await;
    for seq in 0..4 {
        osd.snap_pg_done(img, id, PgId::new(pool, seq))
            .await
            .unwrap();
    }
    let created = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the create call answers once every PG confirmed")
        .unwrap()
        .unwrap();
    assert_eq!(created.state, SnapState::Created);
}

/// Create waits for every PG's confirmation; protect, clone, children, flatten-done and the
/// removal rules; a removed snapshot leaves a trim entry in the map that goes once every PG
/// confirmed; snapshots and clones survive a monitor restart (read back from etcd), and a pool
/// deleted with its images takes their snapshot keys with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_clones_and_trims_over_the_api() {
    let mut mons = MonCluster::start(1, MonOptions::default()).await;
    let osds = [
        FakeOsd::register(&mons, "h1").await,
        FakeOsd::register(&mons, "h2").await,
        FakeOsd::register(&mons, "h3").await,
    ];
    let osd = osds[0].client();
    let client = mons.client();
    let p = pool(&client, "p", 4).await;
    pool(&client, "q", 2).await;
    let img = image(&client, "p", "img").await;

    // Create: the call waits while PGs confirm one by one.
    let task = {
        let client = mons.client();
        tokio::spawn(async move { client.create_snap("p", "img", "s1").await })
    };
    let id = wait_listed(&client, "p", "img", "s1").await;
    assert_eq!(id, SnapId(1));
    let listed = client.snaps("p", "img").await.unwrap();
    assert_eq!(listed[0].state, SnapState::Creating);
    assert_eq!(listed[0].size_bytes, 16 * MIB);
    let map = client.map().await.unwrap().map.unwrap();
    assert_eq!(
        map.snaps[&img][0].state,
        SnapState::Creating,
        "OSDs see the mark to apply"
    );
    // Only OSDs confirm marks.
    let (c, m) = code_of(client.snap_pg_done(img, id, PgId::new(p, 0)).await);
    assert_eq!(c, ErrorCode::PermissionDenied, "{m}");
    for seq in 0..3 {
        let r = osd.snap_pg_done(img, id, PgId::new(p, seq)).await.unwrap();
        assert!(!r.created, "pg {seq}");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!task.is_finished(), "the create call waits for the last PG");
    assert!(
        osd.snap_pg_done(img, id, PgId::new(p, 3))
            .await
            .unwrap()
            .created
    );
    let created = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("answered once every PG confirmed")
        .unwrap()
        .unwrap();
    assert_eq!(created.state, SnapState::Created);
    assert!(created.done_pgs.is_empty());
    let map = client.map().await.unwrap().map.unwrap();
    assert_eq!(map.snaps[&img][0].state, SnapState::Created);
    assert_eq!(client.image("p", "img").await.unwrap().snap_seq, 1);
    let (c, _) = code_of(osd.snap_pg_done(img, SnapId(7), PgId::new(p, 0)).await);
    assert_eq!(c, ErrorCode::SnapNotFound);
    let (c, _) = code_of(client.create_snap("p", "img", "s1").await);
    assert_eq!(c, ErrorCode::SnapExists);
    let (c, _) = code_of(client.create_snap("p", "img", "a@b").await);
    assert_eq!(c, ErrorCode::InvalidArgument);

    // Removal rules and clones.
    let (c, m) = code_of(client.remove_image("p", "img").await);
    assert_eq!(c, ErrorCode::SnapInUse);
    assert!(
        m.contains("image has 1 snapshots: s1; remove them first"),
        "{m}"
    );
    let (c, m) = code_of(client.clone_snap("p", "img", "s1", "q", "c").await);
    assert_eq!(c, ErrorCode::SnapNotReady, "{m}");
    assert!(
        client
            .protect_snap("p", "img", "s1")
            .await
            .unwrap()
            .protected
    );
    let clone = client.clone_snap("p", "img", "s1", "q", "c").await.unwrap();
    let parent = clone.parent.clone().expect("the clone's parent");
    assert_eq!((parent.image, parent.snap), (img, id));
    assert_eq!(parent.overlap_bytes, 16 * MIB);
    assert_eq!(clone.size_bytes, 16 * MIB);
    let children = client.snap_children("p", "img", "s1").await.unwrap();
    assert_eq!(children, vec![clone.clone()]);
    let (c, m) = code_of(client.unprotect_snap("p", "img", "s1").await);
    assert_eq!(c, ErrorCode::SnapInUse);
    assert!(m.contains("q/c"), "{m}");
    let (c, m) = code_of(client.remove_snap("p", "img", "s1").await);
    assert_eq!(c, ErrorCode::SnapInUse);
    assert!(m.contains("protected; unprotect it first"), "{m}");

    // Everything above is in etcd: a restarted monitor reads it back.
    assert!(mons.stop(0), "the monitor stops on SIGTERM");
    mons.restart(0);
    mons.wait_leader(WAIT).await;
    let snaps = client.snaps("p", "img").await.unwrap();
    assert_eq!(snaps.len(), 1);
    assert!(snaps[0].protected);
    assert_eq!(snaps[0].state, SnapState::Created);
    assert_eq!(client.image("q", "c").await.unwrap().parent, Some(parent));

    let flat = client.flatten_done("q", "c").await.unwrap();
    assert_eq!(flat.parent, None);
    assert!(client
        .snap_children("p", "img", "s1")
        .await
        .unwrap()
        .is_empty());
    assert!(
        !client
            .unprotect_snap("p", "img", "s1")
            .await
            .unwrap()
            .protected
    );
    let gone = client.remove_snap("p", "img", "s1").await.unwrap();
    assert_eq!(gone.id, id);
    assert!(client.snaps("p", "img").await.unwrap().is_empty());

    // The trim entry: listed, in the map, confirmed PG by PG.
    let trims = client.snap_trims().await.unwrap();
    assert_eq!(trims.len(), 1, "{trims:?}");
    let trim = trims[0].clone();
    assert_eq!(
        (trim.image, trim.snap, trim.reason.as_str()),
        (img, id, "removed")
    );
    let map = client.map().await.unwrap().map.unwrap();
    assert_eq!(map.snap_trims.get(&trim.id), Some(&trim));
    assert!(map.snaps.is_empty());
    let (c, m) = code_of(client.snap_trim_pg_done(trim.id, PgId::new(p, 0)).await);
    assert_eq!(c, ErrorCode::PermissionDenied, "{m}");
    for seq in 0..3 {
        let r = osd
            .snap_trim_pg_done(trim.id, PgId::new(p, seq))
            .await
            .unwrap();
        assert!(!r.finished);
    }
    assert_eq!(client.snap_trims().await.unwrap()[0].done_pgs.len(), 3);
    assert!(
        osd.snap_trim_pg_done(trim.id, PgId::new(p, 3))
            .await
            .unwrap()
            .finished
    );
    assert!(client.snap_trims().await.unwrap().is_empty());
    let (c, _) = code_of(osd.snap_trim_pg_done(trim.id, PgId::new(p, 3)).await);
    assert_eq!(c, ErrorCode::SnapTrimNotFound);

    // A pool deleted with its images takes their snapshots' keys along: after a restart
    // (which loads every key under the prefix) none is left.
    snapshot(&mons, &osd, p, img, "s2").await;
    image(&client, "p", "other").await;
    client.delete_pool("p", true).await.unwrap();
    let map = client.map().await.unwrap().map.unwrap();
    assert!(map.snaps.is_empty());
    assert!(mons.stop(0));
    mons.restart(0);
    mons.wait_leader(WAIT).await;
    let map = client.map().await.unwrap().map.unwrap();
    assert!(map.snaps.is_empty(), "{:?}", map.snaps);
    assert!(map.snap_trims.is_empty());
    assert!(client.image("q", "c").await.is_ok());
}

/// A create that not every PG confirms within `--snap-create-timeout-ms` fails naming the PGs
/// that did not confirm; the snapshot is gone and a trim entry drops what was marked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_create_times_out_naming_the_pgs_that_did_not_confirm() {
    let mons = MonCluster::start(
        1,
        MonOptions {
            snap_create_timeout_ms: 1_500,
            ..MonOptions::default()
        },
    )
    .await;
    let osds = [
        FakeOsd::register(&mons, "h1").await,
        FakeOsd::register(&mons, "h2").await,
        FakeOsd::register(&mons, "h3").await,
    ];
    let osd = osds[1].client();
    let client = mons.client();
    let p = pool(&client, "p", 4).await;
    let img = image(&client, "p", "img").await;

    let start = Instant::now();
    let task = {
        let client = mons.client();
        tokio::spawn(async move { client.create_snap("p", "img", "slow").await })
    };
    let id = wait_listed(&client, "p", "img", "slow").await;
    osd.snap_pg_done(img, id, PgId::new(p, 0)).await.unwrap();
    osd.snap_pg_done(img, id, PgId::new(p, 2)).await.unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(20), task)
        .await
        .expect("the create call answers within its timeout")
        .unwrap();
    let elapsed = start.elapsed();
    let (c, m) = code_of(answer);
    assert_eq!(c, ErrorCode::SnapCreateTimedOut, "{m}");
    assert!(
        m.contains(&format!("2: {p}.1, {p}.3")),
        "names the missing PGs: {m}"
    );
    assert!(elapsed >= Duration::from_millis(1_400), "{elapsed:?}");

    assert!(client.snaps("p", "img").await.unwrap().is_empty());
    let trims = client.snap_trims().await.unwrap();
    assert_eq!(trims.len(), 1, "{trims:?}");
    assert_eq!(trims[0].reason, "create timed out");
    assert_eq!(trims[0].snap, id);
    let (c, _) = code_of(osd.snap_pg_done(img, id, PgId::new(p, 1)).await);
    assert_eq!(
        c,
        ErrorCode::SnapNotFound,
        "a late confirmation is told it is gone"
    );
    // The id is not given again.
    let next = tokio::spawn({
        let client = mons.client();
        async move { client.create_snap("p", "img", "next").await }
    });
    let next_id = wait_listed(&client, "p", "img", "next").await;
    assert_eq!(next_id, SnapId(id.0 + 1));
    for seq in 0..4 {
        osd.snap_pg_done(img, next_id, PgId::new(p, seq))
            .await
            .unwrap();
    }
    let made = next.await.unwrap().unwrap();
    assert_eq!(made.state, SnapState::Created);
}

//! The monitors' etcd on real processes (`docs/operations.md`, "Monitor database"): its
//! history stays bounded through thousands of map changes on a small quota; with compaction
//! off the same changes fill the quota, health names it, and turning compaction back on at
//! runtime recovers without a restart; a backup restores a cluster whose monitor lost its data.

mod common;

use bytes::Bytes;
use common::{
    config_cli, pool_with_image, start_osds, wait_all_active, wait_until, MonCluster, MonOptions,
    TempDir,
};
use fastblock_client::Cluster;
use fastblock_monclient::MonClient;
use fastblock_types::api::{CreateImageRequest, ErrorCode};
use fastblock_types::etcd::{EtcdStatus, MonBackup};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const WAIT: Duration = Duration::from_secs(60);
/// Small enough that a few thousand map changes without compaction fill it.
const QUOTA: &str = "512KiB";
const QUOTA_BYTES: u64 = 512 << 10;

fn pattern(seed: u8, len: usize) -> Bytes {
    (0..len)
        .map(|i| seed.wrapping_add((i % 251) as u8) | 1)
        .collect::<Vec<u8>>()
        .into()
}

/// What the leader last saw of etcd (it looks every 2 s; waited for after a start).
async fn etcd(client: &MonClient) -> EtcdStatus {
    wait_until(WAIT, "the leader's view of etcd", || async {
        client.status().await.ok()?.etcd
    })
    .await
}

/// One map change: noout set or cleared, whichever it is not.
async fn toggle(client: &MonClient, on: &mut bool) -> Result<(), fastblock_monclient::MonError> {
    *on = !*on;
    client.set_flag("noout", *on).await.map(|_| ())
}

/// Goal: etcd's history never fills a small quota while the monitor compacts it, and the
/// monitor recovers from a full etcd by itself once compaction is back. Method: a 512 KiB
/// quota, compaction every second; 2,000 map changes with the database size sampled (it must
/// stay below the nearfull share, with no alarm); then compaction off at runtime and changes
/// until etcd refuses one (NOSPACE): health says MON_ETCD_NOSPACE naming compaction, the data
/// path still serves; then compaction on at runtime: the alarm clears, changes work again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_history_stays_bounded_and_a_full_etcd_recovers_without_a_restart() {
    let options = MonOptions {
        extra_args: [
            "--etcd-quota-bytes",
            QUOTA,
            "--etcd-compact-interval",
            "1s",
            "--etcd-history-revisions",
            "100",
            "--etcd-history-bytes",
            "64KiB",
        ]
        .map(String::from)
        .to_vec(),
        ..MonOptions::default()
    };
    let mons = MonCluster::start(1, options).await;
    let dir = TempDir::new("mon-etcd");
    // Refusals come back after this long of retries (out of space is retried: it clears).
    let quick = mons.signed(MonClient::new(mons.endpoints()).with_deadline(Duration::from_secs(2)));
    let _osds = start_osds(&mons, dir.path(), 1, "256M", 1, WAIT).await;
    let client = mons.client();
    pool_with_image(&client, ("p", 8, 1), ("img", 4 * MIB, MIB)).await;
    let cluster = Cluster::connect(mons.client_config()).await.unwrap();
    let image = cluster.open_image("p", "img").await.unwrap();
    image.write(0, pattern(1, 4096)).await.unwrap();

    // Phase 1: compaction on.
    let mut on = false;
    let start = Instant::now();
    let first_epoch = client.status().await.unwrap().epoch;
    let mut largest = 0;
    for i in 0..2000u32 {
        toggle(&client, &mut on).await.expect("a map change");
        if i % 100 == 0 {
            let e = etcd(&client).await;
            assert!(e.alarms.is_empty(), "{e:?}");
            largest = largest.max(e.db_size_bytes_max());
        }
    }
    let e = etcd(&client).await;
    let changes = client.status().await.unwrap().epoch.0 - first_epoch.0;
    eprintln!(
        "compaction on: {changes} map changes in {:?}, largest database {} KiB, now {} KiB \
         ({} KiB in use), revision {}, compacted to {:?}",
        start.elapsed(),
        largest >> 10,
        e.db_size_bytes_max() >> 10,
        e.members[0].db_size_in_use_bytes >> 10,
        e.revision,
        e.compacted_revision
    );
    assert!(changes >= 2000, "{changes}");
    assert!(
        largest < QUOTA_BYTES * 8 / 10,
        "the database reached {largest} bytes of a {QUOTA_BYTES}-byte quota"
    );
    assert!(
        e.compacted_revision.is_some_and(|r| r + 200 > e.revision),
        "{e:?}"
    );
    let health = client.health().await.unwrap();
    assert_eq!(health.status, "HEALTH_OK", "{:?}", health.checks);
    assert_eq!(image.read(0, 4096).await.unwrap(), pattern(1, 4096));

    // Phase 2: compaction off, at runtime.
    let set = config_cli(
        &mons.run_dir(),
        &["set", "mon.a", "etcd_compact_interval", "0"],
    );
    set.ok();
    let start = Instant::now();
    let mut made = 0u32;
    let refused = loop {
        match toggle(&quick, &mut on).await {
            Ok(()) => made += 1,
            Err(e) => break e,
        }
        assert!(made < 20_000, "etcd never filled with compaction off");
    };
    eprintln!(
        "compaction off: etcd refused a change after {made} more changes in {:?}: {refused}",
        start.elapsed()
    );
    assert_eq!(refused.code(), Some(ErrorCode::MonStoreFull), "{refused}");
    assert!(
        refused.to_string().contains("out of space (NOSPACE)"),
        "{refused}"
    );
    let health = wait_until(WAIT, "MON_ETCD_NOSPACE in health", || {
        let client = &client;
        async move {
            let h = client.health().await.ok()?;
            h.checks
                .iter()
                .find(|c| c.code == "MON_ETCD_NOSPACE")
                .cloned()
        }
    })
    .await;
    assert!(health.summary.contains("compaction is off"), "{health:?}");
    assert!(
        health.summary.contains("etcd_compact_interval"),
        "{health:?}"
    );
    // The data path does not go through etcd: it keeps serving.
    image.write(4096, pattern(2, 4096)).await.unwrap();
    assert_eq!(image.read(4096, 4096).await.unwrap(), pattern(2, 4096));
    // The map is still served, and changes are refused with the cause.
    client.map().await.expect("the map while etcd is full");
    let e = quick
        .create_image(&CreateImageRequest {
            pool: "p".into(),
            name: "more".into(),
            size_bytes: MIB,
            object_size_bytes: None,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::MonStoreFull), "{e}");

    // Phase 3: compaction on again, at runtime: the monitor recovers by itself.
    let start = Instant::now();
    config_cli(
        &mons.run_dir(),
        &["set", "mon.a", "etcd_compact_interval", "1s"],
    )
    .ok();
    wait_until(WAIT, "the NOSPACE alarm cleared", || {
        let client = &client;
        async move {
            let e = etcd(client).await;
            let h = client.health().await.ok()?;
            (e.alarms.is_empty() && h.checks.iter().all(|c| !c.code.starts_with("MON_ETCD")))
                .then_some(())
        }
    })
    .await;
    let e = etcd(&client).await;
    eprintln!(
        "recovered {:?} after compaction was turned on: {}; database {} KiB",
        start.elapsed(),
        e.recovery.clone().unwrap_or_default(),
        e.db_size_bytes_max() >> 10
    );
    assert!(
        e.recovery
            .as_deref()
            .is_some_and(|r| r.contains("NOSPACE cleared")),
        "{e:?}"
    );
    for _ in 0..100 {
        toggle(&client, &mut on)
            .await
            .expect("map changes after the recovery");
    }
    client
        .create_image(&CreateImageRequest {
            pool: "p".into(),
            name: "more".into(),
            size_bytes: MIB,
            object_size_bytes: None,
        })
        .await
        .expect("an image after the recovery");
    let metrics = common::http_get(&format!("http://{}/metrics", mons.specs[0].api))
        .await
        .unwrap();
    for line in [
        "fastblock_mon_etcd_quota_bytes 524288",
        "fastblock_mon_etcd_db_size_bytes{member=\"a\"}",
        "fastblock_mon_etcd_compactions_total",
        "fastblock_mon_etcd_defrags_total",
    ] {
        assert!(
            metrics.contains(line),
            "{line} missing from /metrics:\n{metrics}"
        );
    }
}

/// Goal: a backup brings back a cluster whose every monitor lost its data; the OSDs and the
/// clients carry on, every image reads back, and no id is handed out twice. Method: one
/// monitor and three OSDs holding two images; `mon backup`; an image created after it (which
/// the restore loses); the monitor killed and its data removed; started again with
/// `--restore-from`; the images read through the client that was open and a new one; a new
/// image gets an id the lost one never had; a restart with the same flag goes on, and a
/// different backup into the now full etcd is refused with status 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_restores_a_cluster_whose_monitor_lost_its_data() {
    let mut mons = MonCluster::start(1, MonOptions::default()).await;
    let dir = TempDir::new("mon-restore");
    let _osds = start_osds(&mons, dir.path(), 3, "256M", 1, WAIT).await;
    let client = mons.client();
    pool_with_image(&client, ("p", 8, 3), ("a", 8 * MIB, MIB)).await;
    client
        .create_image(&CreateImageRequest {
            pool: "p".into(),
            name: "b".into(),
            size_bytes: 4 * MIB,
            object_size_bytes: Some(MIB),
        })
        .await
        .unwrap();
    let cluster = Cluster::connect(mons.client_config()).await.unwrap();
    let a = cluster.open_image("p", "a").await.unwrap();
    let b = cluster.open_image("p", "b").await.unwrap();
    a.write(0, pattern(3, 8 * MIB as usize)).await.unwrap();
    b.write(MIB, pattern(4, MIB as usize)).await.unwrap();

    let file = dir.path().join("mon.backup");
    let out = mons.cli(&["mon", "backup", file.to_str().unwrap()]);
    assert!(out.ok().contains("backed up epoch"), "{}", out.stdout);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "a backup holds the key table");
    let backup: MonBackup = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert!(backup.keys.contains_key("auth/entities/client.admin"));
    // After the backup: an image the restore will not know.
    let lost = client
        .create_image(&CreateImageRequest {
            pool: "p".into(),
            name: "lost".into(),
            size_bytes: MIB,
            object_size_bytes: None,
        })
        .await
        .unwrap();
    let epoch_before = client.status().await.unwrap().epoch;

    // Every monitor's data gone.
    mons.kill(0);
    std::fs::remove_dir_all(mons.dir.path().join("a")).unwrap();
    mons.options.extra_args = vec!["--restore-from".into(), file.display().to_string()];
    mons.restart(0);
    mons.wait_leader(WAIT).await;
    let status = client.status().await.unwrap();
    assert!(
        status.epoch > epoch_before,
        "the restored epoch {} must pass what the daemons saw, {epoch_before}",
        status.epoch
    );
    wait_until(WAIT, "the OSDs up after the restore", || {
        let client = &client;
        async move {
            let s = client.status().await.ok()?;
            (s.osds_up == 3).then_some(())
        }
    })
    .await;
    wait_all_active(&client, WAIT).await;
    let images = client.images(Some("p")).await.unwrap();
    let names: Vec<&str> = images.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(
        names,
        vec!["a", "b"],
        "the image made after the backup is gone"
    );

    // The client that was open carries on; a new one reads the same.
    assert_eq!(
        a.read(0, 8 * MIB).await.unwrap(),
        pattern(3, 8 * MIB as usize)
    );
    b.write(0, pattern(5, 4096)).await.unwrap();
    let fresh = Cluster::connect(mons.client_config()).await.unwrap();
    let b2 = fresh.open_image("p", "b").await.unwrap();
    assert_eq!(b2.read(0, 4096).await.unwrap(), pattern(5, 4096));
    assert_eq!(b2.read(MIB, MIB).await.unwrap(), pattern(4, MIB as usize));
    let again = client
        .create_image(&CreateImageRequest {
            pool: "p".into(),
            name: "new".into(),
            size_bytes: MIB,
            object_size_bytes: None,
        })
        .await
        .unwrap();
    assert!(
        again.id > lost.id,
        "image id {} handed out again (the lost image had {})",
        again.id,
        lost.id
    );

    // The same flag on a restart: the restore is not done twice.
    mons.stop(0);
    mons.restart(0);
    mons.wait_leader(WAIT).await;
    let images = client.images(Some("p")).await.unwrap();
    assert_eq!(images.len(), 3, "{images:?}");
    // Another backup into an etcd that holds a cluster: refused, status 2, nothing changed.
    let mut other = backup.clone();
    other.taken_unix_ms += 1;
    let other_file = dir.path().join("other.backup");
    std::fs::write(&other_file, serde_json::to_vec(&other).unwrap()).unwrap();
    mons.stop(0);
    mons.options.extra_args = vec!["--restore-from".into(), other_file.display().to_string()];
    mons.restart(0);
    let proc = mons.procs[0].as_mut().unwrap();
    let exit = proc.wait_exit(WAIT).expect("the monitor exits");
    assert_eq!(exit.code(), Some(2), "{}", proc.log_tail());
    assert!(
        proc.log_tail().contains("already holds a cluster"),
        "{}",
        proc.log_tail()
    );
    mons.options.extra_args.clear();
    mons.restart(0);
    mons.wait_leader(WAIT).await;
    assert_eq!(client.images(Some("p")).await.unwrap().len(), 3);
}

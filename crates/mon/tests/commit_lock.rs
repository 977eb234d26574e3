//! Heartbeats and reads do not queue behind a commit: while etcd sits on a transaction (here
//! frozen with SIGSTOP), the leader still records heartbeats and answers reads from the last
//! published state. Before, both took the commit lock, so a slow commit made live OSDs look
//! silent to the liveness ticker, and every map long-poll waited for it.

mod common;

use fastblock_mon::election::Role;
use fastblock_mon::etcd_maint::policy::UpkeepSettings;
use fastblock_mon::etcd_maint::EtcdUpkeep;
use fastblock_mon::keys::Keyspace;
use fastblock_mon::service::Monitor;
use fastblock_mon::store::EtcdStore;
use fastblock_mon_core::liveness::LivenessConfig;
use fastblock_mon_core::MonState;
use fastblock_types::api::MonMember;
use fastblock_types::OsdId;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

fn upkeep() -> Arc<EtcdUpkeep> {
    let settings = UpkeepSettings {
        quota_bytes: 1 << 30,
        nearfull_ratio_ppm: 800_000,
        history_revisions: 1000,
        history_bytes: 64 << 20,
        defrag_interval: Duration::ZERO,
        defrag_free_ratio_ppm: 500_000,
    };
    let (_, interval) = watch::channel(Duration::from_secs(3600));
    Arc::new(EtcdUpkeep::new(settings, interval, None, None))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_and_reads_do_not_wait_for_a_commit_etcd_sits_on() {
    let (etcd, mut client) = common::etcd().await;
    let fence = common::fence(&mut client).await;
    let state = common::cluster_state(3, 64, 3);
    let mut store = EtcdStore::new(client.clone(), Keyspace::new("/fb"));
    let mut snapshot = store.load().await.unwrap();
    store.commit(fence, &mut snapshot, state).await.unwrap();

    let (_role_tx, role) = watch::channel(Role::Leader { fence });
    let me = MonMember {
        name: "a".into(),
        api_addr: "127.0.0.1:1".into(),
    };
    let mon = Arc::new(Monitor::new(
        me,
        Keyspace::new("/fb"),
        client,
        role,
        LivenessConfig::default(),
        upkeep(),
    ));
    let loaded = mon.read(|s| s.map.epoch).await.unwrap();

    etcd.signal(libc::SIGSTOP);
    let committing = {
        let mon = mon.clone();
        tokio::spawn(async move {
            mon.apply(|s: &mut MonState, _| {
                s.map.flags.noout = true;
                Ok(())
            })
            .await
        })
    };
    // Until the commit holds the lock (it then waits on the frozen etcd), bounded.
    tokio::time::timeout(Duration::from_secs(10), async {
        while mon.ctx.try_lock().is_ok() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the commit takes the commit lock");
    assert!(
        !committing.is_finished(),
        "etcd is frozen: the commit waits"
    );

    let heard = tokio::time::timeout(
        Duration::from_secs(2),
        mon.observe(|s, side| {
            side.book().liveness.heartbeat(OsdId(1), side.now_ms);
            Ok(s.map.osds.len())
        }),
    )
    .await;
    let read = tokio::time::timeout(Duration::from_secs(2), mon.read(|s| s.map.epoch)).await;
    etcd.signal(libc::SIGCONT);

    assert_eq!(
        heard
            .expect("a heartbeat is recorded while the commit waits")
            .unwrap(),
        3
    );
    assert_eq!(
        read.expect("a read is answered while the commit waits")
            .unwrap(),
        loaded,
        "readers see the last published state, not the one being committed"
    );
    tokio::time::timeout(Duration::from_secs(30), committing)
        .await
        .expect("the commit ends once etcd runs again")
        .unwrap()
        .unwrap();
    let after = mon
        .read(|s| (s.map.epoch, s.map.flags.noout))
        .await
        .unwrap();
    assert!(after.0 > loaded, "the commit published a new epoch");
    assert!(after.1, "and readers see it");
}

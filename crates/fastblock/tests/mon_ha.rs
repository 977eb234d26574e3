//! Monitor durability and availability: restart keeps every piece of state and never reuses
//! an id; three monitors form one three-member etcd cluster and survive the SIGKILL of the
//! leader; concurrent admin calls through different monitors lose no update.

mod common;

use common::{FakeOsd, MonCluster, MonOptions};
use fastblock_types::api::{CreateImageRequest, CreatePoolRequest};
use fastblock_types::map::FailureDomain;
use std::time::{Duration, Instant};

fn pool_req(name: &str, pg_count: u32) -> CreatePoolRequest {
    CreatePoolRequest {
        name: name.into(),
        pg_count,
        size: 1,
        failure_domain: FailureDomain::Osd,
    }
}

fn image_req(pool: &str, name: &str) -> CreateImageRequest {
    CreateImageRequest {
        pool: pool.into(),
        name: name.into(),
        size_bytes: 1 << 30,
        object_size_bytes: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_keeps_state_and_ids_continue() {
    let mut mons = MonCluster::start(1, MonOptions::default()).await;
    let osd = FakeOsd::register(&mons, "h1").await;
    let client = mons.client();
    let pool = client.create_pool(&pool_req("p", 8)).await.unwrap();
    let img = client.create_image(&image_req("p", "a")).await.unwrap();
    client.remove_image("p", "a").await.unwrap();
    client.set_flag("noout", true).await.unwrap();
    let map_before = client.map().await.unwrap().map.unwrap();

    assert!(mons.stop(0), "SIGTERM stops the monitor within 20 s");
    // The monitor's own etcd member went with it.
    let etcd = mons.specs[0].etcd_client.clone();
    assert!(
        std::net::TcpStream::connect(&etcd).is_err(),
        "etcd at {etcd} must be stopped"
    );

    mons.restart(0);
    mons.wait_leader(Duration::from_secs(30)).await;
    let map_after = client.map().await.unwrap().map.unwrap();
    assert_eq!(map_after.pools, map_before.pools);
    assert_eq!(map_after.pgmaps, map_before.pgmaps);
    assert_eq!(map_after.flags, map_before.flags);
    assert_eq!(
        map_after.osds.keys().collect::<Vec<_>>(),
        map_before.osds.keys().collect::<Vec<_>>()
    );
    assert!(map_after.epoch >= map_before.epoch);
    assert_eq!(
        client.reclaim().await.unwrap().len(),
        1,
        "the reclaim record survives"
    );

    let pool2 = client.create_pool(&pool_req("q", 4)).await.unwrap();
    assert!(pool2.id > pool.id);
    let img2 = client.create_image(&image_req("p", "a")).await.unwrap();
    assert!(img2.id > img.id, "image ids are not reused after a restart");
    let osd2 = FakeOsd::register(&mons, "h2").await;
    assert!(osd2.id > osd.id);
}

/// `etcdctl member list` against monitor `i`'s etcd member, logged in as its root.
fn etcdctl_members(mons: &MonCluster, i: usize) -> String {
    let out = mons
        .etcdctl(i)
        .args(["member", "list"])
        .output()
        .expect("running etcdctl (install with scripts/install-deps.sh)");
    assert!(
        out.status.success(),
        "etcdctl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_monitors_survive_the_leader_sigkill() {
    let mut mons = MonCluster::start(3, MonOptions::default()).await;
    let members = etcdctl_members(&mons, 0);
    assert_eq!(
        members.lines().count(),
        3,
        "one three-member etcd cluster:\n{members}"
    );
    for s in &mons.specs {
        assert!(
            members.contains(&format!("https://{}", s.etcd_peer)),
            "{members}"
        );
    }
    let _osd = FakeOsd::register(&mons, "h1").await;
    let client = mons.client();
    client.create_pool(&pool_req("p", 8)).await.unwrap();
    for i in 0..5 {
        client
            .create_image(&image_req("p", &format!("before{i}")))
            .await
            .unwrap();
    }
    // Any monitor answers: followers forward to the leader.
    let leader = mons.wait_leader(Duration::from_secs(10)).await;
    for (i, s) in mons.specs.iter().enumerate() {
        let one = mons.signed(fastblock_monclient::MonClient::new(vec![s.api.clone()]));
        let images = one.images(Some("p")).await.unwrap();
        assert_eq!(
            images.len(),
            5,
            "monitor {i} (leader {leader}) serves reads"
        );
    }
    let status = client.status().await.unwrap();
    assert_eq!(status.mons.len(), 3, "{status:?}");
    assert!(
        !status.health_checks.iter().any(|c| c.code == "MON_DOWN"),
        "{status:?}"
    );

    mons.kill(leader);
    let killed_at = Instant::now();
    let survivors: Vec<String> = mons
        .specs
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != leader)
        .map(|(_, s)| s.api.clone())
        .collect();
    let client = mons.signed(
        fastblock_monclient::MonClient::new(survivors).with_deadline(Duration::from_secs(30)),
    );
    client.create_image(&image_req("p", "after")).await.unwrap();
    let failover = killed_at.elapsed();
    eprintln!("monitor failover: a write succeeded {failover:?} after SIGKILL of the leader");
    assert!(
        failover < Duration::from_secs(15),
        "writes resumed after {failover:?}"
    );
    let images = client.images(Some("p")).await.unwrap();
    assert_eq!(images.len(), 6, "nothing lost: {images:?}");
    // Its member key goes with its lease: health names it.
    let killed = format!("mon.{} is down", mons.specs[leader].name);
    common::wait_until(Duration::from_secs(20), "MON_DOWN", || async {
        let h = client.health().await.ok()?;
        let check = h.checks.iter().find(|c| c.code == "MON_DOWN")?;
        (check.summary == "1 mon down of 3" && check.detail[0].starts_with(&killed)).then_some(())
    })
    .await;
    let alive = (0..3).find(|i| *i != leader).unwrap();
    assert_eq!(etcdctl_members(&mons, alive).lines().count(), 3);

    // The killed monitor rejoins with its existing etcd data.
    mons.restart(leader);
    let one = mons
        .signed(fastblock_monclient::MonClient::new(vec![mons.specs
            [leader]
            .api
            .clone()]))
        .with_deadline(Duration::from_secs(30));
    let images = one.images(Some("p")).await.unwrap();
    assert_eq!(images.len(), 6);
    common::wait_until(Duration::from_secs(20), "MON_DOWN cleared", || async {
        let h = one.health().await.ok()?;
        (!h.checks.iter().any(|c| c.code == "MON_DOWN")).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_admin_calls_lose_nothing() {
    let mons = MonCluster::start(3, MonOptions::default()).await;
    let _osd = FakeOsd::register(&mons, "h1").await;
    let client = mons.client();
    client.create_pool(&pool_req("p", 8)).await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..20 {
        // Spread the calls over all monitors so forwarding is exercised too.
        let c = mons.signed(fastblock_monclient::MonClient::new(vec![mons.specs[i % 3]
            .api
            .clone()]));
        tasks.push(tokio::spawn(async move {
            c.create_image(&image_req("p", &format!("img{i}")))
                .await
                .map(|i| i.id)
        }));
    }
    for i in 0..6 {
        let c = mons.signed(fastblock_monclient::MonClient::new(vec![mons.specs[i % 3]
            .api
            .clone()]));
        tasks.push(tokio::spawn(async move {
            c.create_pool(&pool_req(&format!("pool{i}"), 4))
                .await
                .map(|p| fastblock_types::ImageId(u64::from(p.id.0)))
        }));
    }
    let mut image_ids = Vec::new();
    for (n, t) in tasks.into_iter().enumerate() {
        let id = t
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("call {n} failed: {e}"));
        if n < 20 {
            image_ids.push(id);
        }
    }
    image_ids.sort();
    image_ids.dedup();
    assert_eq!(image_ids.len(), 20, "every image got its own id");
    assert_eq!(client.images(Some("p")).await.unwrap().len(), 20);
    assert_eq!(client.pools().await.unwrap().len(), 7);
    // Concurrent deletes and creates of pools interleave without losing either.
    let c_a = mons.signed(fastblock_monclient::MonClient::new(vec![mons.specs[1]
        .api
        .clone()]));
    let c_b = mons.signed(fastblock_monclient::MonClient::new(vec![mons.specs[2]
        .api
        .clone()]));
    let del = tokio::spawn(async move {
        let c = c_a;
        for i in 0..3 {
            c.delete_pool(&format!("pool{i}"), false).await.unwrap();
        }
    });
    let add = tokio::spawn(async move {
        let c = c_b;
        for i in 0..3 {
            c.create_pool(&pool_req(&format!("extra{i}"), 4))
                .await
                .unwrap();
        }
    });
    del.await.unwrap();
    add.await.unwrap();
    let names: Vec<String> = client
        .pools()
        .await
        .unwrap()
        .into_iter()
        .map(|p| p.name)
        .collect();
    assert_eq!(names.len(), 7, "{names:?}");
}

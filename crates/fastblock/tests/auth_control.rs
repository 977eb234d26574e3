//! Authentication of the monitor API on real monitor processes (`docs/mon-api.md`,
//! "Authentication"): who is refused, with which error, and that refusals change nothing.

mod common;

use common::*;
use fastblock_auth::request::sign_request;
use fastblock_auth::{EntityName, Keyring, Secret};
use fastblock_monclient::MonClient;
use fastblock_types::api::{BootRequest, CreatePoolRequest, ErrorCode, LeaderElectedRequest};
use fastblock_types::map::FailureDomain;
use fastblock_types::{LogIndex, PgId, PoolId, Term};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn raw(addr: &str, request: &[u8]) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf)).await;
    String::from_utf8_lossy(&buf).to_string()
}

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// An HTTP/1.1 request, signed as `who` for monitor incarnation `inc` if given.
fn request(
    method: &str,
    path: &str,
    body: &str,
    who: Option<(&EntityName, &Secret, &str)>,
) -> Vec<u8> {
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some((entity, key, inc)) = who {
        let h = sign_request(entity, key, method, path, body.as_bytes(), now_s(), inc).unwrap();
        for (name, value) in h.pairs() {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
    }
    head.push_str("\r\n");
    head.push_str(body);
    head.into_bytes()
}

/// The map epoch and the monitor's record of `pg`.
async fn pg_info(
    admin: &MonClient,
    pg: PgId,
) -> (fastblock_types::Epoch, fastblock_types::map::PgInfo) {
    let list = admin.pgs(None).await.unwrap();
    let info = list.pgs.into_iter().find(|r| r.pgid == pg).unwrap().info;
    (list.epoch, info)
}

fn pool(name: &str) -> CreatePoolRequest {
    CreatePoolRequest {
        name: name.into(),
        pg_count: 4,
        size: 3,
        failure_domain: FailureDomain::Osd,
    }
}

fn admin_key(mons: &MonCluster) -> Secret {
    Keyring::load(&mons.keyring()).unwrap().entries[&EntityName::admin()]
        .key
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_without_or_with_a_wrong_key_is_refused() {
    let mons = MonCluster::start(1, MonOptions::default()).await;
    let mode = std::fs::metadata(mons.keyring()).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o600
    );
    // No keyring where the CLI looks: the monitor's auth_required and where it looked.
    let missing = mons.dir.path().join("nope");
    let out = mons.cli(&["--keyring", missing.to_str().unwrap(), "pool", "ls"]);
    out.fails_with("auth mode sign");
    assert!(
        out.stderr.contains(missing.to_str().unwrap()),
        "{}",
        out.stderr
    );
    assert_eq!(out.stderr.trim().lines().count(), 1, "{}", out.stderr);
    // A keyring with another key for client.admin: auth_failed, bad signature.
    let wrong = mons.dir.path().join("wrong.keyring");
    Keyring::single(EntityName::admin(), Secret::generate().unwrap(), None)
        .save(&wrong)
        .unwrap();
    let out = mons.cli(&[
        "--keyring",
        wrong.to_str().unwrap(),
        "pool",
        "create",
        "p",
        "--pg-count",
        "4",
        "--size",
        "1",
    ]);
    out.fails_with("signature check failed for client.admin");
    // The right key works; nothing was created by the refused calls.
    let ls = mons.cli(&["--json", "pool", "ls"]).json();
    assert_eq!(ls.as_array().unwrap().len(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_reports_and_boots_are_refused_and_change_nothing() {
    let mons = MonCluster::start(1, MonOptions::default()).await;
    let mut osds = Vec::new();
    for i in 0..3 {
        osds.push(FakeOsd::register(&mons, &format!("h{i}")).await);
    }
    let admin = mons.client();
    admin.create_pool(&pool("p")).await.unwrap();
    let pg = PgId::new(PoolId(1), 0);
    let (epoch_before, info) = pg_info(&admin, pg).await;
    let forged = LeaderElectedRequest {
        leader: info.osdlist[0],
        term: Term(u64::MAX),
        conf_index: LogIndex(u64::MAX),
        voters: vec![info.osdlist[0]],
        voters_outgoing: Vec::new(),
        learners: Vec::new(),
    };
    let body = serde_json::to_string(&forged).unwrap();
    let addr = &mons.specs[0].api;
    let answer = raw(addr, &request("POST", "/v1/pgs/1.0/leader", &body, None)).await;
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    assert!(answer.contains("\"code\":\"auth_required\""), "{answer}");
    // Signed by the admin (no osd cap): forbidden too.
    let key = admin_key(&mons);
    let inc = mon_incarnation(addr).await;
    let answer = raw(
        addr,
        &request(
            "POST",
            "/v1/pgs/1.0/leader",
            &body,
            Some((&EntityName::admin(), &key, &inc)),
        ),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    let (epoch_after, now) = pg_info(&admin, pg).await;
    assert_eq!(now.leader_term, info.leader_term);
    assert_eq!(now.osdlist, info.osdlist);
    assert_eq!(epoch_after, epoch_before);

    // osd.2's boot, signed with osd.1's key or unsigned with osd.2's uuid: refused.
    let (one, two) = (&osds[0], &osds[1]);
    let boot = BootRequest {
        uuid: two.uuid.clone(),
        address: "127.0.0.9".into(),
        port: 1,
        shards: 1,
        host: "evil".into(),
        capacity_bytes: 1,
        config: String::new(),
        lease_timing: None,
    };
    let as_one = MonClient::new(mons.endpoints())
        .with_credentials(EntityName::Osd(one.id), one.key.clone().unwrap());
    let err = as_one.boot(two.id, &boot).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::PermissionDenied), "{err}");
    let err = MonClient::new(mons.endpoints())
        .boot(two.id, &boot)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::AuthRequired), "{err}");
    let o = admin.osds().await.unwrap();
    let o2 = o.iter().find(|o| o.id == two.id).unwrap();
    assert_eq!(o2.address, "127.0.0.1");
    assert_ne!(o2.host, "evil");
}

/// A compromised OSD's key confirms work for a PG it does not host: a reclaim (the monitor
/// would drop the entry with that PG's data still there) through the batch and the
/// single-report endpoint alike. Refused, nothing recorded; the PG's member is heard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmation_from_an_osd_outside_the_pg_is_refused() {
    use fastblock_types::api::{CreateImageRequest, OsdReport, ReportBatch, ResizeImageRequest};
    let mons = MonCluster::start(1, MonOptions::default()).await;
    let mut osds = Vec::new();
    for i in 0..4 {
        osds.push(FakeOsd::register(&mons, &format!("h{i}")).await);
    }
    let admin = mons.client();
    admin
        .create_pool(&CreatePoolRequest {
            size: 2,
            ..pool("p")
        })
        .await
        .unwrap();
    admin
        .create_image(&CreateImageRequest {
            pool: "p".into(),
            name: "img".into(),
            size_bytes: 16 << 20,
            object_size_bytes: Some(1 << 20),
        })
        .await
        .unwrap();
    admin
        .resize_image(
            "p",
            "img",
            &ResizeImageRequest {
                size_bytes: 4 << 20,
                allow_shrink: true,
            },
        )
        .await
        .unwrap();
    let entry = admin
        .reclaim()
        .await
        .unwrap()
        .pop()
        .expect("a reclaim entry");
    let pg = PgId::new(PoolId(1), 0);
    let (_, info) = pg_info(&admin, pg).await;
    let as_osd = |o: &FakeOsd| {
        MonClient::new(mons.endpoints())
            .with_credentials(EntityName::Osd(o.id), o.key.clone().unwrap())
    };
    let stranger = osds
        .iter()
        .find(|o| !info.osdlist.contains(&o.id))
        .expect("4 OSDs, 2 replicas");
    let member = osds.iter().find(|o| o.id == info.osdlist[0]).unwrap();
    let confirm = ReportBatch {
        reports: vec![OsdReport::ReclaimDone { pg, id: entry.id }],
    };
    let answer = as_osd(stranger)
        .reports(stranger.id, &confirm)
        .await
        .unwrap();
    let refused = answer.results[0].clone().expect("refused");
    assert_eq!(refused.code, ErrorCode::ImplausibleReport, "{refused:?}");
    let err = as_osd(stranger)
        .reclaim_pg_done(entry.id, pg)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::ImplausibleReport), "{err}");
    let now = admin.reclaim().await.unwrap();
    assert_eq!(now, vec![entry.clone()], "nothing recorded");
    let answer = as_osd(member).reports(member.id, &confirm).await.unwrap();
    assert_eq!(answer.results, vec![None]);
    let now = admin.reclaim().await.unwrap();
    assert!(now[0].done_pgs.contains(&0), "{now:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caps_rotation_removal_and_replays() {
    let mons = MonCluster::start(1, MonOptions::default()).await;
    let admin = mons.client();
    let vm = admin.auth_add("client.vm", "pool=a").await.unwrap();
    assert_eq!(vm.caps, "pool=a");
    let as_vm = || {
        MonClient::new(mons.endpoints())
            .with_deadline(Duration::from_secs(5))
            .with_credentials(vm.entity.clone(), vm.key.clone())
    };
    // Reads work; creating pools and images is forbidden.
    assert!(as_vm().map().await.unwrap().map.is_some());
    let err = as_vm().create_pool(&pool("a")).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::PermissionDenied), "{err}");
    assert!(err.to_string().contains("needs caps admin"), "{err}");
    assert!(admin.pools().await.unwrap().is_empty());
    // The CLI as client.vm with a keyring written by `auth get-or-create -o`.
    let ring = mons.dir.path().join("vm.keyring");
    mons.cli(&[
        "auth",
        "get-or-create",
        "client.vm",
        "--caps",
        "pool=a",
        "-o",
        ring.to_str().unwrap(),
    ])
    .ok();
    let out = mons.cli(&[
        "--keyring",
        ring.to_str().unwrap(),
        "--name",
        "client.vm",
        "pool",
        "create",
        "x",
        "--pg-count",
        "4",
        "--size",
        "1",
    ]);
    out.fails_with("needs caps admin");
    let ls = mons.cli(&["--json", "auth", "ls"]).json();
    assert_eq!(ls.as_array().unwrap().len(), 2, "{ls}");

    // Rotation: the old key fails, the new one works.
    let epoch = admin.map().await.unwrap().epoch;
    let rotated = admin.auth_rotate("client.vm").await.unwrap();
    assert_eq!(rotated.generation, 2);
    assert!(admin.map().await.unwrap().epoch > epoch);
    let err = as_vm().map().await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::AuthFailed), "{err}");
    let new_vm = MonClient::new(mons.endpoints())
        .with_credentials(rotated.entity.clone(), rotated.key.clone());
    new_vm.map().await.unwrap();
    // Removal: refused from then on; the last admin cannot be removed.
    admin.auth_rm("client.vm").await.unwrap();
    let err = new_vm.map().await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::AuthFailed), "{err}");
    assert!(
        err.to_string().contains("unknown entity client.vm"),
        "{err}"
    );
    assert!(admin.auth_rm("client.admin").await.is_err());

    // The same signed request twice: the second is a replay.
    let key = admin_key(&mons);
    let addr = &mons.specs[0].api;
    let inc = mon_incarnation(addr).await;
    let req = request(
        "GET",
        "/v1/pools",
        "",
        Some((&EntityName::admin(), &key, &inc)),
    );
    let first = raw(addr, &req).await;
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    let second = raw(addr, &req).await;
    assert!(second.starts_with("HTTP/1.1 401"), "{second}");
    assert!(second.contains("replayed request"), "{second}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_signed_call_is_served_once() {
    let mons = MonCluster::start(3, MonOptions::default()).await;
    let leader = mons.wait_leader(Duration::from_secs(30)).await;
    let follower = (leader + 1) % 3;
    let key = admin_key(&mons);
    let body = serde_json::to_string(&pool("p")).unwrap();
    let _osds = [
        FakeOsd::register(&mons, "h0").await,
        FakeOsd::register(&mons, "h1").await,
        FakeOsd::register(&mons, "h2").await,
    ];
    let addr = &mons.specs[follower].api;
    let inc = mon_incarnation(addr).await;
    let req = request(
        "POST",
        "/v1/pools",
        &body,
        Some((&EntityName::admin(), &key, &inc)),
    );
    let first = raw(addr, &req).await;
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    let again = raw(&mons.specs[leader].api, &req).await;
    assert!(again.contains("replayed request"), "{again}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mode_none_works_without_keys() {
    let mons = MonCluster::start(
        1,
        MonOptions {
            auth_mode: "none",
            ..MonOptions::default()
        },
    )
    .await;
    // Unsigned calls work (the keyring the harness passed holds an admin key for later).
    let client = MonClient::new(mons.endpoints());
    for i in 0..3 {
        FakeOsd::register(&mons, &format!("h{i}")).await;
    }
    client.create_pool(&pool("p")).await.unwrap();
    let missing = mons.dir.path().join("nope");
    let out = mons.cli(&["--keyring", missing.to_str().unwrap(), "auth", "mode"]);
    assert_eq!(out.ok().trim(), "none");
    // A keyed CLI refuses the unsigned answers of mode none unless its floor is lowered on
    // purpose (`docs/security.md`, "No downgrade").
    mons.cli(&["auth", "mode"])
        .fails_with("the answer is not signed");
    // Switching to sign: unsigned calls are refused from then on, signed ones work.
    mons.cli(&["--auth-floor", "none", "auth", "mode", "sign"])
        .ok();
    let err = client.pools().await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::AuthRequired), "{err}");
    assert_eq!(mons.client().pools().await.unwrap().len(), 1);
}

/// A client limited to pool `a` lists, reads and follows the image records of `a` only:
/// pool `b`'s images are neither listed nor shown, nor are its snapshots or its clones of
/// `a`'s snapshots; the admin sees everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_limited_client_sees_only_its_pools_images() {
    use fastblock_types::api::CreateImageRequest;
    let mons = MonCluster::start(1, MonOptions::default()).await;
    let dir = TempDir::new("pool-limited");
    // Real OSDs: a snapshot is created once every PG leader applied its mark.
    let _osds = start_osds(&mons, dir.path(), 3, "256M", 1, Duration::from_secs(60)).await;
    let admin = mons.client();
    for (p, image) in [("a", "x"), ("b", "y")] {
        admin.create_pool(&pool(p)).await.unwrap();
        admin
            .create_image(&CreateImageRequest {
                pool: p.into(),
                name: image.into(),
                size_bytes: 1 << 20,
                object_size_bytes: None,
            })
            .await
            .unwrap();
    }
    let tenant = admin.auth_add("client.t", "pool=a").await.unwrap();
    let as_tenant = MonClient::new(mons.endpoints())
        .with_deadline(Duration::from_secs(5))
        .with_credentials(tenant.entity.clone(), tenant.key.clone());
    let names = |images: Vec<fastblock_types::map::ImageInfo>| -> Vec<String> {
        images
            .into_iter()
            .map(|i| format!("{}/{}", i.pool_name, i.name))
            .collect()
    };
    assert_eq!(names(as_tenant.images(None).await.unwrap()), ["a/x"]);
    assert_eq!(names(as_tenant.images(Some("a")).await.unwrap()), ["a/x"]);
    assert_eq!(names(admin.images(None).await.unwrap()), ["a/x", "b/y"]);
    assert_eq!(as_tenant.image("a", "x").await.unwrap().name, "x");
    for err in [
        as_tenant.images(Some("b")).await.unwrap_err(),
        as_tenant.image("b", "y").await.unwrap_err(),
        as_tenant.snaps("b", "y").await.unwrap_err(),
    ] {
        assert_eq!(err.code(), Some(ErrorCode::PermissionDenied), "{err}");
        assert!(err.to_string().contains("do not allow pool \"b\""), "{err}");
    }
    // A clone in b of a's snapshot: listed as a child to the admin, not to the tenant.
    wait_all_active(&admin, Duration::from_secs(60)).await;
    admin.create_snap("a", "x", "s").await.unwrap();
    admin.protect_snap("a", "x", "s").await.unwrap();
    admin.clone_snap("a", "x", "s", "b", "z").await.unwrap();
    assert_eq!(
        names(admin.snap_children("a", "x", "s").await.unwrap()),
        ["b/z"]
    );
    assert!(as_tenant
        .snap_children("a", "x", "s")
        .await
        .unwrap()
        .is_empty());
    // The CLI as the tenant lists the same.
    let ring = mons.dir.path().join("t.keyring");
    mons.cli(&[
        "auth",
        "get-or-create",
        "client.t",
        "--caps",
        "pool=a",
        "-o",
        ring.to_str().unwrap(),
    ])
    .ok();
    let ls = mons
        .cli(&[
            "--keyring",
            ring.to_str().unwrap(),
            "--name",
            "client.t",
            "image",
            "ls",
        ])
        .ok()
        .to_string();
    assert!(ls.contains("a/x") && !ls.contains("b/y"), "{ls}");
}

/// A key that makes signed calls as fast as it can, here a tenant's limited to one pool, is
/// refused once it has made its share of the replay window's calls (200 on this monitor,
/// `--signed-calls-per-entity-max`), and only it: client.admin's calls and an OSD's
/// heartbeats are served meanwhile, so one key cannot deny service to the others by filling
/// the monitor's replay cache (docs/security.md, "Monitor calls").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_cannot_fill_the_replay_cache_of_a_running_monitor() {
    const SHARE: usize = 200;
    let mons = MonCluster::start(
        1,
        MonOptions {
            extra_args: vec!["--signed-calls-per-entity-max".into(), SHARE.to_string()],
            ..MonOptions::default()
        },
    )
    .await;
    let admin = mons.client();
    let osd = FakeOsd::register(&mons, "h0").await;
    let tenant = admin.auth_add("client.tenant", "pool=a").await.unwrap();
    let tenant = MonClient::new(mons.endpoints())
        .with_credentials(tenant.entity, tenant.key)
        .with_deadline(Duration::from_secs(10));
    let mut served = 0;
    let refusal = loop {
        match tenant.pools().await {
            Ok(_) => served += 1,
            Err(e) => break e,
        }
        assert!(served <= SHARE, "more than its share was served");
    };
    assert_eq!(refusal.code(), Some(ErrorCode::AuthFailed), "{refusal}");
    assert!(
        refusal
            .to_string()
            .contains(&format!("client.tenant made {SHARE} signed requests")),
        "{refusal}"
    );
    // Its share, less the call that learned the monitor's incarnation (refused before its
    // nonce is remembered).
    assert!(served >= SHARE - 1, "served {served}");
    // The others are served.
    admin.status().await.expect("client.admin is served");
    let beat = osd
        .client()
        .heartbeat(
            osd.id,
            &fastblock_types::api::HeartbeatRequest {
                uuid: osd.uuid.clone(),
                ..Default::default()
            },
        )
        .await;
    assert!(beat.is_ok(), "the OSD's heartbeat is served: {beat:?}");
    // And the tenant stays refused.
    let again = tenant.pools().await.unwrap_err();
    assert_eq!(again.code(), Some(ErrorCode::AuthFailed), "{again}");
}

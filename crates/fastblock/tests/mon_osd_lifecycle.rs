//! OSD timers and flags against a real monitor, driven by fake OSDs that apply ids, boot and
//! heartbeat like real ones: down, out, noout, manual out/in, norebalance; PG states and
//! `newosdlist` follow reference section 4 (without its bugs), and remaps move only what they
//! must.

mod common;

use common::{wait_until, FakeOsd, MonCluster, MonOptions};
use fastblock_monclient::MonClient;
use fastblock_types::api::{ErrorCode, LeaderElectedRequest, MembershipFinishedRequest, PgList};
use fastblock_types::map::{FailureDomain, PgInfo};
use fastblock_types::{LogIndex, OsdId, PgId, Term};
use std::collections::BTreeMap;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(20);

async fn pgs(client: &MonClient) -> BTreeMap<PgId, PgInfo> {
    let list: PgList = client.pgs(None).await.unwrap();
    list.pgs.into_iter().map(|r| (r.pgid, r.info)).collect()
}

/// Every PG's first member reports itself leader, as a freshly elected Raft leader would.
async fn elect_all(client: &MonClient, osds: &[FakeOsd], term: u64) {
    for (pg, info) in pgs(client).await {
        let req = LeaderElectedRequest {
            leader: info.osdlist[0],
            term: Term(term),
            conf_index: info.conf_index,
            voters: info.osdlist.clone(),
            voters_outgoing: Vec::new(),
            learners: Vec::new(),
        };
        reporter(osds, req.leader)
            .leader_elected(pg, &req)
            .await
            .unwrap();
    }
}

/// A client signing as OSD `id` (a PG report comes from the leader it names).
fn reporter(osds: &[FakeOsd], id: OsdId) -> MonClient {
    osds.iter()
        .find(|o| o.id == id)
        .expect("the reporting OSD")
        .client()
}

/// Completes every pending remap as a PG leader would after its joint-consensus change.
async fn finish_remaps(client: &MonClient, osds: &[FakeOsd], term: u64) -> usize {
    let mut n = 0;
    for (pg, info) in pgs(client).await {
        if info.newosdlist.is_empty() {
            continue;
        }
        let req = MembershipFinishedRequest {
            leader: info.newosdlist[0],
            term: Term(term),
            conf_index: LogIndex(info.conf_index.0 + 2),
            voters: info.newosdlist.clone(),
            learners: Vec::new(),
        };
        reporter(osds, req.leader)
            .membership_finished(pg, &req)
            .await
            .unwrap();
        n += 1;
    }
    n
}

async fn osd_state(client: &MonClient, id: OsdId) -> (bool, bool) {
    let osds = client.osds().await.unwrap();
    let o = osds.iter().find(|o| o.id == id).unwrap();
    (o.up, o.is_in)
}

async fn setup(n_osds: usize, pg_count: u32) -> (MonCluster, Vec<FakeOsd>, MonClient) {
    let mons = MonCluster::start(1, MonOptions::default()).await;
    let mut osds = Vec::new();
    for i in 0..n_osds {
        osds.push(FakeOsd::register(&mons, &format!("host{i}")).await);
    }
    let client = mons.client();
    let req = fastblock_types::api::CreatePoolRequest {
        name: "fb".into(),
        pg_count,
        size: 3,
        failure_domain: FailureDomain::Osd,
    };
    client.create_pool(&req).await.unwrap();
    (mons, osds, client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn down_then_out_remaps_only_the_pgs_of_the_lost_osd() {
    let (mons, mut osds, client) = setup(5, 32).await;
    let before = pgs(&client).await;
    assert!(
        before.values().all(|p| p.state.0 == 1),
        "new PGs are creating"
    );
    elect_all(&client, &osds, 1).await;
    let active = pgs(&client).await;
    assert!(
        active.values().all(|p| p.state.is_active()),
        "a leader report makes PGs active"
    );

    // Pick the OSD holding the most PGs and silence it.
    let victim = osds
        .iter()
        .map(|o| o.id)
        .max_by_key(|id| active.values().filter(|p| p.osdlist.contains(id)).count())
        .unwrap();
    let held: Vec<PgId> = active
        .iter()
        .filter(|(_, p)| p.osdlist.contains(&victim))
        .map(|(id, _)| *id)
        .collect();
    osds.iter_mut()
        .find(|o| o.id == victim)
        .unwrap()
        .stop_heartbeats();

    // Down: its PGs become undersize (4), the others stay active and untouched.
    wait_until(WAIT, "victim down", || async {
        (!osd_state(&client, victim).await.0).then_some(())
    })
    .await;
    let down = pgs(&client).await;
    for (pg, info) in &down {
        if held.contains(pg) {
            assert_eq!(info.state.0, 4, "pg {pg} holding the down osd is undersize");
        } else {
            assert_eq!(
                info, &active[pg],
                "pg {pg} without the down osd must not change"
            );
        }
    }

    // Out: each held PG is remapped (undersize+remapped = 20) with exactly the victim replaced.
    wait_until(WAIT, "victim out", || async {
        (!osd_state(&client, victim).await.1).then_some(())
    })
    .await;
    let out = pgs(&client).await;
    for (pg, info) in &out {
        if !held.contains(pg) {
            assert_eq!(
                info, &active[pg],
                "pg {pg} without the out osd must not change"
            );
            continue;
        }
        assert_eq!(info.state.0, 20, "pg {pg}: {info:?}");
        assert_eq!(info.newosdlist.len(), 3);
        assert!(!info.newosdlist.contains(&victim));
        let kept: Vec<_> = info.osdlist.iter().filter(|o| **o != victim).collect();
        for k in kept {
            assert!(
                info.newosdlist.contains(k),
                "pg {pg}: surviving member {k} kept"
            );
        }
        assert!(info.version > active[pg].version);
    }

    // The PG leaders finish the changes: all active, victim gone from every PG.
    assert_eq!(finish_remaps(&client, &osds, 2).await, held.len());
    let done = pgs(&client).await;
    for (pg, info) in &done {
        assert!(info.state.is_active(), "pg {pg}: {info:?}");
        assert!(!info.osdlist.contains(&victim));
    }

    // The victim comes back: boot makes it up and in, and a rebalance moves some PGs to it,
    // each move replacing exactly one member.
    osds.iter_mut()
        .find(|o| o.id == victim)
        .unwrap()
        .boot()
        .await;
    assert_eq!(osd_state(&client, victim).await, (true, true));
    let rebalanced = pgs(&client).await;
    let moved: Vec<_> = rebalanced
        .iter()
        .filter(|(_, p)| !p.newosdlist.is_empty())
        .collect();
    assert!(!moved.is_empty(), "an empty OSD coming in receives PGs");
    for (pg, info) in &moved {
        assert!(
            info.newosdlist.contains(&victim),
            "pg {pg} moves to the returning osd"
        );
        let common = info
            .osdlist
            .iter()
            .filter(|o| info.newosdlist.contains(o))
            .count();
        assert_eq!(common, 2, "pg {pg}: one member replaced per move");
        assert_eq!(info.state.0, 16, "pg {pg} remapped while active");
    }
    finish_remaps(&client, &osds, 3).await;
    let counts = fastblock_placement_counts(&pgs(&client).await);
    let (min, max) = (
        counts.values().min().unwrap(),
        counts.values().max().unwrap(),
    );
    assert!(max - min <= 1, "balanced after rebalance: {counts:?}");
    drop(mons);
}

fn fastblock_placement_counts(pgs: &BTreeMap<PgId, PgInfo>) -> BTreeMap<OsdId, usize> {
    let mut counts = BTreeMap::new();
    for info in pgs.values() {
        for o in &info.osdlist {
            *counts.entry(*o).or_insert(0) += 1;
        }
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn noout_manual_out_in_and_norebalance() {
    let (mons, mut osds, client) = setup(4, 16).await;
    elect_all(&client, &osds, 1).await;

    // noout: a silent OSD goes down but never out.
    client.set_flag("noout", true).await.unwrap();
    let victim = osds[0].id;
    osds[0].stop_heartbeats();
    wait_until(WAIT, "down", || async {
        (!osd_state(&client, victim).await.0).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await; // longer than down + out timers
    assert_eq!(
        osd_state(&client, victim).await,
        (false, true),
        "noout keeps it in"
    );
    let status = client.status().await.unwrap();
    assert!(
        status
            .health_checks
            .iter()
            .any(|c| c.code == "OSDMAP_FLAGS" && c.summary.contains("noout")),
        "{status:?}"
    );

    // In is refused while down; out works manually; clearing noout does nothing more.
    let err = client.osd_in(victim).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::OsdDown));
    client.osd_out(victim).await.unwrap();
    assert_eq!(osd_state(&client, victim).await, (false, false));
    client.set_flag("noout", false).await.unwrap();
    finish_remaps(&client, &osds, 2).await;

    // A down OSD that heartbeats again comes back up (a healed partition) but stays out.
    osds[0].start_heartbeats();
    wait_until(WAIT, "up again", || async {
        osd_state(&client, victim).await.0.then_some(())
    })
    .await;
    assert_eq!(osd_state(&client, victim).await, (true, false));

    // norebalance defers the rebalance of a manual in until the flag is cleared.
    client.set_flag("norebalance", true).await.unwrap();
    let before = pgs(&client).await;
    client.osd_in(victim).await.unwrap();
    let after_in = pgs(&client).await;
    assert!(
        after_in.values().all(|p| p.newosdlist.is_empty()),
        "no remap while norebalance"
    );
    assert_eq!(before, after_in);
    client.set_flag("norebalance", false).await.unwrap();
    let after_unset = pgs(&client).await;
    assert!(
        after_unset.values().any(|p| p.newosdlist.contains(&victim)),
        "clearing norebalance runs the deferred rebalance"
    );
    drop(mons);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_reports_are_fenced_and_validated() {
    let (mons, osds, admin) = setup(3, 4).await;
    let pg = PgId::new(fastblock_types::PoolId(1), 0);
    let info = pgs(&admin).await[&pg].clone();
    // Reports come from the PG's leader (only OSD keys may send them).
    let client = reporter(&osds, info.osdlist[0]);
    let report = |term: u64, conf: u64, voters: Vec<OsdId>| LeaderElectedRequest {
        leader: voters[0],
        term: Term(term),
        conf_index: LogIndex(conf),
        voters,
        voters_outgoing: Vec::new(),
        learners: Vec::new(),
    };
    client
        .leader_elected(pg, &report(5, 3, info.osdlist.clone()))
        .await
        .unwrap();
    // An older term is stale and changes nothing.
    let err = client
        .leader_elected(pg, &report(4, 9, info.osdlist.clone()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::StaleReport));
    // Unknown members and non-voter leaders are refused.
    let err = client
        .leader_elected(pg, &report(6, 3, vec![info.osdlist[0], OsdId(77)]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::InvalidArgument));
    // A report naming another OSD as leader than the one whose key signed it.
    let mut others = info.osdlist.clone();
    others.rotate_left(1);
    let err = client
        .leader_elected(pg, &report(6, 3, others))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::PermissionDenied), "{err}");
    let bad = LeaderElectedRequest {
        leader: OsdId(99),
        ..report(6, 3, info.osdlist.clone())
    };
    assert!(client.leader_elected(pg, &bad).await.is_err());
    // The report of issue 16: term and index 2^64-1 and one voter. It would take the other
    // members out of the map (they delete their replicas) and fence out genuine reports.
    let took_over = LeaderElectedRequest {
        term: Term(u64::MAX),
        conf_index: LogIndex(u64::MAX),
        ..report(6, 3, vec![info.osdlist[0]])
    };
    let err = client.leader_elected(pg, &took_over).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::ImplausibleReport), "{err}");
    let dropped = report(6, 3, vec![info.osdlist[0]]);
    let err = client.leader_elected(pg, &dropped).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::ImplausibleReport), "{err}");
    let missing = PgId::new(fastblock_types::PoolId(1), 99);
    let err = client
        .leader_elected(missing, &report(6, 3, info.osdlist.clone()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::PgNotFound));
    let now = pgs(&client).await[&pg].clone();
    assert_eq!(now.leader_term, Term(5));
    assert_eq!(now.osdlist, info.osdlist);
    assert!(now.state.is_active());
    drop(mons);
}

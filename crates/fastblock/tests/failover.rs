//! The reference failover suite (FO1-FO6, ST4-ST6) on real processes: real etcd and monitors,
//! OSDs killed with SIGKILL, a client writing stamped blocks throughout. After every case:
//! every PG active, all replicas of every PG identical, every acknowledged write readable.
//! Each case prints its convergence time (`cargo test --test failover -- --nocapture`).

mod common;

use bytes::Bytes;
use common::{stamped_block as block, BLOCK};
use common::{wait_osds_up, MonCluster, MonOptions, OsdProc, TempDir, WireConn};
use fastblock_client::{ClientError, Cluster, Image};
use fastblock_monclient::MonClient;
use fastblock_types::map::ClusterMap;
use fastblock_types::pg_state::PgState;
use fastblock_types::{OsdId, PgId};
use fastblock_wire::{Reply, Request};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CONVERGE: Duration = Duration::from_secs(90);

struct Fx {
    mons: MonCluster,
    dir: TempDir,
    osds: Vec<OsdProc>,
    client: MonClient,
    image: Arc<Image>,
    _cluster: Arc<Cluster>,
}

struct Spec {
    osds: usize,
    mons: usize,
    out_after: &'static str,
    osd_args: &'static [&'static str],
    pg_count: u32,
    image_bytes: u64,
    object_bytes: u64,
}

impl Default for Spec {
    fn default() -> Self {
        Spec {
            osds: 4,
            mons: 1,
            out_after: "3s",
            osd_args: &[],
            pg_count: 8,
            image_bytes: 16 << 20,
            object_bytes: 1 << 20,
        }
    }
}

async fn fixture(spec: Spec) -> Fx {
    let mons = MonCluster::start(
        spec.mons,
        MonOptions {
            osd_down_after: "2s",
            osd_out_after: spec.out_after,
            lease_ttl: "3s",
            ..MonOptions::default()
        },
    )
    .await;
    let dir = TempDir::new("failover");
    let osds: Vec<OsdProc> = (0..spec.osds)
        .map(|i| OsdProc::create_with(&mons, dir.path(), &format!("h{i}"), "512M", spec.osd_args))
        .collect();
    let client = mons.client();
    let ids: Vec<OsdId> = osds.iter().map(|o| o.id).collect();
    wait_osds_up(&client, &ids, Duration::from_secs(30)).await;
    common::pool_with_image(
        &client,
        ("fb", spec.pg_count, 3),
        ("img", spec.image_bytes, spec.object_bytes),
    )
    .await;
    let mut config = mons.client_config();
    config.op_deadline = Duration::from_secs(60);
    let cluster = Cluster::connect(config).await.unwrap();
    let image = Arc::new(cluster.open_image("fb", "img").await.unwrap());
    Fx {
        mons,
        dir,
        osds,
        client,
        image,
        _cluster: cluster,
    }
}

impl Fx {
    fn osd(&mut self, id: OsdId) -> &mut OsdProc {
        self.osds
            .iter_mut()
            .find(|o| o.id == id)
            .expect("known osd")
    }

    async fn map(&self) -> ClusterMap {
        self.client.map().await.unwrap().map.unwrap()
    }

    /// A PG of the image's pool, its leader and members.
    async fn pg_info(&self, pg: PgId) -> (Option<OsdId>, Vec<OsdId>, Vec<OsdId>, PgState) {
        let map = self.map().await;
        let info = map.pg(pg).expect("pg exists");
        (
            info.leader,
            info.osdlist.clone(),
            info.newosdlist.clone(),
            info.state,
        )
    }
}

/// Writes stamped blocks at random offsets until stopped; remembers the last acknowledged
/// generation of each block. Every write must succeed (the client rides out failovers).
struct Writer {
    stop: Arc<AtomicBool>,
    count: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<BTreeMap<u64, u64>>,
}

impl Writer {
    fn start(image: Arc<Image>, seed: u64) -> Writer {
        Writer::start_on(image, seed, None)
    }

    /// Writes only into the objects of one PG when `pg` is given.
    fn start_on(image: Arc<Image>, seed: u64, pg: Option<PgId>) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let count = Arc::new(AtomicU64::new(0));
        let (s, c) = (stop.clone(), count.clone());
        let task = tokio::spawn(async move {
            let object_blocks = image.info().object_size_bytes / BLOCK;
            let objects = image.size_bytes() / image.info().object_size_bytes;
            let chosen: Vec<u64> = (0..objects)
                .filter(|o| pg.is_none_or(|p| image.object_pg(*o) == p))
                .collect();
            assert!(!chosen.is_empty(), "no object of the image maps to {pg:?}");
            let mut acked = BTreeMap::new();
            let mut x = seed | 1;
            let mut generation = 0;
            while !s.load(Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let object = chosen[(x % chosen.len() as u64) as usize];
                let b = object * object_blocks + (x >> 20) % object_blocks;
                image
                    .write(b * BLOCK, block(b * BLOCK, generation))
                    .await
                    .unwrap_or_else(|e| panic!("write of block {b} failed: {e}"));
                acked.insert(b, generation);
                generation += 1;
                c.store(generation, Ordering::Relaxed);
            }
            acked
        });
        Writer { stop, count, task }
    }

    fn written(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    async fn wait_progress(&self, more: u64, what: &str) {
        let start = self.written();
        common::wait_until(Duration::from_secs(60), what, || async {
            (self.written() >= start + more).then_some(())
        })
        .await;
    }

    async fn finish(self) -> BTreeMap<u64, u64> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("writer task")
    }
}

/// Polls until `cond` holds for the PG table (or panics after `timeout` with the table).
async fn wait_pgs(
    client: &MonClient,
    timeout: Duration,
    what: &str,
    cond: impl Fn(&ClusterMap) -> bool,
) {
    let deadline = Instant::now() + timeout;
    loop {
        let map = client.map().await.unwrap().map.unwrap();
        if cond(&map) {
            return;
        }
        if Instant::now() > deadline {
            let table: Vec<String> = map
                .pgmaps
                .values()
                .flat_map(|m| m.pgs.iter())
                .map(|(seq, i)| {
                    format!(
                        "{seq} {} leader {:?} {:?} -> {:?}",
                        i.state.name(),
                        i.leader,
                        i.osdlist,
                        i.newosdlist
                    )
                })
                .collect();
            panic!(
                "{what}: not reached after {timeout:?}\n{}",
                table.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn all_pgs(map: &ClusterMap) -> impl Iterator<Item = (PgId, &fastblock_types::map::PgInfo)> {
    map.pgmaps
        .iter()
        .flat_map(|(pool, m)| m.pgs.iter().map(|(seq, i)| (PgId::new(*pool, *seq), i)))
}

/// The convergence check of every case: all PGs active, every replica of every PG reports the
/// same applied index and objects, every acknowledged write reads back. Returns how long the
/// PGs took to become active.
async fn converge(fx: &Fx, acked: &BTreeMap<u64, u64>, since: Instant, case: &str) -> Duration {
    common::wait_all_active(&fx.client, CONVERGE).await;
    let active_after = since.elapsed();
    // Replicas catch up and OSDs learn the newest map a little after the monitor shows the
    // PGs active: poll until one pass over the current map finds every PG's replicas equal.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let map = fx.map().await;
        match replicas_differ(&map).await {
            None if all_pgs(&map).all(|(_, i)| i.state.is_active()) => break,
            None => {}
            Some(why) => assert!(Instant::now() < deadline, "{case}: {why}"),
        }
        assert!(Instant::now() < deadline, "{case}: PGs not active again");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (b, generation) in acked {
        let got = fx.image.read(b * BLOCK, BLOCK).await.unwrap();
        assert!(
            got == block(b * BLOCK, *generation),
            "{case}: acknowledged write of block {b} (generation {generation}) lost"
        );
    }
    eprintln!(
        "{case}: PGs active {active_after:?} after the event; {} acknowledged blocks verified, \
         replicas identical",
        acked.len()
    );
    active_after
}

/// Why the replicas of some PG differ (or cannot be compared yet), or `None`.
async fn replicas_differ(map: &ClusterMap) -> Option<String> {
    for (pg, info) in all_pgs(map) {
        if !info.newosdlist.is_empty() {
            return Some(format!("{pg} still has a target"));
        }
        let mut digests = Vec::new();
        for osd in &info.osdlist {
            let o = &map.osds[osd];
            let mut conn = WireConn::connect(&format!("{}:{}", o.address, o.port_for(pg))).await;
            match conn.call(&Request::ReplicaDigest { pg }).await {
                Reply::Digest {
                    applied_index,
                    objects,
                } => digests.push((applied_index, objects)),
                other => return Some(format!("digest of {pg} at osd {osd}: {other:?}")),
            }
        }
        if !digests.windows(2).all(|w| w[0] == w[1]) {
            let applied: Vec<u64> = digests.iter().map(|(a, _)| *a).collect();
            return Some(format!(
                "replicas {:?} of {pg} differ: applied {applied:?}",
                info.osdlist
            ));
        }
    }
    None
}

/// Marks out a follower of the PG holding the image's first object: (pg, leader, follower).
async fn out_a_follower(fx: &Fx) -> (PgId, OsdId, OsdId) {
    let (pg, leader) = first_pg_leader(fx).await;
    let (_, members, _, _) = fx.pg_info(pg).await;
    let leaving = *members.iter().find(|o| **o != leader).unwrap();
    fx.client.osd_out(leaving).await.unwrap();
    (pg, leader, leaving)
}

/// Every PG active, and none lists any of `gone`.
fn settled_without(m: &ClusterMap, gone: &[OsdId]) -> bool {
    gone.iter().all(|o| count_in(m, *o) == 0) && all_pgs(m).all(|(_, i)| i.state.is_active())
}

/// The leader of the PG holding the image's first object.
async fn first_pg_leader(fx: &Fx) -> (PgId, OsdId) {
    let pg = fx.image.object_pg(0);
    let (leader, _, _, _) = fx.pg_info(pg).await;
    (pg, leader.expect("pg has a leader"))
}

fn count_in(map: &ClusterMap, osd: OsdId) -> usize {
    all_pgs(map)
        .filter(|(_, i)| i.osdlist.contains(&osd) || i.newosdlist.contains(&osd))
        .count()
}

/// FO1: kill an OSD and restart it before it goes out: its PGs go undersize, get new
/// leaders, and become active again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fo1_kill_and_restart_an_osd() {
    let mut fx = fixture(Spec {
        osds: 3,
        out_after: "600s",
        ..Spec::default()
    })
    .await;
    let writer = Writer::start(fx.image.clone(), 1);
    writer.wait_progress(100, "writes before the kill").await;
    let (_, victim) = first_pg_leader(&fx).await;
    fx.osd(victim).kill();
    let t = Instant::now();
    wait_pgs(
        &fx.client,
        Duration::from_secs(20),
        "undersize with new leaders",
        |m| {
            all_pgs(m).all(|(_, i)| {
                !i.osdlist.contains(&victim)
                    || (i.state.contains(PgState::UNDERSIZE)
                        && i.leader.is_some_and(|l| l != victim))
            })
        },
    )
    .await;
    eprintln!("FO1: undersize with new leaders after {:?}", t.elapsed());
    writer.wait_progress(100, "writes while undersize").await;
    fx.osd(victim).start();
    let t = Instant::now();
    let acked = writer.finish().await;
    converge(&fx, &acked, t, "FO1").await;
}

/// FO2 + FO3: kill an OSD until it is out (its PGs are remapped with a newosdlist, then active
/// without it, IO continuing), then restart it (in again, rebalance through remapped, active).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fo2_fo3_out_remap_then_return_and_rebalance() {
    let mut fx = fixture(Spec::default()).await;
    let writer = Writer::start(fx.image.clone(), 2);
    writer.wait_progress(100, "writes before the kill").await;
    let (_, victim) = first_pg_leader(&fx).await;
    fx.osd(victim).kill();
    let t = Instant::now();
    wait_pgs(
        &fx.client,
        Duration::from_secs(30),
        "remapped with a newosdlist",
        |m| {
            all_pgs(m).any(|(_, i)| {
                i.state.contains(PgState::REMAPPED)
                    && !i.newosdlist.is_empty()
                    && !i.newosdlist.contains(&victim)
            })
        },
    )
    .await;
    eprintln!("FO2: remapped after {:?}", t.elapsed());
    wait_pgs(&fx.client, CONVERGE, "active without the out osd", |m| {
        settled_without(m, &[victim])
    })
    .await;
    writer.wait_progress(100, "writes after the remap").await;
    let acked = writer.finish().await;
    converge(&fx, &acked, t, "FO2").await;

    // FO3: the out OSD returns: in again, PGs move back to it through remapped.
    let writer = Writer::start(fx.image.clone(), 3);
    fx.osd(victim).start();
    let t = Instant::now();
    wait_pgs(
        &fx.client,
        CONVERGE,
        "rebalanced onto the returned osd",
        |m| count_in(m, victim) > 0 && all_pgs(m).all(|(_, i)| i.state.is_active()),
    )
    .await;
    writer.wait_progress(50, "writes after the rebalance").await;
    let mut acked2 = writer.finish().await;
    let mut all = acked;
    all.append(&mut acked2);
    converge(&fx, &all, t, "FO3").await;
}

/// FO4: kill two OSDs of a 3-replica pool: PGs holding both are down (IO to them fails with a
/// retryable error after the client's deadline), the others undersize; restart both: active.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fo4_two_osds_down_then_back() {
    let mut fx = fixture(Spec {
        out_after: "600s",
        ..Spec::default()
    })
    .await;
    let writer = Writer::start(fx.image.clone(), 4);
    writer.wait_progress(100, "writes before the kill").await;
    let acked = writer.finish().await;
    let pg = fx.image.object_pg(0);
    let (_, members, _, _) = fx.pg_info(pg).await;
    let (a, b) = (members[0], members[1]);
    fx.osd(a).kill();
    fx.osd(b).kill();
    let t = Instant::now();
    wait_pgs(
        &fx.client,
        Duration::from_secs(20),
        "down and undersize PGs",
        |m| {
            all_pgs(m).all(|(_, i)| {
                let lost = i.osdlist.iter().filter(|o| **o == a || **o == b).count();
                match lost {
                    0 => i.state.is_active(),
                    1 => i.state.contains(PgState::UNDERSIZE),
                    _ => i.state.contains(PgState::DOWN),
                }
            })
        },
    )
    .await;
    eprintln!("FO4: down/undersize after {:?}", t.elapsed());
    // IO to the down PG: a clear, retryable timeout at the client's deadline, not a hang.
    let mut config = fx.mons.client_config();
    config.op_deadline = Duration::from_secs(3);
    let short = Cluster::connect(config).await.unwrap();
    let img = short.open_image("fb", "img").await.unwrap();
    let started = Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(20), img.write(0, block(0, 1_000_000)))
        .await
        .expect("the write returns instead of hanging");
    match &r {
        Err(e @ ClientError::Timeout { pg: p, .. }) => {
            assert_eq!(*p, pg);
            assert!(e.is_retryable());
            eprintln!(
                "FO4: write to down {pg} failed after {:?}: {e}",
                started.elapsed()
            );
        }
        other => panic!("expected a retryable timeout, got {other:?}"),
    }
    fx.osd(a).start();
    fx.osd(b).start();
    let t = Instant::now();
    // The same write succeeds once the PG is back (it may or may not have been applied).
    img.write(0, block(0, 1_000_001)).await.unwrap();
    let mut acked = acked;
    acked.insert(0, 1_000_001);
    converge(&fx, &acked, t, "FO4").await;
}

/// FO5: `outosd` the leader during a block_bench run; the bench completes with no error and
/// verifies every block.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fo5_out_the_leader_during_block_bench() {
    let mut fx = fixture(Spec::default()).await;
    let (_, leader) = first_pg_leader(&fx).await;
    let mut bench =
        std::process::Command::new(common::bin("fastblock-mon").with_file_name("block_bench"))
            .args(["--mon", &fx.mons.endpoints().join(",")])
            .arg("--keyring")
            .arg(fx.mons.keyring())
            .args(["--pool", "fb", "--image", "img", "--io-type", "write_read"])
            .args(["--io-size", "4K", "--io-count", "4000", "--io-depth", "4"])
            // No warm-up: the run is judged by its completion and its verify, and 4,000 IOs
            // may all fit in the default 10 s warm-up, which block_bench refuses to report.
            .args([
                "--sequential",
                "--verify",
                "--seed",
                "5",
                "--deferred-time",
                "0",
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("block_bench");
    // Out the leader once the bench is writing (the monitor sees client IO).
    common::wait_until(Duration::from_secs(30), "block_bench writing", || async {
        let st = fx.client.status().await.ok()?;
        (st.io.write_ops_per_sec > 0.0).then_some(())
    })
    .await;
    fx.client.osd_out(leader).await.unwrap();
    let t = Instant::now();
    let out = tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(_status) = bench.try_wait().unwrap() {
                return bench.wait_with_output().unwrap();
            }
            if Instant::now() > deadline {
                let _ = bench.kill();
                return bench.wait_with_output().unwrap();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    })
    .await
    .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "block_bench failed: {text}");
    wait_pgs(&fx.client, CONVERGE, "active without the out leader", |m| {
        settled_without(m, &[leader])
    })
    .await;
    converge(&fx, &BTreeMap::new(), t, "FO5").await;
    // The out OSD kept running and holds nothing any more.
    assert!(fx.osd(leader).is_running(), "the out osd crashed");
}

/// FO6: kill the leader during a membership change: a new leader finishes it; the later out
/// of the dead leader is applied too; all active.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fo6_leader_killed_during_membership_change() {
    let mut fx = fixture(Spec {
        osds: 5,
        ..Spec::default()
    })
    .await;
    let writer = Writer::start(fx.image.clone(), 6);
    writer.wait_progress(100, "writes before the change").await;
    let (pg, leader, leaving) = out_a_follower(&fx).await;
    wait_pgs(
        &fx.client,
        Duration::from_secs(10),
        "the change started",
        |m| m.pg(pg).is_some_and(|i| !i.newosdlist.is_empty()),
    )
    .await;
    fx.osd(leader).kill();
    let t = Instant::now();
    wait_pgs(&fx.client, CONVERGE, "both outs applied", |m| {
        settled_without(m, &[leaving, leader])
    })
    .await;
    writer.wait_progress(50, "writes after the change").await;
    let acked = writer.finish().await;
    converge(&fx, &acked, t, "FO6").await;
}

/// ST4: kill the leader while it sends a snapshot to a new member: a new leader sends it
/// again; converges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn st4_leader_killed_during_snapshot_install() {
    let mut fx = fixture(Spec {
        osds: 5,
        pg_count: 4,
        osd_args: &["--recovery-max-bytes-per-sec", "2M"],
        ..Spec::default()
    })
    .await;
    let pg = fx.image.object_pg(0);
    // About 6 MiB in the PG, so the snapshot takes seconds at 2 MiB/s.
    let objects = fx.image.size_bytes() / fx.image.info().object_size_bytes;
    let mut acked = BTreeMap::new();
    for o in (0..objects)
        .filter(|o| fx.image.object_pg(*o) == pg)
        .take(6)
    {
        let obj_bytes = fx.image.info().object_size_bytes;
        let data: Vec<u8> = (0..obj_bytes / BLOCK)
            .flat_map(|b| block(o * obj_bytes + b * BLOCK, 7).to_vec())
            .collect();
        fx.image
            .write(o * obj_bytes, Bytes::from(data))
            .await
            .unwrap();
        for b in 0..obj_bytes / BLOCK {
            acked.insert(o * obj_bytes / BLOCK + b, 7);
        }
    }
    let (leader, members, _, _) = fx.pg_info(pg).await;
    let leader = leader.unwrap();
    let leaving = *members.iter().find(|o| **o != leader).unwrap();
    fx.client.osd_out(leaving).await.unwrap();
    let sending = Instant::now();
    common::wait_until(
        Duration::from_secs(20),
        "the snapshot transfer started",
        || async {
            let logs = fx.osds.iter().find(|o| o.id == leader).unwrap().all_logs();
            logs.lines()
                .any(|l| l.contains("sending snapshot") && l.contains(&format!("pg={pg}")))
                .then_some(())
        },
    )
    .await;
    eprintln!(
        "ST4: transfer started {:?} after the out",
        sending.elapsed()
    );
    // `status` shows the recovery while it runs (the leader reports it in its heartbeats).
    let rec = common::wait_until(Duration::from_secs(5), "status shows recovery", || async {
        let st = fx.client.status().await.ok()?;
        (st.recovery.recovering_pgs > 0 && st.recovery.remaining_bytes > 0).then_some(st.recovery)
    })
    .await;
    eprintln!("ST4: status recovery: {rec:?}");
    let line = fx.mons.cli(&["status"]);
    assert!(line.ok().contains("recovery"), "status: {}", line.ok());
    fx.osd(leader).kill();
    let t = Instant::now();
    wait_pgs(&fx.client, CONVERGE, "outs applied", |m| {
        settled_without(m, &[leaving, leader])
    })
    .await;
    converge(&fx, &acked, t, "ST4").await;
    let installs: usize = fx
        .osds
        .iter()
        .map(|o| o.all_logs().matches("snapshot installed").count())
        .sum();
    assert!(installs > 0, "ST4: no snapshot was installed");
}

/// ST5: a member that falls further behind than the log is kept for is caught up by a
/// snapshot when it returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn st5_lagging_member_caught_up_by_snapshot() {
    let mut fx = fixture(Spec {
        osds: 3,
        out_after: "600s",
        pg_count: 4,
        osd_args: &[
            "--log-lag-max-entries",
            "64",
            "--log-retain-entries",
            "16",
            "--flush-interval",
            "50ms",
        ],
        ..Spec::default()
    })
    .await;
    let pg = fx.image.object_pg(0);
    let (leader, members, _, _) = fx.pg_info(pg).await;
    let follower = *members.iter().find(|o| Some(**o) != leader).unwrap();
    fx.osd(follower).kill();
    let writer = Writer::start_on(fx.image.clone(), 8, Some(pg));
    writer
        .wait_progress(600, "writes while the member is down")
        .await;
    fx.osd(follower).start();
    let t = Instant::now();
    writer.wait_progress(100, "writes after it returned").await;
    let acked = writer.finish().await;
    converge(&fx, &acked, t, "ST5").await;
    let logs = fx.osd(follower).all_logs();
    assert!(
        logs.lines()
            .any(|l| l.contains("snapshot installed") && l.contains(&pg.to_string())),
        "ST5: the returning member of {pg} was not caught up by snapshot"
    );
}

/// ST6: SIGKILL the leader right after a membership change returned: converges, and no other
/// OSD crashes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn st6_leader_killed_right_after_the_change() {
    let mut fx = fixture(Spec::default()).await;
    let writer = Writer::start(fx.image.clone(), 9);
    writer.wait_progress(100, "writes before the change").await;
    let (pg, _, leaving) = out_a_follower(&fx).await;
    wait_pgs(&fx.client, CONVERGE, "the change returned", |m| {
        m.pg(pg)
            .is_some_and(|i| i.newosdlist.is_empty() && !i.osdlist.contains(&leaving))
    })
    .await;
    let (new_leader, _, _, _) = fx.pg_info(pg).await;
    let victim = new_leader.unwrap();
    fx.osd(victim).kill();
    let t = Instant::now();
    writer.wait_progress(100, "writes after the kill").await;
    fx.osd(victim).start();
    let acked = writer.finish().await;
    converge(&fx, &acked, t, "ST6").await;
    for o in &mut fx.osds {
        assert!(
            o.is_running(),
            "ST6: osd {} crashed:\n{}",
            o.id,
            o.log_tail()
        );
    }
}

/// The monitor leader dies during a remap; the next monitor leader finishes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_leader_killed_during_a_remap() {
    let mut fx = fixture(Spec {
        mons: 3,
        ..Spec::default()
    })
    .await;
    let writer = Writer::start(fx.image.clone(), 10);
    writer.wait_progress(100, "writes before the out").await;
    let (_, _, leaving) = out_a_follower(&fx).await;
    wait_pgs(
        &fx.client,
        Duration::from_secs(10),
        "the remap started",
        |m| all_pgs(m).any(|(_, i)| !i.newosdlist.is_empty()),
    )
    .await;
    let mon = fx.mons.wait_leader(Duration::from_secs(10)).await;
    fx.mons.kill(mon);
    let t = Instant::now();
    wait_pgs(&fx.client, CONVERGE, "the remap finished", |m| {
        settled_without(m, &[leaving])
    })
    .await;
    writer
        .wait_progress(50, "writes after the monitor failover")
        .await;
    let acked = writer.finish().await;
    converge(&fx, &acked, t, "monitor failover during remap").await;
    let _ = &fx.dir;
}

//! Network partitions on real processes (issue 19, "Fault injection on real processes"): three
//! OSDs, each in its own network namespace (`common::netns`), a 3-replica pool of 8 PGs and an
//! image. A writer and a reader drive IO on a fixed set of blocks of every object while the
//! network is cut, and every read is checked against a model of the writes ([`Model`]).
//!
//! - `isolating_the_busiest_leader_moves_its_pgs_and_loses_nothing`: the OSD leading most PGs
//!   is cut off from everyone (its veth down); its PGs elect leaders among the other two, IO
//!   resumes on them, and after healing every PG is active with identical replicas.
//! - `a_leader_and_one_follower_cut_apart_keep_serving_with_the_other`: one PG's leader and one
//!   of its followers stop hearing each other (nftables DROP both ways), everything else flows:
//!   the follower falls behind, the PG keeps serving with the other majority, and converges
//!   after healing.
//! - `a_leader_cut_off_the_monitor_alone_keeps_its_pgs_serving`: the OSD leading most PGs
//!   stops hearing the monitor (nftables DROP of the monitor's address in its namespace; the
//!   monitor listens on an address of its own): the monitor marks it down while it still
//!   reaches its peers and the client, and its PGs keep serving.
//! - `a_key_added_while_a_leader_is_cut_off_the_monitor_is_served_at_once`: a client key the
//!   cut-off OSD cannot know yet is served at once: the client's ticket, newer than the OSD's
//!   entity table, says who it is.
//!
//! Checked in all: no stale read (a read never returns a value older than the last write
//! acknowledged before it started; a write that failed may or may not have happened), IO
//! made progress during the partition on the PGs it touched, no IO failed, every replica of
//! every PG identical at the end, and every block reads back as the model allows.
//! Needs root, `ip` and `nft` (scripts/install-deps.sh). Timings and counts are printed
//! (`cargo nextest run -p fastblock --test partition --no-capture`).

mod common;

use common::model::{Model, Outcome};
use common::netns::NetCluster;
use common::{all_pgs, pool_with_image, stamped_block, wait_until, MonOptions, WireConn, BLOCK};
use fastblock_client::{Cluster, Image};
use fastblock_monclient::MonClient;
use fastblock_types::map::ClusterMap;
use fastblock_types::{OsdId, PgId};
use fastblock_wire::{Reply, Request};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const OSDS: usize = 3;
const PG_COUNT: u32 = 8;
const IMAGE_BYTES: u64 = 16 << 20;
const OBJECT_BYTES: u64 = 1 << 20;
/// Blocks the workload uses in every object: 64 blocks over the 8 PGs.
const BLOCKS_PER_OBJECT: u64 = 4;
/// How long a partition lasts (from the cut to the heal), at least.
const PARTITION: Duration = Duration::from_secs(6);
/// Limit of every wait for the cluster to react (new leaders, progress, convergence).
const REACT: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
}

/// One finished IO, for the progress checks.
#[derive(Clone, Copy, Debug)]
struct Op {
    kind: Kind,
    pg: PgId,
    finished: Instant,
    took: Duration,
    ok: bool,
}

/// A writer and a reader on `blocks` until stopped, both checked against one [`Model`].
struct Io {
    stop: Arc<AtomicBool>,
    writes_acked: Arc<AtomicU64>,
    model: Arc<Mutex<Model>>,
    tasks: Vec<tokio::task::JoinHandle<Vec<Op>>>,
}

fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

fn block_pg(image: &Image, block: u64) -> PgId {
    image.object_pg(block * BLOCK / image.info().object_size_bytes)
}

impl Io {
    fn start(image: Arc<Image>, blocks: Vec<u64>, seed: u64) -> Io {
        let stop = Arc::new(AtomicBool::new(false));
        let writes_acked = Arc::new(AtomicU64::new(0));
        let model = Arc::new(Mutex::new(Model::default()));
        let writer = {
            let (image, blocks, stop) = (image.clone(), blocks.clone(), stop.clone());
            let (model, acked) = (model.clone(), writes_acked.clone());
            tokio::spawn(async move {
                let mut ops = Vec::new();
                let mut x = seed | 1;
                let mut generation = 0;
                while !stop.load(Ordering::Relaxed) {
                    generation += 1;
                    let b = blocks[(next(&mut x) % blocks.len() as u64) as usize];
                    model.lock().unwrap().issue(b, generation);
                    let started = Instant::now();
                    let result = image
                        .write(b * BLOCK, stamped_block(b * BLOCK, generation))
                        .await;
                    let outcome = match &result {
                        Ok(()) => Outcome::Acked,
                        Err(e) => {
                            eprintln!("write of block {b} (generation {generation}) failed: {e}");
                            Outcome::Failed
                        }
                    };
                    model.lock().unwrap().complete(b, generation, outcome);
                    if result.is_ok() {
                        acked.fetch_add(1, Ordering::Relaxed);
                    }
                    ops.push(Op {
                        kind: Kind::Write,
                        pg: block_pg(&image, b),
                        finished: Instant::now(),
                        took: started.elapsed(),
                        ok: result.is_ok(),
                    });
                }
                ops
            })
        };
        let reader = {
            let (stop, model) = (stop.clone(), model.clone());
            tokio::spawn(async move {
                let mut ops = Vec::new();
                let mut x = (seed << 1) | 1;
                while !stop.load(Ordering::Relaxed) {
                    let b = blocks[(next(&mut x) % blocks.len() as u64) as usize];
                    let floor = model.lock().unwrap().floor(b);
                    let started = Instant::now();
                    let result = image.read(b * BLOCK, BLOCK).await;
                    match &result {
                        Ok(got) => model.lock().unwrap().check(b, floor, got, "read"),
                        Err(e) => eprintln!("read of block {b} failed: {e}"),
                    }
                    ops.push(Op {
                        kind: Kind::Read,
                        pg: block_pg(&image, b),
                        finished: Instant::now(),
                        took: started.elapsed(),
                        ok: result.is_ok(),
                    });
                }
                ops
            })
        };
        Io {
            stop,
            writes_acked,
            model,
            tasks: vec![writer, reader],
        }
    }

    /// Waits until `more` writes are acknowledged from now.
    async fn wait_writes(&self, more: u64, what: &str) {
        let start = self.writes_acked.load(Ordering::Relaxed);
        wait_until(REACT, what, || async {
            (self.writes_acked.load(Ordering::Relaxed) >= start + more).then_some(())
        })
        .await;
    }

    async fn finish(self) -> (Vec<Op>, Arc<Mutex<Model>>) {
        self.stop.store(true, Ordering::Relaxed);
        let mut ops = Vec::new();
        for task in self.tasks {
            ops.extend(task.await.expect("an IO task"));
        }
        (ops, self.model)
    }
}

struct Fx {
    net: NetCluster,
    client: MonClient,
    image: Arc<Image>,
    _cluster: Arc<Cluster>,
}

async fn fixture() -> Fx {
    let options = MonOptions {
        osd_down_after: "2s",
        // A partition of a few seconds is not an OSD leaving: no remap while it lasts.
        osd_out_after: "600s",
        ..MonOptions::default()
    };
    let net = NetCluster::start(OSDS, options, "256M").await;
    let client = net.mons.client();
    pool_with_image(
        &client,
        ("fb", PG_COUNT, 3),
        ("img", IMAGE_BYTES, OBJECT_BYTES),
    )
    .await;
    let mut config = net.mons.client_config();
    config.op_deadline = REACT;
    // A request sent to a leader that was just cut off gets no answer at all. The client
    // sends it again once the map records the PG's new leader (or the OSD down), so the
    // default `attempt_timeout` (10 s, longer than the whole partition) is kept on purpose.
    let cluster = Cluster::connect(config).await.unwrap();
    let image = Arc::new(cluster.open_image("fb", "img").await.unwrap());
    Fx {
        net,
        client,
        image,
        _cluster: cluster,
    }
}

impl Fx {
    async fn map(&self) -> ClusterMap {
        self.client.map().await.unwrap().map.unwrap()
    }

    /// The workload's blocks: [`BLOCKS_PER_OBJECT`] spread over every object of the image.
    fn blocks(&self) -> Vec<u64> {
        let object_blocks = OBJECT_BYTES / BLOCK;
        let objects = IMAGE_BYTES / OBJECT_BYTES;
        (0..objects)
            .flat_map(|o| {
                (0..BLOCKS_PER_OBJECT).map(move |k| o * object_blocks + k * 37 % object_blocks)
            })
            .collect()
    }

    /// Every PG's leader, once every PG has one.
    async fn leaders(&self) -> BTreeMap<PgId, OsdId> {
        wait_until(REACT, "a leader for every PG", || async {
            let map = self.map().await;
            all_pgs(&map)
                .map(|(pg, i)| Some((pg, i.leader?)))
                .collect::<Option<BTreeMap<_, _>>>()
        })
        .await
    }

    /// The applied index of `pg`'s replica on `osd`.
    async fn applied(&self, map: &ClusterMap, osd: OsdId, pg: PgId) -> u64 {
        let o = &map.osds[&osd];
        let mut conn = WireConn::connect(&format!("{}:{}", o.address, o.port_for(pg))).await;
        match conn.call(&Request::ReplicaDigest { pg }).await {
            Reply::Digest { applied_index, .. } => applied_index,
            other => panic!("digest of {pg} at osd {osd}: {other:?}"),
        }
    }

    /// Every PG active with identical replicas, then every block of the workload read back
    /// and checked against the model.
    async fn converge(&self, model: &Mutex<Model>, blocks: &[u64]) -> Duration {
        let t = Instant::now();
        common::wait_all_active(&self.client, REACT).await;
        common::wait_replicas_identical(&self.client, REACT).await;
        let took = t.elapsed();
        for b in blocks {
            let floor = model.lock().unwrap().floor(*b);
            let got = self.image.read(b * BLOCK, BLOCK).await.unwrap();
            model.lock().unwrap().check(*b, floor, &got, "final read");
        }
        took
    }
}

/// The OSD leading most PGs, and those PGs.
fn busiest_leader(leaders: &BTreeMap<PgId, OsdId>) -> (OsdId, Vec<PgId>) {
    let mut led: BTreeMap<OsdId, Vec<PgId>> = BTreeMap::new();
    for (pg, osd) in leaders {
        led.entry(*osd).or_default().push(*pg);
    }
    led.into_iter()
        .max_by_key(|(_, pgs)| pgs.len())
        .expect("PGs with leaders")
}

/// Finished IO of `kind` (within `during` and on `pgs` if given): (succeeded, failed).
fn count(
    ops: &[Op],
    kind: Kind,
    during: Option<(Instant, Instant)>,
    pgs: Option<&[PgId]>,
) -> (u64, u64) {
    let mut n = (0, 0);
    for op in ops {
        let inside = during.is_none_or(|(from, to)| op.finished > from && op.finished < to);
        if op.kind == kind && inside && pgs.is_none_or(|p| p.contains(&op.pg)) {
            if op.ok {
                n.0 += 1;
            } else {
                n.1 += 1;
            }
        }
    }
    n
}

/// The checks both tests end with, and the figures they print.
fn report(case: &str, ops: &[Op], model: &Model, partition: (Instant, Instant), pgs: &[PgId]) {
    let (writes, failed_writes) = count(ops, Kind::Write, None, None);
    let (reads, failed_reads) = count(ops, Kind::Read, None, None);
    let (writes_cut, _) = count(ops, Kind::Write, Some(partition), None);
    let (reads_cut, _) = count(ops, Kind::Read, Some(partition), None);
    let (writes_cut_pgs, _) = count(ops, Kind::Write, Some(partition), Some(pgs));
    let longest = ops.iter().map(|o| o.took).max().unwrap_or_default();
    eprintln!(
        "{case}: {writes} writes acknowledged ({failed_writes} failed), {reads} reads \
         ({failed_reads} failed), {} reads checked, {} stale; during the {:?} partition: \
         {writes_cut} writes ({writes_cut_pgs} to the PGs it touched) and {reads_cut} reads; \
         longest IO {longest:?}",
        model.reads_checked,
        model.stale_reads(),
        partition.1 - partition.0,
    );
    assert!(
        model.violations.is_empty(),
        "{case}: {} reads broke the model:\n{}",
        model.violations.len(),
        model.violations.join("\n")
    );
    assert_eq!(failed_writes + failed_reads, 0, "{case}: IO failed");
    assert!(
        writes_cut_pgs > 0,
        "{case}: no write to {pgs:?} completed during the partition"
    );
    assert!(
        reads_cut > 0,
        "{case}: no read completed during the partition"
    );
}

/// How long IO goes on after the heal, while the cut-off OSD rejoins.
const AFTER_HEAL: Duration = Duration::from_secs(3);

/// The end of a scenario that cut `victim` off: it is up again, IO goes on for
/// [`AFTER_HEAL`] while it rejoins, then every replica converges and the checks of
/// [`report`] run over the IO of the whole run.
async fn after_heal(
    fx: &Fx,
    io: Io,
    victim: OsdId,
    blocks: &[u64],
    case: &str,
    partition: (Instant, Instant),
    pgs: &[PgId],
) {
    common::wait_osds_up(&fx.client, &[victim], REACT).await;
    tokio::time::sleep(AFTER_HEAL).await;
    io.wait_writes(1, "writes after the heal").await;
    let (ops, model) = io.finish().await;
    let took = fx.converge(&model, blocks).await;
    eprintln!("{case}: replicas identical {took:?} after the IO stopped");
    report(case, &ops, &model.lock().unwrap(), partition, pgs);
}

/// How a scenario cuts the leader of most PGs off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LeaderCut {
    /// From everyone: its veth goes down.
    Isolate,
    /// From the other OSDs only: it still reaches the monitor and the client, which keep
    /// sending it requests until they learn of the new leaders.
    FromPeers,
}

/// Cuts the OSD leading most PGs off for [`PARTITION`] during IO. The other two must elect
/// leaders for its PGs (checked on the monitor's map: the test fails if the cut did nothing)
/// and serve writes to them before the heal; after it, the cut-off OSD rejoins under IO and
/// every replica converges.
async fn cut_off_the_busiest_leader(case: &str, how: LeaderCut, seed: u64) {
    let fx = fixture().await;
    let (victim, led) = busiest_leader(&fx.leaders().await);
    let others: Vec<OsdId> = fx
        .net
        .osds
        .iter()
        .map(|o| o.id)
        .filter(|o| *o != victim)
        .collect();
    let blocks = fx.blocks();
    let io = Io::start(fx.image.clone(), blocks.clone(), seed);
    io.wait_writes(100, "writes before the partition").await;

    match how {
        LeaderCut::Isolate => fx.net.isolate(victim),
        LeaderCut::FromPeers => others.iter().for_each(|o| fx.net.drop_between(victim, *o)),
    }
    let cut = Instant::now();
    wait_until(REACT, "new leaders for the cut-off OSD's PGs", || async {
        let map = fx.map().await;
        led.iter()
            .all(|pg| {
                map.pg(*pg)
                    .and_then(|i| i.leader)
                    .is_some_and(|l| l != victim)
            })
            .then_some(())
    })
    .await;
    let moved = cut.elapsed();
    io.wait_writes(100, "writes with the OSD cut off").await;
    tokio::time::sleep(PARTITION.saturating_sub(cut.elapsed())).await;
    let down = !fx
        .client
        .osds()
        .await
        .unwrap()
        .iter()
        .any(|o| o.id == victim && o.up);
    if how == LeaderCut::Isolate {
        assert!(
            down,
            "{case}: the monitor still sees the isolated osd {victim} up"
        );
    }
    match how {
        LeaderCut::Isolate => fx.net.heal(victim),
        LeaderCut::FromPeers => others.iter().for_each(|o| fx.net.heal_between(victim, *o)),
    }
    let healed = Instant::now();
    eprintln!(
        "{case}: osd {victim} led {} of {PG_COUNT} PGs; new leaders after {moved:?}; \
         marked down by the monitor: {down}",
        led.len()
    );

    after_heal(&fx, io, victim, &blocks, case, (cut, healed), &led).await;
}

/// The OSD leading most PGs loses the network (monitor, client and peers alike).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolating_the_busiest_leader_moves_its_pgs_and_loses_nothing() {
    cut_off_the_busiest_leader("isolate", LeaderCut::Isolate, 19).await;
}

/// The OSD leading most PGs loses its peers but still answers the client: the reads it may
/// still serve under its lease must not be stale once the others elected a new leader and
/// acknowledged writes (docs/design/osd.md, "Reads").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_its_peers_but_not_the_client_serves_no_stale_read() {
    cut_off_the_busiest_leader("leader-peers", LeaderCut::FromPeers, 29).await;
}

/// Cuts the OSD leading most PGs off from the monitor alone for [`PARTITION`] during IO. The
/// monitor must mark it down (the test fails if the cut did nothing); its PGs must keep
/// serving writes and reads with no failed IO and no stale read, whether it goes on leading
/// them for its peers or they elect others; after the heal it is up again and every replica
/// converges.
async fn cut_a_leader_from_the_monitor(case: &str, seed: u64) {
    let fx = fixture().await;
    let (victim, led) = busiest_leader(&fx.leaders().await);
    let blocks = fx.blocks();
    let io = Io::start(fx.image.clone(), blocks.clone(), seed);
    io.wait_writes(100, "writes before the partition").await;

    fx.net.cut_from_monitor(victim);
    let cut = Instant::now();
    wait_until(REACT, "the monitor marks the cut-off OSD down", || async {
        let osds = fx.client.osds().await.ok()?;
        osds.iter().any(|o| o.id == victim && !o.up).then_some(())
    })
    .await;
    let down = cut.elapsed();
    io.wait_writes(100, "writes with the OSD marked down").await;
    tokio::time::sleep(PARTITION.saturating_sub(cut.elapsed())).await;
    let map = fx.map().await;
    let still_led = led
        .iter()
        .filter(|pg| map.pg(**pg).and_then(|i| i.leader) == Some(victim))
        .count();
    fx.net.heal_from_monitor(victim);
    let healed = Instant::now();
    eprintln!(
        "{case}: osd {victim} led {} of {PG_COUNT} PGs; marked down after {down:?}; at the \
         heal the map named it the leader of {still_led} of them",
        led.len()
    );

    after_heal(&fx, io, victim, &blocks, case, (cut, healed), &led).await;
}

/// The OSD leading most PGs loses the monitor but nothing else: marked down, it may still
/// lead for its peers, and the client must keep reaching its PGs (`docs/data-path.md`: a
/// call to an OSD already down when it was sent is not abandoned for that).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_the_monitor_alone_keeps_its_pgs_serving() {
    cut_a_leader_from_the_monitor("leader-monitor", 37).await;
}

/// A client key added while the OSD leading most PGs is cut off from the monitor: that OSD
/// cannot have the new entity in its table, but it needs not: the client's ticket for it,
/// issued by the monitor after the key was added, names the entity and its caps and opens
/// with the OSD's own key; a ticket newer than the OSD's entity table is taken as it is
/// (docs/security.md, "Tickets"). So the write is served while the OSD is still cut off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_added_while_a_leader_is_cut_off_the_monitor_is_served_at_once() {
    let fx = fixture().await;
    let (victim, led) = busiest_leader(&fx.leaders().await);
    fx.net.cut_from_monitor(victim);
    let key = fx
        .client
        .auth_add("client.late", "pool=fb")
        .await
        .expect("auth add");
    let mut config = fx.net.mons.client_config();
    config.credentials = Some((key.entity.clone(), key.key.clone()));
    config.op_deadline = REACT;
    let cluster = Cluster::connect(config)
        .await
        .expect("the monitor accepts the new key");
    let image = Arc::new(cluster.open_image("fb", "img").await.unwrap());
    let block = fx
        .blocks()
        .into_iter()
        .find(|b| led.contains(&block_pg(&image, *b)))
        .expect("a block in a PG the cut-off OSD leads");
    let data = stamped_block(block * BLOCK, 1);
    let started = Instant::now();
    image
        .write(block * BLOCK, data.clone())
        .await
        .unwrap_or_else(|e| panic!("the write while osd {victim} is cut off: {e}"));
    let took = started.elapsed();
    let leader = cluster.leader_of(block_pg(&image, block)).await.unwrap();
    assert_eq!(
        leader, victim,
        "the cut-off OSD itself served the write (it keeps leading its PGs)"
    );
    eprintln!(
        "late-key: the write completed in {took:?} while osd {victim} was cut off the monitor (PG led by osd {leader})"
    );
    fx.net.heal_from_monitor(victim);
    assert_eq!(image.read(block * BLOCK, BLOCK).await.unwrap(), data);
}

/// How a scenario cuts one leader and one of its followers apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PairCut {
    /// Each drops the other's packets.
    BothWays,
    /// The follower drops the leader's packets; its own still reach the leader.
    LeaderToFollower,
}

/// Cuts the leader of most PGs and one follower apart during IO; both still reach the
/// monitor, the client and the third OSD. The follower must fall behind on a PG the leader
/// leads (the cut works), the PG must keep serving writes with the other majority, and after
/// the heal the follower catches up.
async fn cut_a_leader_from_a_follower(case: &str, how: PairCut, seed: u64) {
    let fx = fixture().await;
    let leaders = fx.leaders().await;
    let (leader, led) = busiest_leader(&leaders);
    let pg = led[0];
    let map = fx.map().await;
    let members = &map.pg(pg).unwrap().osdlist;
    let follower = *members.iter().find(|o| **o != leader).unwrap();
    let blocks = fx.blocks();
    let io = Io::start(fx.image.clone(), blocks.clone(), seed);
    io.wait_writes(100, "writes before the partition").await;

    match how {
        PairCut::BothWays => fx.net.drop_between(leader, follower),
        PairCut::LeaderToFollower => fx.net.drop_one_way(leader, follower),
    }
    let cut = Instant::now();
    let (ahead, behind) = wait_until(REACT, "the cut-off follower falls behind", || async {
        let map = fx.map().await;
        let ahead = fx.applied(&map, leader, pg).await;
        let behind = fx.applied(&map, follower, pg).await;
        (ahead >= behind + 20).then_some((ahead, behind))
    })
    .await;
    eprintln!(
        "{case}: {pg} led by osd {leader}: follower osd {follower} at applied index {behind}, \
         the leader at {ahead}, {:?} after the cut",
        cut.elapsed()
    );
    tokio::time::sleep(PARTITION.saturating_sub(cut.elapsed())).await;
    let during = fx.leaders().await;
    match how {
        PairCut::BothWays => fx.net.heal_between(leader, follower),
        PairCut::LeaderToFollower => fx.net.heal_one_way(leader, follower),
    }
    let healed = Instant::now();
    let changed: Vec<PgId> = leaders
        .iter()
        .filter(|(pg, l)| during.get(pg) != Some(l))
        .map(|(pg, _)| *pg)
        .collect();
    eprintln!("{case}: PGs whose leader changed during the partition: {changed:?}");

    tokio::time::sleep(AFTER_HEAL).await;
    io.wait_writes(1, "writes after the heal").await;
    let (ops, model) = io.finish().await;
    let took = fx.converge(&model, &blocks).await;
    eprintln!("{case}: replicas identical {took:?} after the IO stopped");
    report(case, &ops, &model.lock().unwrap(), (cut, healed), &[pg]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_and_one_follower_cut_apart_keep_serving_with_the_other() {
    cut_a_leader_from_a_follower("leader-follower", PairCut::BothWays, 23).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_deaf_to_its_leader_falls_behind_and_catches_up() {
    cut_a_leader_from_a_follower("deaf-follower", PairCut::LeaderToFollower, 31).await;
}

/// The checker itself: it accepts what a correct store may return and flags a stale read, so
/// the tests above can fail.
#[test]
fn the_model_flags_stale_reads_and_allows_failed_writes() {
    let mut m = Model::default();
    let at = |g| stamped_block(5 * BLOCK, g);
    assert_eq!(m.floor(5), None);
    m.check(5, None, &[0; BLOCK as usize], "zeros before any write");
    m.issue(5, 1);
    m.complete(5, 1, Outcome::Acked);
    m.issue(5, 2);
    m.complete(5, 2, Outcome::Failed);
    m.issue(5, 3);
    let floor = m.floor(5);
    assert_eq!(floor, Some(0));
    for g in [1, 2, 3] {
        m.check(5, floor, &at(g), "allowed");
    }
    assert!(m.violations.is_empty(), "{:?}", m.violations);
    m.complete(5, 3, Outcome::Acked);
    let floor = m.floor(5);
    m.check(5, floor, &at(2), "older than the floor");
    m.check(
        5,
        floor,
        &[0; BLOCK as usize],
        "zeros after an acknowledged write",
    );
    m.check(5, floor, &at(9), "never written");
    assert_eq!(m.violations.len(), 3, "{:?}", m.violations);
    assert_eq!(m.stale_reads(), 2, "{:?}", m.violations);
    assert!(m.violations[0].contains("STALE: generation 2"));
    assert_eq!(m.reads_checked, 7);
}

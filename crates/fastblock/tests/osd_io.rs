//! Replicated IO end to end through the client library: verified random and sequential IO on
//! 3-replica and 1-replica pools, many PGs, images with many objects per PG; the SIGKILL of a
//! PG leader during a verified write run (IO pauses, resumes after re-election, loses nothing
//! acknowledged, and all replicas end identical).

mod common;

use bytes::Bytes;
use common::{
    pool_with_image, start_osds, wait_all_active, MonCluster, MonOptions, OsdProc, TempDir,
    WireConn,
};
use fastblock_client::{ClientError, Cluster, Image};
use fastblock_types::PgId;
use fastblock_wire::{Reply, Request};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{stamped_block as block, BLOCK};

struct Setup {
    mons: MonCluster,
    _dir: TempDir,
    osds: Vec<OsdProc>,
    cluster: Arc<Cluster>,
}

async fn setup(
    n: usize,
    pg_count: u32,
    size: u32,
    image_size: u64,
    object_size: u64,
) -> (Setup, Image) {
    setup_sharded(n, 1, pg_count, size, image_size, object_size).await
}

async fn setup_sharded(
    n: usize,
    shards: u32,
    pg_count: u32,
    size: u32,
    image_size: u64,
    object_size: u64,
) -> (Setup, Image) {
    let mons = MonCluster::start(1, MonOptions::default()).await;
    let dir = TempDir::new("osdio");
    let osds = start_osds(
        &mons,
        dir.path(),
        n,
        "512M",
        shards,
        Duration::from_secs(20),
    )
    .await;
    let client = mons.client();
    pool_with_image(
        &client,
        ("fb", pg_count, size),
        ("img", image_size, object_size),
    )
    .await;
    let mut config = mons.client_config();
    config.op_deadline = Duration::from_secs(30);
    let cluster = Cluster::connect(config).await.unwrap();
    let image = cluster.open_image("fb", "img").await.unwrap();
    (
        Setup {
            mons,
            _dir: dir,
            osds,
            cluster,
        },
        image,
    )
}

/// Writes `count` blocks (random or sequential offsets) and reads every one back.
async fn write_then_verify(image: &Image, count: u64, sequential: bool, seed: u64) {
    let blocks = image.size_bytes() / BLOCK;
    let mut written: BTreeMap<u64, u64> = BTreeMap::new();
    let mut x = seed | 1;
    for generation in 0..count {
        let b = if sequential {
            generation % blocks
        } else {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % blocks
        };
        image
            .write(b * BLOCK, block(b * BLOCK, generation))
            .await
            .unwrap();
        written.insert(b, generation);
    }
    for (b, generation) in &written {
        let got = image.read(b * BLOCK, BLOCK).await.unwrap();
        assert!(
            got == block(b * BLOCK, *generation),
            "block {b} does not hold generation {generation}"
        );
    }
    // A multi-block, cross-object read returns exactly what the single reads returned.
    let span = image.read(0, 64 * BLOCK).await.unwrap();
    for b in 0..64 {
        let want = written
            .get(&b)
            .map(|g| block(b * BLOCK, *g))
            .unwrap_or_else(|| Bytes::from(vec![0u8; BLOCK as usize]));
        assert!(
            span[(b * BLOCK) as usize..((b + 1) * BLOCK) as usize] == want[..],
            "span block {b}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_random_and_sequential_verified() {
    let (_s, image) = setup(3, 8, 3, 16 << 20, 1 << 20).await;
    write_then_verify(&image, 400, false, 7).await;
    write_then_verify(&image, 300, true, 0).await;
    // Discard and write-zeroes read back as zeros.
    image.write(0, block(0, 99)).await.unwrap();
    image.discard(0, BLOCK).await.unwrap();
    assert!(image.read(0, BLOCK).await.unwrap().iter().all(|b| *b == 0));
    image.write(BLOCK, block(BLOCK, 98)).await.unwrap();
    image.write_zeroes(BLOCK, BLOCK).await.unwrap();
    assert!(image
        .read(BLOCK, BLOCK)
        .await
        .unwrap()
        .iter()
        .all(|b| *b == 0));
    // Out of range is refused before any IO.
    assert!(matches!(
        image.read(16 << 20, BLOCK).await,
        Err(ClientError::OutOfRange { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_depth_32_writes_then_verified_reads() {
    // Many proposals per PG per loop iteration: the group-commit path under concurrency.
    let (_s, image) = setup(3, 8, 3, 16 << 20, 1 << 20).await;
    let image = Arc::new(image);
    let blocks = image.size_bytes() / BLOCK;
    let mut tasks = Vec::new();
    for worker in 0..32u64 {
        let image = image.clone();
        tasks.push(tokio::spawn(async move {
            // Each worker owns the blocks congruent to it, so the final value is known.
            let mut last = BTreeMap::new();
            for round in 0..12u64 {
                let b = (worker + 32 * (round * 7 % (blocks / 32))) % blocks;
                let generation = worker * 1000 + round;
                image
                    .write(b * BLOCK, block(b * BLOCK, generation))
                    .await
                    .unwrap();
                last.insert(b, generation);
            }
            last
        }));
    }
    let mut expected = BTreeMap::new();
    for t in tasks {
        expected.extend(t.await.unwrap());
    }
    let mut reads = Vec::new();
    for (b, g) in expected.clone() {
        let image = image.clone();
        reads.push(tokio::spawn(async move {
            (b, g, image.read(b * BLOCK, BLOCK).await.unwrap())
        }));
    }
    for r in reads {
        let (b, g, got) = r.await.unwrap();
        assert!(got == block(b * BLOCK, g), "block {b} lost generation {g}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn osds_with_two_shards_route_each_pg_to_its_shard() {
    let (s, image) = setup_sharded(3, 2, 16, 3, 16 << 20, 1 << 20).await;
    let map = s.cluster.map();
    assert!(map.osds.values().all(|o| o.shards == 2));
    let used: std::collections::BTreeSet<u16> = (0..16)
        .map(|seq| {
            map.osds
                .values()
                .next()
                .unwrap()
                .port_for(PgId::new(fastblock_types::PoolId(1), seq))
        })
        .collect();
    assert_eq!(used.len(), 2, "PGs spread over both shard ports");
    write_then_verify(&image, 300, false, 11).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_pool_many_pgs_and_many_objects_per_pg() {
    // More PGs than OSDs x 10, and an image of 256 objects over them (several per PG).
    let (s, image) = setup(3, 40, 1, 16 << 20, 64 << 10).await;
    assert!(image.info().object_count() > 40 * 2);
    write_then_verify(&image, 600, false, 3).await;
    let unaligned = Bytes::from(vec![0xabu8; 10_000]);
    image.write(70_000, unaligned.clone()).await.unwrap(); // crosses an object boundary
    assert_eq!(image.read(70_000, 10_000).await.unwrap(), unaligned);
    let missing = s.cluster.open_image("fb", "nope").await;
    assert!(
        matches!(missing, Err(ClientError::ImageNotFound { .. })),
        "{missing:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_sigkill_during_writes_loses_nothing_acknowledged() {
    let (mut s, image) = setup(3, 4, 3, 8 << 20, 1 << 20).await;
    let image = Arc::new(image);
    // Only the first object's blocks: every write goes to the PG whose leader is killed, so
    // the longest write is the failover pause.
    let blocks = image.info().object_size_bytes / BLOCK;
    let target_pg: PgId = image.object_pg(0);
    let victim_id = s.cluster.leader_of(target_pg).await.unwrap();
    let victim = s.osds.iter().position(|o| o.id == victim_id).unwrap();

    // Writer: sequential passes over the image; records the last acknowledged generation of
    // each block and the worst latency (the pause caused by the kill).
    let progress = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (image, progress, stop) = (image.clone(), progress.clone(), stop.clone());
        tokio::spawn(async move {
            let mut acked: BTreeMap<u64, u64> = BTreeMap::new();
            let mut worst = Duration::ZERO;
            let mut generation = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let b = generation % blocks;
                let t = Instant::now();
                image
                    .write(b * BLOCK, block(b * BLOCK, generation))
                    .await
                    .expect("writes succeed across the failover");
                worst = worst.max(t.elapsed());
                acked.insert(b, generation);
                generation += 1;
                progress.store(generation, std::sync::atomic::Ordering::Relaxed);
            }
            (acked, worst, generation)
        })
    };
    let acked_now = || progress.load(std::sync::atomic::Ordering::Relaxed);
    common::wait_until(
        Duration::from_secs(20),
        "200 writes before the kill",
        || async { (acked_now() >= 200).then_some(()) },
    )
    .await;
    s.osds[victim].kill();
    let at_kill = acked_now();
    // IO resumes after the re-election: 500 more writes must be acknowledged.
    common::wait_until(
        Duration::from_secs(30),
        "writes to resume after the leader kill",
        || async { (acked_now() >= at_kill + 500).then_some(()) },
    )
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (acked, worst, total) = writer.await.unwrap();
    eprintln!("leader kill: {total} writes acknowledged, longest write {worst:?} (the pause)");

    let client = s.mons.client();
    s.osds[victim].start();
    wait_all_active(&client, Duration::from_secs(30)).await;
    for (b, generation) in &acked {
        let got = image.read(b * BLOCK, BLOCK).await.unwrap();
        assert!(
            got == block(b * BLOCK, *generation),
            "acknowledged write of block {b} lost"
        );
    }
    // The restarted OSD catches up: every replica of the PG holds identical objects.
    let map = client.map().await.unwrap().map.unwrap();
    let members = map.pg(target_pg).unwrap().osdlist.clone();
    let mut conns = Vec::new();
    for osd in &members {
        let o = &map.osds[osd];
        conns.push(WireConn::connect(&format!("{}:{}", o.address, o.port_for(target_pg))).await);
    }
    // Poll every replica until all report the same applied index and the same objects.
    let mut last = Vec::new();
    for _ in 0..150 {
        last.clear();
        for conn in &mut conns {
            match conn.call(&Request::ReplicaDigest { pg: target_pg }).await {
                Reply::Digest {
                    applied_index,
                    objects,
                } => last.push((applied_index, objects)),
                other => panic!("digest of {target_pg}: {other:?}"),
            }
        }
        if last.windows(2).all(|w| w[0] == w[1]) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let applied: Vec<u64> = last.iter().map(|(a, _)| *a).collect();
    panic!(
        "replicas of {target_pg} did not converge: applied indexes {applied:?}, digests {last:?}"
    );
}

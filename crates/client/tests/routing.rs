//! The client's routing, redirect, retry and deadline rules (docs/data-path.md, "Retry
//! rules") against fake OSDs speaking the real wire protocol, on an injected map.

use bytes::Bytes;
use fastblock_client::testing::{image_info, FakeOsd, MapBuilder, POOL};
use fastblock_client::types::{OsdId, PgId};
use fastblock_client::wire::{LeaderHint, Reply, Request, Status};
use fastblock_client::{BlockingImage, ClientConfig, ClientError, Cluster, Image};
use std::sync::Arc;
use std::time::{Duration, Instant};

const KIB: u64 = 1024;
const MIB: u64 = 1 << 20;

fn config(deadline: Duration) -> ClientConfig {
    ClientConfig {
        op_deadline: deadline,
        attempt_timeout: Duration::from_secs(2),
        ..ClientConfig::default()
    }
}

async fn open(
    map: fastblock_client::types::map::ClusterMap,
    deadline: Duration,
    size: u64,
    object: u64,
) -> (Arc<Cluster>, Image) {
    let cluster = Cluster::with_map(map, config(deadline)).unwrap();
    let image = cluster
        .open_image_info(image_info(7, "img", size, object))
        .await
        .unwrap();
    (cluster, image)
}

fn not_leader(hint: Option<LeaderHint>) -> Reply {
    Reply::error(Status::NotLeader, hint, "not the leader")
}

fn is_io(request: &Request) -> bool {
    !matches!(request, Request::GetLeader { .. })
}

/// Goal: a request follows a NotLeader hint to another OSD, then rides out a Busy there.
/// Method: OSD 1 (the map's leader) answers GetLeader with itself but refuses IO naming OSD 2;
/// OSD 2 answers Busy once, then serves. The write must land on OSD 2 only, the leader cache
/// must end on OSD 2, and the data must read back from it.
#[tokio::test]
async fn follows_not_leader_hint_then_retries_busy() {
    let a = FakeOsd::start(1).await;
    let b = FakeOsd::start(2).await;
    let hint_b = b.hint();
    a.set_handler(move |r| is_io(r).then(|| not_leader(Some(hint_b.clone()))));
    b.push_replies([Reply::error(Status::Busy, None, "queue full")]);
    let map = MapBuilder::new(1)
        .osd(1, a.port())
        .osd(2, b.port())
        .members(&[1, 2])
        .build();
    let (cluster, image) = open(map, Duration::from_secs(5), 16 * MIB, 4 * MIB).await;

    let data = Bytes::from(vec![0xabu8; 4096]);
    image.write(8192, data.clone()).await.unwrap();

    let pg = PgId::new(POOL, 0);
    assert_eq!(cluster.cached_leader(pg), Some(OsdId(2)));
    assert_eq!(a.io_count(), 1, "OSD 1 saw the first attempt only");
    assert_eq!(b.io_count(), 2, "OSD 2 saw Busy then the successful retry");
    assert!(matches!(a.requests()[0], Request::GetLeader { pg: p, .. } if p == pg));
    let stats = cluster.stats();
    assert_eq!(stats.redirects, 1);
    assert_eq!(stats.retries, 2);

    assert_eq!(image.read(8192, 4096).await.unwrap(), data);
    assert_eq!(
        a.io_count(),
        1,
        "the read went straight to the cached leader"
    );
}

/// Goal: a leader that refuses a mutation for its term (the term fence, docs/data-path.md
/// section 4) is retried at once with the term its hint names, and the client keeps that term
/// for the next mutations. Method: OSD 1's GetLeader names term 1 (`FAKE_TERM`, as a stale
/// answer would), but it leads in term 7: it refuses mutations naming any other term with
/// NotLeader naming itself and term 7. The write must land on the second attempt with term
/// 7, and the next write must name 7 at once; reads name no term.
#[tokio::test]
async fn a_refusal_for_the_term_is_retried_at_once_with_the_leaders_term() {
    let a = FakeOsd::start(1).await;
    let mut hint_now = a.hint();
    hint_now.term = 7;
    a.set_handler(move |r| match r.term() {
        Some(term) if term != 7 => Some(not_leader(Some(hint_now.clone()))),
        _ => None,
    });
    let map = MapBuilder::new(1).osd(1, a.port()).members(&[1]).build();
    let (cluster, image) = open(map, Duration::from_secs(5), 16 * MIB, 4 * MIB).await;

    let data = Bytes::from(vec![0x5au8; 4096]);
    image.write(0, data.clone()).await.unwrap();
    image.write(4096, data.clone()).await.unwrap();
    assert_eq!(image.read(0, 4096).await.unwrap(), data);
    let terms: Vec<Option<u64>> = a
        .requests()
        .iter()
        .filter(|r| is_io(r))
        .map(Request::term)
        .collect();
    assert_eq!(
        terms,
        [
            Some(fastblock_client::testing::FAKE_TERM),
            Some(7),
            Some(7),
            None
        ]
    );
    let stats = cluster.stats();
    assert_eq!(stats.redirects, 1, "one refusal for the term, followed");
    assert_eq!(stats.retries, 1, "and retried once");
}

/// Goal: a hint naming an OSD the map does not know is still followed, at the hint's address.
#[tokio::test]
async fn follows_a_hint_to_an_osd_the_map_does_not_know() {
    let a = FakeOsd::start(1).await;
    let b = FakeOsd::start(9).await;
    let hint_b = b.hint();
    a.set_handler(move |r| is_io(r).then(|| not_leader(Some(hint_b.clone()))));
    let map = MapBuilder::new(1).osd(1, a.port()).members(&[1]).build();
    let (cluster, image) = open(map, Duration::from_secs(5), 16 * MIB, 4 * MIB).await;
    image.write(0, Bytes::from(vec![1u8; 512])).await.unwrap();
    assert_eq!(cluster.cached_leader(PgId::new(POOL, 0)), Some(OsdId(9)));
    assert_eq!(b.io_count(), 1);
}

/// Goal: when the map's recorded leader does not know the leader, the next up member is asked.
#[tokio::test]
async fn asks_the_next_member_when_the_recorded_leader_knows_nothing() {
    let a = FakeOsd::start(1).await;
    let b = FakeOsd::start(2).await;
    a.set_leader(None);
    let map = MapBuilder::new(1)
        .osd(1, a.port())
        .osd(2, b.port())
        .members(&[1, 2])
        .build();
    let (cluster, image) = open(map, Duration::from_secs(5), 16 * MIB, 4 * MIB).await;
    image.write(0, Bytes::from(vec![1u8; 4096])).await.unwrap();
    assert_eq!(cluster.cached_leader(PgId::new(POOL, 0)), Some(OsdId(2)));
    assert_eq!(a.io_count(), 0);
    assert_eq!(b.io_count(), 1);
}

/// Goal: a PG that never becomes ready fails with Timeout after the configured deadline,
/// naming the PG and the last failure. Method: every IO is answered NotReady.
#[tokio::test]
async fn not_ready_forever_times_out_at_the_deadline() {
    let a = FakeOsd::start(1).await;
    a.set_handler(|r| is_io(r).then(|| Reply::error(Status::NotReady, None, "electing")));
    let map = MapBuilder::new(4).osd(1, a.port()).members(&[1]).build();
    let deadline = Duration::from_millis(300);
    let (cluster, image) = open(map, deadline, 16 * MIB, 4 * MIB).await;

    let started = Instant::now();
    let error = image.read(4 * MIB, 4096).await.unwrap_err();
    let elapsed = started.elapsed();

    let expected_pg = image.object_pg(1);
    match &error {
        ClientError::Timeout {
            pg,
            deadline: d,
            last,
        } => {
            assert_eq!(*pg, expected_pg);
            assert_eq!(*d, deadline);
            assert!(last.contains("NotReady"), "{last}");
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
    assert!(error.is_retryable());
    assert!(elapsed >= deadline, "gave up early: {elapsed:?}");
    assert!(
        elapsed < deadline + Duration::from_millis(700),
        "gave up late: {elapsed:?}"
    );
    assert!(a.io_count() >= 3, "it retried: {}", a.io_count());
    assert_eq!(cluster.stats().timeouts, 1);
}

/// Goal: non-retryable OSD errors come back at once as `Io`, with PG, OSD and status.
#[tokio::test]
async fn io_errors_are_not_retried() {
    let a = FakeOsd::start(1).await;
    a.set_handler(|r| is_io(r).then(|| Reply::error(Status::IoError, None, "disk gone")));
    let map = MapBuilder::new(1).osd(1, a.port()).members(&[1]).build();
    let (_cluster, image) = open(map, Duration::from_secs(5), 16 * MIB, 4 * MIB).await;
    let error = image
        .write(0, Bytes::from_static(&[1; 16]))
        .await
        .unwrap_err();
    match error {
        ClientError::Io {
            pg,
            osd,
            status,
            message,
        } => {
            assert_eq!(pg, PgId::new(POOL, 0));
            assert_eq!(osd, OsdId(1));
            assert_eq!(status, Status::IoError);
            assert_eq!(message, "disk gone");
        }
        other => panic!("expected Io, got {other:?}"),
    }
    assert_eq!(a.io_count(), 1);
}

/// Goal: ranges outside the image fail before anything is sent.
#[tokio::test]
async fn out_of_range_sends_nothing() {
    let a = FakeOsd::start(1).await;
    let map = MapBuilder::new(1).osd(1, a.port()).members(&[1]).build();
    let (_cluster, image) = open(map, Duration::from_secs(5), 16 * MIB, 4 * MIB).await;
    let end = image.size_bytes();
    assert!(matches!(
        image.read(end - 100, 101).await,
        Err(ClientError::OutOfRange { offset, len: 101, size }) if offset == end - 100 && size == end
    ));
    assert!(image.write(end, Bytes::from_static(b"x")).await.is_err());
    assert!(image.discard(u64::MAX, 2).await.is_err());
    assert!(image.write_zeroes(0, end + 1).await.is_err());
    assert!(a.requests().is_empty());
    // Empty IO at the very end is fine and sends nothing either.
    assert!(image.read(end, 0).await.unwrap().is_empty());
    assert!(a.requests().is_empty());
}

/// Goal: an unaligned IO crossing several objects (and PGs) is split, sent, and reassembled in
/// order; discard and write-zeroes clear exactly their range.
#[tokio::test]
async fn cross_object_io_round_trips() {
    let a = FakeOsd::start(1).await;
    let map = MapBuilder::new(8).osd(1, a.port()).members(&[1]).build();
    let object = 64 * KIB;
    let (_cluster, image) = open(map, Duration::from_secs(5), 4 * MIB, object).await;

    let offset = object - 1000;
    let pattern: Vec<u8> = (0..(3 * object + 77))
        .map(|i| (i * 7 % 251) as u8)
        .collect();
    image
        .write(offset, Bytes::from(pattern.clone()))
        .await
        .unwrap();
    assert_eq!(
        a.io_count(),
        4,
        "head of object 0, objects 1 and 2 whole, most of object 3"
    );
    let back = image.read(offset, pattern.len() as u64).await.unwrap();
    assert_eq!(back, pattern);

    image.discard(offset + 10, 20).await.unwrap();
    image.write_zeroes(2 * object - 5, 10).await.unwrap();
    image.flush().await.unwrap();
    let mut expected = pattern.clone();
    expected[10..30].fill(0);
    let z = (2 * object - 5 - offset) as usize;
    expected[z..z + 10].fill(0);
    assert_eq!(
        image.read(offset, pattern.len() as u64).await.unwrap(),
        expected
    );
}

/// Goal: many concurrent IOs through a small in-flight limit all complete (backpressure, no
/// deadlock), multiplexed over one connection.
#[tokio::test]
async fn concurrent_io_through_a_small_inflight_limit() {
    let a = FakeOsd::start(1).await;
    let map = MapBuilder::new(4).osd(1, a.port()).members(&[1]).build();
    let cluster = Cluster::with_map(
        map,
        ClientConfig {
            inflight_ops_max: 3,
            ..config(Duration::from_secs(5))
        },
    )
    .unwrap();
    let image = cluster
        .open_image_info(image_info(3, "c", 8 * MIB, 64 * KIB))
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for i in 0..64u64 {
        let image = image.clone();
        tasks.push(tokio::spawn(async move {
            let data = Bytes::from(vec![i as u8; 8192]);
            // Crosses an object boundary every other time: two pieces, two slots.
            let offset = i * 60 * KIB;
            image.write(offset, data.clone()).await.unwrap();
            assert_eq!(image.read(offset, 8192).await.unwrap(), data);
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(cluster.stats().connects, 1);
}

/// Goal: the blocking wrapper does the same IO from a plain thread.
#[test]
fn blocking_image_round_trips() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let a = runtime.block_on(FakeOsd::start(1));
    let map = MapBuilder::new(2).osd(1, a.port()).members(&[1]).build();
    let image = BlockingImage::with_map(
        map,
        config(Duration::from_secs(5)),
        image_info(5, "b", 16 * MIB, 4 * MIB),
    )
    .unwrap();
    assert_eq!(image.size_bytes(), 16 * MIB);
    image
        .write(4 * MIB - 10, Bytes::from_static(&[9u8; 20]))
        .unwrap();
    assert_eq!(image.read(4 * MIB - 10, 20).unwrap(), vec![9u8; 20]);
    image.flush().unwrap();
    drop(image);
    drop(a);
}

/// Goal: `allocated_ranges` asks every object of the range (one `Allocation` request per
/// object piece), makes the answers image-absolute and merges neighbours across objects; and
/// an OSD answer outside the asked range is a protocol error, not trusted.
/// Method: 64 KiB objects on one fake OSD (which counts non-zero 4 KiB blocks as allocated);
/// write across an object boundary, discard part of it, compare; then script a bad answer.
#[tokio::test]
async fn allocated_ranges_span_objects_and_are_checked() {
    let osd = FakeOsd::start(1).await;
    let map = MapBuilder::new(4).osd(1, osd.port()).members(&[1]).build();
    let (_cluster, image) = open(map, Duration::from_secs(5), 16 * 64 * KIB, 64 * KIB).await;
    assert_eq!(image.allocated_ranges(0, 256 * KIB).await.unwrap(), vec![]);
    image
        .write(56 * KIB, Bytes::from(vec![7u8; 16 * KIB as usize]))
        .await
        .unwrap();
    assert_eq!(
        image.allocated_ranges(0, 256 * KIB).await.unwrap(),
        vec![(56 * KIB, 16 * KIB)],
        "one range across the boundary of objects 0 and 1"
    );
    image.discard(60 * KIB, 8 * KIB).await.unwrap();
    assert_eq!(
        image.allocated_ranges(0, 256 * KIB).await.unwrap(),
        vec![(56 * KIB, 4 * KIB), (68 * KIB, 4 * KIB)]
    );
    osd.push_replies([Reply::Allocated(vec![
        fastblock_client::wire::AllocatedRange {
            offset: 0,
            length: 8192,
        },
    ])]);
    let err = image.allocated_ranges(8 * KIB, 4 * KIB).await.unwrap_err();
    assert!(matches!(err, ClientError::Protocol(_)), "{err}");
}

/// An image opened before the client's map shows it (created or grown a moment ago) would
/// be refused by an OSD whose map is as old as the requests' epoch as if it did not exist;
/// open waits for a map that shows it, and refuses an image the map says was removed.
#[tokio::test]
async fn open_needs_a_map_that_shows_the_image_at_its_size() {
    use fastblock_client::types::map::{ImageExtent, ImageTable};
    use fastblock_client::types::ImageId;
    let with_table = |next_id: u64, images: &[(u64, u64)]| {
        let mut map = MapBuilder::new(4).osd(1, 1).members(&[1]).build();
        map.images = Some(ImageTable {
            next_id,
            images: images
                .iter()
                .map(|&(id, size_bytes)| {
                    let extent = ImageExtent {
                        size_bytes,
                        object_size_bytes: MIB,
                        parent_overlap_bytes: None,
                    };
                    (ImageId(id), extent)
                })
                .collect(),
        });
        map
    };
    let info = image_info(7, "img", 8 * MIB, MIB);
    let open = |map| async {
        let cluster = Cluster::with_map(map, config(Duration::from_secs(1))).unwrap();
        cluster.open_image_info(info.clone()).await.map(drop)
    };
    // Shown at its size: opens.
    open(with_table(8, &[(7, 8 * MIB)])).await.unwrap();
    // Newer than the map (id not issued yet), or grown since: the map is behind.
    for behind in [with_table(7, &[]), with_table(8, &[(7, 4 * MIB)])] {
        let e = open(behind).await.unwrap_err();
        assert!(
            matches!(e, ClientError::MapBehind { .. }) && e.is_retryable(),
            "{e}"
        );
    }
    // Removed (issued, not in the table): the image does not exist.
    let e = open(with_table(8, &[(6, MIB)])).await.unwrap_err();
    assert!(matches!(e, ClientError::ImageNotFound { .. }), "{e}");
}

/// Goal: a request in flight to a leader that went silent (cut off from the network) is sent
/// to the new leader as soon as the map records it, not after the attempt timeout.
/// Method: OSD 1, the recorded leader, records IO but never answers; the attempt timeout is
/// 30 s. 300 ms after the write is sent, a map recording OSD 2 as leader is installed (as the
/// map watch would). The write must complete on OSD 2 well before the 30 s, within a 10 s bound.
#[tokio::test]
async fn a_request_to_a_silent_leader_moves_when_the_map_records_a_new_one() {
    let a = FakeOsd::start(1).await;
    let b = FakeOsd::start(2).await;
    a.set_silent(true);
    let builder = || {
        MapBuilder::new(1)
            .osd(1, a.port())
            .osd(2, b.port())
            .members(&[1, 2])
    };
    let config = ClientConfig {
        op_deadline: Duration::from_secs(60),
        attempt_timeout: Duration::from_secs(30),
        ..ClientConfig::default()
    };
    let cluster = Cluster::with_map(builder().build(), config).unwrap();
    let image = cluster
        .open_image_info(image_info(7, "img", 16 * MIB, 4 * MIB))
        .await
        .unwrap();
    let data = Bytes::from(vec![0x5au8; 4096]);
    let write = tokio::spawn({
        let image = image.clone();
        let data = data.clone();
        async move { image.write(0, data).await }
    });
    let sent = tokio::time::timeout(Duration::from_secs(5), async {
        while a.io_count() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(sent.is_ok(), "the write never reached the recorded leader");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let mut moved = builder().members(&[2, 1]).epoch(2).build();
    moved
        .pgmaps
        .get_mut(&POOL)
        .unwrap()
        .pgs
        .get_mut(&0)
        .unwrap()
        .leader = Some(OsdId(2));
    assert!(cluster.set_map(moved));
    let done = tokio::time::timeout(Duration::from_secs(10), write).await;
    let waited = started.elapsed();
    done.expect("the write waited for the silent leader's attempt timeout")
        .unwrap()
        .unwrap();
    assert_eq!(
        b.io_count(),
        1,
        "the write was sent again to the new leader"
    );
    assert_eq!(cluster.cached_leader(PgId::new(POOL, 0)), Some(OsdId(2)));
    assert_eq!(image.read(0, 4096).await.unwrap(), data);
    eprintln!("moved to the new leader {waited:?} after the map recorded it");
}

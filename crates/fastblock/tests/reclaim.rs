//! Reclaim and fencing on real processes: a removed image's space comes back to the OSDs and
//! its reclaim entry goes; a handle still open on it is refused; a shrunk image grown again
//! reads zeros where its old tail was (including the object the shrink cut in the middle).

mod common;

use bytes::Bytes;
use common::{pool_with_image, start_osds, wait_until, MonCluster, MonOptions, OsdProc, TempDir};
use fastblock_client::{ClientError, Cluster};
use fastblock_types::api::{ErrorCode, ResizeImageRequest};
use fastblock_wire::Status;
use std::time::Duration;

const MIB: u64 = 1 << 20;
const OBJECT_BYTES: u64 = MIB;
const WAIT: Duration = Duration::from_secs(30);

struct Setup {
    mons: MonCluster,
    _dir: TempDir,
    osds: Vec<OsdProc>,
}

async fn setup(image_bytes: u64) -> Setup {
    let mons = MonCluster::start(1, MonOptions::default()).await;
    let dir = TempDir::new("reclaim");
    let osds = start_osds(&mons, dir.path(), 3, "256M", 1, WAIT).await;
    let client = mons.client();
    pool_with_image(&client, ("fb", 8, 3), ("img", image_bytes, OBJECT_BYTES)).await;
    Setup {
        mons,
        _dir: dir,
        osds,
    }
}

/// A byte pattern that differs per MiB, never zero.
fn pattern(offset: u64, len: u64) -> Bytes {
    (offset..offset + len)
        .map(|i| 1 + ((i / MIB + i) % 251) as u8)
        .collect::<Vec<u8>>()
        .into()
}

async fn wait_reclaim_empty(s: &Setup) {
    let client = s.mons.client();
    wait_until(WAIT, "the reclaim list empties", || {
        let client = &client;
        async move {
            let pending = client.reclaim().await.ok()?;
            pending.is_empty().then_some(())
        }
    })
    .await;
}

fn status_of(e: &ClientError) -> Option<Status> {
    match e {
        ClientError::Io { status, .. } => Some(*status),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_image_gives_its_space_back_and_an_open_handle_is_refused() {
    let s = setup(32 * MIB).await;
    let before = common::free_bytes(&s.osds).await;
    let cluster = Cluster::connect(s.mons.client_config()).await.unwrap();
    let image = cluster.open_image("fb", "img").await.unwrap();
    image.write(0, pattern(0, 32 * MIB)).await.unwrap();
    // The write is answered once a majority holds it; the third replica may still be
    // applying it, so wait (bounded) until every OSD holds its copy.
    let osds = &s.osds;
    let before_ref = &before;
    let written = wait_until(
        WAIT,
        "every OSD to hold a replica of the 32 MiB",
        || async move {
            let now = common::free_bytes(osds).await;
            let all = before_ref.iter().zip(&now).all(|(b, w)| b - w >= 30 * MIB);
            all.then_some(now)
        },
    )
    .await;
    for (b, w) in before.iter().zip(&written) {
        assert!(
            b - w >= 30 * MIB,
            "every OSD holds a replica of the 32 MiB: {before:?} -> {written:?}"
        );
    }
    let client = s.mons.client();
    client.remove_image("fb", "img").await.unwrap();
    assert_eq!(client.reclaim().await.unwrap().len(), 1);
    wait_reclaim_empty(&s).await;
    // Deleted blocks are free for new data at the next flush (every second).
    wait_until(WAIT, "the OSDs get the space back", || {
        let osds = &s.osds;
        let before = before.clone();
        async move {
            let now = common::free_bytes(osds).await;
            now.iter()
                .zip(&before)
                .all(|(n, b)| *n + MIB >= *b)
                .then_some(())
        }
    })
    .await;
    // The handle opened before the removal is refused, for writes and reads alike.
    let reclaimed = common::free_bytes(&s.osds).await;
    let write = image.write(0, pattern(0, 4096)).await.unwrap_err();
    assert_eq!(status_of(&write), Some(Status::NoSuchImage), "{write}");
    let read = image.read(0, 4096).await.unwrap_err();
    assert_eq!(status_of(&read), Some(Status::NoSuchImage), "{read}");
    let after = common::free_bytes(&s.osds).await;
    assert_eq!(after, reclaimed, "the refused write stored nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shrunk_then_grown_image_reads_zeros_in_its_old_tail() {
    let size = 16 * MIB;
    let s = setup(size).await;
    let cluster = Cluster::connect(s.mons.client_config()).await.unwrap();
    let image = cluster.open_image("fb", "img").await.unwrap();
    image.write(0, pattern(0, size)).await.unwrap();
    // Cut in the middle of an object: its tail must read zeros too.
    let small = 5 * MIB + 12 * 1024;
    let client = s.mons.client();
    let shrink = |size_bytes, allow_shrink| ResizeImageRequest {
        size_bytes,
        allow_shrink,
    };
    client
        .resize_image("fb", "img", &shrink(small, true))
        .await
        .unwrap();
    // Once this client's map shows the shrink, a description read before it opens nothing,
    // at once: the monitor's record says the image is smaller now (the map alone cannot tell
    // this from a map that is behind a grow).
    let id = image.info().id;
    wait_until(WAIT, "the client's map shows the shrink", || {
        let map = cluster.map();
        let shown = map
            .images
            .as_ref()
            .and_then(|t| t.images.get(&id))
            .map(|e| e.size_bytes);
        async move { (shown == Some(small)).then_some(()) }
    })
    .await;
    let started = std::time::Instant::now();
    match cluster.open_image_info(image.info().clone()).await {
        Err(ClientError::ImageResized {
            size_bytes,
            opened_bytes,
            ..
        }) => assert_eq!((size_bytes, opened_bytes), (small, size)),
        other => panic!(
            "open with a description older than the shrink: {:?}",
            other.map(drop)
        ),
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    // Growing waits until the cut range is deleted everywhere.
    let grown = wait_until(WAIT, "the image grows again", || {
        let client = &client;
        async move {
            match client.resize_image("fb", "img", &shrink(size, false)).await {
                Ok(info) => Some(info),
                Err(e) if e.code() == Some(ErrorCode::ReclaimPending) => None,
                Err(e) => panic!("growing: {e}"),
            }
        }
    })
    .await;
    assert_eq!(grown.size_bytes, size);
    assert!(client.reclaim().await.unwrap().is_empty());
    // Opened with the monitor's answer to the grow, at once: the open waits for a map
    // that shows the new size, so the new tail is not refused as out of range.
    let image = cluster.open_image_info(grown).await.unwrap();
    let got = image.read(0, size).await.unwrap();
    assert!(
        got[..small as usize] == pattern(0, small)[..],
        "the kept part is intact"
    );
    let nonzero = got[small as usize..].iter().position(|b| *b != 0);
    assert_eq!(
        nonzero.map(|i| small + i as u64),
        None,
        "the old tail reads zeros"
    );
}

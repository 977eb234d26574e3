//! Large writes and the WAL batch (found through NBD: one 4 MiB write to an object stopped
//! every replica of its PG, since its log entry overflowed the WAL batch and the store's
//! refusal failed the shard). Now a raw write too large for one batch is refused with
//! `InvalidArgument` and the OSDs keep serving; the client library sends writes in 1 MiB
//! pieces; and many large entries in one Raft ready are cut into batches by bytes, on the
//! leader and the followers (16 concurrent 4 MiB writes, 64 entries of 1 MiB, on 2 PGs).

mod common;

use bytes::Bytes;
use common::{pool_with_image, start_osds, MonCluster, MonOptions, TempDir, WireConn};
use fastblock_client::Cluster;
use fastblock_types::{ImageId, PgId};
use fastblock_wire::{ObjectAddr, Reply, Request, Status};
use std::time::Duration;

const MIB: u64 = 1 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_writes_fit_the_wal_or_are_refused() {
    let mons = MonCluster::start(1, MonOptions::default()).await;
    let dir = TempDir::new("large");
    // 256 MiB OSDs: 8 MiB WAL segments, so 2 MiB batches (the smallest mkfs makes).
    let mut osds = start_osds(&mons, dir.path(), 3, "256M", 1, Duration::from_secs(20)).await;
    let client = mons.client();
    let pool = pool_with_image(&client, ("fb", 2, 3), ("big", 64 * MIB, 4 * MIB)).await;

    // A raw 4 MiB write cannot fit a 2 MiB batch: refused, nobody fails.
    let map = client.map().await.unwrap().map.unwrap();
    let pg = PgId::new(pool.id, 0);
    let leader = map
        .pg(pg)
        .unwrap()
        .leader
        .expect("active PGs have a leader");
    let osd = &map.osds[&leader];
    let mut conn = WireConn::connect(&format!("{}:{}", osd.address, osd.port_for(pg))).await;
    let addr = ObjectAddr {
        pg,
        // The pool's one image ("big"), the first the monitor created.
        image: ImageId(1),
        object_index: 0,
    };
    let huge = Request::Write {
        addr,
        offset: 0,
        epoch: map.epoch,
        term: map.pg(pg).unwrap().leader_term.0,
        data: Bytes::from(vec![3u8; 4 * MIB as usize]),
    };
    match conn.call(&huge).await {
        Reply::Error {
            status: Status::InvalidArgument,
            message,
            ..
        } => assert!(message.contains("WAL batch"), "{message}"),
        other => panic!("a 4 MiB raw write answered {other:?}"),
    }
    let fits = Request::Write {
        addr,
        offset: 0,
        epoch: map.epoch,
        term: map.pg(pg).unwrap().leader_term.0,
        data: Bytes::from(vec![4u8; MIB as usize]),
    };
    assert_eq!(conn.call(&fits).await, Reply::Ok);

    // Through the client library: 16 concurrent whole-object writes, then read back.
    let cluster = Cluster::connect(mons.client_config()).await.unwrap();
    let image = cluster.open_image("fb", "big").await.unwrap();
    let block = |i: u64| Bytes::from(vec![i as u8 + 1; 4 * MIB as usize]);
    let writes: Vec<_> = (0..16u64)
        .map(|i| {
            let image = image.clone();
            tokio::spawn(async move { image.write(i * 4 * MIB, block(i)).await })
        })
        .collect();
    for w in writes {
        w.await.unwrap().unwrap();
    }
    for i in 0..16u64 {
        assert_eq!(image.read(i * 4 * MIB, 4 * MIB).await.unwrap(), block(i));
    }
    for osd in &mut osds {
        assert!(
            osd.is_running(),
            "osd {} stopped:\n{}",
            osd.id,
            osd.log_tail()
        );
    }
}

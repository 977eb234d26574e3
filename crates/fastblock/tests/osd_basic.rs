//! Real OSD processes on loopback, spoken to with the wire protocol directly: PGs become
//! active, a write acknowledged by the leader is readable there and identical on every
//! replica, and bad input gets clear errors while the OSD keeps serving.

mod common;

use bytes::Bytes;
use common::{wait_all_active, MonCluster, MonOptions, OsdProc, TempDir, WireConn};
use fastblock_types::api::{CreateImageRequest, CreatePoolRequest};
use fastblock_types::map::{ClusterMap, FailureDomain};
use fastblock_types::{Epoch, ImageId, PgId, PoolId};
use fastblock_wire::{ObjectAddr, Reply, Request, Status};
use std::time::Duration;

async fn cluster(n: usize, pg_count: u32, size: u32) -> (MonCluster, TempDir, Vec<OsdProc>) {
    let mons = MonCluster::start(1, MonOptions::default()).await;
    let dir = TempDir::new("osd");
    let osds = common::start_osds(&mons, dir.path(), n, "256M", 1, Duration::from_secs(20)).await;
    let client = mons.client();
    let req = CreatePoolRequest {
        name: "fb".into(),
        pg_count,
        size,
        failure_domain: FailureDomain::Osd,
    };
    client.create_pool(&req).await.unwrap();
    // Image 1, which the raw requests below address: OSDs refuse IO for images the map
    // does not have.
    let image = CreateImageRequest {
        pool: "fb".into(),
        name: "img".into(),
        size_bytes: 1 << 30,
        object_size_bytes: None,
    };
    assert_eq!(client.create_image(&image).await.unwrap().id, ImageId(1));
    wait_all_active(&client, Duration::from_secs(30)).await;
    (mons, dir, osds)
}

/// The term of the PG's leadership as the map records it: what a mutation names (the
/// leader refuses any other, `docs/wire-protocol.md` 3.1, "Term fencing").
fn leader_term(map: &ClusterMap, pg: PgId) -> u64 {
    map.pg(pg).unwrap().leader_term.0
}

fn leader_addr(map: &ClusterMap, pg: PgId) -> String {
    let leader = map
        .pg(pg)
        .unwrap()
        .leader
        .expect("active PGs have a leader");
    let osd = &map.osds[&leader];
    format!("{}:{}", osd.address, osd.port_for(pg))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicated_write_read_and_identical_replicas() {
    let (mons, _dir, _osds) = cluster(3, 8, 3).await;
    let map = mons.client().map().await.unwrap().map.unwrap();
    for seq in 0..8 {
        let pg = PgId::new(PoolId(1), seq);
        let mut conn = WireConn::connect(&leader_addr(&map, pg)).await;
        let addr = ObjectAddr {
            pg,
            image: ImageId(1),
            object_index: u64::from(seq),
        };
        let data = Bytes::from(
            (0..8192u32)
                .map(|i| (i * 7 + seq) as u8)
                .collect::<Vec<u8>>(),
        );
        let write = Request::Write {
            addr,
            offset: 4096,
            epoch: map.epoch,
            term: leader_term(&map, pg),
            data: data.clone(),
        };
        assert_eq!(conn.call(&write).await, Reply::Ok, "write to pg {pg}");
        let read = Request::Read {
            addr,
            offset: 0,
            length: 12288,
            epoch: map.epoch,
        };
        match conn.call(&read).await {
            Reply::Data(got) => {
                assert!(
                    got[..4096].iter().all(|b| *b == 0),
                    "unwritten range reads zeros"
                );
                assert_eq!(&got[4096..], &data[..]);
            }
            other => panic!("read: {other:?}"),
        }
        // A follower refuses client IO and points at the leader.
        let follower = map
            .pg(pg)
            .unwrap()
            .osdlist
            .iter()
            .find(|o| Some(**o) != map.pg(pg).unwrap().leader)
            .unwrap();
        let f = &map.osds[follower];
        let mut fconn = WireConn::connect(&format!("{}:{}", f.address, f.port_for(pg))).await;
        match fconn.call(&read).await {
            Reply::Error {
                status: Status::NotLeader,
                leader: Some(hint),
                ..
            } => {
                assert_eq!(Some(hint.osd), map.pg(pg).unwrap().leader)
            }
            other => panic!("follower read: {other:?}"),
        }
    }
    // Every replica of every PG converges to the same applied objects.
    for seq in 0..8 {
        let pg = PgId::new(PoolId(1), seq);
        let mut digests = Vec::new();
        for osd in &map.pg(pg).unwrap().osdlist {
            let o = &map.osds[osd];
            let mut conn = WireConn::connect(&format!("{}:{}", o.address, o.port_for(pg))).await;
            let mut digest = None;
            for _ in 0..100 {
                if let Reply::Digest { objects, .. } =
                    conn.call(&Request::ReplicaDigest { pg }).await
                {
                    if objects.len() == 1 {
                        digest = Some(objects);
                        break;
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let digest =
                digest.unwrap_or_else(|| panic!("pg {pg} replica on osd {osd} never caught up"));
            digests.push(digest);
        }
        assert!(
            digests.windows(2).all(|w| w[0] == w[1]),
            "pg {pg} replicas differ: {digests:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_clear_errors_and_the_osd_keeps_serving() {
    let (mons, _dir, mut osds) = cluster(1, 4, 1).await;
    let map = mons.client().map().await.unwrap().map.unwrap();
    let pg = PgId::new(PoolId(1), 0);
    let target = leader_addr(&map, pg);
    let addr = ObjectAddr {
        pg,
        image: ImageId(1),
        object_index: 0,
    };

    // A frame with a bad payload crc: the OSD closes that connection.
    let mut conn = WireConn::connect(&target).await;
    let mut frame = bytes::BytesMut::new();
    Request::Write {
        addr,
        offset: 0,
        epoch: Epoch(1),
        term: leader_term(&map, pg),
        data: Bytes::from(vec![1u8; 4096]),
    }
    .encode(1, &mut frame);
    let last = frame.len() - 1;
    frame[last] ^= 0xff;
    conn.send_raw(&frame).await;
    assert_eq!(
        conn.recv().await,
        None,
        "corrupt frame closes the connection"
    );

    // A well-framed frame of an unknown kind: a protocol error, the connection is closed.
    let mut conn = WireConn::connect(&target).await;
    let mut header = [0u8; 32];
    header[0..4].copy_from_slice(&0x4B42_4246u32.to_le_bytes());
    header[4] = 1; // version
    header[5] = 99; // no such kind
    header[20..24].copy_from_slice(&crc32c::crc32c(&[]).to_le_bytes());
    let crc = crc32c::crc32c(&header[..28]);
    header[28..32].copy_from_slice(&crc.to_le_bytes());
    conn.send_raw(&header).await;
    assert_eq!(conn.recv().await, None, "unknown op closes the connection");

    // Garbage instead of a header: closed too.
    let mut conn = WireConn::connect(&target).await;
    conn.send_raw(&[0xde; 64]).await;
    assert_eq!(conn.recv().await, None);

    // Semantic errors are answered and the connection stays usable.
    let mut conn = WireConn::connect(&target).await;
    let oob = Request::Read {
        addr,
        offset: (64 << 20) - 4096,
        length: 8192,
        epoch: Epoch(1),
    };
    assert!(matches!(
        conn.call(&oob).await,
        Reply::Error {
            status: Status::InvalidArgument,
            ..
        }
    ));
    let huge = Request::Read {
        addr,
        offset: 0,
        length: 32 << 20,
        epoch: Epoch(1),
    };
    assert!(matches!(
        conn.call(&huge).await,
        Reply::Error {
            status: Status::InvalidArgument,
            ..
        }
    ));
    let nopg = Request::Read {
        addr: ObjectAddr {
            pg: PgId::new(PoolId(7), 0),
            ..addr
        },
        offset: 0,
        length: 4096,
        epoch: Epoch(1),
    };
    assert!(matches!(
        conn.call(&nopg).await,
        Reply::Error {
            status: Status::NoSuchPg,
            ..
        }
    ));
    let write = Request::Write {
        addr,
        offset: 0,
        epoch: Epoch(1),
        term: leader_term(&map, pg),
        data: Bytes::from(vec![5u8; 4096]),
    };
    assert_eq!(conn.call(&write).await, Reply::Ok, "the OSD still serves");
    // An image the monitor never created is refused, and nothing is stored for it.
    let stray = Request::Write {
        addr: ObjectAddr {
            image: ImageId(9),
            ..addr
        },
        offset: 0,
        epoch: Epoch(1),
        term: leader_term(&map, pg),
        data: Bytes::from(vec![6u8; 4096]),
    };
    assert!(matches!(
        conn.call(&stray).await,
        Reply::Error {
            status: Status::NoSuchImage,
            ..
        }
    ));
    assert!(osds[0].is_running(), "no crash: {}", osds[0].log_tail());
}

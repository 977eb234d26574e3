//! Bad block copies on real processes (`docs/design/repair.md`): blocks corrupted in the
//! OSDs' data files, on the leader of their PG or on a follower, read back correctly through
//! the client, are rewritten from a good replica, and a partial write over a corrupted copy
//! completes without stopping any OSD; every OSD restarts cleanly afterwards.

mod common;

use bytes::Bytes;
use common::data_file::{find_block, flip_byte};
use common::{
    pool_with_image, stamped_block, start_osds, wait_replicas_identical, wait_until, MonCluster,
    MonOptions, OsdProc, TempDir, BLOCK,
};
use fastblock_client::Cluster;
use fastblock_types::OsdId;
use std::time::Duration;

const MIB: u64 = 1 << 20;
const WAIT: Duration = Duration::from_secs(30);
/// Objects written, one block each: half corrupted on their PG's leader, half on a follower.
const OBJECTS: u64 = 12;

fn osd(osds: &[OsdProc], id: OsdId) -> &OsdProc {
    osds.iter().find(|o| o.id == id).expect("a known OSD")
}

fn count_in_logs(osds: &[OsdProc], needle: &str) -> usize {
    osds.iter()
        .map(|o| o.all_logs().matches(needle).count())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_copies_on_leaders_and_followers_are_read_correctly_and_repaired() {
    let mons = MonCluster::start(1, MonOptions::default()).await;
    let dir = TempDir::new("repair");
    let mut osds = start_osds(&mons, dir.path(), 3, "256M", 1, WAIT).await;
    let client = mons.client();
    pool_with_image(&client, ("fb", 8, 3), ("img", OBJECTS * MIB, MIB)).await;
    let cluster = Cluster::connect(mons.client_config()).await.unwrap();
    let image = cluster.open_image("fb", "img").await.unwrap();
    let offset = |i: u64| i * MIB + 8 * BLOCK;
    for i in 0..OBJECTS {
        image
            .write(offset(i), stamped_block(offset(i), 1))
            .await
            .unwrap();
    }

    // Every OSD holds every block in its data region once it has applied and written it.
    let map = client.map().await.unwrap().map.unwrap();
    let mut victims = Vec::new();
    for i in 0..OBJECTS {
        let pg = image.object_pg(i);
        let info = &map.pgmaps[&pg.pool].pgs[&pg.seq];
        let leader = info.leader.expect("an active PG has a leader");
        let on_leader = i % 2 == 0;
        let victim = if on_leader {
            leader
        } else {
            *info.osdlist.iter().find(|o| **o != leader).unwrap()
        };
        let path = osd(&osds, victim).data.clone();
        let block = stamped_block(offset(i), 1);
        let at = wait_until(WAIT, "the block written to the data region", || {
            let (path, block) = (path.clone(), block.clone());
            async move { find_block(&path, &block) }
        })
        .await;
        flip_byte(&path, at + 100);
        victims.push((i, victim, on_leader));
    }

    // Reads of blocks bad on the leader are answered from a good copy once repaired.
    for i in 0..OBJECTS {
        let got = image.read(offset(i), BLOCK).await.unwrap();
        assert_eq!(
            got,
            stamped_block(offset(i), 1),
            "object {i} ({:?})",
            victims[i as usize]
        );
    }
    // Partial writes over the copies bad on a follower: the follower cannot merge, reports
    // its copy, and the leader repairs it with the merged block.
    let patch = Bytes::from(vec![0xA5u8; 512]);
    for i in (0..OBJECTS).filter(|i| i % 2 == 1) {
        image.write(offset(i) + 1024, patch.clone()).await.unwrap();
    }
    // Every copy converges (a replica digest reads every block: a bad one would not answer).
    wait_replicas_identical(&client, WAIT).await;
    let expected = |i: u64| {
        let mut b = stamped_block(offset(i), 1).to_vec();
        if i % 2 == 1 {
            b[1024..1536].copy_from_slice(&patch);
        }
        Bytes::from(b)
    };
    for i in 0..OBJECTS {
        assert_eq!(
            image.read(offset(i), BLOCK).await.unwrap(),
            expected(i),
            "object {i}"
        );
    }
    for o in osds.iter_mut() {
        assert!(o.is_running(), "osd {} stopped: {}", o.id, o.log_tail());
    }
    let repaired = count_in_logs(&osds, "bad block repaired");
    assert!(
        repaired >= OBJECTS as usize,
        "{repaired} repairs logged for {OBJECTS} corrupted copies"
    );

    // The repairs are durable, and no OSD replays itself into a failure.
    for o in osds.iter_mut() {
        assert!(o.stop(), "osd {} stops cleanly", o.id);
        o.start();
    }
    let ids: Vec<OsdId> = osds.iter().map(|o| o.id).collect();
    common::wait_osds_up(&client, &ids, WAIT).await;
    wait_replicas_identical(&client, WAIT).await;
    for i in 0..OBJECTS {
        assert_eq!(
            image.read(offset(i), BLOCK).await.unwrap(),
            expected(i),
            "object {i}"
        );
    }
    let found = count_in_logs(&osds, "bad block copy found");
    assert!(
        found >= OBJECTS as usize,
        "every corrupted copy was found: {found}"
    );
}

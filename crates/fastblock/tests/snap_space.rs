//! Image snapshots with everything around them, on real processes (monitor, etcd, 4 OSDs):
//! what an image and its snapshots hold (`Image::usage`) and what a pool holds (`pool ls`,
//! `status`, from the PG leaders' heartbeats) through writes, a snapshot, overwrites, a
//! discard, a shrink and a regrow, OSD out/in remaps while snapshots are taken and removed,
//! and removals; and the snapshot reading as taken through all of it, from every OSD as a
//! PG leader in turn.

mod common;

use common::{pool_with_image, start_osds, wait_all_active, wait_until, MonCluster, MonOptions};
use fastblock_client::usage::ImageUsage;
use fastblock_client::Cluster;
use fastblock_monclient::MonClient;
use fastblock_types::api::{ClusterUsage, PoolUsage, ResizeImageRequest};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

const MIB: u64 = 1 << 20;
const SIZE: u64 = 8 * MIB;
const WAIT: Duration = Duration::from_secs(60);

/// `len` bytes at `offset` of stamped blocks of `generation`.
fn stamped(offset: u64, len: u64, generation: u64) -> Vec<u8> {
    (offset / 4096..(offset + len) / 4096)
        .flat_map(|b| common::stamped_block(b * 4096, generation))
        .collect()
}

/// The whole image as `runs` of (offset, len, generation) over zeros.
fn image_of(runs: &[(u64, u64, u64)]) -> Vec<u8> {
    let mut v = vec![0u8; SIZE as usize];
    for (offset, len, generation) in runs {
        v[*offset as usize..(offset + len) as usize].copy_from_slice(&stamped(
            *offset,
            *len,
            *generation,
        ));
    }
    v
}

async fn pool_usage(mon: &MonClient) -> PoolUsage {
    let list = mon.pool_list().await.expect("pool list");
    let i = list
        .pools
        .iter()
        .position(|p| p.name == "p")
        .expect("pool p");
    list.usage[i].clone()
}

/// Waits until every PG of pool `p` has reported and the pool holds `stored` bytes.
async fn wait_pool_stored(mon: &MonClient, stored: u64, why: &str) {
    wait_until(WAIT, why, || async {
        let u = pool_usage(mon).await;
        (u.pgs_unreported == 0 && u.stored_bytes == stored).then_some(())
    })
    .await;
    let u = pool_usage(mon).await;
    assert_eq!(u.used_bytes, 3 * stored, "a 3-replica pool uses 3 copies");
}

/// Waits until the image's usage, as the PG leaders count it, is `want`.
async fn wait_usage(image: &fastblock_client::image::Image, want: ImageUsage, why: &str) {
    let got = wait_until(WAIT, why, || async {
        let u = image.usage().await.ok()?;
        (u == want).then_some(u)
    })
    .await;
    assert_eq!(got.total_bytes(), want.head_bytes + want.snaps_bytes);
}

fn usage(objects: u64, head_mib: u64, by_snap_mib: &[(u64, u64)]) -> ImageUsage {
    let by_snap: BTreeMap<u64, u64> = by_snap_mib.iter().map(|(s, m)| (*s, m * MIB)).collect();
    ImageUsage {
        objects,
        head_bytes: head_mib * MIB,
        snaps_bytes: by_snap.values().sum(),
        by_snap,
    }
}

async fn wait_reclaimed(mon: &MonClient) {
    wait_until(WAIT, "the shrunk tail deleted by every PG", || async {
        mon.reclaim().await.ok()?.is_empty().then_some(())
    })
    .await;
}

async fn wait_trimmed(mon: &MonClient) {
    wait_until(WAIT, "snapshot trims confirmed by every PG", || async {
        mon.snap_trims().await.ok()?.is_empty().then_some(())
    })
    .await;
}

async fn resize(mon: &MonClient, size_bytes: u64, allow_shrink: bool) {
    mon.resize_image(
        "p",
        "img",
        &ResizeImageRequest {
            size_bytes,
            allow_shrink,
        },
    )
    .await
    .expect("resize");
}

/// Reads the whole snapshot `snap` and the head through a fresh client handle, and checks
/// both.
async fn check_reads(cluster: &Arc<Cluster>, snaps: &[(&str, &[u8])], head: &[u8], when: &str) {
    for (snap, want) in snaps {
        let view = cluster
            .open_snapshot("p", "img", snap)
            .await
            .expect("open the snapshot");
        let got = view.read(0, SIZE).await.expect("read the snapshot");
        assert!(got == want[..], "snapshot {snap} {when}");
    }
    let image = cluster.open_image("p", "img").await.expect("open");
    let got = image.read(0, image.size_bytes()).await.expect("read");
    assert!(got == head[..image.size_bytes() as usize], "head {when}");
}

/// Space accounting and snapshot contents through overwrites, a discard, a shrink and a
/// regrow, remaps with snapshots taken and removed meanwhile, failovers and removals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_keep_their_data_and_space_is_counted_through_resizes_remaps_and_removals() {
    let mons = MonCluster::start(1, MonOptions::default()).await;
    let dir = common::TempDir::new("snap_space");
    let mut osds = start_osds(&mons, dir.path(), 4, "512M", 1, Duration::from_secs(20)).await;
    let mon = mons.client();
    pool_with_image(&mon, ("p", 8, 3), ("img", SIZE, MIB)).await;
    let cluster = Cluster::connect(mons.client_config()).await.unwrap();
    let image = cluster.open_image("p", "img").await.unwrap();
    wait_pool_stored(&mon, 0, "an empty pool reported").await;

    // 4 MiB written: 4 objects, 4 MiB of one copy, 12 MiB raw.
    image.write(0, stamped(0, 4 * MIB, 1).into()).await.unwrap();
    wait_usage(&image, usage(4, 4, &[]), "4 MiB written").await;
    wait_pool_stored(&mon, 4 * MIB, "4 MiB in the pool").await;
    // Every replica's OSD counts the 3 copies in its space once it applied them.
    let status = wait_until(WAIT, "3 copies in the OSDs' space", || async {
        let s = mon.status().await.ok()?;
        let u = &s.usage;
        (u.raw_free_bytes + 12 * MIB <= u.raw_total_bytes).then_some(s)
    })
    .await;
    let ClusterUsage {
        stored_bytes,
        used_bytes,
        raw_total_bytes,
        ..
    } = status.usage;
    assert_eq!((stored_bytes, used_bytes), (4 * MIB, 12 * MIB));
    assert!(raw_total_bytes >= 4 * 300 * MIB, "{raw_total_bytes}");
    // The CLI shows the same: `status`, `pool ls` and `image info`.
    let text = mons.cli(&["status"]);
    assert!(
        text.ok().contains("usage  : 4 MiB stored, 12 MiB used"),
        "{}",
        text.stdout
    );
    let pools = mons.cli(&["--json", "pool", "ls"]).json();
    assert_eq!(pools[0]["name"], "p");
    assert_eq!(pools[0]["usage"]["stored_bytes"], 4 * MIB);
    assert_eq!(pools[0]["usage"]["used_bytes"], 12 * MIB);
    assert_eq!(pools[0]["usage"]["objects"], 4);
    let text = mons.cli(&["pool", "ls"]);
    let row: Vec<&str> = text
        .ok()
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(row[5..], ["4", "4", "MiB", "12", "MiB"], "{}", text.stdout);

    // A snapshot costs nothing; overwriting 2 MiB keeps 2 MiB for it.
    let s1 = mon.create_snap("p", "img", "s1").await.unwrap();
    wait_usage(&image, usage(4, 4, &[]), "a snapshot costs nothing").await;
    image.write(0, stamped(0, 2 * MIB, 2).into()).await.unwrap();
    wait_usage(
        &image,
        usage(4, 4, &[(s1.id.0, 2)]),
        "first writes after it",
    )
    .await;
    // Rewriting the same blocks costs nothing more.
    image.write(0, stamped(0, 2 * MIB, 3).into()).await.unwrap();
    image.write(0, stamped(0, 2 * MIB, 2).into()).await.unwrap();
    wait_usage(&image, usage(4, 4, &[(s1.id.0, 2)]), "rewrites").await;
    wait_pool_stored(&mon, 6 * MIB, "head and snapshot in the pool").await;
    let info = mons.cli(&["--json", "image", "info", "p/img"]).json();
    let used = &info["usage"];
    assert_eq!(used["head_bytes"], 4 * MIB, "{info}");
    assert_eq!(used["snapshots_bytes"], 2 * MIB, "{info}");
    assert_eq!(used["raw_bytes"], 18 * MIB, "{info}");
    assert_eq!(used["snapshots"][0]["name"], "s1", "{info}");
    assert_eq!(used["snapshots"][0]["bytes"], 2 * MIB, "{info}");
    let text = mons.cli(&["image", "info", "p/img"]);
    assert!(
        text.ok()
            .contains("used: 6 MiB (head 4 MiB, snapshots 2 MiB), 4 objects, 18 MiB raw"),
        "{}",
        text.stdout
    );
    assert!(
        text.stdout.contains("snapshot s1 (id 1): 2 MiB"),
        "{}",
        text.stdout
    );

    // A discard after the snapshot frees nothing of the snapshot's.
    image.discard(2 * MIB, MIB).await.unwrap();
    wait_usage(&image, usage(4, 3, &[(s1.id.0, 3)]), "a discard").await;
    let first = image_of(&[(0, 4 * MIB, 1)]);
    let mut head = image_of(&[(0, 2 * MIB, 2), (3 * MIB, MIB, 1)]);
    check_reads(&cluster, &[("s1", &first)], &head, "after a discard").await;

    // A shrink to 1 MiB deletes objects 1..3 from the head; the snapshot keeps its size and
    // its data (object 1 was born after it: freed; objects 2 (discarded) and 3: kept).
    resize(&mon, MIB, true).await;
    wait_reclaimed(&mon).await;
    wait_usage(&image, usage(1, 1, &[(s1.id.0, 4)]), "a shrink").await;
    let snaps = mon.snaps("p", "img").await.unwrap();
    assert_eq!(
        snaps[0].size_bytes, SIZE,
        "a shrink keeps the snapshot's size"
    );
    head[MIB as usize..].fill(0);
    check_reads(&cluster, &[("s1", &first)], &head, "after a shrink").await;
    // Grown back, the tail reads zeros; the snapshot is unchanged.
    resize(&mon, SIZE, false).await;
    check_reads(&cluster, &[("s1", &first)], &head, "after a regrow").await;

    // Remaps while snapshots are taken and removed: an OSD goes out (its PGs get a new
    // member, caught up by snapshot transfer), s2 is taken and s1 removed meanwhile, then
    // it comes back in (the PGs move back).
    let image = cluster.open_image("p", "img").await.unwrap();
    image
        .write(MIB, stamped(MIB, 2 * MIB, 4).into())
        .await
        .unwrap();
    let at_s2 = image_of(&[(0, MIB, 2), (MIB, 2 * MIB, 4)]);
    mon.osd_out(osds[0].id).await.unwrap();
    let s2 = mon.create_snap("p", "img", "s2").await.unwrap();
    image.write(0, stamped(0, 2 * MIB, 5).into()).await.unwrap();
    let head = image_of(&[(0, 2 * MIB, 5), (2 * MIB, MIB, 4)]);
    mon.remove_snap("p", "img", "s1").await.unwrap();
    wait_trimmed(&mon).await;
    wait_all_active(&mon, WAIT).await;
    check_reads(&cluster, &[("s2", &at_s2)], &head, "with an OSD out").await;
    mon.osd_in(osds[0].id).await.unwrap();
    wait_all_active(&mon, WAIT).await;
    wait_usage(&image, usage(3, 3, &[(s2.id.0, 2)]), "after out and in").await;
    check_reads(&cluster, &[("s2", &at_s2)], &head, "after out and in").await;

    // Every OSD leads in turn: killing one moves the leadership of its PGs to the others,
    // whose copies (some made by snapshot transfer) must serve the same snapshot.
    for (i, osd) in osds.iter_mut().enumerate() {
        osd.kill();
        let fresh = Cluster::connect(mons.client_config()).await.unwrap();
        check_reads(
            &fresh,
            &[("s2", &at_s2)],
            &head,
            &format!("without osd {i}"),
        )
        .await;
        osd.start();
        common::wait_osds_up(&mon, &[osd.id], WAIT).await;
        wait_all_active(&mon, WAIT).await;
    }

    // Removing the snapshot, then the image, gives everything back.
    mon.remove_snap("p", "img", "s2").await.unwrap();
    wait_trimmed(&mon).await;
    wait_usage(&image, usage(3, 3, &[]), "the last snapshot removed").await;
    wait_pool_stored(&mon, 3 * MIB, "snapshots removed").await;
    mon.remove_image("p", "img").await.unwrap();
    wait_reclaimed(&mon).await;
    wait_pool_stored(&mon, 0, "the image removed").await;
    let free: u64 = common::free_bytes(&osds).await.iter().sum();
    let total = status.usage.raw_total_bytes;
    assert_eq!(free, total, "every block of every OSD is free again");
}

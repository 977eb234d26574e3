//! Snapshots of clones end to end, on real processes (monitor, etcd, 3 OSDs): a VM cloned
//! from a golden image takes snapshots while some of its objects are still its parent's,
//! is shrunk and grown, cloned again from its own snapshot; every version reads as taken,
//! before and after a deep flatten, after the golden image is gone, and after a rollback.

mod common;

use common::{pool_with_image, start_osds, wait_until, MonCluster, MonOptions};
use fastblock_client::Cluster;
use fastblock_monclient::MonClient;
use fastblock_types::api::ResizeImageRequest;
use std::sync::Arc;
use std::time::Duration;

const MIB: u64 = 1 << 20;
const SIZE: u64 = 8 * MIB;
const WAIT: Duration = Duration::from_secs(60);

/// The whole image as `runs` of (offset, len, generation) over zeros.
fn image_of(runs: &[(u64, u64, u64)]) -> Vec<u8> {
    let mut v = vec![0u8; SIZE as usize];
    for (offset, len, generation) in runs {
        for b in offset / 4096..(offset + len) / 4096 {
            let at = (b * 4096) as usize;
            v[at..at + 4096].copy_from_slice(&common::stamped_block(b * 4096, *generation));
        }
    }
    v
}

fn stamped(offset: u64, len: u64, generation: u64) -> bytes::Bytes {
    let whole = image_of(&[(offset, len, generation)]);
    bytes::Bytes::copy_from_slice(&whole[offset as usize..(offset + len) as usize])
}

async fn read_snap(cluster: &Arc<Cluster>, name: &str, snap: &str) -> Vec<u8> {
    let view = cluster.open_snapshot("p", name, snap).await.expect("open");
    view.read(0, view.size_bytes())
        .await
        .expect("read")
        .to_vec()
}

async fn read_head(cluster: &Arc<Cluster>, name: &str) -> Vec<u8> {
    let image = cluster.open_image("p", name).await.expect("open");
    image
        .read(0, image.size_bytes())
        .await
        .expect("read")
        .to_vec()
}

/// Reads every version through a fresh client and checks it.
async fn check(mons: &MonCluster, versions: &[(&str, Option<&str>, &[u8])], when: &str) {
    let cluster = Cluster::connect(mons.client_config()).await.unwrap();
    for (name, snap, want) in versions {
        let got = match snap {
            Some(s) => read_snap(&cluster, name, s).await,
            None => read_head(&cluster, name).await,
        };
        assert!(
            got == want[..],
            "{name}@{} {when}: first difference at byte {:?}",
            snap.unwrap_or("head"),
            got.iter().zip(want.iter()).position(|(a, b)| a != b)
        );
    }
}

async fn resize(mon: &MonClient, name: &str, size_bytes: u64) {
    mon.resize_image(
        "p",
        name,
        &ResizeImageRequest {
            size_bytes,
            allow_shrink: true,
        },
    )
    .await
    .expect("resize");
    wait_until(WAIT, "the shrunk tail deleted by every PG", || async {
        mon.reclaim().await.ok()?.is_empty().then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_version_of_a_clone_reads_as_taken_through_copy_ups_shrinks_flatten_and_rollback() {
    let mons = MonCluster::start(1, MonOptions::default()).await;
    let dir = common::TempDir::new("clone_snapshots");
    let _osds = start_osds(&mons, dir.path(), 3, "512M", 1, Duration::from_secs(20)).await;
    let mon = mons.client();
    pool_with_image(&mon, ("p", 8, 3), ("golden", SIZE, MIB)).await;
    let cluster = Cluster::connect(mons.client_config()).await.unwrap();
    let golden = cluster.open_image("p", "golden").await.unwrap();
    golden.write(0, stamped(0, 6 * MIB, 1)).await.unwrap();
    mon.create_snap("p", "golden", "base").await.unwrap();
    mon.protect_snap("p", "golden", "base").await.unwrap();
    mon.clone_snap("p", "golden", "base", "p", "vm")
        .await
        .unwrap();
    let vm = cluster.open_image("p", "vm").await.unwrap();

    // k1: only object 1 is the clone's own (copied up by a write into it).
    vm.write(MIB, stamped(MIB, 8192, 2)).await.unwrap();
    let k1 = mon.create_snap("p", "vm", "k1").await.unwrap();
    assert_eq!(k1.parent_overlap_bytes, Some(SIZE));
    let at_k1 = image_of(&[(0, 6 * MIB, 1), (MIB, 8192, 2)]);
    // Object 0 is copied up after k1: k1 still reads the parent's bytes, now from the clone.
    vm.write(0, stamped(0, 2 * MIB, 3)).await.unwrap();
    // A shrink cuts the head's overlap to 3 MiB; grown back, the tail reads zeros.
    resize(&mon, "vm", 3 * MIB).await;
    resize(&mon, "vm", SIZE).await;
    let k2 = mon.create_snap("p", "vm", "k2").await.unwrap();
    assert_eq!(k2.parent_overlap_bytes, Some(3 * MIB));
    let at_k2 = image_of(&[(0, 2 * MIB, 3), (2 * MIB, MIB, 1)]);
    // Object 4 is beyond the head's overlap: its copy-up keeps the parent's bytes for k1
    // alone, the head takes only the write.
    let vm = cluster.open_image("p", "vm").await.unwrap();
    vm.write(4 * MIB, stamped(4 * MIB, MIB, 4)).await.unwrap();
    let head = image_of(&[(0, 2 * MIB, 3), (2 * MIB, MIB, 1), (4 * MIB, MIB, 4)]);
    // A clone of the clone's snapshot reads through two parents.
    mon.protect_snap("p", "vm", "k1").await.unwrap();
    mon.clone_snap("p", "vm", "k1", "p", "vm2").await.unwrap();
    let versions: [(&str, Option<&str>, &[u8]); 4] = [
        ("vm", Some("k1"), &at_k1),
        ("vm", Some("k2"), &at_k2),
        ("vm", None, &head),
        ("vm2", None, &at_k1),
    ];
    check(&mons, &versions, "before the flatten").await;

    // A rollback of a clone to a snapshot taken before a shrink: the snapshot reads more of
    // the parent than the head does, so the objects are copied up (kept for it) first.
    mon.clone_snap("p", "golden", "base", "p", "vm3")
        .await
        .unwrap();
    let vm3 = cluster.open_image("p", "vm3").await.unwrap();
    vm3.write(7 * MIB, stamped(7 * MIB, 4096, 6)).await.unwrap();
    let s3 = mon.create_snap("p", "vm3", "s").await.unwrap();
    let at_s3 = image_of(&[(0, 6 * MIB, 1), (7 * MIB, 4096, 6)]);
    // A handle opened before another client shrinks and regrows the clone reads the tail
    // as zeros too (the overlap was cut for good), not the parent's bytes.
    let stale = Cluster::connect(mons.client_config())
        .await
        .unwrap()
        .open_image("p", "vm3")
        .await
        .unwrap();
    resize(&mon, "vm3", MIB).await;
    resize(&mon, "vm3", SIZE).await;
    let vm3_head = image_of(&[(0, MIB, 1)]);
    wait_until(WAIT, "the stale handle's map to show the cut", || async {
        let got = stale.read(0, SIZE).await.ok()?;
        (got == vm3_head[..]).then_some(())
    })
    .await;
    check(
        &mons,
        &[("vm3", None, &vm3_head), ("vm3", Some("s"), &at_s3)],
        "shrunk",
    )
    .await;
    let vm3 = cluster.open_image("p", "vm3").await.unwrap();
    vm3.rollback_objects(s3.id.0, s3.size_bytes, 4, &|_, _| {})
        .await
        .unwrap();
    check(
        &mons,
        &[("vm3", None, &at_s3), ("vm3", Some("s"), &at_s3)],
        "rolled back",
    )
    .await;
    vm3.flatten(4, &|_, _| {}).await.unwrap();
    mon.flatten_done("p", "vm3").await.unwrap();

    // A deep flatten: the clone and its snapshots stand alone; the golden image can go.
    let vm = cluster.open_image("p", "vm").await.unwrap();
    vm.flatten(4, &|_, _| {}).await.unwrap();
    mon.flatten_done("p", "vm").await.unwrap();
    check(&mons, &versions, "after the flatten").await;
    mon.unprotect_snap("p", "golden", "base").await.unwrap();
    mon.remove_snap("p", "golden", "base").await.unwrap();
    mon.remove_image("p", "golden").await.unwrap();
    wait_until(WAIT, "the golden image deleted", || async {
        let gone = mon.reclaim().await.ok()?.is_empty() && mon.snap_trims().await.ok()?.is_empty();
        gone.then_some(())
    })
    .await;
    check(&mons, &versions, "with the golden image gone").await;
    check(
        &mons,
        &[("vm3", None, &at_s3), ("vm3", Some("s"), &at_s3)],
        "with the golden image gone",
    )
    .await;

    // Rollback to k1 (taken before the shrink: it reads more than the head did).
    let vm = cluster.open_image("p", "vm").await.unwrap();
    vm.rollback_objects(k1.id.0, k1.size_bytes, 4, &|_, _| {})
        .await
        .unwrap();
    let after: [(&str, Option<&str>, &[u8]); 4] = [
        ("vm", Some("k1"), &at_k1),
        ("vm", Some("k2"), &at_k2),
        ("vm", None, &at_k1),
        ("vm2", None, &at_k1),
    ];
    check(&mons, &after, "after a rollback to k1").await;
    // vm2's own write goes to vm2 only.
    let vm2 = cluster.open_image("p", "vm2").await.unwrap();
    vm2.write(5 * MIB, stamped(5 * MIB, 4096, 5)).await.unwrap();
    let mut vm2_now = at_k1.clone();
    vm2_now[5 * MIB as usize..5 * MIB as usize + 4096].copy_from_slice(&stamped(5 * MIB, 4096, 5));
    check(
        &mons,
        &[("vm2", None, &vm2_now), ("vm", Some("k1"), &at_k1)],
        "after a write to the second clone",
    )
    .await;
}

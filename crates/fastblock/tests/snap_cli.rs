//! The snapshot and clone commands of `fastblock-client` (`docs/cli.md`, "Snapshots and
//! clones"), run as the real binary against a real cluster: a monitor on etcd and three
//! `fastblock-osd` processes holding a 3-replica pool.
//!
//! Data is written and read back through the client library, so every command is checked
//! by what it did to the bytes (the snapshot keeps the first pattern, the clone reads it
//! through and then stands alone, a rollback brings the first pattern and the snapshot's
//! size back) as well as by its exit status and output.

mod common;

use common::{
    stamped_block, start_osds, wait_all_active, CliOutput, MonCluster, MonOptions, OsdProc,
    TempDir, BLOCK,
};
use fastblock_client::{Cluster, Image};
use fastblock_types::api::CreatePoolRequest;
use fastblock_types::map::FailureDomain;
use std::sync::Arc;
use std::time::Duration;

const MIB: u64 = 1 << 20;
/// The image under test: four objects of 1 MiB.
const SIZE: u64 = 4 * MIB;

/// A monitor, three OSDs and pool `fb3` (8 PGs of 3 replicas), every PG active.
struct Setup {
    mons: MonCluster,
    _dir: TempDir,
    _osds: Vec<OsdProc>,
}

impl Setup {
    async fn start() -> Setup {
        let mons = MonCluster::start(1, MonOptions::default()).await;
        let dir = TempDir::new("snapcli");
        let osds = start_osds(&mons, dir.path(), 3, "512M", 1, Duration::from_secs(20)).await;
        let client = mons.client();
        client
            .create_pool(&CreatePoolRequest {
                name: "fb3".into(),
                pg_count: 8,
                size: 3,
                failure_domain: FailureDomain::Osd,
            })
            .await
            .unwrap();
        wait_all_active(&client, Duration::from_secs(30)).await;
        Setup {
            mons,
            _dir: dir,
            _osds: osds,
        }
    }

    /// Runs `fastblock-client ARGS` (on a blocking thread: the test's client keeps running).
    async fn cli(&self, args: &[&str]) -> CliOutput {
        tokio::task::block_in_place(|| self.mons.cli(args))
    }

    /// A new client connection (a fresh cache: what another host would see).
    async fn connect(&self) -> Arc<Cluster> {
        Cluster::connect(self.mons.client_config()).await.unwrap()
    }
}

/// `len` bytes of stamped blocks of `generation` from `offset`: every block differs from
/// every other block and from the same block of another generation.
fn pattern(offset: u64, len: u64, generation: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(len as usize);
    let mut at = offset;
    while at < offset + len {
        v.extend_from_slice(&stamped_block(at, generation));
        at += BLOCK;
    }
    v
}

/// Reads the whole of `image` and checks it equals `want` (reporting the first difference,
/// not megabytes of bytes).
async fn assert_reads(image: &Image, want: &[u8], what: &str) {
    assert_eq!(image.size_bytes(), want.len() as u64, "{what}: size");
    let got = image.read(0, want.len() as u64).await.unwrap();
    if got[..] != want[..] {
        let first = got.iter().zip(want).position(|(a, b)| a != b).unwrap();
        panic!(
            "{what}: differs from byte {first} (block {})",
            first as u64 / BLOCK
        );
    }
}

/// The exit status is the usage error's (2) and stderr says what a snapshot name must be.
#[track_caller]
fn usage_error(out: &CliOutput) {
    assert_eq!(out.code, 2, "stdout={} stderr={}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains("POOL/IMAGE@SNAP"),
        "stderr: {}",
        out.stderr
    );
    assert!(out.stdout.is_empty(), "stdout: {}", out.stdout);
}

/// The whole life of a snapshot and a clone through the CLI: create, list, read, protect,
/// clone, the refusals while the clone depends on the snapshot, flatten, unprotect,
/// rollbacks at the same size, across a grow and across a shrink, removal of the snapshot
/// and then of the image.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_and_clones_through_the_cli() {
    let s = Setup::start().await;
    s.cli(&[
        "image",
        "create",
        "fb3/vm",
        "--size",
        "4M",
        "--object-size",
        "1M",
    ])
    .await
    .ok();
    let cluster = s.connect().await;
    let first = pattern(0, SIZE, 1);
    let second = pattern(0, SIZE, 2);
    let vm = cluster.open_image("fb3", "vm").await.unwrap();
    vm.write(0, first.clone().into()).await.unwrap();

    // Take the snapshot, then overwrite the whole head.
    let created = s
        .cli(&["--json", "image", "snap", "create", "fb3/vm@s1"])
        .await
        .json();
    assert_eq!(created["name"], "s1");
    assert_eq!(created["state"], "created");
    assert_eq!(created["size_bytes"], SIZE);
    assert_eq!(created["protected"], false);
    let snap_id = created["id"].as_u64().expect("an id");
    vm.write(0, second.clone().into()).await.unwrap();
    s.cli(&["image", "snap", "create", "fb3/vm@s1"])
        .await
        .fails_with("already exists");

    // Listed, complete, in both forms.
    let ls = s
        .cli(&["--json", "image", "snap", "ls", "fb3/vm"])
        .await
        .json();
    let list = ls.as_array().expect("a list");
    assert_eq!(list.len(), 1, "{ls}");
    assert_eq!(list[0]["id"], snap_id);
    assert_eq!(list[0]["name"], "s1");
    assert_eq!(list[0]["state"], "created");
    assert_eq!(list[0]["size_bytes"], SIZE);
    assert_eq!(list[0]["protected"], false);
    assert!(list[0]["started_at_ms"].as_u64().unwrap() > 0, "{ls}");
    let text = s.cli(&["image", "snap", "ls", "fb3/vm"]).await;
    let lines: Vec<&str> = text.ok().lines().collect();
    assert_eq!(lines.len(), 2, "{}", text.stdout);
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(
        header,
        ["ID", "NAME", "SIZE", "STATE", "PROTECTED", "CREATED"]
    );
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    let id = snap_id.to_string();
    assert_eq!(row[..6], [id.as_str(), "s1", "4", "MiB", "created", "no"]);
    assert!(lines[1].ends_with("UTC"), "{}", lines[1]);

    // The snapshot holds the first pattern, the head the second.
    let view = cluster.open_snapshot("fb3", "vm", "s1").await.unwrap();
    assert_reads(&view, &first, "the snapshot").await;
    assert_reads(&vm, &second, "the head after the overwrite").await;

    let info = s.cli(&["--json", "image", "info", "fb3/vm"]).await.json();
    assert_eq!(info["snapshot_count"], 1);
    assert_eq!(info["size_bytes"], SIZE);
    assert!(info["parent"].is_null(), "{info}");
    let text = s.cli(&["image", "info", "fb3/vm"]).await;
    assert!(text.ok().contains("snapshots: 1\n"), "{}", text.stdout);
    assert!(!text.stdout.contains("parent:"), "{}", text.stdout);

    // Protect, then clone into a new image that reads the parent's data.
    let out = s.cli(&["image", "snap", "protect", "fb3/vm@s1"]).await;
    assert!(out.ok().contains("fb3/vm@s1 protected"), "{}", out.stdout);
    let ls = s
        .cli(&["--json", "image", "snap", "ls", "fb3/vm"])
        .await
        .json();
    assert_eq!(ls[0]["protected"], true);
    s.cli(&["image", "snap", "rm", "fb3/vm@s1"])
        .await
        .fails_with("is protected");
    let kid = s
        .cli(&["--json", "image", "clone", "fb3/vm@s1", "fb3/kid"])
        .await
        .json();
    assert_eq!(kid["name"], "kid");
    assert_eq!(kid["size_bytes"], SIZE);
    assert_eq!(kid["parent"]["image_name"], "vm");
    assert_eq!(kid["parent"]["snap_name"], "s1");
    assert_eq!(kid["parent"]["overlap_bytes"], SIZE);
    let text = s.cli(&["image", "info", "fb3/kid"]).await;
    assert!(
        text.ok().contains("parent: fb3/vm@s1 (overlap 4 MiB"),
        "{}",
        text.stdout
    );
    let info = s.cli(&["--json", "image", "info", "fb3/kid"]).await.json();
    assert_eq!(info["parent"]["pool_name"], "fb3");
    assert_eq!(info["snapshot_count"], 0);
    let kid_image = cluster.open_image("fb3", "kid").await.unwrap();
    assert!(kid_image.is_clone());
    assert_reads(&kid_image, &first, "the clone, reading through").await;
    // The clone takes its own write; neither the snapshot nor the parent's head sees it.
    let own_at = MIB + BLOCK;
    let own = stamped_block(own_at, 3);
    kid_image.write(own_at, own.clone()).await.unwrap();
    let mut kid_want = first.clone();
    kid_want[own_at as usize..(own_at + BLOCK) as usize].copy_from_slice(&own);
    assert_reads(&kid_image, &kid_want, "the clone after its own write").await;
    assert_reads(&view, &first, "the snapshot after the clone's write").await;
    assert_reads(&vm, &second, "the head after the clone's write").await;

    let children = s
        .cli(&["--json", "image", "children", "fb3/vm@s1"])
        .await
        .json();
    let children = children.as_array().expect("a list");
    assert_eq!(children.len(), 1);
    assert_eq!(children[0]["pool_name"], "fb3");
    assert_eq!(children[0]["name"], "kid");
    let text = s.cli(&["image", "children", "fb3/vm@s1"]).await;
    assert!(text.ok().contains("fb3/kid"), "{}", text.stdout);

    // While the clone reads through, the snapshot and its image stay: each refusal is one
    // line that names the clone.
    for args in [
        ["image", "snap", "rm", "fb3/vm@s1"].as_slice(),
        ["image", "snap", "unprotect", "fb3/vm@s1"].as_slice(),
        ["image", "rm", "fb3/vm"].as_slice(),
        ["--json", "image", "snap", "rm", "fb3/vm@s1"].as_slice(),
    ] {
        let out = s.cli(args).await;
        assert_eq!(out.code, 4, "refused: {args:?}: {}", out.stderr);
        out.fails_with("fb3/kid");
        assert_eq!(
            out.stderr.matches("fb3/kid").count(),
            1,
            "{args:?}: the clone named once: {}",
            out.stderr
        );
    }
    s.cli(&["image", "rm", "fb3/vm"]).await.fails_with("s1");
    // A snapshot of the clone, while most of it still reads through to its parent.
    let out = s.cli(&["image", "snap", "create", "fb3/kid@k1"]).await;
    assert!(out.ok().contains("fb3/kid@k1 created"), "{}", out.stdout);
    let kid_k1 = cluster.open_snapshot("fb3", "kid", "k1").await.unwrap();
    assert_reads(&kid_k1, &kid_want, "the clone's snapshot").await;
    s.cli(&["image", "flatten", "fb3/vm"])
        .await
        .fails_with("not a clone");

    // Flatten: the clone stands alone, the snapshot has no children.
    let out = s.cli(&["image", "flatten", "fb3/kid"]).await;
    assert!(
        out.ok().contains("no longer depends on fb3/vm@s1"),
        "{}",
        out.stdout
    );
    let info = s.cli(&["--json", "image", "info", "fb3/kid"]).await.json();
    assert!(info["parent"].is_null(), "{info}");
    let children = s
        .cli(&["--json", "image", "children", "fb3/vm@s1"])
        .await
        .json();
    assert_eq!(children.as_array().map(Vec::len), Some(0), "{children}");
    let alone = s.connect().await.open_image("fb3", "kid").await.unwrap();
    assert!(!alone.is_clone());
    assert_reads(&alone, &kid_want, "the flattened clone").await;
    let kid_k1 = s
        .connect()
        .await
        .open_snapshot("fb3", "kid", "k1")
        .await
        .unwrap();
    assert_reads(&kid_k1, &kid_want, "the flattened clone's snapshot").await;

    let out = s.cli(&["image", "snap", "unprotect", "fb3/vm@s1"]).await;
    assert!(out.ok().contains("fb3/vm@s1 unprotected"), "{}", out.stdout);
    let ls = s
        .cli(&["--json", "image", "snap", "ls", "fb3/vm"])
        .await
        .json();
    assert_eq!(ls[0]["protected"], false);

    // Rollback at the snapshot's size: the head holds the first pattern again.
    let rolled = s
        .cli(&["--json", "image", "snap", "rollback", "fb3/vm@s1"])
        .await
        .json();
    assert_eq!(rolled["snap"]["name"], "s1");
    assert_eq!(rolled["image"]["size_bytes"], SIZE);
    assert_eq!(rolled["size_before_bytes"], SIZE);
    assert_eq!(rolled["objects"], 4);
    let vm = s.connect().await.open_image("fb3", "vm").await.unwrap();
    assert_reads(&vm, &first, "the head rolled back").await;

    // Grown after the snapshot and overwritten: the rollback brings the size back too.
    s.cli(&["image", "resize", "fb3/vm", "--size", "6M"])
        .await
        .ok();
    let vm = s.connect().await.open_image("fb3", "vm").await.unwrap();
    vm.write(0, pattern(0, 6 * MIB, 4).into()).await.unwrap();
    let out = s.cli(&["image", "snap", "rollback", "fb3/vm@s1"]).await;
    assert!(
        out.ok().contains("rolled back to snapshot s1"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("shrunk from 6 MiB"), "{}", out.stdout);
    let info = s.cli(&["--json", "image", "info", "fb3/vm"]).await.json();
    assert_eq!(info["size_bytes"], SIZE);
    let vm = s.connect().await.open_image("fb3", "vm").await.unwrap();
    assert_reads(&vm, &first, "the head rolled back from a grow").await;

    // Shrunk after the snapshot: the rollback grows it back and restores the cut tail.
    vm.write(0, pattern(0, SIZE, 5).into()).await.unwrap();
    s.cli(&[
        "image",
        "resize",
        "fb3/vm",
        "--size",
        "2M",
        "--allow-shrink",
    ])
    .await
    .ok();
    let out = s.cli(&["image", "snap", "rollback", "fb3/vm@s1"]).await;
    assert!(out.ok().contains("grown from 2 MiB"), "{}", out.stdout);
    let info = s.cli(&["--json", "image", "info", "fb3/vm"]).await.json();
    assert_eq!(info["size_bytes"], SIZE);
    let vm = s.connect().await.open_image("fb3", "vm").await.unwrap();
    assert_reads(&vm, &first, "the head rolled back from a shrink").await;

    s.cli(&["image", "snap", "rollback", "fb3/vm@nosuch"])
        .await
        .fails_with("fb3/vm@nosuch does not exist");

    // Names the CLI refuses before asking anyone.
    for bad in ["fb3/vm", "fb3/vm@", "fb3/@s1", "fb3/vm@a@b", "fb3/x/vm@s1"] {
        usage_error(&s.cli(&["image", "snap", "rollback", bad]).await);
        usage_error(&s.cli(&["image", "snap", "rm", bad]).await);
    }

    // The image goes only after its snapshot; the flattened clone outlives both.
    s.cli(&["image", "rm", "fb3/vm"]).await.fails_with("s1");
    let out = s.cli(&["image", "snap", "rm", "fb3/vm@s1"]).await;
    assert!(out.ok().contains("fb3/vm@s1 removed"), "{}", out.stdout);
    let ls = s
        .cli(&["--json", "image", "snap", "ls", "fb3/vm"])
        .await
        .json();
    assert_eq!(ls.as_array().map(Vec::len), Some(0), "{ls}");
    s.cli(&["image", "rm", "fb3/vm"]).await.ok();
    s.cli(&["image", "info", "fb3/vm"])
        .await
        .fails_with("does not exist");
    let alone = s.connect().await.open_image("fb3", "kid").await.unwrap();
    assert_reads(&alone, &kid_want, "the clone after its parent went").await;
}

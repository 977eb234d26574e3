//! Capacity and health on real processes (`docs/operations.md`, "Capacity and health"): `df`
//! counts every replica and falls back once an image is removed; OSDs filled past the
//! nearfull and full ratios raise `OSD_NEARFULL` then `OSD_FULL`, writes to their PGs are
//! refused with `NoSpace` at once (not retried) while reads and discards go on, and writes
//! resume once removing an image gives the space back. The ratios are set low (relative to
//! what the fresh OSDs already use) so that a few tens of MiB fill them.

mod common;

use bytes::Bytes;
use common::{pool_with_image, start_osds, wait_until, MonCluster, MonOptions, TempDir};
use fastblock_client::{ClientError, Cluster, Image};
use fastblock_types::api::{CreateImageRequest, DfResponse, HealthResponse, Severity};
use fastblock_wire::Status;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const WAIT: Duration = Duration::from_secs(30);

/// A distinct, never-zero MiB for chunk `n`.
fn chunk(n: u64) -> Bytes {
    (0..MIB)
        .map(|i| 1 + ((i / 4096 + i + n * 7) % 251) as u8)
        .collect::<Vec<u8>>()
        .into()
}

fn df(mons: &MonCluster) -> DfResponse {
    let out = tokio::task::block_in_place(|| mons.cli(&["df", "--json"]));
    serde_json::from_str(out.ok()).unwrap_or_else(|e| panic!("df --json: {e}: {}", out.stdout))
}

fn health(mons: &MonCluster) -> HealthResponse {
    let out = tokio::task::block_in_place(|| mons.cli(&["health", "--json"]));
    serde_json::from_str(out.ok()).unwrap_or_else(|e| panic!("health --json: {e}: {}", out.stdout))
}

fn has_check(h: &HealthResponse, code: &str) -> bool {
    h.checks.iter().any(|c| c.code == code)
}

async fn open(mons: &MonCluster, pool: &str, name: &str) -> Image {
    let cluster = Cluster::connect(mons.client_config()).await.unwrap();
    cluster.open_image(pool, name).await.unwrap()
}

/// Goal: `df` shows raw space used by every replica and each pool's stored bytes, objects and
/// an honest maximum available, and both fall back once the image is removed. Method: three
/// OSDs and a three-replica pool; 32 MiB written, then the image removed (its reclaim frees
/// the blocks on every OSD).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn df_counts_every_replica_and_falls_after_the_image_is_removed() {
    let mons = MonCluster::start(1, MonOptions::default()).await;
    let dir = TempDir::new("capacity-df");
    let _osds = start_osds(&mons, dir.path(), 3, "256M", 1, WAIT).await;
    let client = mons.client();
    let data_bytes = 32 * MIB;
    pool_with_image(&client, ("rep", 8, 3), ("img", data_bytes, MIB)).await;
    let before = wait_until(WAIT, "every OSD reports its space", || async {
        let d = df(&mons);
        (d.raw.total_bytes > 0 && d.raw.osds_unreported == 0).then_some(d)
    })
    .await;
    let image = open(&mons, "rep", "img").await;
    for n in 0..data_bytes / MIB {
        image.write(n * MIB, chunk(n)).await.unwrap();
    }

    // The PG leaders' reports and the OSDs' space reports come with their heartbeats.
    let after = wait_until(WAIT, "df shows the data on every replica", || async {
        let d = df(&mons);
        let p = &d.pools[0];
        let raw_grew = d.raw.used_bytes - before.raw.used_bytes;
        (p.stored_bytes >= data_bytes && p.pgs_unreported == 0 && raw_grew >= 3 * data_bytes)
            .then_some(d)
    })
    .await;
    let p = &after.pools[0];
    assert_eq!((p.name.as_str(), p.size), ("rep", 3));
    assert_eq!(p.used_bytes, 3 * p.stored_bytes, "{p:?}");
    assert_eq!(p.objects, data_bytes / MIB, "{p:?}");
    // Each OSD holds a whole copy: the pool can take at most a third of what is free, less
    // the data reserve of the OSD's one shard (its writes are refused past that).
    assert!(p.max_avail_bytes > 0, "{p:?}");
    let reserve = fastblock_shard::ShardConfig::DATA_RESERVE_BYTES;
    assert!(
        p.max_avail_bytes <= after.raw.avail_bytes / 3 - reserve,
        "{after:?}"
    );
    assert!(
        p.max_avail_bytes < before.pools[0].max_avail_bytes,
        "{before:?} {after:?}"
    );
    let text = tokio::task::block_in_place(|| mons.cli(&["df"]));
    eprintln!("df:\n{}", text.stdout);
    let row = text
        .ok()
        .lines()
        .find(|l| l.starts_with("rep "))
        .unwrap_or_else(|| panic!("no pool row: {}", text.stdout));
    assert!(row.contains("32 MiB") && row.contains("96 MiB"), "{row}");
    assert!(text.stdout.contains("RAW STORAGE:"), "{}", text.stdout);

    client.remove_image("rep", "img").await.unwrap();
    let gone = wait_until(WAIT, "df falls back after the removal", || async {
        let d = df(&mons);
        (d.pools[0].stored_bytes == 0 && d.raw.used_bytes < after.raw.used_bytes - 2 * data_bytes)
            .then_some(d)
    })
    .await;
    assert_eq!(gone.pools[0].objects, 0, "{gone:?}");
    assert!(
        gone.pools[0].max_avail_bytes > p.max_avail_bytes,
        "{gone:?}"
    );
}

/// Writes MiB chunks from `from` until one is refused or `count` are written; the refusal.
async fn fill(image: &Image, from: u64, count: u64) -> (u64, Option<ClientError>) {
    for n in from..from + count {
        if let Err(e) = image.write(n * MIB, chunk(n)).await {
            return (n, Some(e));
        }
    }
    (from + count, None)
}

/// Goal: OSDs past the nearfull ratio warn, past the full ratio they are an error and writes
/// to their PGs are refused with `NoSpace` at once, reads and discards go on, and writes take
/// again once an image's removal frees space. Method: three 256 MiB OSDs, a three-replica
/// pool holding a small image `keep` and a large `fill`; ratios set just above what the
/// fresh OSDs use; `fill` written until refused, then removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_osds_refuse_writes_until_space_is_freed() {
    let mons = MonCluster::start(1, MonOptions::default()).await;
    let dir = TempDir::new("capacity-full");
    let _osds = start_osds(&mons, dir.path(), 3, "256M", 1, WAIT).await;
    let client = mons.client();
    pool_with_image(&client, ("rep", 8, 3), ("keep", 4 * MIB, MIB)).await;
    client
        .create_image(&CreateImageRequest {
            pool: "rep".into(),
            name: "fill".into(),
            size_bytes: 256 * MIB,
            object_size_bytes: Some(MIB),
        })
        .await
        .unwrap();
    let keep = open(&mons, "rep", "keep").await;
    keep.write(0, chunk(1000)).await.unwrap();

    // Bad ratios are refused with the rule they break.
    tokio::task::block_in_place(|| {
        mons.cli(&["osd", "set-full-ratio", "1.5"])
            .fails_with("at most 1");
        mons.cli(&["osd", "set-nearfull-ratio", "0.97"])
            .fails_with("must be below the full ratio");
        let usage = mons.cli(&["osd", "set-full-ratio", "x"]);
        assert_eq!(usage.code, 2, "a usage error: {}", usage.stderr);
        assert!(
            usage.stderr.contains("invalid ratio \"x\""),
            "{}",
            usage.stderr
        );
    });

    // Ratios a few tens of MiB above what each OSD uses now (each holds every PG).
    let base = wait_until(WAIT, "every OSD reports its space", || async {
        let d = df(&mons);
        (d.raw.total_bytes > 0 && d.raw.osds_unreported == 0).then_some(d)
    })
    .await;
    let osd_total = base.raw.total_bytes / 3;
    let used = base.raw.used_bytes as f64 / base.raw.total_bytes as f64;
    let step = (16 * MIB) as f64 / osd_total as f64;
    let (nearfull, full) = (used + step, used + 2.0 * step);
    tokio::task::block_in_place(|| {
        mons.cli(&["osd", "set-nearfull-ratio", &format!("{nearfull:.4}")])
            .ok();
        let set = mons.cli(&["osd", "set-full-ratio", &format!("{full:.4}")]);
        assert!(set.ok().contains("full ratio"), "{}", set.stdout);
    });
    assert!(!has_check(&health(&mons), "OSD_NEARFULL"));

    // Past nearfull (between the ratios): a warning, writes still taken.
    let filler = open(&mons, "rep", "fill").await;
    let (written, refused) = fill(&filler, 0, 24).await;
    assert!(
        refused.is_none(),
        "refused below the full ratio: {refused:?}"
    );
    // Each OSD reports its space in its own heartbeat: wait for all three to be marked.
    let h = wait_until(WAIT, "OSD_NEARFULL naming the three OSDs", || async {
        let h = health(&mons);
        let nearfull = h.checks.iter().find(|c| c.code == "OSD_NEARFULL")?;
        (nearfull.detail.len() == 3).then_some(h)
    })
    .await;
    assert_eq!(h.status, "HEALTH_WARN", "{h:?}");
    assert!(!has_check(&h, "OSD_FULL"), "{h:?}");
    let text = tokio::task::block_in_place(|| mons.cli(&["health", "--detail"]));
    eprintln!("health --detail:\n{}", text.stdout);
    assert!(
        text.ok().contains("OSD_NEARFULL: 3 nearfull osds") && text.stdout.contains("    osd."),
        "{}",
        text.stdout
    );

    // Past full: refused with NoSpace (the monitor marks the OSDs within a heartbeat, so a
    // few more MiB may land first; on a slow machine the OSDs' own reserve may even refuse
    // first, which the write to `keep` below tells apart).
    let (at, refused) = fill(&filler, written, 150).await;
    let refused = refused.unwrap_or_else(|| panic!("no refusal after {at} MiB"));
    assert!(
        matches!(
            refused,
            ClientError::Io {
                status: Status::NoSpace,
                ..
            }
        ),
        "expected NoSpace, got {refused}"
    );
    // Each OSD holds every PG: all three are marked, each with its own heartbeat.
    let h = wait_until(WAIT, "OSD_FULL naming the three OSDs", || async {
        let h = health(&mons);
        let full = h.checks.iter().find(|c| c.code == "OSD_FULL")?;
        (full.detail.len() == 3).then_some(h)
    })
    .await;
    assert_eq!(h.status, "HEALTH_ERR", "{h:?}");
    let full_check = h.checks.iter().find(|c| c.code == "OSD_FULL").unwrap();
    assert_eq!(full_check.severity, Severity::Err);
    assert!(
        full_check.detail[0].contains("% full (full ratio"),
        "{full_check:?}"
    );
    let t = Instant::now();
    match keep.write(MIB, chunk(1001)).await {
        Err(ClientError::Io {
            status: Status::NoSpace,
            message,
            ..
        }) => assert!(message.contains("past the full ratio"), "{message}"),
        other => panic!("expected NoSpace for the full ratio, got {other:?}"),
    }
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "refused after {:?}",
        t.elapsed()
    );
    // Reads and discards go on.
    assert_eq!(keep.read(0, MIB).await.unwrap(), chunk(1000));
    assert_eq!(filler.read(0, MIB).await.unwrap(), chunk(0));
    filler.discard(0, MIB).await.unwrap();
    assert_eq!(
        filler.read(0, MIB).await.unwrap(),
        Bytes::from(vec![0u8; MIB as usize]),
        "a discard on a full OSD is applied"
    );
    let status = tokio::task::block_in_place(|| mons.cli(&["status"]));
    eprintln!("status:\n{}", status.stdout);
    assert!(
        status.ok().contains("OSD_FULL: 3 full osds"),
        "{}",
        status.stdout
    );

    // The filler goes: its reclaim frees the OSDs and writes are taken again.
    client.remove_image("rep", "fill").await.unwrap();
    wait_until(WAIT, "OSD_FULL and OSD_NEARFULL cleared", || async {
        let h = health(&mons);
        (!has_check(&h, "OSD_FULL") && !has_check(&h, "OSD_NEARFULL")).then_some(())
    })
    .await;
    wait_until(WAIT, "a write to keep is taken again", || async {
        keep.write(MIB, chunk(1001)).await.ok()
    })
    .await;
    assert_eq!(keep.read(MIB, MIB).await.unwrap(), chunk(1001));
}

//! block_bench's phases against the client's in-memory fake OSD, and the binary's handling of
//! bad input.

use fastblock_bench::config::IoType;
use fastblock_bench::run::run_phases;
use fastblock_bench::worker::Worker;
use fastblock_bench::workload::RunOptions;
use fastblock_client::testing::{image_info, FakeOsd, MapBuilder};
use fastblock_client::wire::{Reply, Request};
use fastblock_client::{ClientConfig, Cluster, Image};
use indicatif::ProgressBar;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const KIB: u64 = 1024;

fn options(io_type: IoType, io_count: u64) -> RunOptions {
    RunOptions {
        io_type,
        // Set to the image's size by `run`.
        io_range_bytes: 0,
        io_size: 4 * KIB,
        io_count,
        io_depth: 4,
        sequential: true,
        seed: 1,
        verify: true,
        deferred: Duration::ZERO,
        runtime: None,
        infinity: false,
        print_stats_interval: None,
        json: false,
    }
}

async fn image(osd: &FakeOsd, size: u64) -> Image {
    let map = MapBuilder::new(4).osd(1, osd.port()).members(&[1]).build();
    let cluster = Cluster::with_map(map, ClientConfig::default()).unwrap();
    cluster
        .open_image_info(image_info(11, "bench", size, 64 * KIB))
        .await
        .unwrap()
}

/// Runs `options` on `workers` workers of `image`, over the whole image.
async fn run_on(
    image: &Image,
    options: &RunOptions,
    workers: usize,
) -> fastblock_bench::run::Outcome {
    let stop = Arc::new(AtomicBool::new(false));
    let options = RunOptions {
        io_range_bytes: image.size_bytes(),
        ..options.clone()
    };
    let workers: Vec<Worker> = (0..workers).map(|_| Worker::local(image.clone())).collect();
    run_phases(&workers, &options, &stop, &ProgressBar::hidden()).await
}

async fn run(image: &Image, options: &RunOptions) -> fastblock_bench::run::Outcome {
    run_on(image, options, 1).await
}

/// Goal: a write_read run over a healthy (fake) cluster verifies every block and reports both
/// phases. Random offsets at depth 4 make repeated offsets likely, which the per-offset
/// sequence bookkeeping must handle.
#[tokio::test]
async fn write_read_verifies_clean_data() {
    let osd = FakeOsd::start(1).await;
    let image = image(&osd, 256 * KIB).await;
    let mut opts = options(IoType::WriteRead, 300);
    opts.sequential = false;
    opts.io_size = 8 * KIB;
    let outcome = run(&image, &opts).await;
    assert_eq!(outcome.error, None);
    assert_eq!(
        outcome.verify.failures, 0,
        "{:?}",
        outcome.verify.first_failures
    );
    assert_eq!(outcome.verify.blocks_checked, 600);
    assert_eq!(outcome.exit_code(), 0);
    let names: Vec<&str> = outcome.phases.iter().map(|p| p.name).collect();
    assert_eq!(names, ["write", "read"]);
    for phase in &outcome.phases {
        assert_eq!(phase.summary.total_io_count, 300);
        assert_eq!(phase.summary.measured_io_count, 300);
    }
    let text = outcome.text();
    assert!(
        text.contains("[write latency]") && text.contains("[read  latency]"),
        "{text}"
    );
    let json = outcome.json(image.info());
    assert_eq!(json["phases"][1]["total_io_count"], 300);
    assert_eq!(json["exit_code"], 0);
}

/// Goal: several workers share one phase: each issues its share of io_count with io_depth in
/// flight, the phase's figures are the sum of theirs, and verification holds across workers
/// (random offsets make workers overwrite each other's blocks).
#[tokio::test]
async fn workers_share_a_phase_and_their_figures_add_up() {
    let osd = FakeOsd::start(1).await;
    let image = image(&osd, 256 * KIB).await;
    let mut opts = options(IoType::WriteRead, 301);
    opts.sequential = false;
    let outcome = run_on(&image, &opts, 3).await;
    assert_eq!(outcome.error, None);
    assert_eq!(
        outcome.verify.failures, 0,
        "{:?}",
        outcome.verify.first_failures
    );
    assert_eq!(outcome.verify.blocks_checked, 301);
    for phase in &outcome.phases {
        let per_worker: Vec<u64> = phase
            .workers
            .iter()
            .map(|w| w.summary.total_io_count)
            .collect();
        assert_eq!(per_worker, [101, 100, 100], "{}", phase.name);
        assert_eq!(phase.summary.total_io_count, 301);
        let measured: u64 = phase
            .workers
            .iter()
            .map(|w| w.summary.measured_io_count)
            .sum();
        assert_eq!(phase.summary.measured_io_count, measured);
    }
    let text = outcome.text();
    assert_eq!(text.matches("worker 2 (unpinned)").count(), 2, "{text}");
    let json = outcome.json(image.info());
    assert_eq!(json["phases"][0]["workers"][0]["total_io_count"], 101);
    // One client per worker in the binary; here all three share one: its counters, thrice.
    assert_eq!(
        outcome.client.object_requests,
        3 * 602,
        "{:?}",
        outcome.client
    );
}

/// Goal: lost overwrites are reported as stale blocks, with offset, expected and found stamp,
/// and exit code 5. Method: the fake acknowledges writes after the first pass over the image
/// without storing them, so reads find the first pass's sequence numbers.
#[tokio::test]
async fn lost_overwrites_are_detected_as_stale() {
    let osd = FakeOsd::start(1).await;
    let writes = Arc::new(AtomicU64::new(0));
    let counter = writes.clone();
    osd.set_handler(move |request| match request {
        Request::Write { .. } if counter.fetch_add(1, Ordering::SeqCst) >= 64 => Some(Reply::Ok),
        _ => None,
    });
    let image = image(&osd, 256 * KIB).await;
    // Depth 1: writes arrive in index order, so exactly the second pass is dropped.
    let mut opts = options(IoType::WriteRead, 128);
    opts.io_depth = 1;
    let outcome = run(&image, &opts).await;
    assert_eq!(outcome.error, None);
    assert_eq!(outcome.verify.failures, 128);
    assert_eq!(outcome.exit_code(), 5);
    let first = &outcome.verify.first_failures[0];
    assert!(first.found.contains("stale"), "{first:?}");
    assert!(
        first.expected.contains(&format!("offset {}", first.offset)),
        "{first:?}"
    );
    assert!(outcome.text().contains("verify mismatch at offset"));
}

/// Goal: a read-only run on fresh space counts never-written blocks without failing, and
/// flags data written for another offset as misplaced.
#[tokio::test]
async fn read_only_runs_check_self_consistency() {
    let osd = FakeOsd::start(1).await;
    let image = image(&osd, 64 * KIB).await;
    let outcome = run(&image, &options(IoType::Read, 16)).await;
    assert_eq!(outcome.verify.unwritten_blocks, 16);
    assert_eq!(outcome.exit_code(), 0);

    // Data stamped for offset 0 written at offset 4096.
    let wrong = fastblock_bench::stamp::stamped_io(11, 0, 4096, 1);
    image.write(4096, wrong).await.unwrap();
    let outcome = run(&image, &options(IoType::Read, 2)).await;
    assert_eq!(outcome.verify.failures, 1);
    assert!(outcome.verify.first_failures[0].found.contains("misplaced"));
}

/// Goal: an IO error stops the run with a non-zero exit code and names the failed IO.
#[tokio::test]
async fn io_errors_stop_the_run() {
    let osd = FakeOsd::start(1).await;
    osd.set_handler(|request| {
        matches!(request, Request::Write { .. })
            .then(|| Reply::error(fastblock_client::wire::Status::NoSpace, None, "disk full"))
    });
    let image = image(&osd, 64 * KIB).await;
    let outcome = run(&image, &options(IoType::Write, 100)).await;
    let error = outcome.error.clone().unwrap();
    assert!(
        error.contains("NoSpace") && error.contains("write of 4096 bytes"),
        "{error}"
    );
    assert_eq!(outcome.exit_code(), 1);
    assert!(osd.io_count() < 100, "the run stopped early");
}

/// Every IO inside the warm-up: the run fails saying so, instead of reporting zeros.
#[tokio::test]
async fn a_run_that_ends_within_its_warm_up_fails_saying_so() {
    let osd = FakeOsd::start(1).await;
    let image = image(&osd, 64 * KIB).await;
    let outcome = run(
        &image,
        &RunOptions {
            deferred: Duration::from_secs(60),
            verify: false,
            ..options(IoType::Write, 16)
        },
    )
    .await;
    let error = outcome.error.clone().expect("nothing measured is an error");
    assert!(
        error.contains("all 16 write IOs completed within the 60s warm-up"),
        "{error}"
    );
    assert_eq!(outcome.exit_code(), 1);
    assert!(
        outcome.phases.is_empty(),
        "no figures: {:?}",
        outcome.text()
    );
}

fn bench(args: &[&str]) -> (i32, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_block_bench"))
        .args(args)
        .output()
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn bad_config_files_fail_clearly() {
    let dir = std::env::temp_dir().join(format!("block_bench_test_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.json");
    std::fs::write(&bad, "{\"io_size\": 4096,").unwrap();
    let (code, stderr) = bench(&["-C", bad.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(stderr.contains("invalid JSON config"), "{stderr}");
    assert!(stderr.contains("bad.json"), "{stderr}");

    let (code, stderr) = bench(&["-C", dir.join("missing.json").to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(stderr.contains("reading config file"), "{stderr}");

    let (code, stderr) = bench(&["--pool", "fb", "--io-size", "1000"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("multiple of 4096"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}

//! `block_bench`, the real binary, against 3 OSDs and a 3-replica pool: stamped writes then
//! verified reads, random and sequential; and a verify failure is an exit status, not a pass.

mod common;

use common::{start_osds, wait_all_active, MonCluster, MonOptions, OsdProc, TempDir};
use fastblock_types::api::CreatePoolRequest;
use fastblock_types::map::FailureDomain;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// block_bench is built with the workspace (another package), next to our binaries.
fn block_bench() -> PathBuf {
    let path = common::bin("fastblock-mon").with_file_name("block_bench");
    assert!(
        path.exists(),
        "{} not built: run the tests with --workspace",
        path.display()
    );
    path
}

async fn cluster() -> (MonCluster, TempDir, Vec<OsdProc>) {
    let mons = MonCluster::start(1, MonOptions::default()).await;
    let dir = TempDir::new("bb");
    let osds = start_osds(&mons, dir.path(), 3, "512M", 1, Duration::from_secs(20)).await;
    let client = mons.client();
    let req = CreatePoolRequest {
        name: "fb".into(),
        pg_count: 8,
        size: 3,
        failure_domain: FailureDomain::Osd,
    };
    client.create_pool(&req).await.unwrap();
    wait_all_active(&client, Duration::from_secs(30)).await;
    (mons, dir, osds)
}

fn run_bench(mons: &MonCluster, args: &[&str]) -> (i32, String) {
    let out = Command::new(block_bench())
        .env("FASTBLOCK_KEYRING", mons.keyring())
        .args([
            "--mon",
            &mons.endpoints()[0],
            "--pool",
            "fb",
            "--io-size",
            "4096",
            "--deferred-time",
            "0",
        ])
        .args(args)
        .output()
        .expect("running block_bench");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_then_verified_read_random_and_sequential() {
    let (mons, _dir, _osds) = cluster().await;
    for (image, extra) in [("rand", vec![]), ("seq", vec!["--sequential"])] {
        let mut args = vec![
            "--io-type",
            "write_read",
            "--io-count",
            "2000",
            "--io-depth",
            "8",
            "--image",
            image,
            "--image-size",
            "32M",
            "--verify",
        ];
        args.extend(extra);
        let (code, text) = run_bench(&mons, &args);
        assert_eq!(code, 0, "block_bench {image} failed:\n{text}");
        assert!(
            text.contains("[write latency]") && text.contains("[read  latency]"),
            "{text}"
        );
        assert!(text.contains("0 mismatches"), "{text}");
    }
    // Blocks holding data block_bench did not write fail verification (exit status 5).
    let (code, text) = run_bench(
        &mons,
        &[
            "--io-type",
            "write",
            "--io-count",
            "1",
            "--image",
            "foreign",
            "--image-size",
            "8M",
        ],
    );
    assert_eq!(code, 0, "{text}");
    let cluster = fastblock_client::Cluster::connect(mons.client_config())
        .await
        .unwrap();
    let image = cluster.open_image("fb", "foreign").await.unwrap();
    image
        .write(0, bytes::Bytes::from(vec![0xab; 64 << 10]))
        .await
        .unwrap();
    let (code, text) = run_bench(
        &mons,
        &[
            "--io-type",
            "read",
            "--sequential",
            "--io-count",
            "16",
            "--image",
            "foreign",
            "--image-size",
            "8M",
            "--verify",
        ],
    );
    assert_eq!(code, 5, "foreign data must fail verification:\n{text}");
    assert!(text.contains("verify mismatch at offset 0"), "{text}");
}

/// `total_io_count: N` of each final block, and of each worker line under it, in order.
fn io_counts(report: &str) -> Vec<(u64, Vec<u64>)> {
    let count = |line: &str| -> u64 {
        let (_, n) = line
            .rsplit_once("total_io_count: ")
            .unwrap_or_else(|| panic!("no total_io_count in {line:?}"));
        n.trim().parse().expect("a count")
    };
    let mut phases: Vec<(u64, Vec<u64>)> = Vec::new();
    for line in report.lines() {
        if line.starts_with("mean: ") {
            phases.push((count(line), Vec::new()));
        } else if line.starts_with("worker ") {
            phases
                .last_mut()
                .expect("a block first")
                .1
                .push(count(line));
        }
    }
    phases
}

/// Goal: the reference's own report runs as written (`reference-fastblock.md` section 10): its
/// flow creates a 1 GiB image with `fastblock-client -op=createimage`, then runs
/// `block_bench -C cfg.json -m '[0,1]'` with `"image_size": "134217728"` on that image.
/// Method: exactly those commands on real processes. The run must accept the larger image,
/// keep its IO within the configured 128 MiB (the image's allocated ranges end there), run one
/// worker per core with io_depth each, and print totals that are the sums of the workers'.
/// A core this machine lacks gets one warning and an unpinned worker; an image smaller than
/// the configured size is a clear error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_flow_runs_as_written() {
    let (mons, dir, _osds) = cluster().await;
    let endpoint = mons.endpoints()[0].clone();
    let created = mons.cli(&[
        "-op=createimage",
        "-poolname=fb",
        "-imagename=refimg",
        "-imagesize=1073741824",
        &format!("-endpoint={endpoint}"),
    ]);
    assert!(
        created.ok().contains("Image is created"),
        "{}",
        created.stdout
    );
    let config = |image_size: &str| {
        let path = dir.path().join(format!("cfg-{image_size}.json"));
        let json = serde_json::json!({
            "io_type": "write_read", "io_size": 4096, "io_count": 1001, "io_depth": 4,
            "image_name": "refimg", "image_size": image_size, "object_size": 4194304,
            "pool_name": "fb", "mon_host": [endpoint], "deferred_time": 0,
            "verify_read_data": true, "io_print_stats_enable": false,
            "rdma_device_name": "mlx5_0", "msg_client_rpc_timeout_us": 600000000,
        });
        std::fs::write(&path, json.to_string()).unwrap();
        path
    };
    let cfg = config("134217728");
    let bench = |args: &[&str]| {
        let out = Command::new(block_bench())
            .env("FASTBLOCK_KEYRING", mons.keyring())
            .args(args)
            .output()
            .expect("running block_bench");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };

    let (code, stdout, stderr) = bench(&["-C", cfg.to_str().unwrap(), "-m", "[0,1]"]);
    assert_eq!(code, 0, "block_bench failed:\n{stdout}{stderr}");
    assert!(
        !stderr.contains("warning"),
        "both cores exist here: {stderr}"
    );
    assert!(stdout.contains("0 mismatches"), "{stdout}");
    let phases = io_counts(&stdout);
    assert_eq!(phases.len(), 2, "write and read:\n{stdout}");
    for (total, workers) in &phases {
        assert_eq!(*total, 1001, "{stdout}");
        assert_eq!(
            workers,
            &[501, 500],
            "io_count shared between the cores:\n{stdout}"
        );
        assert_eq!(workers.iter().sum::<u64>(), *total);
    }
    assert!(stdout.contains("worker 0 (core 0, pinned)"), "{stdout}");
    assert!(stdout.contains("worker 1 (core 1, pinned)"), "{stdout}");

    // The JSON report: each pinned worker's IOs completed on its core only.
    let (code, stdout, stderr) = bench(&[
        "-C",
        cfg.to_str().unwrap(),
        "-m",
        "0,1",
        "--json",
        "--io-type",
        "write",
    ]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("JSON report");
    assert_eq!(report["image"]["size_bytes"], 1u64 << 30);
    assert_eq!(report["image"]["io_range_bytes"], 128u64 << 20);
    let phase = &report["phases"][0];
    let workers = phase["workers"].as_array().unwrap();
    let mut sum = 0;
    for (core, worker) in workers.iter().enumerate() {
        assert_eq!(worker["core"], core, "{worker}");
        assert_eq!(worker["pinned"], true, "{worker}");
        assert_eq!(worker["cores_seen"], serde_json::json!([core]), "{worker}");
        sum += worker["total_io_count"].as_u64().unwrap();
    }
    assert_eq!(phase["total_io_count"].as_u64(), Some(sum));
    let measured: u64 = workers
        .iter()
        .map(|w| w["measured_io_count"].as_u64().unwrap())
        .sum();
    assert_eq!(phase["measured_io_count"].as_u64(), Some(measured));

    // IO stayed within the configured 128 MiB of the 1 GiB image.
    let cluster = fastblock_client::Cluster::connect(mons.client_config())
        .await
        .unwrap();
    let image = cluster.open_image("fb", "refimg").await.unwrap();
    let ranges = image.allocated_ranges(0, 1 << 30).await.unwrap();
    assert!(!ranges.is_empty(), "the bench wrote something");
    let end = ranges.iter().map(|(o, l)| o + l).max().unwrap();
    assert!(end <= 128 << 20, "data beyond image_size: {ranges:?}");

    // A core this process cannot run on: one warning, and its worker runs unpinned.
    let (code, stdout, stderr) = bench(&[
        "-C",
        cfg.to_str().unwrap(),
        "-m",
        "[0,1000]",
        "--io-type",
        "write",
    ]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert_eq!(stderr.matches("warning").count(), 1, "{stderr}");
    assert!(
        stderr.contains("cores 1000 of -m are not available"),
        "{stderr}"
    );
    assert!(
        stdout.contains("worker 1 (core 1000, unpinned)"),
        "{stdout}"
    );
    let phases = io_counts(&stdout);
    assert_eq!(phases[0].1.iter().sum::<u64>(), phases[0].0);

    // An existing image smaller than the configured size.
    let big = config("2147483648");
    let (code, stdout, stderr) = bench(&["-C", big.to_str().unwrap(), "-m", "[0]"]);
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(
        stderr.contains("exists with 1073741824 bytes, less than the image_size of 2147483648"),
        "{stderr}"
    );
    assert!(stdout.is_empty(), "no IO ran: {stdout}");

    // An existing image, no image_size, smaller than one IO: no IO runs.
    mons.cli(&["image", "create", "fb/tiny", "--size", "64K"])
        .ok();
    let (code, stdout, stderr) = bench(&[
        "--mon",
        &endpoint,
        "--pool",
        "fb",
        "--image",
        "tiny",
        "--io-size",
        "1M",
        "--io-count",
        "4",
        "--io-type",
        "write",
    ]);
    // The run's report is that error alone: no phase ran.
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert_eq!(
        stdout.trim(),
        "error: the IO range has 65536 bytes, less than one IO of 1048576",
        "{stderr}"
    );
}

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

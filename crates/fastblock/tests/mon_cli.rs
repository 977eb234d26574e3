//! Pool and image lifecycle through `fastblock-client`, in both syntaxes, against a real
//! monitor and etcd; every error case gives a non-zero exit and one clear line.

mod common;

use common::{FakeOsd, MonCluster, MonOptions};

async fn cluster_with_osds(n: usize) -> (MonCluster, Vec<FakeOsd>) {
    let mons = MonCluster::start(1, MonOptions::default()).await;
    let mut osds = Vec::new();
    for i in 0..n {
        osds.push(FakeOsd::register(&mons, &format!("host{i}")).await);
    }
    (mons, osds)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_lifecycle_modern_syntax() {
    let (mons, _osds) = cluster_with_osds(3).await;
    let out = mons.cli(&["pool", "create", "rbd", "--pg-count", "16", "--size", "3"]);
    assert!(out.ok().contains("pool rbd created"), "{}", out.stdout);
    let pools = mons.cli(&["--json", "pool", "ls"]).json();
    assert_eq!(pools[0]["name"], "rbd");
    assert_eq!(pools[0]["pg_count"], 16);
    let pgs = mons.cli(&["--json", "pg", "ls", "--pool", "rbd"]).json();
    let pgs = pgs["pgs"].as_array().unwrap();
    assert_eq!(pgs.len(), 16);
    for pg in pgs {
        assert_eq!(pg["state_name"], "creating");
        assert_eq!(pg["osdlist"].as_array().unwrap().len(), 3);
    }
    let table = mons.cli(&["pg", "ls"]);
    assert!(table.ok().starts_with("PG"), "{}", table.stdout);
    assert_eq!(table.stdout.lines().count(), 17);

    // Error cases: each is one line on stderr and a non-zero exit status (docs/cli.md).
    mons.cli(&["pool", "create", "rbd", "--pg-count", "8"])
        .fails_with("already exists");
    mons.cli(&["pool", "create", "big", "--pg-count", "8", "--size", "4"])
        .fails_with("needs 4 distinct osd failure domains");
    mons.cli(&[
        "pool",
        "create",
        "hosty",
        "--pg-count",
        "8",
        "--size",
        "3",
        "--failure-domain",
        "host",
    ])
    .ok();
    mons.cli(&["pool", "create", "zero", "--pg-count", "0"])
        .fails_with("pg count 0");
    mons.cli(&["pool", "create", "bad/name", "--pg-count", "8"])
        .fails_with("may only contain");
    mons.cli(&["pool", "create", "huge", "--pg-count", "131073"])
        .fails_with("between 1 and");
    mons.cli(&["pool", "rm", "nosuch"])
        .fails_with("does not exist");
    let usage = mons.cli(&["pool", "create", "x"]);
    assert_eq!(
        usage.code, 2,
        "missing --pg-count is a usage error: {}",
        usage.stderr
    );

    mons.cli(&["pool", "rm", "hosty"]).ok();
    let pools = mons.cli(&["--json", "pool", "ls"]).json();
    assert_eq!(pools.as_array().unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_lifecycle_modern_syntax() {
    let (mons, _osds) = cluster_with_osds(1).await;
    mons.cli(&["pool", "create", "p", "--pg-count", "4", "--size", "1"])
        .ok();
    mons.cli(&["image", "create", "p/vm1", "--size", "10G"])
        .ok();
    let info = mons.cli(&["--json", "image", "info", "p/vm1"]).json();
    assert_eq!(info["size_bytes"], 10u64 << 30);
    assert_eq!(info["object_size_bytes"], 4u64 << 20);
    let id1 = info["id"].as_u64().unwrap();
    mons.cli(&[
        "image",
        "create",
        "p/vm2",
        "--size",
        "512M",
        "--object-size",
        "1M",
    ])
    .ok();

    mons.cli(&["image", "create", "p/vm1", "--size", "1G"])
        .fails_with("already exists");
    mons.cli(&["image", "create", "nopool/x", "--size", "1G"])
        .fails_with("does not exist");
    mons.cli(&["image", "create", "p/odd", "--size", "1000"])
        .fails_with("not a multiple of 4096");
    mons.cli(&[
        "image",
        "create",
        "p/os",
        "--size",
        "1G",
        "--object-size",
        "3M",
    ])
    .fails_with("power of two");
    mons.cli(&[
        "image",
        "create",
        "p/os",
        "--size",
        "1G",
        "--object-size",
        "1G",
    ])
    .fails_with("power of two");
    mons.cli(&["image", "create", "p/huge", "--size", "2P"])
        .fails_with("exceeds the maximum");
    assert_eq!(
        mons.cli(&["image", "create", "p/x", "--size", "ten"]).code,
        2
    );

    // Grow, refuse a silent shrink, shrink explicitly: the cut tail is queued for reclaim.
    mons.cli(&["image", "resize", "p/vm1", "--size", "20G"])
        .ok();
    mons.cli(&["image", "resize", "p/vm1", "--size", "1G"])
        .fails_with("allow_shrink");
    mons.cli(&["image", "resize", "p/vm1", "--size", "1G", "--allow-shrink"])
        .ok();
    let reclaim = mons.cli(&["--json", "reclaim"]).json();
    assert_eq!(reclaim[0]["from_bytes"], 1u64 << 30);
    assert_eq!(reclaim[0]["to_bytes"], 20u64 << 30);

    // Remove records the whole image for deletion, and the name can be reused with a new id.
    mons.cli(&["image", "rm", "p/vm1"]).ok();
    mons.cli(&["image", "info", "p/vm1"])
        .fails_with("does not exist");
    mons.cli(&["image", "rm", "p/vm1"])
        .fails_with("does not exist");
    let reclaim = mons.cli(&["--json", "reclaim"]).json();
    assert_eq!(reclaim.as_array().unwrap().len(), 2);
    assert_eq!(reclaim[1]["image"], id1);
    mons.cli(&["image", "create", "p/vm1", "--size", "1G"]).ok();
    let info = mons.cli(&["--json", "image", "info", "p/vm1"]).json();
    assert!(
        info["id"].as_u64().unwrap() > id1,
        "image ids are never reused"
    );

    // A pool with images is only deleted on purpose.
    mons.cli(&["pool", "rm", "p"])
        .fails_with("holds 2 image(s)");
    let ls = mons.cli(&["image", "ls", "p"]);
    assert_eq!(ls.ok().lines().count(), 3);
    mons.cli(&["pool", "rm", "p", "--force"]).ok();
    assert_eq!(
        mons.cli(&["--json", "image", "ls"])
            .json()
            .as_array()
            .unwrap()
            .len(),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reference_flag_syntax_and_output_shapes() {
    let (mons, osds) = cluster_with_osds(3).await;
    let ep = format!("-endpoint={}", mons.specs[0].api);
    let run = |args: &[&str]| {
        let mut v = args.to_vec();
        v.push(&ep);
        mons.cli(&v)
    };
    let out = run(&["-op=createpool", "-poolname=fb", "-pgcount=8", "-pgsize=3"]);
    assert_eq!(out.ok().trim(), "pool fb created, pool is 1");
    let out = run(&["-op=createpool", "-poolname=fb", "-pgcount=8", "-pgsize=3"]);
    assert_eq!(
        out.stdout.trim(),
        "pool fb creation failed, error is pool already exists"
    );
    // Refused (docs/cli.md, "Exit status"), and said once: on stdout, in the reference's words.
    assert_eq!(out.code, 4);
    assert!(out.stderr.is_empty(), "printed twice: {}", out.stderr);
    let out = run(&["-op=createpool", "-poolname=x", "-pgcount=8", "-pgsize=5"]);
    assert_eq!(
        out.stdout.trim(),
        "pool x creation failed, error is failure domain need not satisfied"
    );

    let out = run(&["-op=listpools"]);
    assert_eq!(
        out.ok(),
        "pools: \npoolid: 1, name: fb, pgcount: 8, pgsize: 3, root: defaultroot\n"
    );

    let out = run(&["-op=getpgmap"]);
    let mut lines = out.ok().lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["PGID", "STATE", "CORE", "OSDLIST", "NEWCORE", "NEWOSDLIST"]
    );
    let first: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(first[0], "1.0");
    assert_eq!(first[1], "creating");

    let out = run(&["-op=getosdmap"]);
    let rows: Vec<&str> = out.ok().lines().collect();
    assert_eq!(
        rows[0].split_whitespace().collect::<Vec<_>>(),
        ["OSDID", "ADDRESS", "STATUS-UP", "STATUS-IN"]
    );
    assert_eq!(rows.len(), 4);
    assert_eq!(
        rows[1].split_whitespace().collect::<Vec<_>>()[2..],
        ["up", "in"],
        "{}",
        rows[1]
    );

    let out = run(&[
        "-op=createimage",
        "-poolname=fb",
        "-imagename=img",
        "-imagesize=1073741824",
    ]);
    assert_eq!(
        out.ok().trim(),
        "Image is created, imagename: img Poolname: fb Size: 1073741824 Objectsize: 4194304"
    );
    let out = run(&[
        "-op=createimage",
        "-poolname=fb",
        "-imagename=img",
        "-imagesize=1073741824",
    ]);
    assert_eq!(out.stdout.trim(), "create image img failed, imageExists");
    let out = run(&["-op=getimage", "-poolname=fb", "-imagename=img"]);
    assert_eq!(
        out.ok().trim(),
        "Imagename: img get info imagename: img Poolname: fb Size: 1073741824 Objectsize: 4194304"
    );
    let out = run(&[
        "-op=resizeimage",
        "-poolname=fb",
        "-imagename=img",
        "-imagesize=2147483648",
    ]);
    assert_eq!(
        out.ok().trim(),
        "imagename img is resized , new size: 2147483648"
    );
    let out = run(&["-op=removeimage", "-poolname=fb", "-imagename=img"]);
    assert_eq!(out.ok().trim(), "imagename img is removed");
    let out = run(&["-op=removeimage", "-poolname=fb", "-imagename=img"]);
    assert_eq!(out.stdout.trim(), "imagename img can't remove , not exist");

    let out = run(&["-op=outosd", &format!("-osdid={}", osds[0].id)]);
    assert_eq!(out.ok().trim(), "Received OsdOutResponse, ok is true");
    let out = run(&["-op=inosd", "-osdid=99"]);
    assert_eq!(out.stdout.trim(), "Received OsdInResponse, ok is false");
    let out = run(&["-set=noout"]);
    assert_eq!(out.ok().trim(), "Received NoOutResponse, ok is true");
    let out = run(&["-set=noReblance"]);
    assert_eq!(out.ok().trim(), "Received NoReblanceResponse, ok is true");

    let out = run(&["-op=status"]);
    let text = out.ok();
    assert!(
        text.contains("  cluster:\n    noReblance,noOut  flags set\n"),
        "{text}"
    );
    assert!(text.contains("    osd: 3 osds: 3 up, 2 in\n"), "{text}");
    assert!(text.contains("    pools  : 1 pools, 8 pgs\n"), "{text}");
    run(&["-unset=noout"]).ok();
    run(&["-unset=noReblance"]).ok();

    let out = run(&["-op=showconfig", &format!("-osdid={}", osds[1].id)]);
    assert_eq!(out.ok().trim(), format!("{{\"osd\":{}}}", osds[1].id));
    let out = run(&["-op=getpgosds"]);
    assert!(out.ok().starts_with("OSDID"), "{}", out.stdout);
    let out = run(&["-op=getclustermap"]);
    assert!(
        out.ok().contains("pool is 1, pg is 0, osds are ["),
        "{}",
        out.stdout
    );

    // Bad flags are usage errors with a clear reason.
    let out = run(&["-op=createpool", "-pgcount=8"]);
    assert_eq!(out.code, 2);
    assert!(out.stderr.contains("needs -poolname"), "{}", out.stderr);
    let out = run(&["-op=fakeapplyid", "-uuid=x"]);
    assert_eq!(out.code, 2);
    assert!(out.stderr.contains("not supported"), "{}", out.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_monitor_is_a_one_line_error() {
    let port = common::free_port();
    let out = std::process::Command::new(common::bin("fastblock-client"))
        .args([
            "--mon",
            &format!("127.0.0.1:{port}"),
            "--timeout",
            "1s",
            "status",
        ])
        .output()
        .unwrap();
    let out = common::CliOutput::from(out);
    out.fails_with("no monitor reachable");
}

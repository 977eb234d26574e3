//! Deployment: an OSD that registers a loopback address with a monitor elsewhere warns (on
//! real processes); the systemd units in `deploy/systemd` pass `systemd-analyze verify`
//! (which also reports a unit broken on purpose), and `scripts/build-deb.sh` builds a Debian
//! package of the test's own binaries whose contents and control fields `dpkg-deb` reads back.
//! Both tools come from `scripts/install-deps.sh`. systemd does not run in the test (nor,
//! usually, in a container): `verify` parses the units and checks what they refer to under a
//! root directory, without starting anything.

mod common;

use common::{bin, start_osds, MonCluster, MonOptions, TempDir};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const UNITS: [&str; 3] = [
    "fastblock-mon@.service",
    "fastblock-osd@.service",
    "fastblock-nbd@.service",
];
/// One instance of each unit, as an operator would enable it.
const INSTANCES: [&str; 3] = [
    "fastblock-mon@a.service",
    "fastblock-osd@disk1.service",
    "fastblock-nbd@default.service",
];
const BINARIES: [&str; 4] = [
    "fastblock-mon",
    "fastblock-osd",
    "fastblock-client",
    "fastblock-nbd",
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Adds the system's targets to `root` (the units are wanted by and ordered after some, and
/// `verify` loads the default dependencies through them).
fn add_system_targets(root: &Path) {
    let units = root.join("lib/systemd/system");
    std::fs::create_dir_all(&units).unwrap();
    let system = Path::new("/lib/systemd/system");
    let entries = std::fs::read_dir(system).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (install systemd: scripts/install-deps.sh)",
            system.display()
        )
    });
    for entry in entries {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if name.to_string_lossy().ends_with(".target") && entry.path().is_file() {
            std::fs::copy(entry.path(), units.join(&name)).unwrap();
        }
    }
}

/// `systemd-analyze verify` of `INSTANCES` under `root`: its exit status and everything it
/// printed (it only warns, with status 0, about unknown keys and bad values).
fn verify(root: &Path) -> (bool, String) {
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(format!("--root={}", root.display()))
        .args(INSTANCES)
        .output()
        .expect("running systemd-analyze (install systemd: scripts/install-deps.sh)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Goal: the units parse without a warning and refer to binaries that exist. Method: a root
/// with the units, the system's targets and the test's binaries; verify every unit, then a
/// copy with an unknown key and a bad value, which must be reported.
#[test]
fn systemd_units_pass_systemd_analyze_verify() {
    let dir = TempDir::new("units");
    let root = dir.path();
    add_system_targets(root);
    std::fs::create_dir_all(root.join("usr/bin")).unwrap();
    for name in BINARIES {
        std::fs::copy(bin(name), root.join("usr/bin").join(name)).unwrap();
    }
    let units = root.join("lib/systemd/system");
    for unit in UNITS {
        std::fs::copy(repo().join("deploy/systemd").join(unit), units.join(unit)).unwrap();
    }
    let (ok, text) = verify(root);
    assert!(
        ok && text.trim().is_empty(),
        "systemd-analyze verify: {text}"
    );

    // The check can fail: a misspelt key and a bad value are reported.
    let osd = units.join("fastblock-osd@.service");
    let broken = std::fs::read_to_string(&osd)
        .unwrap()
        .replace("Restart=on-failure", "Restart=sometimes\nLimitNOFILES=10");
    std::fs::write(&osd, broken).unwrap();
    let (_, text) = verify(root);
    assert!(text.contains("LimitNOFILES"), "{text}");
    assert!(
        text.contains("sometimes") || text.contains("restart"),
        "{text}"
    );
    // And a unit whose binary is missing fails.
    std::fs::copy(repo().join("deploy/systemd/fastblock-osd@.service"), &osd).unwrap();
    std::fs::remove_file(root.join("usr/bin/fastblock-nbd")).unwrap();
    let (ok, text) = verify(root);
    assert!(!ok && text.contains("fastblock-nbd"), "{text}");
}

fn dpkg_deb(args: &[&str]) -> String {
    let out = Command::new("dpkg-deb")
        .args(args)
        .output()
        .expect("running dpkg-deb");
    assert!(
        out.status.success(),
        "dpkg-deb {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// Goal: the package holds what docs/operations.md says it installs, with working control
/// fields and maintainer scripts. Method: build it from the test's (debug) binaries, list and
/// read it with dpkg-deb, unpack it and verify its units against its own binaries.
#[test]
fn debian_package_holds_binaries_units_docs_and_postinst() {
    let dir = TempDir::new("deb");
    let bin_dir = bin("fastblock-mon").parent().unwrap().to_path_buf();
    let out = Command::new(repo().join("scripts/build-deb.sh"))
        .arg("--bin-dir")
        .arg(&bin_dir)
        .arg("--out")
        .arg(dir.path())
        .args(["--compress", "none"])
        .output()
        .expect("running scripts/build-deb.sh");
    assert!(
        out.status.success(),
        "build-deb.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let deb = stdout.lines().last().expect("the package path").to_string();
    assert!(Path::new(&deb).is_file(), "{deb}");

    let info = dpkg_deb(&["-I", &deb]);
    for field in [
        "Package: fastblock",
        "Version: 0.1.0",
        "Depends: libc6 (>= 2.",
        "Recommends: etcd-server",
    ] {
        assert!(info.contains(field), "{field:?} missing from:\n{info}");
    }
    assert!(info.contains(" postinst"), "{info}");
    assert_eq!(dpkg_deb(&["-f", &deb, "Package"]).trim(), "fastblock");

    let contents = dpkg_deb(&["-c", &deb]);
    let mut wanted: Vec<String> = BINARIES.iter().map(|b| format!("./usr/bin/{b}")).collect();
    for u in UNITS {
        wanted.push(format!("./lib/systemd/system/{u}"));
    }
    for page in [
        "fastblock-client.1.gz",
        "fastblock-client-pool-create.1.gz",
        "fastblock-mon.1.gz",
        "fastblock-osd.1.gz",
        "fastblock-nbd.1.gz",
    ] {
        wanted.push(format!("./usr/share/man/man1/{page}"));
    }
    wanted.push("./usr/share/bash-completion/completions/fastblock-client".to_string());
    for d in [
        "operations.md",
        "security.md",
        "copyright",
        "examples/osd-disk1.env",
        "examples/mon-etcdctl.sh",
    ] {
        wanted.push(format!("./usr/share/doc/fastblock/{d}"));
    }
    for path in &wanted {
        let line = contents
            .lines()
            .find(|l| l.ends_with(path.as_str()))
            .unwrap_or_else(|| panic!("{path} missing from:\n{contents}"));
        assert!(line.contains("root/root"), "{line}");
        if path.starts_with("./usr/bin/") {
            assert!(line.starts_with("-rwxr-xr-x"), "{line}");
        }
    }

    // Unpacked: the maintainer script creates the user and /etc/fastblock, and the units
    // verify against the packaged binaries.
    let unpacked = dir.path().join("root");
    dpkg_deb(&["-R", &deb, unpacked.to_str().unwrap()]);
    let postinst = std::fs::read_to_string(unpacked.join("DEBIAN/postinst")).unwrap();
    for needle in ["adduser --system", "/etc/fastblock", "/var/lib/fastblock"] {
        assert!(
            postinst.contains(needle),
            "{needle:?} missing from:\n{postinst}"
        );
    }
    let sh = Command::new("sh")
        .arg("-n")
        .arg(unpacked.join("DEBIAN/postinst"))
        .status()
        .unwrap();
    assert!(sh.success(), "postinst is not valid sh");
    add_system_targets(&unpacked);
    let (ok, text) = verify(&unpacked);
    assert!(
        ok && text.trim().is_empty(),
        "systemd-analyze verify: {text}"
    );
    let packaged = std::fs::read(unpacked.join("usr/bin/fastblock-osd")).unwrap();
    assert!(packaged == std::fs::read(bin("fastblock-osd")).unwrap());
}

/// A non-loopback IPv4 address of this host: the source address the kernel picks for a
/// route out (connecting a UDP socket sends nothing).
fn host_address() -> String {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").expect("a UDP socket");
    socket
        .connect("192.0.2.1:9")
        .expect("a route out of this host (for a non-loopback address)");
    let ip = socket.local_addr().expect("the local address").ip();
    assert!(!ip.is_loopback(), "{ip}");
    ip.to_string()
}

/// Goal: the mistake of a multi-host setup without `--address` is pointed out. Method: a
/// monitor whose API listens on this host's non-loopback address, and an OSD left on the
/// default `--address 127.0.0.1`: it still boots (one host), and its log carries the warning
/// (`crates/osd/src/reach.rs`). The OSDs of `osd_purge.rs`, with a monitor on loopback, do
/// not warn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_osd_registering_loopback_with_a_remote_monitor_warns() {
    let ip = host_address();
    let mons = MonCluster::start_at(1, MonOptions::default(), &ip).await;
    let dir = TempDir::new("reach");
    let osds = start_osds(&mons, dir.path(), 1, "256M", 1, Duration::from_secs(30)).await;
    let logs = osds[0].all_logs();
    let warning = format!(
        "this OSD registers the loopback address 127.0.0.1 (--address) with monitor {}",
        mons.endpoints()[0]
    );
    assert!(logs.contains(&warning), "{logs}");
    assert!(logs.contains("WARN"), "{logs}");
}

//! A monitor whose own etcd member's address is held by another etcd (on Debian, the
//! distribution's `etcd.service` on localhost:2379/2380) refuses to use it, on real processes:
//! it exits with status 2 (its systemd unit does not restart it) and a message naming the
//! address and the remedy, and writes nothing into the other etcd, so that three monitors
//! can never end up with three independent cluster maps.

mod common;

use common::{bin, free_port, Proc, TempDir};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// How long a refusing monitor may take to exit.
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(30);

/// A standalone etcd, as a distribution runs it: member name "default".
fn start_foreign_etcd(dir: &Path, client: &str, peer: &str) -> Proc {
    let mut cmd = Command::new("etcd");
    cmd.args(["--name", "default", "--data-dir"])
        .arg(dir.join("foreign-etcd"))
        .args(["--listen-client-urls", &format!("http://{client}")])
        .args(["--advertise-client-urls", &format!("http://{client}")])
        .args(["--listen-peer-urls", &format!("http://{peer}")])
        .args(["--initial-advertise-peer-urls", &format!("http://{peer}")])
        .args(["--initial-cluster", &format!("default=http://{peer}")]);
    Proc::spawn("foreign etcd", cmd, dir.join("foreign-etcd.log"))
}

fn etcdctl(endpoint: &str, args: &[&str]) -> std::process::Output {
    Command::new("etcdctl")
        .args(["--endpoints", endpoint])
        .args(args)
        .env("ETCDCTL_API", "3")
        .output()
        .expect("running etcdctl (install with scripts/install-deps.sh)")
}

fn wait_healthy(endpoint: &str, etcd: &Proc) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !etcdctl(endpoint, &["endpoint", "health"]).status.success() {
        assert!(
            Instant::now() < deadline,
            "the foreign etcd at {endpoint} is not healthy:\n{}",
            etcd.log_tail()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Every key in the etcd at `endpoint`.
fn all_keys(endpoint: &str) -> String {
    let out = etcdctl(endpoint, &["get", "", "--from-key", "--keys-only"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Starts a monitor with `extra` flags and waits for it to exit; returns its exit code and
/// log. A monitor that serves on is killed (by PID) and fails the test.
fn run_monitor(dir: &Path, tag: &str, extra: &[&str]) -> (Option<i32>, String) {
    let api = format!("127.0.0.1:{}", free_port());
    let mut cmd = Command::new(bin("fastblock-mon"));
    cmd.args(["--name", "a", "--api-addr", &api, "--auth-mode", "none"])
        .arg("--data-dir")
        .arg(dir.join(tag))
        .args(extra)
        .env("FASTBLOCK_RUN_DIR", dir.join("run"))
        .env("RUST_LOG", "info");
    let log = dir.join(format!("mon-{tag}.log"));
    let mut mon = Proc::spawn(&format!("mon ({tag})"), cmd, log.clone());
    let status = mon.wait_exit(REFUSAL_TIMEOUT);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let Some(status) = status else {
        panic!("{tag}: the monitor still runs after {REFUSAL_TIMEOUT:?}:\n{text}");
    };
    (status.code(), text)
}

#[test]
fn a_monitor_refuses_another_etcd_on_its_members_addresses() {
    let dir = TempDir::new("foreign-etcd");
    let foreign_client = format!("127.0.0.1:{}", free_port());
    let foreign_peer = format!("127.0.0.1:{}", free_port());
    let foreign_url = format!("http://{foreign_client}");
    let foreign = start_foreign_etcd(dir.path(), &foreign_client, &foreign_peer);
    wait_healthy(&foreign_url, &foreign);
    let remedy = "systemctl disable --now etcd";

    // The package's case: the distribution's etcd holds the client address. The own member
    // cannot bind, and the etcd answering there is member "default".
    let own_peer = format!("127.0.0.1:{}", free_port());
    let (code, log) = run_monitor(
        dir.path(),
        "client-held",
        &[
            "--etcd-client-addr",
            &foreign_client,
            "--etcd-peer-addr",
            &own_peer,
        ],
    );
    assert_eq!(code, Some(2), "{log}");
    assert!(log.contains(&foreign_client), "names the address: {log}");
    assert!(log.contains(remedy), "{log}");
    assert!(!log.contains("panicked"), "{log}");

    // The identity check alone: a "member" that starts and stays up without binding (as one
    // that shares the port would), while the other etcd answers at the client URL.
    let fake_etcd = dir.path().join("fake-etcd.sh");
    std::fs::write(&fake_etcd, "#!/bin/sh\nexec sleep 120\n").unwrap();
    std::fs::set_permissions(
        &fake_etcd,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let own_peer = format!("127.0.0.1:{}", free_port());
    let (code, log) = run_monitor(
        dir.path(),
        "identity",
        &[
            "--etcd-binary",
            fake_etcd.to_str().unwrap(),
            "--etcd-client-addr",
            &foreign_client,
            "--etcd-peer-addr",
            &own_peer,
        ],
    );
    assert_eq!(code, Some(2), "{log}");
    let expected = format!(
        "the etcd answering at {foreign_url} is not this monitor's own member: it is member \
         \"default\""
    );
    assert!(log.contains(&expected), "{log}");
    assert!(log.contains(remedy), "{log}");

    // The peer address held (Debian's etcd holds :2380 too), the client address free: nothing
    // answers at the client URL, and the member supervisor sees why its member exits.
    let own_client = format!("127.0.0.1:{}", free_port());
    let (code, log) = run_monitor(
        dir.path(),
        "peer-held",
        &[
            "--etcd-client-addr",
            &own_client,
            "--etcd-peer-addr",
            &foreign_peer,
        ],
    );
    assert_eq!(code, Some(2), "{log}");
    let expected = format!(
        "another process listens on {foreign_peer}, this monitor's etcd peer address, so its \
         own etcd member cannot start there"
    );
    assert!(log.contains(&expected), "{log}");
    assert!(log.contains(remedy), "{log}");

    // None of them wrote anything into the other etcd: no member key, no cluster map.
    assert_eq!(all_keys(&foreign_url), "", "keys in the foreign etcd");
}

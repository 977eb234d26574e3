//! etcd closed to whoever lacks the monitors' files (`docs/security.md`, "etcd"), on real
//! monitors with their own etcd members: a local user's `etcdctl` is refused, the key table is
//! sealed in etcd, and a monitor given another secret refuses to start.

mod common;

use common::{MonCluster, MonOptions};
use std::process::Output;
use std::time::Duration;

fn run(mut cmd: std::process::Command) -> Output {
    cmd.output()
        .expect("running etcdctl (install with scripts/install-deps.sh)")
}

/// `etcdctl` against monitor 0's member as a local user without credentials.
fn anonymous_etcdctl(mons: &MonCluster, args: &[&str]) -> Output {
    let mut cmd = std::process::Command::new("etcdctl");
    cmd.arg("--endpoints")
        .arg(&mons.specs[0].etcd_client)
        .args(args)
        .env("ETCDCTL_API", "3");
    run(cmd)
}

/// A local user who can reach the member's client port but holds no monitor file reads
/// nothing and writes nothing: etcd's authentication is on. Method: plain `etcdctl` get and
/// put against a running monitor's member; both must fail with etcd's refusal of a call
/// without a user, and the key must not have been written (checked as root).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_refuses_a_local_user_without_credentials() {
    let mons = MonCluster::start(1, MonOptions::default()).await;
    let read = anonymous_etcdctl(&mons, &["get", "--prefix", "/fastblock/auth"]);
    let stderr = String::from_utf8_lossy(&read.stderr);
    assert!(
        !read.status.success(),
        "an anonymous read of the key table must be refused; it read:\n{}",
        String::from_utf8_lossy(&read.stdout)
    );
    assert!(
        stderr.contains("user name is empty") || stderr.contains("permission denied"),
        "refused by etcd's authentication: {stderr}"
    );
    assert!(read.stdout.is_empty(), "nothing read");
    let write = anonymous_etcdctl(&mons, &["put", "/fastblock/flags", "{}"]);
    assert!(!write.status.success(), "an anonymous write is refused");
    let mut as_root = mons.etcdctl(0);
    as_root.args(["get", "/fastblock/flags", "--print-value-only"]);
    let flags = run(as_root);
    assert!(flags.status.success(), "root reads");
    assert_ne!(String::from_utf8_lossy(&flags.stdout).trim(), "{}");
}

/// The key table in etcd holds every entity's key sealed: read as etcd's root (who can read
/// everything etcd holds), no entry contains the key `client.admin` holds in its keyring, and
/// each carries a sealed key instead. Method: the admin key from the keyring the test cluster
/// wrote, compared with every stored entity value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_table_is_sealed_in_etcd() {
    let mons = MonCluster::start(1, MonOptions::default()).await;
    let ring = fastblock_auth::Keyring::load(&mons.keyring()).expect("the admin keyring");
    let admin_key = ring.entries[&fastblock_auth::EntityName::admin()]
        .key
        .to_base64();
    let mut cmd = mons.etcdctl(0);
    cmd.args(["get", "--prefix", "/fastblock/auth/entities/"]);
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines.contains(&"/fastblock/auth/entities/client.admin"),
        "client.admin is in the table:\n{text}"
    );
    let values: Vec<&str> = lines.iter().skip(1).step_by(2).copied().collect();
    assert!(!values.is_empty());
    for value in values {
        assert!(
            !value.contains(&admin_key),
            "a key in clear in etcd: {value}"
        );
        assert!(!value.contains("\"key\""), "an entry in clear: {value}");
        assert!(value.contains("\"sealed\""), "a sealed entry: {value}");
    }
}

/// A monitor restarted with another secret file than the one its etcd was set up with
/// refuses to start, with a message naming `--mon-secret-file`, and exits with status 2 (a
/// misconfiguration, which its systemd unit does not restart). Method: stop the monitor,
/// replace its secret, start it again and wait (bounded) for it to exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_monitor_with_another_secret_refuses_to_start() {
    let mut mons = MonCluster::start(1, MonOptions::default()).await;
    assert!(mons.stop(0), "SIGTERM stops the monitor");
    std::fs::remove_file(mons.mon_secret()).unwrap();
    MonCluster::write_secret_file(&mons.mon_secret());
    mons.restart(0);
    let proc = mons.procs[0].as_mut().expect("restarted");
    let status = proc
        .wait_exit(Duration::from_secs(60))
        .expect("the monitor exits within 60 s");
    let log = std::fs::read_to_string(&proc.log).unwrap();
    assert_eq!(status.code(), Some(2), "a misconfiguration: {log}");
    assert!(
        log.contains("--mon-secret-file") && log.contains("another monitor secret"),
        "the message says what is wrong: {log}"
    );
    mons.procs[0] = None;
}

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

/// `curl` to monitor `i`'s etcd peer port, with `extra` options; its exit status and output.
fn curl_peer(mons: &MonCluster, scheme: &str, path: &str, extra: &[&str]) -> Output {
    let mut cmd = std::process::Command::new("curl");
    cmd.args(["-sS", "--http1.1", "--max-time", "5"])
        .args(extra)
        .arg(format!("{scheme}://{}{path}", mons.specs[0].etcd_peer));
    cmd.output()
        .expect("running curl (scripts/install-deps.sh)")
}

/// The members of a 3-monitor cluster reach each other over mutually authenticated TLS, with
/// no file but the monitor secret: their peer URLs are https, and the peer port refuses a
/// client in clear, one without a certificate, and one with a certificate of another
/// secret's CA, while a certificate made from the monitors' own secret is let in (the
/// members' own links; the cluster's working at all shows they pass). Method: the member
/// list as etcd's root, then `curl` at a member's peer port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_members_peer_links_are_mutually_authenticated_tls() {
    let mons = MonCluster::start(3, MonOptions::default()).await;
    mons.wait_leader(Duration::from_secs(60)).await;
    // The cluster works: a write that needs a quorum of members.
    mons.client()
        .set_flag("noout", true)
        .await
        .expect("a write through etcd's quorum");
    let mut list = mons.etcdctl(0);
    list.args(["member", "list"]);
    let out = run(list);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(text.lines().count(), 3, "{text}");
    for spec in &mons.specs {
        assert!(
            text.contains(&format!("https://{}", spec.etcd_peer)),
            "{} advertises an https peer URL:\n{text}",
            spec.name
        );
    }
    // Columns: id, status, name, peer URLs, client URLs (on loopback, in clear), learner.
    for line in text.lines() {
        let peer = line.split(", ").nth(3).unwrap_or_default();
        assert!(peer.starts_with("https://"), "a peer URL in clear: {line}");
    }

    let clear = curl_peer(&mons, "http", "/members", &[]);
    let said = String::from_utf8_lossy(&clear.stdout);
    assert!(
        !said.contains("peerURLs"),
        "a request in clear gets no member list: {said}"
    );
    let anonymous = curl_peer(&mons, "https", "/members", &["-k"]);
    assert!(
        matches!(anonymous.status.code(), Some(35) | Some(56)),
        "a TLS client without a certificate is refused: {}",
        String::from_utf8_lossy(&anonymous.stdout)
    );

    let dir = common::TempDir::new("peer-tls");
    let secret_bytes: [u8; 32] = std::fs::read(mons.mon_secret())
        .unwrap()
        .try_into()
        .unwrap();
    let host = mons.specs[0]
        .etcd_peer
        .rsplit_once(':')
        .unwrap()
        .0
        .to_string();
    // A client certificate made from `secret`; the member's own certificate is checked against
    // the monitors' CA (from their secret) in both cases, so a failure is the member refusing
    // the client's certificate.
    let with_cert = |name: &str, secret: [u8; 32]| {
        let made = |s: [u8; 32]| {
            fastblock_mon::etcd_tls::issue(&fastblock_mon::secret::MonSecret::from_bytes(s), &host)
                .unwrap()
        };
        let (ca, _, _) = made(secret_bytes);
        let (_, cert, key) = made(secret);
        let path = |what: &str| dir.path().join(format!("{name}-{what}.pem"));
        for (what, text) in [("ca", &ca), ("cert", &cert), ("key", &key)] {
            std::fs::write(path(what), text).unwrap();
        }
        let (ca, cert, key) = (path("ca"), path("cert"), path("key"));
        curl_peer(
            &mons,
            "https",
            "/members",
            &[
                "--cacert",
                ca.to_str().unwrap(),
                "--cert",
                cert.to_str().unwrap(),
                "--key",
                key.to_str().unwrap(),
            ],
        )
    };
    let other = with_cert("other", [0x5a; 32]);
    // The TLS handshake fails (curl's 35, or 56 when the alert comes after its own part):
    // refused for its certificate, not for anything before.
    assert!(
        matches!(other.status.code(), Some(35) | Some(56)),
        "a certificate of another secret's CA is refused in the handshake: {:?} {} {}",
        other.status.code(),
        String::from_utf8_lossy(&other.stdout),
        String::from_utf8_lossy(&other.stderr)
    );
    eprintln!(
        "another CA's certificate: {}",
        String::from_utf8_lossy(&other.stderr).trim()
    );
    let own = with_cert("own", secret_bytes);
    let members = String::from_utf8_lossy(&own.stdout);
    assert!(
        own.status.success() && members.contains("peerURLs"),
        "a certificate of the monitors' CA is let in: {members} {}",
        String::from_utf8_lossy(&own.stderr)
    );
}

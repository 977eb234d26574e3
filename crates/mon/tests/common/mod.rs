//! For the store's tests: a real etcd (one member on free loopback ports, in a directory of
//! its own, killed and removed when dropped), and a cluster state to write into it.

use fastblock_mon_core::MonState;
use fastblock_types::api::{BootRequest, CreatePoolRequest};
use fastblock_types::map::FailureDomain;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Etcd {
    child: Child,
    dir: std::path::PathBuf,
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Etcd {
    /// Sends `signal` to the member (SIGSTOP freezes it with its sockets open: requests
    /// wait unanswered until SIGCONT).
    #[allow(dead_code)] // not every test file that shares this module freezes etcd
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, signal);
        }
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A one-member etcd on free loopback ports, in a directory of its own.
#[allow(dead_code)] // a test file that needs other flags calls `etcd_with` only
pub async fn etcd() -> (Etcd, etcd_client::Client) {
    etcd_with(&[]).await
}

/// [`etcd`] with more flags (`--max-txn-ops 4096`, as the monitor's own member runs).
pub async fn etcd_with(flags: &[&str]) -> (Etcd, etcd_client::Client) {
    let dir = std::env::temp_dir().join(format!(
        "restore-etcd-{}-{}",
        std::process::id(),
        free_port()
    ));
    let (client_port, peer_port) = (free_port(), free_port());
    let endpoint = format!("http://127.0.0.1:{client_port}");
    let peer = format!("http://127.0.0.1:{peer_port}");
    let child = Command::new("etcd")
        .arg("--data-dir")
        .arg(&dir)
        .args(["--listen-client-urls", &endpoint])
        .args(["--advertise-client-urls", &endpoint])
        .args(["--listen-peer-urls", &peer])
        .args(["--initial-advertise-peer-urls", &peer])
        .args(["--initial-cluster", &format!("default={peer}")])
        .args(flags)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("running etcd (install with scripts/install-deps.sh)");
    let etcd = Etcd { child, dir };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(mut c) = etcd_client::Client::connect([&endpoint], None).await {
            if c.status().await.is_ok() {
                return (etcd, c);
            }
        }
        assert!(
            Instant::now() < deadline,
            "etcd at {endpoint} did not start"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `osds` OSDs booted and a pool "p" of `pg_count` PGs of `size` replicas, finished as the
/// monitor finishes an operation.
#[allow(dead_code)] // not every test file that shares this module writes a state
pub fn cluster_state(osds: u32, pg_count: u32, size: u32) -> MonState {
    let mut s = MonState::default();
    for i in 0..osds {
        let uuid = format!("0b6b3c2e-7d2f-4c59-9a55-8c2f1a1e2b{i:02}");
        let id = s.apply_id(&uuid).unwrap();
        let boot = BootRequest {
            uuid,
            address: "127.0.0.1".into(),
            port: 7000 + i as u16,
            shards: 1,
            host: format!("h{i}"),
            capacity_bytes: 1 << 30,
            config: String::new(),
            lease_timing: None,
        };
        s.boot(id, &boot).unwrap();
    }
    s.create_pool(&CreatePoolRequest {
        name: "p".into(),
        pg_count,
        size,
        failure_domain: FailureDomain::Osd,
    })
    .unwrap();
    s.finish(&MonState::default());
    s
}

/// Every key under `/fb/` with its value and mod revision.
#[allow(dead_code)] // not every test file that shares this module reads keys
pub async fn all_keys(
    client: &mut etcd_client::Client,
) -> std::collections::BTreeMap<String, (String, i64)> {
    let resp = client
        .get("/fb/", Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .unwrap();
    resp.kvs()
        .iter()
        .map(|kv| {
            (
                kv.key_str().unwrap().to_string(),
                (kv.value_str().unwrap().to_string(), kv.mod_revision()),
            )
        })
        .collect()
}

/// Leadership as the store's commits check it: a leader key put now, its create revision.
#[allow(dead_code)]
pub async fn fence(client: &mut etcd_client::Client) -> fastblock_mon::store::Fence {
    let put = client.put("/fb/mon/leader", "{}", None).await.unwrap();
    fastblock_mon::store::Fence {
        leader_create_revision: put.header().unwrap().revision(),
    }
}

//! A real etcd for the store's tests: one member on free loopback ports, in a directory of
//! its own, killed and removed when dropped.

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

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A one-member etcd on free loopback ports, in a directory of its own.
pub async fn etcd() -> (Etcd, etcd_client::Client) {
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

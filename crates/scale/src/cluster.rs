//! One real monitor (`fastblock-mon`, auth mode `sign`) with the etcd member it runs as its
//! child, in a temporary directory, started as the test harness does
//! (`crates/fastblock/tests/common/mod.rs`, `MonCluster::start`): free loopback ports, the
//! monitor's own secret file and the admin keyring it writes at its first tick.
//!
//! Dropping a [`MonProcess`] kills the monitor by its PID (its etcd member dies with it: the
//! monitor starts it with `PR_SET_PDEATHSIG`) and removes the directory unless kept.

use crate::error::{Result, ScaleError};
use crate::http::http_get;
use crate::procstat;
use fastblock_auth::{EntityName, Secret};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Settings of the monitor the harness starts.
#[derive(Clone, Debug)]
pub struct MonSettings {
    pub bin: PathBuf,
    pub osd_down_after: Duration,
    pub osd_out_after: Duration,
    pub max_pg_per_osd: u32,
    pub keep_dir: bool,
    /// The monitor's `RUST_LOG`.
    pub log_filter: String,
}

pub struct MonProcess {
    child: Option<Child>,
    settings: MonSettings,
    dir: PathBuf,
    keep_dir: bool,
    etcd_client: String,
    etcd_peer: String,
    /// The monitor's API address (`127.0.0.1:port`).
    pub api: String,
    /// client.admin's key, from the keyring the monitor wrote.
    pub admin_key: Secret,
}

impl MonProcess {
    /// Starts the monitor and waits (up to `wait`) until it leads and has written the keyring.
    pub async fn start(settings: &MonSettings, wait: Duration) -> Result<MonProcess> {
        let dir = std::env::temp_dir().join(format!(
            "fastblock-scale-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir).map_err(|e| ScaleError::io(format!("mkdir {dir:?}"), e))?;
        let ports = free_ports(3)?;
        let mut mon = MonProcess {
            child: None,
            settings: settings.clone(),
            dir,
            keep_dir: settings.keep_dir,
            api: format!("127.0.0.1:{}", ports[0]),
            etcd_client: format!("127.0.0.1:{}", ports[1]),
            etcd_peer: format!("127.0.0.1:{}", ports[2]),
            // Replaced below before `start` returns; the struct exists first so that a failed
            // wait drops it and kills the monitor.
            admin_key: Secret::from_bytes([0; 32]),
        };
        mon.spawn()?;
        mon.admin_key = mon.wait_ready(wait).await?;
        Ok(mon)
    }

    /// Starts the monitor process (on the same directory and addresses each time), its
    /// output appended to `mon.log`.
    fn spawn(&mut self) -> Result<()> {
        let (settings, dir) = (&self.settings, &self.dir);
        let log_path = dir.join("mon.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| ScaleError::io(format!("opening {log_path:?}"), e))?;
        let log2 = log
            .try_clone()
            .map_err(|e| ScaleError::io("duplicating the log handle", e))?;
        let mut cmd = Command::new(&settings.bin);
        cmd.arg("--name")
            .arg("a")
            .arg("--data-dir")
            .arg(dir.join("a"))
            .arg("--api-addr")
            .arg(&self.api)
            .arg("--etcd-client-addr")
            .arg(&self.etcd_client)
            .arg("--etcd-peer-addr")
            .arg(&self.etcd_peer)
            .arg("--initial-cluster")
            .arg(format!("a=http://{}", self.etcd_peer))
            .arg("--osd-down-after")
            .arg(format!("{}ms", settings.osd_down_after.as_millis()))
            .arg("--osd-out-after")
            .arg(format!("{}ms", settings.osd_out_after.as_millis()))
            .arg("--max-pg-per-osd")
            .arg(settings.max_pg_per_osd.to_string())
            .arg("--auth-mode")
            .arg("sign")
            .arg("--keyring")
            .arg(dir.join("keyring"))
            .env("FASTBLOCK_RUN_DIR", dir.join("run"))
            .env("RUST_LOG", &settings.log_filter)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2);
        let child = cmd.spawn().map_err(|e| {
            ScaleError::io(
                format!(
                    "starting {} (build it: cargo build --release -p fastblock --bin fastblock-mon; \
                     or pass --mon-bin)",
                    settings.bin.display()
                ),
                e,
            )
        })?;
        self.child = Some(child);
        Ok(())
    }

    /// SIGKILLs the monitor (by its PID; its etcd member dies with it), waits until that
    /// member is gone (its addresses are reused), and starts the monitor again on the same
    /// data. Returns once it leads again, with the time from the kill.
    pub async fn kill_and_restart(&mut self, wait: Duration) -> Result<Duration> {
        let etcd = self
            .pid()
            .and_then(|p| procstat::children(p).into_iter().next());
        let killed = tokio::time::Instant::now();
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(pid) = etcd {
            let deadline = killed + wait;
            while procstat::alive(pid) {
                if tokio::time::Instant::now() >= deadline {
                    return Err(ScaleError::MonStart(format!(
                        "the etcd member (pid {pid}) still runs {wait:?} after its monitor was killed"
                    )));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        self.spawn()?;
        self.wait_ready(wait.saturating_sub(killed.elapsed()))
            .await?;
        Ok(killed.elapsed())
    }

    async fn wait_ready(&mut self, wait: Duration) -> Result<Secret> {
        let keyring = self.dir.join("keyring");
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(ScaleError::MonStart(format!(
                        "the monitor exited ({status}); its log: {}",
                        self.log_tail()
                    )));
                }
            }
            let url = format!("http://{}/v1/mon", self.api);
            let leads = matches!(
                tokio::time::timeout(Duration::from_secs(1), http_get(&url)).await,
                Ok(Ok(body)) if body.contains("\"role\":\"leader\"")
            );
            if leads && keyring.exists() {
                if let Ok(ring) = fastblock_auth::Keyring::load(&keyring) {
                    if let Some(e) = ring.get(&EntityName::admin()) {
                        return Ok(e.key.clone());
                    }
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(ScaleError::MonStart(format!(
                    "no leader with an admin keyring at {} within {wait:?}; its log: {}",
                    keyring.display(),
                    self.log_tail()
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The last lines of the monitor's log (for error messages).
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("mon.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for MonProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // By PID (std's Child::kill is SIGKILL to this child only), then reaped.
            let _ = child.kill();
            let _ = child.wait();
        }
        if self.keep_dir {
            eprintln!(
                "fastblock-scale: the monitor's directory is kept at {}",
                self.dir.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// `n` distinct loopback ports free now (bound, then released: the monitor binds them a moment
/// later), below the kernel's ephemeral range: the simulated daemons hold thousands of
/// connections, each on an ephemeral local port, and one of them took the etcd member's peer
/// port while the monitor was down in the `mon restart` scenario (its member then failed to
/// bind it).
fn free_ports(n: usize) -> Result<Vec<u16>> {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    const FIRST: u16 = 10_000;
    let mut held = Vec::new();
    if low > FIRST {
        // Start at a point that differs between runs, so that runs side by side rarely try
        // the same ports first.
        let span = u32::from(low - FIRST);
        let start = std::process::id().wrapping_mul(7919) % span;
        for i in 0..span {
            if held.len() == n {
                break;
            }
            let port = FIRST + ((start + i) % span) as u16;
            if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) {
                held.push(l);
            }
        }
    }
    while held.len() < n {
        held.push(
            std::net::TcpListener::bind("127.0.0.1:0")
                .map_err(|e| ScaleError::io("finding a free port", e))?,
        );
    }
    held.iter()
        .map(|l| {
            l.local_addr()
                .map(|a| a.port())
                .map_err(|e| ScaleError::io("finding a free port", e))
        })
        .collect()
}

/// The monitor binary: the one given, else `fastblock-mon` beside the running executable (the
/// same cargo target directory), else the name, for PATH.
pub fn find_mon_bin(given: Option<&Path>) -> PathBuf {
    if let Some(p) = given {
        return p.to_path_buf();
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            let beside = dir.join("fastblock-mon");
            if beside.exists() {
                return beside;
            }
        }
    }
    PathBuf::from("fastblock-mon")
}

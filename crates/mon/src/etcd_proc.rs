//! Runs and supervises the monitor's own etcd member.
//!
//! The member's data lives under the monitor's data dir. The child gets `PR_SET_PDEATHSIG` so
//! that it dies with the monitor even when the monitor is SIGKILLed (forked from the thread
//! `crate::child_anchor` keeps for the monitor's lifetime, since the signal follows the
//! forking thread); on a clean shutdown the
//! monitor stops it with SIGTERM and waits. If etcd exits on its own, the supervisor restarts it
//! with a backoff (and health counts it, `MON_TASK_FAILED: etcd member ...`): the monitor keeps
//! answering (with `unavailable`) meanwhile. If etcd cannot be started at all, if another
//! process holds one of the member's addresses (`crate::etcd_identity`), or if the member
//! keeps exiting, the monitor exits (`crate::supervise`, policy `ExitDaemon`).

use crate::etcd_identity::address_held;
use crate::supervise::Misconfiguration;
use anyhow::{bail, Context};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;
use tokio::process::{Child, Command};
use tokio::sync::watch;

/// Raft entries between two snapshots of the own member (its `--snapshot-count`).
pub const ETCD_SNAPSHOT_ENTRIES: u64 = 10_000;

#[derive(Clone, Debug)]
pub struct EtcdMemberConfig {
    pub binary: String,
    pub name: String,
    pub data_dir: PathBuf,
    /// `ip:port` the member serves clients on.
    pub client_addr: String,
    /// `ip:port` the member talks to its peers on.
    pub peer_addr: String,
    /// etcd's `--initial-cluster`: `name=http://ip:port,...`, the same on every monitor.
    pub initial_cluster: String,
    pub cluster_token: String,
    /// etcd's `--quota-backend-bytes`: past it the member raises `NOSPACE` and refuses writes
    /// (`--etcd-quota-bytes`; `crate::etcd_maint` keeps the database well below it).
    pub quota_bytes: u64,
    /// The peer links' TLS files (`crate::etcd_tls`): `None` runs them in clear (a member
    /// created before peer TLS).
    pub peer_tls: Option<crate::etcd_tls::PeerTlsFiles>,
}

/// The member names of an etcd `--initial-cluster` value (`name=http://ip:port,...`).
pub fn member_names(initial_cluster: &str) -> Vec<String> {
    initial_cluster
        .split(',')
        .filter_map(|m| m.split_once('=').map(|(name, _)| name.trim().to_string()))
        .filter(|name| !name.is_empty())
        .collect()
}

impl EtcdMemberConfig {
    pub fn client_url(&self) -> String {
        format!("http://{}", self.client_addr)
    }

    /// The peer URL the member advertises (and is listed with in etcd's member list).
    pub fn peer_url(&self) -> String {
        format!("{}://{}", self.peer_scheme(), self.peer_addr)
    }

    fn peer_scheme(&self) -> &'static str {
        if self.peer_tls.is_some() {
            "https"
        } else {
            "http"
        }
    }

    /// The host part of the peer address (what its certificate names).
    pub fn peer_host(&self) -> String {
        match self.peer_addr.rsplit_once(':') {
            Some((host, _)) => host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
            None => self.peer_addr.clone(),
        }
    }

    /// `--initial-cluster` as etcd gets it: the operator writes every member's peer URL with
    /// `http://`; with peer TLS every monitor turns them into `https://` the same way.
    fn initial_cluster_arg(&self) -> String {
        if self.peer_tls.is_none() {
            return self.initial_cluster.clone();
        }
        self.initial_cluster
            .split(',')
            .map(|m| m.trim().replacen("=http://", "=https://", 1))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(&self.binary);
        let peer_url = self.peer_url();
        // A member that already has data rejoins its cluster; "new" only bootstraps.
        let state = if self.data_dir.join("member").exists() {
            "existing"
        } else {
            "new"
        };
        cmd.arg("--name")
            .arg(&self.name)
            .arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--listen-client-urls")
            .arg(self.client_url())
            .arg("--advertise-client-urls")
            .arg(self.client_url())
            .arg("--listen-peer-urls")
            .arg(&peer_url)
            .arg("--initial-advertise-peer-urls")
            .arg(&peer_url)
            .arg("--initial-cluster")
            .arg(self.initial_cluster_arg())
            .arg("--initial-cluster-state")
            .arg(state)
            .arg("--initial-cluster-token")
            .arg(&self.cluster_token)
            // Pool deletes and remaps change many keys in one transaction.
            .arg("--max-txn-ops")
            .arg(crate::txn_limits::OWN_MEMBER_MAX_TXN_OPS.to_string())
            .arg("--quota-backend-bytes")
            .arg(self.quota_bytes.to_string())
            // etcd keeps its Raft log in memory from one snapshot to the next, every entry
            // whole: 3.4's default of 100,000 entries grew the member to 19 GiB and got it
            // OOM-killed at 131,072 PGs (`docs/scale.md`), where commits write megabytes of PG
            // chunks. 10,000 is 3.5's default; 5,000 more stay after each snapshot.
            .arg("--snapshot-count")
            .arg(ETCD_SNAPSHOT_ENTRIES.to_string())
            // Elections within a second or two on a quiet loopback cluster.
            .arg("--heartbeat-interval")
            .arg("100")
            .arg("--election-timeout")
            .arg("1000")
            .arg("--logger")
            .arg("zap")
            .arg("--log-outputs")
            .arg("stderr")
            .arg("--log-level")
            .arg("warn")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        if let Some(tls) = &self.peer_tls {
            // Both ends of every peer link show a certificate of the monitors' CA.
            cmd.arg("--peer-cert-file")
                .arg(tls.cert())
                .arg("--peer-key-file")
                .arg(tls.key())
                .arg("--peer-trusted-ca-file")
                .arg(tls.ca())
                .arg("--peer-client-cert-auth");
        }
        crate::child_anchor::dies_with_its_forking_thread(&mut cmd);
        cmd
    }

    /// Starts the member from the anchor thread (`crate::child_anchor`): its
    /// `PR_SET_PDEATHSIG` must not fire while the monitor runs.
    async fn spawn(&self) -> anyhow::Result<Child> {
        std::fs::create_dir_all(&self.data_dir)
            .with_context(|| format!("creating etcd data dir {}", self.data_dir.display()))?;
        let log_path = self.data_dir.with_extension("log");
        rotate_log(&log_path, ETCD_LOG_ROTATE_BYTES);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("opening etcd log {}", log_path.display()))?;
        let mut cmd = self.command();
        cmd.stdout(log.try_clone()?).stderr(log);
        let child = crate::child_anchor::spawn(cmd).await.with_context(|| {
            format!(
                "starting etcd ({}); install it with scripts/install-deps.sh",
                self.binary
            )
        })?;
        tracing::info!(pid = child.id(), client = %self.client_url(), "etcd member started");
        Ok(child)
    }
}

/// A member run that lasted this long was not a crash loop: the count of quick exits starts
/// over.
pub const MEMBER_STABLE_AFTER: Duration = Duration::from_secs(60);
/// After this many exits in a row, each within [`MEMBER_STABLE_AFTER`] of its start, the
/// supervisor gives up (the monitor exits, status 1): a member that cannot stay up is for the
/// operator to look at (its log is `<data dir>/etcd.log`), not something to retry unseen.
pub const MEMBER_QUICK_EXITS_MAX: u32 = 10;

/// Starts the member and supervises it until `shutdown` turns true, then stops it. Every exit
/// of the member is told to `on_exit` (for health) before it is restarted. An error is for the
/// caller to act on, the monitor cannot work without its member: etcd cannot be started at
/// all, another process holds one of the member's addresses (a
/// [`crate::supervise::Misconfiguration`]), or the member keeps exiting
/// ([`MEMBER_QUICK_EXITS_MAX`]).
pub async fn supervise(
    config: EtcdMemberConfig,
    mut shutdown: watch::Receiver<bool>,
    on_exit: impl Fn(&str) + Send,
) -> anyhow::Result<()> {
    let mut child = config.spawn().await?;
    let mut started = tokio::time::Instant::now();
    let mut restarts: u32 = 0;
    let mut quick_exits: u32 = 0;
    loop {
        tokio::select! {
            status = child.wait() => {
                let status = status.context("waiting for etcd")?;
                if *shutdown.borrow() {
                    return Ok(());
                }
                // The member is gone, so whoever listens on its addresses now is not ours:
                // restarting it would only fail to bind again, while the monitor's client
                // talks to the other etcd.
                let exit = status.to_string();
                if let Some(held) = address_held(&config, &exit).await {
                    on_exit(&held.to_string());
                    return Err(Misconfiguration::new(held).into());
                }
                quick_exits = if started.elapsed() < MEMBER_STABLE_AFTER {
                    quick_exits + 1
                } else {
                    1
                };
                let log = config.data_dir.with_extension("log");
                if quick_exits >= MEMBER_QUICK_EXITS_MAX {
                    on_exit(&format!("exited ({status}), giving up"));
                    bail!(
                        "the etcd member exited {quick_exits} times in a row, each within \
                         {MEMBER_STABLE_AFTER:?} of its start (last: {status}); see its log {}",
                        log.display()
                    );
                }
                restarts += 1;
                let backoff = Duration::from_millis(200 * u64::from(restarts.min(25)));
                tracing::error!(
                    %status, restarts, quick_exits, ?backoff, log = %log.display(),
                    "etcd member exited; restarting"
                );
                on_exit(&format!("exited ({status}), restarted"));
                tokio::time::sleep(backoff).await;
                child = config.spawn().await?;
                started = tokio::time::Instant::now();
            }
            _ = shutdown.changed() => {
                if *shutdown.borrow() {
                    stop(&mut child).await;
                    return Ok(());
                }
            }
        }
    }
}

async fn stop(child: &mut Child) {
    if let Some(pid) = child.id() {
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGTERM);
        }
    }
    match tokio::time::timeout(Duration::from_secs(5), child.wait()).await {
        Ok(_) => tracing::info!("etcd member stopped"),
        Err(_) => {
            tracing::warn!("etcd did not stop within 5 s; killing it");
            let _ = child.kill().await;
        }
    }
}

/// The member's log (etcd writes it at `warn`, so it grows slowly) is kept below about this
/// size: at each start of the member a log past it becomes `<log>.1`, replacing the previous
/// one, so a monitor that runs for years never fills its disk with etcd's log.
pub const ETCD_LOG_ROTATE_BYTES: u64 = 64 << 20;

/// Moves `path` to `path.1` if it holds `limit_bytes` or more; a failure only warns (the
/// member still starts, appending to the old log).
fn rotate_log(path: &std::path::Path, limit_bytes: u64) {
    let big = std::fs::metadata(path).is_ok_and(|m| m.len() >= limit_bytes);
    if !big {
        return;
    }
    let mut old = path.as_os_str().to_owned();
    old.push(".1");
    if let Err(e) = std::fs::rename(path, &old) {
        tracing::warn!(log = %path.display(), error = %e, "could not rotate the etcd member's log");
    }
}

#[cfg(test)]
mod tests {
    use super::rotate_log;

    #[test]
    fn a_log_past_its_limit_becomes_the_previous_one() {
        let dir = std::env::temp_dir().join(format!("etcd-log-rotate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("etcd.log");
        let old = dir.join("etcd.log.1");
        std::fs::write(&old, b"older").unwrap();
        std::fs::write(&log, b"small").unwrap();
        rotate_log(&log, 6);
        assert_eq!(
            std::fs::read(&log).unwrap(),
            b"small",
            "below the limit: kept"
        );
        std::fs::write(&log, b"larger").unwrap();
        rotate_log(&log, 6);
        assert!(!log.exists(), "rotated away");
        assert_eq!(
            std::fs::read(&old).unwrap(),
            b"larger",
            "the previous one replaced"
        );
        rotate_log(&log, 6);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

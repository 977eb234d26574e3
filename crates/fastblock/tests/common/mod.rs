//! Harness for end-to-end tests on real processes: free loopback ports, temporary
//! directories, child processes killed by PID on drop, monitors with their own etcd, the CLI,
//! and a fake OSD that registers and heartbeats through the real API.
//!
//! Every wait is bounded (`wait_until`), every child is killed by its PID (never by name), and
//! every directory is removed unless `FASTBLOCK_KEEP_TEST_DIRS` is set.

#![allow(dead_code)]

pub mod browser;
pub mod data_file;
pub mod faults;
pub mod model;
pub mod netns;

use fastblock_monclient::MonClient;
use fastblock_types::api::{BootRequest, CreateImageRequest, CreatePoolRequest, HeartbeatRequest};
use fastblock_types::map::{FailureDomain, PoolInfo};
use fastblock_types::OsdId;
use std::future::Future;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A port nobody listens on right now, for a daemon to bind.
pub fn free_port() -> u16 {
    free_ports(1)
}

/// The lowest port handed out by [`free_ports`].
const TEST_PORT_LOW: u16 = 20_000;

/// The first of `n` consecutive ports nobody listens on right now. They are taken from below
/// the kernel's ephemeral range (`ip_local_port_range`), never from it: every outgoing
/// connection of the suite (clients, etcd's gRPC, the daemons' peers) takes its local port
/// from that range, and one could take a port handed out here before its daemon binds it
/// (etcd takes a second to start) or while an OSD restarts on it: the likely cause of CI runs
/// where one monitor never saw a leader (its etcd member could not bind). Ports are drawn at
/// random so that tests running at the same time in other processes rarely draw the same
/// one, and a port handed out once is not handed out again by this process.
pub fn free_ports(n: u16) -> u16 {
    use std::collections::BTreeSet;
    use std::sync::Mutex;
    static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let high = ephemeral_low_port().max(TEST_PORT_LOW + 1_000);
    let span = u128::from(high - TEST_PORT_LOW - n);
    let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
    for _ in 0..10_000 {
        let first = TEST_PORT_LOW + (uuid::Uuid::new_v4().as_u128() % span) as u16;
        let ports = first..first + n;
        if ports.clone().any(|p| given.contains(&p)) {
            continue;
        }
        if ports
            .clone()
            .all(|p| TcpListener::bind(("127.0.0.1", p)).is_ok())
        {
            given.extend(ports);
            return first;
        }
    }
    panic!("no {n} free consecutive ports between {TEST_PORT_LOW} and {high}");
}

/// The first port of the kernel's ephemeral range (32768 if it cannot be read).
fn ephemeral_low_port() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// A directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "fastblock-{tag}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("creating a test directory");
        TempDir(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::env::var_os("FASTBLOCK_KEEP_TEST_DIRS").is_none() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A child process killed (SIGKILL, by PID) and reaped on drop.
pub struct Proc {
    pub child: Option<Child>,
    pub name: String,
    pub log: PathBuf,
}

impl Proc {
    pub fn spawn(name: &str, mut cmd: Command, log: PathBuf) -> Proc {
        let file = std::fs::File::create(&log).expect("creating a log file");
        cmd.stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        Proc {
            child: Some(child),
            name: name.to_string(),
            log,
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    fn signal(&mut self, sig: libc::c_int) {
        if let Some(child) = &self.child {
            // SAFETY: kill(2) on the PID of a child we spawned and have not reaped yet.
            unsafe {
                libc::kill(child.id() as libc::pid_t, sig);
            }
        }
    }

    /// SIGSTOP: the process stays, frozen (its sockets open, its timers stopped), until
    /// [`Proc::resume`]. On drop it is killed as usual (SIGKILL ends a stopped process).
    pub fn pause(&mut self) {
        self.signal(libc::SIGSTOP);
    }

    /// SIGCONT after [`Proc::pause`].
    pub fn resume(&mut self) {
        self.signal(libc::SIGCONT);
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        self.signal(libc::SIGKILL);
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
    }

    /// Waits up to `timeout` for the process to exit by itself and reaps it: its status, or
    /// `None` if it still runs (it is then left running, to be killed on drop).
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            let child = self.child.as_mut()?;
            if let Some(status) = child.try_wait().expect("try_wait") {
                // Reaped: its PID may be reused, so it must never be signalled again.
                self.child = None;
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM, then wait up to `timeout` for a clean exit; returns whether it exited in time.
    pub fn terminate(&mut self, timeout: Duration) -> bool {
        self.signal(libc::SIGTERM);
        let deadline = Instant::now() + timeout;
        while let Some(child) = self.child.as_mut() {
            if let Ok(Some(_)) = child.try_wait() {
                self.child = None;
                return true;
            }
            if Instant::now() > deadline {
                self.kill();
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        true
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Free data bytes of every OSD (one shard each), counting what their next flush gives
/// back (blocks replaced by overwrites or deleted are freed only at a flush).
pub async fn free_bytes(osds: &[OsdProc]) -> Vec<u64> {
    let mut out = Vec::new();
    for osd in osds {
        let mut conn = WireConn::connect(&format!("127.0.0.1:{}", osd.port)).await;
        match conn.call(&fastblock_wire::Request::ShardSpace).await {
            fastblock_wire::Reply::Space {
                free_bytes,
                pending_free_bytes,
            } => out.push(free_bytes + pending_free_bytes),
            other => panic!("ShardSpace answered {other:?}"),
        }
    }
    out
}

/// Polls `cond` until it returns `Some`, or panics with `what` after `timeout`.
pub async fn wait_until<T, F, Fut>(timeout: Duration, what: &str, mut cond: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = cond().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The log filter of the OSDs the tests start: `info`, or `FASTBLOCK_TEST_OSD_LOG` to chase a
/// failure (`info,fastblock_io=debug` adds every applied write and served read,
/// docs/testing.md).
pub fn osd_log_filter() -> String {
    std::env::var("FASTBLOCK_TEST_OSD_LOG").unwrap_or_else(|_| "info".to_string())
}

pub fn bin(name: &str) -> PathBuf {
    match name {
        "fastblock-mon" => PathBuf::from(env!("CARGO_BIN_EXE_fastblock-mon")),
        "fastblock-client" => PathBuf::from(env!("CARGO_BIN_EXE_fastblock-client")),
        "fastblock-osd" => PathBuf::from(env!("CARGO_BIN_EXE_fastblock-osd")),
        "fastblock-nbd" => PathBuf::from(env!("CARGO_BIN_EXE_fastblock-nbd")),
        other => panic!("unknown binary {other}"),
    }
}

/// Ports and names of one monitor.
#[derive(Clone, Debug)]
pub struct MonSpec {
    pub name: String,
    pub api: String,
    pub etcd_client: String,
    pub etcd_peer: String,
}

/// Timers for monitors under test.
#[derive(Clone, Debug)]
pub struct MonOptions {
    pub osd_down_after: &'static str,
    pub osd_out_after: &'static str,
    pub lease_ttl: &'static str,
    /// `--auth-mode` of the cluster the monitors create (`none`, `sign`, `secure`).
    pub auth_mode: &'static str,
    /// `--snap-create-timeout-ms`.
    pub snap_create_timeout_ms: u64,
    /// More flags for every monitor (`--etcd-quota-bytes 1MiB`, say).
    pub extra_args: Vec<String>,
}

impl Default for MonOptions {
    fn default() -> Self {
        MonOptions {
            osd_down_after: "2s",
            osd_out_after: "3s",
            lease_ttl: "3s",
            auth_mode: "sign",
            snap_create_timeout_ms: 30_000,
            extra_args: Vec::new(),
        }
    }
}

/// One or more monitors, each with its own etcd member, forming one etcd cluster.
pub struct MonCluster {
    pub dir: TempDir,
    pub specs: Vec<MonSpec>,
    pub procs: Vec<Option<Proc>>,
    pub options: MonOptions,
}

impl MonCluster {
    pub async fn start(n: usize, options: MonOptions) -> MonCluster {
        MonCluster::start_at(n, options, "127.0.0.1").await
    }

    /// Like [`MonCluster::start`], with the monitors' API listening on `ip` (say, the bridge
    /// address of a `netns::NetCluster`, which its OSDs reach). Their etcd members stay on
    /// loopback: a monitor refuses to expose its own etcd, which holds the key table.
    pub async fn start_at(n: usize, options: MonOptions, ip: &str) -> MonCluster {
        let dir = TempDir::new("mon");
        let names = ["a", "b", "c", "d", "e"];
        let specs: Vec<MonSpec> = (0..n)
            .map(|i| MonSpec {
                name: names[i].to_string(),
                api: format!("{ip}:{}", free_port()),
                etcd_client: format!("127.0.0.1:{}", free_port()),
                etcd_peer: format!("127.0.0.1:{}", free_port()),
            })
            .collect();
        let mut cluster = MonCluster {
            dir,
            specs,
            procs: Vec::new(),
            options,
        };
        if n > 1 {
            // Several monitors share one secret, as an operator copies the first one's: none
            // of them may make its own.
            cluster.write_mon_secret();
        }
        for i in 0..n {
            let p = cluster.spawn(i);
            cluster.procs.push(Some(p));
        }
        cluster.wait_leader(Duration::from_secs(60)).await;
        if cluster.options.auth_mode != "none" {
            // The leader sets up auth (and writes client.admin's key) at its first tick.
            let keyring = cluster.keyring();
            wait_until(Duration::from_secs(30), "the admin keyring", || {
                let exists = keyring.exists();
                async move { exists.then_some(()) }
            })
            .await;
            let key = fastblock_auth::Keyring::load(&keyring)
                .expect("the admin keyring")
                .entries[&fastblock_auth::EntityName::admin()]
                .key
                .clone();
            let mode: fastblock_auth::AuthMode = cluster
                .options
                .auth_mode
                .parse()
                .expect("a valid auth mode");
            *TEST_AUTH.lock().unwrap() = Some(TestAuth {
                credentials: (fastblock_auth::EntityName::admin(), key),
                mode,
                monitors: cluster.endpoints(),
            });
        } else {
            *TEST_AUTH.lock().unwrap() = None;
        }
        cluster
    }

    /// A block-client configuration signing as client.admin.
    pub fn client_config(&self) -> fastblock_client::ClientConfig {
        fastblock_client::ClientConfig {
            keyring: Some(self.keyring()).filter(|p| p.exists()),
            ..fastblock_client::ClientConfig::new(self.endpoints())
        }
    }

    /// The keyring the monitors write client.admin's key to (every helper signs with it).
    pub fn keyring(&self) -> PathBuf {
        self.dir.path().join("keyring")
    }

    /// `client` signing as client.admin with the cluster's keyring (unsigned if it has none:
    /// auth mode `none`).
    pub fn signed(&self, client: MonClient) -> MonClient {
        self.signed_as(client, "client.admin")
    }

    /// `client` signing as `entity` with its key from the cluster's keyring.
    pub fn signed_as(&self, client: MonClient, entity: &str) -> MonClient {
        let path = self.keyring();
        if !path.exists() {
            return client;
        }
        let ring = fastblock_auth::Keyring::load(&path).expect("loading the test keyring");
        let entity: fastblock_auth::EntityName = entity.parse().expect("entity name");
        match ring.get(&entity) {
            Some(e) => client
                .with_credentials(entity, e.key.clone())
                .with_auth_floor(self.auth_floor()),
            None => client,
        }
    }

    /// The auth floor of this cluster's clients: lowered to `none` on purpose for a cluster
    /// created in mode `none` (its keyring is for later), the default otherwise.
    pub fn auth_floor(&self) -> Option<fastblock_auth::AuthMode> {
        (self.options.auth_mode == "none").then_some(fastblock_auth::AuthMode::None)
    }

    /// The monitors' `--mon-secret-file`, one file for all of them (a lone monitor makes it
    /// at its first start).
    pub fn mon_secret(&self) -> PathBuf {
        self.dir.path().join("mon.secret")
    }

    /// Writes a fresh monitor secret (32 random bytes, mode 0600) at `path`.
    pub fn write_secret_file(path: &Path) {
        use std::os::unix::fs::OpenOptionsExt;
        let bytes = *fastblock_auth::Secret::generate()
            .expect("random bytes")
            .as_bytes();
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .expect("creating a monitor secret");
        std::io::Write::write_all(&mut f, &bytes).expect("writing a monitor secret");
    }

    fn write_mon_secret(&self) {
        MonCluster::write_secret_file(&self.mon_secret());
    }

    /// `etcdctl` against monitor `i`'s etcd member, logged in as its `root` user with the
    /// password derived from the monitors' secret (`fastblock_mon::secret`).
    pub fn etcdctl(&self, i: usize) -> Command {
        let password = fastblock_mon::secret::etcd_root_password(&self.mon_secret())
            .expect("the monitors' secret");
        let mut cmd = Command::new("etcdctl");
        cmd.arg("--endpoints")
            .arg(&self.specs[i].etcd_client)
            .arg("--user")
            .arg(format!("root:{password}"))
            .env("ETCDCTL_API", "3");
        cmd
    }

    pub fn initial_cluster(&self) -> String {
        self.specs
            .iter()
            .map(|s| format!("{}=http://{}", s.name, s.etcd_peer))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn spawn(&self, i: usize) -> Proc {
        let s = &self.specs[i];
        let mut cmd = Command::new(bin("fastblock-mon"));
        cmd.arg("--name")
            .arg(&s.name)
            .arg("--data-dir")
            .arg(self.dir.path().join(&s.name))
            .arg("--api-addr")
            .arg(&s.api)
            .arg("--etcd-client-addr")
            .arg(&s.etcd_client)
            .arg("--etcd-peer-addr")
            .arg(&s.etcd_peer)
            .arg("--initial-cluster")
            .arg(self.initial_cluster())
            .arg("--osd-down-after")
            .arg(self.options.osd_down_after)
            .arg("--osd-out-after")
            .arg(self.options.osd_out_after)
            .arg("--tick-interval")
            .arg("200ms")
            .arg("--lease-ttl")
            .arg(self.options.lease_ttl)
            .arg("--auth-mode")
            .arg(self.options.auth_mode)
            .arg("--keyring")
            .arg(self.keyring())
            .arg("--snap-create-timeout-ms")
            .arg(self.options.snap_create_timeout_ms.to_string())
            .arg("--mon-secret-file")
            .arg(self.mon_secret())
            .args(&self.options.extra_args)
            .env("FASTBLOCK_RUN_DIR", self.run_dir())
            .env("RUST_LOG", "info");
        let log = self.dir.path().join(format!("mon-{}.log", s.name));
        Proc::spawn(&format!("mon.{}", s.name), cmd, log)
    }

    /// The monitors' `--run-dir` (their admin sockets `mon.NAME.asok`).
    pub fn run_dir(&self) -> PathBuf {
        self.dir.path().join("run")
    }

    /// Restarts monitor `i` (after `kill` or `stop`).
    pub fn restart(&mut self, i: usize) {
        let p = self.spawn(i);
        self.procs[i] = Some(p);
    }

    pub fn kill(&mut self, i: usize) {
        if let Some(mut p) = self.procs[i].take() {
            p.kill();
        }
    }

    pub fn stop(&mut self, i: usize) -> bool {
        match self.procs[i].take() {
            Some(mut p) => p.terminate(Duration::from_secs(20)),
            None => true,
        }
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.specs.iter().map(|s| s.api.clone()).collect()
    }

    /// A client that fails over between all monitors.
    pub fn client(&self) -> MonClient {
        self.signed(MonClient::new(self.endpoints()).with_deadline(Duration::from_secs(30)))
    }

    /// Index of the monitor that says it leads.
    pub async fn leader_index(&self) -> Option<usize> {
        for (i, s) in self.specs.iter().enumerate() {
            if self.procs[i].is_none() {
                continue;
            }
            let url = format!("http://{}/v1/mon", s.api);
            if let Ok(Ok(body)) = tokio::time::timeout(Duration::from_secs(1), http_get(&url)).await
            {
                if body.contains("\"role\":\"leader\"") {
                    return Some(i);
                }
            }
        }
        None
    }

    pub async fn wait_leader(&self, timeout: Duration) -> usize {
        let logs: Vec<String> = self.procs.iter().flatten().map(|p| p.log_tail()).collect();
        let found = tokio::time::timeout(timeout, async {
            loop {
                if let Some(i) = self.leader_index().await {
                    return i;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
        match found {
            Ok(i) => i,
            Err(_) => panic!(
                "no monitor leader within {timeout:?}; logs:\n{}",
                logs.join("\n---\n")
            ),
        }
    }

    /// Runs `fastblock-client ARGS` against these monitors.
    pub fn cli(&self, args: &[&str]) -> CliOutput {
        let out = Command::new(bin("fastblock-client"))
            .args(args)
            .env("FASTBLOCK_MON", self.endpoints().join(","))
            .env("FASTBLOCK_KEYRING", self.keyring())
            .output()
            .expect("running fastblock-client");
        CliOutput::from(out)
    }

    /// A keyring at `dir/nbd.keyring` holding `client.nbd`, the NBD server's own key, with
    /// `caps` (`pool=*`, `pool=NAME`): what `fastblock-nbd` acts as by default.
    pub fn nbd_keyring(&self, dir: &Path, caps: &str) -> PathBuf {
        let path = dir.join("nbd.keyring");
        let path_text = path.display().to_string();
        let out = self.cli(&[
            "auth",
            "get-or-create",
            "client.nbd",
            "--caps",
            caps,
            "-o",
            &path_text,
        ]);
        assert_eq!(out.code, 0, "creating client.nbd: {}", out.stderr);
        path
    }
}

/// The leading monitor's incarnation, as the answer to an open call to the monitor at `addr`
/// names it (`x-fastblock-incarnation`): what a signed call must be signed for.
///
/// A monitor that does not know the leader yet (a follower just after an election: it learns
/// the leader key within a moment) answers `no_leader` without one: asked again, for up to
/// 30 s.
pub async fn mon_incarnation(addr: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answer = http_get(&format!("http://{addr}/v1/health"))
            .await
            .expect("GET /v1/health");
        if let Some(inc) = answer
            .lines()
            .find_map(|l| l.strip_prefix("x-fastblock-incarnation: "))
        {
            return inc.trim().to_string();
        }
        assert!(
            answer.contains("\"no_leader\"") && Instant::now() < deadline,
            "no incarnation in {answer}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Minimal HTTP GET over a raw socket (the harness must not depend on the code under test).
pub async fn http_get(url: &str) -> std::io::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://").expect("http url");
    let (host, path) = rest
        .split_once('/')
        .map(|(h, p)| (h, format!("/{p}")))
        .unwrap_or((rest, "/".into()));
    let mut s = tokio::net::TcpStream::connect(host).await?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await?;
    Ok(String::from_utf8_lossy(&buf).to_string())
}

/// `fastblock-client config ARGS --run-dir RUN_DIR`: a daemon's runtime configuration through
/// its admin socket under `run_dir`.
pub fn config_cli(run_dir: &Path, args: &[&str]) -> CliOutput {
    let out = std::process::Command::new(bin("fastblock-client"))
        .arg("config")
        .args(args)
        .arg("--run-dir")
        .arg(run_dir)
        .output()
        .expect("running fastblock-client config");
    CliOutput::from(out)
}

pub struct CliOutput {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl From<Output> for CliOutput {
    fn from(o: Output) -> Self {
        CliOutput {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).to_string(),
            stderr: String::from_utf8_lossy(&o.stderr).to_string(),
        }
    }
}

impl CliOutput {
    #[track_caller]
    pub fn ok(&self) -> &str {
        assert_eq!(
            self.code, 0,
            "command failed: stdout={} stderr={}",
            self.stdout, self.stderr
        );
        &self.stdout
    }

    /// Fails with exit status 1 and exactly one line on stderr containing `needle`.
    #[track_caller]
    pub fn fails_with(&self, needle: &str) {
        assert_ne!(
            self.code, 0,
            "command unexpectedly succeeded: {}",
            self.stdout
        );
        assert_eq!(
            self.stderr.trim_end().lines().count(),
            1,
            "stderr not one line: {}",
            self.stderr
        );
        assert!(
            self.stderr.contains(needle),
            "stderr {:?} lacks {needle:?}",
            self.stderr
        );
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(self.ok())
            .unwrap_or_else(|e| panic!("invalid JSON {e}: {}", self.stdout))
    }
}

/// An OSD stand-in that applies for an id, boots and heartbeats through the real API, so the
/// monitor's timers and PG logic can be tested before real OSDs exist.
pub struct FakeOsd {
    pub id: OsdId,
    pub uuid: String,
    pub host: String,
    beating: Arc<AtomicBool>,
    task: Option<tokio::task::JoinHandle<()>>,
    endpoints: Vec<String>,
    /// `osd.N`'s key (created with the admin key), `None` in auth mode `none`.
    pub key: Option<fastblock_auth::Secret>,
    /// The cluster's client floor (`MonCluster::auth_floor`).
    pub auth_floor: Option<fastblock_auth::AuthMode>,
}

impl FakeOsd {
    pub async fn register(mons: &MonCluster, host: &str) -> FakeOsd {
        let client = mons.client();
        let uuid = uuid::Uuid::new_v4().to_string();
        let id = client.apply_id(&uuid).await.expect("apply id");
        let key = match client.credentials() {
            Some(_) => Some(
                client
                    .auth_get_or_create(&format!("osd.{id}"), "osd")
                    .await
                    .expect("osd key")
                    .key,
            ),
            None => None,
        };
        let mut osd = FakeOsd {
            id,
            uuid,
            host: host.to_string(),
            beating: Arc::new(AtomicBool::new(false)),
            task: None,
            endpoints: mons.endpoints(),
            key,
            auth_floor: mons.auth_floor(),
        };
        osd.boot().await;
        osd
    }

    /// A client signing as this OSD.
    pub fn client(&self) -> MonClient {
        let c = MonClient::new(self.endpoints.clone());
        match &self.key {
            Some(k) => c
                .with_credentials(fastblock_auth::EntityName::Osd(self.id), k.clone())
                .with_auth_floor(self.auth_floor),
            None => c,
        }
    }

    pub async fn boot(&mut self) {
        let client = self.client();
        let req = BootRequest {
            uuid: self.uuid.clone(),
            address: "127.0.0.1".into(),
            port: 6800 + self.id.0 as u16,
            shards: 1,
            host: self.host.clone(),
            capacity_bytes: 1 << 30,
            config: format!("{{\"osd\":{}}}", self.id),
            lease_timing: None,
        };
        client.boot(self.id, &req).await.expect("boot");
        self.start_heartbeats();
    }

    /// Heartbeats every 300 ms until `stop_heartbeats` (a simulated crash or partition).
    pub fn start_heartbeats(&mut self) {
        self.stop_heartbeats();
        let beating = Arc::new(AtomicBool::new(true));
        self.beating = beating.clone();
        let client = self.client().with_deadline(Duration::from_secs(1));
        let (id, uuid) = (self.id, self.uuid.clone());
        self.task = Some(tokio::spawn(async move {
            while beating.load(Ordering::Relaxed) {
                let req = HeartbeatRequest {
                    uuid: uuid.clone(),
                    ..Default::default()
                };
                let _ = client.heartbeat(id, &req).await;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }));
    }

    pub fn stop_heartbeats(&mut self) {
        self.beating.store(false, Ordering::Relaxed);
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl Drop for FakeOsd {
    fn drop(&mut self) {
        self.stop_heartbeats();
    }
}

/// A real `fastblock-osd` process on a data file, formatted with `--mkfs` against `mons`.
pub struct OsdProc {
    pub id: OsdId,
    pub data: PathBuf,
    pub port: u16,
    /// Data-path shards (each has a port from `port` on).
    pub shards: u32,
    pub host: String,
    pub proc: Option<Proc>,
    endpoints: Vec<String>,
    log_dir: PathBuf,
    restarts: u32,
    /// Arguments added to every start (replacing the `OSD_TEST_ARGS` options they give).
    pub extra_args: Vec<String>,
    /// Environment variables set at every start.
    pub extra_env: Vec<(String, String)>,
    /// The network namespace every start runs the OSD in (`netns`); `None`: this one.
    pub netns: Option<String>,
}

/// Options of OSDs under test: fast Raft timers so elections take well under a second.
pub const OSD_TEST_ARGS: &[&str] = &[
    "--tick",
    "50ms",
    "--election-ticks",
    "10",
    "--heartbeat-ticks",
    "2",
    "--heartbeat-interval",
    "300ms",
];

impl OsdProc {
    /// Formats a new OSD (`shards` data-path threads) on a fresh file in `dir` and starts it.
    pub fn create(mons: &MonCluster, dir: &Path, host: &str, size: &str, shards: u32) -> OsdProc {
        OsdProc::create_opts(mons, dir, host, size, shards, &[])
    }

    /// Like [`OsdProc::create`], with extra arguments on every start.
    pub fn create_with(
        mons: &MonCluster,
        dir: &Path,
        host: &str,
        size: &str,
        extra: &[&str],
    ) -> OsdProc {
        OsdProc::create_opts(mons, dir, host, size, 1, extra)
    }

    fn create_opts(
        mons: &MonCluster,
        dir: &Path,
        host: &str,
        size: &str,
        shards: u32,
        extra: &[&str],
    ) -> OsdProc {
        OsdProc::create_in(mons, (dir, dir), host, size, shards, extra)
    }

    /// Like [`OsdProc::create_with`], with the data (and metadata) files in `data_dir` and the
    /// logs in `log_dir` (say, data on a small file system that fills up, logs elsewhere).
    pub fn create_in(
        mons: &MonCluster,
        (data_dir, log_dir): (&Path, &Path),
        host: &str,
        size: &str,
        shards: u32,
        extra: &[&str],
    ) -> OsdProc {
        let mut osd = OsdProc::format_in(mons, (data_dir, log_dir), host, size, shards, extra);
        osd.start();
        osd
    }

    /// Like [`OsdProc::create_in`], without starting the OSD (its settings may change first).
    pub fn format_in(
        mons: &MonCluster,
        (data_dir, log_dir): (&Path, &Path),
        host: &str,
        size: &str,
        shards: u32,
        extra: &[&str],
    ) -> OsdProc {
        let n = std::fs::read_dir(data_dir).map(|d| d.count()).unwrap_or(0);
        let data = data_dir.join(format!("osd-{host}-{n}.img"));
        let out = Command::new(bin("fastblock-osd"))
            .args(["--mkfs", "--data"])
            .arg(&data)
            .args(["--size", size, "--shards", &shards.to_string()])
            // Allocated, not written: tests run many small clusters at once; writing every
            // WAL region first (the default) would cost time and test nothing else.
            .args(["--preallocate", "reserve"])
            .env("FASTBLOCK_MON", mons.endpoints().join(","))
            .env("FASTBLOCK_KEYRING", mons.keyring())
            .output()
            .expect("running fastblock-osd --mkfs");
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "mkfs failed: {}{}",
            stdout,
            String::from_utf8_lossy(&out.stderr)
        );
        let id = OsdId(stdout.trim().parse().expect("mkfs prints the new id"));
        // One port per shard, consecutive, and the next for `/metrics` (the OSD's default
        // metrics port: `--port` + shards).
        let port = free_ports(u16::try_from(shards + 1).expect("a few shards"));
        OsdProc {
            id,
            data,
            port,
            shards,
            host: host.to_string(),
            proc: None,
            endpoints: mons.endpoints(),
            log_dir: log_dir.to_path_buf(),
            restarts: 0,
            extra_args: extra.iter().map(|s| s.to_string()).collect(),
            extra_env: Vec::new(),
            netns: None,
        }
    }

    /// Everything this OSD logged in all its runs (for checks on what it did).
    pub fn all_logs(&self) -> String {
        let mut all = String::new();
        for run in 1..=self.restarts {
            let path = self.log_dir.join(format!("osd{}-{}.log", self.id, run));
            all.push_str(&std::fs::read_to_string(path).unwrap_or_default());
        }
        all
    }

    /// The OSD's `--run-dir` (its admin socket `osd.ID.asok`), beside its logs.
    pub fn run_dir(&self) -> PathBuf {
        self.log_dir.join("run")
    }

    pub fn start(&mut self) {
        assert!(self.proc.is_none(), "osd {} already running", self.id);
        let mut cmd = Command::new(bin("fastblock-osd"));
        cmd.arg("--data")
            .arg(&self.data)
            .args(["--port", &self.port.to_string(), "--host", &self.host])
            .args(self.test_args())
            .args(&self.extra_args)
            .env("FASTBLOCK_MON", self.endpoints.join(","))
            .env("FASTBLOCK_RUN_DIR", self.run_dir())
            .env("RUST_LOG", osd_log_filter())
            // The measurement-only mode without flushes is acknowledged only by a test that
            // asks for it (`extra_env`), never by the environment the tests run in.
            .env_remove(fastblock_osd::no_flush::ACKNOWLEDGEMENT_VAR)
            .envs(self.extra_env.iter().map(|(k, v)| (k, v)));
        if let Some(namespace) = &self.netns {
            netns::spawn_inside(&mut cmd, namespace);
        }
        self.restarts += 1;
        let log = self
            .log_dir
            .join(format!("osd{}-{}.log", self.id, self.restarts));
        self.proc = Some(Proc::spawn(&format!("osd.{}", self.id), cmd, log));
    }

    /// `OSD_TEST_ARGS` without the options `extra_args` gives again (clap refuses an option
    /// given twice, so the extra one replaces the test default).
    fn test_args(&self) -> Vec<&'static str> {
        OSD_TEST_ARGS
            .chunks(2)
            .filter(|pair| !self.extra_args.iter().any(|a| a == pair[0]))
            .flatten()
            .copied()
            .collect()
    }

    pub fn kill(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill();
        }
    }

    pub fn stop(&mut self) -> bool {
        match self.proc.take() {
            Some(mut p) => p.terminate(Duration::from_secs(20)),
            None => true,
        }
    }

    /// Freezes the OSD process (SIGSTOP) until [`OsdProc::resume`].
    pub fn pause(&mut self) {
        if let Some(p) = self.proc.as_mut() {
            p.pause();
        }
    }

    pub fn resume(&mut self) {
        if let Some(p) = self.proc.as_mut() {
            p.resume();
        }
    }

    pub fn is_running(&mut self) -> bool {
        match self.proc.as_mut().and_then(|p| p.child.as_mut()) {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    pub fn log_tail(&self) -> String {
        self.proc.as_ref().map(|p| p.log_tail()).unwrap_or_default()
    }

    /// Where this OSD serves `/metrics` by default: the port after its shards' data ports.
    pub fn metrics_addr(&self) -> String {
        format!("127.0.0.1:{}", u32::from(self.port) + self.shards)
    }
}

/// Creates and starts `count` OSDs (hosts `h0`, `h1`, ...) of `size` with `shards` shards
/// each under `dir`, and waits until all are up and in.
pub async fn start_osds(
    mons: &MonCluster,
    dir: &Path,
    count: usize,
    size: &str,
    shards: u32,
    timeout: Duration,
) -> Vec<OsdProc> {
    let osds: Vec<OsdProc> = (0..count)
        .map(|i| OsdProc::create(mons, dir, &format!("h{i}"), size, shards))
        .collect();
    let ids: Vec<OsdId> = osds.iter().map(|o| o.id).collect();
    wait_osds_up(&mons.client(), &ids, timeout).await;
    osds
}

/// Waits until these OSDs are up and in.
pub async fn wait_osds_up(client: &MonClient, ids: &[OsdId], timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let osds = client.osds().await.expect("osd list");
        if ids
            .iter()
            .all(|id| osds.iter().any(|o| o.id == *id && o.up && o.is_in))
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "osds {ids:?} not up after {timeout:?}: {osds:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Creates pool `pool` (`pg_count` PGs of `replicas`, failure domain OSD) holding image
/// `image`, and waits until every PG is active.
pub async fn pool_with_image(
    client: &MonClient,
    (pool, pg_count, replicas): (&str, u32, u32),
    (image, size_bytes, object_bytes): (&str, u64, u64),
) -> PoolInfo {
    let info = client
        .create_pool(&CreatePoolRequest {
            name: pool.into(),
            pg_count,
            size: replicas,
            failure_domain: FailureDomain::Osd,
        })
        .await
        .unwrap();
    client
        .create_image(&CreateImageRequest {
            pool: pool.into(),
            name: image.into(),
            size_bytes,
            object_size_bytes: Some(object_bytes),
        })
        .await
        .unwrap();
    wait_all_active(client, Duration::from_secs(30)).await;
    info
}

/// Waits until every PG of the cluster is active, or panics with the PG table.
pub async fn wait_all_active(client: &MonClient, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let list = client.pgs(None).await.expect("pg list");
        if !list.pgs.is_empty() && list.pgs.iter().all(|r| r.info.state.is_active()) {
            return;
        }
        if Instant::now() > deadline {
            let table: Vec<String> = list
                .pgs
                .iter()
                .map(|r| {
                    format!(
                        "{} {} {:?} -> {:?}",
                        r.pgid, r.state_name, r.info.osdlist, r.info.newosdlist
                    )
                })
                .collect();
            panic!(
                "PGs not all active after {timeout:?}:\n{}",
                table.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// client.admin's credentials, the mode and the monitors of the last cluster this test process
/// started (nextest runs one test per process), for [`WireConn`].
#[derive(Clone)]
struct TestAuth {
    credentials: fastblock_client::auth::Credentials,
    mode: fastblock_auth::AuthMode,
    monitors: Vec<String>,
}

static TEST_AUTH: std::sync::Mutex<Option<TestAuth>> = std::sync::Mutex::new(None);

/// client.admin's ticket for the OSD listening at `addr` (one of its shard ports), asked of
/// the monitor like a client's.
async fn test_ticket(
    auth: &TestAuth,
    addr: &str,
) -> Result<fastblock_auth::handshake::HeldTicket, String> {
    let (entity, key) = auth.credentials.clone();
    let mon = fastblock_monclient::MonClient::new(auth.monitors.clone())
        .with_credentials(entity, key)
        .with_deadline(Duration::from_secs(20));
    let map = mon
        .map()
        .await
        .map_err(|e| format!("map: {e}"))?
        .map
        .ok_or("the monitor answered without a map")?;
    let osd = map
        .osds
        .values()
        .find(|o| {
            (0..o.shards.max(1)).any(|i| format!("{}:{}", o.address, o.port + i as u16) == addr)
        })
        .map(|o| o.id)
        .ok_or_else(|| format!("no OSD of the map listens at {addr}"))?;
    let mut got = mon
        .tickets(&[osd])
        .await
        .map_err(|e| format!("ticket for osd.{}: {e}", osd.0))?;
    got.pop()
        .map(|(_, t)| t)
        .ok_or_else(|| format!("no ticket for osd.{}", osd.0))
}

/// A raw data-plane connection for tests: one request at a time. In a cluster that
/// authenticates it completes the handshake as client.admin and protects every frame sent
/// by `call` (bytes sent with `send_raw` go as they are).
pub struct WireConn {
    stream: tokio::net::TcpStream,
    buf: bytes::BytesMut,
    next_id: u64,
    protected: Option<fastblock_client::auth::Protected>,
}

impl WireConn {
    pub async fn connect(addr: &str) -> WireConn {
        WireConn::try_connect(addr)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Like [`WireConn::connect`], with an error instead of a panic when the OSD cannot be
    /// reached or does not complete the handshake: for callers that expect it to be away at
    /// times (a fault driver asking whether it is back).
    pub async fn try_connect(addr: &str) -> Result<WireConn, String> {
        let mut stream =
            tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(addr))
                .await
                .map_err(|_| format!("connect timeout: {addr}"))?
                .map_err(|e| format!("connecting {addr}: {e}"))?;
        let mut buf = bytes::BytesMut::new();
        let auth = TEST_AUTH.lock().unwrap().clone();
        let protected = match auth {
            Some(auth) => Some(
                tokio::time::timeout(
                    Duration::from_secs(10),
                    fastblock_client::auth::connect(
                        &mut stream,
                        &mut buf,
                        &auth.credentials.0,
                        &test_ticket(&auth, addr).await?,
                        auth.mode,
                        addr,
                    ),
                )
                .await
                .map_err(|_| format!("handshake timeout: {addr}"))?
                .map_err(|e| format!("handshake with {addr}: {e}"))?,
            ),
            None => None,
        };
        Ok(WireConn {
            stream,
            buf,
            next_id: 1,
            protected,
        })
    }

    pub async fn send_raw(&mut self, bytes: &[u8]) {
        use tokio::io::AsyncWriteExt;
        self.stream.write_all(bytes).await.expect("write");
    }

    /// Next reply, or `None` if the OSD closed the connection.
    pub async fn recv(&mut self) -> Option<fastblock_wire::Reply> {
        use tokio::io::AsyncReadExt;
        let mut decoder = fastblock_wire::FrameDecoder::default();
        loop {
            let frame = match &mut self.protected {
                None => decoder.decode(&mut self.buf).expect("valid frame from osd"),
                Some(p) => decoder
                    .decode_mut(&mut self.buf)
                    .expect("valid frame from osd")
                    .map(|f| {
                        fastblock_client::auth::open_frame(f, &mut p.opener)
                            .expect("a frame protected by the OSD")
                    }),
            };
            if let Some(frame) = frame {
                return Some(fastblock_wire::Reply::decode(&frame).expect("valid reply"));
            }
            let n =
                tokio::time::timeout(Duration::from_secs(10), self.stream.read_buf(&mut self.buf))
                    .await
                    .expect("reply timeout")
                    .ok()?;
            if n == 0 {
                return None;
            }
        }
    }

    pub async fn call(&mut self, req: &fastblock_wire::Request) -> fastblock_wire::Reply {
        let out = self.frame(req);
        self.send_raw(&out).await;
        self.recv().await.expect("connection closed")
    }

    /// Like [`WireConn::call`], with an error instead of a panic when the connection breaks,
    /// closes, or gives no reply within `timeout` (below the 10 s after which `recv` panics).
    pub async fn try_call(
        &mut self,
        req: &fastblock_wire::Request,
        timeout: Duration,
    ) -> Result<fastblock_wire::Reply, String> {
        use tokio::io::AsyncWriteExt;
        assert!(timeout < Duration::from_secs(10), "{timeout:?}");
        let out = self.frame(req);
        let exchange = async {
            self.stream
                .write_all(&out)
                .await
                .map_err(|e| format!("write: {e}"))?;
            self.recv()
                .await
                .ok_or_else(|| "connection closed".to_string())
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| format!("no reply within {timeout:?}"))?
    }

    /// `req` as the next frame to send, sealed if the connection is protected.
    fn frame(&mut self, req: &fastblock_wire::Request) -> bytes::BytesMut {
        let mut out = bytes::BytesMut::new();
        req.encode(self.next_id, &mut out);
        if let Some(p) = &mut self.protected {
            fastblock_client::auth::seal_frame(&mut out, 0, &mut p.sealer);
        }
        self.next_id += 1;
        out
    }
}

/// Bytes of a stamped test block.
pub const BLOCK: u64 = 4096;

/// A 4 KiB block whose every byte depends on (offset, generation), so a stale or misplaced
/// block never passes for the right one.
pub fn stamped_block(offset: u64, generation: u64) -> bytes::Bytes {
    stamped(offset, generation, BLOCK)
}

/// The first `len` bytes (a multiple of 8) of a stamped run of bytes at `offset`: what
/// [`stamped_block`] makes for a 4 KiB block, and a piece of a block (a sector) for models of
/// unaligned IO (`model::Model::new`).
pub fn stamped(offset: u64, generation: u64, len: u64) -> bytes::Bytes {
    assert_eq!(len % 8, 0, "stamped bytes come 8 at a time");
    let mut x = offset.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ generation.wrapping_mul(0xBF58_476D_1CE4_E5B9)
        ^ 1;
    let mut v = Vec::with_capacity(len as usize);
    while v.len() < len as usize {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    bytes::Bytes::from(v)
}

/// Every PG of `map`, with its id.
pub fn all_pgs(
    map: &fastblock_types::map::ClusterMap,
) -> impl Iterator<Item = (fastblock_types::PgId, &fastblock_types::map::PgInfo)> {
    map.pgmaps.iter().flat_map(|(pool, m)| {
        m.pgs
            .iter()
            .map(|(seq, i)| (fastblock_types::PgId::new(*pool, *seq), i))
    })
}

/// Why the replicas of some PG of `map` differ or cannot be compared yet (a target membership
/// still pending, a replica answering something else than its digest), or `None` when every
/// replica of every PG reports the same applied index and objects (`Request::ReplicaDigest`).
pub async fn replicas_differ(map: &fastblock_types::map::ClusterMap) -> Option<String> {
    use fastblock_wire::{Reply, Request};
    for (pg, info) in all_pgs(map) {
        if !info.newosdlist.is_empty() {
            return Some(format!("{pg} still has a target"));
        }
        let mut digests = Vec::new();
        for osd in &info.osdlist {
            let o = &map.osds[osd];
            let mut conn = WireConn::connect(&format!("{}:{}", o.address, o.port_for(pg))).await;
            match conn.call(&Request::ReplicaDigest { pg }).await {
                Reply::Digest {
                    applied_index,
                    objects,
                } => digests.push((applied_index, objects)),
                other => return Some(format!("digest of {pg} at osd {osd}: {other:?}")),
            }
        }
        if !digests.windows(2).all(|w| w[0] == w[1]) {
            let applied: Vec<u64> = digests.iter().map(|(a, _)| *a).collect();
            return Some(format!(
                "replicas {:?} of {pg} differ: applied {applied:?}",
                info.osdlist
            ));
        }
    }
    None
}

/// Waits until every PG is active and [`replicas_differ`] finds nothing in one pass over the
/// current map (replicas catch up, and OSDs learn the newest map, a little after the monitor
/// shows the PGs active), or panics with the last difference after `timeout`.
pub async fn wait_replicas_identical(client: &MonClient, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let map = client.map().await.expect("the map").map.expect("a map");
        let why = if all_pgs(&map).all(|(_, i)| i.state.is_active()) {
            match replicas_differ(&map).await {
                None => return,
                Some(why) => why,
            }
        } else {
            "PGs not all active".to_string()
        };
        assert!(
            Instant::now() < deadline,
            "replicas not identical after {timeout:?}: {why}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

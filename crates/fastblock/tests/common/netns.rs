//! Real network partitions for end-to-end tests (issue 19): every OSD runs in its own Linux
//! network namespace, joined by a veth pair to a bridge the test creates in the root
//! namespace. The monitor (and its etcd) and the test process (the client) stay in the root
//! namespace and listen on the bridge's address, which the OSDs reach through their veths.
//!
//! ```text
//!   root namespace: monitor, etcd, test (client)      10.A.B.1/24 on bridge fbnXXXX
//!        |                 |                 |
//!     fbnXXXXv0         fbnXXXXv1         fbnXXXXv2   (root ends of the veth pairs)
//!        |                 |                 |
//!   [fbnXXXX-0] eth0  [fbnXXXX-1] eth0  [fbnXXXX-2] eth0   10.A.B.10, .11, .12 (and lo)
//!     osd.N             osd.M             osd.K
//! ```
//!
//! Partitions: [`NetCluster::isolate`] takes an OSD's veth down, so it reaches nobody and
//! nobody reaches it (monitor and client included); [`NetCluster::drop_between`] makes two
//! OSDs stop hearing each other while everything else flows (nftables DROP rules inside their
//! namespaces); `heal` and `heal_between` undo them. TCP connections are not reset: packets
//! are lost, as on a real network that fails.
//!
//! Each harness claims a /24 out of 10.128.0.0/10 by creating its bridge: the bridge's name
//! encodes the subnet and `ip link add` fails when another test holds it, so tests running at
//! the same time (in other processes) never share a subnet or a name. The bridge's alias names
//! the PID that owns it: a bridge whose owner died without cleaning up (a test process killed
//! by SIGKILL) is reclaimed, with its namespaces and the OSDs left running in them.
//!
//! Everything is removed on drop, also when the test panics: OSDs first (killed by PID), then
//! the veths, namespaces and bridge. Every `ip`/`nft` command is bounded. Needs root
//! (CAP_NET_ADMIN; CAP_SYS_ADMIN for setns), `ip` and `nft` (scripts/install-deps.sh).

use super::{wait_osds_up, MonCluster, MonOptions, OsdProc, TempDir};
use fastblock_types::OsdId;
use std::net::Ipv4Addr;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Subnets a harness may claim: 10.128.0.0/24 to 10.191.255.0/24.
const SUBNETS_COUNT: u32 = 1 << 14;

/// Limit of one `ip` or `nft` command (they take milliseconds).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// The nftables table each namespace filters in, and the set of source addresses it drops.
const NFT_TABLE: &str = "fastblock_partition";

/// Prefix of every name a harness creates (bridge, veths, namespaces).
const NAME_PREFIX: &str = "fbn";

/// Interface names are at most 15 bytes (IFNAMSIZ - 1).
const IFNAME_BYTES_MAX: usize = 15;

// The longest interface name is a veth's root end: prefix, 4 hex digits, 'v', up to 2 digits.
const _: () = assert!(NAME_PREFIX.len() + 4 + 1 + 2 <= IFNAME_BYTES_MAX);

/// Namespaces (OSDs) one harness creates at most: their addresses are .10 to .10 + N - 1, and
/// two digits in a veth's name.
const NAMESPACES_MAX: usize = 64;

/// Runs `program args`, waiting at most [`COMMAND_TIMEOUT`]: its stdout, or why it failed.
/// For commands with little output (a full pipe would block them until the timeout).
fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let what = format!("{program} {}", args.join(" "));
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{what}: {e}"))?;
    let deadline = Instant::now() + COMMAND_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| format!("{what}: {e}"))? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{what}: no exit after {COMMAND_TIMEOUT:?}"));
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let out = child
        .wait_with_output()
        .map_err(|e| format!("{what}: {e}"))?;
    if status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{what}: {status}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// [`run`] for a step that must work (setting up or changing the network of a test).
#[track_caller]
fn must(program: &str, args: &[&str]) -> String {
    run(program, args).unwrap_or_else(|e| panic!("netns harness: {e}"))
}

/// [`run`] while cleaning up: a failure is reported, never a panic (drop may run during one).
fn try_clean(program: &str, args: &[&str]) {
    if let Err(e) = run(program, args) {
        eprintln!("netns harness: cleaning up: {e}");
    }
}

/// Makes `cmd` run its program inside the network namespace `namespace` (made by `ip netns
/// add`): the child enters it with setns(2) between fork and exec, so the PID the caller
/// holds is the program's own (no `ip netns exec` in between), and the caller's kill by PID
/// reaches it.
pub fn spawn_inside(cmd: &mut Command, namespace: &str) {
    let path = format!("/run/netns/{namespace}");
    // Opened now, in the parent (close-on-exec): the child only calls setns on it.
    let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("opening {path}: {e}"));
    let hook = move || {
        use std::os::fd::AsRawFd;
        // SAFETY: setns(2) is a system call on a descriptor this closure owns; it allocates
        // nothing and takes no lock, so it is safe between fork and exec.
        if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } == -1 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    };
    // SAFETY: the hook only makes the async-signal-safe system call above.
    unsafe {
        cmd.pre_exec(hook);
    }
}

/// The bridge, namespaces and veth pairs of one test, removed on drop.
pub struct Net {
    /// Which /24 (and names) this harness holds, below [`SUBNETS_COUNT`].
    index: u32,
    namespaces: usize,
}

impl Net {
    /// A bridge holding the first address of a /24 nobody else uses, and `namespaces`
    /// namespaces joined to it, each with `lo` up and one address on its veth.
    pub fn create(namespaces: usize) -> Net {
        assert!(namespaces <= NAMESPACES_MAX, "{namespaces} namespaces");
        let mut net = Net {
            index: claim_subnet(),
            namespaces: 0,
        };
        let bridge_cidr = format!("{}/24", net.bridge_ip());
        let bridge = net.bridge();
        must("ip", &["addr", "add", &bridge_cidr, "dev", &bridge]);
        // Added second, so the root namespace's connections (the client's) leave from the
        // bridge address: a namespace can then drop the monitor's packets alone.
        let monitor_cidr = format!("{}/24", net.monitor_ip());
        must("ip", &["addr", "add", &monitor_cidr, "dev", &bridge]);
        must("ip", &["link", "set", &bridge, "up"]);
        for i in 0..namespaces {
            net.add_namespace(i);
            net.namespaces = i + 1;
        }
        net
    }

    fn add_namespace(&self, i: usize) {
        let (ns, veth, bridge) = (self.namespace(i), self.veth(i), self.bridge());
        // Left over by a dead owner of this subnet whose reclaim missed it: ours now.
        if std::path::Path::new(&format!("/run/netns/{ns}")).exists() {
            try_clean("ip", &["netns", "del", &ns]);
        }
        must("ip", &["netns", "add", &ns]);
        must(
            "ip",
            &[
                "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns,
            ],
        );
        must("ip", &["link", "set", &veth, "master", &bridge]);
        must("ip", &["link", "set", &veth, "up"]);
        let cidr = format!("{}/24", self.ip(i));
        let inside = |args: &[&str]| {
            let mut all = vec!["-n", ns.as_str()];
            all.extend_from_slice(args);
            must("ip", &all);
        };
        inside(&["addr", "add", &cidr, "dev", "eth0"]);
        inside(&["link", "set", "eth0", "up"]);
        inside(&["link", "set", "lo", "up"]);
        // Dropped sources, empty until `drop_one_way`: one set and one rule, so healing is
        // taking an address out of the set.
        let script = format!(
            "add table inet {NFT_TABLE}; \
             add set inet {NFT_TABLE} dropped {{ type ipv4_addr; }}; \
             add chain inet {NFT_TABLE} input {{ type filter hook input priority 0; }}; \
             add rule inet {NFT_TABLE} input ip saddr @dropped drop"
        );
        must("ip", &["netns", "exec", &ns, "nft", &script]);
    }

    /// The bridge's address: the root namespace's address on the test's network, the source
    /// of the client's connections.
    pub fn bridge_ip(&self) -> Ipv4Addr {
        self.subnet_ip(1)
    }

    /// A second address of the bridge, for the monitors alone.
    pub fn monitor_ip(&self) -> Ipv4Addr {
        self.subnet_ip(2)
    }

    /// The address of namespace `i`.
    pub fn ip(&self, i: usize) -> Ipv4Addr {
        assert!(i < NAMESPACES_MAX);
        self.subnet_ip(10 + i as u8)
    }

    fn subnet_ip(&self, host: u8) -> Ipv4Addr {
        subnet_ip(self.index, host)
    }

    /// The name of namespace `i` (for `ip netns exec`, [`spawn_inside`]).
    pub fn namespace(&self, i: usize) -> String {
        format!("{}-{i}", self.bridge())
    }

    fn bridge(&self) -> String {
        bridge_name(self.index)
    }

    /// The root end of namespace `i`'s veth pair, a port of the bridge.
    fn veth(&self, i: usize) -> String {
        format!("{}v{i}", self.bridge())
    }

    /// Cuts namespace `i` off the network: its veth goes down.
    pub fn isolate(&self, i: usize) {
        assert!(i < self.namespaces);
        must("ip", &["link", "set", &self.veth(i), "down"]);
    }

    /// Undoes [`Net::isolate`].
    pub fn heal(&self, i: usize) {
        assert!(i < self.namespaces);
        must("ip", &["link", "set", &self.veth(i), "up"]);
    }

    /// Namespace `to` drops every packet from namespace `from` (one way: `to`'s packets
    /// still reach `from`).
    pub fn drop_one_way(&self, from: usize, to: usize) {
        self.dropped_set(from, to, "add");
    }

    /// Undoes [`Net::drop_one_way`].
    pub fn heal_one_way(&self, from: usize, to: usize) {
        self.dropped_set(from, to, "delete");
    }

    /// Namespace `i` drops every packet from the monitors' address: its connections to them
    /// never complete, while the client (from the bridge address) and the other namespaces
    /// still reach it.
    pub fn cut_from_monitor(&self, i: usize) {
        assert!(i < self.namespaces);
        self.dropped_set_ip(self.monitor_ip(), i, "add");
    }

    /// Undoes [`Net::cut_from_monitor`].
    pub fn heal_from_monitor(&self, i: usize) {
        assert!(i < self.namespaces);
        self.dropped_set_ip(self.monitor_ip(), i, "delete");
    }

    fn dropped_set(&self, from: usize, to: usize, verb: &str) {
        assert!(from < self.namespaces && to < self.namespaces && from != to);
        self.dropped_set_ip(self.ip(from), to, verb);
    }

    fn dropped_set_ip(&self, from: Ipv4Addr, to: usize, verb: &str) {
        let element = format!("{{ {from} }}");
        let ns = self.namespace(to);
        must(
            "ip",
            &[
                "netns", "exec", &ns, "nft", verb, "element", "inet", NFT_TABLE, "dropped",
                &element,
            ],
        );
    }

    /// Namespaces `a` and `b` stop hearing each other; both still reach everyone else.
    pub fn drop_between(&self, a: usize, b: usize) {
        self.drop_one_way(a, b);
        self.drop_one_way(b, a);
    }

    /// Undoes [`Net::drop_between`].
    pub fn heal_between(&self, a: usize, b: usize) {
        self.heal_one_way(a, b);
        self.heal_one_way(b, a);
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        remove_subnet(self.index);
    }
}

/// Address `host` of subnet `index`: 10.128.0.0/10 cut into /24s.
fn subnet_ip(index: u32, host: u8) -> Ipv4Addr {
    assert!(index < SUBNETS_COUNT);
    let high = u8::try_from(index >> 8).expect("below SUBNETS_COUNT");
    let low = u8::try_from(index & 0xff).expect("one byte");
    Ipv4Addr::new(10, 128 + high, low, host)
}

fn bridge_name(index: u32) -> String {
    format!("{NAME_PREFIX}{index:04x}")
}

/// Creates the bridge of a free subnet and returns its index. Starts from one derived from
/// the PID and a counter (so parallel tests start apart) and moves on while a live test holds
/// the subnet; a subnet whose owner died is reclaimed. An index whose /24 the machine already
/// routes (its real network) is skipped.
fn claim_subnet() -> u32 {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let pid = std::process::id();
    let start = pid
        .wrapping_mul(8)
        .wrapping_add(SEQ.fetch_add(1, Ordering::Relaxed));
    let owner = format!("fastblock-test pid={pid}");
    for step in 0..SUBNETS_COUNT {
        let index = start.wrapping_add(step) % SUBNETS_COUNT;
        let bridge = bridge_name(index);
        let address = subnet_ip(index, 1).to_string();
        let routes = must("ip", &["-4", "route", "show", "match", &address]);
        let ours = format!(" dev {NAME_PREFIX}");
        if routes
            .lines()
            .any(|l| !l.starts_with("default") && !l.contains(&ours))
        {
            continue;
        }
        match run("ip", &["link", "add", &bridge, "type", "bridge"]) {
            Ok(_) => {
                if let Err(e) = run("ip", &["link", "set", &bridge, "alias", &owner]) {
                    try_clean("ip", &["link", "del", &bridge]);
                    panic!("netns harness: {e}");
                }
                return index;
            }
            Err(e) if e.contains("exists") => {
                if owner_is_dead(&bridge) {
                    eprintln!("netns harness: reclaiming {bridge}, left by a dead test");
                    remove_subnet(index);
                }
            }
            Err(e) => panic!("netns harness: {e}"),
        }
    }
    panic!("netns harness: no free subnet in 10.128.0.0/10");
}

/// Whether `bridge` carries the alias of a test process that no longer runs. A bridge
/// without such an alias (being set up right now, or not ours) is left alone.
fn owner_is_dead(bridge: &str) -> bool {
    let Ok(alias) = std::fs::read_to_string(format!("/sys/class/net/{bridge}/ifalias")) else {
        return false;
    };
    let Some(pid) = alias
        .trim()
        .strip_prefix("fastblock-test pid=")
        .and_then(|p| p.parse::<libc::pid_t>().ok())
    else {
        return false;
    };
    // SAFETY: signal 0 only checks whether the process exists.
    let alive = unsafe { libc::kill(pid, 0) } == 0
        || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    !alive
}

/// Removes everything of subnet `index`: the processes still running in its namespaces
/// (killed by PID, as `ip netns pids` lists them), its veths, namespaces and bridge.
fn remove_subnet(index: u32) {
    let bridge = bridge_name(index);
    let prefix = format!("{bridge}-");
    let namespaces: Vec<String> = std::fs::read_dir("/run/netns")
        .map(|dir| {
            dir.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default();
    for ns in &namespaces {
        // Our own OSDs were killed before the harness drops; these are a dead test's.
        if let Ok(pids) = run("ip", &["netns", "pids", ns]) {
            for pid in pids
                .lines()
                .filter_map(|p| p.trim().parse::<libc::pid_t>().ok())
            {
                // SAFETY: kill(2) on a PID that runs inside a namespace this subnet owns.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
        }
        let veth = format!("{bridge}v{}", &ns[prefix.len()..]);
        if std::path::Path::new(&format!("/sys/class/net/{veth}")).exists() {
            try_clean("ip", &["link", "del", &veth]);
        }
        try_clean("ip", &["netns", "del", ns]);
    }
    if std::path::Path::new(&format!("/sys/class/net/{bridge}")).exists() {
        try_clean("ip", &["link", "del", &bridge]);
    }
}

/// A monitor and OSDs, each OSD in its own namespace of a [`Net`]: the fixture of the
/// partition tests. Fields drop in order: the OSDs are killed before their namespaces go.
pub struct NetCluster {
    pub osds: Vec<OsdProc>,
    pub mons: MonCluster,
    pub dir: TempDir,
    pub net: Net,
}

impl NetCluster {
    /// A monitor on the monitors' address of the bridge and `count` OSDs of `size` (one shard, hosts `h0`,
    /// `h1`, ...), OSD `i` in namespace `i`; waits until all are up and in.
    pub async fn start(count: usize, options: MonOptions, size: &str) -> NetCluster {
        NetCluster::start_with(count, 1, options, size, |_, _| {}).await
    }

    /// Like [`NetCluster::start`], with `mons` monitors (each with its etcd member, one etcd
    /// cluster), and `configure(i, osd)` called on OSD `i` after its format and before its
    /// first start (say, to add arguments or variables to every start).
    pub async fn start_with(
        count: usize,
        mons: usize,
        options: MonOptions,
        size: &str,
        configure: impl Fn(usize, &mut OsdProc),
    ) -> NetCluster {
        let net = Net::create(count);
        let mons = MonCluster::start_at(mons, options, &net.monitor_ip().to_string()).await;
        let dir = TempDir::new("netns");
        let osds: Vec<OsdProc> = (0..count)
            .map(|i| {
                let ip = net.ip(i).to_string();
                let host = format!("h{i}");
                let extra = ["--address", ip.as_str()];
                let mut osd =
                    OsdProc::format_in(&mons, (dir.path(), dir.path()), &host, size, 1, &extra);
                osd.netns = Some(net.namespace(i));
                configure(i, &mut osd);
                osd.start();
                osd
            })
            .collect();
        let ids: Vec<OsdId> = osds.iter().map(|o| o.id).collect();
        wait_osds_up(&mons.client(), &ids, Duration::from_secs(30)).await;
        NetCluster {
            osds,
            mons,
            dir,
            net,
        }
    }

    /// The namespace index of OSD `id`.
    fn slot(&self, id: OsdId) -> usize {
        self.osds
            .iter()
            .position(|o| o.id == id)
            .unwrap_or_else(|| panic!("osd {id} is not in this cluster"))
    }

    /// The address OSD `id` listens on, in its namespace.
    pub fn ip_of(&self, id: OsdId) -> Ipv4Addr {
        self.net.ip(self.slot(id))
    }

    /// Cuts OSD `id` off from everyone: monitor, client and the other OSDs.
    pub fn isolate(&self, id: OsdId) {
        self.net.isolate(self.slot(id));
    }

    /// Undoes [`NetCluster::isolate`].
    pub fn heal(&self, id: OsdId) {
        self.net.heal(self.slot(id));
    }

    /// Cuts OSD `id` off from the monitors only (see [`Net::cut_from_monitor`]).
    pub fn cut_from_monitor(&self, id: OsdId) {
        self.net.cut_from_monitor(self.slot(id));
    }

    /// Undoes [`NetCluster::cut_from_monitor`].
    pub fn heal_from_monitor(&self, id: OsdId) {
        self.net.heal_from_monitor(self.slot(id));
    }

    /// OSDs `a` and `b` stop hearing each other; both still reach the monitor, the client and
    /// the other OSDs.
    pub fn drop_between(&self, a: OsdId, b: OsdId) {
        self.net.drop_between(self.slot(a), self.slot(b));
    }

    /// Undoes [`NetCluster::drop_between`].
    pub fn heal_between(&self, a: OsdId, b: OsdId) {
        self.net.heal_between(self.slot(a), self.slot(b));
    }

    /// OSD `to` drops every packet from OSD `from`; `to`'s packets still reach `from`.
    pub fn drop_one_way(&self, from: OsdId, to: OsdId) {
        self.net.drop_one_way(self.slot(from), self.slot(to));
    }

    /// Undoes [`NetCluster::drop_one_way`].
    pub fn heal_one_way(&self, from: OsdId, to: OsdId) {
        self.net.heal_one_way(self.slot(from), self.slot(to));
    }
}

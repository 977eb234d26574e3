//! `fastblock-mon`: the monitor daemon. See `docs/mon-api.md` and `docs/etcd-keys.md`.

use clap::{CommandFactory, FromArgMatches, Parser};
use fastblock::admin_socket::{serve_or_warn, RuntimeConfig};
use fastblock::config::{load_or_exit, Daemon, DaemonArgs};
use fastblock::logging::LogLevel;
use fastblock_mon::etcd_auth::EtcdCredentials;
use fastblock_mon::etcd_maint::policy::UpkeepSettings;
use fastblock_mon::etcd_proc::EtcdMemberConfig;
use fastblock_mon::server::{run, MonConfig};
use fastblock_mon::service::AuthBootstrap;
use fastblock_mon::supervise::is_misconfiguration;
use fastblock_mon_core::liveness::LivenessConfig;
use fastblock_types::api::{SNAP_CREATE_TIMEOUT_MS_DEFAULT, SNAP_CREATE_TIMEOUT_MS_MAX};
use fastblock_types::auth::AuthMode;
use fastblock_types::units::{duration_arg, interval_arg, parse_size};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// The fastblock monitor: keeps the cluster map in etcd (its own member, or an existing etcd)
/// and serves it over HTTP (docs/mon-api.md).
#[derive(Parser, Debug)]
#[command(name = "fastblock-mon", version = fastblock_version::VERSION)]
struct Args {
    #[command(flatten)]
    daemon: DaemonArgs,
    /// This monitor's name (also its etcd member name).
    #[arg(long, default_value = "a")]
    name: String,
    /// Data directory (the own etcd member's data lives under it).
    #[arg(long, default_value = "/var/lib/fastblock/mon")]
    data_dir: PathBuf,
    /// Address of the HTTP API.
    #[arg(long, default_value = "127.0.0.1:3333")]
    api_addr: String,
    /// Use this existing etcd cluster (comma-separated client URLs) instead of starting one.
    #[arg(long, value_delimiter = ',')]
    etcd_endpoints: Vec<String>,
    /// Client address of the own etcd member: a loopback address, because etcd holds the key
    /// table (docs/security.md); an etcd that must be reached from elsewhere is an external
    /// one secured with its own TLS and authentication (--etcd-endpoints).
    #[arg(long, default_value = "127.0.0.1:2379", value_parser = loopback_addr)]
    etcd_client_addr: String,
    /// Peer address of the own etcd member.
    #[arg(long, default_value = "127.0.0.1:2380")]
    etcd_peer_addr: String,
    /// All monitors' etcd members as NAME=http://IP:PEERPORT,...; the same on every monitor.
    /// Default: this monitor alone.
    #[arg(long)]
    initial_cluster: Option<String>,
    /// The etcd server binary.
    #[arg(long, default_value = "etcd")]
    etcd_binary: String,
    /// Prefix of every fastblock key in etcd.
    #[arg(long, default_value = "/fastblock")]
    key_prefix: String,
    /// Up → down after this long without a heartbeat.
    #[arg(long, default_value = "10s", value_parser = interval_arg)]
    osd_down_after: Duration,
    /// Down → out after this much longer (unless noout).
    #[arg(long, default_value = "30s", value_parser = interval_arg)]
    osd_out_after: Duration,
    /// How often OSD liveness is checked.
    #[arg(long, default_value = "500ms", value_parser = interval_arg)]
    tick_interval: Duration,
    /// TTL of the monitor's etcd lease: a dead leader is replaced within about this long
    /// (whole seconds: etcd counts lease TTLs in seconds).
    #[arg(long, default_value = "5s", value_parser = lease_ttl_arg)]
    lease_ttl: Duration,
    /// Auth mode of a cluster this monitor creates (none, sign, secure); a cluster that has
    /// one keeps it (change it with `fastblock-client auth mode`).
    #[arg(long, default_value = "sign")]
    auth_mode: AuthMode,
    /// Keyring to write client.admin's key to when this monitor creates the cluster (or to
    /// take it from, if the file holds one). Default: $FASTBLOCK_KEYRING, else
    /// /etc/fastblock/keyring. In mode none, an admin key is made only if this is given.
    #[arg(long)]
    keyring: Option<PathBuf>,
    /// A snapshot whose mark not every PG of its pool confirmed within this many
    /// milliseconds is aborted (its create call fails, naming those PGs); at most 60000.
    #[arg(long, default_value_t = SNAP_CREATE_TIMEOUT_MS_DEFAULT, value_parser = snap_timeout_arg)]
    snap_create_timeout_ms: u64,
    /// A pool is refused at creation if it would put more PG replicas than this on an OSD
    /// (as Ceph's mon_max_pg_per_osd); health warns with TOO_MANY_PGS about OSDs over it.
    /// Runtime-settable: max_pg_per_osd.
    #[arg(long, default_value_t = fastblock_mon_core::limits::PG_PER_OSD_MAX_DEFAULT, value_parser = pg_per_osd_arg)]
    max_pg_per_osd: u32,
    /// etcd's space quota: the own member is started with it (--quota-backend-bytes); with
    /// --etcd-endpoints, give the quota that etcd was started with. Past it etcd refuses every
    /// write (NOSPACE) until the monitor has made room (docs/operations.md, "Monitor
    /// database").
    #[arg(long, default_value = "2GiB", value_parser = quota_arg)]
    etcd_quota_bytes: u64,
    /// MON_ETCD_NEARFULL is raised when a member's database file reaches this share of the
    /// quota (0 < ratio < 1).
    #[arg(long, default_value = "0.8", value_parser = ratio_arg)]
    etcd_nearfull_ratio: u32,
    /// How often the leading monitor compacts etcd's history; 0 turns compaction off (then
    /// etcd fills its quota in time). Runtime-settable: etcd_compact_interval.
    #[arg(long, default_value = "10s", value_parser = duration_arg)]
    etcd_compact_interval: Duration,
    /// Revisions of history a compaction keeps (nothing in fastblock reads old revisions;
    /// this is for an operator's `etcdctl watch --rev`).
    #[arg(long, default_value_t = 1000)]
    etcd_history_revisions: u64,
    /// At most this much of the monitor's own writes is kept as history, whatever the
    /// revisions; writing more since the last compaction starts one at once.
    #[arg(long, default_value = "64MiB", value_parser = size_arg)]
    etcd_history_bytes: u64,
    /// Every etcd member is defragmented this often, one at a time (0: only when free pages
    /// pass --etcd-defrag-free-ratio of its file).
    #[arg(long, default_value = "24h", value_parser = duration_arg)]
    etcd_defrag_interval: Duration,
    /// A member whose database file is free pages by this share (and by 4 MiB at least) is
    /// defragmented (0 < ratio < 1).
    #[arg(long, default_value = "0.5", value_parser = ratio_arg)]
    etcd_defrag_free_ratio: u32,
    /// Write this backup (`fastblock-client mon backup FILE`) into etcd before the first
    /// campaign, if etcd holds no cluster; a cluster already there is never overwritten (the
    /// monitor exits, status 2), and the same backup restored before is skipped
    /// (docs/operations.md, "Backing up and restoring the monitors").
    #[arg(long)]
    restore_from: Option<PathBuf>,
    /// Signed calls one entity may make within the 300 s replay window; past it its calls are
    /// refused (auth_failed) while every other entity's go on, so one key cannot deny service
    /// to the others (docs/security.md, "Monitor calls"); 1 to 262144.
    #[arg(long, default_value_t = fastblock_auth::request::REPLAY_NONCES_PER_ENTITY_MAX, value_parser = calls_per_entity_arg)]
    signed_calls_per_entity_max: usize,
    /// The monitor secret: 32 random bytes, mode 0600, the same file on every monitor (copy
    /// the first monitor's). The key table in etcd is sealed under it and the own etcd
    /// member's root password derived from it. Made if missing only by a monitor alone in its
    /// --initial-cluster (or with --etcd-endpoints). Default: <data-dir>/mon.secret.
    #[arg(long)]
    mon_secret_file: Option<PathBuf>,
    /// With --etcd-endpoints: the etcd user to log in as (with --etcd-password-file). The
    /// own etcd member is always logged in to as its root user.
    #[arg(long, requires = "etcd_password_file")]
    etcd_user: Option<String>,
    /// With --etcd-user: a file holding that user's password (its first line).
    #[arg(long, requires = "etcd_user")]
    etcd_password_file: Option<PathBuf>,
}

/// A byte size (`2GiB`, `512M`, `4096`).
fn size_arg(input: &str) -> Result<u64, String> {
    parse_size(input).map_err(|e| e.to_string())
}

/// `--etcd-quota-bytes`: etcd refuses a quota above 8 GiB (its `MaxQuotaBytes`), and one below
/// 256 KiB leaves no room for the monitor's own keys.
fn quota_arg(input: &str) -> Result<u64, String> {
    let bytes = size_arg(input)?;
    if !(ETCD_QUOTA_BYTES_MIN..=ETCD_QUOTA_BYTES_MAX).contains(&bytes) {
        return Err(format!(
            "{input} is outside 256 KiB..8 GiB (etcd's own maximum)"
        ));
    }
    Ok(bytes)
}

const ETCD_QUOTA_BYTES_MIN: u64 = 256 << 10;
const ETCD_QUOTA_BYTES_MAX: u64 = 8 << 30;

/// A share strictly between 0 and 1, as parts per million.
fn ratio_arg(input: &str) -> Result<u32, String> {
    let r: f64 = input
        .trim()
        .parse()
        .map_err(|e| format!("{input:?} is not a number: {e}"))?;
    if !(r > 0.0 && r < 1.0) {
        return Err(format!("{input} is not between 0 and 1 (exclusive)"));
    }
    Ok((r * 1_000_000.0).round() as u32)
}

/// `--signed-calls-per-entity-max`: 1..=REPLAY_NONCES_MAX / 16 (at least 16 entities fit the
/// replay cache whole).
fn calls_per_entity_arg(text: &str) -> Result<usize, String> {
    let max = fastblock_auth::request::REPLAY_NONCES_MAX / 16;
    match text.parse::<usize>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(format!(
            "{text:?} must be a number of calls from 1 to {max}"
        )),
    }
}

/// `--snap-create-timeout-ms`: 1..=SNAP_CREATE_TIMEOUT_MS_MAX, so the create call's answer
/// reaches a caller whose call a follower forwarded.
fn snap_timeout_arg(input: &str) -> Result<u64, String> {
    let ms: u64 = input
        .parse()
        .map_err(|e| format!("{input:?} is not a number of milliseconds: {e}"))?;
    if ms == 0 || ms > SNAP_CREATE_TIMEOUT_MS_MAX {
        return Err(format!(
            "{ms} must be between 1 and {SNAP_CREATE_TIMEOUT_MS_MAX} milliseconds"
        ));
    }
    Ok(ms)
}

/// `--max-pg-per-osd`: PG replicas per OSD, at least 1.
fn pg_per_osd_arg(input: &str) -> Result<u32, String> {
    match input.parse::<u32>() {
        Ok(0) => Err("max_pg_per_osd must be at least 1".to_string()),
        Ok(max) => Ok(max),
        Err(e) => Err(format!("{input:?} is not a number of PGs per OSD: {e}")),
    }
}

/// The longest lease TTL etcd grants (its `MaxLeaseTTL`, seconds).
const ETCD_LEASE_TTL_SECS_MAX: u64 = 9_000_000_000;

/// `--lease-ttl`: a whole number of seconds etcd accepts, rather than one rounded silently or
/// refused by etcd at every election attempt.
fn loopback_addr(input: &str) -> Result<String, String> {
    let addr: std::net::SocketAddr = input
        .parse()
        .map_err(|e| format!("{input:?} is not an IP:PORT address: {e}"))?;
    if !addr.ip().is_loopback() {
        return Err(format!(
            "{input} is not a loopback address: the own etcd member holds the key table and \
             must not be reachable from the network (use an external etcd with TLS and \
             authentication through --etcd-endpoints)"
        ));
    }
    Ok(input.to_string())
}

fn lease_ttl_arg(input: &str) -> Result<Duration, String> {
    let ttl = interval_arg(input)?;
    if ttl.subsec_nanos() != 0 {
        return Err(format!(
            "{input:?} is not a whole number of seconds (etcd lease TTLs are in seconds)"
        ));
    }
    if ttl.as_secs() > ETCD_LEASE_TTL_SECS_MAX {
        return Err(format!(
            "{input:?} is above etcd's longest lease TTL, {ETCD_LEASE_TTL_SECS_MAX}s"
        ));
    }
    Ok(ttl)
}

const DAEMON: Daemon = Daemon {
    name: "mon",
    subcommand: None,
};

#[tokio::main]
async fn main() {
    let loaded = load_or_exit(&DAEMON, Args::command());
    let args = Args::from_arg_matches(&loaded.matches).unwrap_or_else(|e| e.exit());
    let etcd_credentials = match (&args.etcd_user, &args.etcd_password_file) {
        (Some(_), _) if args.etcd_endpoints.is_empty() => {
            eprintln!("error: --etcd-user is for an external etcd (--etcd-endpoints)");
            std::process::exit(2);
        }
        (Some(user), Some(path)) => match std::fs::read_to_string(path) {
            Ok(text) => Some(EtcdCredentials {
                user: user.clone(),
                password: text.lines().next().unwrap_or("").to_string(),
            }),
            Err(e) => {
                eprintln!("error: --etcd-password-file {}: {e}", path.display());
                std::process::exit(2);
            }
        },
        _ => None,
    };
    let log_level = LogLevel::init(&args.daemon.log_level);
    loaded.log_file();
    let (compact_interval, compact_interval_rx) = watch::channel(args.etcd_compact_interval);
    let pg_per_osd_max = Arc::new(AtomicU32::new(args.max_pg_per_osd));
    let pg_per_osd_setting = pg_per_osd_max.clone();
    let runtime = RuntimeConfig::new(loaded.settings)
        .settable("log_level", Box::new(move |v| log_level.set(v)))
        .settable(
            "max_pg_per_osd",
            Box::new(move |v| {
                let max = pg_per_osd_arg(v)?;
                pg_per_osd_setting.store(max, Ordering::Relaxed);
                Ok(max.to_string())
            }),
        )
        .settable(
            "etcd_compact_interval",
            Box::new(move |v| {
                // 0 is allowed: it turns compaction off.
                let every = duration_arg(v)?;
                compact_interval.send_replace(every);
                Ok(v.to_string())
            }),
        );
    let entity = format!("mon.{}", args.name);
    serve_or_warn(&args.daemon.run_dir, &entity, std::sync::Arc::new(runtime)).await;
    // Whole seconds within etcd's range (lease_ttl_arg): the cast is exact.
    let lease_ttl_secs = args.lease_ttl.as_secs() as i64;
    let etcd_member = if args.etcd_endpoints.is_empty() {
        Some(EtcdMemberConfig {
            binary: args.etcd_binary.clone(),
            name: args.name.clone(),
            data_dir: args.data_dir.join("etcd"),
            client_addr: args.etcd_client_addr.clone(),
            peer_addr: args.etcd_peer_addr.clone(),
            initial_cluster: args
                .initial_cluster
                .clone()
                .unwrap_or_else(|| format!("{}=http://{}", args.name, args.etcd_peer_addr)),
            cluster_token: "fastblock".to_string(),
            quota_bytes: args.etcd_quota_bytes,
            // Set at start from the monitor secret (`fastblock_mon::etcd_tls`).
            peer_tls: None,
        })
    } else {
        None
    };
    let config = MonConfig {
        name: args.name,
        api_addr: args.api_addr,
        etcd_member,
        etcd_endpoints: args.etcd_endpoints,
        key_prefix: args.key_prefix,
        liveness: LivenessConfig {
            osd_down_after_ms: args.osd_down_after.as_millis() as u64,
            osd_out_after_ms: args.osd_out_after.as_millis() as u64,
        },
        tick_interval: args.tick_interval,
        lease_ttl_secs,
        auth: AuthBootstrap {
            mode: args.auth_mode,
            keyring: if args.auth_mode.authenticates() || args.keyring.is_some() {
                Some(fastblock_auth::keyring::resolve_path(
                    args.keyring.as_deref(),
                ))
            } else {
                None
            },
        },
        snap_create_timeout_ms: args.snap_create_timeout_ms,
        pg_per_osd_max,
        etcd_upkeep: UpkeepSettings {
            quota_bytes: args.etcd_quota_bytes,
            nearfull_ratio_ppm: args.etcd_nearfull_ratio,
            history_revisions: args.etcd_history_revisions,
            history_bytes: args.etcd_history_bytes,
            defrag_interval: args.etcd_defrag_interval,
            defrag_free_ratio_ppm: args.etcd_defrag_free_ratio,
        },
        etcd_compact_interval: compact_interval_rx,
        restore_from: args.restore_from,
        mon_secret_file: args
            .mon_secret_file
            .unwrap_or_else(|| args.data_dir.join("mon.secret")),
        etcd_credentials,
        signed_calls_per_entity_max: args.signed_calls_per_entity_max,
    };
    if let Err(e) = run(config).await {
        eprintln!("error: {e:#}");
        // Status 2: its systemd unit does not restart it, a restart would fail the same way.
        std::process::exit(if is_misconfiguration(&e) { 2 } else { 1 });
    }
}

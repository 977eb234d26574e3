//! `fastblock-osd`: the storage daemon. `--mkfs` formats a file or block device and registers a
//! new OSD with the monitor; without it the OSD starts, boots and serves its PGs.

use clap::{CommandFactory, FromArgMatches, Parser};
use fastblock::admin_socket::{serve_or_warn, RuntimeConfig};
use fastblock::config::{load_or_exit, Daemon, DaemonArgs};
use fastblock::logging::LogLevel;
use fastblock::metrics_arg::MetricsArg;
use fastblock_osd::control::{run, OsdConfig};
use fastblock_osd::mkfs::{mkfs, MkfsArgs};
use fastblock_pg::PgConfig;
use fastblock_types::api::{ApiError, ErrorCode};
use fastblock_types::lease::LeaseTiming;
use fastblock_types::units::{interval_arg, parse_size};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

fn size(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

/// The fastblock storage daemon: serves the PGs the monitor places on it from one data file or
/// block device (docs/design/osd.md). `--mkfs` formats the device and registers a new OSD.
#[derive(Parser, Debug)]
#[command(name = "fastblock-osd", version = fastblock_version::VERSION)]
struct Args {
    #[command(flatten)]
    daemon: DaemonArgs,
    /// Data file or block device.
    #[arg(long)]
    data: PathBuf,
    /// Monitor API address(es), comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "127.0.0.1:3333",
        env = "FASTBLOCK_MON"
    )]
    mon: Vec<String>,
    /// With --mkfs: the admin keyring that registers the OSD and creates its key
    /// [default: $FASTBLOCK_KEYRING, else /etc/fastblock/keyring]. Without --mkfs: the OSD's
    /// own keyring [default: <data>.keyring, written by --mkfs].
    #[arg(long)]
    keyring: Option<PathBuf>,
    /// The weakest auth mode this OSD accepts (none, sign, secure) [default: sign when it has a
    /// key, else none]. A map or monitor answer in a weaker mode is refused as a downgrade
    /// (the OSD keeps its last map; health says AUTH_DOWNGRADE_REFUSED): lower it only to run
    /// a cluster in a weaker mode on purpose (docs/security.md, "No downgrade").
    #[arg(long, value_name = "MODE")]
    auth_floor: Option<fastblock_types::auth::AuthMode>,
    /// Format the device and register a new OSD id, then exit.
    #[arg(long)]
    mkfs: bool,
    /// With --mkfs: size of the data file to create (e.g. 10G).
    #[arg(long, value_parser = size)]
    size: Option<u64>,
    /// With --mkfs: the OSD uuid (default: a new random one).
    #[arg(long)]
    uuid: Option<String>,
    /// With --mkfs: format even if the device holds data.
    #[arg(long)]
    force: bool,
    /// With --mkfs on a data file: the file is always allocated in full (fallocate; so no
    /// write ever meets ENOSPC), and then written with zeros over its WAL regions (`wal`), all
    /// of it (`full`), or nothing (`reserve`: fast, for tests), so that commits overwrite
    /// blocks instead of converting them (a journal commit per fdatasync on ext4/xfs). Block
    /// devices are never pre-written.
    #[arg(long, default_value = "wal", value_name = "reserve|wal|full")]
    preallocate: fastblock_osd::mkfs::Preallocate,
    /// Free space the file system holding the metadata files (`<data>.shard<k>.meta`) keeps:
    /// below it, writes are refused with NoSpace (reads, discards and deletes go on) until a
    /// sample shows room again, so the metadata can always be flushed. mkfs refuses a data
    /// file that would leave less [default: a quarter of each shard's WAL or 1/32 of its
    /// region, whichever is less, summed over the shards; at least 64M].
    #[arg(long, value_parser = size, value_name = "SIZE")]
    host_space_reserve: Option<u64>,
    /// With --mkfs: data-path shards (threads), fixed for the life of the OSD [default: cores].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=i64::from(fastblock_osd::mkfs::SHARDS_MAX)))]
    shards: Option<u32>,
    /// Address clients and peers reach this OSD at.
    #[arg(long, default_value = "127.0.0.1")]
    address: String,
    /// Data port of shard 0 (shard k uses port + k).
    #[arg(long, default_value_t = 6800, value_parser = clap::value_parser!(u16).range(1..))]
    port: u16,
    /// Host name: the `host` failure domain [default: this machine's host name].
    #[arg(long)]
    host: Option<String>,
    /// Raft tick (at most 10s). Every OSD of a cluster needs a tick and election ticks whose
    /// leases fit the others' (docs/design/osd.md, "Reads"): the monitor refuses a boot
    /// otherwise.
    #[arg(long, default_value = "100ms", value_parser = interval_arg)]
    tick: Duration,
    /// Followers campaign after [N, 2N) ticks without a leader (3 to 10000).
    #[arg(long, default_value_t = 10)]
    election_ticks: usize,
    /// Leaders heartbeat every N ticks.
    #[arg(long, default_value_t = 2)]
    heartbeat_ticks: usize,
    /// Leaders serve reads under a lease of (election_ticks - 2) ticks after a quorum
    /// confirmed them, instead of a heartbeat round per read (docs/design/osd.md, "Reads").
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    lease_reads: bool,
    /// Monitor heartbeat interval.
    #[arg(long, default_value = "1s", value_parser = interval_arg)]
    heartbeat_interval: Duration,
    /// An op in flight this long is slow: the OSD reports it and the monitor raises
    /// `SLOW_OPS` (as Ceph's `osd_op_complaint_time`; docs/operations.md, "Slow ops");
    /// settable at runtime with `fastblock-client config set`.
    #[arg(long, default_value = "30s", value_parser = interval_arg)]
    op_complaint_time: Duration,
    /// How often applied data is flushed and logs compacted (sooner when the log has
    /// advanced by an eighth of the WAL). Each flush syncs the metadata file, which slows
    /// the WAL's fdatasyncs on the same disk for a few milliseconds: less often is a lower
    /// p99; the cost is more log to replay after a crash.
    #[arg(long, default_value = "1s", value_parser = interval_arg)]
    flush_interval: Duration,
    /// How a WAL commit makes its write durable: `dsync` (the write carries RWF_DSYNC: durable
    /// when it completes, one completion per commit), `two-step` (the write, then an io_uring
    /// fdatasync, as fio's `fdatasync=1`; io_uring runs it on an io-wq worker thread),
    /// `syscall` (the write through io_uring, then fdatasync(2) on the shard thread) or
    /// `linked` (write and fdatasync linked in one submission; a commit left in flight, see
    /// `--wal-commits-in-flight`, runs as `two-step`). Which is fastest depends on kernel,
    /// device and load: on the 2-vCPU VM of docs/benchmarks.md (2026-11-24), one writer,
    /// `dsync` 93 µs per commit, `two-step` 118 (bench/store-bench.sh); three OSDs,
    /// `dsync` against `two-step` side by side: 1-replica QD32 writes +17 %, 3-replica QD32
    /// +15 %, 3-replica QD1 latency -22 %, with 20-28 % less OSD CPU per write.
    /// `no-flush-benchmark-only` is for bench/run.sh only, never for data: the same writes
    /// without RWF_DSYNC or any fdatasync, so writes are acknowledged before they are durable
    /// and a power loss loses them; refused (exit status 2) unless the environment holds
    /// FASTBLOCK_BENCHMARK_ONLY_SKIP_FLUSH=acknowledged-writes-may-be-lost.
    #[arg(long, value_enum, default_value_t = WalSync::Dsync)]
    wal_sync: WalSync,
    /// WAL group commits a shard keeps in flight at once (1-8): while one commit's write
    /// runs, the shard keeps serving and writes the next. Only with io_uring and a `--wal-sync`
    /// other than `syscall`; otherwise each commit waits for its fdatasync. More than one
    /// splits the same load into smaller commits: on the 2-vCPU VM (CPU-bound) 2 did 16 %
    /// fewer 1-replica QD32 writes than 1 and the same 3-replica figures; a device with
    /// parallel queues and spare cores is where more can pay.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=8))]
    wal_commits_in_flight: u32,
    /// Log entries kept behind the flushed applied index for lagging followers, while more
    /// than half of the WAL is free (below that only what lagging members need is kept:
    /// docs/design/osd.md, step 5).
    #[arg(long, default_value_t = 1024)]
    log_retain_entries: u64,
    /// A member further behind than this many entries is caught up by snapshot: the log is
    /// not kept for it beyond that (bounds the WAL a dead member pins).
    #[arg(long, default_value_t = 65536)]
    log_lag_max_entries: u64,
    /// PG snapshot transfers this OSD sends at once (split across its shards, at least one
    /// each); further members wait their turn.
    #[arg(long, default_value_t = 4)]
    recovery_max_active: usize,
    /// Bytes per second this OSD spends sending PG snapshots (split across its shards), so
    /// recovery does not starve client IO (e.g. 64M).
    #[arg(long, default_value = "64M", value_parser = size)]
    recovery_max_bytes_per_sec: u64,
    /// Scrub each PG this OSD leads this long after its last scrub (or after taking it
    /// over): its replicas compare the checksums of their blocks, and those that disagree
    /// are repaired from the majority (docs/design/scrub.md). 0: only when asked
    /// (`fastblock-client pg scrub`).
    #[arg(long, default_value = "24h", value_parser = fastblock_types::units::duration_arg)]
    scrub_interval: Duration,
    /// A scheduled scrub is deep (every replica reads every block back and checks it) when
    /// the last deep one is this old. 0: only when asked (`pg deep-scrub`).
    #[arg(long, default_value = "168h", value_parser = fastblock_types::units::duration_arg)]
    deep_scrub_interval: Duration,
    /// Bytes per second a deep scrub reads on this OSD at most (split across its shards), so
    /// that client IO keeps priority (e.g. 64M).
    #[arg(long, default_value = "64M", value_parser = size)]
    scrub_deep_bytes_per_sec: u64,
    /// Serve Prometheus `/metrics` (IO counters, per-stage latency: docs/metrics.md) on this
    /// address, or `none` for no metrics server [default: --address, port --port + shards,
    /// the port after the last shard's data port].
    #[arg(long, value_name = "ADDR:PORT|none", value_parser = fastblock::metrics_arg::parse_metrics_addr)]
    metrics_addr: Option<fastblock::metrics_arg::MetricsArg>,
    /// For tests only, never for data: a JSON file of disk faults to inject into this OSD's
    /// shards (I/O errors, delays, corrupted reads), read at start and every 100 ms while it
    /// runs (docs/testing.md). Refused (exit status 2) unless the environment holds
    /// FASTBLOCK_TEST_FAULTS=1. Not used by --mkfs.
    #[arg(long, value_name = "PATH")]
    fault_injection_file: Option<PathBuf>,
}

/// A rate set at runtime: a size per second, positive (a zero rate would never finish).
fn positive_rate(input: &str) -> Result<u64, String> {
    match size(input)? {
        0 => Err(format!("{input:?} is zero: the rate must be positive")),
        rate => Ok(rate),
    }
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

const DAEMON: Daemon = Daemon {
    name: "osd",
    subcommand: None,
};

#[tokio::main]
async fn main() {
    let loaded = load_or_exit(&DAEMON, Args::command());
    let args = Args::from_arg_matches(&loaded.matches).unwrap_or_else(|e| e.exit());
    let log_level = LogLevel::init(&args.daemon.log_level);
    loaded.log_file();
    // Fail-stop: a panic on any thread (a shard's invariant broke) ends the whole OSD, so it
    // never keeps running with a dead shard that the monitor still believes is up.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default_hook(info);
        eprintln!("error: aborting after a panic (fail-stop)");
        std::process::abort();
    }));
    // Before anything is read or written (mkfs included): a usage error.
    let acknowledgement = std::env::var_os(fastblock_osd::no_flush::ACKNOWLEDGEMENT_VAR);
    if let Err(e) = fastblock_osd::no_flush::check(args.wal_sync.into(), acknowledgement.as_deref())
    {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
    let test_faults = std::env::var_os(fastblock_osd::faults::TEST_FAULTS_VAR);
    if let Err(e) =
        fastblock_osd::faults::check(args.fault_injection_file.as_deref(), test_faults.as_deref())
    {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
    let result = if args.mkfs {
        let shards = args.shards.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get() as u32)
                .unwrap_or(1)
        });
        mkfs(MkfsArgs {
            data: args.data.clone(),
            size_bytes: args.size,
            uuid: args.uuid.clone(),
            preallocate: args.preallocate,
            host_space_reserve_bytes: args.host_space_reserve,
            force: args.force,
            shards,
            monitors: args.mon.clone(),
            keyring: args.keyring.clone(),
        })
        .await
        .map(|identity| println!("{}", identity.id))
    } else {
        let lease_timing = LeaseTiming {
            tick_ms: u64::try_from(args.tick.as_millis()).unwrap_or(u64::MAX),
            election_ticks: args.election_ticks as u64,
            lease_reads: args.lease_reads,
        };
        if let Err(e) = lease_timing.validate() {
            eprintln!("error: --tick and --election-ticks: {e}");
            std::process::exit(2);
        }
        let pg_config = PgConfig {
            election_ticks: args.election_ticks,
            heartbeat_ticks: args.heartbeat_ticks,
            lease_ms: lease_timing.lease_ms(),
            ..PgConfig::default()
        };
        if let Err(e) = pg_config.validate() {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
        if args.scrub_deep_bytes_per_sec == 0 {
            eprintln!(
                "error: --scrub-deep-bytes-per-sec must be positive (a deep scrub \
                 could never finish)"
            );
            std::process::exit(2);
        }
        if args.recovery_max_active == 0 || args.recovery_max_bytes_per_sec == 0 {
            eprintln!(
                "error: --recovery-max-active and --recovery-max-bytes-per-sec must be \
                 positive (recovery could never finish)"
            );
            std::process::exit(2);
        }
        // Kept by the admin socket's setter for the life of the OSD; the shards follow it.
        let (flush_interval, flush_interval_rx) = tokio::sync::watch::channel(args.flush_interval);
        let (op_complaint_time, op_complaint_time_rx) =
            tokio::sync::watch::channel(args.op_complaint_time);
        let (rates, rates_rx) = tokio::sync::watch::channel(fastblock_osd::control::Rates {
            recovery_bytes_per_sec: args.recovery_max_bytes_per_sec,
            scrub_deep_bytes_per_sec: args.scrub_deep_bytes_per_sec,
        });
        let rates = Arc::new(rates);
        let recovery_rates = rates.clone();
        // The OSD's id names its admin socket; a data file without one fails in `run` below.
        let mut config_handler = None;
        if let Ok(identity) = fastblock_osd::identity::Identity::load(&args.data) {
            let runtime = RuntimeConfig::new(loaded.settings)
                .settable("log_level", Box::new(move |v| log_level.set(v)))
                .settable(
                    "flush_interval",
                    Box::new(move |v| {
                        let every = interval_arg(v)?;
                        flush_interval.send_replace(every);
                        Ok(v.to_string())
                    }),
                )
                .settable(
                    "op_complaint_time",
                    Box::new(move |v| {
                        let after = interval_arg(v)?;
                        op_complaint_time.send_replace(after);
                        Ok(v.to_string())
                    }),
                )
                .settable(
                    "recovery_max_bytes_per_sec",
                    Box::new(move |v| {
                        let rate = positive_rate(v)?;
                        recovery_rates.send_modify(|r| r.recovery_bytes_per_sec = rate);
                        Ok(v.to_string())
                    }),
                )
                .settable(
                    "scrub_deep_bytes_per_sec",
                    Box::new(move |v| {
                        let rate = positive_rate(v)?;
                        rates.send_modify(|r| r.scrub_deep_bytes_per_sec = rate);
                        Ok(v.to_string())
                    }),
                );
            let entity = format!("osd.{}", identity.id);
            let runtime = Arc::new(runtime);
            serve_or_warn(&args.daemon.run_dir, &entity, runtime.clone()).await;
            // Calls relayed by the monitor get the admin socket's answers: one implementation.
            config_handler = Some(fastblock_osd::config_calls::ConfigHandler::new(
                move |req| runtime.handle(req),
            ));
        }
        run(
            OsdConfig {
                data: args.data,
                monitors: args.mon,
                address: args.address,
                port: args.port,
                host: args.host.unwrap_or_else(host_name),
                tick: args.tick,
                lease_timing,
                heartbeat_interval: args.heartbeat_interval,
                op_complaint_time: op_complaint_time_rx,
                flush_interval: flush_interval_rx,
                wal_sync: args.wal_sync.into(),
                wal_commits_in_flight_max: args.wal_commits_in_flight as usize,
                log_retain_entries: args.log_retain_entries,
                log_lag_max_entries: args.log_lag_max_entries,
                pg_config,
                recovery_max_active: args.recovery_max_active,
                rates: rates_rx,
                scrub: fastblock_osd::ScrubSchedule {
                    interval_ms: u64::try_from(args.scrub_interval.as_millis()).unwrap_or(u64::MAX),
                    deep_interval_ms: u64::try_from(args.deep_scrub_interval.as_millis())
                        .unwrap_or(u64::MAX),
                    deep_bytes_per_sec: args.scrub_deep_bytes_per_sec,
                },
                metrics_addr: match args.metrics_addr {
                    None => fastblock_osd::metrics::MetricsAddr::AfterDataPorts,
                    Some(MetricsArg::Off) => fastblock_osd::metrics::MetricsAddr::Off,
                    Some(MetricsArg::At(addr)) => fastblock_osd::metrics::MetricsAddr::At(addr),
                },
                host_space_reserve_bytes: args.host_space_reserve,
                keyring: args.keyring,
                auth_floor: args.auth_floor,
                fault_injection_file: args.fault_injection_file,
                config_handler,
            },
            fastblock_osd::keys::new_shared(),
        )
        .await
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        // Settings the monitor refused, and an OSD it no longer knows (purged, or another
        // cluster's), are refused again on every restart: exit as for a bad argument, so that
        // a supervisor can tell this from a crash worth restarting (the systemd unit does not
        // restart on 2: deploy/systemd/fastblock-osd@.service).
        let refused = e.chain().any(|cause| {
            let code = match cause.downcast_ref::<fastblock_monclient::MonError>() {
                Some(mon) => mon.code(),
                None => cause.downcast_ref::<ApiError>().map(|a| a.code),
            };
            matches!(
                code,
                Some(
                    ErrorCode::IncompatibleConfig
                        | ErrorCode::OsdNotFound
                        | ErrorCode::UuidMismatch
                )
            )
        });
        std::process::exit(if refused { 2 } else { 1 });
    }
}

/// `--wal-sync` values (`fastblock_store::disk::SyncMode`).
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum WalSync {
    TwoStep,
    Syscall,
    Linked,
    Dsync,
    /// Measurement only (bench/run.sh), never for data: no device flush, a power loss loses
    /// acknowledged writes.
    NoFlushBenchmarkOnly,
}

impl From<WalSync> for fastblock_osd::SyncMode {
    fn from(w: WalSync) -> Self {
        use fastblock_osd::SyncMode;
        match w {
            WalSync::TwoStep => SyncMode::TwoStep,
            WalSync::Syscall => SyncMode::FdatasyncSyscall,
            WalSync::Linked => SyncMode::Fdatasync,
            WalSync::Dsync => SyncMode::DsyncWrites,
            WalSync::NoFlushBenchmarkOnly => SyncMode::NoFlushBenchmarkOnly,
        }
    }
}

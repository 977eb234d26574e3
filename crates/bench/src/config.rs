//! block_bench settings: the reference's JSON config file (`-C file.json`, keys of
//! `reference-fastblock.md` section 10) and the same settings as flags; flags win.
//!
//! Keys the reference reads for RDMA, SPDK or its messenger (`rdma_*`, `msg_*`, `osd_*`,
//! `io_queue_*`, ...) are accepted and ignored silently: they describe its transport, not the
//! workload. Any other unknown key is ignored with one warning line naming them all, so a typo
//! does not pass unnoticed.

use anyhow::{bail, Context, Result};
use clap::Parser;
use fastblock_client::types::units::parse_size;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// The monitor port when `mon_host` names only an address (the reference's).
pub const MON_PORT_DEFAULT: u16 = 3333;
/// The unit of the data stamp: every IO is a whole number of these.
pub const STAMP_BLOCK_BYTES: u64 = 4096;
/// Most IOs in flight; far above what one client needs, and it bounds the worker tasks.
pub const IO_DEPTH_MAX: usize = 4096;
/// Most runtime worker threads `--threads` takes.
pub const THREADS_MAX: usize = 64;
/// Most bench workers (`-m` cores): each holds its own connections to the monitor and to
/// every OSD it writes to.
pub const WORKERS_MAX: usize = 256;
/// Largest IO: the wire carries a 4 MiB piece per object request, and a bench IO spanning
/// many objects is not what this tool measures.
pub const IO_SIZE_BYTES_MAX: u64 = 64 << 20;

/// Reference keys that configure its RDMA/SPDK transport or unused features: accepted, ignored.
const IGNORED_PREFIXES: [&str; 5] = ["rdma_", "msg_", "osd_", "io_queue_", "io_dump_"];
const IGNORED_KEYS: [&str; 4] = [
    "io_print_stats_take_single_core",
    "io_print_stats_acc",
    "pool_id",
    "current_dir",
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoType {
    Write,
    Read,
    WriteRead,
}

impl std::str::FromStr for IoType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "write" => Ok(IoType::Write),
            "read" => Ok(IoType::Read),
            "write_read" => Ok(IoType::WriteRead),
            other => Err(format!(
                "unknown io_type {other:?}: expected write, read or write_read"
            )),
        }
    }
}

/// Command line. Every setting is optional here: unset ones come from the file, then from the
/// defaults.
#[derive(Debug, Default, Parser)]
#[command(
    name = "block_bench",
    version = fastblock_version::VERSION,
    about = "fastblock's block benchmark: the reference's block_bench (-C cfg.json, -m cores) over \
             the client library, with stamped, verifiable data"
)]
pub struct Args {
    /// JSON config file (the reference's keys).
    #[arg(short = 'C', long = "config", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Cores to run on, as the reference's SPDK `-m`: one worker per core, each pinned to its
    /// core and keeping io_depth IOs in flight, io_count shared out between them. A list
    /// `[16,17]` (ranges: `[0-3,8]`; brackets optional) or a hex mask `0x30000`. Without it:
    /// one unpinned worker.
    #[arg(short = 'm', long = "cpumask", value_name = "CORES", value_parser = core_list_arg)]
    pub cores: Option<CoreList>,
    /// write, read or write_read.
    #[arg(long)]
    pub io_type: Option<String>,
    /// Bytes per IO (4096, 4K, 1M); a multiple of 4 KiB.
    #[arg(long)]
    pub io_size: Option<String>,
    /// IOs per phase, over all workers.
    #[arg(long)]
    pub io_count: Option<u64>,
    /// IOs in flight per worker (per core of -m).
    #[arg(long)]
    pub io_depth: Option<u64>,
    /// Image name (created if missing); empty or absent: a random name.
    #[arg(long = "image")]
    pub image_name: Option<String>,
    /// Bytes the IOs stay within (64M, 1G): the size of an image created, at most the size
    /// of an existing one. Absent: the existing image's size.
    #[arg(long)]
    pub image_size: Option<String>,
    /// Object size of an image created (default: the monitor's).
    #[arg(long)]
    pub object_size: Option<String>,
    /// Pool of the image (required here or as "pool_name" in the file).
    #[arg(long = "pool")]
    pub pool_name: Option<String>,
    /// Monitor "ip" or "ip:port" (port 3333 by default); repeat or separate with commas.
    #[arg(long = "mon", value_delimiter = ',')]
    pub mon_host: Vec<String>,
    /// Warm-up seconds excluded from the statistics.
    #[arg(long)]
    pub deferred_time: Option<f64>,
    /// Check read data against the stamps written (`--verify false` to turn off).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub verify: Option<bool>,
    /// Sequential offsets instead of random ones.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub sequential: Option<bool>,
    /// Run until interrupted (or --runtime), with no IO count.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub infinity: Option<bool>,
    /// Stop each phase after this many seconds.
    #[arg(long, value_name = "SECS")]
    pub runtime: Option<f64>,
    /// Print a statistics line every this many milliseconds.
    #[arg(long, value_name = "MS")]
    pub print_stats_ms: Option<u64>,
    /// Seed of the random offsets and of a random image name (default: from the clock).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Print the final figures as JSON instead of the reference's text block.
    #[arg(long)]
    pub json: bool,
    /// Keyring holding the client's key (default: $FASTBLOCK_KEYRING, else
    /// /etc/fastblock/keyring, if it exists; docs/security.md).
    #[arg(long)]
    pub keyring: Option<std::path::PathBuf>,
    /// The weakest auth mode accepted from the monitor (none, sign, secure) [env:
    /// FASTBLOCK_AUTH_FLOOR; default: sign with a key, else none].
    #[arg(long, env = "FASTBLOCK_AUTH_FLOOR", value_name = "MODE")]
    pub auth_floor: Option<fastblock_types::auth::AuthMode>,
    /// The entity to act as.
    #[arg(long, default_value = "client.admin")]
    pub name: String,
    /// Runtime threads of each worker. One keeps each IO and its reply on one thread
    /// (no wake-up across threads per IO): on a small machine it costs less CPU per IO for
    /// the same IOPS. More for a depth one thread cannot keep up with. With -m, all of a
    /// worker's threads share its core. Default 1.
    #[arg(long)]
    pub threads: Option<usize>,
}

/// The cores of `-m`, ascending.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoreList(pub Vec<usize>);

fn core_list_arg(text: &str) -> Result<CoreList, String> {
    crate::cores::parse_core_list(text).map(CoreList)
}

/// A size given as a number of bytes or as text (`"64M"`).
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
enum SizeValue {
    Bytes(u64),
    Text(String),
}

/// `mon_host`: a list of hosts, or one string (comma-separated).
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
enum HostList {
    List(Vec<String>),
    One(String),
}

/// The JSON file as written by users of the reference.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct FileConfig {
    io_type: Option<String>,
    io_size: Option<SizeValue>,
    io_count: Option<u64>,
    io_depth: Option<u64>,
    image_name: Option<String>,
    image_size: Option<SizeValue>,
    object_size: Option<SizeValue>,
    pool_name: Option<String>,
    mon_host: Option<HostList>,
    deferred_time: Option<f64>,
    verify_read_data: Option<bool>,
    sequential_offsets: Option<bool>,
    infinity: Option<bool>,
    io_print_stats_enable: Option<bool>,
    io_print_stats_interval_ms: Option<u64>,
    #[serde(flatten)]
    rest: BTreeMap<String, serde_json::Value>,
}

/// Validated settings of one run.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchConfig {
    pub io_type: IoType,
    pub io_size: u64,
    /// IOs per phase (ignored with `infinity`).
    pub io_count: u64,
    /// IOs in flight per worker.
    pub io_depth: usize,
    /// `-m`: one worker per core, in core order; `None`: one unpinned worker.
    pub cores: Option<Vec<usize>>,
    /// Empty: pick a random name.
    pub image_name: String,
    /// The bytes IO stays within; `None`: the existing image's size (it must exist).
    pub image_size: Option<u64>,
    /// `None`: the monitor's default for a new image, the image's own for an existing one.
    pub object_size: Option<u64>,
    pub pool_name: String,
    /// `host:port` of each monitor.
    pub monitors: Vec<String>,
    pub deferred: Duration,
    pub verify: bool,
    pub sequential: bool,
    pub infinity: bool,
    pub print_stats_interval: Option<Duration>,
    pub runtime: Option<Duration>,
    pub json: bool,
    pub seed: Option<u64>,
    /// Keyring and entity for a cluster that authenticates (`None`: the default location).
    pub keyring: Option<std::path::PathBuf>,
    pub auth_floor: Option<fastblock_types::auth::AuthMode>,
    pub entity: String,
    /// Worker threads of the runtime.
    pub threads: usize,
    /// Unknown keys of the file, for the one warning line.
    pub unknown_keys: Vec<String>,
}

impl BenchConfig {
    /// Reads the file named by `args` (if any), applies the flags over it, and validates.
    pub fn load(args: &Args) -> Result<BenchConfig> {
        let file = match &args.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading config file {}", path.display()))?;
                parse_file(&text).with_context(|| format!("config file {}", path.display()))?
            }
            None => FileConfig::default(),
        };
        merge(file, args)
    }

    /// Same as [`BenchConfig::load`] from JSON text (tests).
    pub fn from_json(text: &str, args: &Args) -> Result<BenchConfig> {
        merge(parse_file(text)?, args)
    }
}

fn parse_file(text: &str) -> Result<FileConfig> {
    serde_json::from_str(text).map_err(|e| anyhow::anyhow!("invalid JSON config: {e}"))
}

fn size(what: &str, value: Option<SizeValue>) -> Result<Option<u64>> {
    match value {
        None => Ok(None),
        Some(SizeValue::Bytes(n)) => Ok(Some(n)),
        Some(SizeValue::Text(text)) => parse_size(&text)
            .map(Some)
            .map_err(|e| anyhow::anyhow!("{what}: {e}")),
    }
}

fn flag_size(what: &str, value: &Option<String>) -> Result<Option<u64>> {
    size(what, value.clone().map(SizeValue::Text))
}

/// `"ip"` → `"ip:3333"`; `"ip:port"` and `"[v6]:port"` are kept; a bare IPv6 address is
/// bracketed.
pub fn monitor_endpoint(host: &str) -> String {
    let host = host.trim().trim_start_matches("http://");
    if host.starts_with('[') {
        if host.contains("]:") {
            return host.to_string();
        }
        return format!("{host}:{MON_PORT_DEFAULT}");
    }
    match host.matches(':').count() {
        0 => format!("{host}:{MON_PORT_DEFAULT}"),
        1 => host.to_string(),
        _ => format!("[{host}]:{MON_PORT_DEFAULT}"),
    }
}

fn seconds(what: &str, value: f64) -> Result<Duration> {
    Duration::try_from_secs_f64(value)
        .map_err(|_| anyhow::anyhow!("{what} must be >= 0, got {value}"))
}

fn merge(file: FileConfig, args: &Args) -> Result<BenchConfig> {
    let unknown_keys: Vec<String> = file
        .rest
        .keys()
        .filter(|k| {
            !IGNORED_KEYS.contains(&k.as_str())
                && !IGNORED_PREFIXES.iter().any(|p| k.starts_with(p))
        })
        .cloned()
        .collect();
    let io_type: IoType = args
        .io_type
        .clone()
        .or(file.io_type)
        .unwrap_or_else(|| "write".to_string())
        .parse()
        .map_err(anyhow::Error::msg)?;
    let io_size = flag_size("io_size", &args.io_size)?
        .or(size("io_size", file.io_size)?)
        .unwrap_or(STAMP_BLOCK_BYTES);
    let io_count = args.io_count.or(file.io_count).unwrap_or(10_000);
    let io_depth = args.io_depth.or(file.io_depth).unwrap_or(1);
    let image_size =
        flag_size("image_size", &args.image_size)?.or(size("image_size", file.image_size)?);
    let object_size =
        flag_size("object_size", &args.object_size)?.or(size("object_size", file.object_size)?);
    let hosts: Vec<String> = if !args.mon_host.is_empty() {
        args.mon_host.clone()
    } else {
        match file.mon_host {
            Some(HostList::List(list)) => list,
            Some(HostList::One(text)) => text.split(',').map(str::to_string).collect(),
            None => vec!["127.0.0.1".to_string()],
        }
    };
    let monitors: Vec<String> = hosts
        .iter()
        .filter(|h| !h.trim().is_empty())
        .map(|h| monitor_endpoint(h))
        .collect();
    let deferred = seconds(
        "deferred_time",
        args.deferred_time.or(file.deferred_time).unwrap_or(10.0),
    )?;
    let runtime = args.runtime.map(|s| seconds("--runtime", s)).transpose()?;
    let print_stats_interval = match (args.print_stats_ms, file.io_print_stats_enable) {
        (Some(ms), _) => Some(ms),
        (None, Some(true)) => Some(file.io_print_stats_interval_ms.unwrap_or(1000)),
        (None, _) => None,
    }
    .map(Duration::from_millis);
    let cores = args.cores.clone().map(|c| c.0);
    let config = BenchConfig {
        io_type,
        io_size,
        io_count,
        io_depth: usize::try_from(io_depth).unwrap_or(usize::MAX),
        cores,
        image_name: args
            .image_name
            .clone()
            .or(file.image_name)
            .unwrap_or_default(),
        image_size,
        object_size,
        pool_name: args
            .pool_name
            .clone()
            .or(file.pool_name)
            .unwrap_or_default(),
        monitors,
        deferred,
        verify: args.verify.or(file.verify_read_data).unwrap_or(false),
        sequential: args.sequential.or(file.sequential_offsets).unwrap_or(false),
        infinity: args.infinity.or(file.infinity).unwrap_or(false),
        print_stats_interval,
        runtime,
        json: args.json,
        seed: args.seed,
        keyring: args.keyring.clone(),
        auth_floor: args.auth_floor,
        entity: args.name.clone(),
        threads: args.threads.unwrap_or(1),
        unknown_keys,
    };
    config.validate()?;
    Ok(config)
}

impl BenchConfig {
    fn validate(&self) -> Result<()> {
        if self.pool_name.is_empty() {
            bail!("pool_name is required (--pool or \"pool_name\" in the config file)");
        }
        if self.monitors.is_empty() {
            bail!("mon_host lists no monitor");
        }
        if self.io_size == 0 || self.io_size % STAMP_BLOCK_BYTES != 0 {
            bail!(
                "io_size {} is not a positive multiple of {STAMP_BLOCK_BYTES} (each 4 KiB block \
                 carries a verifiable stamp)",
                self.io_size
            );
        }
        if self.io_size > IO_SIZE_BYTES_MAX {
            bail!(
                "io_size {} is over the limit of {IO_SIZE_BYTES_MAX} bytes",
                self.io_size
            );
        }
        if self.io_depth == 0 || self.io_depth > IO_DEPTH_MAX {
            bail!(
                "io_depth {} is not within 1..={IO_DEPTH_MAX}",
                self.io_depth
            );
        }
        if self.threads == 0 || self.threads > THREADS_MAX {
            bail!("threads {} is not within 1..={THREADS_MAX}", self.threads);
        }
        if let Some(cores) = &self.cores {
            if cores.len() > WORKERS_MAX {
                bail!(
                    "-m names {} cores, more than the {WORKERS_MAX} workers block_bench runs",
                    cores.len()
                );
            }
        }
        if self.io_count == 0 && !self.infinity {
            bail!("io_count must be at least 1");
        }
        if let Some(image_size) = self.image_size {
            if image_size < self.io_size {
                bail!(
                    "image_size {image_size} is smaller than io_size {}",
                    self.io_size
                );
            }
            if let Some(object_size) = self.object_size {
                if image_size < object_size {
                    bail!("image_size {image_size} is smaller than object_size {object_size}");
                }
            }
        }
        if self.object_size == Some(0) {
            bail!("object_size must be above 0");
        }
        if self.infinity && self.io_type == IoType::WriteRead {
            bail!("infinity runs one phase forever; use io_type write or read with it");
        }
        if self.print_stats_interval == Some(Duration::ZERO) {
            bail!("io_print_stats_interval_ms must be above 0");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> Args {
        Args::default()
    }

    const DEV: &str = r#"{
        "io_type": "write_read", "io_size": 4096, "io_count": 1000, "io_depth": 4,
        "image_name": "dev-image", "image_size": 67108864, "object_size": 4194304,
        "pool_name": "fb", "mon_host": ["127.0.0.1", "10.0.0.2:4444"], "deferred_time": 0,
        "verify_read_data": true, "io_print_stats_enable": true,
        "io_print_stats_interval_ms": 500,
        "rdma_device_name": "mlx5_0", "msg_client_rpc_timeout_us": 1000,
        "io_queue_size": 128, "io_queue_request": 256, "pool_id": 3,
        "colour": "blue"
    }"#;

    #[test]
    fn reference_keys_parse_and_transport_keys_are_ignored() {
        let c = BenchConfig::from_json(DEV, &args()).unwrap();
        assert_eq!(c.io_type, IoType::WriteRead);
        assert_eq!((c.io_size, c.io_count, c.io_depth), (4096, 1000, 4));
        assert_eq!(c.image_name, "dev-image");
        assert_eq!(c.image_size, Some(64 << 20));
        assert_eq!(c.object_size, Some(4 << 20));
        assert_eq!(c.monitors, ["127.0.0.1:3333", "10.0.0.2:4444"]);
        assert_eq!(c.deferred, Duration::ZERO);
        assert!(c.verify);
        assert_eq!(c.print_stats_interval, Some(Duration::from_millis(500)));
        // Only the key nobody knows is reported.
        assert_eq!(c.unknown_keys, ["colour"]);
    }

    #[test]
    fn flags_override_the_file() {
        let a = Args {
            io_type: Some("read".into()),
            io_size: Some("8K".into()),
            io_depth: Some(32),
            mon_host: vec!["192.168.1.1".into()],
            verify: Some(false),
            deferred_time: Some(2.5),
            image_size: Some("1G".into()),
            ..args()
        };
        let c = BenchConfig::from_json(DEV, &a).unwrap();
        assert_eq!(c.io_type, IoType::Read);
        assert_eq!((c.io_size, c.io_depth), (8192, 32));
        assert_eq!(c.monitors, ["192.168.1.1:3333"]);
        assert!(!c.verify);
        assert_eq!(c.deferred, Duration::from_millis(2500));
        assert_eq!(c.image_size, Some(1 << 30));
        assert_eq!(c.io_count, 1000, "unset flags keep the file's value");
    }

    #[test]
    fn defaults_without_a_file() {
        let c = BenchConfig::from_json(
            "{}",
            &Args {
                pool_name: Some("p".into()),
                ..args()
            },
        )
        .unwrap();
        assert_eq!(c.io_type, IoType::Write);
        assert_eq!(c.io_size, 4096);
        assert_eq!(c.monitors, ["127.0.0.1:3333"]);
        assert_eq!(
            c.deferred,
            Duration::from_secs(10),
            "the reference's warm-up"
        );
        assert_eq!(c.print_stats_interval, None);
        assert!(c.image_name.is_empty());
        assert_eq!(c.threads, 1, "one runtime worker unless asked");
    }

    #[test]
    fn bad_input_gives_clear_errors() {
        let err = |json: &str| format!("{:#}", BenchConfig::from_json(json, &args()).unwrap_err());
        assert!(err("{\"io_size\": 4096,").contains("invalid JSON config"));
        assert!(err("[1, 2]").contains("invalid JSON config"));
        assert!(err(r#"{"pool_name": "fb", "io_count": "many"}"#).contains("invalid JSON config"));
        assert!(err(r#"{"pool_name": "fb", "io_type": "append"}"#).contains("unknown io_type"));
        assert!(err(r#"{"io_size": 4096}"#).contains("pool_name is required"));
        assert!(err(r#"{"pool_name": "fb", "io_size": 1000}"#).contains("multiple of 4096"));
        assert!(err(r#"{"pool_name": "fb", "io_size": "4Q"}"#).contains("io_size"));
        assert!(err(r#"{"pool_name": "fb", "io_depth": 0}"#).contains("io_depth"));
        for threads in [0, THREADS_MAX + 1] {
            let flags = Args {
                pool_name: Some("fb".into()),
                threads: Some(threads),
                ..args()
            };
            let e = format!("{:#}", BenchConfig::from_json("{}", &flags).unwrap_err());
            assert!(e.contains("threads"), "{e}");
        }
        assert!(err(r#"{"pool_name": "fb", "deferred_time": -1}"#).contains("deferred_time"));
        assert!(
            err(r#"{"pool_name": "fb", "image_size": 4096, "io_size": 8192}"#)
                .contains("smaller than io_size")
        );
        assert!(
            err(r#"{"pool_name": "fb", "infinity": true, "io_type": "write_read"}"#)
                .contains("infinity")
        );
    }

    #[test]
    fn the_core_list_of_the_reference_flow() {
        let parsed =
            Args::try_parse_from(["block_bench", "-C", "cfg.json", "-m", "[16,17]"]).unwrap();
        assert_eq!(parsed.cores, Some(CoreList(vec![16, 17])));
        let c = BenchConfig::from_json(DEV, &parsed).unwrap();
        assert_eq!(c.cores, Some(vec![16, 17]));
        assert_eq!(BenchConfig::from_json(DEV, &args()).unwrap().cores, None);
        let e = Args::try_parse_from(["block_bench", "-m", "16"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation);
        assert!(e.to_string().contains("ambiguous"), "{e}");
        let flags = Args {
            cores: Some(CoreList((0..512).collect())),
            ..args()
        };
        let e = format!("{:#}", BenchConfig::from_json(DEV, &flags).unwrap_err());
        assert!(e.contains("more than the 256 workers"), "{e}");
    }

    #[test]
    fn monitor_endpoints() {
        assert_eq!(monitor_endpoint("10.0.0.1"), "10.0.0.1:3333");
        assert_eq!(monitor_endpoint("10.0.0.1:80"), "10.0.0.1:80");
        assert_eq!(monitor_endpoint("::1"), "[::1]:3333");
        assert_eq!(monitor_endpoint("[::1]:9"), "[::1]:9");
        assert_eq!(monitor_endpoint("host"), "host:3333");
    }

    #[test]
    fn the_repository_example_parses() {
        let text = include_str!("../../../block_bench.json");
        let c = BenchConfig::from_json(text, &args()).unwrap();
        assert_eq!(c.io_type, IoType::WriteRead);
        assert_eq!(c.image_name, "dev-image");
        assert!(c.unknown_keys.is_empty(), "{:?}", c.unknown_keys);
    }
}

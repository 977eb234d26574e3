//! `fastblock-nbd`: serves the cluster's images as NBD exports `pool/image` (`serve`), or
//! attaches one to the kernel's nbd driver as `/dev/nbdX` (`map`, `unmap`). See
//! `docs/nbd.md`.

use anyhow::{Context, Result};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use fastblock::admin_socket::{serve_or_warn, RuntimeConfig};
use fastblock::config::{load_or_exit, Daemon, DaemonArgs, Setting};
use fastblock::logging::LogLevel;
use fastblock::metrics_arg::MetricsArg;
use fastblock_client::{ClientConfig, Cluster};
use fastblock_nbd::access::{parse_allow_rule, AllowList, AllowRule, TlsMode};
use fastblock_nbd::cluster::ClusterExports;
use fastblock_nbd::local_users::{parse_local_users, LocalUsers};
use fastblock_nbd::metrics::{Metered, NbdMetrics};
use fastblock_nbd::tls::TlsCredentials;
use fastblock_nbd::{certs, kernel, map, Server, ServerConfig};
use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;

#[derive(Parser, Debug)]
#[command(
    name = "fastblock-nbd",
    version = fastblock_version::VERSION,
    about = "NBD server for fastblock images: exports pool/image, kernel attach (docs/nbd.md)"
)]
struct Args {
    #[command(subcommand)]
    command: Cmd,
    #[command(flatten)]
    daemon: DaemonArgs,
    /// Keyring holding the client's key (default: $FASTBLOCK_KEYRING, else
    /// /etc/fastblock/keyring, if it exists; docs/security.md).
    #[arg(long, global = true)]
    keyring: Option<PathBuf>,
    /// The weakest auth mode accepted from the monitor (none, sign, secure) [default: sign
    /// with a key, else none]: a map or answer in a weaker mode is refused as a downgrade.
    #[arg(long, global = true, value_name = "MODE")]
    auth_floor: Option<fastblock_types::auth::AuthMode>,
    /// The entity to act as towards the cluster: by default a key of the server's own,
    /// limited to the pools it serves (`fastblock-client auth get-or-create client.nbd --caps
    /// pool=NAME -o KEYRING`; docs/nbd.md, "Its key").
    #[arg(long, global = true, default_value = NBD_ENTITY)]
    name: String,
    /// Worker threads serving the exports. One keeps each request, its IO to the OSDs and
    /// its reply on one thread (no wake-up across threads per request): on a small machine
    /// it serves more IOPS on less CPU. More for many busy exports.
    #[arg(long, global = true, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    threads: u16,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Serve every image of the cluster as the NBD export `pool/image`.
    Serve {
        /// Monitor API address(es), comma-separated.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "127.0.0.1:3333",
            env = "FASTBLOCK_MON"
        )]
        mon: Vec<String>,
        /// TCP address to listen on.
        #[arg(long, default_value = "127.0.0.1:10809")]
        bind: SocketAddr,
        /// Also listen on this Unix socket.
        #[arg(long)]
        socket: Option<PathBuf>,
        /// Do not listen on TCP (only on --socket).
        #[arg(long, requires = "socket")]
        no_tcp: bool,
        /// Serve Prometheus `/metrics` (per-export IO, latency, errors, retries:
        /// docs/metrics.md) on this address, or `none` [default: the --bind address, port
        /// + 1 (127.0.0.1:10810 for the default bind); 127.0.0.1:10810 with --no-tcp].
        #[arg(long, value_name = "ADDR:PORT|none", value_parser = fastblock::metrics_arg::parse_metrics_addr)]
        metrics_addr: Option<MetricsArg>,
        #[command(flatten)]
        access: AccessArgs,
    },
    /// Make a CA, a server certificate and client certificates in qemu's x509 layout
    /// (DIR for --tls-creds; DIR/client-NAME for each client).
    GenCerts {
        /// Directory to write (created if missing; existing files are never overwritten).
        #[arg(long)]
        dir: PathBuf,
        /// Name or address clients connect to (subject alternative name); repeatable.
        #[arg(long, required = true)]
        host: Vec<String>,
        /// Client certificate common name; repeatable.
        #[arg(long, default_value = "client")]
        client: Vec<String>,
    },
    /// Attach image `pool/image` to a kernel nbd device and print the device path. Serves it
    /// from a background process until `unmap` (or SIGTERM to that process).
    Map {
        /// The image, `pool/image`.
        image: String,
        /// Monitor API address(es), comma-separated.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "127.0.0.1:3333",
            env = "FASTBLOCK_MON"
        )]
        mon: Vec<String>,
        /// Use this device instead of the first free one.
        #[arg(long)]
        device: Option<PathBuf>,
        /// Serve from this process instead of a background one.
        #[arg(long)]
        foreground: bool,
    },
    /// Disconnect a device attached by `map`; the serving process exits.
    Unmap {
        /// The device, e.g. /dev/nbd0.
        device: PathBuf,
    },
}

/// TLS and who may use which export (`docs/nbd.md`, "TLS" and "Allow lists").
#[derive(clap::Args, Debug)]
struct AccessArgs {
    /// off: no TLS; on: offered, optional; require: nothing but STARTTLS before TLS.
    #[arg(long, default_value = "off")]
    tls: TlsMode,
    /// Directory with ca-cert.pem, server-cert.pem and server-key.pem (qemu's layout).
    #[arg(long, value_name = "DIR")]
    tls_creds: Option<PathBuf>,
    /// Require client certificates signed by DIR/ca-cert.pem.
    #[arg(long, requires = "tls_creds")]
    tls_verify_peer: bool,
    /// EXPORT=ID[,ID...]: only these clients may use EXPORT (pool/image or pool/*). An ID is
    /// an address, a CIDR range, or a client certificate common name. Repeatable.
    #[arg(long, value_name = "EXPORT=ID[,ID...]", value_parser = allow_rule)]
    allow: Vec<AllowRule>,
    /// Users of this host let in besides root and the server's own user (over the Unix socket,
    /// or TCP from this host): user names and uid:N, comma-separated, or `any` (docs/nbd.md,
    /// "Local users"). Clients with a verified certificate pass whatever their user.
    #[arg(long, value_name = "USER[,USER...]|any", value_parser = parse_local_users)]
    local_users: Option<LocalUsers>,
}

/// Where the client's key comes from (`--keyring`, `--name`).
struct Credentials {
    keyring: Option<PathBuf>,
    name: String,
    auth_floor: Option<fastblock_types::auth::AuthMode>,
}

fn allow_rule(s: &str) -> Result<AllowRule, String> {
    parse_allow_rule(s).map_err(|e| e.why)
}

/// The daemon is `serve` (and the background process of `map`): its flags and the global ones
/// are what the config file, the environment and the admin socket cover.
const DAEMON: Daemon = Daemon {
    name: "nbd",
    subcommand: Some("serve"),
};

fn main() {
    let loaded = load_or_exit(&DAEMON, Args::command());
    let args = Args::from_arg_matches(&loaded.matches).unwrap_or_else(|e| e.exit());
    let log_level = LogLevel::init(&args.daemon.log_level);
    loaded.log_file();
    let settings = loaded.settings;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(usize::from(args.threads))
        .enable_all()
        .build();
    let result = match runtime {
        Ok(runtime) => runtime.block_on(run(args, settings, log_level)),
        Err(e) => Err(anyhow::Error::new(e).context("starting the runtime")),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

async fn run(args: Args, settings: Vec<Setting>, log_level: LogLevel) -> Result<()> {
    if matches!(args.command, Cmd::Serve { .. }) {
        let runtime =
            RuntimeConfig::new(settings).settable("log_level", Box::new(move |v| log_level.set(v)));
        serve_or_warn(&args.daemon.run_dir, "nbd", std::sync::Arc::new(runtime)).await;
    }
    let who = Credentials {
        keyring: args.keyring,
        name: args.name,
        auth_floor: args.auth_floor,
    };
    match args.command {
        Cmd::Serve {
            mon,
            bind,
            socket,
            no_tcp,
            metrics_addr,
            access,
        } => {
            let listen = Listen {
                tcp: (!no_tcp).then_some(bind),
                unix: socket,
                metrics: metrics_addr,
            };
            serve(mon, &who, listen, access).await
        }
        Cmd::GenCerts { dir, host, client } => gen_certs(&dir, &host, &client),
        Cmd::Map {
            image,
            mon,
            device,
            foreground: true,
        } => map_foreground(mon, &who, &image, device).await,
        Cmd::Map { .. } => map_in_background(),
        Cmd::Unmap { device } => kernel::detach(&device).map_err(Into::into),
    }
}

/// The entity the server acts as unless `--name` says otherwise.
const NBD_ENTITY: &str = "client.nbd";

async fn connect(mon: Vec<String>, who: &Credentials) -> Result<ClusterExports> {
    check_own_key(who)?;
    let config = ClientConfig {
        keyring: who.keyring.clone(),
        entity: who.name.clone(),
        auth_floor: who.auth_floor,
        ..ClientConfig::new(mon)
    };
    let cluster = Cluster::connect(config)
        .await
        .context("connecting to the cluster")?;
    Ok(ClusterExports::new(cluster))
}

/// Acting as [`NBD_ENTITY`] with a keyring that holds no key for it (one holding only
/// `client.admin`, say): refused with the command that makes the key, rather than the bare
/// "no key" of the client library. Any other problem with the keyring is the library's to
/// report.
fn check_own_key(who: &Credentials) -> Result<()> {
    if who.name != NBD_ENTITY {
        return Ok(());
    }
    let path = match &who.keyring {
        Some(path) => path.clone(),
        None => fastblock_auth::keyring::resolve_path(None),
    };
    let Ok(keyring) = fastblock_auth::Keyring::load(&path) else {
        return Ok(());
    };
    let entity: fastblock_auth::EntityName = NBD_ENTITY.parse().expect("a valid entity name");
    if keyring.get(&entity).is_some() {
        return Ok(());
    }
    anyhow::bail!(
        "keyring {} has no key for {NBD_ENTITY}, which the NBD server acts as: a key of its own, \
         limited to the pools it serves. Create it with `fastblock-client auth get-or-create \
         {NBD_ENTITY} --caps pool=NAME -o {}`, or choose another entity with --name",
        path.display(),
        path.display()
    )
}

/// Where `serve` listens.
struct Listen {
    tcp: Option<SocketAddr>,
    unix: Option<PathBuf>,
    /// `--metrics-addr` (None: the default of `fastblock_nbd::metrics::default_addr`).
    metrics: Option<MetricsArg>,
}

async fn serve(
    mon: Vec<String>,
    who: &Credentials,
    listen: Listen,
    access: AccessArgs,
) -> Result<()> {
    let Listen { tcp, unix, metrics } = listen;
    let metrics_at = match metrics {
        Some(MetricsArg::Off) => None,
        Some(MetricsArg::At(addr)) => Some(addr),
        None => Some(fastblock_nbd::metrics::default_addr(tcp).map_err(anyhow::Error::msg)?),
    };
    let tls_credentials = match &access.tls_creds {
        Some(dir) => Some(
            TlsCredentials::load(dir, access.tls_verify_peer)
                .context("loading the TLS credentials")?,
        ),
        None => None,
    };
    let config = ServerConfig {
        tcp,
        unix: unix.clone(),
        tls_mode: access.tls,
        tls_credentials,
        allow: AllowList::new(access.allow),
        local_users: access.local_users.clone().unwrap_or_default(),
        ..ServerConfig::default()
    };
    // Before reaching the cluster, which can take its 30 s when the monitors are down.
    config.check_tls()?;
    let exports = connect(mon, who).await?;
    let registry = Arc::new(NbdMetrics::new());
    let metrics_task = match metrics_at {
        Some(addr) => {
            let (registry, exports) = (registry.clone(), exports.clone());
            let render = move || registry.render(Some(exports.client_stats()));
            let (bound, task) = fastblock_nbd::metrics::serve(addr, render)
                .await
                .with_context(|| {
                    format!(
                        "binding the metrics address {addr} (choose another with \
                         --metrics-addr ADDR:PORT, or none)"
                    )
                })?;
            tracing::info!(%bound, "serving /metrics");
            Some(task)
        }
        None => None,
    };
    let server = Server::bind(config, Metered::new(exports, registry)).await?;
    tracing::info!(
        tcp = ?server.tcp_addr(),
        unix = ?unix,
        tls = ?access.tls,
        "serving NBD exports pool/image"
    );
    let metrics_failed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let failed = metrics_failed.clone();
    let shutdown = async move {
        let Some(task) = metrics_task else {
            return terminated().await;
        };
        tokio::select! {
            _ = terminated() => {}
            ended = task => {
                // The server never ends on its own (axum retries failed accepts): stop
                // rather than run on unobserved.
                tracing::error!("the metrics server ended ({ended:?}): draining");
                failed.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
    };
    server.run(shutdown).await;
    if metrics_failed.load(std::sync::atomic::Ordering::Relaxed) {
        anyhow::bail!("the metrics server ended");
    }
    Ok(())
}

fn gen_certs(dir: &std::path::Path, hosts: &[String], clients: &[String]) -> Result<()> {
    let written = certs::generate(dir, hosts, clients)?;
    println!(
        "server: --tls-creds {} (ca-cert.pem, server-cert.pem, server-key.pem)",
        written.server_dir.display()
    );
    for client in written.client_dirs {
        println!("client: {}", client.display());
    }
    Ok(())
}

async fn map_foreground(
    mon: Vec<String>,
    who: &Credentials,
    image: &str,
    device: Option<PathBuf>,
) -> Result<()> {
    // The driver first: without it there is no point in reaching the cluster.
    let device = match device {
        Some(device) => device,
        None => kernel::free_device()?,
    };
    let exports = connect(mon, who).await?;
    let attached = |device: &std::path::Path| {
        // The parent `map` reads this line and exits; nothing else goes to stdout.
        println!("{}", device.display());
        let _ = std::io::stdout().flush();
    };
    map::run(&exports, image, Some(device), attached, terminated()).await?;
    Ok(())
}

/// Re-runs this command with `--foreground` as a child in its own process group (so a
/// terminal's Ctrl-C or hang-up does not reach it), prints the device it attached and
/// returns; the child keeps serving.
fn map_in_background() -> Result<()> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().context("locating this program")?;
    let mut child = Command::new(exe)
        .args(std::env::args_os().skip(1))
        .arg("--foreground")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .process_group(0)
        .spawn()
        .context("starting the serving process")?;
    let stdout = child.stdout.take().context("child stdout")?;
    let mut line = String::new();
    std::io::BufReader::new(stdout).read_line(&mut line)?;
    if line.trim().is_empty() {
        // The child failed before attaching (it printed why on stderr).
        let status = child.wait()?;
        anyhow::bail!("map failed ({status})");
    }
    println!("{}", line.trim());
    Ok(())
}

/// Completes on SIGTERM or SIGINT.
async fn terminated() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without signal handlers the process can only be killed; serve until then.
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::info!("signal received: draining");
}

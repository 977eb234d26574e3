//! `fastblock-nbd`: serves the cluster's images as NBD exports `pool/image` (`serve`), or
//! attaches one to the kernel's nbd driver as `/dev/nbdX` (`map`, `unmap`). See
//! `docs/nbd.md`.

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use fastblock_client::{ClientConfig, Cluster};
use fastblock_nbd::cluster::ClusterExports;
use fastblock_nbd::{kernel, map, Server, ServerConfig};
use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};

#[derive(Parser, Debug)]
#[command(
    version,
    about = "NBD server for fastblock images: exports pool/image, kernel attach (docs/nbd.md)"
)]
struct Args {
    #[command(subcommand)]
    command: Cmd,
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

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let result = match Args::parse().command {
        Cmd::Serve {
            mon,
            bind,
            socket,
            no_tcp,
        } => serve(mon, (!no_tcp).then_some(bind), socket).await,
        Cmd::Map {
            image,
            mon,
            device,
            foreground: true,
        } => map_foreground(mon, &image, device).await,
        Cmd::Map { .. } => map_in_background(),
        Cmd::Unmap { device } => kernel::detach(&device).map_err(Into::into),
    };
    if let Err(e) = result {
        eprintln!("fastblock-nbd: {e:#}");
        std::process::exit(1);
    }
}

async fn connect(mon: Vec<String>) -> Result<ClusterExports> {
    let cluster = Cluster::connect(ClientConfig::new(mon))
        .await
        .context("connecting to the cluster")?;
    Ok(ClusterExports::new(cluster))
}

async fn serve(mon: Vec<String>, tcp: Option<SocketAddr>, unix: Option<PathBuf>) -> Result<()> {
    let exports = connect(mon).await?;
    let config = ServerConfig {
        tcp,
        unix: unix.clone(),
        ..ServerConfig::default()
    };
    let server = Server::bind(config, exports).await?;
    tracing::info!(tcp = ?server.tcp_addr(), unix = ?unix, "serving NBD exports pool/image");
    server.run(terminated()).await;
    Ok(())
}

async fn map_foreground(mon: Vec<String>, image: &str, device: Option<PathBuf>) -> Result<()> {
    // The driver first: without it there is no point in reaching the cluster.
    let device = match device {
        Some(device) => device,
        None => kernel::free_device()?,
    };
    let exports = connect(mon).await?;
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

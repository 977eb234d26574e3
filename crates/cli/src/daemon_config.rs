//! `fastblock-client config show|get|set TARGET [KEY [VALUE]]`: a daemon's settings, read and
//! changed through its admin socket, `<run-dir>/<entity>.asok` (docs/operations.md,
//! "Configuration"); an OSD whose socket is not on this host is reached through the monitor
//! instead ([`run_relayed`]), which hands the call to the OSD in its heartbeats.
//!
//! Why the admin socket first: a daemon's log filter and tunables are its own process state,
//! the socket reaches the NBD server (which holds no key table and could not check a signed
//! call) and monitors as well as OSDs, and it works while the monitors are down, which is when
//! an operator most wants debug logs. The relay is for OSDs on other hosts, with an admin key. Who may
//! use it is decided by the kernel: the socket is created mode 0600 and the daemon also checks
//! the caller's uid (its own or root), as Ceph's admin socket does; docs/security.md.
//!
//! The protocol: one JSON [`AdminRequest`] line from the client, one JSON [`AdminReply`] line
//! back, then the daemon closes the connection.

use crate::exit::Failure;
use anyhow::{Context, Result};
use fastblock_monclient::MonClient;
use fastblock_types::OsdId;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// The most one request or reply line may hold.
pub const ADMIN_LINE_BYTES_MAX: u64 = 1 << 20;
/// How long the client waits for the daemon's answer.
pub const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);

pub use fastblock_types::daemon_config::{AdminReply, AdminRequest, SettingView};

/// Which daemon: `osd.N`, `mon.NAME`, `mon` (the only monitor with a socket in the run
/// directory) or `nbd`.
pub fn socket_for(run_dir: &Path, target: &str) -> Result<PathBuf> {
    let valid = target == "mon"
        || target == "nbd"
        || target
            .strip_prefix("osd.")
            .is_some_and(|id| id.parse::<u32>().is_ok())
        || target
            .strip_prefix("mon.")
            .is_some_and(|name| !name.is_empty() && !name.contains('/'));
    if !valid {
        return Err(anyhow::Error::new(Failure::Usage(format!(
            "invalid daemon {target:?}: expected osd.N, mon, mon.NAME or nbd"
        ))));
    }
    if target != "mon" {
        return Ok(run_dir.join(format!("{target}.asok")));
    }
    let entries = std::fs::read_dir(run_dir)
        .with_context(|| format!("reading the run directory {}", run_dir.display()))?;
    let mut monitors: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("mon.") && n.ends_with(".asok"))
        })
        .collect();
    monitors.sort();
    match monitors.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(anyhow::Error::new(Failure::NotFound(format!(
            "no monitor admin socket (mon.NAME.asok) in {}",
            run_dir.display()
        )))),
        many => Err(anyhow::Error::new(Failure::Usage(format!(
            "several monitors have admin sockets in {}: name one as mon.NAME ({})",
            run_dir.display(),
            many.iter()
                .filter_map(|p| p.file_stem().and_then(|s| s.to_str()))
                .collect::<Vec<_>>()
                .join(", ")
        )))),
    }
}

/// Sends one request to the daemon at `socket` and returns its reply.
pub async fn call(socket: &Path, request: &AdminRequest) -> Result<AdminReply> {
    let exchange = async {
        let mut stream = tokio::net::UnixStream::connect(socket).await.map_err(|e| {
            anyhow::Error::new(Failure::Unreachable(format!(
                "admin socket {}: {e} (is the daemon running on this host, with this --run-dir?)",
                socket.display()
            )))
        })?;
        let mut line = serde_json::to_vec(request)?;
        line.push(b'\n');
        stream.write_all(&line).await?;
        let mut reply = String::new();
        BufReader::new(stream)
            .take(ADMIN_LINE_BYTES_MAX)
            .read_line(&mut reply)
            .await?;
        serde_json::from_str::<AdminReply>(&reply)
            .with_context(|| format!("reading the reply of {}", socket.display()))
    };
    tokio::time::timeout(ADMIN_TIMEOUT, exchange)
        .await
        .map_err(|_| {
            anyhow::Error::new(Failure::Unreachable(format!(
                "admin socket {}: no answer within {ADMIN_TIMEOUT:?}",
                socket.display()
            )))
        })?
}

/// The OSD to reach through the monitor: `target` is `osd.N` and this host has no admin socket
/// of it in `run_dir` (the OSD runs elsewhere). None: use the local socket.
pub fn relayed_osd(run_dir: &Path, target: &str) -> Result<Option<OsdId>> {
    let socket = socket_for(run_dir, target)?;
    let Some(id) = target.strip_prefix("osd.") else {
        return Ok(None);
    };
    if socket.symlink_metadata().is_ok() {
        return Ok(None);
    }
    let id = id
        .parse()
        .expect("socket_for accepts osd.N only with a number");
    Ok(Some(OsdId(id)))
}

/// Runs `config show|get|set` on a daemon of this host, through its admin socket, and prints
/// the answer.
pub async fn run(
    run_dir: &Path,
    target: &str,
    request: &AdminRequest,
    json: bool,
    out: &mut dyn Write,
) -> Result<()> {
    let socket = socket_for(run_dir, target)?;
    let reply = call(&socket, request).await?;
    print(target, request, reply, json, out)
}

/// Runs `config show|get|set` on OSD `id` through the monitor, which relays it in the OSD's
/// heartbeats, and prints the answer.
pub async fn run_relayed(
    client: &MonClient,
    id: OsdId,
    request: &AdminRequest,
    json: bool,
    out: &mut dyn Write,
) -> Result<()> {
    let reply = client.osd_config(id, request).await?;
    print(&format!("osd.{id}"), request, reply, json, out)
}

/// Prints a daemon's answer: `KEY VALUE (SOURCE)` lines, the value alone for `get`, or JSON.
fn print(
    target: &str,
    request: &AdminRequest,
    reply: AdminReply,
    json: bool,
    out: &mut dyn Write,
) -> Result<()> {
    if let Some(why) = reply.error {
        return Err(anyhow::Error::new(Failure::Refused(format!(
            "{target}: {why}"
        ))));
    }
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(&reply.settings)?)?;
        return Ok(());
    }
    match request {
        AdminRequest::Get { .. } => {
            for s in &reply.settings {
                writeln!(out, "{}", s.value)?;
            }
        }
        _ => {
            let width = reply
                .settings
                .iter()
                .map(|s| s.key.len())
                .max()
                .unwrap_or(0);
            for s in &reply.settings {
                let settable = if s.settable { " settable" } else { "" };
                // An unset flag (an optional one not given) reads `-`.
                let value = if s.value.is_empty() { "-" } else { &s.value };
                writeln!(out, "{:width$}  {value}  ({}{settable})", s.key, s.source)?;
            }
        }
    }
    Ok(())
}

//! `fastblock-client config show|get|set TARGET [KEY [VALUE]]`: a daemon's settings, read and
//! changed through its admin socket, `<run-dir>/<entity>.asok` (docs/operations.md,
//! "Configuration").
//!
//! Why a Unix socket on the daemon's host rather than a call relayed by the monitor: a daemon's
//! log filter and tunables are its own process state, the socket reaches the NBD server (which
//! holds no key table and could not check a signed call) as well as OSDs and monitors, and it
//! works while the monitors are down, which is when an operator most wants debug logs. Who may
//! use it is decided by the kernel: the socket is created mode 0600 and the daemon also checks
//! the caller's uid (its own or root), as Ceph's admin socket does; docs/security.md.
//!
//! The protocol: one JSON [`AdminRequest`] line from the client, one JSON [`AdminReply`] line
//! back, then the daemon closes the connection.

use crate::exit::Failure;
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// The most one request or reply line may hold.
pub const ADMIN_LINE_BYTES_MAX: u64 = 1 << 20;
/// How long the client waits for the daemon's answer.
pub const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum AdminRequest {
    Show,
    Get { key: String },
    Set { key: String, value: String },
}

/// One setting: its effective value, where it came from (`default`, `file`, `env`, `flag`,
/// `runtime`) and whether `config set` may change it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SettingView {
    pub key: String,
    pub value: String,
    pub source: String,
    pub settable: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdminReply {
    /// `show`: every setting; `get` and `set`: the one named (after the change).
    pub settings: Vec<SettingView>,
    /// Why the request was refused (nothing changed).
    pub error: Option<String>,
}

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

/// Runs `config show|get|set` and prints the answer: `KEY VALUE (SOURCE)` lines, or JSON.
pub async fn run(
    run_dir: &Path,
    target: &str,
    request: &AdminRequest,
    json: bool,
    out: &mut dyn Write,
) -> Result<()> {
    let socket = socket_for(run_dir, target)?;
    let reply = call(&socket, request).await?;
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

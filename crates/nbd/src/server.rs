//! The listeners (TCP and a Unix socket), one task per connection (handshake, then
//! transmission), and shutdown: stop accepting, let every connection finish the requests it
//! admitted, close.

use crate::backend::Exports;
use crate::handshake::{negotiate, Outcome};
use crate::transmission::{serve, Limits};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// The IANA port of NBD.
pub const DEFAULT_PORT: u16 = 10809;

#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// TCP address to listen on (`None`: no TCP listener).
    pub tcp: Option<SocketAddr>,
    /// Unix socket path to listen on (`None`: no Unix listener).
    pub unix: Option<PathBuf>,
    pub limits: Limits,
    /// Limit of the whole handshake of one connection (greeting to `GO`).
    pub handshake_timeout: Duration,
    /// Connections served at once; more are accepted and closed at once.
    pub connections_max: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            tcp: Some(SocketAddr::from(([127, 0, 0, 1], DEFAULT_PORT))),
            unix: None,
            limits: Limits::default(),
            handshake_timeout: Duration::from_secs(30),
            connections_max: 1024,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("binding {what}: {source}")]
    Bind {
        what: String,
        source: std::io::Error,
    },
    #[error("no listener configured (neither TCP nor a Unix socket)")]
    NoListener,
}

/// A bound server. [`Server::run`] serves until its shutdown future completes.
pub struct Server<E: Exports> {
    exports: Arc<E>,
    config: ServerConfig,
    tcp: Option<TcpListener>,
    unix: Option<UnixListener>,
}

impl<E: Exports> Server<E> {
    /// Binds the configured listeners. A stale Unix socket file at the path (left by a
    /// killed server) is replaced; any other file there is an error.
    pub async fn bind(config: ServerConfig, exports: E) -> Result<Server<E>, ServerError> {
        if config.tcp.is_none() && config.unix.is_none() {
            return Err(ServerError::NoListener);
        }
        let tcp = match config.tcp {
            Some(addr) => {
                Some(
                    TcpListener::bind(addr)
                        .await
                        .map_err(|source| ServerError::Bind {
                            what: addr.to_string(),
                            source,
                        })?,
                )
            }
            None => None,
        };
        let unix = match &config.unix {
            Some(path) => Some(bind_unix(path).map_err(|source| ServerError::Bind {
                what: path.display().to_string(),
                source,
            })?),
            None => None,
        };
        Ok(Server {
            exports: Arc::new(exports),
            config,
            tcp,
            unix,
        })
    }

    /// The bound TCP address (the port, when 0 was asked for).
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Accepts and serves connections until `shutdown` completes; then stops accepting,
    /// tells every connection to stop reading requests, and waits for them to answer the
    /// requests they already admitted (each bounded by the drain timeout).
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) {
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut connections = JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            while connections.try_join_next().is_some() {}
            tokio::select! {
                _ = &mut shutdown => break,
                accepted = accept_tcp(self.tcp.as_ref()) => match accepted {
                    Ok((stream, peer)) => {
                        let _ = stream.set_nodelay(true);
                        let (r, w) = stream.into_split();
                        self.spawn(&mut connections, r, w, peer.to_string(), &stop_rx);
                    }
                    Err(e) => accept_failed(e).await,
                },
                accepted = accept_unix(self.unix.as_ref()) => match accepted {
                    Ok(stream) => {
                        let (r, w) = stream.into_split();
                        self.spawn(&mut connections, r, w, "unix".into(), &stop_rx);
                    }
                    Err(e) => accept_failed(e).await,
                },
            }
        }
        tracing::info!(
            connections = connections.len(),
            "shutting down: draining connections"
        );
        let _ = stop_tx.send(true);
        while connections.join_next().await.is_some() {}
        if let Some(path) = &self.config.unix {
            let _ = std::fs::remove_file(path);
        }
        tracing::info!("all connections closed");
    }

    fn spawn<R, W>(
        &self,
        connections: &mut JoinSet<()>,
        reader: R,
        writer: W,
        peer: String,
        stop: &watch::Receiver<bool>,
    ) where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        if connections.len() >= self.config.connections_max {
            tracing::warn!(%peer, "connection limit reached; closing the new connection");
            return;
        }
        let exports = self.exports.clone();
        let config = self.config.clone();
        let stop = stop.clone();
        connections.spawn(async move {
            match connection(reader, writer, &*exports, &config, stop).await {
                Ok(()) => tracing::debug!(%peer, "connection closed"),
                Err(e) => tracing::warn!(%peer, "connection ended: {e}"),
            }
        });
    }
}

/// One connection: handshake (bounded by the timeout, abandoned at shutdown), then
/// transmission.
pub async fn connection<R, W, E>(
    mut reader: R,
    mut writer: W,
    exports: &E,
    config: &ServerConfig,
    mut stop: watch::Receiver<bool>,
) -> Result<(), String>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
    E: Exports,
{
    let handshake = tokio::time::timeout(
        config.handshake_timeout,
        negotiate(&mut reader, &mut writer, exports),
    );
    let outcome = tokio::select! {
        _ = stop.wait_for(|s| *s) => return Ok(()),
        outcome = handshake => outcome,
    };
    let outcome = match outcome {
        Err(_) => {
            return Err(format!(
                "handshake timeout ({:?})",
                config.handshake_timeout
            ))
        }
        Ok(Err(e)) => return Err(format!("handshake: {e}")),
        Ok(Ok(outcome)) => outcome,
    };
    let Outcome::Transmission {
        name,
        export,
        negotiated,
    } = outcome
    else {
        return Ok(());
    };
    tracing::debug!(export = %name, structured = negotiated.structured, "transmission");
    serve(reader, writer, export, negotiated, config.limits, stop)
        .await
        .map_err(|e| format!("export {name}: {e}"))
}

async fn accept_tcp(
    listener: Option<&TcpListener>,
) -> std::io::Result<(tokio::net::TcpStream, SocketAddr)> {
    match listener {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
}

async fn accept_unix(listener: Option<&UnixListener>) -> std::io::Result<tokio::net::UnixStream> {
    match listener {
        Some(l) => l.accept().await.map(|(s, _)| s),
        None => std::future::pending().await,
    }
}

/// Accept errors (out of file descriptors, a connection reset before accept) are not fatal:
/// log, pause a little so that a persistent one does not spin, go on.
async fn accept_failed(e: std::io::Error) {
    tracing::warn!("accept: {e}");
    tokio::time::sleep(Duration::from_millis(100)).await;
}

fn bind_unix(path: &Path) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::FileTypeExt;
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        // A socket nobody answers on is a leftover of a killed server; one that answers
        // belongs to a live server and is not taken over.
        let live = std::os::unix::net::UnixStream::connect(path).is_ok();
        if meta.file_type().is_socket() && !live {
            std::fs::remove_file(path)?;
        }
    }
    UnixListener::bind(path)
}

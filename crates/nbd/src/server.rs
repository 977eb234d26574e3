//! The listeners (TCP and a Unix socket), one task per connection (handshake, the TLS upgrade
//! if the client asks for it, then transmission), and shutdown: stop accepting, let every
//! connection finish the requests it admitted, close.

use crate::access::{AllowList, LocalPeer, Peer, TlsMode};
use crate::backend::Exports;
use crate::handshake::{Handshake, Outcome, Policy};
use crate::local_users::{is_loopback, server_uid, tcp_peer_uid, LocalUsers};
use crate::tls::TlsCredentials;
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
    /// Whether TLS is offered (`On`) or required (`Require`); needs `tls_credentials`.
    pub tls_mode: TlsMode,
    pub tls_credentials: Option<TlsCredentials>,
    /// Limit of the TLS handshake after `STARTTLS` (inside the handshake limit).
    pub tls_handshake_timeout: Duration,
    /// Per-export allow lists (`docs/nbd.md`, "Allow lists").
    pub allow: AllowList,
    /// The users of this host let in besides root and the server's own (`docs/nbd.md`,
    /// "Local users").
    pub local_users: LocalUsers,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            tcp: Some(SocketAddr::from(([127, 0, 0, 1], DEFAULT_PORT))),
            unix: None,
            limits: Limits::default(),
            handshake_timeout: Duration::from_secs(30),
            connections_max: 1024,
            tls_mode: TlsMode::Off,
            tls_credentials: None,
            tls_handshake_timeout: Duration::from_secs(10),
            allow: AllowList::default(),
            local_users: LocalUsers::default(),
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
    #[error("--tls {0} needs TLS credentials (--tls-creds DIR)")]
    NoTlsCredentials(TlsMode),
    #[error("TLS credentials are loaded but the TLS mode is off (use --tls on or require)")]
    UnusedTlsCredentials,
    #[error(
        "an allow list names a client certificate, but client certificates are not verified \
         (--tls on|require with --tls-verify-peer)"
    )]
    UnverifiedCommonNames,
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
        config.check_tls()?;
        if let Some(addr) = config.tcp {
            if !addr.ip().is_loopback() && config.tls_mode != TlsMode::Require {
                tracing::warn!(
                    "listening on {addr}, which is not a loopback address, without --tls \
                     require: anyone who can reach it can read and write every image"
                );
            }
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
                        let local = local_peer(peer, stream.local_addr().ok());
                        let who = Peer { addr: Some(peer.ip()), common_name: None, local };
                        self.spawn(&mut connections, stream, who, peer.to_string(), &stop_rx);
                    }
                    Err(e) => accept_failed(e).await,
                },
                accepted = accept_unix(self.unix.as_ref()) => match accepted {
                    Ok(stream) => {
                        let uid = stream.peer_cred().ok().map(|c| c.uid());
                        let who = Peer { local: Some(LocalPeer { uid }), ..Peer::default() };
                        self.spawn(&mut connections, stream, who, "unix".into(), &stop_rx);
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

    fn spawn<S: Stream>(
        &self,
        connections: &mut JoinSet<()>,
        stream: S,
        peer: Peer,
        label: String,
        stop: &watch::Receiver<bool>,
    ) {
        if connections.len() >= self.config.connections_max {
            tracing::warn!(peer = %label, "connection limit reached; closing the new connection");
            return;
        }
        let exports = self.exports.clone();
        let config = self.config.clone();
        let stop = stop.clone();
        connections.spawn(async move {
            match connection(stream, peer, &label, &*exports, &config, stop).await {
                Ok(()) => tracing::debug!(peer = %label, "connection closed"),
                Err(e) => tracing::warn!(peer = %label, "connection ended: {e}"),
            }
        });
    }
}

impl ServerConfig {
    /// The TLS settings must be usable as given: a mode that offers TLS has credentials,
    /// loaded credentials are used, and a common name in an allow list can match (client
    /// certificates are verified). [`Server::bind`] checks this too.
    pub fn check_tls(&self) -> Result<(), ServerError> {
        check_tls(self)
    }
}

fn check_tls(config: &ServerConfig) -> Result<(), ServerError> {
    match (config.tls_mode, &config.tls_credentials) {
        (TlsMode::On | TlsMode::Require, None) => {
            return Err(ServerError::NoTlsCredentials(config.tls_mode))
        }
        (TlsMode::Off, Some(_)) => return Err(ServerError::UnusedTlsCredentials),
        _ => {}
    }
    let verified = config
        .tls_credentials
        .as_ref()
        .is_some_and(|c| c.verify_peer());
    if config.allow.names_common_names() && !verified {
        return Err(ServerError::UnverifiedCommonNames);
    }
    Ok(())
}

/// A connected socket: TCP, a Unix socket, or a TLS session over either. The connection's
/// one task reads and writes it whole (no split: a TLS session is one state machine for both
/// directions).
pub trait Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static {}

impl Stream for tokio::net::TcpStream {}

impl Stream for tokio::net::UnixStream {}

impl<S: Stream> Stream for tokio_rustls::server::TlsStream<S> {}

/// One connection: handshake with the TLS upgrade (bounded by the timeout, abandoned at
/// shutdown), then transmission.
pub async fn connection<S, E>(
    stream: S,
    peer: Peer,
    label: &str,
    exports: &E,
    config: &ServerConfig,
    mut stop: watch::Receiver<bool>,
) -> Result<(), String>
where
    S: Stream,
    E: Exports,
{
    let policy = Policy {
        tls: config.tls_mode,
        allow: &config.allow,
        local_users: &config.local_users,
        server_uid: server_uid(),
    };
    let mut handshake = Handshake::new(exports, policy, peer, label);
    let phase = tokio::time::timeout(
        config.handshake_timeout,
        handshake_phase(stream, &mut handshake, config),
    );
    let ended = tokio::select! {
        _ = stop.wait_for(|s| *s) => return Ok(()),
        ended = phase => ended,
    };
    let ended = ended.map_err(|_| format!("handshake timeout ({:?})", config.handshake_timeout))?;
    match ended? {
        Haggled::Plain(stream, outcome) => transmit(stream, outcome, config, stop).await,
        Haggled::Tls(stream, outcome) => transmit(*stream, outcome, config, stop).await,
    }
}

/// How option haggling ended, on which stream.
enum Haggled<S: Stream, X> {
    Plain(S, Outcome<X>),
    /// Boxed: the TLS session state is over a kilobyte, and lives as long as the connection.
    Tls(Box<tokio_rustls::server::TlsStream<S>>, Outcome<X>),
}

async fn handshake_phase<S: Stream, E: Exports>(
    mut stream: S,
    handshake: &mut Handshake<'_, E>,
    config: &ServerConfig,
) -> Result<Haggled<S, E::Export>, String> {
    let outcome = handshake
        .run(&mut stream)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    if !matches!(outcome, Outcome::StartTls) {
        return Ok(Haggled::Plain(stream, outcome));
    }
    // `check_tls` made sure that a mode offering STARTTLS has credentials.
    let credentials = config
        .tls_credentials
        .as_ref()
        .ok_or("STARTTLS acknowledged without TLS credentials")?;
    let accepted = tokio::time::timeout(config.tls_handshake_timeout, credentials.accept(stream))
        .await
        .map_err(|_| {
            format!(
                "TLS handshake timeout ({:?}) after NBD_OPT_STARTTLS",
                config.tls_handshake_timeout
            )
        })?
        .map_err(|e| format!("TLS handshake failed after NBD_OPT_STARTTLS: {e}"))?;
    tracing::debug!(common_name = ?accepted.common_name, "TLS established");
    handshake.on_tls(accepted.common_name);
    let mut stream = accepted.stream;
    let outcome = handshake
        .run(&mut stream)
        .await
        .map_err(|e| format!("handshake (in TLS): {e}"))?;
    Ok(Haggled::Tls(Box::new(stream), outcome))
}

/// Transmission on `stream`, if haggling chose an export.
async fn transmit<S: Stream, X: crate::backend::Export>(
    stream: S,
    outcome: Outcome<X>,
    config: &ServerConfig,
    stop: watch::Receiver<bool>,
) -> Result<(), String> {
    let Outcome::Transmission {
        name,
        export,
        negotiated,
    } = outcome
    else {
        return Ok(());
    };
    tracing::debug!(export = %name, structured = negotiated.structured, "transmission");
    serve(stream, export, negotiated, config.limits, stop)
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

/// Whether the TCP client at `peer` runs on this host, and as whom: its end of the connection
/// is in this host's socket table (whatever address it used: a local user may connect to the
/// host's own external address as well as to loopback); a loopback peer whose end is not found
/// is local with an unknown user (refused). A client on another host (or in another network
/// namespace) is not local.
fn local_peer(peer: SocketAddr, ours: Option<SocketAddr>) -> Option<LocalPeer> {
    let uid = ours.and_then(|ours| tcp_peer_uid(peer, ours));
    (uid.is_some() || is_loopback(peer.ip())).then_some(LocalPeer { uid })
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

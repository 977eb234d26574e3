//! Connections to OSD shard ports: one multiplexed TCP connection per (address, port).
//!
//! A connection has two tasks. The writer takes encoded frames from a bounded channel and
//! writes everything queued at that moment with one `write_all` (many small requests, one
//! syscall; `TCP_NODELAY` so a lone request is not held back by Nagle). The reader decodes
//! reply frames and hands each to the request waiting on its `request_id`; replies may come in
//! any order. Any error (EOF, I/O, an undecodable frame or reply, a request timing out)
//! closes the connection: every request waiting on it fails at once and is retried by its
//! caller on a fresh connection. `docs/wire-protocol.md` section 8 says why a framing error
//! closes the connection.
//!
//! When the map's auth mode is `sign` or `secure`, a new connection first runs the handshake
//! ([`crate::auth::connect`]); then the writer seals each frame in place as it takes it (in
//! queue order, which is the sequence the OSD checks) and the reader opens each reply in
//! place. A refused handshake is final ([`ConnectError::Refused`]): the caller fails the IO
//! instead of retrying with the same credentials.

use crate::auth::{Credentials, HandshakeError};
use bytes::BytesMut;
use fastblock_auth::frame::{FrameOpener, FrameSealer};
use fastblock_auth::AuthMode;
use fastblock_wire::{FrameDecoder, Kind, Protection, Reply, Request, Status, TAG_BYTES};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch};

/// Encoded frames waiting for the writer, per connection. The in-flight semaphore of the
/// cluster bounds requests long before this fills; the bound is a second line of defence.
const QUEUED_FRAMES_MAX: usize = 1024;
/// The writer stops gathering queued frames into one write past this many bytes.
const WRITE_BATCH_BYTES_MAX: usize = 256 << 10;
/// Frames this large are written on their own instead of being copied into the batch.
const WRITE_ALONE_BYTES_MIN: usize = 64 << 10;
/// Read buffer growth step.
const READ_CHUNK_BYTES: usize = 64 << 10;

/// Longest a handshake may take once connected (the OSD allows 5 s).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Why no connection could be had.
#[derive(Debug)]
pub(crate) enum ConnectError {
    /// The OSD is unreachable or the connection broke: retry later.
    Retry(String),
    /// The data plane refused these credentials (or has none configured for a cluster that
    /// requires them): final. `status` is the OSD's answer, if it gave one.
    Refused {
        status: Option<Status>,
        message: String,
    },
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectError::Retry(why) => f.write_str(why),
            ConnectError::Refused { message, .. } => f.write_str(message),
        }
    }
}

/// Why a request on a connection did not get a reply.
#[derive(Debug)]
pub(crate) enum CallError {
    Closed(String),
    TimedOut(Duration),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Closed(why) => write!(f, "connection closed: {why}"),
            CallError::TimedOut(after) => write!(f, "no reply within {after:?}"),
        }
    }
}

struct State {
    pending: HashMap<u64, oneshot::Sender<Reply>>,
    /// Set once, when the connection closes: the reason, for the requests that see it.
    closed: Option<String>,
    next_request_id: u64,
}

/// State shared by the handle and the two tasks.
struct Shared {
    peer: String,
    state: Mutex<State>,
    /// Flips to true once, when the connection closes: wakes both tasks.
    closed_tx: watch::Sender<bool>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn close(&self, why: String) {
        let pending = {
            let mut state = self.lock();
            if state.closed.is_some() {
                return;
            }
            tracing::debug!(peer = %self.peer, "closing connection: {why}");
            state.closed = Some(why);
            std::mem::take(&mut state.pending)
        };
        // Dropping the senders wakes every waiter with an error; they read the reason.
        drop(pending);
        self.closed_tx.send_replace(true);
    }

    fn closed_reason(&self) -> String {
        self.lock()
            .closed
            .clone()
            .unwrap_or_else(|| "closed".to_string())
    }
}

/// A handle to one connection. Dropping it closes the connection.
pub(crate) struct Conn {
    frames_tx: mpsc::Sender<BytesMut>,
    shared: Arc<Shared>,
    /// The auth mode it was opened in: a connection of another mode is not reused.
    mode: AuthMode,
}

impl Conn {
    /// Connects to `address:port` within `timeout` and starts the reader and writer tasks.
    /// In `mode` sign or secure, it authenticates with `credentials` first.
    pub(crate) async fn connect(
        address: &str,
        port: u16,
        timeout: Duration,
        credentials: Option<&Credentials>,
        mode: AuthMode,
    ) -> Result<Conn, ConnectError> {
        let peer = peer_name(address, port);
        let retry = ConnectError::Retry;
        let mut stream =
            match tokio::time::timeout(timeout, TcpStream::connect((address, port))).await {
                Err(_) => {
                    return Err(retry(format!(
                        "connect to {peer} timed out after {timeout:?}"
                    )))
                }
                Ok(Err(e)) => return Err(retry(format!("connect to {peer}: {e}"))),
                Ok(Ok(stream)) => stream,
            };
        // Requests are small and latency-bound; the writer already batches.
        if let Err(e) = stream.set_nodelay(true) {
            return Err(retry(format!("TCP_NODELAY on {peer}: {e}")));
        }
        let mut buffer = BytesMut::with_capacity(READ_CHUNK_BYTES);
        let (sealer, opener) = if mode.authenticates() {
            let Some(credentials) = credentials else {
                return Err(ConnectError::Refused {
                    status: None,
                    message: format!(
                        "the cluster requires authentication (auth mode {mode}) and this client has no key (give a keyring and an entity name)"
                    ),
                });
            };
            let handshake =
                crate::auth::connect(&mut stream, &mut buffer, credentials, mode, &peer);
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
                Err(_) => {
                    return Err(retry(format!(
                        "handshake with {peer} timed out after {HANDSHAKE_TIMEOUT:?}"
                    )))
                }
                Ok(Err(e)) if e.is_retryable() => return Err(retry(e.to_string())),
                Ok(Err(e)) => {
                    let status = match &e {
                        HandshakeError::Refused { status, .. } => Some(*status),
                        _ => None,
                    };
                    return Err(ConnectError::Refused {
                        status,
                        message: format!("authenticating as {}: {e}", credentials.0),
                    });
                }
                Ok(Ok(p)) => (Some(p.sealer), Some(p.opener)),
            }
        } else {
            (None, None)
        };
        let (read_half, write_half) = stream.into_split();
        let (frames_tx, frames_rx) = mpsc::channel(QUEUED_FRAMES_MAX);
        let (closed_tx, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            peer,
            state: Mutex::new(State {
                pending: HashMap::new(),
                closed: None,
                next_request_id: 1,
            }),
            closed_tx,
        });
        tokio::spawn(run_writer(shared.clone(), write_half, frames_rx, sealer));
        tokio::spawn(run_reader(shared.clone(), read_half, buffer, opener));
        Ok(Conn {
            frames_tx,
            shared,
            mode,
        })
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.shared.lock().closed.is_some()
    }

    /// Sends `request` and waits up to `timeout` for its reply. A timeout closes the
    /// connection: silence that long means it (or the OSD) is broken, and every other request
    /// on it is better retried on a fresh one.
    pub(crate) async fn call(
        &self,
        request: &Request,
        timeout: Duration,
    ) -> Result<Reply, CallError> {
        let (reply_tx, reply_rx) = oneshot::channel();
        let request_id = {
            let mut state = self.shared.lock();
            if let Some(why) = &state.closed {
                return Err(CallError::Closed(why.clone()));
            }
            let id = state.next_request_id;
            state.next_request_id += 1;
            state.pending.insert(id, reply_tx);
            id
        };
        // Removes the waiter if this future is dropped (the caller gave up or was aborted), so
        // the pending table never keeps entries for requests nobody waits for.
        let _pending = PendingGuard {
            shared: &self.shared,
            request_id,
        };
        // Room for the tag too: sealing then never reallocates (copies) the frame.
        let mut frame = BytesMut::with_capacity(request.frame_len() + TAG_BYTES);
        request.encode(request_id, &mut frame);
        if self.frames_tx.send(frame).await.is_err() {
            return Err(CallError::Closed(self.shared.closed_reason()));
        }
        match tokio::time::timeout(timeout, reply_rx).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(_)) => Err(CallError::Closed(self.shared.closed_reason())),
            Err(_) => {
                self.shared.close(format!(
                    "request {request_id} got no reply within {timeout:?}"
                ));
                Err(CallError::TimedOut(timeout))
            }
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.shared.close("connection handle dropped".to_string());
    }
}

struct PendingGuard<'a> {
    shared: &'a Shared,
    request_id: u64,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        self.shared.lock().pending.remove(&self.request_id);
    }
}

fn peer_name(address: &str, port: u16) -> String {
    if address.contains(':') {
        format!("[{address}]:{port}")
    } else {
        format!("{address}:{port}")
    }
}

async fn wait_closed(rx: &mut watch::Receiver<bool>) {
    // An error means the sender is gone, which also means closed.
    let _ = rx.wait_for(|closed| *closed).await;
}

async fn run_writer(
    shared: Arc<Shared>,
    mut write_half: OwnedWriteHalf,
    mut frames_rx: mpsc::Receiver<BytesMut>,
    mut sealer: Option<FrameSealer>,
) {
    // Seals a frame in place, in the order frames are written (the OSD's sequence).
    let mut protect = |mut frame: BytesMut| {
        if let Some(sealer) = sealer.as_mut() {
            crate::auth::seal_frame(&mut frame, 0, sealer);
        }
        frame
    };
    let mut closed_rx = shared.closed_tx.subscribe();
    let mut batch = BytesMut::with_capacity(WRITE_BATCH_BYTES_MAX);
    loop {
        let first = tokio::select! {
            frame = frames_rx.recv() => frame,
            _ = wait_closed(&mut closed_rx) => return,
        };
        let Some(first) = first else { return };
        let first = protect(first);
        // Gather what is queued right now; stop at the byte limit or at a large frame, which
        // is written by itself rather than copied.
        let mut alone = None;
        if first.len() >= WRITE_ALONE_BYTES_MIN {
            alone = Some(first);
        } else {
            batch.extend_from_slice(&first);
            while batch.len() < WRITE_BATCH_BYTES_MAX {
                match frames_rx.try_recv().map(&mut protect) {
                    Ok(frame) if frame.len() >= WRITE_ALONE_BYTES_MIN => {
                        alone = Some(frame);
                        break;
                    }
                    Ok(frame) => batch.extend_from_slice(&frame),
                    Err(_) => break,
                }
            }
        }
        let result = async {
            if !batch.is_empty() {
                write_half.write_all(&batch).await?;
            }
            if let Some(frame) = &alone {
                write_half.write_all(frame).await?;
            }
            Ok::<(), std::io::Error>(())
        };
        let result = tokio::select! {
            result = result => result,
            _ = wait_closed(&mut closed_rx) => return,
        };
        batch.clear();
        if let Err(e) = result {
            shared.close(format!("write to {}: {e}", shared.peer));
            return;
        }
    }
}

async fn run_reader(
    shared: Arc<Shared>,
    mut read_half: OwnedReadHalf,
    mut buffer: BytesMut,
    mut opener: Option<FrameOpener>,
) {
    let mut closed_rx = shared.closed_tx.subscribe();
    let mut decoder = FrameDecoder::default();
    loop {
        loop {
            match decoder.decode_mut(&mut buffer) {
                Ok(Some(frame)) => {
                    let frame = match opener.as_mut() {
                        Some(opener) => match crate::auth::open_frame(frame, opener) {
                            Ok(frame) => frame,
                            Err(e) => {
                                tracing::warn!(peer = %shared.peer, "closing the connection: {e}");
                                shared.close(format!("{}: {e}", shared.peer));
                                return;
                            }
                        },
                        None if frame.protection != Protection::None => {
                            shared.close(format!(
                                "{} sent a protected frame on a connection without authentication",
                                shared.peer
                            ));
                            return;
                        }
                        None => frame.freeze(),
                    };
                    if frame.kind != Kind::Reply {
                        shared.close(format!(
                            "{} sent a {:?} frame where replies were expected",
                            shared.peer, frame.kind
                        ));
                        return;
                    }
                    let reply = match Reply::decode(&frame) {
                        Ok(reply) => reply,
                        Err(e) => {
                            shared.close(format!("undecodable reply from {}: {e}", shared.peer));
                            return;
                        }
                    };
                    let waiter = shared.lock().pending.remove(&frame.request_id);
                    match waiter {
                        // The waiter may have given up in between; nothing to do then.
                        Some(waiter) => drop(waiter.send(reply)),
                        None => tracing::debug!(
                            peer = %shared.peer,
                            request_id = frame.request_id,
                            "reply for a request nobody waits for"
                        ),
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    shared.close(format!("bad frame from {}: {e}", shared.peer));
                    return;
                }
            }
        }
        if buffer.capacity() - buffer.len() < READ_CHUNK_BYTES / 4 {
            buffer.reserve(READ_CHUNK_BYTES);
        }
        let read = tokio::select! {
            read = read_half.read_buf(&mut buffer) => read,
            _ = wait_closed(&mut closed_rx) => return,
        };
        match read {
            Ok(0) => {
                shared.close(format!("{} closed the connection", shared.peer));
                return;
            }
            Ok(_) => {}
            Err(e) => {
                shared.close(format!("read from {}: {e}", shared.peer));
                return;
            }
        }
    }
}

/// The connection to one (address, port), if any; locked while (re)connecting.
type Slot = tokio::sync::Mutex<Option<Arc<Conn>>>;

/// One connection slot per (address, port). A slot's async lock is held while connecting, so
/// concurrent requests to the same OSD shard share one connect, while a slow connect to one
/// OSD never delays requests to others.
pub(crate) struct ConnPool {
    slots: Mutex<HashMap<(String, u16), Arc<Slot>>>,
    connect_timeout: Duration,
    credentials: Option<Credentials>,
}

impl ConnPool {
    pub(crate) fn new(connect_timeout: Duration, credentials: Option<Credentials>) -> Self {
        ConnPool {
            slots: Mutex::new(HashMap::new()),
            connect_timeout,
            credentials,
        }
    }

    /// An open connection to `address:port`, reusing the current one unless it has closed.
    /// Returns whether a new connection was made, for the client's counters. `mode` is the
    /// map's auth mode: a connection opened in another mode is replaced.
    pub(crate) async fn get(
        &self,
        address: &str,
        port: u16,
        mode: AuthMode,
    ) -> Result<(Arc<Conn>, bool), ConnectError> {
        let slot = {
            let mut slots = self
                .slots
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            slots
                .entry((address.to_string(), port))
                .or_default()
                .clone()
        };
        let mut current = slot.lock().await;
        if let Some(conn) = current.as_ref() {
            if !conn.is_closed() && conn.mode == mode {
                return Ok((conn.clone(), false));
            }
        }
        let conn = Arc::new(
            Conn::connect(
                address,
                port,
                self.connect_timeout,
                self.credentials.as_ref(),
                mode,
            )
            .await?,
        );
        *current = Some(conn.clone());
        Ok((conn, true))
    }
}

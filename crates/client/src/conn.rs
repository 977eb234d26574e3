//! Connections to OSD shard ports: one multiplexed TCP connection per (address, port).
//!
//! A connection has one task. It takes encoded frames from a bounded channel and writes
//! everything queued at that moment in one vectored write (many small requests, one syscall;
//! `TCP_NODELAY` so a lone request is not held back by Nagle), and it decodes reply frames and
//! hands each to the request waiting on its `request_id`; replies may come in any order. One
//! task rather than a reader and a writer: a request and its reply never hop between tasks or
//! worker threads. Queued output is bounded (the channel, and at most
//! `WRITE_BATCH_BYTES_MAX` taken from it while the socket does not take it). Any error (EOF,
//! I/O, an undecodable frame or reply, a request timing out) closes the connection: every
//! request waiting on it fails at once and is retried by its caller on a fresh connection.
//! `docs/wire-protocol.md` section 8 says why a framing error closes the connection.
//!
//! When the map's auth mode is `sign` or `secure`, a new connection first runs the handshake
//! ([`crate::auth::connect`]); then the task seals each frame in place as it takes it (in
//! queue order, which is the sequence the OSD checks) and opens each reply in place. A
//! refused handshake is final ([`ConnectError::Refused`]): the caller fails the IO instead of
//! retrying with the same credentials.

use crate::auth::HandshakeError;
use crate::tickets::Tickets;
use bytes::BytesMut;
use fastblock_auth::frame::{FrameOpener, FrameSealer};
use fastblock_auth::AuthMode;
use fastblock_types::OsdId;
use fastblock_wire::{FrameDecoder, Kind, Protection, Reply, Request, Status, TAG_BYTES};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch};

/// Encoded frames waiting for the writer, per connection. The in-flight semaphore of the
/// cluster bounds requests long before this fills; the bound is a second line of defence.
const QUEUED_FRAMES_MAX: usize = 1024;
/// The task takes no more queued frames while this many bytes wait for the socket.
const WRITE_BATCH_BYTES_MAX: usize = 256 << 10;
/// Frames this large are written on their own instead of being copied into the batch.
const WRITE_ALONE_BYTES_MIN: usize = 64 << 10;
/// Buffers handed to one vectored write (the kernel's limit is 1024).
const WRITE_SLICES_MAX: usize = 64;
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

/// State shared by the handle and the connection's task.
struct Shared {
    peer: String,
    state: Mutex<State>,
    /// Flips to true once, when the connection closes: wakes the task.
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
    /// Connects to `address:port` (a shard of `osd`) within `timeout` and starts the
    /// connection's task. In `mode` sign or secure, it authenticates with a ticket for `osd`
    /// from `tickets` first.
    pub(crate) async fn connect(
        address: &str,
        port: u16,
        osd: OsdId,
        timeout: Duration,
        tickets: Option<&Tickets>,
        mode: AuthMode,
    ) -> Result<Conn, ConnectError> {
        let peer = peer_name(address, port);
        let retry = ConnectError::Retry;
        let ticket = match (mode.authenticates(), tickets) {
            (false, _) => None,
            (true, None) => {
                return Err(ConnectError::Refused {
                    status: None,
                    message: format!(
                        "the cluster requires authentication (auth mode {mode}) and this client has no key (give a keyring and an entity name)"
                    ),
                })
            }
            (true, Some(tickets)) => match tickets.get(osd).await {
                Ok(t) => Some((tickets, t)),
                Err(e) if e.is_retryable() => return Err(retry(e.to_string())),
                Err(e) => {
                    return Err(ConnectError::Refused {
                        status: None,
                        message: format!("authenticating as {}: {e}", tickets.entity()),
                    })
                }
            },
        };
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
        // Closing aborts (RST), and the kernel drops what it has not delivered. A request is
        // given up only by closing its connection (see `PendingGuard`), and the caller then
        // sends it again elsewhere; with an orderly close, the kernel kept retransmitting the
        // given-up bytes, and once a partition healed they reached their OSD, which may lead
        // the PG again by then and apply the old write over newer acknowledged ones (the
        // chaos run's stale reads of 2026-11-27 and -28).
        if let Err(e) = stream.set_zero_linger() {
            return Err(retry(format!("SO_LINGER on {peer}: {e}")));
        }
        let mut buffer = BytesMut::with_capacity(READ_CHUNK_BYTES);
        let (sealer, opener) = if let Some((tickets, ticket)) = ticket {
            let handshake = crate::auth::connect(
                &mut stream,
                &mut buffer,
                tickets.entity(),
                &ticket,
                mode,
                &peer,
            );
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
                Err(_) => {
                    return Err(retry(format!(
                        "handshake with {peer} timed out after {HANDSHAKE_TIMEOUT:?}"
                    )))
                }
                Ok(Err(e)) => {
                    if e.spends_ticket() {
                        tickets.forget(osd);
                    }
                    if e.is_retryable() {
                        return Err(retry(e.to_string()));
                    }
                    let status = match &e {
                        HandshakeError::Refused { status, .. } => Some(*status),
                        _ => None,
                    };
                    return Err(ConnectError::Refused {
                        status,
                        message: format!("authenticating as {}: {e}", tickets.entity()),
                    });
                }
                Ok(Ok(p)) => (Some(p.sealer), Some(p.opener)),
            }
        } else {
            (None, None)
        };
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
        tokio::spawn(run_conn(
            shared.clone(),
            stream,
            frames_rx,
            buffer,
            sealer,
            opener,
        ));
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
        // If this future is dropped before the reply (the caller gave up or was aborted), the
        // guard closes the connection: see `PendingGuard`.
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

/// Removes a call's waiter when the call ends. A call that ends without its reply (its future
/// dropped: the caller gave up, say because the PG's leader moved, or was aborted) also closes
/// the connection. The request may still be in the socket's buffers, and its caller will send
/// it again elsewhere or report its outcome unknown; delivered later, after newer writes of the
/// same blocks were acknowledged, it would overwrite them. Closing aborts the connection
/// (`SO_LINGER` 0): the kernel discards every byte the OSD has not acknowledged. The other
/// requests on the connection fail retryably, as on any close; giving up is rare.
impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        let abandoned = self
            .shared
            .lock()
            .pending
            .remove(&self.request_id)
            .is_some();
        if abandoned {
            self.shared.close(format!(
                "request {} was given up before its reply",
                self.request_id
            ));
        }
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

/// The connection's one task: writes the queued frames (everything queued at once, in one
/// vectored write where the socket takes it) and reads and dispatches replies, on one task,
/// so a request's send and its reply's delivery never hop between tasks or worker threads.
async fn run_conn(
    shared: Arc<Shared>,
    stream: TcpStream,
    mut frames_rx: mpsc::Receiver<BytesMut>,
    mut buffer: BytesMut,
    mut sealer: Option<FrameSealer>,
    mut opener: Option<FrameOpener>,
) {
    let mut closed_rx = shared.closed_tx.subscribe();
    let mut decoder = FrameDecoder::default();
    let mut out = Outgoing::default();
    // Replies read along with the handshake's last message are dispatched first.
    if let Err(why) = dispatch_replies(&shared, &mut decoder, &mut buffer, &mut opener) {
        shared.close(why);
        return;
    }
    loop {
        if buffer.capacity() - buffer.len() < READ_CHUNK_BYTES / 4 {
            buffer.reserve(READ_CHUNK_BYTES);
        }
        let room = out.bytes < WRITE_BATCH_BYTES_MAX;
        // Unbiased: under a steady stream of both, neither sends nor replies wait on the other.
        let step = tokio::select! {
            _ = wait_closed(&mut closed_rx) => return,
            ready = stream.readable() => ready.map(|()| Step::Read),
            ready = stream.writable(), if !out.is_empty() => ready.map(|()| Step::Write),
            frame = frames_rx.recv(), if room => Ok(match frame {
                Some(frame) => Step::Queue(frame),
                // The handle is gone: it closed the connection as it dropped.
                None => return,
            }),
        };
        let result = match step {
            Err(e) => Err(format!("waiting on {}: {e}", shared.peer)),
            Ok(Step::Read) => read_replies(&shared, &stream, &mut buffer)
                .and_then(|()| dispatch_replies(&shared, &mut decoder, &mut buffer, &mut opener)),
            Ok(Step::Queue(first)) => {
                // Gather everything queued right now; sealed in the order it is written (the
                // OSD's sequence).
                out.push(first, sealer.as_mut());
                while out.bytes < WRITE_BATCH_BYTES_MAX {
                    match frames_rx.try_recv() {
                        Ok(frame) => out.push(frame, sealer.as_mut()),
                        Err(_) => break,
                    }
                }
                out.write(&stream, &shared.peer)
            }
            Ok(Step::Write) => out.write(&stream, &shared.peer),
        };
        if let Err(why) = result {
            shared.close(why);
            return;
        }
    }
}

enum Step {
    Read,
    Write,
    Queue(BytesMut),
}

/// Frames sealed and waiting for the socket: small ones gathered into one buffer, large
/// ones kept as they are (written by themselves rather than copied).
#[derive(Default)]
struct Outgoing {
    chunks: std::collections::VecDeque<bytes::Bytes>,
    gather: BytesMut,
    bytes: usize,
}

impl Outgoing {
    fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    fn push(&mut self, mut frame: BytesMut, sealer: Option<&mut FrameSealer>) {
        if let Some(sealer) = sealer {
            crate::auth::seal_frame(&mut frame, 0, sealer);
        }
        self.bytes += frame.len();
        if frame.len() >= WRITE_ALONE_BYTES_MIN {
            if !self.gather.is_empty() {
                self.chunks.push_back(self.gather.split().freeze());
            }
            self.chunks.push_back(frame.freeze());
        } else {
            self.gather.extend_from_slice(&frame);
        }
    }

    /// Writes what the socket takes now; the rest waits for it to become writable.
    fn write(&mut self, stream: &TcpStream, peer: &str) -> Result<(), String> {
        if !self.gather.is_empty() {
            self.chunks.push_back(self.gather.split().freeze());
        }
        while !self.chunks.is_empty() {
            let slices: Vec<std::io::IoSlice<'_>> = self
                .chunks
                .iter()
                .take(WRITE_SLICES_MAX)
                .map(|c| std::io::IoSlice::new(c))
                .collect();
            match stream.try_write_vectored(&slices) {
                Ok(0) => return Err(format!("write to {peer}: the socket took nothing")),
                Ok(n) => {
                    self.bytes -= n;
                    fastblock_wire::advance_chunks(&mut self.chunks, n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(format!("write to {peer}: {e}")),
            }
        }
        assert_eq!(self.bytes, 0, "every queued byte was written");
        Ok(())
    }
}

/// Reads what the socket holds now into `buffer`.
fn read_replies(shared: &Shared, stream: &TcpStream, buffer: &mut BytesMut) -> Result<(), String> {
    loop {
        if buffer.capacity() == buffer.len() {
            buffer.reserve(READ_CHUNK_BYTES);
        }
        match stream.try_read_buf(buffer) {
            Ok(0) => return Err(format!("{} closed the connection", shared.peer)),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) => return Err(format!("read from {}: {e}", shared.peer)),
        }
    }
}

/// Decodes every whole reply in `buffer` and hands each to the request waiting on it. An
/// error is final for the connection (`docs/wire-protocol.md` section 8).
fn dispatch_replies(
    shared: &Shared,
    decoder: &mut FrameDecoder,
    buffer: &mut BytesMut,
    opener: &mut Option<FrameOpener>,
) -> Result<(), String> {
    loop {
        let frame = match decoder.decode_mut(buffer) {
            Ok(Some(frame)) => frame,
            Ok(None) => return Ok(()),
            Err(e) => return Err(format!("bad frame from {}: {e}", shared.peer)),
        };
        let frame = match opener.as_mut() {
            Some(opener) => match crate::auth::open_frame(frame, opener) {
                Ok(frame) => frame,
                Err(e) => {
                    tracing::warn!(peer = %shared.peer, "closing the connection: {e}");
                    return Err(format!("{}: {e}", shared.peer));
                }
            },
            None if frame.protection != Protection::None => {
                return Err(format!(
                    "{} sent a protected frame on a connection without authentication",
                    shared.peer
                ))
            }
            None => frame.freeze(),
        };
        if frame.kind != Kind::Reply {
            return Err(format!(
                "{} sent a {:?} frame where replies were expected",
                shared.peer, frame.kind
            ));
        }
        let reply = Reply::decode(&frame)
            .map_err(|e| format!("undecodable reply from {}: {e}", shared.peer))?;
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
}

/// The connection to one (address, port), if any; locked while (re)connecting.
type Slot = tokio::sync::Mutex<Option<Arc<Conn>>>;

/// One connection slot per (address, port). A slot's async lock is held while connecting, so
/// concurrent requests to the same OSD shard share one connect, while a slow connect to one
/// OSD never delays requests to others.
pub(crate) struct ConnPool {
    slots: Mutex<HashMap<(String, u16), Arc<Slot>>>,
    connect_timeout: Duration,
    tickets: Option<Arc<Tickets>>,
}

impl ConnPool {
    pub(crate) fn tickets(&self) -> Option<&Arc<Tickets>> {
        self.tickets.as_ref()
    }

    pub(crate) fn new(connect_timeout: Duration, tickets: Option<Arc<Tickets>>) -> Self {
        ConnPool {
            slots: Mutex::new(HashMap::new()),
            connect_timeout,
            tickets,
        }
    }

    /// An open connection to `address:port` (a shard of `osd`), reusing the current one
    /// unless it has closed. Returns whether a new connection was made, for the client's
    /// counters. `mode` is the map's auth mode: a connection opened in another mode is
    /// replaced.
    pub(crate) async fn get(
        &self,
        address: &str,
        port: u16,
        osd: OsdId,
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
                osd,
                self.connect_timeout,
                self.tickets.as_deref(),
                mode,
            )
            .await?,
        );
        *current = Some(conn.clone());
        Ok((conn, true))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fastblock_types::{Epoch, ImageId, PgId, PoolId};
    use fastblock_wire::ObjectAddr;
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    /// A connection without auth to a listener of this test, and the listener's end of it.
    async fn connected() -> (Conn, tokio::net::TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let conn = Conn::connect(
            "127.0.0.1",
            port,
            OsdId(1),
            Duration::from_secs(5),
            None,
            AuthMode::None,
        )
        .await
        .unwrap();
        let (osd, _) = listener.accept().await.unwrap();
        (conn, osd)
    }

    /// A call given up before its reply aborts its connection: the OSD's end sees a reset,
    /// not an orderly end, so the kernel dropped whatever of the request it had not
    /// delivered (the stale-read fix: a given-up write must never arrive later).
    #[tokio::test]
    async fn a_call_given_up_before_its_reply_aborts_the_connection() {
        let (conn, mut osd) = connected().await;
        let request = Request::Write {
            addr: ObjectAddr {
                pg: PgId {
                    pool: PoolId(1),
                    seq: 0,
                },
                image: ImageId(1),
                object_index: 0,
            },
            offset: 0,
            epoch: Epoch(1),
            term: 0,
            data: bytes::Bytes::from(vec![7u8; 4096]),
        };
        // The OSD stays silent; the caller gives up long before the call's own timeout.
        let given_up = tokio::time::timeout(
            Duration::from_millis(200),
            conn.call(&request, Duration::from_secs(30)),
        )
        .await;
        assert!(given_up.is_err(), "the silent OSD answered: {given_up:?}");
        assert!(conn.is_closed(), "giving up left the connection open");
        // The OSD's end: the request's bytes, then a reset (an orderly close reads as 0).
        let mut got = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        let end = loop {
            match tokio::time::timeout(Duration::from_secs(5), osd.read(&mut buf)).await {
                Err(_) => panic!("the connection stayed open after the call was given up"),
                Ok(Ok(0)) => break Ok(()),
                Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
                Ok(Err(e)) => break Err(e),
            }
        };
        assert!(got.len() >= request.frame_len(), "{} bytes", got.len());
        match end {
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
            Ok(()) => panic!("an orderly close: undelivered bytes would still be sent"),
        }
    }

    /// A call answered in time leaves its connection open for the next.
    #[tokio::test]
    async fn a_call_answered_keeps_the_connection() {
        let (conn, mut osd) = connected().await;
        let server = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let mut decoder = FrameDecoder::default();
            let mut buf = BytesMut::with_capacity(1 << 16);
            loop {
                if osd.read_buf(&mut buf).await.unwrap() == 0 {
                    panic!("closed before a request");
                }
                if let Some(frame) = decoder.decode(&mut buf).unwrap() {
                    let mut out = BytesMut::new();
                    Reply::Ok.encode(frame.request_id, &mut out);
                    osd.write_all(&out).await.unwrap();
                    return osd;
                }
            }
        });
        let request = Request::GetLeader {
            pg: PgId {
                pool: PoolId(1),
                seq: 0,
            },
            epoch: Epoch(1),
        };
        let reply = conn.call(&request, Duration::from_secs(5)).await;
        assert!(matches!(reply, Ok(Reply::Ok)), "{reply:?}");
        let _osd = server.await.unwrap();
        assert!(!conn.is_closed());
    }
}

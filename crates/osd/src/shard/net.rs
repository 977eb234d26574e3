//! Connections of one shard. Everything runs on the shard's thread (a `LocalSet`), so state is
//! shared with `Rc<RefCell<..>>` and never locked.
//!
//! - Reader tasks decode frames into the core's [`Input`]s (`Request`, `BadRequest`, and
//!   `Closed` when the connection ends), queue them for the runtime, then wake it.
//! - Outgoing bytes are appended to a connection's buffer and written at once with
//!   `try_write` by the runtime itself (so replies and Raft messages leave before the loop
//!   blocks on the next fdatasync); whatever the socket does not take is written by the
//!   connection's writer task when the socket becomes writable.
//! - Buffers are bounded: a client whose buffer exceeds [`OUT_BYTES_MAX`] is disconnected (it
//!   does not read its replies); a peer link drops frames instead (Raft retransmits, a
//!   snapshot transfer times out and restarts).

use super::auth::PeerAuth;
use super::Clock;
use bytes::{Buf, BytesMut};
use fastblock_auth::frame::FrameSealer;
use fastblock_auth::AuthMode;
use fastblock_shard::Input;
use fastblock_types::{Epoch, OsdId};
use fastblock_wire::{Frame, FrameDecoder, Protection, Request};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;
use tokio::io::AsyncReadExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::Notify;

pub use fastblock_shard::ConnId;

/// Largest frame payload accepted (an object of 64 MiB plus headers would not fit; IO is split
/// by clients into pieces ≤ 4 MiB + slack).
pub const FRAME_PAYLOAD_BYTES_MAX: u32 = 16 << 20;
/// Per-connection unsent bytes before a client is dropped or a peer's messages are shed.
pub const OUT_BYTES_MAX: usize = 64 << 20;

/// What reader tasks hand to the runtime, in arrival order.
pub type InputQueue = Rc<RefCell<VecDeque<Input>>>;

/// The sending side of a connection.
pub struct Outbox {
    pub buf: BytesMut,
    /// Shared so the writer task can await writability without holding the `RefCell`.
    pub stream: Option<Rc<OwnedWriteHalf>>,
    pub wake_writer: Rc<Notify>,
    pub closed: bool,
    /// When the oldest reply still in `buf` was queued (for the `reply` stage).
    pub reply_since: Option<Instant>,
    /// The auth mode the connection was opened in.
    pub mode: AuthMode,
    /// Protects every frame queued once the handshake succeeded (None: mode none, or the
    /// handshake is not done yet).
    pub sealer: Option<FrameSealer>,
    /// Who the peer proved to be (accepted connections in sign/secure mode).
    pub peer: Option<Rc<PeerAuth>>,
}

pub type SharedOutbox = Rc<RefCell<Outbox>>;

impl Outbox {
    pub fn new(stream: Option<OwnedWriteHalf>, mode: AuthMode) -> SharedOutbox {
        Rc::new(RefCell::new(Outbox {
            buf: BytesMut::with_capacity(64 << 10),
            stream: stream.map(Rc::new),
            wake_writer: Rc::new(Notify::new()),
            closed: false,
            reply_since: None,
            mode,
            sealer: None,
            peer: None,
        }))
    }

    /// Appends one frame written by `encode` (exactly one frame), sealed in place when the
    /// connection is authenticated.
    pub fn push_frame(&mut self, encode: impl FnOnce(&mut BytesMut)) {
        let start = self.buf.len();
        encode(&mut self.buf);
        if let Some(sealer) = self.sealer.as_mut() {
            fastblock_client::auth::seal_frame(&mut self.buf, start, sealer);
        }
    }

    /// Ends the connection from this side: the reader sees end of file and reports it closed
    /// (a revoked key, a changed auth mode). `how`: `libc::SHUT_WR` to let queued bytes
    /// leave first, `libc::SHUT_RDWR` to cut.
    pub fn shutdown_socket(&self, how: i32) {
        if let Some(stream) = &self.stream {
            let fd = stream.as_ref().as_ref().as_raw_fd();
            // SAFETY: shutdown(2) on a descriptor the write half keeps open; no memory.
            unsafe { libc::shutdown(fd, how) };
        }
    }

    /// Writes what the socket takes now without waiting; the writer task does the rest.
    pub fn flush_now(&mut self) {
        let Some(stream) = &self.stream else { return };
        while !self.buf.is_empty() {
            match stream.try_write(&self.buf) {
                Ok(0) => break,
                Ok(n) => self.buf.advance(n),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    self.wake_writer.notify_one();
                    break;
                }
                Err(_) => {
                    self.closed = true;
                    self.buf.clear();
                    break;
                }
            }
        }
    }
}

/// Writes an outbox's leftovers whenever the loop could not.
pub async fn writer_task(outbox: SharedOutbox) {
    loop {
        let notify = outbox.borrow().wake_writer.clone();
        notify.notified().await;
        loop {
            let stream = {
                let o = outbox.borrow();
                if o.closed {
                    return;
                }
                if o.buf.is_empty() {
                    break;
                }
                match &o.stream {
                    Some(s) => s.clone(),
                    None => break,
                }
            };
            if stream.writable().await.is_err() {
                outbox.borrow_mut().closed = true;
                return;
            }
            outbox.borrow_mut().flush_now();
        }
    }
}

/// Reads frames until the connection closes or sends garbage.
pub async fn reader_task(
    conn: ConnId,
    mut stream: OwnedReadHalf,
    inputs: InputQueue,
    wake_loop: Arc<Notify>,
    clock: Clock,
) {
    let mut buf = BytesMut::with_capacity(256 << 10);
    let mut decoder = FrameDecoder::new(FRAME_PAYLOAD_BYTES_MAX);
    let reason = loop {
        match stream.read_buf(&mut buf).await {
            Ok(0) => break "closed by peer".to_string(),
            Ok(_) => {}
            Err(e) => break format!("read error: {e}"),
        }
        let arrived = clock.now();
        let mut framing_error = None;
        loop {
            match decoder.decode(&mut buf) {
                // Mode none: a protected frame means the peer expects authentication.
                Ok(Some(frame)) if frame.protection != Protection::None => {
                    framing_error = Some(format!(
                        "a protected {:?} frame on a connection without authentication",
                        frame.kind
                    ));
                    break;
                }
                Ok(Some(frame)) => inputs
                    .borrow_mut()
                    .push_back(decode_request(conn, &frame, arrived)),
                Ok(None) => break,
                Err(e) => {
                    framing_error = Some(format!("framing error: {e}"));
                    break;
                }
            }
        }
        wake_loop.notify_one();
        if buf.capacity() - buf.len() < 64 << 10 {
            buf.reserve(256 << 10);
        }
        if let Some(reason) = framing_error {
            break reason;
        }
    };
    tracing::debug!(conn, "connection closed: {reason}");
    inputs.borrow_mut().push_back(Input::Closed { conn });
    wake_loop.notify_one();
}

pub(crate) fn decode_request(
    conn: ConnId,
    frame: &Frame,
    arrived: fastblock_shard::Micros,
) -> Input {
    match Request::decode(frame) {
        Ok(req) => Input::Request {
            conn,
            request_id: frame.request_id,
            req,
            arrived,
        },
        Err(error) => Input::BadRequest {
            conn,
            request_id: frame.request_id,
            error,
        },
    }
}

/// An outbound link to one shard of a peer OSD, carrying Raft batches. While its connect
/// attempt runs the outbox has no stream and is not closed; a failed or broken link is closed
/// and replaced by the next send.
pub struct PeerLink {
    pub osd: OsdId,
    pub addr: String,
    pub outbox: SharedOutbox,
    pub epoch: Epoch,
}

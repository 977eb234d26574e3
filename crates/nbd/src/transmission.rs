//! The transmission phase of one connection: a reader that admits requests, one task per
//! request, and a writer that sends replies as they complete (out of order).
//!
//! ```text
//! socket ──▶ reader: header → limits (permits) → payload → validate ──▶ spawn(execute)
//!                                                                         │ reply + permits
//! socket ◀── writer: replies back to back, flushed when none is waiting ◀─┘
//! ```
//!
//! Memory is bounded per connection: a request holds a slot of `inflight_requests_max` and
//! its payload bytes (write data, or the length of a read) of `inflight_bytes_max` from
//! before its payload is read until its reply is written. When either runs out the reader
//! stops reading the socket, so a client that sends faster than the cluster answers is slowed
//! by TCP, not buffered.
//!
//! Ending: `NBD_CMD_DISC`, EOF, a header with a bad magic (the stream cannot be resynced) or
//! server shutdown stop the reader; the requests already admitted finish and their replies
//! are written (bounded by `drain_timeout`), then the socket closes.

use crate::backend::Export;
use crate::consts::*;
use crate::execute::execute;
use crate::handshake::skip;
use crate::reply::{self, ReplyBytes};
use crate::request::{Command, Negotiated, RequestHeader};
use bytes::BytesMut;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

/// Per-connection limits.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub inflight_requests_max: usize,
    /// Must be at least `PAYLOAD_BYTES_MAX`, so that the largest legal request can run.
    pub inflight_bytes_max: u32,
    /// How long admitted requests may take to finish once the connection is ending.
    pub drain_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            // Deeper than any client's queue (qemu 16, the kernel 128 per connection, fio's
            // iodepth as set), and far below the client library's 256 object requests.
            inflight_requests_max: 128,
            // Two maximal requests: the largest one can always run next to another.
            inflight_bytes_max: 2 * PAYLOAD_BYTES_MAX,
            drain_timeout: Duration::from_secs(60),
        }
    }
}

/// Bytes the writer buffers before writing to the socket (small replies coalesce).
const WRITE_BUFFER_BYTES: usize = 256 << 10;
/// Bytes the reader buffers from the socket (many headers per read syscall).
const READ_BUFFER_BYTES: usize = 64 << 10;

/// A reply with the permits its request held; dropping it (after writing) frees them.
struct Outgoing {
    reply: ReplyBytes,
    _slot: OwnedSemaphorePermit,
    _bytes: Option<OwnedSemaphorePermit>,
}

/// Why a connection ended other than by the client's disconnect.
#[derive(Debug, thiserror::Error)]
pub enum TransmissionError {
    #[error("socket: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Protocol(#[from] crate::request::BadRequestMagic),
    #[error("requests still running after the {0:?} drain timeout")]
    DrainTimeout(Duration),
}

/// Serves requests on `reader`/`writer` until the client disconnects, the socket fails, or
/// `shutdown` turns true.
pub async fn serve<R, W, X>(
    reader: R,
    writer: W,
    export: X,
    negotiated: Negotiated,
    limits: Limits,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), TransmissionError>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
    X: Export,
{
    assert!(limits.inflight_bytes_max >= PAYLOAD_BYTES_MAX);
    assert!(limits.inflight_requests_max > 0);
    // One message per admitted request plus reader-made error replies, each holding a slot:
    // the channel never fills.
    let (replies, outbox) = mpsc::channel::<Outgoing>(limits.inflight_requests_max + 1);
    let writer_task = tokio::spawn(write_replies(writer, outbox));
    let slots = Arc::new(Semaphore::new(limits.inflight_requests_max));
    let bytes = Arc::new(Semaphore::new(limits.inflight_bytes_max as usize));
    let mut reader = BufReader::with_capacity(READ_BUFFER_BYTES, reader);
    let mut tasks = JoinSet::new();
    let ended: Result<(), TransmissionError> = loop {
        while tasks.try_join_next().is_some() {}
        let mut raw = [0u8; REQUEST_HEADER_BYTES];
        let read = tokio::select! {
            biased;
            _ = shutdown.wait_for(|stop| *stop) => break Ok(()),
            read = read_header(&mut reader, &mut raw) => read,
        };
        match read {
            Ok(true) => {}
            Ok(false) => break Ok(()),
            Err(e) => break Err(e.into()),
        }
        let header = match RequestHeader::parse(&raw) {
            Ok(header) => header,
            Err(e) => break Err(e.into()),
        };
        let admitted = admit(&mut reader, &header, &negotiated, &slots, &bytes).await;
        let (slot, bytes_permit, payload, command) = match admitted {
            Ok(Admitted::Run(a, b, payload, command)) => (a, b, payload, command),
            Ok(Admitted::Refused(slot, reply)) => {
                send(&replies, reply, slot, None).await;
                continue;
            }
            Ok(Admitted::Disconnect) => break Ok(()),
            Err(e) => break Err(e.into()),
        };
        let export = export.clone();
        let replies = replies.clone();
        let structured = negotiated.structured;
        tasks.spawn(async move {
            let reply = execute(&export, command, header.handle, payload, structured).await;
            send(&replies, reply, slot, bytes_permit).await;
        });
    };
    drop(replies);
    let drained = tokio::time::timeout(limits.drain_timeout, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tasks.abort_all();
    }
    // The writer ends once every sender is gone: the reader's and each task's.
    let written = writer_task.await.unwrap_or(Ok(()));
    ended?;
    written?;
    drained.map_err(|_| TransmissionError::DrainTimeout(limits.drain_timeout))
}

enum Admitted {
    Run(
        OwnedSemaphorePermit,
        Option<OwnedSemaphorePermit>,
        bytes::Bytes,
        Command,
    ),
    Refused(OwnedSemaphorePermit, ReplyBytes),
    Disconnect,
}

/// Takes the request's permits, reads (or skips) its payload and validates it.
async fn admit<R: AsyncRead + Unpin>(
    reader: &mut R,
    header: &RequestHeader,
    negotiated: &Negotiated,
    slots: &Arc<Semaphore>,
    bytes: &Arc<Semaphore>,
) -> std::io::Result<Admitted> {
    // The semaphores are never closed, so acquiring only waits.
    let slot = slots
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| std::io::Error::other("request slots closed"))?;
    let payload_bytes = header.payload_bytes();
    // Bytes a request pins: its write data, or the data a read will return.
    let pinned = match header.kind {
        CMD_WRITE | CMD_READ if header.length <= PAYLOAD_BYTES_MAX => header.length,
        _ => 0,
    };
    let bytes_permit = if pinned > 0 {
        Some(
            bytes
                .clone()
                .acquire_many_owned(pinned)
                .await
                .map_err(|_| std::io::Error::other("byte budget closed"))?,
        )
    } else {
        None
    };
    let payload = if payload_bytes > PAYLOAD_BYTES_MAX {
        // Over the limit: keep the stream's framing, hold nothing (validation refuses it).
        skip(reader, u64::from(payload_bytes)).await?;
        bytes::Bytes::new()
    } else {
        let mut data = BytesMut::with_capacity(payload_bytes as usize);
        while data.len() < payload_bytes as usize {
            let want = payload_bytes as usize - data.len();
            if (&mut *reader).take(want as u64).read_buf(&mut data).await? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        }
        data.freeze()
    };
    Ok(match header.validate(negotiated) {
        Ok(Command::Disconnect) => Admitted::Disconnect,
        Ok(command) => Admitted::Run(slot, bytes_permit, payload, command),
        Err(rejection) => Admitted::Refused(
            slot,
            reply::error(
                header.handle,
                negotiated.structured,
                rejection.error,
                &rejection.message,
            ),
        ),
    })
}

async fn send(
    replies: &mpsc::Sender<Outgoing>,
    reply: ReplyBytes,
    slot: OwnedSemaphorePermit,
    bytes: Option<OwnedSemaphorePermit>,
) {
    // Fails only when the writer stopped (socket error); the reply has nowhere to go then.
    let _ = replies
        .send(Outgoing {
            reply,
            _slot: slot,
            _bytes: bytes,
        })
        .await;
}

/// Fills `raw`; `false` on a clean EOF before the first byte.
async fn read_header<R: AsyncRead + Unpin>(
    reader: &mut R,
    raw: &mut [u8; REQUEST_HEADER_BYTES],
) -> std::io::Result<bool> {
    let first = reader.read(&mut raw[..1]).await?;
    if first == 0 {
        return Ok(false);
    }
    reader.read_exact(&mut raw[1..]).await?;
    Ok(true)
}

/// Writes replies as they arrive; flushes whenever no other reply is waiting, so replies
/// that complete together share one write and a lone reply is not delayed.
async fn write_replies<W: AsyncWrite + Unpin>(
    writer: W,
    mut outbox: mpsc::Receiver<Outgoing>,
) -> std::io::Result<()> {
    let mut writer = BufWriter::with_capacity(WRITE_BUFFER_BYTES, writer);
    while let Some(first) = outbox.recv().await {
        let mut next = Some(first);
        while let Some(outgoing) = next {
            for segment in &outgoing.reply.segments {
                writer.write_all(segment).await?;
            }
            // Permits are released here, once the reply's bytes left this connection's
            // buffers or are in the socket.
            drop(outgoing);
            next = outbox.try_recv().ok();
        }
        writer.flush().await?;
    }
    writer.flush().await?;
    writer.shutdown().await
}

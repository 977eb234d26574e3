//! The transmission phase of one connection, all on the connection's one task: it reads
//! requests, runs them concurrently, and writes their replies as they complete (out of order),
//! with no task per request and no writer task, so a request costs no task spawn, no channel
//! hop and no wake-up of another task.
//!
//! ```text
//!            one task per connection, one pass per wake-up:
//! socket ──▶ read_buf → every whole request buffered: header → limits → payload → validate
//!                                                                 │ execution futures
//!                     poll set: each woken execution polled once ◀┘
//! socket ◀── replies completed in this pass (and earlier, unwritten): one vectored write
//! ```
//!
//! Memory is bounded per connection: a request holds a slot of `inflight_requests_max` and
//! bytes of `inflight_bytes_max` (its payload, then its reply) from before its payload is read
//! until its reply is written (`flight`). When either runs out the task stops reading the
//! socket but goes on running requests and writing replies, so a client that sends faster than
//! the cluster answers, or that does not read its replies, is slowed by TCP, not buffered.
//!
//! Ending: `NBD_CMD_DISC`, EOF, a header with a bad magic (the stream cannot be resynced) or
//! server shutdown stop the reading; the requests already admitted finish and their replies
//! are written (all bounded by `drain_timeout`), then the socket closes.

use crate::backend::Export;
use crate::consts::*;
use crate::execute::execute;
use crate::flight::Flight;
use crate::intake::{Intake, Next};
use crate::outbox::Outbox;
use crate::poll_set::PollSet;
use crate::reply::ReplyBytes;
use crate::request::{Command, Negotiated};
use bytes::Bytes;
use std::future::Future;
use std::pin::{pin, Pin};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tokio::time::Sleep;

/// Per-connection limits.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub inflight_requests_max: usize,
    /// Must be at least `PAYLOAD_BYTES_MAX`, so that the largest legal request can run.
    pub inflight_bytes_max: u32,
    /// How long admitted requests may take to finish, and their replies to be written, once
    /// the connection is ending.
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

/// Why a connection ended other than by the client's disconnect.
#[derive(Debug, thiserror::Error)]
pub enum TransmissionError {
    #[error("socket: {0}")]
    Io(std::io::Error),
    #[error(transparent)]
    Protocol(#[from] crate::request::BadRequestMagic),
    #[error("requests or replies still pending after the {0:?} drain timeout")]
    DrainTimeout(Duration),
}

// The message includes the cause's, so the cause is not also its `source()` (a printed
// chain would say it twice): `From` by hand instead of `#[from]`.
impl From<std::io::Error> for TransmissionError {
    fn from(e: std::io::Error) -> Self {
        TransmissionError::Io(e)
    }
}

/// Serves requests on `stream` until the client disconnects, the socket fails, or `shutdown`
/// turns true.
pub async fn serve<S, X>(
    stream: S,
    export: X,
    negotiated: Negotiated,
    limits: Limits,
    shutdown: watch::Receiver<bool>,
) -> Result<(), TransmissionError>
where
    S: AsyncRead + AsyncWrite + Unpin,
    X: Export,
{
    assert!(limits.inflight_bytes_max >= PAYLOAD_BYTES_MAX);
    assert!(limits.inflight_requests_max > 0);
    let mut conn = Conn {
        stream,
        intake: Intake::new(negotiated),
        flight: Flight::new(&limits),
        outbox: Outbox::default(),
        running: PollSet::new(),
        completed: Vec::new(),
        blocked: false,
    };
    // Set once the connection stops reading requests: why it ended.
    let mut ending: Option<Result<(), TransmissionError>> = None;
    let mut write_failed: Option<std::io::Error> = None;
    let mut stop = pin!(stopped(shutdown));
    let mut drain: Option<Pin<Box<Sleep>>> = None;
    loop {
        if ending.is_none() {
            let structured = negotiated.structured;
            ending = conn.take_requests(|command, handle, payload, pinned| {
                run(&export, command, handle, payload, structured, pinned)
            });
        }
        let idle = conn.running.is_empty() && conn.outbox.is_idle();
        if ending.is_none() {
            // Room is held only by requests running or replies waiting: a request waiting for
            // room always has something to wait for. (Once ending, nothing more is taken.)
            assert!(!(conn.blocked && idle), "blocked with nothing in flight");
        }
        if ending.is_some() {
            drain.get_or_insert_with(|| Box::pin(tokio::time::sleep(limits.drain_timeout)));
            if idle {
                break;
            }
        }
        let read = ending.is_none() && !conn.blocked;
        tokio::select! {
            // The shutdown and the deadline first (both are cheap to poll), so that a stream
            // of work never hides them.
            biased;
            () = &mut stop, if ending.is_none() => ending = Some(Ok(())),
            () = deadline(&mut drain) => {
                return Err(TransmissionError::DrainTimeout(limits.drain_timeout));
            }
            step = std::future::poll_fn(|cx| conn.poll_step(cx, read)) => {
                if let Some(e) = step.write_failed {
                    conn.outbox.break_down(&mut conn.flight);
                    ending.get_or_insert(Ok(()));
                    write_failed.get_or_insert(e);
                }
                match step.read {
                    None | Some(Ok(1..)) => {}
                    Some(Ok(0)) if conn.intake.is_mid_request() => {
                        ending = Some(Err(std::io::Error::from(
                            std::io::ErrorKind::UnexpectedEof,
                        ).into()));
                    }
                    Some(Ok(0)) => ending = Some(Ok(())),
                    Some(Err(e)) => ending = Some(Err(e.into())),
                }
            }
        }
    }
    let drain = drain.expect("set once the connection is ending");
    let closed = match write_failed {
        None => tokio::time::timeout_at(drain.deadline(), conn.stream.shutdown()).await,
        Some(_) => Ok(Ok(())),
    };
    ending.expect("the loop ends once the connection is ending")?;
    if let Some(e) = write_failed {
        return Err(e.into());
    }
    match closed {
        Ok(closed) => Ok(closed?),
        Err(_) => Err(TransmissionError::DrainTimeout(limits.drain_timeout)),
    }
}

/// What one request's execution yields: its reply, and the payload bytes it held.
type Done = (ReplyBytes, u32);

/// Runs one admitted request against the export.
async fn run<X: Export>(
    export: &X,
    command: Command,
    handle: u64,
    payload: Bytes,
    structured: bool,
    pinned: u32,
) -> Done {
    (
        execute(export, command, handle, payload, structured).await,
        pinned,
    )
}

async fn stopped(mut shutdown: watch::Receiver<bool>) {
    // An error means the sender is gone, which is a shutdown too.
    let _ = shutdown.wait_for(|stop| *stop).await;
}

async fn deadline(drain: &mut Option<Pin<Box<Sleep>>>) {
    match drain {
        Some(sleep) => sleep.as_mut().await,
        None => std::future::pending().await,
    }
}

/// What one pass over the connection did, besides running requests and writing replies.
#[derive(Default)]
struct Step {
    /// A read from the socket happened: bytes read (0 at EOF) or its error.
    read: Option<std::io::Result<usize>>,
    write_failed: Option<std::io::Error>,
}

struct Conn<S, F: Future<Output = Done>> {
    stream: S,
    intake: Intake,
    flight: Flight,
    outbox: Outbox,
    running: PollSet<F>,
    /// Outputs of one pass over `running` (kept to reuse its allocation).
    completed: Vec<Done>,
    /// A buffered request waits for room: the socket is not read.
    blocked: bool,
}

impl<S, F> Conn<S, F>
where
    S: AsyncRead + AsyncWrite + Unpin,
    F: Future<Output = Done>,
{
    /// Takes every request the buffer holds, in order: starts the valid ones (`start` makes
    /// their execution), queues the refusals. Stops at a request it needs more bytes for, or
    /// one that finds no room (`blocked`). Some when reading ends: why.
    fn take_requests(
        &mut self,
        mut start: impl FnMut(Command, u64, Bytes, u32) -> F,
    ) -> Option<Result<(), TransmissionError>> {
        self.blocked = false;
        loop {
            match self.intake.next(&mut self.flight) {
                Next::Run {
                    command,
                    handle,
                    payload,
                    pinned,
                } => self.running.push(start(command, handle, payload, pinned)),
                Next::Refused { reply, pinned } => {
                    self.flight.complete(pinned, reply.len_bytes() as u64);
                    self.outbox.push(reply, &mut self.flight);
                }
                Next::Disconnect { pinned } => {
                    self.flight.forget(pinned);
                    return Some(Ok(()));
                }
                Next::NeedBytes => return None,
                Next::Blocked => {
                    self.blocked = true;
                    return None;
                }
                Next::BadMagic(e) => return Some(Err(e.into())),
            }
        }
    }

    /// One pass: the executions that were woken (their replies queued), one vectored write of
    /// every queued reply, and one read of the socket if `read`. Ready when any of it did
    /// something, so that the caller takes the requests read or admits the ones that waited
    /// for room.
    fn poll_step(&mut self, cx: &mut Context<'_>, read: bool) -> Poll<Step> {
        let mut step = Step::default();
        let mut progress = false;
        if self
            .running
            .poll_completed(cx, &mut self.completed)
            .is_ready()
        {
            for (reply, pinned) in self.completed.drain(..) {
                self.flight.complete(pinned, reply.len_bytes() as u64);
                self.outbox.push(reply, &mut self.flight);
            }
            progress = true;
        }
        match self
            .outbox
            .poll_write(cx, &mut self.stream, &mut self.flight)
        {
            Poll::Ready(Ok(released)) => progress |= released,
            Poll::Ready(Err(e)) => {
                step.write_failed = Some(e);
                progress = true;
            }
            Poll::Pending => {}
        }
        if read && step.write_failed.is_none() {
            self.intake.reserve();
            // `read_buf` is cancel safe: dropped unfinished, it has read nothing.
            let reading = pin!(self.stream.read_buf(&mut self.intake.buffer));
            if let Poll::Ready(result) = reading.poll(cx) {
                step.read = Some(result);
                progress = true;
            }
        }
        if progress {
            Poll::Ready(step)
        } else {
            Poll::Pending
        }
    }
}

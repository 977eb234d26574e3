//! Replies waiting for the socket, written by the connection's task: everything ready is
//! handed to one vectored write (read data is not copied: the segments are the client
//! library's buffers), a partial write resumes where it stopped, and each reply gives back
//! its slot and bytes ([`Flight`]) once all of it was written.

use crate::flight::Flight;
use crate::reply::ReplyBytes;
use bytes::Bytes;
use std::collections::VecDeque;
use std::io::IoSlice;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::AsyncWrite;

/// Buffers handed to one vectored write (the kernel takes up to 1024). A simple read reply is
/// two segments, a write's reply one: 64 covers the replies of 32 to 64 requests.
const WRITE_SLICES_MAX: usize = 64;

#[derive(Default)]
pub(crate) struct Outbox {
    segments: VecDeque<Bytes>,
    /// Per queued reply, in order: the stream position at its end, and its bytes.
    ends: VecDeque<(u64, u64)>,
    /// Stream positions: bytes queued, and bytes written, since the connection began.
    queued_position: u64,
    written_position: u64,
    /// Written since the last flush (a TLS stream holds the last record until flushed).
    unflushed: bool,
    /// The socket failed: replies are dropped as they come (their requests still finish).
    broken: bool,
}

impl Outbox {
    /// Nothing waits to be written or flushed.
    pub(crate) fn is_idle(&self) -> bool {
        self.segments.is_empty() && !self.unflushed
    }

    /// Queues `reply`; its bytes count in `flight` until written.
    pub(crate) fn push(&mut self, reply: ReplyBytes, flight: &mut Flight) {
        let bytes = reply.len_bytes() as u64;
        assert!(bytes > 0, "a reply has a header");
        if self.broken {
            flight.written(bytes);
            return;
        }
        // Empty segments (the data of an empty read) would make a write of nothing look like
        // a closed socket.
        self.segments
            .extend(reply.segments.into_iter().filter(|s| !s.is_empty()));
        self.queued_position += bytes;
        self.ends.push_back((self.queued_position, bytes));
    }

    /// Drops what waits, and every reply from now on, releasing them: the socket failed.
    pub(crate) fn break_down(&mut self, flight: &mut Flight) {
        self.broken = true;
        self.segments.clear();
        self.unflushed = false;
        for (_, bytes) in self.ends.drain(..) {
            flight.written(bytes);
        }
    }

    /// Writes what waits until the writer would block, then flushes. Ready(true) when a
    /// reply was released (its request's slot is free); Ready(false) when there was nothing
    /// to do; Pending when the writer is not ready and nothing was released.
    pub(crate) fn poll_write<W: AsyncWrite + Unpin>(
        &mut self,
        cx: &mut Context<'_>,
        writer: &mut W,
        flight: &mut Flight,
    ) -> Poll<std::io::Result<bool>> {
        let mut released = false;
        let blocked = |released| {
            if released {
                Poll::Ready(Ok(true))
            } else {
                Poll::Pending
            }
        };
        while !self.segments.is_empty() {
            let mut slices = [IoSlice::new(&[]); WRITE_SLICES_MAX];
            let count = slices.len().min(self.segments.len());
            for (slice, segment) in slices.iter_mut().zip(&self.segments) {
                *slice = IoSlice::new(segment);
            }
            let written = match Pin::new(&mut *writer).poll_write_vectored(cx, &slices[..count]) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()))
                }
                Poll::Ready(Ok(n)) => n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return blocked(released),
            };
            self.unflushed = true;
            self.advance(written);
            while let Some(&(end, bytes)) = self.ends.front() {
                if end > self.written_position {
                    break;
                }
                self.ends.pop_front();
                flight.written(bytes);
                released = true;
            }
        }
        assert!(self.ends.is_empty(), "every queued reply was written");
        if self.unflushed {
            match Pin::new(writer).poll_flush(cx) {
                Poll::Ready(Ok(())) => self.unflushed = false,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return blocked(released),
            }
        }
        Poll::Ready(Ok(released))
    }

    fn advance(&mut self, written: usize) {
        self.written_position += written as u64;
        assert!(self.written_position <= self.queued_position);
        fastblock_wire::advance_chunks(&mut self.segments, written);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reply;
    use crate::transmission::Limits;

    /// A writer that takes at most `step` bytes per write and is not ready every other call.
    struct Trickle {
        out: Vec<u8>,
        step: usize,
        calls: usize,
    }

    impl AsyncWrite for Trickle {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            self.calls += 1;
            if self.calls % 2 == 0 {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            let n = buf.len().min(self.step);
            self.out.extend_from_slice(&buf[..n]);
            Poll::Ready(Ok(n))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// Partial writes resume where they stopped; a reply frees its slot only once its last
    /// byte is written; the bytes on the wire are the replies back to back.
    #[tokio::test]
    async fn partial_writes_resume_and_release_whole_replies() {
        let mut flight = Flight::new(&Limits::default());
        let mut outbox = Outbox::default();
        let replies = [
            reply::simple_read(1, Bytes::from_static(b"0123456789")),
            reply::simple(2, 0),
            reply::simple_read(3, Bytes::new()),
        ];
        let mut expected = Vec::new();
        for r in &replies {
            flight.admit(0);
            flight.complete(0, r.len_bytes() as u64);
            expected.extend(r.concat());
            outbox.push(r.clone(), &mut flight);
        }
        let mut writer = Trickle {
            out: Vec::new(),
            step: 7,
            calls: 0,
        };
        let mut released_at = Vec::new();
        while !outbox.is_idle() {
            let poll = std::future::poll_fn(|cx| {
                Poll::Ready(outbox.poll_write(cx, &mut writer, &mut flight))
            })
            .await;
            if let Poll::Ready(Ok(true)) = poll {
                released_at.push((writer.out.len(), flight.requests()));
            }
        }
        assert_eq!(writer.out, expected);
        assert_eq!(flight.requests(), 0);
        // Each release happened once the whole reply was out: 26, then 42, then 58 bytes.
        for (len, left) in released_at {
            let done = [26, 42, 58].iter().filter(|end| **end <= len).count();
            assert_eq!(left, 3 - done, "{len} bytes written");
        }
    }
}

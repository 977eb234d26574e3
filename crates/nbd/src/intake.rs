//! Requests out of the connection's read buffer, sans IO: header, admission against the
//! limits, payload, validation. The transmission loop reads the socket into the buffer and
//! takes every request the buffer holds in one pass ([`Intake::next`] until it needs bytes).
//!
//! A request is admitted (takes its slot and bytes in [`Flight`]) once its header is buffered,
//! before its payload is read, as the limits promise. A header that finds no room stays in the
//! buffer, and the loop reads no more until a request finishes: the client is slowed by TCP.

use crate::consts::*;
use crate::flight::{pinned_bytes, Flight};
use crate::reply::{self, ReplyBytes};
use crate::request::{BadRequestMagic, Command, Negotiated, RequestHeader};
use bytes::{Buf, Bytes, BytesMut};

/// Bytes the buffer has room for at each read (many headers per read syscall), on top of the
/// rest of the request being read.
const READ_BUFFER_BYTES: usize = 64 << 10;
/// Below this much room the buffer is grown before reading.
const READ_ROOM_MIN_BYTES: usize = 4 << 10;

/// What the buffer yields next.
#[derive(Debug)]
pub(crate) enum Next {
    /// An admitted, valid request to run; it holds `pinned` bytes in the flight.
    Run {
        command: Command,
        handle: u64,
        payload: Bytes,
        pinned: u32,
    },
    /// An admitted request refused by validation, with its error reply.
    Refused { reply: ReplyBytes, pinned: u32 },
    /// `NBD_CMD_DISC` (admitted; holds `pinned`, which is 0).
    Disconnect { pinned: u32 },
    /// The buffer holds no whole request: read more.
    NeedBytes,
    /// A header is buffered but the limits are reached: read nothing until a request finishes.
    Blocked,
    /// The stream lost its framing.
    BadMagic(BadRequestMagic),
}

/// The request whose header was taken, waiting for the rest of its payload.
#[derive(Debug)]
struct Partial {
    header: RequestHeader,
    pinned: u32,
    /// Payload bytes still to drop, for a payload over the limit (never buffered whole).
    skip_bytes: u64,
}

pub(crate) struct Intake {
    pub(crate) buffer: BytesMut,
    partial: Option<Partial>,
    negotiated: Negotiated,
}

impl Intake {
    pub(crate) fn new(negotiated: Negotiated) -> Intake {
        Intake {
            buffer: BytesMut::with_capacity(READ_BUFFER_BYTES),
            partial: None,
            negotiated,
        }
    }

    /// Whether a request was begun but not received whole (an EOF now cuts it).
    pub(crate) fn is_mid_request(&self) -> bool {
        self.partial.is_some() || !self.buffer.is_empty()
    }

    /// The next request in the buffer, admitted against `flight`.
    pub(crate) fn next(&mut self, flight: &mut Flight) -> Next {
        if self.partial.is_none() {
            let Some(raw) = self.buffer.first_chunk::<REQUEST_HEADER_BYTES>() else {
                return Next::NeedBytes;
            };
            let header = match RequestHeader::parse(raw) {
                Ok(header) => header,
                Err(e) => return Next::BadMagic(e),
            };
            let pinned = pinned_bytes(header.kind, header.length);
            if !flight.has_room(pinned) {
                return Next::Blocked;
            }
            flight.admit(pinned);
            self.buffer.advance(REQUEST_HEADER_BYTES);
            let payload_bytes = header.payload_bytes();
            let skip_bytes = if payload_bytes > PAYLOAD_BYTES_MAX {
                u64::from(payload_bytes)
            } else {
                0
            };
            self.partial = Some(Partial {
                header,
                pinned,
                skip_bytes,
            });
        }
        let partial = self.partial.as_mut().expect("a request is being read");
        let payload = if partial.skip_bytes > 0 {
            // Over the limit: keep the stream's framing, hold nothing (validation refuses it).
            let n = partial.skip_bytes.min(self.buffer.len() as u64);
            self.buffer.advance(n as usize);
            partial.skip_bytes -= n;
            if partial.skip_bytes > 0 {
                return Next::NeedBytes;
            }
            Bytes::new()
        } else {
            let payload_bytes = partial.header.payload_bytes() as usize;
            if self.buffer.len() < payload_bytes {
                return Next::NeedBytes;
            }
            // The payload keeps the buffer's memory (no copy); the buffer goes on after it.
            self.buffer.split_to(payload_bytes).freeze()
        };
        let Partial { header, pinned, .. } = self.partial.take().expect("a request is being read");
        match header.validate(&self.negotiated) {
            Ok(Command::Disconnect) => Next::Disconnect { pinned },
            Ok(command) => Next::Run {
                command,
                handle: header.handle,
                payload,
                pinned,
            },
            Err(rejection) => Next::Refused {
                reply: reply::error(
                    header.handle,
                    self.negotiated.structured,
                    rejection.error,
                    &rejection.message,
                ),
                pinned,
            },
        }
    }

    /// Makes room in the buffer for the next read: what the current request still needs (so a
    /// large write's payload arrives in one buffer), and some more for the requests after it.
    pub(crate) fn reserve(&mut self) {
        let needed = match &self.partial {
            None => REQUEST_HEADER_BYTES.saturating_sub(self.buffer.len()),
            Some(p) if p.skip_bytes > 0 => 0,
            Some(p) => (p.header.payload_bytes() as usize).saturating_sub(self.buffer.len()),
        };
        let room = self.buffer.capacity() - self.buffer.len();
        if room < needed.max(READ_ROOM_MIN_BYTES) {
            self.buffer.reserve(needed + READ_BUFFER_BYTES);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transmission::Limits;
    use bytes::BufMut;

    fn header(kind: u16, handle: u64, length: u32) -> Vec<u8> {
        let mut b = Vec::new();
        b.put_u32(REQUEST_MAGIC);
        b.put_u16(0);
        b.put_u16(kind);
        b.put_u64(handle);
        b.put_u64(0);
        b.put_u32(length);
        b
    }

    fn intake() -> Intake {
        Intake::new(Negotiated {
            size_bytes: 1 << 30,
            structured: false,
            allocation_context: false,
        })
    }

    /// Every whole request in the buffer comes out in one pass; a partial payload waits for
    /// its bytes; a header beyond the slot limit stays buffered until a slot frees.
    #[test]
    fn takes_whole_requests_waits_for_payloads_and_blocks_at_the_limit() {
        let limits = Limits {
            inflight_requests_max: 2,
            ..Limits::default()
        };
        let mut flight = Flight::new(&limits);
        let mut intake = intake();
        intake.buffer.put_slice(&header(CMD_WRITE, 1, 4));
        intake.buffer.put_slice(b"abcd");
        intake.buffer.put_slice(&header(CMD_WRITE, 2, 6));
        intake.buffer.put_slice(b"xyz");
        assert!(matches!(intake.next(&mut flight),
            Next::Run { handle: 1, ref payload, pinned: 4, .. } if payload[..] == *b"abcd"));
        assert!(matches!(intake.next(&mut flight), Next::NeedBytes));
        assert!(intake.is_mid_request());
        intake.buffer.put_slice(b"uvw");
        intake.buffer.put_slice(&header(CMD_READ, 3, 4096));
        assert!(matches!(intake.next(&mut flight),
            Next::Run { handle: 2, ref payload, pinned: 6, .. } if payload[..] == *b"xyzuvw"));
        assert!(matches!(intake.next(&mut flight), Next::Blocked));
        assert!(matches!(intake.next(&mut flight), Next::Blocked));
        flight.complete(4, 16);
        flight.written(16);
        assert!(matches!(
            intake.next(&mut flight),
            Next::Run {
                handle: 3,
                pinned: 4096,
                ..
            }
        ));
        assert!(matches!(intake.next(&mut flight), Next::NeedBytes));
        assert!(!intake.is_mid_request());
        assert_eq!(flight.requests(), 2);
    }

    /// An oversized write is admitted, its payload dropped as it arrives (never buffered),
    /// then refused with EOVERFLOW; a bad magic stops the stream.
    #[test]
    fn oversized_payloads_are_skipped_and_bad_magic_stops() {
        let mut flight = Flight::new(&Limits::default());
        let mut intake = intake();
        let length = PAYLOAD_BYTES_MAX + 1;
        intake.buffer.put_slice(&header(CMD_WRITE, 7, length));
        let mut sent = 0usize;
        while sent < length as usize {
            assert!(matches!(intake.next(&mut flight), Next::NeedBytes));
            assert!(intake.buffer.is_empty(), "skipped bytes are not kept");
            let n = (length as usize - sent).min(1 << 20);
            intake.buffer.put_bytes(1, n);
            sent += n;
        }
        match intake.next(&mut flight) {
            Next::Refused { reply, pinned: 0 } => assert_eq!(reply, reply::simple(7, EOVERFLOW)),
            other => panic!("expected a refusal, got {other:?}"),
        }
        intake.buffer.put_slice(&[0xde; REQUEST_HEADER_BYTES]);
        assert!(matches!(intake.next(&mut flight), Next::BadMagic(_)));
    }
}

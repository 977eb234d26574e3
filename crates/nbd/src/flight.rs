//! What one connection holds, against its [`Limits`]: request slots and bytes.
//!
//! A request takes a slot and its payload bytes (its write data, or the data its read will
//! return) when it is admitted, before its payload is read. When it completes, its bytes become
//! its reply's bytes, which it holds until the reply is written to the socket, with the slot.
//! So a client that does not read its replies stops the connection from admitting more
//! requests: replies waiting for the socket are bounded like requests in flight.

use crate::consts::*;
use crate::transmission::Limits;

#[derive(Debug)]
pub(crate) struct Flight {
    requests_max: usize,
    bytes_max: u64,
    requests: usize,
    bytes: u64,
}

impl Flight {
    pub(crate) fn new(limits: &Limits) -> Flight {
        Flight {
            requests_max: limits.inflight_requests_max,
            bytes_max: u64::from(limits.inflight_bytes_max),
            requests: 0,
            bytes: 0,
        }
    }

    /// Whether a request pinning `pinned` bytes may be admitted now. The byte budget may be
    /// overrun by replies (a reply is a little larger than its data); it then only waits.
    pub(crate) fn has_room(&self, pinned: u32) -> bool {
        self.requests < self.requests_max && self.bytes + u64::from(pinned) <= self.bytes_max
    }

    pub(crate) fn admit(&mut self, pinned: u32) {
        assert!(
            self.has_room(pinned),
            "admitted beyond the limits: {self:?}"
        );
        self.requests += 1;
        self.bytes += u64::from(pinned);
    }

    /// A request ended with nothing to send (`NBD_CMD_DISC`).
    pub(crate) fn forget(&mut self, pinned: u32) {
        self.release(pinned.into());
    }

    /// A request's payload bytes become its reply's bytes.
    pub(crate) fn complete(&mut self, pinned: u32, reply_bytes: u64) {
        assert!(
            self.bytes >= u64::from(pinned),
            "{self:?} releases {pinned}"
        );
        self.bytes = self.bytes - u64::from(pinned) + reply_bytes;
    }

    /// A reply of `reply_bytes` left for the socket (or was dropped with it).
    pub(crate) fn written(&mut self, reply_bytes: u64) {
        self.release(reply_bytes);
    }

    fn release(&mut self, bytes: u64) {
        assert!(self.requests > 0, "{self:?} releases a request");
        assert!(self.bytes >= bytes, "{self:?} releases {bytes}");
        self.requests -= 1;
        self.bytes -= bytes;
    }

    #[cfg(test)]
    pub(crate) fn requests(&self) -> usize {
        self.requests
    }
}

/// Bytes a request pins from its admission: its write data, or the data a read will return.
/// Oversized ones pin nothing (their payload is skipped, and they are refused).
pub(crate) fn pinned_bytes(kind: u16, length: u32) -> u32 {
    match kind {
        CMD_WRITE | CMD_READ if length <= PAYLOAD_BYTES_MAX => length,
        _ => 0,
    }
}

//! Transmission requests, sans IO: the 28-byte header, then its validation against what was
//! negotiated into a [`Command`] or a [`Rejection`] (the error value the client gets).
//!
//! Header (big-endian): magic `0x25609513` u32, command flags u16, type u16, handle u64,
//! offset u64, length u32; a `WRITE` is followed by `length` bytes of data. The payload length
//! depends only on the type, so the reader can always keep the stream's framing, even for a
//! request it rejects: [`RequestHeader::payload_bytes`].

use crate::be::BeReader;
use crate::consts::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestHeader {
    pub flags: u16,
    pub kind: u16,
    pub handle: u64,
    pub offset: u64,
    pub length: u32,
}

/// A header whose magic is wrong: the stream cannot be resynchronised, so the connection is
/// closed (a hard disconnect, which the spec allows on a protocol violation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad request magic {0:#x}")]
pub struct BadRequestMagic(pub u32);

impl RequestHeader {
    pub fn parse(bytes: &[u8; REQUEST_HEADER_BYTES]) -> Result<RequestHeader, BadRequestMagic> {
        let mut r = BeReader::new(bytes);
        // A 28-byte array holds every field: the reads below cannot run short.
        let mut field = |what| r.u64(what).unwrap_or(0);
        let first = field("magic, flags, type");
        let magic = (first >> 32) as u32;
        if magic != REQUEST_MAGIC {
            return Err(BadRequestMagic(magic));
        }
        let handle = field("handle");
        let offset = field("offset");
        let length = r.u32("length").unwrap_or(0);
        Ok(RequestHeader {
            flags: (first >> 16) as u16,
            kind: first as u16,
            handle,
            offset,
            length,
        })
    }

    /// Bytes of data that follow this header on the stream.
    pub fn payload_bytes(&self) -> u32 {
        if self.kind == CMD_WRITE {
            self.length
        } else {
            0
        }
    }
}

/// A valid request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// `df`: answer with one data chunk (no holes).
    Read {
        offset: u64,
        length: u32,
        df: bool,
    },
    /// FUA needs nothing more: every acknowledged write is durable on a Raft majority.
    Write {
        offset: u64,
        length: u32,
    },
    Disconnect,
    Flush,
    Trim {
        offset: u64,
        length: u32,
    },
    Cache {
        offset: u64,
        length: u32,
    },
    WriteZeroes {
        offset: u64,
        length: u32,
        no_hole: bool,
        fast_zero: bool,
    },
    BlockStatus {
        offset: u64,
        length: u32,
        req_one: bool,
    },
}

/// Why a request is refused, with the error value to answer and a message for humans.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    pub error: u32,
    pub message: String,
}

/// What the transmission phase knows when it validates a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Negotiated {
    pub size_bytes: u64,
    pub structured: bool,
    /// `base:allocation` was selected (it is the only context).
    pub allocation_context: bool,
}

/// Flags each command may carry. FUA is valid on every command (the spec: a server that
/// advertises `SEND_FUA` must accept it everywhere).
fn allowed_flags(kind: u16, n: &Negotiated) -> u16 {
    let extra = match kind {
        CMD_READ if n.structured => CMD_FLAG_DF,
        CMD_WRITE_ZEROES => CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
        CMD_BLOCK_STATUS => CMD_FLAG_REQ_ONE,
        _ => 0,
    };
    CMD_FLAG_FUA | extra
}

impl RequestHeader {
    /// Checks the request against the protocol and the export.
    pub fn validate(&self, n: &Negotiated) -> Result<Command, Rejection> {
        let reject = |error, message: String| Err(Rejection { error, message });
        let (offset, length) = (self.offset, self.length);
        if !matches!(
            self.kind,
            CMD_READ
                | CMD_WRITE
                | CMD_DISC
                | CMD_FLUSH
                | CMD_TRIM
                | CMD_CACHE
                | CMD_WRITE_ZEROES
                | CMD_BLOCK_STATUS
        ) {
            return reject(EINVAL, format!("unknown command {}", self.kind));
        }
        if self.kind == CMD_DISC {
            // Nothing is answered to a disconnect; its fields do not matter.
            return Ok(Command::Disconnect);
        }
        let unknown = self.flags & !allowed_flags(self.kind, n);
        if unknown != 0 {
            return reject(
                EINVAL,
                format!("flags {unknown:#x} are not valid on command {}", self.kind),
            );
        }
        if self.kind == CMD_FLUSH {
            if offset != 0 || length != 0 {
                return reject(EINVAL, "flush with a non-zero offset or length".into());
            }
            return Ok(Command::Flush);
        }
        if matches!(self.kind, CMD_READ | CMD_WRITE) && length > PAYLOAD_BYTES_MAX {
            return reject(
                EOVERFLOW,
                format!("{length} bytes is over the maximum block size {PAYLOAD_BYTES_MAX}"),
            );
        }
        let inside = offset
            .checked_add(u64::from(length))
            .is_some_and(|end| end <= n.size_bytes);
        if !inside {
            // The spec asks for ENOSPC on writes past the end, EINVAL otherwise.
            let error = match self.kind {
                CMD_WRITE | CMD_WRITE_ZEROES | CMD_TRIM => ENOSPC,
                _ => EINVAL,
            };
            return reject(
                error,
                format!(
                    "range {offset}+{length} is outside the export of {} bytes",
                    n.size_bytes
                ),
            );
        }
        let flag = |bit| self.flags & bit != 0;
        Ok(match self.kind {
            CMD_READ => Command::Read {
                offset,
                length,
                df: flag(CMD_FLAG_DF),
            },
            CMD_WRITE => Command::Write { offset, length },
            CMD_TRIM => Command::Trim { offset, length },
            CMD_CACHE => Command::Cache { offset, length },
            CMD_WRITE_ZEROES => Command::WriteZeroes {
                offset,
                length,
                no_hole: flag(CMD_FLAG_NO_HOLE),
                fast_zero: flag(CMD_FLAG_FAST_ZERO),
            },
            CMD_BLOCK_STATUS => {
                if !n.allocation_context {
                    return reject(
                        EINVAL,
                        "block status without a selected metadata context".into(),
                    );
                }
                if length == 0 {
                    return reject(EINVAL, "block status of zero bytes".into());
                }
                Command::BlockStatus {
                    offset,
                    length,
                    req_one: flag(CMD_FLAG_REQ_ONE),
                }
            }
            // Every other kind returned above.
            other => return reject(EINVAL, format!("unknown command {other}")),
        })
    }
}

#[cfg(test)]
// NBD fields are big-endian; the tests build them by hand.
#[allow(clippy::big_endian_bytes)]
mod tests {
    use super::*;

    fn header(flags: u16, kind: u16, offset: u64, length: u32) -> [u8; REQUEST_HEADER_BYTES] {
        let mut b = [0u8; REQUEST_HEADER_BYTES];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&flags.to_be_bytes());
        b[6..8].copy_from_slice(&kind.to_be_bytes());
        b[8..16].copy_from_slice(&0x1122_3344_5566_7788u64.to_be_bytes());
        b[16..24].copy_from_slice(&offset.to_be_bytes());
        b[24..28].copy_from_slice(&length.to_be_bytes());
        b
    }

    const PLAIN: Negotiated = Negotiated {
        size_bytes: 1 << 20,
        structured: false,
        allocation_context: false,
    };
    const RICH: Negotiated = Negotiated {
        size_bytes: 1 << 20,
        structured: true,
        allocation_context: true,
    };

    fn check(bytes: [u8; REQUEST_HEADER_BYTES], n: &Negotiated) -> Result<Command, u32> {
        RequestHeader::parse(&bytes)
            .expect("magic")
            .validate(n)
            .map_err(|r| r.error)
    }

    #[test]
    fn header_fields_parse_in_network_order() {
        let h = RequestHeader::parse(&header(0x0001, CMD_WRITE, 4096, 512)).unwrap();
        assert_eq!(
            h,
            RequestHeader {
                flags: 1,
                kind: CMD_WRITE,
                handle: 0x1122_3344_5566_7788,
                offset: 4096,
                length: 512
            }
        );
        assert_eq!(h.payload_bytes(), 512);
        let mut bad = header(0, CMD_READ, 0, 0);
        bad[3] ^= 0xff;
        assert!(RequestHeader::parse(&bad).is_err());
    }

    #[test]
    fn valid_commands() {
        assert_eq!(
            check(header(CMD_FLAG_FUA, CMD_WRITE, 100, 7), &PLAIN),
            Ok(Command::Write {
                offset: 100,
                length: 7
            })
        );
        assert_eq!(
            check(header(CMD_FLAG_DF, CMD_READ, 0, 4096), &RICH),
            Ok(Command::Read {
                offset: 0,
                length: 4096,
                df: true
            })
        );
        assert_eq!(
            check(
                header(
                    CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
                    CMD_WRITE_ZEROES,
                    0,
                    1 << 20
                ),
                &PLAIN
            ),
            Ok(Command::WriteZeroes {
                offset: 0,
                length: 1 << 20,
                no_hole: true,
                fast_zero: true
            })
        );
        assert_eq!(
            check(header(CMD_FLAG_REQ_ONE, CMD_BLOCK_STATUS, 0, 10), &RICH),
            Ok(Command::BlockStatus {
                offset: 0,
                length: 10,
                req_one: true
            })
        );
        assert_eq!(
            check(header(0, CMD_FLUSH, 0, 0), &PLAIN),
            Ok(Command::Flush)
        );
        assert_eq!(
            check(header(0xffff, CMD_DISC, 5, 5), &PLAIN),
            Ok(Command::Disconnect)
        );
    }

    #[test]
    fn rejections_carry_the_spec_error() {
        // Unknown command, unknown flag, flag on the wrong command, DF without structured
        // replies.
        assert_eq!(check(header(0, 9, 0, 0), &PLAIN), Err(EINVAL));
        assert_eq!(check(header(1 << 7, CMD_READ, 0, 1), &RICH), Err(EINVAL));
        assert_eq!(
            check(header(CMD_FLAG_NO_HOLE, CMD_WRITE, 0, 1), &RICH),
            Err(EINVAL)
        );
        assert_eq!(
            check(header(CMD_FLAG_DF, CMD_READ, 0, 1), &PLAIN),
            Err(EINVAL)
        );
        // Past the end: ENOSPC for writes, EINVAL for reads; overflow does not wrap.
        assert_eq!(check(header(0, CMD_WRITE, 1 << 20, 1), &PLAIN), Err(ENOSPC));
        assert_eq!(check(header(0, CMD_TRIM, u64::MAX, 2), &PLAIN), Err(ENOSPC));
        assert_eq!(
            check(header(0, CMD_READ, (1 << 20) - 1, 2), &PLAIN),
            Err(EINVAL)
        );
        // Over the maximum payload.
        let big = Negotiated {
            size_bytes: 1 << 40,
            ..PLAIN
        };
        assert_eq!(
            check(header(0, CMD_READ, 0, PAYLOAD_BYTES_MAX + 1), &big),
            Err(EOVERFLOW)
        );
        // Trim and write-zeroes carry no payload, so they may be larger.
        assert!(check(header(0, CMD_TRIM, 0, PAYLOAD_BYTES_MAX + 1), &big).is_ok());
        // Block status needs a context, and a non-empty range.
        assert_eq!(
            check(header(0, CMD_BLOCK_STATUS, 0, 1), &PLAIN),
            Err(EINVAL)
        );
        assert_eq!(check(header(0, CMD_BLOCK_STATUS, 0, 0), &RICH), Err(EINVAL));
        // Flush with fields set.
        assert_eq!(check(header(0, CMD_FLUSH, 1, 0), &PLAIN), Err(EINVAL));
    }
}

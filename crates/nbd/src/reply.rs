//! Transmission replies, sans IO: simple replies (clients that did not negotiate structured
//! replies, like the kernel) and structured chunks (data, holes, block status, errors).
//!
//! A reply is a list of byte segments ([`ReplyBytes`]) so that read data goes to the socket
//! as the client library returned it, never copied into a reply buffer.
//!
//! Layouts (big-endian): simple reply = magic `0x67446698` u32, error u32, handle u64 (then
//! the data of a successful read); chunk = magic `0x668e33ef` u32, flags u16, type u16,
//! handle u64, payload length u32, payload.

use crate::consts::*;
use crate::extents::{zero_runs, Run};
use crate::option_reply::cut;
use bytes::{BufMut, Bytes, BytesMut};

/// One whole reply, in order. Segments are written back to back.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplyBytes {
    pub segments: Vec<Bytes>,
}

impl ReplyBytes {
    pub fn len_bytes(&self) -> usize {
        self.segments.iter().map(Bytes::len).sum()
    }

    /// All segments in one buffer (tests and small replies).
    pub fn concat(&self) -> Vec<u8> {
        self.segments
            .iter()
            .flat_map(|s| s.iter().copied())
            .collect()
    }
}

/// A simple reply without data: success (`error == 0`) or an error.
pub fn simple(handle: u64, error: u32) -> ReplyBytes {
    ReplyBytes {
        segments: vec![simple_header(handle, error)],
    }
}

fn simple_header(handle: u64, error: u32) -> Bytes {
    let mut out = BytesMut::with_capacity(SIMPLE_REPLY_BYTES);
    out.put_u32(SIMPLE_REPLY_MAGIC);
    out.put_u32(error);
    out.put_u64(handle);
    out.freeze()
}

/// A successful read as a simple reply: the header, then exactly the data.
pub fn simple_read(handle: u64, data: Bytes) -> ReplyBytes {
    ReplyBytes {
        segments: vec![simple_header(handle, 0), data],
    }
}

fn chunk_header(out: &mut BytesMut, flags: u16, kind: u16, handle: u64, length: u32) {
    out.put_u32(STRUCTURED_REPLY_MAGIC);
    out.put_u16(flags);
    out.put_u16(kind);
    out.put_u64(handle);
    out.put_u32(length);
}

/// A successful read as structured chunks: data chunks, and hole chunks for whole zero blocks
/// (unless `df`, "don't fragment", asks for one data chunk). The last chunk carries `DONE`:
/// the data is already in memory, so no error can follow it. An empty read is one `NONE`
/// chunk.
pub fn structured_read(handle: u64, offset: u64, data: Bytes, df: bool) -> ReplyBytes {
    let runs = if df {
        vec![Run {
            start: 0,
            len: data.len(),
            zero: false,
        }]
    } else {
        zero_runs(offset, &data)
    };
    let mut segments = Vec::with_capacity(runs.len() * 2);
    if data.is_empty() {
        let mut out = BytesMut::with_capacity(CHUNK_HEADER_BYTES);
        chunk_header(&mut out, REPLY_FLAG_DONE, REPLY_TYPE_NONE, handle, 0);
        segments.push(out.freeze());
        return ReplyBytes { segments };
    }
    let last = runs.len() - 1;
    for (i, run) in runs.iter().enumerate() {
        let flags = if i == last { REPLY_FLAG_DONE } else { 0 };
        let run_offset = offset + run.start as u64;
        // Runs are at most the read's length, bounded by PAYLOAD_BYTES_MAX: no overflow.
        let len = run.len as u32;
        let mut head = BytesMut::with_capacity(CHUNK_HEADER_BYTES + 12);
        if run.zero {
            chunk_header(&mut head, flags, REPLY_TYPE_OFFSET_HOLE, handle, 12);
            head.put_u64(run_offset);
            head.put_u32(len);
            segments.push(head.freeze());
        } else {
            chunk_header(&mut head, flags, REPLY_TYPE_OFFSET_DATA, handle, 8 + len);
            head.put_u64(run_offset);
            segments.push(head.freeze());
            segments.push(data.slice(run.start..run.start + run.len));
        }
    }
    ReplyBytes { segments }
}

/// An error as the final structured chunk, with a message for humans.
pub fn structured_error(handle: u64, error: u32, message: &str) -> ReplyBytes {
    assert_ne!(error, 0, "an error chunk needs a non-zero error");
    let message = cut(message);
    // `cut` bounds the message far below u16::MAX.
    let message_len = message.len() as u16;
    let mut out = BytesMut::with_capacity(CHUNK_HEADER_BYTES + 6 + message.len());
    chunk_header(
        &mut out,
        REPLY_FLAG_DONE,
        REPLY_TYPE_ERROR,
        handle,
        6 + u32::from(message_len),
    );
    out.put_u32(error);
    out.put_u16(message_len);
    out.put_slice(message.as_bytes());
    ReplyBytes {
        segments: vec![out.freeze()],
    }
}

/// A `BLOCK_STATUS` answer for one context: id, then `(length, flags)` descriptors.
pub fn block_status(handle: u64, context_id: u32, descriptors: &[(u32, u32)]) -> ReplyBytes {
    assert!(!descriptors.is_empty(), "block status needs a descriptor");
    // At most BLOCK_STATUS_BYTES_MAX / 1 descriptors in theory; bounded in practice by the
    // allocated ranges of a 64 MiB window (at most 16384 blocks), far below u32.
    let payload = u32::try_from(4 + descriptors.len() * 8).expect("block status fits u32");
    let mut out = BytesMut::with_capacity(CHUNK_HEADER_BYTES + payload as usize);
    chunk_header(
        &mut out,
        REPLY_FLAG_DONE,
        REPLY_TYPE_BLOCK_STATUS,
        handle,
        payload,
    );
    out.put_u32(context_id);
    for &(length, flags) in descriptors {
        out.put_u32(length);
        out.put_u32(flags);
    }
    ReplyBytes {
        segments: vec![out.freeze()],
    }
}

/// An error answer in whichever reply style the connection negotiated.
pub fn error(handle: u64, structured: bool, error: u32, message: &str) -> ReplyBytes {
    if structured {
        structured_error(handle, error, message)
    } else {
        simple(handle, error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simple_reply_layout() {
        let r = simple_read(7, Bytes::from_static(b"abc"));
        assert_eq!(
            r.concat(),
            [
                &[0x67, 0x44, 0x66, 0x98, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7][..],
                b"abc"
            ]
            .concat()
        );
        assert_eq!(simple(1, EIO).concat()[4..8], [0, 0, 0, 5]);
    }

    #[test]
    fn structured_read_sends_holes_for_zero_blocks_and_done_last() {
        let mut data = vec![0u8; 8192];
        data[5000] = 9;
        let r = structured_read(3, 4096, Bytes::from(data), false);
        let bytes = r.concat();
        // Chunk 1: hole at 4096, 4096 bytes, not done.
        assert_eq!(&bytes[0..4], &[0x66, 0x8e, 0x33, 0xef]);
        assert_eq!(&bytes[4..8], &[0, 0, 0, 2]);
        assert_eq!(&bytes[16..20], &[0, 0, 0, 12]);
        assert_eq!(&bytes[20..28], &[0, 0, 0, 0, 0, 0, 0x10, 0]);
        assert_eq!(&bytes[28..32], &[0, 0, 0x10, 0]);
        // Chunk 2: data at 8192, 4096 bytes, done.
        let c2 = &bytes[32..];
        assert_eq!(&c2[4..8], &[0, 1, 0, 1]);
        assert_eq!(&c2[16..20], &[0, 0, 0x10, 8]);
        assert_eq!(&c2[20..28], &[0, 0, 0, 0, 0, 0, 0x20, 0]);
        assert_eq!(c2.len(), 28 + 4096);
        assert_eq!(c2[28 + 5000 - 4096], 9);
        // With DF: one data chunk, zeros included.
        let r = structured_read(3, 4096, Bytes::from(vec![0u8; 8192]), true);
        assert_eq!(r.len_bytes(), 28 + 8192);
        // An empty read: one NONE chunk with DONE.
        let r = structured_read(3, 0, Bytes::new(), false);
        assert_eq!(&r.concat()[4..8], &[0, 1, 0, 0]);
    }

    #[test]
    fn error_chunk_and_block_status_layouts() {
        let e = structured_error(5, EINVAL, "bad").concat();
        assert_eq!(&e[4..8], &[0, 1, 0x80, 1]);
        assert_eq!(&e[16..20], &[0, 0, 0, 9]);
        assert_eq!(&e[20..26], &[0, 0, 0, 22, 0, 3]);
        assert_eq!(&e[26..], b"bad");
        let b = block_status(5, 1, &[(4096, 3), (512, 0)]).concat();
        assert_eq!(&b[4..8], &[0, 1, 0, 5]);
        assert_eq!(&b[16..20], &[0, 0, 0, 20]);
        assert_eq!(
            &b[20..],
            &[0, 0, 0, 1, 0, 0, 0x10, 0, 0, 0, 0, 3, 0, 0, 2, 0, 0, 0, 0, 0]
        );
    }
}

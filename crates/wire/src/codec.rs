//! Primitive little-endian readers and writers for payloads.
//!
//! Why a reader type instead of `bytes::Buf`: `Buf::get_u32_le` panics on a short buffer, and a
//! decoder must never panic on network input. [`Reader`] checks every bound, names the field
//! in its error, and slices byte strings out of the payload `Bytes` without copying.
//!
//! Why a frame writer: a message is encoded straight into the caller's output buffer behind a
//! placeholder header, and the header (length and crc of what was written) is filled in at
//! the end. No temporary payload buffer, and lengths are only ever encoded as explicit
//! `u32`/`u16` after an assertion that they fit.

use crate::header::{
    build_header, reseal_header, Kind, FLAGS_OFFSET, FLAG_SEALED, FLAG_SIGNED, HEADER_BYTES,
    TAG_BYTES, TAG_HEADER_BYTES,
};
use crate::WireError;
use bytes::{BufMut, Bytes, BytesMut};
use fastblock_types::{Epoch, ImageId, OsdId, PgId, PoolId};

/// A bounds-checked cursor over one frame's payload.
pub(crate) struct Reader<'a> {
    payload: &'a Bytes,
    position: usize,
    /// The message being decoded, for error text ("trailing bytes after Read").
    message: &'static str,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(payload: &'a Bytes, message: &'static str) -> Self {
        Reader {
            payload,
            position: 0,
            message,
        }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.payload.len() - self.position
    }

    /// The next `count` bytes, or `Truncated` naming the field.
    fn take(&mut self, count: usize, what: &'static str) -> Result<&'a [u8], WireError> {
        let have = self.remaining();
        if count > have {
            return Err(WireError::Truncated {
                what,
                need: count,
                have,
            });
        }
        let start = self.position;
        self.position += count;
        // In bounds: `start + count <= payload.len()` was checked just above.
        Ok(&self.payload[start..start + count])
    }

    fn take_array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], WireError> {
        let slice = self.take(N, what)?;
        let mut array = [0u8; N];
        array.copy_from_slice(slice);
        Ok(array)
    }

    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8, WireError> {
        Ok(self.take_array::<1>(what)?[0])
    }

    pub(crate) fn u16(&mut self, what: &'static str) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(self.take_array(what)?))
    }

    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.take_array(what)?))
    }

    pub(crate) fn u64(&mut self, what: &'static str) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.take_array(what)?))
    }

    /// A reserved field: must read as zero, so that a later version can give it a meaning
    /// that an old decoder detects instead of silently ignoring.
    pub(crate) fn zero_u8(&mut self, what: &'static str) -> Result<(), WireError> {
        match self.u8(what)? {
            0 => Ok(()),
            value => Err(WireError::Invalid(format!(
                "{}: {what} is {value}, expected 0",
                self.message
            ))),
        }
    }

    /// A reserved 32-bit field; see [`Reader::zero_u8`].
    pub(crate) fn zero_u32(&mut self, what: &'static str) -> Result<(), WireError> {
        match self.u32(what)? {
            0 => Ok(()),
            value => Err(WireError::Invalid(format!(
                "{}: {what} is {value:#x}, expected 0",
                self.message
            ))),
        }
    }

    /// A reserved 64-bit field; see [`Reader::zero_u8`].
    pub(crate) fn zero_u64(&mut self, what: &'static str) -> Result<(), WireError> {
        match self.u64(what)? {
            0 => Ok(()),
            value => Err(WireError::Invalid(format!(
                "{}: {what} is {value:#x}, expected 0",
                self.message
            ))),
        }
    }

    /// `count` bytes as a zero-copy slice of the payload.
    pub(crate) fn bytes(&mut self, count: usize, what: &'static str) -> Result<Bytes, WireError> {
        let have = self.remaining();
        if count > have {
            return Err(WireError::Truncated {
                what,
                need: count,
                have,
            });
        }
        let start = self.position;
        self.position += count;
        Ok(self.payload.slice(start..start + count))
    }

    /// A UTF-8 string of `len_bytes` bytes, at most `len_bytes_max`.
    pub(crate) fn string(
        &mut self,
        len_bytes: u16,
        len_bytes_max: usize,
        what: &'static str,
    ) -> Result<String, WireError> {
        let len_bytes = usize::from(len_bytes);
        if len_bytes > len_bytes_max {
            return Err(WireError::Invalid(format!(
                "{}: {what} is {len_bytes} bytes, limit {len_bytes_max}",
                self.message
            )));
        }
        let raw = self.take(len_bytes, what)?;
        match std::str::from_utf8(raw) {
            Ok(text) => Ok(text.to_owned()),
            Err(error) => Err(WireError::Invalid(format!(
                "{}: {what} is not UTF-8: {error}",
                self.message
            ))),
        }
    }

    pub(crate) fn pg(&mut self) -> Result<PgId, WireError> {
        let pool = self.u32("pg pool")?;
        let seq = self.u32("pg seq")?;
        Ok(PgId::new(PoolId(pool), seq))
    }

    pub(crate) fn epoch(&mut self) -> Result<Epoch, WireError> {
        Ok(Epoch(self.u64("epoch")?))
    }

    pub(crate) fn osd(&mut self, what: &'static str) -> Result<OsdId, WireError> {
        Ok(OsdId(self.u32(what)?))
    }

    pub(crate) fn image(&mut self) -> Result<ImageId, WireError> {
        Ok(ImageId(self.u64("image id")?))
    }

    /// A length field that must equal the bytes left in the payload. Lengths are explicit on
    /// the wire so that a payload cut or padded by a bug is detected, not reinterpreted.
    pub(crate) fn expect_rest(&self, len_bytes: u32, what: &'static str) -> Result<(), WireError> {
        let rest = self.remaining();
        if u64::from(len_bytes) != rest as u64 {
            return Err(WireError::Invalid(format!(
                "{}: {what} says {len_bytes} bytes but {rest} bytes follow",
                self.message
            )));
        }
        Ok(())
    }

    /// Ends decoding: a payload longer than its message is an error, not ignored.
    pub(crate) fn finish(self) -> Result<(), WireError> {
        match self.remaining() {
            0 => Ok(()),
            rest => Err(WireError::Invalid(format!(
                "{}: {rest} trailing bytes after the message",
                self.message
            ))),
        }
    }
}

/// Converts an in-memory length to its `u32` wire form. A length that does not fit is a bug
/// of the caller (a message the protocol cannot carry), not an input error.
pub(crate) fn len_u32(len: usize, what: &str) -> u32 {
    match u32::try_from(len) {
        Ok(len) => len,
        Err(_) => panic!("{what}: length {len} does not fit the u32 wire field"),
    }
}

/// Converts a string length to its `u16` wire form after checking the protocol's bound.
pub(crate) fn len_u16(len: usize, len_max: usize, what: &str) -> u16 {
    assert!(
        len <= len_max,
        "{what}: {len} bytes over the limit {len_max}"
    );
    match u16::try_from(len) {
        Ok(len) => len,
        Err(_) => panic!("{what}: length {len} does not fit the u16 wire field"),
    }
}

/// Writes one frame into an output buffer: a placeholder header first, the payload through
/// the `put_*` methods, then [`FrameWriter::finish`] fills in the header.
pub(crate) struct FrameWriter<'a> {
    out: &'a mut BytesMut,
    /// Offset of this frame's header in `out` (the buffer may already hold earlier frames).
    start: usize,
}

impl<'a> FrameWriter<'a> {
    /// Starts a frame, reserving room for the header and `payload_len_hint` payload bytes so
    /// that encoding a large write does at most one reallocation.
    pub(crate) fn begin(out: &'a mut BytesMut, payload_len_hint: usize) -> Self {
        out.reserve(HEADER_BYTES.saturating_add(payload_len_hint));
        let start = out.len();
        out.put_bytes(0, HEADER_BYTES);
        FrameWriter { out, start }
    }

    pub(crate) fn put_u8(&mut self, value: u8) {
        self.out.put_u8(value);
    }

    pub(crate) fn put_u16(&mut self, value: u16) {
        self.out.put_u16_le(value);
    }

    pub(crate) fn put_u32(&mut self, value: u32) {
        self.out.put_u32_le(value);
    }

    pub(crate) fn put_u64(&mut self, value: u64) {
        self.out.put_u64_le(value);
    }

    pub(crate) fn put_slice(&mut self, bytes: &[u8]) {
        self.out.put_slice(bytes);
    }

    pub(crate) fn put_pg(&mut self, pg: PgId) {
        self.put_u32(pg.pool.get());
        self.put_u32(pg.seq);
    }

    /// Bytes of payload written so far.
    pub(crate) fn payload_len(&self) -> usize {
        self.out.len() - self.start - HEADER_BYTES
    }

    /// Fills in the header over what was written since [`FrameWriter::begin`].
    pub(crate) fn finish(self, kind: Kind, request_id: u64) {
        let payload_start = self.start + HEADER_BYTES;
        let payload_len = len_u32(self.payload_len(), "frame payload");
        let payload_crc = crc32c::crc32c(&self.out[payload_start..]);
        let header = build_header(kind, 0, request_id, payload_len, payload_crc);
        self.out[self.start..payload_start].copy_from_slice(&header);
    }
}

/// Appends one frame (header, then the concatenation of `payload_parts`) to `out`.
///
/// The payload is given in parts so that a caller holding the fixed fields in one buffer and
/// a write's data in another does not first copy them into a contiguous payload; they are
/// copied once, into `out`, and the crc is computed over what was written.
pub fn encode_frame(kind: Kind, request_id: u64, payload_parts: &[&[u8]], out: &mut BytesMut) {
    let payload_len = payload_parts
        .iter()
        .fold(0usize, |sum, part| sum.saturating_add(part.len()));
    // Checked before writing anything, so a too-large payload leaves `out` untouched.
    len_u32(payload_len, "frame payload");
    let mut writer = FrameWriter::begin(out, payload_len);
    for part in payload_parts {
        writer.put_slice(part);
    }
    assert_eq!(writer.payload_len(), payload_len);
    writer.finish(kind, request_id);
}

/// Protects the frame that starts at `out[start..]` (one whole unprotected frame, the last
/// in `out`) in place: sets its flag (`SIGNED`, or `SEALED` if `encrypts`), lets `protect`
/// tag (and, sealed, encrypt in place) the payload given the header bytes the tag covers,
/// refreshes the header crc and appends the tag. The payload is never copied.
///
/// # Panics
/// If `out[start..]` is not exactly one frame (a caller bug).
pub fn protect_frame(
    out: &mut BytesMut,
    start: usize,
    encrypts: bool,
    protect: impl FnOnce(&[u8; TAG_HEADER_BYTES], &mut [u8]) -> [u8; TAG_BYTES],
) {
    let payload_start = start + HEADER_BYTES;
    assert!(
        out.len() >= payload_start,
        "protect_frame: no frame header at {start}"
    );
    let flags = if encrypts { FLAG_SEALED } else { FLAG_SIGNED };
    let (header, payload) = out[start..].split_at_mut(HEADER_BYTES);
    let payload_len = u32::from_le_bytes(header[16..20].try_into().expect("4 bytes"));
    assert_eq!(
        payload.len(),
        payload_len as usize,
        "protect_frame: not one whole frame"
    );
    header[FLAGS_OFFSET..FLAGS_OFFSET + 2].copy_from_slice(&flags.to_le_bytes());
    let covered: [u8; TAG_HEADER_BYTES] = header[..TAG_HEADER_BYTES].try_into().expect("20");
    let tag = protect(&covered, payload);
    // The payload CRC stays the plaintext's, as encoded: the receiver checks the tag instead
    // (`FrameDecoder::decode_mut`), so nothing is computed again over the ciphertext.
    reseal_header(header);
    out.extend_from_slice(&tag);
}

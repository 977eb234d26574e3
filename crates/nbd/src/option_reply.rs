//! Handshake encoding, sans IO: the server greeting, option replies, and the old
//! `EXPORT_NAME` answer. Every function appends to a caller-owned buffer (`BufMut` writes
//! integers big-endian, as NBD wants).

use crate::consts::*;
use bytes::{BufMut, BytesMut};

/// `NBDMAGIC`, `IHAVEOPT`, then the handshake flags: fixed newstyle, and no trailing zeros
/// after `EXPORT_NAME` if the client agrees.
pub fn put_greeting(out: &mut BytesMut) {
    out.put_u64(INIT_MAGIC);
    out.put_u64(OPTION_MAGIC);
    out.put_u16(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
}

/// One option reply: magic, the option it answers, reply type, payload.
pub fn put_reply(out: &mut BytesMut, option: u32, reply_type: u32, payload: &[u8]) {
    // Payloads are built by this crate from bounded strings; the u32 length always fits.
    let len = u32::try_from(payload.len()).expect("option reply payload fits u32");
    out.put_u64(OPTION_REPLY_MAGIC);
    out.put_u32(option);
    out.put_u32(reply_type);
    out.put_u32(len);
    out.put_slice(payload);
}

pub fn put_ack(out: &mut BytesMut, option: u32) {
    put_reply(out, option, REP_ACK, &[]);
}

/// An error reply with a message for humans (cut to [`MESSAGE_BYTES_MAX`] bytes).
pub fn put_error(out: &mut BytesMut, option: u32, reply_type: u32, message: &str) {
    debug_assert!(reply_type & (1 << 31) != 0, "not an error reply type");
    put_reply(out, option, reply_type, cut(message).as_bytes());
}

/// `NBD_REP_SERVER` for `LIST`: name length u32, name.
pub fn put_server(out: &mut BytesMut, name: &str) {
    let mut payload = BytesMut::with_capacity(4 + name.len());
    payload.put_u32(len_u32(name.len()));
    payload.put_slice(name.as_bytes());
    put_reply(out, OPT_LIST, REP_SERVER, &payload);
}

/// `NBD_REP_INFO` / `NBD_INFO_EXPORT`: size u64, transmission flags u16.
pub fn put_info_export(out: &mut BytesMut, option: u32, size_bytes: u64, flags: u16) {
    let mut payload = BytesMut::with_capacity(12);
    payload.put_u16(INFO_EXPORT);
    payload.put_u64(size_bytes);
    payload.put_u16(flags);
    put_reply(out, option, REP_INFO, &payload);
}

/// `NBD_REP_INFO` / `NBD_INFO_NAME` or `NBD_INFO_DESCRIPTION`: a string.
pub fn put_info_text(out: &mut BytesMut, option: u32, info: u16, text: &str) {
    let mut payload = BytesMut::with_capacity(2 + text.len());
    payload.put_u16(info);
    payload.put_slice(text.as_bytes());
    put_reply(out, option, REP_INFO, &payload);
}

/// `NBD_REP_INFO` / `NBD_INFO_BLOCK_SIZE`: minimum, preferred, maximum u32.
pub fn put_info_block_size(out: &mut BytesMut, option: u32) {
    let mut payload = BytesMut::with_capacity(14);
    payload.put_u16(INFO_BLOCK_SIZE);
    payload.put_u32(BLOCK_SIZE_MIN_BYTES);
    payload.put_u32(BLOCK_SIZE_PREFERRED_BYTES);
    payload.put_u32(PAYLOAD_BYTES_MAX);
    put_reply(out, option, REP_INFO, &payload);
}

/// `NBD_REP_META_CONTEXT`: context id u32, name.
pub fn put_meta_context(out: &mut BytesMut, option: u32, id: u32, name: &str) {
    let mut payload = BytesMut::with_capacity(4 + name.len());
    payload.put_u32(id);
    payload.put_slice(name.as_bytes());
    put_reply(out, option, REP_META_CONTEXT, &payload);
}

/// The answer to `EXPORT_NAME`: size u64, flags u16, and 124 zeros unless the client
/// negotiated `NO_ZEROES`.
pub fn put_export_name_answer(out: &mut BytesMut, size_bytes: u64, flags: u16, no_zeroes: bool) {
    out.put_u64(size_bytes);
    out.put_u16(flags);
    if !no_zeroes {
        out.put_bytes(0, EXPORT_NAME_PADDING_BYTES);
    }
}

/// The transmission flags of an export: everything this server implements; `DF` only once
/// structured replies are negotiated (the spec requires it clear otherwise).
/// `CAN_MULTI_CONN` is true because a write is acknowledged only when durable on a Raft
/// majority, so a flush on any connection covers every write completed on all of them
/// (`docs/nbd.md`).
pub fn transmission_flags(structured: bool, read_only: bool) -> u16 {
    let mut flags = TFLAG_HAS_FLAGS
        | TFLAG_SEND_FLUSH
        | TFLAG_SEND_FUA
        | TFLAG_SEND_TRIM
        | TFLAG_SEND_WRITE_ZEROES
        | TFLAG_CAN_MULTI_CONN
        | TFLAG_SEND_CACHE
        | TFLAG_SEND_FAST_ZERO;
    if structured {
        flags |= TFLAG_SEND_DF;
    }
    if read_only {
        flags |= TFLAG_READ_ONLY;
    }
    flags
}

fn len_u32(len: usize) -> u32 {
    u32::try_from(len).expect("protocol strings are bounded far below u32")
}

/// `message` cut at a character boundary to at most [`MESSAGE_BYTES_MAX`] bytes.
pub fn cut(message: &str) -> &str {
    if message.len() <= MESSAGE_BYTES_MAX {
        return message;
    }
    let mut end = MESSAGE_BYTES_MAX;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    &message[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greeting_bytes() {
        let mut out = BytesMut::new();
        put_greeting(&mut out);
        assert_eq!(&out[..8], b"NBDMAGIC");
        assert_eq!(&out[8..16], b"IHAVEOPT");
        assert_eq!(&out[16..], &[0, 3]);
    }

    #[test]
    fn info_export_layout() {
        let mut out = BytesMut::new();
        put_info_export(&mut out, OPT_GO, 1 << 30, 0x0d6d);
        let expected: &[u8] = &[
            0x00, 0x03, 0xe8, 0x89, 0x04, 0x55, 0x65, 0xa9, // reply magic
            0, 0, 0, 7, // option GO
            0, 0, 0, 3, // NBD_REP_INFO
            0, 0, 0, 12, // length
            0, 0, // NBD_INFO_EXPORT
            0, 0, 0, 0, 0x40, 0, 0, 0, // size 1 GiB
            0x0d, 0x6d, // flags
        ];
        assert_eq!(&out[..], expected);
    }

    #[test]
    fn export_name_answer_pads_unless_no_zeroes() {
        let mut out = BytesMut::new();
        put_export_name_answer(&mut out, 4096, 1, false);
        assert_eq!(out.len(), 10 + EXPORT_NAME_PADDING_BYTES);
        out.clear();
        put_export_name_answer(&mut out, 4096, 1, true);
        assert_eq!(out.len(), 10);
    }

    #[test]
    fn df_only_with_structured_replies_and_multi_conn_always() {
        assert_eq!(transmission_flags(false, false) & TFLAG_SEND_DF, 0);
        assert_ne!(transmission_flags(true, false) & TFLAG_SEND_DF, 0);
        assert_ne!(transmission_flags(false, false) & TFLAG_CAN_MULTI_CONN, 0);
        assert_eq!(transmission_flags(true, false) & TFLAG_READ_ONLY, 0);
        assert_ne!(transmission_flags(true, true) & TFLAG_READ_ONLY, 0);
    }

    #[test]
    fn long_messages_are_cut_at_a_character_boundary() {
        let long = "é".repeat(MESSAGE_BYTES_MAX);
        let short = cut(&long);
        assert!(short.len() <= MESSAGE_BYTES_MAX);
        assert!(short.len() >= MESSAGE_BYTES_MAX - 1);
    }
}

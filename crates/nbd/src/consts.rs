//! The numbers of the NBD protocol (NetworkBlockDevice `doc/proto.md`) that this server
//! speaks, and this server's own limits. Every integer on the NBD wire is big-endian (network
//! byte order), unlike fastblock's own wire protocol.

// ---- Handshake ----

/// `NBDMAGIC`: the first 8 bytes the server sends.
pub const INIT_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: the newstyle magic, sent by the server after `NBDMAGIC` and by the client in
/// front of every option.
pub const OPTION_MAGIC: u64 = 0x4948_4156_454f_5054;
/// Magic of every option reply (fixed newstyle).
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;

/// Handshake flags (server → client, 16 bits).
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
/// Client flags (client → server, 32 bits).
pub const CLIENT_FLAG_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const CLIENT_FLAG_NO_ZEROES: u32 = 1 << 1;

/// Option codes.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;

/// Option reply types. Errors have bit 31 set.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
pub const REP_ERR_UNSUP: u32 = (1 << 31) | 1;
pub const REP_ERR_POLICY: u32 = (1 << 31) | 2;
pub const REP_ERR_INVALID: u32 = (1 << 31) | 3;
pub const REP_ERR_TLS_REQD: u32 = (1 << 31) | 5;
pub const REP_ERR_UNKNOWN: u32 = (1 << 31) | 6;
pub const REP_ERR_SHUTDOWN: u32 = (1 << 31) | 7;
pub const REP_ERR_TOO_BIG: u32 = (1 << 31) | 9;

/// Information types of `NBD_REP_INFO` (answers to `INFO` and `GO`).
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

/// Transmission flags (16 bits, per export).
pub const TFLAG_HAS_FLAGS: u16 = 1 << 0;
pub const TFLAG_READ_ONLY: u16 = 1 << 1;
pub const TFLAG_SEND_FLUSH: u16 = 1 << 2;
pub const TFLAG_SEND_FUA: u16 = 1 << 3;
pub const TFLAG_ROTATIONAL: u16 = 1 << 4;
pub const TFLAG_SEND_TRIM: u16 = 1 << 5;
pub const TFLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const TFLAG_SEND_DF: u16 = 1 << 7;
pub const TFLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const TFLAG_SEND_RESIZE: u16 = 1 << 9;
pub const TFLAG_SEND_CACHE: u16 = 1 << 10;
pub const TFLAG_SEND_FAST_ZERO: u16 = 1 << 11;

/// The one metadata context this server knows, and the id it is selected under.
pub const META_BASE_ALLOCATION: &str = "base:allocation";
pub const META_BASE_ALLOCATION_ID: u32 = 1;
/// `base:allocation` status bits.
pub const STATE_HOLE: u32 = 1 << 0;
pub const STATE_ZERO: u32 = 1 << 1;

// ---- Transmission ----

pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Command types.
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

/// Command flags.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

/// Structured reply chunk flags and types.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) | 1;

/// Error values of replies (the protocol's fixed set, which happen to be Linux errnos).
pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

// ---- Sizes of fixed parts ----

/// Option header: magic u64, option u32, length u32.
pub const OPTION_HEADER_BYTES: usize = 16;
/// Request header: magic u32, flags u16, type u16, handle u64, offset u64, length u32.
pub const REQUEST_HEADER_BYTES: usize = 28;
/// Simple reply: magic u32, error u32, handle u64.
pub const SIMPLE_REPLY_BYTES: usize = 16;
/// Structured chunk header: magic u32, flags u16, type u16, handle u64, length u32.
pub const CHUNK_HEADER_BYTES: usize = 20;
/// Zeros after the `EXPORT_NAME` answer unless `NO_ZEROES` was negotiated.
pub const EXPORT_NAME_PADDING_BYTES: usize = 124;

// ---- This server's limits ----

/// Longest string (export name, query, message) the protocol allows.
pub const STRING_BYTES_MAX: usize = 4096;
/// Longest option payload this server reads. The largest legal one is a `GO` or
/// `SET_META_CONTEXT` with a maximal name and a few queries; larger ones are answered
/// `NBD_REP_ERR_TOO_BIG` after their bytes are skipped.
pub const OPTION_BYTES_MAX: u32 = 16 << 10;
/// Longer option payloads are not even skipped: the connection is dropped (a client sending
/// megabytes of option data is not negotiating).
pub const OPTION_SKIP_BYTES_MAX: u32 = 1 << 20;
/// Options per connection before the server gives up on a client that never picks an export.
pub const OPTIONS_PER_CONNECTION_MAX: u32 = 1024;
/// Largest READ or WRITE payload (the advertised maximum block size). 32 MiB is what qemu
/// and the kernel use as their own maximum, so no real client is refused.
pub const PAYLOAD_BYTES_MAX: u32 = 32 << 20;
/// Longest range one BLOCK_STATUS answer covers; the spec lets a server answer less than the
/// asked length, and the client asks again from where the answer ended. 64 MiB is 16 object
/// requests of the default 4 MiB objects.
pub const BLOCK_STATUS_BYTES_MAX: u64 = 64 << 20;
/// Preferred block size advertised in `NBD_INFO_BLOCK_SIZE`: the OSD's block; smaller or
/// unaligned IO works (the OSD merges partial blocks) but costs a read-modify-write.
pub const BLOCK_SIZE_PREFERRED_BYTES: u32 = 4096;
/// Minimum block size: any byte range is accepted.
pub const BLOCK_SIZE_MIN_BYTES: u32 = 1;
/// Longest error message sent in a structured error chunk or an option error reply.
pub const MESSAGE_BYTES_MAX: usize = 1024;

// The largest payload must fit the u32 length of a data chunk, with its 8-byte offset.
const _: () = assert!(PAYLOAD_BYTES_MAX as u64 + 8 <= u32::MAX as u64);
// A maximal string (with its length field) must fit in an option payload, or a legal name
// could be refused as too big.
const _: () = assert!(STRING_BYTES_MAX + 64 <= OPTION_BYTES_MAX as usize);
const _: () = assert!(OPTION_BYTES_MAX <= OPTION_SKIP_BYTES_MAX);
// Block status descriptor lengths are u32.
const _: () = assert!(BLOCK_STATUS_BYTES_MAX <= u32::MAX as u64);
// The preferred block size must lie between the minimum and the maximum (spec requirement).
const _: () = assert!(BLOCK_SIZE_MIN_BYTES <= BLOCK_SIZE_PREFERRED_BYTES);
const _: () = assert!(BLOCK_SIZE_PREFERRED_BYTES <= PAYLOAD_BYTES_MAX);
const _: () = assert!(MESSAGE_BYTES_MAX <= STRING_BYTES_MAX);

//! fastblock-wire: the data-plane frame codec and every message sent over it (layer 1).
//!
//! Clients send object IO to PG leaders, and OSDs send each other Raft batches, as frames over
//! TCP: a fixed 32-byte little-endian header with two crc32c (header and payload), then the
//! payload. The format, every payload layout, the limits and what a receiver does on each
//! error are written down in `docs/wire-protocol.md`; this crate is its implementation.
//!
//! Module map:
//! - [`header`]: the 32-byte header layout, [`Kind`], the flags, the magic/version/limit
//!   constants.
//! - [`decoder`]: [`FrameDecoder`], cutting verified [`Frame`]s out of a read buffer.
//! - `codec`: bounds-checked little-endian payload reader, frame writer, [`encode_frame`],
//!   [`protect_frame`] (flag, tag and crcs of an authenticated connection's frame; the
//!   cryptography itself is the caller's, `fastblock_auth::frame`).
//! - [`request`]: [`Request`] (client → OSD and OSD ↔ OSD) and its payload layouts.
//! - [`reply`]: [`Reply`], [`Status`] and their payload layouts.
//! - [`error`]: [`WireError`], split into framing errors (close the connection) and payload
//!   errors (answer `InvalidArgument`, keep serving).
//! - [`chunks`]: [`advance_chunks`], what a vectored write of queued frame chunks took.
//!
//! Invariants:
//! - Decoding never panics and never allocates more than one frame's bytes for one frame,
//!   whatever the input: every length and count is checked against the bytes actually present
//!   (and against its limit) before it is used. Property tests and `fuzz/` check this.
//! - `decode(encode(m)) == m` for every message the encoder accepts, and decoding is strict:
//!   reserved fields must be zero, lengths must match, no trailing bytes. So an accepted
//!   payload has exactly one encoding, and a damaged or misparsed one is an error.
//! - No per-IO copies on receive: a Write's data, a Read reply's data and Raft messages are
//!   slices of the frame payload, itself a `split_to().freeze()` of the read buffer.
//! - The encoders assert what only a caller bug can break (a length that does not fit its
//!   field, a count over its limit, an `Error` reply with status `Ok`).
//!
//! Must not depend on: I/O of any kind (sockets, files, clocks), async runtimes, threads, or
//! `raft` (Raft messages are opaque bytes here). It is pure functions over byte buffers, so
//! the simulator, the OSD, the client and the fuzzer all use the same code.

pub mod chunks;
pub(crate) mod codec;
pub mod decoder;
pub mod error;
pub mod header;
pub mod reply;
pub mod request;

// Re-exported because `Bytes`/`BytesMut` appear in this crate's API: users (and the fuzz
// target) name the same version without a dependency of their own.
pub use bytes;
pub use chunks::advance_chunks;
pub use codec::{encode_frame, protect_frame};
pub use decoder::{tag_header, Frame, FrameDecoder, FrameMut, Protection};
pub use error::WireError;
pub use header::{
    Kind, FLAG_SEALED, FLAG_SIGNED, HEADER_BYTES, MAGIC, PAYLOAD_BYTES_MAX_DEFAULT, TAG_BYTES,
    TAG_HEADER_BYTES, VERSION,
};
pub use reply::{
    AllocatedRange, LeaderHint, ObjectDigest, Reply, Status, ADDRESS_BYTES_MAX,
    ALLOCATED_RANGES_MAX, DIGEST_OBJECTS_MAX, MESSAGE_BYTES_MAX, USAGE_SNAPS_MAX,
};
pub use request::{
    ObjectAddr, RaftEnvelope, RepairMsg, RepairStep, Request, ScrubEntry, ScrubMsg, ScrubStep,
    SnapChunk, SnapVerdict, RAFT_BATCH_ENVELOPES_MAX,
};

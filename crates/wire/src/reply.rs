//! Replies: OSD → client (and OSD → OSD for the debug requests). Every reply is one frame of
//! kind [`Kind::Reply`] carrying the request's id. Payload layouts are in
//! `docs/wire-protocol.md`; the offsets in the comments below are the same ones.

use crate::codec::{len_u16, len_u32, FrameWriter, Reader};
use crate::header::Kind;
use crate::{Frame, WireError, PAYLOAD_BYTES_MAX_DEFAULT};
use bytes::{Bytes, BytesMut};
use fastblock_types::{ImageId, OsdId};

/// Most bytes of an error reply's message. Messages are for logs and operators; a bound keeps
/// an error path from turning into a large allocation.
pub const MESSAGE_BYTES_MAX: usize = 1024;
/// Most bytes of a leader hint's address text (an IP address; room for a host name).
pub const ADDRESS_BYTES_MAX: usize = 255;
/// Most objects in one `Digest` reply. The digest is a debug/test tool; 2^19 objects of 4 MiB
/// is a 2 TiB PG, and the whole reply still fits in the default payload limit.
pub const DIGEST_OBJECTS_MAX: u32 = 1 << 19;
/// Most ranges in one `Allocated` reply. An OSD serves at most 8 MiB per request, i.e. 2048
/// blocks of 4 KiB, so at most 1024 separate ranges; 65536 leaves room for smaller blocks
/// and bounds the decoder's `Vec`.
pub const ALLOCATED_RANGES_MAX: u32 = 1 << 16;

/// Bytes of the prefix every reply starts with: tag u8, reserved u8, status u16.
const PREFIX_BYTES: usize = 4;
/// Bytes of one encoded [`ObjectDigest`]: image u64, object_index u64, len_bytes u64, crc u32.
const OBJECT_DIGEST_BYTES: usize = 28;
/// Bytes of a `Digest` reply before its entries.
const DIGEST_FIXED_BYTES: usize = PREFIX_BYTES + 4 + 8;
/// Bytes of the fixed part of a leader hint: osd u32, port u16, address_len u16, term u64.
const HINT_FIXED_BYTES: usize = 16;
/// Bytes of an `Error` reply before its address and message.
const ERROR_FIXED_BYTES: usize = PREFIX_BYTES + 4 + HINT_FIXED_BYTES;
/// Bytes of an `Allocated` reply before its ranges: prefix, count u32.
const ALLOCATED_FIXED_BYTES: usize = PREFIX_BYTES + 4;
/// Bytes of one encoded [`AllocatedRange`]: offset u32, length u32.
const ALLOCATED_RANGE_BYTES: usize = 8;
/// Bytes of a `Space` reply: prefix, reserved u32, free_bytes u64, pending_free_bytes u64.
const SPACE_BYTES: usize = PREFIX_BYTES + 4 + 8 + 8;

// A digest with the maximum number of objects must fit in the default payload limit, or an
// OSD could build a reply that no default decoder accepts.
const _: () = assert!(
    DIGEST_FIXED_BYTES + OBJECT_DIGEST_BYTES * DIGEST_OBJECTS_MAX as usize
        <= PAYLOAD_BYTES_MAX_DEFAULT as usize
);
// An `Allocated` reply with the maximum number of ranges must fit in the default payload limit.
const _: () = assert!(
    ALLOCATED_FIXED_BYTES + ALLOCATED_RANGE_BYTES * ALLOCATED_RANGES_MAX as usize
        <= PAYLOAD_BYTES_MAX_DEFAULT as usize
);
// Both string bounds must be representable in their u16 length fields.
const _: () = assert!(MESSAGE_BYTES_MAX <= u16::MAX as usize);
const _: () = assert!(ADDRESS_BYTES_MAX <= u16::MAX as usize);
// Read data starts 8 bytes into the payload: 8-byte aligned relative to the frame start.
const _: () = assert!((crate::HEADER_BYTES + PREFIX_BYTES + 4) % 8 == 0);

const TAG_OK: u8 = 0;
const TAG_DATA: u8 = 1;
const TAG_LEADER: u8 = 2;
const TAG_DIGEST: u8 = 3;
const TAG_ERROR: u8 = 4;
const TAG_ALLOCATED: u8 = 5;
const TAG_SPACE: u8 = 6;
const TAG_USAGE: u8 = 7;
/// Most per-snapshot entries in a `Usage` reply (a PG answers `InvalidArgument` beyond).
pub const USAGE_SNAPS_MAX: u32 = 1 << 16;
/// Bytes of a `Usage` reply before its entries, and of each entry.
const USAGE_FIXED_BYTES: usize = PREFIX_BYTES + 4 + 24 + 8;
const USAGE_ENTRY_BYTES: usize = 16;
const _: () = assert!(
    USAGE_FIXED_BYTES + USAGE_ENTRY_BYTES * USAGE_SNAPS_MAX as usize
        <= PAYLOAD_BYTES_MAX_DEFAULT as usize
);

/// Status codes of replies. Retryable ones say so ([`Status::is_retryable`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Status {
    Ok = 0,
    NotLeader = 1,
    NotReady = 2,
    NoSuchPg = 3,
    InvalidArgument = 4,
    OutOfRange = 5,
    NoSpace = 6,
    IoError = 7,
    Checksum = 8,
    Busy = 9,
    StaleEpoch = 10,
    Timeout = 11,
    Internal = 12,
    UnknownOp = 13,
    /// The image was removed: its data is being (or has been) deleted.
    NoSuchImage = 14,
    /// The OSD runs `auth: sign|secure` and the connection sent something else than the
    /// handshake's `AuthHello` first. The connection is closed after this reply.
    AuthRequired = 15,
    /// The handshake failed (unknown entity, wrong key, replayed proof, mode mismatch). The
    /// message names the cause; the connection is closed after this reply.
    AuthFailed = 16,
    /// The authenticated entity's caps do not allow this request (a pool it may not use, an
    /// OSD-to-OSD message from a client).
    PermissionDenied = 17,
    /// The PG holds no such snapshot of the image (never taken, or removed).
    NoSuchSnap = 18,
    /// A snapshot of the image is being taken and this PG has marked it: writes to the image
    /// wait until every PG has (a few milliseconds to the monitor's timeout). Retryable.
    SnapInProgress = 19,
    /// A `CloneRead` of an object the clone has not copied up: read it from the parent.
    ObjectAbsent = 20,
    /// The leader's copy of a block the request reads is bad and is being repaired from
    /// another replica (`docs/design/repair.md`). Retryable: retry after a short pause.
    Repairing = 21,
    /// The handshake's ticket was issued before a rotation of the entity's key or a change of
    /// its caps that this OSD knows of: ask the monitor for a new ticket and connect again.
    /// Retryable. The connection is closed after this reply.
    StaleTicket = 22,
}

impl Status {
    /// Every status, for tests and exhaustive tables.
    pub const ALL: [Status; 23] = [
        Status::Ok,
        Status::NotLeader,
        Status::NotReady,
        Status::NoSuchPg,
        Status::InvalidArgument,
        Status::OutOfRange,
        Status::NoSpace,
        Status::IoError,
        Status::Checksum,
        Status::Busy,
        Status::StaleEpoch,
        Status::Timeout,
        Status::Internal,
        Status::UnknownOp,
        Status::NoSuchImage,
        Status::AuthRequired,
        Status::AuthFailed,
        Status::PermissionDenied,
        Status::NoSuchSnap,
        Status::SnapInProgress,
        Status::ObjectAbsent,
        Status::Repairing,
        Status::StaleTicket,
    ];

    /// The status with this wire value, if any.
    pub fn from_u16(value: u16) -> Option<Status> {
        Status::ALL
            .into_iter()
            .find(|status| *status as u16 == value)
    }

    /// Whether the client should retry (after refreshing its map or leader, or backing off):
    /// the condition is about where or when the request was sent, not about the request.
    pub fn is_retryable(self) -> bool {
        match self {
            Status::NotLeader
            | Status::NotReady
            | Status::NoSuchPg
            | Status::Busy
            | Status::StaleEpoch
            | Status::SnapInProgress
            | Status::Repairing
            | Status::StaleTicket
            | Status::Timeout => true,
            Status::Ok
            | Status::InvalidArgument
            | Status::OutOfRange
            | Status::NoSpace
            | Status::IoError
            | Status::Checksum
            | Status::Internal
            | Status::UnknownOp
            | Status::NoSuchImage
            | Status::AuthRequired
            | Status::AuthFailed
            | Status::NoSuchSnap
            | Status::ObjectAbsent
            | Status::PermissionDenied => false,
        }
    }
}

/// Where the leader of a PG can be reached. `address` is IP text; `osd` 0 means unknown.
/// `term` is the Raft term of that leadership (0: unknown): the term a client puts in its
/// mutations for this leader (see [`crate::Request`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderHint {
    pub osd: OsdId,
    pub address: String,
    pub port: u16,
    pub term: u64,
}

/// One object's applied state on one replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectDigest {
    pub image: ImageId,
    pub object_index: u64,
    pub crc32c: u32,
    pub len_bytes: u64,
}

/// Bytes `offset..offset + length` of an object that hold data blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocatedRange {
    pub offset: u32,
    pub length: u32,
}

/// A reply to one request, sent with the request's id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Ok,
    /// Read / ReplicaRead: the data, a zero-copy slice of the frame payload after decoding.
    Data(Bytes),
    /// GetLeader.
    Leader(LeaderHint),
    /// ReplicaDigest.
    Digest {
        applied_index: u64,
        objects: Vec<ObjectDigest>,
    },
    /// Allocation: the parts of the asked range that hold data blocks, in offset order; the
    /// rest of the range is holes (reads as zeros).
    Allocated(Vec<AllocatedRange>),
    /// ShardSpace: the shard's free data space now, and the space its next flush gives back.
    Space {
        free_bytes: u64,
        pending_free_bytes: u64,
    },
    /// Usage: objects and data blocks (4 KiB) of the image's head (or of every image's),
    /// blocks kept for its snapshots in all, and per snapshot (id, blocks), by id; empty for
    /// every image.
    Usage {
        objects: u64,
        head_blocks: u64,
        kept_blocks: u64,
        snaps: Vec<(u64, u64)>,
    },
    /// A failed request. `status` is never `Ok`; NotLeader carries a leader hint when the OSD
    /// knows one; `message` is at most [`MESSAGE_BYTES_MAX`] bytes.
    Error {
        status: Status,
        leader: Option<LeaderHint>,
        message: String,
    },
}

impl Reply {
    /// An error reply whose message is cut (at a character boundary) to
    /// [`MESSAGE_BYTES_MAX`] bytes, so that a long error text can never trip the encoder's
    /// assertion. `status` must not be `Ok`.
    pub fn error(status: Status, leader: Option<LeaderHint>, message: impl Into<String>) -> Reply {
        let mut message = message.into();
        if message.len() > MESSAGE_BYTES_MAX {
            let mut cut = MESSAGE_BYTES_MAX;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
        }
        Reply::Error {
            status,
            leader,
            message,
        }
    }

    /// The reply's status: `Ok` for every variant but `Error`.
    pub fn status(&self) -> Status {
        match self {
            Reply::Error { status, .. } => *status,
            Reply::Ok
            | Reply::Data(_)
            | Reply::Leader(_)
            | Reply::Digest { .. }
            | Reply::Allocated(_)
            | Reply::Usage { .. }
            | Reply::Space { .. } => Status::Ok,
        }
    }

    /// Encodes as one frame of kind [`Kind::Reply`] appended to `out`.
    ///
    /// # Panics
    /// On a reply the protocol cannot carry (caller bugs): `Error` with status `Ok`, a message
    /// over [`MESSAGE_BYTES_MAX`] or an address over [`ADDRESS_BYTES_MAX`] bytes, more than
    /// [`DIGEST_OBJECTS_MAX`] digests, data over `u32::MAX` bytes.
    pub fn encode(&self, request_id: u64, out: &mut BytesMut) {
        let mut writer = FrameWriter::begin(out, self.payload_len_hint());
        match self {
            Reply::Ok => put_prefix(&mut writer, TAG_OK, Status::Ok),
            Reply::Data(data) => {
                put_prefix(&mut writer, TAG_DATA, Status::Ok);
                writer.put_u32(len_u32(data.len(), "Data reply"));
                writer.put_slice(data);
            }
            Reply::Leader(hint) => {
                put_prefix(&mut writer, TAG_LEADER, Status::Ok);
                let address_len = put_hint_fixed(&mut writer, hint);
                assert_eq!(usize::from(address_len), hint.address.len());
                writer.put_slice(hint.address.as_bytes());
            }
            Reply::Digest {
                applied_index,
                objects,
            } => put_digest(&mut writer, *applied_index, objects),
            Reply::Allocated(ranges) => put_allocated(&mut writer, ranges),
            Reply::Space {
                free_bytes,
                pending_free_bytes,
            } => {
                put_prefix(&mut writer, TAG_SPACE, Status::Ok);
                writer.put_u32(0); // reserved
                writer.put_u64(*free_bytes);
                writer.put_u64(*pending_free_bytes);
            }
            Reply::Usage {
                objects,
                head_blocks,
                kept_blocks,
                snaps,
            } => {
                assert!(
                    snaps.len() <= USAGE_SNAPS_MAX as usize,
                    "too many usage entries"
                );
                put_prefix(&mut writer, TAG_USAGE, Status::Ok);
                writer.put_u32(0); // reserved
                writer.put_u64(*objects);
                writer.put_u64(*head_blocks);
                writer.put_u64(*kept_blocks);
                writer.put_u32(snaps.len() as u32);
                writer.put_u32(0); // reserved
                for (snap, blocks) in snaps {
                    writer.put_u64(*snap);
                    writer.put_u64(*blocks);
                }
            }
            Reply::Error {
                status,
                leader,
                message,
            } => put_error(&mut writer, *status, leader.as_ref(), message),
        }
        writer.finish(Kind::Reply, request_id);
    }

    /// Decodes a reply frame's payload. `Data` is a zero-copy slice of `frame.payload`.
    pub fn decode(frame: &Frame) -> Result<Reply, WireError> {
        if frame.kind != Kind::Reply {
            return Err(WireError::Invalid(format!(
                "a {:?} frame (request id {}) where a reply was expected",
                frame.kind, frame.request_id
            )));
        }
        let mut reader = Reader::new(&frame.payload, "Reply");
        let tag = reader.u8("reply tag")?;
        reader.zero_u8("reserved")?;
        let status_value = reader.u16("status")?;
        let status = Status::from_u16(status_value)
            .ok_or_else(|| WireError::Invalid(format!("Reply: unknown status {status_value}")))?;
        if (tag == TAG_ERROR) == (status == Status::Ok) {
            return Err(WireError::Invalid(format!(
                "Reply: tag {tag} with status {status:?} (only Error replies, and all of \
                 them, carry a status other than Ok)"
            )));
        }
        let reply = match tag {
            TAG_OK => Reply::Ok,
            TAG_DATA => {
                let len_bytes = reader.u32("data length")?;
                reader.expect_rest(len_bytes, "data length")?;
                Reply::Data(reader.bytes(reader.remaining(), "data")?)
            }
            TAG_LEADER => {
                let (osd, port, address_len, term) = read_hint_fixed(&mut reader)?;
                let address = reader.string(address_len, ADDRESS_BYTES_MAX, "leader address")?;
                Reply::Leader(LeaderHint {
                    osd,
                    address,
                    port,
                    term,
                })
            }
            TAG_DIGEST => read_digest(&mut reader)?,
            TAG_ALLOCATED => read_allocated(&mut reader)?,
            TAG_SPACE => {
                reader.zero_u32("reserved")?;
                let free_bytes = reader.u64("free bytes")?;
                let pending_free_bytes = reader.u64("pending free bytes")?;
                Reply::Space {
                    free_bytes,
                    pending_free_bytes,
                }
            }
            TAG_USAGE => {
                reader.zero_u32("reserved")?;
                let objects = reader.u64("objects")?;
                let head_blocks = reader.u64("head blocks")?;
                let kept_blocks = reader.u64("kept blocks")?;
                let count = reader.u32("usage entries")?;
                reader.zero_u32("reserved")?;
                if count > USAGE_SNAPS_MAX {
                    return Err(WireError::Invalid(format!(
                        "Usage: {count} entries, more than {USAGE_SNAPS_MAX}"
                    )));
                }
                let mut snaps = Vec::new();
                for _ in 0..count {
                    let snap = reader.u64("snapshot id")?;
                    let blocks = reader.u64("snapshot blocks")?;
                    snaps.push((snap, blocks));
                }
                Reply::Usage {
                    objects,
                    head_blocks,
                    kept_blocks,
                    snaps,
                }
            }
            TAG_ERROR => read_error(&mut reader, status)?,
            _ => return Err(WireError::Invalid(format!("Reply: unknown tag {tag}"))),
        };
        reader.finish()?;
        Ok(reply)
    }

    /// Payload bytes this reply encodes to (exact; used to reserve output space once).
    fn payload_len_hint(&self) -> usize {
        match self {
            Reply::Ok => PREFIX_BYTES,
            Reply::Data(data) => (PREFIX_BYTES + 4).saturating_add(data.len()),
            Reply::Leader(hint) => PREFIX_BYTES + HINT_FIXED_BYTES + hint.address.len(),
            Reply::Digest { objects, .. } => {
                DIGEST_FIXED_BYTES.saturating_add(OBJECT_DIGEST_BYTES.saturating_mul(objects.len()))
            }
            Reply::Allocated(ranges) => ALLOCATED_FIXED_BYTES
                .saturating_add(ALLOCATED_RANGE_BYTES.saturating_mul(ranges.len())),
            Reply::Space { .. } => SPACE_BYTES,
            Reply::Usage { snaps, .. } => {
                USAGE_FIXED_BYTES.saturating_add(USAGE_ENTRY_BYTES.saturating_mul(snaps.len()))
            }
            Reply::Error {
                leader, message, ..
            } => {
                let address_len = leader.as_ref().map_or(0, |hint| hint.address.len());
                ERROR_FIXED_BYTES + address_len + message.len()
            }
        }
    }
}

/// Offsets 0..4 of every reply: tag u8, reserved u8 (0), status u16.
fn put_prefix(writer: &mut FrameWriter<'_>, tag: u8, status: Status) {
    assert_eq!(writer.payload_len(), 0);
    writer.put_u8(tag);
    writer.put_u8(0);
    writer.put_u16(status as u16);
}

/// The fixed 16 bytes of a leader hint: osd u32, port u16, address_len u16, term u64.
/// Returns the address length; the caller places the address text where its layout says.
fn put_hint_fixed(writer: &mut FrameWriter<'_>, hint: &LeaderHint) -> u16 {
    let address_len = len_u16(hint.address.len(), ADDRESS_BYTES_MAX, "leader address");
    writer.put_u32(hint.osd.get());
    writer.put_u16(hint.port);
    writer.put_u16(address_len);
    writer.put_u64(hint.term);
    address_len
}

/// The hint's osd, port, address length and term.
fn read_hint_fixed(reader: &mut Reader<'_>) -> Result<(OsdId, u16, u16, u64), WireError> {
    let osd = reader.osd("leader osd")?;
    let port = reader.u16("leader port")?;
    let address_len = reader.u16("leader address length")?;
    let term = reader.u64("leader term")?;
    Ok((osd, port, address_len, term))
}

/// Offsets 4..8 count u32, 8..16 applied_index u64, then `count` entries of 28 bytes.
fn put_digest(writer: &mut FrameWriter<'_>, applied_index: u64, objects: &[ObjectDigest]) {
    let count = len_u32(objects.len(), "Digest objects");
    assert!(
        count <= DIGEST_OBJECTS_MAX,
        "Digest of {count} objects over the limit {DIGEST_OBJECTS_MAX}"
    );
    put_prefix(writer, TAG_DIGEST, Status::Ok);
    writer.put_u32(count);
    writer.put_u64(applied_index);
    for object in objects {
        writer.put_u64(object.image.get());
        writer.put_u64(object.object_index);
        writer.put_u64(object.len_bytes);
        writer.put_u32(object.crc32c);
    }
}

fn read_digest(reader: &mut Reader<'_>) -> Result<Reply, WireError> {
    let count = reader.u32("digest object count")?;
    let applied_index = reader.u64("applied index")?;
    if count > DIGEST_OBJECTS_MAX {
        return Err(WireError::Invalid(format!(
            "Digest of {count} objects over the limit {DIGEST_OBJECTS_MAX}"
        )));
    }
    // Checked against the payload before the `Vec` is sized from `count`.
    let entries_bytes = count as usize * OBJECT_DIGEST_BYTES;
    let have = reader.remaining();
    if entries_bytes > have {
        return Err(WireError::Truncated {
            what: "digest entries",
            need: entries_bytes,
            have,
        });
    }
    let mut objects = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let image = reader.image()?;
        let object_index = reader.u64("object index")?;
        let len_bytes = reader.u64("object length")?;
        let crc32c = reader.u32("object crc32c")?;
        objects.push(ObjectDigest {
            image,
            object_index,
            crc32c,
            len_bytes,
        });
    }
    Ok(Reply::Digest {
        applied_index,
        objects,
    })
}

/// Offsets 4..8 count u32, then `count` ranges of 8 bytes: offset u32, length u32.
fn put_allocated(writer: &mut FrameWriter<'_>, ranges: &[AllocatedRange]) {
    let count = len_u32(ranges.len(), "Allocated ranges");
    assert!(
        count <= ALLOCATED_RANGES_MAX,
        "Allocated reply of {count} ranges over the limit {ALLOCATED_RANGES_MAX}"
    );
    put_prefix(writer, TAG_ALLOCATED, Status::Ok);
    writer.put_u32(count);
    for range in ranges {
        writer.put_u32(range.offset);
        writer.put_u32(range.length);
    }
}

fn read_allocated(reader: &mut Reader<'_>) -> Result<Reply, WireError> {
    let count = reader.u32("allocated range count")?;
    if count > ALLOCATED_RANGES_MAX {
        return Err(WireError::Invalid(format!(
            "Allocated reply of {count} ranges over the limit {ALLOCATED_RANGES_MAX}"
        )));
    }
    // Checked against the payload before the `Vec` is sized from `count`.
    reader.expect_rest(
        count.saturating_mul(ALLOCATED_RANGE_BYTES as u32),
        "range count",
    )?;
    let mut ranges = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let offset = reader.u32("range offset")?;
        let length = reader.u32("range length")?;
        ranges.push(AllocatedRange { offset, length });
    }
    Ok(Reply::Allocated(ranges))
}

/// Offsets 4 has_leader u8, 5 reserved u8, 6 message_len u16, 8..24 the hint's fixed part
/// (all zero without a hint), 24 the address text, then the message text.
fn put_error(
    writer: &mut FrameWriter<'_>,
    status: Status,
    leader: Option<&LeaderHint>,
    message: &str,
) {
    assert_ne!(
        status,
        Status::Ok,
        "an Error reply must not carry status Ok"
    );
    let message_len = len_u16(message.len(), MESSAGE_BYTES_MAX, "error message");
    put_prefix(writer, TAG_ERROR, status);
    writer.put_u8(u8::from(leader.is_some()));
    writer.put_u8(0);
    writer.put_u16(message_len);
    match leader {
        Some(hint) => {
            put_hint_fixed(writer, hint);
            writer.put_slice(hint.address.as_bytes());
        }
        None => writer.put_slice(&[0u8; HINT_FIXED_BYTES]),
    }
    writer.put_slice(message.as_bytes());
}

fn read_error(reader: &mut Reader<'_>, status: Status) -> Result<Reply, WireError> {
    let has_leader = reader.u8("has leader")?;
    reader.zero_u8("reserved")?;
    let message_len = reader.u16("message length")?;
    let (osd, port, address_len, term) = read_hint_fixed(reader)?;
    let address = reader.string(address_len, ADDRESS_BYTES_MAX, "leader address")?;
    let leader = match has_leader {
        1 => Some(LeaderHint {
            osd,
            address,
            port,
            term,
        }),
        0 if osd.get() == 0 && port == 0 && address.is_empty() && term == 0 => None,
        0 => {
            return Err(WireError::Invalid(
                "Reply: Error without a leader hint has non-zero hint fields".to_owned(),
            ))
        }
        other => {
            return Err(WireError::Invalid(format!(
                "Reply: has_leader is {other}, expected 0 or 1"
            )))
        }
    };
    let message = reader.string(message_len, MESSAGE_BYTES_MAX, "error message")?;
    Ok(Reply::Error {
        status,
        leader,
        message,
    })
}

//! Requests: client → OSD, and OSD ↔ OSD. Payload layouts are in `docs/wire-protocol.md`;
//! the offsets in the comments below are the same ones.

use crate::codec::{len_u32, FrameWriter, Reader};
use crate::header::Kind;
use crate::{Frame, WireError, PAYLOAD_BYTES_MAX_DEFAULT};
use bytes::{Bytes, BytesMut};
use fastblock_types::{Epoch, ImageId, OsdId, PgId};

/// Most Raft envelopes in one `RaftBatch`. One batch carries one loop iteration's messages to
/// one peer; 65536 is far above what a shard has PGs for, and bounds the decoder's `Vec`.
pub const RAFT_BATCH_ENVELOPES_MAX: u32 = 1 << 16;

/// Bytes of an encoded [`ObjectAddr`].
const OBJECT_ADDR_BYTES: usize = 24;
/// Bytes of the fixed part of Write/Read/Discard/WriteZeroes: address, epoch, term, offset,
/// length.
pub(crate) const OBJECT_OP_BYTES: usize = OBJECT_ADDR_BYTES + 8 + 8 + 4 + 4;
/// Bytes of `RaftBatch` before its envelope table.
const RAFT_BATCH_FIXED_BYTES: usize = 16;
/// Bytes of one entry of the `RaftBatch` envelope table: pool, seq, message length.
const RAFT_ENVELOPE_ENTRY_BYTES: usize = 12;

// Write data starts right after the fixed part; keeping it at a multiple of 8 from the frame
// start (header 32 + 48) lets a receiver that reads into an aligned buffer keep data aligned.
const _: () = assert!(OBJECT_OP_BYTES == 48);
const _: () = assert!((crate::HEADER_BYTES + OBJECT_OP_BYTES) % 8 == 0);
// A batch with the maximum number of (empty) envelopes must still fit in the default payload
// limit, or the envelope limit would be unreachable and meaningless.
const _: () = assert!(
    RAFT_BATCH_FIXED_BYTES + RAFT_ENVELOPE_ENTRY_BYTES * RAFT_BATCH_ENVELOPES_MAX as usize
        <= PAYLOAD_BYTES_MAX_DEFAULT as usize
);

/// Where an object lives: its PG and its id (image id + object index within the image).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectAddr {
    pub pg: PgId,
    pub image: ImageId,
    pub object_index: u64,
}

/// One Raft message for one PG. `msg` is an opaque encoded raft-rs message: this crate does
/// not depend on raft, so that the frame codec and its fuzzing stay independent of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RaftEnvelope {
    pub pg: PgId,
    pub msg: Bytes,
}

/// Client → OSD requests (and OSD ↔ OSD). `epoch` is the sender's cluster-map epoch.
///
/// Every mutation (Write, Discard, WriteZeroes, CopyUp, CopyUpDone, Rollback) carries `term`:
/// the Raft term of the leadership the client believes it addresses (0: unknown). A leader
/// refuses a mutation whose term is not its current one (`NotLeader`, with a hint naming
/// itself and its term), so a request delayed across a leadership change is never applied
/// by a later leadership of the same OSD (`docs/data-path.md` section 4).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// Writes `data` at `offset` in the object. `data` is a zero-copy slice of the frame
    /// payload after decoding.
    Write {
        addr: ObjectAddr,
        offset: u32,
        epoch: Epoch,
        term: u64,
        data: Bytes,
    },
    Read {
        addr: ObjectAddr,
        offset: u32,
        length: u32,
        epoch: Epoch,
    },
    Discard {
        addr: ObjectAddr,
        offset: u32,
        length: u32,
        epoch: Epoch,
        term: u64,
    },
    WriteZeroes {
        addr: ObjectAddr,
        offset: u32,
        length: u32,
        epoch: Epoch,
        term: u64,
    },
    GetLeader {
        pg: PgId,
        epoch: Epoch,
    },
    /// Debug/test: read this replica's applied copy, leader or not.
    ReplicaRead {
        addr: ObjectAddr,
        offset: u32,
        length: u32,
    },
    /// Debug/test: this replica's applied index and per-object crc32c, to compare replicas.
    ReplicaDigest {
        pg: PgId,
    },
    /// Which parts of `offset..offset + length` of the object hold data blocks (the rest are
    /// holes that read as zeros). Served by the PG leader like a read; answered with
    /// `Reply::Allocated`.
    Allocation {
        addr: ObjectAddr,
        offset: u32,
        length: u32,
        epoch: Epoch,
    },
    /// Reads the object as image snapshot `snap` holds it (`docs/design/snapshots.md`).
    /// Served by the PG leader behind the same read barrier as a read; answered with
    /// `Reply::Data`, or `NoSuchSnap` if the PG holds no such snapshot of the image.
    SnapRead {
        addr: ObjectAddr,
        offset: u32,
        length: u32,
        epoch: Epoch,
        snap: u64,
    },
    /// Makes the object's data what image snapshot `snap` holds, through the PG's log
    /// (every replica copies the differing blocks from its own copy of the snapshot).
    Rollback {
        addr: ObjectAddr,
        epoch: Epoch,
        term: u64,
        snap: u64,
    },
    /// Reads a clone's object if the clone holds its own copy of it (copied up); otherwise
    /// answers `ObjectAbsent`, and the client reads the parent snapshot
    /// (`docs/design/snapshots.md`, "Clones"). A length of 0 only asks which.
    CloneRead {
        addr: ObjectAddr,
        offset: u32,
        length: u32,
        epoch: Epoch,
    },
    /// One piece of a clone object's copy-up: written through the log unless the object is
    /// already marked copied. `data` is a zero-copy slice of the payload.
    CopyUp {
        addr: ObjectAddr,
        offset: u32,
        epoch: Epoch,
        term: u64,
        data: Bytes,
    },
    /// The clone object's copy-up is complete: mark it copied, through the log.
    CopyUpDone {
        addr: ObjectAddr,
        epoch: Epoch,
        term: u64,
    },
    /// The data blocks the PG holds of `image` (its head, and those kept for each of its
    /// snapshots), or of every image (`image` 0), as the replica that receives it has
    /// applied; answered with `Reply::Usage`.
    Usage {
        pg: PgId,
        image: ImageId,
    },
    /// Debug/test: the free data space of the shard that receives it, answered with
    /// `Reply::Space` (tests check that discards give space back).
    ShardSpace,
    /// First frame on an OSD↔OSD connection: who is speaking (and its incarnation).
    Hello {
        osd: OsdId,
        boot_epoch: Epoch,
    },
    /// Raft messages from one OSD to another, many PGs per frame.
    RaftBatch {
        from: OsdId,
        to: OsdId,
        msgs: Vec<RaftEnvelope>,
    },
    /// One chunk of a PG snapshot transfer, leader → learner (see `docs/wire-protocol.md`,
    /// "Snapshot transfer"). Chunks of one transfer carry consecutive `seq` from 0; the one
    /// with `last` set ends the transfer. `data` is a zero-copy slice of the payload.
    SnapChunk(SnapChunk),
    /// The receiver's answer to chunks: every chunk up to `seq` is staged, or the transfer
    /// was refused (see [`SnapVerdict`]).
    SnapAck {
        from: OsdId,
        to: OsdId,
        pg: PgId,
        transfer: u64,
        seq: u32,
        verdict: SnapVerdict,
    },
    /// One step of a bad block's repair between the members of a PG (see [`RepairMsg`] and
    /// `docs/design/repair.md`).
    Repair(RepairMsg),
    /// One step of a PG scrub between its leader and a member (see [`ScrubMsg`] and
    /// `docs/design/scrub.md`).
    Scrub(ScrubMsg),
}

/// What a [`ScrubMsg`] says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScrubStep {
    /// Leader → member: send your digests of the objects in `first..=last`.
    Ask = 1,
    /// Member → leader: my digests, as of my applied index `applied`.
    Digests = 2,
}

/// One group's digest in a [`ScrubMsg`] (`fastblock_store::ScrubDigest` on the wire).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ScrubEntry {
    pub image: ImageId,
    pub object_index: u64,
    pub group: u32,
    pub digest: u64,
}

/// See [`Request::Scrub`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScrubMsg {
    pub from: OsdId,
    pub to: OsdId,
    pub pg: PgId,
    pub step: ScrubStep,
    /// Read and check the data too.
    pub deep: bool,
    /// The leader's id for this range of this scrub, echoed back.
    pub scrub: u64,
    /// The leader's term when it asked, echoed back.
    pub term: u64,
    /// With `Digests`: the sender's applied index of the PG when it computed them.
    pub applied: u64,
    /// The range of objects, both ends included: (image, object index).
    pub first: (ImageId, u64),
    pub last: (ImageId, u64),
    /// With `Digests` of a deep scrub: block versions read, and those bad (which the
    /// member reports for repair itself).
    pub blocks_read: u64,
    pub bad_blocks: u64,
    /// With `Digests`: every group holding data, in (image, object, group) order.
    pub entries: Vec<ScrubEntry>,
}

/// Bytes of the fixed part of `Scrub`, and of each of its entries.
const SCRUB_FIXED_BYTES: usize = 96;
const SCRUB_ENTRY_BYTES: usize = 28;

/// What a [`RepairMsg`] says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RepairStep {
    /// Member → leader: my copy of this block is bad; please repair it.
    Report = 1,
    /// Leader → member: send me every version of this block as you hold it now.
    Fetch = 2,
    /// Member → leader: every version of the block (`data`: a PG snapshot transfer
    /// chunk's payload), as of my applied index `applied`.
    Data = 3,
    /// Member → leader: my copy is bad too (or I do not hold the PG).
    Unavailable = 4,
}

impl RepairStep {
    fn from_u32(v: u32) -> Option<RepairStep> {
        [
            RepairStep::Report,
            RepairStep::Fetch,
            RepairStep::Data,
            RepairStep::Unavailable,
        ]
        .into_iter()
        .find(|s| *s as u32 == v)
    }
}

/// See [`Request::Repair`]. `applied` is the sender's applied index of the PG when it read
/// `data` (0 in other steps); `term` the leader's term when it asked (echoed back).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepairMsg {
    pub from: OsdId,
    pub to: OsdId,
    pub pg: PgId,
    pub step: RepairStep,
    pub image: ImageId,
    pub object_index: u64,
    /// Block index within the object.
    pub block: u32,
    pub applied: u64,
    pub term: u64,
    pub data: Bytes,
}

/// Bytes of the fixed part of `Repair` before its data.
const REPAIR_FIXED_BYTES: usize = 56;

/// What a receiver says of a snapshot transfer in a `SnapAck`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SnapVerdict {
    /// Refused: the sender starts a new transfer (the receiver restarted, or lost what it
    /// staged).
    Refused,
    /// Every chunk up to the ack's `seq` is staged.
    Staged,
    /// The receiver cannot reserve the transfer's `total_bytes`: it has `free_bytes` for it.
    /// The sender waits before it tries again (a backfill reservation refused).
    TooFull { free_bytes: u64 },
}

impl SnapVerdict {
    fn code(self) -> (u32, u64) {
        match self {
            SnapVerdict::Refused => (0, 0),
            SnapVerdict::Staged => (1, 0),
            SnapVerdict::TooFull { free_bytes } => (2, free_bytes),
        }
    }
}

/// See [`Request::SnapChunk`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapChunk {
    pub from: OsdId,
    pub to: OsdId,
    pub pg: PgId,
    /// Identifies the transfer: a new one (new leader, retry) has a new id.
    pub transfer: u64,
    /// The snapshot's Raft index and term.
    pub index: u64,
    pub term: u64,
    pub seq: u32,
    pub last: bool,
    pub image: ImageId,
    pub object_index: u64,
    pub offset: u64,
    /// Bytes of the whole transfer (every object's extent): what the receiver reserves
    /// before it stages the first chunk. The same in every chunk of a transfer.
    pub total_bytes: u64,
    pub data: Bytes,
}

/// Bytes of the fixed part of `SnapChunk` before its data.
const SNAP_CHUNK_FIXED_BYTES: usize = 80;
/// Bytes of `SnapAck`.
const SNAP_ACK_BYTES: usize = 40;

impl Request {
    /// A mutation's object and the leader's term it names; `None` for every other request.
    pub fn mutation(&self) -> Option<(&ObjectAddr, u64)> {
        match self {
            Request::Write { addr, term, .. }
            | Request::Discard { addr, term, .. }
            | Request::WriteZeroes { addr, term, .. }
            | Request::Rollback { addr, term, .. }
            | Request::CopyUp { addr, term, .. }
            | Request::CopyUpDone { addr, term, .. } => Some((addr, *term)),
            _ => None,
        }
    }

    /// The leader's term a mutation names; `None` for every other request.
    pub fn term(&self) -> Option<u64> {
        self.mutation().map(|(_, term)| term)
    }

    /// The same request naming `term` if it is a mutation; any other request as it was. A
    /// client builds a request once per attempt and names the term of the leader that
    /// attempt goes to.
    pub fn with_term(mut self, new: u64) -> Request {
        match &mut self {
            Request::Write { term, .. }
            | Request::Discard { term, .. }
            | Request::WriteZeroes { term, .. }
            | Request::Rollback { term, .. }
            | Request::CopyUp { term, .. }
            | Request::CopyUpDone { term, .. } => *term = new,
            _ => {}
        }
        self
    }

    /// The frame kind this request is sent as.
    pub fn kind(&self) -> Kind {
        match self {
            Request::Write { .. } => Kind::Write,
            Request::Read { .. } => Kind::Read,
            Request::Discard { .. } => Kind::Discard,
            Request::WriteZeroes { .. } => Kind::WriteZeroes,
            Request::GetLeader { .. } => Kind::GetLeader,
            Request::ReplicaRead { .. } => Kind::ReplicaRead,
            Request::ReplicaDigest { .. } => Kind::ReplicaDigest,
            Request::Allocation { .. } => Kind::Allocation,
            Request::ShardSpace => Kind::ShardSpace,
            Request::SnapRead { .. } => Kind::SnapRead,
            Request::Rollback { .. } => Kind::Rollback,
            Request::CloneRead { .. } => Kind::CloneRead,
            Request::CopyUp { .. } => Kind::CopyUp,
            Request::CopyUpDone { .. } => Kind::CopyUpDone,
            Request::Usage { .. } => Kind::Usage,
            Request::Hello { .. } => Kind::Hello,
            Request::RaftBatch { .. } => Kind::RaftBatch,
            Request::SnapChunk(_) => Kind::SnapChunk,
            Request::SnapAck { .. } => Kind::SnapAck,
            Request::Repair(_) => Kind::Repair,
            Request::Scrub(_) => Kind::Scrub,
        }
    }

    /// Encodes as one frame appended to `out`. Write's data is copied once, straight into
    /// `out` behind the fixed fields: no temporary payload.
    ///
    /// # Panics
    /// If the request cannot be represented: a payload over `u32::MAX` bytes, or more than
    /// [`RAFT_BATCH_ENVELOPES_MAX`] envelopes. Those are caller bugs; the sizes the OSD and the
    /// client produce are bounded far below.
    pub fn encode(&self, request_id: u64, out: &mut BytesMut) {
        let mut writer = FrameWriter::begin(out, self.payload_len_hint());
        match self {
            Request::Write {
                addr,
                offset,
                epoch,
                term,
                data,
            }
            | Request::CopyUp {
                addr,
                offset,
                epoch,
                term,
                data,
            } => {
                let length = len_u32(data.len(), "Write data");
                put_object_op(&mut writer, addr, (*epoch, *term), *offset, length);
                writer.put_slice(data);
            }
            Request::CopyUpDone { addr, epoch, term } => {
                put_addr(&mut writer, addr);
                writer.put_u64(epoch.get());
                writer.put_u64(*term);
            }
            Request::Discard {
                addr,
                offset,
                length,
                epoch,
                term,
            }
            | Request::WriteZeroes {
                addr,
                offset,
                length,
                epoch,
                term,
            } => put_object_op(&mut writer, addr, (*epoch, *term), *offset, *length),
            Request::Read {
                addr,
                offset,
                length,
                epoch,
            }
            | Request::Allocation {
                addr,
                offset,
                length,
                epoch,
            }
            | Request::CloneRead {
                addr,
                offset,
                length,
                epoch,
            } => put_object_op(&mut writer, addr, (*epoch, 0), *offset, *length),
            Request::GetLeader { pg, epoch } => {
                writer.put_pg(*pg);
                writer.put_u64(epoch.get());
            }
            Request::ReplicaRead {
                addr,
                offset,
                length,
            } => {
                put_addr(&mut writer, addr);
                writer.put_u32(*offset);
                writer.put_u32(*length);
            }
            Request::ReplicaDigest { pg } => writer.put_pg(*pg),
            Request::Usage { pg, image } => {
                writer.put_pg(*pg);
                writer.put_u64(image.get());
            }
            Request::SnapRead {
                addr,
                offset,
                length,
                epoch,
                snap,
            } => {
                put_object_op(&mut writer, addr, (*epoch, 0), *offset, *length);
                writer.put_u64(*snap);
            }
            Request::Rollback {
                addr,
                epoch,
                term,
                snap,
            } => {
                put_addr(&mut writer, addr);
                writer.put_u64(epoch.get());
                writer.put_u64(*term);
                writer.put_u64(*snap);
            }
            Request::ShardSpace => {}
            Request::Hello { osd, boot_epoch } => {
                writer.put_u32(osd.get());
                writer.put_u32(0); // reserved
                writer.put_u64(boot_epoch.get());
            }
            Request::RaftBatch { from, to, msgs } => put_raft_batch(&mut writer, *from, *to, msgs),
            Request::SnapChunk(c) => {
                writer.put_u32(c.from.get());
                writer.put_u32(c.to.get());
                writer.put_pg(c.pg);
                writer.put_u64(c.transfer);
                writer.put_u64(c.index);
                writer.put_u64(c.term);
                writer.put_u32(c.seq);
                writer.put_u32(u32::from(c.last));
                writer.put_u64(c.image.get());
                writer.put_u64(c.object_index);
                writer.put_u64(c.offset);
                writer.put_u64(c.total_bytes);
                writer.put_slice(&c.data);
            }
            Request::SnapAck {
                from,
                to,
                pg,
                transfer,
                seq,
                verdict,
            } => {
                let (code, free_bytes) = verdict.code();
                writer.put_u32(from.get());
                writer.put_u32(to.get());
                writer.put_pg(*pg);
                writer.put_u64(*transfer);
                writer.put_u32(*seq);
                writer.put_u32(code);
                writer.put_u64(free_bytes);
            }
            Request::Repair(m) => {
                writer.put_u32(m.from.get());
                writer.put_u32(m.to.get());
                writer.put_pg(m.pg);
                writer.put_u32(m.step as u32);
                writer.put_u32(m.block);
                writer.put_u64(m.image.get());
                writer.put_u64(m.object_index);
                writer.put_u64(m.applied);
                writer.put_u64(m.term);
                writer.put_slice(&m.data);
            }
            Request::Scrub(m) => {
                writer.put_u32(m.from.get());
                writer.put_u32(m.to.get());
                writer.put_pg(m.pg);
                writer.put_u32(m.step as u32);
                writer.put_u32(u32::from(m.deep));
                writer.put_u64(m.scrub);
                writer.put_u64(m.term);
                writer.put_u64(m.applied);
                writer.put_u64(m.first.0.get());
                writer.put_u64(m.first.1);
                writer.put_u64(m.last.0.get());
                writer.put_u64(m.last.1);
                writer.put_u64(m.blocks_read);
                writer.put_u64(m.bad_blocks);
                for e in &m.entries {
                    writer.put_u64(e.image.get());
                    writer.put_u64(e.object_index);
                    writer.put_u32(e.group);
                    writer.put_u64(e.digest);
                }
            }
        }
        writer.finish(self.kind(), request_id);
    }

    /// Decodes a request frame's payload. Write's `data` and each envelope's `msg` are
    /// zero-copy slices of `frame.payload`. Errors are payload errors: the frame was intact,
    /// so the receiver answers `InvalidArgument` and keeps the connection.
    pub fn decode(frame: &Frame) -> Result<Request, WireError> {
        let payload = &frame.payload;
        let request = match frame.kind {
            Kind::Write => {
                let mut reader = Reader::new(payload, "Write");
                let (addr, epoch, term, offset, length) = read_object_op(&mut reader)?;
                reader.expect_rest(length, "data length")?;
                let data = reader.bytes(reader.remaining(), "data")?;
                reader.finish()?;
                Request::Write {
                    addr,
                    offset,
                    epoch,
                    term,
                    data,
                }
            }
            Kind::Read => {
                let mut reader = Reader::new(payload, "Read");
                let (addr, epoch, offset, length) = read_read_op(&mut reader)?;
                reader.finish()?;
                Request::Read {
                    addr,
                    offset,
                    length,
                    epoch,
                }
            }
            Kind::Discard => {
                let mut reader = Reader::new(payload, "Discard");
                let (addr, epoch, term, offset, length) = read_object_op(&mut reader)?;
                reader.finish()?;
                Request::Discard {
                    addr,
                    offset,
                    length,
                    epoch,
                    term,
                }
            }
            Kind::WriteZeroes => {
                let mut reader = Reader::new(payload, "WriteZeroes");
                let (addr, epoch, term, offset, length) = read_object_op(&mut reader)?;
                reader.finish()?;
                Request::WriteZeroes {
                    addr,
                    offset,
                    length,
                    epoch,
                    term,
                }
            }
            Kind::GetLeader => {
                let mut reader = Reader::new(payload, "GetLeader");
                let pg = reader.pg()?;
                let epoch = reader.epoch()?;
                reader.finish()?;
                Request::GetLeader { pg, epoch }
            }
            Kind::ReplicaRead => {
                let mut reader = Reader::new(payload, "ReplicaRead");
                let addr = read_addr(&mut reader)?;
                let offset = reader.u32("offset")?;
                let length = reader.u32("length")?;
                reader.finish()?;
                Request::ReplicaRead {
                    addr,
                    offset,
                    length,
                }
            }
            Kind::ReplicaDigest => {
                let mut reader = Reader::new(payload, "ReplicaDigest");
                let pg = reader.pg()?;
                reader.finish()?;
                Request::ReplicaDigest { pg }
            }
            Kind::Allocation => {
                let mut reader = Reader::new(payload, "Allocation");
                let (addr, epoch, offset, length) = read_read_op(&mut reader)?;
                reader.finish()?;
                Request::Allocation {
                    addr,
                    offset,
                    length,
                    epoch,
                }
            }
            Kind::ShardSpace => {
                Reader::new(payload, "ShardSpace").finish()?;
                Request::ShardSpace
            }
            Kind::SnapRead => {
                let mut reader = Reader::new(payload, "SnapRead");
                let (addr, epoch, offset, length) = read_read_op(&mut reader)?;
                let snap = reader.u64("snap")?;
                reader.finish()?;
                Request::SnapRead {
                    addr,
                    offset,
                    length,
                    epoch,
                    snap,
                }
            }
            Kind::Usage => {
                let mut reader = Reader::new(payload, "Usage");
                let pg = reader.pg()?;
                let image = reader.image()?;
                reader.finish()?;
                Request::Usage { pg, image }
            }
            Kind::CloneRead => {
                let mut reader = Reader::new(payload, "CloneRead");
                let (addr, epoch, offset, length) = read_read_op(&mut reader)?;
                reader.finish()?;
                Request::CloneRead {
                    addr,
                    offset,
                    length,
                    epoch,
                }
            }
            Kind::CopyUp => {
                let mut reader = Reader::new(payload, "CopyUp");
                let (addr, epoch, term, offset, length) = read_object_op(&mut reader)?;
                reader.expect_rest(length, "data length")?;
                let data = reader.bytes(reader.remaining(), "data")?;
                reader.finish()?;
                Request::CopyUp {
                    addr,
                    offset,
                    epoch,
                    term,
                    data,
                }
            }
            Kind::CopyUpDone => {
                let mut reader = Reader::new(payload, "CopyUpDone");
                let addr = read_addr(&mut reader)?;
                let epoch = reader.epoch()?;
                let term = reader.u64("term")?;
                reader.finish()?;
                Request::CopyUpDone { addr, epoch, term }
            }
            Kind::Rollback => {
                let mut reader = Reader::new(payload, "Rollback");
                let addr = read_addr(&mut reader)?;
                let epoch = reader.epoch()?;
                let term = reader.u64("term")?;
                let snap = reader.u64("snap")?;
                reader.finish()?;
                Request::Rollback {
                    addr,
                    epoch,
                    term,
                    snap,
                }
            }
            Kind::Hello => {
                let mut reader = Reader::new(payload, "Hello");
                let osd = reader.osd("osd")?;
                reader.zero_u32("reserved")?;
                let boot_epoch = reader.epoch()?;
                reader.finish()?;
                Request::Hello { osd, boot_epoch }
            }
            Kind::RaftBatch => read_raft_batch(payload)?,
            Kind::SnapChunk => {
                let mut reader = Reader::new(payload, "SnapChunk");
                let from = reader.osd("from osd")?;
                let to = reader.osd("to osd")?;
                let pg = reader.pg()?;
                let transfer = reader.u64("transfer")?;
                let index = reader.u64("index")?;
                let term = reader.u64("term")?;
                let seq = reader.u32("seq")?;
                let last = read_flag(&mut reader, "last")?;
                let image = reader.image()?;
                let object_index = reader.u64("object index")?;
                let offset = reader.u64("offset")?;
                let total_bytes = reader.u64("total bytes")?;
                let data = reader.bytes(reader.remaining(), "data")?;
                reader.finish()?;
                Request::SnapChunk(SnapChunk {
                    from,
                    to,
                    pg,
                    transfer,
                    index,
                    term,
                    seq,
                    last,
                    image,
                    object_index,
                    offset,
                    total_bytes,
                    data,
                })
            }
            Kind::SnapAck => {
                let mut reader = Reader::new(payload, "SnapAck");
                let from = reader.osd("from osd")?;
                let to = reader.osd("to osd")?;
                let pg = reader.pg()?;
                let transfer = reader.u64("transfer")?;
                let seq = reader.u32("seq")?;
                let code = reader.u32("verdict")?;
                let free_bytes = reader.u64("free bytes")?;
                reader.finish()?;
                let verdict = match (code, free_bytes) {
                    (0, 0) => SnapVerdict::Refused,
                    (1, 0) => SnapVerdict::Staged,
                    (2, free_bytes) => SnapVerdict::TooFull { free_bytes },
                    (0 | 1, _) => {
                        return Err(WireError::Invalid(format!(
                            "SnapAck verdict {code} with free bytes {free_bytes} (must be 0)"
                        )))
                    }
                    _ => {
                        return Err(WireError::Invalid(format!(
                            "SnapAck verdict {code} (0, 1 or 2)"
                        )))
                    }
                };
                Request::SnapAck {
                    from,
                    to,
                    pg,
                    transfer,
                    seq,
                    verdict,
                }
            }
            Kind::Repair => {
                let mut reader = Reader::new(payload, "Repair");
                let from = reader.osd("from osd")?;
                let to = reader.osd("to osd")?;
                let pg = reader.pg()?;
                let code = reader.u32("step")?;
                let step = RepairStep::from_u32(code)
                    .ok_or_else(|| WireError::Invalid(format!("Repair step {code} (1 to 4)")))?;
                let block = reader.u32("block")?;
                let image = reader.image()?;
                let object_index = reader.u64("object index")?;
                let applied = reader.u64("applied")?;
                let term = reader.u64("term")?;
                let data = reader.bytes(reader.remaining(), "data")?;
                reader.finish()?;
                if step != RepairStep::Data && !data.is_empty() {
                    return Err(WireError::Invalid(format!(
                        "Repair step {step:?} with {} bytes of data",
                        data.len()
                    )));
                }
                Request::Repair(RepairMsg {
                    from,
                    to,
                    pg,
                    step,
                    image,
                    object_index,
                    block,
                    applied,
                    term,
                    data,
                })
            }
            Kind::Scrub => {
                let mut reader = Reader::new(payload, "Scrub");
                let from = reader.osd("from osd")?;
                let to = reader.osd("to osd")?;
                let pg = reader.pg()?;
                let step = match reader.u32("step")? {
                    1 => ScrubStep::Ask,
                    2 => ScrubStep::Digests,
                    v => return Err(WireError::Invalid(format!("Scrub step {v} (1 or 2)"))),
                };
                let deep = read_flag(&mut reader, "deep")?;
                let scrub = reader.u64("scrub")?;
                let term = reader.u64("term")?;
                let applied = reader.u64("applied")?;
                let first = (reader.image()?, reader.u64("first object")?);
                let last = (reader.image()?, reader.u64("last object")?);
                let blocks_read = reader.u64("blocks read")?;
                let bad_blocks = reader.u64("bad blocks")?;
                if reader.remaining() % SCRUB_ENTRY_BYTES != 0 {
                    return Err(WireError::Invalid(format!(
                        "Scrub entries of {} bytes (a multiple of {SCRUB_ENTRY_BYTES})",
                        reader.remaining()
                    )));
                }
                if step == ScrubStep::Ask && reader.remaining() != 0 {
                    return Err(WireError::Invalid("Scrub Ask with entries".into()));
                }
                let mut entries = Vec::with_capacity(reader.remaining() / SCRUB_ENTRY_BYTES);
                while reader.remaining() > 0 {
                    entries.push(ScrubEntry {
                        image: reader.image()?,
                        object_index: reader.u64("object index")?,
                        group: reader.u32("group")?,
                        digest: reader.u64("digest")?,
                    });
                }
                reader.finish()?;
                Request::Scrub(ScrubMsg {
                    from,
                    to,
                    pg,
                    step,
                    deep,
                    scrub,
                    term,
                    applied,
                    first,
                    last,
                    blocks_read,
                    bad_blocks,
                    entries,
                })
            }
            Kind::AuthHello | Kind::AuthChallenge | Kind::AuthProof | Kind::AuthDone => {
                return Err(WireError::Invalid(format!(
                    "a {:?} frame (request id {}) outside the authentication handshake",
                    frame.kind, frame.request_id
                )))
            }
            Kind::Reply => {
                return Err(WireError::Invalid(format!(
                    "a Reply frame (request id {}) where a request was expected",
                    frame.request_id
                )))
            }
        };
        Ok(request)
    }

    /// Bytes of this request's frame (header and payload, no tag): a sender that protects
    /// the frame reserves this plus `TAG_BYTES`, so appending the tag never reallocates.
    pub fn frame_len(&self) -> usize {
        crate::HEADER_BYTES.saturating_add(self.payload_len_hint())
    }

    /// Payload bytes this request encodes to (exact; used to reserve output space once).
    fn payload_len_hint(&self) -> usize {
        match self {
            Request::Write { data, .. } | Request::CopyUp { data, .. } => {
                OBJECT_OP_BYTES.saturating_add(data.len())
            }
            Request::CloneRead { .. } => OBJECT_OP_BYTES,
            Request::Usage { .. } => 16,
            Request::CopyUpDone { .. } => OBJECT_ADDR_BYTES + 16,
            Request::Read { .. }
            | Request::Discard { .. }
            | Request::WriteZeroes { .. }
            | Request::Allocation { .. } => OBJECT_OP_BYTES,
            Request::ShardSpace => 0,
            Request::SnapRead { .. } => OBJECT_OP_BYTES + 8,
            Request::Rollback { .. } => OBJECT_ADDR_BYTES + 24,
            Request::GetLeader { .. } | Request::Hello { .. } => 16,
            Request::ReplicaRead { .. } => OBJECT_ADDR_BYTES + 8,
            Request::ReplicaDigest { .. } => 8,
            Request::SnapChunk(c) => SNAP_CHUNK_FIXED_BYTES.saturating_add(c.data.len()),
            Request::SnapAck { .. } => SNAP_ACK_BYTES,
            Request::Repair(m) => REPAIR_FIXED_BYTES.saturating_add(m.data.len()),
            Request::Scrub(m) => {
                SCRUB_FIXED_BYTES.saturating_add(m.entries.len().saturating_mul(SCRUB_ENTRY_BYTES))
            }
            Request::RaftBatch { msgs, .. } => {
                msgs.iter().fold(RAFT_BATCH_FIXED_BYTES, |sum, envelope| {
                    sum.saturating_add(RAFT_ENVELOPE_ENTRY_BYTES + envelope.msg.len())
                })
            }
        }
    }
}

/// A u32 that must be 0 or 1.
fn read_flag(reader: &mut Reader<'_>, what: &'static str) -> Result<bool, WireError> {
    match reader.u32(what)? {
        0 => Ok(false),
        1 => Ok(true),
        v => Err(WireError::Invalid(format!(
            "{what} flag is {v}, not 0 or 1"
        ))),
    }
}

/// Offsets 0..24: pool u32, seq u32, image u64, object_index u64.
fn put_addr(writer: &mut FrameWriter<'_>, addr: &ObjectAddr) {
    writer.put_pg(addr.pg);
    writer.put_u64(addr.image.get());
    writer.put_u64(addr.object_index);
}

fn read_addr(reader: &mut Reader<'_>) -> Result<ObjectAddr, WireError> {
    let pg = reader.pg()?;
    let image = reader.image()?;
    let object_index = reader.u64("object index")?;
    Ok(ObjectAddr {
        pg,
        image,
        object_index,
    })
}

/// The shared 48-byte fixed part of the object IO requests: address 0..24, epoch 24..32,
/// term 32..40 (a mutation's; 0 in reads), offset 40..44, length 44..48.
fn put_object_op(
    writer: &mut FrameWriter<'_>,
    addr: &ObjectAddr,
    (epoch, term): (Epoch, u64),
    offset: u32,
    length: u32,
) {
    let start = writer.payload_len();
    put_addr(writer, addr);
    writer.put_u64(epoch.get());
    writer.put_u64(term);
    writer.put_u32(offset);
    writer.put_u32(length);
    assert_eq!(writer.payload_len() - start, OBJECT_OP_BYTES);
}

/// A mutation's object op: address, epoch, term, offset, length.
fn read_object_op(
    reader: &mut Reader<'_>,
) -> Result<(ObjectAddr, Epoch, u64, u32, u32), WireError> {
    let addr = read_addr(reader)?;
    let epoch = reader.epoch()?;
    let term = reader.u64("term")?;
    let offset = reader.u32("offset")?;
    let length = reader.u32("length")?;
    Ok((addr, epoch, term, offset, length))
}

/// A read's object op: the term field is reserved and must be zero (reads are fenced by the
/// leader's read barrier, not by the client's term), so each read has one encoding.
fn read_read_op(reader: &mut Reader<'_>) -> Result<(ObjectAddr, Epoch, u32, u32), WireError> {
    let addr = read_addr(reader)?;
    let epoch = reader.epoch()?;
    reader.zero_u64("term (reserved in a read)")?;
    let offset = reader.u32("offset")?;
    let length = reader.u32("length")?;
    Ok((addr, epoch, offset, length))
}

/// from u32, to u32, count u32, reserved u32, then `count` table entries (pool u32, seq u32,
/// msg_len u32), then the messages back to back in table order. The table comes first so
/// that every fixed-width field precedes the variable tail and the count can be checked
/// against the payload before anything is allocated.
fn put_raft_batch(writer: &mut FrameWriter<'_>, from: OsdId, to: OsdId, msgs: &[RaftEnvelope]) {
    let count = len_u32(msgs.len(), "RaftBatch envelopes");
    assert!(
        count <= RAFT_BATCH_ENVELOPES_MAX,
        "RaftBatch from osd {from} to osd {to}: {count} envelopes over the limit \
         {RAFT_BATCH_ENVELOPES_MAX}"
    );
    writer.put_u32(from.get());
    writer.put_u32(to.get());
    writer.put_u32(count);
    writer.put_u32(0); // reserved
    for envelope in msgs {
        writer.put_pg(envelope.pg);
        writer.put_u32(len_u32(envelope.msg.len(), "raft message"));
    }
    for envelope in msgs {
        writer.put_slice(&envelope.msg);
    }
}

fn read_raft_batch(payload: &Bytes) -> Result<Request, WireError> {
    let mut reader = Reader::new(payload, "RaftBatch");
    let from = reader.osd("from osd")?;
    let to = reader.osd("to osd")?;
    let count = reader.u32("envelope count")?;
    reader.zero_u32("reserved")?;
    if count > RAFT_BATCH_ENVELOPES_MAX {
        return Err(WireError::Invalid(format!(
            "RaftBatch from osd {from} to osd {to}: {count} envelopes over the limit \
             {RAFT_BATCH_ENVELOPES_MAX}"
        )));
    }
    // `count` is at most 65536, so the table size cannot overflow; it is then checked against
    // the payload before the `Vec` below is sized from it.
    let table_bytes = count as usize * RAFT_ENVELOPE_ENTRY_BYTES;
    let table = reader.bytes(table_bytes, "envelope table")?;
    let mut table = Reader::new(&table, "RaftBatch envelope table");
    let mut msgs = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let pg = table.pg()?;
        let msg_len = table.u32("raft message length")?;
        let msg = reader.bytes(msg_len as usize, "raft message")?;
        msgs.push(RaftEnvelope { pg, msg });
    }
    table.finish()?;
    reader.finish()?;
    Ok(Request::RaftBatch { from, to, msgs })
}

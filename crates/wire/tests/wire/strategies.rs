//! proptest strategies for every message type.

use bytes::Bytes;
use fastblock_types::{Epoch, ImageId, OsdId, PgId, PoolId};
use fastblock_wire::{
    AllocatedRange, LeaderHint, ObjectAddr, ObjectDigest, RaftEnvelope, RepairMsg, RepairStep,
    Reply, Request, ScrubEntry, ScrubMsg, ScrubStep, SnapChunk, SnapVerdict, Status,
};
use proptest::collection::vec;
use proptest::prelude::*;

pub fn pg() -> impl Strategy<Value = PgId> {
    (any::<u32>(), any::<u32>()).prop_map(|(pool, seq)| PgId::new(PoolId(pool), seq))
}

pub fn addr() -> impl Strategy<Value = ObjectAddr> {
    (pg(), any::<u64>(), any::<u64>()).prop_map(|(pg, image, object_index)| ObjectAddr {
        pg,
        image: ImageId(image),
        object_index,
    })
}

/// Data up to 4 KiB: large enough to cross chunk boundaries, small enough to keep the suite
/// fast. A full 4 MiB object is tested once, by hand, in `roundtrip`.
pub fn data() -> impl Strategy<Value = Bytes> {
    vec(any::<u8>(), 0..4096).prop_map(Bytes::from)
}

pub fn epoch() -> impl Strategy<Value = Epoch> {
    any::<u64>().prop_map(Epoch)
}

pub fn request() -> impl Strategy<Value = Request> {
    let object_op = || (addr(), any::<u32>(), any::<u32>(), epoch());
    prop_oneof![
        (addr(), any::<u32>(), epoch(), any::<u64>(), data()).prop_map(
            |(addr, offset, epoch, term, data)| Request::Write {
                addr,
                offset,
                epoch,
                term,
                data,
            }
        ),
        (addr(), any::<u32>(), epoch(), any::<u64>(), data()).prop_map(
            |(addr, offset, epoch, term, data)| Request::CopyUp {
                addr,
                offset,
                epoch,
                term,
                data,
            }
        ),
        (addr(), epoch(), any::<u64>()).prop_map(|(addr, epoch, term)| Request::CopyUpDone {
            addr,
            epoch,
            term
        }),
        object_op().prop_map(|(addr, offset, length, epoch)| Request::CloneRead {
            addr,
            offset,
            length,
            epoch
        }),
        object_op().prop_map(|(addr, offset, length, epoch)| Request::Read {
            addr,
            offset,
            length,
            epoch
        }),
        (object_op(), any::<u64>()).prop_map(|((addr, offset, length, epoch), term)| {
            Request::Discard {
                addr,
                offset,
                length,
                epoch,
                term,
            }
        }),
        (object_op(), any::<u64>()).prop_map(|((addr, offset, length, epoch), term)| {
            Request::WriteZeroes {
                addr,
                offset,
                length,
                epoch,
                term,
            }
        }),
        (pg(), epoch()).prop_map(|(pg, epoch)| Request::GetLeader { pg, epoch }),
        (addr(), any::<u32>(), any::<u32>()).prop_map(|(addr, offset, length)| {
            Request::ReplicaRead {
                addr,
                offset,
                length,
            }
        }),
        pg().prop_map(|pg| Request::ReplicaDigest { pg }),
        object_op().prop_map(|(addr, offset, length, epoch)| Request::Allocation {
            addr,
            offset,
            length,
            epoch
        }),
        (object_op(), any::<u64>()).prop_map(|((addr, offset, length, epoch), snap)| {
            Request::SnapRead {
                addr,
                offset,
                length,
                epoch,
                snap,
            }
        }),
        (addr(), epoch(), any::<u64>(), any::<u64>()).prop_map(|(addr, epoch, term, snap)| {
            Request::Rollback {
                addr,
                epoch,
                term,
                snap,
            }
        }),
        (pg(), any::<u64>()).prop_map(|(pg, image)| Request::Usage {
            pg,
            image: ImageId(image)
        }),
        Just(Request::ShardSpace),
        (any::<u32>(), epoch()).prop_map(|(osd, boot_epoch)| Request::Hello {
            osd: OsdId(osd),
            boot_epoch
        }),
        (
            any::<u32>(),
            any::<u32>(),
            vec(
                (pg(), vec(any::<u8>(), 0..300)).prop_map(|(pg, msg)| RaftEnvelope {
                    pg,
                    msg: Bytes::from(msg)
                }),
                0..12
            )
        )
            .prop_map(|(from, to, msgs)| Request::RaftBatch {
                from: OsdId(from),
                to: OsdId(to),
                msgs
            }),
        (
            (any::<u32>(), any::<u32>(), pg(), any::<u64>()),
            (any::<u64>(), any::<u64>(), any::<u32>(), any::<bool>()),
            (
                any::<u64>(),
                any::<u64>(),
                any::<u64>(),
                any::<u64>(),
                vec(any::<u8>(), 0..300)
            ),
        )
            .prop_map(
                |(
                    (from, to, pg, transfer),
                    (index, term, seq, last),
                    (image, object_index, offset, total_bytes, data),
                )| {
                    Request::SnapChunk(SnapChunk {
                        from: OsdId(from),
                        to: OsdId(to),
                        pg,
                        transfer,
                        index,
                        term,
                        seq,
                        last,
                        image: ImageId(image),
                        object_index,
                        offset,
                        total_bytes,
                        data: Bytes::from(data),
                    })
                }
            ),
        (
            any::<u32>(),
            any::<u32>(),
            pg(),
            any::<u64>(),
            any::<u32>(),
            (0u8..3, any::<u64>())
        )
            .prop_map(|(from, to, pg, transfer, seq, (code, free_bytes))| {
                Request::SnapAck {
                    from: OsdId(from),
                    to: OsdId(to),
                    pg,
                    transfer,
                    seq,
                    verdict: match code {
                        0 => SnapVerdict::Refused,
                        1 => SnapVerdict::Staged,
                        _ => SnapVerdict::TooFull { free_bytes },
                    },
                }
            }),
        (
            (any::<u32>(), any::<u32>(), pg(), 1u32..5, any::<u32>()),
            (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()),
            vec(any::<u8>(), 0..300)
        )
            .prop_map(
                |((from, to, pg, step, block), (image, object_index, applied, term), data)| {
                    let step = match step {
                        1 => RepairStep::Report,
                        2 => RepairStep::Fetch,
                        3 => RepairStep::Data,
                        _ => RepairStep::Unavailable,
                    };
                    Request::Repair(RepairMsg {
                        from: OsdId(from),
                        to: OsdId(to),
                        pg,
                        step,
                        image: ImageId(image),
                        object_index,
                        block,
                        applied,
                        term,
                        // Only the data step carries bytes.
                        data: if step == RepairStep::Data {
                            Bytes::from(data)
                        } else {
                            Bytes::new()
                        },
                    })
                }
            ),
        (
            (
                any::<u32>(),
                any::<u32>(),
                pg(),
                any::<bool>(),
                any::<bool>()
            ),
            (
                any::<u64>(),
                any::<u64>(),
                any::<u64>(),
                any::<u64>(),
                any::<u64>()
            ),
            vec(
                (any::<u64>(), any::<u64>(), any::<u32>(), any::<u64>()),
                0..20
            )
        )
            .prop_map(
                |((from, to, pg, digests, deep), (scrub, term, applied, first, read), entries)| {
                    Request::Scrub(ScrubMsg {
                        from: OsdId(from),
                        to: OsdId(to),
                        pg,
                        step: if digests {
                            ScrubStep::Digests
                        } else {
                            ScrubStep::Ask
                        },
                        deep,
                        scrub,
                        term,
                        applied,
                        first: (ImageId(first), read),
                        last: (ImageId(read), first),
                        blocks_read: read,
                        bad_blocks: applied,
                        // Only digests carry entries.
                        entries: if digests {
                            entries
                                .into_iter()
                                .map(|(image, object_index, group, digest)| ScrubEntry {
                                    image: ImageId(image),
                                    object_index,
                                    group,
                                    digest,
                                })
                                .collect()
                        } else {
                            Vec::new()
                        },
                    })
                }
            ),
    ]
}

/// Any UTF-8 text (multi-byte characters included) of at most `bytes_max` bytes.
pub fn text(bytes_max: usize) -> impl Strategy<Value = String> {
    vec(any::<char>(), 0..bytes_max / 4 + 8).prop_map(move |chars| {
        let mut text = String::new();
        for c in chars {
            if text.len() + c.len_utf8() > bytes_max {
                break;
            }
            text.push(c);
        }
        text
    })
}

pub fn leader_hint() -> impl Strategy<Value = LeaderHint> {
    (
        any::<u32>(),
        text(fastblock_wire::ADDRESS_BYTES_MAX),
        any::<u16>(),
        any::<u64>(),
    )
        .prop_map(|(osd, address, port, term)| LeaderHint {
            osd: OsdId(osd),
            address,
            port,
            term,
        })
}

pub fn error_status() -> impl Strategy<Value = Status> {
    prop::sample::select(&Status::ALL[1..])
}

pub fn reply() -> impl Strategy<Value = Reply> {
    let digest = (any::<u64>(), any::<u64>(), any::<u32>(), any::<u64>()).prop_map(
        |(image, object_index, crc32c, len_bytes)| ObjectDigest {
            image: ImageId(image),
            object_index,
            crc32c,
            len_bytes,
        },
    );
    prop_oneof![
        Just(Reply::Ok),
        data().prop_map(Reply::Data),
        leader_hint().prop_map(Reply::Leader),
        (any::<u64>(), vec(digest, 0..40)).prop_map(|(applied_index, objects)| {
            Reply::Digest {
                applied_index,
                objects,
            }
        }),
        vec(
            (any::<u32>(), any::<u32>())
                .prop_map(|(offset, length)| AllocatedRange { offset, length }),
            0..40
        )
        .prop_map(Reply::Allocated),
        (any::<u64>(), any::<u64>()).prop_map(|(free_bytes, pending_free_bytes)| Reply::Space {
            free_bytes,
            pending_free_bytes
        }),
        (
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            vec((any::<u64>(), any::<u64>()), 0..20)
        )
            .prop_map(|(objects, head_blocks, kept_blocks, snaps)| Reply::Usage {
                objects,
                head_blocks,
                kept_blocks,
                snaps
            }),
        (
            error_status(),
            proptest::option::of(leader_hint()),
            text(fastblock_wire::MESSAGE_BYTES_MAX)
        )
            .prop_map(|(status, leader, message)| Reply::Error {
                status,
                leader,
                message
            }),
    ]
}

/// A request or a reply, for mixed streams.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    Request(Request),
    Reply(Reply),
}

pub fn message() -> impl Strategy<Value = Message> {
    prop_oneof![
        request().prop_map(Message::Request),
        reply().prop_map(Message::Reply)
    ]
}

//! Client operations and their encoding in Raft log entries.
//!
//! An operation's fixed header goes in the entry's `context` and a write's payload in its
//! `data`: both are `bytes::Bytes`, so the payload received from the network is the payload
//! replicated, persisted and applied, without a copy.
//!
//! Header (little-endian, 30 bytes):
//! ```text
//! 0  u8  version = 1
//! 1  u8  kind: 1 write, 2 discard, 3 write-zeroes, 4 reclaim, 5 snap mark, 6 snap trim,
//!          7 rollback, 8 copy-up piece (as a write), 9 copy-up done (no data), 10 repair
//!          (data: every version of a range's blocks as a good replica holds them)
//! 2  u64 image id
//! 10 u64 object index (reclaim, snap mark, snap trim: 0)
//! 18 u32 offset in the object (reclaim, snap mark, snap trim, rollback: 0)
//! 22 u32 length (write, repair: must equal data.len(); reclaim: 40; snap mark, rollback: 8;
//!        snap trim: 16)
//! 26 u32 crc32c-free padding, 0 (reserved)
//! ```
//!
//! A reclaim's `data` (40 bytes, little-endian): u64 reclaim entry id, u64 first image byte
//! to delete, u64 end byte (exclusive), u64 the image's object size, u64 the map epoch that
//! recorded the entry (a leader whose map is older must not admit IO after applying it).
//!
//! A repair's offset is the first byte of the 4 KiB blocks it repairs and its `data` is a PG
//! snapshot transfer chunk's payload (`fastblock_store::ChunkVersions`, documented in
//! `docs/design/store-format.md`), opaque here; `docs/design/repair.md` says what it does.
//!
//! A snap mark's and a rollback's `data` is the snapshot id (u64 LE); a snap trim's is the
//! trim entry id, then the snapshot id (u64 LE each). `docs/design/snapshots.md` says what
//! each does.

use bytes::Bytes;
use fastblock_types::ImageId;

pub const OP_HEADER_BYTES: usize = 30;
const OP_VERSION: u8 = 1;

/// An object of an image: the unit a PG stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectRef {
    pub image: ImageId,
    pub index: u64,
}

/// Bytes of a reclaim entry's payload.
const RECLAIM_PAYLOAD_BYTES: usize = 40;

/// A mutation that goes through the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientOp {
    Write {
        object: ObjectRef,
        offset: u32,
        data: Bytes,
    },
    /// Deallocate the range; it reads as zeros.
    Discard {
        object: ObjectRef,
        offset: u32,
        length: u32,
    },
    /// Make the range read as zeros (space may be given back).
    WriteZeroes {
        object: ObjectRef,
        offset: u32,
        length: u32,
    },
    /// Delete what the PG holds of `image` in `from_bytes..to_bytes` (image bytes): whole
    /// objects inside the range go, the object the range starts in is zeroed from there on.
    /// Proposed by the PG leader for the monitor's reclaim entry `id` (a removed image or a
    /// shrunk tail).
    Reclaim {
        id: u64,
        image: ImageId,
        from_bytes: u64,
        to_bytes: u64,
        object_size_bytes: u64,
        /// The map epoch that recorded the reclaim entry.
        epoch: u64,
    },
    /// Take image snapshot `snap` of `image` in this PG: from here on in the log, writes of
    /// the image keep what they replace for it. Proposed by the PG leader for a snapshot the
    /// map shows being created.
    SnapMark { image: ImageId, snap: u64 },
    /// Remove image snapshot `snap` of `image` in this PG (the monitor's trim entry `id`).
    SnapTrim { id: u64, image: ImageId, snap: u64 },
    /// Make the object's data what image snapshot `snap` holds.
    Rollback { object: ObjectRef, snap: u64 },
    /// One piece of a clone object's copy-up from its parent: written unless the object is
    /// marked copied already. `runs` says where each part goes (decided by the leader from
    /// its map, `fastblock_types::clone_data`): (end offset within the object, target as
    /// `CopyUpTarget::to_u64`), in order, the last ending at `offset + data.len()`.
    CopyUp {
        object: ObjectRef,
        offset: u32,
        data: Bytes,
        runs: Vec<(u32, u64)>,
    },
    /// The clone object's copy-up is complete: it is read from the clone from now on.
    CopyUpDone { object: ObjectRef },
    /// Make every version of the object's blocks from `offset` on (4 KiB aligned, as far as
    /// `versions` covers) what a good replica holds: `versions` is their encoding as a PG
    /// snapshot transfer chunk. Proposed by the PG leader for a bad block copy found on a
    /// replica; a replica whose copy is good and the same keeps it.
    Repair {
        object: ObjectRef,
        offset: u32,
        versions: Bytes,
    },
}

impl ClientOp {
    /// The one object the operation touches (a reclaim spans objects: `None`).
    pub fn object(&self) -> Option<ObjectRef> {
        match self {
            ClientOp::Write { object, .. }
            | ClientOp::Discard { object, .. }
            | ClientOp::WriteZeroes { object, .. }
            | ClientOp::Rollback { object, .. }
            | ClientOp::CopyUp { object, .. }
            | ClientOp::Repair { object, .. }
            | ClientOp::CopyUpDone { object } => Some(*object),
            ClientOp::Reclaim { .. } | ClientOp::SnapMark { .. } | ClientOp::SnapTrim { .. } => {
                None
            }
        }
    }

    /// Encodes into (context, data) of a log entry.
    pub fn encode(&self) -> (Bytes, Bytes) {
        let (kind, object, offset, length, data) = match self {
            ClientOp::Reclaim {
                id,
                image,
                from_bytes,
                to_bytes,
                object_size_bytes,
                epoch,
            } => {
                let mut d = Vec::with_capacity(RECLAIM_PAYLOAD_BYTES);
                for v in [*id, *from_bytes, *to_bytes, *object_size_bytes, *epoch] {
                    d.extend_from_slice(&v.to_le_bytes());
                }
                let object = ObjectRef {
                    image: *image,
                    index: 0,
                };
                (4u8, object, 0, RECLAIM_PAYLOAD_BYTES as u32, Bytes::from(d))
            }
            ClientOp::SnapMark { image, snap } => {
                let object = ObjectRef {
                    image: *image,
                    index: 0,
                };
                let d = Bytes::copy_from_slice(&snap.to_le_bytes());
                (5u8, object, 0, 8, d)
            }
            ClientOp::SnapTrim { id, image, snap } => {
                let object = ObjectRef {
                    image: *image,
                    index: 0,
                };
                let mut d = Vec::with_capacity(16);
                d.extend_from_slice(&id.to_le_bytes());
                d.extend_from_slice(&snap.to_le_bytes());
                (6u8, object, 0, 16, Bytes::from(d))
            }
            ClientOp::Rollback { object, snap } => {
                let d = Bytes::copy_from_slice(&snap.to_le_bytes());
                (7u8, *object, 0, 8, d)
            }
            ClientOp::CopyUp {
                object,
                offset,
                data,
                runs,
            } => {
                let len = u32::try_from(data.len()).expect("copy-up payload fits in u32");
                // The runs, then the bytes: [count u32][end u32, target u64]*[data].
                let mut d = Vec::with_capacity(4 + runs.len() * COPY_UP_RUN_BYTES + data.len());
                d.extend_from_slice(&(runs.len() as u32).to_le_bytes());
                for (end, target) in runs {
                    d.extend_from_slice(&end.to_le_bytes());
                    d.extend_from_slice(&target.to_le_bytes());
                }
                d.extend_from_slice(data);
                (8u8, *object, *offset, len, Bytes::from(d))
            }
            ClientOp::CopyUpDone { object } => (9u8, *object, 0, 0, Bytes::new()),
            ClientOp::Repair {
                object,
                offset,
                versions,
            } => {
                let len = u32::try_from(versions.len()).expect("repair payload fits in u32");
                (10u8, *object, *offset, len, versions.clone())
            }
            ClientOp::Write {
                object,
                offset,
                data,
            } => {
                let len = u32::try_from(data.len()).expect("write payload fits in u32");
                (1u8, *object, *offset, len, data.clone())
            }
            ClientOp::Discard {
                object,
                offset,
                length,
            } => (2, *object, *offset, *length, Bytes::new()),
            ClientOp::WriteZeroes {
                object,
                offset,
                length,
            } => (3, *object, *offset, *length, Bytes::new()),
        };
        let mut h = Vec::with_capacity(OP_HEADER_BYTES);
        h.push(OP_VERSION);
        h.push(kind);
        h.extend_from_slice(&object.image.0.to_le_bytes());
        h.extend_from_slice(&object.index.to_le_bytes());
        h.extend_from_slice(&offset.to_le_bytes());
        h.extend_from_slice(&length.to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes());
        debug_assert_eq!(h.len(), OP_HEADER_BYTES);
        (Bytes::from(h), data)
    }

    /// Decodes an entry's (context, data); an error means the entry was not written by
    /// [`ClientOp::encode`] (a bug or damage that escaped the checksums).
    pub fn decode(context: &Bytes, data: &Bytes) -> Result<ClientOp, String> {
        if context.len() != OP_HEADER_BYTES {
            return Err(format!(
                "op header of {} bytes, want {OP_HEADER_BYTES}",
                context.len()
            ));
        }
        if context[0] != OP_VERSION {
            return Err(format!("op version {}", context[0]));
        }
        let u64_at = |o: usize| u64::from_le_bytes(context[o..o + 8].try_into().expect("8 bytes"));
        let u32_at = |o: usize| u32::from_le_bytes(context[o..o + 4].try_into().expect("4 bytes"));
        let object = ObjectRef {
            image: ImageId(u64_at(2)),
            index: u64_at(10),
        };
        let (offset, length) = (u32_at(18), u32_at(22));
        match context[1] {
            1 => {
                if data.len() != length as usize {
                    return Err(format!("write of {} bytes claims {length}", data.len()));
                }
                Ok(ClientOp::Write {
                    object,
                    offset,
                    data: data.clone(),
                })
            }
            2 | 3 if !data.is_empty() => Err("discard/zero entry carries data".into()),
            2 => Ok(ClientOp::Discard {
                object,
                offset,
                length,
            }),
            3 => Ok(ClientOp::WriteZeroes {
                object,
                offset,
                length,
            }),
            4 => {
                if data.len() != RECLAIM_PAYLOAD_BYTES || length as usize != data.len() {
                    return Err(format!("reclaim payload of {} bytes", data.len()));
                }
                let d = |i: usize| {
                    u64::from_le_bytes(data[i * 8..i * 8 + 8].try_into().expect("8 bytes"))
                };
                let (from_bytes, to_bytes, object_size_bytes) = (d(1), d(2), d(3));
                if from_bytes >= to_bytes || object_size_bytes == 0 {
                    return Err(format!(
                        "reclaim of {from_bytes}..{to_bytes} with objects of {object_size_bytes} bytes"
                    ));
                }
                Ok(ClientOp::Reclaim {
                    id: d(0),
                    image: object.image,
                    from_bytes,
                    to_bytes,
                    object_size_bytes,
                    epoch: d(4),
                })
            }
            5..=7 => {
                let want = if context[1] == 6 { 16 } else { 8 };
                if data.len() != want || length as usize != want || offset != 0 {
                    return Err(format!(
                        "op kind {} with {} bytes of data at offset {offset}",
                        context[1],
                        data.len()
                    ));
                }
                let d = |i: usize| {
                    u64::from_le_bytes(data[i * 8..i * 8 + 8].try_into().expect("8 bytes"))
                };
                Ok(match context[1] {
                    5 if object.index == 0 => ClientOp::SnapMark {
                        image: object.image,
                        snap: d(0),
                    },
                    6 if object.index == 0 => ClientOp::SnapTrim {
                        id: d(0),
                        image: object.image,
                        snap: d(1),
                    },
                    7 => ClientOp::Rollback { object, snap: d(0) },
                    k => return Err(format!("op kind {k} names object {}", object.index)),
                })
            }
            8 => decode_copy_up(object, offset, length, data),
            9 if data.is_empty() && offset == 0 && length == 0 => {
                Ok(ClientOp::CopyUpDone { object })
            }
            9 => Err("copy-up done carries a range or data".into()),
            10 if data.len() != length as usize => {
                Err(format!("repair of {} bytes claims {length}", data.len()))
            }
            10 => Ok(ClientOp::Repair {
                object,
                offset,
                versions: data.clone(),
            }),
            k => Err(format!("unknown op kind {k}")),
        }
    }
}

/// Bytes of one run of a copy-up entry: end offset u32, target u64.
const COPY_UP_RUN_BYTES: usize = 12;
/// Runs a copy-up piece may carry: one per target (the head, each live snapshot of the
/// image, nothing), so the live-snapshot limit plus two.
const COPY_UP_RUNS_MAX: usize = fastblock_types::SnapId::LIVE_PER_IMAGE_MAX + 2;

fn decode_copy_up(
    object: ObjectRef,
    offset: u32,
    length: u32,
    data: &Bytes,
) -> Result<ClientOp, String> {
    let bad = |why: String| Err(format!("copy-up entry: {why}"));
    if data.len() < 4 {
        return bad(format!("{} bytes", data.len()));
    }
    let count = u32::from_le_bytes(data[0..4].try_into().expect("4 bytes")) as usize;
    if count == 0 || count > COPY_UP_RUNS_MAX {
        return bad(format!("{count} runs"));
    }
    let head = 4 + count * COPY_UP_RUN_BYTES;
    if data.len() != head + length as usize {
        return bad(format!(
            "{} bytes for {count} runs and {length} of data",
            data.len()
        ));
    }
    let mut runs = Vec::with_capacity(count);
    let mut at = offset;
    for c in data[4..head].chunks_exact(COPY_UP_RUN_BYTES) {
        let end = u32::from_le_bytes(c[0..4].try_into().expect("4 bytes"));
        let target = u64::from_le_bytes(c[4..12].try_into().expect("8 bytes"));
        if end <= at && !(end == at && count == 1 && length == 0) {
            return bad(format!("a run ends at {end}, not after {at}"));
        }
        runs.push((end, target));
        at = end;
    }
    if u64::from(at) != u64::from(offset) + u64::from(length) {
        return bad(format!("runs end at {at}, the data at {offset}+{length}"));
    }
    Ok(ClientOp::CopyUp {
        object,
        offset,
        data: data.slice(head..),
        runs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn obj(image: u64, index: u64) -> ObjectRef {
        ObjectRef {
            image: ImageId(image),
            index,
        }
    }

    proptest! {
        #[test]
        fn round_trips(kind in 0u8..10, image: u64, index: u64, offset: u32, len in 0u32..9000, epoch: u64) {
            let op = match kind {
                0 => ClientOp::Write { object: obj(image, index), offset, data: Bytes::from(vec![7u8; len as usize]) },
                1 => ClientOp::Discard { object: obj(image, index), offset, length: len },
                2 => ClientOp::WriteZeroes { object: obj(image, index), offset, length: len },
                3 => ClientOp::SnapMark { image: ImageId(image), snap: epoch },
                4 => ClientOp::SnapTrim { id: index, image: ImageId(image), snap: epoch },
                5 => ClientOp::Rollback { object: obj(image, index), snap: epoch },
                6 => ClientOp::CopyUp {
                    object: obj(image, index),
                    offset: offset / 2,
                    data: Bytes::from(vec![3u8; len as usize]),
                    runs: if len < 2 {
                        vec![(offset / 2 + len, 0)]
                    } else {
                        vec![(offset / 2 + len / 2, epoch), (offset / 2 + len, u64::MAX)]
                    },
                },
                7 => ClientOp::CopyUpDone { object: obj(image, index) },
                8 => ClientOp::Repair { object: obj(image, index), offset, versions: Bytes::from(vec![5u8; len as usize]) },
                _ => ClientOp::Reclaim {
                    id: index,
                    image: ImageId(image),
                    from_bytes: u64::from(offset),
                    to_bytes: u64::from(offset) + u64::from(len) + 1,
                    object_size_bytes: 4 << 20,
                    epoch,
                },
            };
            let (ctx, data) = op.encode();
            prop_assert_eq!(ClientOp::decode(&ctx, &data), Ok(op));
        }

        #[test]
        fn garbage_never_panics(ctx in prop::collection::vec(any::<u8>(), 0..40), data in prop::collection::vec(any::<u8>(), 0..10)) {
            let _ = ClientOp::decode(&Bytes::from(ctx), &Bytes::from(data));
        }
    }

    #[test]
    fn write_payload_is_not_copied() {
        let data = Bytes::from(vec![1u8; 4096]);
        let op = ClientOp::Write {
            object: obj(1, 2),
            offset: 0,
            data: data.clone(),
        };
        let (ctx, encoded) = op.encode();
        assert_eq!(encoded.as_ptr(), data.as_ptr());
        match ClientOp::decode(&ctx, &encoded).unwrap() {
            ClientOp::Write { data: back, .. } => assert_eq!(back.as_ptr(), data.as_ptr()),
            other => panic!("{other:?}"),
        }
    }
}

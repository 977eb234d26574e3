//! Client operations and their encoding in Raft log entries.
//!
//! An operation's fixed header goes in the entry's `context` and a write's payload in its
//! `data`: both are `bytes::Bytes`, so the payload received from the network is the payload
//! replicated, persisted and applied, without a copy.
//!
//! Header (little-endian, 30 bytes):
//! ```text
//! 0  u8  version = 1
//! 1  u8  kind: 1 write, 2 discard, 3 write-zeroes
//! 2  u64 image id
//! 10 u64 object index
//! 18 u32 offset in the object
//! 22 u32 length (write: must equal data.len())
//! 26 u32 crc32c-free padding, 0 (reserved)
//! ```

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
}

impl ClientOp {
    pub fn object(&self) -> ObjectRef {
        match self {
            ClientOp::Write { object, .. }
            | ClientOp::Discard { object, .. }
            | ClientOp::WriteZeroes { object, .. } => *object,
        }
    }

    /// Encodes into (context, data) of a log entry.
    pub fn encode(&self) -> (Bytes, Bytes) {
        let (kind, object, offset, length, data) = match self {
            ClientOp::Write {
                object,
                offset,
                data,
            } => {
                let len = u32::try_from(data.len()).expect("write payload fits in u32");
                (1u8, object, *offset, len, data.clone())
            }
            ClientOp::Discard {
                object,
                offset,
                length,
            } => (2, object, *offset, *length, Bytes::new()),
            ClientOp::WriteZeroes {
                object,
                offset,
                length,
            } => (3, object, *offset, *length, Bytes::new()),
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
            k => Err(format!("unknown op kind {k}")),
        }
    }
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
        fn round_trips(kind in 0u8..3, image: u64, index: u64, offset: u32, len in 0u32..9000) {
            let op = match kind {
                0 => ClientOp::Write { object: obj(image, index), offset, data: Bytes::from(vec![7u8; len as usize]) },
                1 => ClientOp::Discard { object: obj(image, index), offset, length: len },
                _ => ClientOp::WriteZeroes { object: obj(image, index), offset, length: len },
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

//! Splitting an image byte range into object requests. Pure: the unit tests below pin it.
//!
//! Object `i` covers image bytes `[i * object_size, (i + 1) * object_size)`. A range is cut at
//! every object boundary, and a piece larger than `piece_bytes_max` is cut again, so that one
//! request always fits in one wire frame (`PAYLOAD_BYTES_MAX_DEFAULT`) whatever the object
//! size.

use crate::ClientError;

/// Most bytes of one object request. 4 MiB: a whole default object, and with the 40-byte
/// request header far below the wire's default 16 MiB payload limit.
pub const PIECE_BYTES_MAX: u64 = 4 << 20;

/// Most bytes of one write request. A write travels in one Raft log entry, and an OSD logs an
/// entry in one WAL batch, which `fastblock-osd --mkfs` makes 2 MiB at the smallest (a
/// quarter of an 8 MiB segment); the OSD refuses a write that cannot fit. 1 MiB fits with room
/// for the entry's headers. Reads, discards and write-zeroes carry no data in the log and use
/// [`PIECE_BYTES_MAX`].
pub const WRITE_PIECE_BYTES_MAX: u64 = 1 << 20;

const _: () = assert!(PIECE_BYTES_MAX + 64 <= fastblock_wire::PAYLOAD_BYTES_MAX_DEFAULT as u64);
const _: () = assert!(WRITE_PIECE_BYTES_MAX <= PIECE_BYTES_MAX);
const _: () = assert!(PIECE_BYTES_MAX <= u32::MAX as u64);

/// One object request's part of an IO.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub object_index: u64,
    /// Byte offset within the object.
    pub object_offset: u32,
    pub len: u32,
    /// Where this piece starts in the caller's buffer (0 for the first piece).
    pub buffer_offset: u64,
}

/// Checks that `[offset, offset + len)` lies inside an image of `size_bytes`.
pub fn check_range(offset: u64, len: u64, size_bytes: u64) -> Result<(), ClientError> {
    match offset.checked_add(len) {
        Some(end) if end <= size_bytes => Ok(()),
        _ => Err(ClientError::OutOfRange {
            offset,
            len,
            size: size_bytes,
        }),
    }
}

/// Cuts `[offset, offset + len)` into object pieces of at most `piece_bytes_max` bytes, in
/// order. An empty range gives no pieces.
///
/// # Panics
/// If `object_size_bytes` is 0 or above 2^32 (offsets within an object are u32 on the wire),
/// or `piece_bytes_max` is 0 or above `u32::MAX`: the image was validated at open, so these
/// are caller bugs.
pub fn split(offset: u64, len: u64, object_size_bytes: u64, piece_bytes_max: u64) -> Vec<Extent> {
    assert!(object_size_bytes > 0, "object size is 0");
    assert!(
        object_size_bytes <= 1 << 32,
        "object size {object_size_bytes} over 4 GiB"
    );
    assert!(piece_bytes_max > 0 && piece_bytes_max <= u64::from(u32::MAX));
    let mut extents = Vec::with_capacity(1);
    let mut done = 0u64;
    while done < len {
        let position = offset + done;
        let object_index = position / object_size_bytes;
        let object_offset = position % object_size_bytes;
        let in_object = object_size_bytes - object_offset;
        let piece = (len - done).min(in_object).min(piece_bytes_max);
        // Both fit in u32: object_offset < object_size <= 2^32 and piece <= piece_bytes_max.
        extents.push(Extent {
            object_index,
            object_offset: object_offset as u32,
            len: piece as u32,
            buffer_offset: done,
        });
        done += piece;
    }
    debug_assert_eq!(extents.iter().map(|e| u64::from(e.len)).sum::<u64>(), len);
    extents
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn ext(object_index: u64, object_offset: u32, len: u32, buffer_offset: u64) -> Extent {
        Extent {
            object_index,
            object_offset,
            len,
            buffer_offset,
        }
    }

    #[test]
    fn inside_one_object_is_one_piece() {
        assert_eq!(
            split(4096, 4096, 4 * MIB, PIECE_BYTES_MAX),
            [ext(0, 4096, 4096, 0)]
        );
        // Unaligned offset and length, still inside object 2.
        assert_eq!(
            split(8 * MIB + 17, 1000, 4 * MIB, PIECE_BYTES_MAX),
            [ext(2, 17, 1000, 0)]
        );
    }

    #[test]
    fn exactly_one_whole_object() {
        assert_eq!(
            split(4 * MIB, 4 * MIB, 4 * MIB, PIECE_BYTES_MAX),
            [ext(1, 0, 4 * MIB as u32, 0)]
        );
    }

    #[test]
    fn cross_object_range_is_cut_at_the_boundary() {
        // 8 KiB straddling the boundary between objects 0 and 1, unaligned.
        let start = 4 * MIB - 3000;
        assert_eq!(
            split(start, 8192, 4 * MIB, PIECE_BYTES_MAX),
            [
                ext(0, (4 * MIB - 3000) as u32, 3000, 0),
                ext(1, 0, 5192, 3000)
            ]
        );
    }

    #[test]
    fn head_whole_objects_and_tail() {
        let object = 64 * 1024;
        let pieces = split(object - 10, 2 * object + 30, object, PIECE_BYTES_MAX);
        assert_eq!(
            pieces,
            [
                ext(0, (object - 10) as u32, 10, 0),
                ext(1, 0, object as u32, 10),
                ext(2, 0, object as u32, 10 + object),
                ext(3, 0, 20, 10 + 2 * object),
            ]
        );
    }

    #[test]
    fn large_objects_are_cut_into_frame_sized_pieces() {
        let pieces = split(MIB, 10 * MIB, 64 * MIB, 4 * MIB);
        assert_eq!(
            pieces,
            [
                ext(0, MIB as u32, 4 * MIB as u32, 0),
                ext(0, 5 * MIB as u32, 4 * MIB as u32, 4 * MIB),
                ext(0, 9 * MIB as u32, 2 * MIB as u32, 8 * MIB),
            ]
        );
    }

    #[test]
    fn empty_range_has_no_pieces() {
        assert!(split(123, 0, 4 * MIB, PIECE_BYTES_MAX).is_empty());
    }

    #[test]
    fn pieces_tile_the_range_for_many_shapes() {
        for object in [512u64, 4096, 65536] {
            for offset in [0u64, 1, 511, 4095, 4096, 65535, 70000] {
                for len in [1u64, 511, 4096, 65536, 200_000] {
                    let pieces = split(offset, len, object, 8192);
                    let mut position = offset;
                    for p in &pieces {
                        assert_eq!(
                            p.object_index * object + u64::from(p.object_offset),
                            position
                        );
                        assert_eq!(p.buffer_offset, position - offset);
                        assert!(u64::from(p.object_offset) + u64::from(p.len) <= object);
                        assert!(p.len > 0 && p.len <= 8192);
                        position += u64::from(p.len);
                    }
                    assert_eq!(position, offset + len);
                }
            }
        }
    }

    #[test]
    fn range_checks() {
        assert!(check_range(0, 100, 100).is_ok());
        assert!(check_range(100, 0, 100).is_ok());
        assert!(matches!(
            check_range(99, 2, 100),
            Err(ClientError::OutOfRange {
                offset: 99,
                len: 2,
                size: 100
            })
        ));
        assert!(check_range(101, 0, 100).is_err());
        assert!(check_range(u64::MAX, 2, u64::MAX).is_err());
    }
}

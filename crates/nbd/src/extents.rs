//! Pure extent arithmetic: where a read's data is all zeros (sent as hole chunks instead of
//! bytes), and `base:allocation` descriptors from the cluster's allocated ranges.

use crate::consts::{STATE_HOLE, STATE_ZERO};

// One decision of what counts as a hole in read data, shared with `fastblock-client image
// export|import|cp` (which skip the same blocks): it lives in the client library.
pub use fastblock_client::zeros::{is_zero, zero_runs, Run, HOLE_BLOCK_BYTES};

/// `base:allocation` descriptors `(length, flags)` covering `offset..offset + length`, given
/// the allocated ranges inside it (sorted, not overlapping): allocated ranges are data
/// (flags 0), the gaps are holes that read as zeros (`HOLE | ZERO`). With `req_one` only the
/// first descriptor is returned.
///
/// # Panics
/// If a range lies outside the window or the ranges are out of order: the client library
/// checks the OSDs' answers, so this is a caller bug.
pub fn allocation_descriptors(
    offset: u64,
    length: u32,
    allocated: &[(u64, u64)],
    req_one: bool,
) -> Vec<(u32, u32)> {
    let end = offset + u64::from(length);
    let mut out = Vec::with_capacity(allocated.len() * 2 + 1);
    let mut at = offset;
    // Lengths are at most `length` (a u32), so the casts below are exact.
    for &(start, len) in allocated {
        assert!(
            start >= at && start + len <= end && len > 0,
            "allocated range {start}+{len} out of order or outside {offset}+{length}"
        );
        if start > at {
            out.push(((start - at) as u32, STATE_HOLE | STATE_ZERO));
        }
        out.push((len as u32, 0));
        at = start + len;
    }
    if at < end {
        out.push(((end - at) as u32, STATE_HOLE | STATE_ZERO));
    }
    if req_one {
        out.truncate(1);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_alternate_holes_and_data() {
        let hole = STATE_HOLE | STATE_ZERO;
        assert_eq!(
            allocation_descriptors(1000, 9000, &[(2000, 1000), (5000, 100)], false),
            vec![
                (1000, hole),
                (1000, 0),
                (2000, hole),
                (100, 0),
                (4900, hole)
            ]
        );
        assert_eq!(allocation_descriptors(0, 10, &[], false), vec![(10, hole)]);
        assert_eq!(
            allocation_descriptors(0, 10, &[(0, 10)], false),
            vec![(10, 0)]
        );
        assert_eq!(
            allocation_descriptors(0, 10, &[(5, 5)], true),
            vec![(5, hole)]
        );
    }
}

//! Where read data is all zeros: whole, aligned 4 KiB blocks that a reader can treat as holes
//! (the NBD server sends them as hole chunks; `fastblock-client image import|export|cp` does
//! not write them). Pure; the unit tests below pin it.

/// Granularity of hole detection in reads: the OSD's block, aligned in image offsets.
pub const HOLE_BLOCK_BYTES: u64 = 4096;

/// A piece of a read: `len` bytes at `start` within the read's buffer, zeros or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    pub start: usize,
    pub len: usize,
    pub zero: bool,
}

/// Cuts the data of a read at image (or export) offset `offset` into runs of data and runs of whole,
/// aligned, all-zero blocks, in order, neighbours of the same kind merged. Partial blocks at
/// the edges always count as data (a hole chunk for a few bytes saves nothing).
pub fn zero_runs(offset: u64, data: &[u8]) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    let mut push = |start: usize, len: usize, zero: bool| match runs.last_mut() {
        Some(last) if last.zero == zero => last.len += len,
        _ => runs.push(Run { start, len, zero }),
    };
    let mut at = 0usize;
    while at < data.len() {
        let position = offset + at as u64;
        let block_end = (position / HOLE_BLOCK_BYTES + 1) * HOLE_BLOCK_BYTES;
        let len = ((block_end - position) as usize).min(data.len() - at);
        let whole_block = position % HOLE_BLOCK_BYTES == 0 && len as u64 == HOLE_BLOCK_BYTES;
        let zero = whole_block && is_zero(&data[at..at + len]);
        push(at, len, zero);
        at += len;
    }
    runs
}

/// Whether every byte is zero. Checked 64 bytes at a time: the inner fold vectorises, and
/// data that is not zero (the usual case) stops at its first chunk.
pub fn is_zero(bytes: &[u8]) -> bool {
    bytes
        .chunks(64)
        .all(|chunk| chunk.iter().fold(0u8, |acc, b| acc | b) == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_blocks_become_holes_only_when_whole_and_aligned() {
        let mut data = vec![0u8; 3 * 4096];
        data[4096 + 17] = 1;
        // Block 0 zero, block 1 data, block 2 zero.
        assert_eq!(
            zero_runs(0, &data),
            vec![
                Run {
                    start: 0,
                    len: 4096,
                    zero: true
                },
                Run {
                    start: 4096,
                    len: 4096,
                    zero: false
                },
                Run {
                    start: 8192,
                    len: 4096,
                    zero: true
                },
            ]
        );
        // Unaligned: a partial head and tail are data even when zero.
        let zeros = vec![0u8; 2 * 4096];
        assert_eq!(
            zero_runs(100, &zeros),
            vec![
                Run {
                    start: 0,
                    len: 3996,
                    zero: false
                },
                Run {
                    start: 3996,
                    len: 4096,
                    zero: true
                },
                Run {
                    start: 8092,
                    len: 100,
                    zero: false
                },
            ]
        );
        assert!(zero_runs(0, &[]).is_empty());
        // Adjacent zero blocks merge into one run.
        assert_eq!(zero_runs(4096, &vec![0u8; 5 * 4096]).len(), 1);
    }

    #[test]
    fn runs_cover_the_data_exactly() {
        for offset in [0u64, 1, 4095, 4096, 12345] {
            for len in [0usize, 1, 4096, 10000, 3 * 4096 + 5] {
                let mut data = vec![0u8; len];
                for (i, b) in data.iter_mut().enumerate() {
                    if i % 9000 == 7 {
                        *b = 1;
                    }
                }
                let runs = zero_runs(offset, &data);
                let mut at = 0;
                for r in &runs {
                    assert_eq!(r.start, at);
                    assert!(r.len > 0);
                    if r.zero {
                        assert!(is_zero(&data[r.start..r.start + r.len]));
                    }
                    at += r.len;
                }
                assert_eq!(at, len);
            }
        }
    }
}

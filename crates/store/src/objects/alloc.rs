//! Free-space allocator over the data region: one bit per 4 KiB block, next-fit from a
//! cursor so that consecutive allocations (the applied writes of one batch) land in
//! consecutive blocks and go to disk as one write. Rebuilt at open from the metadata.

/// A run of physical blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub start_block: u64,
    pub block_count: u64,
}

#[derive(Debug)]
pub struct Allocator {
    used: Vec<u64>,
    block_count: u64,
    free_blocks: u64,
    cursor: u64,
}

impl Allocator {
    pub fn new(block_count: u64) -> Self {
        Allocator {
            used: vec![0; block_count.div_ceil(64) as usize],
            block_count,
            free_blocks: block_count,
            cursor: 0,
        }
    }

    pub fn free_blocks(&self) -> u64 {
        self.free_blocks
    }

    pub fn block_count(&self) -> u64 {
        self.block_count
    }

    pub fn is_used(&self, block: u64) -> bool {
        assert!(block < self.block_count, "block {block} out of range");
        self.used[(block / 64) as usize] & (1 << (block % 64)) != 0
    }

    /// Marks a block used while rebuilding; false if it already was (a double reference).
    pub fn mark_used(&mut self, block: u64) -> bool {
        if self.is_used(block) {
            return false;
        }
        self.used[(block / 64) as usize] |= 1 << (block % 64);
        self.free_blocks -= 1;
        true
    }

    pub fn free(&mut self, block: u64) {
        assert!(self.is_used(block), "double free of block {block}");
        self.used[(block / 64) as usize] &= !(1 << (block % 64));
        self.free_blocks += 1;
    }

    /// Allocates `count` blocks as few extents as the free space allows; all or nothing.
    pub fn allocate(&mut self, count: u64) -> Option<Vec<Extent>> {
        if count > self.free_blocks {
            return None;
        }
        let mut out: Vec<Extent> = Vec::new();
        let mut left = count;
        let mut b = self.cursor;
        let mut scanned = 0u64;
        while left > 0 {
            assert!(scanned <= self.block_count + 64, "allocator scan ran away");
            if b >= self.block_count {
                b = 0;
            }
            let word = self.used[(b / 64) as usize];
            if b.is_multiple_of(64) && word == u64::MAX {
                b += 64;
                scanned += 64;
                continue;
            }
            if !self.is_used(b) {
                self.used[(b / 64) as usize] |= 1 << (b % 64);
                match out.last_mut() {
                    Some(e) if e.start_block + e.block_count == b => e.block_count += 1,
                    _ => out.push(Extent {
                        start_block: b,
                        block_count: 1,
                    }),
                }
                left -= 1;
            }
            b += 1;
            scanned += 1;
        }
        self.free_blocks -= count;
        self.cursor = b;
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocates_contiguously_and_reuses_freed_blocks() {
        let mut a = Allocator::new(130);
        let e = a.allocate(100).unwrap();
        assert_eq!(
            e,
            vec![Extent {
                start_block: 0,
                block_count: 100
            }]
        );
        assert_eq!(a.free_blocks(), 30);
        assert!(a.allocate(31).is_none());
        assert_eq!(a.free_blocks(), 30, "failed allocation must change nothing");
        for b in 10..20 {
            a.free(b);
        }
        let e = a.allocate(35).unwrap();
        assert_eq!(e.iter().map(|e| e.block_count).sum::<u64>(), 35);
        assert_eq!(
            e[0],
            Extent {
                start_block: 100,
                block_count: 30
            }
        );
        assert_eq!(a.free_blocks(), 5);
        assert!(!a.mark_used(0), "double reference must be reported");
    }
}

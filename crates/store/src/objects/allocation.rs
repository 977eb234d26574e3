//! Which parts of an object hold data blocks: the allocation query behind NBD's
//! `base:allocation` block status. A separate `impl Objects` block so that the write path in
//! `mod.rs` stays about writing.

use super::{obj_key, BlockKey, Objects, BS};
use crate::error::{ObjectId, Result};
use fastblock_types::PgId;

impl Objects {
    /// The byte ranges of `offset_bytes..offset_bytes + len_bytes` of the object that are
    /// backed by data blocks (flushed map overlaid with applied-but-unflushed changes), in
    /// offset order, adjacent blocks merged, clipped to the asked range. Everything else in
    /// the range is a hole and reads as zeros. Granularity is the 4 KiB block: a block that a
    /// discard only partly covered was rewritten with zeros and stays allocated.
    pub fn allocated_ranges(
        &mut self,
        pg: PgId,
        object: ObjectId,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> Result<Vec<(u64, u64)>> {
        super::check_range(offset_bytes, len_bytes)?;
        if len_bytes == 0 {
            return Ok(Vec::new());
        }
        let ok = obj_key(pg, object);
        let end = offset_bytes + len_bytes;
        // `check_range` bounds `end` by the object size limit, so block indexes fit in u32.
        let keys: Vec<BlockKey> = (offset_bytes / BS..end.div_ceil(BS))
            .map(|b| (ok.0, ok.1, ok.2, b as u32))
            .collect();
        let values = self.lookup_many(&keys)?;
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        for (key, value) in keys.iter().zip(values) {
            if value.is_none() {
                continue;
            }
            let block = u64::from(key.3);
            let lo = (block * BS).max(offset_bytes);
            let hi = ((block + 1) * BS).min(end);
            match ranges.last_mut() {
                Some((start, len)) if *start + *len == lo => *len += hi - lo,
                _ => ranges.push((lo, hi - lo)),
            }
        }
        Ok(ranges)
    }
}

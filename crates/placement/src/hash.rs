//! Stable integer hashing for tie-breaks.
//!
//! Every choice between equally good candidates is broken by a hash of (pool, PG seq, candidate)
//! rather than by the candidate's id, so that pools created on the same cluster do not all put
//! their first PGs on the lowest-numbered OSDs. The functions are fixed forever in spirit: a
//! change here changes where new pools are placed (existing pools are persisted lists and do not
//! move), so it is allowed but must be deliberate.

/// The splitmix64 finalizer (Steele, Lea, Flood 2014): a bijective mix of 64 bits.
pub(crate) const fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The tie-break key of `candidate` (an OSD id or a domain's hash) for PG `seq` of `pool`.
pub(crate) const fn tie(pool: u32, seq: u32, candidate: u64) -> u64 {
    splitmix64(splitmix64(splitmix64(pool as u64) ^ seq as u64) ^ candidate)
}

/// FNV-1a of a host name: a stable integer standing for a `Host` failure domain.
pub(crate) fn name_hash(name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values_do_not_drift() {
        // Reference value of splitmix64 seeded with 0 (first output of the generator).
        assert_eq!(splitmix64(0), 0xe220_a839_7b1d_cdaf);
        assert_eq!(name_hash(""), 0xcbf2_9ce4_8422_2325);
        assert_ne!(tie(1, 0, 1), tie(2, 0, 1));
        assert_ne!(tie(1, 0, 1), tie(1, 1, 1));
    }
}

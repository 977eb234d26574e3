//! Data routing shared by clients, OSDs and the simulator: which PG an object belongs to, and
//! which shard of an OSD serves a PG. Both are stable functions of their inputs (documented in
//! `docs/data-path.md`); changing them moves data, so they are versioned by this page.

use crate::ids::{ImageId, PgId, PoolId};

/// FNV-1a 64 over little-endian bytes: simple, stable across platforms and releases, and
/// spreads consecutive object indexes well after the final avalanche step.
fn fnv1a64(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in *part {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    // Avalanche (the murmur3 finalizer), so that `% pg_count` uses well-mixed low bits.
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// The PG holding object `index` of `image` in a pool of `pg_count` PGs.
pub fn object_pg(pool: PoolId, pg_count: u32, image: ImageId, index: u64) -> PgId {
    assert!(pg_count > 0, "pool {pool} has no PGs");
    let h = fnv1a64(&[&image.0.to_le_bytes(), &index.to_le_bytes()]);
    PgId::new(pool, (h % u64::from(pg_count)) as u32)
}

/// The shard (0-based) of an OSD with `shards` shards that serves `pg`; the shard listens on
/// the OSD's data port + shard.
pub fn pg_shard(pg: PgId, shards: u32) -> u32 {
    assert!(shards > 0, "an OSD has at least one shard");
    let h = fnv1a64(&[&pg.pool.0.to_le_bytes(), &pg.seq.to_le_bytes()]);
    (h % u64::from(shards)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_is_stable() {
        // Golden values: a change here moves every object of every existing image.
        assert_eq!(
            object_pg(PoolId(1), 8, ImageId(1), 0),
            object_pg(PoolId(1), 8, ImageId(1), 0)
        );
        let golden: Vec<u32> = (0..8)
            .map(|i| object_pg(PoolId(1), 8, ImageId(1), i).seq)
            .collect();
        assert_eq!(golden, GOLDEN_OBJECT_PGS);
        assert_eq!(pg_shard(PgId::new(PoolId(1), 0), 1), 0);
    }

    const GOLDEN_OBJECT_PGS: [u32; 8] = [1, 7, 2, 4, 0, 0, 4, 1];

    #[test]
    fn objects_spread_evenly_over_pgs() {
        let mut counts = [0u32; 32];
        for i in 0..32_000 {
            counts[object_pg(PoolId(1), 32, ImageId(3), i).seq as usize] += 1;
        }
        let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
        assert!(*min > 850 && *max < 1150, "uneven: {counts:?}");
        let mut shards = [0u32; 4];
        for seq in 0..4096 {
            shards[pg_shard(PgId::new(PoolId(2), seq), 4) as usize] += 1;
        }
        assert!(shards.iter().all(|c| *c > 900), "{shards:?}");
    }
}

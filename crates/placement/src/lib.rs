//! Layer 1 of fastblock: pure placement of PGs on OSDs.
//!
//! The monitor decides which OSDs hold each PG of a pool and persists the ordered member lists
//! in etcd; this crate makes those decisions. It is not CRUSH: nothing is recomputed from a map
//! on the data path, so placement only has to be deterministic, respect failure domains, spread
//! load evenly and move as little as possible when the cluster changes.
//! See `docs/design/placement.md` for the algorithms and the bounds the tests hold them to.
//!
//! Module map:
//! - [`place_pool`] (`initial.rs`): the member lists of every PG of a new pool; then
//!   `primaries.rs` balances the preferred leaders (position 0) by swapping positions.
//! - [`repair`] (`repair.rs`): replace members that are no longer placement targets, fill short
//!   PGs; every other member keeps its position.
//! - [`rebalance`] (`rebalance.rs`): bounded, one-member-at-a-time moves from loaded domains and
//!   OSDs to light ones, only in PGs the caller marks movable.
//! - [`load`] (`load.rs`): per-OSD member and primary counts.
//! - `domains.rs`: failure-domain keys and the candidate topology; `choose.rs`: the selection
//!   rule shared by initial placement and repair; `hash.rs`: the stable tie-break hash.
//!
//! Invariants (asserted where they are produced, and property-tested):
//! - No two members of a PG this crate creates or changes share a failure domain (the domain of
//!   an OSD is its host name for `Host`, the OSD itself for `Osd`).
//! - Every member placed is a placement target (`OsdInfo::is_placement_target`: in and not
//!   pending-create; up or down does not matter, like the reference system).
//! - The same input gives the same output: no clock, no randomness, no hash-ordered
//!   collections; ties are broken by a splitmix64 hash of (pool, PG seq, candidate), so that
//!   pools do not all favour the same OSDs.
//!
//! This crate depends only on `fastblock-types` and `thiserror`. It must not do I/O, read a
//! clock, draw randomness or iterate a `HashMap`/`HashSet`.

mod choose;
mod domains;
mod hash;
mod initial;
mod load;
mod primaries;
mod rebalance;
mod repair;

use fastblock_types::map::FailureDomain;
use fastblock_types::PoolId;

pub use initial::place_pool;
pub use load::load;
pub use rebalance::rebalance;
pub use repair::repair;

/// The largest replica count a pool may have. Bounds the per-PG work and keeps Raft groups sane.
pub const POOL_SIZE_MAX: u32 = 16;

/// The largest number of PGs a pool may have. Placement is roughly `O(pg_count · domains)` plus
/// the primary pass; this bound keeps one call well under a second.
pub const PG_COUNT_MAX: u32 = 1 << 17;

/// The pool parameters placement needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolSpec {
    pub pool: PoolId,
    pub pg_count: u32,
    /// Replicas per PG.
    pub size: u32,
    pub failure_domain: FailureDomain,
}

impl PoolSpec {
    /// Checks the limits of a new pool.
    pub fn validate(&self) -> Result<(), PlacementError> {
        if self.size == 0 {
            return Err(PlacementError::Invalid("size must be at least 1".into()));
        }
        if self.size > POOL_SIZE_MAX {
            return Err(PlacementError::Invalid(format!(
                "size {} exceeds the maximum {POOL_SIZE_MAX}",
                self.size
            )));
        }
        if self.pg_count == 0 {
            return Err(PlacementError::Invalid(
                "pg_count must be at least 1".into(),
            ));
        }
        if self.pg_count > PG_COUNT_MAX {
            return Err(PlacementError::Invalid(format!(
                "pg_count {} exceeds the maximum {PG_COUNT_MAX}",
                self.pg_count
            )));
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlacementError {
    #[error(
        "pool size {size} needs {size} distinct {domain} failure domains with in OSDs, \
         but only {available} exist"
    )]
    NotEnoughDomains {
        size: u32,
        available: u32,
        domain: FailureDomain,
    },
    /// Size 0, pg_count 0, or a limit exceeded.
    #[error("invalid pool spec: {0}")]
    Invalid(String),
}

#[cfg(test)]
pub(crate) mod test_support {
    use fastblock_types::map::OsdInfo;
    use fastblock_types::OsdId;

    pub fn osd(id: u32, host: &str, is_in: bool) -> OsdInfo {
        OsdInfo {
            id: OsdId(id),
            uuid: format!("uuid-{id}"),
            host: host.to_string(),
            address: "127.0.0.1".into(),
            port: 0,
            shards: 1,
            capacity_bytes: 0,
            up: true,
            is_in,
            pending_create: false,
            boot_epoch: Default::default(),
            config: String::new(),
            lease_timing: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_messages_read_well() {
        let e = PlacementError::NotEnoughDomains {
            size: 3,
            available: 2,
            domain: FailureDomain::Host,
        };
        assert_eq!(
            e.to_string(),
            "pool size 3 needs 3 distinct host failure domains with in OSDs, but only 2 exist"
        );
        let spec = PoolSpec {
            pool: PoolId(1),
            pg_count: 0,
            size: 3,
            failure_domain: FailureDomain::Osd,
        };
        assert!(matches!(spec.validate(), Err(PlacementError::Invalid(_))));
    }
}

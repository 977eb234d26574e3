//! What a shard served since it started, over every PG it led at the time. The heartbeats'
//! per-PG counters leave with a PG's leadership (the monitor computes rates from them); these
//! only ever grow, so the OSD exports them as Prometheus counters and leaves rates to
//! Prometheus (`docs/metrics.md`).

use crate::core::ShardCore;
use fastblock_store::Disk;

/// Counters since the shard started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoTotals {
    /// Client reads answered with data, and their bytes.
    pub read_ops: u64,
    pub read_bytes: u64,
    /// Client requests that change data (writes, discards, write-zeroes, copy-ups, ...)
    /// applied and acknowledged, and the bytes each names (a discard's range counts).
    pub write_ops: u64,
    pub write_bytes: u64,
    /// Bytes of PG snapshots sent to recovering members.
    pub recovery_sent_bytes: u64,
}

/// PGs a shard holds a replica of, and those it leads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PgCounts {
    pub hosted: u64,
    pub led: u64,
}

impl<D: Disk + 'static> ShardCore<D> {
    pub fn io_totals(&self) -> IoTotals {
        self.io_totals
    }

    pub fn pg_counts(&self) -> PgCounts {
        PgCounts {
            hosted: self.pgs.len() as u64,
            led: self.pgs.values().filter(|h| h.replica.is_leader()).count() as u64,
        }
    }
}

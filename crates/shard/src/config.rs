//! A shard's settings: the OSD's flags, or the simulator's scaled-down values.

use fastblock_pg::PgConfig;
use fastblock_types::OsdId;

/// Snapshot transfer limits of one shard (`docs/design/recovery.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecoveryLimits {
    /// Transfers this shard sends at a time.
    pub max_active: usize,
    /// Bytes of objects read and sent per second, across its transfers.
    pub bytes_per_sec: u64,
    /// Bytes per chunk.
    pub chunk_bytes: u64,
    /// Chunks in flight per transfer.
    pub window_chunks: u32,
    /// Ticks without an acknowledgement after which a transfer is abandoned (Raft asks
    /// again).
    pub idle_ticks_max: u32,
}

impl RecoveryLimits {
    /// Bytes per snapshot chunk: small enough that reading one does not hold up client IO for
    /// long (a 128 KiB read is well under a millisecond), large enough to keep frames
    /// efficient.
    pub const CHUNK_BYTES: u64 = 128 << 10;
    pub const WINDOW_CHUNKS: u32 = 8;
    pub const IDLE_TICKS_MAX: u32 = 200;

    /// The OSD's limits for `max_active` transfers at `bytes_per_sec`.
    pub fn osd(max_active: usize, bytes_per_sec: u64) -> RecoveryLimits {
        RecoveryLimits {
            max_active,
            bytes_per_sec,
            chunk_bytes: Self::CHUNK_BYTES,
            window_chunks: Self::WINDOW_CHUNKS,
            idle_ticks_max: Self::IDLE_TICKS_MAX,
        }
    }
}

/// When the PG leaders of a shard scrub their PGs (`docs/design/scrub.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScrubSchedule {
    /// A PG is scrubbed (light) this long after its last scrub under this leader, or after
    /// this leader took it over; 0: only when an operator asks.
    pub interval_ms: u64,
    /// A scheduled scrub is deep when the last deep one is this old; 0: never scheduled.
    pub deep_interval_ms: u64,
    /// Bytes of data a deep scrub reads per second on this shard, at most (its chunks wait
    /// for it): client IO keeps priority.
    pub deep_bytes_per_sec: u64,
}

impl ScrubSchedule {
    /// No scheduled scrubs (an operator's requests still run).
    pub const ON_REQUEST: ScrubSchedule = ScrubSchedule {
        interval_ms: 0,
        deep_interval_ms: 0,
        deep_bytes_per_sec: 64 << 20,
    };
    /// The OSD's defaults: light daily, deep weekly (Ceph's `osd_scrub_min_interval` and
    /// `osd_deep_scrub_interval`), deep reads at 64 MiB/s.
    pub const OSD_DEFAULT: ScrubSchedule = ScrubSchedule {
        interval_ms: 24 * 3600 * 1000,
        deep_interval_ms: 7 * 24 * 3600 * 1000,
        deep_bytes_per_sec: 64 << 20,
    };
}

#[derive(Clone, Debug)]
pub struct ShardConfig {
    pub osd: OsdId,
    /// This shard's index among the OSD's `count` shards: it hosts the PGs that hash to it.
    pub index: u32,
    pub count: u32,
    pub pg: PgConfig,
    /// Seed of the replicas' election timeouts.
    pub pg_seed: u64,
    /// Log entries kept behind the flushed applied index, for followers that fall behind.
    pub log_retain_entries: u64,
    /// A member further behind than this is caught up by snapshot, not from the log.
    pub log_lag_max_entries: u64,
    pub recovery: RecoveryLimits,
    /// Free data space below which new writes are refused with `NoSpace`, so that every
    /// committed entry can still be applied.
    pub data_reserve_bytes: u64,
    /// Free bytes the file system holding the shard's metadata keeps: while its last sample
    /// ([`crate::Input::HostSpace`]) is below this plus a write's length, writes are refused
    /// with `NoSpace` (see [`crate::space`]). The OSD's `--host-space-reserve`, by default
    /// [`ShardConfig::host_space_reserve_bytes`].
    pub host_space_reserve_bytes: u64,
    /// First snapshot transfer id: unique per sender incarnation (the OSD derives it from its
    /// id, shard and start time; the simulator from the node's incarnation).
    pub transfer_id_base: u64,
    /// Flush early once the log advanced by this share of the WAL's segments (1/N) since the
    /// last flush began.
    pub flush_wal_share_divisor: u64,
    /// WAL commits written and not yet durable before the core stops taking inputs (they
    /// wait in the core until the oldest is durable). The OSD's disk syncs synchronously, so
    /// it has one at a time; the simulator's deferred syncs explore several.
    pub wal_commits_in_flight_max: usize,
    /// Record every applied entry in [`crate::Effects::applied`] (the simulator's checker).
    pub record_applies: bool,
    pub scrub: ScrubSchedule,
}

impl ShardConfig {
    /// Free data space reserve of the OSD.
    pub const DATA_RESERVE_BYTES: u64 = 32 << 20;
    /// Least host file system reserve: what a flush of a small OSD, the daemons' logs and the
    /// files beside the data (identity, etcd of a monitor on the same disk) need.
    pub const HOST_SPACE_RESERVE_MIN_BYTES: u64 = 64 << 20;

    /// The default host file system reserve of an OSD of `shards` shards, each a region of
    /// `region_bytes` with a WAL of `wal_bytes`: what the metadata files can grow by between
    /// the sample that shows the file system low and the last flush of the writes admitted
    /// before it.
    ///
    /// Why this much: the data file is preallocated, so only the metadata (redb) grows. A
    /// shard flushes once a second or once its log advanced by an eighth of the WAL, and a
    /// flush commits the block map of what was applied since the last one. In the worst case
    /// (scattered 4 KiB writes) each applied 4 KiB block dirties its own 4 KiB page, and redb
    /// keeps the pages of the previous commit until the next one: twice an eighth of the
    /// WAL. Nor can a commit write more than twice the whole block map, about 1/64 of the
    /// region (some 64 bytes per 4 KiB block). The samples come once a second too, so this
    /// covers the writes admitted on a stale sample.
    pub fn host_space_reserve_bytes(shards: u32, region_bytes: u64, wal_bytes: u64) -> u64 {
        let per_shard = (wal_bytes / 4).min(region_bytes / 32);
        per_shard
            .saturating_mul(u64::from(shards))
            .max(Self::HOST_SPACE_RESERVE_MIN_BYTES)
    }
}

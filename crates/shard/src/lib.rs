//! The OSD shard core, sans IO: every protocol and durability decision of one OSD shard, in
//! one synchronous state machine with private state and one entry point,
//! [`ShardCore::step`]`(input, now) -> effects`. The OSD daemon (`crates/osd`) and the
//! simulator (`crates/sim`) both drive it; neither re-implements any of it.
//!
//! No tokio, no sockets, no threads, no clock or RNG reads (`clippy.toml` forbids them
//! here): time comes in with each step, randomness from the configuration's seeds, storage
//! through the store's `Disk` trait and flush runner, and stage timings from the metrics
//! clock the runtime hands over (read for metrics only, never for a decision).
//!
//! Module map:
//! - [`io`]: [`Input`], [`Effects`] and what they carry.
//! - [`core`]: the state and the rounds: collect PG outputs, apply and answer, queue Raft
//!   messages, stage log writes; the WAL commit cycle (`WalCommit`, `WalDurable`); fail-stop.
//! - [`admission`]: client and peer requests: limits, epochs, space, the PG.
//! - [`space`]: refusing writes before the data region or the host file system runs out.
//! - [`hosting`]: which PGs live here, from the cluster map (create, reopen, targets,
//!   removal, orphans, leader and membership reports).
//! - [`recovery`]: snapshot transfer to members that need one, rate-limited.
//! - [`reads`]: client reads whose barrier passed, read in one batch per step.
//! - [`repair`]: bad block copies repaired through the log from a good replica's versions;
//!   a disk that fails reads stops the shard.
//! - [`scrub`]: comparing the replicas' block checksums (light) and reading every block
//!   (deep), range by range, repairing from the majority.
//! - [`reclaim`]: deleting removed images and shrunk tails through the log; fencing IO by
//!   the map's image table.
//! - [`snaps`]: image snapshot marks and trims through the log; holding writes while a
//!   snapshot is taken.
//! - [`report_outbox`]: the reports an OSD owes the monitor, sent in batches and sent again
//!   while the monitor cannot take them (the OSD's and the simulator's nodes' outbox).
//! - [`flush`]: flush and compaction.
//! - [`wal_fit`]: cutting log writes into WAL batches; the uncommitted-write budgets.
//! - [`wal_space`]: keeping the WAL ring moving when a PG cannot release its log.
//! - [`optrack`]: the op tracker: ops in flight and the slowest recent ones, by stage.
//! - [`inspect`]: read-only views for the simulator's checks.
//! - [`totals`]: client IO and recovery bytes since the shard started, and the PGs it leads
//!   (the OSD's `/metrics` counters).
//! - [`config`], [`error`], [`stage`].

pub mod admission;
pub mod config;
pub mod core;
pub mod error;
pub mod flush;
pub mod hosting;
pub mod inspect;
pub mod io;
pub mod optrack;
pub mod reads;
pub mod reclaim;
pub mod recovery;
pub mod repair;
pub mod report_outbox;
pub mod scrub;
pub mod snaps;
pub mod space;
pub mod stage;
pub mod totals;
pub mod wal_fit;
pub mod wal_space;

pub use crate::core::{ShardCore, CONN_INFLIGHT_OPS_MAX};
pub use config::{RecoveryLimits, ScrubSchedule, ShardConfig};
pub use error::{Cause, Operation, ShardFailure};
pub use hosting::{PG_INIT_INDEX, PG_INIT_TERM};
pub use io::{
    AppliedRecord, CommitStats, ConnId, Effects, Input, MetricsClock, Micros, PeerSend, Probes,
    Report,
};
pub use repair::RepairCounts;
pub use stage::Stage;
pub use totals::{IoTotals, PgCounts};

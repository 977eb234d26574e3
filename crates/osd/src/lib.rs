//! The OSD node: shards that serve PG replicas from one disk, and the control task that ties
//! them to the monitor.
//!
//! Module map:
//! - [`identity`]: the OSD's id, uuid and shard count beside its data (`<data>.osd.json`).
//! - [`keys`]: the OSD's keyring (`<data>.keyring`) and the shared key table the control
//!   task refreshes when the map's `auth.epoch` moves.
//! - [`region`]: each shard's region of the device.
//! - [`mkfs`]: formatting a device and registering a new OSD id with the monitor.
//! - [`space`]: the host file system: allocating the data file and the metadata's holes,
//!   sampling the free space the shard cores refuse writes by.
//! - [`shard`]: one data-path thread: the runtime around the shard core
//!   ([`fastblock_shard::ShardCore`], which holds the store and the PG replicas and makes
//!   every protocol and durability decision) with the shard's connections, timers and clock.
//! - [`reach`]: the warning for an OSD that registers a loopback address with a monitor
//!   elsewhere.
//! - [`control`]: boot, heartbeats (with IO counters), following the map by long-poll,
//!   reporting new PG leaders, fail-stop; it watches every task and shard thread, and stops
//!   the OSD (exit status 1, naming what failed) when one fails or ends unasked.
//! - [`keys`]: the key table shared by the control task and the shards (data-plane auth).
//! - [`no_flush`]: the measurement-only WAL mode without device flushes: its opt-in and its
//!   warnings.
//! - [`faults`]: test-only disk fault injection (`--fault-injection-file`): its opt-in, the
//!   file's format, and the task that installs the file's rules into the shards' disks.
//! - [`op_reports`]: the shards' op tracker reports (slow ops), gathered for the heartbeat
//!   without waiting for a shard stuck in a slow disk call.
//! - [`stages`]: per-stage latency histograms of the IO path (the core times the stages, the
//!   runtime records them); [`metrics`]: `/metrics`.
//!
//! Threads: one per shard (each a single-threaded tokio runtime owning its core, with its
//! io_uring, PGs and store, and its sockets; a PG belongs to exactly one shard, chosen by
//! `route::pg_shard`) and its flusher (the metadata commit of each flush), plus the control
//! runtime. Shards share nothing; the control task talks to them over channels.

pub mod config_calls;
pub mod control;
pub mod faults;
pub mod identity;
pub mod keys;
pub mod metrics;
pub mod mkfs;
pub mod no_flush;
pub mod op_reports;
pub mod reach;
pub mod region;
pub mod shard;
pub mod space;
pub mod stages;

/// When PG leaders scrub (the OSD's `--scrub-*` flags).
pub use fastblock_shard::ScrubSchedule;

/// How a WAL commit makes its write durable (the OSD's `--wal-sync`).
pub use fastblock_store::disk::SyncMode;

use std::path::{Path, PathBuf};

pub use fastblock_types::panics::panic_message;

/// The metadata database of shard `index`: `<data>.shard<index>.meta`.
pub fn shard_meta_path(data: &Path, index: u32) -> PathBuf {
    let mut p = data.as_os_str().to_owned();
    p.push(format!(".shard{index}.meta"));
    PathBuf::from(p)
}

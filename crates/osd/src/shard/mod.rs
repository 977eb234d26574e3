//! One data-path shard: a thread with a single-threaded tokio runtime that owns one shard
//! core (with its store: its region of the device, its WAL, its io_uring; and the PGs that
//! hash to it) and the shard's connections. The control task talks to it only through
//! [`ShardCommand`] and [`ShardEvent`].
//!
//! Every protocol and durability decision is made by the sans-IO core,
//! [`fastblock_shard::ShardCore`] (the simulator drives the same core). This module is only
//! its runtime:
//!
//! - [`net`]: connections and peer links; reader tasks turn frames into the core's inputs.
//! - [`runtime`]: the loop: waits for sockets, timers, commands and the flusher thread,
//!   steps the core, and carries out its effects (replies, peer frames, reports, stage
//!   timings, the WAL commit cycle).

pub mod auth;
pub mod net;
pub mod runtime;

use crate::region::RegionDisk;
use fastblock_pg::PgConfig;
use fastblock_shard::{Micros, RecoveryLimits, ShardFailure};
use fastblock_store::{FaultPlan, FaultyDisk, Store, StoreOptions, UringDisk};
use fastblock_types::api::{BackfillTooFull, PgIoCounters};
use fastblock_types::map::ClusterMap;
use fastblock_types::OsdId;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

/// A shard's region of the device. The [`FaultyDisk`] in between does nothing (one atomic
/// load per call) unless `--fault-injection-file` (test-only, [`crate::faults`]) sets rules
/// in the shard's plan.
pub type ShardDisk = RegionDisk<FaultyDisk<UringDisk>>;
pub type ShardStore = Store<ShardDisk>;

#[derive(Clone, Debug)]
pub struct ShardSpec {
    pub index: u32,
    pub count: u32,
    pub osd: OsdId,
    pub data: PathBuf,
    pub pg_config: PgConfig,
    pub tick: Duration,
    /// How often applied data is flushed; a new value takes effect from the next flush on.
    pub flush_interval: tokio::sync::watch::Receiver<Duration>,
    /// How a WAL commit makes its write durable.
    pub wal_sync: fastblock_store::disk::SyncMode,
    /// WAL group commits in flight at once (1: each waits for its fdatasync).
    pub wal_commits_in_flight_max: usize,
    /// Log entries kept behind the flushed applied index, for followers that fall behind.
    pub log_retain_entries: u64,
    /// A member further behind than this is caught up by snapshot, not from the log.
    pub log_lag_max_entries: u64,
    /// Seed of the replicas' election timeouts.
    pub seed: u64,
    /// Snapshot transfers this shard sends at a time, and their bandwidth.
    pub recovery: RecoveryLimits,
    /// The OSD's rates as the operator changes them: the shard takes its share of each new
    /// value (`crate::control::shard_share`).
    pub rates: tokio::sync::watch::Receiver<crate::control::Rates>,
    /// When this shard's PG leaders scrub, and its deep read rate.
    pub scrub: fastblock_shard::ScrubSchedule,
    /// Where the shard records its per-stage latencies.
    pub stages: crate::stages::ShardStages,
    /// Bytes the file system holding the metadata keeps free (`--host-space-reserve`; None:
    /// derived from the store's geometry, `ShardConfig::host_space_reserve_bytes`).
    pub host_space_reserve_bytes: Option<u64>,
    /// The entity table tickets and connections are judged against (refreshed by the
    /// control task).
    pub keys: crate::keys::SharedKeyTable,
    /// This OSD's entity (`osd.N`) and entity key (from its keyring): its service key, which
    /// opens the tickets peers present, is derived from it.
    pub credentials: Option<fastblock_client::auth::Credentials>,
    /// This OSD's tickets to its peers, for its peer links when the map's auth mode is not
    /// none.
    pub tickets: Option<Arc<fastblock_client::tickets::Tickets>>,
    /// The fault plan of the shard's disk: empty unless the test-only
    /// `--fault-injection-file` fills it ([`crate::faults`]).
    pub faults: FaultPlan,
}

/// What a shard reports for the heartbeat.
pub struct ShardStats {
    /// IO counters and recovery progress of the PGs it leads.
    pub pgs: Vec<PgIoCounters>,
    /// Snapshot copies of those PGs that a member refused for lack of space.
    pub backfill_toofull: Vec<BackfillTooFull>,
    /// The shard's data space: (total bytes, free bytes).
    pub space: (u64, u64),
    /// What it can still take before it refuses writes for its reserve
    /// (`ShardCore::writable_bytes`).
    pub writable_bytes: u64,
}

pub enum ShardCommand {
    Map(Arc<ClusterMap>),
    Stats(oneshot::Sender<ShardStats>),
    /// The op tracker's report, with ops in flight this long (µs) counted slow.
    Ops {
        complaint_us: u64,
        reply: oneshot::Sender<fastblock_types::api::OsdOps>,
    },
    Shutdown(oneshot::Sender<()>),
}

#[derive(Debug)]
pub enum ShardEvent {
    /// Something the monitor must hear (a PG's leader or configuration, a confirmation): it
    /// goes through the OSD's report outbox.
    Report(fastblock_types::api::OsdReport),
    /// The shard stopped serving (an I/O error or a corrupt log): the OSD must stop.
    Fatal { shard: u32, failure: ShardFailure },
    /// The shard's thread ended without being asked to (its runtime failed, or it panicked
    /// where no panic hook aborts first): the OSD must stop.
    Stopped { shard: u32, reason: String },
}

/// The shard's monotonic clock: microseconds since the shard started. Stamps requests as
/// they are read, gives every step its `now`, and is the core's metrics clock, so all of
/// them are on one time line.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    origin: Instant,
}

impl Clock {
    pub fn start() -> Clock {
        Clock {
            origin: Instant::now(),
        }
    }

    pub fn now(&self) -> Micros {
        Micros(u64::try_from(self.origin.elapsed().as_micros()).unwrap_or(u64::MAX))
    }
}

pub struct ShardHandle {
    pub index: u32,
    pub commands: mpsc::UnboundedSender<ShardCommand>,
    pub thread: std::thread::JoinHandle<()>,
}

/// The shard thread's body: its runtime, its core, its loop. `Err`: it stopped without being
/// asked to.
fn serve(
    spec: ShardSpec,
    listener: std::net::TcpListener,
    events: mpsc::UnboundedSender<ShardEvent>,
    commands: mpsc::UnboundedReceiver<ShardCommand>,
    ready: std::sync::mpsc::Sender<anyhow::Result<()>>,
) -> Result<(), String> {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = ready.send(Err(e.into()));
            return Ok(()); // reported as an error of `spawn`
        }
    };
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async move {
        let shard = match runtime::Runtime::open(spec, listener, events) {
            Ok(shard) => {
                let _ = ready.send(Ok(()));
                shard
            }
            Err(e) => {
                let _ = ready.send(Err(e));
                return Ok(()); // reported as an error of `spawn`
            }
        };
        shard.run(commands).await
    })
}

pub fn store_options() -> StoreOptions {
    StoreOptions::default()
}

/// Opens the shard's store, binds its port and starts its thread. Errors (a missing device,
/// a busy port) are returned before the thread starts serving.
pub fn spawn(
    spec: ShardSpec,
    listener: std::net::TcpListener,
    events: mpsc::UnboundedSender<ShardEvent>,
) -> anyhow::Result<ShardHandle> {
    let (tx, rx) = mpsc::unbounded_channel();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<anyhow::Result<()>>();
    let index = spec.index;
    let thread = std::thread::Builder::new()
        .name(format!("shard-{index}"))
        .spawn(move || {
            let stopped = events.clone();
            // The OSD binary's panic hook aborts first (fail-stop); without it (the library
            // in tests), a panic still reaches the control task instead of ending the
            // thread unseen.
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                serve(spec, listener, events, rx, ready_tx)
            }));
            let reason = match outcome {
                Ok(Ok(())) => return,
                Ok(Err(reason)) => reason,
                Err(payload) => format!("panicked: {}", crate::panic_message(&*payload)),
            };
            tracing::error!(shard = index, "shard stopped: {reason}");
            let _ = stopped.send(ShardEvent::Stopped {
                shard: index,
                reason,
            });
        })?;
    ready_rx
        .recv()
        .map_err(|_| anyhow::anyhow!("shard {index} thread died while opening"))??;
    Ok(ShardHandle {
        index,
        commands: tx,
        thread,
    })
}

//! What goes into the core and what comes out of it.
//!
//! A runtime turns what happens around the shard (a frame read from a socket, a timer, a map
//! from the monitor, a finished flush) into an [`Input`], calls
//! [`crate::ShardCore::step`], and carries out the [`Effects`]: replies to connections, frames
//! to peers, reports to the monitor, stage timings to histograms, and — when
//! [`Effects::wal_commit_due`] is set — the next `step(Input::WalCommit)` once the frames of
//! this step have left.

use crate::error::ShardFailure;
use crate::stage::Stage;
use fastblock_pg::{Apply, Event};
use fastblock_types::api::{LeaderElectedRequest, MembershipFinishedRequest};
use fastblock_types::map::ClusterMap;
use fastblock_types::{OsdId, PgId};
use fastblock_wire::{Reply, Request, WireError};
use std::sync::Arc;

/// A client or peer connection, named by the runtime.
pub type ConnId = u64;

/// A point on the runtime's monotonic clock, in microseconds (virtual time in the simulator).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Micros(pub u64);

impl Micros {
    /// Microseconds from `earlier` to `self` (0 if `earlier` is later).
    pub fn since(self, earlier: Micros) -> u64 {
        self.0.saturating_sub(earlier.0)
    }

    pub fn as_millis(self) -> u64 {
        self.0 / 1000
    }
}

/// The clock the core reads for stage timings only, never for a decision: a runtime's
/// monotonic clock, or the simulator's virtual time.
pub type MetricsClock = Box<dyn Fn() -> Micros>;

/// One thing that happened to the shard.
#[derive(Debug)]
pub enum Input {
    /// A decoded request from a connection (client or peer).
    Request {
        conn: ConnId,
        request_id: u64,
        req: Request,
        /// When its bytes were read (the `queue` and `op_*` stages start here).
        arrived: Micros,
    },
    /// A well-framed request whose payload did not decode: answered with an error.
    BadRequest {
        conn: ConnId,
        request_id: u64,
        error: WireError,
    },
    /// A connection closed: its operations in flight no longer count against its limit.
    Closed { conn: ConnId },
    /// The tick timer fired.
    Tick,
    /// A new cluster map.
    Map(Arc<ClusterMap>),
    /// The flush timer fired: start a flush if anything was applied since the last one.
    FlushDue,
    /// The flush runner finished a flush's metadata commit: compact behind it.
    FlushDone,
    /// The runtime carried out the effects that asked for a WAL commit
    /// ([`Effects::wal_commit_due`]); now write the batch and sync it.
    WalCommit,
    /// The disk completed something while commits are in flight: the core collects the
    /// commits it finished (`Store::commit_reap`) and completes every round now durable.
    /// Nothing finished is fine (a spurious wake-up).
    WalDurable,
    /// Flush and compact before the process exits.
    Shutdown,
    /// A sample of the free bytes of the file system holding the shard's metadata (the OSD:
    /// `statvfs` of the metadata file, `f_bavail * f_frsize`, about once a second). The core
    /// keeps the last one and refuses writes while it is below the reserve
    /// ([`crate::ShardConfig::host_space_reserve_bytes`]); the next sample that shows room
    /// lets them in again. Without any sample the core refuses nothing for it. Taken at
    /// once, even while a WAL commit holds other inputs back.
    HostSpace { free_bytes: u64 },
    /// New throttles set by the operator while the OSD runs (`fastblock-client config set`):
    /// this shard's share of the recovery and deep-scrub read rates, bytes per second, each
    /// positive. Taken at once, like `HostSpace`: a setting, not work.
    Rates {
        recovery_bytes_per_sec: u64,
        scrub_deep_bytes_per_sec: u64,
    },
}

/// A frame for a peer OSD.
#[derive(Debug)]
pub struct PeerSend {
    pub to: OsdId,
    /// A PG the frame is about: the peer's shard (port) that hosts it receives the frame. A
    /// `RaftBatch` only holds PGs of that one shard.
    pub pg: PgId,
    pub req: Request,
}

/// Something the monitor must hear.
#[derive(Clone, Debug)]
pub enum Report {
    /// This OSD leads `pg` (or changed its configuration as leader).
    LeaderElected { pg: PgId, req: LeaderElectedRequest },
    /// This OSD leads `pg` and its configuration reached the monitor's target.
    MembershipFinished {
        pg: PgId,
        req: MembershipFinishedRequest,
    },
    /// This OSD leads `pg`, which applied reclaim entry `id`: the monitor may count the PG
    /// done (see [`crate::reclaim`]).
    ReclaimDone { pg: PgId, id: u64 },
    /// This OSD leads `pg`, which applied the mark of snapshot `snap` of `image` (see
    /// [`crate::snaps`]).
    SnapMarked {
        pg: PgId,
        image: fastblock_types::ImageId,
        snap: u64,
    },
    /// This OSD leads `pg`, which applied snapshot trim entry `id`.
    SnapTrimmed { pg: PgId, id: u64 },
    /// The shard stopped serving (an I/O error or a corrupt log): the OSD must stop.
    Fatal(ShardFailure),
}

impl Report {
    /// The report as the monitor takes it, `None` for [`Report::Fatal`] (the OSD's own
    /// business).
    pub fn to_monitor(&self) -> Option<fastblock_types::api::OsdReport> {
        use fastblock_types::api::OsdReport;
        Some(match self {
            Report::LeaderElected { pg, req } => OsdReport::LeaderElected {
                pg: *pg,
                req: req.clone(),
            },
            Report::MembershipFinished { pg, req } => OsdReport::MembershipFinished {
                pg: *pg,
                req: req.clone(),
            },
            Report::ReclaimDone { pg, id } => OsdReport::ReclaimDone { pg: *pg, id: *id },
            Report::SnapMarked { pg, image, snap } => OsdReport::SnapMarked {
                pg: *pg,
                image: *image,
                snap: *snap,
            },
            Report::SnapTrimmed { pg, id } => OsdReport::SnapTrimmed { pg: *pg, id: *id },
            Report::Fatal(_) => return None,
        })
    }
}

/// A committed entry this replica applied (recorded only with
/// [`crate::ShardConfig::record_applies`], for the simulator's checker).
#[derive(Clone, Debug)]
pub struct AppliedRecord {
    pub pg: PgId,
    pub index: u64,
    /// Its term, read from the log before it was applied.
    pub term: u64,
    pub apply: Apply,
    /// The raw entry of a no-op or configuration change (what the leader proposed).
    pub entry: Option<raft::eraftpb::Entry>,
}

/// Counters of rare paths, for the simulator's coverage probes and the OSD's logs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Probes {
    /// The WAL was full: transfers abandoned and everything applied compacted.
    pub wal_full: u64,
    /// A hard state moved only the commit index: no fdatasync of its own (MustSync).
    pub must_sync_skipped: u64,
    pub transfers_started: u64,
    pub transfers_abandoned: u64,
    /// `MsgSnapshot`s dropped because their objects were not staged.
    pub snapshots_unstaged: u64,
    /// A flush became durable while a WAL commit was submitted and not yet durable.
    pub flush_done_during_commit: u64,
    /// A WAL commit was written while an earlier one was not yet durable.
    pub commits_overlapped: u64,
    /// Writes refused because their PG's unreleased log reached its limit.
    pub pg_log_full: u64,
    /// Free WAL segments fell to the reserve: everything applied was compacted.
    pub wal_pressure: u64,
    /// A PG's live entries were moved forward to free the oldest WAL segment.
    pub log_rewrites: u64,
    /// The entries pinning the oldest segment did not fit the free space.
    pub log_rewrites_skipped: u64,
    /// Requests answered `StaleEpoch`.
    pub stale_epoch: u64,
    /// Mutations a leader refused because they named another term than its own (or none).
    pub stale_term: u64,
    /// Pending mutations dropped by a leader change (their outcome unknown to the client).
    pub writes_dropped: u64,
    /// Appends whose entries did not all fit the WAL's room and were trimmed.
    pub appends_trimmed: u64,
    /// Reclaims this shard led to the end (applied on the leader, reported).
    pub reclaims_applied: u64,
    /// Requests refused by the map's image table (removed image, beyond its size, or a map
    /// behind the request's).
    pub fenced: u64,
    /// Writes held until their PG's new leader applied the log it inherited.
    pub held_for_term: u64,
    /// Snapshots a member refused for lack of space (this shard sending).
    pub backfill_too_full: u64,
    /// Snapshots this shard refused to receive for lack of space.
    pub backfill_refused: u64,
    /// Steps that read more than one client read in one batch.
    pub reads_batched: u64,
    /// Read batches that failed and were retried one read at a time.
    pub read_batches_retried: u64,
}

/// What one step produced.
#[derive(Debug, Default)]
pub struct Effects {
    /// Replies to connections: (connection, request id, reply).
    pub replies: Vec<(ConnId, u64, Reply)>,
    /// Frames to peers, in the order they must leave.
    pub peers: Vec<PeerSend>,
    pub reports: Vec<Report>,
    /// Every PG event, in order (the simulator checks them; the OSD logs them in the core).
    pub events: Vec<(PgId, Event)>,
    /// Log records are staged: after carrying out these effects (so a leader's appends and
    /// the replies leave before its own fdatasync), step `Input::WalCommit`.
    pub wal_commit_due: bool,
    /// A WAL commit was submitted. Unless the disk synced it at once (then the core already
    /// completed it: [`crate::ShardCore::commits_in_flight`] says), step `Input::WalDurable`
    /// when the disk reports a completion.
    pub wal_commit_submitted: Option<CommitStats>,
    /// A flush was handed to the flush runner: expect `Input::FlushDone`.
    pub flush_started: bool,
    /// Stage timings: (stage, microseconds).
    pub stages: Vec<(Stage, u64)>,
    pub probes: Probes,
    /// PGs opened, with their applied index; PGs removed with their data.
    pub opened: Vec<(PgId, u64)>,
    pub removed: Vec<PgId>,
    /// Snapshots installed: (PG, index).
    pub snapshots_installed: Vec<(PgId, u64)>,
    pub applied: Vec<AppliedRecord>,
}

/// One WAL commit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommitStats {
    /// Log entries it carries.
    pub entries: usize,
}

impl Effects {
    pub(crate) fn stage(&mut self, stage: Stage, from: Micros, to: Micros) {
        self.stages.push((stage, to.since(from)));
    }
}

//! The shard core: private state and [`ShardCore::step`].
//!
//! One step handles its input, then runs rounds until the PGs are quiet or a WAL commit is
//! needed. A round:
//!
//! 1. collects every PG's output: replies, events, Raft messages, log writes, committed
//!    entries, snapshots to send;
//! 2. applies committed entries to the object store (no sync: the WAL holds them until the
//!    next flush) and answers their clients: they are durable on a majority already;
//! 3. queues the Raft messages (a leader's appends leave before its own log write, so the
//!    followers' fdatasync overlaps ours);
//! 4. stages every PG's log write in the WAL. When a record needs a sync, the step ends with
//!    [`Effects::wal_commit_due`]: the runtime carries out the effects, then steps
//!    `WalCommit` (one write, one fdatasync for all PGs: group commit, submitted without
//!    waiting) and, when the disk reports completions, `WalDurable`: each round whose LSN is
//!    now durable tells its replicas (`on_persisted`), oldest first, and the next rounds run.
//!    A hard state that moves only the commit index needs no sync of its own (etcd's
//!    MustSync rule): the round completes with the newest commit in flight, or at once.
//!
//! Inputs that arrive while a commit is due, or while `wal_commits_in_flight_max` are in
//! flight, wait in the core (ticks and flush timers coalesced, only the newest map kept) and
//! are handled once one completes.
//!
//! A store error stops the shard (fail-stop): every pending and later client request gets
//! the retryable `NotReady` (the PGs' other replicas serve them once they take over), and
//! [`Report::Fatal`] tells the runtime so the OSD exits.

use crate::config::ShardConfig;
use crate::error::{Operation, ShardFailure};
use crate::io::{AppliedRecord, ConnId, Effects, Input, MetricsClock, Micros, Report};
use crate::recovery::Recovery;
use crate::stage::Stage;
use fastblock_pg::{
    Apply, ClientOp, Event, LeaderReport, LogWrite, OpId, OpOutcome, Output, PgError, PgReplica,
};
use fastblock_store::{Disk, PgStorage, Store};
use fastblock_types::api::{LeaderElectedRequest, MembershipFinishedRequest, PgIoCounters};
use fastblock_types::clone_data::CopyUpTarget;
use fastblock_types::map::ClusterMap;
use fastblock_types::{Epoch, LogIndex, OsdId, PgId};
use fastblock_wire::{LeaderHint, ObjectAddr, RaftEnvelope, Reply, Request, Status};
use protobuf::Message as _;
use raft::GetEntriesContext;
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::rc::Rc;
use std::sync::Arc;

/// Client operations in flight per connection before `Busy`.
pub const CONN_INFLIGHT_OPS_MAX: usize = 4096;
/// Rounds one step may run before the core declares that its PGs never settle (a bug).
const ROUNDS_PER_STEP_MAX: usize = 10_000;

pub struct HostedPg<D: Disk> {
    pub replica: PgReplica<PgStorage<D>>,
    pub io: PgIoCounters,
    /// The newest map epoch among the reclaims this replica applied since it was opened
    /// (`crate::reclaim`): a map older than that must not admit IO. A restart fetches a map
    /// at least that new.
    pub reclaim_epoch: Epoch,
}

pub(crate) enum OpKind {
    Mutation {
        /// The range the mutation covers (counted as written bytes).
        bytes: u64,
        /// Data it carries in its log entry (a write's bytes; a discard carries a range
        /// only), counted in `pending_mutation_bytes` until it is answered.
        log_bytes: u64,
        /// Data-region space it may take when applied (see [`crate::space`]), counted in
        /// `pending_space_bytes` until it is answered.
        space_bytes: u64,
    },
    Read {
        addr: ObjectAddr,
        offset: u32,
        length: u32,
    },
    /// A block-status query: runs behind the same read barrier as a read.
    Allocation {
        addr: ObjectAddr,
        offset: u32,
        length: u32,
    },
    /// A read of an image snapshot: behind the same read barrier as a read.
    SnapRead {
        addr: ObjectAddr,
        offset: u32,
        length: u32,
        snap: u64,
    },
    /// A read of a clone's object if it holds its own copy (else `ObjectAbsent`).
    CloneRead {
        addr: ObjectAddr,
        offset: u32,
        length: u32,
    },
    /// A reclaim the shard proposed itself (no client waits for it).
    Reclaim { id: u64 },
    /// A snapshot mark the shard proposed itself.
    SnapMark {
        image: fastblock_types::ImageId,
        snap: u64,
    },
    /// A snapshot trim the shard proposed itself.
    SnapTrim { id: u64 },
    /// A bad block's repair the shard proposed itself (`crate::repair`).
    Repair { block: crate::repair::BlockRef },
}

pub(crate) struct PendingOp {
    pub conn: ConnId,
    pub request_id: u64,
    pub pg: PgId,
    pub kind: OpKind,
    /// When the request was read, and when it was proposed (or its read index asked).
    pub arrived: Micros,
    pub started: Micros,
    /// The log index its entry gets, if it goes through the log (set by `new_op`: the
    /// leader appends a proposal right after its last entry).
    pub log_index: u64,
}

/// The WAL commit cycle: at most one round staged and waiting for `WalCommit`, then up to
/// `wal_commits_in_flight_max` submitted and waiting until the store reports their LSNs
/// durable, oldest first. The store reports durability in submission order, so rounds
/// complete in order: a round is persisted only when it and every round before it are.
#[derive(Default)]
struct Commits {
    due: Option<Round>,
    in_flight: VecDeque<Round>,
}

/// What a round left to do once its log writes are durable.
struct Round {
    /// The WAL LSN that makes this round durable (set when its commit is submitted).
    lsn: u64,
    /// When its commit was submitted, by the metrics clock (`Stage::WalCommit` runs from
    /// here to when the core hears it durable).
    submitted: Micros,
    /// Highest ready number staged per PG.
    persisted: Vec<(PgId, u64)>,
    /// Snapshots installed by this round: (PG, index).
    installed: Vec<(PgId, u64)>,
    entries: usize,
}

/// Inputs that arrived while a commit was due or in flight.
#[derive(Default)]
struct Deferred {
    /// In arrival order, with at most one tick among them (see `handle`).
    inputs: VecDeque<Input>,
    /// A tick is in `inputs`.
    tick: bool,
    flush: bool,
    map: Option<Arc<ClusterMap>>,
}

pub struct ShardCore<D: Disk + 'static> {
    pub(crate) cfg: ShardConfig,
    pub(crate) store: Rc<RefCell<Store<D>>>,
    pub(crate) pgs: BTreeMap<PgId, HostedPg<D>>,
    pub(crate) map: Arc<ClusterMap>,
    pub(crate) conn_inflight: BTreeMap<ConnId, usize>,
    next_op: u64,
    pub(crate) ops: BTreeMap<u64, PendingOp>,
    /// Data bytes of the writes in `ops` (proposed here, not yet answered): bounded by
    /// `wal_fit::uncommitted_bytes_max` at admission.
    pub(crate) pending_mutation_bytes: u64,
    /// The same per PG: bounded by `wal_fit::pg_uncommitted_bytes_max`.
    pub(crate) pg_pending_bytes: BTreeMap<PgId, u64>,
    /// Data-region space the mutations in `ops` may take when applied (writes, copy-ups,
    /// rollbacks, the partial blocks of discards): see [`crate::space`].
    pub(crate) pending_space_bytes: u64,
    /// The last sample of the host file system's free bytes (`Input::HostSpace`; None before
    /// the first): see [`crate::space`].
    pub(crate) host_free_bytes: Option<u64>,
    pub(crate) failed: Option<ShardFailure>,
    pub(crate) applied_since_flush: bool,
    pub(crate) recovery: Recovery,
    pub(crate) reclaims: crate::reclaim::Reclaims,
    pub(crate) snap_ops: crate::snaps::SnapOps,
    pub(crate) repairs: crate::repair::Repairs,
    /// Client IO and recovery since the shard started (`crate::totals`).
    pub(crate) io_totals: crate::totals::IoTotals,
    pub(crate) scrubs: crate::scrub::Scrubs,
    /// Leader and membership reports waiting until the WAL is durable up to the LSN staged
    /// when they were made (see `hold_report`).
    held_reports: VecDeque<(u64, Report)>,
    /// Outputs of the PGs not yet processed by a round.
    pub(crate) outs: BTreeMap<PgId, Output>,
    commits: Commits,
    deferred: Deferred,
    /// Client reads whose barrier passed in this step, read together at its end.
    pub(crate) ready_reads: crate::reads::ReadyReads,
    /// When the last apply batch started: the commit time of the writes it completes.
    apply_started: Micros,
    /// When the flush being committed began, and the WAL segment written then.
    pub(crate) flush_started: Option<Micros>,
    pub(crate) flush_wal_seq: u64,
    /// A flush is due and waits for the WAL to go idle, since this time (see
    /// `ShardCore::maybe_flush`).
    pub(crate) flush_wanted_since: Option<Micros>,
    /// The time of the step being run.
    pub(crate) now: Micros,
    /// Highest ready number handed to each replica's `on_persisted` (must increase).
    persisted_numbers: BTreeMap<PgId, u64>,
    /// Each replica's commit index when a round last saw it (must never decrease).
    commit_indexes: BTreeMap<PgId, u64>,
    clock: MetricsClock,
    /// The op tracker's record of when each PG's log became durable here, and the slowest
    /// completed ops (`crate::optrack`).
    pub(crate) persist_times: BTreeMap<PgId, crate::optrack::PersistTimes>,
    pub(crate) history: crate::optrack::History,
}

impl<D: Disk + 'static> ShardCore<D> {
    /// A core over an open store. It hosts no PG until the first map arrives.
    pub fn new(cfg: ShardConfig, store: Store<D>, clock: MetricsClock) -> ShardCore<D> {
        assert!(
            cfg.count > 0 && cfg.index < cfg.count,
            "shard index out of range"
        );
        let recovery = Recovery::new(cfg.recovery, cfg.transfer_id_base);
        ShardCore {
            cfg,
            store: Rc::new(RefCell::new(store)),
            pgs: BTreeMap::new(),
            map: Arc::new(ClusterMap::default()),
            conn_inflight: BTreeMap::new(),
            next_op: 1,
            ops: BTreeMap::new(),
            pending_mutation_bytes: 0,
            pg_pending_bytes: BTreeMap::new(),
            pending_space_bytes: 0,
            host_free_bytes: None,
            failed: None,
            applied_since_flush: false,
            recovery,
            reclaims: Default::default(),
            snap_ops: Default::default(),
            repairs: Default::default(),
            io_totals: Default::default(),
            scrubs: Default::default(),
            held_reports: VecDeque::new(),
            outs: BTreeMap::new(),
            commits: Commits::default(),
            deferred: Deferred::default(),
            ready_reads: Default::default(),
            apply_started: Micros(0),
            flush_started: None,
            flush_wanted_since: None,
            flush_wal_seq: 0,
            now: Micros(0),
            persisted_numbers: BTreeMap::new(),
            commit_indexes: BTreeMap::new(),
            clock,
            persist_times: BTreeMap::new(),
            history: Default::default(),
        }
    }

    /// Handles one input at `now`, then runs rounds until the PGs are quiet or a WAL commit
    /// is due.
    pub fn step(&mut self, input: Input, now: Micros) -> Effects {
        self.step_batch(std::iter::once(input), now)
    }

    /// [`ShardCore::step`] for several inputs at once: their PGs' work shares the rounds
    /// (and so the WAL commits) that follow. The OSD hands over everything its sockets
    /// delivered since the last step; the simulator one input at a time.
    pub fn step_batch(&mut self, inputs: impl IntoIterator<Item = Input>, now: Micros) -> Effects {
        assert!(
            now >= self.now,
            "time went backwards: {now:?} < {:?}",
            self.now
        );
        self.now = now;
        let mut eff = Effects::default();
        for input in inputs {
            self.handle(input, &mut eff);
        }
        self.settle(&mut eff);
        self.finish_reads(&mut eff);
        if self.drive_repairs(&mut eff) {
            self.settle(&mut eff);
            self.finish_reads(&mut eff);
        }
        assert!(
            self.ready_reads.is_empty(),
            "a step ends with its reads answered"
        );
        eff
    }

    /// The client requests waiting in the core to be taken (a WAL commit holds inputs back):
    /// (request id, request, when it was read).
    pub(crate) fn deferred_requests(&self) -> impl Iterator<Item = (u64, &Request, Micros)> {
        self.deferred.inputs.iter().filter_map(|input| match input {
            Input::Request {
                request_id,
                req,
                arrived,
                ..
            } => Some((*request_id, req, *arrived)),
            _ => None,
        })
    }

    /// Whether a WAL commit is due or in flight.
    pub fn commit_pending(&self) -> bool {
        self.commits.due.is_some() || !self.commits.in_flight.is_empty()
    }

    /// WAL commits written and not yet durable.
    pub fn commits_in_flight(&self) -> usize {
        self.commits.in_flight.len()
    }

    /// Whether no WAL commit is in flight or due and no log record waits for one: starting a
    /// flush now waits for no device flush of the WAL.
    pub(crate) fn wal_idle(&self) -> bool {
        self.commits.in_flight.is_empty()
            && self.commits.due.is_none()
            && self.store.borrow().wal().pending_bytes() == 0
    }

    /// Whether new inputs would only wait in the core until a WAL commit completes: as many
    /// commits are in flight as the configuration allows. A runtime may then block on the
    /// disk rather than read inputs it cannot hand over yet.
    pub fn inputs_wait_for_commit(&self) -> bool {
        self.commits.due.is_none() && self.commit_blocks()
    }

    /// The disk, for a runtime that waits on its completions between steps (the OSD waits on
    /// its io_uring while `inputs_wait_for_commit`). Not for submitting or reaping: the core
    /// does that when it steps `WalDurable`.
    pub fn with_disk<R>(&self, f: impl FnOnce(&mut D) -> R) -> R {
        f(self.store.borrow_mut().disk_mut())
    }

    /// Whether new inputs wait in the core: a commit is due (the runtime steps `WalCommit`
    /// next), or as many are in flight as the configuration allows.
    fn commit_blocks(&self) -> bool {
        self.commits.due.is_some()
            || self.commits.in_flight.len() >= self.cfg.wal_commits_in_flight_max.max(1)
    }

    /// IO counters of the PGs this shard leads, with their recovery progress.
    pub fn stats(&self) -> Vec<PgIoCounters> {
        self.pgs
            .iter()
            .filter(|(_, h)| h.replica.is_leader())
            .map(|(pg, h)| {
                let (bytes, objects) = self.recovery.remaining(*pg);
                let usage = self.store.borrow().pg_usage(*pg);
                PgIoCounters {
                    pg: Some(*pg),
                    recovery_remaining_bytes: bytes,
                    recovery_remaining_objects: objects,
                    recovery_done_bytes: self.recovery.done_bytes(*pg),
                    objects: usage.objects,
                    stored_bytes: usage.blocks() * fastblock_types::units::BLOCK_SIZE_BYTES,
                    scrub: self.scrub_report(*pg),
                    ..h.io
                }
            })
            .collect()
    }

    /// What this shard's data region can still take before writes are refused for its
    /// reserve (nothing in flight counted): free plus what flushes give back, less the
    /// reserve (see [`crate::space`]). The OSD reports it for `df`'s `MAX AVAIL`.
    pub fn writable_bytes(&self) -> u64 {
        let store = self.store.borrow();
        (store.free_data_bytes() + store.pending_free_bytes())
            .saturating_sub(self.cfg.data_reserve_bytes)
    }

    /// The data space of this shard's store: (total bytes, free bytes).
    pub fn space(&self) -> (u64, u64) {
        let store = self.store.borrow();
        let total = store.superblock().data_blocks() * fastblock_types::units::BLOCK_SIZE_BYTES;
        (total, store.free_data_bytes())
    }

    /// Members that refused a snapshot of a PG this shard leads for lack of space.
    pub fn backfill_too_full(&self) -> Vec<fastblock_types::api::BackfillTooFull> {
        self.recovery.backfill_too_full()
    }

    pub(crate) fn metrics_now(&self) -> Micros {
        (self.clock)()
    }

    fn handle(&mut self, input: Input, eff: &mut Effects) {
        let blocked = self.commit_blocks();
        match input {
            Input::WalCommit => {
                assert!(self.commits.due.is_some(), "WalCommit without a commit due");
                self.commit_wal(eff)
            }
            Input::WalDurable => self.wal_durable(eff),
            Input::FlushDone => {
                // Compacting needs no round, so it never waits; a flush finishing while a WAL
                // commit is in flight (between a commit and the apply it allows) is one of
                // the interleavings the simulator explores.
                if !self.commits.in_flight.is_empty() {
                    eff.probes.flush_done_during_commit += 1;
                }
                self.poll_flush(eff);
            }
            // A sample is state, not work: it never waits behind a commit.
            Input::HostSpace { free_bytes } => self.on_host_space(free_bytes),
            Input::Rates {
                recovery_bytes_per_sec,
                scrub_deep_bytes_per_sec,
            } => self.on_rates(recovery_bytes_per_sec, scrub_deep_bytes_per_sec),
            input if !blocked => self.handle_now(input, eff),
            // A deferred tick keeps its place among the inputs: handled after a leader's
            // message that came after it, it would count as a tick *after* that message,
            // although it was due earlier, and shorten the follower's refusal to vote that a
            // lease relies on (`fastblock_types::lease`). Later ticks are dropped, which only
            // lengthens timeouts.
            Input::Tick if self.deferred.tick => {}
            Input::Tick => {
                self.deferred.tick = true;
                self.deferred.inputs.push_back(Input::Tick);
            }
            Input::FlushDue => self.deferred.flush = true,
            Input::Map(map) => self.deferred.map = Some(map),
            input => self.deferred.inputs.push_back(input),
        }
    }

    fn handle_now(&mut self, input: Input, eff: &mut Effects) {
        match input {
            Input::Request {
                conn,
                request_id,
                req,
                arrived,
            } => self.on_request(conn, request_id, req, arrived, eff),
            Input::BadRequest {
                conn,
                request_id,
                error,
            } => self.on_bad_request(conn, request_id, error, eff),
            Input::Closed { conn } => {
                self.conn_inflight.remove(&conn);
            }
            Input::Tick => self.tick(eff),
            Input::Map(map) => self.on_map(map, eff),
            Input::FlushDue => self.maybe_flush(eff),
            Input::FlushDone => self.poll_flush(eff),
            Input::Shutdown => self.shutdown(eff),
            Input::WalCommit
            | Input::WalDurable
            | Input::HostSpace { .. }
            | Input::Rates { .. } => {
                unreachable!("matched in handle")
            }
        }
    }

    fn tick(&mut self, eff: &mut Effects) {
        if self.failed.is_some() {
            return;
        }
        let now_ms = self.now.as_millis();
        for (pg, hosted) in self.pgs.iter_mut() {
            hosted
                .replica
                .tick(now_ms, self.outs.entry(*pg).or_default());
        }
        self.tick_recovery(eff);
        self.drive_reclaims(eff);
        self.drive_snaps(eff);
        self.drive_scrubs(eff);
    }

    /// Rounds until quiet or a commit is due; then, when idle, what waited for the commit,
    /// snapshot chunks within the rate limit, and an early flush if the WAL advanced.
    fn settle(&mut self, eff: &mut Effects) {
        loop {
            // A synchronous WAL commit of this step (a full batch, a flush) made the commits
            // in flight before it durable too.
            self.complete_durable(eff);
            self.run_rounds(eff);
            if self.commit_blocks() {
                return;
            }
            if self.admit_held(eff) {
                continue;
            }
            let d = std::mem::take(&mut self.deferred);
            if d.inputs.is_empty() && !d.tick && !d.flush && d.map.is_none() {
                break;
            }
            // After a commit, what queued up is handled together, as the OSD's loop drains
            // its sockets after a long fdatasync.
            if let Some(map) = d.map {
                self.on_map(map, eff);
            }
            for input in d.inputs {
                self.handle_now(input, eff);
            }
            if d.flush {
                self.maybe_flush(eff);
            }
        }
        // Recovery goes after client work, within its rate limit.
        self.pump_recovery(eff);
        if self.flush_wanted_since.is_some() {
            self.maybe_flush(eff);
        }
        // A flush begun while its data was still being written goes to the flusher once the
        // disk finished the writes (any step after that, at worst the next tick).
        if self.store.borrow().flush_awaits_writes() {
            self.poll_flush(eff);
        }
        self.flush_if_wal_advanced(eff);
        self.relieve_wal_pressure(eff);
        // A flush or a synchronous commit of this step may have made held reports durable.
        self.release_reports(eff);
        self.commit_for_reports(eff);
    }

    fn run_rounds(&mut self, eff: &mut Effects) {
        let mut rounds = 0;
        while !self.commit_blocks() && self.outs.values().any(|o| !o.is_empty()) {
            rounds += 1;
            assert!(
                rounds < ROUNDS_PER_STEP_MAX,
                "osd {} shard {}: PG outputs never settle",
                self.cfg.osd,
                self.cfg.index
            );
            self.round(eff);
        }
        self.outs.retain(|_, o| !o.is_empty());
    }

    /// One round: collect, stage log writes, apply and answer, queue Raft messages.
    fn round(&mut self, eff: &mut Effects) {
        let mut outs = std::mem::take(&mut self.outs);
        for pg in outs.keys() {
            if let Some(h) = self.pgs.get(pg) {
                let now = h.replica.commit_index().0;
                let before = self.commit_indexes.insert(*pg, now).unwrap_or(0);
                assert!(now >= before, "pg {pg}: commit index {now} after {before}");
            }
        }
        let mut raft_out: BTreeMap<(OsdId, u16), (PgId, Vec<RaftEnvelope>)> = BTreeMap::new();
        let mut writes = Vec::new();
        let mut applies = Vec::new();
        let mut snapshots = Vec::new();
        let mut events = Vec::new();
        for (pg, out) in outs.iter_mut() {
            snapshots.extend(out.snapshots.drain(..).map(|m| (*pg, m)));
            for msg in out.messages.drain(..) {
                debug_assert_ne!(
                    msg.get_msg_type(),
                    raft::eraftpb::MessageType::MsgSnapshot,
                    "snapshots go through Output::snapshots"
                );
                let to = OsdId(msg.to as u32);
                // Peers' shards are told apart by port; one batch per (OSD, port).
                let port = self.map.osds.get(&to).map_or(0, |o| o.port_for(*pg));
                match msg.write_to_bytes() {
                    Ok(bytes) => raft_out
                        .entry((to, port))
                        .or_insert_with(|| (*pg, Vec::new()))
                        .1
                        .push(RaftEnvelope {
                            pg: *pg,
                            msg: bytes.into(),
                        }),
                    Err(e) => tracing::error!(%pg, "encoding a raft message: {e}"),
                }
            }
            for (op, outcome) in out.replies.drain(..) {
                self.complete(op, outcome, eff);
            }
            events.extend(out.events.drain(..).map(|e| (*pg, e)));
            if !out.log_writes.is_empty() {
                writes.push((*pg, std::mem::take(&mut out.log_writes)));
            }
            if !out.apply.is_empty() {
                applies.push((*pg, std::mem::take(&mut out.apply)));
            }
        }
        // Snapshot transfers are planned before this step applies anything: raft-rs took the
        // snapshot's index when it made the message, and the image snapshot states a transfer
        // carries must be as of that index (`recovery.rs`).
        for (pg, msg) in snapshots {
            self.on_snapshot_request(pg, msg, eff);
        }
        // Log writes are staged before anything is applied: the hard state of this round may
        // carry the commit index its entries are applied by (a follower learns it from the
        // next append), and the store may flush in this round (a snapshot installed for
        // another PG, a full data region while applying). A flush commits what the WAL has
        // staged first, so staged before the apply, the commit index is durable with the
        // applied index; staged after it, the flush made the applied index durable and a
        // crash before the next WAL commit left it past the log's commit index, which raft-rs
        // refuses at open (found by the simulator, seed 249999389376033725). Staging syncs
        // nothing (a batch that fills is written early, which only makes it durable sooner):
        // the round's commit is a step of its own, after this one's messages and replies.
        self.stage_writes(writes, eff);
        // Then apply and answer: committed entries are durable on a majority already
        // (raft-rs hands out only committed entries that are also persisted here), so their
        // clients wait neither for this round's Raft messages nor for the fdatasync of newer
        // entries or of a hard state.
        let applied = self.apply(applies, eff);
        for (pg, index) in applied {
            if let Some(h) = self.pgs.get_mut(&pg) {
                let out = self.outs.entry(pg).or_default();
                h.replica.on_applied(index, out);
                for (op, outcome) in std::mem::take(&mut out.replies) {
                    self.complete(op, outcome, eff);
                }
            }
        }
        // Raft messages leave with the step's effects, before the runtime steps the WAL
        // commit: a leader's appends go out before its own fdatasync, so the followers'
        // overlaps it.
        for ((to, _), (pg, msgs)) in raft_out {
            eff.peers.push(crate::io::PeerSend {
                to,
                pg,
                req: Request::RaftBatch {
                    from: self.cfg.osd,
                    to,
                    msgs,
                },
            });
        }
        // Events once this round's log writes are staged (above): a leader or membership report is
        // held until everything staged before it is durable (`hold_report`), and the
        // configuration it names was applied from a commit index that the hard state of this
        // very round carries. Held before that hard state was staged, the report left at once
        // while the commit index (which needs no sync of its own) was not durable; the leader
        // crashed, came back with the joint configuration it had reported leaving, and needed
        // the vote of the member the monitor had dropped by the report (simulator seed
        // 3856582366863085052 with --membership).
        for (pg, event) in events {
            self.on_event(pg, event, eff);
        }
    }

    /// Stages every PG's log write in the WAL. If a record needs a sync, the commit becomes
    /// due; otherwise the replicas hear at once that their writes are persisted.
    fn stage_writes(&mut self, writes: Vec<(PgId, Vec<LogWrite>)>, eff: &mut Effects) {
        if writes.is_empty() || self.failed.is_some() {
            return;
        }
        // Snapshots installed by an attempt (pg, index): a retry after a full WAL must not
        // install one again, since the first install consumed its staging, and a second
        // would replace the PG's objects with nothing.
        let mut installed = BTreeSet::new();
        let mut result = self.stage_once(&writes, &mut installed, eff);
        if let Err(fastblock_store::Error::NoSpace {
            area: fastblock_store::SpaceArea::Wal,
            ..
        }) = &result
        {
            // The WAL is full of entries kept for lagging followers or behind snapshots being
            // sent: abandon the transfers (Raft asks again later, from a newer index), flush,
            // compact everything applied, and retry once (seed 7164261484067460021). What the
            // failed attempt appended is appended again, the same entries replacing
            // themselves; but a snapshot it installed stays installed and consumed its
            // staging, so the retry skips it (`installed`) instead of replacing the PG's
            // objects with nothing.
            let abandoned = self.abandon_all_sends();
            eff.probes.wal_full += 1;
            eff.probes.transfers_abandoned += abandoned as u64;
            tracing::warn!(osd = %self.cfg.osd, shard = self.cfg.index, transfers_abandoned = abandoned, "WAL full; compacting all applied entries");
            let compacted = self
                .flush_and_compact(crate::flush::Keep::Nothing)
                .map_err(|e| ShardFailure::store(Operation::Flush, None, e));
            result = match compacted {
                Ok(()) => self.stage_once(&writes, &mut installed, eff),
                Err(f) => {
                    self.fail(f, eff);
                    return;
                }
            };
        }
        match result {
            Ok((round, true)) => {
                self.commits.due = Some(round);
                eff.wal_commit_due = true;
            }
            // Nothing to sync, but a round is durable only once every round before it is:
            // with a commit still in flight, this one completes with it (a follower must not
            // acknowledge entries of that earlier round before they are durable). Found by the
            // simulator (seed 17628629206118725206).
            Ok((round, false)) => match self.commits.in_flight.back_mut() {
                Some(last) => {
                    last.persisted.extend(round.persisted);
                    last.installed.extend(round.installed);
                }
                None => self.persisted(round, eff),
            },
            Err(e) => self.fail(ShardFailure::store(Operation::WalCommit, None, e), eff),
        }
    }

    /// Appends the records; returns the round and whether it needs a sync. `installed`
    /// holds the snapshots installed so far, by this attempt or an earlier one of the round.
    fn stage_once(
        &mut self,
        writes: &[(PgId, Vec<LogWrite>)],
        installed: &mut BTreeSet<(PgId, u64)>,
        eff: &mut Effects,
    ) -> fastblock_store::Result<(Round, bool)> {
        let mut round = Round {
            lsn: 0,
            submitted: Micros(0),
            persisted: Vec::new(),
            installed: Vec::new(),
            entries: 0,
        };
        let mut store = self.store.borrow_mut();
        let batch_bytes_max = store.superblock().batch_bytes_max;
        let mut needs_sync = false;
        for (pg, list) in writes {
            let mut last = 0;
            for w in list {
                if let Some(snap) = &w.snapshot {
                    // Replaces the PG's objects with the staged ones (made durable here, in
                    // one metadata commit) and restarts its log after the snapshot.
                    let md = snap.get_metadata();
                    if !installed.contains(&(*pg, md.index)) {
                        with_room(&mut store, |s| {
                            s.install_snapshot(*pg, md.index, md.term, md.get_conf_state())
                        })?;
                        installed.insert((*pg, md.index));
                    }
                    round.installed.push((*pg, md.index));
                    needs_sync = true;
                }
                // Entries go in runs that fit one WAL batch (by bytes), so that many large
                // entries fill several batches instead of overflowing one.
                for chunk in crate::wal_fit::batches(&w.entries, batch_bytes_max) {
                    with_room(&mut store, |s| s.append_entries(*pg, chunk))?;
                    round.entries += chunk.len();
                    needs_sync = true;
                }
                if let Some(hs) = &w.hard_state {
                    // As etcd's raft `MustSync`: a hard state that moves only the commit index
                    // needs no fdatasync of its own (a lost commit index is learnt again from
                    // the leader; term and vote must be durable before any message that
                    // depends on them leaves). It rides with the next commit, and the store
                    // commits it before any flush; staged before the entries it commits are
                    // applied (`round`), a flushed applied index never runs ahead of the
                    // durable commit index.
                    let prev = store
                        .pg_log(*pg)
                        .map(|l| (l.hard_state.term, l.hard_state.vote));
                    with_room(&mut store, |s| s.set_hard_state(*pg, hs))?;
                    if prev == Some((hs.term, hs.vote)) {
                        eff.probes.must_sync_skipped += 1;
                    } else {
                        needs_sync = true;
                    }
                }
                assert!(
                    w.ready_number > last,
                    "pg {pg}: ready numbers must increase ({} after {last})",
                    w.ready_number
                );
                last = w.ready_number;
            }
            round.persisted.push((*pg, last));
        }
        Ok((round, needs_sync))
    }

    /// `Input::WalCommit`: one write and one sync for everything staged, submitted without
    /// waiting. A disk that syncs synchronously completes the round at once.
    fn commit_wal(&mut self, eff: &mut Effects) {
        let mut round = self.commits.due.take().expect("checked by handle");
        if self.failed.is_some() {
            return;
        }
        let start = self.metrics_now();
        let r = self.store.borrow_mut().commit_submit();
        match r {
            Ok(lsn) => {
                eff.wal_commit_submitted = Some(crate::io::CommitStats {
                    entries: round.entries,
                });
                round.submitted = start;
                assert!(
                    self.commits.in_flight.back().is_none_or(|r| r.lsn <= lsn),
                    "commit LSNs must not go back"
                );
                round.lsn = lsn;
                self.commits.in_flight.push_back(round);
                if self.commits.in_flight.len() > 1 {
                    eff.probes.commits_overlapped += 1;
                }
                self.wal_durable(eff);
            }
            Err(e) => self.fail(ShardFailure::store(Operation::WalCommit, None, e), eff),
        }
    }

    /// `Input::WalDurable` (the disk finished something): collects the finished commits and
    /// tells the replicas of every round now durable that their writes are persisted.
    fn wal_durable(&mut self, eff: &mut Effects) {
        if self.failed.is_some() || self.commits.in_flight.is_empty() {
            return;
        }
        let r = self.store.borrow_mut().commit_reap();
        match r {
            Ok(_) => self.complete_durable(eff),
            Err(e) => self.fail(ShardFailure::store(Operation::WalCommit, None, e), eff),
        }
    }

    /// Completes the rounds in flight whose LSN the store knows durable, oldest first.
    fn complete_durable(&mut self, eff: &mut Effects) {
        if self.failed.is_some() {
            return;
        }
        let durable = self.store.borrow().wal().durable_lsn();
        while self
            .commits
            .in_flight
            .front()
            .is_some_and(|r| r.lsn <= durable)
        {
            let round = self.commits.in_flight.pop_front().expect("checked");
            let now = self.metrics_now();
            eff.stage(Stage::WalCommit, round.submitted, now);
            self.persisted(round, eff);
        }
        self.release_reports(eff);
    }

    fn persisted(&mut self, round: Round, eff: &mut Effects) {
        for (pg, index) in round.installed {
            tracing::info!(%pg, index, "snapshot installed");
            self.snapshot_installed(pg);
            eff.snapshots_installed.push((pg, index));
        }
        for (pg, number) in round.persisted {
            let Some(h) = self.pgs.get_mut(&pg) else {
                continue;
            };
            let before = self.persisted_numbers.insert(pg, number).unwrap_or(0);
            assert!(
                number > before,
                "pg {pg}: persisted ready number {number} after {before}"
            );
            let commit_before = h.replica.commit_index();
            let persisted_before = h.replica.raw_node().raft.raft_log.persisted;
            h.replica
                .on_persisted(number, self.outs.entry(pg).or_default());
            let persisted = h.replica.raw_node().raft.raft_log.persisted;
            if persisted > persisted_before {
                let now = (self.clock)();
                self.persist_times
                    .entry(pg)
                    .or_default()
                    .advanced(persisted, now);
            }
            assert!(
                h.replica.commit_index() >= commit_before,
                "pg {pg}: commit index went back"
            );
        }
    }

    /// Applies committed entries to the object store (staged; durable at the next flush).
    /// Returns the last applied index per PG.
    fn apply(
        &mut self,
        applies: Vec<(PgId, Vec<Apply>)>,
        eff: &mut Effects,
    ) -> Vec<(PgId, LogIndex)> {
        if applies.is_empty() || self.failed.is_some() {
            return Vec::new();
        }
        if self.cfg.record_applies {
            self.record_applies(&applies, eff);
        }
        let mut done = Vec::new();
        let mut failure = None;
        let mut reclaim_epochs = Vec::new();
        self.apply_started = self.now;
        let start = self.metrics_now();
        {
            let mut store = self.store.borrow_mut();
            for (pg, list) in &applies {
                let h = self.pgs.get(pg);
                let (applied_before, committed, persisted) = h.map_or((0, 0, 0), |h| {
                    let log = &h.replica.raw_node().raft.raft_log;
                    (h.replica.applied().0, log.committed, log.persisted)
                });
                // The commit index the WAL holds for the PG (durable or staged for the next
                // commit, which any flush makes first).
                let staged_commit = store.pg_log(*pg).map_or(0, |l| l.hard_state.commit);
                let mut last = None;
                for a in list {
                    // Applied ≤ committed (durable on a majority) and ≤ persisted here, in log
                    // order without gaps: nothing is acknowledged before it is durable.
                    let index = a.index().0;
                    assert!(
                        index <= committed && index <= persisted,
                        "pg {pg}: applying {index} beyond the commit index {committed} or the \
                         persisted index {persisted}"
                    );
                    // And ≤ the commit index in the WAL: a flush makes the applied index
                    // durable, and after a crash raft-rs opens the PG only if it is within
                    // the log's commit index (see `round`).
                    assert!(
                        index <= staged_commit,
                        "pg {pg} osd {}: applying {index} beyond the commit index {staged_commit} \
                         the WAL holds (raft's is {committed}): its hard state was not staged first",
                        self.cfg.osd
                    );
                    // Contiguous, from the replica's applied index on: a snapshot's install
                    // moved that index to the snapshot's before these applies (`persisted`
                    // runs first), so nothing may jump over an entry. A skipped entry would
                    // leave this replica without a committed write and serving the block's
                    // older value; fail-stop instead (1,600 simulator seeds with
                    // `--membership` and `--bad-blocks` never met a jump).
                    let expected = last.map_or(applied_before + 1, |l: LogIndex| l.0 + 1);
                    assert!(
                        index == expected,
                        "pg {pg} osd {}: applying {index}, expected {expected} (applied before: \
                         {applied_before})",
                        self.cfg.osd
                    );
                    if let Apply::Op {
                        op: ClientOp::Reclaim { epoch, .. },
                        ..
                    } = a
                    {
                        reclaim_epochs.push((*pg, Epoch(*epoch)));
                    }
                    if let Apply::Op {
                        op:
                            ClientOp::Write {
                                object: o,
                                offset,
                                data,
                            },
                        ..
                    } = a
                    {
                        // Off unless asked for (`fastblock_io=debug`): with the read trace in
                        // `reads.rs`, what a stale read's diagnosis needs.
                        tracing::debug!(
                            target: "fastblock_io", %pg, index, image = %o.image,
                            object = o.index, offset, len = data.len(), "write applied"
                        );
                    }
                    let r = match a {
                        Apply::Op { op, .. } => apply_op(&mut store, *pg, op),
                        Apply::Noop {
                            conf_state: Some(cs),
                            ..
                        } => store.set_conf_state(*pg, cs),
                        Apply::Noop { .. } => Ok(()),
                    };
                    if let Err(e) = r {
                        failure = Some(ShardFailure::store(Operation::Apply, Some(*pg), e));
                        break;
                    }
                    last = Some(a.index());
                }
                if failure.is_some() {
                    break;
                }
                if let Some(index) = last {
                    if let Err(e) = store.set_applied(*pg, index.0) {
                        failure = Some(ShardFailure::store(Operation::Apply, Some(*pg), e));
                        break;
                    }
                    done.push((*pg, index));
                }
            }
        }
        for (pg, epoch) in reclaim_epochs {
            if let Some(h) = self.pgs.get_mut(&pg) {
                h.reclaim_epoch = h.reclaim_epoch.max(epoch);
            }
        }
        if let Some(f) = failure {
            self.fail(f, eff);
            return Vec::new();
        }
        self.applied_since_flush = true;
        eff.stages
            .push((Stage::Apply, self.metrics_now().since(start)));
        done
    }

    /// The checker's record, taken before the store is borrowed for applying (raft reads
    /// terms through `PgStorage`, which borrows it too).
    fn record_applies(&self, applies: &[(PgId, Vec<Apply>)], eff: &mut Effects) {
        for (pg, list) in applies {
            let log = self
                .pgs
                .get(pg)
                .map(|h| &h.replica.raw_node().raft.raft_log);
            for a in list {
                let index = a.index().0;
                let term = log.and_then(|l| l.term(index).ok()).unwrap_or(0);
                let entry = match a {
                    Apply::Op { .. } => None,
                    Apply::Noop { .. } => log
                        .and_then(|l| {
                            l.slice(index, index + 1, None, GetEntriesContext::empty(false))
                                .ok()
                        })
                        .and_then(|es| es.into_iter().next()),
                };
                eff.applied.push(AppliedRecord {
                    pg: *pg,
                    index,
                    term,
                    apply: a.clone(),
                    entry,
                });
            }
        }
    }

    pub(crate) fn fail(&mut self, failure: ShardFailure, eff: &mut Effects) {
        if self.failed.is_some() {
            return;
        }
        tracing::error!(osd = %self.cfg.osd, shard = self.cfg.index, "shard failed: {failure}");
        self.failed = Some(failure.clone());
        // The rounds waiting for a commit are dropped: this step must not ask for one (a
        // failure after the rounds, in the step's reads or repairs, would otherwise have the
        // runtime step `WalCommit` with nothing due).
        self.commits = Commits::default();
        eff.wal_commit_due = false;
        let ops: Vec<u64> = self.ops.keys().copied().collect();
        for op in ops {
            self.complete(
                OpId(op),
                OpOutcome::Failed(PgError::Failed(failure.to_string())),
                eff,
            );
        }
        eff.reports.push(Report::Fatal(failure));
    }

    fn shutdown(&mut self, eff: &mut Effects) {
        if self.failed.is_some() {
            return;
        }
        let start = self.metrics_now();
        let keep = self.routine_keep();
        if let Err(e) = self.flush_and_compact(keep) {
            self.fail(ShardFailure::store(Operation::Shutdown, None, e), eff);
        }
        eff.stages
            .push((Stage::Flush, self.metrics_now().since(start)));
    }

    /// Where `leader` serves `pg`, from this shard's map, with the leadership's term: this
    /// replica's term when `leader` is the leader it knows of (Raft learns a leader only in
    /// the leader's own term), else 0 (unknown).
    pub(crate) fn leader_hint(&self, pg: PgId, leader: Option<OsdId>) -> Option<LeaderHint> {
        let leader = leader?;
        let osd = self.map.osds.get(&leader)?;
        let term = self
            .pgs
            .get(&pg)
            .filter(|h| h.replica.leader() == Some(leader))
            .map_or(0, |h| h.replica.term().0);
        Some(LeaderHint {
            osd: osd.id,
            address: osd.address.clone(),
            port: osd.port_for(pg),
            term,
        })
    }

    /// An operation finished: answer its client and count it.
    pub(crate) fn complete(&mut self, op: OpId, outcome: OpOutcome, eff: &mut Effects) {
        let Some(pending) = self.ops.remove(&op.0) else {
            return;
        };
        if let OpKind::Mutation {
            log_bytes,
            space_bytes,
            ..
        } = pending.kind
        {
            self.pending_mutation_bytes -= log_bytes;
            self.pending_space_bytes -= space_bytes;
            let pg_bytes = self.pg_pending_bytes.entry(pending.pg).or_default();
            *pg_bytes -= log_bytes;
            if *pg_bytes == 0 {
                self.pg_pending_bytes.remove(&pending.pg);
            }
        }
        if let Some(n) = self.conn_inflight.get_mut(&pending.conn) {
            *n = n.saturating_sub(1);
        }
        let applied = matches!(outcome, OpOutcome::Applied);
        // A read whose barrier passed is recorded when it is answered: a data read by
        // `reads`, the other reads below, once read.
        let barrier_passed = matches!(outcome, OpOutcome::ReadReady);
        let ready = (barrier_passed && !matches!(pending.kind, OpKind::Read { .. }))
            .then(|| self.metrics_now());
        if !barrier_passed {
            let done = self.metrics_now();
            let committed = applied.then_some(self.apply_started);
            let view = self.op_view(&pending, committed, done);
            self.history.record(view);
        }
        match pending.kind {
            OpKind::Reclaim { id } => return self.reclaim_finished(pending.pg, id, applied, eff),
            OpKind::SnapMark { image, snap } => {
                return self.snap_mark_finished(pending.pg, (image, snap), applied, eff)
            }
            OpKind::SnapTrim { id } => {
                return self.snap_trim_finished(pending.pg, id, applied, eff)
            }
            OpKind::Repair { block } => return self.repair_finished(block, applied),
            _ => {}
        }
        let reply = match (outcome, &pending.kind) {
            (OpOutcome::Applied, OpKind::Mutation { bytes, .. }) => {
                if let Some(h) = self.pgs.get_mut(&pending.pg) {
                    h.io.write_ops += 1;
                    h.io.write_bytes += bytes;
                }
                self.io_totals.write_ops += 1;
                self.io_totals.write_bytes += bytes;
                eff.stage(Stage::Replication, pending.started, self.apply_started);
                eff.stage(Stage::OpWrite, pending.arrived, self.metrics_now());
                Reply::Ok
            }
            (
                OpOutcome::ReadReady,
                OpKind::Read {
                    addr,
                    offset,
                    length,
                },
            ) => {
                // Read with the step's other ready reads, at its end (`reads`).
                let ready = self.metrics_now();
                self.ready_reads.push(crate::reads::ReadyRead {
                    conn: pending.conn,
                    request_id: pending.request_id,
                    pg: pending.pg,
                    addr: *addr,
                    offset: *offset,
                    length: *length,
                    arrived: pending.arrived,
                    started: pending.started,
                    ready,
                });
                return;
            }
            (
                OpOutcome::ReadReady,
                OpKind::Allocation {
                    addr,
                    offset,
                    length,
                },
            ) => {
                let (addr, offset, length) = (*addr, *offset, *length);
                self.allocation_reply(addr, offset, length, eff)
            }
            (
                OpOutcome::ReadReady,
                OpKind::CloneRead {
                    addr,
                    offset,
                    length,
                },
            ) => {
                let (addr, offset, length) = (*addr, *offset, *length);
                let object = fastblock_store::ObjectId {
                    image: addr.image,
                    index: addr.object_index,
                };
                if !self.store.borrow().is_copied(addr.pg, object) {
                    Reply::error(
                        Status::ObjectAbsent,
                        None,
                        format!(
                            "pg {}: object {} of image {} is not copied up from its parent",
                            addr.pg, addr.object_index, addr.image
                        ),
                    )
                } else {
                    match self.read_for_client(addr, offset, length, eff) {
                        Ok(data) => Reply::Data(data),
                        Err(reply) => reply,
                    }
                }
            }
            (
                OpOutcome::ReadReady,
                OpKind::SnapRead {
                    addr,
                    offset,
                    length,
                    snap,
                },
            ) => {
                let (addr, range, snap) = (*addr, (*offset, *length), *snap);
                self.snap_read_reply(addr, range, snap, eff)
            }
            (OpOutcome::Failed(e), kind) => {
                if matches!(e, PgError::Dropped) && matches!(kind, OpKind::Mutation { .. }) {
                    eff.probes.writes_dropped += 1;
                }
                self.error_reply(pending.pg, e)
            }
            (other, _) => Reply::error(
                Status::Internal,
                None,
                format!("unexpected outcome {other:?}"),
            ),
        };
        if let Some(ready) = ready {
            self.record_read_answered(&pending, ready);
        }
        eff.replies.push((pending.conn, pending.request_id, reply));
    }

    pub(crate) fn error_reply(&self, pg: PgId, e: PgError) -> Reply {
        match e {
            PgError::NotLeader { leader } => Reply::error(
                Status::NotLeader,
                self.leader_hint(pg, leader),
                format!("pg {pg}: not the leader"),
            ),
            PgError::Dropped => {
                let leader = self.pgs.get(&pg).and_then(|h| h.replica.leader());
                Reply::error(
                    Status::NotLeader,
                    self.leader_hint(pg, leader),
                    format!("pg {pg}: leadership changed, retry"),
                )
            }
            PgError::Busy => Reply::error(
                Status::Busy,
                None,
                format!("pg {pg}: too many pending operations"),
            ),
            // The whole shard failed (its disk): the OSD is stopping and the PG's other
            // replicas take over, so the client is sent to find them (`NotReady` is retried
            // through `GetLeader`) rather than handed an I/O error the cluster can still
            // serve. The op's outcome is unknown, like any dropped op's.
            PgError::Failed(reason) if self.failed.is_some() => Reply::error(
                Status::NotReady,
                None,
                format!("{reason}; this OSD is stopping, its PGs fail over"),
            ),
            // This PG's replica alone failed (an undecodable committed entry).
            PgError::Failed(reason) => Reply::error(Status::IoError, None, reason),
        }
    }

    /// Reads applied data of this replica.
    pub(crate) fn read_for_client(
        &mut self,
        addr: ObjectAddr,
        offset: u32,
        length: u32,
        eff: &mut Effects,
    ) -> Result<bytes::Bytes, Reply> {
        let mut buf = vec![0u8; length as usize];
        let object = fastblock_store::ObjectId {
            image: addr.image,
            index: addr.object_index,
        };
        let r = self
            .store
            .borrow_mut()
            .read_object(addr.pg, object, u64::from(offset), &mut buf);
        match r {
            Ok(()) => Ok(buf.into()),
            Err(e) => {
                let status = match e.bad_block() {
                    Some(_) => self.bad_block_status(&e),
                    None => crate::repair::read_error_status(&e),
                };
                let reply = Reply::error(status, None, format!("pg {}: read: {e}", addr.pg));
                if e.is_fatal() {
                    self.fail(ShardFailure::store(Operation::Read, Some(addr.pg), e), eff);
                }
                Err(reply)
            }
        }
    }

    fn on_event(&mut self, pg: PgId, event: Event, eff: &mut Effects) {
        match &event {
            Event::BecameLeader(report) => {
                tracing::info!(%pg, term = report.term.0, voters = ?report.voters, "became leader");
                self.report_leader(pg, report.clone(), eff);
            }
            Event::ConfigurationChanged(report) => {
                tracing::info!(%pg, term = report.term.0, conf_index = report.conf_index.0, voters = ?report.voters, outgoing = ?report.voters_outgoing, learners = ?report.learners, "configuration changed");
                self.report_leader(pg, report.clone(), eff);
            }
            Event::LeaderChanged { leader, term } => {
                tracing::debug!(%pg, ?leader, term = term.0, "leader changed");
            }
            Event::Failed { index, reason } => {
                tracing::error!(%pg, index = index.0, "pg replica failed: {reason}");
            }
            Event::MembershipFinished(r) => {
                tracing::info!(%pg, term = r.term.0, voters = ?r.voters, "membership change finished");
                let req = MembershipFinishedRequest {
                    leader: self.cfg.osd,
                    term: r.term,
                    conf_index: r.conf_index,
                    voters: r.voters.clone(),
                    learners: r.learners.clone(),
                };
                self.hold_report(Report::MembershipFinished { pg, req }, eff);
            }
            Event::ConfChangeRefused { index, reason } => {
                tracing::warn!(%pg, index = index.0, "configuration change refused by raft: {reason}");
            }
        }
        eff.events.push((pg, event));
    }

    /// Tells the monitor (through the runtime) that this OSD leads `pg`.
    pub(crate) fn report_leader(&mut self, pg: PgId, r: LeaderReport, eff: &mut Effects) {
        let req = LeaderElectedRequest {
            leader: self.cfg.osd,
            term: r.term,
            conf_index: r.conf_index,
            voters: r.voters,
            voters_outgoing: r.voters_outgoing,
            learners: r.learners,
        };
        self.hold_report(Report::LeaderElected { pg, req }, eff);
    }

    /// A leader or membership report leaves only once everything staged before it is
    /// durable. The configuration it names was applied from a commit index that a hard state
    /// moving only the commit index does not sync (MustSync); the monitor drops members from
    /// the map by the report, and a dropped member deletes its replica. A leader that then
    /// crashed came back with an older commit index and the old (joint) configuration, whose
    /// vote it needed from the member that was gone: the PG had no leader for good
    /// (simulator, seed 9952412769498548792 with --membership). That commit index must be
    /// staged when the report is held, or the LSN taken misses it: `round` handles the PGs'
    /// events only after staging their log writes (seed 3856582366863085052), and
    /// [`ShardCore::assert_report_covered`] checks it here and when the report leaves.
    fn hold_report(&mut self, report: Report, eff: &mut Effects) {
        self.assert_report_covered(&report, "held");
        let lsn = self.store.borrow().wal().staged_lsn();
        self.held_reports.push_back((lsn, report));
        self.release_reports(eff);
    }

    /// Sends the held reports whose LSN is durable, in order.
    fn release_reports(&mut self, eff: &mut Effects) {
        let durable = self.store.borrow().wal().durable_lsn();
        while self
            .held_reports
            .front()
            .is_some_and(|(lsn, _)| *lsn <= durable)
        {
            let (_, report) = self.held_reports.pop_front().expect("checked");
            self.assert_report_covered(&report, "sent");
            eff.reports.push(report);
        }
    }

    /// A leader or membership report names a configuration applied from a commit index that
    /// the PG's log in the store (the hard state, or a snapshot) already covers: staged when
    /// the report is held, durable when it leaves (`hold_report`). Not checked for a PG whose
    /// log is gone (removed since).
    fn assert_report_covered(&self, report: &Report, when: &str) {
        let (pg, conf_index) = match report {
            Report::LeaderElected { pg, req } => (*pg, req.conf_index),
            Report::MembershipFinished { pg, req } => (*pg, req.conf_index),
            _ => return,
        };
        let store = self.store.borrow();
        let Some(log) = store.pg_log(pg) else {
            return;
        };
        assert!(
            log.hard_state.commit >= conf_index.0,
            "osd {} pg {pg}: a report of the configuration at {} {when} while the log's commit \
             index is {}",
            self.cfg.osd,
            conf_index.0,
            log.hard_state.commit
        );
    }

    /// With reports held and nothing on its way to the disk, asks for a commit of what is
    /// staged, so that an idle PG's report does not wait for the next write or flush.
    fn commit_for_reports(&mut self, eff: &mut Effects) {
        if !self.held_reports.is_empty() {
            self.commit_staged(eff);
        }
    }

    /// With records staged and nothing on its way to the disk, asks for a commit of them (a
    /// round of its own, which completes nothing but the records).
    pub(crate) fn commit_staged(&mut self, eff: &mut Effects) {
        if self.failed.is_some()
            || self.commits.due.is_some()
            || !self.commits.in_flight.is_empty()
            || self.store.borrow().wal().pending_bytes() == 0
        {
            return;
        }
        self.commits.due = Some(Round {
            lsn: 0,
            submitted: Micros(0),
            persisted: Vec::new(),
            installed: Vec::new(),
            entries: 0,
        });
        eff.wal_commit_due = true;
    }

    pub(crate) fn persisted_numbers_forget(&mut self, pg: PgId) {
        self.persisted_numbers.remove(&pg);
        self.persist_times.remove(&pg);
        self.commit_indexes.remove(&pg);
    }

    pub(crate) fn new_op(&mut self, mut pending: PendingOp) -> OpId {
        pending.log_index = self
            .pgs
            .get(&pending.pg)
            .map_or(0, |h| h.replica.raw_node().raft.raft_log.last_index() + 1);
        let id = self.next_op;
        self.next_op += 1;
        *self.conn_inflight.entry(pending.conn).or_default() += 1;
        self.ops.insert(id, pending);
        OpId(id)
    }
}

/// Runs a WAL append; if the pending batch is full, commits it (one more write and sync, still
/// before anything is acknowledged) and tries again.
pub(crate) fn with_room<D: Disk>(
    store: &mut Store<D>,
    mut append: impl FnMut(&mut Store<D>) -> fastblock_store::Result<()>,
) -> fastblock_store::Result<()> {
    match append(store) {
        Err(fastblock_store::Error::BatchFull { .. }) => {
            store.commit()?;
            append(store)
        }
        other => other,
    }
}

fn apply_op<D: Disk>(store: &mut Store<D>, pg: PgId, op: &ClientOp) -> fastblock_store::Result<()> {
    let object = |o: &fastblock_pg::ObjectRef| fastblock_store::ObjectId {
        image: o.image,
        index: o.index,
    };
    match op {
        ClientOp::Write {
            object: o,
            offset,
            data,
        } => store.write_object(pg, object(o), u64::from(*offset), data),
        ClientOp::Discard {
            object: o,
            offset,
            length,
        }
        | ClientOp::WriteZeroes {
            object: o,
            offset,
            length,
        } => store.zero_object(pg, object(o), u64::from(*offset), u64::from(*length)),
        &ClientOp::Reclaim {
            id,
            image,
            from_bytes,
            to_bytes,
            object_size_bytes,
            ..
        } => {
            let touched =
                store.reclaim_image_range(pg, image, from_bytes, to_bytes, object_size_bytes)?;
            tracing::info!(%pg, reclaim = id, %image, objects = touched, "reclaim applied");
            Ok(())
        }
        // The snapshot operations are decided by the log's order, the same on every replica,
        // so a mark that is no longer newest or a rollback to a snapshot trimmed since it was
        // proposed does nothing, on every replica alike (the leader confirms a mark only if
        // the snapshot is live after it; a rollback's client sees the snapshot gone).
        &ClientOp::SnapMark { image, snap } => match store.image_snap_create(pg, image, snap) {
            Err(fastblock_store::Error::InvalidArgument(m)) => {
                tracing::warn!(%pg, %image, snap, "snapshot mark skipped: {m}");
                Ok(())
            }
            r => {
                tracing::info!(%pg, %image, snap, "snapshot marked");
                r
            }
        },
        &ClientOp::SnapTrim { id, image, snap } => {
            let freed = store.image_snap_remove(pg, image, snap)?;
            tracing::info!(%pg, %image, snap, trim = id, blocks_freed = freed, "snapshot trimmed");
            Ok(())
        }
        ClientOp::CopyUp {
            object: o,
            offset,
            data,
            runs,
        } => {
            let runs: Vec<(u64, CopyUpTarget)> = runs
                .iter()
                .map(|(end, target)| (u64::from(*end), CopyUpTarget::from_u64(*target)))
                .collect();
            store
                .copy_up(pg, object(o), u64::from(*offset), data, &runs)
                .map(|_| ())
        }
        ClientOp::CopyUpDone { object: o } => store.copy_up_done(pg, object(o)),
        ClientOp::Repair {
            object: o,
            offset,
            versions,
        } => {
            // Decided on the leader from a good replica's versions; a payload that does not
            // decode or fit (a bug or damage past the log's checksums) or a full data region
            // leaves this copy as it is, on every replica alike: never a failed apply, which
            // would fail again at every replay.
            let r = fastblock_store::ChunkVersions::decode(versions)
                .and_then(|chunk| store.repair_blocks(pg, object(o), u64::from(*offset), &chunk));
            match r {
                Ok(rewritten) => {
                    tracing::info!(%pg, image = %o.image, object = o.index, offset, rewritten, "repair applied");
                    Ok(())
                }
                Err(
                    e @ (fastblock_store::Error::InvalidArgument(_)
                    | fastblock_store::Error::NoSpace { .. }),
                ) => {
                    tracing::error!(%pg, image = %o.image, object = o.index, offset, "repair not applied: {e}");
                    Ok(())
                }
                Err(e) => Err(e),
            }
        }
        ClientOp::Rollback { object: o, snap } => {
            match store.image_snap_rollback(pg, object(o), *snap) {
                Err(fastblock_store::Error::NoSuchImageSnap { .. }) => {
                    tracing::warn!(%pg, image = %o.image, object = o.index, snap, "rollback to a snapshot this PG no longer holds: nothing done");
                    Ok(())
                }
                r => r.map(|_| ()),
            }
        }
    }
}

//! The simulated world: virtual time, one event queue, one PRNG, the nodes, the network, the
//! monitor's state, the clients, the faults and the checkers. Single-threaded and
//! deterministic: the seed decides everything (no clock, no threads, no hash-ordered
//! iteration).
//!
//! A run has two phases. In the **fault phase** clients write and read while the faults the
//! seed enabled strike at random: message loss, delay, duplication and reordering,
//! partitions, node crashes (with torn unsynced writes) and restarts, crash points at
//! arbitrary I/Os, slow WAL commits, scrub requests, and with `--bad-blocks` data blocks
//! going bad (`bad_blocks.rs`). In the **liveness phase** the faults stop (partitions heal,
//! crashed nodes restart, the network is clean), clients keep working a little, then every
//! PG must become active, a deep scrub of every PG must find and repair every bad copy left,
//! the replicas must be identical, every client operation must complete, and every block
//! must read back as the model allows, within a bounded virtual time.

use crate::checker::{AppliedEntry, Safety};
use crate::disk::Claims;
use crate::model::{decode_block, stamp_block, At, Found, ImageModel, BLOCK_BYTES};
use crate::node::{ClientReply, ClientTag, Node, PEER_CONN};
use crate::options::{RngExt, SimOptions, MS, SEC};
use crate::probes::Probes;
use bytes::{Bytes, BytesMut};
use fastblock_client::policy::{classify, Pacer, Retry, Verdict};
use fastblock_client::route::{leader_candidates, map_leader_term};
use fastblock_mon_core::map_log::MapLog;
use fastblock_mon_core::scrub_ops::ScrubStats;
use fastblock_mon_core::snap_ops::SnapAbort;
use fastblock_mon_core::{MonState, Reporter};
use fastblock_pg::{Event, ObjectRef};
use fastblock_shard::report_outbox::ReportOutbox;
use fastblock_shard::{Effects, Input, Micros, PeerSend, RepairCounts, Report};
use fastblock_store::{DamageCounts, ObjectId};
use fastblock_types::api::OsdReport;
use fastblock_types::api::{
    ApiError, BootRequest, CreateImageRequest, CreatePoolRequest, ErrorCode, PgScrubReport,
    ResizeImageRequest,
};
use fastblock_types::map::{ClusterMap, FailureDomain, PgInfo, SnapState};
use fastblock_types::map_delta::{MapFollower, MapScope};
use fastblock_types::rng::SplitMix64;
use fastblock_types::route::object_pg;
use fastblock_types::{Epoch, ImageId, OsdId, PgId, PoolId, SnapId};
use fastblock_wire::{ObjectAddr, Reply, Request, Status};
use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::rc::Rc;
use std::sync::Arc;

mod bad_blocks;
mod client_net;
mod scrubs;

const IMAGE: ImageId = ImageId(1);
/// How often a node sends the reports waiting in its outbox, as an OSD does (its
/// `REPORT_TICK`).
const REPORT_TICK_US: u64 = 50 * MS;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FaultKind {
    Crash,
    Fuse,
    Partition,
    Slow,
    /// An OSD goes out (its PGs are remapped) or comes back in (rebalance).
    OutIn,
    /// A node's map watch stalls: no new map reaches it for a while.
    MapStall,
    /// A data block on one node's disk goes bad (`SimOptions::bad_block_every_us`).
    BadBlock,
    /// The monitor asks for a scrub of a PG (`SimOptions::scrub_every_us`).
    Scrub,
}

/// How a data block goes bad.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BadKind {
    /// A bit of it flips on the device (silent corruption of synced data).
    Flip,
    /// A sector of it stops reading (a latent sector error) until a write covers it.
    Unreadable,
    /// The next write of a client's block to the data region lands on a nearby block.
    Misdirect,
}

/// Latent sector errors made on one node in a run, at most: the shard stops once its disk
/// failed to read `fastblock_shard::repair::DISK_READ_ERRORS_MAX` blocks (a failing disk),
/// and the simulator keeps each node well below that.
const UNREADABLE_BLOCKS_PER_NODE_MAX: u64 = 4;

#[derive(Debug)]
enum Ev {
    Tick {
        node: OsdId,
        life: u64,
    },
    /// The flush timer of a node.
    Flush {
        node: OsdId,
        life: u64,
    },
    /// The flush a node started finishes: its metadata commit runs now.
    FlushDone {
        node: OsdId,
        life: u64,
    },
    /// The simulated fdatasync of a slow WAL commit completes.
    CommitDone {
        node: OsdId,
        life: u64,
    },
    /// A peer request reaches `to` (a `RaftBatch` of one envelope, a chunk or an ack).
    Packet {
        from: OsdId,
        to: OsdId,
        pg: PgId,
        req: Request,
        link_seq: u64,
    },
    ClientSend {
        node: OsdId,
        tag: ClientTag,
        req: Request,
    },
    ClientReply {
        tag: ClientTag,
        reply: ClientReply,
    },
    ClientTimeout {
        tag: ClientTag,
    },
    /// Send the next attempt of the operation whose current attempt is `tag`.
    ClientRetry {
        tag: ClientTag,
    },
    ClientNext {
        client: u32,
    },
    /// A node sends the reports waiting in its outbox, in one batch (as an OSD does every
    /// report tick).
    ReportTick {
        node: OsdId,
        life: u64,
    },
    /// A node's batch of reports reaches the monitor.
    MonReports {
        from: OsdId,
        life: u64,
        batch: Vec<OsdReport>,
    },
    /// The monitor's answer to a batch reaches the node.
    ReportsAnswered {
        node: OsdId,
        life: u64,
        batch: Vec<OsdReport>,
        results: Vec<Option<ApiError>>,
    },
    /// The current map reaches a node.
    MapTo {
        node: OsdId,
        life: u64,
    },
    Fault(FaultKind),
    Restart {
        node: OsdId,
    },
    /// Crash this incarnation of a node (a crash aimed at a moment, not at random).
    CrashNode {
        node: OsdId,
        life: u64,
    },
    Heal,
    /// A data block of `node` goes bad now (`tries`: times a flip waited for the disk to
    /// have no unsynced write).
    BadBlock {
        node: OsdId,
        kind: BadKind,
        tries: u32,
    },
    /// Every node's heartbeat carries its scrub reports to the monitor.
    Heartbeat,
    SlowEnd {
        node: OsdId,
    },
    FaultsEnd,
    LivenessCheck,
    /// The monitor cuts the image's tail (`SimOptions::shrink_at_us`).
    Shrink,
    /// The monitor grows the image back to its full size.
    Regrow,
    /// The monitor takes snapshot number `index` of `SimOptions::snap_at_us`.
    SnapCreate {
        index: usize,
    },
    /// The create call of snapshot `snap` stops waiting: it aborts the snapshot unless it is
    /// created (`MonState::abort_snap_create`).
    SnapDeadline {
        snap: u64,
    },
    /// The monitor's ticker aborts snapshots still `creating` after the timeout
    /// (`MonState::tick_snaps`).
    SnapTick,
    /// The monitor removes snapshot `snap`.
    SnapRemove {
        snap: u64,
    },
}

#[derive(Clone, Debug)]
enum ClientOpKind {
    Write {
        id: u64,
        data: Bytes,
    },
    Read,
    /// A read of image snapshot `snap` (`Request::SnapRead`).
    SnapRead {
        snap: u64,
    },
}

#[derive(Clone, Debug)]
struct ClientOp {
    kind: ClientOpKind,
    /// Issued over the image's full size while it was shrunk (a client with an old handle):
    /// the OSDs may refuse it as beyond the end.
    beyond: bool,
    pg: PgId,
    object: ObjectRef,
    offset: u32,
    first_block: u64,
    blocks: u64,
    started: u64,
    attempt_started: At,
}

#[derive(Debug, Default)]
struct Client {
    op: Option<ClientOp>,
    attempt: u64,
    /// Where the current attempt went, and the leader term it named: what `policy::classify`
    /// weighs a hint against.
    asked: Option<(OsdId, u64)>,
    /// The pacing of the current operation's attempts (the client library's, per request).
    pacer: Option<Pacer>,
    /// The leader last heard of per PG, with its term (0: unknown), as the library caches it.
    hints: BTreeMap<PgId, (OsdId, u64)>,
    /// The map the client routes by, and whose epoch its requests carry: the monitor's at the
    /// start of each operation and at each back-off (the client library's map watch delivers
    /// new maps meanwhile); redirects follow without a new map.
    map: Arc<ClusterMap>,
    stopped: bool,
    /// Driven by a scenario: one attempt per operation, no retries, the reply kept in
    /// `result` (reads and acknowledgements still go through the model).
    scripted: bool,
    result: Option<ClientReply>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        crate::keep_probes(std::mem::take(&mut self.probes));
    }
}

/// What a finished run reports.
#[derive(Clone, Debug, Default)]
pub struct RunSummary {
    pub seed: u64,
    pub virtual_us: u64,
    pub events: u64,
    pub writes: u64,
    pub writes_acked: u64,
    pub writes_unknown: u64,
    pub reads_checked: u64,
    /// Blocks of snapshot reads checked.
    pub snap_reads_checked: u64,
    pub entries_checked: u64,
    pub crashes: u64,
    pub probes: Probes,
    /// A digest of the whole run, for the determinism check.
    pub fingerprint: u64,
}

pub struct Cluster {
    pub o: SimOptions,
    rng: SplitMix64,
    pub now: u64,
    queue: BTreeMap<(u64, u64), Ev>,
    seq: u64,
    nodes: BTreeMap<OsdId, Node>,
    mon: MonState,
    pool: PoolId,
    /// The map epoch last sent to the nodes.
    published: Epoch,
    /// The monitor's recent epochs as deltas, which the nodes follow the map with, as OSDs do
    /// (`fastblock_mon_core::map_log`); its current map is what clients are given.
    map_log: MapLog,
    /// Each node's copy of the map, scoped to its own PGs: reset by a crash (the OSD process
    /// starts over with a whole map, as `follow_map` does).
    followers: BTreeMap<OsdId, MapFollower>,
    /// Each node's reports waiting for its next batch (lost with the process at a crash).
    outboxes: BTreeMap<OsdId, ReportOutbox>,
    /// Nodes with a report tick scheduled.
    report_tick_pending: BTreeSet<OsdId>,
    /// Nodes with a batch the monitor has not answered yet, and the life that sent it.
    reports_in_flight: BTreeMap<OsdId, u64>,
    partition: Option<BTreeSet<OsdId>>,
    /// Nodes the clients cannot reach, and the client requests to them waiting for that to
    /// heal (`client_net.rs`).
    clients_cut: BTreeSet<OsdId>,
    held_client_sends: Vec<client_net::HeldSend>,
    faults_on: bool,
    faults_end_us: u64,
    clients: Vec<Client>,
    model: ImageModel,
    /// Nodes whose map watch is stalled, until when (`FaultKind::MapStall`).
    map_stalled: BTreeMap<OsdId, u64>,
    /// The image's size as the monitor has it now, in blocks (clients stay within it, but
    /// for `SimOptions::stale_size_pct` of their operations).
    size_blocks: u64,
    shrink: Option<Shrink>,
    /// The snapshots the monitor took (`SimOptions::snap_at_us`), by id.
    snaps: BTreeMap<u64, SnapRun>,
    /// Every snapshot decision of the simulator (removals, lost create calls, which snapshot a
    /// client reads and where): a stream of its own, so that seeds without snapshots draw
    /// from `rng` exactly as before, and seeds with snapshots until their first one.
    snap_rng: SplitMix64,
    /// The monitor's snapshot ticker is scheduled.
    snap_ticking: bool,
    /// Snapshot removals scheduled and not done yet: the run converges only after them.
    snap_removals_pending: u64,
    /// The client that reads every block of every live snapshot once the cluster converged
    /// (present when the seed takes snapshots), and what it has left to read.
    sweep: Option<Sweep>,
    /// Every bad-block and scrub decision: a stream of its own, so that seeds without them
    /// draw from `rng` exactly as before.
    rot_rng: SplitMix64,
    /// Image blocks whose copy on some node may be bad, and that node (shared with the disks,
    /// whose misdirected writes claim blocks when they land).
    claims: Claims,
    /// Latent sector errors made per node.
    unreadable_made: BTreeMap<OsdId, u64>,
    /// What the monitor knows of the leaders' scrub reports.
    scrub_stats: ScrubStats,
    /// The deep scrub of every PG that ends every run, once asked.
    final_scrub: Option<FinalScrub>,
    /// Each node's repair and damage counters as last counted (per incarnation).
    seen_counts: BTreeMap<OsdId, (u64, RepairCounts, DamageCounts)>,
    /// Each leader's scrub report of each PG as last counted (per incarnation).
    seen_reports: BTreeMap<(OsdId, PgId), (u64, PgScrubReport)>,
    safety: Safety,
    pub probes: Probes,
    /// Link → highest link sequence number delivered (reordering probe).
    link_sent: BTreeMap<(OsdId, OsdId), u64>,
    link_delivered: BTreeMap<(OsdId, OsdId), u64>,
    /// Link → delivery time of its last ordered (snapshot) message.
    fifo_after: BTreeMap<(OsdId, OsdId), u64>,
    /// (node, PG) → term in which that replica leads.
    leading: BTreeMap<(OsdId, PgId), u64>,
    /// Node → durable WAL LSN and whether a commit was owed, at its last crash.
    crash_state: BTreeMap<OsdId, (u64, bool)>,
    /// (node, PG) → the highest configuration index the node reported to the monitor as the
    /// PG's leader (the monitor drops members by such reports): a restart must find it
    /// committed in the node's log, until the node removes the PG.
    reported_conf: BTreeMap<(OsdId, PgId), u64>,
    events: u64,
    crashes: u64,
    fingerprint: u64,
    failure: Option<String>,
    done: bool,
    trace: bool,
}

/// The image's tail being deleted after a shrink.
#[derive(Clone, Copy, Debug)]
struct Shrink {
    reclaim: u64,
    /// The model's zeroings of the tail, one per object: each object lives in one PG, and
    /// each PG deletes its part at its own moment, so what a read learns of one object's
    /// deletion says nothing of another's.
    zeroings: (u64, u64),
    first_block: u64,
    /// Every PG confirmed the deletion (the monitor dropped the entry).
    done_at: Option<At>,
    /// The monitor grew the image back.
    regrown_at: Option<At>,
}

/// A snapshot the monitor took, as the simulator follows it (the model keeps its interval).
#[derive(Clone, Debug)]
struct SnapRun {
    name: String,
    /// The image's size when it was taken, in blocks: its reads stay within it.
    size_blocks: u64,
    created: Option<At>,
    aborted: Option<At>,
    removed: Option<At>,
    /// The trim entry its abort or removal left, which every PG must confirm.
    trim: Option<u64>,
}

/// The deep scrub of every PG that ends every run: asked once the cluster settled, before the
/// replicas are compared, so that every bad copy left is found and repaired first.
#[derive(Debug, Default)]
struct FinalScrub {
    /// The round (from 1): see `scrubs::FINAL_ROUNDS_MAX`.
    round: u32,
    /// This round's request of each PG.
    requests: BTreeMap<PgId, u64>,
    /// A request of this round was one already pending, whose scrub may have begun before
    /// the faults stopped: another round follows.
    reused: bool,
    /// Each PG's leader and its scrub report's (inconsistent, repaired) blocks when the
    /// round was asked.
    baseline: BTreeMap<PgId, (OsdId, u64, u64)>,
    /// The nodes' repair counters at the last check, and checks in a row they stayed so.
    repairs: BTreeMap<OsdId, RepairCounts>,
    quiet_checks: u32,
    /// When the next round is asked, once this one left blocks unrepaired.
    next_round_at: Option<u64>,
    done: bool,
}

/// The final read of every block of every live snapshot, after convergence.
#[derive(Debug)]
struct Sweep {
    client: u32,
    started: bool,
    /// (snapshot, object, blocks from the object's start) still to read.
    left: VecDeque<(u64, u64, u64)>,
}

fn uuid_of(id: u32) -> String {
    format!("00000000-0000-4000-8000-{id:012x}")
}

impl Cluster {
    /// Builds the cluster of `o`: the monitor boots the nodes and creates the pool (real
    /// placement), then every node formats its disk and hosts its PGs.
    pub fn new(o: SimOptions, trace: bool) -> Result<Cluster, String> {
        let mut rng = SplitMix64::new(o.seed);
        let mut mon = MonState::default();
        mon.counters.next_osd_id = mon.counters.next_osd_id.max(1);
        mon.counters.next_pool_id = mon.counters.next_pool_id.max(1);
        mon.counters.next_image_id = mon.counters.next_image_id.max(1);
        for _ in 0..o.nodes {
            let before = mon.clone();
            let id = mon
                .apply_id(&uuid_of(mon.counters.next_osd_id))
                .map_err(|e| format!("apply id: {e:?}"))?;
            mon.finish(&before);
            let before = mon.clone();
            boot(&mut mon, id)?;
            mon.finish(&before);
        }
        let before = mon.clone();
        let pool = mon
            .create_pool(&CreatePoolRequest {
                name: "sim".into(),
                pg_count: o.pg_count,
                size: o.replicas,
                failure_domain: FailureDomain::Osd,
            })
            .map_err(|e| format!("create pool: {e:?}"))?;
        mon.finish(&before);
        // The clients' image, in the monitor like any image: the map's image table fences
        // IO by it (`fastblock_shard::reclaim`).
        let before = mon.clone();
        let image = mon
            .create_image(&CreateImageRequest {
                name: "sim".into(),
                pool: "sim".into(),
                size_bytes: o.objects * o.object_bytes,
                object_size_bytes: Some(o.object_bytes),
            })
            .map_err(|e| format!("create image: {e:?}"))?;
        mon.finish(&before);
        assert_eq!(image.id, IMAGE, "the first image gets the first id");
        let mut nodes = BTreeMap::new();
        let pg_seed = rng.next_u64();
        // Virtual time, set by each node before it steps its core: the cores' metrics clock.
        let clock = Rc::new(Cell::new(0));
        for id in mon.map.osds.keys() {
            let node = Node::format(&o, *id, pg_seed ^ u64::from(id.0), clock.clone())?;
            nodes.insert(*id, node);
        }
        let published = mon.map.epoch;
        let map_log = MapLog::new(Arc::new(mon.map.clone()));
        let followers = nodes
            .keys()
            .map(|id| (*id, MapFollower::new(MapScope::Osd(*id))))
            .collect();
        let mut c = Cluster {
            rng,
            now: 0,
            queue: BTreeMap::new(),
            seq: 0,
            nodes,
            mon,
            pool: pool.id,
            published,
            map_log,
            followers,
            outboxes: BTreeMap::new(),
            report_tick_pending: BTreeSet::new(),
            reports_in_flight: BTreeMap::new(),
            partition: None,
            clients_cut: BTreeSet::new(),
            held_client_sends: Vec::new(),
            faults_on: true,
            faults_end_us: o.fault_phase_us,
            clients: (0..o.clients).map(|_| Client::default()).collect(),
            model: ImageModel::new(IMAGE.0),
            map_stalled: BTreeMap::new(),
            size_blocks: o.objects * o.object_bytes / BLOCK_BYTES as u64,
            shrink: None,
            snaps: BTreeMap::new(),
            snap_rng: SplitMix64::new(o.seed ^ 0x5A95_4075_0000_0007),
            snap_ticking: false,
            snap_removals_pending: 0,
            sweep: None,
            rot_rng: SplitMix64::new(o.seed ^ 0xBAD0_B10C_0000_0009),
            claims: Claims::default(),
            unreadable_made: BTreeMap::new(),
            scrub_stats: ScrubStats::default(),
            final_scrub: None,
            seen_counts: BTreeMap::new(),
            seen_reports: BTreeMap::new(),
            safety: Safety::default(),
            probes: Probes::default(),
            link_sent: BTreeMap::new(),
            link_delivered: BTreeMap::new(),
            fifo_after: BTreeMap::new(),
            leading: BTreeMap::new(),
            crash_state: BTreeMap::new(),
            reported_conf: BTreeMap::new(),
            events: 0,
            crashes: 0,
            fingerprint: 0xcbf2_9ce4_8422_2325,
            failure: None,
            done: false,
            trace,
            o,
        };
        let ids: Vec<OsdId> = c.nodes.keys().copied().collect();
        for id in ids {
            c.deliver_map(id);
            c.schedule_timers(id);
        }
        for client in 0..c.o.clients {
            let at = c.rng.range(0, 10 * MS);
            c.at(at, Ev::ClientNext { client });
        }
        for (kind, every) in [
            (FaultKind::Crash, c.o.crash_every_us),
            (FaultKind::Fuse, c.o.fuse_every_us),
            (FaultKind::Partition, c.o.partition_every_us),
            (FaultKind::Slow, c.o.slow_every_us),
            (FaultKind::OutIn, c.o.outin_every_us),
            (FaultKind::MapStall, c.o.map_stall_every_us),
        ] {
            if every > 0 {
                let at = c.rng.range(0, 2 * every);
                c.at(at, Ev::Fault(kind));
            }
        }
        // From a stream of their own, so that the other faults' times stay the seed's.
        for (kind, every) in [
            (FaultKind::BadBlock, c.o.bad_block_every_us),
            (FaultKind::Scrub, c.o.scrub_every_us),
        ] {
            if every > 0 {
                let at = c.rot_rng.range(0, 2 * every);
                c.at(at, Ev::Fault(kind));
            }
        }
        if c.o.scrub_every_us > 0 {
            c.at(SEC, Ev::Heartbeat);
        }
        let end = c.faults_end_us;
        c.at(end, Ev::FaultsEnd);
        if c.o.shrink_at_us > 0 {
            let at = c.o.shrink_at_us;
            c.at(at, Ev::Shrink);
        }
        for (index, at) in c.o.snap_at_us.clone().into_iter().enumerate() {
            c.at(at, Ev::SnapCreate { index });
        }
        if !c.o.snap_at_us.is_empty() {
            // Not a workload client: it reads the snapshots once the cluster converged.
            c.clients.push(Client {
                stopped: true,
                ..Client::default()
            });
            c.sweep = Some(Sweep {
                client: c.clients.len() as u32 - 1,
                started: false,
                left: VecDeque::new(),
            });
        }
        Ok(c)
    }

    fn at(&mut self, time: u64, ev: Ev) {
        self.seq += 1;
        self.queue.insert((time.max(self.now), self.seq), ev);
    }

    fn after(&mut self, delay: u64, ev: Ev) {
        self.at(self.now + delay, ev);
    }

    /// The current instant, for the image model.
    fn at_now(&self) -> At {
        At {
            us: self.now,
            event: self.events,
        }
    }

    fn fail(&mut self, message: String) {
        if self.failure.is_none() {
            self.failure = Some(message);
        }
    }

    fn mix(&mut self, v: u64) {
        self.fingerprint = (self.fingerprint ^ v).wrapping_mul(0x0000_0100_0000_01b3);
    }

    /// Runs to the end: `Ok` with a summary, or the first failure.
    pub fn run(mut self) -> Result<RunSummary, String> {
        let limit = self.faults_end_us + self.o.liveness_bound_us;
        while !self.done {
            if self.next_event_time().is_some_and(|t| t > limit) {
                let why = self.not_converged_reason();
                return Err(format!(
                    "liveness: not converged {} s after the faults stopped: {why}",
                    self.o.liveness_bound_us / crate::options::SEC
                ));
            }
            self.step_event()?;
        }
        self.summary()
    }

    /// When the next event happens (`None`: nothing is scheduled).
    pub fn next_event_time(&self) -> Option<u64> {
        self.queue.first_key_value().map(|((t, _), _)| *t)
    }

    /// Handles the next event; `Err` is the run's first failure.
    pub fn step_event(&mut self) -> Result<(), String> {
        let Some(((time, _), ev)) = self.queue.pop_first() else {
            return Err("the event queue ran dry".into());
        };
        self.now = time;
        crate::set_virtual_time(time);
        self.events += 1;
        self.mix(time);
        if self.trace {
            eprintln!("[{:>12}] {}", time, trace_line(&ev));
        }
        self.handle(ev);
        match self.failure.take() {
            Some(f) => Err(f),
            None => Ok(()),
        }
    }

    fn summary(mut self) -> Result<RunSummary, String> {
        self.mix(self.model.write_count());
        self.mix(self.safety.entries_checked);
        Ok(RunSummary {
            seed: self.o.seed,
            virtual_us: self.now,
            events: self.events,
            writes: self.model.write_count(),
            writes_acked: self.model.acked_count(),
            writes_unknown: self.model.unknown_count(),
            reads_checked: self.model.stats.reads_checked,
            snap_reads_checked: self.model.stats.snap_reads_checked,
            entries_checked: self.safety.entries_checked,
            crashes: self.crashes,
            probes: self.probes.clone(),
            fingerprint: self.fingerprint,
        })
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Tick { node, life } => self.on_tick(node, life),
            Ev::Flush { node, life } => self.on_flush(node, life),
            Ev::FlushDone { node, life } => self.on_flush_done(node, life),
            Ev::CommitDone { node, life } => self.on_commit_done(node, life),
            Ev::Packet {
                from,
                to,
                pg,
                req,
                link_seq,
            } => self.on_packet(from, to, pg, req, link_seq),
            Ev::ClientSend { node, tag, req } => self.on_client_send(node, tag, req),
            Ev::ClientReply { tag, reply } => self.on_client_reply(tag, reply),
            Ev::ClientTimeout { tag } => {
                if self.current_attempt(tag) && self.clients[tag.client as usize].scripted {
                    let reply = ClientReply::Refused("timeout".into());
                    self.on_client_reply(tag, reply);
                } else if self.current_attempt(tag) {
                    // As the library: the attempt failed without a reply; forget the
                    // leader, retry after a pause.
                    self.probes.hit("client.timeout");
                    self.back_off(tag.client);
                }
            }
            Ev::ClientRetry { tag } => {
                if self.current_attempt(tag) {
                    self.send_attempt(tag.client);
                }
            }
            Ev::ClientNext { client } => self.next_op(client),
            Ev::ReportTick { node, life } => self.on_report_tick(node, life),
            Ev::MonReports { from, life, batch } => self.on_mon_reports(from, life, batch),
            Ev::ReportsAnswered {
                node,
                life,
                batch,
                results,
            } => self.on_reports_answered(node, life, batch, results),
            Ev::MapTo { node, life } => self.on_map_to(node, life),
            Ev::Fault(kind) => self.on_fault(kind),
            Ev::Restart { node } => self.restart(node),
            Ev::CrashNode { node, life } => {
                let n = &self.nodes[&node];
                if self.faults_on && n.is_up() && n.incarnation == life {
                    self.crash_and_restart_later(node);
                }
            }
            Ev::Heal => {
                self.partition = None;
                self.set_clients_cut(BTreeSet::new());
            }
            Ev::BadBlock { node, kind, tries } => self.on_bad_block(node, kind, tries),
            Ev::Heartbeat => {
                self.heartbeat();
                self.after(SEC, Ev::Heartbeat);
            }
            Ev::SlowEnd { node } => {
                if let Some(n) = self.nodes.get_mut(&node) {
                    n.slow_commit_us = None;
                }
            }
            Ev::FaultsEnd => self.on_faults_end(),
            Ev::LivenessCheck => self.on_liveness_check(),
            Ev::Shrink => self.on_shrink(),
            Ev::Regrow => self.on_regrow(),
            Ev::SnapCreate { index } => self.on_snap_create(index),
            Ev::SnapDeadline { snap } => self.on_snap_deadline(snap),
            Ev::SnapTick => self.on_snap_tick(),
            Ev::SnapRemove { snap } => self.on_snap_remove(snap),
        }
    }

    // ---- nodes ----

    fn schedule_timers(&mut self, id: OsdId) {
        let life = self.nodes[&id].incarnation;
        let t = self.rng.range(0, self.o.tick_us);
        self.after(t, Ev::Tick { node: id, life });
        let f = self.rng.range(0, self.o.flush_us);
        self.after(f, Ev::Flush { node: id, life });
    }

    /// Whether `id` is up in incarnation `life` (events of an earlier life are stale).
    fn alive(&self, id: OsdId, life: u64) -> bool {
        let node = &self.nodes[&id];
        node.incarnation == life && node.is_up()
    }

    /// Runs `f` on a node. A panic caused by an injected I/O error (it reached raft-rs
    /// through `PgStorage`, and raft-rs panicked) crashes the node, as the OSD aborts on any
    /// panic (fail-stop): `None` then, and whatever the step produced is dropped, as an abort
    /// drops unsent buffers. Any other panic fails the run.
    fn guarded<T>(&mut self, id: OsdId, f: impl FnOnce(&mut Node) -> T) -> Option<T> {
        let node = self.nodes.get_mut(&id).expect("known node");
        match catch_unwind(AssertUnwindSafe(|| f(node))) {
            Ok(t) => Some(t),
            Err(payload) => {
                if node.fuse_blown_at().is_none() {
                    resume_unwind(payload);
                }
                crate::take_panic_message();
                self.probes.hit("fuse.raft_panic");
                self.crash_and_restart_later(id);
                None
            }
        }
    }

    /// Steps a node's core with `input` and carries out the effects, then the WAL commits
    /// they ask for, all within this event: when a step's effects set `wal_commit_due`, its
    /// messages and replies leave first (as in the OSD: a leader's appends go out before its
    /// own fdatasync), then the core steps `WalCommit`. On a slow disk the commit's fdatasync
    /// is deferred: the commit stays in flight until its `CommitDone` event (the core queues
    /// what arrives meanwhile, or with two commits allowed in flight, writes a second one);
    /// otherwise it is durable when the step returns.
    fn run_node(&mut self, id: OsdId, input: Input) {
        let life = self.nodes[&id].incarnation;
        let mut next = VecDeque::from([input]);
        while let Some(input) = next.pop_front() {
            if !self.alive(id, life) {
                return;
            }
            let commit = matches!(input, Input::WalCommit);
            let slow = self.nodes[&id].slow_commit_us.is_some();
            let name = self.trace.then(|| input_name(&input));
            if commit {
                self.nodes[&id].defer_next_sync(slow);
            }
            let now = self.now;
            let Some(Some(eff)) = self.guarded(id, |n| n.step(input, now)) else {
                return;
            };
            if let Some(name) = name {
                eprintln!(
                    "               osd {id}: step {name}: {} replies, {} peer requests, {} applied, \
                     commit due {}, commit written {}, in flight {}",
                    eff.replies.len(),
                    eff.peers.len(),
                    eff.applied.len(),
                    eff.wal_commit_due,
                    eff.wal_commit_submitted.is_some(),
                    self.nodes[&id].core().map_or(0, |c| c.commits_in_flight()),
                );
            }
            if commit {
                let node = &self.nodes[&id];
                node.defer_next_sync(false);
                // On a fast disk the commit synced at once and the core completed it in the
                // same step; on a slow one its fdatasync completes at a later event.
                if eff.wal_commit_submitted.is_some() && node.sync_owed() {
                    self.commit_in_flight(id);
                }
            }
            let due = eff.wal_commit_due;
            self.dispatch(id, eff);
            let serving = self.alive(id, life)
                && self.nodes[&id]
                    .core()
                    .is_some_and(|c| c.failure().is_none());
            if due && serving {
                // Before the `WalDurable` of this step's commit, if any: with two commits
                // allowed in flight, the core wrote this round while the other was in flight,
                // and its second commit goes out before the first is acknowledged.
                next.push_front(Input::WalCommit);
            }
        }
    }

    /// A slow WAL commit is in flight: its fdatasync completes after a delay, unless power
    /// fails first.
    fn commit_in_flight(&mut self, id: OsdId) {
        self.probes.hit("slow.commit");
        let max = self.nodes[&id].slow_commit_us.unwrap_or(MS).max(MS);
        let d = self.rng.range(MS / 2, max);
        let life = self.nodes[&id].incarnation;
        self.after(d, Ev::CommitDone { node: id, life });
        let down = self.nodes.values().filter(|n| !n.is_up()).count();
        if self.o.crash_every_us > 0 && down < self.o.down_max as usize && self.rng.chance_pct(10) {
            // Power fails while the commit is in flight: the torn WAL tail.
            let at = self.rng.range(0, d - 1);
            self.after(at, Ev::CrashNode { node: id, life });
        }
    }

    fn on_tick(&mut self, id: OsdId, life: u64) {
        if !self.alive(id, life) {
            return;
        }
        let jitter = self.o.tick_us * self.o.tick_jitter_pct / 100;
        let next = self.o.tick_us - jitter + self.rng.range(0, 2 * jitter);
        self.after(next, Ev::Tick { node: id, life });
        self.run_node(id, Input::Tick);
    }

    fn on_flush(&mut self, id: OsdId, life: u64) {
        if !self.alive(id, life) {
            return;
        }
        let every = self.o.flush_us;
        self.after(every, Ev::Flush { node: id, life });
        self.run_node(id, Input::FlushDue);
    }

    /// A flush the node started finishes: its metadata commit runs now (a crash point may
    /// strike in it), then the core compacts behind it.
    fn on_flush_done(&mut self, id: OsdId, life: u64) {
        if !self.alive(id, life) {
            return;
        }
        if self.guarded(id, Node::release_flush).is_none() {
            return;
        }
        self.run_node(id, Input::FlushDone);
    }

    /// The simulated fdatasync of a slow commit completed: the owed sync happens, and the core
    /// hears that its oldest commit in flight is durable. (With two commits in flight the
    /// second one's sync completed the first's already; each `CommitDone` still completes
    /// exactly one commit, the oldest.)
    fn on_commit_done(&mut self, id: OsdId, life: u64) {
        if !self.alive(id, life) {
            return;
        }
        match self.guarded(id, Node::complete_sync) {
            None => return,
            Some(Err(e)) => {
                self.fail(format!("osd {id}: completing a WAL commit's sync: {e}"));
                return;
            }
            Some(Ok(())) => {}
        }
        let waiting = self.nodes[&id]
            .core()
            .is_some_and(|c| c.failure().is_none() && c.commits_in_flight() > 0);
        if !waiting {
            return;
        }
        let leading_before: Vec<PgId> = self.leaders_on(id);
        self.run_node(id, Input::WalDurable);
        let leading_after = self.leaders_on(id);
        if leading_before.iter().any(|pg| !leading_after.contains(pg)) {
            self.probes.hit("slow.leader_deposed");
        }
    }

    fn leaders_on(&self, id: OsdId) -> Vec<PgId> {
        let Some(core) = self.nodes[&id].core() else {
            return Vec::new();
        };
        core.hosted()
            .filter(|pg| core.replica(*pg).is_some_and(|r| r.is_leader()))
            .collect()
    }

    /// A client's request reaches a node: stepped at once (the core queues it while a commit
    /// blocks it), or refused while the node is down ("connection refused").
    fn on_client_send(&mut self, id: OsdId, tag: ClientTag, req: Request) {
        if self.send_given_up(tag) {
            // Its client aborted the connection before it arrived (`client_net.rs`).
            self.probes.hit("net.client_given_up_discarded");
            return;
        }
        if self.cut_from_clients(id) {
            self.hold_client_send(id, tag, req);
            return;
        }
        if !self.current_attempt(tag) {
            self.probes.hit("net.client_given_up_delivered");
        }
        if !self.nodes[&id].is_up() {
            let d = self.client_delay();
            let reply = ClientReply::Refused(format!("osd {id} is down"));
            self.after(d, Ev::ClientReply { tag, reply });
            return;
        }
        let input = Input::Request {
            conn: u64::from(tag.client),
            request_id: tag.attempt,
            req,
            arrived: Micros(self.now),
        };
        self.run_node(id, input);
    }

    /// Carries out what a node's step produced (except the WAL commit it may ask for: see
    /// [`Cluster::run_node`]).
    fn dispatch(&mut self, id: OsdId, eff: Effects) {
        for (pg, applied) in &eff.opened {
            self.safety.on_open(id, *pg, *applied);
        }
        for send in eff.peers {
            self.send_peer(id, send);
        }
        let mut fatal = None;
        for report in eff.reports {
            if let Report::Fatal(failure) = report {
                fatal = Some(failure);
                continue;
            }
            match &report {
                Report::LeaderElected { pg, req } => {
                    self.note_reported_conf(id, *pg, req.conf_index.0)
                }
                Report::MembershipFinished { pg, req } => {
                    self.note_reported_conf(id, *pg, req.conf_index.0)
                }
                _ => {}
            }
            let to_monitor = report.to_monitor().expect("every report but Fatal");
            self.check_report_asked(id, &to_monitor);
            self.queue_report(id, to_monitor);
        }
        self.count_probes(&eff.probes);
        self.probes
            .add("snapshot.installed", eff.snapshots_installed.len() as u64);
        self.probes
            .add("member.pg_removed", eff.removed.len() as u64);
        for pg in &eff.removed {
            self.reported_conf.remove(&(id, *pg));
        }
        // A shard that goes on answers `Checksum` or `IoError` only for a block no replica
        // holds a good copy of; the simulator leaves every block a good copy on all nodes
        // but one (`bad_blocks.rs`).
        let serving = fatal.is_none()
            && self.nodes[&id]
                .core()
                .is_some_and(|c| c.failure().is_none())
            && self.nodes[&id].fuse_blown_at().is_none();
        for (conn, _, reply) in &eff.replies {
            if let Reply::Error {
                status: status @ (Status::Checksum | Status::IoError),
                message,
                ..
            } = reply
            {
                if serving {
                    self.fail(format!(
                        "osd {id}: answered {status:?} to connection {conn:#x}, though the simulator \
                         leaves every block a good copy on all nodes but one: {message}"
                    ));
                }
            }
        }
        for (conn, request_id, reply) in eff.replies {
            let Some(client) = u32::try_from(conn).ok().filter(|_| conn < PEER_CONN) else {
                self.fail(format!(
                    "osd {id}: a reply to peer connection {conn:#x}: {reply:?}"
                ));
                continue;
            };
            let tag = ClientTag {
                client,
                attempt: request_id,
            };
            let d = self.client_delay();
            let reply = ClientReply::Osd(reply);
            self.after(d, Ev::ClientReply { tag, reply });
        }
        for (pg, event) in eff.events {
            self.on_pg_event(id, pg, event);
        }
        // A step installs snapshots (when the round that staged them is durable) before its
        // rounds apply anything, so the installs go to the checker first.
        let installed = eff
            .snapshots_installed
            .iter()
            .map(|(pg, index)| AppliedEntry::snapshot(*pg, *index));
        let applied = eff.applied.iter().map(AppliedEntry::applied);
        for e in installed.chain(applied) {
            if !e.snapshot {
                self.mix(e.index ^ u64::from(e.hash));
            }
            let differed = self.safety.results_differ;
            if let Err(m) = self.safety.on_applied(id, &e) {
                self.fail(m);
            }
            if self.safety.results_differ > differed {
                self.probes.hit("restart.conf_change_reapplied");
            }
        }
        if eff.flush_started {
            // The metadata commit takes a few milliseconds of virtual time (now and then
            // tens, as a slow fsync): commits, applies and client IO interleave with it.
            let d = if self.rng.chance_pct(10) {
                self.rng.range(4 * MS, 40 * MS)
            } else {
                self.rng.range(0, 4 * MS)
            };
            let life = self.nodes[&id].incarnation;
            self.after(d, Ev::FlushDone { node: id, life });
        }
        // A blown fuse is a crash point: the node loses power at that I/O, whether or not the
        // shard stopped on the error (a failed read of a data block is a bad block to repair,
        // not a reason to stop, so the shard goes on).
        let blown = self.nodes[&id].fuse_blown_at().is_some();
        let fatal = fatal.map(|f| f.to_string()).or_else(|| {
            blown.then(|| "a crash point fired without stopping the shard".to_string())
        });
        self.count_bad_blocks(id);
        if let Some(failure) = fatal {
            match self.nodes[&id].fuse_blown_at() {
                Some(at) => {
                    self.probes.hit(match at {
                        "disk write" => "fuse.disk_write",
                        "disk sync" => "fuse.disk_sync",
                        "disk read" => "fuse.disk_read",
                        "meta write" => "fuse.meta_write",
                        "meta sync" => "fuse.meta_sync",
                        _ => "fuse.meta_other",
                    });
                    self.crash_and_restart_later(id);
                }
                None => {
                    let bad = self.unreadable_made.get(&id).copied().unwrap_or(0);
                    let sectors = if bad > 0 {
                        format!(" (the simulator made {bad} of its data blocks unreadable)")
                    } else {
                        String::new()
                    };
                    self.fail(format!(
                        "osd {id}: the shard failed without an injected fault: {failure}{sectors}"
                    ));
                }
            }
        }
    }

    /// The core's counters of rare paths, as probes.
    fn count_probes(&mut self, p: &fastblock_shard::Probes) {
        self.probes.add("wal.full", p.wal_full);
        self.probes
            .add("wal.must_sync_skipped", p.must_sync_skipped);
        self.probes
            .add("wal.commits_overlapped", p.commits_overlapped);
        self.probes
            .add("flush.done_during_commit", p.flush_done_during_commit);
        self.probes.add("snapshot.started", p.transfers_started);
        self.probes
            .add("snapshot.interrupted", p.transfers_abandoned);
        self.probes
            .add("snapshot.dropped_unstaged", p.snapshots_unstaged);
        self.probes.add("admission.stale_epoch", p.stale_epoch);
        self.probes.add("admission.stale_term", p.stale_term);
        self.probes.add("client.dropped", p.writes_dropped);
        self.probes.add("wal.append_trimmed", p.appends_trimmed);
        self.probes.add("admission.pg_log_full", p.pg_log_full);
        self.probes.add("wal.pressure", p.wal_pressure);
        self.probes.add("wal.log_moved", p.log_rewrites);
        self.probes
            .add("wal.log_move_skipped", p.log_rewrites_skipped);
        self.probes.add("admission.fenced", p.fenced);
        self.probes.add("admission.held_for_term", p.held_for_term);
        self.probes
            .add("snapshot.backfill_too_full", p.backfill_too_full);
        self.probes
            .add("snapshot.backfill_refused", p.backfill_refused);
        self.probes.add("read.batched", p.reads_batched);
        self.probes
            .add("read.batch_retried", p.read_batches_retried);
    }

    fn on_pg_event(&mut self, id: OsdId, pg: PgId, event: Event) {
        match event {
            Event::BecameLeader(report) => {
                self.mix(u64::from(id.0) << 32 ^ report.term.0);
                if let Err(m) = self.safety.on_leader(pg, report.term.0, id) {
                    self.fail(m);
                }
                if !report.voters_outgoing.is_empty() {
                    self.probes.hit("member.joint_leader_change");
                }
                self.leading.insert((id, pg), report.term.0);
            }
            // The core reports these to the monitor itself (`Report`).
            Event::MembershipFinished(_) | Event::ConfigurationChanged(_) => {}
            Event::ConfChangeRefused { .. } => self.probes.hit("member.conf_change_refused"),
            Event::LeaderChanged { leader, term } => {
                if let Some(led) = self.leading.remove(&(id, pg)) {
                    if led == term.0 && leader != Some(id) {
                        self.probes.hit("raft.check_quorum_stepdown");
                    }
                }
            }
            Event::Failed { index, reason } => self.fail(format!(
                "pg {pg} osd {id}: replica failed at {index}: {reason}"
            )),
        }
    }

    // ---- monitor ----

    /// Applies a monitor operation to a copy and keeps it if it succeeded (the monitor
    /// service persists the copy in one etcd transaction); then publishes a new map.
    fn mon_op(&mut self, op: impl FnOnce(&mut MonState) -> Result<(), String>) -> bool {
        let before = self.mon.clone();
        match op(&mut self.mon) {
            Ok(()) => {
                let changed = self.mon.finish(&before);
                self.publish();
                changed
            }
            Err(_) => {
                self.mon = before;
                false
            }
        }
    }

    /// The image's size in bytes, as the clients' objects lay it out.
    fn full_bytes(&self) -> u64 {
        self.o.objects * self.o.object_bytes
    }

    /// Cuts the image's tail: the monitor records the reclaim, the model a zeroing of the
    /// tail that lasts until every PG confirmed it.
    fn on_shrink(&mut self) {
        let to = self.o.shrink_to_bytes;
        let shrunk = self.mon_op(|m| {
            m.resize_image(
                "sim",
                "sim",
                &ResizeImageRequest {
                    size_bytes: to,
                    allow_shrink: true,
                },
            )
            .map(|_| ())
            .map_err(|e| e.message)
        });
        let reclaim = self.mon.reclaim.keys().next_back().copied();
        let (true, Some(reclaim)) = (shrunk, reclaim) else {
            self.fail(format!(
                "the monitor refused to shrink the image to {to} bytes"
            ));
            return;
        };
        self.probes.hit("reclaim.shrunk");
        let first_block = to / BLOCK_BYTES as u64;
        let blocks = self.full_bytes() / BLOCK_BYTES as u64 - first_block;
        let per_object = self.o.object_bytes / BLOCK_BYTES as u64;
        let end_block = first_block + blocks;
        let mut zeroings = (0, 0);
        let mut block = first_block;
        while block < end_block {
            let next = ((block / per_object + 1) * per_object).min(end_block);
            let id = self.model.begin_zeroing(self.at_now(), block, next - block);
            zeroings = (if zeroings.0 == 0 { id } else { zeroings.0 }, id);
            block = next;
        }
        self.size_blocks = first_block;
        self.shrink = Some(Shrink {
            reclaim,
            zeroings,
            first_block,
            done_at: None,
            regrown_at: None,
        });
    }

    fn on_regrow(&mut self) {
        let full = self.full_bytes();
        let grown = self.mon_op(|m| {
            m.resize_image(
                "sim",
                "sim",
                &ResizeImageRequest {
                    size_bytes: full,
                    allow_shrink: false,
                },
            )
            .map(|_| ())
            .map_err(|e| e.message)
        });
        let Some(shrink) = self.shrink else { return };
        if !grown {
            self.fail("the monitor refused to grow the image back after its reclaim".into());
            return;
        }
        self.size_blocks = full / BLOCK_BYTES as u64;
        self.shrink = Some(Shrink {
            regrown_at: Some(self.at_now()),
            ..shrink
        });
        self.probes.hit("reclaim.regrown");
    }

    /// Applies a monitor operation that answers with a value, as [`Cluster::mon_op`] does:
    /// kept and published if it succeeded, undone if it failed.
    fn mon_call<T>(
        &mut self,
        op: impl FnOnce(&mut MonState) -> Result<T, ApiError>,
    ) -> Result<T, ApiError> {
        let before = self.mon.clone();
        let result = op(&mut self.mon);
        match &result {
            Ok(_) => {
                self.mon.finish(&before);
                self.publish();
            }
            Err(_) => self.mon = before,
        }
        result
    }

    /// The virtual clock in milliseconds: the monitor's clock for snapshot timeouts.
    fn mon_now_ms(&self) -> u64 {
        self.now / MS
    }

    /// The monitor takes a snapshot of the image (`MonState::create_snap`); the model records
    /// its creation interval from now until the monitor's record shows it created. Its create
    /// call aborts it at the timeout unless the call went away (then only the ticker does).
    fn on_snap_create(&mut self, index: usize) {
        let name = format!("s{index}");
        let now_ms = self.mon_now_ms();
        let overlapping = self
            .mon
            .snaps_of_image(IMAGE)
            .iter()
            .any(|s| s.state == SnapState::Creating);
        let info = match self.mon_call(|m| m.create_snap("sim", "sim", &name, now_ms)) {
            Ok(info) => info,
            Err(e) => {
                self.fail(format!(
                    "the monitor refused to take snapshot {name}: {:?}: {}",
                    e.code, e.message
                ));
                return;
            }
        };
        let snap = info.id.0;
        self.probes.hit("snap.creating");
        if overlapping {
            self.probes.hit("snap.overlapping");
        }
        if self.shrink.is_some_and(|s| s.regrown_at.is_none()) {
            self.probes.hit("snap.during_shrink");
        }
        self.model.begin_snap(snap, self.at_now());
        self.snaps.insert(
            snap,
            SnapRun {
                name,
                size_blocks: info.size_bytes / BLOCK_BYTES as u64,
                created: None,
                aborted: None,
                removed: None,
                trim: None,
            },
        );
        if !self.snap_rng.chance_pct(self.o.snap_caller_lost_pct) {
            let t = self.o.snap_create_timeout_us;
            self.after(t, Ev::SnapDeadline { snap });
        }
        if !self.snap_ticking {
            self.snap_ticking = true;
            let d = self.snap_rng.range(MS, SEC);
            self.after(d, Ev::SnapTick);
        }
    }

    /// The monitor's record of `snap` shows it created: its interval ends, clients may read
    /// it, and it may be removed later.
    fn snap_created(&mut self, snap: u64) {
        let now = self.at_now();
        self.model.snap_created(snap, now);
        self.snaps.get_mut(&snap).expect("taken").created = Some(now);
        self.probes.hit("snap.created");
        if self.snap_rng.chance_pct(self.o.snap_remove_pct) {
            // While clients still work, so that some of their reads of it are in flight.
            let last = self.faults_end_us + self.o.liveness_work_us;
            let at = (self.now + self.snap_rng.range(100 * MS, 5 * SEC)).min(last);
            self.snap_removals_pending += 1;
            self.at(at, Ev::SnapRemove { snap });
        }
    }

    /// The monitor aborted `snap` (its creation timed out): never read; its trim entry must
    /// be confirmed by every PG.
    fn snap_aborted(&mut self, snap: u64, by: &'static str) {
        let now = self.at_now();
        self.model.snap_aborted(snap, now);
        let trim = self.trim_of(snap);
        let run = self.snaps.get_mut(&snap).expect("taken");
        run.aborted = Some(now);
        run.trim = trim;
        if trim.is_none() {
            self.fail(format!("snapshot {snap} aborted without a trim entry"));
        }
        self.probes.hit(by);
    }

    /// The trim entry the monitor recorded for `snap`.
    fn trim_of(&self, snap: u64) -> Option<u64> {
        self.mon
            .snap_trims
            .values()
            .find(|t| t.image == IMAGE && t.snap == SnapId(snap))
            .map(|t| t.id)
    }

    /// The create call of `snap` stops waiting (`MonState::abort_snap_create`).
    fn on_snap_deadline(&mut self, snap: u64) {
        let outcome = self.mon_call(|m| m.abort_snap_create(IMAGE, SnapId(snap)));
        let run = &self.snaps[&snap];
        match outcome {
            Ok(SnapAbort::Created(_)) if run.created.is_some() => {}
            Ok(SnapAbort::Aborted { .. }) if run.created.is_none() && run.aborted.is_none() => {
                self.snap_aborted(snap, "snap.aborted");
            }
            // The ticker aborted it first, or it was created and removed since.
            Ok(SnapAbort::Gone) if run.aborted.is_some() || run.removed.is_some() => {}
            other => self.fail(format!(
                "snapshot {snap}: the create call's abort answered {other:?}, the simulator \
                 saw {run:?}"
            )),
        }
    }

    /// The monitor's ticker: aborts snapshots still `creating` after the timeout
    /// (`MonState::tick_snaps`), every second while one is `creating`.
    fn on_snap_tick(&mut self) {
        let now_ms = self.mon_now_ms();
        let timeout_ms = self.o.snap_create_timeout_us / MS;
        let aborted = self
            .mon_call(|m| Ok(m.tick_snaps(now_ms, timeout_ms)))
            .unwrap_or_default();
        for snap in aborted {
            let known = self.snaps.get(&snap.id.0);
            if snap.image != IMAGE
                || known.is_none_or(|r| r.created.is_some() || r.aborted.is_some())
            {
                self.fail(format!(
                    "the ticker aborted {snap:?}, the simulator saw {known:?}"
                ));
                return;
            }
            self.snap_aborted(snap.id.0, "snap.aborted_by_tick");
        }
        let creating = self
            .mon
            .snaps_of_image(IMAGE)
            .iter()
            .any(|s| s.state == SnapState::Creating);
        if creating {
            self.after(SEC, Ev::SnapTick);
        } else {
            self.snap_ticking = false;
        }
    }

    /// The monitor removes a created snapshot (`MonState::remove_snap`): clients stop reading
    /// it, and every PG must confirm its trim entry.
    fn on_snap_remove(&mut self, snap: u64) {
        self.snap_removals_pending -= 1;
        let name = self.snaps[&snap].name.clone();
        if let Err(e) = self.mon_call(|m| m.remove_snap("sim", "sim", &name)) {
            self.fail(format!(
                "the monitor refused to remove snapshot {snap} ({name}): {:?}: {}",
                e.code, e.message
            ));
            return;
        }
        let trim = self.trim_of(snap);
        let now = self.at_now();
        let run = self.snaps.get_mut(&snap).expect("taken");
        run.removed = Some(now);
        run.trim = trim;
        if trim.is_none() {
            self.fail(format!("snapshot {snap} removed without a trim entry"));
        }
        self.probes.hit("snap.removed");
    }

    // ---- reports: each node's outbox, sent in batches ----

    /// What a node's shard reported that no monitor record explains: a bug of the core.
    fn check_report_asked(&mut self, id: OsdId, report: &OsdReport) {
        match *report {
            OsdReport::ReclaimDone { pg, id: reclaim } => {
                if self.shrink.is_none_or(|s| s.reclaim != reclaim) {
                    self.fail(format!(
                        "osd {id}: reclaim {reclaim} of pg {pg} reported, none was asked"
                    ));
                }
            }
            OsdReport::SnapMarked { pg, image, snap } => {
                if image != IMAGE || !self.snaps.contains_key(&snap) {
                    self.fail(format!(
                        "osd {id}: snapshot {snap} of image {image} marked in pg {pg}, none \
                         was taken"
                    ));
                }
            }
            OsdReport::SnapTrimmed { pg, id: trim } => {
                if !self.snaps.values().any(|s| s.trim == Some(trim)) {
                    self.fail(format!(
                        "osd {id}: snapshot trim {trim} of pg {pg} reported, none was asked"
                    ));
                }
            }
            OsdReport::LeaderElected { .. } | OsdReport::MembershipFinished { .. } => {}
        }
    }

    /// Puts a report in node `id`'s outbox; the next report tick sends it.
    fn queue_report(&mut self, id: OsdId, report: OsdReport) {
        self.outboxes.entry(id).or_default().push(report);
        self.maybe_schedule_report_tick(id);
    }

    fn maybe_schedule_report_tick(&mut self, id: OsdId) {
        let waiting = self.outboxes.get(&id).is_some_and(|o| !o.is_empty());
        if !waiting
            || self.report_tick_pending.contains(&id)
            || self.reports_in_flight.contains_key(&id)
        {
            return;
        }
        let life = self.nodes[&id].incarnation;
        self.report_tick_pending.insert(id);
        self.after(REPORT_TICK_US, Ev::ReportTick { node: id, life });
    }

    fn on_report_tick(&mut self, id: OsdId, life: u64) {
        if !self.alive(id, life) {
            return;
        }
        self.report_tick_pending.remove(&id);
        if self.reports_in_flight.contains_key(&id) {
            return;
        }
        let batch = self.outboxes.entry(id).or_default().take_batch();
        if batch.is_empty() {
            return;
        }
        self.reports_in_flight.insert(id, life);
        let d = self.rng.range(MS, 20 * MS);
        self.after(
            d,
            Ev::MonReports {
                from: id,
                life,
                batch,
            },
        );
    }

    /// A batch reaches the monitor: applied in one operation, as `POST /v1/osds/{id}/reports`
    /// does (`MonState::apply_reports`), from the genuine (simulated) OSD `from`, authenticated
    /// as itself. The monitor may find a report stale (delayed, or reordered behind a newer
    /// one), but refusing one for any other reason is a bug in its rules
    /// (`fastblock_mon_core::report_checks`) or in the leader: the run fails.
    fn on_mon_reports(&mut self, from: OsdId, life: u64, batch: Vec<OsdReport>) {
        let had_target: Vec<bool> = batch
            .iter()
            .map(|r| match r {
                OsdReport::MembershipFinished { pg, .. } => self
                    .mon
                    .map
                    .pg(*pg)
                    .is_some_and(|info| !info.newosdlist.is_empty()),
                _ => false,
            })
            .collect();
        let before = self.mon.clone();
        let results = self.mon.apply_reports(Reporter::Osd(from), &batch);
        self.mon.finish(&before);
        self.publish();
        for ((report, result), had_target) in batch.iter().zip(&results).zip(had_target) {
            if self.refused_from_outside(&before, from, report, result.as_ref()) {
                continue;
            }
            self.after_report(from, report, result.as_ref(), had_target);
        }
        let d = self.rng.range(MS, 20 * MS);
        self.after(
            d,
            Ev::ReportsAnswered {
                node: from,
                life,
                batch,
                results,
            },
        );
    }

    /// A reclaim, snapshot-mark or snapshot-trim confirmation refused because the PG's record
    /// does not name its sender (`report_checks::check_confirmer`): a leader that has since
    /// left the PG (the record moved on while its confirmation waited). Genuine, and harmless:
    /// the PG's current leader confirms again. Counted if the record at the batch's start
    /// indeed did not name the sender (within its own batch a sender's reports only add it),
    /// asked of the monitor's own rule (`MonState::check_confirmation`); the run fails if it
    /// did.
    fn refused_from_outside(
        &mut self,
        before: &MonState,
        from: OsdId,
        report: &OsdReport,
        result: Option<&ApiError>,
    ) -> bool {
        let confirmation = matches!(
            report,
            OsdReport::ReclaimDone { .. }
                | OsdReport::SnapMarked { .. }
                | OsdReport::SnapTrimmed { .. }
        );
        let Some(e) = result.filter(|e| confirmation && e.code == ErrorCode::ImplausibleReport)
        else {
            return false;
        };
        if before
            .check_confirmation(Reporter::Osd(from), report.pg())
            .is_ok()
        {
            self.fail(format!(
                "osd {from}: the monitor refused a confirmation for pg {} from a member: {}",
                report.pg(),
                e.message
            ));
        } else {
            self.probes.hit("confirm.from_outside");
        }
        true
    }

    /// What the simulator makes of one report the monitor took or refused.
    fn after_report(
        &mut self,
        from: OsdId,
        report: &OsdReport,
        result: Option<&ApiError>,
        had_target: bool,
    ) {
        match (report, result) {
            (OsdReport::LeaderElected { .. } | OsdReport::MembershipFinished { .. }, Some(e))
                if e.code != ErrorCode::StaleReport =>
            {
                self.fail(format!(
                    "osd {from}: the monitor refused a genuine report for pg {}: {:?}: {}",
                    report.pg(),
                    e.code,
                    e.message
                ));
            }
            (OsdReport::MembershipFinished { pg, .. }, None) => {
                let cleared = self
                    .mon
                    .map
                    .pg(*pg)
                    .is_some_and(|info| info.newosdlist.is_empty());
                if had_target && cleared {
                    self.probes.hit("member.finished");
                }
            }
            (OsdReport::ReclaimDone { .. }, _) => self.maybe_shrink_done(),
            (OsdReport::SnapMarked { snap, .. }, None) => {
                let created = self
                    .mon
                    .snaps
                    .get(&IMAGE)
                    .and_then(|v| v.iter().find(|s| s.id == SnapId(*snap)))
                    .is_some_and(|s| s.state == SnapState::Created);
                if created && self.snaps[snap].created.is_none() {
                    self.snap_created(*snap);
                }
            }
            (OsdReport::SnapMarked { pg, snap, .. }, Some(e)) => {
                if e.code == ErrorCode::SnapNotFound {
                    self.probes.hit("snap.mark_of_gone");
                } else {
                    self.fail(format!(
                        "pg {pg}: the monitor refused the mark of snapshot {snap}: {:?}: {}",
                        e.code, e.message
                    ));
                }
            }
            (OsdReport::SnapTrimmed { id, .. }, None) if !self.mon.snap_trims.contains_key(id) => {
                self.probes.hit("snap.trimmed");
            }
            (OsdReport::SnapTrimmed { pg, id }, Some(e))
                if e.code != ErrorCode::SnapTrimNotFound =>
            {
                self.fail(format!(
                    "pg {pg}: the monitor refused the confirmation of snapshot trim {id}: {:?}: {}",
                    e.code, e.message
                ));
            }
            _ => {}
        }
    }

    /// Every PG confirmed the shrink's deletion (the monitor dropped its reclaim entry): the
    /// model's zeroings of the tail are done, and the image grows back later.
    fn maybe_shrink_done(&mut self) {
        let Some(shrink) = self.shrink else { return };
        if shrink.done_at.is_none() && !self.mon.reclaim.contains_key(&shrink.reclaim) {
            let now = self.at_now();
            for id in shrink.zeroings.0..=shrink.zeroings.1 {
                self.model.ack(id, now);
            }
            self.shrink = Some(Shrink {
                done_at: Some(now),
                ..shrink
            });
            self.probes.hit("reclaim.done");
            let d = self.rng.range(0, 2 * SEC);
            self.after(d, Ev::Regrow);
        }
    }

    /// The monitor's answer reaches the node: what it could not take yet waits for the next
    /// batch (`ReportOutbox::settle`).
    fn on_reports_answered(
        &mut self,
        id: OsdId,
        life: u64,
        batch: Vec<OsdReport>,
        results: Vec<Option<ApiError>>,
    ) {
        if self.reports_in_flight.get(&id) == Some(&life) {
            self.reports_in_flight.remove(&id);
        }
        if !self.alive(id, life) {
            return;
        }
        self.outboxes.entry(id).or_default().settle(batch, results);
        self.maybe_schedule_report_tick(id);
    }

    /// Sends a new map to every running node (each gets it after its own delay; a node that
    /// is down gets the current map when it restarts).
    fn publish(&mut self) {
        if self.mon.map.epoch <= self.published {
            return;
        }
        self.published = self.mon.map.epoch;
        let ids: Vec<OsdId> = self.nodes.keys().copied().collect();
        for id in ids {
            let life = self.nodes[&id].incarnation;
            let d = self.rng.range(MS, 50 * MS);
            self.after(d, Ev::MapTo { node: id, life });
        }
    }

    fn on_map_to(&mut self, id: OsdId, life: u64) {
        if !self.alive(id, life) {
            return;
        }
        if self
            .map_stalled
            .get(&id)
            .is_some_and(|until| self.now < *until)
        {
            return;
        }
        self.deliver_map(id);
    }

    /// What node `id` asks the monitor for, as `follow_map` does: the changes since the epoch
    /// it has, scoped to its PGs (a whole map after a restart), applied to its copy; the new
    /// map goes to its core.
    fn deliver_map(&mut self, id: OsdId) {
        self.sync_map_log();
        let follower = self
            .followers
            .entry(id)
            .or_insert_with(|| MapFollower::new(MapScope::Osd(id)));
        let update = self.map_log.update_for(follower.epoch(), follower.scope());
        match follower.apply(update) {
            Ok(Some(map)) => self.run_node(id, Input::Map(map)),
            Ok(None) => {}
            Err(gap) => self.fail(format!(
                "osd {id}: the map log's delta did not apply: {gap}"
            )),
        }
    }

    /// Records the monitor's map in the log if its epoch moved. An epoch names one map:
    /// `MonState::finish` bumps it on every change.
    fn sync_map_log(&mut self) {
        if self.map_log.current().epoch != self.mon.map.epoch {
            self.map_log.push(Arc::new(self.mon.map.clone()));
        }
    }

    /// The monitor's current map, shared (what clients are given).
    fn current_map(&mut self) -> Arc<ClusterMap> {
        self.sync_map_log();
        self.map_log.current().clone()
    }

    /// The PGs of the pool, as the monitor has them.
    pub fn pg_infos(&self) -> BTreeMap<PgId, PgInfo> {
        self.mon.map.pgmaps[&self.pool]
            .pgs
            .iter()
            .map(|(seq, info)| (PgId::new(self.pool, *seq), info.clone()))
            .collect()
    }

    /// Current members of a PG (the monitor's `osdlist`).
    pub fn members(&self, pg: PgId) -> Vec<OsdId> {
        self.mon.map.pgmaps[&pg.pool].pgs[&pg.seq].osdlist.clone()
    }

    // ---- network ----

    fn partitioned(&self, a: OsdId, b: OsdId) -> bool {
        self.partition
            .as_ref()
            .is_some_and(|side| side.contains(&a) != side.contains(&b))
    }

    /// Sends a peer request of a node's step. A `RaftBatch` is split into one request per
    /// envelope, so that each Raft message is lost, delayed, duplicated and reordered on its
    /// own (the OSD sends the batch as one frame; Raft must not depend on that).
    fn send_peer(&mut self, from: OsdId, send: PeerSend) {
        let PeerSend { to, pg, req } = send;
        match req {
            Request::RaftBatch {
                from: sender,
                to: receiver,
                msgs,
            } => {
                for env in msgs {
                    let pg = env.pg;
                    let req = Request::RaftBatch {
                        from: sender,
                        to: receiver,
                        msgs: vec![env],
                    };
                    self.send(from, to, pg, req);
                }
            }
            req => self.send(from, to, pg, req),
        }
    }

    fn send(&mut self, from: OsdId, to: OsdId, pg: PgId, req: Request) {
        if self.partitioned(from, to) {
            self.probes.hit("net.partition_drop");
            return;
        }
        if self.faults_on && self.rng.chance_ppm(self.o.loss_ppm) {
            self.probes.hit("net.loss");
            return;
        }
        let copies = if self.faults_on && self.rng.chance_ppm(self.o.dup_ppm) {
            2
        } else {
            1
        };
        let seq = self.link_sent.entry((from, to)).or_default();
        *seq += 1;
        let link_seq = *seq;
        // Snapshot chunks and acknowledgements keep their order on a link, as on the OSD's
        // TCP link (the transfer protocol relies on it: a gap makes the receiver refuse and
        // the sender start over); losses model a dropped connection. Raft messages may also
        // be reordered and duplicated: Raft must not depend on order, and testing it against
        // more than TCP does costs nothing.
        let fifo = !matches!(req, Request::RaftBatch { .. });
        for _ in 0..copies {
            let mut d = self.rng.range(self.o.delay_us_min, self.o.delay_us_max);
            if self.faults_on && self.rng.chance_ppm(self.o.spike_ppm) {
                d += self.rng.range(0, self.o.spike_us_max);
            }
            if fifo {
                let at = (self.now + d).max(self.fifo_after.get(&(from, to)).copied().unwrap_or(0));
                self.fifo_after.insert((from, to), at);
                d = at - self.now;
            }
            self.after(
                d,
                Ev::Packet {
                    from,
                    to,
                    pg,
                    req: req.clone(),
                    link_seq,
                },
            );
        }
    }

    /// A peer request arrives: the receiving core steps it (a node that is down drops it).
    fn on_packet(&mut self, from: OsdId, to: OsdId, pg: PgId, req: Request, link_seq: u64) {
        if self.partitioned(from, to) {
            self.probes.hit("net.partition_drop");
            return;
        }
        let last = self.link_delivered.entry((from, to)).or_default();
        if link_seq < *last {
            self.probes.hit("net.reorder");
        } else if link_seq == *last {
            self.probes.hit("net.duplicate");
        }
        *last = (*last).max(link_seq);
        if !self.nodes[&to].is_up() {
            return;
        }
        debug_assert!(
            req.kind().is_osd_to_osd(),
            "pg {pg}: a client request on a peer link"
        );
        let input = Input::Request {
            conn: PEER_CONN | u64::from(from.0),
            request_id: 0,
            req,
            arrived: Micros(self.now),
        };
        self.run_node(to, input);
    }

    // ---- faults ----

    fn on_fault(&mut self, kind: FaultKind) {
        if !self.faults_on {
            return;
        }
        if matches!(kind, FaultKind::BadBlock | FaultKind::Scrub) {
            self.on_disk_fault(kind);
            return;
        }
        let every = match kind {
            FaultKind::Crash => self.o.crash_every_us,
            FaultKind::Fuse => self.o.fuse_every_us,
            FaultKind::Partition => self.o.partition_every_us,
            FaultKind::Slow => self.o.slow_every_us,
            FaultKind::OutIn => self.o.outin_every_us,
            FaultKind::MapStall => self.o.map_stall_every_us,
            FaultKind::BadBlock | FaultKind::Scrub => unreachable!("drawn from rot_rng"),
        };
        let next = self.rng.range(every / 4, every * 2);
        self.after(next, Ev::Fault(kind));
        let ids: Vec<OsdId> = self.nodes.keys().copied().collect();
        let up: Vec<OsdId> = ids
            .iter()
            .copied()
            .filter(|i| self.nodes[i].is_up())
            .collect();
        let down = ids.len() - up.len();
        match kind {
            FaultKind::Crash => {
                if up.is_empty() || down >= self.o.down_max as usize {
                    return;
                }
                let id = self.pick_awkward(&up);
                self.crash_and_restart_later(id);
            }
            FaultKind::MapStall => {
                if up.is_empty() {
                    return;
                }
                let id = self.pick_awkward(&up);
                let until = self.now + self.rng.range(100 * MS, self.o.map_stall_us_max);
                let life = self.nodes[&id].incarnation;
                self.map_stalled.insert(id, until);
                self.probes.hit("map.stalled");
                // When the watch recovers, the node gets the map of that moment.
                self.at(until, Ev::MapTo { node: id, life });
            }
            FaultKind::Fuse => {
                if up.is_empty() || down >= self.o.down_max as usize {
                    return;
                }
                let id = self.rng.pick(&up);
                let ios = self.rng.range(0, 300);
                self.nodes[&id].arm_fuse(ios);
            }
            FaultKind::Partition => {
                let mut side = BTreeSet::new();
                if self.rng.chance_pct(50) {
                    // Isolate a leader, possibly with a minority of others.
                    side.insert(self.pick_awkward(&ids));
                    for id in &ids {
                        if side.len() < (ids.len() - 1) / 2 && self.rng.chance_pct(30) {
                            side.insert(*id);
                        }
                    }
                } else {
                    for id in &ids {
                        if self.rng.chance_pct(50) {
                            side.insert(*id);
                        }
                    }
                }
                if side.is_empty() || side.len() == ids.len() {
                    side = BTreeSet::from([self.rng.pick(&ids)]);
                }
                // One node isolated is cut off from the clients too (its link is down);
                // groups of nodes apart still reach them.
                let cut = if side.len() == 1 {
                    side.clone()
                } else {
                    BTreeSet::new()
                };
                self.partition = Some(side);
                self.set_clients_cut(cut);
                let d = self.rng.range(100 * MS, self.o.partition_us_max);
                self.after(d, Ev::Heal);
            }
            FaultKind::OutIn => self.out_or_in(&ids),
            FaultKind::BadBlock | FaultKind::Scrub => unreachable!("drawn from rot_rng"),
            FaultKind::Slow => {
                let id = self.pick_awkward(&ids);
                let latency = self.rng.range(MS, self.o.slow_commit_us_max);
                self.nodes.get_mut(&id).expect("known").slow_commit_us = Some(latency);
                let d = self.rng.range(100 * MS, self.o.slow_for_us_max);
                self.after(d, Ev::SlowEnd { node: id });
            }
        }
    }

    /// A node to hit: half the time one that leads some PG (leader changes at awkward
    /// moments), else any of `candidates` (non-empty).
    fn pick_awkward(&mut self, candidates: &[OsdId]) -> OsdId {
        if self.rng.chance_pct(50) {
            let leaders: Vec<OsdId> = candidates
                .iter()
                .copied()
                .filter(|id| !self.leaders_on(*id).is_empty())
                .collect();
            if !leaders.is_empty() {
                return self.rng.pick(&leaders);
            }
        }
        self.rng.pick(candidates)
    }

    /// Marks an out OSD in again (if it is up), or an in OSD out, keeping enough OSDs in for
    /// placement to find every PG its full size.
    fn out_or_in(&mut self, ids: &[OsdId]) {
        let out: Vec<OsdId> = ids
            .iter()
            .copied()
            .filter(|id| !self.mon.map.osds[id].is_in)
            .collect();
        let out_max = (self.o.nodes - self.o.replicas) as usize;
        let bring_in = !out.is_empty() && (out.len() >= out_max || self.rng.chance_pct(50));
        if bring_in {
            let id = self.rng.pick(&out);
            if self.mon_op(|m| m.mark_in(id).map_err(|e| e.message)) {
                self.probes.hit("member.in_rebalance");
            }
        } else if out.len() < out_max {
            let candidates: Vec<OsdId> = ids
                .iter()
                .copied()
                .filter(|id| self.mon.map.osds[id].is_in)
                .collect();
            let id = self.pick_awkward(&candidates);
            if self.mon_op(|m| m.mark_out(id).map_err(|e| e.message)) {
                self.probes.hit("member.out_remap");
            }
        }
    }

    fn crash_and_restart_later(&mut self, id: OsdId) {
        self.crash(id);
        let d = self.rng.range(10 * MS, self.o.down_us_max);
        self.after(d, Ev::Restart { node: id });
    }

    fn crash(&mut self, id: OsdId) {
        let node = self.nodes.get_mut(&id).expect("known node");
        if !node.is_up() {
            return;
        }
        self.crashes += 1;
        let lsn = node
            .core()
            .map(|c| c.store().wal().durable_lsn())
            .unwrap_or(0);
        let seed = self.rng.next_u64();
        let node = self.nodes.get_mut(&id).expect("known node");
        let (pending, owed) = node.crash(seed);
        self.crash_state.insert(id, (lsn, owed));
        self.probes.hit(if owed {
            "crash.during_slow_commit"
        } else if pending > 0 {
            "crash.unsynced_writes"
        } else {
            "crash.clean"
        });
        self.leading.retain(|(n, _), _| *n != id);
        // The process's outbox goes with it (its shards report again what still matters).
        self.outboxes.remove(&id);
        self.report_tick_pending.remove(&id);
        self.reports_in_flight.remove(&id);
        self.mon_op(|m| m.mark_down(id).map_err(|e| e.message));
    }

    fn restart(&mut self, id: OsdId) {
        if self.nodes[&id].is_up() {
            return;
        }
        // A new process fetches the current map at boot: an old watch's stall is gone.
        self.map_stalled.remove(&id);
        if let Err(e) = self.nodes.get_mut(&id).expect("known").restart() {
            self.fail(e);
            return;
        }
        let core = self.nodes[&id].core().expect("just started");
        let lsn = core.store().wal().durable_lsn();
        let crash_state = self.crash_state.remove(&id);
        if let Some((before, owed)) = crash_state {
            if lsn < before && !owed {
                self.fail(format!(
                    "osd {id}: WAL lost synced records in a crash: durable LSN {before} before, \
                     {lsn} after"
                ));
            } else if lsn < before {
                self.probes.hit("restart.wal_tail_cut");
            } else if owed {
                self.probes.hit("restart.unsynced_commit_survived");
            }
        }
        self.check_reported_confs(id, crash_state.is_some_and(|(_, owed)| owed));
        // The store is open; the core hosts PGs once it has the current map, which the new
        // process fetches whole.
        self.followers
            .insert(id, MapFollower::new(MapScope::Osd(id)));
        self.deliver_map(id);
        let reapplied = self.nodes[&id].core().is_some_and(|core| {
            let store = core.store();
            core.hosted().any(|pg| {
                let applied = store.applied_index(pg);
                core.replica(pg)
                    .is_some_and(|r| r.commit_index().0 > applied && applied > 0)
            })
        });
        if reapplied {
            self.probes.hit("restart.reapplied");
        }
        self.schedule_timers(id);
        self.mon_op(|m| boot(m, id));
    }

    fn note_reported_conf(&mut self, id: OsdId, pg: PgId, conf_index: u64) {
        let at = self.reported_conf.entry((id, pg)).or_default();
        *at = (*at).max(conf_index);
    }

    /// A restarted node still has committed every configuration it reported leading with
    /// (the shard core sends such a report only once what it was applied from is durable):
    /// otherwise it comes back in a configuration the monitor has moved past, and may need
    /// the vote of a member the monitor dropped by the report (seed 3856582366863085052).
    /// A crash during a slow commit may cut the WAL's tail (see the LSN check above): not
    /// checked then. PGs the store no longer has are forgotten.
    fn check_reported_confs(&mut self, id: OsdId, owed: bool) {
        let Some(core) = self.nodes[&id].core() else {
            return;
        };
        let store = core.store();
        let mut lost = None;
        self.reported_conf.retain(|(node, pg), conf_index| {
            if *node != id {
                return true;
            }
            let Some(log) = store.pg_log(*pg) else {
                return false;
            };
            if log.hard_state.commit < *conf_index && !owed && lost.is_none() {
                lost = Some(format!(
                    "osd {id}: pg {pg} restarted with commit index {} below the configuration \
                     at {conf_index} it reported leading with",
                    log.hard_state.commit
                ));
            }
            true
        });
        drop(store);
        if let Some(message) = lost {
            self.fail(message);
        }
    }

    fn on_faults_end(&mut self) {
        self.faults_on = false;
        self.partition = None;
        self.set_clients_cut(BTreeSet::new());
        for (id, _) in std::mem::take(&mut self.map_stalled) {
            if let Some(n) = self.nodes.get(&id) {
                let life = n.incarnation;
                self.after(0, Ev::MapTo { node: id, life });
            }
        }
        let ids: Vec<OsdId> = self.nodes.keys().copied().collect();
        for id in ids {
            let node = self.nodes.get_mut(&id).expect("known");
            node.slow_commit_us = None;
            node.disarm_fuse();
            node.faults().bad.misdirect = None;
            if !node.is_up() {
                self.restart(id);
            }
        }
        // Everything back in: remaps are cancelled or rebalanced, and must converge too.
        let out: Vec<OsdId> = self
            .mon
            .map
            .osds
            .values()
            .filter(|o| !o.is_in)
            .map(|o| o.id)
            .collect();
        for id in out {
            if self.mon_op(|m| m.mark_in(id).map_err(|e| e.message)) {
                self.probes.hit("member.in_rebalance");
            }
        }
        self.after(250 * MS, Ev::LivenessCheck);
    }

    // ---- clients ----

    fn client_delay(&mut self) -> u64 {
        self.rng.range(20, 500)
    }

    fn current_attempt(&self, tag: ClientTag) -> bool {
        let c = &self.clients[tag.client as usize];
        c.op.is_some() && c.attempt == tag.attempt
    }

    fn next_op(&mut self, client: u32) {
        let c = client as usize;
        assert!(
            self.clients[c].op.is_none(),
            "client {client} has an operation"
        );
        if self.now >= self.faults_end_us + self.o.liveness_work_us {
            self.clients[c].stopped = true;
            return;
        }
        if let Some(op) = self.maybe_snap_read() {
            self.start_op(client, op);
            return;
        }
        let blocks_per_object = self.o.object_bytes / BLOCK_BYTES as u64;
        let hot = self.o.hot_blocks > 0 && self.rng.chance_pct(80);
        let (object, block) = if hot {
            // Contention: most operations hit a few blocks of the first objects, so reads
            // often follow writes of the same block from other clients.
            let object = self.rng.range(0, self.o.objects.min(2) - 1);
            (object, self.rng.range(0, self.o.hot_blocks - 1))
        } else {
            let object = self.rng.range(0, self.o.objects - 1);
            (object, self.rng.range(0, blocks_per_object - 1))
        };
        let blocks = self
            .rng
            .range(1, self.o.write_blocks_max.min(blocks_per_object - block));
        // Within the image's current size, but for a stale client's share while it is shrunk.
        let full_blocks = self.full_bytes() / BLOCK_BYTES as u64;
        let beyond = self.size_blocks < full_blocks && self.rng.chance_pct(self.o.stale_size_pct);
        let (object, block, blocks) = if beyond {
            (object, block, blocks)
        } else {
            let first = (object * blocks_per_object + block) % self.size_blocks;
            let block = first % blocks_per_object;
            let room = (blocks_per_object - block).min(self.size_blocks - first);
            (first / blocks_per_object, block, blocks.min(room))
        };
        let read_pct = if client == 0 && self.o.reader_client {
            100
        } else {
            self.o.read_pct
        };
        let write = !self.rng.chance_pct(read_pct);
        let mut op = self.new_op(write, object, block, blocks);
        op.beyond = beyond;
        self.start_op(client, op);
    }

    /// Starts `op` on `client`: its pacer, the map it routes by, the first attempt.
    fn start_op(&mut self, client: u32, op: ClientOp) {
        let c = client as usize;
        self.clients[c].op = Some(op);
        self.clients[c].pacer = Some(Pacer::new(self.rng.next_u64()));
        self.clients[c].map = self.current_map();
        self.send_attempt(client);
    }

    /// The snapshots clients may read: created and not removed.
    fn readable_snaps(&self) -> Vec<u64> {
        self.snaps
            .iter()
            .filter(|(_, r)| r.created.is_some() && r.removed.is_none())
            .map(|(id, _)| *id)
            .collect()
    }

    /// In `SimOptions::snap_read_pct` of the operations while a snapshot is readable: a read
    /// of 1-4 blocks of one, at a random place within its size (drawn from `snap_rng`).
    fn maybe_snap_read(&mut self) -> Option<ClientOp> {
        let readable = self.readable_snaps();
        if readable.is_empty() || !self.snap_rng.chance_pct(self.o.snap_read_pct) {
            return None;
        }
        let snap = self.snap_rng.pick(&readable);
        let size_blocks = self.snaps[&snap].size_blocks;
        let blocks_per_object = self.o.object_bytes / BLOCK_BYTES as u64;
        let first = self.snap_rng.range(0, size_blocks - 1);
        let room = (blocks_per_object - first % blocks_per_object).min(size_blocks - first);
        let blocks = self.snap_rng.range(1, room.min(4));
        Some(self.snap_read_op(snap, first, blocks))
    }

    /// A read of `blocks` blocks of snapshot `snap` from image block `first_block` on (within
    /// one object).
    fn snap_read_op(&mut self, snap: u64, first_block: u64, blocks: u64) -> ClientOp {
        let blocks_per_object = self.o.object_bytes / BLOCK_BYTES as u64;
        let object = first_block / blocks_per_object;
        let block = first_block % blocks_per_object;
        assert!(
            block + blocks <= blocks_per_object,
            "a read within one object"
        );
        self.op_of(ClientOpKind::SnapRead { snap }, object, block, blocks)
    }

    /// An operation of `kind` on `blocks` blocks of `object` from `block` on, issued now.
    fn op_of(&self, kind: ClientOpKind, object: u64, block: u64, blocks: u64) -> ClientOp {
        let blocks_per_object = self.o.object_bytes / BLOCK_BYTES as u64;
        ClientOp {
            kind,
            beyond: false,
            pg: object_pg(self.pool, self.o.pg_count, IMAGE, object),
            object: ObjectRef {
                image: IMAGE,
                index: object,
            },
            offset: (block * BLOCK_BYTES as u64) as u32,
            first_block: object * blocks_per_object + block,
            blocks,
            started: self.now,
            attempt_started: self.at_now(),
        }
    }

    /// A new operation: a write of fresh stamps to `blocks` blocks of `object` from `block`
    /// on (the model records it as issued now), or a read of them.
    fn new_op(&mut self, write: bool, object: u64, block: u64, blocks: u64) -> ClientOp {
        let blocks_per_object = self.o.object_bytes / BLOCK_BYTES as u64;
        let first_block = object * blocks_per_object + block;
        let kind = if write {
            let id = self.model.begin_write(self.at_now(), first_block, blocks);
            let mut data = BytesMut::zeroed(blocks as usize * BLOCK_BYTES);
            for (i, b) in data.chunks_exact_mut(BLOCK_BYTES).enumerate() {
                stamp_block(
                    b,
                    IMAGE.0,
                    (first_block + i as u64) * BLOCK_BYTES as u64,
                    id,
                );
            }
            ClientOpKind::Write {
                id,
                data: data.freeze(),
            }
        } else {
            ClientOpKind::Read
        };
        self.op_of(kind, object, block, blocks)
    }

    /// Where a client sends its next attempt: the last leader it heard of, else one of the
    /// library's leader candidates for its map (`route::leader_candidates`: the recorded
    /// leader first, then the up members). The library asks the candidates `GetLeader` in
    /// order; the simulator sends the request itself, to the first candidate most of the
    /// time and to any other now and then, so requests reach non-leaders too. `None` when
    /// no member is up in the client's map. With the term the library would name: the
    /// hint's, else the map's (`route::map_leader_term`, 0 unless the map records the node as
    /// leader).
    fn target(&mut self, client: u32, pg: PgId) -> Option<(OsdId, u64)> {
        let c = &self.clients[client as usize];
        if let Some(h) = c.hints.get(&pg) {
            return Some(*h);
        }
        let candidates = leader_candidates(&c.map, pg);
        let first = *candidates.first()?;
        let node = if self.rng.chance_pct(70) {
            first
        } else {
            self.rng.pick(&candidates)
        };
        let c = &self.clients[client as usize];
        Some((node, map_leader_term(&c.map, pg, node)))
    }

    fn send_attempt(&mut self, client: u32) {
        let c = client as usize;
        self.clients[c].attempt += 1;
        let attempt = self.clients[c].attempt;
        let now = self.at_now();
        let op = self.clients[c].op.as_mut().expect("an operation");
        op.attempt_started = now;
        let op = op.clone();
        let Some((node, term)) = self.target(client, op.pg) else {
            // The library's discovery finds no member up: it retries after a pause.
            self.probes.hit("client.no_member_up");
            self.back_off(client);
            return;
        };
        self.clients[c].asked = Some((node, term));
        // The request carries the epoch of the map the client routes by: an OSD whose map is
        // older or newer and that does not host the PG answers `StaleEpoch`.
        let epoch = self.clients[c].map.epoch;
        let addr = ObjectAddr {
            pg: op.pg,
            image: op.object.image,
            object_index: op.object.index,
        };
        let req = match &op.kind {
            ClientOpKind::Write { data, .. } => Request::Write {
                addr,
                offset: op.offset,
                epoch,
                term,
                data: data.clone(),
            },
            ClientOpKind::Read => Request::Read {
                addr,
                offset: op.offset,
                length: (op.blocks as usize * BLOCK_BYTES) as u32,
                epoch,
            },
            ClientOpKind::SnapRead { snap } => Request::SnapRead {
                addr,
                offset: op.offset,
                length: (op.blocks as usize * BLOCK_BYTES) as u32,
                epoch,
                snap: *snap,
            },
        };
        let tag = ClientTag { client, attempt };
        let d = self.client_delay();
        self.after(d, Ev::ClientSend { node, tag, req });
        let t = self.o.attempt_timeout_us;
        self.after(t, Ev::ClientTimeout { tag });
    }

    /// Retries the current operation after `delay`, or gives up after its deadline.
    fn retry(&mut self, client: u32, delay: u64) {
        let c = client as usize;
        let op = self.clients[c].op.clone().expect("an operation");
        if self.now.saturating_sub(op.started) >= self.o.op_deadline_us {
            if op.started >= self.faults_end_us {
                self.fail(format!(
                    "liveness: client {client} could not complete an operation on pg {} \
                     issued at {} after the faults stopped",
                    op.pg, op.started
                ));
            }
            if let ClientOpKind::Write { id, .. } = op.kind {
                self.probes.hit("client.gave_up");
                self.model.give_up(id, self.at_now());
            }
            self.finish_op(client);
            return;
        }
        // Invalidate the current attempt now; the new one is sent after the delay.
        self.clients[c].attempt += 1;
        let tag = ClientTag {
            client,
            attempt: self.clients[c].attempt,
        };
        self.after(delay, Ev::ClientRetry { tag });
    }

    fn finish_op(&mut self, client: u32) {
        let c = client as usize;
        self.clients[c].op = None;
        self.clients[c].attempt += 1;
        if self.clients[c].scripted {
            return;
        }
        if self.sweep.as_ref().is_some_and(|s| s.client == client) {
            self.next_sweep_read();
            return;
        }
        let think = self.rng.range(0, self.o.think_us_max);
        self.after(think, Ev::ClientNext { client });
    }

    fn on_client_reply(&mut self, tag: ClientTag, reply: ClientReply) {
        if !self.current_attempt(tag) {
            return;
        }
        let c = tag.client as usize;
        let op = self.clients[c]
            .op
            .clone()
            .expect("current attempt has an op");
        let context = ReplyContext {
            beyond: self.may_be_beyond(&op),
            snaps_taken: !self.snaps.is_empty(),
            snap_removed: match op.kind {
                ClientOpKind::SnapRead { snap } => self.snaps[&snap].removed.is_some(),
                _ => false,
            },
        };
        if let Err(m) = expected_reply(&reply, &op.kind, context) {
            self.fail(format!("client {}: {m} (to {op:?})", tag.client));
            return;
        }
        if reply.status() == Some(Status::SnapInProgress) {
            self.probes.hit("snap.write_refused");
        }
        if reply.status() == Some(Status::Repairing) {
            self.probes.hit("client.repairing");
        }
        if self.clients[c].scripted {
            self.clients[c].result = Some(reply.clone());
            if !reply.is_ok() && !reply.is_data() {
                if let ClientOpKind::Write { id, .. } = op.kind {
                    self.model.give_up(id, self.at_now());
                }
                self.finish_op(tag.client);
                return;
            }
        }
        match (reply, &op.kind) {
            (ClientReply::Osd(Reply::Ok), ClientOpKind::Write { id, .. }) => {
                if let Some(m) = self.beyond_the_end(&op) {
                    self.fail(format!("client {}: {m}", tag.client));
                    return;
                }
                self.model.ack(*id, self.at_now());
                self.finish_op(tag.client);
            }
            (ClientReply::Osd(Reply::Data(data)), ClientOpKind::SnapRead { snap }) => {
                for i in 0..op.blocks {
                    let block = &data[i as usize * BLOCK_BYTES..(i as usize + 1) * BLOCK_BYTES];
                    let found = decode_block(block);
                    let before = self.model.stats.snap_reads_promised;
                    let r = self
                        .model
                        .check_snap_read(*snap, op.first_block + i, &found);
                    let promised = self.model.stats.snap_reads_promised - before;
                    self.probes.add("snap.read_promised", promised);
                    if let Err(m) = r {
                        self.fail(format!(
                            "snapshot read check (client {}, pg {}): {m}",
                            tag.client, op.pg
                        ));
                        return;
                    }
                    if let Found::Write { write, .. } = found {
                        self.mix(write);
                    }
                }
                self.probes.hit("snap.read");
                self.finish_op(tag.client);
            }
            (ClientReply::Osd(Reply::Data(data)), ClientOpKind::Read) => {
                for i in 0..op.blocks {
                    let block = &data[i as usize * BLOCK_BYTES..(i as usize + 1) * BLOCK_BYTES];
                    let found = decode_block(block);
                    let before = self.model.stats;
                    let now = self.at_now();
                    let r =
                        self.model
                            .check_read(op.first_block + i, op.attempt_started, now, &found);
                    if let Err(m) = r {
                        self.fail(format!(
                            "read check (client {}, pg {}): {m}",
                            tag.client, op.pg
                        ));
                        return;
                    }
                    let after = self.model.stats;
                    self.probes.add(
                        "model.unknown_write_seen",
                        after.unknown_write_seen - before.unknown_write_seen,
                    );
                    self.probes.add(
                        "model.inflight_write_seen",
                        after.inflight_write_seen - before.inflight_write_seen,
                    );
                    if let Found::Write { write, .. } = found {
                        self.mix(write);
                    }
                }
                self.finish_op(tag.client);
            }
            (ClientReply::Osd(reply), kind) => {
                let (asked, term) = self.clients[c].asked.expect("an attempt was sent");
                self.on_client_error(tag.client, &op, kind, classify(&reply, asked, term));
            }
            // As the library on a connection error: forget the leader, retry after a pause.
            (ClientReply::Refused(_), _) => self.back_off(tag.client),
        }
    }

    /// Carries out the library's verdict on an error reply (`policy::classify`), as its request
    /// loop does: the same cache changes and the same pacing, in virtual time.
    fn on_client_error(&mut self, client: u32, op: &ClientOp, kind: &ClientOpKind, v: Verdict) {
        let c = client as usize;
        let retry = match v {
            Verdict::Done => unreachable!("an error reply is never Done"),
            Verdict::Redirect(hint) => {
                self.clients[c].hints.insert(op.pg, (hint.osd, hint.term));
                Retry::Now
            }
            Verdict::Rediscover => {
                self.clients[c].hints.remove(&op.pg);
                Retry::Later
            }
            Verdict::RefreshMap => {
                self.clients[c].hints.remove(&op.pg);
                let before = self.clients[c].map.epoch;
                self.clients[c].map = self.current_map();
                if self.clients[c].map.epoch > before {
                    Retry::Now
                } else {
                    Retry::Later
                }
            }
            Verdict::BackOff => {
                self.probes.hit("client.busy");
                Retry::Later
            }
            Verdict::Fail(status, message) => {
                // The library hands the error to its caller. Once the faults have stopped,
                // nothing may fail an operation: every OSD is back and has room. An operation
                // beyond the end of the shrunk image is refused (`OutOfRange`), or one issued
                // before the shrink and retried after it.
                self.probes.hit("client.failed");
                let snap_removed = match kind {
                    ClientOpKind::SnapRead { snap } => self.snaps[snap].removed.is_some(),
                    _ => false,
                };
                if status == fastblock_wire::Status::OutOfRange && self.may_be_beyond(op) {
                    self.probes.hit("reclaim.beyond_refused");
                } else if status == fastblock_wire::Status::NoSuchSnap && snap_removed {
                    // Removed while the read was in flight (`expected_reply` admits no other).
                    self.probes.hit("snap.read_removed");
                } else if op.started >= self.faults_end_us {
                    self.fail(format!(
                        "client {client}: {status:?} ({message}) for an operation on pg {} \
                         issued at {} after the faults stopped",
                        op.pg, op.started
                    ));
                }
                if let ClientOpKind::Write { id, .. } = kind {
                    self.model.give_up(*id, self.at_now());
                }
                self.finish_op(client);
                return;
            }
        };
        let pause = self.pause(client, retry);
        self.retry(client, pause);
    }

    /// Whether `op` touches the image's cut tail and was issued before the image grew back:
    /// an OSD may refuse it as beyond the end.
    fn may_be_beyond(&self, op: &ClientOp) -> bool {
        // A snapshot read is not fenced by the image's current size (the snapshot keeps its
        // own, which its reads stay within).
        if matches!(op.kind, ClientOpKind::SnapRead { .. }) {
            return false;
        }
        self.shrink.is_some_and(|s| {
            op.first_block + op.blocks > s.first_block
                && s.regrown_at.is_none_or(|r| op.started < r.us)
        })
    }

    /// Why an acknowledged write `op` must not have been: its last attempt began after every
    /// PG had deleted the cut tail and it was acknowledged before the image grew back, yet it
    /// covers the tail (a leader admitted it from a map older than the shrink).
    fn beyond_the_end(&self, op: &ClientOp) -> Option<String> {
        let s = self.shrink?;
        let done = s.done_at?;
        let now = self.at_now();
        let open = op.attempt_started > done && s.regrown_at.is_none_or(|r| now < r);
        (open && op.first_block + op.blocks > s.first_block).then(|| {
            format!(
                "a write of blocks {}..{} was acknowledged at {now:?} although the image ends at \
                 block {} since the shrink, whose deletion finished at {done:?}",
                op.first_block,
                op.first_block + op.blocks,
                s.first_block
            )
        })
    }

    /// The client's next pause, from the library's pacer, in virtual microseconds.
    fn pause(&mut self, client: u32, retry: Retry) -> u64 {
        let pacer = self.clients[client as usize]
            .pacer
            .as_mut()
            .expect("an operation has a pacer");
        pacer.pause(retry).as_micros() as u64
    }

    /// Forgets the leader the client believed in and retries after the pacer's pause, with
    /// the current map (the library's map watch delivers new maps meanwhile).
    fn back_off(&mut self, client: u32) {
        let c = client as usize;
        let pg = self.clients[c].op.as_ref().expect("an operation").pg;
        self.clients[c].hints.remove(&pg);
        self.clients[c].map = self.current_map();
        let pause = self.pause(client, Retry::Later);
        self.retry(client, pause);
    }

    // ---- scenarios ----

    /// Adds a client that only does what a scenario tells it (see [`crate::scenario`]).
    pub fn add_scripted_client(&mut self) -> u32 {
        self.clients.push(Client {
            stopped: true,
            scripted: true,
            ..Client::default()
        });
        self.clients.len() as u32 - 1
    }

    /// The term a scripted client names for `node`: what `GetLeader` would answer there now
    /// (the node's term if its replica knows itself as the leader, else 0), as a library
    /// client that has just asked. A scenario addresses a node it chose, often one the map
    /// does not record as leader yet; its one attempt must reach the node as such a client's
    /// would.
    fn learned_term(&self, node: OsdId, pg: PgId) -> u64 {
        self.node(node)
            .core()
            .and_then(|core| core.replica(pg))
            .filter(|r| r.leader() == Some(node))
            .map_or(0, |r| r.term().0)
    }

    /// Sends one operation of a scripted client to `node`: a write of a fresh stamp, or a
    /// read, of block `block` of object `object`.
    pub fn submit(&mut self, client: u32, node: OsdId, write: bool, object: u64, block: u64) {
        let c = client as usize;
        assert!(self.clients[c].scripted, "client {client} is not scripted");
        // A scenario's action is an event of its own: it comes after everything handled so far.
        self.events += 1;
        assert!(self.clients[c].op.is_none(), "client {client} is busy");
        let op = self.new_op(write, object, block, 1);
        self.clients[c].result = None;
        let term = self.learned_term(node, op.pg);
        self.clients[c].hints.insert(op.pg, (node, term));
        self.clients[c].op = Some(op);
        self.clients[c].pacer = Some(Pacer::new(self.rng.next_u64()));
        self.clients[c].map = self.current_map();
        self.send_attempt(client);
    }

    /// Sends a scripted client's read of block `block` of object `object` of snapshot `snap`
    /// to `node`, one attempt; the model checks what it returns.
    pub fn submit_snap_read(
        &mut self,
        client: u32,
        node: OsdId,
        snap: u64,
        (object, block): (u64, u64),
    ) {
        let c = client as usize;
        assert!(self.clients[c].scripted, "client {client} is not scripted");
        self.events += 1;
        assert!(self.clients[c].op.is_none(), "client {client} is busy");
        let blocks_per_object = self.o.object_bytes / BLOCK_BYTES as u64;
        let op = self.snap_read_op(snap, object * blocks_per_object + block, 1);
        self.clients[c].result = None;
        let term = self.learned_term(node, op.pg);
        self.clients[c].hints.insert(op.pg, (node, term));
        self.start_op(client, op);
    }

    /// The monitor takes a snapshot of the image now, as the random runs do; its id.
    pub fn take_snapshot(&mut self) -> Option<u64> {
        self.events += 1;
        let before = self.snaps.len();
        self.on_snap_create(before);
        (self.snaps.len() > before).then(|| *self.snaps.keys().next_back().expect("taken"))
    }

    /// Whether the monitor's record shows snapshot `snap` created.
    pub fn snapshot_created(&self, snap: u64) -> bool {
        self.snaps.get(&snap).is_some_and(|s| s.created.is_some())
    }

    /// Node `id` hears no new map for `us` (its map watch stalls), then gets the map of that
    /// moment (`FaultKind::MapStall`, at a moment a scenario picks).
    pub fn stall_map(&mut self, id: OsdId, us: u64) {
        let until = self.now + us;
        let life = self.nodes[&id].incarnation;
        self.map_stalled.insert(id, until);
        self.at(until, Ev::MapTo { node: id, life });
    }

    /// The PG that holds object `object` of the clients' image.
    pub fn object_pg(&self, object: u64) -> PgId {
        object_pg(self.pool, self.o.pg_count, IMAGE, object)
    }

    /// The reply a scripted client got for its last operation, once it has one.
    pub fn result(&self, client: u32) -> Option<&ClientReply> {
        let c = &self.clients[client as usize];
        c.op.is_none().then_some(c.result.as_ref()).flatten()
    }

    pub fn node(&self, id: OsdId) -> &Node {
        &self.nodes[&id]
    }

    pub fn set_partition(&mut self, side: Option<BTreeSet<OsdId>>) {
        self.partition = side;
    }

    /// Cuts the clients off from `nodes` (empty: heals; see `client_net.rs`).
    pub fn cut_clients(&mut self, nodes: BTreeSet<OsdId>) {
        self.set_clients_cut(nodes);
    }

    /// Node `id`'s runtime samples the file system holding its metadata: `free_bytes` free
    /// (the OSD's once-a-second `statvfs`, here when a scenario says). A node that is down
    /// hears nothing.
    pub fn host_space(&mut self, id: OsdId, free_bytes: u64) {
        self.run_node(id, Input::HostSpace { free_bytes });
    }

    // ---- liveness ----

    fn on_liveness_check(&mut self) {
        match self.converged() {
            Ok(true) => self.done = true,
            Ok(false) => self.after(250 * MS, Ev::LivenessCheck),
            Err(m) => self.fail(m),
        }
    }

    /// Why the cluster has not converged yet.
    fn not_converged_reason(&self) -> String {
        if let Some((i, c)) = self
            .clients
            .iter()
            .enumerate()
            .find(|(_, c)| !c.stopped || c.op.is_some())
        {
            return format!("client {i} still busy: {:?}", c.op);
        }
        if let Err(why) = self.snaps_settled() {
            return why;
        }
        if let Some(sweep) = self.sweep.as_ref().filter(|s| s.started) {
            let op = &self.clients[sweep.client as usize].op;
            return format!(
                "the final snapshot reads are not done: {} left after {op:?}",
                sweep.left.len()
            );
        }
        if let Some(shrink) = self.shrink.filter(|s| s.regrown_at.is_none()) {
            let pending = self.mon.reclaim.get(&shrink.reclaim);
            return format!(
                "the image was not grown back: reclaim {} {}",
                shrink.reclaim,
                pending.map_or("is done".to_string(), |r| format!(
                    "still waits for PGs (done: {:?})",
                    r.done_pgs
                ))
            );
        }
        let infos = self.pg_infos();
        for (pg, info) in &infos {
            if let Err(why) = self.pg_settled(*pg, info) {
                return why;
            }
        }
        if let Some(why) = self.final_scrub_reason(&infos) {
            return why;
        }
        "converged indexes, content not compared yet".into()
    }

    /// Checks that a PG is active in the monitor's map (a leader reported, no target pending,
    /// every member up), that its members are exactly the Raft voters, that one leader is
    /// followed by every member, every member applied everything in the leader's log, and no
    /// other node still hosts it.
    fn pg_settled(&self, pg: PgId, info: &PgInfo) -> Result<(), String> {
        if !info.state.is_active() {
            return Err(format!(
                "pg {pg}: state {} in the monitor's map",
                info.state
            ));
        }
        let members = &info.osdlist;
        let mut leader = None;
        for m in members {
            let Some(core) = self.nodes[m].core() else {
                return Err(format!("pg {pg}: osd {m} is down"));
            };
            if core.commit_pending() {
                return Err(format!("pg {pg}: osd {m} has a WAL commit in flight"));
            }
            if core.map_epoch() != self.mon.map.epoch {
                return Err(format!("pg {pg}: osd {m} has not seen the current map"));
            }
            let Some(r) = core.replica(pg) else {
                return Err(format!("pg {pg}: member osd {m} does not host it"));
            };
            if r.is_leader() {
                leader = Some((
                    *m,
                    r.term(),
                    r.commit_index(),
                    r.raw_node().raft.raft_log.last_index(),
                    r.voters(),
                ));
            }
        }
        let Some((l, term, commit, last, voters)) = leader else {
            return Err(format!("pg {pg}: no leader among {members:?}"));
        };
        let mut sorted = members.clone();
        sorted.sort();
        if voters != sorted {
            return Err(format!(
                "pg {pg}: voters {voters:?} of leader osd {l} differ from the map's members {members:?}"
            ));
        }
        if commit.0 != last {
            return Err(format!(
                "pg {pg}: leader osd {l} committed {commit} of {last}"
            ));
        }
        for m in members {
            let core = self.nodes[m].core().expect("up");
            let r = core.replica(pg).expect("hosted");
            if r.leader() != Some(l) || r.term() != term {
                return Err(format!(
                    "pg {pg}: osd {m} follows {:?} in term {}, the leader is osd {l} in term {term}",
                    r.leader(),
                    r.term()
                ));
            }
            if r.applied() != commit {
                return Err(format!(
                    "pg {pg}: osd {m} applied {} of {commit}",
                    r.applied()
                ));
            }
        }
        for (id, node) in &self.nodes {
            if members.contains(id) {
                continue;
            }
            if let Some(core) = node.core() {
                if core.replica(pg).is_some() || core.store().pg_log(pg).is_some() {
                    return Err(format!("pg {pg}: osd {id} is no member but still holds it"));
                }
            }
        }
        Ok(())
    }

    /// The liveness condition: clients done, every PG settled, replicas identical, and every
    /// block reads back as the model allows.
    fn converged(&mut self) -> Result<bool, String> {
        if let Some(sweep) = self.sweep.as_ref().filter(|s| s.started) {
            // Everything else was checked before the sweep began.
            let busy = self.clients[sweep.client as usize].op.is_some();
            return Ok(!busy && sweep.left.is_empty());
        }
        if self.clients.iter().any(|c| !c.stopped || c.op.is_some()) {
            return Ok(false);
        }
        if self.shrink.is_some_and(|s| s.regrown_at.is_none()) {
            return Ok(false);
        }
        if self.snaps_settled().is_err() {
            return Ok(false);
        }
        let infos = self.pg_infos();
        for (pg, info) in &infos {
            if self.pg_settled(*pg, info).is_err() {
                return Ok(false);
            }
        }
        if !self.final_scrub_done(&infos)? {
            return Ok(false);
        }
        for (pg, info) in &infos {
            let mut first: Option<(OsdId, Content)> = None;
            for m in &info.osdlist {
                let content = self.replica_content(*m, *pg)?;
                match &first {
                    None => first = Some((*m, content)),
                    Some((f, c)) if *c != content => {
                        return Err(format!(
                            "replicas differ: pg {pg} osd {f} and osd {m} hold different objects \
                             at the same applied index ({})",
                            describe_difference(c, &content)
                        ));
                    }
                    Some(_) => {}
                }
            }
        }
        // Every block as the model allows (a read at this instant, no write in flight).
        let blocks: Vec<u64> = self.model.written_blocks().collect();
        let blocks_per_object = self.o.object_bytes / BLOCK_BYTES as u64;
        for block in blocks {
            let object = block / blocks_per_object;
            let pg = object_pg(self.pool, self.o.pg_count, IMAGE, object);
            let member = infos[&pg].osdlist[0];
            let mut buf = vec![0u8; BLOCK_BYTES];
            let core = self.nodes[&member].core().expect("up");
            core.read_object(
                pg,
                ObjectId {
                    image: IMAGE,
                    index: object,
                },
                (block % blocks_per_object) * BLOCK_BYTES as u64,
                &mut buf,
            )
            .map_err(|e| format!("final read of block {block} on osd {member}: {e}"))?;
            let found = decode_block(&buf);
            let now = self.at_now();
            self.model
                .check_read(block, now, now, &found)
                .map_err(|m| format!("final check: {m}"))?;
        }
        if self.sweep.is_some() {
            self.check_snap_states(&infos)?;
            self.start_sweep();
            return Ok(false);
        }
        Ok(true)
    }

    /// Why the snapshots are not settled: a create neither completed nor aborted, a trim
    /// entry some PG has not confirmed, a removal still to come.
    fn snaps_settled(&self) -> Result<(), String> {
        if let Some(s) = self
            .mon
            .snaps_of_image(IMAGE)
            .iter()
            .find(|s| s.state == SnapState::Creating)
        {
            return Err(format!(
                "snapshot {} is still creating (confirmed by pgs {:?})",
                s.id, s.done_pgs
            ));
        }
        if let Some(t) = self.mon.snap_trims.values().next() {
            return Err(format!(
                "snapshot trim {} (snapshot {}, {}) waits for PGs (done: {:?})",
                t.id, t.snap, t.reason, t.done_pgs
            ));
        }
        if self.snap_removals_pending > 0 {
            return Err(format!(
                "{} snapshot removals still to come",
                self.snap_removals_pending
            ));
        }
        Ok(())
    }

    /// Once every trim is confirmed and every member applied its leader's whole log, every
    /// replica of every PG holds exactly the snapshots created and not removed: an aborted
    /// snapshot's marks and a removed one's blocks are gone.
    fn check_snap_states(&self, infos: &BTreeMap<PgId, PgInfo>) -> Result<(), String> {
        let live: BTreeSet<u64> = self.readable_snaps().into_iter().collect();
        for (id, run) in &self.snaps {
            let ended = run.created.is_some() || run.aborted.is_some();
            if !ended {
                return Err(format!(
                    "snapshot {id} neither created nor aborted: {run:?}"
                ));
            }
        }
        for (pg, info) in infos {
            for m in &info.osdlist {
                let core = self.nodes[m].core().expect("up");
                let held = core.store().image_snaps(*pg, IMAGE).live;
                if held != live {
                    return Err(format!(
                        "pg {pg} osd {m} holds snapshots {held:?} of the image, the monitor's \
                         live ones are {live:?} (every trim confirmed, every entry applied)"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Queues a read of every block of every live snapshot, object by object, through the
    /// same path as the clients' (`Request::SnapRead` to the PG leader, the library's retry
    /// policy), each checked by the model, and starts the first.
    fn start_sweep(&mut self) {
        let blocks_per_object = self.o.object_bytes / BLOCK_BYTES as u64;
        let mut left = VecDeque::new();
        for snap in self.readable_snaps() {
            let size_blocks = self.snaps[&snap].size_blocks;
            for object in 0..size_blocks.div_ceil(blocks_per_object) {
                let first = object * blocks_per_object;
                left.push_back((snap, first, blocks_per_object.min(size_blocks - first)));
            }
        }
        let sweep = self.sweep.as_mut().expect("a sweep");
        sweep.left = left;
        sweep.started = true;
        self.next_sweep_read();
    }

    fn next_sweep_read(&mut self) {
        let sweep = self.sweep.as_mut().expect("a sweep");
        let client = sweep.client;
        let Some((snap, first, blocks)) = sweep.left.pop_front() else {
            return;
        };
        self.probes.hit("snap.final_read");
        let op = self.snap_read_op(snap, first, blocks);
        self.start_op(client, op);
    }

    fn replica_content(&self, id: OsdId, pg: PgId) -> Result<Content, String> {
        let core = self.nodes[&id].core().expect("up");
        let mut objects = core
            .list_objects(pg)
            .map_err(|e| format!("listing pg {pg} on osd {id}: {e}"))?;
        objects.sort();
        let mut out = Vec::new();
        for object in objects {
            let mut buf = vec![0u8; self.o.object_bytes as usize];
            core.read_object(pg, object, 0, &mut buf).map_err(|e| {
                let after = if e.bad_block().is_some() {
                    " (a bad copy the final deep scrub left)"
                } else {
                    ""
                };
                format!("reading pg {pg} {object:?} on osd {id}: {e}{after}")
            })?;
            out.push((object, buf));
        }
        Ok(out)
    }
}

/// What decides whether a reply is expected, besides the operation.
#[derive(Clone, Copy, Debug)]
struct ReplyContext {
    /// The operation touches the image's cut tail (see `Cluster::may_be_beyond`).
    beyond: bool,
    /// The monitor took a snapshot during the run.
    snaps_taken: bool,
    /// The operation reads a snapshot that the monitor has removed by now.
    snap_removed: bool,
}

/// Whether a client of this simulation can get `reply` for an operation of `kind`: the
/// success of its kind, an error the library retries, or one it hands to its caller that a
/// fault can cause (`NoSpace`, `IoError`), or the operation's circumstances (`OutOfRange`
/// beyond the end of a shrunk image, `NoSuchSnap` for a read of a snapshot removed since it
/// was issued). Anything else is a bug.
fn expected_reply(
    reply: &ClientReply,
    kind: &ClientOpKind,
    cx: ReplyContext,
) -> Result<(), String> {
    match (reply, kind) {
        (
            ClientReply::Osd(Reply::Error {
                status: Status::OutOfRange,
                ..
            }),
            _,
        ) if cx.beyond => Ok(()),
        (
            ClientReply::Osd(Reply::Error {
                status: Status::NoSuchSnap,
                ..
            }),
            ClientOpKind::SnapRead { .. },
        ) if cx.snap_removed => Ok(()),
        // Only writes wait for a snapshot being taken, and only if one was.
        (
            ClientReply::Osd(Reply::Error {
                status: Status::SnapInProgress,
                ..
            }),
            ClientOpKind::Write { .. },
        ) if cx.snaps_taken => Ok(()),
        (
            ClientReply::Osd(Reply::Error {
                status: Status::SnapInProgress,
                ..
            }),
            _,
        ) => Err(format!("unexpected reply {}", describe_reply(reply))),
        (ClientReply::Refused(_), _)
        | (ClientReply::Osd(Reply::Ok), ClientOpKind::Write { .. })
        | (ClientReply::Osd(Reply::Data(_)), ClientOpKind::Read | ClientOpKind::SnapRead { .. }) => {
            Ok(())
        }
        (ClientReply::Osd(Reply::Error { status, .. }), _) if status.is_retryable() => Ok(()),
        // A full OSD, or one whose shard failed at a crash point: another replica may serve.
        (
            ClientReply::Osd(Reply::Error {
                status: Status::NoSpace | Status::IoError,
                ..
            }),
            _,
        ) => Ok(()),
        (reply, _) => Err(format!("unexpected reply {}", describe_reply(reply))),
    }
}

fn describe_reply(reply: &ClientReply) -> String {
    match reply {
        ClientReply::Osd(Reply::Data(d)) => format!("Data({} bytes)", d.len()),
        other => format!("{other:?}"),
    }
}

/// A replica's objects of one PG, with their whole contents, in object order.
type Content = Vec<(ObjectId, Vec<u8>)>;

fn describe_difference(a: &[(ObjectId, Vec<u8>)], b: &[(ObjectId, Vec<u8>)]) -> String {
    let names = |v: &[(ObjectId, Vec<u8>)]| v.iter().map(|(o, _)| o.index).collect::<Vec<_>>();
    if names(a) != names(b) {
        return format!("objects {:?} vs {:?}", names(a), names(b));
    }
    for ((o, x), (_, y)) in a.iter().zip(b) {
        for (i, (bx, by)) in x.chunks(BLOCK_BYTES).zip(y.chunks(BLOCK_BYTES)).enumerate() {
            if bx != by {
                return format!(
                    "object {} block {i}: {:?} vs {:?}",
                    o.index,
                    decode_block(bx),
                    decode_block(by)
                );
            }
        }
    }
    "same".into()
}

/// The monitor's `boot` of a node (the caller finishes the operation).
fn boot(mon: &mut MonState, id: OsdId) -> Result<(), String> {
    mon.boot(
        id,
        &BootRequest {
            uuid: uuid_of(id.0),
            address: "10.0.0.1".into(),
            port: 6800 + id.0 as u16,
            shards: 1,
            host: format!("sim-host-{id}"),
            capacity_bytes: 1 << 30,
            config: String::new(),
            lease_timing: None,
        },
    )
    .map_err(|e| format!("boot osd {id}: {e:?}"))
}

/// An input as the trace names it.
fn input_name(input: &Input) -> String {
    match input {
        Input::Request { conn, req, .. } => format!("{:?} from conn {conn:#x}", req.kind()),
        Input::Map(map) => format!("Map(epoch {})", map.epoch.0),
        other => format!("{other:?}"),
    }
}

fn trace_line(ev: &Ev) -> String {
    match ev {
        Ev::Packet {
            from, to, pg, req, ..
        } => match req {
            Request::RaftBatch { msgs, .. } => {
                use protobuf::Message as _;
                let m = msgs
                    .first()
                    .and_then(|env| raft::eraftpb::Message::parse_from_bytes(&env.msg).ok())
                    .unwrap_or_default();
                format!(
                    "packet {from}->{to} pg {pg} {:?} term {} index {} logterm {} commit {} entries {} reject {}",
                    m.get_msg_type(),
                    m.term,
                    m.index,
                    m.log_term,
                    m.commit,
                    m.entries.len(),
                    m.reject
                )
            }
            Request::SnapChunk(c) => format!(
                "packet {from}->{to} pg {pg} SnapChunk transfer {:#x} seq {} last {} object {} offset {} bytes {}",
                c.transfer,
                c.seq,
                c.last,
                c.object_index,
                c.offset,
                c.data.len()
            ),
            Request::SnapAck {
                transfer,
                seq,
                verdict,
                ..
            } => {
                format!("packet {from}->{to} pg {pg} SnapAck transfer {transfer:#x} seq {seq} {verdict:?}")
            }
            other => format!("packet {from}->{to} pg {pg} {:?}", other.kind()),
        },
        Ev::ClientSend { node, tag, req } => {
            let what = match req {
                Request::Write {
                    addr,
                    offset,
                    epoch,
                    term,
                    data,
                } => format!(
                    "pg {} write obj {} off {offset} len {} epoch {} term {term}",
                    addr.pg,
                    addr.object_index,
                    data.len(),
                    epoch.0
                ),
                Request::Read {
                    addr,
                    offset,
                    length,
                    epoch,
                } => format!(
                    "pg {} read obj {} off {offset} len {length} epoch {}",
                    addr.pg, addr.object_index, epoch.0
                ),
                Request::SnapRead {
                    addr,
                    offset,
                    length,
                    epoch,
                    snap,
                } => format!(
                    "pg {} read snapshot {snap} obj {} off {offset} len {length} epoch {}",
                    addr.pg, addr.object_index, epoch.0
                ),
                other => format!("{:?}", other.kind()),
            };
            format!(
                "client {} attempt {} -> osd {node}: {what}",
                tag.client, tag.attempt
            )
        }
        Ev::ClientReply { tag, reply } => format!(
            "reply to client {} attempt {}: {}",
            tag.client,
            tag.attempt,
            describe_reply(reply)
        ),
        other => format!("{other:?}"),
    }
}

//! The simulated world: virtual time, one event queue, one PRNG, the nodes, the network, the
//! monitor's state, the clients, the faults and the checkers. Single-threaded and
//! deterministic: the seed decides everything (no clock, no threads, no hash-ordered
//! iteration).
//!
//! A run has two phases. In the **fault phase** clients write and read while the faults the
//! seed enabled strike at random: message loss, delay, duplication and reordering,
//! partitions, node crashes (with torn unsynced writes) and restarts, crash points at
//! arbitrary I/Os, slow WAL commits. In the **liveness phase** the faults stop (partitions
//! heal, crashed nodes restart, the network is clean), clients keep working a little, then
//! every PG must become active with identical replicas, every client operation must
//! complete, and every block must read back as the model allows, within a bounded virtual
//! time.

use crate::checker::Safety;
use crate::model::{decode_block, stamp_block, At, Found, ImageModel, BLOCK_BYTES};
use crate::node::{ClientReply, ClientReq, ClientTag, Effects, Input, Node, PeerMsg};
use crate::options::{RngExt, SimOptions, MS};
use crate::probes::Probes;
use bytes::{Bytes, BytesMut};
use fastblock_mon_core::MonState;
use fastblock_pg::{Event, LeaderReport, ObjectRef};
use fastblock_store::ObjectId;
use fastblock_types::api::{
    BootRequest, CreatePoolRequest, LeaderElectedRequest, MembershipFinishedRequest,
};
use fastblock_types::map::{FailureDomain, PgInfo};
use fastblock_types::rng::SplitMix64;
use fastblock_types::route::object_pg;
use fastblock_types::{Epoch, ImageId, OsdId, PgId, PoolId};
use std::collections::{BTreeMap, BTreeSet};

const IMAGE: ImageId = ImageId(1);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FaultKind {
    Crash,
    Fuse,
    Partition,
    Slow,
    /// An OSD goes out (its PGs are remapped) or comes back in (rebalance).
    OutIn,
}

#[derive(Debug)]
enum Ev {
    Tick {
        node: OsdId,
        life: u64,
    },
    Flush {
        node: OsdId,
        life: u64,
    },
    CommitDone {
        node: OsdId,
        life: u64,
    },
    Packet {
        from: OsdId,
        to: OsdId,
        pg: PgId,
        msg: PeerMsg,
        link_seq: u64,
    },
    ClientSend {
        node: OsdId,
        tag: ClientTag,
        pg: PgId,
        req: ClientReq,
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
    MonLeader {
        pg: PgId,
        req: LeaderElectedRequest,
    },
    MonFinished {
        pg: PgId,
        req: MembershipFinishedRequest,
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
    SlowEnd {
        node: OsdId,
    },
    FaultsEnd,
    LivenessCheck,
}

#[derive(Clone, Debug)]
enum ClientOpKind {
    Write { id: u64, data: Bytes },
    Read,
}

#[derive(Clone, Debug)]
struct ClientOp {
    kind: ClientOpKind,
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
    hints: BTreeMap<PgId, OsdId>,
    stopped: bool,
    /// Driven by a scenario: one attempt per operation, no retries, the reply kept in
    /// `result` (reads and acknowledgements still go through the model).
    scripted: bool,
    result: Option<ClientReply>,
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
    partition: Option<BTreeSet<OsdId>>,
    faults_on: bool,
    faults_end_us: u64,
    clients: Vec<Client>,
    model: ImageModel,
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
    events: u64,
    crashes: u64,
    fingerprint: u64,
    failure: Option<String>,
    done: bool,
    trace: bool,
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
        let mut nodes = BTreeMap::new();
        let mut formatted = Vec::new();
        let pg_seed = rng.next_u64();
        for id in mon.map.osds.keys() {
            let mut eff = Effects::default();
            let node = Node::format(&o, *id, &mon.map, pg_seed ^ u64::from(id.0), &mut eff)?;
            nodes.insert(*id, node);
            formatted.push((*id, eff));
        }
        let published = mon.map.epoch;
        let mut c = Cluster {
            rng,
            now: 0,
            queue: BTreeMap::new(),
            seq: 0,
            nodes,
            mon,
            pool: pool.id,
            published,
            partition: None,
            faults_on: true,
            faults_end_us: o.fault_phase_us,
            clients: (0..o.clients).map(|_| Client::default()).collect(),
            model: ImageModel::new(IMAGE.0),
            safety: Safety::default(),
            probes: Probes::default(),
            link_sent: BTreeMap::new(),
            link_delivered: BTreeMap::new(),
            fifo_after: BTreeMap::new(),
            leading: BTreeMap::new(),
            crash_state: BTreeMap::new(),
            events: 0,
            crashes: 0,
            fingerprint: 0xcbf2_9ce4_8422_2325,
            failure: None,
            done: false,
            trace,
            o,
        };
        for (id, eff) in formatted {
            c.dispatch(id, eff);
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
        ] {
            if every > 0 {
                let at = c.rng.range(0, 2 * every);
                c.at(at, Ev::Fault(kind));
            }
        }
        let end = c.faults_end_us;
        c.at(end, Ev::FaultsEnd);
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
            Ev::CommitDone { node, life } => self.on_commit_done(node, life),
            Ev::Packet {
                from,
                to,
                pg,
                msg,
                link_seq,
            } => self.on_packet(from, to, pg, msg, link_seq),
            Ev::ClientSend { node, tag, pg, req } => {
                self.deliver(node, Input::Client { tag, pg, req }, Some(tag))
            }
            Ev::ClientReply { tag, reply } => self.on_client_reply(tag, reply),
            Ev::ClientTimeout { tag } => {
                if self.current_attempt(tag) && self.clients[tag.client as usize].scripted {
                    let reply = ClientReply::Refused("timeout".into());
                    self.on_client_reply(tag, reply);
                } else if self.current_attempt(tag) {
                    self.probes.hit("client.timeout");
                    let client = tag.client as usize;
                    if let Some(op) = &self.clients[client].op {
                        let pg = op.pg;
                        self.clients[client].hints.remove(&pg);
                    }
                    self.retry(tag.client, 0);
                }
            }
            Ev::ClientRetry { tag } => {
                if self.current_attempt(tag) {
                    self.send_attempt(tag.client);
                }
            }
            Ev::ClientNext { client } => self.next_op(client),
            Ev::MonLeader { pg, req } => {
                self.mon_op(|m| {
                    m.leader_elected(pg, &req)
                        .map(|_| ())
                        .map_err(|e| e.message)
                });
            }
            Ev::MonFinished { pg, req } => {
                let had_target = !self.mon.map.pgmaps[&pg.pool].pgs[&pg.seq]
                    .newosdlist
                    .is_empty();
                let accepted = self.mon_op(|m| {
                    m.membership_finished(pg, &req)
                        .map(|_| ())
                        .map_err(|e| e.message)
                });
                let cleared = self.mon.map.pgmaps[&pg.pool].pgs[&pg.seq]
                    .newosdlist
                    .is_empty();
                if accepted && had_target && cleared {
                    self.probes.hit("member.finished");
                }
            }
            Ev::MapTo { node, life } => self.on_map_to(node, life),
            Ev::Fault(kind) => self.on_fault(kind),
            Ev::Restart { node } => self.restart(node),
            Ev::CrashNode { node, life } => {
                let n = &self.nodes[&node];
                if self.faults_on && n.is_up() && n.incarnation == life {
                    self.crash_and_restart_later(node);
                }
            }
            Ev::Heal => self.partition = None,
            Ev::SlowEnd { node } => {
                if let Some(n) = self.nodes.get_mut(&node) {
                    n.slow_commit_us = None;
                }
            }
            Ev::FaultsEnd => self.on_faults_end(),
            Ev::LivenessCheck => self.on_liveness_check(),
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

    fn step(&mut self, id: OsdId, f: impl FnOnce(&mut Node, &mut Effects)) {
        let mut eff = Effects {
            tracing: self.trace,
            ..Effects::default()
        };
        let node = self.nodes.get_mut(&id).expect("known node");
        let stepped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(node, &mut eff)));
        if let Err(payload) = stepped {
            if node.fuse_blown_at().is_none() {
                std::panic::resume_unwind(payload);
            }
            // An injected I/O error reached raft-rs through `PgStorage` and raft-rs panicked;
            // the OSD aborts on any panic (fail-stop), so the node crashes here too. What the
            // step produced before the panic is dropped, as an abort drops unflushed buffers.
            crate::take_panic_message();
            self.probes.hit("fuse.raft_panic");
            self.crash_and_restart_later(id);
            return;
        }
        self.dispatch(id, eff);
    }

    fn on_tick(&mut self, id: OsdId, life: u64) {
        let node = &self.nodes[&id];
        if node.incarnation != life || !node.is_up() {
            return;
        }
        let busy = node.is_busy();
        let jitter = self.o.tick_us * self.o.tick_jitter_pct / 100;
        let next = self.o.tick_us - jitter + self.rng.range(0, 2 * jitter);
        self.after(next, Ev::Tick { node: id, life });
        if busy {
            let run = self.nodes.get_mut(&id).and_then(|n| n.run.as_mut());
            run.expect("up").tick_missed = true;
            return;
        }
        let now = self.now;
        self.step(id, |n, eff| n.iterate(now, Vec::new(), true, eff));
    }

    fn on_flush(&mut self, id: OsdId, life: u64) {
        let node = &self.nodes[&id];
        if node.incarnation != life || !node.is_up() {
            return;
        }
        let every = self.o.flush_us;
        self.after(every, Ev::Flush { node: id, life });
        self.step(id, |n, eff| n.flush(eff));
    }

    fn on_commit_done(&mut self, id: OsdId, life: u64) {
        let node = &self.nodes[&id];
        if node.incarnation != life || !node.is_busy() {
            return;
        }
        let leading_before: Vec<PgId> = self.leaders_on(id);
        let now = self.now;
        self.step(id, |n, eff| n.resume(now, eff));
        let leading_after = self.leaders_on(id);
        if leading_before.iter().any(|pg| !leading_after.contains(pg)) {
            self.probes.hit("slow.leader_deposed");
        }
    }

    fn leaders_on(&self, id: OsdId) -> Vec<PgId> {
        self.nodes[&id]
            .run
            .as_ref()
            .map(|r| {
                r.pgs
                    .iter()
                    .filter(|(_, rep)| rep.is_leader())
                    .map(|(pg, _)| *pg)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Delivers one input to a node: queued while it is busy, dropped while it is down (a
    /// client then hears "connection refused").
    fn deliver(&mut self, id: OsdId, input: Input, client: Option<ClientTag>) {
        let node = self.nodes.get_mut(&id).expect("known node");
        let busy = node.is_busy();
        let Some(run) = node.run.as_mut() else {
            if let Some(tag) = client {
                let d = self.client_delay();
                self.after(
                    d,
                    Ev::ClientReply {
                        tag,
                        reply: ClientReply::Refused(format!("osd {id} is down")),
                    },
                );
            }
            return;
        };
        if busy {
            run.inbox.push_back(input);
            return;
        }
        let now = self.now;
        self.step(id, |n, eff| n.iterate(now, vec![input], false, eff));
    }

    /// Performs what a node step produced.
    fn dispatch(&mut self, id: OsdId, mut eff: Effects) {
        for n in &eff.notes {
            eprintln!("               osd {id}: {n}");
        }
        for (pg, applied) in &eff.opened {
            self.safety.on_open(id, *pg, *applied);
        }
        for (pg, to, msg) in eff.messages {
            self.send(id, to, pg, msg);
        }
        for (pg, report) in eff.leader_reports.drain(..) {
            self.report_leader(id, pg, report);
        }
        self.probes.add("snapshot.started", eff.transfers_started);
        self.probes
            .add("snapshot.interrupted", eff.transfers_abandoned);
        self.probes
            .add("snapshot.dropped_unstaged", eff.snapshots_unstaged);
        self.probes
            .add("snapshot.installed", eff.snapshots_installed.len() as u64);
        self.probes
            .add("member.pg_removed", eff.removed.len() as u64);
        for (tag, reply) in eff.replies {
            let d = self.client_delay();
            self.after(d, Ev::ClientReply { tag, reply });
        }
        for (pg, event) in eff.events {
            self.on_pg_event(id, pg, event);
        }
        for e in &eff.applied {
            self.mix(e.index ^ u64::from(e.hash));
            let differed = self.safety.results_differ;
            if let Err(m) = self.safety.on_applied(id, e) {
                self.fail(m);
            }
            if self.safety.results_differ > differed {
                self.probes.hit("restart.conf_change_reapplied");
            }
        }
        if eff.wal_full {
            self.probes.hit("wal.full");
        }
        if eff.commit_started {
            self.probes.hit("slow.commit");
            let max = self.nodes[&id].slow_commit_us.unwrap_or(MS).max(MS);
            let d = self.rng.range(MS / 2, max);
            let life = self.nodes[&id].incarnation;
            self.after(d, Ev::CommitDone { node: id, life });
            let down = self.nodes.values().filter(|n| !n.is_up()).count();
            if self.o.crash_every_us > 0
                && down < self.o.down_max as usize
                && self.rng.chance_pct(10)
            {
                // Power fails while the commit is in flight: the torn WAL tail.
                let at = self.rng.range(0, d - 1);
                self.after(at, Ev::CrashNode { node: id, life });
            }
        }
        if let Some(reason) = eff.failed {
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
                None => self.fail(format!(
                    "osd {id}: store failed without an injected fault: {reason}"
                )),
            }
        }
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
                self.report_leader(id, pg, report);
            }
            Event::MembershipFinished(report) => {
                let req = MembershipFinishedRequest {
                    leader: id,
                    term: report.term,
                    conf_index: report.conf_index,
                    voters: report.voters,
                    learners: report.learners,
                };
                let d = self.rng.range(MS, 20 * MS);
                self.after(d, Ev::MonFinished { pg, req });
            }
            Event::ConfigurationChanged(report) => self.report_leader(id, pg, report),
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

    /// The OSD's leader report to the monitor (after a network delay).
    fn report_leader(&mut self, id: OsdId, pg: PgId, report: LeaderReport) {
        let req = LeaderElectedRequest {
            leader: id,
            term: report.term,
            conf_index: report.conf_index,
            voters: report.voters,
            voters_outgoing: report.voters_outgoing,
            learners: report.learners,
        };
        let d = self.rng.range(MS, 20 * MS);
        self.after(d, Ev::MonLeader { pg, req });
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
        let node = &self.nodes[&id];
        if node.incarnation != life || !node.is_up() {
            return;
        }
        let map = self.mon.map.clone();
        self.step(id, |n, eff| n.on_map(&map, eff));
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

    fn send(&mut self, from: OsdId, to: OsdId, pg: PgId, msg: PeerMsg) {
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
        let fifo = !matches!(msg, PeerMsg::Raft(_));
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
                    msg: msg.clone(),
                    link_seq,
                },
            );
        }
    }

    fn on_packet(&mut self, from: OsdId, to: OsdId, pg: PgId, msg: PeerMsg, link_seq: u64) {
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
        self.deliver(to, Input::Peer { from, pg, msg }, None);
    }

    // ---- faults ----

    fn on_fault(&mut self, kind: FaultKind) {
        if !self.faults_on {
            return;
        }
        let every = match kind {
            FaultKind::Crash => self.o.crash_every_us,
            FaultKind::Fuse => self.o.fuse_every_us,
            FaultKind::Partition => self.o.partition_every_us,
            FaultKind::Slow => self.o.slow_every_us,
            FaultKind::OutIn => self.o.outin_every_us,
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
                self.partition = Some(side);
                let d = self.rng.range(100 * MS, self.o.partition_us_max);
                self.after(d, Ev::Heal);
            }
            FaultKind::OutIn => self.out_or_in(&ids),
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
            .run
            .as_ref()
            .map(|r| r.store.borrow().wal().durable_lsn())
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
        self.mon_op(|m| m.mark_down(id).map_err(|e| e.message));
    }

    fn restart(&mut self, id: OsdId) {
        if self.nodes[&id].is_up() {
            return;
        }
        let map = self.mon.map.clone();
        let mut eff = Effects {
            tracing: self.trace,
            ..Effects::default()
        };
        if let Err(e) = self
            .nodes
            .get_mut(&id)
            .expect("known")
            .restart(&map, &mut eff)
        {
            self.fail(e);
            return;
        }
        let node = &self.nodes[&id];
        let run = node.run.as_ref().expect("just opened");
        let lsn = run.store.borrow().wal().durable_lsn();
        let reapplied = run.pgs.iter().any(|(pg, r)| {
            let s = run.store.borrow();
            r.commit_index().0 > s.applied_index(*pg) && s.applied_index(*pg) > 0
        });
        if let Some((before, owed)) = self.crash_state.remove(&id) {
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
        if reapplied {
            self.probes.hit("restart.reapplied");
        }
        self.dispatch(id, eff);
        self.schedule_timers(id);
        self.mon_op(|m| boot(m, id));
    }

    fn on_faults_end(&mut self) {
        self.faults_on = false;
        self.partition = None;
        let ids: Vec<OsdId> = self.nodes.keys().copied().collect();
        for id in ids {
            let node = self.nodes.get_mut(&id).expect("known");
            node.slow_commit_us = None;
            node.disarm_fuse();
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
        let first_block = object * blocks_per_object + block;
        let pg = object_pg(self.pool, self.o.pg_count, IMAGE, object);
        let read_pct = if client == 0 && self.o.reader_client {
            100
        } else {
            self.o.read_pct
        };
        let kind = if self.rng.chance_pct(read_pct) {
            ClientOpKind::Read
        } else {
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
        };
        self.clients[c].op = Some(ClientOp {
            kind,
            pg,
            object: ObjectRef {
                image: IMAGE,
                index: object,
            },
            offset: (block * BLOCK_BYTES as u64) as u32,
            first_block,
            blocks,
            started: self.now,
            attempt_started: self.at_now(),
        });
        self.send_attempt(client);
    }

    /// Where a client sends its next attempt: the last leader it heard of, else the
    /// monitor's, else any member.
    fn target(&mut self, client: u32, pg: PgId) -> OsdId {
        if let Some(h) = self.clients[client as usize].hints.get(&pg) {
            return *h;
        }
        let map_leader = self
            .mon
            .map
            .pgmaps
            .get(&pg.pool)
            .and_then(|m| m.pgs.get(&pg.seq))
            .and_then(|i| i.leader);
        match map_leader {
            Some(l) if self.rng.chance_pct(70) => l,
            _ => {
                let info = &self.mon.map.pgmaps[&pg.pool].pgs[&pg.seq];
                let mut members = info.osdlist.clone();
                members.extend(info.newosdlist.iter().filter(|o| !info.osdlist.contains(o)));
                self.rng.pick(&members)
            }
        }
    }

    fn send_attempt(&mut self, client: u32) {
        let c = client as usize;
        self.clients[c].attempt += 1;
        let attempt = self.clients[c].attempt;
        let now = self.at_now();
        let op = self.clients[c].op.as_mut().expect("an operation");
        op.attempt_started = now;
        let op = op.clone();
        let node = self.target(client, op.pg);
        let req = match &op.kind {
            ClientOpKind::Write { data, .. } => ClientReq::Write {
                object: op.object,
                offset: op.offset,
                data: data.clone(),
            },
            ClientOpKind::Read => ClientReq::Read {
                object: op.object,
                offset: op.offset,
                length: (op.blocks as usize * BLOCK_BYTES) as u32,
            },
        };
        let tag = ClientTag { client, attempt };
        let d = self.client_delay();
        self.after(
            d,
            Ev::ClientSend {
                node,
                tag,
                pg: op.pg,
                req,
            },
        );
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
        if self.clients[c].scripted {
            self.clients[c].result = Some(reply.clone());
            if !matches!(reply, ClientReply::Ok | ClientReply::Data(_)) {
                if let ClientOpKind::Write { id, .. } = op.kind {
                    self.model.give_up(id, self.at_now());
                }
                self.finish_op(tag.client);
                return;
            }
        }
        match (reply, &op.kind) {
            (ClientReply::Ok, ClientOpKind::Write { id, .. }) => {
                self.model.ack(*id, self.at_now());
                self.finish_op(tag.client);
            }
            (ClientReply::Data(data), ClientOpKind::Read) => {
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
            (ClientReply::NotLeader(Some(l)), _) => {
                self.clients[c].hints.insert(op.pg, l);
                let d = self.rng.range(0, MS);
                self.retry(tag.client, d);
            }
            (reply, _) => {
                match reply {
                    ClientReply::Dropped if matches!(op.kind, ClientOpKind::Write { .. }) => {
                        self.probes.hit("client.dropped")
                    }
                    ClientReply::Busy => self.probes.hit("client.busy"),
                    ClientReply::Ok | ClientReply::Data(_) => {
                        self.fail(format!("client {}: reply {reply:?} to {op:?}", tag.client));
                        return;
                    }
                    _ => {}
                }
                self.clients[c].hints.remove(&op.pg);
                let d = self.rng.range(10 * MS, 200 * MS);
                self.retry(tag.client, d);
            }
        }
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

    /// Sends one operation of a scripted client to `node`: a write of a fresh stamp, or a
    /// read, of block `block` of object `object`.
    pub fn submit(&mut self, client: u32, node: OsdId, write: bool, object: u64, block: u64) {
        let c = client as usize;
        assert!(self.clients[c].scripted, "client {client} is not scripted");
        // A scenario's action is an event of its own: it comes after everything handled so far.
        self.events += 1;
        assert!(self.clients[c].op.is_none(), "client {client} is busy");
        let blocks_per_object = self.o.object_bytes / BLOCK_BYTES as u64;
        let first_block = object * blocks_per_object + block;
        let pg = object_pg(self.pool, self.o.pg_count, IMAGE, object);
        let kind = if write {
            let id = self.model.begin_write(self.at_now(), first_block, 1);
            let mut data = BytesMut::zeroed(BLOCK_BYTES);
            stamp_block(&mut data, IMAGE.0, first_block * BLOCK_BYTES as u64, id);
            ClientOpKind::Write {
                id,
                data: data.freeze(),
            }
        } else {
            ClientOpKind::Read
        };
        self.clients[c].result = None;
        self.clients[c].hints.insert(pg, node);
        self.clients[c].op = Some(ClientOp {
            kind,
            pg,
            object: ObjectRef {
                image: IMAGE,
                index: object,
            },
            offset: (block * BLOCK_BYTES as u64) as u32,
            first_block,
            blocks: 1,
            started: self.now,
            attempt_started: self.at_now(),
        });
        self.send_attempt(client);
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
        for (pg, info) in self.pg_infos() {
            if let Err(why) = self.pg_settled(pg, &info) {
                return why;
            }
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
            let node = &self.nodes[m];
            let Some(run) = node.run.as_ref() else {
                return Err(format!("pg {pg}: osd {m} is down"));
            };
            if node.is_busy() {
                return Err(format!("pg {pg}: osd {m} is busy"));
            }
            if run.map_epoch != self.mon.map.epoch {
                return Err(format!("pg {pg}: osd {m} has not seen the current map"));
            }
            let Some(r) = run.pgs.get(&pg) else {
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
            let r = &self.nodes[m].run.as_ref().expect("up").pgs[&pg];
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
            if let Some(run) = node.run.as_ref() {
                if run.pgs.contains_key(&pg) || run.store.borrow().pg_log(pg).is_some() {
                    return Err(format!("pg {pg}: osd {id} is no member but still holds it"));
                }
            }
        }
        Ok(())
    }

    /// The liveness condition: clients done, every PG settled, replicas identical, and every
    /// block reads back as the model allows.
    fn converged(&mut self) -> Result<bool, String> {
        if self.clients.iter().any(|c| !c.stopped || c.op.is_some()) {
            return Ok(false);
        }
        let infos = self.pg_infos();
        for (pg, info) in &infos {
            if self.pg_settled(*pg, info).is_err() {
                return Ok(false);
            }
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
            let run = self.nodes[&member].run.as_ref().expect("up");
            run.store
                .borrow_mut()
                .read_object(
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
        Ok(true)
    }

    fn replica_content(&self, id: OsdId, pg: PgId) -> Result<Content, String> {
        let run = self.nodes[&id].run.as_ref().expect("up");
        let mut store = run.store.borrow_mut();
        let mut objects = store
            .list_objects(pg)
            .map_err(|e| format!("listing pg {pg} on osd {id}: {e}"))?;
        objects.sort();
        let mut out = Vec::new();
        for object in objects {
            let mut buf = vec![0u8; self.o.object_bytes as usize];
            store
                .read_object(pg, object, 0, &mut buf)
                .map_err(|e| format!("reading pg {pg} {object:?} on osd {id}: {e}"))?;
            out.push((object, buf));
        }
        Ok(out)
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
        },
    )
    .map_err(|e| format!("boot osd {id}: {e:?}"))
}

fn trace_line(ev: &Ev) -> String {
    match ev {
        Ev::Packet {
            from, to, pg, msg, ..
        } => match msg {
            PeerMsg::Raft(bytes) => {
                use protobuf::Message as _;
                let m = raft::eraftpb::Message::parse_from_bytes(bytes).unwrap_or_default();
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
            PeerMsg::Chunk(c) => format!(
                "packet {from}->{to} pg {pg} SnapChunk transfer {:#x} seq {} last {} object {} offset {} bytes {}",
                c.transfer,
                c.seq,
                c.last,
                c.object_index,
                c.offset,
                c.data.len()
            ),
            PeerMsg::Ack { transfer, seq, ok } => {
                format!("packet {from}->{to} pg {pg} SnapAck transfer {transfer:#x} seq {seq} ok {ok}")
            }
        },
        Ev::ClientSend { node, tag, pg, req } => {
            let what = match req {
                ClientReq::Write {
                    object,
                    offset,
                    data,
                } => {
                    format!("write obj {} off {offset} len {}", object.index, data.len())
                }
                ClientReq::Read {
                    object,
                    offset,
                    length,
                } => {
                    format!("read obj {} off {offset} len {length}", object.index)
                }
            };
            format!(
                "client {} attempt {} -> osd {node} pg {pg}: {what}",
                tag.client, tag.attempt
            )
        }
        Ev::ClientReply { tag, reply } => {
            let r = match reply {
                ClientReply::Data(d) => format!("Data({} bytes)", d.len()),
                other => format!("{other:?}"),
            };
            format!(
                "reply to client {} attempt {}: {r}",
                tag.client, tag.attempt
            )
        }
        other => format!("{other:?}"),
    }
}

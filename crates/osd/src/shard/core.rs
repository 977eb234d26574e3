//! The shard loop. One iteration:
//!
//! 1. drain inputs (requests, Raft batches, closed connections) and, when due, tick every PG;
//! 2. for every PG output: queue replies, report events, collect Raft messages, log writes
//!    and committed entries;
//! 3. apply committed entries to the object store (no sync: the WAL holds them until the next
//!    flush), tell the replicas (`on_applied`), and hand the replies this releases (and those
//!    of step 2) to the sockets at once: they are durable on a majority already;
//! 4. send the Raft messages (a leader's appends go out before its own log write, so the
//!    followers' fdatasync overlaps ours);
//! 5. persist every PG's log write into the shard's WAL and commit them together: one write,
//!    one fdatasync (group commit across PGs), skipped when only commit indexes moved (etcd's
//!    MustSync rule); then `on_persisted`, which releases held messages; repeat 2-5 until no
//!    PG has more to do;
//! 6. flush connections.
//!
//! An I/O error from the store stops the shard (fail-stop): every later request gets
//! `IoError`, and the control task is told so the OSD exits.

use super::net::{self, ConnId, InputQueue, Outbox, PeerLink, SharedOutbox, OUT_BYTES_MAX};
use super::{ShardCommand, ShardEvent, ShardSpec, ShardStore};
use crate::region::RegionDisk;
use crate::stages::Stage;
use bytes::BytesMut;
use fastblock_pg::{
    Apply, ClientOp, Event, LeaderReport, OpId, OpOutcome, Output, PgError, PgReplica,
};
use fastblock_store::{PgStorage, UringDisk, UringOptions};
use fastblock_types::api::{LeaderElectedRequest, PgIoCounters};
use fastblock_types::map::ClusterMap;
use fastblock_types::{OsdId, PgId};
use fastblock_wire::{LeaderHint, ObjectAddr, RaftEnvelope, Reply, Request, Status};
use protobuf::Message as _;
use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::{mpsc, Notify};

/// Client operations in flight per connection before `Busy`.
pub const CONN_INFLIGHT_OPS_MAX: usize = 4096;

pub struct HostedPg {
    pub replica: PgReplica<PgStorage<RegionDisk<UringDisk>>>,
    pub io: PgIoCounters,
}

pub enum OpKind {
    Mutation {
        /// The range the mutation covers (counted as written bytes).
        bytes: u64,
        /// Data it carries in its log entry (a write's bytes; a discard carries a range
        /// only), counted in `Shard::pending_mutation_bytes` until it is answered.
        log_bytes: u64,
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
}

pub struct PendingOp {
    pub conn: ConnId,
    pub request_id: u64,
    pub pg: PgId,
    pub kind: OpKind,
    /// When the request was read, and when it was proposed (or its read index asked).
    pub arrived: Instant,
    pub started: Instant,
}

pub struct Shard {
    pub spec: ShardSpec,
    pub store: Rc<RefCell<ShardStore>>,
    pub pgs: BTreeMap<PgId, HostedPg>,
    pub map: Arc<ClusterMap>,
    pub inputs: InputQueue,
    pub wake: Arc<Notify>,
    pub conns: BTreeMap<ConnId, SharedOutbox>,
    pub conn_inflight: BTreeMap<ConnId, usize>,
    pub peers: BTreeMap<(OsdId, u16), PeerLink>,
    pub next_conn: ConnId,
    pub next_op: u64,
    pub ops: BTreeMap<u64, PendingOp>,
    /// Data bytes of the writes in `ops` (proposed here, not yet answered): bounded by
    /// `wal_fit::uncommitted_bytes_max` at admission.
    pub pending_mutation_bytes: u64,
    pub events: mpsc::UnboundedSender<ShardEvent>,
    pub failed: Option<String>,
    pub applied_since_flush: bool,
    pub recovery: super::recovery::Recovery,
    /// When the last apply batch started: the commit time of the writes it completes.
    pub apply_started: Instant,
    /// When the flush whose metadata commit is running began.
    pub flush_started: Option<Instant>,
    /// The WAL segment being written when the last flush began (see `flush_if_wal_advanced`).
    pub flush_wal_seq: u64,
    /// Milliseconds since the shard started, sampled at the start of each iteration: the
    /// replicas' lease clock (`fastblock_pg::lease`).
    pub now_ms: u64,
    clock_origin: Instant,
    listener: Option<std::net::TcpListener>,
}

impl Shard {
    pub fn open(
        spec: ShardSpec,
        listener: std::net::TcpListener,
        events: mpsc::UnboundedSender<ShardEvent>,
    ) -> anyhow::Result<Shard> {
        let disk = UringDisk::open(
            &spec.data,
            UringOptions {
                sync_mode: spec.wal_sync,
                ..UringOptions::default()
            },
        )?;
        let disk = RegionDisk::new(disk, spec.index, spec.count)?;
        let meta = crate::shard_meta_path(&spec.data, spec.index);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(false)
            .open(&meta)
            .map_err(|e| anyhow::anyhow!("opening {}: {e}", meta.display()))?;
        let backend = redb_backend(file)?;
        let mut store = ShardStore::open(disk, backend, super::store_options())?;
        // Flushes commit their metadata on a thread of their own, which wakes this loop
        // when one is durable (see `maybe_flush`, `poll_flush`).
        let wake = Arc::new(Notify::new());
        let notify = wake.clone();
        store.start_flusher(
            format!("flush-{}", spec.index),
            Box::new(move || notify.notify_one()),
        )?;
        let recovery = super::recovery::Recovery::new(spec.osd, spec.index, spec.recovery);
        Ok(Shard {
            recovery,
            spec,
            store: Rc::new(RefCell::new(store)),
            pgs: BTreeMap::new(),
            map: Arc::new(ClusterMap::default()),
            inputs: Rc::new(RefCell::new(VecDeque::new())),
            wake,
            conns: BTreeMap::new(),
            conn_inflight: BTreeMap::new(),
            peers: BTreeMap::new(),
            next_conn: 1,
            next_op: 1,
            ops: BTreeMap::new(),
            pending_mutation_bytes: 0,
            events,
            failed: None,
            applied_since_flush: false,
            apply_started: Instant::now(),
            flush_started: None,
            flush_wal_seq: 0,
            now_ms: 0,
            clock_origin: Instant::now(),
            listener: Some(listener),
        })
    }

    pub async fn run(mut self, mut commands: mpsc::UnboundedReceiver<ShardCommand>) {
        let listener = self.listener.take().expect("listener");
        listener
            .set_nonblocking(true)
            .expect("nonblocking listener");
        let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
        let accepted: Rc<RefCell<VecDeque<tokio::net::TcpStream>>> =
            Rc::new(RefCell::new(VecDeque::new()));
        {
            let accepted = accepted.clone();
            let wake = self.wake.clone();
            tokio::task::spawn_local(async move {
                loop {
                    match listener.accept().await {
                        Ok((stream, _)) => {
                            let _ = stream.set_nodelay(true);
                            accepted.borrow_mut().push_back(stream);
                            wake.notify_one();
                        }
                        Err(e) => {
                            tracing::warn!("accept: {e}");
                            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        }
                    }
                }
            });
        }
        let mut ticker = tokio::time::interval(self.spec.tick);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut flusher = tokio::time::interval(self.spec.flush_interval);
        flusher.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let mut tick = false;
            tokio::select! {
                biased;
                cmd = commands.recv() => match cmd {
                    Some(ShardCommand::Map(map)) => self.on_map(map),
                    Some(ShardCommand::Stats(reply)) => { let _ = reply.send(self.stats()); }
                    Some(ShardCommand::Shutdown(done)) => {
                        self.shutdown();
                        let _ = done.send(());
                        return;
                    }
                    None => { self.shutdown(); return; }
                },
                _ = self.wake.notified() => {}
                _ = ticker.tick() => tick = true,
                _ = flusher.tick() => self.maybe_flush(),
            }
            while let Some(stream) = accepted.borrow_mut().pop_front() {
                self.add_conn(stream);
            }
            self.poll_flush();
            self.iterate(tick);
            self.flush_if_wal_advanced();
        }
    }

    fn add_conn(&mut self, stream: tokio::net::TcpStream) {
        let conn = self.next_conn;
        self.next_conn += 1;
        let (read, write) = stream.into_split();
        let outbox = Outbox::new(Some(write));
        tokio::task::spawn_local(net::writer_task(outbox.clone()));
        tokio::task::spawn_local(net::reader_task(
            conn,
            read,
            self.inputs.clone(),
            self.wake.clone(),
        ));
        self.conns.insert(conn, outbox);
    }

    /// One loop iteration (see the module doc).
    pub fn iterate(&mut self, tick: bool) {
        self.spec.stages.iteration();
        // Sampled before any input is handled: a lease is never checked against a clock
        // older than the iteration that serves the read.
        self.now_ms = self.clock_origin.elapsed().as_millis() as u64;
        let mut outs: BTreeMap<PgId, Output> = BTreeMap::new();
        loop {
            let next = self.inputs.borrow_mut().pop_front();
            match next {
                Some(input) => self.handle_input(input, &mut outs),
                None => break,
            }
        }
        if tick && self.failed.is_none() {
            for (pg, hosted) in self.pgs.iter_mut() {
                hosted
                    .replica
                    .tick(self.now_ms, outs.entry(*pg).or_default());
            }
            self.tick_recovery(&mut outs);
        }
        self.process(outs);
        // Recovery goes after client work, within its rate limit.
        self.pump_recovery();
        self.flush_conns();
    }

    /// Steps 2-4 of the loop, until quiet.
    pub fn process(&mut self, mut outs: BTreeMap<PgId, Output>) {
        let mut rounds = 0;
        while outs.values().any(|o| !o.is_empty()) {
            rounds += 1;
            assert!(
                rounds < 10_000,
                "osd {} shard {}: PG outputs never settle",
                self.spec.osd,
                self.spec.index
            );
            let mut raft_out: BTreeMap<OsdId, Vec<RaftEnvelope>> = BTreeMap::new();
            let mut writes = Vec::new();
            let mut applies = Vec::new();
            let mut snapshots = Vec::new();
            let mut replied = false;
            for (pg, out) in outs.iter_mut() {
                snapshots.extend(out.snapshots.drain(..).map(|m| (*pg, m)));
                for msg in out.messages.drain(..) {
                    let to = OsdId(msg.to as u32);
                    match msg.write_to_bytes() {
                        Ok(bytes) => raft_out.entry(to).or_default().push(RaftEnvelope {
                            pg: *pg,
                            msg: bytes.into(),
                        }),
                        Err(e) => tracing::error!(%pg, "encoding a raft message: {e}"),
                    }
                }
                for (op, outcome) in out.replies.drain(..) {
                    self.complete(op, outcome);
                    replied = true;
                }
                for event in out.events.drain(..) {
                    self.on_event(*pg, event);
                }
                if !out.log_writes.is_empty() {
                    writes.push((*pg, std::mem::take(&mut out.log_writes)));
                }
                if !out.apply.is_empty() {
                    applies.push((*pg, std::mem::take(&mut out.apply)));
                }
            }
            // Apply and answer first: committed entries are durable on a majority already
            // (raft-rs hands out only committed entries that are also persisted here), so
            // their clients wait neither for this round's Raft messages (on a leader, often
            // just the commit index for the followers) nor for the fdatasync of newer entries
            // or of a hard state. Read replies and refusals leave here too.
            let applied = self.apply(applies);
            let mut next: BTreeMap<PgId, Output> = BTreeMap::new();
            for (pg, index) in applied {
                if let Some(h) = self.pgs.get_mut(&pg) {
                    let out = next.entry(pg).or_default();
                    h.replica.on_applied(index, out);
                    for (op, outcome) in std::mem::take(&mut out.replies) {
                        self.complete(op, outcome);
                        replied = true;
                    }
                }
            }
            if replied {
                self.flush_conns();
            }
            for (pg, msg) in snapshots {
                self.on_snapshot_request(pg, msg, &mut next);
            }
            // Raft messages before the log write: a leader's appends leave before its own
            // fdatasync, so the followers' overlaps it.
            self.send_raft(raft_out);
            let persisted = self.persist(writes, &mut next);
            for (pg, number) in persisted {
                if let Some(h) = self.pgs.get_mut(&pg) {
                    h.replica.on_persisted(number, next.entry(pg).or_default());
                }
            }
            outs = next;
        }
    }

    /// Writes every PG's log write into the WAL and commits them with one sync. Returns the
    /// highest persisted ready number per PG. Snapshot transfers abandoned for room are
    /// reported to Raft in `outs`.
    fn persist(
        &mut self,
        writes: Vec<(PgId, Vec<fastblock_pg::LogWrite>)>,
        outs: &mut BTreeMap<PgId, Output>,
    ) -> Vec<(PgId, u64)> {
        if writes.is_empty() || self.failed.is_some() {
            return Vec::new();
        }
        let mut result = self.persist_once(&writes);
        if let Err(fastblock_store::Error::NoSpace {
            area: fastblock_store::SpaceArea::Wal,
            ..
        }) = &result
        {
            // The WAL is full of entries kept for lagging followers or behind snapshots being
            // sent: abandon the transfers (Raft asks again later, from a newer index), flush,
            // compact everything applied, and retry once. Nothing was written by the failed
            // attempt. Found by the simulator (seed 7164261484067460021): keeping the log
            // behind a long transfer while other PGs write filled the WAL and stopped the
            // shard.
            let abandoned = self.abandon_all_sends(outs);
            tracing::warn!(osd = %self.spec.osd, shard = self.spec.index, transfers_abandoned = abandoned, "WAL full; compacting all applied entries");
            let compacted = self.flush_and_compact(0);
            result = compacted.and_then(|_| self.persist_once(&writes));
        }
        match result {
            Ok(persisted) => persisted,
            Err(e) => {
                self.fail(format!("WAL commit: {e}"));
                Vec::new()
            }
        }
    }

    fn persist_once(
        &mut self,
        writes: &[(PgId, Vec<fastblock_pg::LogWrite>)],
    ) -> fastblock_store::Result<Vec<(PgId, u64)>> {
        let mut persisted = Vec::new();
        let mut installed = Vec::new();
        let mut store = self.store.borrow_mut();
        let batch_bytes_max = store.superblock().batch_bytes_max;
        let mut needs_commit = false;
        let entries: usize = writes
            .iter()
            .flat_map(|(_, l)| l)
            .map(|w| w.entries.len())
            .sum();
        for (pg, list) in writes {
            let mut last = 0;
            for w in list {
                if let Some(snap) = &w.snapshot {
                    // Replaces the PG's objects with the staged ones (made durable here, in
                    // one metadata commit) and restarts its log after the snapshot.
                    let md = snap.get_metadata();
                    with_room(&mut store, |s| {
                        s.install_snapshot(*pg, md.index, md.term, md.get_conf_state())
                    })?;
                    installed.push(*pg);
                    needs_commit = true;
                }
                // Entries go in runs that fit one WAL batch (by bytes), so that many large
                // entries fill several batches instead of overflowing one.
                for chunk in super::wal_fit::batches(&w.entries, batch_bytes_max) {
                    with_room(&mut store, |s| s.append_entries(*pg, chunk))?;
                    needs_commit = true;
                }
                if let Some(hs) = &w.hard_state {
                    // As etcd's raft `MustSync`: a hard state that moves only the commit index
                    // needs no fdatasync of its own (a lost commit index is learnt again from
                    // the leader; term and vote must be durable before any message that
                    // depends on them leaves). It rides with the next commit, and the store
                    // commits it before any flush, so a flushed applied index never runs
                    // ahead of the durable commit index.
                    let prev = store
                        .pg_log(*pg)
                        .map(|l| (l.hard_state.term, l.hard_state.vote));
                    with_room(&mut store, |s| s.set_hard_state(*pg, hs))?;
                    needs_commit |= prev != Some((hs.term, hs.vote));
                }
                last = w.ready_number;
            }
            persisted.push((*pg, last));
        }
        if needs_commit {
            let start = Instant::now();
            store.commit()?;
            self.spec.stages.wal_commit(start.elapsed(), entries);
        }
        drop(store);
        for pg in installed {
            tracing::info!(%pg, "snapshot installed");
            self.snapshot_installed(pg);
        }
        Ok(persisted)
    }

    /// Applies committed entries to the object store (staged; durable at the next flush).
    /// Returns the last applied index per PG.
    fn apply(
        &mut self,
        applies: Vec<(PgId, Vec<Apply>)>,
    ) -> Vec<(PgId, fastblock_types::LogIndex)> {
        if applies.is_empty() || self.failed.is_some() {
            return Vec::new();
        }
        let mut done = Vec::new();
        let mut failure = None;
        self.apply_started = Instant::now();
        {
            let mut store = self.store.borrow_mut();
            for (pg, list) in &applies {
                let mut last = None;
                for a in list {
                    let r = match a {
                        Apply::Op { op, .. } => apply_op(&mut store, *pg, op),
                        Apply::Noop {
                            conf_state: Some(cs),
                            ..
                        } => store.set_conf_state(*pg, cs),
                        Apply::Noop { .. } => Ok(()),
                    };
                    if let Err(e) = r {
                        failure = Some(format!("applying pg {pg} index {}: {e}", a.index()));
                        break;
                    }
                    last = Some(a.index());
                }
                if failure.is_some() {
                    break;
                }
                if let Some(index) = last {
                    if let Err(e) = store.set_applied(*pg, index.0) {
                        failure = Some(format!("recording applied index of pg {pg}: {e}"));
                        break;
                    }
                    done.push((*pg, index));
                }
            }
        }
        if let Some(reason) = failure {
            self.fail(reason);
            return Vec::new();
        }
        self.applied_since_flush = true;
        self.spec
            .stages
            .since(Stage::Apply, self.apply_started, Instant::now());
        done
    }

    /// Periodic flush: applied data and metadata become durable, and the log behind them
    /// (minus a retained tail for lagging followers) is compacted. This loop writes and
    /// syncs the applied data; the metadata commit (milliseconds of redb page writes and an
    /// fsync) runs on the store's flusher thread, and [`Shard::poll_flush`] compacts once it
    /// is durable. A tick while one is still running is skipped.
    pub fn maybe_flush(&mut self) {
        if !self.applied_since_flush || self.failed.is_some() {
            return;
        }
        let start = Instant::now();
        let begun = self.store.borrow_mut().flush_begin();
        match begun {
            Ok(true) => {
                self.applied_since_flush = false;
                self.flush_started = Some(start);
                self.flush_wal_seq = self.store.borrow().wal().current_segment_seq();
            }
            Ok(false) => {}
            Err(e) => self.fail(format!("flush: {e}")),
        }
    }

    /// Flushes before the interval is up once the log has advanced by an eighth of the WAL
    /// since the last flush began: a burst of writes (a sequential 1 MiB stream writes
    /// 100+ MiB/s per OSD) would otherwise fill the WAL between two flushes, since only a
    /// flush lets the log be compacted.
    pub fn flush_if_wal_advanced(&mut self) {
        if !self.applied_since_flush {
            return;
        }
        let (seq, segments) = {
            let store = self.store.borrow();
            (
                store.wal().current_segment_seq(),
                u64::from(store.superblock().segment_count),
            )
        };
        if seq >= self.flush_wal_seq + (segments / 8).max(1) {
            self.maybe_flush();
        }
    }

    /// Compacts the logs after a flush became durable (called every loop iteration; the
    /// flusher thread wakes the loop).
    pub fn poll_flush(&mut self) {
        if self.failed.is_some() {
            return;
        }
        let polled = self.store.borrow_mut().flush_poll();
        match polled {
            Ok(None) => {}
            Ok(Some(_)) => {
                if let Some(start) = self.flush_started.take() {
                    self.spec.stages.observe(Stage::Flush, start.elapsed());
                }
                let compacted = {
                    let mut store = self.store.borrow_mut();
                    self.compact_logs(&mut store, self.spec.log_retain_entries)
                };
                if let Err(e) = compacted {
                    self.fail(format!("compaction: {e}"));
                }
            }
            Err(e) => self.fail(format!("flush: {e}")),
        }
    }

    /// Flushes applied state, then compacts each PG's log up to `retain` entries behind its
    /// flushed applied index.
    fn flush_and_compact(&mut self, retain: u64) -> fastblock_store::Result<()> {
        let store = self.store.clone();
        let mut store = store.borrow_mut();
        // Waits for a running background commit first.
        store.flush()?;
        self.compact_logs(&mut store, retain)
    }

    /// Compacts each PG's log up to `retain` entries behind its flushed applied index.
    fn compact_logs(&self, store: &mut ShardStore, retain: u64) -> fastblock_store::Result<()> {
        for (pg, hosted) in &self.pgs {
            let flushed = store.flushed_applied_index(*pg);
            let (first, _) = store.log_bounds(*pg);
            let mut target = flushed.saturating_sub(retain);
            if retain > 0 {
                // A leader keeps what some member still lacks, so a member that was down
                // catches up from the log; but not without bound: a member further behind
                // than `log_lag_max_entries` gets a snapshot instead. Only a full WAL (retain
                // 0) overrides this.
                if let Some(matched) = hosted.replica.min_match_index() {
                    let floor = flushed.saturating_sub(self.spec.log_lag_max_entries);
                    target = target.min(matched.0.max(floor));
                }
            }
            // A snapshot being sent is exact only with the log after its index (see
            // `fastblock_pg::transfer`): keep it. A full WAL abandons the transfers before
            // compacting (`persist`), so this never pins a full WAL.
            if let Some(index) = self.recovery.sending_index(*pg) {
                target = target.min(index);
            }
            if target >= first {
                store.compact(*pg, target)?;
            }
        }
        Ok(())
    }

    pub fn fail(&mut self, reason: String) {
        if self.failed.is_some() {
            return;
        }
        tracing::error!(osd = %self.spec.osd, shard = self.spec.index, "shard failed: {reason}");
        self.failed = Some(reason.clone());
        let ops: Vec<u64> = self.ops.keys().copied().collect();
        for op in ops {
            self.complete(OpId(op), OpOutcome::Failed(PgError::Failed(reason.clone())));
        }
        let _ = self.events.send(ShardEvent::Fatal {
            shard: self.spec.index,
            reason,
        });
    }

    fn shutdown(&mut self) {
        if self.failed.is_none() {
            let start = Instant::now();
            if let Err(e) = self.flush_and_compact(self.spec.log_retain_entries) {
                self.fail(format!("flush at shutdown: {e}"));
            }
            self.spec.stages.observe(Stage::Flush, start.elapsed());
        }
        self.flush_conns();
    }

    pub fn leader_hint(&self, pg: PgId, leader: Option<OsdId>) -> Option<LeaderHint> {
        let osd = self.map.osds.get(&leader?)?;
        Some(LeaderHint {
            osd: osd.id,
            address: osd.address.clone(),
            port: osd.port_for(pg),
        })
    }

    /// Queues a reply on a connection (dropped if the connection went away).
    pub fn reply(&mut self, conn: ConnId, request_id: u64, reply: &Reply) {
        if let Some(outbox) = self.conns.get(&conn) {
            let mut o = outbox.borrow_mut();
            o.reply_since.get_or_insert_with(Instant::now);
            reply.encode(request_id, &mut o.buf);
            if o.buf.len() > OUT_BYTES_MAX {
                // The client does not read its replies: stop serving it rather than buffer
                // without bound.
                o.closed = true;
                o.buf.clear();
                o.stream = None;
            }
        }
    }

    /// An operation finished: answer its client and count it.
    pub fn complete(&mut self, op: OpId, outcome: OpOutcome) {
        let Some(pending) = self.ops.remove(&op.0) else {
            return;
        };
        if let OpKind::Mutation { log_bytes, .. } = pending.kind {
            self.pending_mutation_bytes = self.pending_mutation_bytes.saturating_sub(log_bytes);
        }
        if let Some(n) = self.conn_inflight.get_mut(&pending.conn) {
            *n = n.saturating_sub(1);
        }
        let reply = match (outcome, &pending.kind) {
            (OpOutcome::Applied, OpKind::Mutation { bytes, .. }) => {
                if let Some(h) = self.pgs.get_mut(&pending.pg) {
                    h.io.write_ops += 1;
                    h.io.write_bytes += bytes;
                }
                let stages = &self.spec.stages;
                stages.since(Stage::Replication, pending.started, self.apply_started);
                stages.since(Stage::OpWrite, pending.arrived, Instant::now());
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
                let start = Instant::now();
                let r = self.read_object(*addr, *offset, *length);
                let end = Instant::now();
                let stages = &self.spec.stages;
                stages.since(Stage::ReadIndex, pending.started, start);
                stages.since(Stage::Read, start, end);
                stages.since(Stage::OpRead, pending.arrived, end);
                if r.is_ok() {
                    if let Some(h) = self.pgs.get_mut(&pending.pg) {
                        h.io.read_ops += 1;
                        h.io.read_bytes += u64::from(*length);
                    }
                }
                match r {
                    Ok(data) => Reply::Data(data),
                    Err(reply) => reply,
                }
            }
            (
                OpOutcome::ReadReady,
                OpKind::Allocation {
                    addr,
                    offset,
                    length,
                },
            ) => self.allocation_reply(*addr, *offset, *length),
            (OpOutcome::Failed(e), _) => self.error_reply(pending.pg, e),
            (other, _) => Reply::error(
                Status::Internal,
                None,
                format!("unexpected outcome {other:?}"),
            ),
        };
        self.reply(pending.conn, pending.request_id, &reply);
    }

    pub fn error_reply(&self, pg: PgId, e: PgError) -> Reply {
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
            PgError::Failed(reason) => Reply::error(Status::IoError, None, reason),
        }
    }

    /// Reads applied data of this replica.
    pub fn read_object(
        &mut self,
        addr: ObjectAddr,
        offset: u32,
        length: u32,
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
                let status = match &e {
                    fastblock_store::Error::Checksum { .. } => Status::Checksum,
                    e if e.is_fatal() => Status::IoError,
                    _ => Status::InvalidArgument,
                };
                if e.is_fatal() {
                    self.fail(format!("read: {e}"));
                }
                Err(Reply::error(
                    status,
                    None,
                    format!("pg {}: read: {e}", addr.pg),
                ))
            }
        }
    }

    fn on_event(&mut self, pg: PgId, event: Event) {
        match event {
            Event::BecameLeader(report) => {
                tracing::info!(%pg, term = report.term.0, voters = ?report.voters, "became leader");
                self.report_leader(pg, report);
            }
            Event::ConfigurationChanged(report) => {
                tracing::info!(%pg, term = report.term.0, conf_index = report.conf_index.0, voters = ?report.voters, outgoing = ?report.voters_outgoing, learners = ?report.learners, "configuration changed");
                self.report_leader(pg, report);
            }
            Event::LeaderChanged { leader, term } => {
                tracing::debug!(%pg, ?leader, term = term.0, "leader changed");
            }
            Event::Failed { index, reason } => {
                tracing::error!(%pg, index = index.0, "pg replica failed: {reason}");
            }
            Event::MembershipFinished(r) => {
                tracing::info!(%pg, term = r.term.0, voters = ?r.voters, "membership change finished");
                let req = fastblock_types::api::MembershipFinishedRequest {
                    leader: self.spec.osd,
                    term: r.term,
                    conf_index: r.conf_index,
                    voters: r.voters,
                    learners: r.learners,
                };
                let _ = self.events.send(ShardEvent::MembershipFinished { pg, req });
            }
            Event::ConfChangeRefused { index, reason } => {
                tracing::warn!(%pg, index = index.0, "configuration change refused by raft: {reason}");
            }
        }
    }

    /// Asks the control task to tell the monitor that this OSD leads `pg`.
    pub fn report_leader(&self, pg: PgId, r: LeaderReport) {
        let req = LeaderElectedRequest {
            leader: self.spec.osd,
            term: r.term,
            conf_index: r.conf_index,
            voters: r.voters,
            voters_outgoing: r.voters_outgoing,
            learners: r.learners,
        };
        let _ = self.events.send(ShardEvent::LeaderElected { pg, req });
    }

    /// Sends one Raft batch per destination OSD shard.
    fn send_raft(&mut self, by_osd: BTreeMap<OsdId, Vec<RaftEnvelope>>) {
        for (to, envelopes) in by_osd {
            let Some(info) = self.map.osds.get(&to).cloned() else {
                continue; // not in our map yet: Raft will retry
            };
            let mut by_port: BTreeMap<u16, Vec<RaftEnvelope>> = BTreeMap::new();
            for env in envelopes {
                by_port.entry(info.port_for(env.pg)).or_default().push(env);
            }
            for (port, msgs) in by_port {
                let link = self.peer_link(to, &info.address, port, info.boot_epoch);
                let req = Request::RaftBatch {
                    from: self.spec.osd,
                    to,
                    msgs,
                };
                let mut o = link.borrow_mut();
                if o.buf.len() > OUT_BYTES_MAX {
                    continue; // the peer is not keeping up: shed (Raft retransmits)
                }
                req.encode(0, &mut o.buf);
                o.flush_now();
            }
        }
    }

    pub(super) fn peer_link(
        &mut self,
        osd: OsdId,
        address: &str,
        port: u16,
        epoch: fastblock_types::Epoch,
    ) -> SharedOutbox {
        let addr = format!("{address}:{port}");
        let key = (osd, port);
        let stale = self
            .peers
            .get(&key)
            .is_some_and(|l| l.addr != addr || l.epoch != epoch || l.outbox.borrow().closed);
        if stale {
            self.peers.remove(&key);
        }
        if let Some(link) = self.peers.get(&key) {
            return link.outbox.clone();
        }
        let outbox = Outbox::new(None);
        self.peers.insert(
            key,
            PeerLink {
                osd,
                addr: addr.clone(),
                outbox: outbox.clone(),
                epoch,
            },
        );
        let me = self.spec.osd;
        let boot_epoch = self
            .map
            .osds
            .get(&me)
            .map(|o| o.boot_epoch)
            .unwrap_or_default();
        let target = outbox.clone();
        let inputs = self.inputs.clone();
        let wake = self.wake.clone();
        let conn = self.next_conn;
        self.next_conn += 1;
        tokio::task::spawn_local(async move {
            let connected = tokio::time::timeout(
                std::time::Duration::from_secs(2),
                tokio::net::TcpStream::connect(&addr),
            )
            .await;
            let stream = match connected {
                Ok(Ok(s)) => s,
                _ => {
                    // Pace reconnects: the link counts as connecting (not closed) a little
                    // longer, so a down peer is retried every 100 ms, not every iteration.
                    target.borrow_mut().buf.clear();
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    target.borrow_mut().closed = true;
                    return;
                }
            };
            let _ = stream.set_nodelay(true);
            let (read, write) = stream.into_split();
            {
                let mut o = target.borrow_mut();
                let mut hello = BytesMut::new();
                Request::Hello {
                    osd: me,
                    boot_epoch,
                }
                .encode(0, &mut hello);
                let pending = std::mem::replace(&mut o.buf, hello);
                o.buf.extend_from_slice(&pending);
                o.stream = Some(Rc::new(write));
                o.flush_now();
            }
            tokio::task::spawn_local(net::writer_task(target.clone()));
            // Peers never reply on this link, but reading notices when it closes.
            net::reader_task(conn, read, inputs, wake).await;
            target.borrow_mut().closed = true;
        });
        outbox
    }

    fn flush_conns(&mut self) {
        let mut closed = Vec::new();
        for (id, outbox) in &self.conns {
            let mut o = outbox.borrow_mut();
            o.flush_now();
            if o.buf.is_empty() {
                if let Some(since) = o.reply_since.take() {
                    self.spec.stages.since(Stage::Reply, since, Instant::now());
                }
            }
            if o.closed {
                closed.push(*id);
            }
        }
        for id in closed {
            self.conns.remove(&id);
            self.conn_inflight.remove(&id);
        }
        for link in self.peers.values() {
            link.outbox.borrow_mut().flush_now();
        }
    }

    fn stats(&self) -> Vec<PgIoCounters> {
        self.pgs
            .iter()
            .filter(|(_, h)| h.replica.is_leader())
            .map(|(pg, h)| {
                let (bytes, objects) = self.recovery.remaining(*pg);
                PgIoCounters {
                    pg: Some(*pg),
                    recovery_remaining_bytes: bytes,
                    recovery_remaining_objects: objects,
                    recovery_done_bytes: self.recovery.done_bytes.get(pg).copied().unwrap_or(0),
                    ..h.io
                }
            })
            .collect()
    }

    pub fn new_op(&mut self, pending: PendingOp) -> OpId {
        let id = self.next_op;
        self.next_op += 1;
        *self.conn_inflight.entry(pending.conn).or_default() += 1;
        self.ops.insert(id, pending);
        OpId(id)
    }
}

/// Runs a WAL append; if the pending batch is full, commits it (one more write and sync, still
/// before anything is acknowledged) and tries again.
fn with_room(
    store: &mut ShardStore,
    mut append: impl FnMut(&mut ShardStore) -> fastblock_store::Result<()>,
) -> fastblock_store::Result<()> {
    match append(store) {
        Err(fastblock_store::Error::BatchFull { .. }) => {
            store.commit()?;
            append(store)
        }
        other => other,
    }
}

fn apply_op(store: &mut ShardStore, pg: PgId, op: &ClientOp) -> fastblock_store::Result<()> {
    let object = fastblock_store::ObjectId {
        image: op.object().image,
        index: op.object().index,
    };
    match op {
        ClientOp::Write { offset, data, .. } => {
            store.write_object(pg, object, u64::from(*offset), data)
        }
        ClientOp::Discard { offset, length, .. } | ClientOp::WriteZeroes { offset, length, .. } => {
            store.zero_object(pg, object, u64::from(*offset), u64::from(*length))
        }
    }
}

fn redb_backend(file: std::fs::File) -> anyhow::Result<redb::backends::FileBackend> {
    Ok(redb::backends::FileBackend::new(file)?)
}

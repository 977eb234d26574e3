//! The shard's runtime around [`ShardCore`]: it owns the sockets, the timers and the clock,
//! and makes no protocol or durability decision of its own.
//!
//! One loop iteration:
//!
//! 1. wait for a command, a wake-up (a socket read, an accepted connection, the flusher
//!    thread), a completion on the disk's io_uring (its eventfd), the tick timer, the flush
//!    timer or the host space sampler (`select!`, biased towards commands);
//! 2. hand everything that arrived to ONE [`ShardCore::step_batch`]: the new map, the flush
//!    timer, a sample of the metadata file system's free space, a finished flush,
//!    `WalDurable` if the disk completed something while commits are in flight, every queued
//!    network input, then the tick. One batch lets the PGs of all
//!    those inputs share the next WAL commit (group commit across PGs);
//! 3. carry out the effects: replies into connection buffers, frames to peer links, reports
//!    to the control task, stage timings into histograms; then write the sockets at once;
//! 4. only then, when the core asks for it ([`Effects::wal_commit_due`]), step `WalCommit`:
//!    the replies and a leader's Raft appends are already on the wire, so the followers'
//!    commits overlap ours. The commit's durable write (and fdatasync, per `--wal-sync`) goes
//!    to the io_uring without waiting; the core keeps stepping (and writes up to
//!    `--wal-commits-in-flight` commits) while it runs, and the ring's eventfd brings the
//!    loop back to step `WalDurable` when it completes. Carry out each step's effects the
//!    same way until a step asks for no commit.
//!
//! When the core can take no new input until a commit completes (as many are in flight as
//! `--wal-commits-in-flight` allows), the loop blocks on the ring's eventfd instead of going
//! back to the sockets: a request read then would only wait in the core, and reading it
//! costs a wake-up and a step. The requests that arrive meanwhile stay in the sockets and
//! are read together afterwards, as one batch that shares the next commit. The wait is cut
//! into slices of [`COMMIT_WAIT_SLICE`] so that a slow disk never holds off the timers and
//! commands for longer.
//!
//! After [`Report::Fatal`] the runtime keeps serving: the core answers client requests with
//! `IoError` itself, and the control task, told at once, stops the OSD.

use super::auth::AuthContext;
use super::net::{self, InputQueue, Outbox, PeerLink, SharedOutbox, OUT_BYTES_MAX};
use super::{Clock, ShardCommand, ShardDisk, ShardEvent, ShardSpec, ShardStats, ShardStore};
use crate::region::RegionDisk;
use crate::stages::Stage;
use bytes::BytesMut;
use fastblock_auth::{AuthMode, EntityTable};
use fastblock_shard::{ConnId, Effects, Input, PeerSend, Report, ShardConfig, ShardCore};
use fastblock_store::{UringDisk, UringOptions};
use fastblock_types::map::ClusterMap;
use fastblock_types::{Epoch, OsdId};
use fastblock_wire::{Reply, Request};
use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, Notify};

/// A flush starts before its interval is up once the log advanced by this share (1/N) of the
/// WAL since the last one began.
const FLUSH_WAL_SHARE_DIVISOR: u64 = 8;
/// Longest the loop blocks on the disk at once while the core waits for a commit (see the
/// module doc); then it serves timers and commands before it waits again.
const COMMIT_WAIT_SLICE: Duration = Duration::from_millis(10);
/// How often the loop samples the free space of the file system holding the metadata (and
/// allocates the metadata file's new holes): writes stop within this of the file system
/// running low, and resume within this of room coming back.
const HOST_SPACE_SAMPLE_INTERVAL: Duration = Duration::from_secs(1);

pub struct Runtime {
    spec: ShardSpec,
    core: ShardCore<ShardDisk>,
    clock: Clock,
    /// The newest map: where peers are (the core keeps its own for its decisions).
    map: Arc<ClusterMap>,
    inputs: InputQueue,
    wake: Arc<Notify>,
    /// Set by the flusher thread when a flush's metadata commit finished (before it wakes the
    /// loop): the next batch carries `FlushDone`.
    flush_finished: Arc<AtomicBool>,
    conns: BTreeMap<ConnId, SharedOutbox>,
    peers: BTreeMap<(OsdId, u16), PeerLink>,
    /// Connection ids of accepted connections and of peer links alike.
    next_conn: ConnId,
    events: mpsc::UnboundedSender<ShardEvent>,
    listener: Option<std::net::TcpListener>,
    /// Signalled by the kernel for completions on the disk's io_uring while WAL commits are in
    /// flight (`UringDisk::register_eventfd`; None: no io_uring, commits are synchronous).
    completions: Option<OwnedFd>,
    /// The same eventfd while [`Runtime::run`] owns it, for blocking waits.
    completion_fd: Option<RawFd>,
    /// The metadata file (a handle of our own, for allocating its holes) and its path (whose
    /// file system the host space samples measure).
    meta_file: std::fs::File,
    meta_path: std::path::PathBuf,
    /// A sample failed and was logged: later failures are not (until one succeeds).
    space_sample_failed: bool,
    /// The map and key table the connections' authentication reads.
    auth: Rc<AuthContext>,
    /// The key table the open connections were last checked against.
    keys_checked: Arc<EntityTable>,
    /// Whether a map arrived: connections are served only then, in the map's auth mode.
    map_received: bool,
}

/// A non-blocking eventfd for the disk's io_uring to signal completions on.
fn completion_eventfd(disk: &mut UringDisk) -> std::io::Result<OwnedFd> {
    // SAFETY: eventfd(2) with valid flags; the result is checked before use.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    disk.register_eventfd(fd.as_raw_fd())?;
    Ok(fd)
}

/// Empties the eventfd's counter (it is non-blocking: nothing to read is fine).
fn drain_eventfd(fd: RawFd) {
    let mut counter = [0u8; 8];
    // SAFETY: reads at most 8 bytes into a valid buffer of 8.
    let _ = unsafe { libc::read(fd, counter.as_mut_ptr().cast(), counter.len()) };
}

/// Blocks until the eventfd is readable or `timeout` passed; drains it if it was. Draining
/// before the next `epoll_wait` also keeps tokio from waking the loop once more for the
/// same completions (epoll re-checks an edge-triggered event's readiness before reporting).
fn wait_eventfd(fd: RawFd, timeout: Duration) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let timeout_ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: one valid pollfd, count 1.
    let n = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
    if n <= 0 {
        // Timed out, or interrupted by a signal: the caller goes back to its loop.
        return false;
    }
    drain_eventfd(fd);
    true
}

impl Runtime {
    pub fn open(
        spec: ShardSpec,
        listener: std::net::TcpListener,
        events: mpsc::UnboundedSender<ShardEvent>,
    ) -> anyhow::Result<Runtime> {
        let clock = Clock::start();
        let mut disk = UringDisk::open(
            &spec.data,
            UringOptions {
                sync_mode: spec.wal_sync,
                ..UringOptions::default()
            },
        )?;
        // Commits go in flight only if the loop can hear them complete.
        let completions = match completion_eventfd(&mut disk) {
            Ok(fd) => Some(fd),
            Err(e) => {
                tracing::warn!(shard = spec.index, error = %e,
                    "no completion eventfd; WAL commits wait for their fdatasync");
                None
            }
        };
        let disk = RegionDisk::new_faulty(disk, spec.faults.clone(), spec.index, spec.count)?;
        let region_bytes = fastblock_store::Disk::size_bytes(&disk);
        let meta = crate::shard_meta_path(&spec.data, spec.index);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(false)
            .open(&meta)
            .map_err(|e| anyhow::anyhow!("opening {}: {e}", meta.display()))?;
        let meta_file = file.try_clone()?;
        let backend = redb::backends::FileBackend::new(file)?;
        let mut store = ShardStore::open(disk, backend, super::store_options())?;
        let host_space_reserve_bytes = spec.host_space_reserve_bytes.unwrap_or_else(|| {
            let sb = store.superblock();
            let wal_bytes = sb.segment_size_bytes * u64::from(sb.segment_count);
            ShardConfig::host_space_reserve_bytes(spec.count, region_bytes, wal_bytes)
        });
        // Flushes commit their metadata on a thread of their own, which wakes this loop when
        // one is durable; the loop then steps `FlushDone` (the core compacts behind it).
        let wake = Arc::new(Notify::new());
        let flush_finished = Arc::new(AtomicBool::new(false));
        {
            let wake = wake.clone();
            let finished = flush_finished.clone();
            store.start_flusher(
                format!("flush-{}", spec.index),
                Box::new(move || {
                    finished.store(true, Ordering::Release);
                    wake.notify_one();
                }),
            )?;
        }
        let mut cfg = shard_config(&spec, transfer_id_base(spec.osd, spec.index));
        cfg.host_space_reserve_bytes = host_space_reserve_bytes;
        if completions.is_none() {
            cfg.wal_commits_in_flight_max = 1;
        }
        let core = ShardCore::new(cfg, store, Box::new(move || clock.now()));
        Ok(Runtime {
            core,
            clock,
            map: Arc::new(ClusterMap::default()),
            inputs: Rc::new(RefCell::new(VecDeque::new())),
            wake,
            flush_finished,
            conns: BTreeMap::new(),
            peers: BTreeMap::new(),
            next_conn: 1,
            events,
            listener: Some(listener),
            completions,
            completion_fd: None,
            meta_file,
            meta_path: meta,
            space_sample_failed: false,
            auth: Rc::new(AuthContext {
                map: RefCell::new(Arc::new(ClusterMap::default())),
                keys: spec.keys.clone(),
                me: spec.osd,
                service_key: spec.credentials.as_ref().map(|(_, key)| key.service_key()),
            }),
            keys_checked: crate::keys::current(&spec.keys),
            map_received: false,
            spec,
        })
    }

    /// Serves until the control task asks it to stop (or is gone). `Err`: the shard could not
    /// go on serving; the caller tells the control task, which stops the OSD.
    pub async fn run(
        mut self,
        mut commands: mpsc::UnboundedReceiver<ShardCommand>,
    ) -> Result<(), String> {
        let accepted = self.accept_connections()?;
        let mut ticker = tokio::time::interval(self.spec.tick);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut flush_interval = self.spec.flush_interval.clone();
        let mut flusher = tokio::time::interval(*flush_interval.borrow_and_update());
        flusher.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut flush_interval_open = true;
        let mut rates = self.spec.rates.clone();
        let mut rates_open = true;
        // Its first tick is at once: the core has a sample before the first request.
        let mut space = tokio::time::interval(HOST_SPACE_SAMPLE_INTERVAL);
        space.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        self.completion_fd = self.completions.as_ref().map(|fd| fd.as_raw_fd());
        let completions = match self.completions.take() {
            // SAFETY: the runtime owns `fd` (an eventfd it created) and keeps it open for as
            // long as the AsyncFd lives; nothing else registers or closes it.
            Some(fd) => match unsafe { tokio::io::unix::AsyncFd::register(fd) } {
                Ok(fd) => Some(fd),
                Err(e) => {
                    let (_, e) = e.into_parts();
                    // Cannot happen once the fd exists; the commits would then never be
                    // heard of, so stop here rather than hang.
                    self.shutdown();
                    return Err(format!("registering the completion eventfd: {e}"));
                }
            },
            None => None,
        };
        loop {
            let mut batch = Vec::new();
            let mut tick = false;
            tokio::select! {
                biased;
                cmd = commands.recv() => match cmd {
                    Some(ShardCommand::Map(map)) => {
                        if map.epoch >= self.map.epoch {
                            let mode_changed = map.auth.mode != self.map.auth.mode;
                            self.map = map.clone();
                            *self.auth.map.borrow_mut() = map.clone();
                            self.map_received = true;
                            if mode_changed {
                                self.close_other_modes();
                            }
                        }
                        batch.push(Input::Map(map));
                    }
                    Some(ShardCommand::Stats(reply)) => {
                        let _ = reply.send(ShardStats {
                            pgs: self.core.stats(),
                            backfill_toofull: self.core.backfill_too_full(),
                            space: self.core.space(),
                            writable_bytes: self.core.writable_bytes(),
                        });
                    }
                    Some(ShardCommand::Ops { complaint_us, reply }) => {
                        let _ = reply.send(self.core.ops_report(complaint_us));
                    }
                    Some(ShardCommand::Shutdown(done)) => {
                        self.shutdown();
                        let _ = done.send(());
                        return Ok(());
                    }
                    None => { self.shutdown(); return Ok(()); }
                },
                changed = flush_interval.changed(), if flush_interval_open => match changed {
                    Ok(()) => {
                        // The next flush one new interval from now, not at once: a change is
                        // a setting, not a request to flush.
                        let every = *flush_interval.borrow_and_update();
                        let first = tokio::time::Instant::now() + every;
                        flusher = tokio::time::interval_at(first, every);
                        flusher.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                        tracing::debug!(shard = self.spec.index, ?every, "flush interval changed");
                    }
                    // No sender any more: the interval can no longer change; keep it.
                    Err(_) => flush_interval_open = false,
                },
                changed = rates.changed(), if rates_open => match changed {
                    Ok(()) => {
                        let osd = *rates.borrow_and_update();
                        let share = |rate| crate::control::shard_share(rate, self.spec.count);
                        batch.push(Input::Rates {
                            recovery_bytes_per_sec: share(osd.recovery_bytes_per_sec),
                            scrub_deep_bytes_per_sec: share(osd.scrub_deep_bytes_per_sec),
                        });
                    }
                    Err(_) => rates_open = false,
                },
                _ = self.wake.notified() => {}
                ready = readable(&completions) => {
                    if let Ok(mut guard) = ready {
                        drain_eventfd(guard.get_inner().as_raw_fd());
                        guard.clear_ready();
                    }
                    if self.core.commits_in_flight() > 0 {
                        batch.push(Input::WalDurable);
                    }
                }
                _ = ticker.tick() => tick = true,
                _ = flusher.tick() => batch.push(Input::FlushDue),
                _ = space.tick() => batch.extend(self.sample_host_space()),
            }
            // Before the first map the auth mode is unknown: connections wait in the queue.
            while self.map_received {
                let Some(stream) = accepted.borrow_mut().pop_front() else {
                    break;
                };
                self.add_conn(stream);
            }
            if tick {
                self.check_keys();
                // A commit completion taken off the ring by another call after it came
                // without a signal (see `UringDisk::commits_reportable`) is reported within
                // a tick at the latest.
                if self.core.commits_in_flight() > 0
                    && !batch.iter().any(|i| matches!(i, Input::WalDurable))
                    && self.core.with_disk(|d| d.commits_reportable())
                {
                    batch.push(Input::WalDurable);
                }
            }
            self.iterate(batch, tick);
        }
    }

    /// Allocates the metadata file's new holes (redb grows it by `set_len`), then samples the
    /// free bytes of its file system for the core (`Input::HostSpace`; see `crate::space`).
    /// None when the sample failed: the core keeps the last one.
    fn sample_host_space(&mut self) -> Option<Input> {
        let dir = crate::space::parent_dir(&self.meta_path);
        match crate::space::fill_holes(&self.meta_file, dir) {
            Ok(0) => {}
            Ok(bytes) => tracing::debug!(
                shard = self.spec.index,
                bytes,
                "allocated the metadata file's holes"
            ),
            Err(e) => {
                tracing::debug!(shard = self.spec.index, error = %e, "allocating the metadata file's holes")
            }
        }
        match crate::space::free_bytes(&self.meta_path) {
            Ok(free_bytes) => {
                self.space_sample_failed = false;
                Some(Input::HostSpace { free_bytes })
            }
            Err(e) => {
                if !std::mem::replace(&mut self.space_sample_failed, true) {
                    tracing::warn!(shard = self.spec.index, path = %self.meta_path.display(), error = %e,
                        "cannot read the free space of the metadata's file system");
                }
                None
            }
        }
    }

    /// Accepts connections on the shard's port, queueing them for the loop. A failed accept
    /// (out of descriptors, say) is retried: it is not the shard's failure.
    fn accept_connections(
        &mut self,
    ) -> Result<Rc<RefCell<VecDeque<tokio::net::TcpStream>>>, String> {
        let listener = self
            .listener
            .take()
            .ok_or("the shard's listener was taken before (run twice)")?;
        let listener = listener
            .set_nonblocking(true)
            .and_then(|()| tokio::net::TcpListener::from_std(listener))
            .map_err(|e| format!("listening on the shard's port: {e}"))?;
        let accepted: Rc<RefCell<VecDeque<tokio::net::TcpStream>>> =
            Rc::new(RefCell::new(VecDeque::new()));
        let queue = accepted.clone();
        let wake = self.wake.clone();
        tokio::task::spawn_local(async move {
            loop {
                match listener.accept().await {
                    Ok((stream, _)) => {
                        let _ = stream.set_nodelay(true);
                        queue.borrow_mut().push_back(stream);
                        wake.notify_one();
                    }
                    Err(e) => {
                        tracing::warn!("accept: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        });
        Ok(accepted)
    }

    fn add_conn(&mut self, stream: tokio::net::TcpStream) {
        let conn = self.next_conn;
        self.next_conn += 1;
        let (read, write) = stream.into_split();
        let mode = self.map.auth.mode;
        let outbox = Outbox::new(Some(write), mode);
        tokio::task::spawn_local(net::writer_task(outbox.clone()));
        if mode.authenticates() {
            tokio::task::spawn_local(super::auth::serve_accepted(
                conn,
                read,
                outbox.clone(),
                self.inputs.clone(),
                self.wake.clone(),
                self.clock,
                self.auth.clone(),
                mode,
            ));
        } else {
            tokio::task::spawn_local(net::reader_task(
                conn,
                read,
                self.inputs.clone(),
                self.wake.clone(),
                self.clock,
            ));
        }
        self.conns.insert(conn, outbox);
    }

    /// The map's auth mode changed: connections opened in another mode are closed (their
    /// peers reconnect in the new one).
    fn close_other_modes(&mut self) {
        let mode = self.map.auth.mode;
        tracing::info!(shard = self.spec.index, %mode, "auth mode changed: closing connections of the old mode");
        for outbox in self.conns.values() {
            let o = outbox.borrow();
            if o.mode != mode {
                o.shutdown_socket(libc::SHUT_RDWR);
            }
        }
        for link in self.peers.values() {
            let mut o = link.outbox.borrow_mut();
            if o.mode != mode {
                o.shutdown_socket(libc::SHUT_RDWR);
                o.closed = true;
            }
        }
    }

    /// When the key table changed: closes the connections of entities it no longer holds
    /// at the generation (and caps) they authenticated with. Their readers see end of file.
    fn check_keys(&mut self) {
        let table = crate::keys::current(&self.spec.keys);
        if Arc::ptr_eq(&table, &self.keys_checked) {
            return;
        }
        for (conn, outbox) in &self.conns {
            let o = outbox.borrow();
            if let Some(peer) = &o.peer {
                if !peer.still_valid(&table) {
                    tracing::info!(shard = self.spec.index, conn, entity = %peer.entity,
                        "closing the connection: its key was removed or changed");
                    o.shutdown_socket(libc::SHUT_RDWR);
                }
            }
        }
        self.keys_checked = table;
    }

    /// Steps 2-4 of the loop (see the module doc). `batch` holds what the wait delivered.
    fn iterate(&mut self, mut batch: Vec<Input>, tick: bool) {
        self.spec.stages.iteration();
        if self.flush_finished.swap(false, Ordering::Acquire) {
            batch.push(Input::FlushDone);
        }
        let queued: Vec<Input> = self.inputs.borrow_mut().drain(..).collect();
        for input in queued {
            if let Input::Closed { conn } = input {
                self.drop_conn(conn);
            }
            batch.push(input);
        }
        if tick {
            batch.push(Input::Tick);
        }
        let eff = self.core.step_batch(batch, self.clock.now());
        self.drive(eff);
        let store = self.core.store();
        self.spec
            .stages
            .store_block_cache(&store.block_cache_stats());
        self.spec.stages.integrity(crate::stages::integrity_counts(
            &store.damage_counts(),
            &self.core.repair_counts(),
        ));
        self.spec.stages.io_totals(&self.core.io_totals());
        if tick {
            // Once a tick: counting them walks every PG of the shard.
            self.spec.stages.pg_counts(&self.core.pg_counts());
        }
    }

    /// Carries out `eff`, then steps the WAL commits it asks for, carrying out each step's
    /// effects in turn, until a step asks for none. Commits in flight complete later: the
    /// ring's eventfd wakes the loop (or, without io_uring, the commit step waited) — or,
    /// while the core takes no new input until one completes, this waits for it here (see
    /// the module doc).
    fn drive(&mut self, mut eff: Effects) {
        loop {
            let due = eff.wal_commit_due;
            self.carry_out(eff);
            // Replies and a leader's Raft appends leave before its own fdatasync.
            self.flush_conns();
            let input = if due {
                Input::WalCommit
            } else if self.core.inputs_wait_for_commit() && self.wait_for_disk() {
                Input::WalDurable
            } else {
                return;
            };
            eff = self.core.step(input, self.clock.now());
        }
    }

    /// Blocks (one slice at most) until the disk completes something. False without an
    /// eventfd or when the slice ended first: the loop's `select!` takes over.
    fn wait_for_disk(&self) -> bool {
        let Some(fd) = self.completion_fd else {
            return false;
        };
        match self
            .core
            .with_disk(|disk| disk.wait_completion(COMMIT_WAIT_SLICE))
        {
            Ok(Some(wait)) => {
                if wait.signalled {
                    drain_eventfd(fd);
                }
                wait.ready
            }
            // No wait on the ring here: the eventfd, as the loop's `select!` would.
            Ok(None) => wait_eventfd(fd, COMMIT_WAIT_SLICE),
            // The eventfd still works; the step that reaps reports a failing ring.
            Err(e) => {
                tracing::warn!(shard = self.spec.index, error = %e,
                    "waiting on the disk's ring failed; waiting on its eventfd");
                wait_eventfd(fd, COMMIT_WAIT_SLICE)
            }
        }
    }

    /// Carries out one step's effects, except the WAL commit cycle (see [`Runtime::drive`]).
    fn carry_out(&mut self, eff: Effects) {
        let Effects {
            replies,
            peers,
            reports,
            stages,
            wal_commit_submitted,
            // Driven by `drive`.
            wal_commit_due: _,
            // The core logs these; the simulator checks them.
            events: _,
            flush_started: _,
            probes: _,
            opened: _,
            removed: _,
            snapshots_installed: _,
            applied: _,
        } = eff;
        for (conn, request_id, reply) in &replies {
            self.reply(*conn, *request_id, reply);
        }
        for send in peers {
            self.send_peer(send);
        }
        for report in reports {
            self.report(report);
        }
        for (stage, us) in stages {
            self.spec.stages.observe(stage, Duration::from_micros(us));
        }
        // The commit's own time came in `stages` (`Stage::WalCommit`).
        if let Some(commit) = wal_commit_submitted {
            self.spec.stages.wal_commit(commit.entries);
        }
    }

    fn report(&mut self, report: Report) {
        let event = match (report.to_monitor(), report) {
            (Some(to_monitor), _) => ShardEvent::Report(to_monitor),
            (None, Report::Fatal(failure)) => ShardEvent::Fatal {
                shard: self.spec.index,
                failure,
            },
            (None, other) => unreachable!("every report but Fatal goes to the monitor: {other:?}"),
        };
        let _ = self.events.send(event);
    }

    /// Flushes and compacts before the process exits, then writes what is left to send.
    fn shutdown(&mut self) {
        let eff = self.core.step(Input::Shutdown, self.clock.now());
        self.drive(eff);
    }

    /// Queues a reply on a connection (dropped if the connection went away).
    fn reply(&mut self, conn: ConnId, request_id: u64, reply: &Reply) {
        let Some(outbox) = self.conns.get(&conn) else {
            return;
        };
        let mut o = outbox.borrow_mut();
        o.reply_since.get_or_insert_with(Instant::now);
        o.push_frame(|buf| reply.encode(request_id, buf));
        if o.buf.len() > OUT_BYTES_MAX {
            // The client does not read its replies: stop serving it rather than buffer
            // without bound.
            o.closed = true;
            o.buf.clear();
            o.stream = None;
        }
    }

    /// Queues a frame on the link to the shard of `to` that hosts the frame's PG.
    fn send_peer(&mut self, send: PeerSend) {
        let map = self.map.clone();
        let Some(info) = map.osds.get(&send.to) else {
            return; // not in our map yet: Raft retries, a transfer times out and restarts
        };
        let port = info.port_for(send.pg);
        let link = self.peer_link(send.to, &info.address, port, info.boot_epoch);
        let mut o = link.borrow_mut();
        if o.buf.len() > OUT_BYTES_MAX {
            return; // the peer is not keeping up: shed (Raft retransmits)
        }
        o.push_frame(|buf| send.req.encode(0, buf));
    }

    /// The link to one shard of a peer, connecting a new one if there is none or the peer
    /// moved or restarted (its address or boot epoch changed) or the link broke.
    fn peer_link(&mut self, osd: OsdId, address: &str, port: u16, epoch: Epoch) -> SharedOutbox {
        let addr = format!("{address}:{port}");
        let key = (osd, port);
        let mode = self.map.auth.mode;
        let stale = self.peers.get(&key).is_some_and(|l| {
            let o = l.outbox.borrow();
            l.addr != addr || l.epoch != epoch || o.closed || o.mode != mode
        });
        if stale {
            self.peers.remove(&key);
        }
        if let Some(link) = self.peers.get(&key) {
            return link.outbox.clone();
        }
        let outbox = Outbox::new(None, mode);
        self.peers.insert(
            key,
            PeerLink {
                osd,
                addr: addr.clone(),
                outbox: outbox.clone(),
                epoch,
            },
        );
        let conn = self.next_conn;
        self.next_conn += 1;
        let hello = Request::Hello {
            osd: self.spec.osd,
            boot_epoch: self
                .map
                .osds
                .get(&self.spec.osd)
                .map(|o| o.boot_epoch)
                .unwrap_or_default(),
        };
        let auth = mode
            .authenticates()
            .then(|| (mode, osd, self.spec.tickets.clone()));
        tokio::task::spawn_local(connect_peer(
            addr,
            hello,
            auth,
            outbox.clone(),
            conn,
            self.inputs.clone(),
            self.wake.clone(),
            self.clock,
        ));
        outbox
    }

    /// A connection's reader ended: stop writing to it.
    fn drop_conn(&mut self, conn: ConnId) {
        if let Some(o) = self.conns.remove(&conn) {
            let mut o = o.borrow_mut();
            o.closed = true;
            o.wake_writer.notify_one();
        }
    }

    /// Writes what every socket takes now; forgets connections that broke or were dropped.
    fn flush_conns(&mut self) {
        let mut closed = Vec::new();
        for (id, outbox) in &self.conns {
            let mut o = outbox.borrow_mut();
            o.flush_now();
            if o.buf.is_empty() {
                if let Some(since) = o.reply_since.take() {
                    self.spec.stages.observe(Stage::Reply, since.elapsed());
                }
            }
            if o.closed {
                closed.push(*id);
            }
        }
        for conn in closed {
            self.conns.remove(&conn);
            // The core stops counting its operations in flight against a limit.
            self.inputs.borrow_mut().push_back(Input::Closed { conn });
        }
        for link in self.peers.values() {
            link.outbox.borrow_mut().flush_now();
        }
    }
}

/// How a peer link authenticates: the map's mode, the peer, and this OSD's tickets (`None`:
/// no keyring).
type PeerAuthSpec = (
    AuthMode,
    OsdId,
    Option<Arc<fastblock_client::tickets::Tickets>>,
);

/// Longest a peer link waits for a ticket from the monitor before it counts as failed (and is
/// tried again like any failed connect).
const TICKET_WAIT: Duration = Duration::from_secs(5);

/// Connects a peer link: the frames queued meanwhile follow a `Hello`. A failed attempt
/// leaves the link closed (after a pause), so the next send connects again.
#[allow(clippy::too_many_arguments)]
async fn connect_peer(
    addr: String,
    hello: Request,
    auth: Option<PeerAuthSpec>,
    target: SharedOutbox,
    conn: ConnId,
    inputs: InputQueue,
    wake: Arc<Notify>,
    clock: Clock,
) {
    let connected = tokio::time::timeout(
        Duration::from_secs(2),
        tokio::net::TcpStream::connect(&addr),
    )
    .await;
    let failed = |why: Option<String>| {
        let target = target.clone();
        let addr = addr.clone();
        async move {
            if let Some(why) = why {
                tracing::warn!(peer = %addr, "peer link: {why}");
            }
            // Pace reconnects: the link counts as connecting (not closed) a little longer,
            // so a down peer is retried every 100 ms, not every iteration.
            target.borrow_mut().buf.clear();
            tokio::time::sleep(Duration::from_millis(100)).await;
            target.borrow_mut().closed = true;
        }
    };
    let mut stream = match connected {
        Ok(Ok(s)) => s,
        _ => return failed(None).await,
    };
    let _ = stream.set_nodelay(true);
    let mut buf = BytesMut::new();
    let mut opener = None;
    if let Some((mode, peer, tickets)) = &auth {
        let Some(tickets) = tickets else {
            return failed(Some(format!(
                "auth mode {mode} and this OSD has no key (its keyring)"
            )))
            .await;
        };
        let ticket = match tokio::time::timeout(TICKET_WAIT, tickets.get(*peer)).await {
            Ok(Ok(t)) => t,
            Ok(Err(e)) => return failed(Some(e.to_string())).await,
            Err(_) => {
                return failed(Some(format!(
                    "no ticket for osd.{} from the monitor within {TICKET_WAIT:?}",
                    peer.0
                )))
                .await
            }
        };
        let handshake = fastblock_client::auth::connect(
            &mut stream,
            &mut buf,
            tickets.entity(),
            &ticket,
            *mode,
            &addr,
        );
        match tokio::time::timeout(super::auth::HANDSHAKE_TIMEOUT, handshake).await {
            Ok(Ok(p)) => {
                target.borrow_mut().sealer = Some(p.sealer);
                opener = Some(p.opener);
            }
            Ok(Err(e)) => {
                if e.spends_ticket() {
                    tickets.forget(*peer);
                }
                return failed(Some(e.to_string())).await;
            }
            Err(_) => return failed(Some("handshake timed out".into())).await,
        }
    }
    let (mut read, write) = stream.into_split();
    {
        let mut o = target.borrow_mut();
        // The Hello goes first, then the frames queued while connecting, each sealed in
        // order now that the session exists (they were queued unsealed).
        let pending = std::mem::take(&mut o.buf);
        o.push_frame(|b| hello.encode(0, b));
        let mut rest = &pending[..];
        while rest.len() >= fastblock_wire::HEADER_BYTES {
            let payload_len = u32::from_le_bytes(rest[16..20].try_into().expect("4 bytes"));
            let len = fastblock_wire::HEADER_BYTES + payload_len as usize;
            let (frame, tail) = rest.split_at(len.min(rest.len()));
            o.push_frame(|b| b.extend_from_slice(frame));
            rest = tail;
        }
        o.stream = Some(Rc::new(write));
        o.flush_now();
    }
    tokio::task::spawn_local(net::writer_task(target.clone()));
    // Peers never reply on this link, but reading notices when it closes.
    match opener {
        None => net::reader_task(conn, read, inputs, wake, clock).await,
        Some(opener) => {
            let why = super::auth::read_checked(
                conn, &mut read, buf, opener, &target, None, &inputs, &wake, clock,
            )
            .await;
            tracing::debug!(conn, "peer link closed: {why}");
            inputs.borrow_mut().push_back(Input::Closed { conn });
            wake.notify_one();
        }
    }
    target.borrow_mut().closed = true;
}

/// The core's configuration from the OSD's shard spec.
fn shard_config(spec: &ShardSpec, transfer_id_base: u64) -> ShardConfig {
    ShardConfig {
        osd: spec.osd,
        index: spec.index,
        count: spec.count,
        pg: spec.pg_config,
        pg_seed: spec.seed,
        log_retain_entries: spec.log_retain_entries,
        log_lag_max_entries: spec.log_lag_max_entries,
        recovery: spec.recovery,
        data_reserve_bytes: ShardConfig::DATA_RESERVE_BYTES,
        // Set by `Runtime::open` once the store's geometry is known.
        host_space_reserve_bytes: ShardConfig::HOST_SPACE_RESERVE_MIN_BYTES,
        transfer_id_base,
        flush_wal_share_divisor: FLUSH_WAL_SHARE_DIVISOR,
        wal_commits_in_flight_max: spec.wal_commits_in_flight_max.max(1),
        record_applies: false,
        scrub: spec.scrub,
    }
}

/// The first snapshot transfer id of this shard's incarnation: the high bits say who
/// (OSD, shard) and when it started, the low 24 bits count transfers. A receiver tells a
/// restarted sender's transfers from the old ones by it.
fn transfer_id_base(osd: OsdId, shard: u32) -> u64 {
    let now_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    (u64::from(osd.0) << 48) ^ (u64::from(shard) << 40) ^ (now_ns << 24)
}

/// Waits until the completion eventfd is readable (forever without one).
async fn readable(
    fd: &Option<tokio::io::unix::AsyncFd<OwnedFd>>,
) -> std::io::Result<tokio::io::unix::AsyncFdReadyGuard<'_, OwnedFd>> {
    match fd {
        Some(fd) => fd.readable().await,
        None => std::future::pending().await,
    }
}

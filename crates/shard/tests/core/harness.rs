//! A few shard cores on the store's in-memory disks, wired by a message queue: the smallest
//! driver of the core, for tests of its decisions without sockets, threads or clocks.

use fastblock_pg::PgConfig;
use fastblock_shard::{
    ConnId, Effects, Input, Micros, PeerSend, RecoveryLimits, Report, ShardConfig, ShardCore,
};
use fastblock_store::disk::{OwnedWrite, ReadOp, Reaped, Submitted, WriteOp};
use fastblock_store::{Disk, MkfsOptions, SimDisk, SimFile, Store, StoreOptions};
use fastblock_types::map::{ClusterMap, FailureDomain, OsdInfo, PgInfo, PgMap, PoolInfo};
use fastblock_types::pg_state::PgState;
use fastblock_types::{Epoch, ImageId, OsdId, PgId, PoolId};
use fastblock_wire::{ObjectAddr, Reply, Request};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};

pub const POOL: PoolId = PoolId(1);
pub const IMAGE: ImageId = ImageId(7);
/// The connection every test client uses.
pub const CLIENT: ConnId = 1;
/// Peer frames arrive on a connection per sender.
fn peer_conn(from: OsdId) -> ConnId {
    (1 << 40) | u64::from(from.0)
}

pub fn pg(seq: u32) -> PgId {
    PgId::new(POOL, seq)
}

pub fn addr(pg: PgId, object_index: u64) -> ObjectAddr {
    ObjectAddr {
        pg,
        image: IMAGE,
        object_index,
    }
}

/// The in-memory disk with WAL commits that stay in flight (written, not synced) until the
/// test's disk completes them ([`HeldDisk::complete`]), as the OSD's io_uring disk does.
#[derive(Clone)]
pub struct HeldDisk {
    inner: SimDisk,
    /// (submitted and not synced, synced and not reported)
    state: Arc<Mutex<(usize, usize)>>,
    /// Every write and WAL commit fails with EIO (a dying disk).
    fail_writes: Arc<std::sync::atomic::AtomicBool>,
}

impl HeldDisk {
    /// Flips a bit of the byte at `offset_bytes`: written and durable content alike (a bad
    /// sector, or bit rot).
    pub fn corrupt(&self, offset_bytes: u64) {
        self.inner.image().corrupt(offset_bytes, |b| b[0] ^= 0x10);
    }

    /// From now on every write and WAL commit fails with EIO.
    pub fn fail_writes(&self) {
        self.fail_writes
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    fn check_writes(&self) -> std::io::Result<()> {
        if self.fail_writes.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(std::io::Error::from_raw_os_error(5));
        }
        Ok(())
    }

    /// The disk finishes every commit in flight.
    pub fn complete(&mut self) {
        self.inner.sync().expect("sim sync");
        let mut s = self.state.lock().unwrap();
        s.1 += std::mem::take(&mut s.0);
    }
}

impl Disk for HeldDisk {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_many(&mut self, reads: &mut [ReadOp<'_>]) -> std::io::Result<()> {
        self.inner.read_many(reads)
    }
    fn write_many(&mut self, writes: &[WriteOp<'_>], sync: bool) -> std::io::Result<()> {
        self.check_writes()?;
        self.inner.write_many(writes, sync)?;
        if sync {
            // A sync covers the commits in flight too.
            let mut s = self.state.lock().unwrap();
            s.1 += std::mem::take(&mut s.0);
        }
        Ok(())
    }
    fn discard(&mut self, offset_bytes: u64, len_bytes: u64) -> std::io::Result<()> {
        self.inner.discard(offset_bytes, len_bytes)
    }
    fn submit_durable(&mut self, writes: Vec<OwnedWrite>) -> std::io::Result<Submitted> {
        self.check_writes()?;
        for w in &writes {
            self.inner.write(w.offset_bytes, &w.buf, false)?;
        }
        self.state.lock().unwrap().0 += 1;
        Ok(Submitted::InFlight)
    }
    fn reap_durable(&mut self, wait: bool) -> std::io::Result<Reaped> {
        if wait {
            self.complete();
        }
        let count = std::mem::take(&mut self.state.lock().unwrap().1);
        Ok(Reaped {
            count,
            bufs: Vec::new(),
        })
    }
}

fn store_options() -> StoreOptions {
    StoreOptions {
        meta_cache_bytes: 1 << 20,
        ..StoreOptions::default()
    }
}

/// Small WAL: 8 segments of 256 KiB, batches of 64 KiB (a shard may have 512 KiB of writes
/// unanswered, one PG 256 KiB). Also returns the metadata file, to reopen the store after a
/// crash.
pub fn mkfs(id: OsdId) -> (HeldDisk, SimFile, Store<HeldDisk>) {
    let mut uuid = [0u8; 16];
    uuid[..4].copy_from_slice(&id.0.to_le_bytes());
    let opts = MkfsOptions {
        osd_uuid: uuid,
        segment_size_bytes: 256 << 10,
        segment_count: 8,
        batch_bytes_max: 64 << 10,
        force: false,
    };
    let disk = HeldDisk {
        inner: SimDisk::new(16 << 20),
        state: Arc::new(Mutex::new((0, 0))),
        fail_writes: Arc::default(),
    };
    let meta = SimFile::new();
    let store = Store::mkfs(disk.clone(), meta.clone(), &opts, store_options()).expect("mkfs");
    (disk, meta, store)
}

pub fn config(id: OsdId) -> ShardConfig {
    ShardConfig {
        osd: id,
        index: 0,
        count: 1,
        pg: PgConfig::default(),
        pg_seed: u64::from(id.0),
        log_retain_entries: 4,
        log_lag_max_entries: 1024,
        recovery: RecoveryLimits {
            max_active: 1,
            bytes_per_sec: 64 << 20,
            chunk_bytes: 16 << 10,
            window_chunks: 4,
            idle_ticks_max: 200,
        },
        data_reserve_bytes: 1 << 20,
        host_space_reserve_bytes: 64 << 20,
        transfer_id_base: u64::from(id.0) << 48,
        flush_wal_share_divisor: 8,
        wal_commits_in_flight_max: 1,
        record_applies: true,
        scrub: fastblock_shard::config::ScrubSchedule::ON_REQUEST,
    }
}

/// One OSD leading PG 0 alone, with `adjust` changing the harness's configuration.
pub fn single_with(adjust: impl Fn(&mut ShardConfig)) -> Cluster {
    let mut c = Cluster::with(&[1], |id| {
        let mut cfg = config(id);
        adjust(&mut cfg);
        cfg
    });
    c.map(map(1, &[1], &[(0, &[1], &[])]));
    c.elect(1, pg(0));
    c
}

/// A map with OSDs `osds` (shard count 1) and one pool whose PGs have the given members.
pub fn map(epoch: u64, osds: &[u32], pgs: &[(u32, &[u32], &[u32])]) -> Arc<ClusterMap> {
    let ids = |l: &[u32]| l.iter().map(|o| OsdId(*o)).collect::<Vec<_>>();
    let mut m = ClusterMap {
        epoch: Epoch(epoch),
        ..ClusterMap::default()
    };
    for o in osds {
        std::sync::Arc::make_mut(&mut m.osds).insert(
            OsdId(*o),
            OsdInfo {
                id: OsdId(*o),
                uuid: format!("osd-{o}"),
                host: format!("host-{o}"),
                address: "127.0.0.1".into(),
                port: 7000 + *o as u16,
                shards: 1,
                capacity_bytes: 16 << 20,
                up: true,
                is_in: true,
                pending_create: false,
                boot_epoch: Epoch(1),
                config: String::new(),
                lease_timing: None,
            },
        );
    }
    m.pools.insert(
        POOL,
        PoolInfo {
            id: POOL,
            name: "p".into(),
            pg_count: pgs.len() as u32,
            size: 1,
            failure_domain: FailureDomain::Osd,
            created_epoch: Epoch(1),
        },
    );
    let mut pgmap = PgMap {
        pool: POOL,
        version: 1,
        pgs: Default::default(),
    };
    for (seq, members, target) in pgs {
        pgmap.pgs.insert(
            *seq,
            PgInfo {
                version: 1,
                state: PgState::CREATING,
                osdlist: ids(members),
                newosdlist: ids(target),
                learners: Vec::new(),
                joint_voters: Vec::new(),
                released: Vec::new(),
                restored: false,
                leader: None,
                leader_term: Default::default(),
                conf_index: Default::default(),
            },
        );
    }
    m.pgmaps.insert(POOL, pgmap);
    Arc::new(m)
}

pub fn write(pg: PgId, object: u64, offset: u32, data: &[u8], epoch: u64) -> Request {
    Request::Write {
        addr: addr(pg, object),
        offset,
        epoch: Epoch(epoch),
        term: 0,
        data: bytes::Bytes::copy_from_slice(data),
    }
}

pub fn read(pg: PgId, object: u64, offset: u32, length: u32, epoch: u64) -> Request {
    Request::Read {
        addr: addr(pg, object),
        offset,
        length,
        epoch: Epoch(epoch),
    }
}

/// Several cores and the frames between them.
pub struct Cluster {
    pub cores: BTreeMap<OsdId, ShardCore<HeldDisk>>,
    /// Each core's disk, to complete its commits in flight.
    pub disks: BTreeMap<OsdId, HeldDisk>,
    /// Each core's metadata file and configuration, to restart it after a crash.
    metas: BTreeMap<OsdId, SimFile>,
    configs: BTreeMap<OsdId, ShardConfig>,
    /// The last map handed to the cores (a restarted core gets it).
    last_map: Option<Arc<ClusterMap>>,
    pub now: Micros,
    /// Frames in flight: (to, frame). Delivered in order by [`Cluster::settle`].
    pub wire: VecDeque<(OsdId, OsdId, Request)>,
    /// OSDs whose frames are dropped (both ways).
    pub cut: BTreeSet<OsdId>,
    /// Every reply to the test client: (OSD, request id, reply).
    pub replies: Vec<(OsdId, u64, Reply)>,
    pub reports: Vec<(OsdId, Report)>,
    /// Everything else the steps produced, merged per OSD.
    pub effects: BTreeMap<OsdId, Vec<Effects>>,
    /// Drive `WalCommit`/`WalDurable` at once (the OSD's way); otherwise tests step them.
    pub auto_commit: bool,
    next_request: u64,
}

impl Cluster {
    pub fn new(osds: &[u32]) -> Cluster {
        Cluster::with(osds, config)
    }

    pub fn with(osds: &[u32], cfg: impl Fn(OsdId) -> ShardConfig) -> Cluster {
        let mut cores = BTreeMap::new();
        let mut disks = BTreeMap::new();
        let mut metas = BTreeMap::new();
        let mut configs = BTreeMap::new();
        for o in osds {
            let id = OsdId(*o);
            let (disk, meta, store) = mkfs(id);
            disks.insert(id, disk);
            metas.insert(id, meta);
            configs.insert(id, cfg(id));
            cores.insert(id, ShardCore::new(cfg(id), store, Box::new(|| Micros(0))));
        }
        Cluster {
            cores,
            disks,
            metas,
            configs,
            last_map: None,
            now: Micros(1),
            wire: VecDeque::new(),
            cut: BTreeSet::new(),
            replies: Vec::new(),
            reports: Vec::new(),
            effects: BTreeMap::new(),
            auto_commit: true,
            next_request: 1,
        }
    }

    pub fn core(&self, id: u32) -> &ShardCore<HeldDisk> {
        &self.cores[&OsdId(id)]
    }

    /// Steps one core and carries out its effects (peer frames queued, replies recorded,
    /// WAL commits driven if `auto_commit`). Returns the effects of the step itself.
    /// `WalDurable` comes after the core's disk completed its commits in flight, as the
    /// OSD's runtime steps it when the disk signals a completion.
    pub fn step(&mut self, id: u32, input: Input) -> Effects {
        if matches!(input, Input::WalDurable) {
            self.disks
                .get_mut(&OsdId(id))
                .expect("known osd")
                .complete();
        }
        self.step_raw(id, input)
    }

    /// Drives the commit cycle of a core with `auto_commit` off until nothing is pending
    /// (bounded: a core that keeps asking is a bug the caller's assertions catch).
    pub fn finish_commits(&mut self, id: u32) {
        for _ in 0..4 {
            if !self.core(id).commit_pending() {
                return;
            }
            if self.core(id).commits_in_flight() == 0 {
                self.step(id, Input::WalCommit);
            }
            self.step(id, Input::WalDurable);
        }
    }

    /// [`Cluster::step`] without completing the disk's commits first.
    pub fn step_raw(&mut self, id: u32, input: Input) -> Effects {
        let osd = OsdId(id);
        let now = self.now;
        let eff = self
            .cores
            .get_mut(&osd)
            .expect("known osd")
            .step(input, now);
        self.carry_out(id, eff)
    }

    /// Records what a step of `id` produced and, with `auto_commit`, drives the WAL commits
    /// it asked for; returns the step's effects.
    fn carry_out(&mut self, id: u32, eff: Effects) -> Effects {
        let osd = OsdId(id);
        self.absorb(osd, &eff);
        if self.auto_commit && eff.wal_commit_due {
            self.step(id, Input::WalCommit);
        }
        if self.auto_commit
            && eff.wal_commit_submitted.is_some()
            && self.cores[&osd].commits_in_flight() > 0
        {
            self.step(id, Input::WalDurable);
        }
        eff
    }

    fn absorb(&mut self, osd: OsdId, eff: &Effects) {
        for (conn, request_id, reply) in &eff.replies {
            if *conn == CLIENT {
                self.replies.push((osd, *request_id, reply.clone()));
            }
        }
        for PeerSend { to, req, .. } in &eff.peers {
            self.wire.push_back((osd, *to, req.clone()));
        }
        for r in &eff.reports {
            self.reports.push((osd, r.clone()));
        }
        let summary = Effects {
            probes: eff.probes.clone(),
            opened: eff.opened.clone(),
            removed: eff.removed.clone(),
            snapshots_installed: eff.snapshots_installed.clone(),
            applied: eff.applied.clone(),
            flush_started: eff.flush_started,
            stages: eff.stages.clone(),
            ..Effects::default()
        };
        self.effects.entry(osd).or_default().push(summary);
    }

    /// A mutation that names no term (0) as a client that learned the term of `id`'s
    /// replica of the PG names it: the tests of everything but the term fence address the
    /// leader as it is now. A term set by the test is kept ([`Cluster::request_as_is`] sends
    /// a 0 too).
    pub fn stamp_term(&self, id: u32, req: Request) -> Request {
        let pg = match req.mutation() {
            Some((addr, 0)) => addr.pg,
            _ => return req,
        };
        match self.core(id).replica(pg) {
            Some(r) => req.with_term(r.term().0),
            None => req,
        }
    }

    /// Sends a client request to `id`; returns its request id. A mutation naming no term
    /// names the replica's current one ([`Cluster::stamp_term`]).
    pub fn request(&mut self, id: u32, req: Request) -> u64 {
        let req = self.stamp_term(id, req);
        self.request_as_is(id, req)
    }

    /// Sends a client request to `id` exactly as given (a mutation's term included).
    pub fn request_as_is(&mut self, id: u32, req: Request) -> u64 {
        let request_id = self.next_request;
        self.next_request += 1;
        let arrived = self.now;
        self.step(
            id,
            Input::Request {
                conn: CLIENT,
                request_id,
                req,
                arrived,
            },
        );
        request_id
    }

    /// Steps `id` with several inputs at once (as the OSD hands over everything its sockets
    /// delivered since the last step): their PGs' work shares the rounds that follow.
    pub fn step_batch(&mut self, id: u32, inputs: Vec<Input>) -> Effects {
        let now = self.now;
        let eff = self
            .cores
            .get_mut(&OsdId(id))
            .expect("known osd")
            .step_batch(inputs, now);
        self.carry_out(id, eff)
    }

    /// The input by which a frame from `from` reaches its OSD.
    pub fn peer_input(&self, from: OsdId, req: Request) -> Input {
        Input::Request {
            conn: peer_conn(from),
            request_id: 0,
            req,
            arrived: self.now,
        }
    }

    /// Power fails on `id` and it restarts: every write its disk and metadata file had not
    /// synced is lost (a WAL commit in flight among them), the store is reopened (WAL replay,
    /// interrupted snapshot installs finished) and a new core gets the last map, as the OSD
    /// does when it starts.
    pub fn crash_and_restart(&mut self, id: u32) {
        let osd = OsdId(id);
        self.cores.remove(&osd).expect("known osd");
        self.wire.retain(|(from, to, _)| *from != osd && *to != osd);
        let disk = self.disks.get_mut(&osd).expect("known osd");
        disk.inner.image().crash_losing_unsynced();
        *disk.state.lock().unwrap() = (0, 0);
        let meta = self.metas[&osd].clone();
        meta.image().crash_losing_unsynced();
        let store = Store::open(disk.clone(), meta, store_options()).expect("reopen the store");
        let core = ShardCore::new(self.configs[&osd].clone(), store, Box::new(|| Micros(0)));
        self.cores.insert(osd, core);
        if let Some(m) = self.last_map.clone() {
            self.step(id, Input::Map(m));
        }
    }

    /// Sends several client requests to `id` in one step (as the OSD hands over what its
    /// sockets delivered since the last one): all are admitted before any is applied.
    /// Returns their request ids.
    pub fn request_batch(&mut self, id: u32, reqs: Vec<Request>) -> Vec<u64> {
        let arrived = self.now;
        let mut ids = Vec::new();
        let mut inputs = Vec::new();
        for req in reqs {
            let req = self.stamp_term(id, req);
            let request_id = self.next_request;
            self.next_request += 1;
            ids.push(request_id);
            inputs.push(Input::Request {
                conn: CLIENT,
                request_id,
                req,
                arrived,
            });
        }
        self.step_batch(id, inputs);
        ids
    }

    /// The reply to request `request_id`, if it came.
    pub fn reply(&self, request_id: u64) -> Option<&Reply> {
        self.replies
            .iter()
            .find(|(_, r, _)| *r == request_id)
            .map(|(_, _, reply)| reply)
    }

    /// Delivers frames until none is left (frames to or from a cut OSD are dropped).
    pub fn settle(&mut self) {
        let mut delivered = 0;
        while self.deliver_one() {
            delivered += 1;
            assert!(delivered < 1_000_000, "frames never settle");
        }
    }

    /// Delivers frames until none is left, as [`Cluster::settle`], except those `hold` picks
    /// (from, to, frame): those are taken off the wire and returned, in order.
    pub fn settle_holding(
        &mut self,
        hold: impl Fn(OsdId, OsdId, &Request) -> bool,
    ) -> Vec<(OsdId, OsdId, Request)> {
        let mut held = Vec::new();
        let mut delivered = 0;
        while let Some((from, to, req)) = self.wire.front() {
            if hold(*from, *to, req) {
                held.push(self.wire.pop_front().expect("front exists"));
                continue;
            }
            self.deliver_one();
            delivered += 1;
            assert!(delivered < 1_000_000, "frames never settle");
        }
        held
    }

    /// Delivers the oldest frame in flight (dropped if either end is cut); returns whether
    /// there was one.
    pub fn deliver_one(&mut self) -> bool {
        let Some((from, to, req)) = self.wire.pop_front() else {
            return false;
        };
        if !self.cut.contains(&from) && !self.cut.contains(&to) && self.cores.contains_key(&to) {
            let arrived = self.now;
            self.step(
                to.0,
                Input::Request {
                    conn: peer_conn(from),
                    request_id: 0,
                    req,
                    arrived,
                },
            );
        }
        true
    }

    /// Advances time by one tick (100 ms) and ticks every core, delivering nothing.
    pub fn tick_only(&mut self) {
        self.now = Micros(self.now.0 + 100_000);
        let ids: Vec<u32> = self.cores.keys().map(|o| o.0).collect();
        for id in ids {
            self.step(id, Input::Tick);
        }
    }

    /// Advances time by one tick (100 ms) and ticks every core, then settles.
    pub fn tick(&mut self) {
        self.tick_only();
        self.settle();
    }

    pub fn map(&mut self, m: Arc<ClusterMap>) {
        self.last_map = Some(m.clone());
        let ids: Vec<u32> = self.cores.keys().map(|o| o.0).collect();
        for id in ids {
            self.step(id, Input::Map(m.clone()));
        }
        self.settle();
    }

    /// Ticks until `id` leads `pg` (at most 100 ticks).
    pub fn elect(&mut self, id: u32, pg: PgId) {
        for _ in 0..100 {
            if self.core(id).replica(pg).is_some_and(|r| r.is_leader()) {
                return;
            }
            self.tick();
        }
        panic!("osd {id} did not become leader of {pg}");
    }

    /// Sum of a probe over every step of `id`.
    pub fn probe(&self, id: u32, f: impl Fn(&fastblock_shard::Probes) -> u64) -> u64 {
        self.effects
            .get(&OsdId(id))
            .map_or(0, |l| l.iter().map(|e| f(&e.probes)).sum())
    }
}

//! One simulated OSD with one shard: the real shard core ([`ShardCore`], the same code the
//! OSD daemon runs) over one real [`Store`] on a simulated disk. A node is the core's
//! runtime, as the OSD's shard thread is: it owns the disk images, the disk faults, the
//! incarnation (bumped by every crash) and the flush gate, and steps the core with one input
//! at a time at the virtual time of the event. What the core produced ([`Effects`]) is
//! carried out by the cluster (`cluster.rs`), which also decides when a slow WAL commit
//! becomes durable and when a flush finishes.
//!
//! A crash drops the core, its store and the flush gate; the disk keeps what was synced plus
//! a seeded choice of the unsynced writes, and a restart reopens the store from it.

use crate::disk::{NodeDisk, NodeFile, SharedFaults};
use crate::flush::{FlushGate, SharedGate};
use crate::options::SimOptions;
use fastblock_shard::{Effects, Input, Micros, RecoveryLimits, ShardConfig, ShardCore};
use fastblock_store::{MkfsOptions, SimDisk, SimFile, Store, StoreOptions};
use fastblock_types::OsdId;
use fastblock_wire::{Reply, Status};
use std::cell::{Cell, RefCell};
use std::rc::Rc;

pub type NodeStore = Store<NodeDisk>;
pub type NodeCore = ShardCore<NodeDisk>;

/// Connection ids of peers: this bit, then the sending OSD's id. Clients' connections are
/// their client numbers (below 2^32), so the two never meet.
pub const PEER_CONN: u64 = 1 << 40;

/// Who is waiting for a client operation: the client (its connection) and its attempt
/// number (the request id).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ClientTag {
    pub client: u32,
    pub attempt: u64,
}

/// What a client hears back for one attempt.
#[derive(Clone, Debug)]
pub enum ClientReply {
    /// The OSD's reply.
    Osd(Reply),
    /// No reply: the OSD is down (connection refused), or a scripted attempt timed out.
    Refused(String),
}

impl ClientReply {
    pub fn is_ok(&self) -> bool {
        matches!(self, ClientReply::Osd(Reply::Ok))
    }

    pub fn is_data(&self) -> bool {
        matches!(self, ClientReply::Osd(Reply::Data(_)))
    }

    /// The status of an error reply.
    pub fn status(&self) -> Option<Status> {
        match self {
            ClientReply::Osd(Reply::Error { status, .. }) => Some(*status),
            _ => None,
        }
    }
}

/// One simulated OSD, running or crashed; the disk outlives crashes.
pub struct Node {
    pub id: OsdId,
    pub disk: SimDisk,
    pub meta: SimFile,
    pub faults: SharedFaults,
    /// Bumped by every crash, so stale events of an earlier life are ignored.
    pub incarnation: u64,
    core: Option<NodeCore>,
    /// The flush runner shared with the core's store (`None` while down).
    flush: Option<Rc<RefCell<FlushGate>>>,
    /// Slow disk: a WAL commit takes up to this long (None: instant).
    pub slow_commit_us: Option<u64>,
    /// The shard's settings (`transfer_id_base` is set per incarnation).
    cfg: ShardConfig,
    store_options: StoreOptions,
    /// Virtual time, set by the cluster before each step: the core's metrics clock.
    clock: Rc<Cell<u64>>,
}

pub fn store_options(o: &SimOptions) -> StoreOptions {
    let mut s = StoreOptions::default();
    s.wal.cache_bytes_max_per_pg = o.entry_cache_bytes_per_pg;
    s.stage_bytes_max = o.stage_bytes_max;
    s.meta_cache_bytes = 1 << 20;
    s
}

fn mkfs_options(o: &SimOptions, id: OsdId) -> MkfsOptions {
    let mut uuid = [0u8; 16];
    uuid[..4].copy_from_slice(&id.0.to_le_bytes());
    MkfsOptions {
        osd_uuid: uuid,
        segment_size_bytes: o.wal_segment_bytes,
        segment_count: o.wal_segments,
        batch_bytes_max: o.wal_batch_bytes_max,
        force: false,
    }
}

/// The shard settings of node `id`: the run's options at simulator scale.
pub fn shard_config(o: &SimOptions, id: OsdId, pg_seed: u64) -> ShardConfig {
    ShardConfig {
        osd: id,
        index: 0,
        count: 1,
        pg: fastblock_pg::PgConfig {
            lease_ms: o.lease_ms(),
            ..o.pg
        },
        pg_seed,
        log_retain_entries: o.log_retain_entries,
        log_lag_max_entries: o.log_lag_max_entries,
        recovery: RecoveryLimits {
            max_active: o.recovery_max_active,
            bytes_per_sec: o.recovery_bytes_per_sec,
            chunk_bytes: o.snap_chunk_bytes,
            window_chunks: o.snap_window_chunks,
            idle_ticks_max: o.snap_idle_ticks_max,
        },
        // The OSD's `ShardConfig::DATA_RESERVE_BYTES`, scaled to the simulated device.
        data_reserve_bytes: 1 << 20,
        // The OSD's floor; only a scenario's `HostSpace` samples bring it into play.
        host_space_reserve_bytes: ShardConfig::HOST_SPACE_RESERVE_MIN_BYTES,
        transfer_id_base: 0,
        flush_wal_share_divisor: 8,
        wal_commits_in_flight_max: o.wal_commits_in_flight_max,
        record_applies: true,
        scrub: fastblock_shard::config::ScrubSchedule::ON_REQUEST,
    }
}

impl Node {
    /// Formats a node's disk and starts its core (the OSD's mkfs, then start). It hosts no PG
    /// until the cluster steps the first map.
    pub fn format(
        o: &SimOptions,
        id: OsdId,
        pg_seed: u64,
        clock: Rc<Cell<u64>>,
    ) -> Result<Node, String> {
        let mut node = Node {
            id,
            disk: SimDisk::new(o.device_bytes),
            meta: SimFile::new(),
            faults: SharedFaults::default(),
            incarnation: 0,
            core: None,
            flush: None,
            slow_commit_us: None,
            cfg: shard_config(o, id, pg_seed),
            store_options: store_options(o),
            clock,
        };
        let store = Store::mkfs(
            node.node_disk(),
            node.node_file(),
            &mkfs_options(o, id),
            node.store_options.clone(),
        )
        .map_err(|e| format!("osd {id}: mkfs: {e}"))?;
        let sb = store.superblock();
        let data = (
            sb.data_offset_bytes,
            sb.data_offset_bytes + sb.data_size_bytes,
        );
        node.faults().bad.data = data;
        node.start(store);
        Ok(node)
    }

    fn node_disk(&self) -> NodeDisk {
        NodeDisk {
            inner: self.disk.clone(),
            faults: self.faults.clone(),
        }
    }

    fn node_file(&self) -> NodeFile {
        NodeFile {
            inner: self.meta.clone(),
            faults: self.faults.clone(),
        }
    }

    /// Starts a core over an open store, with the simulator's flush gate as its flush runner.
    fn start(&mut self, mut store: NodeStore) {
        let gate = Rc::new(RefCell::new(FlushGate::default()));
        store.set_flush_runner(Box::new(SharedGate(gate.clone())));
        let mut cfg = self.cfg.clone();
        // High bits: who and which incarnation; low 24 bits: the core's counter.
        cfg.transfer_id_base = (u64::from(self.id.0) << 48) ^ (self.incarnation << 24);
        let clock = self.clock.clone();
        self.core = Some(ShardCore::new(
            cfg,
            store,
            Box::new(move || Micros(clock.get())),
        ));
        self.flush = Some(gate);
    }

    /// Steps the core with one input at virtual time `now_us` (`None` while down).
    pub fn step(&mut self, input: Input, now_us: u64) -> Option<Effects> {
        let core = self.core.as_mut()?;
        self.clock.set(now_us);
        Some(core.step(input, Micros(now_us)))
    }

    /// Finishes the flush commit the gate holds (it runs now). Returns whether one ran.
    pub fn release_flush(&mut self) -> bool {
        self.flush
            .as_ref()
            .is_some_and(|gate| gate.borrow_mut().release())
    }

    /// The simulated fdatasync of a slow WAL commit completed: the owed sync happens now.
    pub fn complete_sync(&mut self) -> std::io::Result<()> {
        self.node_disk().complete_sync()
    }

    /// Whether a sync of a WAL commit is owed (written, not yet durable).
    pub fn sync_owed(&self) -> bool {
        self.faults.lock().unwrap_or_else(|e| e.into_inner()).owed > 0
    }

    /// Defers the next sync request of this node's disk (a slow WAL commit), or stops
    /// deferring.
    pub fn defer_next_sync(&self, defer: bool) {
        self.faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .defer_syncs = defer;
    }

    /// Power loss: the in-memory state is gone, the disk keeps what was synced plus a seeded
    /// choice of the unsynced writes (each dropped, kept or torn at sector granularity).
    /// Returns how many unsynced device writes were pending and whether a commit was owed.
    pub fn crash(&mut self, seed: u64) -> (usize, bool) {
        let owed = self.halt();
        self.incarnation += 1;
        let pending = self.disk.image().pending_writes();
        self.faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .after_crash();
        self.disk.image().crash(seed);
        self.meta.image().crash(seed ^ 0x6D65_7461);
        (pending, owed)
    }

    /// Stops the node as power loss does: every I/O fails from now on, so dropping the core
    /// writes nothing (redb's `Database` writes its allocator state when dropped, which a
    /// power loss does not let it do: the next open repairs instead). Returns whether a WAL
    /// commit's sync was owed.
    fn halt(&mut self) -> bool {
        let owed = {
            let mut f = self.faults.lock().unwrap_or_else(|e| e.into_inner());
            f.blown = true;
            f.owed > 0
        };
        self.core = None;
        self.flush = None;
        owed
    }

    /// Restart after a crash: reopens the store (WAL replay, interrupted snapshot installs
    /// and PG removals finished) and starts a core; it hosts PGs once the cluster steps the
    /// current map.
    pub fn restart(&mut self) -> Result<(), String> {
        assert!(
            self.core.is_none(),
            "osd {} restarted while running",
            self.id
        );
        let store = Store::open(
            self.node_disk(),
            self.node_file(),
            self.store_options.clone(),
        )
        .map_err(|e| format!("osd {}: reopening the store after a crash: {e}", self.id))?;
        self.start(store);
        Ok(())
    }

    pub fn is_up(&self) -> bool {
        self.core.is_some()
    }

    /// The running core, for the checks between steps.
    pub fn core(&self) -> Option<&NodeCore> {
        self.core.as_ref()
    }

    /// The disk's faults (crash fuse, slow commits, bad blocks).
    pub fn faults(&self) -> std::sync::MutexGuard<'_, crate::disk::DiskFaults> {
        self.faults.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn arm_fuse(&self, ios: u64) {
        self.faults.lock().unwrap_or_else(|e| e.into_inner()).fuse = Some(ios);
    }

    pub fn disarm_fuse(&self) {
        self.faults.lock().unwrap_or_else(|e| e.into_inner()).fuse = None;
    }

    pub fn fuse_blown_at(&self) -> Option<&'static str> {
        self.faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .blown_at
    }
}

impl Drop for Node {
    /// The end of a run is a power loss too: nothing is written on the way out.
    fn drop(&mut self) {
        self.halt();
    }
}

//! Everything a run is made of, drawn from its seed ("swarm testing": each seed turns faults
//! on or off and picks their rates, and picks extreme but legal knob values), printed in full
//! when a run fails so that the failing configuration can be read, not just replayed.

use fastblock_pg::PgConfig;
use fastblock_types::rng::SplitMix64;

/// Small helpers over the one PRNG.
pub trait RngExt {
    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64;
    /// True with probability `ppm` / 1,000,000.
    fn chance_ppm(&mut self, ppm: u64) -> bool;
    /// True with probability `pct` / 100.
    fn chance_pct(&mut self, pct: u64) -> bool {
        self.chance_ppm(pct * 10_000)
    }
    /// One of `items` (non-empty).
    fn pick<T: Copy>(&mut self, items: &[T]) -> T;
}

impl RngExt for SplitMix64 {
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        assert!(lo <= hi, "range {lo}..={hi}");
        lo + self.below(hi - lo + 1)
    }

    fn chance_ppm(&mut self, ppm: u64) -> bool {
        ppm > 0 && self.below(1_000_000) < ppm
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
}

pub const MS: u64 = 1_000;
pub const SEC: u64 = 1_000_000;

/// One run's configuration. Times are virtual microseconds (`_us`).
#[derive(Clone, Debug)]
pub struct SimOptions {
    pub seed: u64,
    // ---- cluster ----
    pub nodes: u32,
    pub replicas: u32,
    pub pg_count: u32,
    pub pg: PgConfig,
    pub tick_us: u64,
    /// Each tick of each node lands up to this many percent early or late (clock jitter, not
    /// drift: the mean rate is the same on every node, as raft-rs's lease assumes).
    pub tick_jitter_pct: u64,
    /// Leaders serve reads under a lease (`fastblock_pg::lease`; length from
    /// [`SimOptions::lease_ms`]). Drawn apart from the other options, so seeds drew the same
    /// configurations before it existed.
    pub lease_reads: bool,
    /// Clients close connections in an orderly way, so that a request they gave up still
    /// reaches its node once a partition heals (`cluster/client_net.rs`): how the client
    /// library behaved before it aborted them. Never drawn; a scenario sets it to show that
    /// the term fence refuses such a late request (before the fence it overwrote newer data).
    pub client_close_orderly: bool,
    pub flush_us: u64,
    /// WAL commits written and not yet durable before the core waits (1 or 2; the core's
    /// `ShardConfig::wal_commits_in_flight_max`). With 2, a slow disk has a second commit
    /// written while the first one's fdatasync is owed. Drawn apart from the other options,
    /// like `lease_reads`.
    pub wal_commits_in_flight_max: usize,
    pub log_retain_entries: u64,
    /// A member further behind than this is caught up by snapshot (`--log-lag-max-entries`).
    pub log_lag_max_entries: u64,
    // ---- snapshot transfer (the OSD's recovery limits, at simulator scale) ----
    pub snap_chunk_bytes: u64,
    pub snap_window_chunks: u32,
    pub snap_idle_ticks_max: u32,
    pub recovery_max_active: usize,
    pub recovery_bytes_per_sec: u64,
    // ---- store geometry and tunables ----
    pub device_bytes: u64,
    pub wal_segment_bytes: u64,
    pub wal_segments: u32,
    pub wal_batch_bytes_max: u64,
    pub entry_cache_bytes_per_pg: u64,
    pub stage_bytes_max: usize,
    // ---- workload ----
    pub clients: u32,
    pub objects: u64,
    pub object_bytes: u64,
    pub write_blocks_max: u64,
    /// When non-zero, most operations go to this many blocks of the first two objects.
    pub hot_blocks: u64,
    pub read_pct: u64,
    /// Client 0 only reads (it keeps reading at a leader it believes in while the writers
    /// move on, which is how stale reads show).
    pub reader_client: bool,
    pub think_us_max: u64,
    /// The monitor shrinks the image to `shrink_to_bytes` at this time (0: never) and grows it
    /// back once every PG confirmed the deletion of the cut tail (the reclaim): the tail must
    /// then read zeros. Drawn apart from the other options, like `lease_reads`.
    pub shrink_at_us: u64,
    pub shrink_to_bytes: u64,
    /// While the image is shrunk, this percent of a client's operations still use its full
    /// size (a client holding the image open from before the shrink): the OSDs must refuse
    /// the part beyond the end.
    pub stale_size_pct: u64,
    /// The monitor takes a snapshot of the image at each of these times of the fault phase
    /// (empty: never), in order; some may overlap (one is still `creating` when the next
    /// begins). Drawn from a stream of its own, like `shrink_at_us`, as are the other
    /// `snap_` options.
    pub snap_at_us: Vec<u64>,
    /// A snapshot still `creating` this long after the monitor recorded it is aborted (the
    /// monitor's `--snap-create-timeout-ms`, at simulator scale).
    pub snap_create_timeout_us: u64,
    /// Percent of snapshots whose create call goes away before its deadline (a monitor
    /// leader change, a client that disconnected): only the monitor's ticker
    /// (`MonState::tick_snaps`) can abort those; the others the call aborts itself
    /// (`MonState::abort_snap_create`).
    pub snap_caller_lost_pct: u64,
    /// While a created snapshot exists, this percent of the clients' operations read it.
    pub snap_read_pct: u64,
    /// Percent of the created snapshots that the monitor removes later in the run.
    pub snap_remove_pct: u64,
    /// A client gives up on an attempt without a reply after this long and retries elsewhere.
    pub attempt_timeout_us: u64,
    /// A client gives up on an operation after this long (the outcome of a write is then
    /// unknown); in the liveness phase giving up is a failure.
    pub op_deadline_us: u64,
    // ---- network ----
    pub delay_us_min: u64,
    pub delay_us_max: u64,
    pub loss_ppm: u64,
    pub dup_ppm: u64,
    /// Chance that a message is held back much longer than usual (reordering).
    pub spike_ppm: u64,
    pub spike_us_max: u64,
    // ---- faults: mean time between faults of each kind, 0 = off ----
    pub crash_every_us: u64,
    pub fuse_every_us: u64,
    pub partition_every_us: u64,
    pub slow_every_us: u64,
    /// OSDs going out (PGs remapped, new members caught up by snapshot) and back in.
    pub outin_every_us: u64,
    /// A running node hears no new map for up to `map_stall_us_max` (its map watch stalls):
    /// it acts on an old map meanwhile. Drawn apart from the other options, like
    /// `lease_reads`.
    pub map_stall_every_us: u64,
    pub map_stall_us_max: u64,
    /// A data block on one node's disk goes bad now and then (`FaultKind::BadBlock`): its
    /// bytes flip (silent corruption of synced data), one of its sectors stops reading
    /// (a latent sector error), or a write of it lands on another block (a misdirected
    /// write). Never on more than one node per block (`cluster/bad_blocks.rs`). Off unless
    /// [`SimOptions::with_bad_blocks`].
    pub bad_block_every_us: u64,
    /// Of the bad blocks: percent that are latent sector errors, and percent that are
    /// misdirected writes (the rest flip bytes).
    pub unreadable_pct: u64,
    pub misdirect_pct: u64,
    /// The monitor asks for a scrub (light or deep) of a random PG now and then in the fault
    /// phase (`MonState::request_scrub`), and the nodes' heartbeats carry their scrub
    /// reports to it. Every run ends with a deep scrub of every PG in any case. Drawn from a
    /// stream of its own, like `lease_reads`.
    pub scrub_every_us: u64,
    pub down_us_max: u64,
    pub partition_us_max: u64,
    pub slow_for_us_max: u64,
    pub slow_commit_us_max: u64,
    /// Most nodes down at once (crashes only; disks are kept, so any number is survivable).
    pub down_max: u32,
    // ---- phases ----
    pub fault_phase_us: u64,
    /// After the faults stop, clients keep working this long, then stop.
    pub liveness_work_us: u64,
    /// Every PG must be active with identical replicas within this long after the faults stop.
    pub liveness_bound_us: u64,
}

impl SimOptions {
    /// The configuration of `seed`, without OSDs going out and in (see
    /// [`SimOptions::with_membership`]).
    pub fn from_seed(seed: u64) -> SimOptions {
        let mut o = Self::with_membership(seed);
        o.outin_every_us = 0;
        o
    }

    /// The replicas' lease (0: off). A follower refuses votes for `election_ticks` of its
    /// ticks after hearing from its leader; here a tick may land `tick_jitter_pct` early, and
    /// a core that a slow WAL commit kept waiting handles the tick it deferred once the commit
    /// is durable, possibly just before the next one (up to two ticks early in all). So the lease is `election_ticks - 2` ticks at their shortest,
    /// less half a tick.
    pub fn lease_ms(&self) -> u64 {
        if !self.lease_reads {
            return 0;
        }
        let shortest_tick_us = self.tick_us * (100 - self.tick_jitter_pct) / 100;
        let ticks = self.pg.election_ticks.saturating_sub(2) as u64;
        (ticks * shortest_tick_us).saturating_sub(self.tick_us / 2) / 1000
    }

    /// These options with data blocks going bad when the seed enables it (`vopr
    /// --bad-blocks`): in half the seeds whose PGs have two replicas or more (a PG of one
    /// replica has no good copy to repair a bad one from). Off by default: the shard core's
    /// repair can give a block up while a good copy exists, and clients are then answered
    /// `Checksum` (the "Open" table of `docs/design/simulator.md`). Drawn from a stream of
    /// its own, so the seed's other options stay as they are.
    pub fn with_bad_blocks(mut self) -> SimOptions {
        let mut r = SplitMix64::new(self.seed ^ 0xBAD0_B10C_0000_0008);
        if self.replicas >= 2 && r.chance_pct(50) {
            self.bad_block_every_us = r.range(SEC, 4 * SEC);
            self.unreadable_pct = r.pick(&[0, 20, 40]);
            self.misdirect_pct = r.pick(&[0, 20, 40]);
        }
        self
    }

    /// The configuration of `seed` with OSDs going out and in when the seed enables it
    /// (membership changes; `vopr --membership`). Kept out of the CI budget while the
    /// failures it finds are open (see `docs/design/simulator.md`); the same seed draws the
    /// same configuration either way, apart from this fault.
    pub fn with_membership(seed: u64) -> SimOptions {
        let mut r = SplitMix64::new(seed ^ 0x0005_EED0_F0F7_10A5);
        let nodes = r.range(3, 6) as u32;
        let replicas = if nodes == 3 || r.chance_pct(80) {
            3
        } else {
            r.pick(&[1, 2, 5.min(nodes)])
        };
        let election_ticks = r.pick(&[5, 10, 10, 20]) as usize;
        let heartbeat_ticks = r.range(1, ((election_ticks - 1) / 2).min(3) as u64) as usize;
        let pg = PgConfig {
            heartbeat_ticks,
            election_ticks,
            append_bytes_max: r.pick(&[4 << 10, 64 << 10, 1 << 20]),
            inflight_appends_max: r.pick(&[1, 4, 256]) as usize,
            pending_ops_max: r.pick(&[2, 64, 1024]) as usize,
            // Set per node from the final options (`node::shard_config`, `lease_ms`).
            lease_ms: 0,
            // Drawn below from a stream of its own, so the draws above stay the seed's.
            commit_broadcast: false,
        };
        pg.validate().expect("sim picks a valid PG config");
        let on = |r: &mut SplitMix64, pct: u64, every: u64| {
            if r.chance_pct(pct) {
                r.range(every / 2, every * 2)
            } else {
                0
            }
        };
        // Shrink and regrow: a stream of its own, so that seeds keep their other options.
        let mut shrink = SplitMix64::new(seed ^ 0x5117_1C0F_F00D_0003);
        let shrink_on = shrink.chance_pct(40);
        let wal_segment_bytes = r.pick(&[256 << 10, 1 << 20]);
        let wal_segments = r.range(4, 12) as u32;
        let log_retain_entries = r.pick(&[1, 8, 64, 1024]);
        let loss_ppm = r.pick(&[0, 0, 1_000, 20_000, 100_000]);
        let mut o = SimOptions {
            seed,
            nodes,
            replicas,
            pg_count: r.range(1, 8) as u32,
            pg,
            tick_us: 100 * MS,
            tick_jitter_pct: r.pick(&[0, 5, 10]),
            lease_reads: SplitMix64::new(seed ^ 0x1EA5_E0F0_0000_0001).chance_pct(75),
            client_close_orderly: false,
            flush_us: r.pick(&[50 * MS, 200 * MS, 1000 * MS]),
            wal_commits_in_flight_max: if SplitMix64::new(seed ^ 0xC0_3317_F11E_0002).chance_pct(50)
            {
                2
            } else {
                1
            },
            log_retain_entries,
            log_lag_max_entries: r.pick(&[16, 256, 65536]),
            snap_chunk_bytes: r.pick(&[4 << 10, 16 << 10, 128 << 10]),
            snap_window_chunks: r.pick(&[1, 2, 8]) as u32,
            snap_idle_ticks_max: r.pick(&[20, 200]) as u32,
            recovery_max_active: r.pick(&[1, 4]) as usize,
            recovery_bytes_per_sec: r.pick(&[256 << 10, 64 << 20]),
            device_bytes: 24 << 20,
            wal_segment_bytes,
            wal_segments,
            wal_batch_bytes_max: r.pick(&[32 << 10, wal_segment_bytes / 4]),
            entry_cache_bytes_per_pg: r.pick(&[4 << 10, 1 << 20]),
            stage_bytes_max: r.pick(&[16 << 10, 1 << 20]) as usize,
            clients: r.range(1, 4) as u32,
            objects: r.range(2, 12),
            object_bytes: 64 << 10,
            write_blocks_max: r.pick(&[1, 1, 4]),
            hot_blocks: r.pick(&[0, 1, 4]),
            read_pct: r.pick(&[10, 30, 50]),
            reader_client: r.chance_pct(50),
            think_us_max: r.pick(&[MS, 20 * MS, 200 * MS]),
            attempt_timeout_us: r.pick(&[300 * MS, 2 * SEC]),
            op_deadline_us: 10 * SEC,
            delay_us_min: 50,
            delay_us_max: r.pick(&[500, 5 * MS, 50 * MS]),
            loss_ppm,
            dup_ppm: r.pick(&[0, 0, 10_000, 50_000]),
            spike_ppm: r.pick(&[0, 5_000, 50_000]),
            spike_us_max: r.pick(&[100 * MS, 2 * SEC]),
            crash_every_us: on(&mut r, 60, 4 * SEC),
            fuse_every_us: on(&mut r, 50, 6 * SEC),
            partition_every_us: on(&mut r, 50, 5 * SEC),
            slow_every_us: on(&mut r, 50, 5 * SEC),
            outin_every_us: if nodes > replicas {
                on(&mut r, 60, 6 * SEC)
            } else {
                0
            },
            down_us_max: r.pick(&[500 * MS, 5 * SEC, 20 * SEC]),
            partition_us_max: r.pick(&[SEC, 10 * SEC]),
            slow_for_us_max: r.pick(&[SEC, 5 * SEC]),
            slow_commit_us_max: r.pick(&[5 * MS, 100 * MS, 3 * SEC]),
            down_max: r.range(1, u64::from(nodes)) as u32,
            fault_phase_us: r.range(10, 40) * SEC,
            liveness_work_us: 3 * SEC,
            liveness_bound_us: 60 * SEC,
            shrink_at_us: 0,
            shrink_to_bytes: 0,
            stale_size_pct: 0,
            snap_at_us: Vec::new(),
            snap_create_timeout_us: 0,
            snap_caller_lost_pct: 0,
            snap_read_pct: 0,
            snap_remove_pct: 0,
            map_stall_every_us: 0,
            map_stall_us_max: 0,
            bad_block_every_us: 0,
            unreadable_pct: 0,
            misdirect_pct: 0,
            scrub_every_us: 0,
        };
        let mut stall = SplitMix64::new(seed ^ 0x3A95_7A11_0000_0004);
        if stall.chance_pct(30) {
            o.map_stall_every_us = stall.range(2 * SEC, 8 * SEC);
            o.map_stall_us_max = stall.pick(&[500 * MS, 3 * SEC]);
        }
        // Scrubs: a stream of their own, so that seeds keep their other options.
        let mut scrubs = SplitMix64::new(seed ^ 0x5C0B_0000_0000_0009);
        if scrubs.chance_pct(30) {
            o.scrub_every_us = scrubs.range(SEC, 5 * SEC);
        }
        // Mostly the OSD's default (followers learn the commit index from the next append
        // or heartbeat), sometimes raft-rs's broadcast of every commit.
        let mut broadcast = SplitMix64::new(seed ^ 0xB0AD_CA57_0000_0005);
        o.pg.commit_broadcast = broadcast.chance_pct(25);
        if shrink_on {
            // Cut anywhere past the first block, often in the middle of an object.
            let blocks = o.objects * o.object_bytes / 4096;
            o.shrink_at_us = shrink.range(SEC, o.fault_phase_us / 2);
            o.shrink_to_bytes = shrink.range(1, blocks - 1) * 4096;
            o.stale_size_pct = shrink.pick(&[0, 5, 20]);
        }
        // Snapshots: a stream of their own, so that seeds keep their other options.
        let mut snaps = SplitMix64::new(seed ^ 0x5A95_4075_0000_0006);
        if snaps.chance_pct(40) {
            let count = snaps.range(1, 4) as usize;
            let mut at: Vec<u64> = (0..count)
                .map(|_| snaps.range(SEC / 2, o.fault_phase_us - SEC / 2))
                .collect();
            if count > 1 && snaps.chance_pct(30) {
                // Two at nearly the same time: the second begins while the first is creating.
                at[1] = at[0] + snaps.range(0, 300 * MS);
            }
            if shrink_on && snaps.chance_pct(50) {
                // While the shrunk tail is being deleted (the PGs mark and reclaim in their
                // own orders), or soon after.
                at[0] = o.shrink_at_us + snaps.range(0, SEC);
            }
            at.sort_unstable();
            o.snap_at_us = at;
            o.snap_create_timeout_us = snaps.pick(&[SEC, 2 * SEC, 5 * SEC]);
            o.snap_caller_lost_pct = snaps.pick(&[0, 25]);
            o.snap_read_pct = snaps.pick(&[10, 25, 40]);
            o.snap_remove_pct = snaps.pick(&[30, 60, 100]);
        }
        o
    }
}

//! The chaos run (issue 19): a real cluster (three monitors on etcd, four OSDs, each in its
//! own network namespace, `common::netns`) under verified IO while faults of every kind the
//! design claims to survive come and go at random, then healed, checked for convergence and
//! read back whole.
//!
//! - **IO.** Writers and readers through the client library on image `fb/img`, and a writer
//!   and a reader through `fastblock-nbd` (root namespace) on image `fb/nbd`: 4 KiB blocks,
//!   unaligned runs of 512-byte sectors (partial blocks merged by the OSDs) and 32 KiB
//!   extents across object boundaries (two PGs), over a bounded set of extents. Every read is
//!   checked, sector by sector, against a model of the writes (`common::model`): it returns a
//!   value written by a write acknowledged, failed or in flight, never one older than the last
//!   write acknowledged before the read began.
//! - **Faults**, one started every 2 to 8 s, drawn from a deck holding every kind once per
//!   round (so a short run still sees them all): SIGKILL of an OSD and its restart; SIGKILL of
//!   a monitor and its restart; an OSD isolated (veth down) and healed; two OSDs dropping each
//!   other's packets, both ways or one way, then healed; a slow disk (delays on writes and
//!   syncs); a disk failing writes and syncs with EIO (the OSD must exit by itself, status 1;
//!   the file is cleared and it restarts); bit rot (bytes flipped in block copies on one OSD's
//!   disk: checksums catch them, replicas repair them); `osd out` and, later, `osd in` (PGs
//!   move and come back); transient corrupted reads of data blocks (checksums catch them, the
//!   shard repairs from replicas; see [`Kind::CorruptReads`]).
//!   Bound: at most one OSD at a time is down, isolated, cut from a peer, or has a failing,
//!   rotten or corrupting disk (the "slot"), and it is back up, caught up, with every PG
//!   active before the slot is taken again; a slow disk, an out OSD and a dead monitor (one of
//!   three) come on top, on other OSDs. So a majority of every PG, and of the monitors,
//!   always survives.
//! - **End.** Faults stop and heal; then every PG must be active with identical replicas
//!   within 120 s (`common::wait_replicas_identical`), every extent of both images reads back
//!   as the model allows (through the library and through NBD), a deep scrub of every PG
//!   (`fastblock-client pg deep-scrub`) must leave no block inconsistent and no
//!   `PG_INCONSISTENT`, and no daemon may have exited unasked.
//!
//! Settings: `FASTBLOCK_CHAOS_SECS` (default 120, what CI runs) and `FASTBLOCK_CHAOS_SEED`
//! (default random; printed first, so a failure can be replayed as far as real processes
//! allow: the seed fixes the faults, their order, targets and lengths, and every IO's choice).
//! `scripts/chaos.sh --minutes N --seed S` runs it (`docs/testing.md`, "The chaos run"). The
//! summary printed at the end gives the duration, the faults by kind, IOs, reads checked,
//! violations and the seed.

mod common;

use bytes::{Bytes, BytesMut};
use common::faults::{use_fault_file, write_fault_file};
use common::model::{Floor, Model, Outcome, WallClock};
use common::netns::NetCluster;
use common::{
    all_pgs, bin, free_ports, stamped, wait_osds_up, wait_until, MonOptions, Proc, TempDir,
    WireConn,
};
use fastblock_client::{Cluster, Image};
use fastblock_monclient::MonClient;
use fastblock_nbd::consts::{CMD_READ, CMD_WRITE, SIMPLE_REPLY_MAGIC};
use fastblock_nbd::testing::{accepts, request_bytes, RawClient};
use fastblock_types::api::CreateImageRequest;
use fastblock_types::map::ClusterMap;
use fastblock_types::{Epoch, OsdId, PgId};
use fastblock_wire::{Reply, Request};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const OSDS: usize = 4;
const MONS: usize = 3;
const PG_COUNT: u32 = 16;
const OBJECT_BYTES: u64 = 1 << 20;
/// The library's image: 32 objects over the 16 PGs.
const IMAGE_BYTES: u64 = 32 << 20;
/// The image served by NBD.
const NBD_IMAGE_BYTES: u64 = 16 << 20;
const SECTOR: u64 = 512;
/// Sectors of one extent of the workload: 32 KiB, 16 KiB on each side of an object boundary.
const EXTENT_SECTORS: u64 = 64;
/// The longest unaligned run written or read at once.
const RUN_SECTORS_MAX: u64 = 24;
const LIB_WRITERS: usize = 3;
const LIB_READERS: usize = 2;

// An extent is whole 4 KiB blocks (the aligned IO and bit rot pick blocks in it), an unaligned
// run fits in one, and half of one fits in an object (the extents across object boundaries).
const _: () = assert!(EXTENT_SECTORS % 8 == 0);
const _: () = assert!(RUN_SECTORS_MAX <= EXTENT_SECTORS);
const _: () = assert!(EXTENT_SECTORS * SECTOR / 2 <= OBJECT_BYTES);
// Every writer of the library's leg owns some extents.
const _: () = assert!(IMAGE_BYTES / OBJECT_BYTES >= LIB_WRITERS as u64);

/// Block copies one bit rot fault damages at most.
const ROT_BLOCKS_MAX: usize = 4;
/// The seconds a run lasts unless `FASTBLOCK_CHAOS_SECS` says otherwise (what CI runs).
const SECS_DEFAULT: u64 = 120;
/// Time between two fault starts, drawn in this range (milliseconds).
const FAULT_GAP_MS: (u64, u64) = (2_000, 8_000);
/// Limit of the wait for an OSD back from a fault to be up with every PG active, before the
/// slot is taken again (beyond it the run goes on and counts a slow recovery).
const RECOVER_WAIT: Duration = Duration::from_secs(60);
/// Limit of the wait for an OSD whose disk fails writes to stop by itself: the faults are
/// installed within 100 ms, the next WAL commit fails, and the shards stop (10 s each at most).
const FAIL_EXIT_WAIT: Duration = Duration::from_secs(30);
/// Limit of the final convergence: every PG active with identical replicas.
const CONVERGE_WAIT: Duration = Duration::from_secs(120);
/// How long one client IO keeps retrying (the library's `op_deadline`).
const OP_DEADLINE: Duration = Duration::from_secs(30);
/// Limit of one NBD request's reply: above the NBD server's own op deadline (30 s), so the
/// server has given up on a request before the test does.
const NBD_REPLY_WAIT: Duration = Duration::from_secs(90);
/// Limit of every monitor call of the fault driver (a dead monitor must not stall it).
const MON_CALL_DEADLINE: Duration = Duration::from_secs(5);

/// Seconds since the test started, for log lines that line up faults and IO.
fn now_s() -> f64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_secs_f64()
}

macro_rules! say {
    ($($arg:tt)*) => {
        eprintln!("[{:8.2}s] {}", now_s(), format!($($arg)*))
    };
}

/// A seeded generator (SplitMix64): every random choice of the run comes from the seed.
#[derive(Clone, Debug)]
struct Prng(u64);

impl Prng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0);
        self.next() % n
    }

    /// Uniform in `lo..=hi`.
    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        assert!(lo <= hi);
        lo + self.below(hi - lo + 1)
    }

    fn millis(&mut self, (lo, hi): (u64, u64)) -> Duration {
        Duration::from_millis(self.between(lo, hi))
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }

    /// A generator of its own for a task, drawn from this one.
    fn fork(&mut self) -> Prng {
        Prng(self.next())
    }

    fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

/// The run's settings, from the environment.
struct Settings {
    duration: Duration,
    seed: u64,
    /// The kinds of faults in the deck: all, or those `FASTBLOCK_CHAOS_KINDS` names
    /// (comma-separated short names, [`Kind::short`]), to chase one kind's failure.
    kinds: Vec<Kind>,
}

impl Settings {
    fn from_env() -> Settings {
        let secs = match std::env::var("FASTBLOCK_CHAOS_SECS") {
            Ok(s) => s
                .trim()
                .parse()
                .unwrap_or_else(|e| panic!("FASTBLOCK_CHAOS_SECS={s:?}: {e}")),
            Err(_) => SECS_DEFAULT,
        };
        let seed = match std::env::var("FASTBLOCK_CHAOS_SEED") {
            Ok(s) => {
                let s = s.trim();
                match s.strip_prefix("0x") {
                    Some(hex) => u64::from_str_radix(hex, 16),
                    None => s.parse(),
                }
                .unwrap_or_else(|e| panic!("FASTBLOCK_CHAOS_SEED={s:?}: {e}"))
            }
            Err(_) => uuid::Uuid::new_v4().as_u128() as u64,
        };
        let kinds =
            match std::env::var("FASTBLOCK_CHAOS_KINDS") {
                Ok(list) => {
                    list.split(',')
                        .map(|name| {
                            let name = name.trim();
                            KINDS.into_iter().find(|k| k.short() == name).unwrap_or_else(|| {
                        let known: Vec<&str> = KINDS.iter().map(|k| k.short()).collect();
                        panic!("FASTBLOCK_CHAOS_KINDS: no kind {name:?} (kinds: {known:?})")
                    })
                        })
                        .collect()
                }
                Err(_) => KINDS.to_vec(),
            };
        Settings {
            duration: Duration::from_secs(secs),
            seed,
            kinds,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The workload.

/// Counters of one leg of the workload (library or NBD).
#[derive(Default)]
struct Stats {
    writes_acked: AtomicU64,
    writes_failed: AtomicU64,
    reads_ok: AtomicU64,
    reads_failed: AtomicU64,
    /// Errors printed so far (the first few of each leg are, the rest only counted).
    errors_logged: AtomicU64,
}

/// Errors of one leg printed at most.
const ERRORS_LOGGED_MAX: u64 = 20;

/// One image under test, its model (512-byte units) and its counters.
struct Leg {
    name: &'static str,
    model: Mutex<Model>,
    stats: Stats,
    /// The next write's generation (one counter for all writers of the leg: a unit's writes,
    /// all from its one writer, get rising generations).
    generation: AtomicU64,
    /// First sector of each extent.
    extents: Vec<u64>,
}

impl Leg {
    fn new(name: &'static str, image_bytes: u64) -> Leg {
        Leg {
            name,
            model: Mutex::new(Model::new(SECTOR)),
            stats: Stats::default(),
            generation: AtomicU64::new(0),
            extents: extents(image_bytes),
        }
    }

    fn log_error(&self, what: &str) {
        if self.stats.errors_logged.fetch_add(1, Ordering::Relaxed) < ERRORS_LOGGED_MAX {
            say!("{}: {what}", self.name);
        }
    }

    /// Checks what a read of `count` sectors from `first` returned against `floors` (taken
    /// when it started), and prints the violations it adds.
    fn check(&self, first: u64, floors: &[Floor], got: &[u8], what: &str) {
        let mut model = self.model.lock().unwrap();
        let before = model.violations.len();
        if got.len() as u64 != floors.len() as u64 * SECTOR {
            model.violations.push(format!(
                "{what} of sectors {first}+{}: {} bytes back",
                floors.len(),
                got.len()
            ));
        } else {
            for (i, floor) in floors.iter().enumerate() {
                let bytes = &got[i * SECTOR as usize..(i + 1) * SECTOR as usize];
                model.check(first + i as u64, *floor, bytes, what);
            }
        }
        if model.violations.len() > before {
            for v in &model.violations[before..] {
                say!("VIOLATION ({}): {v}", self.name);
            }
            // What the model knew of the first sector, for the report.
            say!(
                "  sector {first}: floor {:?}, last writes (oldest first) {:?}",
                floors[0],
                model.recent(first, 8)
            );
        }
    }
}

/// The workload's extents in an image of `image_bytes`: one at the start, and one across
/// every object boundary, 16 KiB on each side (so some IO spans two objects, and two PGs).
fn extents(image_bytes: u64) -> Vec<u64> {
    let objects = image_bytes / OBJECT_BYTES;
    (0..objects)
        .map(|o| {
            let start = if o == 0 {
                0
            } else {
                o * OBJECT_BYTES - EXTENT_SECTORS * SECTOR / 2
            };
            start / SECTOR
        })
        .collect()
}

/// A range of sectors to write or read in the extent starting at sector `extent`: a 4 KiB
/// block (55%), an unaligned run (35%) or the whole extent (10%).
fn pick_range(rng: &mut Prng, extent: u64) -> (u64, u64) {
    let roll = rng.below(100);
    if roll < 55 {
        let blocks = EXTENT_SECTORS / 8;
        (extent + 8 * rng.below(blocks), 8)
    } else if roll < 90 {
        let first = rng.below(EXTENT_SECTORS);
        let count = rng.between(1, RUN_SECTORS_MAX.min(EXTENT_SECTORS - first));
        (extent + first, count)
    } else {
        (extent, EXTENT_SECTORS)
    }
}

/// Where a leg's IO goes: the client library, or an NBD connection to `fastblock-nbd`.
enum Target {
    Library(Arc<Image>),
    Nbd(NbdConn),
}

impl Target {
    async fn write(&mut self, offset: u64, data: Bytes) -> Result<(), String> {
        match self {
            Target::Library(image) => image.write(offset, data).await.map_err(|e| e.to_string()),
            Target::Nbd(conn) => conn.call(CMD_WRITE, offset, &data).await.map(drop),
        }
    }

    async fn read(&mut self, offset: u64, len: u64) -> Result<Bytes, String> {
        match self {
            Target::Library(image) => image.read(offset, len).await.map_err(|e| e.to_string()),
            Target::Nbd(conn) => {
                let len = u32::try_from(len).expect("a short read");
                conn.call_read(offset, len).await.map(Bytes::from)
            }
        }
    }
}

/// One NBD connection to an export, opened again after a broken or silent one.
struct NbdConn {
    addr: SocketAddr,
    export: String,
    client: Option<RawClient>,
    handle: u64,
}

impl NbdConn {
    fn new(addr: SocketAddr, export: &str) -> NbdConn {
        NbdConn {
            addr,
            export: export.to_string(),
            client: None,
            handle: 0,
        }
    }

    /// The connection, opened (handshake and `GO`) if there is none.
    async fn connected(&mut self) -> Result<&mut RawClient, String> {
        if self.client.is_none() {
            let (addr, export) = (self.addr, self.export.clone());
            // The raw test client panics on a failed connect or a late answer: in a task of
            // its own, that is an error here.
            let opened = tokio::spawn(async move {
                let mut c = RawClient::connect(addr).await;
                c.go(&export).await.map(|_| c)
            })
            .await;
            match opened {
                Ok(Ok(c)) => self.client = Some(c),
                Ok(Err(kind)) => return Err(format!("NBD GO refused ({kind:#x})")),
                Err(e) => return Err(format!("NBD connect: {e}")),
            }
        }
        Ok(self.client.as_mut().expect("connected"))
    }

    async fn call_read(&mut self, offset: u64, len: u32) -> Result<Vec<u8>, String> {
        self.request(CMD_READ, offset, len, &[]).await
    }

    async fn call(&mut self, kind: u16, offset: u64, payload: &[u8]) -> Result<Vec<u8>, String> {
        let len = u32::try_from(payload.len()).expect("a short write");
        self.request(kind, offset, len, payload).await
    }

    /// Sends one request and waits for its simple reply (and a read's data). A connection
    /// that breaks or stays silent for [`NBD_REPLY_WAIT`] is dropped (the next request opens
    /// a new one); the request then failed, its outcome unknown.
    async fn request(
        &mut self,
        kind: u16,
        offset: u64,
        len: u32,
        payload: &[u8],
    ) -> Result<Vec<u8>, String> {
        self.handle += 1;
        let handle = self.handle;
        let bytes = request_bytes(0, kind, handle, offset, len, payload);
        let client = self.connected().await?;
        let exchange = async {
            client.stream.write_all(&bytes).await?;
            let mut header = [0u8; 16];
            client.stream.read_exact(&mut header).await?;
            let word = |range: std::ops::Range<usize>| {
                header[range]
                    .iter()
                    .fold(0u64, |acc, b| (acc << 8) | u64::from(*b))
            };
            let (magic, error, got_handle) = (word(0..4), word(4..8), word(8..16));
            if magic != u64::from(SIMPLE_REPLY_MAGIC) || got_handle != handle {
                return Err(std::io::Error::other(format!(
                    "bad reply: magic {magic:#x}, handle {got_handle} for {handle}"
                )));
            }
            let mut data = Vec::new();
            if error == 0 && kind == CMD_READ {
                data.resize(len as usize, 0);
                client.stream.read_exact(&mut data).await?;
            }
            Ok((error, data))
        };
        match tokio::time::timeout(NBD_REPLY_WAIT, exchange).await {
            Ok(Ok((0, data))) => Ok(data),
            Ok(Ok((error, _))) => Err(format!("NBD error {error}")),
            Ok(Err(e)) => {
                self.client = None;
                Err(format!("NBD connection: {e}"))
            }
            Err(_) => {
                self.client = None;
                Err(format!("no NBD reply within {NBD_REPLY_WAIT:?}"))
            }
        }
    }
}

/// Writes to the extents `mine` (this task is their only writer) until `stop`.
async fn writer(
    mut target: Target,
    leg: Arc<Leg>,
    mine: Vec<u64>,
    mut rng: Prng,
    stop: Arc<AtomicBool>,
) {
    while !stop.load(Ordering::Relaxed) {
        let extent = rng.pick(&mine);
        let (first, count) = pick_range(&mut rng, extent);
        let generation = leg.generation.fetch_add(1, Ordering::Relaxed) + 1;
        let mut data = BytesMut::with_capacity((count * SECTOR) as usize);
        for unit in first..first + count {
            data.extend_from_slice(&stamped(unit * SECTOR, generation, SECTOR));
        }
        {
            let mut model = leg.model.lock().unwrap();
            for unit in first..first + count {
                model.issue(unit, generation);
            }
        }
        let result = target.write(first * SECTOR, data.freeze()).await;
        let outcome = match &result {
            Ok(()) => {
                leg.stats.writes_acked.fetch_add(1, Ordering::Relaxed);
                Outcome::Acked
            }
            Err(e) => {
                leg.stats.writes_failed.fetch_add(1, Ordering::Relaxed);
                leg.log_error(&format!(
                    "write of sectors {first}+{count} (generation {generation}) failed: {e}"
                ));
                Outcome::Failed
            }
        };
        let mut model = leg.model.lock().unwrap();
        for unit in first..first + count {
            model.complete(unit, generation, outcome);
        }
    }
}

/// Reads any extent and checks what it returns, until `stop`.
async fn reader(mut target: Target, leg: Arc<Leg>, mut rng: Prng, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        let extent = rng.pick(&leg.extents);
        let (first, count) = pick_range(&mut rng, extent);
        // Which PG answered, for a violation's report (an extent may span two objects).
        let what = match &target {
            Target::Library(image) => {
                let os = image.info().object_size_bytes;
                let (a, b) = (first * SECTOR / os, ((first + count) * SECTOR - 1) / os);
                format!(
                    "read (pg {} .. pg {})",
                    image.object_pg(a),
                    image.object_pg(b)
                )
            }
            Target::Nbd(_) => "read".to_string(),
        };
        read_and_check(&mut target, &leg, first, count, &what).await;
    }
}

/// Reads `count` sectors from `first` and checks them; whether the read succeeded.
async fn read_and_check(
    target: &mut Target,
    leg: &Leg,
    first: u64,
    count: u64,
    what: &str,
) -> bool {
    let floors: Vec<Floor> = {
        let model = leg.model.lock().unwrap();
        (first..first + count).map(|u| model.floor(u)).collect()
    };
    let started = WallClock::now();
    match target.read(first * SECTOR, count * SECTOR).await {
        Ok(got) => {
            leg.stats.reads_ok.fetch_add(1, Ordering::Relaxed);
            // When it ran, on the daemons' log clock, for a violation's report.
            let what = format!("{what} [{started:?} .. {:?}]", WallClock::now());
            leg.check(first, &floors, &got, &what);
            true
        }
        Err(e) => {
            leg.stats.reads_failed.fetch_add(1, Ordering::Relaxed);
            leg.log_error(&format!("{what} of sectors {first}+{count} failed: {e}"));
            false
        }
    }
}

/// The IO tasks of both legs.
struct Workload {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Workload {
    fn start(
        image: &Arc<Image>,
        (lib, nbd): (&Arc<Leg>, &Arc<Leg>),
        nbd_addr: SocketAddr,
        rng: &mut Prng,
    ) -> Workload {
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        for w in 0..LIB_WRITERS {
            let mine: Vec<u64> = lib
                .extents
                .iter()
                .copied()
                .skip(w)
                .step_by(LIB_WRITERS)
                .collect();
            tasks.push(tokio::spawn(writer(
                Target::Library(image.clone()),
                lib.clone(),
                mine,
                rng.fork(),
                stop.clone(),
            )));
        }
        for _ in 0..LIB_READERS {
            tasks.push(tokio::spawn(reader(
                Target::Library(image.clone()),
                lib.clone(),
                rng.fork(),
                stop.clone(),
            )));
        }
        tasks.push(tokio::spawn(writer(
            Target::Nbd(NbdConn::new(nbd_addr, "fb/nbd")),
            nbd.clone(),
            nbd.extents.clone(),
            rng.fork(),
            stop.clone(),
        )));
        tasks.push(tokio::spawn(reader(
            Target::Nbd(NbdConn::new(nbd_addr, "fb/nbd")),
            nbd.clone(),
            rng.fork(),
            stop.clone(),
        )));
        Workload { stop, tasks }
    }

    /// Stops every task after the IO it is doing (each bounded by its deadline).
    async fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            tokio::time::timeout(NBD_REPLY_WAIT + OP_DEADLINE, task)
                .await
                .expect("an IO task stops within its deadline")
                .expect("an IO task");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The faults.

/// Every kind of fault, one card each in the deck.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    KillOsd,
    Isolate,
    DropBothWays,
    DropOneWay,
    FailingDisk,
    /// Reads of data blocks on one OSD come back with flipped bytes for a while (the
    /// device keeps its bytes: a transient fault). This run found that a partial write whose
    /// merge read came back corrupted on a PG leader left the leader's old copy in place,
    /// checksum-valid, and that the repair which followed took that stale copy as its source
    /// and rewrote the replicas that had merged the write (stale reads, an acknowledged write
    /// lost on every replica); the store now marks such a copy damaged (commit fae5dd3).
    CorruptReads,
    /// Bytes flipped in block copies on one OSD's disk (persistent bit rot).
    BitRot,
    SlowDisk,
    KillMon,
    OutIn,
}

const KINDS: [Kind; 10] = [
    Kind::KillOsd,
    Kind::Isolate,
    Kind::DropBothWays,
    Kind::DropOneWay,
    Kind::FailingDisk,
    Kind::CorruptReads,
    Kind::BitRot,
    Kind::SlowDisk,
    Kind::KillMon,
    Kind::OutIn,
];

impl Kind {
    /// Its name in `FASTBLOCK_CHAOS_KINDS`.
    fn short(self) -> &'static str {
        match self {
            Kind::KillOsd => "kill-osd",
            Kind::Isolate => "isolate",
            Kind::DropBothWays => "cut-both",
            Kind::DropOneWay => "cut-one",
            Kind::FailingDisk => "failing-disk",
            Kind::CorruptReads => "corrupt-reads",
            Kind::BitRot => "bit-rot",
            Kind::SlowDisk => "slow-disk",
            Kind::KillMon => "kill-mon",
            Kind::OutIn => "out-in",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::KillOsd => "osd SIGKILL + restart",
            Kind::Isolate => "osd isolated (veth down)",
            Kind::DropBothWays => "2 osds cut both ways",
            Kind::DropOneWay => "2 osds cut one way",
            Kind::FailingDisk => "disk failing writes (EIO)",
            Kind::CorruptReads => "corrupted reads (transient)",
            Kind::BitRot => "bit rot (bytes flipped on disk)",
            Kind::SlowDisk => "slow disk",
            Kind::KillMon => "monitor SIGKILL + restart",
            Kind::OutIn => "osd out + in",
        }
    }

    /// How long the fault lasts once started (milliseconds).
    fn length_ms(self) -> (u64, u64) {
        match self {
            Kind::KillOsd | Kind::KillMon => (2_000, 8_000),
            Kind::Isolate | Kind::DropBothWays | Kind::DropOneWay => (3_000, 10_000),
            Kind::SlowDisk | Kind::CorruptReads => (5_000, 15_000),
            // Nothing to undo: the slot stays taken a while so that no other OSD fails while
            // the rotten copies are met and repaired.
            Kind::BitRot => (3_000, 8_000),
            Kind::OutIn => (5_000, 20_000),
            // Until the OSD stops by itself.
            Kind::FailingDisk => (0, 0),
        }
    }
}

/// The fault holding the slot (OSD indexes are namespace indexes, `net.osds[i]`).
enum Slot {
    /// `osds` are faulty until `until`.
    Active {
        kind: Kind,
        osds: Vec<usize>,
        until: Instant,
    },
    /// The disk of `osd` fails writes; waiting for it to stop by itself.
    AwaitExit { osd: usize, since: Instant },
    /// The fault ended; waiting for `osds` up (those in `boots` booted again, after the
    /// epoch given), every PG active, and their replicas caught up with their leaders.
    Recovering {
        osds: Vec<usize>,
        boots: Vec<(usize, Epoch)>,
        since: Instant,
    },
}

enum MonFault {
    Down {
        index: usize,
        until: Instant,
    },
    /// Restarted; waiting for it to see a leader (its etcd member back in the cluster).
    Rejoining {
        index: usize,
        since: Instant,
    },
}

enum OutFault {
    Out {
        osd: usize,
        until: Instant,
    },
    /// Back in; waiting for the PGs to move back.
    Settling {
        since: Instant,
    },
}

/// Drives the faults: owns the cluster, starts faults from the deck and ends them.
struct Nemesis {
    net: NetCluster,
    /// Monitor calls bounded by [`MON_CALL_DEADLINE`].
    client: MonClient,
    fault_files: Vec<PathBuf>,
    rng: Prng,
    deck: Vec<Kind>,
    slot: Option<Slot>,
    slow: Option<(usize, Instant)>,
    mon: Option<MonFault>,
    out: Option<OutFault>,
    /// OSDs the test stopped or expects to stop (not a crash if they are not running), with
    /// their boot epoch before (they must boot again).
    expected_down: Vec<(usize, Epoch)>,
    counts: BTreeMap<Kind, u64>,
    /// When the slot's recovery, and the PGs' after `osd in`, are checked next (at most once a
    /// second: each check asks the monitor and connects to replicas).
    next_slot_check: Instant,
    next_out_check: Instant,
    /// The kinds of faults of this run ([`Settings::kinds`]).
    kinds: Vec<Kind>,
    /// The library's leg: [`Kind::BitRot`] damages blocks whose content its model knows.
    lib: Arc<Leg>,
    /// Block copies damaged by [`Kind::BitRot`].
    blocks_rotted: u64,
    /// Things that must not happen (a daemon exiting unasked, a failing disk that did not stop
    /// its OSD); the test fails on any.
    findings: Vec<String>,
    slow_recoveries: u64,
}

impl Nemesis {
    fn id(&self, osd: usize) -> OsdId {
        self.net.osds[osd].id
    }

    fn write_faults(&self, osd: usize, content: &str) {
        write_fault_file(&self.fault_files[osd], content);
    }

    /// The OSDs no fault involves now (candidates for a new one).
    fn free_osds(&self) -> Vec<usize> {
        let mut busy: Vec<usize> = Vec::new();
        match &self.slot {
            Some(Slot::Active { osds, .. } | Slot::Recovering { osds, .. }) => {
                busy.extend(osds);
            }
            Some(Slot::AwaitExit { osd, .. }) => busy.push(*osd),
            None => {}
        }
        if let Some((osd, _)) = self.slow {
            busy.push(osd);
        }
        if let Some(OutFault::Out { osd, .. }) = self.out {
            busy.push(osd);
        }
        (0..OSDS).filter(|i| !busy.contains(i)).collect()
    }

    fn can_start(&self, kind: Kind) -> bool {
        let free = self.free_osds().len();
        match kind {
            Kind::SlowDisk => self.slow.is_none() && free >= 1,
            Kind::KillMon => self.mon.is_none(),
            // Not while the slot is taken: an OSD moving its PGs while another is down is
            // allowed, but only one of them at a time starts.
            Kind::OutIn => self.out.is_none() && free >= 1,
            Kind::DropBothWays | Kind::DropOneWay => self.slot.is_none() && free >= 2,
            _ => self.slot.is_none() && free >= 1,
        }
    }

    /// Starts the next startable fault of the deck (a new shuffled deck when it runs out);
    /// whether one started.
    async fn start_next(&mut self) -> bool {
        if self.deck.is_empty() {
            self.deck = self.kinds.clone();
            let mut rng = self.rng.fork();
            rng.shuffle(&mut self.deck);
        }
        let Some(at) = self.deck.iter().position(|k| self.can_start(*k)) else {
            return false;
        };
        let kind = self.deck.remove(at);
        if self.start(kind).await {
            *self.counts.entry(kind).or_default() += 1;
            true
        } else {
            self.deck.push(kind);
            false
        }
    }

    async fn start(&mut self, kind: Kind) -> bool {
        let free = self.free_osds();
        // Unused by the kinds that need no OSD (`can_start` checked there is one otherwise).
        let osd = if free.is_empty() {
            0
        } else {
            self.rng.pick(&free)
        };
        let length = self.rng.millis(kind.length_ms());
        let until = Instant::now() + length;
        let mut osds = vec![osd];
        match kind {
            Kind::KillOsd => {
                let epoch = self.boot_epoch(osd).await;
                self.expected_down.push((osd, epoch));
                self.net.osds[osd].kill();
                say!("FAULT osd.{} SIGKILL, restart in {length:?}", self.id(osd));
            }
            Kind::Isolate => {
                self.net.net.isolate(osd);
                say!("FAULT osd.{} isolated for {length:?}", self.id(osd));
            }
            Kind::DropBothWays | Kind::DropOneWay => {
                let others: Vec<usize> = free.iter().copied().filter(|o| *o != osd).collect();
                let other = self.rng.pick(&others);
                osds.push(other);
                if kind == Kind::DropBothWays {
                    self.net.net.drop_between(osd, other);
                } else {
                    self.net.net.drop_one_way(osd, other);
                }
                say!(
                    "FAULT osd.{} and osd.{} cut {} for {length:?}",
                    self.id(osd),
                    self.id(other),
                    if kind == Kind::DropBothWays {
                        "both ways".to_string()
                    } else {
                        format!("(osd.{} deaf to osd.{})", self.id(other), self.id(osd))
                    }
                );
            }
            Kind::FailingDisk => {
                let epoch = self.boot_epoch(osd).await;
                self.expected_down.push((osd, epoch));
                self.write_faults(
                    osd,
                    r#"{"seed": 1, "rules": [{"op": "write", "kind": "eio"},
                        {"op": "sync", "kind": "eio"}]}"#,
                );
                say!(
                    "FAULT osd.{} disk fails writes and syncs (EIO)",
                    self.id(osd)
                );
                self.slot = Some(Slot::AwaitExit {
                    osd,
                    since: Instant::now(),
                });
                return true;
            }
            Kind::CorruptReads => {
                let data = &self.net.osds[osd].data;
                let start = common::data_file::data_offset(data);
                let end = std::fs::metadata(data).expect("the data file").len();
                let count = self.rng.between(8, 32);
                let seed = self.rng.next() % 1_000_000;
                self.write_faults(
                    osd,
                    &format!(
                        r#"{{"seed": {seed}, "rules": [{{"op": "read", "kind": "corrupt",
                            "range": [{start}, {end}], "probability": 0.2, "count": {count}}}]}}"#
                    ),
                );
                say!(
                    "FAULT osd.{} corrupts 20% of data reads (at most {count}) for {length:?}",
                    self.id(osd)
                );
            }
            Kind::BitRot => {
                let rotten = self.rot_blocks(osd).await;
                if rotten == 0 {
                    say!(
                        "no block of the workload found on osd.{}; not counted",
                        self.id(osd)
                    );
                    return false;
                }
                self.blocks_rotted += rotten;
                say!(
                    "FAULT osd.{}: {rotten} block copies rotten on disk (a byte flipped each)",
                    self.id(osd)
                );
            }
            Kind::SlowDisk => {
                let delay_ms = self.rng.between(20, 150);
                self.write_faults(
                    osd,
                    &format!(
                        r#"{{"seed": 1, "rules": [{{"op": "sync", "kind": {{"delay_ms": {delay_ms}}}}},
                            {{"op": "write", "kind": {{"delay_ms": {delay_ms}}}, "probability": 0.5}}]}}"#
                    ),
                );
                say!(
                    "FAULT osd.{} disk slow ({delay_ms} ms per sync) for {length:?}",
                    self.id(osd)
                );
                self.slow = Some((osd, until));
                return true;
            }
            Kind::KillMon => {
                let index = self.rng.below(MONS as u64) as usize;
                self.net.mons.kill(index);
                say!(
                    "FAULT mon.{} SIGKILL, restart in {length:?}",
                    self.net.mons.specs[index].name
                );
                self.mon = Some(MonFault::Down { index, until });
                return true;
            }
            Kind::OutIn => {
                let id = self.id(osd);
                if let Err(e) = self.client.osd_out(id).await {
                    say!("osd out {id} failed ({e}); not counted");
                    return false;
                }
                say!("FAULT osd.{id} out, in again in {length:?}");
                self.out = Some(OutFault::Out { osd, until });
                return true;
            }
        }
        self.slot = Some(Slot::Active { kind, osds, until });
        true
    }

    /// Flips a byte of the copies on `osd`'s disk of up to [`ROT_BLOCKS_MAX`] blocks of the
    /// library's image whose content the model knows for sure (their last write covered the
    /// whole block and was acknowledged), as bit rot would; how many it flipped. A copy found
    /// may have been replaced since: its space then holds another block or nothing, and the
    /// flip damages that or nothing (a bad copy either way, which checksums catch).
    async fn rot_blocks(&mut self, osd: usize) -> u64 {
        let mut candidates: Vec<Bytes> = Vec::new();
        {
            let model = self.lib.model.lock().unwrap();
            for _ in 0..4 * ROT_BLOCKS_MAX {
                let extent = self.rng.pick(&self.lib.extents);
                let first = extent + 8 * self.rng.below(EXTENT_SECTORS / 8);
                let Some(generation) = model.settled(first) else {
                    continue;
                };
                if (first..first + 8).any(|u| model.settled(u) != Some(generation)) {
                    continue;
                }
                let mut block = BytesMut::with_capacity(common::BLOCK as usize);
                for unit in first..first + 8 {
                    block.extend_from_slice(&model.content(unit, generation));
                }
                candidates.push(block.freeze());
            }
        }
        let path = self.net.osds[osd].data.clone();
        let found = tokio::task::spawn_blocking(move || {
            let blocks: Vec<&[u8]> = candidates.iter().map(|b| &b[..]).collect();
            common::data_file::find_blocks(&path, &blocks)
        })
        .await
        .expect("scanning a data file");
        let mut flipped = 0;
        for at in found.into_iter().flatten().take(ROT_BLOCKS_MAX) {
            let byte = at + self.rng.below(common::BLOCK);
            common::data_file::flip_byte(&self.net.osds[osd].data, byte);
            flipped += 1;
        }
        flipped
    }

    /// The boot epoch of `osd` by the monitor (0 if it does not answer).
    async fn boot_epoch(&self, osd: usize) -> Epoch {
        let id = self.id(osd);
        let list = self.client.osds().await.unwrap_or_default();
        list.iter()
            .find(|i| i.id == id)
            .map_or(Epoch(0), |i| i.boot_epoch)
    }

    /// Starts `osd` again (it was stopped by the test); the boot it must make.
    fn restart(&mut self, osd: usize) -> Vec<(usize, Epoch)> {
        self.net.osds[osd].start();
        let boots: Vec<(usize, Epoch)> = self
            .expected_down
            .iter()
            .filter(|(o, _)| *o == osd)
            .copied()
            .collect();
        self.expected_down.retain(|(o, _)| *o != osd);
        boots
    }

    /// Ends the slot's fault (its OSDs then recover).
    fn end_slot_fault(&mut self, kind: Kind, osds: &[usize]) {
        let ids: Vec<OsdId> = osds.iter().map(|o| self.id(*o)).collect();
        let mut boots = Vec::new();
        match kind {
            Kind::KillOsd => boots = self.restart(osds[0]),
            Kind::Isolate => self.net.net.heal(osds[0]),
            Kind::DropBothWays => self.net.net.heal_between(osds[0], osds[1]),
            Kind::DropOneWay => self.net.net.heal_one_way(osds[0], osds[1]),
            Kind::CorruptReads => self.write_faults(osds[0], ""),
            Kind::BitRot => {}
            other => unreachable!("{other:?} does not end this way"),
        }
        say!("END {} on {ids:?}", kind.name());
        self.slot = Some(Slot::Recovering {
            osds: osds.to_vec(),
            boots,
            since: Instant::now(),
        });
    }

    /// The OSD whose disk failed stopped (or never did): clears its faults and restarts it.
    fn restart_failed_disk(&mut self, osd: usize, exited: Option<std::process::ExitStatus>) {
        let id = self.id(osd);
        match exited {
            Some(status) if status.code() == Some(1) => {
                say!("END osd.{id} stopped by itself ({status}); restarting it without faults");
            }
            Some(status) => {
                let finding = format!(
                    "osd.{id} with a failing disk exited with {status}, not 1:\n{}",
                    exit_story(self.net.osds[osd].proc.as_ref())
                );
                say!("FINDING {finding}");
                self.findings.push(finding);
            }
            None => {
                let finding = format!(
                    "osd.{id} still ran {FAIL_EXIT_WAIT:?} after its disk began failing \
                     writes:\n{}",
                    exit_story(self.net.osds[osd].proc.as_ref())
                );
                say!("FINDING {finding}");
                self.findings.push(finding);
                self.net.osds[osd].kill();
            }
        }
        self.net.osds[osd].proc = None;
        self.write_faults(osd, "");
        let boots = self.restart(osd);
        self.slot = Some(Slot::Recovering {
            osds: vec![osd],
            boots,
            since: Instant::now(),
        });
    }

    /// Whether `osds` are up (those in `boots` booted since), every PG is active (and, with
    /// `settled`, no PG has a target membership left), by the monitor, and the replicas on
    /// `osds` caught up with their leaders; false when something does not answer.
    async fn recovered(&self, osds: &[usize], boots: &[(usize, Epoch)], settled: bool) -> bool {
        let Ok(list) = self.client.osds().await else {
            return false;
        };
        let up = osds.iter().all(|o| {
            let booted_after = boots.iter().find(|(b, _)| b == o).map(|(_, e)| *e);
            list.iter().any(|i| {
                i.id == self.id(*o) && i.up && booted_after.is_none_or(|e| i.boot_epoch > e)
            })
        });
        if !up {
            return false;
        }
        let Ok(Some(map)) = self.client.map().await.map(|m| m.map) else {
            return false;
        };
        let active = all_pgs(&map)
            .all(|(_, i)| i.state.is_active() && (!settled || i.newosdlist.is_empty()));
        if !active {
            return false;
        }
        let ids: Vec<OsdId> = osds.iter().map(|o| self.id(*o)).collect();
        caught_up(&map, &ids).await
    }

    /// Ends what is due, follows recoveries, and restarts daemons that exited unasked.
    async fn advance(&mut self) {
        self.reap_unexpected_exits();
        let now = Instant::now();
        match self.slot.take() {
            Some(Slot::Active { kind, osds, until }) if now >= until => {
                self.end_slot_fault(kind, &osds);
            }
            Some(Slot::AwaitExit { osd, since }) => {
                let exited = self.net.osds[osd]
                    .proc
                    .as_mut()
                    .and_then(|p| p.wait_exit(Duration::ZERO));
                if exited.is_some() || since.elapsed() > FAIL_EXIT_WAIT {
                    self.restart_failed_disk(osd, exited);
                } else {
                    self.slot = Some(Slot::AwaitExit { osd, since });
                }
            }
            Some(Slot::Recovering { osds, boots, since }) => {
                let ids: Vec<OsdId> = osds.iter().map(|o| self.id(*o)).collect();
                if !due(&mut self.next_slot_check) {
                    self.slot = Some(Slot::Recovering { osds, boots, since });
                } else if self.recovered(&osds, &boots, false).await {
                    say!("RECOVERED {ids:?} after {:?}", since.elapsed());
                } else if since.elapsed() > RECOVER_WAIT {
                    self.slow_recoveries += 1;
                    say!(
                        "SLOW RECOVERY: {ids:?} not back and caught up, with every PG active, \
                         after {RECOVER_WAIT:?}"
                    );
                } else {
                    self.slot = Some(Slot::Recovering { osds, boots, since });
                }
            }
            other => self.slot = other,
        }
        if let Some((osd, until)) = self.slow {
            if now >= until {
                self.write_faults(osd, "");
                say!("END slow disk of osd.{}", self.id(osd));
                self.slow = None;
            }
        }
        match self.mon.take() {
            Some(MonFault::Down { index, until }) if now >= until => {
                self.net.mons.restart(index);
                say!("END mon.{} restarted", self.net.mons.specs[index].name);
                self.mon = Some(MonFault::Rejoining {
                    index,
                    since: Instant::now(),
                });
            }
            Some(MonFault::Rejoining { index, since }) => {
                if mon_sees_leader(&self.net.mons.specs[index].api).await {
                    say!(
                        "RECOVERED mon.{} after {:?}",
                        self.net.mons.specs[index].name,
                        since.elapsed()
                    );
                } else if since.elapsed() > RECOVER_WAIT {
                    self.slow_recoveries += 1;
                    say!(
                        "SLOW RECOVERY: mon.{} sees no leader after {RECOVER_WAIT:?}",
                        self.net.mons.specs[index].name
                    );
                } else {
                    self.mon = Some(MonFault::Rejoining { index, since });
                }
            }
            other => self.mon = other,
        }
        match self.out.take() {
            Some(OutFault::Out { osd, until }) if now >= until => {
                let id = self.id(osd);
                match self.client.osd_in(id).await {
                    Ok(_) => {
                        say!("END osd.{id} in");
                        self.out = Some(OutFault::Settling {
                            since: Instant::now(),
                        });
                    }
                    Err(e) => {
                        say!("osd in {id} failed ({e}); trying again");
                        self.out = Some(OutFault::Out { osd, until });
                    }
                }
            }
            Some(OutFault::Settling { since }) => {
                if !due(&mut self.next_out_check) {
                    self.out = Some(OutFault::Settling { since });
                } else if self.recovered(&[], &[], true).await {
                    say!("RECOVERED PGs settled after osd in, {:?}", since.elapsed());
                } else if since.elapsed() > RECOVER_WAIT {
                    self.slow_recoveries += 1;
                    say!("SLOW RECOVERY: PGs not settled {RECOVER_WAIT:?} after osd in");
                } else {
                    self.out = Some(OutFault::Settling { since });
                }
            }
            other => self.out = other,
        }
    }

    /// Daemons that exited without the test asking: findings; they are started again so that
    /// the run goes on (and shows whether they crash again).
    fn reap_unexpected_exits(&mut self) {
        for osd in 0..OSDS {
            let expected = self.expected_down.iter().any(|(o, _)| *o == osd);
            if expected || self.net.osds[osd].is_running() {
                continue;
            }
            let id = self.id(osd);
            let status = self.net.osds[osd]
                .proc
                .as_mut()
                .and_then(|p| p.wait_exit(Duration::ZERO));
            let finding = format!(
                "osd.{id} exited unasked ({status:?}):\n{}",
                exit_story(self.net.osds[osd].proc.as_ref())
            );
            say!("FINDING {finding}");
            self.findings.push(finding);
            self.net.osds[osd].proc = None;
            self.net.osds[osd].start();
        }
        for index in 0..MONS {
            let Some(proc) = self.net.mons.procs[index].as_mut() else {
                continue;
            };
            if let Some(status) = proc.wait_exit(Duration::ZERO) {
                let finding = format!(
                    "mon.{} exited unasked ({status}):\n{}",
                    self.net.mons.specs[index].name,
                    exit_story(Some(proc))
                );
                say!("FINDING {finding}");
                self.findings.push(finding);
                self.net.mons.restart(index);
            }
        }
    }

    /// Injects faults until `until`.
    async fn run(&mut self, until: Instant) {
        let mut next_fault = Instant::now() + self.rng.millis(FAULT_GAP_MS);
        while Instant::now() < until {
            self.advance().await;
            if Instant::now() >= next_fault {
                next_fault = if self.start_next().await {
                    Instant::now() + self.rng.millis(FAULT_GAP_MS)
                } else {
                    // Everything startable is busy: try again soon.
                    Instant::now() + Duration::from_millis(500)
                };
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Ends every fault now: heals, clears the fault files, restarts what is down, puts the
    /// out OSD back in (a failing disk's OSD is given its time to stop first).
    async fn heal_all(&mut self) {
        match self.slot.take() {
            Some(Slot::Active { kind, osds, .. }) => self.end_slot_fault(kind, &osds),
            Some(Slot::AwaitExit { osd, since }) => {
                let left = FAIL_EXIT_WAIT.saturating_sub(since.elapsed());
                let exited = self.net.osds[osd]
                    .proc
                    .as_mut()
                    .and_then(|p| p.wait_exit(left));
                self.restart_failed_disk(osd, exited);
            }
            other => self.slot = other,
        }
        if let Some((osd, _)) = self.slow.take() {
            self.write_faults(osd, "");
        }
        if let Some(MonFault::Down { index, .. }) = self.mon.take() {
            self.net.mons.restart(index);
        }
        if let Some(OutFault::Out { osd, .. }) = self.out.take() {
            let id = self.id(osd);
            let client = &self.client;
            wait_until(CONVERGE_WAIT, "osd in accepted", || async move {
                client.osd_in(id).await.ok()
            })
            .await;
        }
        self.reap_unexpected_exits();
        say!("HEALED everything");
    }
}

/// Whether `next` has come; if so, it moves a second on.
fn due(next: &mut Instant) -> bool {
    let now = Instant::now();
    if now < *next {
        return false;
    }
    *next = now + Duration::from_secs(1);
    true
}

/// What the log of a daemon that stopped says about why: its panic (the line and the three
/// after it) and its last error lines, or else its last lines; and where the log is.
fn exit_story(proc: Option<&Proc>) -> String {
    let Some(proc) = proc else {
        return "(no process)".to_string();
    };
    let text = std::fs::read_to_string(&proc.log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let mut story: Vec<&str> = Vec::new();
    if let Some(at) = lines.iter().position(|l| l.contains("panicked at")) {
        story.extend(&lines[at..(at + 4).min(lines.len())]);
    }
    let errors: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.contains("ERROR"))
        .collect();
    story.extend(&errors[errors.len().saturating_sub(5)..]);
    if story.is_empty() {
        story.extend(&lines[lines.len().saturating_sub(20)..]);
    }
    format!("{}\n(log: {})", story.join("\n"), proc.log.display())
}

/// How many log entries a replica may trail its PG's leader and still count as caught up (IO
/// goes on while they are compared; the leader is asked first).
const CATCH_UP_SLACK: u64 = 64;

/// Limit of the connection to a replica, and of its answer, when asking how far it got: the
/// fault driver must not stall on an OSD that is still starting.
const DIGEST_WAIT: Duration = Duration::from_secs(2);

/// Whether every replica on `osds` of every PG of `map` is within [`CATCH_UP_SLACK`] of its
/// leader's applied index (`Request::ReplicaDigest`).
async fn caught_up(map: &ClusterMap, osds: &[OsdId]) -> bool {
    for (pg, info) in all_pgs(map) {
        let mine: Vec<OsdId> = info
            .osdlist
            .iter()
            .copied()
            .filter(|o| osds.contains(o))
            .collect();
        if mine.is_empty() {
            continue;
        }
        let Some(leader) = info.leader else {
            return false;
        };
        let Some(lead) = applied(map, leader, pg).await else {
            return false;
        };
        for osd in mine {
            match applied(map, osd, pg).await {
                Some(at) if at + CATCH_UP_SLACK >= lead => {}
                _ => return false,
            }
        }
    }
    true
}

/// The applied index of `pg`'s replica on `osd` (`None`: it does not answer within
/// [`DIGEST_WAIT`], or answers something else).
async fn applied(map: &ClusterMap, osd: OsdId, pg: PgId) -> Option<u64> {
    let o = map.osds.get(&osd)?;
    let addr = format!("{}:{}", o.address, o.port_for(pg));
    let mut conn = tokio::time::timeout(DIGEST_WAIT, WireConn::try_connect(&addr))
        .await
        .ok()?
        .ok()?;
    match conn
        .try_call(&Request::ReplicaDigest { pg }, DIGEST_WAIT)
        .await
    {
        Ok(Reply::Digest { applied_index, .. }) => Some(applied_index),
        _ => None,
    }
}

/// Whether the monitor at `api` sees a leader (itself or another): its etcd member works.
async fn mon_sees_leader(api: &str) -> bool {
    let url = format!("http://{api}/v1/mon");
    match tokio::time::timeout(Duration::from_secs(1), common::http_get(&url)).await {
        Ok(Ok(body)) => {
            body.contains("\"role\":\"leader\"")
                || (body.contains("\"role\":\"follower\"") && body.contains("\"leader\":{"))
        }
        _ => false,
    }
}

// ---------------------------------------------------------------------------------------------
// The end: convergence, final reads, deep scrub.

/// Reads every extent of a leg back whole and checks it (through `target`); every read must
/// succeed.
async fn read_back(target: &mut Target, leg: &Leg, what: &str) {
    for &extent in &leg.extents {
        let ok = read_and_check(target, leg, extent, EXTENT_SECTORS, what).await;
        assert!(ok, "{what}: the read of extent {extent} failed");
    }
}

/// What the deep scrub of every PG found.
struct ScrubSummary {
    pgs: usize,
    inconsistent_blocks: u64,
    repaired_blocks: u64,
}

/// Asks a deep scrub of every PG through the CLI, waits until each PG's leader reports it
/// done and nothing is left inconsistent, and checks that health raises no `PG_INCONSISTENT`.
async fn deep_scrub_all(net: &NetCluster, client: &MonClient) -> ScrubSummary {
    let map = client.map().await.unwrap().map.expect("a map");
    let mut requests: BTreeMap<String, u64> = BTreeMap::new();
    for (pg, _) in all_pgs(&map) {
        let pg = pg.to_string();
        let out =
            tokio::task::block_in_place(|| net.mons.cli(&["--json", "pg", "deep-scrub", &pg]));
        let id = out.json()["id"].as_u64().expect("a scrub request id");
        requests.insert(pg, id);
    }
    let rows = wait_until(
        CONVERGE_WAIT,
        "every PG deep-scrubbed and repaired",
        || async {
            let list: serde_json::Value = client.pgs_as(None).await.ok()?;
            let rows = list["pgs"].as_array()?.clone();
            let done = rows.iter().all(|r| {
                let pg = format!("{}.{}", r["pgid"]["pool"], r["pgid"]["seq"]);
                let report = &r["scrub"]["report"];
                report["request_done"].as_u64() >= requests.get(&pg).copied()
                    && r["scrub"]["inconsistent_blocks_left"] == 0
            });
            (done && rows.len() == requests.len()).then_some(rows)
        },
    )
    .await;
    let health = format!("{:?}", client.health().await.expect("health"));
    assert!(
        !health.contains("PG_INCONSISTENT"),
        "health after the deep scrubs: {health}"
    );
    let sum = |field: &str| -> u64 {
        rows.iter()
            .map(|r| r["scrub"]["report"][field].as_u64().unwrap_or(0))
            .sum()
    };
    ScrubSummary {
        pgs: rows.len(),
        inconsistent_blocks: sum("inconsistent_blocks"),
        repaired_blocks: sum("repaired_blocks"),
    }
}

// ---------------------------------------------------------------------------------------------
// The run.

/// Starts `fastblock-nbd serve` in the root namespace for the cluster; its address.
async fn start_nbd(net: &NetCluster, dir: &TempDir) -> (Proc, SocketAddr) {
    // The NBD port, and the next for its default `/metrics`.
    let addr: SocketAddr = format!("127.0.0.1:{}", free_ports(2)).parse().unwrap();
    let mut cmd = Command::new(bin("fastblock-nbd"));
    cmd.arg("serve")
        .args(["--mon", &net.mons.endpoints().join(",")])
        .args(["--bind", &addr.to_string()])
        .env(
            "FASTBLOCK_KEYRING",
            net.mons.nbd_keyring(dir.path(), "pool=*"),
        )
        .env("FASTBLOCK_RUN_DIR", dir.path().join("run"))
        .env("RUST_LOG", "info");
    let nbd = Proc::spawn("fastblock-nbd", cmd, dir.path().join("nbd.log"));
    wait_until(
        Duration::from_secs(20),
        "the NBD server listening",
        || async { accepts(addr).await.then_some(()) },
    )
    .await;
    (nbd, addr)
}

fn leg_line(leg: &Leg) -> String {
    let s = &leg.stats;
    let model = leg.model.lock().unwrap();
    format!(
        "{}: {} writes acknowledged, {} failed; {} reads checked, {} failed; {} sectors \
         checked; {} violations",
        leg.name,
        s.writes_acked.load(Ordering::Relaxed),
        s.writes_failed.load(Ordering::Relaxed),
        s.reads_ok.load(Ordering::Relaxed),
        s.reads_failed.load(Ordering::Relaxed),
        model.reads_checked,
        model.violations.len()
    )
}

/// Goal: under IO checked against a model, any sequence of the faults the design claims to
/// survive (one OSD unavailable at a time, plus a slow disk, an out OSD and a dead monitor)
/// loses no acknowledged write, serves no stale read, crashes no daemon, and ends with every
/// PG converged, identical and consistent under a deep scrub.
/// Method: see the module documentation; `FASTBLOCK_CHAOS_SECS` and `FASTBLOCK_CHAOS_SEED`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_run() {
    let settings = Settings::from_env();
    say!(
        "chaos: seed {} for {:?} (replay: FASTBLOCK_CHAOS_SEED={} FASTBLOCK_CHAOS_SECS={}{})",
        settings.seed,
        settings.duration,
        settings.seed,
        settings.duration.as_secs(),
        match std::env::var("FASTBLOCK_CHAOS_KINDS") {
            Ok(kinds) => format!(" FASTBLOCK_CHAOS_KINDS={kinds}"),
            Err(_) => String::new(),
        }
    );
    let mut rng = Prng(settings.seed);
    let files = TempDir::new("chaos");
    let fault_files: Vec<PathBuf> = (0..OSDS)
        .map(|i| files.path().join(format!("faults-{i}.json")))
        .collect();
    let options = MonOptions {
        osd_down_after: "2s",
        // OSDs leave only when the test says so (`osd out`): a fault of a few seconds is not an
        // OSD leaving, and an automatic out on top of the test's would leave fewer than three.
        osd_out_after: "600s",
        ..MonOptions::default()
    };
    let net = {
        let files = fault_files.clone();
        NetCluster::start_with(OSDS, MONS, options, "256M", move |i, osd| {
            use_fault_file(osd, &files[i])
        })
        .await
    };
    let client = net.mons.client();
    common::pool_with_image(
        &client,
        ("fb", PG_COUNT, 3),
        ("img", IMAGE_BYTES, OBJECT_BYTES),
    )
    .await;
    client
        .create_image(&CreateImageRequest {
            pool: "fb".into(),
            name: "nbd".into(),
            size_bytes: NBD_IMAGE_BYTES,
            object_size_bytes: Some(OBJECT_BYTES),
        })
        .await
        .unwrap();
    let mut config = net.mons.client_config();
    config.op_deadline = OP_DEADLINE;
    // A request sent to an OSD just cut off gets no answer at all: the client gives up on
    // that attempt (and asks the others) after 2 s, not the default 10 s.
    config.attempt_timeout = Duration::from_secs(2);
    let cluster = Cluster::connect(config).await.unwrap();
    let image = Arc::new(cluster.open_image("fb", "img").await.unwrap());
    let nbd_image = cluster.open_image("fb", "nbd").await.unwrap();
    let (mut nbd_server, nbd_addr) = start_nbd(&net, &files).await;
    let lib = Arc::new(Leg::new("library", IMAGE_BYTES));
    let nbd = Arc::new(Leg::new("nbd", NBD_IMAGE_BYTES));
    say!(
        "cluster up: {OSDS} OSDs, {MONS} monitors, {PG_COUNT} PGs; {} + {} extents of {} KiB",
        lib.extents.len(),
        nbd.extents.len(),
        EXTENT_SECTORS * SECTOR / 1024
    );
    say!(
        "logs: OSDs in {}, monitors in {}, NBD and fault files in {} (kept with \
         FASTBLOCK_KEEP_TEST_DIRS=1); OSD ids by namespace {:?}",
        net.dir.path().display(),
        net.mons.dir.path().display(),
        files.path().display(),
        net.osds.iter().map(|o| o.id).collect::<Vec<_>>()
    );

    let workload = Workload::start(&image, (&lib, &nbd), nbd_addr, &mut rng);
    let quiet_client = net
        .mons
        .signed(MonClient::new(net.mons.endpoints()).with_deadline(MON_CALL_DEADLINE));
    let mut nemesis = Nemesis {
        net,
        client: quiet_client,
        fault_files,
        rng: rng.fork(),
        deck: Vec::new(),
        slot: None,
        slow: None,
        mon: None,
        out: None,
        expected_down: Vec::new(),
        counts: BTreeMap::new(),
        next_slot_check: Instant::now(),
        next_out_check: Instant::now(),
        kinds: settings.kinds.clone(),
        lib: lib.clone(),
        blocks_rotted: 0,
        findings: Vec::new(),
        slow_recoveries: 0,
    };
    let started = Instant::now();
    nemesis.run(started + settings.duration).await;
    let chaos_took = started.elapsed();
    nemesis.heal_all().await;

    // IO goes on a little over the healed cluster, then stops.
    tokio::time::sleep(Duration::from_secs(3)).await;
    workload.stop().await;
    let ids: Vec<OsdId> = nemesis.net.osds.iter().map(|o| o.id).collect();
    let healed = Instant::now();
    wait_osds_up(&client, &ids, CONVERGE_WAIT).await;
    common::wait_replicas_identical(&client, CONVERGE_WAIT).await;
    let converged = healed.elapsed();
    say!("every PG active with identical replicas {converged:?} after the heal");

    read_back(&mut Target::Library(image.clone()), &lib, "final read").await;
    read_back(
        &mut Target::Library(Arc::new(nbd_image)),
        &nbd,
        "final read (library)",
    )
    .await;
    read_back(
        &mut Target::Nbd(NbdConn::new(nbd_addr, "fb/nbd")),
        &nbd,
        "final read (NBD)",
    )
    .await;
    let scrub = deep_scrub_all(&nemesis.net, &client).await;
    nemesis.reap_unexpected_exits();
    assert!(
        nbd_server.wait_exit(Duration::ZERO).is_none(),
        "fastblock-nbd exited:\n{}",
        nbd_server.log_tail()
    );

    let faults: u64 = nemesis.counts.values().sum();
    eprintln!("===== chaos summary (seed {}) =====", settings.seed);
    eprintln!("duration: {chaos_took:?} of faults; converged {converged:?} after the heal");
    eprintln!("faults injected: {faults}");
    for kind in KINDS {
        if !nemesis.kinds.contains(&kind) {
            eprintln!("  {:<32} (not in FASTBLOCK_CHAOS_KINDS)", kind.name());
            continue;
        }
        eprintln!(
            "  {:<32} {}",
            kind.name(),
            nemesis.counts.get(&kind).copied().unwrap_or(0)
        );
    }
    let logs: String = nemesis.net.osds.iter().map(|o| o.all_logs()).collect();
    eprintln!(
        "block copies rotten on disk: {}; OSD logs: {} bad block copies found, {} repaired",
        nemesis.blocks_rotted,
        logs.matches("bad block copy found").count(),
        logs.matches("bad block repaired").count()
    );
    eprintln!(
        "slow recoveries (> {RECOVER_WAIT:?}): {}",
        nemesis.slow_recoveries
    );
    eprintln!("{}", leg_line(&lib));
    eprintln!("{}", leg_line(&nbd));
    eprintln!(
        "deep scrub of {} PGs: {} blocks inconsistent, {} repaired",
        scrub.pgs, scrub.inconsistent_blocks, scrub.repaired_blocks
    );
    eprintln!("findings: {}", nemesis.findings.len());
    eprintln!("===== seed {} =====", settings.seed);

    for leg in [&lib, &nbd] {
        let model = leg.model.lock().unwrap();
        assert!(
            model.violations.is_empty(),
            "seed {}: {} reads of {} broke the model:\n{}",
            settings.seed,
            model.violations.len(),
            leg.name,
            model.violations.join("\n")
        );
        assert!(
            leg.stats.writes_acked.load(Ordering::Relaxed) > 0 && model.reads_checked > 0,
            "seed {}: no IO on {}",
            settings.seed,
            leg.name
        );
    }
    assert!(
        nemesis.findings.is_empty(),
        "seed {}: {}",
        settings.seed,
        nemesis.findings.join("\n----\n")
    );
    assert!(
        faults > 0 || settings.duration < Duration::from_secs(10),
        "seed {}: no fault injected",
        settings.seed
    );
}

/// The checker at sector granularity: unaligned writes are checked sector by sector, a
/// sector older than the floor is stale, and the 4 KiB model stays what it was.
#[test]
fn the_model_checks_sectors_of_unaligned_writes() {
    let mut m = Model::new(SECTOR);
    for unit in 3..6 {
        m.issue(unit, 1);
        m.complete(unit, 1, Outcome::Acked);
    }
    m.issue(4, 2);
    let floors: Vec<Floor> = (3..6).map(|u| m.floor(u)).collect();
    let mut got = Vec::new();
    for (unit, generation) in [(3, 1), (4, 2), (5, 1)] {
        got.extend_from_slice(&m.content(unit, generation));
    }
    for (i, floor) in floors.iter().enumerate() {
        let bytes = &got[i * SECTOR as usize..(i + 1) * SECTOR as usize];
        m.check(3 + i as u64, *floor, bytes, "allowed");
    }
    assert!(m.violations.is_empty(), "{:?}", m.violations);
    m.complete(4, 2, Outcome::Acked);
    let floor = m.floor(4);
    m.check(4, floor, &m.content(4, 1), "older than the floor");
    m.check(4, floor, &m.content(5, 2), "another sector's data");
    assert_eq!(m.violations.len(), 2, "{:?}", m.violations);
    assert_eq!(m.stale_reads(), 1, "{:?}", m.violations);
    assert_eq!(
        &Model::default().content(7, 3)[..],
        &common::stamped_block(7 * common::BLOCK, 3)[..]
    );
}

//! fastblock-sim (test only): a deterministic simulator of a whole cluster in one thread, after
//! TigerBeetle's VOPR and FoundationDB's simulation. Design page: `docs/design/simulator.md`.
//!
//! What runs is the real code: each simulated OSD is the real shard core
//! ([`fastblock_shard::ShardCore`], the code the OSD daemon runs: admission, WAL group
//! commit, apply, flush and compaction, hosting, snapshot transfer) with the real
//! [`fastblock_pg::PgReplica`] of each PG it hosts over one real [`fastblock_store::Store`] on
//! the store's simulated disk; placement and PG leader bookkeeping are the monitor's real
//! [`fastblock_mon_core::MonState`]. What is simulated is everything around it: virtual time,
//! the network, the disks' faults, the clients, and the runtime that steps the core (the
//! adapter in [`node`] and [`cluster`]).
//!
//! Module map:
//! - [`options`]: a run's configuration, drawn from its seed (swarm testing).
//! - [`cluster`]: the world: event queue, network, faults, clients, phases; carries out what
//!   the cores produce.
//! - [`node`]: one OSD: its disks, incarnation and shard core.
//! - [`flush`]: the flush runner that lets a flush finish at a moment the simulator picks.
//! - [`disk`]: crash points, slow commits and bad blocks on top of the simulated disk.
//! - [`model`]: stamped blocks and the image model that checks every read.
//! - [`checker`]: Raft safety asserted along the way.
//! - [`probes`]: coverage counters of rare paths.
//! - [`scenario`]: step-by-step scenario tests over the same cluster.
//!
//! Determinism: one [`fastblock_types::rng::SplitMix64`] seeded from the run's seed drives
//! every choice; the PG replicas and the disk crashes get their seeds from it; collections
//! that are iterated are `BTreeMap`s; there is no clock and no thread (the cores read virtual
//! time). The same seed gives the same run, event for event ([`RunSummary::fingerprint`]).
//!
//! Entry points: [`run_seed`] (one seed, panics caught and reported; [`run_seed_profile`]
//! with optional faults: OSDs going out and in, data blocks going bad), the `vopr` binary
//! (`scripts/sim.sh`) and the CI test `tests/seeds.rs`.

pub mod checker;
pub mod cluster;
pub mod disk;
pub mod flush;
pub mod model;
pub mod node;
pub mod options;
pub mod probes;
pub mod scenario;

pub use cluster::{Cluster, RunSummary};
pub use options::SimOptions;
pub use probes::Probes;

use std::cell::{Cell, RefCell};
use std::panic::{self, AssertUnwindSafe};
use std::sync::Once;

thread_local! {
    static VIRTUAL_TIME: Cell<u64> = const { Cell::new(0) };
    static PANIC_MESSAGE: RefCell<Option<String>> = const { RefCell::new(None) };
    static CAPTURE_PANICS: Cell<bool> = const { Cell::new(false) };
    static LAST_PROBES: RefCell<Probes> = RefCell::new(Probes::default());
}

/// Keeps the probes of a cluster being dropped (at the end of a run, or unwound by a panic),
/// so that a failed run still reports what it reached.
pub(crate) fn keep_probes(probes: Probes) {
    LAST_PROBES.with(|p| *p.borrow_mut() = probes);
}

/// Records the virtual time of the current event, for failure reports.
pub(crate) fn set_virtual_time(us: u64) {
    VIRTUAL_TIME.with(|t| t.set(us));
}

/// Failures the simulator found whose fix belongs to code it does not own and has not landed
/// yet: (what the message contains, the diagnosis). The CI budget reports a seed that fails
/// this way as a known open bug instead of failing; any other failure fails it. Each entry
/// is in the "Open" table of `docs/design/simulator.md`.
pub const KNOWN_OPEN: &[(&str, &str)] = &[];

/// The known open bug a failure message matches, if any.
pub fn known_open(message: &str) -> Option<&'static str> {
    KNOWN_OPEN
        .iter()
        .find(|(needle, _)| message.contains(needle))
        .map(|(_, why)| *why)
}

/// Forgets a panic the simulator handled itself (a node that fail-stopped).
pub(crate) fn take_panic_message() -> Option<String> {
    PANIC_MESSAGE.with(|m| m.borrow_mut().take())
}

/// A failed run: everything needed to reproduce and read it.
#[derive(Clone, Debug)]
pub struct SimFailure {
    pub seed: u64,
    pub virtual_us: u64,
    pub message: String,
    pub options: Box<SimOptions>,
    /// The optional faults it ran with (replay with the same flags).
    pub profile: Profile,
    /// The coverage probes the run reached before it failed.
    pub probes: Probes,
}

impl SimFailure {
    /// The report, seed and replay command first.
    pub fn report(&self) -> String {
        let flag = self.profile.flags();
        let known = known_open(&self.message)
            .map(|why| format!("known open bug: {why}\n"))
            .unwrap_or_default();
        format!(
            "SIM FAILED seed={seed}\n{known}\
             replay: scripts/sim.sh --seed {seed}{flag}   (or: cargo run -p fastblock-sim --bin vopr -- --seed {seed}{flag} --trace)\n\
             at virtual time {t:.6} s: {msg}\n\
             options: {opts:#?}",
            seed = self.seed,
            t = self.virtual_us as f64 / 1e6,
            msg = self.message,
            opts = self.options,
        )
    }
}

fn install_panic_hook() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let default = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if CAPTURE_PANICS.with(Cell::get) {
                let msg = match info.payload().downcast_ref::<&str>() {
                    Some(s) => (*s).to_string(),
                    None => info
                        .payload()
                        .downcast_ref::<String>()
                        .cloned()
                        .unwrap_or_else(|| "panic".into()),
                };
                let at = info
                    .location()
                    .map(|l| format!(" at {}:{}", l.file(), l.line()))
                    .unwrap_or_default();
                PANIC_MESSAGE.with(|m| *m.borrow_mut() = Some(format!("panic: {msg}{at}")));
            } else {
                default(info);
            }
        }));
    });
}

/// Runs one seed to the end. Panics inside the simulated code (an assertion of raft-rs, the PG
/// core, the store or the simulator) are caught and reported as failures of this seed.
pub fn run_seed(seed: u64, trace: bool) -> Result<RunSummary, SimFailure> {
    run_options(SimOptions::from_seed(seed), trace)
}

/// [`run_seed`] with OSDs going out and in ([`SimOptions::with_membership`]).
pub fn run_seed_membership(seed: u64, trace: bool) -> Result<RunSummary, SimFailure> {
    run_seed_profile(seed, trace, Profile::MEMBERSHIP)
}

/// Which optional faults a run draws (each seed then enables them or not, at its rates).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Profile {
    /// OSDs going out and in ([`SimOptions::with_membership`]).
    pub membership: bool,
    /// Data blocks going bad ([`SimOptions::with_bad_blocks`]).
    pub bad_blocks: bool,
}

impl Profile {
    pub const NONE: Profile = Profile {
        membership: false,
        bad_blocks: false,
    };
    pub const MEMBERSHIP: Profile = Profile {
        membership: true,
        bad_blocks: false,
    };
    pub const MEMBERSHIP_BAD_BLOCKS: Profile = Profile {
        membership: true,
        bad_blocks: true,
    };

    /// The `vopr` flags that select it, each after a space.
    pub fn flags(self) -> &'static str {
        match (self.membership, self.bad_blocks) {
            (false, false) => "",
            (true, false) => " --membership",
            (false, true) => " --bad-blocks",
            (true, true) => " --membership --bad-blocks",
        }
    }
}

/// [`run_seed`] with the optional faults of `profile`.
pub fn run_seed_profile(
    seed: u64,
    trace: bool,
    profile: Profile,
) -> Result<RunSummary, SimFailure> {
    let mut o = if profile.membership {
        SimOptions::with_membership(seed)
    } else {
        SimOptions::from_seed(seed)
    };
    if profile.bad_blocks {
        o = o.with_bad_blocks();
    }
    let mut failure = run_options(o, trace);
    if let Err(f) = &mut failure {
        f.profile = profile;
    }
    failure
}

/// Stamps the shard cores' log lines (`--trace`) with the virtual time of the event.
struct VirtualClock;

impl tracing_subscriber::fmt::time::FormatTime for VirtualClock {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        write!(w, "[{:>12}]", VIRTUAL_TIME.with(Cell::get))
    }
}

/// Runs one configuration (tests adjust the options of a seed). With `trace`, every event
/// and the shard cores' log lines (debug level) go to stderr.
pub fn run_options(options: SimOptions, trace: bool) -> Result<RunSummary, SimFailure> {
    install_panic_hook();
    set_virtual_time(0);
    keep_probes(Probes::default());
    let _trace = trace.then(|| {
        let subscriber = tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_timer(VirtualClock)
            .with_ansi(false)
            .with_max_level(tracing::Level::DEBUG)
            .finish();
        tracing::subscriber::set_default(subscriber)
    });
    CAPTURE_PANICS.with(|c| c.set(true));
    let o = options.clone();
    let result = panic::catch_unwind(AssertUnwindSafe(|| {
        Cluster::new(o, trace).and_then(Cluster::run)
    }));
    CAPTURE_PANICS.with(|c| c.set(false));
    let failure = |message: String| SimFailure {
        seed: options.seed,
        virtual_us: VIRTUAL_TIME.with(Cell::get),
        message,
        options: Box::new(options.clone()),
        profile: Profile::default(),
        probes: LAST_PROBES.with(|p| std::mem::take(&mut *p.borrow_mut())),
    };
    match result {
        Ok(Ok(summary)) => Ok(summary),
        Ok(Err(message)) => Err(failure(message)),
        Err(_) => {
            let message = PANIC_MESSAGE
                .with(|m| m.borrow_mut().take())
                .unwrap_or_else(|| "panic".into());
            Err(failure(message))
        }
    }
}

/// The seeds of a fixed-budget run: `count` seeds derived from `base`, so CI is reproducible.
pub fn seeds_from(base: u64, count: u64) -> impl Iterator<Item = u64> {
    let mut r = fastblock_types::rng::SplitMix64::new(base);
    (0..count).map(move |_| r.next_u64())
}

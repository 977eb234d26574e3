//! CI's simulator budget: a fixed list of seeds (derived from a fixed base, so every CI run
//! checks the same seeds and a failure reproduces), split over two tests so both cores of a CI
//! machine work. A failing seed is printed first as `SIM FAILED seed=<seed>` with its replay
//! command (`scripts/sim.sh --seed <seed>`).
//!
//! Environment: `SIM_SEED=<seed>` runs that one seed; `SIM_SEEDS=<n>` changes the budget
//! (each of the two tests runs half). Overnight runs use `scripts/sim.sh --seeds N --random`.

use fastblock_sim::{
    known_open, run_seed, run_seed_membership, seeds_from, Probes, RunSummary, SimFailure,
};

/// The base every CI run derives its seeds from.
const CI_BASE: u64 = 0xFA57_B10C_51A0_0001;
/// Seeds per CI run (both halves together). Measured: about 0.15 s of CPU per seed with the
/// workspace's dev profile (sim, store, pg, raft, redb, protobuf at opt-level 2), so this
/// budget is well under a minute per core on an idle machine (measured: 600 seeds took 160 s of
/// CPU in all, 320 s of wall time on two cores busy with other builds).
const CI_SEEDS: u64 = 400;

fn budget(default: u64) -> Vec<u64> {
    if let Ok(seed) = std::env::var("SIM_SEED") {
        let seed = seed.trim().parse().expect("SIM_SEED is a u64");
        return vec![seed];
    }
    let n = std::env::var("SIM_SEEDS")
        .ok()
        .map(|v| v.trim().parse().expect("SIM_SEEDS is a number"))
        .unwrap_or(default);
    seeds_from(CI_BASE, n).collect()
}

type Runner = fn(u64, bool) -> Result<RunSummary, SimFailure>;

/// Runs every `part`-th seed of the budget (of `parts`); fails with the failing seeds first.
fn run_part(run: Runner, default_seeds: u64, part: usize, parts: usize) {
    let seeds: Vec<u64> = budget(default_seeds)
        .into_iter()
        .enumerate()
        .filter(|(i, _)| i % parts == part)
        .map(|(_, s)| s)
        .collect();
    let mut failures: Vec<SimFailure> = Vec::new();
    let mut clean: Vec<RunSummary> = Vec::new();
    let mut probes = Probes::default();
    for seed in &seeds {
        match run(*seed, false) {
            Ok(s) => {
                probes.merge(&s.probes);
                clean.push(s);
            }
            Err(f) => failures.push(f),
        }
    }
    let (known, new): (Vec<&SimFailure>, Vec<&SimFailure>) = failures
        .iter()
        .partition(|f| known_open(&f.message).is_some());
    for f in &new {
        eprintln!("SIM FAILED seed={}", f.seed);
    }
    for f in &known {
        eprintln!(
            "SIM FAILED seed={} (known open bug, not failing CI)",
            f.seed
        );
    }
    for f in &failures {
        eprintln!("\n{}", f.report());
    }
    println!(
        "part {part}/{parts}: {} seeds: {} clean, {} failed on known open bugs, {} failed",
        seeds.len(),
        clean.len(),
        known.len(),
        new.len()
    );
    println!("probes:\n{probes}");
    assert!(
        new.is_empty(),
        "simulator seeds failed: {:?} (replay one with scripts/sim.sh --seed <seed>)",
        new.iter().map(|f| f.seed).collect::<Vec<_>>()
    );
}

#[test]
fn seed_budget_first_half() {
    run_part(run_seed, CI_SEEDS, 0, 2);
}

#[test]
fn seed_budget_second_half() {
    run_part(run_seed, CI_SEEDS, 1, 2);
}

/// Seeds per CI run with OSDs going out and coming back in as well (membership changes,
/// snapshot catch-up of new members); about 0.3 s of CPU per seed.
const CI_MEMBERSHIP_SEEDS: u64 = 100;

#[test]
fn membership_seed_budget_first_half() {
    run_part(run_seed_membership, CI_MEMBERSHIP_SEEDS, 0, 2);
}

#[test]
fn membership_seed_budget_second_half() {
    run_part(run_seed_membership, CI_MEMBERSHIP_SEEDS, 1, 2);
}

/// Goal: the same seed reproduces the same run exactly. Method: run two seeds twice each
/// and compare everything the runs report, including the fingerprint that digests every
/// event time, applied entry, leader election and read result.
#[test]
fn same_seed_same_run() {
    for seed in seeds_from(CI_BASE ^ 0xD37E, 2) {
        let a = run_seed(seed, false).map_err(|f| f.report()).unwrap();
        let b = run_seed(seed, false).map_err(|f| f.report()).unwrap();
        assert_eq!(a.fingerprint, b.fingerprint, "seed {seed}");
        assert_eq!(a.events, b.events, "seed {seed}");
        assert_eq!(a.virtual_us, b.virtual_us, "seed {seed}");
        assert_eq!(a.writes_acked, b.writes_acked, "seed {seed}");
        assert_eq!(a.probes, b.probes, "seed {seed}");
    }
}

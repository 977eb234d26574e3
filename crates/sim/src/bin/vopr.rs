//! The simulator's command line (after TigerBeetle's `vopr`).
//!
//! ```text
//! vopr --seed S [--trace]        replay one seed (exactly the same run every time)
//! vopr --seeds N [--base B]      run N seeds derived from B (default 0, so two runs of the
//!                                same command agree)
//! vopr --random --seeds N        run N seeds from a fresh base (SIM_BASE, else the clock and
//!                                the process id), printed first
//! --membership                   also let OSDs go out and in (membership changes)
//! --bad-blocks                   also let data blocks go bad on the disks (flipped bits,
//!                                unreadable sectors, misdirected writes; off by default
//!                                until the shard core's repair bug in the design page's
//!                                "Open" table is fixed)
//! ```
//! Failing seeds are printed first, as `SIM FAILED seed=<seed>` with the replay command; the
//! exit status is 1 if any seed failed.

use clap::Parser;
use fastblock_sim::{known_open, run_seed_profile, seeds_from, Probes, Profile};
use std::process::ExitCode;
use std::time::Instant;

/// The simulator: whole clusters in one thread with virtual time and seeded faults
/// (docs/design/simulator.md). Replays one seed, or runs many and prints the failing ones.
#[derive(Debug, Parser)]
#[command(name = "vopr", version = fastblock_version::VERSION)]
struct Cli {
    /// Replay this one seed (exactly the same run every time).
    #[arg(long, value_parser = parse_u64, conflicts_with_all = ["seeds", "base", "random"])]
    seed: Option<u64>,
    /// With --seed: print the trace of the run.
    #[arg(long, requires = "seed")]
    trace: bool,
    /// Run this many seeds.
    #[arg(long, value_parser = parse_u64, default_value = "100")]
    seeds: u64,
    /// Derive the seeds from this base (so two runs of the same command agree).
    #[arg(long, value_parser = parse_u64, default_value = "0", conflicts_with = "random")]
    base: u64,
    /// Derive the seeds from a fresh base ($SIM_BASE, else the clock and the process id),
    /// printed first.
    #[arg(long)]
    random: bool,
    /// Also let OSDs go out and in (membership changes).
    #[arg(long)]
    membership: bool,
    /// Also let data blocks go bad on the disks (flipped bits, unreadable sectors,
    /// misdirected writes).
    #[arg(long)]
    bad_blocks: bool,
    /// Stop at the first failing seed.
    #[arg(long)]
    stop_on_failure: bool,
}

struct Args {
    seed: Option<u64>,
    seeds: u64,
    base: u64,
    trace: bool,
    stop_on_failure: bool,
    profile: Profile,
}

fn parse_u64(s: &str) -> Result<u64, String> {
    let s = s.trim();
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    }
    .map_err(|e| format!("{s:?}: {e}"))
}

fn parse() -> Result<Args, String> {
    let cli = Cli::parse();
    let profile = Profile {
        membership: cli.membership,
        bad_blocks: cli.bad_blocks,
    };
    let mut a = Args {
        seed: cli.seed,
        seeds: cli.seeds,
        base: cli.base,
        trace: cli.trace,
        stop_on_failure: cli.stop_on_failure,
        profile,
    };
    if cli.random {
        // The one place the simulator looks outside itself: choosing which seeds to run.
        a.base = match std::env::var("SIM_BASE") {
            Ok(v) => parse_u64(&v).map_err(|e| format!("SIM_BASE: {e}"))?,
            Err(_) => {
                let t = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(0);
                t ^ u64::from(std::process::id()).rotate_left(32)
            }
        };
    }
    Ok(a)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let run = |seed: u64, trace: bool| run_seed_profile(seed, trace, args.profile);
    if let Some(seed) = args.seed {
        return match run(seed, args.trace) {
            Ok(s) => {
                println!(
                    "seed {seed}: ok ({} events, {:.1} s virtual, {} writes ({} acked, {} unknown), \
                     {} block reads checked ({} of snapshots), {} entries checked, {} crashes, \
                     fingerprint {:#018x})",
                    s.events,
                    s.virtual_us as f64 / 1e6,
                    s.writes,
                    s.writes_acked,
                    s.writes_unknown,
                    s.reads_checked,
                    s.snap_reads_checked,
                    s.entries_checked,
                    s.crashes,
                    s.fingerprint
                );
                println!("probes:\n{}", s.probes);
                ExitCode::SUCCESS
            }
            Err(f) => {
                eprintln!("{}", f.report());
                ExitCode::FAILURE
            }
        };
    }
    println!("vopr: {} seeds from base {:#x}", args.seeds, args.base);
    let started = Instant::now();
    let mut failed = Vec::new();
    let mut clean = 0u64;
    let mut probes = Probes::default();
    // Probes of the seeds that failed, up to their failure.
    let mut failed_probes = Probes::default();
    for (i, seed) in seeds_from(args.base, args.seeds).enumerate() {
        match run(seed, false) {
            Ok(s) => {
                probes.merge(&s.probes);
                clean += 1;
            }
            Err(f) => {
                eprintln!("{}\n", f.report());
                failed_probes.merge(&f.probes);
                failed.push((seed, known_open(&f.message).is_some()));
                if args.stop_on_failure {
                    break;
                }
            }
        }
        if (i + 1) % 25 == 0 {
            println!(
                "vopr: {} seeds, {} failed, {:.0} s",
                i + 1,
                failed.len(),
                started.elapsed().as_secs_f64()
            );
        }
    }
    let flag = args.profile.flags();
    for (seed, known) in &failed {
        let known = if *known { "  [known open bug]" } else { "" };
        println!("SIM FAILED seed={seed}  (replay: scripts/sim.sh --seed {seed}{flag}){known}");
    }
    println!(
        "vopr: {clean} seeds clean, {} failed, {:.0} s",
        failed.len(),
        started.elapsed().as_secs_f64()
    );
    println!("probes (summed over seeds that did not fail):\n{probes}");
    let mut all = probes.clone();
    all.merge(&failed_probes);
    println!("required probes, over all seeds (those that failed up to their failure):");
    for name in fastblock_sim::probes::REQUIRED {
        println!("  {:>9}  {name}", all.count(name));
    }
    let unreached = probes.unreached();
    if !unreached.is_empty() {
        println!("probes no seed reached:");
        for (name, what) in unreached {
            let required = if fastblock_sim::probes::REQUIRED.contains(&name) {
                "  [required by the CI budget]"
            } else {
                ""
            };
            println!("  {name}: {what}{required}");
        }
    }
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

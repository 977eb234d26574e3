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

use fastblock_sim::{known_open, run_seed_profile, seeds_from, Probes, Profile};
use std::process::ExitCode;
use std::time::Instant;

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
    let mut a = Args {
        seed: None,
        seeds: 100,
        base: 0,
        trace: false,
        stop_on_failure: false,
        profile: Profile::default(),
    };
    let mut random = false;
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--seed" => a.seed = Some(parse_u64(&value("--seed")?)?),
            "--seeds" => a.seeds = parse_u64(&value("--seeds")?)?,
            "--base" => a.base = parse_u64(&value("--base")?)?,
            "--random" => random = true,
            "--trace" => a.trace = true,
            "--membership" => a.profile.membership = true,
            "--bad-blocks" => a.profile.bad_blocks = true,
            "--stop-on-failure" => a.stop_on_failure = true,
            "-h" | "--help" => {
                return Err(
                    "usage: vopr [--seed S [--trace]] [--seeds N] [--base B | --random] \
                            [--membership] [--bad-blocks] [--stop-on-failure]"
                        .into(),
                )
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if random {
        // The one place the simulator looks outside itself: choosing which seeds to run.
        a.base = match std::env::var("SIM_BASE") {
            Ok(v) => parse_u64(&v)?,
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
            eprintln!("vopr: {e}");
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

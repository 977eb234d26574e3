//! block_bench: `block_bench -C block_bench.json [--flags]`. See `fastblock_bench` for the
//! modules; this file parses arguments, connects, and turns the outcome into output and an
//! exit code.

use anyhow::{Context, Result};
use clap::Parser;
use fastblock_bench::config::{Args, BenchConfig};
use fastblock_bench::cores::{available_cores, format_cores};
use fastblock_bench::run::{ensure_image, progress_bar, run_options, run_phases};
use fastblock_bench::stamp::splitmix64;
use fastblock_bench::worker::{Worker, WorkerSetup};
use fastblock_client::{ClientConfig, Cluster};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

fn main() {
    let args = Args::parse();
    let code = match run(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            1
        }
    };
    std::process::exit(code);
}

fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0x5eed)
}

/// A random image name of 32 characters, as the reference makes for an empty `image_name`.
fn random_image_name(seed: u64) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut state = seed;
    (0..32)
        .map(|_| ALPHABET[(splitmix64(&mut state) % ALPHABET.len() as u64) as usize] as char)
        .collect()
}

fn run(args: &Args) -> Result<i32> {
    let config = BenchConfig::load(args)?;
    if !config.unknown_keys.is_empty() {
        eprintln!(
            "warning: ignoring unknown config keys: {}",
            config.unknown_keys.join(", ")
        );
    }
    let seed = config.seed.unwrap_or_else(clock_seed);
    let name = if config.image_name.is_empty() {
        random_image_name(seed)
    } else {
        config.image_name.clone()
    };
    // This runtime only sets up the image and waits for the workers, which run the IO on
    // their own threads and runtimes (`fastblock_bench::worker`).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(async {
        let client = ClientConfig {
            keyring: config.keyring.clone(),
            entity: config.entity.clone(),
            auth_floor: config.auth_floor,
            ..ClientConfig::new(config.monitors.clone())
        };
        let cluster = Cluster::connect(client.clone())
            .await
            .with_context(|| format!("connecting to monitors {}", config.monitors.join(",")))?;
        let info = ensure_image(&cluster, &config, &name).await?;
        let setup = WorkerSetup {
            client,
            image: info.clone(),
            threads: config.threads,
        };
        let mut workers = Vec::new();
        for (core, pin) in placements(config.cores.as_deref()) {
            workers.push(Worker::start(core, pin, &setup).await?);
        }
        let options = run_options(&config, &info, seed);
        let stop = Arc::new(AtomicBool::new(false));
        let on_interrupt = stop.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                on_interrupt.store(true, Ordering::Relaxed);
            }
        });
        let progress = progress_bar(&options);
        let outcome = run_phases(&workers, &options, &stop, &progress).await;
        if config.json {
            println!("{}", serde_json::to_string_pretty(&outcome.json(&info))?);
        } else {
            println!("{}", outcome.text());
        }
        Ok(outcome.exit_code())
    })
}

/// The workers to start: one per `-m` core, pinned when this process may run on that core;
/// without `-m`, one unpinned worker. Cores this process may not run on (absent from the
/// machine, or taken away by taskset or a cgroup) get an unpinned worker and one warning for
/// all of them: the run still has the parallelism asked for, as on the reference's machines,
/// only not the placement.
fn placements(cores: Option<&[usize]>) -> Vec<(Option<usize>, bool)> {
    let Some(cores) = cores else {
        return vec![(None, false)];
    };
    let available = available_cores();
    let missing: Vec<usize> = cores
        .iter()
        .copied()
        .filter(|c| available.as_ref().is_some_and(|a| !a.contains(c)))
        .collect();
    if available.is_none() {
        eprintln!("warning: this process's CPU affinity is unknown; every worker runs unpinned");
    } else if !missing.is_empty() {
        let available: Vec<usize> = available.iter().flatten().copied().collect();
        eprintln!(
            "warning: cores {} of -m are not available to this process (it may run on {}); \
             their workers run unpinned",
            format_cores(&missing),
            format_cores(&available)
        );
    }
    cores
        .iter()
        .map(|&core| {
            let pin = available.as_ref().is_some_and(|a| a.contains(&core));
            (Some(core), pin)
        })
        .collect()
}

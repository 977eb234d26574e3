//! A whole run: make sure the image exists, run the phases of `io_type`, gather the outcome,
//! and render it as the reference's text or as JSON.

use crate::config::{BenchConfig, IoType};
use crate::phase::{run_phase, PhaseContext, PhaseResult};
use crate::stats::final_block;
use crate::worker::Worker;
use crate::workload::{Ledger, RunOptions, VerifyReport};
use anyhow::{bail, Context, Result};
use fastblock_client::types::api::{CreateImageRequest, ErrorCode};
use fastblock_client::types::map::ImageInfo;
use fastblock_client::{ClientStats, Cluster, MonError};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

/// Where a worker ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// The core `-m` gave it (`None` without `-m`).
    pub core: Option<usize>,
    pub pinned: bool,
}

impl Placement {
    fn describe(&self) -> String {
        match (self.core, self.pinned) {
            (Some(core), true) => format!("core {core}, pinned"),
            (Some(core), false) => format!("core {core}, unpinned"),
            (None, _) => "unpinned".to_string(),
        }
    }
}

/// What a run did.
#[derive(Debug)]
pub struct Outcome {
    pub phases: Vec<PhaseResult>,
    /// Each worker's placement, in worker order (the order of the phases' worker figures).
    pub workers: Vec<Placement>,
    /// The bytes of the image the IOs stayed within.
    pub io_range_bytes: u64,
    pub verify: VerifyReport,
    /// The first IO error, which stopped the run.
    pub error: Option<String>,
    pub client: ClientStats,
}

impl Outcome {
    /// 0: fine; 1: an IO error; 5 (EIO, like the reference): verify mismatches.
    pub fn exit_code(&self) -> i32 {
        if self.error.is_some() {
            1
        } else if self.verify.failures > 0 {
            5
        } else {
            0
        }
    }

    /// The reference's final blocks (each followed by one line per worker when there are
    /// several), then verify and error lines.
    pub fn text(&self) -> String {
        let mut out: Vec<String> = Vec::new();
        for phase in &self.phases {
            out.push(final_block(phase.name, &phase.summary));
            if phase.workers.len() > 1 {
                for (i, (worker, placement)) in phase.workers.iter().zip(&self.workers).enumerate()
                {
                    let s = &worker.summary;
                    out.push(format!(
                        "worker {i} ({}): mean: {:.3}us, iops: {:.0}, total_io_count: {}",
                        placement.describe(),
                        s.mean_us,
                        s.iops,
                        s.total_io_count
                    ));
                }
            }
        }
        if self.verify.blocks_checked > 0 {
            out.push(format!(
                "verify: {} blocks checked, {} mismatches, {} never written",
                self.verify.blocks_checked, self.verify.failures, self.verify.unwritten_blocks
            ));
        }
        for f in &self.verify.first_failures {
            out.push(format!(
                "verify mismatch at offset {}: expected {}, {}",
                f.offset, f.expected, f.found
            ));
        }
        if let Some(error) = &self.error {
            out.push(format!("error: {error}"));
        }
        out.join("\n")
    }

    pub fn json(&self, image: &ImageInfo) -> serde_json::Value {
        let phases: Vec<serde_json::Value> = self
            .phases
            .iter()
            .map(|p| {
                let s = &p.summary;
                let mut percentiles = serde_json::Map::new();
                for ((name, _), value) in crate::stats::QUANTILES.iter().zip(s.percentiles_us) {
                    percentiles.insert(format!("{name}_us"), value.into());
                }
                serde_json::json!({
                    "io_type": p.name,
                    "mean_us": s.mean_us,
                    "percentiles": percentiles,
                    "min_us": s.min_us,
                    "max_us": s.max_us,
                    "stdev_us": s.stdev_us,
                    "iops": s.iops,
                    "iops_dur_sec": s.iops_dur_sec,
                    "measured_io_count": s.measured_io_count,
                    "total_io_count": s.total_io_count,
                    "elapsed_sec": p.elapsed.as_secs_f64(),
                    "cpu_us": p.cpu.as_micros() as u64,
                    "cpu_us_per_io": if s.total_io_count > 0 {
                        p.cpu.as_secs_f64() * 1e6 / s.total_io_count as f64
                    } else {
                        0.0
                    },
                    "latency_cdf": p.latency_cdf,
                    "workers": p.workers.iter().zip(&self.workers).map(|(w, placement)| {
                        serde_json::json!({
                            "core": placement.core,
                            "pinned": placement.pinned,
                            "cores_seen": w.cores_seen,
                            "mean_us": w.summary.mean_us,
                            "iops": w.summary.iops,
                            "measured_io_count": w.summary.measured_io_count,
                            "total_io_count": w.summary.total_io_count,
                        })
                    }).collect::<Vec<_>>(),
                })
            })
            .collect();
        serde_json::json!({
            "image": {"pool": image.pool_name, "name": image.name, "id": image.id.get(),
                      "size_bytes": image.size_bytes, "object_size_bytes": image.object_size_bytes,
                      "io_range_bytes": self.io_range_bytes},
            "phases": phases,
            "verify": self.verify,
            "error": self.error,
            "client": {
                "object_requests": self.client.object_requests,
                "retries": self.client.retries,
                "redirects": self.client.redirects,
                "connects": self.client.connects,
                "map_updates": self.client.map_updates,
                "timeouts": self.client.timeouts,
            },
            "process_cpu_us": crate::cpu::process_cpu().map(|d| d.as_micros() as u64),
            "exit_code": self.exit_code(),
        })
    }
}

/// Creates the image if missing, or takes the existing one, as the reference does ("exists"
/// is fine). An existing image must be at least `image_size` large (the IOs stay within
/// `image_size`); an object size other than the config's is used as it is, with a warning.
pub async fn ensure_image(
    cluster: &Arc<Cluster>,
    config: &BenchConfig,
    name: &str,
) -> Result<ImageInfo> {
    let Some(mon) = cluster.monitor() else {
        bail!("no monitor to create the image with");
    };
    let pool = &config.pool_name;
    let pool_missing = |e: &MonError| e.code() == Some(ErrorCode::PoolNotFound);
    if let Some(size_bytes) = config.image_size {
        let request = CreateImageRequest {
            pool: pool.clone(),
            name: name.to_string(),
            size_bytes,
            object_size_bytes: config.object_size,
        };
        match mon.create_image(&request).await {
            Ok(info) => return Ok(info),
            // Exists: fall through and check it is the image the config describes.
            Err(e) if e.code() == Some(ErrorCode::ImageExists) => {}
            Err(e) if pool_missing(&e) => bail!("pool {pool} does not exist"),
            Err(e) => return Err(e).context(format!("creating image {pool}/{name}")),
        }
    }
    let info = match mon.image(pool, name).await {
        Ok(info) => info,
        Err(e) if pool_missing(&e) => bail!("pool {pool} does not exist"),
        Err(e) if e.code() == Some(ErrorCode::ImageNotFound) => {
            bail!("image {pool}/{name} does not exist and no image_size was given to create it")
        }
        Err(e) => return Err(e).context(format!("looking up image {pool}/{name}")),
    };
    if let Some(size) = config.image_size {
        if info.size_bytes < size {
            bail!(
                "image {pool}/{name} exists with {} bytes, less than the image_size of {size} \
                 the config asks for",
                info.size_bytes
            );
        }
    }
    if let Some(object_size) = config.object_size {
        if info.object_size_bytes != object_size {
            eprintln!(
                "warning: image {pool}/{name} exists with object size {}, not the config's \
                 {object_size}; using the image's",
                info.object_size_bytes
            );
        }
    }
    Ok(info)
}

/// The options of the phases, from the config, the image and a seed.
pub fn run_options(config: &BenchConfig, image: &ImageInfo, seed: u64) -> RunOptions {
    RunOptions {
        io_type: config.io_type,
        io_range_bytes: config.image_size.unwrap_or(image.size_bytes),
        io_size: config.io_size,
        io_count: config.io_count,
        io_depth: config.io_depth,
        sequential: config.sequential,
        seed,
        verify: config.verify,
        deferred: config.deferred,
        runtime: config.runtime,
        infinity: config.infinity,
        print_stats_interval: config.print_stats_interval,
        json: config.json,
    }
}

/// A progress bar on stderr when it is a terminal and the output is text; hidden otherwise.
pub fn progress_bar(options: &RunOptions) -> ProgressBar {
    if options.json || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = if options.infinity {
        ProgressBar::new_spinner()
    } else {
        ProgressBar::new(options.io_count)
    };
    if let Ok(style) = ProgressStyle::with_template(
        "{msg:>5} [{elapsed_precise}] {wide_bar} {pos}/{len} ({per_sec})",
    ) {
        bar.set_style(style);
    }
    bar
}

/// Runs the phases of `options.io_type` on `workers`. `stop` ends the current phase early.
pub async fn run_phases(
    workers: &[Worker],
    options: &RunOptions,
    stop: &Arc<AtomicBool>,
    progress: &ProgressBar,
) -> Outcome {
    let mut outcome = Outcome {
        phases: Vec::new(),
        workers: workers
            .iter()
            .map(|w| Placement {
                core: w.core,
                pinned: w.pinned,
            })
            .collect(),
        io_range_bytes: options.io_range_bytes,
        verify: VerifyReport::default(),
        error: None,
        client: ClientStats::default(),
    };
    if options.io_range_bytes < options.io_size {
        outcome.error = Some(format!(
            "the IO range has {} bytes, less than one IO of {}",
            options.io_range_bytes, options.io_size
        ));
        return outcome;
    }
    let writes: &[bool] = match options.io_type {
        IoType::Write => &[true],
        IoType::Read => &[false],
        IoType::WriteRead => &[true, false],
    };
    let ledger = Arc::new(Ledger::default());
    let verify = Arc::new(Mutex::new(VerifyReport::default()));
    let cx = PhaseContext {
        workers,
        options,
        ledger: &ledger,
        verify: &verify,
        stop,
        progress,
    };
    for &write in writes {
        let (result, clients) = run_phase(&cx, write).await;
        // Each worker's counters cover all its phases so far: the last phase's are the run's.
        outcome.client = sum_stats(&clients);
        match result {
            Ok(result) => outcome.phases.push(result),
            Err(e) => {
                outcome.error = Some(e);
                break;
            }
        }
    }
    progress.finish_and_clear();
    outcome.verify = verify.lock().unwrap_or_else(|p| p.into_inner()).clone();
    outcome
}

fn sum_stats(stats: &[ClientStats]) -> ClientStats {
    stats
        .iter()
        .fold(ClientStats::default(), |a, s| ClientStats {
            object_requests: a.object_requests + s.object_requests,
            retries: a.retries + s.retries,
            redirects: a.redirects + s.redirects,
            connects: a.connects + s.connects,
            map_updates: a.map_updates + s.map_updates,
            timeouts: a.timeouts + s.timeouts,
        })
}

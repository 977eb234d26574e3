//! One IO phase over all workers: hand each its share, print the periodic lines over all of
//! them, and sum their figures when they are done.
//!
//! The phase's figures are those of one histogram holding every worker's measured IOs; its
//! IOPS are the measured IOs of all workers over the time from the end of the warm-up to the
//! last worker's last IO. Each worker's own figures are kept next to them, so the report can
//! show that the total is their sum.

use crate::stats::{interval_line, Latencies, Summary};
use crate::worker::{Worker, WORKER_GONE};
use crate::workload::{Ledger, PhaseJob, Recorder, RunOptions, Share, VerifyReport};
use fastblock_client::ClientStats;
use indicatif::ProgressBar;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::time::Instant;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One worker's figures of a phase.
#[derive(Clone, Debug)]
pub struct WorkerResult {
    /// Over the worker's measured IOs, from the end of the warm-up to its last IO.
    pub summary: Summary,
    /// The cores its IOs completed on.
    pub cores_seen: Vec<usize>,
}

/// The figures of one finished phase.
#[derive(Clone, Debug)]
pub struct PhaseResult {
    /// "write" or "read".
    pub name: &'static str,
    /// All workers together.
    pub summary: Summary,
    /// Each worker's, in worker order.
    pub workers: Vec<WorkerResult>,
    /// (latency µs, fraction of measured IOs at or below it), for plotting the distribution.
    pub latency_cdf: Vec<(u64, f64)>,
    /// CPU time of this process (all threads) during the whole phase, warm-up included.
    pub cpu: Duration,
    /// Wall time of the whole phase, warm-up included.
    pub elapsed: Duration,
}

/// What a phase shares with the rest of the run.
pub struct PhaseContext<'a> {
    pub workers: &'a [Worker],
    pub options: &'a RunOptions,
    pub ledger: &'a Arc<Ledger>,
    pub verify: &'a Arc<Mutex<VerifyReport>>,
    pub stop: &'a Arc<AtomicBool>,
    pub progress: &'a ProgressBar,
}

/// Runs one phase ("write" or "read") on every worker. Returns its figures and the workers'
/// client counters, or the first IO error (the run stops at it).
pub async fn run_phase(
    cx: &PhaseContext<'_>,
    write: bool,
) -> (Result<PhaseResult, String>, Vec<ClientStats>) {
    let start = Instant::now();
    let cpu_start = crate::cpu::process_cpu();
    let error = Arc::new(Mutex::new(None));
    let workers = cx.workers.len() as u64;
    let recorders: Vec<Arc<Mutex<Recorder>>> = cx
        .workers
        .iter()
        .map(|_| Arc::new(Mutex::new(Recorder::default())))
        .collect();
    cx.progress.reset();
    cx.progress
        .set_message(if write { "write" } else { "read" });
    let printer = cx.options.print_stats_interval.map(|every| {
        tokio::spawn(print_stats(
            recorders.clone(),
            every,
            cx.options.json,
            cx.progress.clone(),
        ))
    });
    // Every worker gets its share before any is awaited, so that they all run together.
    let mut pending = Vec::new();
    for (i, (worker, recorder)) in cx.workers.iter().zip(&recorders).enumerate() {
        let job = PhaseJob {
            options: cx.options.clone(),
            write,
            share: Share {
                worker: i as u64,
                workers,
            },
            ledger: cx.ledger.clone(),
            verify: cx.verify.clone(),
            recorder: recorder.clone(),
            stop: cx.stop.clone(),
            error: error.clone(),
            start,
            progress: cx.progress.clone(),
        };
        pending.push(worker.submit(job).await);
    }
    let mut done = Vec::new();
    for submitted in pending {
        done.push(match submitted {
            Ok(receiver) => receiver.await.map_err(|_| WORKER_GONE.to_string()),
            Err(e) => Err(e),
        });
    }
    if let Some(printer) = printer {
        printer.abort();
    }
    let end = Instant::now();
    let cpu = match (cpu_start, crate::cpu::process_cpu()) {
        (Some(a), Some(b)) => b.saturating_sub(a),
        _ => Duration::ZERO,
    };
    let mut clients = Vec::new();
    let mut ends = Vec::new();
    for result in done {
        match result {
            Ok(share) => {
                clients.push(share.client);
                ends.push(share.end);
            }
            Err(e) => return (Err(e), clients),
        }
    }
    if let Some(error) = lock(&error).take() {
        return (Err(error), clients);
    }
    let measure_from = start + cx.options.deferred;
    let mut all = Latencies::default();
    let mut total = 0;
    let mut worker_results = Vec::new();
    for (recorder, worker_end) in recorders.iter().zip(&ends) {
        let recorder = lock(recorder);
        all.add(&recorder.all);
        total += recorder.total;
        let measured = worker_end.saturating_duration_since(measure_from);
        worker_results.push(WorkerResult {
            summary: recorder.all.summary(measured, recorder.total),
            cores_seen: recorder.cores_seen.iter().copied().collect(),
        });
    }
    // Every IO fell inside the warm-up: there is nothing to report, and zeros would read as
    // a measurement.
    if total > 0 && all.count() == 0 {
        return (
            Err(format!(
                "all {total} {} IOs completed within the {:?} warm-up (deferred_time): nothing \
                 was measured; shorten the warm-up or run longer (io_count, runtime)",
                if write { "write" } else { "read" },
                cx.options.deferred
            )),
            clients,
        );
    }
    let last_end = ends.iter().copied().max().unwrap_or(end);
    let result = PhaseResult {
        name: if write { "write" } else { "read" },
        summary: all.summary(last_end.saturating_duration_since(measure_from), total),
        workers: worker_results,
        latency_cdf: all.cdf(),
        cpu,
        elapsed: end - start,
    };
    (Ok(result), clients)
}

/// Every `every`, the reference's line over the IOs all workers completed since the last one.
async fn print_stats(
    recorders: Vec<Arc<Mutex<Recorder>>>,
    every: Duration,
    json: bool,
    progress: ProgressBar,
) {
    let mut ticker = tokio::time::interval_at(Instant::now() + every, every);
    let mut last = Instant::now();
    loop {
        ticker.tick().await;
        let now = Instant::now();
        let mut interval = Latencies::default();
        let mut total = 0;
        for recorder in &recorders {
            let mut recorder = lock(recorder);
            interval.add(&recorder.interval);
            total += recorder.total;
            recorder.interval.reset();
        }
        let line = interval_line(&interval.summary(now - last, total));
        last = now;
        progress.suspend(|| {
            if json {
                eprintln!("{line}");
            } else {
                println!("{line}");
            }
        });
    }
}

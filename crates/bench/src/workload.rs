//! The IO phases: `io_depth` workers issue `io_count` IOs of `io_size` bytes at offsets drawn
//! from the IO index (random or sequential, io_size-aligned), record latencies, and verify
//! read data against the stamps.
//!
//! Offsets are a pure function of (seed, IO index), so the read phase of `write_read` reads
//! exactly the offsets the write phase wrote, without storing them. Two writes to the same
//! offset are never in flight together (a worker waits for the offset to be free), so the last
//! acknowledged sequence number of each offset is the one a later read must find.

use crate::config::IoType;
use crate::stamp::{check_block, splitmix64, stamped_io, Mismatch, BLOCK_BYTES};
use crate::stats::{interval_line, Latencies, Summary};
use fastblock_client::Image;
use indicatif::ProgressBar;
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::time::Instant;

/// Verify failures printed and kept in the report; the rest are only counted.
pub const FAILURES_KEPT_MAX: usize = 10;
/// Pause of a writer waiting for another write to the same offset to finish.
const SAME_OFFSET_WAIT: Duration = Duration::from_micros(100);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the phases need to know, from the bench config and the image.
#[derive(Clone, Debug)]
pub struct RunOptions {
    pub io_type: IoType,
    pub io_size: u64,
    pub io_count: u64,
    pub io_depth: usize,
    pub sequential: bool,
    pub seed: u64,
    pub verify: bool,
    pub deferred: Duration,
    pub runtime: Option<Duration>,
    pub infinity: bool,
    pub print_stats_interval: Option<Duration>,
    /// Periodic lines go to stderr (stdout carries the JSON report).
    pub json: bool,
}

impl RunOptions {
    /// The offset of IO number `index` in an image of `image_size` bytes.
    pub fn offset_of(&self, index: u64, image_size: u64) -> u64 {
        let slots = (image_size / self.io_size).max(1);
        let slot = if self.sequential {
            index % slots
        } else {
            let mut state = self.seed ^ index.wrapping_mul(0x2545_f491_4f6c_dd1d);
            splitmix64(&mut state) % slots
        };
        slot * self.io_size
    }
}

/// One verify failure, as printed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct VerifyFailure {
    /// Byte offset of the 4 KiB block in the image.
    pub offset: u64,
    pub expected: String,
    pub found: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct VerifyReport {
    pub blocks_checked: u64,
    /// Zero blocks where no write was recorded (a read-only run on fresh space): not failures.
    pub unwritten_blocks: u64,
    pub failures: u64,
    pub first_failures: Vec<VerifyFailure>,
}

/// Per-offset write bookkeeping shared by the workers.
#[derive(Default)]
pub struct Ledger {
    next_seq: AtomicU64,
    last_seq: Mutex<HashMap<u64, u64>>,
    writing: Mutex<HashSet<u64>>,
}

impl Ledger {
    async fn claim(&self, offset: u64) {
        loop {
            if lock(&self.writing).insert(offset) {
                return;
            }
            tokio::time::sleep(SAME_OFFSET_WAIT).await;
        }
    }

    fn release(&self, offset: u64) {
        lock(&self.writing).remove(&offset);
    }

    fn expected(&self, offset: u64) -> Option<u64> {
        lock(&self.last_seq).get(&offset).copied()
    }
}

/// The figures of one finished phase.
#[derive(Clone, Debug)]
pub struct PhaseResult {
    /// "write" or "read".
    pub name: &'static str,
    pub summary: Summary,
    /// (latency µs, fraction of measured IOs at or below it), for plotting the distribution.
    pub latency_cdf: Vec<(u64, f64)>,
    /// CPU time of this process (all threads) during the whole phase, warm-up included.
    pub cpu: Duration,
    /// Wall time of the whole phase, warm-up included.
    pub elapsed: Duration,
}

#[derive(Default)]
struct Recorder {
    all: Latencies,
    interval: Latencies,
    total: u64,
}

/// State shared by the workers of one phase.
struct PhaseShared {
    image: Image,
    options: RunOptions,
    write: bool,
    ledger: Arc<Ledger>,
    verify: Arc<Mutex<VerifyReport>>,
    recorder: Mutex<Recorder>,
    next_index: AtomicU64,
    stop: Arc<AtomicBool>,
    error: Mutex<Option<String>>,
    measure_from: Instant,
    deadline: Option<Instant>,
    progress: ProgressBar,
}

/// Runs one phase ("write" or "read"). Returns its figures, or the first IO error (the run
/// stops at it). `stop` ends the phase early (Ctrl-C).
pub async fn run_phase(
    image: &Image,
    options: &RunOptions,
    write: bool,
    ledger: &Arc<Ledger>,
    verify: &Arc<Mutex<VerifyReport>>,
    stop: &Arc<AtomicBool>,
    progress: &ProgressBar,
) -> Result<PhaseResult, String> {
    let start = Instant::now();
    let cpu_start = crate::cpu::process_cpu();
    let shared = Arc::new(PhaseShared {
        image: image.clone(),
        options: options.clone(),
        write,
        ledger: ledger.clone(),
        verify: verify.clone(),
        recorder: Mutex::new(Recorder::default()),
        next_index: AtomicU64::new(0),
        stop: stop.clone(),
        error: Mutex::new(None),
        measure_from: start + options.deferred,
        deadline: options.runtime.map(|r| start + r),
        progress: progress.clone(),
    });
    progress.reset();
    progress.set_message(if write { "write" } else { "read" });
    let printer = options
        .print_stats_interval
        .map(|every| tokio::spawn(print_stats(shared.clone(), every)));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..options.io_depth {
        workers.spawn(worker(shared.clone()));
    }
    while let Some(joined) = workers.join_next().await {
        if let Err(e) = joined {
            if e.is_panic() {
                std::panic::resume_unwind(e.into_panic());
            }
        }
    }
    if let Some(printer) = printer {
        printer.abort();
    }
    let end = Instant::now();
    let cpu = match (cpu_start, crate::cpu::process_cpu()) {
        (Some(a), Some(b)) => b.saturating_sub(a),
        _ => Duration::ZERO,
    };
    if let Some(error) = lock(&shared.error).take() {
        return Err(error);
    }
    let recorder = lock(&shared.recorder);
    let measured = end.saturating_duration_since(shared.measure_from);
    Ok(PhaseResult {
        name: if write { "write" } else { "read" },
        summary: recorder.all.summary(measured, recorder.total),
        latency_cdf: recorder.all.cdf(),
        cpu,
        elapsed: end - start,
    })
}

fn should_stop(shared: &PhaseShared) -> bool {
    shared.stop.load(Ordering::Relaxed) || shared.deadline.is_some_and(|d| Instant::now() >= d)
}

async fn worker(shared: Arc<PhaseShared>) {
    let options = &shared.options;
    let image_size = shared.image.size_bytes();
    let image_id = shared.image.info().id.get();
    while !should_stop(&shared) {
        let index = shared.next_index.fetch_add(1, Ordering::Relaxed);
        if !options.infinity && index >= options.io_count {
            break;
        }
        let offset = options.offset_of(index, image_size);
        let result = if shared.write {
            shared.ledger.claim(offset).await;
            let seq = shared.ledger.next_seq.fetch_add(1, Ordering::Relaxed) + 1;
            let data = stamped_io(image_id, offset, options.io_size as usize, seq);
            let started = Instant::now();
            let result = shared.image.write(offset, data).await;
            let latency = started.elapsed();
            if result.is_ok() {
                lock(&shared.ledger.last_seq).insert(offset, seq);
            }
            shared.ledger.release(offset);
            result.map(|()| latency)
        } else {
            let started = Instant::now();
            match shared.image.read(offset, options.io_size).await {
                Ok(data) => {
                    let latency = started.elapsed();
                    if options.verify {
                        verify_read(&shared, image_id, offset, &data);
                    }
                    Ok(latency)
                }
                Err(e) => Err(e),
            }
        };
        match result {
            Ok(latency) => {
                let mut recorder = lock(&shared.recorder);
                recorder.total += 1;
                recorder.interval.record(latency);
                if Instant::now() >= shared.measure_from {
                    recorder.all.record(latency);
                }
                drop(recorder);
                shared.progress.inc(1);
            }
            Err(e) => {
                let what = if shared.write { "write" } else { "read" };
                let mut first = lock(&shared.error);
                if first.is_none() {
                    *first = Some(format!(
                        "{what} of {} bytes at offset {offset} failed: {e}",
                        options.io_size
                    ));
                }
                shared.stop.store(true, Ordering::Relaxed);
                return;
            }
        }
    }
}

fn verify_read(shared: &PhaseShared, image_id: u64, offset: u64, data: &[u8]) {
    let expected = shared.ledger.expected(offset);
    let mut checked = 0u64;
    let mut unwritten = 0u64;
    let mut failures = Vec::new();
    for (i, block) in data.chunks_exact(BLOCK_BYTES).enumerate() {
        let block_offset = offset + (i * BLOCK_BYTES) as u64;
        checked += 1;
        match check_block(block, image_id, block_offset, expected) {
            Ok(_) => {}
            Err(Mismatch::Unwritten) if expected.is_none() => unwritten += 1,
            Err(mismatch) => failures.push(VerifyFailure {
                offset: block_offset,
                expected: match expected {
                    Some(seq) => format!("image {image_id} offset {block_offset} seq {seq}"),
                    None => format!("a valid stamp of image {image_id} offset {block_offset}"),
                },
                found: mismatch.to_string(),
            }),
        }
    }
    let mut report = lock(&shared.verify);
    report.blocks_checked += checked;
    report.unwritten_blocks += unwritten;
    report.failures += failures.len() as u64;
    for failure in failures {
        if report.first_failures.len() < FAILURES_KEPT_MAX {
            report.first_failures.push(failure);
        }
    }
}

async fn print_stats(shared: Arc<PhaseShared>, every: Duration) {
    let mut ticker = tokio::time::interval_at(Instant::now() + every, every);
    let mut last = Instant::now();
    loop {
        ticker.tick().await;
        let now = Instant::now();
        let line = {
            let mut recorder = lock(&shared.recorder);
            let summary = recorder.interval.summary(now - last, recorder.total);
            recorder.interval.reset();
            interval_line(&summary)
        };
        last = now;
        let json = shared.options.json;
        shared.progress.suspend(|| {
            if json {
                eprintln!("{line}");
            } else {
                println!("{line}");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(sequential: bool) -> RunOptions {
        RunOptions {
            io_type: IoType::Write,
            io_size: 8192,
            io_count: 100,
            io_depth: 1,
            sequential,
            seed: 7,
            verify: true,
            deferred: Duration::ZERO,
            runtime: None,
            infinity: false,
            print_stats_interval: None,
            json: false,
        }
    }

    #[test]
    fn offsets_are_aligned_inside_the_image_and_repeatable() {
        let size = 1 << 20;
        let random = options(false);
        for i in 0..1000 {
            let offset = random.offset_of(i, size);
            assert_eq!(offset % 8192, 0);
            assert!(offset + 8192 <= size);
            assert_eq!(offset, random.offset_of(i, size));
        }
        let distinct: HashSet<u64> = (0..1000).map(|i| random.offset_of(i, size)).collect();
        assert!(
            distinct.len() > 100,
            "random offsets spread: {}",
            distinct.len()
        );
        let sequential = options(true);
        let first: Vec<u64> = (0..3).map(|i| sequential.offset_of(i, size)).collect();
        assert_eq!(first, [0, 8192, 16384]);
        assert_eq!(sequential.offset_of(128, size), 0, "wraps at the end");
    }
}

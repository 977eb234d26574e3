//! One worker's share of an IO phase: `io_depth` IO slots issue the worker's IOs of `io_size`
//! bytes at offsets drawn from the IO index (random or sequential, io_size-aligned, below
//! `io_range_bytes`), record latencies, and verify read data against the stamps. [`crate::phase`]
//! runs a phase over all workers and merges their figures.
//!
//! Offsets are a pure function of (seed, IO index), so the read phase of `write_read` reads
//! exactly the offsets the write phase wrote, without storing them. Two writes to the same
//! offset are never in flight together, across all workers (an IO slot waits for the offset to be
//! free in the shared [`Ledger`]), so the last acknowledged sequence number of each offset is the one a later read must find.

use crate::config::IoType;
use crate::stamp::{check_block, splitmix64, stamped_io, Mismatch, BLOCK_BYTES};
use crate::stats::Latencies;
use fastblock_client::Image;
use indicatif::ProgressBar;
use serde::Serialize;
use std::collections::{BTreeSet, HashMap, HashSet};
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
    /// IO stays below this offset: the configured image_size, or the image's size.
    pub io_range_bytes: u64,
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
    /// The offset of IO number `index` in a range of `range_bytes` bytes.
    pub fn offset_of(&self, index: u64, range_bytes: u64) -> u64 {
        let slots = (range_bytes / self.io_size).max(1);
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

/// Which IOs of a phase one worker issues: indices `worker`, `worker + workers`, ... below
/// `io_count`. Interleaving (rather than the reference's contiguous slices, whose last core
/// also takes the remainder) works the same for runs without an IO count (`infinity`), and
/// spreads the remainder one IO per worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Share {
    pub worker: u64,
    pub workers: u64,
}

impl Share {
    pub const WHOLE: Share = Share {
        worker: 0,
        workers: 1,
    };

    /// The IO index of this worker's `k`th IO.
    pub fn index(&self, k: u64) -> u64 {
        self.worker + k * self.workers
    }

    /// How many of `io_count` IOs are this worker's.
    pub fn io_count(&self, io_count: u64) -> u64 {
        if io_count <= self.worker {
            0
        } else {
            (io_count - self.worker - 1) / self.workers + 1
        }
    }
}

/// One worker's figures of one phase, filled in as its IOs complete.
#[derive(Default)]
pub struct Recorder {
    /// Latencies of the IOs that completed after the warm-up.
    pub all: Latencies,
    /// Latencies since the last periodic line.
    pub interval: Latencies,
    /// IOs completed, warm-up included.
    pub total: u64,
    /// Cores the worker's IOs completed on: the proof that pinning held.
    pub cores_seen: BTreeSet<usize>,
}

/// What one worker needs to run its share of a phase. The ledger, the verify report, the
/// stop flag and the error slot are shared by all workers of the run.
#[derive(Clone)]
pub struct PhaseJob {
    pub options: RunOptions,
    pub write: bool,
    pub share: Share,
    pub ledger: Arc<Ledger>,
    pub verify: Arc<Mutex<VerifyReport>>,
    pub recorder: Arc<Mutex<Recorder>>,
    pub stop: Arc<AtomicBool>,
    /// The first IO error of the phase (any worker's); it stops every worker.
    pub error: Arc<Mutex<Option<String>>>,
    /// When the phase started: the warm-up and `--runtime` count from here.
    pub start: Instant,
    pub progress: ProgressBar,
}

impl PhaseJob {
    fn measure_from(&self) -> Instant {
        self.start + self.options.deferred
    }

    fn should_stop(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
            || self
                .options
                .runtime
                .is_some_and(|r| Instant::now() >= self.start + r)
    }
}

/// Runs one worker's share of a phase on `image` with `io_depth` IOs in flight; returns when
/// the share is done, the phase is stopped or an IO failed (recorded in `job.error`). The
/// result is the time the worker's last IO completed.
pub async fn run_share(image: &Image, job: &PhaseJob) -> Instant {
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..job.options.io_depth {
        tasks.spawn(io_loop(image.clone(), job.clone(), next.clone()));
    }
    while let Some(joined) = tasks.join_next().await {
        if let Err(e) = joined {
            if e.is_panic() {
                std::panic::resume_unwind(e.into_panic());
            }
        }
    }
    Instant::now()
}

/// One of a worker's `io_depth` IO slots: takes the worker's next IO until none is left.
async fn io_loop(image: Image, job: PhaseJob, next: Arc<AtomicU64>) {
    let options = &job.options;
    let image_id = image.info().id.get();
    let measure_from = job.measure_from();
    while !job.should_stop() {
        let index = job.share.index(next.fetch_add(1, Ordering::Relaxed));
        if !options.infinity && index >= options.io_count {
            break;
        }
        let offset = options.offset_of(index, options.io_range_bytes);
        let result = if job.write {
            job.ledger.claim(offset).await;
            let seq = job.ledger.next_seq.fetch_add(1, Ordering::Relaxed) + 1;
            let data = stamped_io(image_id, offset, options.io_size as usize, seq);
            let started = Instant::now();
            let result = image.write(offset, data).await;
            let latency = started.elapsed();
            if result.is_ok() {
                lock(&job.ledger.last_seq).insert(offset, seq);
            }
            job.ledger.release(offset);
            result.map(|()| latency)
        } else {
            let started = Instant::now();
            match image.read(offset, options.io_size).await {
                Ok(data) => {
                    let latency = started.elapsed();
                    if options.verify {
                        verify_read(&job, image_id, offset, &data);
                    }
                    Ok(latency)
                }
                Err(e) => Err(e),
            }
        };
        match result {
            Ok(latency) => {
                let core = crate::cores::current_core();
                let mut recorder = lock(&job.recorder);
                recorder.total += 1;
                recorder.interval.record(latency);
                if Instant::now() >= measure_from {
                    recorder.all.record(latency);
                }
                if let Some(core) = core {
                    recorder.cores_seen.insert(core);
                }
                drop(recorder);
                job.progress.inc(1);
            }
            Err(e) => {
                let what = if job.write { "write" } else { "read" };
                let mut first = lock(&job.error);
                if first.is_none() {
                    *first = Some(format!(
                        "{what} of {} bytes at offset {offset} failed: {e}",
                        options.io_size
                    ));
                }
                job.stop.store(true, Ordering::Relaxed);
                return;
            }
        }
    }
}

fn verify_read(job: &PhaseJob, image_id: u64, offset: u64, data: &[u8]) {
    let expected = job.ledger.expected(offset);
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
    let mut report = lock(&job.verify);
    report.blocks_checked += checked;
    report.unwritten_blocks += unwritten;
    report.failures += failures.len() as u64;
    for failure in failures {
        if report.first_failures.len() < FAILURES_KEPT_MAX {
            report.first_failures.push(failure);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(sequential: bool) -> RunOptions {
        RunOptions {
            io_type: IoType::Write,
            io_range_bytes: 1 << 20,
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

    #[test]
    fn shares_split_the_io_count_exactly() {
        for workers in 1..=5u64 {
            for io_count in 0..40u64 {
                let shares: Vec<Share> = (0..workers)
                    .map(|worker| Share { worker, workers })
                    .collect();
                let sum: u64 = shares.iter().map(|s| s.io_count(io_count)).sum();
                assert_eq!(sum, io_count, "{workers} workers, {io_count} IOs");
                let mut indices: Vec<u64> = shares
                    .iter()
                    .flat_map(|s| (0..s.io_count(io_count)).map(|k| s.index(k)))
                    .collect();
                indices.sort_unstable();
                assert_eq!(indices, (0..io_count).collect::<Vec<_>>(), "each IO once");
            }
        }
    }
}

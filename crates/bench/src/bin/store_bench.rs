//! The engine side of `bench/store-bench.sh`: 4 KiB durable writes through WAL commit +
//! apply at 1 and 32 writers, and 4 KiB random reads at 1 and 32 outstanding, on a real file
//! through the io_uring disk. Prints one `key=value` line per test.
//!
//! Usage: `store-bench FILE [--seconds S] [--dataset-mib M] [--data-with-commit 0|1]
//!         [--sync dsync|twostep|linked|syscall] [--block-cache-entries N]`; see `--help`.
//! The cache's hits and misses of each test go to stderr.
//!
//! It lives in the bench crate, not beside the engine, because its `--version` names the git
//! commit (`fastblock-version`), and the engine's crate must not depend on that: every commit
//! would rebuild the engine and everything above it.
//! A "writer" is a PG: with 32 writers, 32 PGs each append one 4 KiB entry, all 32 share one
//! commit (one write + one fdatasync), then the 32 writes are applied (their data goes out
//! with the next commit's submission). The reported latency is append → durable → applied.
//! `engine_lookup` is one block-map lookup (`allocated_ranges` of a 4 KiB block: no I/O).
// raft-rs messages (rust-protobuf) are built field by field, as raft-rs itself does.
#![allow(clippy::field_reassign_with_default)]

use clap::Parser;
use fastblock_store::disk::SyncMode;
use fastblock_store::{
    BlockCacheStats, MkfsOptions, ObjectId, ObjectRead, Store, StoreOptions, UringDisk,
    UringOptions,
};
use fastblock_types::{ImageId, PgId, PoolId};
use raft::eraftpb::Entry;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum Sync {
    /// RWF_DSYNC writes, as the OSD's.
    Dsync,
    /// A ring write, then a separate IORING_OP_FSYNC.
    Twostep,
    /// Write and fsync in one submission.
    Linked,
    /// fdatasync(2) after the ring writes.
    Syscall,
}

fn positive_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err("expected a positive number of seconds".to_string()),
    }
}

/// Zero or one, as the flags have always been given.
fn flag01(s: &str) -> Result<bool, String> {
    match s {
        "0" => Ok(false),
        "1" => Ok(true),
        _ => Err("expected 0 or 1".to_string()),
    }
}

/// The storage engine alone on a real file: 4 KiB durable writes (WAL commit + apply) at 1
/// and 32 writers, 4 KiB random reads at 1 and 32 outstanding, block-map lookups; one
/// `key=value` line per test (bench/store-bench.sh).
#[derive(Debug, Parser)]
#[command(name = "store-bench", version = fastblock_version::VERSION)]
struct Args {
    /// The file to create and format (replaced if it exists; about 1.4 GB with the default
    /// dataset).
    file: PathBuf,
    /// Seconds each test runs.
    #[arg(long, default_value = "10", value_parser = positive_seconds)]
    seconds: f64,
    /// MiB of data written before the tests and read by them.
    #[arg(long, default_value_t = 256)]
    dataset_mib: u64,
    /// Data goes out with the WAL commit (1) or after it (0).
    #[arg(long, default_value = "0", value_parser = flag01)]
    data_with_commit: bool,
    /// Data writes in the background (1) or inline (0).
    #[arg(long, default_value = "1", value_parser = flag01)]
    background: bool,
    /// How the WAL is made durable.
    #[arg(long, value_enum, default_value = "dsync")]
    sync: Sync,
    /// `StoreOptions::block_cache_entries_max` (0: every block-map lookup goes to redb).
    #[arg(long)]
    block_cache_entries: Option<usize>,
}

const OBJECT_BYTES: u64 = 4 << 20;
const BS: u64 = 4096;
const FLUSH_EVERY_OPS: u64 = 32768;
/// PGs the dataset's objects map to (object index modulo this).
const PGS: u64 = 32;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

struct Bench {
    s: Store<UringDisk>,
    rng: Rng,
    dataset_blocks: u64,
    data: Vec<u8>,
    ops_since_flush: u64,
    /// Time in commit, apply, flush (printed to stderr: where a write's time goes).
    profile: [Duration; 3],
}

fn pg(i: u64) -> PgId {
    PgId::new(PoolId(1), i as u32)
}

impl Bench {
    fn location(&mut self) -> (ObjectId, u64) {
        let block = self.rng.next() % self.dataset_blocks;
        let per_object = OBJECT_BYTES / BS;
        (
            ObjectId {
                image: ImageId(1),
                index: block / per_object,
            },
            (block % per_object) * BS,
        )
    }

    /// One round: `writers` random 4 KiB writes, each appended to the log of the PG its
    /// object maps to, one commit for all, then all applied.
    fn write_round(&mut self, writers: u64) {
        let mut applies = Vec::with_capacity(writers as usize);
        for _ in 0..writers {
            let (o, off) = self.location();
            let p = pg(o.index % PGS);
            let index = self.s.log_bounds(p).1 + 1;
            let mut e = Entry::default();
            e.index = index;
            e.term = 1;
            e.data = self.data.clone().into();
            self.s.append_entries(p, &[e]).expect("append");
            applies.push((p, index, o, off));
        }
        let t = Instant::now();
        self.s.commit().expect("commit");
        self.profile[0] += t.elapsed();
        let t = Instant::now();
        for (p, index, o, off) in applies {
            self.s.write_object(p, o, off, &self.data).expect("apply");
            self.s.set_applied(p, index).expect("applied");
        }
        self.profile[1] += t.elapsed();
        self.ops_since_flush += writers;
        if self.ops_since_flush >= FLUSH_EVERY_OPS {
            let t = Instant::now();
            self.flush_and_compact();
            self.profile[2] += t.elapsed();
        }
    }

    fn flush_and_compact(&mut self) {
        self.s.flush().expect("flush");
        for w in 0..PGS {
            let p = pg(w);
            let to = self.s.flushed_applied_index(p);
            if to > 0 {
                self.s.compact(p, to).expect("compact");
            }
        }
        self.s.commit().expect("commit");
        self.ops_since_flush = 0;
    }

    fn run_writes(&mut self, writers: u64, seconds: f64) -> (f64, f64) {
        let start = Instant::now();
        let mut ops = 0u64;
        let mut lat = Duration::ZERO;
        while start.elapsed().as_secs_f64() < seconds {
            let t = Instant::now();
            self.write_round(writers);
            lat += t.elapsed();
            ops += writers;
        }
        let rounds = ops / writers;
        (
            ops as f64 / start.elapsed().as_secs_f64(),
            lat.as_secs_f64() * 1e6 / rounds as f64,
        )
    }

    fn run_reads(&mut self, depth: usize, seconds: f64) -> (f64, f64) {
        let mut bufs = vec![vec![0u8; BS as usize]; depth];
        let start = Instant::now();
        let mut ops = 0u64;
        while start.elapsed().as_secs_f64() < seconds {
            let locs: Vec<_> = (0..depth).map(|_| self.location()).collect();
            let mut reqs: Vec<ObjectRead<'_>> = bufs
                .iter_mut()
                .zip(&locs)
                .map(|(buf, (o, off))| ObjectRead {
                    pg: pg(o.index % PGS),
                    object: *o,
                    offset_bytes: *off,
                    buf,
                })
                .collect();
            self.s.read_objects(&mut reqs).expect("read");
            ops += depth as u64;
        }
        let el = start.elapsed().as_secs_f64();
        (ops as f64 / el, el * 1e6 / (ops / depth as u64) as f64)
    }

    /// Block-map lookups alone: `allocated_ranges` of one random 4 KiB block, no disk I/O
    /// (called after a flush: each lookup goes to the block cache or redb).
    fn run_lookups(&mut self, seconds: f64) -> (f64, f64) {
        let start = Instant::now();
        let mut ops = 0u64;
        while start.elapsed().as_secs_f64() < seconds {
            for _ in 0..1000 {
                let (o, off) = self.location();
                let r = self
                    .s
                    .allocated_ranges(pg(o.index % PGS), o, off, BS)
                    .expect("allocated_ranges");
                assert_eq!(r, vec![(off, BS)], "the dataset is written in full");
            }
            ops += 1000;
        }
        let el = start.elapsed().as_secs_f64();
        (ops as f64 / el, el * 1e6 / ops as f64)
    }

    /// Writes the whole dataset once, so reads hit mapped blocks.
    fn prefill(&mut self) {
        let per_object = OBJECT_BYTES / BS;
        let chunk = vec![0x5Au8; (1 << 20) as usize];
        for b in (0..self.dataset_blocks).step_by(256) {
            let o = ObjectId {
                image: ImageId(1),
                index: b / per_object,
            };
            self.s
                .write_object(pg(o.index % PGS), o, (b % per_object) * BS, &chunk)
                .expect("prefill");
            if b % 8192 == 0 {
                self.s.flush().expect("flush");
            }
        }
        self.s.flush().expect("flush");
    }
}

fn cache_report(test: &str, before: BlockCacheStats, after: BlockCacheStats) {
    eprintln!(
        "  {test} block cache: {} hits, {} misses (redb lookups), {} evictions",
        after.hits - before.hits,
        after.misses - before.misses,
        after.evictions - before.evictions
    );
}

fn main() {
    let args = Args::parse();
    let path = args.file;
    let (seconds, dataset_mib) = (args.seconds, args.dataset_mib);
    let sync = match args.sync {
        Sync::Dsync => SyncMode::DsyncWrites,
        Sync::Syscall => SyncMode::FdatasyncSyscall,
        Sync::Linked => SyncMode::Fdatasync,
        Sync::Twostep => SyncMode::TwoStep,
    };
    let data_with_commit = args.data_with_commit;
    let background = args.background;
    let block_cache_entries = args
        .block_cache_entries
        .unwrap_or(StoreOptions::default().block_cache_entries_max);
    let wal_bytes = 8 * (32u64 << 20);
    let file_bytes = wal_bytes + dataset_mib * 4 * (1 << 20) + (64 << 20);
    UringDisk::create_file(&path, file_bytes).expect("create file");
    let mut mkfs = MkfsOptions::new(*b"fastblock-bench!");
    mkfs.segment_size_bytes = 32 << 20;
    mkfs.segment_count = 8;
    mkfs.batch_bytes_max = 1 << 20;
    mkfs.force = true;
    let uring = UringOptions {
        sync_mode: sync,
        ..UringOptions::default()
    };
    let s = Store::open_path(
        &path,
        None,
        Some(&mkfs),
        uring,
        StoreOptions {
            data_with_commit,
            background_data_writes: background,
            block_cache_entries_max: block_cache_entries,
            ..StoreOptions::default()
        },
    )
    .expect("mkfs");
    let mut b = Bench {
        s,
        rng: Rng(0x1234_5678_9ABC_DEF1),
        dataset_blocks: dataset_mib * (1 << 20) / BS,
        data: vec![0xA5; BS as usize],
        ops_since_flush: 0,
        profile: [Duration::ZERO; 3],
    };
    b.prefill();
    for writers in [1u64, 32] {
        b.run_writes(writers, 1.0); // warm-up
        let before = b.s.block_cache_stats();
        let (iops, lat_us) = b.run_writes(writers, seconds);
        println!("engine_write_qd{writers} iops={iops:.0} lat_us={lat_us:.1}");
        let [c, a, f] = std::mem::take(&mut b.profile).map(|d| d.as_secs_f64());
        let ops = iops * seconds;
        eprintln!(
            "  qd{writers} time split: commit {c:.2} s, apply {a:.2} s ({:.1} us/op), flush {f:.2} s",
            a * 1e6 / ops
        );
        cache_report(
            &format!("write qd{writers}"),
            before,
            b.s.block_cache_stats(),
        );
    }
    for depth in [1usize, 32] {
        b.run_reads(depth, 1.0);
        let before = b.s.block_cache_stats();
        let (iops, lat_us) = b.run_reads(depth, seconds);
        println!("engine_read_qd{depth} iops={iops:.0} lat_us={lat_us:.1}");
        cache_report(&format!("read qd{depth}"), before, b.s.block_cache_stats());
    }
    // Nothing dirty: every lookup asks the block cache or redb.
    b.s.flush().expect("flush");
    b.run_lookups(1.0);
    let before = b.s.block_cache_stats();
    let (iops, lat_us) = b.run_lookups(seconds);
    println!("engine_lookup iops={iops:.0} lat_us={lat_us:.3}");
    cache_report("lookup", before, b.s.block_cache_stats());
}

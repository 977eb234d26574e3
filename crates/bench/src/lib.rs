//! block_bench (layer 5): the reference system's block benchmark over the fastblock client.
//!
//! Module map:
//! - [`config`]: the reference's JSON config keys and the same settings as flags.
//! - [`stamp`]: per-4-KiB-block stamps (image, offset, sequence, crc32c, PRNG fill) and their
//!   verification.
//! - [`stats`]: hdrhistogram latencies and the reference's report lines.
//! - [`cpu`]: this process's CPU time, reported per phase.
//! - [`cores`]: the `-m` core list and thread pinning.
//! - [`workload`]: one worker's share of a phase (IO slots, offsets, warm-up, verify).
//! - [`worker`]: the workers (one per `-m` core, each with its own thread, runtime and client).
//! - [`phase`]: one phase over all workers, their figures summed, the periodic lines.
//! - [`run`]: image setup and the whole run; `main.rs` only parses arguments, prints and
//!   picks the exit code.
//!
//! Invariants: no two writes to one offset are in flight together, so the sequence number last
//! acknowledged at an offset is what a later read must find; latency figures cover only IOs
//! that completed after the warm-up; the first IO error stops the run.

pub mod config;
pub mod cores;
pub mod cpu;
pub mod phase;
pub mod run;
pub mod stamp;
pub mod stats;
pub mod worker;
pub mod workload;

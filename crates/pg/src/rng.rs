//! The seeded generator behind election-timeout jitter (shared with the simulator).

pub use fastblock_types::rng::SplitMix64;

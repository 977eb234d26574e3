//! The NBD option and request parsers on arbitrary bytes must never panic, and what they
//! accept must respect the protocol's bounds (names and queries within 4096 bytes, counts
//! matching the bytes present, commands inside the export and the payload limit, only the
//! flags valid for each command).
//!
//! Run: `cargo +nightly fuzz run nbd_parse` (from `fuzz/`). The first byte picks the parser
//! (client flags and option header, option payload, request header under some negotiation,
//! read zero-runs and block-status descriptors); the properties live in
//! `fastblock_nbd::fuzzing::check`, which `crates/nbd/tests/no_panic.rs` also runs on stable.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    fastblock_nbd::fuzzing::check(data);
});

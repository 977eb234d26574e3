//! WAL recovery on arbitrary bytes must never panic or hang.
//!
//! Run: `cargo +nightly fuzz run wal_recovery` (from `fuzz/`). Each input is used twice:
//! as mutations (offset, length, bytes) over a valid canonical device image, which lets the
//! fuzzer get past checksums, and as a raw device image. The same property runs on stable in
//! `crates/store/tests/fuzz_recovery.rs`.
#![no_main]

use fastblock_store::fuzzing::{canonical_image, mutate, recover_image};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

static IMAGE: OnceLock<Vec<u8>> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    let mut image = IMAGE.get_or_init(canonical_image).clone();
    mutate(&mut image, data);
    let _ = recover_image(&image);
    let _ = recover_image(data);
});

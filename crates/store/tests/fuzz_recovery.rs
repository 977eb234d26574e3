//! The fuzz property without nightly: log recovery on arbitrary or mutated bytes returns a
//! value or a typed error, never panics. (The cargo-fuzz target in `fuzz/` runs the same
//! functions.)
// raft-rs messages (rust-protobuf) are built field by field, as raft-rs itself does.
#![allow(clippy::field_reassign_with_default)]

use fastblock_store::fuzzing::{canonical_image, mutate, recover_image};
use proptest::prelude::*;
use std::sync::OnceLock;

fn canonical() -> &'static [u8] {
    static IMAGE: OnceLock<Vec<u8>> = OnceLock::new();
    IMAGE.get_or_init(canonical_image)
}

fn cases() -> u32 {
    std::env::var("FASTBLOCK_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
        * 4
}

#[test]
fn canonical_image_recovers_every_entry() {
    // Guards the fuzz seed itself: if it stopped being valid, mutations would test nothing.
    let n = recover_image(canonical()).expect("canonical image recovers");
    assert!(n > 50, "only {n} entries");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn mutated_wal_never_panics(muts in prop::collection::vec((8192u32..(8192 + 4 * 32768), prop::collection::vec(any::<u8>(), 1..16)), 1..6)) {
        let mut img = canonical().to_vec();
        for (off, bytes) in muts {
            let mut data = off.to_le_bytes().to_vec();
            data.push(bytes.len() as u8);
            data.extend(bytes);
            mutate(&mut img, &data);
        }
        let _ = recover_image(&img);
    }

    #[test]
    fn arbitrary_bytes_never_panic(data in prop::collection::vec(any::<u8>(), 0..600)) {
        let mut img = canonical().to_vec();
        mutate(&mut img, &data);
        let _ = recover_image(&img);
        let _ = recover_image(&data);
    }
}

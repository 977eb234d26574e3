//! The fuzz target's properties (`fastblock_nbd::fuzzing::check`) on stable Rust: arbitrary
//! bytes through the option and request parsers never panic, and what they accept stays in
//! the protocol's bounds. `fuzz/fuzz_targets/nbd_parse.rs` explores the same space with
//! coverage guidance.
// NBD fields are big-endian; the test builds request headers by hand.
#![allow(clippy::big_endian_bytes)]

use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn arbitrary_bytes(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        fastblock_nbd::fuzzing::check(&data);
    }

    /// Well-formed headers with arbitrary fields reach validation (random bytes almost never
    /// carry the request magic).
    #[test]
    fn request_headers(
        flags in any::<u16>(),
        kind in 0u16..12,
        offset in any::<u64>(),
        length in any::<u32>(),
        knobs in any::<u8>(),
    ) {
        let mut data = vec![2u8];
        data.extend_from_slice(&[0x25, 0x60, 0x95, 0x13]);
        data.extend_from_slice(&flags.to_be_bytes());
        data.extend_from_slice(&kind.to_be_bytes());
        data.extend_from_slice(&[0; 8]);
        data.extend_from_slice(&offset.to_be_bytes());
        data.extend_from_slice(&length.to_be_bytes());
        data.push(knobs);
        fastblock_nbd::fuzzing::check(&data);
    }
}

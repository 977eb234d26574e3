//! The in-memory block cache (`objects/block_cache.rs`): it holds flushed block-map entries,
//! so a flush must leave it holding what the flush committed, and once a working set is in it
//! applying and reading need no redb lookup at all.
// raft-rs messages (rust-protobuf) are built field by field, as raft-rs itself does.
#![allow(clippy::field_reassign_with_default)]

mod common;
use common::*;
use fastblock_store::{SimDisk, Store, StoreOptions};

const BS: usize = 4096;

fn store(block_cache_entries_max: usize) -> Store<SimDisk> {
    let opts = StoreOptions {
        block_cache_entries_max,
        ..options()
    };
    new_sim_with(DEVICE_BYTES, opts).2
}

fn read(s: &mut Store<SimDisk>, o: u64, block: u64, blocks: usize) -> Vec<u8> {
    let mut buf = vec![0xEEu8; blocks * BS];
    s.read_object(pg(0), obj(o), block * BS as u64, &mut buf)
        .unwrap();
    buf
}

/// Compares without printing 4 KiB buffers.
#[track_caller]
fn same(got: Vec<u8>, want: &[u8], what: &str) {
    assert!(got == want, "{what} differs");
}

/// Cache sizes every test runs with: the default, and one so small that it evicts nearly at
/// every lookup.
const SIZES: [usize; 2] = [1 << 20, 2];

/// Goal: a flush that changes cached entries leaves the new values in the cache. Method: write
/// a block, flush, read it (the first write looked it up as a hole: cached); overwrite it and
/// a block cached as a hole, flush, read again; then a discard. A cache still holding the
/// entry from before a flush returns zeros, or the old block (its checksum still matches:
/// the freed block has not been reused).
#[test]
fn a_flushed_overwrite_reads_back_new_data() {
    for size in SIZES {
        let at = format!("cache size {size}");
        let mut s = store(size);
        s.write_object(pg(0), obj(1), 0, &pattern(1, BS)).unwrap();
        s.flush().unwrap();
        same(read(&mut s, 1, 0, 1), &pattern(1, BS), &at);
        same(read(&mut s, 1, 1, 1), &[0; BS], &at);
        s.write_object(pg(0), obj(1), 0, &pattern(2, 2 * BS))
            .unwrap();
        s.flush().unwrap();
        same(read(&mut s, 1, 0, 2), &pattern(2, 2 * BS), &at);
        s.zero_object(pg(0), obj(1), 0, BS as u64).unwrap();
        s.flush().unwrap();
        same(read(&mut s, 1, 0, 1), &[0; BS], &at);
        same(read(&mut s, 1, 1, 1), &pattern(2, 2 * BS)[BS..], &at);
    }
}

/// Goal: a flushed delete leaves no cached block behind. Method: write and read an object
/// (its blocks cached), delete it, flush, write one block of it again; the other blocks must
/// read as holes, not as the deleted object's blocks.
#[test]
fn a_deleted_and_recreated_object_reads_holes_as_zeros() {
    for size in SIZES {
        let at = format!("cache size {size}");
        let mut s = store(size);
        s.write_object(pg(0), obj(3), 0, &pattern(3, 4 * BS))
            .unwrap();
        s.flush().unwrap();
        same(read(&mut s, 3, 0, 4), &pattern(3, 4 * BS), &at);
        s.delete_object(pg(0), obj(3)).unwrap();
        s.flush().unwrap();
        s.write_object(pg(0), obj(3), 2 * BS as u64, &pattern(4, BS))
            .unwrap();
        let mut want = vec![0; 4 * BS];
        want[2 * BS..3 * BS].copy_from_slice(&pattern(4, BS));
        same(read(&mut s, 3, 0, 4), &want, &at);
        s.flush().unwrap();
        same(read(&mut s, 3, 0, 4), &want, &at);
        // An overwrite frees exactly the block it replaces (a write that saw a stale entry
        // would give back another object's block, or one already free).
        let free = s.free_data_bytes();
        s.write_object(pg(0), obj(3), 2 * BS as u64, &pattern(5, BS))
            .unwrap();
        s.flush().unwrap();
        assert_eq!(s.free_data_bytes(), free, "{at}");
    }
}

/// Goal: the point of the cache. Method: write a working set of 256 blocks once and flush;
/// then 4 000 random 4 KiB writes and reads with a flush every 100: with the default cache
/// not one lookup misses (each would be a redb lookup), and every read is right. A cache too
/// small for the set misses and evicts, and still reads right.
#[test]
fn steady_io_over_a_working_set_that_fits_needs_no_redb_lookup() {
    for size in [1 << 20, 64] {
        let mut s = store(size);
        let mut model = vec![0u64; 256];
        for (b, seed) in model.iter_mut().enumerate() {
            *seed = b as u64;
            s.write_object(
                pg(0),
                obj(b as u64 / 64),
                (b % 64 * BS) as u64,
                &pattern(b as u64, BS),
            )
            .unwrap();
        }
        s.flush().unwrap();
        let warm = s.block_cache_stats();
        let mut x = 0x9E37_79B9_u64;
        for op in 0..4000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let b = (x % 256) as usize;
            let (o, at) = (b as u64 / 64, (b % 64) as u64);
            if x >> 32 & 1 == 0 {
                model[b] = 1000 + op;
                s.write_object(pg(0), obj(o), at * BS as u64, &pattern(model[b], BS))
                    .unwrap();
            } else {
                same(read(&mut s, o, at, 1), &pattern(model[b], BS), "a read");
            }
            if op % 100 == 99 {
                s.flush().unwrap();
            }
        }
        let end = s.block_cache_stats();
        if size == 1 << 20 {
            assert_eq!(end.misses, warm.misses, "{end:?}");
            assert!(end.hits > warm.hits + 2000, "{end:?}");
            assert_eq!(end.evictions, 0);
        } else {
            assert!(end.misses > warm.misses + 1000, "{end:?}");
            assert!(end.evictions > 1000, "{end:?}");
            assert_eq!(end.entries, 64);
        }
    }
}

//! What fits one WAL batch. The store refuses (as an invalid argument, which fails the shard)
//! records larger than its batch limit, and `with_room` can only start a new batch, not
//! split a record. So log writes are cut into runs of entries that each fit an empty batch
//! (by bytes: a count of entries says nothing when one entry holds a 1 MiB write), and a
//! client mutation whose entry could never fit is refused at admission instead of taking
//! every replica of its PG down. Writes a shard proposed and has not answered are bounded too
//! ([`uncommitted_bytes_max`]), so that a leader that cannot commit does not fill its WAL.

use fastblock_store::wal::record::{entry_payload_bytes, RECORD_HEADER_BYTES};
use fastblock_store::wal::segment::BATCH_HEADER_BYTES;
use raft::eraftpb::Entry;

/// Bytes a client mutation's log entry adds to its data: the record and entry headers and
/// the encoded operation (object, offset, length), with a wide margin.
pub const MUTATION_OVERHEAD_BYTES: u64 = 4096;

/// Whether a mutation carrying `data_bytes` of data can be logged in a batch of
/// `batch_bytes_max`.
pub fn mutation_fits(data_bytes: u64, batch_bytes_max: u64) -> bool {
    BATCH_HEADER_BYTES as u64 + MUTATION_OVERHEAD_BYTES + data_bytes <= batch_bytes_max
}

/// The share of the WAL (one part in this many) that the data of writes proposed on a shard
/// and not yet answered may take.
pub const UNCOMMITTED_WAL_SHARE_DIVISOR: u64 = 4;

/// Data bytes of writes a shard may have proposed and not yet answered before it refuses
/// more with `Busy`. Only applied entries can be compacted, so a leader cut off from its
/// followers would otherwise keep logging writes it cannot commit until the WAL is full, and
/// the commit then fails with `NoSpace` and stops the shard (found by the simulator, scenario
/// `isolated_leader_with_a_full_wal_refuses_instead_of_failing`). A quarter leaves the rest
/// of the WAL to committed entries kept for lagging followers and to the other PGs. Since a
/// batch is at most a quarter of a segment and a WAL has at least 3 segments, this is at least
/// three batches: an idle shard always admits any write that fits one batch.
pub fn uncommitted_bytes_max(segment_size_bytes: u64, segment_count: u32) -> u64 {
    segment_size_bytes.saturating_mul(u64::from(segment_count)) / UNCOMMITTED_WAL_SHARE_DIVISOR
}

/// The share of the WAL (one part in this many) that the unanswered writes of one PG may
/// take, so that one PG that cannot commit (it lost its majority) refuses writes with `Busy`
/// on its own while the shard's other PGs keep the rest of the budget.
pub const PG_UNCOMMITTED_WAL_SHARE_DIVISOR: u64 = 16;

/// Data bytes of writes one PG may have proposed and not yet answered: a sixteenth of the
/// WAL, but at least one segment, so that any write that fits a batch is admitted on an idle
/// PG.
pub fn pg_uncommitted_bytes_max(segment_size_bytes: u64, segment_count: u32) -> u64 {
    (segment_size_bytes.saturating_mul(u64::from(segment_count)) / PG_UNCOMMITTED_WAL_SHARE_DIVISOR)
        .max(segment_size_bytes)
}

/// Bytes of an entry's WAL record.
pub(crate) fn record_bytes(entry: &Entry) -> usize {
    RECORD_HEADER_BYTES + entry_payload_bytes(entry)
}

/// How many of `entries`, from the first, have records that fit `room_bytes`, and their
/// bytes. A follower logs only that prefix of an append: a shorter append is one the leader
/// could have sent, and the leader sends the rest again once this one is acknowledged.
pub fn prefix_that_fits(entries: &[Entry], room_bytes: u64) -> (usize, u64) {
    let mut used = 0u64;
    for (i, entry) in entries.iter().enumerate() {
        let bytes = record_bytes(entry) as u64;
        if used + bytes > room_bytes {
            return (i, used);
        }
        used += bytes;
    }
    (entries.len(), used)
}

/// Cuts `entries` into consecutive runs whose records fit an empty batch of
/// `batch_bytes_max`. An entry too large even alone gets a run of its own (the store then
/// refuses it; admission keeps client entries below the limit).
pub fn batches(entries: &[Entry], batch_bytes_max: u64) -> Vec<&[Entry]> {
    let budget = (batch_bytes_max as usize).saturating_sub(BATCH_HEADER_BYTES);
    let mut out = Vec::new();
    let (mut start, mut used) = (0, 0usize);
    for (i, entry) in entries.iter().enumerate() {
        let bytes = record_bytes(entry);
        if i > start && used + bytes > budget {
            out.push(&entries[start..i]);
            (start, used) = (i, 0);
        }
        used += bytes;
    }
    if start < entries.len() {
        out.push(&entries[start..]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(data_bytes: usize) -> Entry {
        Entry {
            data: vec![0u8; data_bytes].into(),
            ..Entry::default()
        }
    }

    #[test]
    fn runs_fit_the_batch_and_keep_order() {
        let limit = 2u64 << 20;
        let entries: Vec<Entry> = (0..20).map(|_| entry(300 << 10)).collect();
        let runs = batches(&entries, limit);
        assert_eq!(runs.iter().map(|r| r.len()).sum::<usize>(), 20);
        for run in &runs {
            let bytes: usize = run.iter().map(record_bytes).sum();
            assert!(BATCH_HEADER_BYTES + bytes <= limit as usize);
        }
        // Six 300 KiB entries fit 2 MiB, a seventh does not.
        assert_eq!(runs[0].len(), 6);
        assert!(batches(&[], limit).is_empty());
        // A single oversized entry stands alone.
        let big = [entry(1), entry(3 << 20), entry(1)];
        assert_eq!(
            batches(&big, limit)
                .iter()
                .map(|r| r.len())
                .collect::<Vec<_>>(),
            [1, 1, 1]
        );
    }

    #[test]
    fn the_prefix_that_fits_stops_at_the_first_entry_over_the_room() {
        let entries: Vec<Entry> = [100, 200, 50].into_iter().map(entry).collect();
        let sizes: Vec<u64> = entries.iter().map(|e| record_bytes(e) as u64).collect();
        assert_eq!(prefix_that_fits(&entries, 0), (0, 0));
        assert_eq!(prefix_that_fits(&entries, sizes[0]), (1, sizes[0]));
        // The third would fit after the first, but a prefix cannot skip the second.
        assert_eq!(
            prefix_that_fits(&entries, sizes[0] + sizes[2]),
            (1, sizes[0])
        );
        let all: u64 = sizes.iter().sum();
        assert_eq!(prefix_that_fits(&entries, all), (3, all));
        assert_eq!(prefix_that_fits(&[], 0), (0, 0));
    }

    #[test]
    fn a_one_mib_write_fits_the_smallest_batch_mkfs_makes() {
        // mkfs makes batches of a quarter of an 8 MiB segment at least.
        assert!(mutation_fits(1 << 20, 2 << 20));
        assert!(!mutation_fits(4 << 20, 4 << 20));
    }

    #[test]
    fn an_idle_shard_admits_any_write_that_fits_a_batch() {
        // The smallest WAL the store accepts: 3 segments, batches of a quarter segment.
        let segment = 8u64 << 20;
        let batch = segment / 4;
        let budget = uncommitted_bytes_max(segment, 3);
        let largest = batch - BATCH_HEADER_BYTES as u64 - MUTATION_OVERHEAD_BYTES;
        assert!(mutation_fits(largest, batch) && !mutation_fits(largest + 1, batch));
        assert!(largest <= budget);
        assert!(largest <= pg_uncommitted_bytes_max(segment, 3));
        // mkfs's WAL: 16 segments, so 4 segments' worth may be uncommitted, one per PG.
        assert_eq!(uncommitted_bytes_max(segment, 16), 4 * segment);
        assert_eq!(pg_uncommitted_bytes_max(segment, 16), segment);
        assert_eq!(pg_uncommitted_bytes_max(segment, 64), 4 * segment);
        assert_eq!(uncommitted_bytes_max(u64::MAX, 16), u64::MAX / 4);
    }
}

//! How much one etcd transaction may carry, and the cutting of a long list of writes into
//! transactions that each fit. etcd refuses a request over `--max-request-bytes` (1.5 MiB by
//! default) and a transaction with more compares or operations than `--max-txn-ops` (128 by
//! default; the monitor's own member raises it, an external cluster may not). Both the
//! store's large commits (`crate::store`, "Large commits") and a restore (`crate::backup`)
//! cut their writes with [`batches`].

/// Bytes of keys and values one transaction puts: below etcd's 1.5 MiB request limit with
/// room for the compares and the framing.
pub const TXN_BYTES_MAX: usize = 1 << 20;
/// Operations one transaction carries: with one compare per put and the leader fence, below
/// the 128 of etcd's default `--max-txn-ops`, which an external etcd may have.
pub const TXN_OPS_MAX: usize = 64;
/// The `--max-txn-ops` the monitor's own etcd member runs with (`crate::etcd_proc`).
pub const OWN_MEMBER_MAX_TXN_OPS: usize = 4096;
/// Operations one transaction carries on the monitor's own member: a commit of a pool's
/// creation or of an event that changes thousands of PGs (one key each, `crate::keys`) goes
/// in a few transactions, not hundreds (each waits for etcd's disk). A quarter of the
/// member's limit, so the compares (one per operation) stay well within it.
pub const OWN_MEMBER_TXN_OPS_MAX: usize = OWN_MEMBER_MAX_TXN_OPS / 4;

/// Cuts `items` (in order) into runs of at most [`TXN_OPS_MAX`] items and at most
/// [`TXN_BYTES_MAX`] bytes by `size`; an item larger than the byte bound alone gets a run of
/// its own (etcd then judges it). Empty input, no run.
pub fn batches<T>(items: Vec<T>, size: impl Fn(&T) -> usize) -> Vec<Vec<T>> {
    batches_within(items, size, TXN_OPS_MAX, TXN_BYTES_MAX)
}

/// [`batches`] with runs of at most `ops_max` items (an etcd whose `--max-txn-ops` is known).
pub fn batches_of<T>(items: Vec<T>, size: impl Fn(&T) -> usize, ops_max: usize) -> Vec<Vec<T>> {
    batches_within(items, size, ops_max, TXN_BYTES_MAX)
}

fn batches_within<T>(
    items: Vec<T>,
    size: impl Fn(&T) -> usize,
    ops_max: usize,
    bytes_max: usize,
) -> Vec<Vec<T>> {
    let mut out: Vec<Vec<T>> = Vec::new();
    let mut run: Vec<T> = Vec::new();
    let mut bytes = 0usize;
    for item in items {
        let s = size(&item);
        if !run.is_empty() && (run.len() >= ops_max || bytes + s > bytes_max) {
            out.push(std::mem::take(&mut run));
            bytes = 0;
        }
        bytes += s;
        run.push(item);
    }
    if !run.is_empty() {
        out.push(run);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn runs_are_cut_by_count_and_by_bytes_and_an_oversized_item_stands_alone() {
        let sizes = vec![3, 3, 3, 3, 3];
        let runs = batches_within(sizes, |s| *s, 2, 100);
        assert_eq!(runs, vec![vec![3, 3], vec![3, 3], vec![3]]);
        let runs = batches_within(vec![4, 4, 4, 9, 1], |s| *s, 10, 8);
        assert_eq!(runs, vec![vec![4, 4], vec![4], vec![9], vec![1]]);
        assert!(batches_within(Vec::<usize>::new(), |s| *s, 2, 8).is_empty());
    }

    proptest! {
        /// Every item once, in order; each run within both bounds unless it is one item.
        #[test]
        fn runs_keep_every_item_in_order_within_the_bounds(
            sizes in proptest::collection::vec(0usize..50, 0..200),
            ops_max in 1usize..20,
            bytes_max in 1usize..120,
        ) {
            let runs = batches_within(sizes.clone(), |s| *s, ops_max, bytes_max);
            let flat: Vec<usize> = runs.iter().flatten().copied().collect();
            prop_assert_eq!(flat, sizes);
            for run in &runs {
                prop_assert!(!run.is_empty());
                prop_assert!(run.len() <= ops_max);
                prop_assert!(run.len() == 1 || run.iter().sum::<usize>() <= bytes_max);
            }
        }
    }
}

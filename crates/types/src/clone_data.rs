//! Where a copy-up puts the parent's data, block by block: the clone's head, a snapshot of
//! the clone, or nowhere (`docs/design/snapshots.md`, "Snapshots of clones").
//!
//! A clone reads an object it has not copied up from its parent snapshot, within an
//! **overlap**: its head's (the parent snapshot's size, cut by every shrink of the clone since),
//! or, for a snapshot of the clone, the head's overlap when that snapshot was taken. The
//! overlap only ever shrinks, so a snapshot's is at least the head's and at least every newer
//! snapshot's. When the object is copied up, every version that reads the parent must keep
//! reading the same bytes from the clone's own blocks:
//! - a block below the head's overlap is parent data for the head and for every snapshot: it
//!   goes into the head, born before every snapshot (birth 0), so that each snapshot sees it;
//! - a block at or beyond the head's overlap that some snapshot's overlap covers is parent
//!   data for exactly the snapshots whose overlap covers it, which are the oldest ones up to
//!   the newest such: it is kept for that snapshot (birth 0), so that it and every older one
//!   see it and no newer one does;
//! - a block no overlap covers reads zeros everywhere: it is not written.
//!
//! The PG leader decides this from its map when it admits a copy-up piece, and writes the
//! decision into the log entry, so that every replica applies the same.

use crate::SnapId;

/// Where one run of copied-up blocks goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CopyUpTarget {
    /// The clone's head.
    Head,
    /// Kept for this snapshot of the clone (or, if it was removed since, the newest older
    /// one still live; none: dropped).
    Snap(SnapId),
    /// Read as zeros by every version: not written.
    Drop,
}

impl CopyUpTarget {
    /// The log's encoding: 0 the head, `u64::MAX` dropped, else the snapshot id.
    pub fn to_u64(self) -> u64 {
        match self {
            CopyUpTarget::Head => 0,
            CopyUpTarget::Snap(s) => s.0,
            CopyUpTarget::Drop => u64::MAX,
        }
    }

    pub fn from_u64(v: u64) -> CopyUpTarget {
        match v {
            0 => CopyUpTarget::Head,
            u64::MAX => CopyUpTarget::Drop,
            s => CopyUpTarget::Snap(SnapId(s)),
        }
    }
}

/// Where each part of the image bytes `start..end` goes when copied up: runs of (end of the
/// run in image bytes, target), in order, the last ending at `end`. `head_overlap_bytes` is
/// the head's overlap; `snaps` the live snapshots of the clone with their overlaps, in any
/// order. The run boundaries are overlaps, so they fall on the image's 4 KiB granularity.
pub fn copy_up_runs(
    start: u64,
    end: u64,
    head_overlap_bytes: u64,
    snaps: &[(SnapId, u64)],
) -> Vec<(u64, CopyUpTarget)> {
    assert!(start <= end, "copy-up range {start}..{end}");
    // Snapshots by overlap, largest first: beyond the head's overlap, a byte at `x` belongs
    // to the newest snapshot among those whose overlap exceeds `x`.
    let mut bounds: Vec<(u64, CopyUpTarget)> = Vec::new();
    let mut by_overlap: Vec<(u64, SnapId)> = snaps
        .iter()
        .filter(|(_, ov)| *ov > head_overlap_bytes)
        .map(|(s, ov)| (*ov, *s))
        .collect();
    by_overlap.sort();
    // Walking up from the head's overlap: each overlap ends the runs of the snapshots whose
    // overlap it is; the target of `[previous bound, bound)` is the newest snapshot whose
    // overlap is at least `bound`.
    let mut at = head_overlap_bytes;
    bounds.push((head_overlap_bytes, CopyUpTarget::Head));
    for (i, (ov, _)) in by_overlap.iter().enumerate() {
        if *ov == at {
            continue;
        }
        let newest = by_overlap[i..]
            .iter()
            .map(|(_, s)| *s)
            .max()
            .expect("at least this snapshot");
        bounds.push((*ov, CopyUpTarget::Snap(newest)));
        at = *ov;
    }
    bounds.push((u64::MAX, CopyUpTarget::Drop));
    // Clip to start..end, merging runs with the same target.
    let mut runs: Vec<(u64, CopyUpTarget)> = Vec::new();
    let mut lo = 0u64;
    for (hi, target) in bounds {
        let (a, b) = (lo.max(start), hi.min(end));
        if a < b {
            match runs.last_mut() {
                Some((e, t)) if *t == target && *e == a => *e = b,
                _ => runs.push((b, target)),
            }
        }
        lo = hi;
    }
    if runs.is_empty() {
        runs.push((end, CopyUpTarget::Drop));
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;
    use CopyUpTarget::*;

    const K: u64 = 4096;

    #[test]
    fn without_snapshots_the_head_takes_its_overlap_and_the_rest_is_dropped() {
        assert_eq!(copy_up_runs(0, 8 * K, 8 * K, &[]), vec![(8 * K, Head)]);
        assert_eq!(
            copy_up_runs(4 * K, 12 * K, 8 * K, &[]),
            vec![(8 * K, Head), (12 * K, Drop)]
        );
        assert_eq!(copy_up_runs(8 * K, 9 * K, 8 * K, &[]), vec![(9 * K, Drop)]);
        assert_eq!(copy_up_runs(3 * K, 3 * K, 8 * K, &[]), vec![(3 * K, Drop)]);
    }

    #[test]
    fn beyond_the_head_each_byte_goes_to_the_newest_snapshot_whose_overlap_covers_it() {
        // Snapshots 1 (overlap 16K), 2 (12K), 3 (12K), 5 (4K = head's: sees nothing more).
        let snaps = [
            (SnapId(2), 12 * K),
            (SnapId(1), 16 * K),
            (SnapId(5), 4 * K),
            (SnapId(3), 12 * K),
        ];
        assert_eq!(
            copy_up_runs(0, 20 * K, 4 * K, &snaps),
            vec![
                (4 * K, Head),
                (12 * K, Snap(SnapId(3))),
                (16 * K, Snap(SnapId(1))),
                (20 * K, Drop)
            ]
        );
        assert_eq!(
            copy_up_runs(13 * K, 14 * K, 4 * K, &snaps),
            vec![(14 * K, Snap(SnapId(1)))]
        );
    }

    #[test]
    fn targets_survive_their_encoding() {
        for t in [Head, Drop, Snap(SnapId(1)), Snap(SnapId(SnapId::LIMIT - 1))] {
            assert_eq!(CopyUpTarget::from_u64(t.to_u64()), t);
        }
    }
}

//! Keeping the WAL ring moving when one PG cannot release its log.
//!
//! The WAL frees a segment only when no live entry is left in it, so a PG whose entries
//! cannot commit or apply (a leader that lost its majority, a deposed leader's leftover
//! tail) pins its oldest segment and, the WAL being a ring, every segment after it, while the
//! shard's other PGs keep writing. Before this, the commit then failed with `NoSpace` and the
//! whole OSD stopped (simulator seeds 7402521786782383011, 10718562395890590409,
//! 16959202575796627265, 9641297925560367563, 7112218500893266606).
//!
//! Two bounds and one move, as raft-engine does with its log rewrite:
//! - admission bounds the unanswered writes of the shard and of each PG
//!   ([`crate::wal_fit`]): such a PG alone refuses writes with `Busy`;
//! - when free segments fall to a quarter of the WAL, everything applied is flushed and
//!   compacted (as a full WAL did before);
//! - then the live entries of the PGs that still pin the oldest segment are re-appended at
//!   the head of the log. The old records become dead, and the segment is reused once the
//!   new records are durable (a roll happens only with the pending batch committed).

use crate::core::ShardCore;
use crate::error::{Operation, ShardFailure};
use crate::io::Effects;
use fastblock_store::Disk;
use fastblock_types::PgId;

/// One part in this many of the WAL's segments is kept free; below, the core relieves.
pub const WAL_FREE_SHARE_DIVISOR: u64 = 4;

impl<D: Disk + 'static> ShardCore<D> {
    /// Called when a step is done and no WAL commit is pending.
    pub(crate) fn relieve_wal_pressure(&mut self, eff: &mut Effects) {
        if self.failed.is_some() || self.commit_pending() {
            return;
        }
        let (free, segments) = {
            let store = self.store.borrow();
            (
                store.wal().free_segment_count(),
                u64::from(store.superblock().segment_count),
            )
        };
        let reserve = (segments / WAL_FREE_SHARE_DIVISOR).max(1);
        if free > reserve {
            return;
        }
        eff.probes.wal_pressure += 1;
        if let Err(e) = self.flush_and_compact(0) {
            self.fail(ShardFailure::store(Operation::Flush, None, e), eff);
            return;
        }
        let pinned = self.store.borrow().wal().oldest_pinned_segment();
        let Some((seq, pgs)) = pinned else {
            return;
        };
        for pg in pgs {
            match self.rewrite_log(pg) {
                Ok(entries) => {
                    tracing::info!(osd = %self.cfg.osd, shard = self.cfg.index, %pg, segment = seq, entries, "WAL: moved a PG's live entries forward to free its oldest segment");
                    eff.probes.log_rewrites += 1;
                }
                Err(e) => {
                    self.fail(ShardFailure::store(Operation::WalCommit, Some(pg), e), eff);
                    return;
                }
            }
        }
    }

    /// Re-appends every live entry of `pg`'s log (same indexes, terms and data) at the head of
    /// the WAL. Returns how many.
    fn rewrite_log(&mut self, pg: PgId) -> fastblock_store::Result<usize> {
        let mut store = self.store.borrow_mut();
        let (first, last) = store.log_bounds(pg);
        if first > last {
            return Ok(0);
        }
        let entries = store.entries(pg, first, last + 1, None)?;
        let batch_bytes_max = store.superblock().batch_bytes_max;
        for chunk in crate::wal_fit::batches(&entries, batch_bytes_max) {
            crate::core::with_room(&mut store, |s| s.append_entries(pg, chunk))?;
        }
        assert_eq!(
            store.log_bounds(pg),
            (first, last),
            "pg {pg}: a rewrite keeps the log's bounds"
        );
        Ok(entries.len())
    }
}

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
//! - when free segments fall to a quarter of the WAL plus one, snapshot transfers are
//!   abandoned (their log floors would pin the ring) and everything applied is flushed and
//!   compacted (as a full WAL did before); what is left live is about the unanswered writes,
//!   at most a quarter of the WAL;
//! - then the live entries of the PGs that still pin the oldest segment are re-appended at
//!   the head of the log, if they fit the free space, and committed. The store moves an entry
//!   whose index and term it holds to its new record without touching the entries after it
//!   (Raft's log matching), so a move cut short by a crash loses nothing; the old segment is
//!   reused once no live entry is left in it.

use crate::core::ShardCore;
use crate::error::{Operation, ShardFailure};
use crate::io::Effects;
use fastblock_store::Disk;
use fastblock_types::PgId;

/// One part in this many of the WAL's segments (plus one segment) is kept free; below, the
/// core relieves. A quarter holds what can be left live after compaction (the unanswered
/// writes, bounded by `wal_fit::uncommitted_bytes_max`), the extra segment the headers and
/// checkpoints of the segments the move opens.
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
        let reserve = segments / WAL_FREE_SHARE_DIVISOR + 1;
        if free > reserve {
            return;
        }
        eff.probes.wal_pressure += 1;
        let abandoned = self.abandon_all_sends();
        eff.probes.transfers_abandoned += abandoned as u64;
        if let Err(e) = self.flush_and_compact(0) {
            self.fail(ShardFailure::store(Operation::Flush, None, e), eff);
            return;
        }
        let pinned = self.store.borrow().wal().oldest_pinned_segment();
        let Some((seq, pgs)) = pinned else {
            return;
        };
        // Only a move that fits: half of each free segment counts (the rest is room for
        // segment headers and checkpoints, with a wide margin).
        let (needed, room) = {
            let store = self.store.borrow();
            let needed: u64 = pgs.iter().map(|pg| store.wal().live_entry_bytes(*pg)).sum();
            let room =
                store.wal().free_segment_count() * (store.superblock().segment_size_bytes / 2);
            (needed, room)
        };
        if needed > room {
            eff.probes.log_rewrites_skipped += 1;
            tracing::warn!(osd = %self.cfg.osd, shard = self.cfg.index, segment = seq, needed, room, "WAL: the live entries pinning the oldest segment do not fit the free space; not moved");
            return;
        }
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
        // Durable before anything reads the moved entries back from their new records.
        store.commit()?;
        Ok(entries.len())
    }
}

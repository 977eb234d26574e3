//! Keeping the WAL ring moving when one PG cannot release its log.
//!
//! The WAL frees a segment only when no live entry is left in it, so a PG whose entries
//! cannot commit or apply (a leader that lost its majority, a deposed leader's leftover
//! tail) pins its oldest segment and, the WAL being a ring, every segment after it, while the
//! shard's other PGs keep writing. Before this, the commit then failed with `NoSpace` and the
//! whole OSD stopped (simulator seeds 7402521786782383011, 10718562395890590409,
//! 16959202575796627265, 9641297925560367563, 7112218500893266606).
//!
//! A routine flush already keeps the ring from filling with retained tails: once half of
//! the segments are used it compacts each PG's log to what members and transfers need
//! ([`Keep::Members`]). What follows is for the PGs that pin the ring anyway.
//!
//! Two bounds and one move, as raft-engine does with its log rewrite:
//! - admission bounds the unanswered writes of the shard and of each PG
//!   ([`crate::wal_fit`]): such a PG alone refuses writes with `Busy`;
//! - when free segments fall to a quarter of the WAL plus one, everything applied is flushed
//!   and compacted (keeping only the log behind snapshots being sent); what is left live is
//!   about the unanswered writes (at most a quarter of the WAL) and those logs;
//! - then the live entries of the PGs that still pin the oldest segment are re-appended at
//!   the head of the log, if they fit the free space, and committed;
//! - only if that moved nothing and the WAL is still pressed are the snapshot transfers
//!   abandoned (their log floors go, compaction and the move run again): a transfer is
//!   abandoned when the ring truly cannot keep its log, not each time the ring comes round. The store moves an entry
//!   whose index and term it holds to its new record without touching the entries after it
//!   (Raft's log matching), so a move cut short by a crash loses nothing; the old segment is
//!   reused once no live entry is left in it.
//!
//! And followers take in no more than the WAL can hold ([`ShardCore::append_room_bytes`]):
//! an append is trimmed to the entries that fit, the leader sends the rest again.

use crate::core::ShardCore;
use crate::error::{Operation, ShardFailure};
use crate::flush::Keep;
use crate::io::Effects;
use fastblock_store::Disk;
use fastblock_types::PgId;

/// One part in this many of the WAL's segments (plus one segment) is kept free; below, the
/// core relieves. A quarter holds what can be left live after compaction (the unanswered
/// writes, bounded by `wal_fit::uncommitted_bytes_max`), the extra segment the headers and
/// checkpoints of the segments the move opens.
pub const WAL_FREE_SHARE_DIVISOR: u64 = 4;
/// While more than one part in this many of the WAL's segments is free, a routine flush
/// keeps `log_retain_entries` of each PG's log; at or below it, only what members and
/// transfers need ([`Keep::Members`]), so that the relief above stays a last resort.
pub const WAL_RETAIN_FREE_SHARE_DIVISOR: u64 = 2;

impl<D: Disk + 'static> ShardCore<D> {
    /// Bytes of log records a follower may still take in before its next commit: half of
    /// each free segment (the other half is a margin for batch headers and padding, as for a
    /// move, and for the leaders' own proposals), less the records staged and not committed
    /// and those the replicas' outputs hold for the next round. While a slow commit is in flight, leaders keep sending appends;
    /// taken whole, they made a log write larger than the WAL and the commit failed with
    /// `NoSpace`, stopping the shard (simulator, seed 14852178357259321636 with
    /// `--membership`). Appends are trimmed to this room instead (`admission`).
    pub(crate) fn append_room_bytes(&self) -> u64 {
        let store = self.store.borrow();
        let wal = store.wal();
        let room = wal.free_segment_count() * (store.superblock().segment_size_bytes / 2);
        let waiting: u64 = self
            .outs
            .values()
            .flat_map(|o| &o.log_writes)
            .flat_map(|w| &w.entries)
            .map(|e| crate::wal_fit::record_bytes(e) as u64)
            .sum();
        room.saturating_sub(wal.pending_bytes())
            .saturating_sub(waiting)
    }

    /// Called when a step is done and no WAL commit is pending. Cheapest relief first:
    /// compaction of everything applied (keeping the log behind snapshots being sent), then
    /// moving the live entries that pin the oldest segment; only if the WAL is still pressed
    /// are the transfers abandoned, so that their log floors go too. Abandoning first, as
    /// before, restarted a transfer each time the ring came round: under steady writes a
    /// transfer that outlasts a few segments never finished, and the receiver's aborted
    /// stagings filled its data area (simulator, seed 624121348245308800).
    pub(crate) fn relieve_wal_pressure(&mut self, eff: &mut Effects) {
        if self.failed.is_some() || self.commit_pending() || !self.wal_pressed() {
            return;
        }
        eff.probes.wal_pressure += 1;
        if let Err(e) = self.flush_and_compact(Keep::Nothing) {
            self.fail(ShardFailure::store(Operation::Flush, None, e), eff);
            return;
        }
        if !self.wal_pressed() || self.move_pinned_entries(eff) || self.failed.is_some() {
            return;
        }
        let abandoned = self.abandon_all_sends();
        eff.probes.transfers_abandoned += abandoned as u64;
        if abandoned == 0 {
            return;
        }
        tracing::info!(osd = %self.cfg.osd, shard = self.cfg.index, abandoned, "WAL pressed: snapshot transfers abandoned to free their log");
        if let Err(e) = self.flush_and_compact(Keep::Nothing) {
            self.fail(ShardFailure::store(Operation::Flush, None, e), eff);
            return;
        }
        if self.wal_pressed() {
            self.move_pinned_entries(eff);
        }
    }

    /// Whether more than [`WAL_RETAIN_FREE_SHARE_DIVISOR`]'s share of the WAL's segments is
    /// free: room for the retained tails of the PGs' logs.
    pub(crate) fn wal_has_retain_room(&self) -> bool {
        let store = self.store.borrow();
        let segments = u64::from(store.superblock().segment_count);
        store.wal().free_segment_count() > segments / WAL_RETAIN_FREE_SHARE_DIVISOR
    }

    /// Whether free WAL segments are down to the reserve.
    fn wal_pressed(&self) -> bool {
        let store = self.store.borrow();
        let segments = u64::from(store.superblock().segment_count);
        store.wal().free_segment_count() <= segments / WAL_FREE_SHARE_DIVISOR + 1
    }

    /// Moves the live entries of the PGs that pin the oldest segment to the head of the log,
    /// if they fit the free space. Returns whether it moved anything.
    fn move_pinned_entries(&mut self, eff: &mut Effects) -> bool {
        let pinned = self.store.borrow().wal().oldest_pinned_segment();
        let Some((seq, pgs)) = pinned else {
            return false;
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
            return false;
        }
        for pg in pgs {
            match self.rewrite_log(pg) {
                Ok(entries) => {
                    tracing::info!(osd = %self.cfg.osd, shard = self.cfg.index, %pg, segment = seq, entries, "WAL: moved a PG's live entries forward to free its oldest segment");
                    eff.probes.log_rewrites += 1;
                }
                Err(e) => {
                    self.fail(ShardFailure::store(Operation::WalCommit, Some(pg), e), eff);
                    return false;
                }
            }
        }
        true
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

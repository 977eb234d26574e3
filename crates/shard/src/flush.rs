//! Flush and compaction. A flush makes applied data and metadata durable; only then may the
//! log behind them be compacted (minus a retained tail for lagging followers), which is what
//! frees WAL segments.
//!
//! The flush's metadata commit (milliseconds of redb page writes and an fsync) runs in the
//! store's flush runner — a thread of the OSD, or the simulator's deferred runner — and the
//! runtime steps `FlushDone` when it finished: compaction follows then.

use crate::core::ShardCore;
use crate::error::{Operation, ShardFailure};
use crate::io::Effects;
use crate::stage::Stage;
use fastblock_store::Disk;
use fastblock_types::PgId;

/// The longest a due flush waits for the WAL to go idle (see [`ShardCore::maybe_flush`]):
/// short against the flush interval (1 s), long against a WAL commit (about 0.1-1 ms).
pub const FLUSH_WAL_IDLE_WAIT_MAX_US: u64 = 50_000;

impl<D: Disk + 'static> ShardCore<D> {
    /// `FlushDue`: starts a flush if anything was applied since the last one, or if blocks
    /// wait to be freed (only a flush gives them back: a replica that applies nothing while
    /// its snapshot transfers are aborted would otherwise never get their staging back). A
    /// flush still running makes this one a no-op (the next timer tries again).
    ///
    /// A flush makes the WAL durable before anything else (flushed state never runs ahead of
    /// the log), on the shard's thread: with a commit in flight or due, that is a wait for a
    /// device flush, which every request of the shard shares. So a due flush first waits for
    /// a moment when the WAL is idle (at low queue depth, right after a commit completes;
    /// `settle` tries again after every step; records staged with nothing in flight are
    /// committed for it), for at most [`FLUSH_WAL_IDLE_WAIT_MAX_US`]: a shard whose WAL is
    /// never idle flushes anyway.
    pub(crate) fn maybe_flush(&mut self, eff: &mut Effects) {
        let frees_waiting = self.store.borrow().pending_free_bytes() > 0;
        if !(self.applied_since_flush || frees_waiting) || self.failed.is_some() {
            self.flush_wanted_since = None;
            return;
        }
        if !self.wal_idle() {
            let since = *self.flush_wanted_since.get_or_insert(self.now);
            if self.now.since(since) < FLUSH_WAL_IDLE_WAIT_MAX_US {
                // Records staged with nothing in flight (hard states that need no sync of
                // their own) go out in a commit of their own rather than in the flush's, on
                // this thread.
                self.commit_staged(eff);
                return;
            }
        }
        self.flush_wanted_since = None;
        // What starting a flush holds the shard's thread for (the data's sync and the
        // metadata commit run on the flush runner, once the staged data handed to the disk
        // here is written): the WAL records staged, and whatever a slow disk takes to
        // accept the stage's write.
        let start = self.metrics_now();
        let begun = self.store.borrow_mut().flush_begin();
        if matches!(begun, Ok(true)) {
            eff.stage(Stage::FlushStart, start, self.metrics_now());
        }
        match begun {
            Ok(true) => {
                self.applied_since_flush = false;
                self.flush_started = Some(self.now);
                self.flush_wal_seq = self.store.borrow().wal().current_segment_seq();
                eff.flush_started = true;
                // A runner without a thread may have finished already.
                self.poll_flush(eff);
            }
            Ok(false) => {}
            Err(e) => self.fail(ShardFailure::store(Operation::Flush, None, e), eff),
        }
    }

    /// Flushes before the interval is up once the log has advanced by a share of the WAL
    /// since the last flush began: a burst of writes (a sequential 1 MiB stream writes
    /// 100+ MiB/s per OSD) would otherwise fill the WAL between two flushes, since only a
    /// flush lets the log be compacted.
    pub(crate) fn flush_if_wal_advanced(&mut self, eff: &mut Effects) {
        if !self.applied_since_flush || self.failed.is_some() {
            return;
        }
        let (seq, segments) = {
            let store = self.store.borrow();
            (
                store.wal().current_segment_seq(),
                u64::from(store.superblock().segment_count),
            )
        };
        let share = (segments / self.cfg.flush_wal_share_divisor.max(1)).max(1);
        if seq >= self.flush_wal_seq + share {
            self.maybe_flush(eff);
        }
    }

    /// `FlushDone` (and after starting a flush): compacts the logs once the flush is durable.
    pub(crate) fn poll_flush(&mut self, eff: &mut Effects) {
        if self.failed.is_some() {
            return;
        }
        let polled = self.store.borrow_mut().flush_poll();
        match polled {
            Ok(None) => {}
            Ok(Some(_)) => {
                if let Some(start) = self.flush_started.take() {
                    eff.stage(Stage::Flush, start, self.now);
                }
                let keep = self.routine_keep();
                if let Err(e) = self.compact_logs(keep) {
                    self.fail(ShardFailure::store(Operation::Compaction, None, e), eff);
                }
            }
            Err(e) => self.fail(ShardFailure::store(Operation::Flush, None, e), eff),
        }
    }

    /// What a flush that finished in the normal course keeps of each PG's log: the
    /// configured tail while the WAL has room for it, only what members and transfers need
    /// once it is half used (see [`Keep::Members`]).
    pub(crate) fn routine_keep(&self) -> Keep {
        if self.wal_has_retain_room() {
            Keep::Retained(self.cfg.log_retain_entries)
        } else {
            Keep::Members
        }
    }

    /// Flushes applied state now (waiting for a running metadata commit first), then compacts
    /// each PG's log, keeping `keep`.
    pub(crate) fn flush_and_compact(&mut self, keep: Keep) -> fastblock_store::Result<()> {
        self.store.borrow_mut().flush()?;
        self.compact_logs(keep)
    }

    /// Compacts each PG's log behind its flushed applied index, keeping `keep`.
    fn compact_logs(&mut self, keep: Keep) -> fastblock_store::Result<()> {
        let mut store = self.store.borrow_mut();
        for (pg, hosted) in &self.pgs {
            let flushed = store.flushed_applied_index(*pg);
            let (first, _) = store.log_bounds(*pg);
            let target = compaction_target(
                flushed,
                keep,
                self.cfg.log_lag_max_entries,
                hosted.replica.min_match_index().map(|m| m.0),
                self.recovery.sending_index(*pg),
            );
            if target >= first {
                store.compact(*pg, target)?;
            }
        }
        Ok(())
    }

    /// Forgets per-PG bookkeeping of a PG this shard no longer hosts.
    pub(crate) fn forget_pg(&mut self, pg: PgId) {
        self.persisted_numbers_forget(pg);
    }
}

/// How much of a PG's log a compaction keeps behind what is flushed as applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    /// This many entries (`--log-retain-entries`: a member that falls a little behind, or a
    /// new leader's followers, catch up from the log rather than by snapshot), and what
    /// lagging members and snapshots being sent need.
    Retained(u64),
    /// Only what lagging members and snapshots being sent need. Once the WAL is half used a
    /// routine flush keeps no more: the WAL is a ring, so the oldest retained entry of any
    /// PG pins every segment after it. With 32 PGs taking uniform writes, 1,024 entries each
    /// span the last 32 Ki writes: at 14k 3-replica writes a second that pinned a 256 MiB
    /// WAL down to its pressed level, and every OSD went into the relief of a pressed WAL
    /// about every two seconds, holding its shard for the 15-30 ms of a flush inline (the
    /// QD32 write p99.9: 24-27 ms before this rule, 12-13 ms after, 2026-11-27).
    Members,
    /// Only what snapshots being sent need: the WAL is pressed or full (their transfers are
    /// abandoned next if that is not enough).
    Nothing,
}

/// The index up to which a PG's log may be compacted: what `keep` says behind what is
/// flushed as applied; on a leader (unless [`Keep::Nothing`]), not past what some member
/// still lacks (so a member that was down catches up from the log), unless that member is
/// more than `lag_max` behind (it gets a snapshot instead); and never past a snapshot being
/// sent (which is exact only with the log after its index, see `fastblock_pg::transfer`). A
/// full WAL compacts with [`Keep::Nothing`] after abandoning the transfers, so neither floor
/// pins a full WAL.
pub fn compaction_target(
    flushed: u64,
    keep: Keep,
    lag_max: u64,
    min_match: Option<u64>,
    sending: Option<u64>,
) -> u64 {
    let retain = match keep {
        Keep::Retained(entries) => entries,
        Keep::Members | Keep::Nothing => 0,
    };
    let mut target = flushed.saturating_sub(retain);
    if keep != Keep::Nothing {
        if let Some(matched) = min_match {
            let floor = flushed.saturating_sub(lag_max);
            target = target.min(matched.max(floor));
        }
    }
    if let Some(index) = sending {
        target = target.min(index);
    }
    target
}

#[cfg(test)]
mod tests {
    use super::{compaction_target, Keep};

    #[test]
    fn compaction_keeps_what_lagging_members_and_transfers_need() {
        let retain = Keep::Retained(10);
        // Retain 10 behind flushed 100.
        assert_eq!(compaction_target(100, retain, 50, None, None), 90);
        // A member at 70 keeps the log from 71 on.
        assert_eq!(compaction_target(100, retain, 50, Some(70), None), 70);
        // One further behind than lag_max gets a snapshot: the floor is 100 - 50.
        assert_eq!(compaction_target(100, retain, 50, Some(20), None), 50);
        // A snapshot being sent at 40 keeps the log after 40.
        assert_eq!(compaction_target(100, retain, 50, Some(70), Some(40)), 40);
        // A half-used WAL keeps no tail of its own, but still what members lack.
        assert_eq!(compaction_target(100, Keep::Members, 50, None, None), 100);
        assert_eq!(
            compaction_target(100, Keep::Members, 50, Some(70), None),
            70
        );
        assert_eq!(
            compaction_target(100, Keep::Members, 50, Some(20), None),
            50
        );
        assert_eq!(
            compaction_target(100, Keep::Members, 50, Some(99), Some(40)),
            40
        );
        // A full WAL ignores lagging members, not transfers (those are abandoned first).
        assert_eq!(
            compaction_target(100, Keep::Nothing, 50, Some(20), None),
            100
        );
        assert_eq!(
            compaction_target(100, Keep::Nothing, 50, Some(20), Some(40)),
            40
        );
    }
}

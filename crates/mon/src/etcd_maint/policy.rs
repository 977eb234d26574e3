//! The decisions of etcd's upkeep as pure functions (no etcd, no clock): how far to compact,
//! when a member needs a defragmentation, and whether an out-of-space alarm may be cleared.
//! `super` performs them; the reasoning is in `docs/operations.md`, "Monitor database".
//!
//! Why the monitor compacts with explicit calls rather than etcd's `--auto-compaction-*`: the
//! monitor's own member could take the flag, but an external etcd (`--etcd-endpoints`) is set up
//! by someone else, and only the monitor knows how much it writes: a single pool key can be
//! hundreds of KiB, so a retention counted in revisions alone lets history grow to gigabytes
//! between two rounds. The leader counts the bytes of every commit it makes ([`CommitLog`]) and
//! keeps at most `history_revisions` revisions and at most `history_bytes` of its writes.
//! Nothing in fastblock reads old revisions (the monitors load the current state; nobody
//! watches etcd), so the history kept is a courtesy to an operator's `etcdctl watch`, and
//! revisions written before this monitor led, whose size it does not know, are not kept past
//! its first round.

use std::collections::VecDeque;
use std::time::Duration;

/// How the upkeep is tuned (flags of `fastblock-mon`, `docs/config.md`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct UpkeepSettings {
    /// The quota each member enforces (`--etcd-quota-bytes`, passed to the own member as
    /// `--quota-backend-bytes`; an external etcd must be given the same).
    pub quota_bytes: u64,
    /// `MON_ETCD_NEARFULL` at this share of the quota, in parts per million.
    pub nearfull_ratio_ppm: u32,
    /// Revisions kept by a compaction.
    pub history_revisions: u64,
    /// Bytes of the monitor's writes kept by a compaction; writing more than this since the
    /// last compaction starts one at once.
    pub history_bytes: u64,
    /// How often every member is defragmented whatever its free space (0: never on a
    /// schedule, only past the threshold).
    pub defrag_interval: Duration,
    /// A member whose free pages make up this share of its file (parts per million), and at
    /// least [`DEFRAG_FREE_BYTES_MIN`], is defragmented.
    pub defrag_free_ratio_ppm: u32,
}

/// Free pages below this are never worth a defragmentation, whatever their share: the file is
/// small, and a defragmentation blocks the member while it runs.
pub const DEFRAG_FREE_BYTES_MIN: u64 = 4 << 20;

/// Commits remembered: enough for the default `history_revisions` with room to spare; older
/// ones are only ever compacted away.
pub const COMMIT_LOG_ENTRIES_MAX: usize = 1 << 16;

/// What the leader wrote, per revision, since it took over.
#[derive(Clone, Debug, Default)]
pub struct CommitLog {
    /// (revision, bytes of keys and values written), oldest first.
    entries: VecDeque<(u64, u64)>,
    /// Bytes written since the last compaction.
    bytes_since_compaction: u64,
}

impl CommitLog {
    /// Records one commit at `revision` that wrote `bytes` (keys and values).
    pub fn record(&mut self, revision: u64, bytes: u64) {
        if let Some(&(last, _)) = self.entries.back() {
            assert!(
                revision > last,
                "etcd revisions rise: {revision} after {last}"
            );
        }
        self.entries.push_back((revision, bytes));
        if self.entries.len() > COMMIT_LOG_ENTRIES_MAX {
            self.entries.pop_front();
        }
        self.bytes_since_compaction += bytes;
    }

    /// Whether so much was written since the last compaction that the next should not wait
    /// for its interval.
    pub fn compaction_due(&self, history_bytes: u64) -> bool {
        self.bytes_since_compaction > history_bytes
    }

    /// Forgets what a compaction to `revision` removed.
    pub fn compacted(&mut self, revision: u64) {
        while self.entries.front().is_some_and(|&(r, _)| r < revision) {
            self.entries.pop_front();
        }
        self.bytes_since_compaction = 0;
    }

    /// The first revision this leader wrote, if it wrote any it still remembers.
    fn first_revision(&self) -> Option<u64> {
        self.entries.front().map(|&(r, _)| r)
    }
}

/// The revision to compact to, or `None` if the history is within bounds already. `current` is
/// the store's revision, `compacted` the last compaction's (0 if none is known). Compacting to
/// `r` keeps every revision from `r` on.
pub fn compaction_target(
    log: &CommitLog,
    current: u64,
    compacted: u64,
    settings: &UpkeepSettings,
) -> Option<u64> {
    // By count: the last `history_revisions` revisions.
    let by_count = current.saturating_sub(settings.history_revisions);
    // By bytes: back to the oldest of the newest commits whose writes fit the budget, and no
    // further back than the first commit this leader remembers (what came before is of
    // unknown size); the current revision if no commit fits or none is remembered.
    let mut by_bytes = log.first_revision().unwrap_or(current);
    let mut kept_bytes = 0u64;
    let mut oldest_kept = current;
    for &(revision, bytes) in log.entries.iter().rev() {
        kept_bytes = kept_bytes.saturating_add(bytes);
        if kept_bytes > settings.history_bytes {
            by_bytes = oldest_kept;
            break;
        }
        oldest_kept = revision;
    }
    let target = by_count.max(by_bytes).min(current);
    debug_assert!(target <= current);
    (target > compacted).then_some(target)
}

/// Why a member is to be defragmented.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DefragReason {
    /// The store raised `NOSPACE`: the pages compaction freed must go back to make room.
    NoSpace,
    /// Free pages passed the share of the file (`defrag_free_ratio_ppm`).
    FreeSpace,
    /// The schedule (`defrag_interval`) came round.
    Schedule,
}

/// Whether a member with a database file of `db_bytes` holding `in_use_bytes` of data needs a
/// defragmentation (under `NOSPACE`, as soon as anything in it is free); `since_last` is the
/// time since this monitor last defragmented it, or since it started (`None`: unknown, the
/// schedule is due).
pub fn defrag_reason(
    db_bytes: u64,
    in_use_bytes: u64,
    nospace: bool,
    since_last: Option<Duration>,
    settings: &UpkeepSettings,
) -> Option<DefragReason> {
    let free = db_bytes.saturating_sub(in_use_bytes);
    if nospace {
        // Any free page helps, however few: the caller limits how often.
        return (free > 0).then_some(DefragReason::NoSpace);
    }
    if free < DEFRAG_FREE_BYTES_MIN {
        return None;
    }
    let share_ppm = (u128::from(free) * 1_000_000 / u128::from(db_bytes.max(1))) as u32;
    if share_ppm >= settings.defrag_free_ratio_ppm {
        return Some(DefragReason::FreeSpace);
    }
    let scheduled = !settings.defrag_interval.is_zero()
        && since_last.is_none_or(|t| t >= settings.defrag_interval);
    scheduled.then_some(DefragReason::Schedule)
}

/// Whether an out-of-space alarm may be cleared: every member's file is back below the
/// nearfull share of the quota (clearing it earlier would only let etcd raise it again at the
/// next write, with the monitor's state half written).
pub fn room_made(db_sizes: &[u64], settings: &UpkeepSettings) -> bool {
    let limit = (u128::from(settings.quota_bytes) * u128::from(settings.nearfull_ratio_ppm)
        / 1_000_000) as u64;
    !db_sizes.is_empty() && db_sizes.iter().all(|&b| b < limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> UpkeepSettings {
        UpkeepSettings {
            quota_bytes: 100 << 20,
            nearfull_ratio_ppm: 800_000,
            history_revisions: 10,
            history_bytes: 1000,
            defrag_interval: Duration::from_secs(3600),
            defrag_free_ratio_ppm: 500_000,
        }
    }

    #[test]
    fn compaction_keeps_the_newest_revisions_by_count() {
        let mut log = CommitLog::default();
        for r in 1..=50 {
            log.record(r, 1);
        }
        assert_eq!(compaction_target(&log, 50, 0, &settings()), Some(40));
        assert_eq!(compaction_target(&log, 50, 40, &settings()), None);
        log.compacted(40);
        assert_eq!(log.first_revision(), Some(40));
        assert!(!log.compaction_due(1000));
    }

    #[test]
    fn compaction_keeps_the_newest_writes_by_bytes() {
        let mut log = CommitLog::default();
        for r in 41..=50 {
            log.record(r, 300);
        }
        assert!(log.compaction_due(1000));
        // 300 bytes a revision: 48, 49 and 50 fit 1000 bytes.
        assert_eq!(compaction_target(&log, 50, 0, &settings()), Some(48));
        // A revision written by someone else (no commit of ours) at 51: counted by number.
        assert_eq!(compaction_target(&log, 51, 0, &settings()), Some(48));
    }

    #[test]
    fn history_from_before_this_leader_goes_at_its_first_round() {
        let mut log = CommitLog::default();
        log.record(1000, 10);
        log.record(1001, 10);
        assert_eq!(compaction_target(&log, 1001, 0, &settings()), Some(1000));
        // Nothing written yet: back to the current revision.
        let empty = CommitLog::default();
        assert_eq!(compaction_target(&empty, 1001, 0, &settings()), Some(1001));
        assert_eq!(compaction_target(&empty, 1001, 1001, &settings()), None);
    }

    #[test]
    #[should_panic(expected = "etcd revisions rise")]
    fn a_revision_that_goes_back_is_a_bug() {
        let mut log = CommitLog::default();
        log.record(5, 1);
        log.record(5, 1);
    }

    #[test]
    fn defragmentation_by_alarm_share_and_schedule() {
        let s = settings();
        let mib = 1 << 20;
        assert_eq!(
            defrag_reason(10 * mib, 9 * mib, true, None, &s),
            Some(DefragReason::NoSpace)
        );
        // Out of space but nothing free in the file: nothing a defragmentation gives back.
        assert_eq!(defrag_reason(10 * mib, 10 * mib, true, None, &s), None);
        // Half the file free, but below the minimum worth it.
        assert_eq!(defrag_reason(6 * mib, 3 * mib, false, None, &s), None);
        assert_eq!(
            defrag_reason(100 * mib, 40 * mib, false, Some(Duration::ZERO), &s),
            Some(DefragReason::FreeSpace)
        );
        let hour = Duration::from_secs(3600);
        assert_eq!(
            defrag_reason(100 * mib, 90 * mib, false, Some(hour), &s),
            Some(DefragReason::Schedule)
        );
        assert_eq!(
            defrag_reason(100 * mib, 90 * mib, false, Some(hour / 2), &s),
            None
        );
        let unscheduled = UpkeepSettings {
            defrag_interval: Duration::ZERO,
            ..s
        };
        assert_eq!(
            defrag_reason(100 * mib, 90 * mib, false, None, &unscheduled),
            None
        );
    }

    #[test]
    fn the_alarm_is_cleared_only_below_nearfull_on_every_member() {
        let s = settings();
        let mib = 1 << 20;
        assert!(room_made(&[10 * mib, 79 * mib], &s));
        assert!(!room_made(&[10 * mib, 80 * mib], &s));
        assert!(!room_made(&[], &s));
    }
}

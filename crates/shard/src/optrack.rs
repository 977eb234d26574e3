//! The op tracker: the ops in flight with the stage each is in, and the slowest ops of the
//! last [`HISTORY_WINDOW_US`], each with the time it spent in every stage
//! (`docs/operations.md`, "Slow ops").
//!
//! The core knows when an op passes each stage; the runtime only hands it the clock. The
//! stages of an op that goes through the log (a client write, or a reclaim, snapshot mark or
//! trim, or repair the shard proposed itself):
//!
//! | stage | from | to |
//! |---|---|---|
//! | `queue` | its request was read | proposed to its PG |
//! | `wal_commit` | proposed | this OSD's WAL holds its entry durably |
//! | `replication` | durable here | committed on a majority: the apply that answers it starts |
//! | `apply` | the apply starts | its reply is queued |
//!
//! and of a read (a read, a block-status query, a snapshot or clone read):
//! `queue`, then `read_index` (its read index asked, until the lease confirmed it and
//! everything before it is applied), then `read` (until its reply is queued). A request that
//! waits in the core for a WAL commit slot before it is taken is in `queue`.
//!
//! Cost on the IO path: an op in flight is the core's pending op (one more word, its log
//! index); each time a PG's log becomes durable further, the clock is read and the index and
//! time go into a fixed ring of that PG; each completed op reads the clock once more (its
//! end; a read other than a data read twice, when its barrier passed and when answered), an
//! op through the log looks up when its entry became durable (a binary search of its PG's
//! ring of `PERSIST_TIMES_KEPT`), and the op is compared with the fastest of the kept ones
//! and, only if it is slower (or the kept ones aged out), replaces it in a list of at most
//! [`TRACKED_OPS_LISTED_MAX`] (a scan of that list). Listing the ops in flight walks them
//! all, but only when a report is asked for (once per heartbeat).
//!
//! When a write is durable here: when its PG's Raft log is persisted up to the write's index
//! (a PG hands its next entries to the WAL only once the previous ones are durable, so the
//! first WAL commit after the proposal need not hold them).

use crate::core::{OpKind, PendingOp, ShardCore};
use crate::io::Micros;
use fastblock_store::Disk;
use fastblock_types::api::{
    OpStage, OsdOps, TrackedOp, TRACKED_OPS_LISTED_MAX, TRACKED_OP_STAGES_MAX,
};
use fastblock_types::PgId;
use fastblock_wire::Request;

/// How long a completed op stays among the slowest: 10 minutes (Ceph's
/// `osd_op_history_duration`).
pub const HISTORY_WINDOW_US: u64 = 600 * 1_000_000;
/// Advances of a PG's durable log index whose time is kept: a write asks for the time its
/// entry became durable when it completes, a few advances later at most unless its PG is
/// stuck (then when it became durable is unknown, and its `replication` time counts in
/// `wal_commit`).
const PERSIST_TIMES_KEPT: usize = 64;

const LOG_STAGES: [&str; 4] = ["queue", "wal_commit", "replication", "apply"];
const READ_STAGES: [&str; 3] = ["queue", "read_index", "read"];
// A report's receiver cuts every op's stages to this many.
const _: () = assert!(LOG_STAGES.len() <= TRACKED_OP_STAGES_MAX);
const _: () = assert!(READ_STAGES.len() <= TRACKED_OP_STAGES_MAX);

/// Whether an op goes through the log or is a read: that names its stages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpPath {
    Log,
    Read,
}

impl OpPath {
    fn names(self) -> &'static [&'static str] {
        match self {
            OpPath::Log => &LOG_STAGES,
            OpPath::Read => &READ_STAGES,
        }
    }
}

/// When an op entered each of its stages (None: not known or not reached), then when it
/// ended (or now, for an op in flight). A read's fourth mark is always None.
pub type Marks = [Option<Micros>; 5];

/// The time spent in each stage: a stage runs from its mark to the next known one, so time
/// whose stage is unknown counts in the last stage reached before it.
fn spans(marks: &Marks) -> ([u64; 4], usize) {
    let mut out = [0u64; 4];
    let mut last: Option<(usize, Micros)> = None;
    for (i, mark) in marks.iter().enumerate() {
        if let Some(t) = mark {
            if let Some((j, tj)) = last {
                out[j] = t.since(tj);
            }
            last = Some((i, *t));
        }
    }
    // The stage the op is in (or ended in): the last mark before the end.
    let current = marks[..4].iter().rposition(Option::is_some).unwrap_or(0);
    (out, current)
}

/// When a PG's log last became durable here, and up to which index: the last
/// [`PERSIST_TIMES_KEPT`] times it advanced.
#[derive(Debug)]
pub struct PersistTimes {
    ring: [(u64, Micros); PERSIST_TIMES_KEPT],
    /// How many advances were recorded (the next one goes at `next % PERSIST_TIMES_KEPT`).
    next: usize,
}

impl Default for PersistTimes {
    fn default() -> Self {
        PersistTimes {
            ring: [(0, Micros(0)); PERSIST_TIMES_KEPT],
            next: 0,
        }
    }
}

impl PersistTimes {
    /// The log is durable up to `index` from `at` on.
    pub fn advanced(&mut self, index: u64, at: Micros) {
        let last = (self.next > 0).then(|| self.ring[(self.next - 1) % PERSIST_TIMES_KEPT].0);
        if last.is_some_and(|last| index <= last) {
            // Raft truncated the log (a follower's entries replaced by its new leader's) and
            // it grew back: the times kept were those of entries that are gone.
            self.next = 0;
        }
        self.ring[self.next % PERSIST_TIMES_KEPT] = (index, at);
        self.next += 1;
    }

    /// When the log first became durable up to `index` at `not_before` or later (the
    /// op's proposal: an advance before it was of entries Raft replaced since, which
    /// `advanced` cannot tell when the log grew back past its old end): None if it is not
    /// yet, or if that was before the oldest advance kept.
    ///
    /// The kept indexes increase and their times never go back (`advanced` starts over
    /// otherwise), so the advances that answer are the last ones kept: a binary search.
    pub fn durable_at(&self, index: u64, not_before: Micros) -> Option<Micros> {
        let kept = self.next.min(PERSIST_TIMES_KEPT);
        let oldest = self.next - kept;
        let answers = |k: usize| {
            let (i, at) = self.ring[k % PERSIST_TIMES_KEPT];
            i >= index && at >= not_before
        };
        let (mut lo, mut hi) = (oldest, self.next);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if answers(mid) {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        if lo == self.next {
            return None;
        }
        // The advance before the oldest kept one may have answered already.
        let known = lo > oldest || self.next <= PERSIST_TIMES_KEPT;
        known.then_some(self.ring[lo % PERSIST_TIMES_KEPT].1)
    }
}

/// An op as the tracker describes it.
#[derive(Clone, Copy, Debug)]
pub struct OpView {
    pub pg: PgId,
    pub kind: &'static str,
    pub request_id: u64,
    pub path: OpPath,
    pub marks: Marks,
}

impl OpView {
    fn start(&self) -> Micros {
        self.marks[0].unwrap_or_default()
    }

    fn end(&self) -> Micros {
        self.marks[4].unwrap_or_default()
    }

    /// The op for a report. `slowest_stage`: name the stage it spent longest in (a completed
    /// op), else the one it is in.
    pub fn tracked(&self, shard: u32, slowest_stage: bool) -> TrackedOp {
        let (us, current) = spans(&self.marks);
        let names = self.path.names();
        let shown = if slowest_stage {
            names.len()
        } else {
            (current + 1).min(names.len())
        };
        let stage = if slowest_stage {
            (0..names.len()).max_by_key(|&i| (us[i], i)).unwrap_or(0)
        } else {
            current.min(names.len() - 1)
        };
        TrackedOp {
            shard,
            pg: self.pg,
            kind: self.kind.to_string(),
            request_id: self.request_id,
            duration_us: self.end().since(self.start()),
            stage: names[stage].to_string(),
            stages: names[..shown]
                .iter()
                .zip(us)
                .map(|(name, us)| OpStage {
                    stage: name.to_string(),
                    us,
                })
                .collect(),
        }
    }
}

/// The slowest ops completed in the last [`HISTORY_WINDOW_US`]: at most
/// [`TRACKED_OPS_LISTED_MAX`].
#[derive(Debug, Default)]
pub struct History {
    ops: Vec<OpView>,
    /// With `ops` full: the shortest duration among them, and the oldest end.
    fastest_us: u64,
    oldest_end: Micros,
}

impl History {
    /// A completed op (its last mark is its end).
    pub fn record(&mut self, op: OpView) {
        let end = op.end();
        let took = end.since(op.start());
        let window_start = Micros(end.0.saturating_sub(HISTORY_WINDOW_US));
        let full = self.ops.len() >= TRACKED_OPS_LISTED_MAX;
        // The common case: not slower than any kept op, and none of them aged out.
        if full && took <= self.fastest_us && self.oldest_end >= window_start {
            return;
        }
        self.ops.retain(|o| o.end() >= window_start);
        if self.ops.len() < TRACKED_OPS_LISTED_MAX {
            self.ops.push(op);
        } else {
            let (i, fastest) = self
                .ops
                .iter()
                .enumerate()
                .min_by_key(|(_, o)| o.end().since(o.start()))
                .expect("full");
            if fastest.end().since(fastest.start()) < took {
                self.ops[i] = op;
            }
        }
        self.fastest_us = self
            .ops
            .iter()
            .map(|o| o.end().since(o.start()))
            .min()
            .unwrap_or(0);
        self.oldest_end = self.ops.iter().map(OpView::end).min().unwrap_or_default();
        assert!(self.ops.len() <= TRACKED_OPS_LISTED_MAX);
    }

    /// The kept ops that completed within the window before `now`, slowest first.
    pub fn slowest(&self, now: Micros, shard: u32) -> Vec<TrackedOp> {
        let window_start = Micros(now.0.saturating_sub(HISTORY_WINDOW_US));
        let mut ops: Vec<TrackedOp> = self
            .ops
            .iter()
            .filter(|o| o.end() >= window_start)
            .map(|o| o.tracked(shard, true))
            .collect();
        ops.sort_by_key(|o| std::cmp::Reverse(o.duration_us));
        ops
    }
}

/// The name and path of an op the core holds.
fn kind_of(kind: &OpKind) -> (&'static str, OpPath) {
    match kind {
        OpKind::Mutation { .. } => ("write", OpPath::Log),
        OpKind::Read { .. } => ("read", OpPath::Read),
        OpKind::Allocation { .. } => ("allocation", OpPath::Read),
        OpKind::SnapRead { .. } => ("snap_read", OpPath::Read),
        OpKind::CloneRead { .. } => ("clone_read", OpPath::Read),
        OpKind::Reclaim { .. } => ("reclaim", OpPath::Log),
        OpKind::SnapMark { .. } => ("snap_mark", OpPath::Log),
        OpKind::SnapTrim { .. } => ("snap_trim", OpPath::Log),
        OpKind::Repair { .. } => ("repair", OpPath::Log),
    }
}

/// The name, path and PG of a client request that waits in the core to be taken (`None`:
/// not a client op).
fn request_kind(req: &Request) -> Option<(&'static str, OpPath, PgId)> {
    Some(match req {
        Request::Write { addr, .. }
        | Request::Discard { addr, .. }
        | Request::WriteZeroes { addr, .. }
        | Request::Rollback { addr, .. }
        | Request::CopyUp { addr, .. } => ("write", OpPath::Log, addr.pg),
        Request::Read { addr, .. } => ("read", OpPath::Read, addr.pg),
        Request::Allocation { addr, .. } => ("allocation", OpPath::Read, addr.pg),
        Request::SnapRead { addr, .. } => ("snap_read", OpPath::Read, addr.pg),
        Request::CloneRead { addr, .. } => ("clone_read", OpPath::Read, addr.pg),
        _ => return None,
    })
}

impl<D: Disk + 'static> ShardCore<D> {
    /// An op the core holds, as the tracker describes it at `end` (now, for an op in flight).
    /// `committed`: when the apply that answers it started, if it was applied.
    pub(crate) fn op_view(&self, op: &PendingOp, committed: Option<Micros>, end: Micros) -> OpView {
        let (kind, path) = kind_of(&op.kind);
        let durable = match path {
            OpPath::Log => self
                .persist_times
                .get(&op.pg)
                .and_then(|t| t.durable_at(op.log_index, op.started)),
            OpPath::Read => None,
        };
        OpView {
            pg: op.pg,
            kind,
            request_id: op.request_id,
            path,
            marks: [
                Some(op.arrived),
                Some(op.started),
                durable,
                committed,
                Some(end),
            ],
        }
    }

    /// A read other than a data read (those are recorded by `reads`), answered now; its
    /// barrier passed at `ready`.
    pub(crate) fn record_read_answered(&mut self, op: &PendingOp, ready: Micros) {
        let mut view = self.op_view(op, None, self.metrics_now());
        view.marks[2] = Some(ready);
        self.history.record(view);
    }

    /// The op tracker's report (`docs/operations.md`, "Slow ops"): the ops in flight (those
    /// the core took, and the client requests waiting in it for a WAL commit slot), how many
    /// of them are `complaint_us` old or older, the oldest of them, and the slowest completed
    /// in the last [`HISTORY_WINDOW_US`].
    pub fn ops_report(&self, complaint_us: u64) -> OsdOps {
        let now = self.metrics_now();
        let shard = self.cfg.index;
        let mut in_flight: Vec<OpView> = self
            .ops
            .values()
            .map(|op| self.op_view(op, None, now))
            .collect();
        for (conn_request_id, req, arrived) in self.deferred_requests() {
            if let Some((kind, path, pg)) = request_kind(req) {
                in_flight.push(OpView {
                    pg,
                    kind,
                    request_id: conn_request_id,
                    path,
                    marks: [Some(arrived), None, None, None, Some(now)],
                });
            }
        }
        let slow = in_flight
            .iter()
            .filter(|o| now.since(o.start()) >= complaint_us)
            .count();
        in_flight.sort_by_key(OpView::start);
        OsdOps {
            complaint_time_ms: complaint_us / 1000,
            in_flight: in_flight.len() as u64,
            slow: slow as u64,
            oldest: in_flight
                .iter()
                .take(TRACKED_OPS_LISTED_MAX)
                .map(|o| o.tracked(shard, false))
                .collect(),
            slowest: self.history.slowest(now, shard),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fastblock_types::PoolId;

    fn at(us: u64) -> Option<Micros> {
        Some(Micros(us))
    }

    fn write(request_id: u64, marks: Marks) -> OpView {
        OpView {
            pg: PgId::new(PoolId(1), 0),
            kind: "write",
            request_id,
            path: OpPath::Log,
            marks,
        }
    }

    #[test]
    fn a_write_in_flight_waiting_for_its_wal_commit_is_in_wal_commit() {
        let op = write(7, [at(100), at(150), None, None, at(2_150)]);
        let t = op.tracked(3, false);
        assert_eq!(t.stage, "wal_commit");
        assert_eq!(t.duration_us, 2_050);
        let stages: Vec<(&str, u64)> = t.stages.iter().map(|s| (s.stage.as_str(), s.us)).collect();
        assert_eq!(stages, [("queue", 50), ("wal_commit", 2_000)]);
        assert_eq!(t.shard, 3);
    }

    #[test]
    fn a_completed_write_names_its_slowest_stage() {
        let op = write(1, [at(0), at(10), at(5_010), at(5_030), at(5_040)]);
        let t = op.tracked(0, true);
        assert_eq!(t.stage, "wal_commit");
        let us: Vec<u64> = t.stages.iter().map(|s| s.us).collect();
        assert_eq!(us, [10, 5_000, 20, 10]);
        // Without its commit's time, the WAL wait counts in the stage before it.
        let op = write(1, [at(0), at(10), None, at(5_030), at(5_040)]);
        assert_eq!(op.tracked(0, true).stages[1].us, 5_020);
    }

    #[test]
    fn a_read_shows_only_its_three_stages() {
        let op = OpView {
            path: OpPath::Read,
            kind: "read",
            ..write(2, [at(0), at(5), at(900), None, at(1_000)])
        };
        let t = op.tracked(0, true);
        let names: Vec<&str> = t.stages.iter().map(|s| s.stage.as_str()).collect();
        assert_eq!(names, ["queue", "read_index", "read"]);
        assert_eq!(t.stage, "read_index");
        assert_eq!(t.stages[2].us, 100);
    }

    #[test]
    fn history_keeps_the_slowest_of_the_window() {
        let mut h = History::default();
        // 30 ops of growing duration: the 20 slowest stay, slowest first.
        for i in 0..30u64 {
            let start = i * 1_000_000;
            h.record(write(
                i,
                [at(start), None, None, None, at(start + 1_000 + i)],
            ));
        }
        let kept = h.slowest(Micros(30_000_000), 0);
        assert_eq!(kept.len(), TRACKED_OPS_LISTED_MAX);
        assert_eq!(kept[0].request_id, 29);
        assert_eq!(kept.last().unwrap().request_id, 10);
        // A fast op changes nothing.
        h.record(write(
            99,
            [at(31_000_000), None, None, None, at(31_000_001)],
        ));
        assert!(h
            .slowest(Micros(31_000_000), 0)
            .iter()
            .all(|o| o.request_id != 99));
        // Past the window they age out, and a fast op is kept again.
        let later = 31_000_000 + HISTORY_WINDOW_US;
        assert!(h.slowest(Micros(later), 0).is_empty());
        h.record(write(100, [at(later), None, None, None, at(later + 1)]));
        let kept = h.slowest(Micros(later + 1), 0);
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].request_id, 100);
    }

    #[test]
    fn persist_times_answer_when_an_index_first_became_durable() {
        let mut t = PersistTimes::default();
        assert_eq!(t.durable_at(1, Micros(0)), None);
        t.advanced(3, Micros(10));
        t.advanced(7, Micros(20));
        assert_eq!(t.durable_at(1, Micros(0)), Some(Micros(10)));
        assert_eq!(t.durable_at(3, Micros(0)), Some(Micros(10)));
        assert_eq!(t.durable_at(4, Micros(0)), Some(Micros(20)));
        assert_eq!(t.durable_at(8, Micros(0)), None, "not durable yet");
        for i in 0..PERSIST_TIMES_KEPT as u64 {
            t.advanced(8 + i, Micros(100 + i));
        }
        // Index 4 became durable at 20, which the ring no longer holds: unknown, not wrong.
        assert_eq!(t.durable_at(4, Micros(0)), None);
        assert_eq!(t.durable_at(9, Micros(0)), Some(Micros(101)));
        // A truncated log forgets the times of the entries it lost.
        t.advanced(5, Micros(500));
        assert_eq!(t.durable_at(9, Micros(0)), None);
        assert_eq!(t.durable_at(5, Micros(0)), Some(Micros(500)));
    }

    #[test]
    fn a_durable_time_before_the_op_was_proposed_is_not_its_own() {
        let mut t = PersistTimes::default();
        // Entries up to 10 durable at 100; Raft replaces 6.. with a new leader's entries and
        // the log grows back past 10 before the next advance is recorded: at 500, up to 12.
        t.advanced(10, Micros(100));
        t.advanced(12, Micros(500));
        // An op proposed at 200 with index 8 became durable at 500, not at 100.
        assert_eq!(t.durable_at(8, Micros(200)), Some(Micros(500)));
        assert_eq!(t.durable_at(8, Micros(0)), Some(Micros(100)));
        assert_eq!(t.durable_at(8, Micros(501)), None, "not durable since");
        // Spans of such an op then never run backwards.
        let op = write(
            1,
            [
                at(150),
                at(200),
                t.durable_at(8, Micros(200)),
                at(600),
                at(650),
            ],
        );
        let us: Vec<u64> = op.tracked(0, true).stages.iter().map(|s| s.us).collect();
        assert_eq!(us, [50, 300, 100, 50]);
    }

    #[test]
    fn durable_at_searches_a_full_ring() {
        let mut t = PersistTimes::default();
        for i in 0..(3 * PERSIST_TIMES_KEPT as u64) {
            t.advanced(10 * (i + 1), Micros(1_000 + i));
        }
        let first_kept = 2 * PERSIST_TIMES_KEPT as u64;
        for i in first_kept + 1..3 * PERSIST_TIMES_KEPT as u64 {
            // Index 10 * i + 5 became durable with advance i + 1 (up to 10 * (i + 1)).
            assert_eq!(
                t.durable_at(10 * i + 5, Micros(0)),
                Some(Micros(1_000 + i)),
                "index {}",
                10 * i + 5
            );
            assert_eq!(
                t.durable_at(10 * (i + 1), Micros(0)),
                Some(Micros(1_000 + i))
            );
        }
        assert_eq!(
            t.durable_at(10 * first_kept + 5, Micros(0)),
            None,
            "covered by an advance no longer kept"
        );
        assert_eq!(
            t.durable_at(30 * PERSIST_TIMES_KEPT as u64 + 1, Micros(0)),
            None
        );
    }
}

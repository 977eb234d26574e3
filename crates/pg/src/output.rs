//! What a replica asks its driver to do, as data.

use crate::op::ClientOp;
use fastblock_types::{LogIndex, OsdId, Term};
use raft::eraftpb::{ConfState, Entry, HardState, Message, Snapshot};

/// The driver's token for a client operation, echoed in its outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpId(pub u64);

/// Why an operation did not complete here. All are retryable by the client.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PgError {
    #[error("not the leader (leader hint: {leader:?})")]
    NotLeader { leader: Option<OsdId> },
    /// Leadership changed while the operation was pending; it may or may not have been
    /// applied. Block writes are idempotent, so the client simply retries.
    #[error("leadership changed; outcome unknown, retry")]
    Dropped,
    /// Too many operations pending on this PG: backpressure.
    #[error("too many pending operations")]
    Busy,
    /// The replica stopped after finding an undecodable committed entry.
    #[error("replica failed: {0}")]
    Failed(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpOutcome {
    /// The write is committed on a majority and applied here.
    Applied,
    /// The read may now be served from the applied state (a quorum confirmed the leadership
    /// after the read started, and everything committed before it started is applied).
    ReadReady,
    Failed(PgError),
}

/// One atomic persistence unit: make all of it durable, then call `on_persisted`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LogWrite {
    pub ready_number: u64,
    pub hard_state: Option<HardState>,
    pub entries: Vec<Entry>,
    pub snapshot: Option<Snapshot>,
}

/// A committed entry to apply, in log order.
#[derive(Clone, Debug, PartialEq)]
pub enum Apply {
    Op {
        index: LogIndex,
        op: ClientOp,
    },
    /// An empty entry (a new leader's) or a membership change already applied to Raft; only
    /// the applied index moves. A membership change carries the configuration to persist.
    Noop {
        index: LogIndex,
        conf_state: Option<ConfState>,
    },
}

impl Apply {
    pub fn index(&self) -> LogIndex {
        match self {
            Apply::Op { index, .. } | Apply::Noop { index, .. } => *index,
        }
    }
}

/// What a leader tells the monitor about itself and its configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderReport {
    pub term: Term,
    /// An index at or after the configuration entry `voters` comes from and at or before the
    /// leader's applied index (the configuration is the same all along that range; exact
    /// unless the leader restarted since the change).
    pub conf_index: LogIndex,
    pub voters: Vec<OsdId>,
    /// Non-empty while the group is in a joint configuration.
    pub voters_outgoing: Vec<OsdId>,
    pub learners: Vec<OsdId>,
}

/// Changes the monitor must hear about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// This replica became leader.
    BecameLeader(LeaderReport),
    /// This leader applied a configuration change: the monitor must learn the new members
    /// (a learner it does not know of would otherwise delete its replica).
    ConfigurationChanged(LeaderReport),
    /// The leader this replica knows changed (possibly to none).
    LeaderChanged { leader: Option<OsdId>, term: Term },
    /// An undecodable committed entry: the replica stopped.
    Failed { index: LogIndex, reason: String },
    /// This leader's configuration reached the target the driver set: tell the monitor.
    /// Repeated every few ticks until the driver clears the target.
    MembershipFinished(LeaderReport),
    /// A committed configuration change Raft refused to apply (the same on every replica, so
    /// the configuration stays consistent); logged, not fatal.
    ConfChangeRefused { index: LogIndex, reason: String },
}

/// Everything one input produced.
#[derive(Debug, Default)]
pub struct Output {
    pub messages: Vec<Message>,
    /// `MsgSnapshot`s for the driver: it streams the PG's objects to `msg.to` first and sends
    /// the message once they are staged there, or calls `report_snapshot(to, false)`.
    pub snapshots: Vec<Message>,
    pub log_writes: Vec<LogWrite>,
    pub apply: Vec<Apply>,
    pub replies: Vec<(OpId, OpOutcome)>,
    pub events: Vec<Event>,
}

impl Output {
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
            && self.snapshots.is_empty()
            && self.log_writes.is_empty()
            && self.apply.is_empty()
            && self.replies.is_empty()
            && self.events.is_empty()
    }
}

//! Why a shard stopped. A store error in the data path is fatal (fail-stop: the disk's state
//! is unknown after a failed write or sync), so the core keeps the first one it meets and
//! answers every later client request with it.

use fastblock_types::PgId;
use std::fmt;
use std::sync::Arc;

/// What the shard was doing when the store failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// Writing or syncing the WAL (log entries, hard states, an installed snapshot).
    WalCommit,
    /// Applying committed entries to the object store.
    Apply,
    /// A periodic flush, or the one after the WAL filled.
    Flush,
    /// Compacting logs behind a flush.
    Compaction,
    /// Opening (or creating) a PG replica.
    OpenPg,
    /// Removing a PG that left this OSD.
    RemovePg,
    /// Reading an object for a client.
    Read,
    /// Answering a block-status query.
    Allocation,
    /// Reading an object to send in a snapshot.
    SnapshotRead,
    /// Staging a received snapshot chunk.
    SnapshotStage,
    /// The flush at shutdown.
    Shutdown,
}

/// The cause of a failure.
#[derive(Clone, Debug)]
pub enum Cause {
    Store(Arc<fastblock_store::Error>),
    /// raft-rs refused to open a replica from its stored state.
    Raft(Arc<raft::Error>),
}

/// A shard that stopped serving.
#[derive(Clone, Debug)]
pub struct ShardFailure {
    pub during: Operation,
    pub pg: Option<PgId>,
    pub cause: Cause,
}

impl ShardFailure {
    pub fn store(during: Operation, pg: Option<PgId>, e: fastblock_store::Error) -> ShardFailure {
        ShardFailure {
            during,
            pg,
            cause: Cause::Store(Arc::new(e)),
        }
    }
}

impl fmt::Display for ShardFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.during)?;
        if let Some(pg) = self.pg {
            write!(f, " of pg {pg}")?;
        }
        match &self.cause {
            Cause::Store(e) => write!(f, ": {e}"),
            Cause::Raft(e) => write!(f, ": raft: {e}"),
        }
    }
}

impl std::error::Error for ShardFailure {}

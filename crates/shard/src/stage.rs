//! The stages of a request's path through the shard that the core times (the table and the
//! histograms are in `crates/osd/src/stages.rs`).

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    Queue,
    WalCommit,
    Replication,
    Apply,
    ReadIndex,
    Read,
    Reply,
    OpWrite,
    OpRead,
    RaftQueue,
    Flush,
    FlushStart,
}

impl Stage {
    pub const ALL: [Stage; 12] = [
        Stage::Queue,
        Stage::WalCommit,
        Stage::Replication,
        Stage::Apply,
        Stage::ReadIndex,
        Stage::Read,
        Stage::Reply,
        Stage::OpWrite,
        Stage::OpRead,
        Stage::RaftQueue,
        Stage::Flush,
        Stage::FlushStart,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Stage::Queue => "queue",
            Stage::WalCommit => "wal_commit",
            Stage::Replication => "replication",
            Stage::Apply => "apply",
            Stage::ReadIndex => "read_index",
            Stage::Read => "read",
            Stage::Reply => "reply",
            Stage::OpWrite => "op_write",
            Stage::OpRead => "op_read",
            Stage::RaftQueue => "raft_queue",
            Stage::Flush => "flush",
            Stage::FlushStart => "flush_start",
        }
    }
}

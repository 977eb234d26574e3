//! One PG replica: a raft-rs `RawNode` plus the bookkeeping that turns client operations into
//! log entries and committed entries into replies. Sans-IO and deterministic.
//!
//! The replica consumes inputs — ticks, Raft messages, client operations, "persisted up to
//! ready N", "applied up to index I" — and returns [`Output`] as data: messages to send, log
//! writes to persist, committed operations to apply, replies, and events for the monitor. The
//! OSD performs them (batching the log writes of all its PGs into one WAL write and one sync);
//! the simulator performs them with a simulated disk and network.
//!
//! Module map:
//! - [`op`]: client operations and their encoding in log entries (header in the entry's
//!   `context`, payload in its `data`, so a write's bytes are never copied).
//! - [`config`]: tick-based timing and limits.
//! - [`replica`]: [`PgReplica`] and its input handlers.
//! - [`output`]: what the replica asks its driver to do.
//! - [`overlay`]: serves entries handed to the driver but not yet persisted (raft-rs's async
//!   ready reads them through storage at once).
//! - [`rng`]: the seeded generator behind election-timeout jitter.
//! - [`membership`]: the next step of a membership change (learners, joint consensus), a pure
//!   decision any leader can take from the current configuration.
//! - [`transfer`]: snapshot transfer of a PG's objects in chunks (sender and receiver state).
//! - [`retention`]: whether an OSD the map no longer lists may delete its replica.
//! - [`lease`]: the leader lease, under which reads skip the heartbeat round.
//!
//! Ordering contract (raft-rs "async ready", style practice 3): messages in
//! `Output::messages` may be sent at once; the entries and hard state of a [`LogWrite`] must be
//! durable before the driver calls [`PgReplica::on_persisted`] with its `ready_number`, which
//! releases the messages that must not leave before it (votes, append responses). Committed
//! entries in `Output::apply` must be applied in order before [`PgReplica::on_applied`].
//!
//! Determinism: raft-rs draws election timeouts from a thread-local RNG; the replica overrides
//! every such draw with one from its own seeded [`rng::SplitMix64`] before the next tick can use
//! it, so a given seed and input sequence produce the same outputs.
//!
//! Must not depend on: tokio, the network, the clock, the store's disk, threads.

pub mod config;
pub mod lease;
pub mod membership;
pub mod op;
pub mod output;
pub mod overlay;
pub mod replica;
pub mod retention;
pub mod rng;
pub mod transfer;

pub use config::PgConfig;
pub use op::{ClientOp, ObjectRef};
pub use output::{Apply, Event, LeaderReport, LogWrite, OpId, OpOutcome, Output, PgError};
pub use replica::PgReplica;

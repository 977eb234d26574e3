//! The monitor's decisions as a deterministic state machine: no I/O, no clock, no randomness.
//!
//! The monitor service (`fastblock-mon`) keeps one [`MonState`] (loaded from etcd), applies an
//! operation to a copy, and persists the keys that changed in one etcd transaction; only on
//! success does the copy become the state. The simulator drives the same functions.
//!
//! Module map:
//! - [`state`]: [`MonState`], its derived fields (PG states, versions, epoch) and the
//!   [`MonState::finish`] step every operation ends with.
//! - [`auth_ops`]: the key table and auth mode: add, get-or-create, caps, rotate, remove,
//!   mode; every change bumps `map.auth.epoch`.
//! - [`osd_ops`]: apply-id, boot, down, up, out, in, flags.
//! - [`osd_purge`]: removing a down, out OSD no PG names, for good (its id retired).
//! - [`pool_ops`]: pool create/delete, repair and rebalance of PG targets.
//! - [`image_ops`]: image create/remove/resize and the reclaim list.
//! - [`snap_ops`]: image snapshots (create, confirm per PG, timeout, remove, protect), clones
//!   and flatten, and the trim list that makes the PGs drop removed or aborted snapshots.
//! - [`scrub_ops`]: operators' scrub requests, dropped when the PG's leader reports them
//!   done, and what leaders report of their scrubs ([`scrub_ops::ScrubStats`], in memory).
//! - [`pg_per_osd`]: PG replicas per OSD, bounded at pool creation (`max_pg_per_osd`) and
//!   warned about in health (`TOO_MANY_PGS`).
//! - [`pg_reports`]: "leader elected" and "membership change finished" from PG leaders.
//! - [`report_batch`]: an OSD's reports in one batch, one operation for all of them.
//! - [`report_checks`]: the rules a PG report must pass against its sender ([`Reporter`]) and
//!   the recorded PG before it is recorded.
//! - [`map_log`]: the recent epochs as deltas, for the daemons that follow the map
//!   incrementally (the service's map endpoint, the simulator's nodes).
//! - [`heartbeat`]: an OSD's heartbeat, the part that changes the state apart from the part
//!   that does not (so that a heartbeat costs no copy of the state).
//! - [`liveness`]: heartbeat bookkeeping that turns silence into down and out events, with the
//!   time passed in by the caller.
//! - [`health`]: the health checks (stable codes, summaries, details) and PG-state counts for
//!   `status`; [`etcd_health`] adds those about the monitors' etcd.
//! - [`capacity`]: the full ratios, which OSDs are full (carried by the map to the PG
//!   leaders, which refuse writes), and `df` with each pool's maximum available bytes.
//! - [`damage`]: damage confined to one pool in a state loaded from etcd, reported and fenced
//!   so that the other pools and OSD liveness keep working.
//! - [`limits`]: every bound the monitor enforces, with units in the names.
//!
//! Invariants (asserted in [`MonState::finish`] after every operation): ids are below their
//! counters, so they are never reused; an operation damages no pool, so in every pool the
//! monitor made, every PG member exists as an OSD and a PG's members and its target members
//! each come from distinct OSDs; PG state bits are exactly those derived from the PG's facts.
//! A state loaded from etcd that breaks the first is refused ([`MonState::validate`]); damage
//! confined to one pool is accepted, reported and fenced ([`damage`]).

pub mod auth_ops;
pub mod capacity;
pub mod damage;
pub mod etcd_health;
pub mod health;
pub mod heartbeat;
pub mod image_ops;
pub mod limits;
pub mod liveness;
pub mod map_log;
pub mod osd_ops;
pub mod osd_purge;
pub mod pg_per_osd;
pub mod pg_reports;
pub mod pool_ops;
pub mod report_batch;
pub mod report_checks;
pub mod scrub_ops;
pub mod snap_ops;
pub mod state;

pub use report_checks::Reporter;
pub use state::MonState;

use fastblock_types::api::{ApiError, ErrorCode};

/// Result of a monitor operation: the error is what the API returns.
pub type OpResult<T> = Result<T, ApiError>;

pub(crate) fn err<T>(code: ErrorCode, message: impl Into<String>) -> OpResult<T> {
    Err(ApiError::new(code, message))
}

//! Timing and limits of a PG replica, in ticks and counts (the driver decides how long a tick
//! is; the OSD's default is 100 ms).

use fastblock_types::lease::ELECTION_TICKS_MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PgConfig {
    /// A leader sends heartbeats every this many ticks.
    pub heartbeat_ticks: usize,
    /// Followers campaign after a random timeout in `[election_ticks, 2 * election_ticks)`;
    /// leaders step down after `election_ticks` without hearing from a quorum (check-quorum).
    /// Reads do not rely on that: a read index is confirmed by a heartbeat round, or served
    /// under a lease (`lease_ms`) that a confirmed round started.
    pub election_ticks: usize,
    /// Bytes of entries per append message.
    pub append_bytes_max: u64,
    /// Append messages in flight per follower.
    pub inflight_appends_max: usize,
    /// Client operations proposed but not yet applied; beyond it proposals get `Busy`.
    pub pending_ops_max: usize,
    /// How long after a quorum confirmed its leadership a leader serves reads without a
    /// heartbeat round (`lease.rs`), in the driver's milliseconds; 0: every read asks a
    /// quorum. It must stay below the shortest time `election_ticks` ticks of a follower can
    /// take: the OSD takes it from `fastblock_types::lease::LeaseTiming::lease_ms`, which also
    /// decides whether another OSD's followers allow it.
    pub lease_ms: u64,
    /// Whether a leader tells its followers at once, with an append of its own, that its
    /// commit index advanced (raft-rs's default). Off: they learn it from the next append or
    /// heartbeat (every `heartbeat_ticks`), which is all they need it for (applying their
    /// copy; the client's answer comes from the leader). At QD1 that message and its answer
    /// were four of a 3-replica write's ten thread wake-ups. A pending configuration change
    /// is broadcast either way (raft-rs), so membership changes do not wait for a heartbeat.
    pub commit_broadcast: bool,
}

impl Default for PgConfig {
    fn default() -> Self {
        PgConfig {
            heartbeat_ticks: 2,
            election_ticks: 10,
            append_bytes_max: 1 << 20,
            inflight_appends_max: 256,
            pending_ops_max: 1024,
            lease_ms: 0,
            commit_broadcast: false,
        }
    }
}

impl PgConfig {
    pub fn validate(&self) -> Result<(), String> {
        if self.heartbeat_ticks == 0 {
            return Err("heartbeat_ticks must be > 0".into());
        }
        // raft-rs requires heartbeats well inside the election timeout, or followers campaign
        // against a live leader.
        if self.election_ticks <= self.heartbeat_ticks.saturating_mul(2) {
            return Err("election_ticks must exceed 2 * heartbeat_ticks".into());
        }
        // raft-rs draws timeouts below 2 * election_ticks: the bound keeps that in range.
        if self.election_ticks as u64 > ELECTION_TICKS_MAX {
            return Err(format!(
                "election_ticks must not exceed {ELECTION_TICKS_MAX}"
            ));
        }
        if self.inflight_appends_max == 0 || self.pending_ops_max == 0 {
            return Err("limits must be > 0".into());
        }
        Ok(())
    }
}

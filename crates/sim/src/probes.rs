//! Coverage probes: how often a run reached each rare path (FoundationDB's `CODE_PROBE`),
//! observed from the cluster's side or counted by the shard core (`fastblock_shard::Probes`).
//! A multi-seed run prints the probes no seed reached: a fault the simulator never produces
//! finds no bugs.

use std::collections::BTreeMap;
use std::fmt;

/// Every probe: (name, what reaching it means). Names are stable: scripts grep for them.
pub const PROBES: &[(&str, &str)] = &[
    (
        "crash.clean",
        "a node crashed with nothing unsynced on its device",
    ),
    (
        "crash.unsynced_writes",
        "a node crashed with unsynced device writes (staged applied data, a WAL commit in flight)",
    ),
    (
        "crash.during_slow_commit",
        "a node crashed while a slow WAL commit was in flight (torn log tail)",
    ),
    (
        "restart.wal_tail_cut",
        "a restart found the last WAL commit torn or lost and cut it",
    ),
    (
        "restart.unsynced_commit_survived",
        "an unsynced WAL commit survived a crash whole",
    ),
    (
        "restart.reapplied",
        "a restart re-applied committed entries (the flushed applied index was behind)",
    ),
    (
        "restart.conf_change_reapplied",
        "a replica re-applied a configuration change over the newer configuration it had \
         persisted, with another result than the other replicas (see the design page)",
    ),
    (
        "fuse.disk_write",
        "crash point at an unsynced device write (applied data)",
    ),
    (
        "fuse.disk_sync",
        "crash point at a synced device write (WAL commit, flush)",
    ),
    ("fuse.disk_read", "crash point at a device read"),
    ("fuse.meta_write", "crash point at a metadata (redb) write"),
    ("fuse.meta_sync", "crash point at a metadata (redb) sync"),
    (
        "fuse.meta_other",
        "crash point at another metadata operation",
    ),
    (
        "fuse.raft_panic",
        "an injected I/O error reached raft-rs through PgStorage and it panicked (fail-stop)",
    ),
    ("net.loss", "a message was lost"),
    ("net.duplicate", "a message was delivered twice"),
    (
        "net.reorder",
        "a message overtook an earlier one on the same link",
    ),
    ("net.partition_drop", "a partition dropped a message"),
    (
        "net.client_held",
        "a client request to a node cut off from the clients waited for the partition to heal",
    ),
    (
        "net.client_given_up_discarded",
        "a client request was discarded with the connection its client aborted on giving up",
    ),
    (
        "net.client_given_up_delivered",
        "a client request given up was delivered anyway (orderly closes only)",
    ),
    (
        "net.client_held_reset",
        "a held client request found its node restarted (reset, not delivered)",
    ),
    (
        "slow.commit",
        "a WAL commit was slow (in flight until its simulated fdatasync completed)",
    ),
    (
        "slow.leader_deposed",
        "a leader found itself deposed when its slow commit became durable",
    ),
    (
        "raft.check_quorum_stepdown",
        "a leader stepped down without seeing a newer term (check-quorum)",
    ),
    (
        "wal.full",
        "the WAL filled: every applied entry was compacted",
    ),
    (
        "wal.must_sync_skipped",
        "a hard state that moved only the commit index was staged without a sync of its own \
         (MustSync)",
    ),
    (
        "wal.commits_overlapped",
        "a WAL commit was written while an earlier one was not yet durable (two in flight)",
    ),
    (
        "flush.done_during_commit",
        "a flush finished between a WAL commit and its durability (before the apply it allows)",
    ),
    (
        "wal.pressure",
        "free WAL segments fell to the reserve: everything applied compacted (transfers \
         abandoned only if that and a move did not relieve it)",
    ),
    (
        "wal.log_moved",
        "a PG's live entries were moved forward to free the oldest WAL segment",
    ),
    (
        "wal.log_move_skipped",
        "the entries pinning the oldest WAL segment did not fit the free space and were not moved",
    ),
    (
        "wal.append_trimmed",
        "a follower took only the entries of an append that fit its WAL's room",
    ),
    (
        "admission.fenced",
        "a request refused by the map's image table (or a map older than an applied reclaim, or a new leader still applying)",
    ),
    (
        "map.stalled",
        "a node's map watch stalled: it acted on an old map for a while",
    ),
    (
        "reclaim.shrunk",
        "the monitor cut the image's tail (a reclaim for every PG)",
    ),
    (
        "reclaim.done",
        "every PG confirmed the deletion of the cut tail",
    ),
    (
        "reclaim.regrown",
        "the image grew back over its deleted tail (which must read zeros)",
    ),
    (
        "reclaim.beyond_refused",
        "an operation over the cut tail was refused as beyond the image's end",
    ),
    (
        "snap.creating",
        "the monitor recorded a snapshot of the image (creating: every PG leader marks it)",
    ),
    (
        "snap.overlapping",
        "a snapshot was taken while another was still creating",
    ),
    (
        "snap.during_shrink",
        "a snapshot was taken while the image was shrunk (its tail's reclaim running or done, not regrown)",
    ),
    (
        "snap.created",
        "every PG confirmed a snapshot's mark: the monitor's record shows it created",
    ),
    (
        "snap.aborted",
        "a snapshot's create call timed out and aborted it (MonState::abort_snap_create)",
    ),
    (
        "snap.aborted_by_tick",
        "the monitor's ticker aborted a snapshot still creating after the timeout \
         (MonState::tick_snaps; its create call had gone away)",
    ),
    (
        "snap.mark_of_gone",
        "a PG's confirmation of a snapshot mark reached the monitor after the snapshot was aborted \
         or removed (answered SnapNotFound, which the OSD ignores)",
    ),
    (
        "confirm.from_outside",
        "a reclaim, snapshot-mark or snapshot-trim confirmation was refused because the PG's \
         record no longer named its sender (a former leader; the current one confirms again)",
    ),
    (
        "snap.write_refused",
        "a write was refused with SnapInProgress (its PG marked a snapshot still being created)",
    ),
    ("snap.read", "a client read a snapshot (checked by the model)"),
    (
        "snap.read_promised",
        "a snapshot read of a block that a client's write was known to have reached while the \
         snapshot was being created (the promise: it is in the snapshot)",
    ),
    (
        "snap.read_removed",
        "a snapshot read was answered NoSuchSnap: the snapshot was removed while it was in flight",
    ),
    (
        "snap.removed",
        "the monitor removed a snapshot (a trim entry for every PG)",
    ),
    (
        "snap.trimmed",
        "every PG confirmed a snapshot trim entry (of a removed or aborted snapshot)",
    ),
    (
        "snap.final_read",
        "an object of a live snapshot was read after convergence (every block, checked)",
    ),
    (
        "admission.held_for_term",
        "a write waited until its PG's new leader applied the log it inherited",
    ),
    (
        "snapshot.backfill_too_full",
        "a member refused a snapshot for lack of space (the leader waits and retries)",
    ),
    (
        "snapshot.backfill_refused",
        "a shard refused to reserve room for a snapshot it was sent",
    ),
    (
        "admission.stale_epoch",
        "a request was refused with StaleEpoch (the client's and the OSD's maps disagree)",
    ),
    (
        "admission.stale_term",
        "a leader refused a mutation naming another term than its own (the client re-sends)",
    ),
    (
        "admission.pg_log_full",
        "a write was refused because its PG's uncommitted writes reached their share of the WAL",
    ),
    (
        "client.dropped",
        "a pending write was dropped by a leader change (outcome unknown; counted by the core)",
    ),
    (
        "client.busy",
        "a reply told a client to back off (Busy, Timeout: the library's BackOff verdict)",
    ),
    (
        "client.no_member_up",
        "a client's map had no member of the PG up (the library backs off)",
    ),
    (
        "client.failed",
        "a client got a non-retryable error (NoSpace, IoError) and handed it to its caller",
    ),
    (
        "client.timeout",
        "a client attempt got no reply and was retried elsewhere",
    ),
    (
        "client.gave_up",
        "a client gave up on a write (outcome unknown)",
    ),
    (
        "model.unknown_write_seen",
        "a read returned a write whose client never learned its outcome",
    ),
    (
        "model.inflight_write_seen",
        "a read returned a write still in flight",
    ),
    // Membership changes and snapshot transfer.
    (
        "member.out_remap",
        "an OSD went out and its PGs were remapped",
    ),
    (
        "member.in_rebalance",
        "an OSD came back in and PGs moved back or were rebalanced",
    ),
    (
        "member.joint_leader_change",
        "a leader was elected while its PG was in a joint configuration",
    ),
    (
        "member.finished",
        "a membership change finished and the monitor took it",
    ),
    (
        "member.pg_removed",
        "a node that left a PG removed its replica and data",
    ),
    (
        "member.conf_change_refused",
        "a committed configuration change was refused by Raft on apply (a stale step)",
    ),
    (
        "snapshot.started",
        "a leader started streaming a snapshot's objects",
    ),
    (
        "snapshot.installed",
        "a replica installed a snapshot with object data",
    ),
    (
        "read.batched",
        "a step read more than one client read in one batch",
    ),
    (
        "read.batch_retried",
        "a batch of client reads failed and was retried one read at a time",
    ),
    (
        "snapshot.interrupted",
        "a snapshot transfer was abandoned (refused, stalled, leadership lost)",
    ),
    (
        "snapshot.dropped_unstaged",
        "a MsgSnapshot arrived without its objects staged and was dropped",
    ),
    (
        "bad_block.flipped",
        "a bit of a data block flipped on a node's disk (silent corruption of synced data)",
    ),
    (
        "bad_block.unreadable",
        "a sector of a data block stopped reading on a node's disk (a latent sector error)",
    ),
    (
        "bad_block.misdirect_armed",
        "the next write of a client's block to a node's data region was set to land elsewhere",
    ),
    (
        "bad_block.misdirected",
        "a write of a client's block landed on a nearby block (its target kept stale bytes)",
    ),
    (
        "store.checksum_error",
        "a store read a data block whose bytes did not match their checksum",
    ),
    (
        "store.read_error",
        "a store's disk failed to read a data block",
    ),
    (
        "repair.reported",
        "a member reported a bad copy of a block to its PG's leader",
    ),
    ("repair.started", "a PG leader started repairing a bad block"),
    (
        "repair.repaired",
        "a repair entry was applied on the leader that proposed it",
    ),
    (
        "repair.failed",
        "a leader gave up a repair (no replica answered with a good copy, or the object kept \
         changing)",
    ),
    (
        "client.repairing",
        "a client was answered Repairing (the leader's copy of a block it read was bad)",
    ),
    (
        "scrub.requested",
        "the monitor asked for a scrub of a PG during the fault phase",
    ),
    ("scrub.finished", "a leader finished a scrub (light or deep)"),
    ("scrub.deep_finished", "a leader finished a deep scrub"),
    (
        "scrub.inconsistent_block",
        "a scrub found a block whose replicas disagreed or whose copy was bad",
    ),
    (
        "scrub.repaired_block",
        "a block a scrub found was repaired",
    ),
    (
        "scrub.final_requested",
        "the deep scrub of every PG that ends a run was asked for (a round)",
    ),
    (
        "scrub.final_repeated",
        "a round of the final deep scrub left blocks it found unrepaired (a repair the PG \
         refused as busy), and another round followed",
    ),
    (
        "scrub.final_done",
        "the final deep scrub finished and every repair it started was applied",
    ),
];

/// Probes the CI budget must reach (`tests/seeds.rs`): the interleavings the simulator's
/// adapter exists to explore. A change that makes them unreachable makes the simulator blind
/// to them.
pub const REQUIRED: &[&str] = &[
    "wal.must_sync_skipped",
    "wal.commits_overlapped",
    "flush.done_during_commit",
];

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Probes {
    hits: BTreeMap<&'static str, u64>,
}

impl Probes {
    pub fn hit(&mut self, name: &'static str) {
        self.add(name, 1);
    }

    pub fn add(&mut self, name: &'static str, n: u64) {
        assert!(
            PROBES.iter().any(|(p, _)| *p == name),
            "unknown probe {name}"
        );
        if n > 0 {
            *self.hits.entry(name).or_default() += n;
        }
    }

    pub fn count(&self, name: &str) -> u64 {
        self.hits.get(name).copied().unwrap_or(0)
    }

    pub fn merge(&mut self, other: &Probes) {
        for (name, n) in &other.hits {
            *self.hits.entry(name).or_default() += n;
        }
    }

    /// Required probes ([`REQUIRED`]) never reached.
    pub fn required_unreached(&self) -> Vec<&'static str> {
        REQUIRED
            .iter()
            .copied()
            .filter(|name| self.count(name) == 0)
            .collect()
    }

    /// Probes never reached, with their descriptions.
    pub fn unreached(&self) -> Vec<(&'static str, &'static str)> {
        PROBES
            .iter()
            .filter(|(name, _)| self.count(name) == 0)
            .copied()
            .collect()
    }
}

impl fmt::Display for Probes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (name, what) in PROBES {
            writeln!(f, "  {:>9}  {name:<34} {what}", self.count(name))?;
        }
        Ok(())
    }
}

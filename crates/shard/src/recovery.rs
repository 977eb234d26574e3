//! Snapshot transfer between shards: the leader side streams a PG's objects to a member that
//! needs a snapshot, the receiving side stages them (`docs/design/recovery.md`; the state
//! machines are `fastblock_pg::transfer`).
//!
//! Client IO keeps priority: chunks are read and sent only after a step has served its
//! inputs, at most `bytes_per_sec` per shard (a token bucket on the step's clock), with at
//! most `max_active` transfers per shard at a time. A snapshot Raft asks for beyond that is
//! refused at once and Raft asks again later (on the next heartbeat response).
//!
//! Space (the backfill reservation): the receiver reserves room for the whole transfer when
//! its first chunk arrives, or answers `TooFull` with the room it has; the leader then waits
//! [`BACKFILL_RETRY_MS`] before it asks that member again and reports the refusal to the
//! monitor (`PG_BACKFILL_TOOFULL`). Reserved room is not free for client writes
//! (`crate::space`). See `docs/design/recovery.md`, "Space".

use crate::config::RecoveryLimits;
use crate::core::ShardCore;
use crate::error::{Operation, ShardFailure};
use crate::io::{Effects, Micros, PeerSend};
use fastblock_pg::transfer::{AckOutcome, ChunkVerdict, ObjectExtent, Receiver, Sender};
use fastblock_store::Disk;
use fastblock_types::api::BackfillTooFull;
use fastblock_types::units::BLOCK_SIZE_BYTES;
use fastblock_types::{OsdId, PgId};
use fastblock_wire::{RaftEnvelope, Request, SnapChunk, SnapVerdict};
use protobuf::Message as _;
use raft::eraftpb::{Message, MessageType};
use std::collections::BTreeMap;

struct ActiveSend {
    sender: Sender,
    /// The `MsgSnapshot` to deliver once every chunk is staged.
    msg: Message,
    /// The PG's image snapshot states as of the snapshot's index (taken when the transfer
    /// was planned, before this step applied anything): sent first, as the state the log
    /// replayed after the install starts from.
    image_snaps: BTreeMap<fastblock_types::ImageId, fastblock_store::ImageSnaps>,
}

/// The object index of a chunk that carries an image's snapshot state, not data (no
/// object of an image has this index).
pub const IMAGE_SNAPS_CHUNK_INDEX: u64 = u64::MAX;

/// A member refused to reserve room for a snapshot of a PG (a backfill reservation refused):
/// no new transfer to it before `retry_at`, and the leader reports it to the monitor
/// (`PG_BACKFILL_TOOFULL`) until a transfer is accepted or the refusals stop.
#[derive(Clone, Copy, Debug)]
struct TooFull {
    needed_bytes: u64,
    free_bytes: u64,
    refused_at: Micros,
    retry_at: Micros,
}

/// After a member refused a snapshot for lack of space, the leader asks it again this long
/// later (Ceph's `osd_backfill_retry_interval` is 30 s; ours is shorter because asking costs
/// one chunk).
pub const BACKFILL_RETRY_MS: u64 = 5_000;
/// A refusal not repeated for this long is no longer reported (the member stopped needing
/// the snapshot, or this OSD stopped leading).
const TOOFULL_REPORT_MS: u64 = 3 * BACKFILL_RETRY_MS;

/// Room a receiver holds for a snapshot it accepted (a backfill reservation): client
/// writes and other transfers cannot take it, so staging does not run out half way.
#[derive(Clone, Copy, Debug)]
struct Reservation {
    total_bytes: u64,
    staged_bytes: u64,
    last_chunk_at: Micros,
}

/// A reservation without a chunk for this long is given back with what was staged (well
/// past the sender's own idle limit, after which it has abandoned the transfer).
const RESERVATION_IDLE_MS: u64 = 60_000;

impl Reservation {
    fn remaining_bytes(&self) -> u64 {
        self.total_bytes.saturating_sub(self.staged_bytes)
    }
}

/// The shard's recovery state.
pub(crate) struct Recovery {
    limits: RecoveryLimits,
    sending: BTreeMap<(PgId, OsdId), ActiveSend>,
    receiving: BTreeMap<PgId, Receiver>,
    next_transfer: u64,
    /// May go below zero: a chunk is sent whenever the bucket holds any tokens, and paid for
    /// after.
    tokens_bytes: i64,
    refilled_at: Option<Micros>,
    /// Bytes this shard sent for snapshots, per PG (reported as recovery progress).
    done_bytes: BTreeMap<PgId, u64>,
    /// Members that refused a snapshot for lack of space, per (PG, member).
    too_full: BTreeMap<(PgId, OsdId), TooFull>,
    /// Room held for the snapshots this shard is receiving, per PG.
    reserved: BTreeMap<PgId, Reservation>,
}

impl Recovery {
    pub(crate) fn new(limits: RecoveryLimits, transfer_id_base: u64) -> Recovery {
        Recovery {
            limits,
            sending: BTreeMap::new(),
            receiving: BTreeMap::new(),
            next_transfer: transfer_id_base,
            tokens_bytes: 0,
            refilled_at: None,
            done_bytes: BTreeMap::new(),
            too_full: BTreeMap::new(),
            reserved: BTreeMap::new(),
        }
    }

    /// Data bytes held for snapshots being received and not staged yet: free space client
    /// writes must leave alone.
    pub(crate) fn reserved_bytes(&self) -> u64 {
        self.reserved
            .values()
            .map(Reservation::remaining_bytes)
            .sum()
    }

    /// The members that refused a snapshot of a PG this shard leads for lack of space, as
    /// reported to the monitor.
    pub(crate) fn backfill_too_full(&self) -> Vec<BackfillTooFull> {
        self.too_full
            .iter()
            .map(|((pg, osd), t)| BackfillTooFull {
                pg: *pg,
                osd: *osd,
                needed_bytes: t.needed_bytes,
                free_bytes: t.free_bytes,
            })
            .collect()
    }

    /// Bytes and objects still to send for `pg` (0 when it is not recovering here).
    pub(crate) fn remaining(&self, pg: PgId) -> (u64, u64) {
        self.sending
            .iter()
            .filter(|((p, _), _)| *p == pg)
            .fold((0, 0), |(b, o), (_, a)| {
                let left = a.sender.remaining_bytes();
                (b + left, o + u64::from(left > 0))
            })
    }

    pub(crate) fn done_bytes(&self, pg: PgId) -> u64 {
        self.done_bytes.get(&pg).copied().unwrap_or(0)
    }

    /// The lowest snapshot index being sent for `pg`, if any.
    pub(crate) fn sending_index(&self, pg: PgId) -> Option<u64> {
        self.sending
            .iter()
            .filter(|((p, _), _)| *p == pg)
            .map(|(_, a)| a.sender.index)
            .min()
    }

    fn refill(&mut self, now: Micros) {
        let dt_us = self.refilled_at.map_or(0, |t| now.since(t));
        self.refilled_at = Some(now);
        let rate = self.limits.bytes_per_sec;
        let add = (u128::from(rate) * u128::from(dt_us) / 1_000_000).min(i64::MAX as u128) as i64;
        // At most a tenth of a second of burst.
        let cap = i64::try_from(rate / 10 + self.limits.chunk_bytes).unwrap_or(i64::MAX);
        self.tokens_bytes = self.tokens_bytes.saturating_add(add).min(cap);
    }
}

impl<D: Disk + 'static> ShardCore<D> {
    /// `Input::Rates`: the recovery token bucket refills at the new rate from its next refill
    /// on (its burst cap follows the rate), and each deep-scrub read is paced by the new rate;
    /// transfers and scrubs in flight go on.
    pub(crate) fn on_rates(&mut self, recovery_bytes_per_sec: u64, scrub_deep_bytes_per_sec: u64) {
        assert!(
            recovery_bytes_per_sec > 0,
            "osd {} shard {}: a zero recovery rate would never finish a transfer",
            self.cfg.osd,
            self.cfg.index
        );
        assert!(
            scrub_deep_bytes_per_sec > 0,
            "osd {} shard {}: a zero deep-scrub rate would never finish a scrub",
            self.cfg.osd,
            self.cfg.index
        );
        self.recovery.limits.bytes_per_sec = recovery_bytes_per_sec;
        self.cfg.recovery.bytes_per_sec = recovery_bytes_per_sec;
        self.cfg.scrub.deep_bytes_per_sec = scrub_deep_bytes_per_sec;
        tracing::info!(
            osd = %self.cfg.osd,
            shard = self.cfg.index,
            recovery_bytes_per_sec,
            scrub_deep_bytes_per_sec,
            "rates changed"
        );
    }

    /// Raft wants to send a snapshot: start streaming the PG's objects to its receiver.
    pub(crate) fn on_snapshot_request(&mut self, pg: PgId, msg: Message, eff: &mut Effects) {
        let to = OsdId(msg.to as u32);
        let key = (pg, to);
        let busy = !self.recovery.sending.contains_key(&key)
            && self.recovery.sending.len() >= self.recovery.limits.max_active;
        let waiting = self
            .recovery
            .too_full
            .get(&key)
            .is_some_and(|t| self.now < t.retry_at);
        if busy || waiting {
            tracing::debug!(%pg, %to, busy, "snapshot deferred: recovery limit reached or target too full");
            if let Some(h) = self.pgs.get_mut(&pg) {
                h.replica
                    .report_snapshot(to, false, self.outs.entry(pg).or_default());
            }
            return;
        }
        let md = msg.get_snapshot().get_metadata();
        // The head's objects, and those only image snapshots still keep blocks of (deleted
        // from the head since).
        let (image_snaps, extents) = {
            let mut store = self.store.borrow_mut();
            let mut extents: BTreeMap<fastblock_store::ObjectId, u64> = store
                .object_sizes(pg)
                .into_iter()
                // At least one block each: an object that exists with no byte (a member that
                // received a hole-only object records it at size 0) must still be named to
                // the receiver, which creates it; a plan of 0 bytes would skip it, and the
                // object would be missing there (found by the simulator, seed
                // 11519488835606117001, `--membership --bad-blocks`).
                .map(|(o, size)| {
                    let size = size.next_multiple_of(BLOCK_SIZE_BYTES);
                    (o, size.max(BLOCK_SIZE_BYTES))
                })
                .collect();
            match store.kept_extents(pg) {
                Ok(kept) => {
                    for (o, end) in kept {
                        let e = extents.entry(o).or_insert(0);
                        *e = (*e).max(end);
                    }
                }
                Err(e) => {
                    drop(store);
                    if e.is_fatal() {
                        self.fail(
                            ShardFailure::store(Operation::SnapshotRead, Some(pg), e),
                            eff,
                        );
                    } else {
                        tracing::warn!(%pg, "planning a snapshot: {e}");
                    }
                    if let Some(h) = self.pgs.get_mut(&pg) {
                        h.replica
                            .report_snapshot(to, false, self.outs.entry(pg).or_default());
                    }
                    return;
                }
            }
            let states: BTreeMap<_, _> = store.image_snaps_of_pg(pg).into_iter().collect();
            (states, extents)
        };
        let mut objects: Vec<ObjectExtent> = image_snaps
            .keys()
            .map(|image| ObjectExtent {
                image: *image,
                index: IMAGE_SNAPS_CHUNK_INDEX,
                size_bytes: BLOCK_SIZE_BYTES,
            })
            .collect();
        objects.extend(extents.into_iter().map(|(o, size_bytes)| ObjectExtent {
            image: o.image,
            index: o.index,
            size_bytes,
        }));
        let transfer = self.recovery.next_transfer;
        self.recovery.next_transfer += 1;
        eff.probes.transfers_started += 1;
        tracing::info!(
            %pg, %to, index = md.index, term = md.term, objects = objects.len(), transfer,
            "sending snapshot"
        );
        let limits = self.recovery.limits;
        let sender = Sender::new(
            to,
            transfer,
            md.index,
            md.term,
            objects,
            limits.chunk_bytes,
            limits.window_chunks,
        );
        self.recovery.sending.insert(
            key,
            ActiveSend {
                sender,
                msg,
                image_snaps,
            },
        );
    }

    /// Sends chunks within the window and the rate limit. Called at the end of every step,
    /// after client inputs were served.
    pub(crate) fn pump_recovery(&mut self, eff: &mut Effects) {
        if self.recovery.sending.is_empty() || self.failed.is_some() {
            return;
        }
        self.recovery.refill(self.now);
        let keys: Vec<(PgId, OsdId)> = self.recovery.sending.keys().copied().collect();
        let mut progress = true;
        while progress && self.recovery.tokens_bytes > 0 {
            progress = false;
            for key in &keys {
                if self.recovery.tokens_bytes <= 0 {
                    break;
                }
                let Some(active) = self.recovery.sending.get_mut(key) else {
                    continue;
                };
                let Some(plan) = active.sender.next_chunk() else {
                    continue;
                };
                progress = true;
                let (transfer, index, term) = (
                    active.sender.transfer,
                    active.sender.index,
                    active.sender.term,
                );
                let total_bytes = active.sender.total_bytes;
                let mut data = bytes::Bytes::new();
                if plan.len_bytes > 0 && plan.object_index == IMAGE_SNAPS_CHUNK_INDEX {
                    let state = active.image_snaps.get(&plan.image).cloned();
                    data = state.unwrap_or_default().encode().into();
                } else if plan.len_bytes > 0 {
                    let object = fastblock_store::ObjectId {
                        image: plan.image,
                        index: plan.object_index,
                    };
                    let r = self.store.borrow_mut().transfer_read(
                        key.0,
                        object,
                        plan.offset_bytes,
                        plan.len_bytes,
                    );
                    // A version bad here would reach the member as damaged: while a repair
                    // may still fix it, the transfer starts over later instead (Raft asks
                    // again), so that a bad copy is not spread to a member that may end up
                    // holding the PG's only copies. A block no replica could repair goes
                    // as damaged (`docs/design/repair.md`).
                    let repairable = |v: &fastblock_store::ChunkVersions| {
                        v.versions.iter().any(|b| {
                            b.damaged && !self.repair_failed_lately((key.0, object, b.block))
                        })
                    };
                    match r {
                        Ok(versions) if repairable(&versions) => {
                            tracing::warn!(pg = %key.0, image = %object.image, object = object.index, "a block of the snapshot is being repaired; the transfer starts over once it is");
                            self.abandon_send(*key);
                            eff.probes.transfers_abandoned += 1;
                            continue;
                        }
                        Ok(versions) => data = versions.encode().into(),
                        Err(e) if e.is_fatal() => {
                            let f = ShardFailure::store(Operation::SnapshotRead, Some(key.0), e);
                            self.fail(f, eff);
                            return;
                        }
                        Err(e) => {
                            tracing::warn!(pg = %key.0, "snapshot read: {e}; abandoning the transfer");
                            self.abandon_send(*key);
                            eff.probes.transfers_abandoned += 1;
                            continue;
                        }
                    }
                    self.recovery.tokens_bytes = self
                        .recovery
                        .tokens_bytes
                        .saturating_sub(i64::try_from(plan.len_bytes).unwrap_or(i64::MAX));
                    *self.recovery.done_bytes.entry(key.0).or_default() += plan.len_bytes;
                    self.io_totals.recovery_sent_bytes += plan.len_bytes;
                }
                let chunk = SnapChunk {
                    from: self.cfg.osd,
                    to: key.1,
                    pg: key.0,
                    transfer,
                    index,
                    term,
                    seq: plan.seq,
                    last: plan.last,
                    image: plan.image,
                    object_index: plan.object_index,
                    offset: plan.offset_bytes,
                    total_bytes,
                    data,
                };
                eff.peers.push(PeerSend {
                    to: key.1,
                    pg: key.0,
                    req: Request::SnapChunk(chunk),
                });
            }
        }
        // A transfer abandoned above was reported to Raft in `outs`: the next step's rounds
        // (the next tick at the latest) carry out whatever that produced.
    }

    /// Gives up a transfer and tells Raft, which will ask for a new snapshot.
    fn abandon_send(&mut self, key: (PgId, OsdId)) {
        if self.recovery.sending.remove(&key).is_some() {
            if let Some(h) = self.pgs.get_mut(&key.0) {
                h.replica
                    .report_snapshot(key.1, false, self.outs.entry(key.0).or_default());
            }
        }
    }

    /// The WAL is full: gives up every transfer being sent and tells Raft, which asks again
    /// later from a newer index. A transfer pins the log behind its snapshot, and a long one
    /// (a lost chunk waits for the idle timeout; a big PG at the rate limit takes minutes)
    /// plus writes to the shard's other PGs would otherwise fill the WAL and stop the shard.
    /// Returns how many were abandoned.
    pub(crate) fn abandon_all_sends(&mut self) -> usize {
        let keys: Vec<(PgId, OsdId)> = self.recovery.sending.keys().copied().collect();
        for key in &keys {
            self.abandon_send(*key);
        }
        keys.len()
    }

    /// An acknowledgement from a receiver.
    pub(crate) fn on_snap_ack(
        &mut self,
        from: OsdId,
        pg: PgId,
        transfer: u64,
        seq: u32,
        verdict: SnapVerdict,
        eff: &mut Effects,
    ) {
        let key = (pg, from);
        let Some(active) = self.recovery.sending.get_mut(&key) else {
            return;
        };
        if let SnapVerdict::TooFull { free_bytes } = verdict {
            if transfer != active.sender.transfer {
                return;
            }
            let needed_bytes = active.sender.total_bytes;
            let first = !self.recovery.too_full.contains_key(&key);
            let now = self.now;
            self.recovery.too_full.insert(
                key,
                TooFull {
                    needed_bytes,
                    free_bytes,
                    refused_at: now,
                    retry_at: Micros(now.0 + BACKFILL_RETRY_MS * 1000),
                },
            );
            if first {
                tracing::warn!(%pg, to = %from, needed_bytes, free_bytes,
                    "backfill too full: the target has no room for the snapshot; retrying every {BACKFILL_RETRY_MS} ms");
            }
            eff.probes.backfill_too_full += 1;
            self.abandon_send(key);
            return;
        }
        let ok = verdict == SnapVerdict::Staged;
        if ok && seq == 0 {
            // The target reserved room for the transfer.
            self.recovery.too_full.remove(&key);
        }
        match active.sender.on_ack(transfer, seq, ok) {
            AckOutcome::Stale | AckOutcome::Progress => {}
            AckOutcome::Refused => {
                tracing::info!(%pg, %from, transfer, "snapshot refused by the receiver; will retry");
                self.abandon_send(key);
                eff.probes.transfers_abandoned += 1;
            }
            AckOutcome::Complete => {
                let active = self.recovery.sending.remove(&key).expect("present");
                tracing::info!(%pg, to = %from, index = active.sender.index, bytes = active.sender.total_bytes, "snapshot objects staged; sending the snapshot");
                match active.msg.write_to_bytes() {
                    Ok(bytes) => eff.peers.push(PeerSend {
                        to: from,
                        pg,
                        req: Request::RaftBatch {
                            from: self.cfg.osd,
                            to: from,
                            msgs: vec![RaftEnvelope {
                                pg,
                                msg: bytes.into(),
                            }],
                        },
                    }),
                    Err(e) => tracing::error!(%pg, "encoding a snapshot message: {e}"),
                }
                if let Some(h) = self.pgs.get_mut(&pg) {
                    h.replica
                        .report_snapshot(from, true, self.outs.entry(pg).or_default());
                }
            }
        }
    }

    /// A chunk from a leader: stage it and acknowledge. The first chunk of a transfer
    /// reserves room for all of it, or is refused `TooFull`.
    pub(crate) fn on_snap_chunk(&mut self, c: SnapChunk, eff: &mut Effects) {
        let ack = |seq: u32, verdict: SnapVerdict| PeerSend {
            to: c.from,
            pg: c.pg,
            req: Request::SnapAck {
                from: c.to,
                to: c.from,
                pg: c.pg,
                transfer: c.transfer,
                seq,
                verdict,
            },
        };
        if c.to != self.cfg.osd || !self.pgs.contains_key(&c.pg) {
            eff.peers.push(ack(0, SnapVerdict::Refused));
            return;
        }
        let verdict = self
            .recovery
            .receiving
            .entry(c.pg)
            .or_default()
            .on_chunk(c.transfer, c.seq);
        match verdict {
            ChunkVerdict::Refuse => eff.peers.push(ack(0, SnapVerdict::Refused)),
            ChunkVerdict::Duplicate { ack: seq } => eff.peers.push(ack(seq, SnapVerdict::Staged)),
            ChunkVerdict::Stage => {
                if c.seq == 0 {
                    if let Err(free_bytes) = self.reserve_snapshot(&c) {
                        eff.probes.backfill_refused += 1;
                        self.recovery.receiving.remove(&c.pg);
                        eff.peers.push(ack(0, SnapVerdict::TooFull { free_bytes }));
                        return;
                    }
                }
                let r = {
                    let mut store = self.store.borrow_mut();
                    if c.seq == 0 {
                        // A new transfer: whatever an older one staged is garbage.
                        store.snapshot_abort(c.pg);
                    }
                    let object = fastblock_store::ObjectId {
                        image: c.image,
                        index: c.object_index,
                    };
                    if c.last && c.data.is_empty() {
                        // The end marker names no object.
                        Ok(())
                    } else if c.object_index == IMAGE_SNAPS_CHUNK_INDEX {
                        fastblock_store::ImageSnaps::decode(&c.data).map(|state| {
                            store.snapshot_image_snaps(c.pg, c.transfer, c.image, state)
                        })
                    } else {
                        fastblock_store::ChunkVersions::decode(&c.data).and_then(|versions| {
                            store.snapshot_stage(c.pg, c.transfer, object, c.offset, &versions)
                        })
                    }
                };
                match r {
                    Ok(()) => {
                        self.recovery
                            .receiving
                            .entry(c.pg)
                            .or_default()
                            .staged(c.transfer, c.seq, c.last, c.index, c.term);
                        if let Some(r) = self.recovery.reserved.get_mut(&c.pg) {
                            r.staged_bytes += c.data.len() as u64;
                            r.last_chunk_at = self.now;
                        }
                        eff.peers.push(ack(c.seq, SnapVerdict::Staged));
                    }
                    Err(e) if e.is_fatal() => {
                        let f = ShardFailure::store(Operation::SnapshotStage, Some(c.pg), e);
                        self.fail(f, eff)
                    }
                    Err(e) => {
                        tracing::warn!(pg = %c.pg, "staging a snapshot chunk: {e}");
                        self.recovery.receiving.remove(&c.pg);
                        self.recovery.reserved.remove(&c.pg);
                        self.store.borrow_mut().snapshot_abort(c.pg);
                        let verdict = match e {
                            fastblock_store::Error::NoSpace { free_bytes, .. } => {
                                SnapVerdict::TooFull { free_bytes }
                            }
                            _ => SnapVerdict::Refused,
                        };
                        eff.peers.push(ack(0, verdict));
                    }
                }
            }
        }
    }

    /// Whether a received `MsgSnapshot` may be stepped: only once its objects are staged,
    /// since persisting it installs them.
    pub(crate) fn snapshot_ready(&self, pg: PgId, msg: &Message) -> bool {
        if msg.get_msg_type() != MessageType::MsgSnapshot {
            return true;
        }
        let md = msg.get_snapshot().get_metadata();
        self.recovery
            .receiving
            .get(&pg)
            .is_some_and(|r| r.ready_for(md.index, md.term))
    }

    /// Reserves room for the transfer `c` starts (its seq 0), replacing what this PG held
    /// for an earlier one; `Err(free bytes)` if the data area cannot hold it: what is free
    /// now and after the next flush, less the write reserve, the mutations in flight and what
    /// other transfers hold.
    /// A member that holds an older copy of the PG needs room only for what changed
    /// (unchanged blocks are shared, see the store's `snapshot` module), so the bytes of
    /// its copy count as room; if more changed than that, staging runs out and the transfer
    /// is refused then.
    fn reserve_snapshot(&mut self, c: &SnapChunk) -> Result<(), u64> {
        self.recovery.reserved.remove(&c.pg);
        let (free, pending, held) = {
            let store = self.store.borrow();
            let held: u64 = store.object_sizes(c.pg).iter().map(|(_, b)| *b).sum();
            (store.free_data_bytes(), store.pending_free_bytes(), held)
        };
        let available = (free + pending)
            .saturating_sub(self.cfg.data_reserve_bytes)
            .saturating_sub(self.pending_space_bytes)
            .saturating_sub(self.recovery.reserved_bytes());
        let needed = c.total_bytes.saturating_sub(held);
        if needed > available {
            tracing::warn!(pg = %c.pg, from = %c.from, total = c.total_bytes, held, available,
                "refusing a snapshot: no room to reserve for it");
            return Err(available);
        }
        self.recovery.reserved.insert(
            c.pg,
            Reservation {
                total_bytes: needed,
                staged_bytes: 0,
                last_chunk_at: self.now,
            },
        );
        Ok(())
    }

    /// The snapshot of `pg` was installed: its receiving state and reservation are done.
    pub(crate) fn snapshot_installed(&mut self, pg: PgId) {
        self.recovery.receiving.remove(&pg);
        self.recovery.reserved.remove(&pg);
    }

    /// Per tick: abandon transfers that stopped making progress or whose PG this shard no
    /// longer leads.
    pub(crate) fn tick_recovery(&mut self, eff: &mut Effects) {
        let mut stale = Vec::new();
        let idle_max = self.recovery.limits.idle_ticks_max;
        for (key, active) in self.recovery.sending.iter_mut() {
            active.sender.idle_ticks += 1;
            let leading = self.pgs.get(&key.0).is_some_and(|h| h.replica.is_leader());
            if !leading || active.sender.idle_ticks > idle_max {
                stale.push(*key);
            }
        }
        for key in stale {
            tracing::info!(pg = %key.0, to = %key.1, "snapshot transfer stalled; abandoning");
            self.abandon_send(key);
            eff.probes.transfers_abandoned += 1;
        }
        let now = self.now;
        let pgs = &self.pgs;
        self.recovery.too_full.retain(|(pg, _), t| {
            pgs.get(pg).is_some_and(|h| h.replica.is_leader())
                && now.since(t.refused_at) < TOOFULL_REPORT_MS * 1000
        });
        // A transfer whose chunks stopped coming (its sender abandoned it or lost the lead)
        // gives back its reservation and its staged blocks; if it resumes, its next chunk is
        // refused and the sender starts a new transfer from seq 0.
        let idle: Vec<PgId> = self
            .recovery
            .reserved
            .iter()
            .filter(|(_, r)| now.since(r.last_chunk_at) >= RESERVATION_IDLE_MS * 1000)
            .map(|(pg, _)| *pg)
            .collect();
        for pg in idle {
            tracing::info!(%pg, "no snapshot chunk for {RESERVATION_IDLE_MS} ms; dropping what was staged");
            self.recovery.reserved.remove(&pg);
            self.recovery.receiving.remove(&pg);
            self.store.borrow_mut().snapshot_abort(pg);
        }
    }

    /// Forgets recovery state of a PG this shard no longer hosts.
    pub(crate) fn forget_recovery(&mut self, pg: PgId) {
        self.recovery.sending.retain(|(p, _), _| *p != pg);
        self.recovery.receiving.remove(&pg);
        self.recovery.done_bytes.remove(&pg);
        self.recovery.too_full.retain(|(p, _), _| *p != pg);
        self.recovery.reserved.remove(&pg);
    }
}

//! Snapshot transfer between shards: the leader side streams a PG's objects to a member that
//! needs a snapshot, the receiving side stages them (`docs/design/recovery.md`; the state
//! machines are `fastblock_pg::transfer`).
//!
//! Client IO keeps priority: chunks are read and sent only after a loop iteration has served
//! its inputs, at most `recovery_bytes_per_sec` per shard (a token bucket), with at most
//! `recovery_max_active` transfers per shard at a time. A snapshot Raft asks for beyond that is
//! refused at once and Raft asks again later (on the next heartbeat response).

use super::core::Shard;
use fastblock_pg::transfer::{AckOutcome, ChunkVerdict, ObjectExtent, Receiver, Sender};
use fastblock_pg::Output;
use fastblock_types::units::BLOCK_SIZE_BYTES;
use fastblock_types::{OsdId, PgId};
use fastblock_wire::{RaftEnvelope, Request, SnapChunk};
use protobuf::Message as _;
use raft::eraftpb::{Message, MessageType};
use std::collections::BTreeMap;
use std::time::Instant;

/// Bytes per snapshot chunk: small enough that reading one does not hold up client IO for
/// long (a 128 KiB read is well under a millisecond), large enough to keep frames efficient.
pub const SNAP_CHUNK_BYTES: u64 = 128 << 10;
/// Chunks in flight per transfer.
pub const SNAP_WINDOW_CHUNKS: u32 = 8;
/// Ticks without an acknowledgement after which a transfer is abandoned (Raft asks again).
pub const SNAP_IDLE_TICKS_MAX: u32 = 200;

/// Recovery limits of one shard.
#[derive(Clone, Copy, Debug)]
pub struct RecoveryLimits {
    pub max_active: usize,
    pub bytes_per_sec: u64,
}

struct ActiveSend {
    sender: Sender,
    /// The `MsgSnapshot` to deliver once every chunk is staged.
    msg: Message,
}

/// The shard's recovery state.
pub struct Recovery {
    limits: RecoveryLimits,
    sending: BTreeMap<(PgId, OsdId), ActiveSend>,
    receiving: BTreeMap<PgId, Receiver>,
    /// Transfer ids: unique per sender incarnation (OSD id, start time) and counter.
    next_transfer: u64,
    tokens_bytes: f64,
    refilled_at: Instant,
    /// Bytes this shard sent for snapshots, per PG (reported as recovery progress).
    pub done_bytes: BTreeMap<PgId, u64>,
}

impl Recovery {
    pub fn new(osd: OsdId, shard: u32, limits: RecoveryLimits) -> Recovery {
        let now_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        // High bits: who and which incarnation; low 24 bits: a counter.
        let base = (u64::from(osd.0) << 48) ^ (u64::from(shard) << 40) ^ (now_ns << 24);
        Recovery {
            limits,
            sending: BTreeMap::new(),
            receiving: BTreeMap::new(),
            next_transfer: base,
            tokens_bytes: 0.0,
            refilled_at: Instant::now(),
            done_bytes: BTreeMap::new(),
        }
    }

    /// Bytes and objects still to send for `pg` (0 when it is not recovering here).
    pub fn remaining(&self, pg: PgId) -> (u64, u64) {
        self.sending
            .iter()
            .filter(|((p, _), _)| *p == pg)
            .fold((0, 0), |(b, o), (_, a)| {
                let left = a.sender.remaining_bytes();
                (b + left, o + u64::from(left > 0))
            })
    }

    /// The lowest snapshot index being sent for `pg`, if any.
    pub fn sending_index(&self, pg: PgId) -> Option<u64> {
        self.sending
            .iter()
            .filter(|((p, _), _)| *p == pg)
            .map(|(_, a)| a.sender.index)
            .min()
    }

    pub fn active(&self) -> usize {
        self.sending.len()
    }

    fn refill(&mut self) {
        let now = Instant::now();
        let dt = now.duration_since(self.refilled_at).as_secs_f64();
        self.refilled_at = now;
        let rate = self.limits.bytes_per_sec as f64;
        // At most a tenth of a second of burst.
        self.tokens_bytes =
            (self.tokens_bytes + rate * dt).min(rate / 10.0 + SNAP_CHUNK_BYTES as f64);
    }
}

impl Shard {
    /// Raft wants to send a snapshot: start streaming the PG's objects to its receiver.
    pub fn on_snapshot_request(
        &mut self,
        pg: PgId,
        msg: Message,
        outs: &mut BTreeMap<PgId, Output>,
    ) {
        let to = OsdId(msg.to as u32);
        let key = (pg, to);
        let busy = !self.recovery.sending.contains_key(&key)
            && self.recovery.active() >= self.recovery.limits.max_active;
        if busy {
            tracing::debug!(%pg, %to, "snapshot deferred: recovery limit reached");
            if let Some(h) = self.pgs.get_mut(&pg) {
                h.replica
                    .report_snapshot(to, false, outs.entry(pg).or_default());
            }
            return;
        }
        let md = msg.get_snapshot().get_metadata();
        let objects: Vec<ObjectExtent> = self
            .store
            .borrow()
            .object_sizes(pg)
            .into_iter()
            .map(|(o, size)| ObjectExtent {
                image: o.image,
                index: o.index,
                size_bytes: size.next_multiple_of(BLOCK_SIZE_BYTES),
            })
            .collect();
        let transfer = self.recovery.next_transfer;
        self.recovery.next_transfer += 1;
        tracing::info!(
            %pg, %to, index = md.index, term = md.term, objects = objects.len(), transfer,
            "sending snapshot"
        );
        let sender = Sender::new(
            to,
            transfer,
            md.index,
            md.term,
            objects,
            SNAP_CHUNK_BYTES,
            SNAP_WINDOW_CHUNKS,
        );
        self.recovery
            .sending
            .insert(key, ActiveSend { sender, msg });
    }

    /// Sends chunks within the window and the rate limit. Called once per loop iteration,
    /// after client inputs were served.
    pub fn pump_recovery(&mut self) {
        if self.recovery.sending.is_empty() || self.failed.is_some() {
            return;
        }
        self.recovery.refill();
        let keys: Vec<(PgId, OsdId)> = self.recovery.sending.keys().copied().collect();
        let mut progress = true;
        while progress && self.recovery.tokens_bytes > 0.0 {
            progress = false;
            for key in &keys {
                if self.recovery.tokens_bytes <= 0.0 {
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
                let mut data = bytes::Bytes::new();
                if plan.len_bytes > 0 {
                    let mut buf = vec![0u8; plan.len_bytes as usize];
                    let object = fastblock_store::ObjectId {
                        image: plan.image,
                        index: plan.object_index,
                    };
                    let r = self.store.borrow_mut().read_object(
                        key.0,
                        object,
                        plan.offset_bytes,
                        &mut buf,
                    );
                    if let Err(e) = r {
                        if e.is_fatal() {
                            self.fail(format!("snapshot read of pg {}: {e}", key.0));
                            return;
                        }
                        tracing::warn!(pg = %key.0, "snapshot read: {e}; abandoning the transfer");
                        self.abandon_send(*key, &mut BTreeMap::new());
                        continue;
                    }
                    // Holes are not sent: the receiver starts from nothing.
                    if buf.iter().any(|b| *b != 0) {
                        data = buf.into();
                    }
                    self.recovery.tokens_bytes -= plan.len_bytes as f64;
                    *self.recovery.done_bytes.entry(key.0).or_default() += plan.len_bytes;
                }
                let chunk = SnapChunk {
                    from: self.spec.osd,
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
                    data,
                };
                self.send_peer(key.1, key.0, &Request::SnapChunk(chunk));
            }
        }
    }

    /// Gives up a transfer and tells Raft, which will ask for a new snapshot.
    fn abandon_send(&mut self, key: (PgId, OsdId), outs: &mut BTreeMap<PgId, Output>) {
        if self.recovery.sending.remove(&key).is_some() {
            if let Some(h) = self.pgs.get_mut(&key.0) {
                h.replica
                    .report_snapshot(key.1, false, outs.entry(key.0).or_default());
            }
        }
    }

    /// The WAL is full: gives up every transfer being sent and tells Raft, which asks again
    /// later from a newer index. A transfer pins the log behind its snapshot, and a long one
    /// (a lost chunk waits for the idle timeout; a big PG at the rate limit takes minutes)
    /// plus writes to the shard's other PGs would otherwise fill the WAL and stop the shard.
    /// Returns how many were abandoned.
    pub fn abandon_all_sends(&mut self, outs: &mut BTreeMap<PgId, Output>) -> usize {
        let keys: Vec<(PgId, OsdId)> = self.recovery.sending.keys().copied().collect();
        for key in &keys {
            self.abandon_send(*key, outs);
        }
        keys.len()
    }

    /// An acknowledgement from a receiver.
    pub fn on_snap_ack(
        &mut self,
        from: OsdId,
        pg: PgId,
        transfer: u64,
        seq: u32,
        ok: bool,
        outs: &mut BTreeMap<PgId, Output>,
    ) {
        let key = (pg, from);
        let Some(active) = self.recovery.sending.get_mut(&key) else {
            return;
        };
        match active.sender.on_ack(transfer, seq, ok) {
            AckOutcome::Stale | AckOutcome::Progress => {}
            AckOutcome::Refused => {
                tracing::info!(%pg, %from, transfer, "snapshot refused by the receiver; will retry");
                self.abandon_send(key, outs);
            }
            AckOutcome::Complete => {
                let active = self.recovery.sending.remove(&key).expect("present");
                tracing::info!(%pg, to = %from, index = active.sender.index, bytes = active.sender.total_bytes, "snapshot objects staged; sending the snapshot");
                match active.msg.write_to_bytes() {
                    Ok(bytes) => self.send_peer(
                        from,
                        pg,
                        &Request::RaftBatch {
                            from: self.spec.osd,
                            to: from,
                            msgs: vec![RaftEnvelope {
                                pg,
                                msg: bytes.into(),
                            }],
                        },
                    ),
                    Err(e) => tracing::error!(%pg, "encoding a snapshot message: {e}"),
                }
                if let Some(h) = self.pgs.get_mut(&pg) {
                    h.replica
                        .report_snapshot(from, true, outs.entry(pg).or_default());
                }
            }
        }
    }

    /// A chunk from a leader: stage it and acknowledge.
    pub fn on_snap_chunk(&mut self, c: SnapChunk) {
        let ack = |seq: u32, ok: bool| Request::SnapAck {
            from: c.to,
            to: c.from,
            pg: c.pg,
            transfer: c.transfer,
            seq,
            ok,
        };
        if c.to != self.spec.osd || !self.pgs.contains_key(&c.pg) {
            self.send_peer(c.from, c.pg, &ack(0, false));
            return;
        }
        let verdict = self
            .recovery
            .receiving
            .entry(c.pg)
            .or_default()
            .on_chunk(c.transfer, c.seq);
        match verdict {
            ChunkVerdict::Refuse => self.send_peer(c.from, c.pg, &ack(0, false)),
            ChunkVerdict::Duplicate { ack: seq } => self.send_peer(c.from, c.pg, &ack(seq, true)),
            ChunkVerdict::Stage => {
                let r = {
                    let mut store = self.store.borrow_mut();
                    if c.seq == 0 {
                        // A new transfer: whatever an older one staged is garbage.
                        store.snapshot_abort(c.pg);
                    }
                    if c.data.is_empty() {
                        Ok(())
                    } else {
                        let object = fastblock_store::ObjectId {
                            image: c.image,
                            index: c.object_index,
                        };
                        store.snapshot_write(c.pg, c.transfer, object, c.offset, &c.data)
                    }
                };
                match r {
                    Ok(()) => {
                        self.recovery
                            .receiving
                            .entry(c.pg)
                            .or_default()
                            .staged(c.transfer, c.seq, c.last, c.index, c.term);
                        self.send_peer(c.from, c.pg, &ack(c.seq, true));
                    }
                    Err(e) if e.is_fatal() => self.fail(format!("staging a snapshot: {e}")),
                    Err(e) => {
                        tracing::warn!(pg = %c.pg, "staging a snapshot chunk: {e}");
                        self.recovery.receiving.remove(&c.pg);
                        self.store.borrow_mut().snapshot_abort(c.pg);
                        self.send_peer(c.from, c.pg, &ack(0, false));
                    }
                }
            }
        }
    }

    /// Whether a received `MsgSnapshot` may be stepped: only once its objects are staged,
    /// since persisting it installs them.
    pub fn snapshot_ready(&self, pg: PgId, msg: &Message) -> bool {
        if msg.get_msg_type() != MessageType::MsgSnapshot {
            return true;
        }
        let md = msg.get_snapshot().get_metadata();
        self.recovery
            .receiving
            .get(&pg)
            .is_some_and(|r| r.ready_for(md.index, md.term))
    }

    /// The snapshot of `pg` was installed: its receiving state is done.
    pub fn snapshot_installed(&mut self, pg: PgId) {
        self.recovery.receiving.remove(&pg);
    }

    /// Per tick: abandon transfers that stopped making progress or whose PG this shard no
    /// longer leads.
    pub fn tick_recovery(&mut self, outs: &mut BTreeMap<PgId, Output>) {
        let mut stale = Vec::new();
        for (key, active) in self.recovery.sending.iter_mut() {
            active.sender.idle_ticks += 1;
            let leading = self.pgs.get(&key.0).is_some_and(|h| h.replica.is_leader());
            if !leading || active.sender.idle_ticks > SNAP_IDLE_TICKS_MAX {
                stale.push(*key);
            }
        }
        for key in stale {
            tracing::info!(pg = %key.0, to = %key.1, "snapshot transfer stalled; abandoning");
            self.abandon_send(key, outs);
        }
    }

    /// Forgets recovery state of a PG this shard no longer hosts.
    pub fn forget_recovery(&mut self, pg: PgId) {
        self.recovery.sending.retain(|(p, _), _| *p != pg);
        self.recovery.receiving.remove(&pg);
        self.recovery.done_bytes.remove(&pg);
    }

    /// Sends one OSD-to-OSD request to the shard of `to` that hosts `pg`.
    pub fn send_peer(&mut self, to: OsdId, pg: PgId, req: &Request) {
        let Some(info) = self.map.osds.get(&to).cloned() else {
            return;
        };
        let port = info.port_for(pg);
        let link = self.peer_link(to, &info.address, port, info.boot_epoch);
        let mut o = link.borrow_mut();
        if o.buf.len() > super::net::OUT_BYTES_MAX {
            return; // the peer is not keeping up: the transfer times out and restarts
        }
        req.encode(0, &mut o.buf);
        o.flush_now();
    }
}

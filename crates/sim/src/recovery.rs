//! Snapshot transfer between nodes: mirrors `crates/osd/src/shard/recovery.rs` function by
//! function (the state machines are the real `fastblock_pg::transfer`). Differences: the
//! token bucket runs on virtual time, transfer ids come from the node's incarnation instead of
//! the clock, and the limits are the run's (smaller chunks and windows than the OSD's, so that
//! the simulator's small objects still take many chunks).

use crate::node::{Effects, NodeConfig, PeerMsg, Running, SnapChunk};
use fastblock_pg::transfer::{AckOutcome, ChunkVerdict, ObjectExtent, Receiver, Sender};
use fastblock_pg::Output;
use fastblock_store::ObjectId;
use fastblock_types::units::BLOCK_SIZE_BYTES;
use fastblock_types::{OsdId, PgId};
use protobuf::Message as _;
use raft::eraftpb::{Message, MessageType};
use std::collections::BTreeMap;

struct ActiveSend {
    sender: Sender,
    /// The `MsgSnapshot` to deliver once every chunk is staged.
    msg: Message,
}

/// A node's recovery state (`recovery.rs` `Recovery`).
pub struct Recovery {
    max_active: usize,
    bytes_per_sec: u64,
    chunk_bytes: u64,
    window_chunks: u32,
    idle_ticks_max: u32,
    sending: BTreeMap<(PgId, OsdId), ActiveSend>,
    receiving: BTreeMap<PgId, Receiver>,
    next_transfer: u64,
    tokens_bytes: u64,
    refilled_at_us: u64,
}

impl Recovery {
    pub fn new(osd: OsdId, incarnation: u64, cfg: &NodeConfig) -> Recovery {
        Recovery {
            max_active: cfg.recovery_max_active,
            bytes_per_sec: cfg.recovery_bytes_per_sec,
            chunk_bytes: cfg.snap_chunk_bytes,
            window_chunks: cfg.snap_window_chunks,
            idle_ticks_max: cfg.snap_idle_ticks_max,
            sending: BTreeMap::new(),
            receiving: BTreeMap::new(),
            // High bits: who and which incarnation; low 24 bits: a counter.
            next_transfer: (u64::from(osd.0) << 48) ^ (incarnation << 24),
            tokens_bytes: 0,
            refilled_at_us: 0,
        }
    }

    /// The lowest snapshot index being sent for `pg`, if any.
    pub fn sending_index(&self, pg: PgId) -> Option<u64> {
        self.sending
            .iter()
            .filter(|((p, _), _)| *p == pg)
            .map(|(_, a)| a.sender.index)
            .min()
    }

    /// `Shard::abandon_all_sends` (a full WAL): drops every transfer being sent; returns them
    /// so that Raft can be told after the round.
    pub fn abandon_all(&mut self) -> Vec<(PgId, OsdId)> {
        std::mem::take(&mut self.sending).into_keys().collect()
    }

    fn refill(&mut self, now_us: u64) {
        let dt_us = now_us.saturating_sub(self.refilled_at_us);
        self.refilled_at_us = now_us;
        let cap = self.bytes_per_sec / 10 + self.chunk_bytes;
        let add = self.bytes_per_sec.saturating_mul(dt_us) / 1_000_000;
        self.tokens_bytes = self.tokens_bytes.saturating_add(add).min(cap);
    }
}

impl Running {
    /// `Shard::on_snapshot_request`.
    pub(crate) fn on_snapshot_request(
        &mut self,
        pg: PgId,
        msg: Message,
        outs: &mut BTreeMap<PgId, Output>,
        eff: &mut Effects,
    ) {
        let to = OsdId(msg.to as u32);
        let key = (pg, to);
        let busy = !self.recovery.sending.contains_key(&key)
            && self.recovery.sending.len() >= self.recovery.max_active;
        if busy {
            if let Some(r) = self.pgs.get_mut(&pg) {
                r.report_snapshot(to, false, outs.entry(pg).or_default());
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
        eff.transfers_started += 1;
        eff.note(|| {
            format!(
                "pg {pg}: sending snapshot index {} term {} to osd {to} ({} objects, transfer {transfer:#x})",
                md.index,
                md.term,
                objects.len()
            )
        });
        let sender = Sender::new(
            to,
            transfer,
            md.index,
            md.term,
            objects,
            self.recovery.chunk_bytes,
            self.recovery.window_chunks,
        );
        self.recovery
            .sending
            .insert(key, ActiveSend { sender, msg });
    }

    /// `Shard::pump_recovery`: chunks within the window and the rate limit, after the
    /// iteration's inputs were served.
    pub(crate) fn pump_recovery(&mut self, now_us: u64, eff: &mut Effects) {
        if self.recovery.sending.is_empty() || self.failed.is_some() {
            return;
        }
        self.recovery.refill(now_us);
        let keys: Vec<(PgId, OsdId)> = self.recovery.sending.keys().copied().collect();
        let mut progress = true;
        while progress && self.recovery.tokens_bytes > 0 {
            progress = false;
            for key in &keys {
                if self.recovery.tokens_bytes == 0 {
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
                    let object = ObjectId {
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
                            self.fail(format!("snapshot read of pg {}: {e}", key.0), eff);
                            return;
                        }
                        panic!("pg {}: snapshot read: {e}", key.0);
                    }
                    // Holes are not sent: the receiver starts from nothing.
                    if buf.iter().any(|b| *b != 0) {
                        data = buf.into();
                    }
                    self.recovery.tokens_bytes =
                        self.recovery.tokens_bytes.saturating_sub(plan.len_bytes);
                }
                let chunk = SnapChunk {
                    from: self.me,
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
                eff.messages.push((key.0, key.1, PeerMsg::Chunk(chunk)));
            }
        }
    }

    /// `Shard::abandon_send`.
    fn abandon_send(
        &mut self,
        key: (PgId, OsdId),
        outs: &mut BTreeMap<PgId, Output>,
        eff: &mut Effects,
    ) {
        if self.recovery.sending.remove(&key).is_some() {
            eff.transfers_abandoned += 1;
            eff.note(|| format!("pg {}: snapshot to osd {} abandoned", key.0, key.1));
            if let Some(r) = self.pgs.get_mut(&key.0) {
                r.report_snapshot(key.1, false, outs.entry(key.0).or_default());
            }
        }
    }

    /// `Shard::on_snap_ack`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn on_snap_ack(
        &mut self,
        from: OsdId,
        pg: PgId,
        transfer: u64,
        seq: u32,
        ok: bool,
        outs: &mut BTreeMap<PgId, Output>,
        eff: &mut Effects,
    ) {
        let key = (pg, from);
        let Some(active) = self.recovery.sending.get_mut(&key) else {
            return;
        };
        match active.sender.on_ack(transfer, seq, ok) {
            AckOutcome::Stale | AckOutcome::Progress => {}
            AckOutcome::Refused => self.abandon_send(key, outs, eff),
            AckOutcome::Complete => {
                let active = self.recovery.sending.remove(&key).expect("present");
                eff.note(|| {
                    format!("pg {pg}: snapshot objects staged at osd {from}; sending the snapshot")
                });
                let bytes = active
                    .msg
                    .write_to_bytes()
                    .unwrap_or_else(|e| panic!("pg {pg}: encoding a snapshot message: {e}"));
                eff.messages
                    .push((pg, from, PeerMsg::Raft(bytes::Bytes::from(bytes))));
                if let Some(r) = self.pgs.get_mut(&pg) {
                    r.report_snapshot(from, true, outs.entry(pg).or_default());
                }
            }
        }
    }

    /// `Shard::on_snap_chunk`: stage a chunk and acknowledge.
    pub(crate) fn on_snap_chunk(&mut self, c: SnapChunk, eff: &mut Effects) {
        let ack = |seq: u32, ok: bool| PeerMsg::Ack {
            transfer: c.transfer,
            seq,
            ok,
        };
        if c.to != self.me || !self.pgs.contains_key(&c.pg) {
            eff.messages.push((c.pg, c.from, ack(0, false)));
            return;
        }
        let verdict = self
            .recovery
            .receiving
            .entry(c.pg)
            .or_default()
            .on_chunk(c.transfer, c.seq);
        match verdict {
            ChunkVerdict::Refuse => eff.messages.push((c.pg, c.from, ack(0, false))),
            ChunkVerdict::Duplicate { ack: seq } => {
                eff.messages.push((c.pg, c.from, ack(seq, true)))
            }
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
                        let object = ObjectId {
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
                        eff.messages.push((c.pg, c.from, ack(c.seq, true)));
                    }
                    Err(e) if e.is_fatal() => self.fail(format!("staging a snapshot: {e}"), eff),
                    Err(e) => {
                        eff.note(|| format!("pg {}: staging a snapshot chunk: {e}", c.pg));
                        self.recovery.receiving.remove(&c.pg);
                        self.store.borrow_mut().snapshot_abort(c.pg);
                        eff.messages.push((c.pg, c.from, ack(0, false)));
                    }
                }
            }
        }
    }

    /// `Shard::snapshot_ready`: a `MsgSnapshot` may be stepped only once its objects are
    /// staged, since persisting it installs them.
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

    /// `Shard::snapshot_installed`.
    pub(crate) fn snapshot_installed(&mut self, pg: PgId) {
        self.recovery.receiving.remove(&pg);
    }

    /// `Shard::tick_recovery`: abandon transfers that stopped making progress or whose PG
    /// this node no longer leads.
    pub(crate) fn tick_recovery(&mut self, outs: &mut BTreeMap<PgId, Output>, eff: &mut Effects) {
        let mut stale = Vec::new();
        for (key, active) in self.recovery.sending.iter_mut() {
            active.sender.idle_ticks += 1;
            let leading = self.pgs.get(&key.0).is_some_and(|r| r.is_leader());
            if !leading || active.sender.idle_ticks > self.recovery.idle_ticks_max {
                stale.push(*key);
            }
        }
        for key in stale {
            self.abandon_send(key, outs, eff);
        }
    }

    /// `Shard::forget_recovery`.
    pub(crate) fn forget_recovery(&mut self, pg: PgId) {
        self.recovery.sending.retain(|(p, _), _| *p != pg);
        self.recovery.receiving.remove(&pg);
    }
}

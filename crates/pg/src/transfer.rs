//! Snapshot transfer of a PG's objects, as pure state machines (the OSD and the simulator do
//! the reads, writes and sends).
//!
//! Raft decides *when* a follower needs a snapshot (its next index is below the leader's
//! first log index) and produces a `MsgSnapshot` carrying only metadata: index `i`, term and
//! configuration. The [`Sender`] streams the leader's objects in bounded chunks, a window of
//! them in flight, each acknowledged cumulatively by the [`Receiver`], which stages them
//! (`Store::snapshot_write`). Only when every chunk is acknowledged does the leader deliver the
//! `MsgSnapshot`; the receiver steps it into Raft, whose ready makes the store install the
//! staged objects atomically.
//!
//! Consistency: chunks are read from the leader's live object store while it keeps applying
//! writes, so the copy is fuzzy: each block is as of some index in `[i, j]`, where `j` is the
//! applied index when the last chunk was read. Every log entry is an idempotent overwrite of a
//! byte range (write, discard, write-zeroes), and the leader keeps its log after `i` until the
//! receiver has caught up (compaction never passes the slowest member's match), so replaying
//! `i+1..=j` over the installed copy gives exactly the leader's state at `j`: a block changed
//! after `i` is rewritten by its last change, an unchanged block was copied as of `i`. The
//! receiver applies nothing before that replay and serves no reads until it leads, which needs
//! an up-to-date log, so the intermediate state is never observed.
//!
//! Failure: a receiver that restarts loses its staging and refuses chunks of a transfer it has
//! not seen from seq 0 (`SnapAck` verdict refused); a sender that sees no progress for a
//! while, a refusal, or a new leader abandons the transfer; Raft is told the snapshot failed
//! and asks for a new one, which starts a new transfer with a new id.

use fastblock_types::units::BLOCK_SIZE_BYTES;
use fastblock_types::{ImageId, OsdId};
use std::collections::VecDeque;

/// One object to send and its size (highest byte written, rounded up to a block).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectExtent {
    pub image: ImageId,
    pub index: u64,
    pub size_bytes: u64,
}

/// A chunk to read and send: `len_bytes` at `offset_bytes` of an object (`len_bytes` is 0 on
/// the final marker).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkPlan {
    pub seq: u32,
    pub image: ImageId,
    pub object_index: u64,
    pub offset_bytes: u64,
    pub len_bytes: u64,
    pub last: bool,
}

/// Sending one snapshot to one member.
#[derive(Debug)]
pub struct Sender {
    pub to: OsdId,
    pub transfer: u64,
    pub index: u64,
    pub term: u64,
    objects: VecDeque<ObjectExtent>,
    /// Offset within the front object of the next chunk.
    cursor_bytes: u64,
    chunk_bytes: u64,
    window_chunks: u32,
    next_seq: u32,
    /// Highest cumulatively acknowledged seq + 1.
    acked: u32,
    last_sent: bool,
    /// Bytes of the objects in total and sent so far (progress reporting).
    pub total_bytes: u64,
    pub sent_bytes: u64,
    /// Ticks since the last acknowledgement that made progress.
    pub idle_ticks: u32,
}

/// What an acknowledgement meant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckOutcome {
    /// More chunks may go.
    Progress,
    /// Every chunk, the final one included, is staged: deliver the `MsgSnapshot`.
    Complete,
    /// The receiver refused: abandon and tell Raft the snapshot failed.
    Refused,
    /// For another transfer or an old seq: ignore.
    Stale,
}

impl Sender {
    pub fn new(
        to: OsdId,
        transfer: u64,
        index: u64,
        term: u64,
        objects: Vec<ObjectExtent>,
        chunk_bytes: u64,
        window_chunks: u32,
    ) -> Sender {
        assert!(chunk_bytes > 0 && chunk_bytes % BLOCK_SIZE_BYTES == 0);
        assert!(window_chunks > 0);
        let total_bytes = objects.iter().map(|o| o.size_bytes).sum();
        Sender {
            to,
            transfer,
            index,
            term,
            objects: objects.into(),
            cursor_bytes: 0,
            chunk_bytes,
            window_chunks,
            next_seq: 0,
            acked: 0,
            last_sent: false,
            total_bytes,
            sent_bytes: 0,
            idle_ticks: 0,
        }
    }

    /// The next chunk to send, if the window allows one.
    pub fn next_chunk(&mut self) -> Option<ChunkPlan> {
        if self.last_sent || self.next_seq - self.acked >= self.window_chunks {
            return None;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        while let Some(front) = self.objects.front() {
            if self.cursor_bytes < front.size_bytes {
                break;
            }
            self.objects.pop_front();
            self.cursor_bytes = 0;
        }
        let Some(front) = self.objects.front().copied() else {
            self.last_sent = true;
            return Some(ChunkPlan {
                seq,
                image: ImageId(0),
                object_index: 0,
                offset_bytes: 0,
                len_bytes: 0,
                last: true,
            });
        };
        let len = self.chunk_bytes.min(front.size_bytes - self.cursor_bytes);
        let plan = ChunkPlan {
            seq,
            image: front.image,
            object_index: front.index,
            offset_bytes: self.cursor_bytes,
            len_bytes: len,
            last: false,
        };
        self.cursor_bytes += len;
        self.sent_bytes += len;
        Some(plan)
    }

    /// An acknowledgement from the receiver.
    pub fn on_ack(&mut self, transfer: u64, seq: u32, ok: bool) -> AckOutcome {
        if transfer != self.transfer {
            return AckOutcome::Stale;
        }
        if !ok {
            return AckOutcome::Refused;
        }
        if seq >= self.next_seq || seq < self.acked {
            return AckOutcome::Stale;
        }
        self.acked = seq + 1;
        self.idle_ticks = 0;
        if self.last_sent && self.acked == self.next_seq {
            AckOutcome::Complete
        } else {
            AckOutcome::Progress
        }
    }

    pub fn remaining_bytes(&self) -> u64 {
        self.total_bytes.saturating_sub(self.sent_bytes)
    }
}

/// Receiving snapshot chunks for one PG.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Receiver {
    /// The transfer being received and the next seq expected from it.
    pub current: Option<(u64, u32)>,
    /// The transfer whose final chunk arrived: its `MsgSnapshot` may be stepped.
    pub complete: Option<(u64, u64, u64)>,
}

/// What to do with an arriving chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkVerdict {
    /// Stage it (a new transfer starting at seq 0 replaces any other), then ack `seq`.
    Stage,
    /// A duplicate of a staged chunk: just ack the highest staged seq again.
    Duplicate { ack: u32 },
    /// Out of order or of an unknown transfer: refuse (the sender restarts).
    Refuse,
}

impl Receiver {
    pub fn on_chunk(&mut self, transfer: u64, seq: u32) -> ChunkVerdict {
        match self.current {
            Some((t, next)) if t == transfer => {
                if seq == next {
                    ChunkVerdict::Stage
                } else if seq < next {
                    ChunkVerdict::Duplicate { ack: next - 1 }
                } else {
                    ChunkVerdict::Refuse
                }
            }
            _ if seq == 0 => ChunkVerdict::Stage,
            _ => ChunkVerdict::Refuse,
        }
    }

    /// The chunk was staged.
    pub fn staged(&mut self, transfer: u64, seq: u32, last: bool, index: u64, term: u64) {
        if seq == 0 {
            self.complete = None;
        }
        self.current = Some((transfer, seq + 1));
        if last {
            self.complete = Some((transfer, index, term));
        }
    }

    /// Whether a `MsgSnapshot` for `index`/`term` has its objects staged.
    pub fn ready_for(&self, index: u64, term: u64) -> bool {
        self.complete
            .is_some_and(|(_, i, t)| i == index && t == term)
    }

    pub fn reset(&mut self) {
        *self = Receiver::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn objs() -> Vec<ObjectExtent> {
        vec![
            ObjectExtent {
                image: ImageId(1),
                index: 0,
                size_bytes: 12288,
            },
            ObjectExtent {
                image: ImageId(1),
                index: 5,
                size_bytes: 4096,
            },
        ]
    }

    #[test]
    fn chunks_cover_every_object_then_a_final_marker() {
        let mut s = Sender::new(OsdId(2), 9, 100, 3, objs(), 8192, 2);
        let a = s.next_chunk().unwrap();
        let b = s.next_chunk().unwrap();
        assert_eq!((a.object_index, a.offset_bytes, a.len_bytes), (0, 0, 8192));
        assert_eq!(
            (b.object_index, b.offset_bytes, b.len_bytes),
            (0, 8192, 4096)
        );
        assert_eq!(s.next_chunk(), None, "window of 2");
        assert_eq!(s.on_ack(9, 0, true), AckOutcome::Progress);
        let c = s.next_chunk().unwrap();
        assert_eq!((c.object_index, c.offset_bytes, c.len_bytes), (5, 0, 4096));
        assert_eq!(s.on_ack(9, 2, true), AckOutcome::Progress);
        let d = s.next_chunk().unwrap();
        assert!(d.last && d.len_bytes == 0 && d.seq == 3);
        assert_eq!(s.next_chunk(), None);
        assert_eq!(s.on_ack(8, 3, true), AckOutcome::Stale);
        assert_eq!(s.on_ack(9, 1, true), AckOutcome::Stale);
        assert_eq!(s.on_ack(9, 3, true), AckOutcome::Complete);
        assert_eq!(s.remaining_bytes(), 0);
    }

    #[test]
    fn an_empty_pg_is_just_the_marker() {
        let mut s = Sender::new(OsdId(2), 1, 10, 1, vec![], 8192, 4);
        let m = s.next_chunk().unwrap();
        assert!(m.last);
        assert_eq!(s.on_ack(1, 0, true), AckOutcome::Complete);
    }

    #[test]
    fn receiver_accepts_in_order_and_restarts_on_a_new_transfer() {
        let mut r = Receiver::default();
        assert_eq!(r.on_chunk(5, 1), ChunkVerdict::Refuse, "must start at 0");
        assert_eq!(r.on_chunk(5, 0), ChunkVerdict::Stage);
        r.staged(5, 0, false, 100, 3);
        assert_eq!(r.on_chunk(5, 0), ChunkVerdict::Duplicate { ack: 0 });
        assert_eq!(r.on_chunk(5, 2), ChunkVerdict::Refuse, "gap");
        assert_eq!(r.on_chunk(5, 1), ChunkVerdict::Stage);
        r.staged(5, 1, true, 100, 3);
        assert!(r.ready_for(100, 3));
        assert!(!r.ready_for(100, 4));
        // A new leader's transfer replaces it.
        assert_eq!(r.on_chunk(6, 0), ChunkVerdict::Stage);
        r.staged(6, 0, false, 120, 4);
        assert!(!r.ready_for(100, 3));
        assert_eq!(r.on_chunk(5, 2), ChunkVerdict::Refuse);
    }

    #[test]
    fn refusal_aborts_the_sender() {
        let mut s = Sender::new(OsdId(2), 9, 100, 3, objs(), 8192, 2);
        s.next_chunk();
        assert_eq!(s.on_ack(9, 0, false), AckOutcome::Refused);
    }
}

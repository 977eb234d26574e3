//! Client reads, batched per step. A read whose barrier passed (`OpOutcome::ReadReady`) is
//! not read at once: it waits in [`ReadyReads`] until the step's rounds have settled, and then
//! every ready read of the step goes to the store in one [`Store::read_objects`] call, which
//! the disk submits as one batch and waits for once. At QD32 a step often readies dozens of
//! reads; one read and one wait each kept the device at depth one and cost an
//! `io_uring_enter` per read.
//!
//! Reading at the end of the step rather than when the barrier passed can only show more:
//! the rounds in between apply committed entries, never undo one, so a read still sees every
//! write acknowledged before it was sent (and a write applied meanwhile is committed, so
//! showing it is linearizable).
//!
//! [`Store::read_objects`]: fastblock_store::Store::read_objects

use crate::core::ShardCore;
use crate::io::{Effects, Micros};
use crate::stage::Stage;
use fastblock_store::{Disk, ObjectId, ObjectRead};
use fastblock_types::PgId;
use fastblock_wire::{ObjectAddr, Reply};

/// A client read whose barrier passed, waiting for the end of the step.
pub(crate) struct ReadyRead {
    pub conn: crate::io::ConnId,
    pub request_id: u64,
    pub pg: PgId,
    pub addr: ObjectAddr,
    pub offset: u32,
    pub length: u32,
    /// When the request was read, and when its read index was asked.
    pub arrived: Micros,
    pub started: Micros,
    /// When its barrier passed.
    pub ready: Micros,
}

/// The reads of the current step, in the order their barriers passed.
#[derive(Default)]
pub(crate) struct ReadyReads {
    reads: Vec<ReadyRead>,
}

impl ReadyReads {
    pub fn push(&mut self, read: ReadyRead) {
        self.reads.push(read);
    }

    pub fn is_empty(&self) -> bool {
        self.reads.is_empty()
    }
}

impl<D: Disk + 'static> ShardCore<D> {
    /// A read is answered from the store once the replica's applied index passed its barrier;
    /// the store's own applied index must then be at least as far (the core sets it before it
    /// tells the replica; an installed snapshot moves it first). Logged, not asserted: added
    /// while the chaos run's stale reads were chased (their cause was a given-up request
    /// delivered late, `docs/data-path.md` section 4), it did not fire in the runs whose logs
    /// were kept, and a store behind its replica would serve old data without it saying so.
    fn check_store_applied(&self, reads: &[ReadyRead]) {
        let store = self.store.borrow();
        let mut last = None;
        for r in reads {
            if last == Some(r.addr.pg) {
                continue;
            }
            last = Some(r.addr.pg);
            let Some(h) = self.pgs.get(&r.addr.pg) else {
                continue;
            };
            let (stored, replica) = (store.applied_index(r.addr.pg), h.replica.applied().0);
            if stored < replica {
                tracing::error!(
                    pg = %r.addr.pg, stored, replica,
                    "a read is answered while the store's applied index is behind the replica's"
                );
            }
        }
    }

    /// The read trace (`fastblock_io=debug`, off by default): which replica answered each
    /// read, in which term and at which applied indexes.
    fn trace_reads(&self, reads: &[ReadyRead]) {
        let store = self.store.borrow();
        for r in reads {
            let Some(h) = self.pgs.get(&r.addr.pg) else {
                continue;
            };
            tracing::debug!(
                target: "fastblock_io", pg = %r.addr.pg, image = %r.addr.image,
                object = r.addr.object_index, offset = r.offset, len = r.length,
                term = h.replica.term().0, leader = h.replica.is_leader(),
                applied = h.replica.applied().0, commit = h.replica.commit_index().0,
                stored = store.applied_index(r.addr.pg), request = r.request_id, "read served"
            );
        }
    }

    /// Reads every read of the step in one batch and answers each. If the batch fails, each
    /// read is retried alone, so that an error (a bad checksum, a fatal disk error) is
    /// answered to the reads it concerns only and the others still get their data.
    pub(crate) fn finish_reads(&mut self, eff: &mut Effects) {
        if self.ready_reads.is_empty() {
            return;
        }
        let reads = std::mem::take(&mut self.ready_reads.reads);
        self.check_store_applied(&reads);
        let start = self.metrics_now();
        let mut bufs: Vec<Vec<u8>> = reads.iter().map(|r| vec![0u8; r.length as usize]).collect();
        let batch = {
            let mut reqs: Vec<ObjectRead<'_>> = reads
                .iter()
                .zip(bufs.iter_mut())
                .map(|(r, buf)| ObjectRead {
                    pg: r.addr.pg,
                    object: ObjectId {
                        image: r.addr.image,
                        index: r.addr.object_index,
                    },
                    offset_bytes: u64::from(r.offset),
                    buf: buf.as_mut_slice(),
                })
                .collect();
            self.store.borrow_mut().read_objects(&mut reqs)
        };
        let end = self.metrics_now();
        if reads.len() > 1 {
            eff.probes.reads_batched += 1;
        }
        if batch.is_err() {
            eff.probes.read_batches_retried += 1;
        }
        if tracing::enabled!(target: "fastblock_io", tracing::Level::DEBUG) {
            self.trace_reads(&reads);
        }
        for (r, buf) in reads.into_iter().zip(bufs) {
            let result = match &batch {
                Ok(()) => Ok(bytes::Bytes::from(buf)),
                Err(_) => self.read_for_client(r.addr, r.offset, r.length, eff),
            };
            eff.stage(Stage::ReadIndex, r.started, r.ready);
            eff.stages.push((Stage::Read, end.since(start)));
            eff.stage(Stage::OpRead, r.arrived, end);
            self.history.record(crate::optrack::OpView {
                pg: r.pg,
                kind: "read",
                request_id: r.request_id,
                path: crate::optrack::OpPath::Read,
                marks: [
                    Some(r.arrived),
                    Some(r.started),
                    Some(r.ready),
                    None,
                    Some(end),
                ],
            });
            let reply = match result {
                Ok(data) => {
                    if let Some(h) = self.pgs.get_mut(&r.pg) {
                        h.io.read_ops += 1;
                        h.io.read_bytes += u64::from(r.length);
                    }
                    self.io_totals.read_ops += 1;
                    self.io_totals.read_bytes += u64::from(r.length);
                    Reply::Data(data)
                }
                Err(reply) => reply,
            };
            eff.replies.push((r.conn, r.request_id, reply));
        }
        assert!(self.ready_reads.is_empty(), "a read readied while reading");
    }
}

//! Client and peer requests arriving at a shard.

use super::core::{OpKind, PendingOp, Shard, CONN_INFLIGHT_OPS_MAX};
use super::net::{ConnId, Input};
use crate::stages::Stage;
use fastblock_pg::{ClientOp, ObjectRef, Output};
use fastblock_types::PgId;
use fastblock_wire::{
    AllocatedRange, LeaderHint, ObjectAddr, ObjectDigest, Reply, Request, Status,
};
use protobuf::Message as _;
use std::collections::BTreeMap;
use std::time::Instant;

/// Largest single read or mutation: clients split IO at object boundaries, and objects are at
/// most 64 MiB; one request is further bounded to keep frames small.
pub const REQUEST_BYTES_MAX: u32 = 8 << 20;
/// Offsets within an object stay below the largest object size.
pub const OBJECT_BYTES_MAX: u64 = 64 << 20;
/// Free data space below which new mutations are refused with `NoSpace`, so that every
/// committed entry can still be applied.
pub const DATA_RESERVE_BYTES: u64 = 32 << 20;
/// Bytes of each object digested by `ReplicaDigest` (the default object size).
pub const DIGEST_WINDOW_BYTES: u32 = 4 << 20;

fn range_ok(offset: u32, length: u32) -> Result<(), String> {
    if length > REQUEST_BYTES_MAX {
        return Err(format!(
            "request of {length} bytes exceeds {REQUEST_BYTES_MAX}"
        ));
    }
    if u64::from(offset) + u64::from(length) > OBJECT_BYTES_MAX {
        return Err(format!(
            "range {offset}+{length} exceeds the object size limit {OBJECT_BYTES_MAX}"
        ));
    }
    Ok(())
}

/// A mutating request as the log operation it becomes: (PG, offset, length, op).
fn mutation(req: Request) -> Option<(PgId, u32, u32, ClientOp)> {
    let object = |a: &ObjectAddr| ObjectRef {
        image: a.image,
        index: a.object_index,
    };
    match req {
        Request::Write {
            addr, offset, data, ..
        } => {
            let length = u32::try_from(data.len()).unwrap_or(u32::MAX);
            Some((
                addr.pg,
                offset,
                length,
                ClientOp::Write {
                    object: object(&addr),
                    offset,
                    data,
                },
            ))
        }
        Request::Discard {
            addr,
            offset,
            length,
            ..
        } => Some((
            addr.pg,
            offset,
            length,
            ClientOp::Discard {
                object: object(&addr),
                offset,
                length,
            },
        )),
        Request::WriteZeroes {
            addr,
            offset,
            length,
            ..
        } => {
            let op = ClientOp::WriteZeroes {
                object: object(&addr),
                offset,
                length,
            };
            Some((addr.pg, offset, length, op))
        }
        _ => None,
    }
}

impl Shard {
    pub fn handle_input(&mut self, input: Input, outs: &mut BTreeMap<PgId, Output>) {
        match input {
            Input::Request {
                conn,
                request_id,
                req,
                arrived,
            } => self.handle_request(conn, request_id, req, arrived, outs),
            Input::BadRequest {
                conn,
                request_id,
                reason,
            } => {
                let status = if reason.contains("kind") {
                    Status::UnknownOp
                } else {
                    Status::InvalidArgument
                };
                self.reply(conn, request_id, &Reply::error(status, None, reason));
            }
            Input::Closed { conn, reason } => {
                tracing::debug!(conn, "connection closed: {reason}");
                if let Some(o) = self.conns.remove(&conn) {
                    o.borrow_mut().closed = true;
                    o.borrow().wake_writer.notify_one();
                }
                self.conn_inflight.remove(&conn);
            }
        }
    }

    fn refuse(&mut self, conn: ConnId, request_id: u64, status: Status, message: String) {
        self.reply(conn, request_id, &Reply::error(status, None, message));
    }

    fn handle_request(
        &mut self,
        conn: ConnId,
        request_id: u64,
        req: Request,
        arrived: Instant,
        outs: &mut BTreeMap<PgId, Output>,
    ) {
        if let Some(reason) = self.failed.clone() {
            if !req.kind().is_osd_to_osd() {
                self.refuse(
                    conn,
                    request_id,
                    Status::IoError,
                    format!("osd shard failed: {reason}"),
                );
            }
            return;
        }
        match req {
            req @ (Request::Write { .. }
            | Request::Discard { .. }
            | Request::WriteZeroes { .. }) => {
                let (pg, offset, length, op) = mutation(req).expect("matched a mutation");
                let at = (arrived, Instant::now());
                self.propose(conn, request_id, pg, offset, length, op, at, outs);
            }
            Request::Read {
                addr,
                offset,
                length,
                ..
            } => {
                let at = (arrived, Instant::now());
                let kind = OpKind::Read {
                    addr,
                    offset,
                    length,
                };
                self.read(conn, request_id, kind, at, outs)
            }
            Request::GetLeader { pg, .. } => {
                let reply = match self.pgs.get(&pg) {
                    None => Reply::error(
                        Status::NoSuchPg,
                        None,
                        format!("pg {pg} is not hosted here"),
                    ),
                    Some(h) => {
                        let hint = self.leader_hint(pg, h.replica.leader());
                        Reply::Leader(hint.unwrap_or(LeaderHint {
                            osd: fastblock_types::OsdId(0),
                            address: String::new(),
                            port: 0,
                        }))
                    }
                };
                self.reply(conn, request_id, &reply);
            }
            Request::ReplicaRead {
                addr,
                offset,
                length,
            } => {
                let reply = match (self.pgs.contains_key(&addr.pg), range_ok(offset, length)) {
                    (false, _) => Reply::error(
                        Status::NoSuchPg,
                        None,
                        format!("pg {} is not hosted here", addr.pg),
                    ),
                    (true, Err(m)) => Reply::error(Status::InvalidArgument, None, m),
                    (true, Ok(())) => match self.read_object(addr, offset, length) {
                        Ok(data) => Reply::Data(data),
                        Err(r) => r,
                    },
                };
                self.reply(conn, request_id, &reply);
            }
            Request::ReplicaDigest { pg } => {
                let reply = self.digest(pg);
                self.reply(conn, request_id, &reply);
            }
            Request::Allocation {
                addr,
                offset,
                length,
                ..
            } => {
                let at = (arrived, Instant::now());
                let kind = OpKind::Allocation {
                    addr,
                    offset,
                    length,
                };
                self.read(conn, request_id, kind, at, outs)
            }
            Request::ShardSpace => {
                let store = self.store.borrow();
                let reply = Reply::Space {
                    free_bytes: store.free_data_bytes(),
                    pending_free_bytes: store.pending_free_bytes(),
                };
                drop(store);
                self.reply(conn, request_id, &reply);
            }
            Request::Hello { .. } => {}
            Request::RaftBatch { from, to, msgs } => {
                if to != self.spec.osd {
                    tracing::warn!(%from, %to, "raft batch for another osd; dropped");
                    return;
                }
                self.spec
                    .stages
                    .since(Stage::RaftQueue, arrived, Instant::now());
                for env in msgs {
                    if !self.pgs.contains_key(&env.pg) {
                        continue;
                    }
                    match raft::eraftpb::Message::parse_from_carllerche_bytes(&env.msg) {
                        // Persisting a snapshot installs its objects, so one is stepped only
                        // once they are all staged here.
                        Ok(msg) if !self.snapshot_ready(env.pg, &msg) => {
                            tracing::warn!(pg = %env.pg, %from, "snapshot without staged objects; dropped")
                        }
                        Ok(msg) => {
                            if let Some(h) = self.pgs.get_mut(&env.pg) {
                                h.replica.step(msg, outs.entry(env.pg).or_default());
                            }
                        }
                        Err(e) => {
                            tracing::warn!(pg = %env.pg, %from, "undecodable raft message: {e}")
                        }
                    }
                }
            }
            Request::SnapChunk(chunk) => self.on_snap_chunk(chunk),
            Request::SnapAck {
                from,
                to,
                pg,
                transfer,
                seq,
                ok,
            } => {
                if to == self.spec.osd {
                    self.on_snap_ack(from, pg, transfer, seq, ok, outs);
                }
            }
        }
    }

    /// Admits a client operation: limits, then the PG.
    fn admit(&mut self, conn: ConnId, request_id: u64, pg: PgId, offset: u32, length: u32) -> bool {
        if let Err(m) = range_ok(offset, length) {
            self.refuse(conn, request_id, Status::InvalidArgument, m);
            return false;
        }
        if self.conn_inflight.get(&conn).copied().unwrap_or(0) >= CONN_INFLIGHT_OPS_MAX {
            self.refuse(
                conn,
                request_id,
                Status::Busy,
                "too many operations in flight on this connection".into(),
            );
            return false;
        }
        if !self.pgs.contains_key(&pg) {
            let known = self.map.pg(pg).is_some();
            let (status, m) = if known {
                (
                    Status::NotReady,
                    format!("pg {pg} is not ready on this osd"),
                )
            } else {
                (Status::NoSuchPg, format!("pg {pg} is not hosted here"))
            };
            self.refuse(conn, request_id, status, m);
            return false;
        }
        true
    }

    #[allow(clippy::too_many_arguments)]
    fn propose(
        &mut self,
        conn: ConnId,
        request_id: u64,
        pg: PgId,
        offset: u32,
        length: u32,
        op: ClientOp,
        (arrived, started): (Instant, Instant),
        outs: &mut BTreeMap<PgId, Output>,
    ) {
        if !self.admit(conn, request_id, pg, offset, length) {
            return;
        }
        let batch_bytes_max = self.store.borrow().superblock().batch_bytes_max;
        // Only a write carries its bytes in the log entry; discards carry a range.
        let is_write = matches!(op, ClientOp::Write { .. });
        if is_write && !super::wal_fit::mutation_fits(u64::from(length), batch_bytes_max) {
            let m = format!(
                "a mutation of {length} bytes does not fit one WAL batch of {batch_bytes_max}"
            );
            self.refuse(conn, request_id, Status::InvalidArgument, m);
            return;
        }
        let free = self.store.borrow().free_data_bytes();
        if is_write && free < DATA_RESERVE_BYTES + u64::from(length) {
            self.refuse(
                conn,
                request_id,
                Status::NoSpace,
                format!("osd {} is full ({free} bytes free)", self.spec.osd),
            );
            return;
        }
        // Uncommitted writes stay below a share of the WAL: a leader cut off from its
        // followers cannot commit (so cannot compact) what it logs, and filling the WAL would
        // stop the shard (see `wal_fit::uncommitted_bytes_max`). `Busy` is retryable: the
        // client backs off until writes commit or a new leader takes over.
        let log_bytes = if is_write { u64::from(length) } else { 0 };
        let budget = {
            let store = self.store.borrow();
            let sb = store.superblock();
            super::wal_fit::uncommitted_bytes_max(sb.segment_size_bytes, sb.segment_count)
        };
        if self.pending_mutation_bytes + log_bytes > budget {
            let m = format!(
                "{} bytes of writes not yet committed on this shard (limit {budget})",
                self.pending_mutation_bytes
            );
            self.refuse(conn, request_id, Status::Busy, m);
            return;
        }
        self.pending_mutation_bytes += log_bytes;
        let id = self.new_op(PendingOp {
            conn,
            request_id,
            pg,
            kind: OpKind::Mutation {
                bytes: u64::from(length),
                log_bytes,
            },
            arrived,
            started,
        });
        self.spec.stages.since(Stage::Queue, arrived, started);
        let hosted = self.pgs.get_mut(&pg).expect("admitted");
        hosted.replica.propose(id, &op, outs.entry(pg).or_default());
    }

    /// Admits a read or a block-status query (`kind`); either is answered once the PG's read
    /// barrier passes, so it sees every write acknowledged before it was sent.
    fn read(
        &mut self,
        conn: ConnId,
        request_id: u64,
        kind: OpKind,
        (arrived, started): (Instant, Instant),
        outs: &mut BTreeMap<PgId, Output>,
    ) {
        let (OpKind::Read {
            addr,
            offset,
            length,
        }
        | OpKind::Allocation {
            addr,
            offset,
            length,
        }) = kind
        else {
            unreachable!("read admits only reads and block-status queries");
        };
        if !self.admit(conn, request_id, addr.pg, offset, length) {
            return;
        }
        let id = self.new_op(PendingOp {
            conn,
            request_id,
            pg: addr.pg,
            kind,
            arrived,
            started,
        });
        self.spec.stages.since(Stage::Queue, arrived, started);
        let hosted = self.pgs.get_mut(&addr.pg).expect("admitted");
        hosted
            .replica
            .read(id, self.now_ms, outs.entry(addr.pg).or_default());
    }

    /// The data-holding ranges of an object's range on this (leader) replica.
    pub fn allocation_reply(&mut self, addr: ObjectAddr, offset: u32, length: u32) -> Reply {
        let object = fastblock_store::ObjectId {
            image: addr.image,
            index: addr.object_index,
        };
        let result = self.store.borrow_mut().allocated_ranges(
            addr.pg,
            object,
            u64::from(offset),
            u64::from(length),
        );
        match result {
            // The ranges lie inside offset..offset + length, which `admit` bounded by u32
            // offsets and REQUEST_BYTES_MAX, so they fit their u32 fields.
            Ok(ranges) => Reply::Allocated(
                ranges
                    .into_iter()
                    .map(|(start, len)| AllocatedRange {
                        offset: start as u32,
                        length: len as u32,
                    })
                    .collect(),
            ),
            Err(e) => {
                if e.is_fatal() {
                    self.fail(format!("allocation query: {e}"));
                }
                let status = if e.is_fatal() {
                    Status::IoError
                } else {
                    Status::InvalidArgument
                };
                Reply::error(status, None, format!("pg {}: allocation: {e}", addr.pg))
            }
        }
    }

    /// This replica's applied index and a crc32c of the first `DIGEST_WINDOW_BYTES` of each
    /// object, for comparing replicas in tests and repairs.
    fn digest(&mut self, pg: PgId) -> Reply {
        let Some(hosted) = self.pgs.get(&pg) else {
            return Reply::error(
                Status::NoSuchPg,
                None,
                format!("pg {pg} is not hosted here"),
            );
        };
        let applied_index = hosted.replica.applied().0;
        let objects = match self.store.borrow_mut().list_objects(pg) {
            Ok(o) => o,
            Err(e) => return Reply::error(Status::IoError, None, format!("listing pg {pg}: {e}")),
        };
        let mut digests = Vec::with_capacity(objects.len());
        for object in objects {
            let addr = ObjectAddr {
                pg,
                image: object.image,
                object_index: object.index,
            };
            match self.read_object(addr, 0, DIGEST_WINDOW_BYTES) {
                Ok(data) => digests.push(ObjectDigest {
                    image: object.image,
                    object_index: object.index,
                    crc32c: crc32c::crc32c(&data),
                    len_bytes: u64::from(DIGEST_WINDOW_BYTES),
                }),
                Err(reply) => return reply,
            }
        }
        Reply::Digest {
            applied_index,
            objects: digests,
        }
    }
}

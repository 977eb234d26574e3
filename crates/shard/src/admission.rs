//! Client and peer requests arriving at a shard: checks, then the PG.
//!
//! A client request is refused before it reaches its PG when it is malformed, its
//! connection has too many operations in flight, the PG is not here, its map epoch says
//! one side is behind (`StaleEpoch`), the disk is nearly full (`NoSpace`), or the writes this
//! shard or this PG proposed and has not answered take their share of the WAL (`Busy`:
//! retryable, see [`crate::wal_fit`]).

use crate::core::{OpKind, PendingOp, ShardCore, CONN_INFLIGHT_OPS_MAX};
use crate::io::{ConnId, Effects, Micros};
use crate::reclaim::FenceQuery;
use crate::stage::Stage;
use fastblock_pg::{ClientOp, ObjectRef};
use fastblock_store::Disk;
use fastblock_types::{Epoch, ImageId, PgId};
use fastblock_wire::{
    AllocatedRange, LeaderHint, ObjectAddr, ObjectDigest, Reply, Request, Status, WireError,
};
use protobuf::Message as _;

/// Largest single read or mutation: clients split IO at object boundaries, and objects are at
/// most 64 MiB; one request is further bounded to keep frames small.
pub const REQUEST_BYTES_MAX: u32 = 8 << 20;
/// Offsets within an object stay below the largest object size.
pub const OBJECT_BYTES_MAX: u64 = 64 << 20;
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

/// A client mutation as the log operation it becomes.
struct Mutation {
    addr: ObjectAddr,
    offset: u32,
    length: u32,
    epoch: Epoch,
    /// The leader's term the client addressed (0: unknown); see [`ShardCore::stale_term`].
    term: u64,
    op: ClientOp,
}

/// A discard or zeroing: a range and no data.
fn range_op(
    addr: ObjectAddr,
    (offset, length): (u32, u32),
    (epoch, term): (Epoch, u64),
    op: impl FnOnce(ObjectRef) -> ClientOp,
) -> Mutation {
    Mutation {
        addr,
        offset,
        length,
        epoch,
        term,
        op: op(ObjectRef {
            image: addr.image,
            index: addr.object_index,
        }),
    }
}

/// A mutating request as its log operation; any other request back as it was.
fn mutation(req: Request) -> Result<Mutation, Request> {
    let object = |a: &ObjectAddr| ObjectRef {
        image: a.image,
        index: a.object_index,
    };
    match req {
        Request::Write {
            addr,
            offset,
            epoch,
            term,
            data,
        } => Ok(Mutation {
            addr,
            offset,
            length: u32::try_from(data.len()).unwrap_or(u32::MAX),
            epoch,
            term,
            op: ClientOp::Write {
                object: object(&addr),
                offset,
                data,
            },
        }),
        Request::Discard {
            addr,
            offset,
            length,
            epoch,
            term,
        } => Ok(range_op(addr, (offset, length), (epoch, term), |object| {
            ClientOp::Discard {
                object,
                offset,
                length,
            }
        })),
        Request::WriteZeroes {
            addr,
            offset,
            length,
            epoch,
            term,
        } => Ok(range_op(addr, (offset, length), (epoch, term), |object| {
            ClientOp::WriteZeroes {
                object,
                offset,
                length,
            }
        })),
        Request::CopyUp {
            addr,
            offset,
            epoch,
            term,
            data,
        } => Ok(Mutation {
            addr,
            offset,
            length: u32::try_from(data.len()).unwrap_or(u32::MAX),
            epoch,
            term,
            // Placed by the leader once admitted (`ShardCore::place_copy_up`).
            op: ClientOp::CopyUp {
                object: object(&addr),
                offset,
                data,
                runs: Vec::new(),
            },
        }),
        Request::CopyUpDone { addr, epoch, term } => Ok(Mutation {
            addr,
            offset: 0,
            length: 0,
            epoch,
            term,
            op: ClientOp::CopyUpDone {
                object: object(&addr),
            },
        }),
        Request::Rollback {
            addr,
            epoch,
            term,
            snap,
        } => Ok(Mutation {
            addr,
            offset: 0,
            length: 0,
            epoch,
            term,
            op: ClientOp::Rollback {
                object: object(&addr),
                snap,
            },
        }),
        other => Err(other),
    }
}

/// Where a snapshot read of an object finds its bytes ([`ShardCore::snap_reads_parent`]).
enum SnapSource {
    /// In this replica's store (the image is not a clone, or the object lies beyond the
    /// snapshot's overlap).
    Clone,
    /// In the parent within `overlap_bytes`, unless the clone copied the object up.
    ParentUnlessCopied { overlap_bytes: u64 },
    /// The snapshot was removed (its trim is pending).
    Removed,
    /// This map does not show the image or the snapshot yet: it cannot tell.
    MapBehind(String),
}

impl<D: Disk + 'static> ShardCore<D> {
    pub(crate) fn on_bad_request(
        &mut self,
        conn: ConnId,
        request_id: u64,
        error: WireError,
        eff: &mut Effects,
    ) {
        let status = match error {
            WireError::UnknownKind(_) => Status::UnknownOp,
            _ => Status::InvalidArgument,
        };
        eff.replies.push((
            conn,
            request_id,
            Reply::error(status, None, error.to_string()),
        ));
    }

    pub(crate) fn refuse(
        &mut self,
        conn: ConnId,
        request_id: u64,
        status: Status,
        message: String,
        eff: &mut Effects,
    ) {
        eff.replies
            .push((conn, request_id, Reply::error(status, None, message)));
    }

    pub(crate) fn on_request(
        &mut self,
        conn: ConnId,
        request_id: u64,
        req: Request,
        arrived: Micros,
        eff: &mut Effects,
    ) {
        if let Some(failure) = &self.failed {
            if !req.kind().is_osd_to_osd() {
                // Retryable: the client asks the PG's other replicas, which take over
                // once this OSD has stopped (see `error_reply`).
                let m = format!("osd shard failed: {failure}; this OSD is stopping");
                self.refuse(conn, request_id, Status::NotReady, m, eff);
            }
            return;
        }
        let Some(req) = self.hold_until_own_term(conn, request_id, req, arrived, eff) else {
            return;
        };
        if let Request::Rollback { addr, snap, .. } = &req {
            if let Some(m) = self.snap_missing(addr, *snap) {
                return self.refuse(conn, request_id, Status::NoSuchSnap, m, eff);
            }
        }
        let req = match mutation(req) {
            Ok(m) => return self.propose(conn, request_id, m, arrived, eff),
            Err(req) => req,
        };
        match req {
            Request::Write { .. }
            | Request::Discard { .. }
            | Request::WriteZeroes { .. }
            | Request::Rollback { .. }
            | Request::CopyUp { .. }
            | Request::CopyUpDone { .. } => {
                unreachable!("mutations were taken above")
            }
            Request::CloneRead {
                addr,
                offset,
                length,
                epoch,
            } => {
                let kind = OpKind::CloneRead {
                    addr,
                    offset,
                    length,
                };
                self.read(conn, request_id, kind, epoch, arrived, eff)
            }
            Request::SnapRead {
                addr,
                offset,
                length,
                epoch,
                snap,
            } => {
                let kind = OpKind::SnapRead {
                    addr,
                    offset,
                    length,
                    snap,
                };
                self.read(conn, request_id, kind, epoch, arrived, eff)
            }
            Request::Read {
                addr,
                offset,
                length,
                epoch,
            } => {
                let kind = OpKind::Read {
                    addr,
                    offset,
                    length,
                };
                self.read(conn, request_id, kind, epoch, arrived, eff)
            }
            Request::Allocation {
                addr,
                offset,
                length,
                epoch,
            } => {
                let kind = OpKind::Allocation {
                    addr,
                    offset,
                    length,
                };
                self.read(conn, request_id, kind, epoch, arrived, eff)
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
                            term: 0,
                        }))
                    }
                };
                eff.replies.push((conn, request_id, reply));
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
                    (true, Ok(())) => match self.read_for_client(addr, offset, length, eff) {
                        Ok(data) => Reply::Data(data),
                        Err(r) => r,
                    },
                };
                eff.replies.push((conn, request_id, reply));
            }
            Request::ReplicaDigest { pg } => {
                let reply = self.digest(pg, eff);
                eff.replies.push((conn, request_id, reply));
            }
            Request::Usage { pg, image } => {
                let reply = self.usage(pg, image);
                eff.replies.push((conn, request_id, reply));
            }
            Request::ShardSpace => {
                let store = self.store.borrow();
                let reply = Reply::Space {
                    free_bytes: store.free_data_bytes(),
                    pending_free_bytes: store.pending_free_bytes(),
                };
                drop(store);
                eff.replies.push((conn, request_id, reply));
            }
            // Peers announce themselves; the link needs no answer.
            Request::Hello { .. } => {}
            Request::RaftBatch { from, to, msgs } => {
                if to != self.cfg.osd {
                    tracing::warn!(%from, %to, "raft batch for another osd; dropped");
                    return;
                }
                eff.stage(Stage::RaftQueue, arrived, self.now);
                let mut room_bytes = self.append_room_bytes();
                for env in msgs {
                    if !self.pgs.contains_key(&env.pg) {
                        continue;
                    }
                    let parsed = raft::eraftpb::Message::parse_from_carllerche_bytes(&env.msg);
                    match parsed.map(|m| self.trim_append(env.pg, m, &mut room_bytes, eff)) {
                        // Persisting a snapshot installs its objects, so one is stepped only
                        // once they are all staged here.
                        Ok(msg) if !self.snapshot_ready(env.pg, &msg) => {
                            eff.probes.snapshots_unstaged += 1;
                            tracing::warn!(pg = %env.pg, %from, "snapshot without staged objects; dropped")
                        }
                        Ok(msg) if msg.to != u64::from(self.cfg.osd.0) => {
                            tracing::warn!(pg = %env.pg, %from, to = msg.to, "raft message for another osd; dropped")
                        }
                        Ok(msg) => {
                            if let Some(h) = self.pgs.get_mut(&env.pg) {
                                h.replica.step(msg, self.outs.entry(env.pg).or_default());
                            }
                        }
                        Err(e) => {
                            tracing::warn!(pg = %env.pg, %from, "undecodable raft message: {e}")
                        }
                    }
                }
            }
            Request::SnapChunk(chunk) => self.on_snap_chunk(chunk, eff),
            Request::Repair(m) => self.on_repair_msg(m, eff),
            Request::Scrub(m) => self.on_scrub_msg(m, eff),
            Request::SnapAck {
                from,
                to,
                pg,
                transfer,
                seq,
                verdict,
            } => {
                if to == self.cfg.osd {
                    self.on_snap_ack(from, pg, transfer, seq, verdict, eff);
                }
            }
        }
    }

    /// How far the live snapshots of `image` reach (their largest size): a copy-up may write
    /// that far for them, beyond a shrunk clone's size.
    fn snapshots_reach_bytes(&self, image: ImageId) -> u64 {
        self.map
            .snaps
            .get(&image)
            .map_or(0, |l| l.iter().map(|s| s.size_bytes).max().unwrap_or(0))
    }

    /// Decides where the parts of a copy-up piece go, from this leader's map, and writes it
    /// into the operation (`fastblock_types::clone_data`): the log carries the decision, so
    /// every replica applies the same. Snapshots of the image being taken are no concern: a
    /// copy-up waits while one is (`snap_freeze`), so the map shows every snapshot logged
    /// before this piece.
    fn place_copy_up(&self, m: &mut Mutation) -> Result<(), String> {
        let image = m.addr.image;
        let extent = self
            .map
            .images
            .as_ref()
            .and_then(|t| t.images.get(&image))
            .copied()
            .ok_or_else(|| format!("image {image} is not in this osd's map"))?;
        let Some(head_overlap_bytes) = extent.parent_overlap_bytes else {
            return Err(format!("image {image} is not a clone: nothing to copy up"));
        };
        let ClientOp::CopyUp {
            offset, data, runs, ..
        } = &mut m.op
        else {
            unreachable!("called for copy-ups");
        };
        let block = fastblock_types::units::BLOCK_SIZE_BYTES;
        let len = data.len() as u64;
        if u64::from(*offset) % block != 0 || len % block != 0 {
            return Err(format!(
                "a copy-up piece must be whole 4 KiB blocks: {offset}+{len}"
            ));
        }
        let start = m.addr.object_index * extent.object_size_bytes + u64::from(*offset);
        let snaps: Vec<(fastblock_types::SnapId, u64)> = self
            .map
            .snaps
            .get(&image)
            .into_iter()
            .flatten()
            .map(|s| (s.id, s.parent_overlap_bytes.unwrap_or(0)))
            .collect();
        let object_start = m.addr.object_index * extent.object_size_bytes;
        *runs = fastblock_types::clone_data::copy_up_runs(
            start,
            start + len,
            head_overlap_bytes,
            &snaps,
        )
        .into_iter()
        .map(|(end, target)| ((end - object_start) as u32, target.to_u64()))
        .collect();
        Ok(())
    }

    /// What `pg` holds of `image` (0: every image), as this replica applied it; only the
    /// PG's leader answers, so that every client sees the same replica's count.
    fn usage(&self, pg: PgId, image: ImageId) -> Reply {
        let Some(h) = self.pgs.get(&pg) else {
            return Reply::error(
                Status::NoSuchPg,
                None,
                format!("pg {pg} is not hosted here"),
            );
        };
        if !h.replica.is_leader() {
            let hint = self.leader_hint(pg, h.replica.leader());
            return Reply::error(
                Status::NotLeader,
                hint,
                format!("this osd does not lead pg {pg}"),
            );
        }
        let store = self.store.borrow();
        let usage = if image.get() == 0 {
            store.pg_usage(pg)
        } else {
            store.image_usage(pg, image)
        };
        drop(store);
        let snaps: Vec<(u64, u64)> = if image.get() == 0 {
            Vec::new()
        } else {
            usage
                .kept_blocks_by_snap
                .iter()
                .map(|(s, n)| (*s, *n))
                .take(fastblock_wire::USAGE_SNAPS_MAX as usize)
                .collect()
        };
        Reply::Usage {
            objects: usage.objects,
            head_blocks: usage.head_blocks,
            kept_blocks: usage.kept_blocks(),
            snaps,
        }
    }

    /// Keeps the entries of an append that fit `room_bytes` (see
    /// [`ShardCore::append_room_bytes`]) and takes their bytes from it. The append stays, with
    /// fewer or no entries: a shorter append is one the leader could have sent, and its commit
    /// index still lets this replica apply (and so compact) what it has.
    fn trim_append(
        &self,
        pg: PgId,
        mut msg: raft::eraftpb::Message,
        room_bytes: &mut u64,
        eff: &mut Effects,
    ) -> raft::eraftpb::Message {
        if msg.get_msg_type() != raft::eraftpb::MessageType::MsgAppend || msg.entries.is_empty() {
            return msg;
        }
        let (keep, bytes) = crate::wal_fit::prefix_that_fits(&msg.entries, *room_bytes);
        *room_bytes -= bytes;
        if keep < msg.entries.len() {
            eff.probes.appends_trimmed += 1;
            tracing::debug!(%pg, kept = keep, sent = msg.entries.len(), "append trimmed to the WAL's room");
            msg.entries.truncate(keep);
        }
        msg
    }

    /// Whether a leader refused a mutation because it names another term than the leader's
    /// current one (0, unknown, included): the client addressed an earlier leadership (its
    /// request may have waited in a socket buffer across a leadership change and back), or
    /// never learned the term. The answer is `NotLeader` with a hint naming this OSD and its
    /// term, which the client follows at once (`fastblock_client::policy`). A follower lets
    /// the mutation through: proposing it answers `NotLeader` naming the leader it knows.
    fn stale_term(
        &mut self,
        conn: ConnId,
        request_id: u64,
        pg: PgId,
        term: u64,
        eff: &mut Effects,
    ) -> bool {
        let Some(h) = self.pgs.get(&pg) else {
            return false;
        };
        let current = h.replica.term().0;
        if !h.replica.is_leader() || term == current {
            return false;
        }
        eff.probes.stale_term += 1;
        let hint = self.leader_hint(pg, Some(self.cfg.osd));
        let m = format!("pg {pg}: the request names term {term}, this leader's term is {current}");
        eff.replies
            .push((conn, request_id, Reply::error(Status::NotLeader, hint, m)));
        true
    }

    /// Checks shared by every client operation: range, connection limit, the PG, epochs.
    fn admit(
        &mut self,
        conn: ConnId,
        request_id: u64,
        pg: PgId,
        (offset, length): (u32, u32),
        epoch: Epoch,
        eff: &mut Effects,
    ) -> bool {
        if let Err(m) = range_ok(offset, length) {
            self.refuse(conn, request_id, Status::InvalidArgument, m, eff);
            return false;
        }
        if self.conn_inflight.get(&conn).copied().unwrap_or(0) >= CONN_INFLIGHT_OPS_MAX {
            let m = "too many operations in flight on this connection".to_string();
            self.refuse(conn, request_id, Status::Busy, m, eff);
            return false;
        }
        if !self.pgs.contains_key(&pg) {
            // The epochs say who is behind: an OSD whose map is older than the client's has
            // not yet heard that it hosts the PG (the client retries after a back-off while
            // this OSD's control task fetches the map); a PG no map of ours has is simply not
            // here; a client whose map is older than ours was sent here by a placement that
            // has changed (it must refresh its map).
            let (status, m) = if epoch > self.map.epoch {
                (
                    Status::StaleEpoch,
                    format!(
                        "this osd's map (epoch {}) is older than the request's (epoch {}); retry",
                        self.map.epoch.0, epoch.0
                    ),
                )
            } else if self.map.pg(pg).is_none() {
                (Status::NoSuchPg, format!("pg {pg} is not hosted here"))
            } else if epoch < self.map.epoch {
                (
                    Status::StaleEpoch,
                    format!(
                        "pg {pg} is not hosted here at epoch {}; the request's map is epoch {}",
                        self.map.epoch.0, epoch.0
                    ),
                )
            } else {
                (
                    Status::NotReady,
                    format!("pg {pg} is not ready on this osd"),
                )
            };
            if status == Status::StaleEpoch {
                eff.probes.stale_epoch += 1;
            }
            self.refuse(conn, request_id, status, m, eff);
            return false;
        }
        true
    }

    /// The most data-region space `m` takes when applied, from admission until it is
    /// answered (see [`crate::space`]): every block a write or copy-up piece touches (each is
    /// written anew), the whole object for a rollback (it may copy every block back from the
    /// snapshot), the partial end blocks of a discard or write-zeroes; nothing for the rest.
    fn mutation_space_bytes(&self, m: &Mutation) -> u64 {
        use fastblock_store::objects::{write_allocates_bytes, zero_allocates_bytes};
        let (offset, length) = (u64::from(m.offset), u64::from(m.length));
        match &m.op {
            ClientOp::Write { .. } | ClientOp::CopyUp { .. } => {
                write_allocates_bytes(offset, length)
            }
            ClientOp::Discard { .. } | ClientOp::WriteZeroes { .. } => {
                zero_allocates_bytes(offset, length)
            }
            ClientOp::Rollback { object, .. } => self
                .map
                .images
                .as_ref()
                .and_then(|t| t.images.get(&object.image))
                .map_or(fastblock_store::objects::OBJECT_SIZE_MAX_BYTES, |e| {
                    e.object_size_bytes
                }),
            _ => 0,
        }
    }

    fn propose(
        &mut self,
        conn: ConnId,
        request_id: u64,
        m: Mutation,
        arrived: Micros,
        eff: &mut Effects,
    ) {
        let pg = m.addr.pg;
        if let Some((status, msg)) = self.snap_freeze(pg, m.addr.image) {
            if self.pgs.get(&pg).is_some_and(|h| h.replica.is_leader()) {
                eff.probes.fenced += 1;
                self.refuse(conn, request_id, status, msg, eff);
                return;
            }
        }
        let is_copy_up = matches!(m.op, ClientOp::CopyUp { .. } | ClientOp::CopyUpDone { .. });
        if !self.admit(conn, request_id, pg, (m.offset, m.length), m.epoch, eff)
            || self.stale_term(conn, request_id, pg, m.term, eff)
            || !self.fence(
                conn,
                request_id,
                FenceQuery {
                    addr: m.addr,
                    offset: m.offset,
                    length: m.length,
                    epoch: m.epoch,
                    reach_bytes: if is_copy_up {
                        self.snapshots_reach_bytes(m.addr.image)
                    } else {
                        0
                    },
                },
                eff,
            )
        {
            return;
        }
        let mut m = m;
        if let ClientOp::CopyUp { .. } = m.op {
            if let Err(msg) = self.place_copy_up(&mut m) {
                self.refuse(conn, request_id, Status::InvalidArgument, msg, eff);
                return;
            }
        }
        let (batch_bytes_max, segment_size_bytes, segment_count) = {
            let store = self.store.borrow();
            let sb = store.superblock();
            (sb.batch_bytes_max, sb.segment_size_bytes, sb.segment_count)
        };
        // Only a write (or a copy-up piece) carries its bytes in the log entry; discards carry
        // a range.
        let is_write = matches!(m.op, ClientOp::Write { .. } | ClientOp::CopyUp { .. });
        let length = m.length;
        // Writes, copy-ups and rollbacks need room on every member; discards and deletes give
        // it back, so they go on.
        let needs_room = is_write || matches!(m.op, ClientOp::Rollback { .. });
        if let Some(msg) = needs_room.then(|| self.full_osd_refusal(pg)).flatten() {
            self.refuse(conn, request_id, Status::NoSpace, msg, eff);
            return;
        }
        if is_write && !crate::wal_fit::mutation_fits(u64::from(length), batch_bytes_max) {
            let msg = format!(
                "a mutation of {length} bytes does not fit one WAL batch of {batch_bytes_max}"
            );
            self.refuse(conn, request_id, Status::InvalidArgument, msg, eff);
            return;
        }
        // The space applying it may take: counted in flight from here until it is answered,
        // so that a burst admitted against the same free count still fits (see `space`).
        let space_bytes = self.mutation_space_bytes(&m);
        let space_refusal = match m.op {
            ClientOp::Discard { .. } | ClientOp::WriteZeroes { .. } => {
                self.zeroing_refusal(space_bytes)
            }
            _ if needs_room => self.space_refusal(space_bytes),
            _ => None,
        };
        if let Some(msg) = space_refusal {
            self.refuse(conn, request_id, Status::NoSpace, msg, eff);
            return;
        }
        // Uncommitted writes stay below a share of the WAL, for the shard and for each PG: a
        // leader cut off from its followers cannot commit (so cannot compact) what it logs,
        // and filling the WAL would stop the shard (see `wal_fit`). `Busy` is retryable: the
        // client backs off until writes commit or a new leader takes over.
        let log_bytes = if is_write { u64::from(length) } else { 0 };
        let budget = crate::wal_fit::uncommitted_bytes_max(segment_size_bytes, segment_count);
        if self.pending_mutation_bytes + log_bytes > budget {
            let msg = format!(
                "{} bytes of writes not yet committed on this shard (limit {budget})",
                self.pending_mutation_bytes
            );
            self.refuse(conn, request_id, Status::Busy, msg, eff);
            return;
        }
        let pg_pending = self.pg_pending_bytes.get(&pg).copied().unwrap_or(0);
        let pg_budget = crate::wal_fit::pg_uncommitted_bytes_max(segment_size_bytes, segment_count);
        if pg_pending + log_bytes > pg_budget {
            eff.probes.pg_log_full += 1;
            let msg = format!(
                "pg {pg}: {pg_pending} bytes of writes not yet committed (limit {pg_budget})"
            );
            self.refuse(conn, request_id, Status::Busy, msg, eff);
            return;
        }
        self.pending_mutation_bytes += log_bytes;
        self.pending_space_bytes += space_bytes;
        *self.pg_pending_bytes.entry(pg).or_default() += log_bytes;
        let id = self.new_op(PendingOp {
            conn,
            request_id,
            pg,
            kind: OpKind::Mutation {
                bytes: u64::from(length),
                log_bytes,
                space_bytes,
            },
            arrived,
            started: self.now,
            log_index: 0,
        });
        eff.stage(Stage::Queue, arrived, self.now);
        let hosted = self.pgs.get_mut(&pg).expect("admitted");
        hosted
            .replica
            .propose(id, &m.op, self.outs.entry(pg).or_default());
    }

    /// Admits a read or a block-status query (`kind`); either is answered once the PG's read
    /// barrier passes, so it sees every write acknowledged before it was sent.
    fn read(
        &mut self,
        conn: ConnId,
        request_id: u64,
        kind: OpKind,
        epoch: Epoch,
        arrived: Micros,
        eff: &mut Effects,
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
        }
        | OpKind::SnapRead {
            addr,
            offset,
            length,
            ..
        }
        | OpKind::CloneRead {
            addr,
            offset,
            length,
        }) = kind
        else {
            unreachable!("read admits only reads and block-status queries");
        };
        // A snapshot keeps its own size, which a later shrink of the image does not change:
        // the head's size does not fence its reads (beyond the snapshot's data they read
        // zeros; the client bounds them by the snapshot's size).
        let fenced = !matches!(kind, OpKind::SnapRead { .. });
        if !self.admit(conn, request_id, addr.pg, (offset, length), epoch, eff)
            || fenced
                && !self.fence(
                    conn,
                    request_id,
                    FenceQuery {
                        addr,
                        offset,
                        length,
                        epoch,
                        reach_bytes: 0,
                    },
                    eff,
                )
        {
            return;
        }
        let id = self.new_op(PendingOp {
            conn,
            request_id,
            pg: addr.pg,
            kind,
            arrived,
            started: self.now,
            log_index: 0,
        });
        eff.stage(Stage::Queue, arrived, self.now);
        let now_ms = self.now.as_millis();
        let hosted = self.pgs.get_mut(&addr.pg).expect("admitted");
        hosted
            .replica
            .read(id, now_ms, self.outs.entry(addr.pg).or_default());
    }

    /// Why a rollback or snapshot read of `addr` to `snap` cannot be served by this replica
    /// if it leads the PG and holds no such snapshot (`None`: go on; a replica that does not
    /// lead answers as for any request).
    fn snap_missing(&self, addr: &ObjectAddr, snap: u64) -> Option<String> {
        let leads = self
            .pgs
            .get(&addr.pg)
            .is_some_and(|h| h.replica.is_leader());
        let live = self
            .store
            .borrow()
            .image_snaps(addr.pg, addr.image)
            .live
            .contains(&snap);
        (leads && !live).then(|| {
            format!(
                "pg {} holds no snapshot {snap} of image {}",
                addr.pg, addr.image
            )
        })
    }

    /// Whether snapshot `snap` of image `addr.image` reads object `addr` from the parent
    /// where the clone has not copied it up, by this map (`design/snapshots.md`, "Snapshots
    /// of clones"). A flattened clone copied up every object within every overlap first, so
    /// a map that still shows the parent changes no answer; a map that does not show the
    /// image or the snapshot yet cannot answer at all.
    fn snap_reads_parent(&self, addr: ObjectAddr, snap: u64) -> SnapSource {
        let Some(table) = &self.map.images else {
            return SnapSource::Clone;
        };
        let extent = match table.check(addr.image, 0, 0, 0) {
            fastblock_types::map::ImageFence::Unknown => {
                return SnapSource::MapBehind(format!("image {} is newer than", addr.image))
            }
            _ => table.images.get(&addr.image),
        };
        let Some(extent) = extent.filter(|e| e.parent_overlap_bytes.is_some()) else {
            // Not a clone (or removed: its snapshots were removed first).
            return SnapSource::Clone;
        };
        let listed = self
            .map
            .snaps
            .get(&addr.image)
            .and_then(|l| l.iter().find(|s| s.id.0 == snap));
        let Some(info) = listed else {
            let trimmed = self
                .map
                .snap_trims
                .values()
                .any(|t| t.image == addr.image && t.snap.0 == snap);
            return if trimmed {
                SnapSource::Removed
            } else {
                SnapSource::MapBehind(format!(
                    "snapshot {snap} of clone {} is newer than",
                    addr.image
                ))
            };
        };
        let Some(overlap_bytes) = info.parent_overlap_bytes else {
            return SnapSource::Clone;
        };
        let start = addr.object_index.saturating_mul(extent.object_size_bytes);
        if start < overlap_bytes {
            SnapSource::ParentUnlessCopied { overlap_bytes }
        } else {
            SnapSource::Clone
        }
    }

    /// Reads `addr` as image snapshot `snap` holds it, on this (leader) replica, once the
    /// read barrier passed.
    pub(crate) fn snap_read_reply(
        &mut self,
        addr: ObjectAddr,
        (offset, length): (u32, u32),
        snap: u64,
        eff: &mut Effects,
    ) -> Reply {
        let object = fastblock_store::ObjectId {
            image: addr.image,
            index: addr.object_index,
        };
        match self.snap_reads_parent(addr, snap) {
            SnapSource::Clone => {}
            SnapSource::ParentUnlessCopied { overlap_bytes } => {
                if !self.store.borrow().is_copied(addr.pg, object) {
                    return Reply::error(
                        Status::ObjectAbsent,
                        None,
                        format!(
                            "pg {}: object {} of clone {} was not copied up when snapshot \
                             {snap} was taken: read its parent within {overlap_bytes} bytes",
                            addr.pg, addr.object_index, addr.image
                        ),
                    );
                }
            }
            SnapSource::Removed => {
                return Reply::error(
                    Status::NoSuchSnap,
                    None,
                    format!(
                        "pg {}: snapshot {snap} of image {} was removed",
                        addr.pg, addr.image
                    ),
                )
            }
            SnapSource::MapBehind(what) => {
                return Reply::error(
                    Status::StaleEpoch,
                    None,
                    format!(
                        "pg {}: {what} this osd's map (epoch {}); retry",
                        addr.pg, self.map.epoch.0
                    ),
                )
            }
        }
        let mut buf = vec![0u8; length as usize];
        let r = self.store.borrow_mut().read_image_snap(
            addr.pg,
            object,
            snap,
            u64::from(offset),
            &mut buf,
        );
        match r {
            Ok(()) => Reply::Data(buf.into()),
            Err(e) => {
                let status = match (&e, e.bad_block()) {
                    (fastblock_store::Error::NoSuchImageSnap { .. }, _) => Status::NoSuchSnap,
                    (e, Some(_)) => self.bad_block_status(e),
                    (e, None) => crate::repair::read_error_status(e),
                };
                let reply =
                    Reply::error(status, None, format!("pg {}: snapshot read: {e}", addr.pg));
                if e.is_fatal() {
                    let f = crate::error::ShardFailure::store(
                        crate::error::Operation::Read,
                        Some(addr.pg),
                        e,
                    );
                    self.fail(f, eff);
                }
                reply
            }
        }
    }

    /// The data-holding ranges of an object's range on this (leader) replica.
    pub(crate) fn allocation_reply(
        &mut self,
        addr: ObjectAddr,
        offset: u32,
        length: u32,
        eff: &mut Effects,
    ) -> Reply {
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
                let status = crate::repair::read_error_status(&e);
                let reply = Reply::error(status, None, format!("pg {}: allocation: {e}", addr.pg));
                if e.is_fatal() {
                    let f = crate::error::ShardFailure::store(
                        crate::error::Operation::Allocation,
                        Some(addr.pg),
                        e,
                    );
                    self.fail(f, eff);
                }
                reply
            }
        }
    }

    /// This replica's applied index and a crc32c of the first `DIGEST_WINDOW_BYTES` of each
    /// object, for comparing replicas in tests and repairs.
    fn digest(&mut self, pg: PgId, eff: &mut Effects) -> Reply {
        let Some(hosted) = self.pgs.get(&pg) else {
            return Reply::error(
                Status::NoSuchPg,
                None,
                format!("pg {pg} is not hosted here"),
            );
        };
        let applied_index = hosted.replica.applied().0;
        let listed = self.store.borrow_mut().list_objects(pg);
        let objects = match listed {
            Ok(o) => o,
            Err(e) => {
                let reply = Reply::error(
                    crate::repair::read_error_status(&e),
                    None,
                    format!("listing pg {pg}: {e}"),
                );
                if e.is_fatal() {
                    let f = crate::error::ShardFailure::store(
                        crate::error::Operation::Read,
                        Some(pg),
                        e,
                    );
                    self.fail(f, eff);
                }
                return reply;
            }
        };
        let mut digests = Vec::with_capacity(objects.len());
        for object in objects {
            let addr = ObjectAddr {
                pg,
                image: object.image,
                object_index: object.index,
            };
            match self.read_for_client(addr, 0, DIGEST_WINDOW_BYTES, eff) {
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

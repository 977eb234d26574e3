//! Reclaim and fencing: deleting the data of removed images and shrunk tails, and refusing
//! IO for images that no longer exist or beyond their size.
//!
//! The monitor lists what must go in the map (`ClusterMap::reclaim`, one entry per removal or
//! shrink). The leader of every PG of the entry's pool proposes a `ClientOp::Reclaim` for it;
//! every member applies it through the log (so all replicas delete the same objects, in the
//! same order relative to the writes around it), and once the leader applied it, it reports
//! the PG done ([`Report::ReclaimDone`]). The monitor drops the entry once every PG of the
//! pool did. A report the monitor did not take is repeated after [`REPORT_RETRY_MS`]; a
//! proposal lost with a leadership change is made again by the next leader. Applying a
//! reclaim twice deletes nothing more (the monitor refuses to grow an image over a range
//! still being reclaimed, so nothing new can be there).
//!
//! Fencing (`ClusterMap::images`): a request for an image the map says was removed is
//! refused with `NoSuchImage`, a range beyond the image's size with `OutOfRange`; when the
//! request's map is newer than this OSD's (an image created or grown since), `StaleEpoch`
//! tells the client to retry once this OSD has the new map. A map without an image table
//! (most unit tests') fences nothing.
//!
//! Two windows would let a write land after the reclaim that deleted its range, where it
//! would stay for good: a new leader whose map is older than the shrink, admitting writes
//! before it applied a reclaim that an earlier leader committed, or after it applied it. So
//! a new leader holds writes until it has applied the log it inherited
//! (`hold_until_own_term`), and a replica that applied a reclaim recorded at map epoch E
//! admits no IO while its own map is older than E (`HostedPg::reclaim_epoch`; a restart
//! fetches a map at least that new).

use crate::core::{OpKind, PendingOp, ShardCore};
use crate::io::{ConnId, Effects, Micros, Report};
use fastblock_pg::ClientOp;
use fastblock_store::Disk;
use fastblock_types::map::ImageFence;
use fastblock_types::{Epoch, PgId};
use fastblock_wire::{ObjectAddr, Request, Status};
use std::collections::BTreeMap;

/// The connection id of operations the shard proposes itself (client connections count
/// from 1).
pub(crate) const INTERNAL_CONN: ConnId = 0;
/// A done report the map does not show after this long is sent again.
pub const REPORT_RETRY_MS: u64 = 5_000;

/// Where this shard is with one (PG, reclaim entry) it leads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReclaimState {
    /// Proposed; not applied yet.
    Proposed,
    /// Applied and reported at this time; waiting for the map to show it done.
    Reported { at: Micros },
}

/// The reclaims this shard's PG leaders are working on, and the writes held until a new
/// leader has applied its inherited log.
#[derive(Default)]
pub(crate) struct Reclaims {
    pub(crate) states: BTreeMap<(PgId, u64), ReclaimState>,
    pub(crate) awaiting_term: BTreeMap<PgId, Vec<Held>>,
}

impl<D: Disk + 'static> ShardCore<D> {
    /// Proposes the reclaims of the map that the PGs this shard leads have not done, and
    /// repeats done reports the map does not show yet. Runs on every map and tick.
    pub(crate) fn drive_reclaims(&mut self, eff: &mut Effects) {
        if self.failed.is_some() {
            return;
        }
        let map = self.map.clone();
        // Forget what the map no longer asks of a PG (done, or the entry is gone).
        self.reclaims.states.retain(|(pg, id), _| {
            map.reclaim
                .get(id)
                .is_some_and(|e| !e.done_pgs.contains(&pg.seq))
        });
        if map.reclaim.is_empty() {
            return;
        }
        let led: Vec<PgId> = self
            .pgs
            .iter()
            .filter(|(_, h)| h.replica.is_leader())
            .map(|(pg, _)| *pg)
            .collect();
        let now = self.now;
        for pg in led {
            for entry in map.reclaim.values() {
                if entry.pool != pg.pool || entry.done_pgs.contains(&pg.seq) {
                    continue;
                }
                let key = (pg, entry.id);
                match self.reclaims.states.get(&key).copied() {
                    Some(ReclaimState::Proposed) => {}
                    Some(ReclaimState::Reported { at }) => {
                        if now.since(at) >= REPORT_RETRY_MS * 1000 {
                            self.reclaims
                                .states
                                .insert(key, ReclaimState::Reported { at: now });
                            eff.reports.push(Report::ReclaimDone { pg, id: entry.id });
                        }
                    }
                    None => {
                        let op = ClientOp::Reclaim {
                            id: entry.id,
                            image: entry.image,
                            from_bytes: entry.from_bytes,
                            to_bytes: entry.to_bytes,
                            object_size_bytes: entry.object_size_bytes,
                            epoch: entry.epoch.0,
                        };
                        let id = self.new_op(PendingOp {
                            conn: INTERNAL_CONN,
                            request_id: 0,
                            pg,
                            kind: OpKind::Reclaim { id: entry.id },
                            arrived: now,
                            started: now,
                            log_index: 0,
                        });
                        self.reclaims.states.insert(key, ReclaimState::Proposed);
                        tracing::info!(%pg, reclaim = entry.id, image = %entry.image,
                            from = entry.from_bytes, to = entry.to_bytes, "proposing a reclaim");
                        let hosted = self.pgs.get_mut(&pg).expect("led above");
                        hosted
                            .replica
                            .propose(id, &op, self.outs.entry(pg).or_default());
                    }
                }
            }
        }
    }

    /// The reclaim proposed for `(pg, id)` ended: applied (reported to the monitor)
    /// or failed (proposed again by whoever leads next).
    pub(crate) fn reclaim_finished(&mut self, pg: PgId, id: u64, applied: bool, eff: &mut Effects) {
        let key = (pg, id);
        if applied {
            eff.probes.reclaims_applied += 1;
            self.reclaims
                .states
                .insert(key, ReclaimState::Reported { at: self.now });
            eff.reports.push(Report::ReclaimDone { pg, id });
        } else {
            self.reclaims.states.remove(&key);
        }
    }

    /// Whether the map lets a request touch `query`'s range; refuses it (and returns false)
    /// otherwise. See the module doc.
    pub(crate) fn fence(
        &mut self,
        conn: ConnId,
        request_id: u64,
        query: FenceQuery,
        eff: &mut Effects,
    ) -> bool {
        match self.fence_verdict(&query) {
            Ok(()) => true,
            Err((status, message)) => {
                eff.probes.fenced += 1;
                self.refuse(conn, request_id, status, message, eff);
                false
            }
        }
    }

    fn fence_verdict(&self, q: &FenceQuery) -> Result<(), (Status, String)> {
        let Some(table) = &self.map.images else {
            return Ok(());
        };
        let addr = &q.addr;
        let map_epoch = self.map.epoch;
        if let Some(h) = self.pgs.get(&addr.pg) {
            // A map older than a reclaim this replica applied may still show the deleted
            // range (a leader elected with a stale map would admit a write the reclaim
            // already deleted around, and its data would stay for good). Writes reach this
            // check only once a new leader applied the log it inherited
            // (`hold_until_own_term`), so a reclaim an earlier leader committed counts.
            if h.reclaim_epoch > map_epoch {
                return Err((
                    Status::StaleEpoch,
                    format!(
                        "pg {} applied a reclaim of map epoch {}, newer than this osd's map (epoch {}); retry",
                        addr.pg, h.reclaim_epoch.0, map_epoch.0
                    ),
                ));
            }
        }
        let (offset, length) = (q.offset, q.length);
        let fence = table.check(
            addr.image,
            addr.object_index,
            u64::from(offset),
            u64::from(length),
        );
        let end_bytes = addr
            .object_index
            .checked_mul(
                table
                    .images
                    .get(&addr.image)
                    .map_or(0, |e| e.object_size_bytes),
            )
            .and_then(|start| start.checked_add(u64::from(offset) + u64::from(length)));
        Err(match fence {
            ImageFence::Allowed => return Ok(()),
            ImageFence::BeyondSize { .. } if end_bytes.is_some_and(|e| e <= q.reach_bytes) => {
                return Ok(())
            }
            ImageFence::Removed => (
                Status::NoSuchImage,
                format!("image {} was removed", addr.image),
            ),
            _ if q.epoch > map_epoch => (
                Status::StaleEpoch,
                format!(
                    "image {} is not in this osd's map (epoch {}) as in the request's (epoch {}); retry",
                    addr.image, map_epoch.0, q.epoch.0
                ),
            ),
            ImageFence::Unknown => (
                Status::NoSuchImage,
                format!("image {} does not exist", addr.image),
            ),
            ImageFence::BeyondSize { size_bytes } => (
                Status::OutOfRange,
                format!(
                    "object {} bytes {offset}+{length} is beyond the end of image {} ({size_bytes} bytes)",
                    addr.object_index, addr.image
                ),
            ),
        })
    }
}

/// What [`ShardCore::fence`] checks of a request.
pub(crate) struct FenceQuery {
    pub(crate) addr: ObjectAddr,
    pub(crate) offset: u32,
    pub(crate) length: u32,
    /// The request's map epoch.
    pub(crate) epoch: Epoch,
    /// Image bytes the request may reach beyond the image's size (a copy-up for a snapshot
    /// of a shrunk clone, which keeps its own size); 0: none.
    pub(crate) reach_bytes: u64,
}

/// Writes held per PG while its new leader applies the log it inherited; more are refused
/// `Busy`.
const AWAITING_TERM_OPS_MAX: usize = 4096;

/// A write held until its PG's new leader has applied the log it inherited.
pub(crate) struct Held {
    conn: ConnId,
    request_id: u64,
    req: Request,
    arrived: Micros,
}

impl<D: Disk + 'static> ShardCore<D> {
    /// Holds a write for `pg` if its leader has not applied the log of the terms before its
    /// own yet (a reclaim an earlier leader committed may be among it, and the fencing must
    /// see it); returns the request back otherwise. Only maps with an image table fence.
    pub(crate) fn hold_until_own_term(
        &mut self,
        conn: ConnId,
        request_id: u64,
        req: Request,
        arrived: Micros,
        eff: &mut Effects,
    ) -> Option<Request> {
        let pg = match &req {
            Request::Write { addr, .. }
            | Request::Discard { addr, .. }
            | Request::WriteZeroes { addr, .. }
            | Request::Rollback { addr, .. }
            | Request::CopyUp { addr, .. }
            | Request::CopyUpDone { addr, .. } => addr.pg,
            _ => return Some(req),
        };
        // Writes already held for the PG keep their place: a later one waits behind them.
        let waiting = self.reclaims.awaiting_term.contains_key(&pg)
            || self.map.images.is_some()
                && self
                    .pgs
                    .get(&pg)
                    .is_some_and(|h| h.replica.is_leader() && !h.replica.applied_own_term());
        if !waiting {
            return Some(req);
        }
        let held = self.reclaims.awaiting_term.entry(pg).or_default();
        if held.len() >= AWAITING_TERM_OPS_MAX {
            let m = format!("pg {pg}: its new leader is still applying its log");
            self.refuse(conn, request_id, Status::Busy, m, eff);
            return None;
        }
        eff.probes.held_for_term += 1;
        held.push(Held {
            conn,
            request_id,
            req,
            arrived,
        });
        None
    }

    /// Admits the writes held for PGs whose leader has now applied its term's first entry
    /// (or that it no longer leads: admission answers them). Returns whether any went.
    pub(crate) fn admit_held(&mut self, eff: &mut Effects) -> bool {
        if self.reclaims.awaiting_term.is_empty() {
            return false;
        }
        let ready: Vec<PgId> = self
            .reclaims
            .awaiting_term
            .keys()
            .copied()
            .filter(|pg| {
                self.pgs
                    .get(pg)
                    .is_none_or(|h| !h.replica.is_leader() || h.replica.applied_own_term())
            })
            .collect();
        for pg in &ready {
            let held = self.reclaims.awaiting_term.remove(pg).unwrap_or_default();
            for h in held {
                self.on_request(h.conn, h.request_id, h.req, h.arrived, eff);
            }
        }
        !ready.is_empty()
    }
}

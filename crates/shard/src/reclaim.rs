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
//! (the simulator's, unit tests') fences nothing.

use crate::core::{OpKind, PendingOp, ShardCore};
use crate::io::{ConnId, Effects, Micros, Report};
use fastblock_pg::ClientOp;
use fastblock_store::Disk;
use fastblock_types::map::ImageFence;
use fastblock_types::{Epoch, PgId};
use fastblock_wire::{ObjectAddr, Status};
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

/// The reclaims this shard's PG leaders are working on.
#[derive(Default)]
pub(crate) struct Reclaims {
    pub(crate) states: BTreeMap<(PgId, u64), ReclaimState>,
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
                        };
                        let id = self.new_op(PendingOp {
                            conn: INTERNAL_CONN,
                            request_id: 0,
                            pg,
                            kind: OpKind::Reclaim { id: entry.id },
                            arrived: now,
                            started: now,
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

    /// Whether the map lets a request touch `length` bytes at `offset` of `addr`'s object;
    /// refuses it (and returns false) otherwise. See the module doc.
    pub(crate) fn fence(
        &mut self,
        conn: ConnId,
        request_id: u64,
        addr: &ObjectAddr,
        (offset, length): (u32, u32),
        epoch: Epoch,
        eff: &mut Effects,
    ) -> bool {
        let Some(table) = &self.map.images else {
            return true;
        };
        let fence = table.check(
            addr.image,
            addr.object_index,
            u64::from(offset),
            u64::from(length),
        );
        let map_epoch = self.map.epoch;
        let (status, message) = match fence {
            ImageFence::Allowed => return true,
            ImageFence::Removed => (
                Status::NoSuchImage,
                format!("image {} was removed", addr.image),
            ),
            _ if epoch > map_epoch => (
                Status::StaleEpoch,
                format!(
                    "image {} is not in this osd's map (epoch {}) as in the request's (epoch {}); retry",
                    addr.image, map_epoch.0, epoch.0
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
        };
        eff.probes.fenced += 1;
        self.refuse(conn, request_id, status, message, eff);
        false
    }
}

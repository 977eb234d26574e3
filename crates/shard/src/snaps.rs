//! Image snapshots through the PGs' logs (`docs/design/snapshots.md`).
//!
//! The monitor lists the snapshots of every image in the map (`ClusterMap::snaps`) and the
//! removed ones whose blocks must go (`ClusterMap::snap_trims`). The leader of every PG of an
//! image's pool proposes a `ClientOp::SnapMark` for a snapshot the map shows `creating`, and a
//! `ClientOp::SnapTrim` for a trim entry; every member applies them through the log, and once
//! the leader applied one it confirms it to the monitor ([`Report::SnapMarked`],
//! [`Report::SnapTrimmed`]), repeated after [`REPORT_RETRY_MS`] while the map does not show
//! it, exactly as reclaims are (`crate::reclaim`).
//!
//! The freeze: from the moment a leader proposes a snapshot's mark (or finds it applied) until
//! the map shows the snapshot `created` (or gone), writes to that image are refused with the
//! retryable `SnapInProgress`. So no write is acknowledged between the first PG's mark and the
//! snapshot being complete: a write acknowledged before the creating call returned was logged
//! before its PG's mark (it is in the snapshot), a write issued after it returned is logged
//! after every PG's mark (it is not), and the snapshot is a state the image passed through.
//! A new leader holds writes until it applied its inherited log (`hold_until_own_term`), so a
//! mark its predecessor committed freezes it too.

use crate::core::{OpKind, PendingOp, ShardCore};
use crate::io::{Effects, Micros, Report};
use crate::reclaim::{INTERNAL_CONN, REPORT_RETRY_MS};
use fastblock_pg::ClientOp;
use fastblock_store::Disk;
use fastblock_types::map::SnapState;
use fastblock_types::{ImageId, PgId};
use fastblock_wire::Status;
use std::collections::BTreeMap;

/// Where this shard's leader of one PG is with one snapshot operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SnapOpState {
    /// Proposed; not applied yet.
    Proposed,
    /// Applied and confirmed at this time; waiting for the map to show it.
    Reported { at: Micros },
    /// Applied without effect (a mark older than one this PG applied since): nothing to
    /// confirm; the monitor times the snapshot out.
    Skipped,
}

/// The snapshot marks and trims this shard's PG leaders are working on.
#[derive(Default)]
pub(crate) struct SnapOps {
    /// (pg, image, snapshot id) -> the mark's state.
    pub(crate) marks: BTreeMap<(PgId, ImageId, u64), SnapOpState>,
    /// (pg, trim entry id) -> the trim's state.
    pub(crate) trims: BTreeMap<(PgId, u64), SnapOpState>,
}

impl<D: Disk + 'static> ShardCore<D> {
    /// Proposes the snapshot marks and trims of the map that the PGs this shard leads have not
    /// done, and repeats confirmations the map does not show yet. Runs on every map and tick.
    pub(crate) fn drive_snaps(&mut self, eff: &mut Effects) {
        if self.failed.is_some() {
            return;
        }
        let map = self.map.clone();
        // Forget what the map no longer asks of a PG.
        self.snap_ops.marks.retain(|(pg, image, snap), _| {
            map.snaps.get(image).is_some_and(|list| {
                list.iter().any(|s| {
                    s.id.0 == *snap
                        && s.state == SnapState::Creating
                        && !s.done_pgs.contains(&pg.seq)
                })
            })
        });
        self.snap_ops.trims.retain(|(pg, id), _| {
            map.snap_trims
                .get(id)
                .is_some_and(|t| !t.done_pgs.contains(&pg.seq))
        });
        if map.snaps.is_empty() && map.snap_trims.is_empty() {
            return;
        }
        let led: Vec<PgId> = self
            .pgs
            .iter()
            .filter(|(_, h)| h.replica.is_leader() && h.replica.applied_own_term())
            .map(|(pg, _)| *pg)
            .collect();
        let now = self.now;
        for pg in led {
            // Marks in id order: an image's later snapshot is never marked before an earlier
            // one (applying it would make the earlier one's mark a no-op).
            for list in map.snaps.values() {
                for s in list {
                    if s.pool != pg.pool
                        || s.state != SnapState::Creating
                        || s.done_pgs.contains(&pg.seq)
                    {
                        continue;
                    }
                    let key = (pg, s.image, s.id.0);
                    let marked = self
                        .store
                        .borrow()
                        .image_snaps(pg, s.image)
                        .live
                        .contains(&s.id.0);
                    match self.snap_ops.marks.get(&key).copied() {
                        Some(SnapOpState::Proposed | SnapOpState::Skipped) => {}
                        Some(SnapOpState::Reported { at }) => {
                            if now.since(at) >= REPORT_RETRY_MS * 1000 {
                                self.snap_ops
                                    .marks
                                    .insert(key, SnapOpState::Reported { at: now });
                                eff.reports.push(Report::SnapMarked {
                                    pg,
                                    image: s.image,
                                    snap: s.id.0,
                                });
                            }
                        }
                        // Applied already (by an earlier leader, or before a restart).
                        None if marked => {
                            self.snap_ops
                                .marks
                                .insert(key, SnapOpState::Reported { at: now });
                            eff.reports.push(Report::SnapMarked {
                                pg,
                                image: s.image,
                                snap: s.id.0,
                            });
                        }
                        None => {
                            let op = ClientOp::SnapMark {
                                image: s.image,
                                snap: s.id.0,
                            };
                            let kind = OpKind::SnapMark {
                                image: s.image,
                                snap: s.id.0,
                            };
                            self.snap_ops.marks.insert(key, SnapOpState::Proposed);
                            tracing::info!(%pg, image = %s.image, snap = s.id.0, "proposing a snapshot mark");
                            self.propose_internal(pg, kind, &op);
                        }
                    }
                }
            }
            for t in map.snap_trims.values() {
                if t.pool != pg.pool || t.done_pgs.contains(&pg.seq) {
                    continue;
                }
                let key = (pg, t.id);
                match self.snap_ops.trims.get(&key).copied() {
                    Some(SnapOpState::Proposed | SnapOpState::Skipped) => {}
                    Some(SnapOpState::Reported { at }) => {
                        if now.since(at) >= REPORT_RETRY_MS * 1000 {
                            self.snap_ops
                                .trims
                                .insert(key, SnapOpState::Reported { at: now });
                            eff.reports.push(Report::SnapTrimmed { pg, id: t.id });
                        }
                    }
                    None => {
                        let op = ClientOp::SnapTrim {
                            id: t.id,
                            image: t.image,
                            snap: t.snap.0,
                        };
                        self.snap_ops.trims.insert(key, SnapOpState::Proposed);
                        tracing::info!(%pg, image = %t.image, snap = t.snap.0, trim = t.id, "proposing a snapshot trim");
                        self.propose_internal(pg, OpKind::SnapTrim { id: t.id }, &op);
                    }
                }
            }
        }
    }

    pub(crate) fn propose_internal(&mut self, pg: PgId, kind: OpKind, op: &ClientOp) {
        let now = self.now;
        let id = self.new_op(PendingOp {
            conn: INTERNAL_CONN,
            request_id: 0,
            pg,
            kind,
            arrived: now,
            started: now,
            log_index: 0,
        });
        let hosted = self
            .pgs
            .get_mut(&pg)
            .expect("proposed on a PG this shard leads");
        hosted
            .replica
            .propose(id, op, self.outs.entry(pg).or_default());
    }

    /// The mark of snapshot `snap` of `image` proposed for `pg` ended: applied (confirmed to
    /// the monitor if the snapshot is live here now) or failed (proposed again by whoever
    /// leads next).
    pub(crate) fn snap_mark_finished(
        &mut self,
        pg: PgId,
        (image, snap): (ImageId, u64),
        applied: bool,
        eff: &mut Effects,
    ) {
        let key = (pg, image, snap);
        if !applied {
            self.snap_ops.marks.remove(&key);
            return;
        }
        let live = self
            .store
            .borrow()
            .image_snaps(pg, image)
            .live
            .contains(&snap);
        if live {
            self.snap_ops
                .marks
                .insert(key, SnapOpState::Reported { at: self.now });
            eff.reports.push(Report::SnapMarked { pg, image, snap });
        } else {
            self.snap_ops.marks.insert(key, SnapOpState::Skipped);
        }
    }

    /// The trim `id` proposed for `pg` ended: applied (confirmed) or failed (proposed again).
    pub(crate) fn snap_trim_finished(
        &mut self,
        pg: PgId,
        id: u64,
        applied: bool,
        eff: &mut Effects,
    ) {
        let key = (pg, id);
        if applied {
            self.snap_ops
                .trims
                .insert(key, SnapOpState::Reported { at: self.now });
            eff.reports.push(Report::SnapTrimmed { pg, id });
        } else {
            self.snap_ops.trims.remove(&key);
        }
    }

    /// Why a write to `image` in `pg` must wait for a snapshot being taken (see the module
    /// doc), or `None`.
    pub(crate) fn snap_freeze(&self, pg: PgId, image: ImageId) -> Option<(Status, String)> {
        let listed = self.map.snaps.get(&image).map_or(&[][..], |l| l.as_slice());
        let state = self.store.borrow().image_snaps(pg, image);
        // Marked here (applied, or proposed by this leader) and not shown created by the map:
        // being taken. That includes a mark applied from the log while this leader's map is
        // older than the snapshot (it shows neither the snapshot nor a trim of it): a leader
        // elected with a stale map would otherwise admit writes between the marks of two PGs
        // (simulator scenario `a_leader_whose_map_is_older_than_a_snapshot_takes_no_write_the_snapshot_misses`).
        let taking = |snap: u64| {
            let in_map = listed.iter().find(|s| s.id.0 == snap);
            match in_map {
                Some(s) => s.state == SnapState::Creating,
                None => !self
                    .map
                    .snap_trims
                    .values()
                    .any(|t| t.image == image && t.snap.0 == snap),
            }
        };
        let proposed = listed.iter().map(|s| s.id.0).filter(|snap| {
            self.snap_ops
                .marks
                .get(&(pg, image, *snap))
                .is_some_and(|s| *s == SnapOpState::Proposed)
        });
        let frozen = state
            .live
            .iter()
            .copied()
            .chain(proposed)
            .find(|snap| taking(*snap))?;
        Some((
            Status::SnapInProgress,
            format!(
                "pg {pg}: snapshot {frozen} of image {image} is being taken; writes wait until every PG marked it"
            ),
        ))
    }
}

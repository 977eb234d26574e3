//! Scrubbing the PGs this shard leads (`docs/design/scrub.md`).
//!
//! A scrub walks a PG's objects in ranges (chunks of at most [`CHUNK_BYTES_MAX`] of data or
//! [`CHUNK_OBJECTS_MAX`] objects). For each range, the leader computes its own digests
//! (`Store::scrub_digests`: one per 64 KiB group of an object, over the versions'
//! checksums) and asks every other voter for theirs (`ScrubStep::Ask` → `Digests`). A deep
//! scrub also reads every block version back on every replica; a bad one is repaired like
//! any bad block (`crate::repair`).
//!
//! Replicas computed their digests at different applied indexes. So a group whose digests
//! differ counts only if no entry of the leader's log after the lowest of those indexes
//! touches its object (`log_touches`, as for a repair). Otherwise the difference may be a
//! write on its way, and the group is left for the next scrub. A group that truly differs
//! is repaired from the majority: every block of the group gets a repair whose source
//! excludes the replicas in the minority. With no majority, nothing is repaired and the
//! group stays counted.
//!
//! Every repair this shard starts for a PG while it scrubs the PG counts in the scrub's
//! report ([`PgScrubReport`]): `inconsistent_blocks` when started, `repaired_blocks` when
//! applied, also after the scrub ended, until the next scrub of the PG starts afresh. The
//! monitor raises `PG_INCONSISTENT` while some are left.
//!
//! One scrub runs per shard at a time. After each range it waits while the data it read
//! (deep) would exceed [`ScrubSchedule::deep_bytes_per_sec`]: client IO keeps priority.
//!
//! [`ScrubSchedule::deep_bytes_per_sec`]: crate::config::ScrubSchedule

use crate::core::ShardCore;
use crate::io::{Effects, Micros, PeerSend};
use crate::repair::BlockRef;
use fastblock_store::{Disk, ObjectId, ScrubDigest, SCRUB_GROUP_BLOCKS};
use fastblock_types::api::PgScrubReport;
use fastblock_types::units::BLOCK_SIZE_BYTES;
use fastblock_types::{ImageId, OsdId, PgId};
use fastblock_wire::{Request, ScrubEntry, ScrubMsg, ScrubStep};
use std::collections::{BTreeMap, BTreeSet};

/// Data of one scrub range, at most (one object more if a single object is larger).
pub const CHUNK_BYTES_MAX: u64 = 4 << 20;
/// Objects of one scrub range, at most.
pub const CHUNK_OBJECTS_MAX: usize = 64;
/// A member's digests not back after this long: the range is compared without them.
pub const CHUNK_TIMEOUT_MS: u64 = 10_000;
/// Scrubs one shard runs at a time.
pub const SCRUBS_ACTIVE_MAX: usize = 1;

const OBJECT_MAX: ObjectId = ObjectId {
    image: ImageId(u64::MAX),
    index: u64::MAX,
};

/// The object right after `o` in (image, index) order (`o` itself at the very end).
fn successor(o: ObjectId) -> ObjectId {
    match o.index.checked_add(1) {
        Some(index) => ObjectId {
            image: o.image,
            index,
        },
        None => match o.image.0.checked_add(1) {
            Some(image) => ObjectId {
                image: ImageId(image),
                index: 0,
            },
            None => o,
        },
    }
}

struct Chunk {
    id: u64,
    last: ObjectId,
    sent: Micros,
    /// Each replica's applied index and digests (the leader's own included).
    digests: BTreeMap<OsdId, (u64, Vec<ScrubDigest>)>,
    waiting: BTreeSet<OsdId>,
    /// Block versions read by the deep scrub of this range (the most of any replica).
    blocks_read: u64,
}

struct Running {
    deep: bool,
    /// The operator's request this scrub answers (0: scheduled).
    request: u64,
    term: u64,
    /// The last object of the ranges compared so far.
    cursor: Option<ObjectId>,
    chunk: Option<Chunk>,
    /// Groups left for the next scrub (written to while compared).
    skipped_groups: u64,
}

#[derive(Default)]
struct PgState {
    report: PgScrubReport,
    /// When this shard started leading the PG, and last finished a light / deep scrub of
    /// it.
    led_since: Option<Micros>,
    last_scrub: Option<Micros>,
    last_deep: Option<Micros>,
}

#[derive(Default)]
pub(crate) struct Scrubs {
    next_chunk_id: u64,
    running: BTreeMap<PgId, Running>,
    pgs: BTreeMap<PgId, PgState>,
    /// Repairs started while their PG was scrubbed: counted in its report.
    repairs: BTreeMap<BlockRef, PgId>,
    /// No new range starts before this (the deep read rate).
    next_chunk_at: Micros,
}

impl<D: Disk + 'static> ShardCore<D> {
    /// The scrub report of `pg`, if this shard scrubbed it (or is scrubbing it).
    pub(crate) fn scrub_report(&self, pg: PgId) -> Option<PgScrubReport> {
        let st = self.scrubs.pgs.get(&pg)?;
        let mut r = st.report;
        r.running = self.scrubs.running.contains_key(&pg);
        (r.scrubs > 0 || r.running || r.inconsistent_blocks > 0).then_some(r)
    }

    /// Whether a repair started now for `pg` belongs to a scrub; if so it is counted.
    pub(crate) fn scrub_counts_repair(&mut self, block: BlockRef) {
        if self.scrubs.running.contains_key(&block.0) {
            self.scrubs.repairs.insert(block, block.0);
            self.scrubs
                .pgs
                .entry(block.0)
                .or_default()
                .report
                .inconsistent_blocks += 1;
        }
    }

    /// A repair ended: counted if a scrub started it.
    pub(crate) fn scrub_repair_finished(&mut self, block: BlockRef, applied: bool) {
        if let Some(pg) = self.scrubs.repairs.remove(&block) {
            if applied {
                self.scrubs
                    .pgs
                    .entry(pg)
                    .or_default()
                    .report
                    .repaired_blocks += 1;
            }
        }
    }

    /// Starts the scrubs that are due or asked for and moves the running ones on. Runs on
    /// every tick and map.
    pub(crate) fn drive_scrubs(&mut self, eff: &mut Effects) {
        if self.failed.is_some() {
            return;
        }
        let now = self.now;
        // Drop what this shard no longer leads.
        let led: BTreeMap<PgId, u64> = self
            .pgs
            .iter()
            .filter(|(_, h)| h.replica.is_leader() && h.replica.applied_own_term())
            .map(|(pg, h)| (*pg, h.replica.term().0))
            .collect();
        self.scrubs
            .running
            .retain(|pg, r| led.get(pg) == Some(&r.term));
        self.scrubs.pgs.retain(|pg, _| led.contains_key(pg));
        for pg in led.keys() {
            self.scrubs
                .pgs
                .entry(*pg)
                .or_default()
                .led_since
                .get_or_insert(now);
        }
        self.start_due_scrubs(&led);
        let pgs: Vec<PgId> = self.scrubs.running.keys().copied().collect();
        for pg in pgs {
            self.advance_scrub(pg, eff);
        }
    }

    fn start_due_scrubs(&mut self, led: &BTreeMap<PgId, u64>) {
        let now_ms = self.now.as_millis();
        let sched = self.cfg.scrub;
        for (pg, term) in led {
            if self.scrubs.running.len() >= SCRUBS_ACTIVE_MAX {
                return;
            }
            if self.scrubs.running.contains_key(pg) {
                continue;
            }
            let st = &self.scrubs.pgs[pg];
            let asked: Vec<(u64, bool)> = self
                .map
                .scrub_requests
                .values()
                .filter(|r| r.pg == *pg && r.id > st.report.request_done)
                .map(|r| (r.id, r.deep))
                .collect();
            let since = |t: Option<Micros>| {
                now_ms.saturating_sub(t.or(st.led_since).map_or(now_ms, |t| t.as_millis()))
            };
            let (deep, request) = if let Some(&(id, _)) = asked.iter().max() {
                (asked.iter().any(|(_, d)| *d), id)
            } else if sched.deep_interval_ms > 0 && since(st.last_deep) >= sched.deep_interval_ms {
                (true, 0)
            } else if sched.interval_ms > 0 && since(st.last_scrub) >= sched.interval_ms {
                (false, 0)
            } else {
                continue;
            };
            tracing::info!(%pg, deep, request, "scrub started");
            // The counts are the new scrub's from here on: repairs the last one started and
            // that finish later are no longer its.
            let report = &mut self.scrubs.pgs.get_mut(pg).expect("led").report;
            report.inconsistent_blocks = 0;
            report.repaired_blocks = 0;
            self.scrubs.repairs.retain(|_, p| p != pg);
            self.scrubs.running.insert(
                *pg,
                Running {
                    deep,
                    request,
                    term: *term,
                    cursor: None,
                    chunk: None,
                    skipped_groups: 0,
                },
            );
        }
    }

    fn advance_scrub(&mut self, pg: PgId, eff: &mut Effects) {
        let now = self.now;
        let r = self.scrubs.running.get_mut(&pg).expect("running");
        if let Some(c) = &r.chunk {
            if c.waiting.is_empty() || now.as_millis() >= c.sent.as_millis() + CHUNK_TIMEOUT_MS {
                if !c.waiting.is_empty() {
                    tracing::warn!(%pg, missing = ?c.waiting, "scrub range compared without the members that did not answer");
                }
                self.compare_chunk(pg);
            }
            return;
        }
        if now < self.scrubs.next_chunk_at {
            return;
        }
        let after = r.cursor;
        if after == Some(OBJECT_MAX) {
            self.finish_scrub(pg);
            return;
        }
        let (deep, term) = (r.deep, r.term);
        let first = after.map_or(
            ObjectId {
                image: ImageId(0),
                index: 0,
            },
            successor,
        );
        let next =
            self.store
                .borrow()
                .scrub_next_objects(pg, after, CHUNK_BYTES_MAX, CHUNK_OBJECTS_MAX);
        // The last range reaches the end, for objects that only image snapshots still keep.
        let last = match next.last() {
            Some(l) if next.len() == CHUNK_OBJECTS_MAX || self.more_objects_after(pg, *l) => *l,
            _ => OBJECT_MAX,
        };
        let mine = {
            let mut store = self.store.borrow_mut();
            let applied = store.applied_index(pg);
            store
                .scrub_digests(pg, first, last, deep)
                .map(|f| (applied, f))
        };
        let (applied, findings) = match mine {
            Ok(m) => m,
            Err(e) if e.is_fatal() => {
                self.fail(
                    crate::error::ShardFailure::store(crate::error::Operation::Read, Some(pg), e),
                    eff,
                );
                return;
            }
            Err(e) => {
                tracing::error!(%pg, "scrub stopped: {e}");
                self.scrubs.running.remove(&pg);
                return;
            }
        };
        self.scrubs.next_chunk_id += 1;
        let id = self.scrubs.next_chunk_id;
        let me = self.cfg.osd;
        let members: BTreeSet<OsdId> = self
            .pgs
            .get(&pg)
            .map(|h| h.replica.voters())
            .unwrap_or_default()
            .into_iter()
            .filter(|o| *o != me)
            .collect();
        for to in &members {
            eff.peers.push(PeerSend {
                to: *to,
                pg,
                req: Request::Scrub(ScrubMsg {
                    from: me,
                    to: *to,
                    pg,
                    step: ScrubStep::Ask,
                    deep,
                    scrub: id,
                    term,
                    applied: 0,
                    first: (first.image, first.index),
                    last: (last.image, last.index),
                    blocks_read: 0,
                    bad_blocks: 0,
                    entries: Vec::new(),
                }),
            });
        }
        let r = self.scrubs.running.get_mut(&pg).expect("running");
        r.chunk = Some(Chunk {
            id,
            last,
            sent: now,
            digests: BTreeMap::from([(me, (applied, findings.digests))]),
            waiting: members,
            blocks_read: findings.blocks_read,
        });
        if r.chunk.as_ref().is_some_and(|c| c.waiting.is_empty()) {
            self.compare_chunk(pg);
        }
    }

    fn more_objects_after(&self, pg: PgId, o: ObjectId) -> bool {
        !self
            .store
            .borrow()
            .scrub_next_objects(pg, Some(o), 0, 1)
            .is_empty()
    }

    /// A member's digests for a range this shard asked for.
    fn on_scrub_digests(&mut self, m: ScrubMsg) {
        let Some(r) = self.scrubs.running.get_mut(&m.pg) else {
            return;
        };
        let Some(c) = r.chunk.as_mut() else {
            return;
        };
        if c.id != m.scrub || r.term != m.term || !c.waiting.remove(&m.from) {
            return;
        }
        let digests = m
            .entries
            .iter()
            .map(|e| ScrubDigest {
                object: ObjectId {
                    image: e.image,
                    index: e.object_index,
                },
                group: e.group,
                digest: e.digest,
            })
            .collect();
        c.digests.insert(m.from, (m.applied, digests));
        c.blocks_read = c.blocks_read.max(m.blocks_read);
    }

    /// Compares the replicas' digests of the range in flight, repairs the groups that truly
    /// differ from the majority, and moves on.
    fn compare_chunk(&mut self, pg: PgId) {
        let r = self.scrubs.running.get_mut(&pg).expect("running");
        let c = r.chunk.take().expect("a range in flight");
        r.cursor = Some(c.last);
        let oldest = c.digests.values().map(|(a, _)| *a).min().unwrap_or(0);
        let replicas: Vec<OsdId> = c.digests.keys().copied().collect();
        // (object, group) -> each replica's digest (None: no data there).
        let mut groups: BTreeMap<(ObjectId, u32), BTreeMap<OsdId, u64>> = BTreeMap::new();
        for (osd, (_, list)) in &c.digests {
            for d in list {
                groups
                    .entry((d.object, d.group))
                    .or_default()
                    .insert(*osd, d.digest);
            }
        }
        let mut to_repair: Vec<((ObjectId, u32), BTreeSet<OsdId>)> = Vec::new();
        let mut skipped = 0;
        let mut unresolved = 0;
        for (key, by_osd) in groups {
            let values: Vec<Option<u64>> =
                replicas.iter().map(|o| by_osd.get(o).copied()).collect();
            if values.windows(2).all(|w| w[0] == w[1]) {
                continue;
            }
            let group_bytes = u64::from(SCRUB_GROUP_BLOCKS) * BLOCK_SIZE_BYTES;
            let at = u64::from(key.1) * group_bytes;
            if self.log_touches(pg, key.0, at..at + group_bytes, oldest) {
                skipped += 1;
                continue;
            }
            let majority = values
                .iter()
                .find(|v| values.iter().filter(|w| w == v).count() * 2 > values.len());
            match majority {
                Some(m) => {
                    let minority: BTreeSet<OsdId> = replicas
                        .iter()
                        .zip(&values)
                        .filter(|(_, v)| *v != m)
                        .map(|(o, _)| *o)
                        .collect();
                    tracing::warn!(%pg, image = %key.0.image, object = key.0.index, group = key.1, ?minority, "scrub: replicas disagree; repairing from the majority");
                    to_repair.push((key, minority));
                }
                None => {
                    tracing::error!(%pg, image = %key.0.image, object = key.0.index, group = key.1, "scrub: replicas disagree and no majority agrees");
                    unresolved += 1;
                }
            }
        }
        let r = self.scrubs.running.get_mut(&pg).expect("running");
        r.skipped_groups += skipped;
        let deep = r.deep;
        self.scrubs
            .pgs
            .entry(pg)
            .or_default()
            .report
            .inconsistent_blocks += unresolved * u64::from(SCRUB_GROUP_BLOCKS);
        for ((object, group), minority) in to_repair {
            for b in 0..SCRUB_GROUP_BLOCKS {
                self.start_repair_excluding(
                    (pg, object, group * SCRUB_GROUP_BLOCKS + b),
                    &minority,
                );
            }
        }
        // The deep read rate: the next range waits for what this one read.
        let read_bytes = if deep {
            c.blocks_read * BLOCK_SIZE_BYTES
        } else {
            0
        };
        let wait_ms = read_bytes.saturating_mul(1000) / self.cfg.scrub.deep_bytes_per_sec.max(1);
        self.scrubs.next_chunk_at = Micros(self.now.0 + wait_ms * 1000);
    }

    fn finish_scrub(&mut self, pg: PgId) {
        let r = self.scrubs.running.remove(&pg).expect("running");
        let now = self.now;
        let st = self.scrubs.pgs.entry(pg).or_default();
        st.report.scrubs += 1;
        st.report.last_deep = r.deep;
        if r.deep {
            st.report.deep_scrubs += 1;
            st.last_deep = Some(now);
        }
        st.last_scrub = Some(now);
        st.report.request_done = st.report.request_done.max(r.request);
        tracing::info!(%pg, deep = r.deep, inconsistent = st.report.inconsistent_blocks, repaired = st.report.repaired_blocks, left_for_next = r.skipped_groups, "scrub finished");
    }

    /// A scrub message from a member or the leader.
    pub(crate) fn on_scrub_msg(&mut self, m: ScrubMsg, eff: &mut Effects) {
        if m.to != self.cfg.osd {
            return;
        }
        match m.step {
            ScrubStep::Digests => self.on_scrub_digests(m),
            ScrubStep::Ask => {
                if !self.pgs.contains_key(&m.pg) {
                    return;
                }
                let first = ObjectId {
                    image: m.first.0,
                    index: m.first.1,
                };
                let last = ObjectId {
                    image: m.last.0,
                    index: m.last.1,
                };
                let r = {
                    let mut store = self.store.borrow_mut();
                    let applied = store.applied_index(m.pg);
                    store
                        .scrub_digests(m.pg, first, last, m.deep)
                        .map(|f| (applied, f))
                };
                let (applied, findings) = match r {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::error!(pg = %m.pg, "scrub range not read: {e}");
                        if e.is_fatal() {
                            self.fail(
                                crate::error::ShardFailure::store(
                                    crate::error::Operation::Read,
                                    Some(m.pg),
                                    e,
                                ),
                                eff,
                            );
                        }
                        return;
                    }
                };
                eff.peers.push(PeerSend {
                    to: m.from,
                    pg: m.pg,
                    req: Request::Scrub(ScrubMsg {
                        from: self.cfg.osd,
                        to: m.from,
                        step: ScrubStep::Digests,
                        applied,
                        blocks_read: findings.blocks_read,
                        bad_blocks: findings.bad_blocks,
                        entries: findings
                            .digests
                            .iter()
                            .map(|d| ScrubEntry {
                                image: d.object.image,
                                object_index: d.object.index,
                                group: d.group,
                                digest: d.digest,
                            })
                            .collect(),
                        ..m
                    }),
                });
            }
        }
    }
}

//! Repairing bad block copies from good replicas (`docs/design/repair.md`).
//!
//! The store notes every block whose copy here does not read back (`Store::take_damaged`):
//! a client read, a write merging a partial block, a rollback, a snapshot transfer. At the
//! end of each step the core hands the notes on: a member that does not lead the PG reports
//! the block to the leader (`RepairStep::Report`); the leader repairs it.
//!
//! The leader's repair of one block:
//!
//! 1. A source: every version of the block as a good replica holds it, with that replica's
//!    applied index `A`. Its own copy first; if that is bad too, each other member in turn
//!    (`Fetch` → `Data` or `Unavailable`).
//! 2. A proposal: `ClientOp::Repair` carrying those versions, only if no entry of the
//!    leader's log after `A` touches the object (a write, a rollback, a copy-up, a reclaim or
//!    a snapshot operation of its image). Then the object on every replica, just before the
//!    repair entry, is what it was at `A` on the source, and the entry is right everywhere:
//!    a replica whose copy is good and the same keeps it, any other copy is replaced. An
//!    entry that touches the object in between sends the repair back to step 1 (bounded by
//!    [`REPAIR_ATTEMPTS_MAX`]).
//! 3. Applied on the leader: done. A leader change drops the repair; the next leader finds
//!    the block again when it reads it, and a member reports it again after
//!    [`REPORT_RETRY_MS`].
//!
//! A client read of a bad block on the leader is answered `Repairing` (retryable) while the
//! repair runs, and `Checksum` once every replica's copy turned out bad.
//!
//! A disk that fails reads ([`DISK_READ_ERRORS_MAX`] blocks) takes the shard down
//! (fail-stop), so that its PGs fail over to members with working disks.

use crate::core::{OpKind, ShardCore};
use crate::error::{Operation, ShardFailure};
use crate::io::{Effects, Micros, PeerSend};
use fastblock_pg::{ClientOp, ObjectRef};
use fastblock_store::{ChunkVersions, Disk, ObjectId};
use fastblock_types::units::BLOCK_SIZE_BYTES;
use fastblock_types::{OsdId, PgId};
use fastblock_wire::{RepairMsg, RepairStep, Request};
use raft::eraftpb::EntryType;
use raft::GetEntriesContext;
use std::collections::{BTreeMap, BTreeSet};

/// Distinct places of the data region the device failed to read before the shard stops
/// (since it started): the disk is failing, and the PGs are better served by the other
/// replicas. Checksum mismatches do not count (bit rot is repaired; a disk that cannot read
/// is replaced), nor does the same copy read again; a repaired copy lies elsewhere, so it
/// counts again if that place fails too.
pub const DISK_READ_ERRORS_MAX: usize = 16;
/// A member's `Fetch` unanswered for this long: the next member is asked.
pub const FETCH_TIMEOUT_MS: u64 = 2_000;
/// Sources read before the leader gives up on one block (each read can be spoiled by a
/// write to the object between the read and the proposal).
pub const REPAIR_ATTEMPTS_MAX: u32 = 32;
/// Repairs of one block within [`REPAIR_FAILED_RETRY_MS`] before the leader gives up on it:
/// its copy here goes bad again after every repair. Above [`DISK_READ_ERRORS_MAX`], so a disk
/// that fails every read stops the shard first.
pub const REPAIR_REPEATS_MAX: u32 = 24;
/// After a source read that an entry in the log spoils, the next waits this much longer
/// than the last (32 attempts span about 5 s).
pub const RETRY_STEP_MS: u64 = 10;
/// A block no replica could repair is not tried again for this long.
pub const REPAIR_FAILED_RETRY_MS: u64 = 30_000;
/// A member reports a bad block to its leader again after this long if it is still bad.
pub const REPORT_RETRY_MS: u64 = 5_000;
/// Fetches a member holds until it has applied what they ask (more are dropped; the
/// leader asks again).
pub const FETCHES_PENDING_MAX: usize = 256;
/// Repairs one shard leads at a time; more wait for their block to be found again.
pub const REPAIRS_ACTIVE_MAX: usize = 256;

/// One block of one object of one PG.
pub type BlockRef = (PgId, ObjectId, u32);

#[derive(Debug)]
enum State {
    /// Reading a source next (its own copy first), not before `at`.
    Source { at: Micros },
    /// Asked `from` for its versions.
    Fetching { from: OsdId, sent: Micros },
    /// Proposed as op `op`.
    Proposed,
}

#[derive(Debug)]
struct Active {
    term: u64,
    state: State,
    /// The member asked last (the next fetch goes to the one after it: a member that did not
    /// answer is asked again in its turn, as only `Unavailable` says its copy is bad).
    last_asked: Option<OsdId>,
    /// Members that answered `Unavailable` or timed out (the leader's own copy: itself), and
    /// the excluded ones.
    tried: BTreeSet<OsdId>,
    /// Replicas never to take the block from (a scrub found them in the minority).
    excluded: BTreeSet<OsdId>,
    attempts: u32,
}

/// Counters since the shard started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RepairCounts {
    pub started: u64,
    pub repaired: u64,
    pub failed: u64,
    /// Bad blocks this shard reported to another member leading their PG.
    pub reported: u64,
}

#[derive(Default)]
pub(crate) struct Repairs {
    active: BTreeMap<BlockRef, Active>,
    /// Blocks no replica could repair, and when that was found.
    failed: BTreeMap<BlockRef, Micros>,
    /// Bad copies reported to the leader (the block, and where the copy lies: a repaired
    /// copy that goes bad again is a new one), and when.
    reported: BTreeMap<(BlockRef, u64), Micros>,
    /// Distinct data blocks (where they lie) the device failed to read, up to the limit: a
    /// block repaired lies elsewhere, so a disk that fails every read reaches it even while
    /// one block is read again and again.
    unreadable: BTreeSet<u64>,
    /// Repairs applied per block lately, and when the first of them was: a copy that goes
    /// bad again after every repair is given up on.
    repeats: BTreeMap<BlockRef, (u32, Micros)>,
    /// Fetches from leaders waiting until this replica has applied what they ask, and when
    /// they came.
    fetches: Vec<(RepairMsg, Micros)>,
    counts: RepairCounts,
}

fn block_offset(block: u32) -> u64 {
    u64::from(block) * BLOCK_SIZE_BYTES
}

/// The status of a read the store failed with `e`, an error not about one bad block: a
/// fatal one stops the shard right after (the caller fails it), so the client is sent to the
/// PG's other replicas with the retryable `NotReady`, as every request to a failed shard is;
/// any other is the request's own fault.
pub(crate) fn read_error_status(e: &fastblock_store::Error) -> fastblock_wire::Status {
    if e.is_fatal() {
        fastblock_wire::Status::NotReady
    } else {
        fastblock_wire::Status::InvalidArgument
    }
}

impl<D: Disk + 'static> ShardCore<D> {
    pub fn repair_counts(&self) -> RepairCounts {
        self.repairs.counts
    }

    /// The status a read answers when it met the bad block `e` is about: `Repairing` if
    /// this replica leads its PG and a repair may still succeed; else `IoError` for a block
    /// the device failed to read, `Checksum` for one whose data does not match.
    pub(crate) fn bad_block_status(&self, e: &fastblock_store::Error) -> fastblock_wire::Status {
        let Some((pg, object, block)) = e.bad_block() else {
            return fastblock_wire::Status::IoError;
        };
        let key = (
            pg,
            object,
            u32::try_from(block).expect("block indexes fit u32"),
        );
        let leads = self.pgs.get(&pg).is_some_and(|h| h.replica.is_leader());
        if leads && !self.repairs.failed.contains_key(&key) {
            fastblock_wire::Status::Repairing
        } else if matches!(e, fastblock_store::Error::BlockUnreadable { .. }) {
            fastblock_wire::Status::IoError
        } else {
            fastblock_wire::Status::Checksum
        }
    }

    /// Whether no replica could repair `block` lately (its reads answer an error meanwhile).
    pub(crate) fn repair_failed_lately(&self, block: BlockRef) -> bool {
        self.repairs.failed.contains_key(&block)
    }

    /// Hands the store's new bad blocks on, and moves every repair this shard leads a step
    /// on. Runs at the end of every step. Returns whether it proposed anything (the caller
    /// then runs the rounds that log it).
    pub(crate) fn drive_repairs(&mut self, eff: &mut Effects) -> bool {
        if self.failed.is_some() {
            return false;
        }
        let damaged = self.store.borrow_mut().take_damaged();
        for d in damaged.iter().filter(|d| d.unreadable) {
            if self.repairs.unreadable.len() < DISK_READ_ERRORS_MAX {
                self.repairs.unreadable.insert(d.physical_block);
            }
        }
        let unreadable = self.repairs.unreadable.len();
        if unreadable >= DISK_READ_ERRORS_MAX {
            let e = fastblock_store::Error::Io {
                op: "data read",
                offset_bytes: 0,
                source: std::io::Error::other(format!(
                    "{unreadable} data blocks failed to read (limit {DISK_READ_ERRORS_MAX}): the disk is failing"
                )),
            };
            tracing::error!("{e}; stopping the shard so that its PGs fail over");
            self.fail(ShardFailure::store(Operation::Read, None, e), eff);
            return false;
        }
        let now = self.now;
        self.repairs
            .failed
            .retain(|_, at| now.as_millis() < at.as_millis() + REPAIR_FAILED_RETRY_MS);
        self.repairs
            .reported
            .retain(|_, at| now.as_millis() < at.as_millis() + REPORT_RETRY_MS);
        self.repairs
            .repeats
            .retain(|_, (_, first)| now.as_millis() < first.as_millis() + REPAIR_FAILED_RETRY_MS);
        for d in damaged {
            let key = (d.pg, d.object, d.block);
            // Met again (a read retried, a repair's source read): already handled.
            if self.repairs.active.contains_key(&key)
                || self.repairs.failed.contains_key(&key)
                || self.repairs.reported.contains_key(&(key, d.physical_block))
            {
                continue;
            }
            tracing::warn!(pg = %d.pg, image = %d.object.image, object = d.object.index, block = d.block, unreadable = d.unreadable, "bad block copy found");
            self.on_bad_block(key, d.physical_block, eff);
        }
        self.answer_fetches(eff);
        if self.repairs.active.is_empty() {
            return false;
        }
        let keys: Vec<BlockRef> = self.repairs.active.keys().copied().collect();
        let mut proposed = false;
        for key in keys {
            proposed |= self.advance_repair(key, eff);
        }
        proposed
    }

    /// A bad copy of `block` found here: repaired if this replica leads its PG, else
    /// reported to the leader.
    fn on_bad_block(&mut self, block: BlockRef, physical_block: u64, eff: &mut Effects) {
        let Some(h) = self.pgs.get(&block.0) else {
            return;
        };
        if h.replica.is_leader() {
            self.start_repair(block);
            return;
        }
        let Some(leader) = h.replica.leader() else {
            return;
        };
        if self.repairs.reported.contains_key(&(block, physical_block)) {
            return;
        }
        self.repairs
            .reported
            .insert((block, physical_block), self.now);
        self.repairs.counts.reported += 1;
        eff.peers.push(self.repair_msg(
            leader,
            block,
            RepairStep::Report,
            0,
            0,
            Default::default(),
        ));
    }

    fn start_repair(&mut self, block: BlockRef) {
        self.start_repair_excluding(block, &BTreeSet::new());
    }

    /// Starts repairing `block` with a source other than `excluded` (the replicas a scrub
    /// found in the minority), unless it is being repaired or failed lately.
    pub(crate) fn start_repair_excluding(&mut self, block: BlockRef, excluded: &BTreeSet<OsdId>) {
        if self.repairs.active.contains_key(&block)
            || self.repairs.failed.contains_key(&block)
            || self.repairs.active.len() >= REPAIRS_ACTIVE_MAX
        {
            return;
        }
        if self
            .repairs
            .repeats
            .get(&block)
            .is_some_and(|(n, _)| *n >= REPAIR_REPEATS_MAX)
        {
            tracing::error!(pg = %block.0, image = %block.1.image, object = block.1.index, block = block.2, repairs = REPAIR_REPEATS_MAX, "bad block not repaired: its copy here goes bad again after every repair");
            self.repairs.repeats.remove(&block);
            self.repairs.failed.insert(block, self.now);
            self.repairs.counts.failed += 1;
            return;
        }
        let Some(h) = self.pgs.get(&block.0) else {
            return;
        };
        tracing::info!(pg = %block.0, image = %block.1.image, object = block.1.index, block = block.2, "repairing a bad block");
        self.repairs.counts.started += 1;
        self.repairs.active.insert(
            block,
            Active {
                term: h.replica.term().0,
                state: State::Source { at: Micros(0) },
                last_asked: None,
                tried: excluded.clone(),
                excluded: excluded.clone(),
                attempts: 0,
            },
        );
        self.scrub_counts_repair(block);
    }

    fn repair_msg(
        &self,
        to: OsdId,
        (pg, object, block): BlockRef,
        step: RepairStep,
        applied: u64,
        term: u64,
        data: bytes::Bytes,
    ) -> PeerSend {
        PeerSend {
            to,
            pg,
            req: Request::Repair(RepairMsg {
                from: self.cfg.osd,
                to,
                pg,
                step,
                image: object.image,
                object_index: object.index,
                block,
                applied,
                term,
                data,
            }),
        }
    }

    /// Moves one repair on; returns whether it proposed.
    fn advance_repair(&mut self, key: BlockRef, eff: &mut Effects) -> bool {
        let pg = key.0;
        let still_leads = self.pgs.get(&pg).and_then(|h| {
            let a = self.repairs.active.get(&key)?;
            (h.replica.is_leader() && h.replica.term().0 == a.term).then_some(())
        });
        if still_leads.is_none() {
            // Leadership moved: the next leader finds the block again.
            self.repairs.active.remove(&key);
            self.scrub_repair_finished(key, false);
            return false;
        }
        let a = self.repairs.active.get_mut(&key).expect("checked above");
        match a.state {
            State::Proposed => false,
            State::Fetching { from, sent } => {
                if self.now.as_millis() >= sent.as_millis() + FETCH_TIMEOUT_MS {
                    // No answer is not a bad copy: the member is asked again in its turn.
                    a.last_asked = Some(from);
                    a.state = State::Source { at: Micros(0) };
                    self.next_source(key, eff)
                } else {
                    false
                }
            }
            State::Source { at } if self.now >= at => self.next_source(key, eff),
            State::Source { .. } => false,
        }
    }

    /// Reads the next source of `key`: this replica's own copy, else asks the next member.
    fn next_source(&mut self, key: BlockRef, eff: &mut Effects) -> bool {
        let pg = key.0;
        let me = self.cfg.osd;
        let a = self.repairs.active.get_mut(&key).expect("active");
        a.attempts += 1;
        if a.attempts > REPAIR_ATTEMPTS_MAX {
            return self.repair_failed(
                key,
                "too many attempts (the object is written to without pause)",
            );
        }
        if !a.tried.contains(&me) {
            match self.local_versions(key) {
                Some((chunk, applied)) => return self.propose_repair(key, chunk, applied),
                None => {
                    self.repairs
                        .active
                        .get_mut(&key)
                        .expect("active")
                        .tried
                        .insert(me);
                }
            }
        }
        let voters = self
            .pgs
            .get(&pg)
            .map(|h| h.replica.voters())
            .unwrap_or_default();
        // The member answers once it has applied everything this leader logged so far, so
        // that its versions are not older than what the log holds for the block.
        let last = self
            .pgs
            .get(&pg)
            .map_or(0, |h| h.replica.raw_node().raft.raft_log.last_index());
        let a = self.repairs.active.get_mut(&key).expect("active");
        let candidates: Vec<OsdId> = voters
            .into_iter()
            .filter(|o| !a.tried.contains(o))
            .collect();
        // The one after the member asked last, in turn.
        let from = match a.last_asked {
            Some(last) => candidates
                .iter()
                .find(|o| **o > last)
                .or(candidates.first())
                .copied(),
            None => candidates.first().copied(),
        };
        let Some(from) = from else {
            return self.repair_failed(key, "no replica holds a good copy");
        };
        a.state = State::Fetching {
            from,
            sent: self.now,
        };
        let term = a.term;
        eff.peers.push(self.repair_msg(
            from,
            key,
            RepairStep::Fetch,
            last,
            term,
            Default::default(),
        ));
        false
    }

    fn repair_failed(&mut self, key: BlockRef, why: &str) -> bool {
        tracing::error!(pg = %key.0, image = %key.1.image, object = key.1.index, block = key.2, "bad block not repaired: {why}");
        self.repairs.active.remove(&key);
        self.repairs.failed.insert(key, self.now);
        self.repairs.counts.failed += 1;
        self.scrub_repair_finished(key, false);
        false
    }

    /// Every version of the block as this replica holds it, with its applied index; `None`
    /// if a version of it is bad here.
    fn local_versions(&mut self, (pg, object, block): BlockRef) -> Option<(ChunkVersions, u64)> {
        let mut store = self.store.borrow_mut();
        // A bad copy read here is noted again; handing the note on finds the repair under
        // way (or reports it, rate-limited).
        let chunk = store
            .transfer_read(pg, object, block_offset(block), BLOCK_SIZE_BYTES)
            .ok()?;
        if chunk.versions.iter().any(|v| v.damaged) {
            return None;
        }
        Some((chunk, store.applied_index(pg)))
    }

    /// Proposes the repair of `key` from `chunk`, read at applied index `applied`, unless an
    /// entry after `applied` touches the object (then the next source read tries again).
    fn propose_repair(&mut self, key: BlockRef, chunk: ChunkVersions, applied: u64) -> bool {
        let (pg, object, block) = key;
        let at = block_offset(block);
        if self.log_touches(pg, object, at..at + BLOCK_SIZE_BYTES, applied) {
            // Read again once the entries in between are applied: a little later each time.
            let a = self.repairs.active.get_mut(&key).expect("active");
            let wait_ms = RETRY_STEP_MS * u64::from(a.attempts);
            a.state = State::Source {
                at: Micros(self.now.0 + wait_ms * 1000),
            };
            a.tried = a.excluded.clone();
            return false;
        }
        let versions: bytes::Bytes = chunk.encode().into();
        let batch_bytes_max = self.store.borrow().superblock().batch_bytes_max;
        if !crate::wal_fit::mutation_fits(versions.len() as u64, batch_bytes_max) {
            return self.repair_failed(
                key,
                "its versions do not fit one WAL batch (too many snapshots keep it)",
            );
        }
        let op = ClientOp::Repair {
            object: ObjectRef {
                image: object.image,
                index: object.index,
            },
            offset: u32::try_from(block_offset(block)).expect("objects are at most 64 MiB"),
            versions,
        };
        self.repairs.active.get_mut(&key).expect("active").state = State::Proposed;
        self.propose_internal(pg, OpKind::Repair { block: key }, &op);
        true
    }

    /// Whether an entry of `pg`'s log after `after` touches the bytes `range` of `object`
    /// (or might: an entry that cannot be read or decoded counts as touching it). A write,
    /// discard, copy-up or repair touches the 4 KiB blocks its range covers; a rollback the
    /// whole object; a reclaim or snapshot operation every object of its image.
    pub(crate) fn log_touches(
        &self,
        pg: PgId,
        object: ObjectId,
        range: std::ops::Range<u64>,
        after: u64,
    ) -> bool {
        let Some(h) = self.pgs.get(&pg) else {
            return true;
        };
        let log = &h.replica.raw_node().raft.raft_log;
        let last = log.last_index();
        if after >= last {
            return false;
        }
        let Ok(entries) = log.slice(after + 1, last + 1, None, GetEntriesContext::empty(false))
        else {
            return true;
        };
        let bs = BLOCK_SIZE_BYTES;
        let blocks = |lo: u64, len: u64| {
            let (a, b) = (lo / bs * bs, (lo + len).div_ceil(bs) * bs);
            a < range.end && range.start < b.max(a + 1)
        };
        entries.iter().any(|e| {
            if e.get_entry_type() != EntryType::EntryNormal
                || e.data.is_empty() && e.context.is_empty()
            {
                return false;
            }
            let Ok(op) = ClientOp::decode(&e.context, &e.data) else {
                return true;
            };
            let same = |o: &ObjectRef| o.image == object.image && o.index == object.index;
            match &op {
                ClientOp::Write {
                    object: o,
                    offset,
                    data,
                } => same(o) && blocks(u64::from(*offset), data.len() as u64),
                ClientOp::CopyUp {
                    object: o,
                    offset,
                    data,
                    ..
                } => same(o) && blocks(u64::from(*offset), data.len() as u64),
                ClientOp::Discard {
                    object: o,
                    offset,
                    length,
                }
                | ClientOp::WriteZeroes {
                    object: o,
                    offset,
                    length,
                } => same(o) && blocks(u64::from(*offset), u64::from(*length)),
                ClientOp::Repair {
                    object: o,
                    offset,
                    versions,
                } => {
                    // The repaired range's length is in the chunk's header (bytes 8..16).
                    let len = versions.get(8..16).map_or(u64::MAX / 2, |b| {
                        u64::from_le_bytes(b.try_into().expect("8 bytes"))
                    });
                    same(o) && blocks(u64::from(*offset), len.min(u64::MAX / 2))
                }
                ClientOp::Rollback { object: o, .. } | ClientOp::CopyUpDone { object: o } => {
                    same(o)
                }
                ClientOp::Reclaim { image, .. }
                | ClientOp::SnapMark { image, .. }
                | ClientOp::SnapTrim { image, .. } => *image == object.image,
            }
        })
    }

    /// Answers the leaders' fetches this replica has applied far enough for (`applied` of a
    /// fetch: the leader's last index when it asked); drops those the leader gave up on.
    fn answer_fetches(&mut self, eff: &mut Effects) {
        if self.repairs.fetches.is_empty() {
            return;
        }
        let now = self.now;
        let pending = std::mem::take(&mut self.repairs.fetches);
        for (m, came) in pending {
            if now.as_millis() >= came.as_millis() + FETCH_TIMEOUT_MS {
                continue;
            }
            let key = (
                m.pg,
                ObjectId {
                    image: m.image,
                    index: m.object_index,
                },
                m.block,
            );
            let applied = self.store.borrow().applied_index(m.pg);
            if self.pgs.contains_key(&m.pg) && applied < m.applied {
                self.repairs.fetches.push((m, came));
                continue;
            }
            let reply = match self
                .pgs
                .contains_key(&m.pg)
                .then(|| self.local_versions(key))
                .flatten()
            {
                Some((chunk, applied)) => self.repair_msg(
                    m.from,
                    key,
                    RepairStep::Data,
                    applied,
                    m.term,
                    chunk.encode().into(),
                ),
                None => self.repair_msg(
                    m.from,
                    key,
                    RepairStep::Unavailable,
                    0,
                    m.term,
                    Default::default(),
                ),
            };
            eff.peers.push(reply);
        }
    }

    /// The repair proposed for `key` ended: applied (done) or not (dropped with the
    /// leadership).
    pub(crate) fn repair_finished(&mut self, key: BlockRef, applied: bool) {
        if !applied {
            // Refused (the PG busy) or dropped with a leadership: read a source again a
            // little later; `advance_repair` drops it if this shard no longer leads.
            if let Some(a) = self.repairs.active.get_mut(&key) {
                a.state = State::Source {
                    at: Micros(self.now.0 + RETRY_STEP_MS * 1000),
                };
                a.tried = a.excluded.clone();
                return;
            }
        }
        self.repairs.active.remove(&key);
        self.scrub_repair_finished(key, applied);
        if applied {
            let now = self.now;
            let r = self.repairs.repeats.entry(key).or_insert((0, now));
            r.0 += 1;
            self.repairs.counts.repaired += 1;
            tracing::info!(pg = %key.0, image = %key.1.image, object = key.1.index, block = key.2, "bad block repaired");
        }
    }

    /// A repair message from a member.
    pub(crate) fn on_repair_msg(&mut self, m: RepairMsg, eff: &mut Effects) {
        if m.to != self.cfg.osd {
            return;
        }
        let object = ObjectId {
            image: m.image,
            index: m.object_index,
        };
        let key = (m.pg, object, m.block);
        match m.step {
            RepairStep::Report => {
                if self.pgs.get(&m.pg).is_some_and(|h| h.replica.is_leader()) {
                    self.start_repair(key);
                }
            }
            RepairStep::Fetch => {
                if self.repairs.fetches.len() < FETCHES_PENDING_MAX {
                    self.repairs.fetches.push((m, self.now));
                }
                self.answer_fetches(eff);
            }
            RepairStep::Data | RepairStep::Unavailable => {
                let Some(a) = self.repairs.active.get_mut(&key) else {
                    return;
                };
                let asked = matches!(a.state, State::Fetching { from, .. } if from == m.from);
                if !asked || a.term != m.term {
                    return;
                }
                let chunk = (m.step == RepairStep::Data)
                    .then(|| ChunkVersions::decode(&m.data).ok())
                    .flatten()
                    .filter(|c| {
                        c.len_bytes == BLOCK_SIZE_BYTES
                            && c.versions.iter().all(|v| v.block == m.block && !v.damaged)
                    });
                match chunk {
                    Some(chunk) => {
                        a.state = State::Source { at: Micros(0) };
                        // Logged by the rounds that follow in this step.
                        self.propose_repair(key, chunk, m.applied);
                    }
                    None => {
                        a.tried.insert(m.from);
                        a.state = State::Source { at: Micros(0) };
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::read_error_status;
    use fastblock_wire::Status;

    /// Goal: a read that finds the store engine stopped (an earlier I/O error, or one of its
    /// own) sends its client to the other replicas instead of handing it an I/O error.
    #[test]
    fn a_read_of_a_stopped_store_is_retried_elsewhere() {
        let stopped = fastblock_store::Error::PreviousIo;
        assert!(stopped.is_fatal());
        assert_eq!(read_error_status(&stopped), Status::NotReady);
        assert!(read_error_status(&stopped).is_retryable());
        let io = fastblock_store::Error::Io {
            op: "read",
            offset_bytes: 0,
            source: std::io::Error::from_raw_os_error(5),
        };
        assert_eq!(read_error_status(&io), Status::NotReady);
    }
}

//! Stamped blocks and the model of the image that checks every read.
//!
//! Every 4 KiB block a client writes says which image, which byte offset and which write it
//! belongs to, with a crc32c over the block (the same idea as block_bench's stamps in
//! `crates/bench/src/stamp.rs`, kept separate because the simulator must not depend on a
//! frontend crate). A read can therefore name exactly the write it saw.
//!
//! The model keeps every write with its interval: `start` (the client issued it), `end` (the
//! client got the acknowledgement, or gave up: then the outcome is unknown) and `done_at`
//! (the earliest time the write is known to have taken effect: its acknowledgement, or the
//! end of a read that saw it). A read of a block over `[start, end]` may return write `w` iff
//! - `w` started before the read ended, and
//! - no write `v` of that block is known to have taken effect before the read started while
//!   `w` had already ended when `v` started (then `v` is ordered after `w` and overwrote it);
//!
//! and it may return zeros iff no write of the block is known to have taken effect before the
//! read started, or a zeroing `z` of the block (the deletion of a shrunk tail) started before
//! the read ended and no write known to have taken effect before the read started began
//! after `z` ended. A write whose outcome is unknown ends when the client gives up: anything
//! the client (or anyone) issues afterwards lands in a later Raft term or later in the same
//! leader's log, so it is ordered after that write if that write lands at all.
//!
//! **Snapshots.** A snapshot has an interval too: `started` (the monitor recorded it
//! `creating`) and `created` (the monitor's record shows it `created`: every PG confirmed its
//! mark); an aborted one is never read. Each PG's part of a snapshot is that PG's state when
//! it applied the mark, which lies within the interval, and a block lives in one PG. So a
//! snapshot read of a block may return what a head read of that block over
//! `[started, created]` may return by the rules above:
//! - write `w` iff `w` started before the snapshot was created (a write issued after that
//!   is never in it), and no write or zeroing `v` of the block known to have taken effect
//!   before the snapshot started began after `w` ended;
//! - zeros iff no write of the block is known to have taken effect before the snapshot
//!   started, or a zeroing of it began before the snapshot was created and no write known to
//!   have taken effect before the snapshot started began after that zeroing ended;
//!
//! with one tightening, the snapshot's promise (`docs/design/snapshots.md`): for a client's
//! write (not a zeroing), "known to have taken effect before the snapshot started" becomes
//! "before it was created". A PG refuses writes to the image (`SnapInProgress`) from the moment
//! its leader proposes the mark until its map shows the snapshot created, and a new leader
//! holds writes until it applied the log it inherited, so a write that took effect in a PG
//! before the snapshot was created took effect before that PG's mark: it, or a write ordered
//! after it, is in the snapshot. Reclaims are not frozen: a PG may delete its part of a cut
//! tail after its mark while another deleted its part before, so a zeroing counts only if it
//! is known to have taken effect before the snapshot started.
//!
//! "Known to have taken effect before" uses `done_at` as a head read does, whenever it was
//! learned: `done_at` is an upper bound on when a write took effect, so a bound learned after
//! the snapshot is as good as one learned before it. What a snapshot read sees teaches the
//! model as a head read ending at `created` does: the write it returns had taken effect by
//! then (`done_at` is at most `created`), and so had the zeroing its zeros prove. A write
//! whose outcome is unknown may be in the snapshot or not if it started before `created` and
//! nothing shows it landed before (a retry may land after the freeze); one given up before
//! the snapshot started is ordered before every write issued after it gave up, as for head
//! reads.
//!
//! In addition a snapshot never changes: every read of a block of a snapshot must return what
//! the first read of that block of that snapshot returned.

use std::collections::BTreeMap;
use std::fmt;

/// An instant of a run: virtual time, then the number of the event within it, so that two
/// things that happen in the same microsecond are still ordered (an acknowledgement handled
/// before a read is issued is known to the read).
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct At {
    pub us: u64,
    pub event: u64,
}

impl fmt::Debug for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}us#{}", self.us, self.event)
    }
}

pub const BLOCK_BYTES: usize = 4096;
const MAGIC: [u8; 8] = *b"FBSIMBK1";
const CRC_AT: usize = 32;
const FILL_AT: usize = 40;

// The fill is written in whole u64 words.
const _: () = assert!(FILL_AT % 8 == 0 && (BLOCK_BYTES - FILL_AT) % 8 == 0);

fn block_crc(block: &[u8]) -> u32 {
    let crc = crc32c::crc32c(&block[..CRC_AT]);
    let crc = crc32c::crc32c_append(crc, &[0u8; 4]);
    crc32c::crc32c_append(crc, &block[CRC_AT + 4..])
}

fn le_u64(b: &[u8]) -> u64 {
    u64::from_le_bytes(b[..8].try_into().expect("8 bytes"))
}

/// Fills `block` with the stamp of write `write` at byte `offset` of `image`.
pub fn stamp_block(block: &mut [u8], image: u64, offset: u64, write: u64) {
    assert_eq!(block.len(), BLOCK_BYTES);
    block[..8].copy_from_slice(&MAGIC);
    block[8..16].copy_from_slice(&image.to_le_bytes());
    block[16..24].copy_from_slice(&offset.to_le_bytes());
    block[24..32].copy_from_slice(&write.to_le_bytes());
    block[CRC_AT..FILL_AT].fill(0);
    let mut rng = fastblock_types::rng::SplitMix64::new(
        image ^ offset.rotate_left(21) ^ write.rotate_left(42),
    );
    for chunk in block[FILL_AT..].chunks_exact_mut(8) {
        chunk.copy_from_slice(&rng.next_u64().to_le_bytes());
    }
    let crc = block_crc(block);
    block[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
}

/// What a block read back holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    Zeros,
    Write {
        image: u64,
        offset: u64,
        write: u64,
    },
    /// Neither zeros nor an intact stamp: damaged or foreign data.
    Garbage(String),
}

pub fn decode_block(block: &[u8]) -> Found {
    assert_eq!(block.len(), BLOCK_BYTES);
    if block.iter().all(|b| *b == 0) {
        return Found::Zeros;
    }
    if block[..8] != MAGIC {
        return Found::Garbage("no stamp magic".into());
    }
    let stored = u32::from_le_bytes(block[CRC_AT..CRC_AT + 4].try_into().expect("4 bytes"));
    let computed = block_crc(block);
    if stored != computed {
        return Found::Garbage(format!(
            "stamp crc32c stored {stored:#010x}, computed {computed:#010x}"
        ));
    }
    Found::Write {
        image: le_u64(&block[8..]),
        offset: le_u64(&block[16..]),
        write: le_u64(&block[24..]),
    }
}

#[derive(Clone, Debug)]
pub struct WriteRec {
    pub start: At,
    /// Acknowledged or given up (outcome unknown); `None` while in flight.
    pub end: Option<At>,
    pub acked: bool,
    /// Earliest time the write is known to have taken effect.
    pub done_at: Option<At>,
    /// First block (image byte offset / 4 KiB) and block count.
    pub first_block: u64,
    pub blocks: u64,
    /// A zeroing (the deletion of a shrunk tail), not a client's stamped write.
    pub zeros: bool,
}

/// A snapshot of the image: its creation interval and what its reads returned.
#[derive(Clone, Debug)]
pub struct SnapRec {
    /// The monitor recorded it `creating`.
    pub started: At,
    /// The monitor's record shows it `created` (every PG confirmed its mark).
    pub created: Option<At>,
    /// Its creation timed out and the monitor aborted it: it is never read.
    pub aborted: Option<At>,
    /// Block → what the first read of it in this snapshot returned.
    seen: BTreeMap<u64, Found>,
}

/// Counters the probes read.
#[derive(Clone, Copy, Debug, Default)]
pub struct ModelStats {
    pub reads_checked: u64,
    /// Blocks of snapshot reads checked.
    pub snap_reads_checked: u64,
    /// Blocks of snapshot reads checked whose block a client's write was known to have been
    /// written to while the snapshot was being created (so the promise decided).
    pub snap_reads_promised: u64,
    /// A read returned a write whose client had given up on it (outcome unknown → landed).
    pub unknown_write_seen: u64,
    /// A read returned a write still in flight at the client.
    pub inflight_write_seen: u64,
}

#[derive(Clone, Debug, Default)]
pub struct ImageModel {
    pub image: u64,
    /// Write ids are 1-based indexes into this.
    writes: Vec<WriteRec>,
    /// Block number → ids of the writes that cover it, in start order.
    blocks: BTreeMap<u64, Vec<u64>>,
    /// Snapshot id → its record.
    snaps: BTreeMap<u64, SnapRec>,
    pub stats: ModelStats,
}

impl ImageModel {
    pub fn new(image: u64) -> Self {
        ImageModel {
            image,
            ..Default::default()
        }
    }

    pub fn write(&self, id: u64) -> &WriteRec {
        &self.writes[(id - 1) as usize]
    }

    fn write_mut(&mut self, id: u64) -> &mut WriteRec {
        &mut self.writes[(id - 1) as usize]
    }

    /// A client issues a write of `blocks` blocks from block `first_block`; returns its id.
    pub fn begin_write(&mut self, now: At, first_block: u64, blocks: u64) -> u64 {
        self.begin(now, first_block, blocks, false)
    }

    /// The monitor cut the image's tail: its blocks are being deleted (acknowledged once
    /// every PG confirmed); returns the zeroing's id.
    pub fn begin_zeroing(&mut self, now: At, first_block: u64, blocks: u64) -> u64 {
        self.begin(now, first_block, blocks, true)
    }

    fn begin(&mut self, now: At, first_block: u64, blocks: u64, zeros: bool) -> u64 {
        self.writes.push(WriteRec {
            start: now,
            end: None,
            acked: false,
            done_at: None,
            first_block,
            blocks,
            zeros,
        });
        let id = self.writes.len() as u64;
        for b in first_block..first_block + blocks {
            self.blocks.entry(b).or_default().push(id);
        }
        id
    }

    pub fn ack(&mut self, id: u64, now: At) {
        let w = self.write_mut(id);
        assert!(w.end.is_none(), "write {id} ended twice");
        w.end = Some(now);
        w.acked = true;
        w.done_at = Some(w.done_at.map_or(now, |d| d.min(now)));
    }

    pub fn give_up(&mut self, id: u64, now: At) {
        let w = self.write_mut(id);
        assert!(w.end.is_none(), "write {id} ended twice");
        w.end = Some(now);
    }

    /// The monitor recorded snapshot `snap` `creating`.
    pub fn begin_snap(&mut self, snap: u64, now: At) {
        let rec = SnapRec {
            started: now,
            created: None,
            aborted: None,
            seen: BTreeMap::new(),
        };
        let before = self.snaps.insert(snap, rec);
        assert!(before.is_none(), "snapshot {snap} begun twice");
    }

    /// The monitor's record of snapshot `snap` shows it `created`.
    pub fn snap_created(&mut self, snap: u64, now: At) {
        let rec = self.snaps.get_mut(&snap).expect("a snapshot begun");
        assert!(
            rec.created.is_none() && rec.aborted.is_none(),
            "snapshot {snap} ended twice: {rec:?}"
        );
        rec.created = Some(now);
    }

    /// The monitor aborted snapshot `snap` (its creation timed out).
    pub fn snap_aborted(&mut self, snap: u64, now: At) {
        let rec = self.snaps.get_mut(&snap).expect("a snapshot begun");
        assert!(
            rec.created.is_none() && rec.aborted.is_none(),
            "snapshot {snap} ended twice: {rec:?}"
        );
        rec.aborted = Some(now);
    }

    pub fn snap(&self, snap: u64) -> Option<&SnapRec> {
        self.snaps.get(&snap)
    }

    /// Checks one block of a read of snapshot `snap` that found `found` (see the module doc),
    /// and records what it learned.
    pub fn check_snap_read(&mut self, snap: u64, block: u64, found: &Found) -> Result<(), String> {
        self.stats.snap_reads_checked += 1;
        let Some(rec) = self.snaps.get(&snap) else {
            return Err(format!(
                "block {block}: read of snapshot {snap}, never taken"
            ));
        };
        let (started, Some(created), None) = (rec.started, rec.created, rec.aborted) else {
            return Err(format!(
                "block {block}: read of snapshot {snap}, which was not created: {rec:?}"
            ));
        };
        if let Some(first) = rec.seen.get(&block) {
            if first != found {
                return Err(format!(
                    "block {block} of snapshot {snap} read {found:?}, but an earlier read of it \
                     found {first:?}: a snapshot changed"
                ));
            }
        }
        let during = self.blocks.get(&block).is_some_and(|ids| {
            ids.iter().any(|id| {
                let w = self.write(*id);
                !w.zeros && w.done_at.is_some_and(|d| started < d && d < created)
            })
        });
        if during {
            self.stats.snap_reads_promised += 1;
        }
        self.check_value(block, (started, created), created, found)
            .map_err(|m| {
                format!("snapshot {snap} (created over [{started:?}, {created:?}]): {m}")
            })?;
        let rec = self.snaps.get_mut(&snap).expect("looked up above");
        rec.seen.entry(block).or_insert_with(|| found.clone());
        Ok(())
    }

    /// Checks one block of a read over `[start, end]` that found `found`, and records what it
    /// learned. The error says why the value is impossible.
    pub fn check_read(
        &mut self,
        block: u64,
        start: At,
        end: At,
        found: &Found,
    ) -> Result<(), String> {
        self.stats.reads_checked += 1;
        self.check_value(block, (start, end), start, found)
    }

    /// The rules of the module doc for a value `found` in `block` over `[start, end]`; a
    /// client's write counts as known to have taken effect before the read if it had by
    /// `writes_by` (a head read: `start`; a snapshot read: `created`, the promise), a zeroing
    /// if it had by `start`.
    fn check_value(
        &mut self,
        block: u64,
        (start, end): (At, At),
        writes_by: At,
        found: &Found,
    ) -> Result<(), String> {
        let ids = self.blocks.get(&block).cloned().unwrap_or_default();
        let by = |w: &WriteRec| if w.zeros { start } else { writes_by };
        let known_before = |w: &WriteRec| w.done_at.is_some_and(|d| d < by(w));
        match found {
            Found::Garbage(why) => Err(format!("block {block}: {why}")),
            Found::Zeros => {
                // Zeros come from the start (nothing known landed before the read) or from a
                // zeroing that no write known to have landed follows.
                let overwritten = |z: Option<&WriteRec>| {
                    ids.iter().map(|id| (*id, self.write(*id))).find(|(_, v)| {
                        !v.zeros
                            && known_before(v)
                            && z.is_none_or(|z| z.end.is_some_and(|e| e < v.start))
                    })
                };
                let zeroing = ids.iter().copied().find(|id| {
                    let z = self.write(*id);
                    z.zeros && z.start < end && overwritten(Some(z)).is_none()
                });
                match (zeroing, overwritten(None)) {
                    // Zeros from the start explain the read: it says nothing of a zeroing.
                    (_, None) => Ok(()),
                    (Some(z), Some(_)) => {
                        let zm = self.write_mut(z);
                        zm.done_at = Some(zm.done_at.map_or(end, |d| d.min(end)));
                        Ok(())
                    }
                    (None, Some((id, w))) => Err(format!(
                        "block {block}: read over [{start:?}, {end:?}] found zeros, but write \
                         {id} {w:?} had taken effect before {:?}",
                        by(w)
                    )),
                }
            }
            Found::Write {
                image,
                offset,
                write,
            } => {
                let expect_offset = block * BLOCK_BYTES as u64;
                if *image != self.image || *offset != expect_offset {
                    return Err(format!(
                        "block {block}: found a misplaced block of image {image} offset {offset} \
                         (write {write})"
                    ));
                }
                if !ids.contains(write) || self.write(*write).zeros {
                    return Err(format!(
                        "block {block}: found write {write}, which never covered this block"
                    ));
                }
                let w = self.write(*write).clone();
                if w.start >= end {
                    return Err(format!(
                        "block {block}: read over [{start:?}, {end:?}] found write {write} {w:?} \
                         issued after the read ended"
                    ));
                }
                if let Some(w_end) = w.end {
                    for id in &ids {
                        let v = self.write(*id);
                        if *id != *write && w_end < v.start && known_before(v) {
                            return Err(format!(
                                "block {block}: stale read over [{start:?}, {end:?}]: found write \
                                 {write} {w:?}, but write {id} {v:?} overwrote it before {:?}",
                                by(v)
                            ));
                        }
                    }
                }
                if w.end.is_none() {
                    self.stats.inflight_write_seen += 1;
                } else if !w.acked && w.done_at.is_none() {
                    self.stats.unknown_write_seen += 1;
                }
                let wm = self.write_mut(*write);
                wm.done_at = Some(wm.done_at.map_or(end, |d| d.min(end)));
                Ok(())
            }
        }
    }

    /// Blocks that were ever written.
    pub fn written_blocks(&self) -> impl Iterator<Item = u64> + '_ {
        self.blocks.keys().copied()
    }

    pub fn write_count(&self) -> u64 {
        self.writes.len() as u64
    }

    pub fn acked_count(&self) -> u64 {
        self.writes.iter().filter(|w| w.acked && !w.zeros).count() as u64
    }

    pub fn unknown_count(&self) -> u64 {
        self.writes
            .iter()
            .filter(|w| w.end.is_some() && !w.acked && !w.zeros)
            .count() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(us: u64) -> At {
        At { us, event: 0 }
    }

    fn found(m: &ImageModel, block: u64, write: u64) -> Found {
        Found::Write {
            image: m.image,
            offset: block * BLOCK_BYTES as u64,
            write,
        }
    }

    #[test]
    fn stamps_round_trip_and_damage_is_seen() {
        let mut b = vec![0u8; BLOCK_BYTES];
        assert_eq!(decode_block(&b), Found::Zeros);
        stamp_block(&mut b, 7, 8192, 42);
        assert_eq!(
            decode_block(&b),
            Found::Write {
                image: 7,
                offset: 8192,
                write: 42
            }
        );
        b[100] ^= 1;
        assert!(matches!(decode_block(&b), Found::Garbage(_)));
    }

    /// Goal: the read rules of the module doc, one case each.
    #[test]
    fn reads_are_checked_against_intervals() {
        let mut m = ImageModel::new(1);
        let w1 = m.begin_write(t(10), 0, 1);
        assert!(m.check_read(0, t(5), t(6), &Found::Zeros).is_ok());
        // In flight: old or new value.
        assert!(m.check_read(0, t(11), t(12), &Found::Zeros).is_ok());
        m.ack(w1, t(20));
        assert!(
            m.check_read(0, t(25), t(26), &Found::Zeros).is_err(),
            "lost ack"
        );
        assert!(m.check_read(0, t(25), t(26), &found(&m, 0, w1)).is_ok());
        let w2 = m.begin_write(t(30), 0, 1);
        m.give_up(w2, t(40));
        // Unknown outcome: either value, until something later is known to have landed.
        assert!(m.check_read(0, t(50), t(51), &found(&m, 0, w1)).is_ok());
        assert!(m.check_read(0, t(52), t(53), &found(&m, 0, w2)).is_ok());
        // w2 was seen at 53: w1 can no longer be read afterwards (w1 ended before w2 began).
        assert!(
            m.check_read(0, t(60), t(61), &found(&m, 0, w1)).is_err(),
            "stale"
        );
        let w3 = m.begin_write(t(70), 0, 1);
        assert!(
            m.check_read(0, t(65), t(69), &found(&m, 0, w3)).is_err(),
            "future"
        );
        assert!(
            m.check_read(0, t(65), t(69), &found(&m, 1, w3)).is_err(),
            "misplaced"
        );
    }

    /// Goal: the zeroing rules of the module doc: zeros are allowed once a zeroing of the
    /// block started, until a write that began after it ended is known to have landed; the
    /// old write stays possible while the zeroing runs.
    #[test]
    fn a_zeroed_tail_reads_zeros_until_a_later_write_lands() {
        let mut m = ImageModel::new(1);
        let w1 = m.begin_write(t(10), 0, 1);
        m.ack(w1, t(20));
        assert!(m.check_read(0, t(25), t(26), &Found::Zeros).is_err());
        // Zeros of a block nobody wrote say nothing of a zeroing of it.
        let z0 = m.begin_zeroing(t(28), 5, 1);
        assert!(m.check_read(5, t(29), t(30), &Found::Zeros).is_ok());
        assert_eq!(m.write(z0).done_at, None);
        let z = m.begin_zeroing(t(30), 0, 1);
        // While the zeroing runs, either value.
        assert!(m.check_read(0, t(31), t(32), &found(&m, 0, w1)).is_ok());
        assert!(m.check_read(0, t(33), t(34), &Found::Zeros).is_ok());
        m.ack(z, t(40));
        // Zeros were seen at 34 and the zeroing began after w1 ended: w1 is stale now.
        assert!(m.check_read(0, t(45), t(46), &found(&m, 0, w1)).is_err());
        assert!(m.check_read(0, t(45), t(46), &Found::Zeros).is_ok());
        assert!(
            m.check_read(0, t(45), t(46), &found(&m, 0, z)).is_err(),
            "a zeroing has no stamp"
        );
        let w2 = m.begin_write(t(50), 0, 1);
        m.ack(w2, t(60));
        assert!(
            m.check_read(0, t(65), t(66), &Found::Zeros).is_err(),
            "w2 began after the zeroing ended"
        );
        assert!(m.check_read(0, t(65), t(66), &found(&m, 0, w2)).is_ok());
    }

    /// Goal: the snapshot rules of the module doc: a snapshot read is a head read over the
    /// creation interval, a write issued after the snapshot was created is never in it, what
    /// it sees teaches the model, and a block of a snapshot always reads the same. Method: one
    /// case per rule, each of which a wrong rule lets through (or refuses).
    #[test]
    fn snapshot_reads_are_head_reads_over_the_creation_interval_and_never_change() {
        let mut m = ImageModel::new(1);
        // Block 3: w6 acknowledged long before; a zeroing of it begins within the interval.
        let w6 = m.begin_write(t(5), 3, 1);
        m.ack(w6, t(8));
        // Block 0: w0 then w1, both acknowledged before the snapshot started.
        let w0 = m.begin_write(t(10), 0, 1);
        m.ack(w0, t(12));
        let w1 = m.begin_write(t(14), 0, 1);
        m.ack(w1, t(16));
        // Block 1: w2 acknowledged before, w3 in flight across the snapshot.
        let w2 = m.begin_write(t(10), 1, 1);
        m.ack(w2, t(12));
        // Block 2: w4 given up on (outcome unknown) after the snapshot was created.
        let w4 = m.begin_write(t(20), 2, 1);
        // Block 4: w7 acknowledged before the snapshot, w8 acknowledged while it was created.
        let w7 = m.begin_write(t(20), 4, 1);
        m.ack(w7, t(22));
        let w8 = m.begin_write(t(24), 4, 1);
        m.begin_snap(7, t(30));
        m.ack(w8, t(36));
        let z = m.begin_zeroing(t(33), 3, 1);
        let w3 = m.begin_write(t(35), 1, 1);
        assert!(
            m.check_snap_read(7, 0, &found(&m, 0, w1)).is_err(),
            "not created yet"
        );
        m.snap_created(7, t(40));
        // Issued after the snapshot was created: never in it, though still in flight.
        let w5 = m.begin_write(t(41), 0, 1);
        assert!(
            m.check_snap_read(7, 0, &found(&m, 0, w5)).is_err(),
            "a write issued after the snapshot was created"
        );
        assert!(
            m.check_snap_read(7, 0, &found(&m, 0, w0)).is_err(),
            "w1 overwrote w0 before the snapshot started"
        );
        assert!(
            m.check_snap_read(7, 0, &Found::Zeros).is_err(),
            "w1 had landed before the snapshot started"
        );
        assert!(m.check_snap_read(7, 0, &found(&m, 0, w1)).is_ok());
        // Later head writes change nothing in the snapshot.
        m.ack(w5, t(45));
        m.give_up(w4, t(50));
        assert!(m.check_snap_read(7, 0, &found(&m, 0, w1)).is_ok());
        // w3 was in flight over the interval: in the snapshot or not.
        assert!(m.clone().check_snap_read(7, 1, &found(&m, 1, w2)).is_ok());
        assert!(m.check_snap_read(7, 1, &found(&m, 1, w3)).is_ok());
        // Once a read found w3 there, it is what that block of the snapshot holds.
        assert!(
            m.check_snap_read(7, 1, &found(&m, 1, w2)).is_err(),
            "two reads of a snapshot block disagree"
        );
        // And w3 had taken effect by the time the snapshot was created: a head read after
        // that may not return w2, which ended before w3 began.
        assert_eq!(m.write(w3).done_at, Some(t(40)));
        assert!(m.check_read(1, t(60), t(61), &found(&m, 1, w2)).is_err());
        // An unknown outcome that began before the snapshot was created: either value.
        assert!(m.clone().check_snap_read(7, 2, &Found::Zeros).is_ok());
        assert!(m.check_snap_read(7, 2, &found(&m, 2, w4)).is_ok());
        // A zeroing that began within the interval: the old data, or zeros, which prove the
        // zeroing had taken effect by the time the snapshot was created.
        assert!(m.clone().check_snap_read(7, 3, &found(&m, 3, w6)).is_ok());
        assert!(m.check_snap_read(7, 3, &Found::Zeros).is_ok());
        assert_eq!(m.write(z).done_at, Some(t(40)));
        // The promise: a write acknowledged before the snapshot was created is in it.
        assert!(
            m.check_snap_read(7, 4, &found(&m, 4, w7)).is_err(),
            "w8, acknowledged before the snapshot was created, overwrote w7"
        );
        assert!(m.check_snap_read(7, 4, &found(&m, 4, w8)).is_ok());
        assert_eq!(m.stats.snap_reads_promised, 2);
        // An aborted snapshot is never read.
        m.begin_snap(8, t(70));
        m.snap_aborted(8, t(80));
        assert!(m.check_snap_read(8, 0, &found(&m, 0, w5)).is_err());
        assert_eq!(m.stats.snap_reads_checked, 13);
    }
}

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

/// Counters the probes read.
#[derive(Clone, Copy, Debug, Default)]
pub struct ModelStats {
    pub reads_checked: u64,
    /// A read returned a write whose client had given up on it (outcome unknown → landed).
    pub unknown_write_seen: u64,
    /// A read returned a write still in flight at the client.
    pub inflight_write_seen: u64,
}

#[derive(Debug, Default)]
pub struct ImageModel {
    pub image: u64,
    /// Write ids are 1-based indexes into this.
    writes: Vec<WriteRec>,
    /// Block number → ids of the writes that cover it, in start order.
    blocks: BTreeMap<u64, Vec<u64>>,
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
        let ids = self.blocks.get(&block).cloned().unwrap_or_default();
        let known_before = |w: &WriteRec| w.done_at.is_some_and(|d| d < start);
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
                         {id} {w:?} had taken effect before"
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
                                 {write} {w:?}, but write {id} {v:?} overwrote it before the \
                                 read started"
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
}

//! Bad blocks: noting them, and repairing them with versions read from a good replica.
//!
//! A block whose copy here does not read back (a checksum mismatch, a read error) is never
//! a reason to stop the engine: a read changes nothing on disk, and the other replicas hold
//! good copies. Every path that meets one notes it ([`Objects::take_damaged`] hands the
//! notes to the owner, which asks for a repair) and goes on:
//!
//! - a read returns [`Error::bad_block`] for it;
//! - a write that must merge a partial block over it leaves that block's data as it is and
//!   marks it damaged ([`marked_damaged`]: it reads as bad even if the device's error was
//!   transient), and a rollback does the same with a head block whose snapshot copy is bad;
//! - a PG snapshot transfer sends it as a damaged version, which the receiver stores as a
//!   bad block.
//!
//! The repair is a log entry (`ClientOp::Repair`, proposed by the PG leader) that carries
//! every version of the block as a good replica holds it at a point of the log after which
//! nothing touched the block until the entry (`docs/design/repair.md` says why that makes
//! the entry's content right on every replica). [`Objects::repair_blocks`] applies it: a
//! version whose copy here is good and the same is kept, any other is replaced in place
//! (same birth, same snapshot), and versions the good replica does not hold are dropped.

use super::image_snaps::{birth_of, pack, phys_of};
use super::{block_crc, check_range, obj_key, BlockKey, BlockVal, Objects, BS};
use crate::disk::{AlignedBuf, Disk};
use crate::error::{Error, ObjectId, Result};
use crate::objects::transfer::ChunkVersions;
use fastblock_types::PgId;
use std::collections::{BTreeMap, BTreeSet};

/// Bad blocks noted and not yet taken, bounded: past this many, more are counted but not
/// listed (the owner finds them again when it reads them).
pub const DAMAGED_NOTED_MAX: usize = 4096;

/// One bad block copy found on this disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DamagedBlock {
    pub pg: PgId,
    pub object: ObjectId,
    /// Block index within the object.
    pub block: u32,
    /// The device failed to read it (else its data did not match its checksum).
    pub unreadable: bool,
    /// Where the bad copy lies in the data region (a repaired block lies elsewhere).
    pub physical_block: u64,
}

/// Bad blocks found and repaired since the engine opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DamageCounts {
    /// Blocks whose content did not match their checksum.
    pub checksum_errors: u64,
    /// Blocks the device failed to read.
    pub read_errors: u64,
    /// Block versions rewritten by repairs.
    pub versions_repaired: u64,
}

#[derive(Default)]
pub(super) struct Damage {
    noted: BTreeSet<DamagedBlock>,
    counts: DamageCounts,
}

impl Damage {
    /// Notes the bad block `err` is about (nothing if it is about none).
    pub(super) fn note(&mut self, err: &Error) {
        let (pg, object, block, physical_block) = match err {
            Error::Checksum {
                pg,
                object,
                block_index,
                physical_block,
            }
            | Error::BlockUnreadable {
                pg,
                object,
                block_index,
                physical_block,
                ..
            } => (*pg, *object, *block_index, *physical_block),
            _ => return,
        };
        let unreadable = matches!(err, Error::BlockUnreadable { .. });
        if unreadable {
            self.counts.read_errors += 1;
        } else {
            self.counts.checksum_errors += 1;
        }
        if self.noted.len() < DAMAGED_NOTED_MAX {
            self.noted.insert(DamagedBlock {
                pg,
                object,
                block: u32::try_from(block).expect("block indexes fit u32"),
                unreadable,
                physical_block,
            });
        }
    }
}

/// The crc a damaged version is stored with: never the crc of the bytes staged for it, so
/// it reads back as a checksum mismatch until a repair replaces it.
pub(super) fn damaged_crc(key: &BlockKey, data: &[u8]) -> u32 {
    !block_crc(key, data)
}

/// `v` marked damaged in place: the same block, birth and crc with the damaged bit set, so
/// that it reads back as a checksum mismatch whatever the device returns next. A block left
/// as it was because it could not be read when a write or rollback needed it must read as
/// bad until a repair replaces it: if the read failed only once, it would otherwise pass for
/// current without that change. Marking is idempotent (a second write over the same bad
/// block must not unmark it: inverting the crc twice did, and served the stale block).
pub(super) fn marked_damaged(v: BlockVal) -> BlockVal {
    (v.0 | super::image_snaps::DAMAGED_BIT, v.1)
}

impl Objects {
    /// The bad blocks noted since the last call, each once.
    pub fn take_damaged(&mut self) -> Vec<DamagedBlock> {
        std::mem::take(&mut self.damage.noted).into_iter().collect()
    }

    pub fn damage_counts(&self) -> DamageCounts {
        self.damage.counts
    }

    /// Makes the versions of the blocks of `object` in `offset_bytes..+chunk.len_bytes`
    /// (4 KiB aligned) exactly `chunk.versions`: what a good replica holds of them (see the
    /// module doc). Returns the versions rewritten here. A chunk with a damaged version is
    /// refused (a repair's source must be good).
    pub fn repair_blocks(
        &mut self,
        disk: &mut dyn Disk,
        pg: PgId,
        object: ObjectId,
        offset_bytes: u64,
        chunk: &ChunkVersions,
    ) -> Result<u64> {
        let len_bytes = chunk.len_bytes;
        check_range(offset_bytes, len_bytes)?;
        if !offset_bytes.is_multiple_of(BS) || !len_bytes.is_multiple_of(BS) {
            return Err(Error::InvalidArgument(format!(
                "repair of {offset_bytes}+{len_bytes} is not 4 KiB aligned"
            )));
        }
        let (lo, hi) = (
            (offset_bytes / BS) as u32,
            ((offset_bytes + len_bytes) / BS) as u32,
        );
        let mut wanted: BTreeMap<(u32, u64), &[u8]> = BTreeMap::new();
        let mut births: BTreeMap<(u32, u64), u64> = BTreeMap::new();
        for v in &chunk.versions {
            if !(lo..hi).contains(&v.block)
                || v.damaged
                || v.data.len() != BS as usize
                || u64::from(v.birth) > super::IMAGE_SNAP_ID_MAX
                || wanted.insert((v.block, v.snap), &v.data).is_some()
            {
                return Err(Error::InvalidArgument(format!(
                    "repair of {offset_bytes}+{len_bytes}: a bad version of block {} (snapshot {})",
                    v.block, v.snap
                )));
            }
            births.insert((v.block, v.snap), u64::from(v.birth));
        }
        let ok = obj_key(pg, object);
        // What this replica holds now: (block, snapshot) -> value.
        let mut held: BTreeMap<(u32, u64), BlockVal> = BTreeMap::new();
        let keys: Vec<BlockKey> = (lo..hi).map(|b| (ok.0, ok.1, ok.2, b)).collect();
        for (k, v) in keys.iter().zip(self.lookup_many(&keys)?) {
            if let Some(v) = v {
                held.insert((k.3, 0), v);
            }
        }
        if hi > lo {
            let kept = self.snap_entries(
                (ok.0, ok.1, ok.2, lo, 0),
                (ok.0, ok.1, ok.2, hi - 1, u64::MAX),
            )?;
            for (sk, v) in kept {
                held.insert((sk.3, sk.4), v);
            }
        }
        self.submit_staged(disk, false)?;
        // A background write's error surfaces in the next read: it is a write error, fatal
        // (the reads below would take it for a bad copy).
        disk.wait_background()
            .map_err(|e| crate::wal::writer::io_err("data write", 0, e))?;
        // Versions to write: wanted ones not held here as a good, equal copy.
        let mut buf = AlignedBuf::zeroed(BS as usize);
        let mut rewrite = Vec::new();
        for (&(block, snap), data) in &wanted {
            let key = (ok.0, ok.1, ok.2, block);
            let crc = block_crc(&key, data);
            let good = match held.get(&(block, snap)) {
                Some(v)
                    if v.1 == crc
                        && !super::image_snaps::is_marked_damaged(*v)
                        && birth_of(*v) == births[&(block, snap)] =>
                {
                    // A bad copy here is what is being repaired: not noted again.
                    let at = self.data_offset_bytes + phys_of(*v) * BS;
                    disk.read(at, &mut buf).is_ok()
                        && block_crc(&key, &buf) == crc
                        && buf[..] == data[..]
                }
                _ => false,
            };
            if !good {
                rewrite.push((block, snap, crc));
            }
        }
        let mut physs = self.allocate_blocks(rewrite.len() as u64)?.into_iter();
        let mut rewritten = 0;
        let mut head_end = 0;
        for (block, snap, crc) in rewrite {
            let key = (ok.0, ok.1, ok.2, block);
            let phys = physs
                .next()
                .expect("a block allocated per version rewritten");
            let at = self.stage_block(disk, phys)?;
            self.stage.buf[at..at + BS as usize].copy_from_slice(wanted[&(block, snap)]);
            let new = pack(phys, births[&(block, snap)], crc);
            let old = held.remove(&(block, snap));
            self.replace_version(pg, key, snap, old, Some(new));
            rewritten += 1;
        }
        // Versions held here that the good replica does not hold.
        let extra: Vec<((u32, u64), BlockVal)> = held
            .into_iter()
            .filter(|(k, _)| !wanted.contains_key(k))
            .collect();
        for ((block, snap), old) in extra {
            let key = (ok.0, ok.1, ok.2, block);
            self.replace_version(pg, key, snap, Some(old), None);
            rewritten += 1;
        }
        self.damage.counts.versions_repaired += rewritten;
        for &(block, snap) in wanted.keys() {
            if snap == 0 {
                head_end = head_end.max((u64::from(block) + 1) * BS);
            }
        }
        if head_end > 0 || chunk.head_exists {
            self.touch_object(ok, head_end);
        }
        Ok(rewritten)
    }

    /// Replaces one version of a block in place: the head's (`snap` 0) or the one kept for
    /// `snap`, from `old` (its current value) to `new`; the old copy is released.
    fn replace_version(
        &mut self,
        pg: PgId,
        key: BlockKey,
        snap: u64,
        old: Option<BlockVal>,
        new: Option<BlockVal>,
    ) {
        if snap == 0 {
            self.set_head(key, old, new);
        } else {
            self.set_kept((key.0, key.1, key.2, key.3, snap), old, new);
        }
        if let Some(old) = old {
            self.release(pg, phys_of(old));
        }
    }
}

//! Objects of clones: which objects of a clone image hold their own data, and where a copy-up
//! puts the parent's (`docs/design/snapshots.md`, "Clones" and "Snapshots of clones").
//!
//! A clone reads an object from its parent snapshot until the object is **copied up**: the
//! client reads the parent's object, writes it into the clone's object piece by piece
//! ([`Objects::copy_up`]), then marks it copied ([`Objects::copy_up_done`]); only then does
//! it send the write that needed the copy. A copy-up piece applied after the mark does
//! nothing, so a second client's late copy-up cannot overwrite data written since. Until
//! the mark, readers go to the parent: a copy-up cut short by a crash is simply redone.
//!
//! Each piece says where its parts go (`fastblock_types::clone_data`, decided by the PG
//! leader): into the head, born before every snapshot of the clone (birth 0), so that every
//! snapshot that read the parent there sees the same bytes in the clone; kept for a snapshot
//! of the clone (the newest whose overlap covers the part, so that it and every older one
//! see it, and no newer one), for parts beyond the head's overlap; or nowhere.
//!
//! The marks are kept in memory and in the `copied` table, flushed with the block map. A
//! deleted object (the tail of a shrunk clone) keeps its mark: the clone's snapshots that
//! saw it copied keep reading it from the clone. The marks go with the image
//! ([`Objects::forget_copies`]).

use super::image_snaps::{pack, phys_of};
use super::{block_crc, meta, obj_key, BlockKey, Objects, WriteAs, BS};
use crate::disk::Disk;
use crate::error::{Error, ObjectId, Result};
use crate::wal::record::pg_to_u64;
use fastblock_types::clone_data::CopyUpTarget;
use fastblock_types::{ImageId, PgId};
use redb::ReadableTable;

impl Objects {
    /// Whether `object` of a clone holds its own data (see the module doc).
    pub fn is_copied(&self, pg: PgId, object: ObjectId) -> bool {
        self.copied.contains(&obj_key(pg, object))
    }

    /// Writes one piece of a copy-up unless the object is marked copied already; returns
    /// whether it wrote. `runs` place the piece's parts: (end offset within the object,
    /// target), in order, the last ending at the piece's end. Parts kept for a snapshot
    /// must be whole 4 KiB blocks.
    pub fn copy_up(
        &mut self,
        disk: &mut dyn Disk,
        pg: PgId,
        object: ObjectId,
        offset_bytes: u64,
        data: &[u8],
        runs: &[(u64, CopyUpTarget)],
    ) -> Result<bool> {
        super::check_range(offset_bytes, data.len() as u64)?;
        let end = offset_bytes + data.len() as u64;
        let mut at = offset_bytes;
        for (run_end, _) in runs {
            if *run_end < at || *run_end > end {
                return Err(Error::InvalidArgument(format!(
                    "copy-up runs out of order: {run_end} after {at}, piece ends at {end}"
                )));
            }
            at = *run_end;
        }
        if at != end {
            return Err(Error::InvalidArgument(format!(
                "copy-up runs end at {at}, the piece at {end}"
            )));
        }
        if self.is_copied(pg, object) {
            return Ok(false);
        }
        let mut at = offset_bytes;
        for (run_end, target) in runs {
            let part = &data[(at - offset_bytes) as usize..(run_end - offset_bytes) as usize];
            match target {
                _ if part.is_empty() => {}
                CopyUpTarget::Head => {
                    self.write_as(disk, pg, object, at, part, WriteAs::CopyUpHead)?
                }
                CopyUpTarget::Snap(snap) => {
                    self.copy_up_kept(disk, pg, object, at, part, snap.0)?
                }
                CopyUpTarget::Drop => {}
            }
            at = *run_end;
        }
        Ok(true)
    }

    /// Writes parent data beyond the head's overlap as blocks kept for snapshot `snap` of the
    /// clone, or for the newest older snapshot still live if it was removed since the leader
    /// decided (one that saw at least as much of the parent); none live: nothing to keep.
    fn copy_up_kept(
        &mut self,
        disk: &mut dyn Disk,
        pg: PgId,
        object: ObjectId,
        offset_bytes: u64,
        data: &[u8],
        snap: u64,
    ) -> Result<()> {
        if !offset_bytes.is_multiple_of(BS) || !(data.len() as u64).is_multiple_of(BS) {
            return Err(Error::InvalidArgument(format!(
                "a copy-up part kept for a snapshot must be whole blocks: {offset_bytes}+{}",
                data.len()
            )));
        }
        let ok = obj_key(pg, object);
        let keeper = self
            .image_snaps
            .get(&(ok.0, ok.1))
            .and_then(|s| s.live.range(..=snap).next_back().copied());
        let Some(keeper) = keeper else {
            return Ok(());
        };
        let blocks = data.len() as u64 / BS;
        let physs = self.allocate_blocks(blocks)?;
        for (i, phys) in physs.into_iter().enumerate() {
            let b = offset_bytes / BS + i as u64;
            let key: BlockKey = (ok.0, ok.1, ok.2, b as u32);
            let sk = (key.0, key.1, key.2, key.3, keeper);
            let src = &data[i * BS as usize..(i + 1) * BS as usize];
            let at = self.stage_block(disk, phys)?;
            self.stage.buf[at..at + BS as usize].copy_from_slice(src);
            let crc = block_crc(&key, src);
            // An earlier copy of the same parent bytes (a copy-up redone): replaced.
            let old = self.kept_value(&sk)?;
            if let Some(old) = old {
                self.release(pg, phys_of(old));
            }
            self.set_kept(sk, old, Some(pack(phys, 0, crc)));
        }
        Ok(())
    }

    /// Marks `object` copied: from now on it is read from the clone, not its parent. The
    /// object exists from now on, even with no data (a parent hole).
    pub fn copy_up_done(&mut self, pg: PgId, object: ObjectId) {
        let k = obj_key(pg, object);
        if self.copied.insert(k) {
            self.dirty_copied.insert(k, Some(()));
        }
        self.touch_object(k, 0);
    }

    /// Forgets the copied marks of `image` in `pg` (it was removed), or of every image of
    /// `pg` (`None`: the PG goes or is replaced by a snapshot install).
    pub(super) fn forget_copies(&mut self, pg: PgId, image: Option<ImageId>) {
        let p = pg_to_u64(pg);
        let (lo, hi) = image.map_or(((p, 0, 0), (p, u64::MAX, u64::MAX)), |i| {
            ((p, i.0, 0), (p, i.0, u64::MAX))
        });
        let keys: Vec<super::ObjKey> = self.copied.range(lo..=hi).copied().collect();
        for k in keys {
            self.copied.remove(&k);
            self.dirty_copied.insert(k, None);
        }
    }

    /// Forgets the copied marks of a removed image in `pg`.
    pub fn forget_image_copies(&mut self, pg: PgId, image: ImageId) {
        self.forget_copies(pg, Some(image));
    }

    /// Loads the marks at open.
    pub(super) fn load_copied(
        tx: &redb::ReadTransaction,
    ) -> Result<std::collections::BTreeSet<super::ObjKey>> {
        let mut out = std::collections::BTreeSet::new();
        for row in tx.open_table(meta::COPIED)?.iter()? {
            let (k, _) = row?;
            out.insert(k.value());
        }
        Ok(out)
    }
}

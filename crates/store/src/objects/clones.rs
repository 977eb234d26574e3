//! Objects of clones: which objects of a clone image hold their own data (`docs/design/snapshots.md`,
//! "Clones").
//!
//! A clone reads an object from its parent snapshot until the object is **copied up**: the
//! client reads the parent's object, writes it into the clone's object piece by piece
//! ([`Objects::copy_up`]), then marks it copied ([`Objects::copy_up_done`]); only then does
//! it send the write that needed the copy. A copy-up piece applied after the mark does
//! nothing, so a second client's late copy-up cannot overwrite data written since. Until
//! the mark, readers go to the parent: a copy-up cut short by a crash is simply redone.
//!
//! The marks are kept in memory and in the `copied` table, flushed with the block map.

use super::{meta, obj_key, Objects};
use crate::disk::Disk;
use crate::error::{ObjectId, Result};
use fastblock_types::PgId;
use redb::ReadableTable;

impl Objects {
    /// Whether `object` of a clone holds its own data (see the module doc).
    pub fn is_copied(&self, pg: PgId, object: ObjectId) -> bool {
        self.copied.contains(&obj_key(pg, object))
    }

    /// Writes one piece of a copy-up unless the object is marked copied already; returns
    /// whether it wrote.
    pub fn copy_up(
        &mut self,
        disk: &mut dyn Disk,
        pg: PgId,
        object: ObjectId,
        offset_bytes: u64,
        data: &[u8],
    ) -> Result<bool> {
        if self.is_copied(pg, object) {
            return Ok(false);
        }
        self.write(disk, pg, object, offset_bytes, data)?;
        Ok(true)
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

    /// Forgets the mark of a deleted object.
    pub(super) fn uncopy(&mut self, k: super::ObjKey) {
        if self.copied.remove(&k) {
            self.dirty_copied.insert(k, None);
        }
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

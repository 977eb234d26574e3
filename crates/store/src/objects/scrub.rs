//! What a replica says of a range of its objects when a PG is scrubbed
//! (`docs/design/scrub.md`): a digest per group of [`SCRUB_GROUP_BLOCKS`] blocks of every
//! object, over the versions' identities and checksums (metadata only: a light scrub), and
//! for a deep scrub, every version's data read back and checked against its checksum.
//!
//! A digest covers, for each version of each block of the group in key order: the block
//! index, the snapshot the version is kept for (0: the head), its birth, and its crc32c.
//! Never where it lies on disk, which differs between replicas. Two replicas whose digests
//! of a group agree hold the same data there (to the strength of the checksums); a deep
//! read catches a copy whose data no longer matches its own checksum (bit rot), which a
//! comparison of checksums cannot see.

use super::image_snaps::birth_of;
use super::{obj_key, BlockKey, BlockVal, Objects};
use crate::disk::Disk;
use crate::error::{ObjectId, Result};
use crate::wal::record::pg_to_u64;
use fastblock_types::{ImageId, PgId};
use std::collections::BTreeMap;

/// Blocks per scrub digest (64 KiB): a disagreement is repaired group by group.
pub const SCRUB_GROUP_BLOCKS: u32 = 16;

/// One group's digest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ScrubDigest {
    pub object: ObjectId,
    /// Block index / [`SCRUB_GROUP_BLOCKS`].
    pub group: u32,
    pub digest: u64,
}

/// What one replica found in a range of objects.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScrubFindings {
    /// Every group with at least one version, in (object, group) order.
    pub digests: Vec<ScrubDigest>,
    /// Deep only: block versions read, and those bad here (noted for repair).
    pub blocks_read: u64,
    pub bad_blocks: u64,
}

/// A 64-bit digest from two crc32c lanes with different seeds.
#[derive(Clone, Copy)]
struct Lanes(u32, u32);

impl Lanes {
    fn new() -> Lanes {
        Lanes(0, 0x9E37_79B9)
    }
    fn add(&mut self, bytes: &[u8]) {
        self.0 = crc32c::crc32c_append(self.0, bytes);
        self.1 = crc32c::crc32c_append(self.1 ^ 0x5bd1_e995, bytes);
    }
    fn value(self) -> u64 {
        (u64::from(self.0) << 32) | u64::from(self.1)
    }
}

impl Objects {
    /// The objects of `pg` after `after` (from the first if `None`), in order, until their
    /// data reaches `bytes_max` or there are `count_max` of them (at least one, if any is
    /// left): the next range a scrub covers.
    pub fn scrub_next_objects(
        &self,
        pg: PgId,
        after: Option<ObjectId>,
        bytes_max: u64,
        count_max: usize,
    ) -> Vec<ObjectId> {
        let p = pg_to_u64(pg);
        let lo = match after {
            Some(o) => std::ops::Bound::Excluded((p, o.image.get(), o.index)),
            None => std::ops::Bound::Included((p, 0, 0)),
        };
        let hi = std::ops::Bound::Included((p, u64::MAX, u64::MAX));
        let mut out = Vec::new();
        let mut bytes = 0;
        for (k, end) in self.objects.range((lo, hi)) {
            if !out.is_empty() && (bytes + end > bytes_max || out.len() >= count_max) {
                break;
            }
            bytes += end;
            out.push(ObjectId {
                image: ImageId(k.1),
                index: k.2,
            });
        }
        out
    }

    /// Digests of every object of `pg` in `first..=last` (in (image, index) order), its
    /// head's blocks and those kept for image snapshots; with `deep`, every version read
    /// back and checked too (bad ones noted for repair, `damage.rs`).
    pub fn scrub_digests(
        &mut self,
        disk: &mut dyn Disk,
        pg: PgId,
        first: ObjectId,
        last: ObjectId,
        deep: bool,
    ) -> Result<ScrubFindings> {
        let (lo, hi) = (obj_key(pg, first), obj_key(pg, last));
        let mut versions: BTreeMap<(ObjectId, u32, u64), BlockVal> = BTreeMap::new();
        let objects: Vec<(u64, u64, u64)> = if lo <= hi {
            self.objects.range(lo..=hi).map(|(k, _)| *k).collect()
        } else {
            Vec::new()
        };
        let id = |k: (u64, u64, u64)| ObjectId {
            image: ImageId(k.1),
            index: k.2,
        };
        for ok in objects {
            for (k, v) in self.object_blocks(ok)? {
                versions.insert((id(ok), k.3, 0), v);
            }
        }
        if lo <= hi {
            let kept = self.snap_entries(
                (lo.0, lo.1, lo.2, 0, 0),
                (hi.0, hi.1, hi.2, u32::MAX, u64::MAX),
            )?;
            for (sk, v) in kept {
                versions.insert((id((sk.0, sk.1, sk.2)), sk.3, sk.4), v);
            }
        }
        let mut findings = ScrubFindings::default();
        let mut group: Option<(ObjectId, u32, Lanes)> = None;
        for (&(object, block, snap), v) in &versions {
            let g = block / SCRUB_GROUP_BLOCKS;
            match &mut group {
                Some((o, gg, _)) if *o == object && *gg == g => {}
                _ => {
                    if let Some((o, gg, lanes)) = group.take() {
                        findings.digests.push(ScrubDigest {
                            object: o,
                            group: gg,
                            digest: lanes.value(),
                        });
                    }
                    group = Some((object, g, Lanes::new()));
                }
            }
            let lanes = &mut group.as_mut().expect("set above").2;
            lanes.add(&block.to_le_bytes());
            lanes.add(&snap.to_le_bytes());
            lanes.add(&birth_of(*v).to_le_bytes());
            lanes.add(&v.1.to_le_bytes());
        }
        if let Some((o, gg, lanes)) = group {
            findings.digests.push(ScrubDigest {
                object: o,
                group: gg,
                digest: lanes.value(),
            });
        }
        if deep {
            self.submit_staged(disk, false)?;
            // One object's versions per device submission (at most a few MiB).
            let mut by_object: BTreeMap<ObjectId, Vec<(BlockKey, BlockVal)>> = BTreeMap::new();
            let p = pg_to_u64(pg);
            for (&(object, block, _), v) in &versions {
                let key = (p, object.image.get(), object.index, block);
                by_object.entry(object).or_default().push((key, *v));
            }
            for list in by_object.values() {
                let (keys, vals): (Vec<BlockKey>, Vec<Option<BlockVal>>) =
                    list.iter().map(|(k, v)| (*k, Some(*v))).unzip();
                findings.blocks_read += keys.len() as u64;
                let before = self.damage_counts();
                match self.read_resolved(disk, &keys, &vals) {
                    Ok(_) => {}
                    Err(e) if e.bad_block().is_some() => {
                        let after = self.damage_counts();
                        findings.bad_blocks += (after.checksum_errors - before.checksum_errors)
                            + (after.read_errors - before.read_errors);
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(findings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::BS;

    #[test]
    fn lanes_differ_by_content_and_order() {
        let mut a = Lanes::new();
        a.add(&[1, 2]);
        a.add(&[3]);
        let mut b = Lanes::new();
        b.add(&[3]);
        b.add(&[1, 2]);
        assert_ne!(a.value(), b.value());
        let mut c = Lanes::new();
        c.add(&[1, 2]);
        c.add(&[3]);
        assert_eq!(a.value(), c.value());
    }

    #[test]
    fn a_group_is_sixteen_blocks() {
        assert_eq!(u64::from(SCRUB_GROUP_BLOCKS) * BS, 64 << 10);
    }
}

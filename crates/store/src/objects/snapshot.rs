//! Receiving a PG snapshot: staged blocks, then an atomic install.
//!
//! A snapshot arrives in chunks while the PG's current objects keep serving (a follower's are
//! stale but consistent). Each chunk's blocks are allocated and written like applied data, but
//! their block-map entries are held here, referenced by nothing durable. The install swaps
//! them in: the PG's old objects are deleted, the staged map entries become dirty, the applied
//! index jumps to the snapshot's, and a snapshot record is added; the next flush commits all
//! of it in one redb transaction. So a crash leaves the old state (the staged blocks are free
//! again when the allocator is rebuilt from the durable map) or the new one, never a mix.
//!
//! A member that already holds a copy of the PG (one that fell behind) does not need room for
//! two copies: a staged block whose content equals the block the PG holds at the same place
//! (same checksum, then compared byte for byte) shares that block instead of a new one. A
//! shared block belongs to both maps until one lets go of it: the live map's write, discard
//! or delete hands it to the staging alone (it is not freed), an abort frees only what the
//! staging owns alone, and the install keeps every block the staged map references.

use super::image_snaps::{pack, phys_of, ImageSnaps, SnapBlockKey, IMAGE_SNAP_ID_MAX};
use super::transfer::{BlockVersion, ChunkVersions};
use super::{
    block_crc, check_range, meta, obj_key, BlockKey, BlockVal, ImageUsage, ObjKey, Objects, BS,
};
use crate::disk::AlignedBuf;
use crate::disk::Disk;
use crate::error::{Error, ObjectId, Result};
use crate::wal::record::{pg_from_u64, pg_to_u64};
use fastblock_types::PgId;
use raft::eraftpb::ConfState;
use redb::ReadableTable;
use std::collections::{BTreeMap, BTreeSet};

/// A snapshot being received for one PG.
pub(super) struct Receiving {
    /// Identifies the transfer; chunks of another transfer restart the staging.
    transfer: u64,
    blocks: BTreeMap<BlockKey, BlockVal>,
    /// Blocks kept for image snapshots (never shared with the live map).
    kept: BTreeMap<SnapBlockKey, BlockVal>,
    /// Image snapshot states, per (pg, image).
    states: BTreeMap<(u64, u64), ImageSnaps>,
    /// Objects of clones copied up (`clones.rs`).
    copied: BTreeSet<ObjKey>,
    objects: BTreeMap<ObjKey, u64>,
    /// Physical blocks the staged map shares with the PG's live objects.
    shared: BTreeSet<u64>,
}

impl Receiving {
    fn new(transfer: u64) -> Receiving {
        Receiving {
            transfer,
            blocks: BTreeMap::new(),
            kept: BTreeMap::new(),
            states: BTreeMap::new(),
            copied: BTreeSet::new(),
            objects: BTreeMap::new(),
            shared: BTreeSet::new(),
        }
    }
}

/// A durable record of an installed snapshot.
#[derive(Clone, Debug, PartialEq)]
pub struct SnapshotRecord {
    pub pg: PgId,
    pub index: u64,
    pub term: u64,
    pub conf_state: ConfState,
}

impl SnapshotRecord {
    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(64);
        v.extend_from_slice(&self.index.to_le_bytes());
        v.extend_from_slice(&self.term.to_le_bytes());
        crate::wal::record::put_conf_state(&mut v, &self.conf_state);
        v
    }

    fn decode(pg: PgId, bytes: &[u8]) -> Result<Self> {
        if bytes.len() < 16 {
            return Err(Error::Meta(format!(
                "snapshot record of pg {pg} is {} bytes",
                bytes.len()
            )));
        }
        let index = u64::from_le_bytes(bytes[0..8].try_into().expect("8 bytes"));
        let term = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
        let mut r = crate::codec::Reader::new(&bytes[16..]);
        let conf_state = crate::wal::record::read_conf_state(&mut r)
            .ok_or_else(|| Error::Meta(format!("snapshot record of pg {pg}: bad ConfState")))?;
        Ok(SnapshotRecord {
            pg,
            index,
            term,
            conf_state,
        })
    }
}

impl Objects {
    /// Stages one chunk of transfer `transfer` for `pg`: `data` at `offset_bytes` of `object`,
    /// both multiples of 4 KiB, every block a head block born at 0 (a PG without image
    /// snapshots). See [`Objects::snapshot_stage`].
    pub fn snapshot_write(
        &mut self,
        disk: &mut dyn Disk,
        pg: PgId,
        transfer: u64,
        object: ObjectId,
        offset_bytes: u64,
        data: &[u8],
    ) -> Result<()> {
        let len = data.len() as u64;
        if !offset_bytes.is_multiple_of(BS) || !len.is_multiple_of(BS) {
            return Err(Error::InvalidArgument(format!(
                "snapshot chunk {offset_bytes}+{len} is not 4 KiB aligned"
            )));
        }
        check_range(offset_bytes, len)?;
        let versions = data
            .chunks_exact(BS as usize)
            .enumerate()
            .map(|(i, d)| BlockVersion {
                block: (offset_bytes / BS) as u32 + i as u32,
                birth: 0,
                snap: 0,
                damaged: false,
                data: d.to_vec(),
            })
            .collect();
        let chunk = ChunkVersions {
            head_exists: true,
            copied: false,
            len_bytes: len,
            versions,
        };
        self.snapshot_stage(disk, pg, transfer, object, offset_bytes, &chunk)
    }

    /// Stages one chunk of transfer `transfer` for `pg`: the versions of the blocks of
    /// `object` in `offset_bytes..+chunk.len_bytes` (4 KiB aligned) that the sender read at one
    /// instant (`transfer.rs`). Head blocks go to the staged head (sharing a block the PG
    /// holds with the same content), kept blocks to the staged blocks of their image
    /// snapshot. A chunk of a different transfer than the one staged discards the staged one
    /// first.
    pub fn snapshot_stage(
        &mut self,
        disk: &mut dyn Disk,
        pg: PgId,
        transfer: u64,
        object: ObjectId,
        offset_bytes: u64,
        chunk: &ChunkVersions,
    ) -> Result<()> {
        let len_bytes = chunk.len_bytes;
        check_range(offset_bytes, len_bytes)?;
        if !offset_bytes.is_multiple_of(BS) || !len_bytes.is_multiple_of(BS) {
            return Err(Error::InvalidArgument(format!(
                "snapshot chunk {offset_bytes}+{len_bytes} is not 4 KiB aligned"
            )));
        }
        let (lo, hi) = (offset_bytes / BS, (offset_bytes + len_bytes) / BS);
        for v in &chunk.versions {
            let inside = (lo..hi).contains(&u64::from(v.block));
            if !inside || u64::from(v.birth) > IMAGE_SNAP_ID_MAX || v.data.len() != BS as usize {
                return Err(Error::InvalidArgument(format!(
                    "snapshot chunk {offset_bytes}+{len_bytes}: a version of block {} born at {} \
                     with {} bytes",
                    v.block,
                    v.birth,
                    v.data.len()
                )));
            }
        }
        if self
            .receiving
            .get(&pg)
            .is_some_and(|r| r.transfer != transfer)
        {
            self.snapshot_abort(pg);
        }
        let ok = obj_key(pg, object);
        let keys: Vec<BlockKey> = chunk
            .versions
            .iter()
            .map(|v| (ok.0, ok.1, ok.2, v.block))
            .collect();
        // A damaged version (the sender's copy was bad) is stored as a bad block: its crc
        // never matches, so it reads as one and is repaired like one (`damage.rs`).
        let crcs: Vec<u32> = chunk
            .versions
            .iter()
            .zip(&keys)
            .map(|(v, k)| {
                if v.damaged {
                    super::damage::damaged_crc(k, &v.data)
                } else {
                    block_crc(k, &v.data)
                }
            })
            .collect();
        // Head blocks the PG already holds with the same content are shared, not copied
        // (kept blocks are always copied: sharing them would tie maps of two kinds).
        let count = chunk.versions.len();
        let mut same: Vec<Option<u64>> = vec![None; count];
        let live = self.lookup_many(&keys)?;
        let mut buf = AlignedBuf::zeroed(BS as usize);
        for n in 0..count {
            let (Some(val), 0) = (live[n], chunk.versions[n].snap) else {
                continue;
            };
            if val.1 != crcs[n] {
                continue;
            }
            self.submit_staged(disk, false)?;
            if self.read_block(disk, pg, &keys[n], val, &mut buf).is_ok()
                && buf[..] == chunk.versions[n].data[..]
            {
                same[n] = Some(phys_of(val));
            }
        }
        let new_count = same.iter().filter(|s| s.is_none()).count() as u64;
        let mut physs = self.allocate_blocks(new_count)?.into_iter();
        let mut staged = Vec::with_capacity(count);
        for n in 0..count {
            let phys = match same[n] {
                Some(phys) => phys,
                None => {
                    let phys = physs.next().expect("allocated one block per new block");
                    let at = self.stage_block(disk, phys)?;
                    self.stage.buf[at..at + BS as usize].copy_from_slice(&chunk.versions[n].data);
                    phys
                }
            };
            let v = &chunk.versions[n];
            staged.push((
                keys[n],
                v.snap,
                pack(phys, u64::from(v.birth), crcs[n]),
                same[n].is_some(),
            ));
        }
        let r = self
            .receiving
            .entry(pg)
            .or_insert_with(|| Receiving::new(transfer));
        let mut garbage = Vec::new();
        let mut head_blocks = false;
        for (key, snap, val, shared) in staged {
            let phys = phys_of(val);
            if shared {
                r.shared.insert(phys);
            }
            let old = if snap == 0 {
                head_blocks = true;
                r.blocks.insert(key, val)
            } else {
                r.kept.insert((key.0, key.1, key.2, key.3, snap), val)
            };
            if let Some(old) = old.map(phys_of) {
                // A resent chunk: the earlier copy is garbage (freed after the next flush,
                // when its staged write has surely been submitted), unless the PG's objects
                // still reference it or the new copy is the same block.
                if old != phys && !r.shared.remove(&old) {
                    garbage.push(old);
                }
            }
        }
        if chunk.copied {
            r.copied.insert(ok);
        }
        if chunk.head_exists {
            // An object with no head block in this range still exists on the sender (a
            // tail cut by a reclaim leaves one with no data), so it must here.
            let end = r.objects.entry(ok).or_insert(0);
            let reach = if head_blocks {
                offset_bytes + len_bytes
            } else {
                offset_bytes
            };
            *end = (*end).max(reach);
        }
        self.pending_free.extend(garbage);
        Ok(())
    }

    /// Stages the snapshot state of `image` for the transfer (sent before any block, so it
    /// is as old as every block copied; the log replayed after the install brings it up to
    /// date).
    pub fn snapshot_image_snaps(
        &mut self,
        pg: PgId,
        transfer: u64,
        image: fastblock_types::ImageId,
        state: ImageSnaps,
    ) {
        if self
            .receiving
            .get(&pg)
            .is_some_and(|r| r.transfer != transfer)
        {
            self.snapshot_abort(pg);
        }
        let r = self
            .receiving
            .entry(pg)
            .or_insert_with(|| Receiving::new(transfer));
        r.states.insert((pg_to_u64(pg), image.0), state);
    }

    /// Stages that `object` exists (a chunk of transfer `transfer` that is all hole at
    /// `offset_bytes`): the install creates it even if no data of it was staged, so that
    /// every replica lists the same objects.
    pub fn snapshot_touch(&mut self, pg: PgId, transfer: u64, object: ObjectId, offset_bytes: u64) {
        if self
            .receiving
            .get(&pg)
            .is_some_and(|r| r.transfer != transfer)
        {
            self.snapshot_abort(pg);
        }
        let r = self
            .receiving
            .entry(pg)
            .or_insert_with(|| Receiving::new(transfer));
        let end = r.objects.entry(obj_key(pg, object)).or_insert(0);
        *end = (*end).max(offset_bytes);
    }

    /// The transfer staged for `pg`, if any.
    pub fn snapshot_receiving(&self, pg: PgId) -> Option<u64> {
        self.receiving.get(&pg).map(|r| r.transfer)
    }

    /// Drops what was staged for `pg` (a transfer that will not complete).
    pub fn snapshot_abort(&mut self, pg: PgId) {
        if let Some(r) = self.receiving.remove(&pg) {
            // Not freed at once: a staged write of these blocks may still be queued. Blocks
            // shared with the PG's objects stay theirs.
            let owned = r
                .blocks
                .values()
                .chain(r.kept.values())
                .map(|v| phys_of(*v));
            self.pending_free
                .extend(owned.filter(|phys| !r.shared.contains(phys)));
        }
    }

    /// A block the PG's live objects no longer reference: freed after the next flush, unless
    /// a snapshot being staged for the PG shares it (it is then the staging's alone).
    pub(super) fn release(&mut self, pg: PgId, phys: u64) {
        let shared = self
            .receiving
            .get_mut(&pg)
            .is_some_and(|r| r.shared.remove(&phys));
        if !shared {
            self.pending_free.push(phys);
        }
    }

    /// Data bytes of the blocks a snapshot being staged for `pg` shares with its objects
    /// (room the snapshot did not need).
    pub fn snapshot_shared_bytes(&self, pg: PgId) -> u64 {
        self.receiving
            .get(&pg)
            .map_or(0, |r| r.shared.len() as u64 * BS)
    }

    /// Replaces the PG's objects with the staged snapshot and sets its applied index; durable
    /// (atomically) at the next flush, which the caller does at once.
    pub fn snapshot_install(&mut self, pg: PgId, record: &SnapshotRecord) -> Result<()> {
        assert_eq!(record.pg, pg);
        // The PG's image snapshots are not part of the transfer yet: they go, before the
        // objects, so that deleting the objects frees their blocks instead of keeping them.
        self.image_snaps_drop_pg(pg)?;
        // The old objects go first, while the staging still says which of their blocks it
        // shares (those are kept).
        for o in self.list(pg)? {
            self.delete(pg, o)?;
        }
        self.forget_copies(pg, None);
        let staged = self
            .receiving
            .remove(&pg)
            .unwrap_or_else(|| Receiving::new(0));
        assert!(
            staged.shared.is_empty(),
            "pg {pg}: the old objects were deleted, yet the staging shares {} of their blocks",
            staged.shared.len()
        );
        // The PG holds nothing now (its objects deleted, its snapshots dropped), so every
        // staged entry is new.
        let held = self.usage.pg(pg);
        assert!(
            held == ImageUsage::default(),
            "pg {pg}: {held:?} left after its objects and snapshots were dropped"
        );
        for (k, v) in staged.blocks {
            self.set_head(k, None, Some(v));
        }
        for (k, v) in staged.kept {
            self.set_kept(k, None, Some(v));
        }
        for (k, state) in staged.states {
            self.set_image_snaps(k, state);
        }
        for k in staged.copied {
            if self.copied.insert(k) {
                self.dirty_copied.insert(k, Some(()));
            }
        }
        for (k, end) in staged.objects {
            if self.objects.insert(k, end).is_none() {
                self.usage.add_object(&k, 1);
            }
            self.dirty_objects.insert(k, Some(end));
        }
        self.applied.insert(pg, record.index);
        self.dirty_applied.insert(pg_to_u64(pg), Some(record.index));
        self.dirty_snapshots
            .insert(pg_to_u64(pg), Some(record.encode()));
        Ok(())
    }

    /// Every durable snapshot record (read at open to finish interrupted installs).
    pub fn snapshot_records(&self) -> Result<Vec<SnapshotRecord>> {
        let tx = self.db.begin_read()?;
        let table = match tx.open_table(meta::SNAPSHOTS) {
            Ok(t) => t,
            // A store formatted before snapshots existed has no such table yet.
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        let mut out = Vec::new();
        for row in table.iter()? {
            let (k, v) = row?;
            let pg = pg_from_u64(k.value());
            out.push(SnapshotRecord::decode(pg, v.value())?);
        }
        Ok(out)
    }
}

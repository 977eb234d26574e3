//! Bad blocks: data blocks going bad on the nodes' disks (`--bad-blocks`;
//! `docs/design/simulator.md`, "Faults"), and the counts of what the cores did about them.
//!
//! The rule that keeps these faults within what the design claims to survive: an image block
//! is made bad on at most one node in a run ([`crate::disk::Claims`]; a misdirected write
//! claims its blocks in `disk.rs` when it lands). Every block written keeps a good
//! copy on every other replica, so every bad copy can be repaired (`docs/design/repair.md`)
//! and no client may be answered `Checksum` or `IoError` for it. A block is claimed when one
//! of its copies is made bad: the stamp a client wrote into it names the image block, so the
//! simulator finds the device blocks holding a client's block by reading the device, without
//! asking the store. A copy it finds may be stale (freed, not yet reused); making it bad is
//! harmless then, and the block is claimed all the same.

use super::{BadKind, Cluster, Ev, FaultKind, UNREADABLE_BLOCKS_PER_NODE_MAX};
use crate::disk::{may_claim, stamped_block, Misdirect, SECTOR_BYTES};
use crate::model::BLOCK_BYTES;
use crate::options::{RngExt, MS};
use fastblock_types::OsdId;
use std::collections::BTreeMap;

const BS: u64 = BLOCK_BYTES as u64;
/// Times a flip waits for its disk to have no unsynced write before it is dropped.
const FLIP_TRIES_MAX: u32 = 50;

impl Cluster {
    /// A fault of the disks' data (`FaultKind::BadBlock`) or a scrub request
    /// (`FaultKind::Scrub`, `scrubs.rs`), drawn from `rot_rng`.
    pub(super) fn on_disk_fault(&mut self, kind: FaultKind) {
        let every = match kind {
            FaultKind::BadBlock => self.o.bad_block_every_us,
            _ => self.o.scrub_every_us,
        };
        let next = self.rot_rng.range(every / 4, every * 2);
        self.after(next, Ev::Fault(kind));
        if kind == FaultKind::Scrub {
            self.request_scrub();
            return;
        }
        let ids: Vec<OsdId> = self.nodes.keys().copied().collect();
        let node = self.rot_rng.pick(&ids);
        let roll = self.rot_rng.range(0, 99);
        let kind = if roll < self.o.unreadable_pct {
            BadKind::Unreadable
        } else if roll < self.o.unreadable_pct + self.o.misdirect_pct {
            BadKind::Misdirect
        } else {
            BadKind::Flip
        };
        self.on_bad_block(node, kind, 0);
    }

    /// A data block of node `id` goes bad (a node that is down too: its disk rots all the
    /// same). A flip changes the device's durable bytes, so it waits until the disk has no
    /// unsynced write (`SimImage::corrupt` makes the whole image durable): the crash model
    /// stays as it is.
    pub(super) fn on_bad_block(&mut self, id: OsdId, kind: BadKind, tries: u32) {
        if !self.faults_on {
            return;
        }
        match kind {
            BadKind::Misdirect => {
                let seed = self.rot_rng.next_u64();
                self.nodes[&id].faults().bad.misdirect = Some(Misdirect {
                    osd: id,
                    claims: self.claims.clone(),
                    seed,
                });
                self.probes.hit("bad_block.misdirect_armed");
                return;
            }
            BadKind::Flip if self.nodes[&id].disk.image().pending_writes() > 0 => {
                if tries < FLIP_TRIES_MAX {
                    let d = self.rot_rng.range(MS, 10 * MS);
                    let tries = tries + 1;
                    self.after(
                        d,
                        Ev::BadBlock {
                            node: id,
                            kind,
                            tries,
                        },
                    );
                }
                return;
            }
            BadKind::Unreadable
                if self.unreadable_made.get(&id).copied().unwrap_or(0)
                    >= UNREADABLE_BLOCKS_PER_NODE_MAX =>
            {
                return;
            }
            BadKind::Flip | BadKind::Unreadable => {}
        }
        let Some((at, block)) = self.pick_bad_block(id) else {
            return;
        };
        if self.trace {
            eprintln!(
                "               osd {id}: {kind:?} at device offset {at} (image block {block})"
            );
        }
        match kind {
            BadKind::Flip => {
                let byte = self.rot_rng.range(0, BS - 1);
                let bit = self.rot_rng.range(0, 7);
                let node = &self.nodes[&id];
                node.disk.image().corrupt(at + byte, |b| b[0] ^= 1 << bit);
                self.probes.hit("bad_block.flipped");
            }
            BadKind::Unreadable => {
                let sector = at + self.rot_rng.range(0, BS / SECTOR_BYTES - 1) * SECTOR_BYTES;
                self.nodes[&id].faults().bad.unreadable.insert(sector);
                *self.unreadable_made.entry(id).or_default() += 1;
                self.probes.hit("bad_block.unreadable");
            }
            BadKind::Misdirect => unreachable!("armed above"),
        }
    }

    /// The device blocks of node `id` that hold a client's block no other node has a bad
    /// copy of: image block -> (write, device byte offset) of each copy.
    fn claimable_copies(&self, id: OsdId) -> BTreeMap<u64, Vec<(u64, u64)>> {
        let node = &self.nodes[&id];
        let (start, end) = node.faults().bad.data;
        let claims = self.claims.lock().unwrap_or_else(|e| e.into_inner());
        let image = node.disk.image();
        let bytes = image.bytes();
        let mut copies: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
        let mut at = start;
        while at + BS <= end {
            if let Some((block, write)) = stamped_block(&bytes[at as usize..(at + BS) as usize]) {
                if may_claim(&claims, block, id) {
                    copies.entry(block).or_default().push((write, at));
                }
            }
            at += BS;
        }
        copies
    }

    /// A device block of node `id` holding a client's block that no other node has a bad
    /// copy of, claimed for `id`: its device byte offset and image block. Mostly the newest
    /// copy of its image block on the device (likely the live one), sometimes any copy (a
    /// version a snapshot keeps, or a stale one).
    fn pick_bad_block(&mut self, id: OsdId) -> Option<(u64, u64)> {
        let mut copies = self.claimable_copies(id);
        if copies.is_empty() {
            return None;
        }
        let blocks: Vec<u64> = copies.keys().copied().collect();
        let block = self.rot_rng.pick(&blocks);
        let mut of_block = copies.remove(&block).expect("listed");
        of_block.sort_unstable();
        let (_, at) = if self.rot_rng.chance_pct(75) {
            *of_block.last().expect("one copy at least")
        } else {
            self.rot_rng.pick(&of_block)
        };
        self.claim(block, id);
        Some((at, block))
    }

    fn claim(&self, block: u64, id: OsdId) {
        self.claims
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(block, id);
    }

    /// Flips a bit of the newest copy of image block `block` on node `id`'s disk, as the
    /// random runs do (`BadKind::Flip`), at a moment a scenario picks. False if the disk
    /// holds no copy, another node has a bad one, or the disk has unsynced writes.
    pub fn flip_block(&mut self, id: OsdId, block: u64) -> bool {
        if self.nodes[&id].disk.image().pending_writes() > 0 {
            return false;
        }
        let Some(copies) = self.claimable_copies(id).remove(&block) else {
            return false;
        };
        let (_, at) = *copies.iter().max().expect("one copy at least");
        self.claim(block, id);
        self.nodes[&id]
            .disk
            .image()
            .corrupt(at + 100, |b| b[0] ^= 0x10);
        self.probes.hit("bad_block.flipped");
        true
    }

    /// Counts what the disks did since the last step of node `id`: misdirected writes that
    /// landed, and the core's repairs and bad copies met (`ShardCore::repair_counts`,
    /// `Store::damage_counts`).
    pub(super) fn count_bad_blocks(&mut self, id: OsdId) {
        let node = &self.nodes[&id];
        let landed = std::mem::take(&mut node.faults().bad.misdirected);
        if self.trace {
            for m in &landed {
                eprintln!("               osd {id}: misdirected write: {m:?}");
            }
        }
        self.probes
            .add("bad_block.misdirected", landed.len() as u64);
        let Some(core) = node.core() else {
            return;
        };
        let life = node.incarnation;
        let repairs = core.repair_counts();
        let damage = core.store().damage_counts();
        let (_, r0, d0) = self
            .seen_counts
            .get(&id)
            .copied()
            .filter(|(l, ..)| *l == life)
            .unwrap_or_default();
        self.probes
            .add("repair.started", repairs.started.saturating_sub(r0.started));
        self.probes.add(
            "repair.repaired",
            repairs.repaired.saturating_sub(r0.repaired),
        );
        self.probes
            .add("repair.failed", repairs.failed.saturating_sub(r0.failed));
        self.probes.add(
            "repair.reported",
            repairs.reported.saturating_sub(r0.reported),
        );
        self.probes.add(
            "store.checksum_error",
            damage.checksum_errors.saturating_sub(d0.checksum_errors),
        );
        self.probes.add(
            "store.read_error",
            damage.read_errors.saturating_sub(d0.read_errors),
        );
        self.seen_counts.insert(id, (life, repairs, damage));
    }
}

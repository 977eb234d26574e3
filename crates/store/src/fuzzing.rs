//! Entry points for fuzzing log recovery on arbitrary bytes (the cargo-fuzz target in
//! `fuzz/` and the proptest in `tests/fuzz_recovery.rs` share them). Recovery must return
//! `Ok` or a typed error for any input, never panic or hang.

use crate::disk::{AlignedBuf, Disk, SimDisk, SimFile};
use crate::error::Result;
use crate::store::{MkfsOptions, Store, StoreOptions};
use crate::superblock::{Superblock, SUPERBLOCK_SIZE_BYTES};
use crate::wal::{Wal, WalOptions};
use crate::ObjectId;
use fastblock_types::{ImageId, PgId, PoolId};
use raft::eraftpb::{ConfState, Entry, HardState};

pub const IMAGE_BYTES: u64 = 512 << 10;

/// A small, valid device image with three PGs, several batches, a segment roll, a
/// compaction and a truncated suffix: the seed that mutations start from.
pub fn canonical_image() -> Vec<u8> {
    let disk = SimDisk::new(IMAGE_BYTES);
    let mkfs = MkfsOptions {
        osd_uuid: [0x5A; 16],
        segment_size_bytes: 32 << 10,
        segment_count: 4,
        batch_bytes_max: 8 << 10,
        force: false,
    };
    let mut s = Store::mkfs(disk.clone(), SimFile::new(), &mkfs, StoreOptions::default())
        .expect("mkfs of the canonical image");
    let mut cs = ConfState::default();
    cs.voters = vec![1, 2, 3];
    let mut next = [1u64; 3];
    for round in 0..24u64 {
        for p in 0..3u32 {
            let pg = PgId::new(PoolId(1), p);
            if round == 0 {
                s.set_conf_state(pg, &cs).expect("conf");
            }
            let i = &mut next[p as usize];
            if round == 6 && p == 1 {
                *i -= 1; // overwrite a suffix with a new term
            }
            let mut e = Entry::default();
            e.index = *i;
            e.term = 1 + round / 6;
            e.data = vec![(round * 3 + u64::from(p)) as u8; 900].into();
            if let Err(crate::Error::BatchFull { .. }) = s.append_entries(pg, &[e.clone()]) {
                s.commit().expect("commit");
                s.append_entries(pg, &[e]).expect("append");
            }
            *i += 1;
            let mut hs = HardState::default();
            hs.term = e_term(round);
            hs.commit = *i - 1;
            if let Err(crate::Error::BatchFull { .. }) = s.set_hard_state(pg, &hs) {
                s.commit().expect("commit");
                s.set_hard_state(pg, &hs).expect("hard state");
            }
        }
        s.commit().expect("commit");
        if round == 8 {
            let pg = PgId::new(PoolId(1), 0);
            s.write_object(
                pg,
                ObjectId {
                    image: ImageId(1),
                    index: 0,
                },
                0,
                &[7; 4096],
            )
            .expect("write");
            s.set_applied(pg, 5).expect("applied");
            s.flush().expect("flush");
            s.compact(pg, 4).expect("compact");
            s.commit().expect("commit");
        }
    }
    drop(s);
    let img = disk.image();
    img.bytes().to_vec()
}

fn e_term(round: u64) -> u64 {
    1 + round / 6
}

/// Overwrites parts of `image` as told by `data`: a sequence of (u32 LE offset, u8 length,
/// bytes). Offsets wrap around the image size.
pub fn mutate(image: &mut [u8], data: &[u8]) {
    let mut p = 0;
    while p + 5 <= data.len() {
        let offset = u32::from_le_bytes([data[p], data[p + 1], data[p + 2], data[p + 3]]) as usize;
        let len = data[p + 4] as usize;
        p += 5;
        let bytes = &data[p..(p + len).min(data.len())];
        p += bytes.len();
        for (i, b) in bytes.iter().enumerate() {
            let at = (offset + i) % image.len();
            image[at] = *b;
        }
    }
}

/// Recovers the WAL of `image` and reads every entry back. Returns the number of entries.
pub fn recover_image(image: &[u8]) -> Result<u64> {
    if image.len() < SUPERBLOCK_SIZE_BYTES as usize {
        return Err(crate::Error::BadSuperblock("image too short".into()));
    }
    let sb = Superblock::decode(&image[..SUPERBLOCK_SIZE_BYTES as usize])?;
    if (image.len() as u64) < sb.device_size_bytes || sb.device_size_bytes > 64 << 20 {
        return Err(crate::Error::DeviceTooSmall {
            expected_bytes: sb.device_size_bytes,
            actual_bytes: image.len() as u64,
        });
    }
    let mut disk = SimDisk::from_bytes(image.to_vec());
    let mut wal = Wal::recover(&mut disk, &sb, WalOptions::default())?;
    let mut n = 0;
    let pgs: Vec<PgId> = wal.pg_ids().collect();
    for pg in pgs {
        let log = wal.pg(pg).expect("listed");
        let (first, last) = (log.first_index(), log.last_index());
        n += wal.entries(&mut disk, pg, first, last + 1, None)?.len() as u64;
    }
    // A recovered log must accept new writes.
    let mut probe = AlignedBuf::zeroed(512);
    disk.read(0, &mut probe)
        .map_err(|e| crate::wal::writer::io_err("probe", 0, e))?;
    Ok(n)
}

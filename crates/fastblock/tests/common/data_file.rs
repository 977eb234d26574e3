//! An OSD's data file seen from outside, for tests that damage it as a disk would: where the
//! data region of its (only) shard starts, where a block's copy lies, and a flipped byte.

use super::BLOCK;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

/// Where the data region of shard 0 starts in `path` (the store's superblock opens the
/// shard's region, which starts the file).
pub fn data_offset(path: &Path) -> u64 {
    let mut sb = vec![0u8; 4096];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut sb))
        .expect("reading the superblock");
    fastblock_store::superblock::Superblock::decode(&sb)
        .expect("the data file starts with the superblock")
        .data_offset_bytes
}

/// The offset of the 4 KiB-aligned copy of `block` in the data region of `path`, if one is
/// written there.
pub fn find_block(path: &Path, block: &[u8]) -> Option<u64> {
    find_blocks(path, &[block])[0]
}

/// [`find_block`] for several blocks in one pass over the file: the offset of a copy of each
/// (the first met), in the order given.
pub fn find_blocks(path: &Path, blocks: &[&[u8]]) -> Vec<Option<u64>> {
    let start = data_offset(path);
    let mut found: Vec<Option<u64>> = vec![None; blocks.len()];
    let mut f = std::fs::File::open(path).unwrap();
    f.seek(SeekFrom::Start(start)).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut at = start;
    while found.iter().any(Option::is_none) {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        for (i, chunk) in buf[..n].chunks_exact(BLOCK as usize).enumerate() {
            for (k, block) in blocks.iter().enumerate() {
                if found[k].is_none() && chunk == *block {
                    found[k] = Some(at + (i as u64) * BLOCK);
                }
            }
        }
        at += n as u64;
    }
    found
}

/// Flips a byte at `offset` of the file and syncs it, as a bad sector or bit rot would
/// (the OSD reads with O_DIRECT: it sees the change at its next read).
pub fn flip_byte(path: &Path, offset: u64) {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.read_exact(&mut b).unwrap();
    b[0] ^= 0x20;
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.write_all(&b).unwrap();
    f.sync_all().unwrap();
}

//! Helpers shared by the integration tests.
#![allow(dead_code)]

use fastblock_store::ObjectId;
use fastblock_store::{MkfsOptions, SimDisk, SimFile, Store, StoreOptions};
use fastblock_types::{ImageId, PgId, PoolId};
use raft::eraftpb::Entry;

pub const DEVICE_BYTES: u64 = 4 << 20;

pub fn small_mkfs() -> MkfsOptions {
    MkfsOptions {
        osd_uuid: [0xAB; 16],
        segment_size_bytes: 64 << 10,
        segment_count: 6,
        batch_bytes_max: 16 << 10,
        force: false,
    }
}

pub fn options() -> StoreOptions {
    let mut o = StoreOptions::default();
    o.wal.cache_bytes_max_per_pg = 2048;
    o.stage_bytes_max = 64 << 10;
    o.meta_cache_bytes = 1 << 20;
    o
}

pub fn new_sim(device_bytes: u64) -> (SimDisk, SimFile, Store<SimDisk>) {
    new_sim_with(device_bytes, options())
}

/// Like [`new_sim`], with these options.
pub fn new_sim_with(device_bytes: u64, opts: StoreOptions) -> (SimDisk, SimFile, Store<SimDisk>) {
    let disk = SimDisk::new(device_bytes);
    let meta = SimFile::new();
    let store = Store::mkfs(disk.clone(), meta.clone(), &small_mkfs(), opts).expect("mkfs");
    (disk, meta, store)
}

pub fn reopen(disk: &SimDisk, meta: &SimFile) -> fastblock_store::Result<Store<SimDisk>> {
    reopen_with(disk, meta, options())
}

pub fn reopen_with(
    disk: &SimDisk,
    meta: &SimFile,
    opts: StoreOptions,
) -> fastblock_store::Result<Store<SimDisk>> {
    Store::open(disk.clone(), meta.clone(), opts)
}

pub fn crash(disk: &SimDisk, meta: &SimFile, seed: u64) {
    disk.image().crash(seed);
    meta.image().crash(seed ^ 0x5555);
}

pub fn pg(n: u32) -> PgId {
    PgId::new(PoolId(1), n)
}

pub fn obj(i: u64) -> ObjectId {
    ObjectId {
        image: ImageId(1),
        index: i,
    }
}

pub fn entry(index: u64, term: u64, len: usize) -> Entry {
    let mut e = Entry::default();
    e.index = index;
    e.term = term;
    e.data = (0..len)
        .map(|i| (index as usize * 31 + i) as u8)
        .collect::<Vec<_>>()
        .into();
    e
}

pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (seed.wrapping_mul(2654435761).wrapping_add(i as u64 * 7) >> 3) as u8)
        .collect()
}

/// A flush runner that holds the commit it is handed until the test lets it run.
#[derive(Default)]
pub struct HeldRunner {
    pub held: Option<fastblock_store::MetaCommit>,
    /// The store's next poll runs the held commit.
    pub release: bool,
}

impl HeldRunner {
    pub fn finish(&mut self) -> Option<fastblock_store::Finished> {
        let mut commit = self.held.take()?;
        let result = commit.run();
        Some(fastblock_store::Finished {
            commit: Some(commit),
            result,
            commit_time: std::time::Duration::ZERO,
            since_start: std::time::Duration::ZERO,
        })
    }
}

/// The store's handle on a [`HeldRunner`] the test keeps too.
pub struct Held(pub std::rc::Rc<std::cell::RefCell<HeldRunner>>);

impl fastblock_store::FlushRunner for Held {
    fn submit(&mut self, commit: fastblock_store::MetaCommit) {
        self.0.borrow_mut().held = Some(commit);
    }
    fn busy(&self) -> bool {
        self.0.borrow().held.is_some()
    }
    fn try_finished(&mut self) -> Option<fastblock_store::Finished> {
        let mut r = self.0.borrow_mut();
        if r.release {
            r.finish()
        } else {
            None
        }
    }
    fn wait(&mut self) -> Option<fastblock_store::Finished> {
        self.0.borrow_mut().finish()
    }
}

//! The hot part of the flushed block map, in memory: a bounded cache of `blocks` table
//! entries, so that applying a 4 KiB write or reading 4 KiB of a working set that fits looks
//! nothing up in redb (a B-tree descent through redb's page cache per block).
//!
//! What it holds is what the flushed table says, "absent" included: the first write of a
//! block and a read of a hole look up keys that are not in the table. `Objects::lookup_many`
//! consults the dirty map first, then this, then redb, and fills this on a miss. It never
//! disagrees with the flushed table: the only writer of that table is a flush's metadata
//! commit, and `Objects::flush_finish` gives every key the commit wrote that is cached here
//! its committed value. While the commit runs those keys are still in the dirty map, which
//! hides what is cached for them.
//!
//! Layout: one array of 40-byte slots, open addressing with linear probing, at most 2/3 full
//! (60 bytes per entry when full; the array grows by doubling as entries arrive, so an idle
//! store holds almost nothing). No entry is more than [`PROBE_SLOTS_MAX`] slots from where
//! its hash puts it: an insert that finds no free slot that close is not cached. The hash is
//! fixed (the store has no hidden randomness), so keys chosen to collide could only keep
//! keys out of the cache (each then costs a redb lookup), never make a lookup scan more than
//! that many slots. Removal shifts the entries after it back (no tombstones), so a lookup
//! stops at the first empty slot.
//!
//! Eviction: second chance at random slots. A hit sets the slot's referenced bit; when the
//! cache holds its maximum, it picks pseudo-random slots, clearing the bits it finds set, until
//! it picks an entry whose bit was clear (or has picked [`EVICT_CANDIDATES_MAX`] entries), and
//! evicts that one. Not a CLOCK hand sweeping the array in order: such a hand empties the
//! stretch behind it while inserts land everywhere, so the stretch ahead fills far past 2/3
//! (measured: a quarter of the inserts into a full 100 000-entry cache then found no free slot
//! within the probe limit). Nor a walk forward from a random slot: that mostly finds the first
//! entry of a run, which sits at its home, and leaves the displaced ones (mean distance from
//! home doubled). Uniform picks keep it as after fresh inserts (mean 1.0 slot, no insert
//! turned away). The random numbers come from a fixed seed, so the store stays deterministic.
//! Nothing is allocated per hit or per miss.

use super::{BlockKey, BlockVal};

/// The furthest a slot may be from its hash's home slot.
pub const PROBE_SLOTS_MAX: usize = 128;
/// The array starts this small and doubles.
const INITIAL_SLOTS: usize = 64;
/// An eviction looks at no more entries than this (all referenced: the last one goes).
pub const EVICT_CANDIDATES_MAX: usize = 32;

/// Counts since the store opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockCacheStats {
    /// Lookups (the dirty map did not have the key) answered from the cache.
    pub hits: u64,
    /// Lookups that went to redb.
    pub misses: u64,
    /// Entries dropped to make room.
    pub evictions: u64,
    /// Entries held now.
    pub entries: u64,
}

/// Flags in the top bits of [`Slot::tag`]; the rest is the physical block.
const OCCUPIED: u64 = 1 << 63;
const REFERENCED: u64 = 1 << 62;
/// The key is mapped (`Some((phys, crc))`); clear: cached as absent.
const PRESENT: u64 = 1 << 61;
/// Physical block numbers are below 2^52 (a 16 EiB device), far under this; a larger one
/// would not be cached.
const PHYS_MASK: u64 = PRESENT - 1;

/// One cached entry, the key spelled out so that the slot is 40 bytes (a `BlockKey` tuple
/// alone is 32 with its padding).
#[derive(Clone, Copy, Debug)]
struct Slot {
    pg: u64,
    image: u64,
    index: u64,
    block: u32,
    crc: u32,
    /// Physical block | `PRESENT` | `REFERENCED` | `OCCUPIED`; 0 is an empty slot.
    tag: u64,
}

const _: () = assert!(std::mem::size_of::<Slot>() == 40);

impl Slot {
    const EMPTY: Slot = Slot {
        pg: 0,
        image: 0,
        index: 0,
        block: 0,
        crc: 0,
        tag: 0,
    };

    fn occupied(&self) -> bool {
        self.tag & OCCUPIED != 0
    }

    fn key(&self) -> BlockKey {
        (self.pg, self.image, self.index, self.block)
    }

    fn is(&self, k: &BlockKey) -> bool {
        self.occupied()
            && self.pg == k.0
            && self.image == k.1
            && self.index == k.2
            && self.block == k.3
    }

    fn value(&self) -> Option<BlockVal> {
        (self.tag & PRESENT != 0).then_some((self.tag & PHYS_MASK, self.crc))
    }

    /// Stores `v`, keeping the referenced bit. False if `v` cannot be held (a physical block
    /// above `PHYS_MASK`).
    fn set_value(&mut self, v: Option<BlockVal>) -> bool {
        let keep = self.tag & REFERENCED;
        match v {
            Some((phys, _)) if phys > PHYS_MASK => return false,
            Some((phys, crc)) => {
                self.crc = crc;
                self.tag = OCCUPIED | PRESENT | keep | phys;
            }
            None => {
                self.crc = 0;
                self.tag = OCCUPIED | keep;
            }
        }
        true
    }
}

fn fold(a: u64, b: u64) -> u64 {
    let m = u128::from(a) * u128::from(b);
    (m as u64) ^ ((m >> 64) as u64)
}

fn hash(k: &BlockKey) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut h = 0x243F_6A88_85A3_08D3;
    for x in [k.0, k.1, k.2, u64::from(k.3)] {
        h = fold(h ^ x, K);
    }
    fold(h, K)
}

/// The bounded cache (see the module doc).
pub struct BlockCache {
    slots: Vec<Slot>,
    len: usize,
    entries_max: usize,
    /// The array never grows past this: `entries_max` entries fill it to 2/3.
    slots_max: usize,
    /// xorshift state choosing the slots an eviction looks at.
    rng: u64,
    stats: BlockCacheStats,
}

impl BlockCache {
    /// A cache of at most `entries_max` entries (0: nothing is cached).
    pub fn new(entries_max: usize) -> BlockCache {
        let slots_max = entries_max.saturating_add(entries_max / 2);
        BlockCache {
            slots: Vec::new(),
            len: 0,
            entries_max,
            slots_max,
            rng: 0x9E37_79B9_7F4A_7C15,
            stats: BlockCacheStats::default(),
        }
    }

    pub fn stats(&self) -> BlockCacheStats {
        BlockCacheStats {
            entries: self.len as u64,
            ..self.stats
        }
    }

    fn home(&self, k: &BlockKey) -> usize {
        ((u128::from(hash(k)) * self.slots.len() as u128) >> 64) as usize
    }

    fn next(&self, i: usize) -> usize {
        if i + 1 == self.slots.len() {
            0
        } else {
            i + 1
        }
    }

    fn find(&self, k: &BlockKey) -> Option<usize> {
        if self.slots.is_empty() {
            return None;
        }
        let mut i = self.home(k);
        for _ in 0..=PROBE_SLOTS_MAX.min(self.slots.len() - 1) {
            let s = &self.slots[i];
            if !s.occupied() {
                return None;
            }
            if s.is(k) {
                return Some(i);
            }
            i = self.next(i);
        }
        None
    }

    /// The cached value of `k` (`Some(None)`: cached as absent), counted as a hit or a miss.
    pub fn get(&mut self, k: &BlockKey) -> Option<Option<BlockVal>> {
        match self.find(k) {
            Some(i) => {
                self.stats.hits += 1;
                let s = &mut self.slots[i];
                s.tag |= REFERENCED;
                Some(s.value())
            }
            None => {
                self.stats.misses += 1;
                None
            }
        }
    }

    /// Caches `k`'s flushed value `v` (after a miss), evicting an entry if the cache is full.
    pub fn fill(&mut self, k: BlockKey, v: Option<BlockVal>) {
        if self.entries_max == 0 {
            return;
        }
        if let Some(i) = self.find(&k) {
            if !self.slots[i].set_value(v) {
                self.remove_at(i);
            }
            return;
        }
        if self.len >= self.entries_max {
            self.evict_one();
        }
        if self.len + 1 > self.slots.len() * 2 / 3 && self.slots.len() < self.slots_max {
            self.grow();
        }
        let mut i = self.home(&k);
        for _ in 0..=PROBE_SLOTS_MAX.min(self.slots.len() - 1) {
            if !self.slots[i].occupied() {
                let mut s = Slot {
                    pg: k.0,
                    image: k.1,
                    index: k.2,
                    block: k.3,
                    crc: 0,
                    tag: 0,
                };
                if s.set_value(v) {
                    self.slots[i] = s;
                    self.len += 1;
                }
                return;
            }
            i = self.next(i);
        }
        // No free slot near its home: not cached (see the module doc).
    }

    /// A committed change of `k` to `v`: the cached value, if any, becomes `v`. A key that is
    /// not cached stays so (a flush that carries a deleted PG or an installed snapshot must
    /// not push the working set out).
    pub fn update(&mut self, k: &BlockKey, v: Option<BlockVal>) {
        if let Some(i) = self.find(k) {
            if !self.slots[i].set_value(v) {
                self.remove_at(i);
            }
        }
    }

    /// Doubles the array (up to `slots_max`) and re-inserts every entry.
    fn grow(&mut self) {
        let n = (self.slots.len() * 2)
            .max(INITIAL_SLOTS)
            .min(self.slots_max)
            .max(1);
        let old = std::mem::replace(&mut self.slots, vec![Slot::EMPTY; n]);
        self.len = 0;
        for s in old.into_iter().filter(Slot::occupied) {
            let mut i = self.home(&s.key());
            for _ in 0..=PROBE_SLOTS_MAX.min(n - 1) {
                if !self.slots[i].occupied() {
                    self.slots[i] = s;
                    self.len += 1;
                    break;
                }
                i = self.next(i);
            }
        }
    }

    /// Second chance at random slots (see the module doc): evicts one entry.
    fn evict_one(&mut self) {
        assert!(self.len > 0, "evicting from an empty cache");
        let mut i = 0;
        let mut seen = 0;
        for _ in 0..EVICT_CANDIDATES_MAX * 4 {
            i = self.random_slot();
            let s = &mut self.slots[i];
            if !s.occupied() {
                continue;
            }
            seen += 1;
            if s.tag & REFERENCED == 0 || seen == EVICT_CANDIDATES_MAX {
                self.remove_at(i);
                self.stats.evictions += 1;
                return;
            }
            s.tag &= !REFERENCED;
        }
        // Only a nearly empty array gets here (the cache is full, so at most a third of its
        // slots are empty unless the probe limit turned many inserts away).
        while !self.slots[i].occupied() {
            i = self.next(i);
        }
        self.remove_at(i);
        self.stats.evictions += 1;
    }

    fn random_slot(&mut self) -> usize {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        ((u128::from(self.rng) * self.slots.len() as u128) >> 64) as usize
    }

    /// Empties slot `i`, moving back the entries after it that may move (backward shift).
    fn remove_at(&mut self, mut i: usize) {
        let mut j = i;
        loop {
            j = self.next(j);
            if !self.slots[j].occupied() {
                break;
            }
            let home = self.home(&self.slots[j].key());
            // The entry at `j` may move to `i` unless its home lies cyclically in (i, j].
            let stays = if i <= j {
                i < home && home <= j
            } else {
                i < home || home <= j
            };
            if !stays {
                self.slots[i] = self.slots[j];
                i = j;
            }
        }
        self.slots[i] = Slot::EMPTY;
        self.len -= 1;
    }

    /// Every entry with the distance from its home, for the tests' invariant checks.
    #[cfg(test)]
    fn entries(&self) -> Vec<(BlockKey, Option<BlockVal>, usize)> {
        let n = self.slots.len();
        (0..n)
            .filter(|i| self.slots[*i].occupied())
            .map(|i| {
                let s = &self.slots[i];
                let home = self.home(&s.key());
                (s.key(), s.value(), (i + n - home) % n)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn key(i: u64) -> BlockKey {
        (1 << 32 | (i % 3), 7, i / 16, (i % 16) as u32)
    }

    /// Every entry is reachable: within `PROBE_SLOTS_MAX` of its home with no empty slot in
    /// between, and found by `find`.
    fn check(c: &BlockCache) {
        let entries = c.entries();
        assert_eq!(entries.len(), c.len);
        assert!(c.len <= c.entries_max);
        for (k, _, dist) in entries {
            assert!(dist <= PROBE_SLOTS_MAX, "{k:?} is {dist} slots from home");
            assert!(c.find(&k).is_some(), "{k:?} is not reachable");
        }
    }

    #[test]
    fn hits_misses_and_absent_entries() {
        let mut c = BlockCache::new(100);
        assert_eq!(c.get(&key(1)), None);
        c.fill(key(1), Some((5, 0xABCD)));
        c.fill(key(2), None);
        assert_eq!(c.get(&key(1)), Some(Some((5, 0xABCD))));
        assert_eq!(c.get(&key(2)), Some(None), "absent is cached too");
        assert_eq!(c.get(&key(3)), None);
        let s = c.stats();
        assert_eq!((s.hits, s.misses, s.evictions, s.entries), (2, 2, 0, 2));
    }

    #[test]
    fn update_changes_only_cached_keys() {
        let mut c = BlockCache::new(100);
        c.fill(key(1), None);
        c.fill(key(2), Some((9, 1)));
        c.update(&key(1), Some((3, 4)));
        c.update(&key(2), None);
        c.update(&key(3), Some((8, 8)));
        assert_eq!(c.get(&key(1)), Some(Some((3, 4))));
        assert_eq!(c.get(&key(2)), Some(None));
        assert_eq!(
            c.get(&key(3)),
            None,
            "a committed key that was not cached stays out"
        );
    }

    #[test]
    fn a_physical_block_too_large_to_hold_is_not_cached() {
        let mut c = BlockCache::new(100);
        c.fill(key(1), Some((PHYS_MASK + 1, 0)));
        assert_eq!(c.get(&key(1)), None);
        c.fill(key(2), None);
        c.update(&key(2), Some((u64::MAX, 0)));
        assert_eq!(c.get(&key(2)), None, "dropped rather than kept stale");
        check(&c);
    }

    #[test]
    fn zero_entries_caches_nothing() {
        let mut c = BlockCache::new(0);
        c.fill(key(1), None);
        assert_eq!(c.get(&key(1)), None);
        assert_eq!(c.stats().entries, 0);
    }

    /// A tiny cache under a random stream of fills, updates and gets agrees with a map of
    /// the truth on every hit, stays within its limit and keeps every entry reachable.
    #[test]
    fn tiny_cache_evicts_and_never_answers_wrong() {
        let mut c = BlockCache::new(8);
        let mut truth: BTreeMap<BlockKey, Option<BlockVal>> = BTreeMap::new();
        let mut x = 0x1234_5678_u64;
        for round in 0..20_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let k = key(x % 40);
            let v = (!x.is_multiple_of(5)).then_some((round, round as u32));
            match (x >> 8) % 3 {
                0 => {
                    truth.insert(k, v);
                    c.update(&k, v);
                }
                _ => match c.get(&k) {
                    Some(got) => assert_eq!(Some(&got), truth.get(&k).or(Some(&None))),
                    None => c.fill(k, truth.get(&k).copied().flatten()),
                },
            }
            if round % 97 == 0 {
                check(&c);
            }
        }
        let s = c.stats();
        assert_eq!(s.entries, 8);
        assert!(s.evictions > 1000, "{s:?}");
        assert!(s.hits > 1000, "{s:?}");
    }

    /// Second chance keeps what is used: a hot set looked up between fills of cold keys
    /// stays, though every fill evicts (random eviction alone: 1806 misses, measured).
    #[test]
    fn referenced_entries_survive_a_scan() {
        let mut c = BlockCache::new(64);
        for i in 0..32 {
            c.fill(key(i), None);
        }
        let mut hot_misses = 0;
        for cold in 1000..3000 {
            for i in 0..32 {
                if c.get(&key(i)).is_none() {
                    hot_misses += 1;
                    c.fill(key(i), None);
                }
            }
            if c.get(&key(cold)).is_none() {
                c.fill(key(cold), None);
            }
        }
        check(&c);
        assert!(c.stats().evictions > 1900, "{:?}", c.stats());
        assert!(hot_misses < 200, "{hot_misses} misses of the hot set");
    }

    /// Growing re-inserts everything; a large cache fills to its limit with almost no key
    /// turned away by the probe limit.
    #[test]
    fn grows_to_its_limit() {
        let n = 100_000u64;
        let mut c = BlockCache::new(n as usize);
        for i in 0..n {
            c.fill(key(i), Some((i, i as u32)));
        }
        check(&c);
        assert!(c.stats().entries >= n - n / 1000, "{:?}", c.stats());
        assert!(c.slots.len() <= c.slots_max);
        for i in (0..n).step_by(7) {
            if let Some(v) = c.get(&key(i)) {
                assert_eq!(v, Some((i, i as u32)));
            }
        }
        for i in n..2 * n {
            c.fill(key(i), None);
        }
        check(&c);
        assert!(c.stats().entries >= n - n / 1000, "{:?}", c.stats());
        assert!(c.stats().evictions >= n - n / 1000, "{:?}", c.stats());
    }
}

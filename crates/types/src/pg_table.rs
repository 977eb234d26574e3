//! [`PgTable`]: the PGs of one pool, by sequence number, in chunks shared between copies.
//!
//! Why not a `BTreeMap<u32, PgInfo>`: the monitor works on a copy of its state for every
//! operation, and every daemon installs a new map for every epoch. With 131,072 PGs in a pool
//! a deep copy is some 130,000 allocations (tens of milliseconds), and so is comparing two
//! copies to find what an epoch changed. Here a copy shares every chunk of [`CHUNK_PGS`] PGs
//! with its original until one of its PGs is changed ([`PgTable::get_mut`] copies that chunk
//! alone), so copying costs one reference count per chunk, and [`PgTable::diff`] skips the
//! chunks both sides still share: what an operation costs grows with what it changes, not
//! with the size of the pool. Inside a chunk each PG is shared too, so copying a chunk costs
//! a reference count per PG, not a deep copy: a host going out at 131,072 PGs changes some
//! 8,000 PGs spread over every chunk, and each holder of the pool's whole map (the monitor, a
//! client) copied every PG of the pool at that epoch.
//!
//! It reads and writes as JSON exactly as the map it replaces, `{"<seq>": PgInfo, ...}`.

use crate::map::PgInfo;
use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeMap;
use std::sync::Arc;

/// PGs per chunk: a change copies one chunk (256 references to PGs), a copy of the table
/// costs one reference count per chunk (512 at 131,072 PGs).
pub const CHUNK_PGS: u32 = 256;

type Chunk = BTreeMap<u32, Arc<PgInfo>>;

/// The PGs of a pool by sequence number (see the module documentation).
#[derive(Clone, Default)]
pub struct PgTable {
    chunks: BTreeMap<u32, Arc<Chunk>>,
    len: usize,
}

/// One difference between two tables ([`PgTable::diff`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PgChange<'a> {
    Added(u32, &'a PgInfo),
    Changed(u32, &'a PgInfo, &'a PgInfo),
    Removed(u32, &'a PgInfo),
}

impl PgChange<'_> {
    pub fn seq(&self) -> u32 {
        match *self {
            PgChange::Added(s, _) | PgChange::Changed(s, _, _) | PgChange::Removed(s, _) => s,
        }
    }
}

fn chunk_of(seq: u32) -> u32 {
    seq / CHUNK_PGS
}

impl PgTable {
    pub fn new() -> Self {
        PgTable::default()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn get(&self, seq: &u32) -> Option<&PgInfo> {
        self.chunks.get(&chunk_of(*seq))?.get(seq).map(|p| &**p)
    }

    pub fn contains_key(&self, seq: &u32) -> bool {
        self.get(seq).is_some()
    }

    /// The PG to change, its chunk copied first if another table shares it.
    pub fn get_mut(&mut self, seq: &u32) -> Option<&mut PgInfo> {
        let chunk = self.chunks.get_mut(&chunk_of(*seq))?;
        if !chunk.contains_key(seq) {
            return None;
        }
        Arc::make_mut(chunk).get_mut(seq).map(Arc::make_mut)
    }

    pub fn insert(&mut self, seq: u32, pg: PgInfo) -> Option<PgInfo> {
        let chunk = self.chunks.entry(chunk_of(seq)).or_default();
        let old = Arc::make_mut(chunk).insert(seq, Arc::new(pg));
        if old.is_none() {
            self.len += 1;
        }
        old.map(Arc::unwrap_or_clone)
    }

    pub fn remove(&mut self, seq: &u32) -> Option<PgInfo> {
        let index = chunk_of(*seq);
        let chunk = self.chunks.get_mut(&index)?;
        if !chunk.contains_key(seq) {
            return None;
        }
        let old = Arc::make_mut(chunk).remove(seq);
        if chunk.is_empty() {
            self.chunks.remove(&index);
        }
        self.len -= 1;
        old.map(Arc::unwrap_or_clone)
    }

    /// Every PG in sequence order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&u32, &PgInfo)> + '_ {
        self.chunks
            .values()
            .flat_map(|c| c.iter().map(|(s, p)| (s, &**p)))
    }

    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &u32> + '_ {
        self.iter().map(|(k, _)| k)
    }

    pub fn values(&self) -> impl DoubleEndedIterator<Item = &PgInfo> + '_ {
        self.iter().map(|(_, v)| v)
    }

    /// Every PG, to change: copies every chunk another table shares. For a change of some
    /// PGs only, find them with [`PgTable::iter`] and change each with [`PgTable::get_mut`].
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&u32, &mut PgInfo)> + '_ {
        self.chunks.values_mut().flat_map(|c| {
            Arc::make_mut(c)
                .iter_mut()
                .map(|(s, p)| (s, Arc::make_mut(p)))
        })
    }

    /// Like [`PgTable::iter_mut`], values only.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut PgInfo> + '_ {
        self.iter_mut().map(|(_, v)| v)
    }

    /// Changes the PGs `f` returns `true` for after changing them; chunks where `f` changed
    /// nothing are not copied (`f` is handed a copy to try first).
    pub fn update_where(&mut self, mut f: impl FnMut(u32, &mut PgInfo) -> bool) -> usize {
        let mut changed = 0;
        for chunk in self.chunks.values_mut() {
            let mut updates = Vec::new();
            for (seq, pg) in chunk.iter() {
                let mut next = PgInfo::clone(pg);
                if f(*seq, &mut next) && next != **pg {
                    updates.push((*seq, next));
                }
            }
            if updates.is_empty() {
                continue;
            }
            changed += updates.len();
            let chunk = Arc::make_mut(chunk);
            for (seq, pg) in updates {
                chunk.insert(seq, Arc::new(pg));
            }
        }
        changed
    }

    /// Keeps the PGs `keep` says yes to.
    pub fn retain(&mut self, mut keep: impl FnMut(&u32, &PgInfo) -> bool) {
        let mut len = 0;
        self.chunks.retain(|_, chunk| {
            if chunk.iter().any(|(s, p)| !keep(s, p)) {
                // Called again on the kept ones only: `keep` must not count on being called
                // once per PG.
                Arc::make_mut(chunk).retain(|s, p| keep(s, p));
            }
            len += chunk.len();
            !chunk.is_empty()
        });
        self.len = len;
    }

    /// What changed from `self` to `other`, in sequence order. Chunks the two tables share
    /// are skipped without looking inside.
    pub fn diff<'a>(&'a self, other: &'a PgTable) -> Vec<PgChange<'a>> {
        let mut out = Vec::new();
        let indexes: std::collections::BTreeSet<u32> = self
            .chunks
            .keys()
            .chain(other.chunks.keys())
            .copied()
            .collect();
        for index in indexes {
            match (self.chunks.get(&index), other.chunks.get(&index)) {
                (Some(a), Some(b)) if Arc::ptr_eq(a, b) => {}
                (Some(a), Some(b)) => {
                    for (seq, old) in a.iter() {
                        match b.get(seq) {
                            // A PG both copies share is equal without a look.
                            Some(new) if Arc::ptr_eq(new, old) || new == old => {}
                            Some(new) => out.push(PgChange::Changed(*seq, old, new)),
                            None => out.push(PgChange::Removed(*seq, old)),
                        }
                    }
                    for (seq, new) in b.iter() {
                        if !a.contains_key(seq) {
                            out.push(PgChange::Added(*seq, new));
                        }
                    }
                }
                (Some(a), None) => out.extend(a.iter().map(|(s, p)| PgChange::Removed(*s, p))),
                (None, Some(b)) => out.extend(b.iter().map(|(s, p)| PgChange::Added(*s, p))),
                (None, None) => unreachable!("an index comes from one of the tables"),
            }
        }
        out.sort_by_key(PgChange::seq);
        out
    }

    /// The PGs with `lo <= seq < hi`, in sequence order.
    pub fn range(&self, lo: u32, hi: u32) -> impl Iterator<Item = (&u32, &PgInfo)> + '_ {
        let chunks = if lo < hi {
            self.chunks.range(chunk_of(lo)..=chunk_of(hi - 1))
        } else {
            self.chunks.range(1..1)
        };
        chunks.flat_map(move |(_, c)| c.range(lo..hi).map(|(s, p)| (s, &**p)))
    }

    /// The sequence ranges of the chunks `self` does not share with `before` (held by either
    /// table, changed or not): outside them, the two tables hold the same PGs. Found without
    /// looking inside a chunk, in chunk order.
    pub fn unshared_seq_ranges(&self, before: &PgTable) -> Vec<std::ops::Range<u32>> {
        let indexes: std::collections::BTreeSet<u32> = self
            .chunks
            .keys()
            .chain(before.chunks.keys())
            .copied()
            .filter(|i| !self.shares_chunk(before, *i))
            .collect();
        indexes
            .into_iter()
            .map(|i| i * CHUNK_PGS..(i * CHUNK_PGS).saturating_add(CHUNK_PGS))
            .collect()
    }

    /// Whether both tables hold chunk `index` and share it (then it is equal, without
    /// comparing).
    fn shares_chunk(&self, other: &PgTable, index: u32) -> bool {
        match (self.chunks.get(&index), other.chunks.get(&index)) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// Whether the two tables share every chunk (then they are equal, without comparing).
    pub fn shares_all(&self, other: &PgTable) -> bool {
        self.chunks.len() == other.chunks.len()
            && self
                .chunks
                .iter()
                .zip(&other.chunks)
                .all(|((i, a), (j, b))| i == j && Arc::ptr_eq(a, b))
    }
}

impl PartialEq for PgTable {
    /// Chunk by chunk, a chunk both tables share counted equal without a look: comparing a
    /// state with the copy an operation changed costs what the operation changed (the
    /// monitor does it at every commit).
    fn eq(&self, other: &Self) -> bool {
        if self.len != other.len {
            return false;
        }
        if self.chunks.keys().eq(other.chunks.keys()) {
            // The same chunks hold the same sequence numbers on both sides.
            return self
                .chunks
                .values()
                .zip(other.chunks.values())
                .all(|(a, b)| Arc::ptr_eq(a, b) || a == b);
        }
        self.iter().eq(other.iter())
    }
}

impl Eq for PgTable {}

impl std::fmt::Debug for PgTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl FromIterator<(u32, PgInfo)> for PgTable {
    fn from_iter<I: IntoIterator<Item = (u32, PgInfo)>>(iter: I) -> Self {
        let mut t = PgTable::new();
        for (seq, pg) in iter {
            t.insert(seq, pg);
        }
        t
    }
}

impl From<BTreeMap<u32, PgInfo>> for PgTable {
    fn from(map: BTreeMap<u32, PgInfo>) -> Self {
        map.into_iter().collect()
    }
}

impl<'a> IntoIterator for &'a PgTable {
    type Item = (&'a u32, &'a PgInfo);
    type IntoIter = Box<dyn Iterator<Item = (&'a u32, &'a PgInfo)> + 'a>;
    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

impl std::ops::Index<&u32> for PgTable {
    type Output = PgInfo;
    fn index(&self, seq: &u32) -> &PgInfo {
        self.get(seq).expect("no PG of that sequence number")
    }
}

impl Serialize for PgTable {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.len))?;
        for (seq, pg) in self.iter() {
            map.serialize_entry(seq, pg)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for PgTable {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TableVisitor;
        impl<'de> Visitor<'de> for TableVisitor {
            type Value = PgTable;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a map of PG sequence numbers to PGs")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<PgTable, A::Error> {
                let mut t = PgTable::new();
                while let Some((seq, pg)) = access.next_entry::<u32, PgInfo>()? {
                    if t.insert(seq, pg).is_some() {
                        return Err(serde::de::Error::custom(format!("PG {seq} twice")));
                    }
                }
                Ok(t)
            }
        }
        deserializer.deserialize_map(TableVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LogIndex, OsdId, PgState, Term};
    use proptest::prelude::*;

    fn pg(osd: u32) -> PgInfo {
        PgInfo {
            version: 1,
            state: PgState::ACTIVE,
            osdlist: vec![OsdId(osd)],
            newosdlist: Vec::new(),
            learners: Vec::new(),
            joint_voters: Vec::new(),
            released: Vec::new(),
            restored: false,
            leader: Some(OsdId(osd)),
            leader_term: Term(1),
            conf_index: LogIndex(1),
        }
    }

    #[test]
    fn a_copy_shares_its_chunks_until_one_pg_changes() {
        let t: PgTable = (0..1000).map(|s| (s, pg(1))).collect();
        let mut c = t.clone();
        assert!(c.shares_all(&t));
        c.get_mut(&700).unwrap().leader = Some(OsdId(2));
        assert!(!c.shares_all(&t));
        let d = t.diff(&c);
        assert_eq!(d.len(), 1);
        assert!(
            matches!(d[0], PgChange::Changed(700, a, b) if a.leader == Some(OsdId(1)) && b.leader == Some(OsdId(2)))
        );
        // Only that chunk was copied.
        let shared = t
            .chunks
            .iter()
            .filter(|(i, a)| Arc::ptr_eq(a, &c.chunks[i]))
            .count();
        assert_eq!(shared, t.chunks.len() - 1);
        // And of that chunk, only the PG changed: the others are still shared.
        let (a, b) = (&t.chunks[&(700 / CHUNK_PGS)], &c.chunks[&(700 / CHUNK_PGS)]);
        let kept = a.iter().filter(|(s, p)| Arc::ptr_eq(p, &b[*s])).count();
        assert_eq!(kept, a.len() - 1);
        assert_eq!(
            t.get(&700).unwrap().leader,
            Some(OsdId(1)),
            "the original is unchanged"
        );
        // A change to a copy that changes nothing copies nothing.
        let mut d2 = t.clone();
        assert_eq!(
            d2.update_where(|_, p| {
                p.version = 1;
                true
            }),
            0
        );
        assert!(d2.shares_all(&t));
    }

    #[test]
    fn json_is_the_map_it_replaces() {
        let t: PgTable = [(3, pg(1)), (700, pg(2))].into_iter().collect();
        let as_map: BTreeMap<u32, PgInfo> = [(3, pg(1)), (700, pg(2))].into_iter().collect();
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(json, serde_json::to_string(&as_map).unwrap());
        let back: PgTable = serde_json::from_str(&json).unwrap();
        assert_eq!(back, t);
        assert!(serde_json::from_str::<PgTable>(r#"{"1":null}"#).is_err());
    }

    proptest! {
        /// Against a `BTreeMap` model: inserts, removals and changes, then the table's
        /// content, length, order and its diff from a copy taken at the start.
        #[test]
        fn behaves_like_a_btreemap(ops in prop::collection::vec((0u32..2000, 0u8..3, 1u32..9), 0..300)) {
            let mut t = PgTable::new();
            let mut m: BTreeMap<u32, PgInfo> = BTreeMap::new();
            for s in (0..2000).step_by(7) {
                t.insert(s, pg(1));
                m.insert(s, pg(1));
            }
            let start = t.clone();
            let start_model = m.clone();
            for (seq, op, osd) in ops {
                match op {
                    0 => { prop_assert_eq!(t.insert(seq, pg(osd)), m.insert(seq, pg(osd))); }
                    1 => { prop_assert_eq!(t.remove(&seq), m.remove(&seq)); }
                    _ => {
                        if let (Some(a), Some(b)) = (t.get_mut(&seq), m.get_mut(&seq)) {
                            a.leader = Some(OsdId(osd));
                            b.leader = Some(OsdId(osd));
                        }
                    }
                }
            }
            prop_assert_eq!(t.len(), m.len());
            prop_assert!(t.iter().eq(m.iter()));
            // Equality, chunk by chunk, as the models' (shared chunks and copied ones alike,
            // and against a table built afresh, which shares nothing).
            prop_assert_eq!(t == start, m == start_model);
            let fresh: PgTable = m.clone().into_iter().collect();
            prop_assert!(t == fresh);
            let mut changed = fresh.clone();
            if let Some(first) = m.keys().next().copied() {
                if let Some(pg) = changed.get_mut(&first) {
                    pg.version += 1;
                }
                prop_assert!(changed != t);
            }
            let diff: Vec<(u32, Option<PgInfo>, Option<PgInfo>)> = start
                .diff(&t)
                .into_iter()
                .map(|c| match c {
                    PgChange::Added(s, n) => (s, None, Some(n.clone())),
                    PgChange::Changed(s, o, n) => (s, Some(o.clone()), Some(n.clone())),
                    PgChange::Removed(s, o) => (s, Some(o.clone()), None),
                })
                .collect();
            let keys: std::collections::BTreeSet<u32> =
                start_model.keys().chain(m.keys()).copied().collect();
            let expected: Vec<(u32, Option<PgInfo>, Option<PgInfo>)> = keys
                .into_iter()
                .filter(|k| start_model.get(k) != m.get(k))
                .map(|k| (k, start_model.get(&k).cloned(), m.get(&k).cloned()))
                .collect();
            prop_assert_eq!(&diff, &expected);
            // Every PG that differs lies in a range the table does not share with the start.
            let unshared = t.unshared_seq_ranges(&start);
            for (seq, _, _) in &diff {
                let inside = unshared.iter().any(|r| r.contains(seq));
                prop_assert!(inside, "{} outside {:?}", seq, unshared);
            }
        }

        /// `range` is the model's range, whatever the bounds.
        #[test]
        fn range_is_the_btreemaps(
            seqs in prop::collection::btree_set(0u32..3000, 0..200),
            lo in 0u32..3100,
            len in 0u32..1200,
        ) {
            let m: BTreeMap<u32, PgInfo> = seqs.iter().map(|s| (*s, pg(*s % 7))).collect();
            let t: PgTable = m.clone().into_iter().collect();
            let hi = lo.saturating_add(len);
            prop_assert!(t.range(lo, hi).eq(m.range(lo..hi)));
            prop_assert_eq!(t.range(hi, lo).count(), 0, "a reversed range holds nothing");
        }
    }
}

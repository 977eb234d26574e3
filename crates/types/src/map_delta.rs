//! Incremental maps: [`MapDelta`] says what changed from one map epoch to a later one, so that
//! a daemon that has epoch `e` gets only the changes since `e` (like Ceph's incremental OSD
//! maps), not the whole map at every epoch; and [`MapScope`] cuts a map or a delta down to what
//! its holder needs: an OSD the PGs it takes part in, a client the pools it opens.
//!
//! The rules, each property-tested below:
//! - `MapDelta::between(a, b).apply(a) == b`;
//! - `merge`: applying `d1` then `d2` equals applying `d1.merge(d2)`;
//! - scoping: for a scope `s`, `s.map(b) == apply(s.delta(between(a, b)), s.map(a))` followed by
//!   `s.prune` (a PG a daemon no longer takes part in is in the delta once, with the daemon in
//!   `left`, so that it learns it was removed; then it is dropped from its map).
//!
//! The PGs that confirmed a reclaim entry, a snapshot's mark or a trim (`done_pgs`) are cut to
//! what the holder needs: an OSD the PGs it takes part in (what its shards check), a client
//! none; so a reclaim in a pool of 131,072 PGs costs each OSD a few hundred sequence numbers
//! per epoch, not the pool's. A delta cut for an OSD resends, cut, an entry that did not change
//! but whose done set holds a PG the delta brings the OSD, so that the scoping rule holds.
//!
//! Every section of the map is keyed (OSDs by id, PGs by pool and sequence number, images by
//! id, ...): a delta carries the entries that changed, whole, and the keys removed. The small
//! sections (flags, space, auth) go whole when they changed.

use crate::auth::AuthSettings;
use crate::map::{
    ClusterMap, Flags, ImageExtent, ImageTable, OsdInfo, PgInfo, PgMap, PoolInfo, ReclaimEntry,
    ScrubRequest, SnapInfo, SnapTrimEntry, SpaceSettings,
};
use crate::osd_table::OsdTable;
use crate::pg_table::PgChange;
use crate::{Epoch, ImageId, OsdId, PoolId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

/// The entries of one keyed section that changed (whole) and the keys removed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyedDelta<K: Ord, V> {
    #[serde(default = "Vec::new", skip_serializing_if = "Vec::is_empty")]
    pub changed: Vec<(K, V)>,
    #[serde(default = "Vec::new", skip_serializing_if = "Vec::is_empty")]
    pub removed: Vec<K>,
}

impl<K: Ord, V> Default for KeyedDelta<K, V> {
    fn default() -> Self {
        KeyedDelta {
            changed: Vec::new(),
            removed: Vec::new(),
        }
    }
}

impl KeyedDelta<OsdId, OsdInfo> {
    /// [`KeyedDelta::between`] for the OSD table: an OSD both tables share is unchanged
    /// without a look.
    fn between_osds(a: &OsdTable, b: &OsdTable) -> Self {
        KeyedDelta {
            changed: b
                .iter()
                .filter(|(id, o)| !b.shares(a, id) && a.get(id) != Some(o))
                .map(|(id, o)| (*id, o.clone()))
                .collect(),
            removed: a.keys().filter(|id| !b.contains_key(id)).copied().collect(),
        }
    }

    fn apply_osds(&self, table: &mut OsdTable) {
        for id in &self.removed {
            table.remove(id);
        }
        for (id, o) in &self.changed {
            table.insert(*id, o.clone());
        }
    }
}

impl<K: Ord + Clone, V: Clone + PartialEq> KeyedDelta<K, V> {
    pub fn is_empty(&self) -> bool {
        self.changed.is_empty() && self.removed.is_empty()
    }

    fn between(a: &BTreeMap<K, V>, b: &BTreeMap<K, V>) -> Self {
        KeyedDelta {
            changed: b
                .iter()
                .filter(|(k, v)| a.get(k) != Some(v))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            removed: a.keys().filter(|k| !b.contains_key(k)).cloned().collect(),
        }
    }

    fn apply(&self, map: &mut BTreeMap<K, V>) {
        for k in &self.removed {
            map.remove(k);
        }
        for (k, v) in &self.changed {
            map.insert(k.clone(), v.clone());
        }
    }

    /// This delta followed by `next`, as one.
    fn merge(&mut self, next: &Self) {
        let mut changed: BTreeMap<K, V> = std::mem::take(&mut self.changed).into_iter().collect();
        let mut removed: BTreeSet<K> = std::mem::take(&mut self.removed).into_iter().collect();
        for k in &next.removed {
            changed.remove(k);
            removed.insert(k.clone());
        }
        for (k, v) in &next.changed {
            removed.remove(k);
            changed.insert(k.clone(), v.clone());
        }
        self.changed = changed.into_iter().collect();
        self.removed = removed.into_iter().collect();
    }
}

/// One PG in a delta: its new state, and the OSDs that took part in it before and no longer do
/// (so that a delta scoped to one of them still tells it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgEntry {
    pub seq: u32,
    pub pg: PgInfo,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left: Vec<OsdId>,
}

/// The changes to one pool's PG map.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgMapDelta {
    pub pool: PoolId,
    /// The PG map's version after the change.
    pub version: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changed: Vec<PgEntry>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed: Vec<u32>,
}

/// The changes to the image table (see [`ImageTable`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageTableDelta {
    pub next_id: u64,
    #[serde(default, skip_serializing_if = "KeyedDelta::is_empty")]
    pub images: KeyedDelta<ImageId, ImageExtent>,
}

/// What changed from map epoch `from` to `to` (see the module documentation).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapDelta {
    pub from: Epoch,
    pub to: Epoch,
    #[serde(default, skip_serializing_if = "KeyedDelta::is_empty")]
    pub osds: KeyedDelta<OsdId, OsdInfo>,
    #[serde(default, skip_serializing_if = "KeyedDelta::is_empty")]
    pub pools: KeyedDelta<PoolId, PoolInfo>,
    /// PG maps that changed or appeared (a new one has every PG in `changed`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pgmaps: Vec<PgMapDelta>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed_pgmaps: Vec<PoolId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flags: Option<Flags>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub space: Option<SpaceSettings>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<AuthSettings>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images: Option<ImageTableDelta>,
    #[serde(default, skip_serializing_if = "KeyedDelta::is_empty")]
    pub reclaim: KeyedDelta<u64, ReclaimEntry>,
    #[serde(default, skip_serializing_if = "KeyedDelta::is_empty")]
    pub snaps: KeyedDelta<ImageId, Vec<SnapInfo>>,
    #[serde(default, skip_serializing_if = "KeyedDelta::is_empty")]
    pub snap_trims: KeyedDelta<u64, SnapTrimEntry>,
    #[serde(default, skip_serializing_if = "KeyedDelta::is_empty")]
    pub scrub_requests: KeyedDelta<u64, ScrubRequest>,
}

/// Why a [`MapFollower`] did not take an update.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MapRefused {
    /// The delta does not follow the map held: the holder must fetch a whole map.
    #[error(transparent)]
    Gap(#[from] DeltaGap),
    /// The map it would make is in an auth mode weaker than the holder's floor (a downgrade;
    /// `docs/security.md`, "No downgrade"): the map held stays.
    #[error("the map of epoch {epoch} is in auth mode {mode}, below this end's auth floor {floor}: refused (a downgrade; lower the floor with --auth-floor only on purpose)")]
    BelowFloor {
        epoch: Epoch,
        mode: crate::auth::AuthMode,
        floor: crate::auth::AuthMode,
    },
}

/// A delta that does not follow the map it is applied to: the holder must fetch a whole map.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("a map delta from epoch {from} does not apply to a map at epoch {have}")]
pub struct DeltaGap {
    pub from: Epoch,
    pub have: Epoch,
}

impl MapDelta {
    /// What changed from `a` to `b`. Sections `b` shares with `a` cost nothing: a PG table
    /// compares only the chunks the two do not share (`PgTable::diff`).
    pub fn between(a: &ClusterMap, b: &ClusterMap) -> MapDelta {
        let mut pgmaps = Vec::new();
        for (pool, new) in &b.pgmaps {
            let mut d = PgMapDelta {
                pool: *pool,
                version: new.version,
                changed: Vec::new(),
                removed: Vec::new(),
            };
            let empty = PgMap {
                pool: *pool,
                version: 0,
                pgs: Default::default(),
            };
            let old = a.pgmaps.get(pool).unwrap_or(&empty);
            for change in old.pgs.diff(&new.pgs) {
                match change {
                    PgChange::Added(seq, pg) => d.changed.push(PgEntry {
                        seq,
                        pg: pg.clone(),
                        left: Vec::new(),
                    }),
                    PgChange::Changed(seq, before, pg) => {
                        let mut left: Vec<OsdId> = before
                            .members()
                            .filter(|o| !pg.names(**o))
                            .copied()
                            .collect();
                        left.sort_unstable();
                        left.dedup();
                        d.changed.push(PgEntry {
                            seq,
                            pg: pg.clone(),
                            left,
                        });
                    }
                    PgChange::Removed(seq, _) => d.removed.push(seq),
                }
            }
            let existed = a.pgmaps.contains_key(pool);
            if !existed
                || !d.changed.is_empty()
                || !d.removed.is_empty()
                || old.version != new.version
            {
                pgmaps.push(d);
            }
        }
        MapDelta {
            from: a.epoch,
            to: b.epoch,
            // Maps that share their OSDs (most epochs) are not compared entry by entry.
            osds: if std::sync::Arc::ptr_eq(&a.osds, &b.osds) {
                KeyedDelta::default()
            } else {
                KeyedDelta::between_osds(&a.osds, &b.osds)
            },
            pools: KeyedDelta::between(&a.pools, &b.pools),
            pgmaps,
            removed_pgmaps: a
                .pgmaps
                .keys()
                .filter(|p| !b.pgmaps.contains_key(p))
                .copied()
                .collect(),
            flags: (a.flags != b.flags).then_some(b.flags),
            space: (a.space != b.space).then(|| b.space.clone()),
            auth: (a.auth != b.auth).then_some(b.auth),
            images: images_between(a.images.as_ref(), b.images.as_ref()),
            reclaim: KeyedDelta::between(&a.reclaim, &b.reclaim),
            snaps: KeyedDelta::between(&a.snaps, &b.snaps),
            snap_trims: KeyedDelta::between(&a.snap_trims, &b.snap_trims),
            scrub_requests: KeyedDelta::between(&a.scrub_requests, &b.scrub_requests),
        }
    }

    /// Whether it changes nothing but the epoch.
    pub fn is_empty(&self) -> bool {
        self.osds.is_empty()
            && self.pools.is_empty()
            && self.pgmaps.is_empty()
            && self.removed_pgmaps.is_empty()
            && self.flags.is_none()
            && self.space.is_none()
            && self.auth.is_none()
            && self.images.is_none()
            && self.reclaim.is_empty()
            && self.snaps.is_empty()
            && self.snap_trims.is_empty()
            && self.scrub_requests.is_empty()
    }

    /// Applies the delta to `map`, which must be at epoch `from`.
    pub fn apply(&self, map: &mut ClusterMap) -> Result<(), DeltaGap> {
        if map.epoch != self.from {
            return Err(DeltaGap {
                from: self.from,
                have: map.epoch,
            });
        }
        assert!(self.to > self.from, "a delta moves the epoch forward");
        if !self.osds.is_empty() {
            self.osds
                .apply_osds(std::sync::Arc::make_mut(&mut map.osds));
        }
        self.pools.apply(&mut map.pools);
        for pool in &self.removed_pgmaps {
            map.pgmaps.remove(pool);
        }
        for d in &self.pgmaps {
            let pgmap = map.pgmaps.entry(d.pool).or_insert_with(|| PgMap {
                pool: d.pool,
                version: d.version,
                pgs: Default::default(),
            });
            pgmap.version = d.version;
            for seq in &d.removed {
                pgmap.pgs.remove(seq);
            }
            for e in &d.changed {
                pgmap.pgs.insert(e.seq, e.pg.clone());
            }
        }
        if let Some(f) = self.flags {
            map.flags = f;
        }
        if let Some(s) = &self.space {
            map.space = s.clone();
        }
        if let Some(a) = self.auth {
            map.auth = a;
        }
        if let Some(d) = &self.images {
            let table = map.images.get_or_insert_with(ImageTable::default);
            table.next_id = d.next_id;
            d.images.apply(&mut table.images);
        }
        self.reclaim.apply(&mut map.reclaim);
        self.snaps.apply(&mut map.snaps);
        self.snap_trims.apply(&mut map.snap_trims);
        self.scrub_requests.apply(&mut map.scrub_requests);
        map.epoch = self.to;
        Ok(())
    }

    /// This delta followed by `next` (which must start where this one ends), as one delta.
    pub fn merge(&mut self, next: &MapDelta) {
        assert_eq!(self.to, next.from, "deltas merge in order");
        self.osds.merge(&next.osds);
        self.pools.merge(&next.pools);
        for pool in &next.removed_pgmaps {
            self.pgmaps.retain(|d| d.pool != *pool);
            if !self.removed_pgmaps.contains(pool) {
                self.removed_pgmaps.push(*pool);
            }
        }
        for nd in &next.pgmaps {
            // A PG map removed earlier and made again: the removal stays (applied first, it
            // drops the old PGs) and the new map follows whole (`between` lists every PG of a
            // map it did not have before).
            let Some(d) = self.pgmaps.iter_mut().find(|d| d.pool == nd.pool) else {
                self.pgmaps.push(nd.clone());
                continue;
            };
            d.version = nd.version;
            let mut changed: BTreeMap<u32, PgEntry> = std::mem::take(&mut d.changed)
                .into_iter()
                .map(|e| (e.seq, e))
                .collect();
            let mut removed: BTreeSet<u32> = std::mem::take(&mut d.removed).into_iter().collect();
            for seq in &nd.removed {
                changed.remove(seq);
                removed.insert(*seq);
            }
            for e in &nd.changed {
                removed.remove(&e.seq);
                // Who left over both steps: those who left in either and are not back.
                let mut left: BTreeSet<OsdId> = changed
                    .get(&e.seq)
                    .map(|old| old.left.iter().copied().collect())
                    .unwrap_or_default();
                if let Some(old) = changed.get(&e.seq) {
                    left.extend(old.pg.members().copied());
                }
                left.extend(e.left.iter().copied());
                left.retain(|o| !e.pg.names(*o));
                changed.insert(
                    e.seq,
                    PgEntry {
                        seq: e.seq,
                        pg: e.pg.clone(),
                        left: left.into_iter().collect(),
                    },
                );
            }
            d.changed = changed.into_values().collect();
            d.removed = removed.into_iter().collect();
        }
        self.pgmaps.sort_by_key(|d| d.pool);
        self.removed_pgmaps.sort_unstable();
        if next.flags.is_some() {
            self.flags = next.flags;
        }
        if next.space.is_some() {
            self.space.clone_from(&next.space);
        }
        if next.auth.is_some() {
            self.auth = next.auth;
        }
        match (&mut self.images, &next.images) {
            (Some(a), Some(b)) => {
                a.next_id = b.next_id;
                a.images.merge(&b.images);
            }
            (None, Some(b)) => self.images = Some(b.clone()),
            _ => {}
        }
        self.reclaim.merge(&next.reclaim);
        self.snaps.merge(&next.snaps);
        self.snap_trims.merge(&next.snap_trims);
        self.scrub_requests.merge(&next.scrub_requests);
        self.to = next.to;
    }

    /// A copy with each PG map's delta made by `pgmap` (`None`: left out) and each done set
    /// by `cut`: what a scope keeps, without copying what it drops.
    fn copy_cut(
        &self,
        pgmap: impl Fn(&PgMapDelta) -> Option<PgMapDelta>,
        cut: impl Fn(PoolId, &BTreeSet<u32>) -> BTreeSet<u32>,
    ) -> MapDelta {
        MapDelta {
            from: self.from,
            to: self.to,
            osds: self.osds.clone(),
            pools: self.pools.clone(),
            pgmaps: self.pgmaps.iter().filter_map(pgmap).collect(),
            removed_pgmaps: self.removed_pgmaps.clone(),
            flags: self.flags,
            space: self.space.clone(),
            auth: self.auth,
            images: self.images.clone(),
            reclaim: copy_keyed(&self.reclaim, |e| e.copy_cut(&cut)),
            snaps: copy_keyed(&self.snaps, |s| {
                s.iter().map(|s| s.copy_cut(&cut)).collect()
            }),
            snap_trims: copy_keyed(&self.snap_trims, |t| t.copy_cut(&cut)),
            scrub_requests: self.scrub_requests.clone(),
        }
    }
}

fn images_between(a: Option<&ImageTable>, b: Option<&ImageTable>) -> Option<ImageTableDelta> {
    let empty = ImageTable::default();
    let b = b?;
    let a = a.unwrap_or(&empty);
    if a == b {
        return None;
    }
    Some(ImageTableDelta {
        next_id: b.next_id,
        images: KeyedDelta::between(&a.images, &b.images),
    })
}

/// What part of the map a holder needs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum MapScope {
    /// Everything (an admin tool, a frontend serving every pool).
    #[default]
    All,
    /// An OSD: the PGs it takes part in (every pool's PG map is kept, possibly empty, so
    /// that a pool without one still reads as damaged).
    Osd(OsdId),
    /// A client: the PG maps of these pools.
    Pools(BTreeSet<PoolId>),
}

impl MapScope {
    fn keeps_pool(&self, pool: PoolId) -> bool {
        match self {
            MapScope::Pools(p) => p.contains(&pool),
            _ => true,
        }
    }

    /// The PGs of `map` this scope keeps.
    pub fn map(&self, map: &ClusterMap) -> ClusterMap {
        let mut out = map.clone();
        self.prune(&mut out);
        out
    }

    /// Drops from `map` what the scope does not keep (after applying a delta: a PG this OSD
    /// left).
    pub fn prune(&self, map: &mut ClusterMap) {
        match self {
            MapScope::All => {}
            MapScope::Pools(_) => {
                map.pgmaps.retain(|pool, _| self.keeps_pool(*pool));
                for_each_done(map, |_, done| done.clear());
            }
            MapScope::Osd(osd) => {
                for pgmap in map.pgmaps.values_mut() {
                    if pgmap.pgs.iter().any(|(_, pg)| !pg.names(*osd)) {
                        // Built anew from the few PGs kept: a retain would copy every chunk
                        // (an OSD takes part in a few hundred of a pool's PGs at most).
                        pgmap.pgs = pgmap
                            .pgs
                            .iter()
                            .filter(|(_, pg)| pg.names(*osd))
                            .map(|(seq, pg)| (*seq, pg.clone()))
                            .collect();
                    }
                }
                let pgmaps = std::mem::take(&mut map.pgmaps);
                for_each_done(map, |pool, done| {
                    let held = pgmaps.get(&pool).map(|m| &m.pgs);
                    done.retain(|seq| held.is_some_and(|pgs| pgs.get(seq).is_some()));
                });
                map.pgmaps = pgmaps;
            }
        }
    }

    /// The part of `delta` this scope needs; `current` is the map the delta ends at and
    /// `index` its [`PgIndex`] (what an OSD's done sets are cut to); `members` holds the
    /// delta's [`DeltaMembers`] once an OSD's cut has built them (the caller keeps one per
    /// delta, shared by the holders it cuts the delta for).
    ///
    /// Built from `delta` by reference, copying only what the holder gets: at a pool's
    /// creation a delta holds every PG of the pool, and a snapshot's done set grows to the
    /// pool's PG count, while an OSD needs a few hundred of them; the monitor cuts one delta
    /// per holder per epoch, a thousand times an epoch at 1,000 OSDs.
    pub fn delta(
        &self,
        delta: &MapDelta,
        current: &ClusterMap,
        index: &PgIndex,
        members: &OnceLock<DeltaMembers>,
    ) -> MapDelta {
        match self {
            MapScope::All => delta.clone(),
            MapScope::Pools(_) => {
                let mut out = delta.copy_cut(
                    |d| self.keeps_pool(d.pool).then(|| d.clone()),
                    |_, _| BTreeSet::new(),
                );
                out.removed_pgmaps.retain(|p| self.keeps_pool(*p));
                out
            }
            MapScope::Osd(osd) => {
                let osd = *osd;
                let members = members.get_or_init(|| DeltaMembers::of(delta));
                // Removals of PGs it never held are harmless; kept (a pool shrink is rare).
                let pgmap = |d: &PgMapDelta| {
                    Some(PgMapDelta {
                        pool: d.pool,
                        version: d.version,
                        changed: members
                            .entries(osd, d.pool)
                            .iter()
                            .map(|at| d.changed[*at as usize].clone())
                            .collect(),
                        removed: d.removed.clone(),
                    })
                };
                let cut = |pool: PoolId, done: &BTreeSet<u32>| -> BTreeSet<u32> {
                    index
                        .pgs(osd, pool)
                        .iter()
                        .filter(|seq| done.contains(seq))
                        .copied()
                        .collect()
                };
                let mut out = delta.copy_cut(pgmap, cut);
                // The PGs this delta brings the OSD (some it may have had already): an
                // unchanged entry whose done set holds one goes again, so the OSD learns it.
                let brought: BTreeMap<PoolId, BTreeSet<u32>> = out
                    .pgmaps
                    .iter()
                    .map(|d| {
                        let seqs = d.changed.iter().filter(|e| e.pg.names(osd));
                        (d.pool, seqs.map(|e| e.seq).collect())
                    })
                    .collect();
                let names_brought = |pool: PoolId, done: &BTreeSet<u32>| {
                    brought
                        .get(&pool)
                        .is_some_and(|b| b.iter().any(|s| done.contains(s)))
                };
                resend_if(
                    &mut out.reclaim,
                    &current.reclaim,
                    |e| names_brought(e.pool, &e.done_pgs),
                    |e| e.copy_cut(&cut),
                );
                resend_if(
                    &mut out.snaps,
                    &current.snaps,
                    |snaps| snaps.iter().any(|s| names_brought(s.pool, &s.done_pgs)),
                    |snaps| snaps.iter().map(|s| s.copy_cut(&cut)).collect(),
                );
                resend_if(
                    &mut out.snap_trims,
                    &current.snap_trims,
                    |t| names_brought(t.pool, &t.done_pgs),
                    |t| t.copy_cut(&cut),
                );
                out
            }
        }
    }
}

/// For each OSD, the PG changes of one delta that name it (the PG's members after the change,
/// or those that left it), by pool, as positions in the pool's `changed` list, in order: built
/// in one pass over the delta, so that cutting it for each of a thousand OSDs
/// ([`MapScope::delta`]) costs each OSD its own entries. At a pool's creation the delta holds
/// every PG of the pool, and looking at each of 131,072 for each of 1,000 OSDs took the monitor
/// 2.2 s (`docs/scale.md`, run K).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeltaMembers {
    by_osd: BTreeMap<OsdId, BTreeMap<PoolId, Vec<u32>>>,
}

impl DeltaMembers {
    pub fn of(delta: &MapDelta) -> Self {
        let mut by_osd: BTreeMap<OsdId, BTreeMap<PoolId, Vec<u32>>> = BTreeMap::new();
        for d in &delta.pgmaps {
            for (at, e) in d.changed.iter().enumerate() {
                let at = u32::try_from(at).expect("a pool's PGs are counted in u32");
                for osd in e.pg.members().chain(&e.left) {
                    let entries = by_osd.entry(*osd).or_default().entry(d.pool).or_default();
                    // An OSD listed twice in one entry (voter and learner, say) counts once.
                    if entries.last() != Some(&at) {
                        entries.push(at);
                    }
                }
            }
        }
        DeltaMembers { by_osd }
    }

    /// The positions in `pool`'s changed list of the entries that name `osd`, ascending.
    pub fn entries(&self, osd: OsdId, pool: PoolId) -> &[u32] {
        self.by_osd
            .get(&osd)
            .and_then(|pools| pools.get(&pool))
            .map_or(&[], Vec::as_slice)
    }
}

/// The PGs each OSD takes part in, by pool, of one map: built in one pass over its PGs, so
/// that cutting a done set down to an OSD's PGs costs that OSD's PGs, not the pool's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PgIndex {
    by_osd: BTreeMap<OsdId, BTreeMap<PoolId, Vec<u32>>>,
}

impl PgIndex {
    pub fn of(map: &ClusterMap) -> Self {
        let mut by_osd: BTreeMap<OsdId, BTreeMap<PoolId, Vec<u32>>> = BTreeMap::new();
        for (pool, pgmap) in &map.pgmaps {
            for (seq, pg) in pgmap.pgs.iter() {
                for osd in pg.members() {
                    let seqs = by_osd.entry(*osd).or_default().entry(*pool).or_default();
                    // Members listed twice (in `osdlist` and `learners`, say) count once.
                    if seqs.last() != Some(seq) {
                        seqs.push(*seq);
                    }
                }
            }
        }
        PgIndex { by_osd }
    }

    /// Makes this index, of `before`, the index of the map `delta` (one step, from `before`)
    /// leads to, in work proportional to the PGs the delta changes rather than to the map's:
    /// the monitor keeps one across epochs, and at 131,072 PGs building it anew each epoch
    /// walks some 400,000 replicas.
    pub fn advance(&mut self, before: &ClusterMap, delta: &MapDelta) {
        assert_eq!(
            before.epoch, delta.from,
            "the index advances from its own map"
        );
        for pool in &delta.removed_pgmaps {
            for pools in self.by_osd.values_mut() {
                pools.remove(pool);
            }
        }
        for d in &delta.pgmaps {
            let old = before.pgmaps.get(&d.pool);
            let was = |seq: &u32| old.and_then(|m| m.pgs.get(seq));
            for seq in &d.removed {
                for osd in was(seq).into_iter().flat_map(PgInfo::members) {
                    self.remove(*osd, d.pool, *seq);
                }
            }
            for e in &d.changed {
                for osd in was(&e.seq).into_iter().flat_map(PgInfo::members) {
                    if !e.pg.names(*osd) {
                        self.remove(*osd, d.pool, e.seq);
                    }
                }
                for osd in e.pg.members() {
                    let seqs = self
                        .by_osd
                        .entry(*osd)
                        .or_default()
                        .entry(d.pool)
                        .or_default();
                    if let Err(at) = seqs.binary_search(&e.seq) {
                        seqs.insert(at, e.seq);
                    }
                }
            }
        }
        self.by_osd.retain(|_, pools| {
            pools.retain(|_, seqs| !seqs.is_empty());
            !pools.is_empty()
        });
    }

    fn remove(&mut self, osd: OsdId, pool: PoolId, seq: u32) {
        if let Some(seqs) = self.by_osd.get_mut(&osd).and_then(|p| p.get_mut(&pool)) {
            if let Ok(at) = seqs.binary_search(&seq) {
                seqs.remove(at);
            }
        }
    }

    /// The PGs of `pool` that `osd` takes part in, in order.
    pub fn pgs(&self, osd: OsdId, pool: PoolId) -> &[u32] {
        self.by_osd
            .get(&osd)
            .and_then(|p| p.get(&pool))
            .map_or(&[], Vec::as_slice)
    }
}

/// Calls `f` with every done set of `map` and its pool.
fn for_each_done(map: &mut ClusterMap, mut f: impl FnMut(PoolId, &mut BTreeSet<u32>)) {
    for e in map.reclaim.values_mut() {
        f(e.pool, &mut e.done_pgs);
    }
    for s in map.snaps.values_mut().flatten() {
        f(s.pool, &mut s.done_pgs);
    }
    for t in map.snap_trims.values_mut() {
        f(t.pool, &mut t.done_pgs);
    }
}

/// An entry with a done set, copied with that set cut (by `cut`, from the pool and the whole
/// set) without copying the whole set first. Each field is named, so that a field added to the
/// entry is not forgotten here.
trait CopyCut {
    fn copy_cut(&self, cut: &impl Fn(PoolId, &BTreeSet<u32>) -> BTreeSet<u32>) -> Self;
}

impl CopyCut for ReclaimEntry {
    fn copy_cut(&self, cut: &impl Fn(PoolId, &BTreeSet<u32>) -> BTreeSet<u32>) -> Self {
        ReclaimEntry {
            id: self.id,
            pool: self.pool,
            image: self.image,
            image_name: self.image_name.clone(),
            object_size_bytes: self.object_size_bytes,
            from_bytes: self.from_bytes,
            to_bytes: self.to_bytes,
            reason: self.reason.clone(),
            epoch: self.epoch,
            done_pgs: cut(self.pool, &self.done_pgs),
        }
    }
}

impl CopyCut for SnapInfo {
    fn copy_cut(&self, cut: &impl Fn(PoolId, &BTreeSet<u32>) -> BTreeSet<u32>) -> Self {
        SnapInfo {
            id: self.id,
            pool: self.pool,
            image: self.image,
            image_name: self.image_name.clone(),
            name: self.name.clone(),
            state: self.state,
            size_bytes: self.size_bytes,
            object_size_bytes: self.object_size_bytes,
            created_epoch: self.created_epoch,
            protected: self.protected,
            done_pgs: cut(self.pool, &self.done_pgs),
            started_at_ms: self.started_at_ms,
            parent_overlap_bytes: self.parent_overlap_bytes,
        }
    }
}

impl CopyCut for SnapTrimEntry {
    fn copy_cut(&self, cut: &impl Fn(PoolId, &BTreeSet<u32>) -> BTreeSet<u32>) -> Self {
        SnapTrimEntry {
            id: self.id,
            pool: self.pool,
            image: self.image,
            image_name: self.image_name.clone(),
            snap: self.snap,
            reason: self.reason.clone(),
            epoch: self.epoch,
            done_pgs: cut(self.pool, &self.done_pgs),
        }
    }
}

fn copy_keyed<K: Ord + Clone, V>(d: &KeyedDelta<K, V>, copy: impl Fn(&V) -> V) -> KeyedDelta<K, V> {
    KeyedDelta {
        changed: d
            .changed
            .iter()
            .map(|(k, v)| (k.clone(), copy(v)))
            .collect(),
        removed: d.removed.clone(),
    }
}

/// Adds to `delta` every entry of `current` it does not carry for which `again` holds, as
/// `copy` makes it.
fn resend_if<K: Ord + Clone, V>(
    delta: &mut KeyedDelta<K, V>,
    current: &BTreeMap<K, V>,
    again: impl Fn(&V) -> bool,
    copy: impl Fn(&V) -> V,
) {
    let carried: BTreeSet<K> = delta.changed.iter().map(|(k, _)| k.clone()).collect();
    let extra: Vec<(K, V)> = current
        .iter()
        .filter(|(k, v)| !carried.contains(*k) && again(v))
        .map(|(k, v)| (k.clone(), copy(v)))
        .collect();
    if !extra.is_empty() {
        delta.changed.extend(extra);
        delta.changed.sort_by(|a, b| a.0.cmp(&b.0));
    }
}

/// One answer to "what changed since epoch `e`" for one holder.
// Made once per answer and moved a few times: the size of its variants does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MapUpdate {
    /// Nothing newer than what the holder has.
    UpToDate,
    /// The changes since the holder's epoch, scoped.
    Delta(MapDelta),
    /// The whole map, scoped: on first contact, or when the holder is too far behind for the
    /// deltas kept.
    Full(ClusterMap),
}

/// A holder's copy of the map, kept up to date with [`MapUpdate`]s: what OSDs, clients and the
/// simulator's nodes follow the map with. Each update makes a new map (sharing what did not
/// change with the last) so that readers can hold one as long as they like.
#[derive(Clone, Debug)]
pub struct MapFollower {
    scope: MapScope,
    map: Option<std::sync::Arc<ClusterMap>>,
    /// The weakest auth mode a map it takes may be in.
    floor: crate::auth::AuthMode,
}

impl MapFollower {
    pub fn new(scope: MapScope) -> Self {
        MapFollower {
            scope,
            map: None,
            floor: crate::auth::AuthMode::None,
        }
    }

    /// Refuses, from then on, every map in an auth mode weaker than `floor`.
    pub fn with_auth_floor(mut self, floor: crate::auth::AuthMode) -> Self {
        self.floor = floor;
        self
    }

    fn admit(&self, map: &ClusterMap) -> Result<(), MapRefused> {
        if map.auth.mode < self.floor {
            return Err(MapRefused::BelowFloor {
                epoch: map.epoch,
                mode: map.auth.mode,
                floor: self.floor,
            });
        }
        Ok(())
    }

    pub fn scope(&self) -> &MapScope {
        &self.scope
    }

    /// Changes what it follows: the next update it asks for must be a whole map.
    pub fn set_scope(&mut self, scope: MapScope) {
        if scope != self.scope {
            self.scope = scope;
            self.map = None;
        }
    }

    /// The epoch it has (0: none yet; ask for a whole map).
    pub fn epoch(&self) -> Epoch {
        self.map.as_ref().map_or(Epoch(0), |m| m.epoch)
    }

    pub fn map(&self) -> Option<std::sync::Arc<ClusterMap>> {
        self.map.clone()
    }

    /// Takes an update. Returns the new map if the update moved it forward; a whole map not
    /// newer than the one held is ignored; a delta that does not follow it is a
    /// [`MapRefused::Gap`] (the map is dropped, so the next request asks for a whole one); a
    /// map below the auth floor is [`MapRefused::BelowFloor`] (the map held stays).
    pub fn apply(
        &mut self,
        update: MapUpdate,
    ) -> Result<Option<std::sync::Arc<ClusterMap>>, MapRefused> {
        match update {
            MapUpdate::UpToDate => Ok(None),
            MapUpdate::Full(mut map) => {
                if self.map.as_ref().is_some_and(|m| m.epoch >= map.epoch) {
                    return Ok(None);
                }
                self.admit(&map)?;
                self.scope.prune(&mut map);
                let map = std::sync::Arc::new(map);
                self.map = Some(map.clone());
                Ok(Some(map))
            }
            MapUpdate::Delta(delta) => {
                let Some(current) = &self.map else {
                    return Err(DeltaGap {
                        from: delta.from,
                        have: Epoch(0),
                    }
                    .into());
                };
                if delta.to <= current.epoch {
                    return Ok(None);
                }
                let mut next = (**current).clone();
                if let Err(gap) = delta.apply(&mut next) {
                    self.map = None;
                    return Err(gap.into());
                }
                self.admit(&next)?;
                self.scope.prune(&mut next);
                let next = std::sync::Arc::new(next);
                self.map = Some(next.clone());
                Ok(Some(next))
            }
        }
    }
}

#[cfg(test)]
mod tests;

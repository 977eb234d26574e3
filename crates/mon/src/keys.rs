//! The etcd keyspace: every key the monitor writes, in one place (documented in
//! `docs/etcd-keys.md`). All values are JSON.
//!
//! ```text
//! <prefix>/epoch                   {"epoch":N}            bumped by every change
//! <prefix>/counters                Counters               next ids; ids are never reused
//! <prefix>/flags                   Flags                  noout, norebalance
//! <prefix>/space                   SpaceSettings          full ratios, full OSDs (once set)
//! <prefix>/pending                 Pending                deferred work (rebalance)
//! <prefix>/osds/<id>               OsdInfo
//! <prefix>/pools/<id>              PoolInfo
//! <prefix>/pgmaps/<pool id>        PgMap                  one pool's PG map: pool, version
//!                                                         (`pgs` empty; older monitors put
//!                                                         every PG here, still read)
//! <prefix>/pgs/<pool id>/<seq>    {"<seq>":PgInfo}        one PG of the pool
//! <prefix>/pgmaps/<pool id>/<chunk> {"<seq>":PgInfo,..}   seq/256 == chunk: the layout before
//!                                                         `pgs/`, still read, then rewritten
//! <prefix>/images/<pool id>/<name> ImageInfo
//! <prefix>/reclaim/<id>            ReclaimEntry           data the data path must delete
//! <prefix>/snaps/<image id>/<snap id>  SnapInfo           a live snapshot of an image
//! <prefix>/snaptrim/<id>           SnapTrimEntry          a snapshot the PGs must drop
//! <prefix>/scrub/next-id           {"next_id":N}          next scrub request id (once used)
//! <prefix>/scrub/requests/<id>     ScrubRequest           a PG scrub an operator asked for
//! <prefix>/auth/config             AuthSettings           auth mode and key-table epoch
//! <prefix>/auth/entities/<entity>  {sealed,caps,generation} one entity's key, sealed
//!                                                         (`crate::key_seal`)
//! <prefix>/mon/leader              MonMember              held with the leader's lease
//! <prefix>/mon/members/<name>      MonMember              each monitor, with its own lease
//! <prefix>/mon/restore             RestoreMarker          the backup a restore wrote (once)
//! ```
//!
//! A pool's PGs are stored [`PG_KEY_PGS`] to a key (one: some 160 bytes), so a commit
//! rewrites the PGs that changed, not the pool's whole PG map ([`Keyspace::changes`]); the
//! keys of the other records are small.

use crate::key_seal::{open_value, ClearEntity, KeyTableSeal};
use fastblock_mon_core::auth_ops::AuthEntity;
use fastblock_mon_core::state::{MonState, Pending};
use fastblock_types::auth::AuthSettings;
use fastblock_types::map::PgInfo;
use fastblock_types::map::{
    Counters, Flags, ImageInfo, OsdInfo, PgMap, PoolInfo, ReclaimEntry, ScrubRequest, SnapInfo,
    SnapTrimEntry, SpaceSettings,
};
use fastblock_types::pg_table::{PgTable, CHUNK_PGS};
use fastblock_types::{Epoch, PoolId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::sync::Arc;

/// PGs per etcd key of a pool's PGs (`pgs/<pool>/<index>`: the PGs whose `seq / PG_KEY_PGS`
/// is `index`). An event rewrites every key holding a PG it changed, and the PGs of the OSDs
/// it concerns lie spread over the pool: what an event writes is this many times the PGs it
/// changes, until every key is touched. At 256 PGs to a key (the layout before), commits of a
/// rolling restart at 131,072 PGs commonly rewrote 13 MB (most of the 512 keys); etcd keeps
/// its recent Raft log in memory, and the restart of 1,000 OSDs got it killed at 19 GiB
/// (`docs/scale.md`). One PG per key writes what changed and no more; it costs more keys to load (paged by thousands,
/// `crate::store::LOAD_PG_PAGE_KEYS`) and more operations per commit (cut into transactions
/// as `crate::txn_limits` says).
pub const PG_KEY_PGS: u32 = 1;
#[allow(clippy::modulo_one)] // one PG per key today; the bound holds for any choice
const _: () = assert!(
    CHUNK_PGS % PG_KEY_PGS == 0,
    "a chunk of the PG table holds whole keys"
);
/// PGs per key in the layout before `pgs/` (`pgmaps/<pool>/<chunk>`, `seq / 256`): read, and
/// rewritten in `pgs/` keys by the first commit after the load.
const OLD_KEY_PGS: u32 = 256;

/// The keys under one prefix. Its values are the clear forms; with a seal (every monitor
/// has one, from its secret: `crate::server`), what goes to etcd is sealed
/// ([`Keyspace::stored_value`]) and what comes from it opened ([`Keyspace::open_stored`]).
#[derive(Clone, Debug)]
pub struct Keyspace {
    prefix: String,
    seal: Option<Arc<KeyTableSeal>>,
}

#[derive(Debug, Serialize, Deserialize)]
struct EpochValue {
    epoch: Epoch,
}

/// The scrub request counter. Its own key, not a field of `Counters`, which is shared with the
/// data path's types; written only once a request was made, so a cluster that never scrubbed
/// on request stays readable by monitors that predate scrub.
#[derive(Debug, Serialize, Deserialize)]
struct ScrubCounterValue {
    next_id: u64,
}

/// A key the monitor did not expect or could not parse: the state in etcd is damaged or was
/// written by something else. The monitor refuses to lead on it rather than guess.
#[derive(Debug, thiserror::Error)]
#[error("etcd key {key}: {reason}")]
pub struct KeyError {
    pub key: String,
    pub reason: String,
}

impl Keyspace {
    pub fn new(prefix: &str) -> Self {
        Keyspace {
            prefix: prefix.trim_end_matches('/').to_string(),
            seal: None,
        }
    }

    /// This keyspace with the key table sealed under `seal` in etcd.
    pub fn with_seal(mut self, seal: Arc<KeyTableSeal>) -> Self {
        self.seal = Some(seal);
        self
    }

    /// The entity whose key table entry `key` is, if it is one.
    pub fn entity_of<'k>(&self, key: &'k str) -> Option<&'k str> {
        key.strip_prefix(&self.prefix)?
            .strip_prefix("/auth/entities/")
            .filter(|e| !e.is_empty() && !e.contains('/'))
    }

    /// What to put in etcd for `key` with the clear form `value`: a key table entry sealed
    /// (a fresh nonce each time), any other value as it is. Without a seal (tests of the
    /// store that have no secret) the entry goes in clear.
    pub fn stored_value(&self, key: &str, value: &str) -> Result<String, KeyError> {
        match (self.entity_of(key), &self.seal) {
            (Some(entity), Some(seal)) => seal.seal_value(entity, value).map_err(|e| KeyError {
                key: key.to_string(),
                reason: e.to_string(),
            }),
            _ => Ok(value.to_string()),
        }
    }

    /// Brings the key table entries among `kvs` (as read from etcd) to their clear forms, in
    /// place; returns the keys that were stored in clear (by a monitor before the seal),
    /// which the next commit rewrites sealed. An entry that does not open (another secret,
    /// or altered) is an error naming it: never dropped, never served.
    pub fn open_stored(
        &self,
        kvs: &mut BTreeMap<String, String>,
    ) -> Result<BTreeSet<String>, KeyError> {
        let mut clear = BTreeSet::new();
        for (key, value) in kvs.iter_mut() {
            let Some(entity) = self.entity_of(key) else {
                continue;
            };
            let opened = open_value(self.seal.as_deref(), entity, value).map_err(|e| KeyError {
                key: key.clone(),
                reason: e.to_string(),
            })?;
            if opened.was_clear {
                clear.insert(key.clone());
            }
            *value = opened.clear;
        }
        Ok(clear)
    }

    /// The prefix of the whole cluster state (everything but `mon/`).
    pub fn root(&self) -> String {
        format!("{}/", self.prefix)
    }

    pub fn leader(&self) -> String {
        format!("{}/mon/leader", self.prefix)
    }

    pub fn member(&self, name: &str) -> String {
        format!("{}/mon/members/{name}", self.prefix)
    }

    /// Which backup a restore wrote into this etcd (`crate::backup`).
    pub fn restore_marker(&self) -> String {
        format!("{}/mon/restore", self.prefix)
    }

    pub fn members_prefix(&self) -> String {
        format!("{}/mon/members/", self.prefix)
    }

    pub fn images_of_pool_prefix(&self, pool: u32) -> String {
        format!("{}/images/{pool}/", self.prefix)
    }

    /// The prefix of every pool's PG keys (`pgs/`).
    pub fn pg_keys_root(&self) -> String {
        format!("{}/pgs/", self.prefix)
    }

    /// The prefixes of the keys holding `pool`'s PGs, in this layout and the one before.
    pub fn pg_key_prefixes(&self, pool: u32) -> [String; 2] {
        [
            format!("{}/pgs/{pool}/", self.prefix),
            format!("{}/pgmaps/{pool}/", self.prefix),
        ]
    }

    pub fn snaps_of_image_prefix(&self, image: u64) -> String {
        format!("{}/snaps/{image}/", self.prefix)
    }

    /// The map epoch's key.
    pub fn epoch_key(&self) -> String {
        format!("{}/epoch", self.prefix)
    }

    /// Whether `key` holds PGs (`pgs/<pool>/<index>`, or `pgmaps/<pool>/<chunk>` of the
    /// layout before).
    pub fn is_pg_key(&self, key: &str) -> bool {
        self.is_old_pg_key(key)
            || key
                .strip_prefix(&self.prefix)
                .is_some_and(|rest| rest.starts_with("/pgs/"))
    }

    /// Whether `key` holds PGs in the layout before `pgs/` (`pgmaps/<pool>/<chunk>`).
    fn is_old_pg_key(&self, key: &str) -> bool {
        key.strip_prefix(&self.prefix)
            .and_then(|rest| rest.strip_prefix("/pgmaps/"))
            .is_some_and(|rest| rest.contains('/'))
    }

    /// Serializes the state into its keys and JSON values.
    pub fn encode(&self, state: &MonState) -> BTreeMap<String, String> {
        let p = &self.prefix;
        let json = |v: &dyn erased::Json| v.to_json();
        let mut out = BTreeMap::new();
        out.insert(
            format!("{p}/epoch"),
            json(&EpochValue {
                epoch: state.map.epoch,
            }),
        );
        out.insert(format!("{p}/counters"), json(&state.counters));
        out.insert(format!("{p}/flags"), json(&state.map.flags));
        out.insert(format!("{p}/pending"), json(&state.pending));
        // Written once it differs from the defaults, so a cluster that never set a ratio nor
        // had a full OSD keeps the keys monitors before it wrote.
        if state.map.space != SpaceSettings::default() {
            out.insert(format!("{p}/space"), json(&state.map.space));
        }
        for (id, osd) in state.map.osds.iter() {
            out.insert(format!("{p}/osds/{id}"), json(osd));
        }
        for (id, pool) in &state.map.pools {
            out.insert(format!("{p}/pools/{id}"), json(pool));
        }
        for (id, pgmap) in &state.map.pgmaps {
            out.insert(format!("{p}/pgmaps/{id}"), pgmap_header(pgmap));
            for (index, value) in pg_key_values(pgmap.pgs.iter()) {
                out.insert(self.pg_key(id.0, index), value);
            }
        }
        for ((pool, name), image) in &state.images {
            out.insert(format!("{p}/images/{pool}/{name}"), json(image));
        }
        for (id, entry) in &state.reclaim {
            out.insert(format!("{p}/reclaim/{id}"), json(entry));
        }
        for (image, snaps) in &state.snaps {
            for snap in snaps {
                out.insert(format!("{p}/snaps/{image}/{}", snap.id), json(snap));
            }
        }
        for (id, entry) in &state.snap_trims {
            out.insert(format!("{p}/snaptrim/{id}"), json(entry));
        }
        if state.scrubs.next_id > 1 {
            out.insert(
                format!("{p}/scrub/next-id"),
                json(&ScrubCounterValue {
                    next_id: state.scrubs.next_id,
                }),
            );
        }
        for (id, request) in &state.scrubs.requests {
            out.insert(format!("{p}/scrub/requests/{id}"), json(request));
        }
        // A cluster whose auth is not set up yet has no config key: the first leader sees
        // it missing and sets it up (`service::Monitor::bootstrap_auth`).
        if state.auth.configured {
            out.insert(format!("{p}/auth/config"), json(&state.map.auth));
        }
        for (entity, e) in &state.auth.entities {
            out.insert(
                format!("{p}/auth/entities/{entity}"),
                json(&ClearEntity {
                    key: e.key.to_base64(),
                    caps: e.caps.to_string(),
                    generation: e.generation,
                }),
            );
        }
        out
    }

    /// The key of `pool`'s PGs whose `seq / PG_KEY_PGS` is `index`.
    pub fn pg_key(&self, pool: u32, index: u32) -> String {
        format!("{}/pgs/{pool}/{index}", self.prefix)
    }

    /// What to write to go from `prev` (whose keys are `prev_kvs`, `encode(prev)`) to `next`:
    /// the keys to put with their values, and the keys to delete. Equal to comparing
    /// `encode(prev)` with `encode(next)` (asserted in debug builds by the store), but a PG
    /// chunk `next` shares with `prev` is neither encoded nor compared, so a commit costs what
    /// it changed, not the size of the pools. `prev_kvs` holds no key of the layout before
    /// (a snapshot loaded with some is `dirty`, and its commit compares every key).
    pub fn changes(
        &self,
        prev: &MonState,
        prev_kvs: &BTreeMap<String, String>,
        next: &MonState,
    ) -> (Vec<(String, String)>, Vec<String>) {
        let mut puts = Vec::new();
        let mut deletes = Vec::new();
        // Every record but the PG chunks: small, encoded whole.
        let small = self.encode_without_chunks(next);
        for (key, value) in &small {
            if prev_kvs.get(key) != Some(value) {
                puts.push((key.clone(), value.clone()));
            }
        }
        for key in prev_kvs.keys() {
            if !self.is_pg_key(key) && !small.contains_key(key) {
                deletes.push(key.clone());
            }
        }
        // The PG keys: outside the table chunks `next` does not share with `prev` (aligned
        // on keys), nothing changed.
        let empty = PgTable::new();
        for (pool, pgmap) in &next.map.pgmaps {
            let before = prev.map.pgmaps.get(pool).map_or(&empty, |m| &m.pgs);
            for seqs in pgmap.pgs.unshared_seq_ranges(before) {
                let values: BTreeMap<u32, String> =
                    pg_key_values(pgmap.pgs.range(seqs.start, seqs.end))
                        .into_iter()
                        .collect();
                for index in key_indexes(&seqs) {
                    let key = self.pg_key(pool.0, index);
                    match values.get(&index) {
                        Some(value) if prev_kvs.get(&key) != Some(value) => {
                            puts.push((key, value.clone()))
                        }
                        Some(_) => {}
                        None if prev_kvs.contains_key(&key) => deletes.push(key),
                        None => {}
                    }
                }
            }
        }
        // A pool gone takes its PG keys along (a damaged pool's, which `prev` has no PG map
        // for, are left alone: `orphan_chunks`).
        for pool in prev.map.pgmaps.keys() {
            if !next.map.pgmaps.contains_key(pool) {
                for prefix in self.pg_key_prefixes(pool.0) {
                    deletes.extend(
                        prev_kvs
                            .range(prefix.clone()..)
                            .take_while(|(k, _)| k.starts_with(&prefix))
                            .map(|(k, _)| k.clone()),
                    );
                }
            }
        }
        (puts, deletes)
    }

    /// The PG keys among `kvs` (either layout) whose pool has no PG map key (`pgmaps/<pool>`)
    /// but was created (its id is below the pool counter): a damaged pool's PGs, which neither
    /// a load nor a commit touches.
    pub fn orphan_chunks(&self, kvs: &BTreeMap<String, String>) -> BTreeSet<String> {
        let next_pool = self.next_pool_id(kvs);
        self.pg_keys_by_pool(kvs)
            .into_iter()
            .filter(|(pool, _)| next_pool.is_none_or(|next| pool.0 < next))
            .filter(|(pool, _)| !kvs.contains_key(&format!("{}/pgmaps/{pool}", self.prefix)))
            .flat_map(|(_, keys)| keys)
            .collect()
    }

    /// The PG keys among `kvs` (either layout) of a pool never created (its id is at or above
    /// the pool counter): a large creation cut short after its PG keys went ahead of the
    /// pool's own keys (`crate::store`, "Large commits"). Not part of the state; a commit
    /// after the load deletes them. None if the counters key is missing or unreadable (the
    /// load then fails or the pools are judged as damage instead).
    pub fn abandoned_chunks(&self, kvs: &BTreeMap<String, String>) -> BTreeSet<String> {
        let Some(next_pool) = self.next_pool_id(kvs) else {
            return BTreeSet::new();
        };
        self.pg_keys_by_pool(kvs)
            .into_iter()
            .filter(|(pool, _)| pool.0 >= next_pool)
            .flat_map(|(_, keys)| keys)
            .collect()
    }

    /// The pool counter as `kvs` store it.
    fn next_pool_id(&self, kvs: &BTreeMap<String, String>) -> Option<u32> {
        let counters = kvs.get(&format!("{}/counters", self.prefix))?;
        serde_json::from_str::<Counters>(counters)
            .ok()
            .map(|c| c.next_pool_id)
    }

    /// The PG keys among `kvs` (either layout), by pool.
    fn pg_keys_by_pool(&self, kvs: &BTreeMap<String, String>) -> BTreeMap<PoolId, Vec<String>> {
        let mut out: BTreeMap<PoolId, Vec<String>> = BTreeMap::new();
        for root in ["pgs", "pgmaps"].map(|dir| format!("{}/{dir}/", self.prefix)) {
            for key in kvs.range(root.clone()..).map(|(k, _)| k) {
                let Some(rest) = key.strip_prefix(&root) else {
                    break;
                };
                let Some((pool, index)) = rest.split_once('/') else {
                    continue;
                };
                if let (Ok(pool), Ok(_)) = (pool.parse(), index.parse::<u32>()) {
                    out.entry(PoolId(pool)).or_default().push(key.clone());
                }
            }
        }
        out
    }

    /// `encode` without the PG chunks.
    fn encode_without_chunks(&self, state: &MonState) -> BTreeMap<String, String> {
        let stripped = MonState {
            map: fastblock_types::map::ClusterMap {
                pgmaps: BTreeMap::new(),
                ..state.map.clone()
            },
            ..state.clone()
        };
        let mut out = self.encode(&stripped);
        for (id, pgmap) in &state.map.pgmaps {
            out.insert(format!("{}/pgmaps/{id}", self.prefix), pgmap_header(pgmap));
        }
        out
    }

    /// Rebuilds the state from the keys under the prefix (the `mon/` keys are skipped).
    pub fn decode(&self, kvs: &BTreeMap<String, String>) -> Result<MonState, KeyError> {
        let mut state = MonState::default();
        // The keys holding PGs: (pool, key, PGs, whether of the layout before `pgs/`).
        let mut pg_keys = Vec::new();
        let root = self.root();
        for (key, value) in kvs {
            let Some(rest) = key.strip_prefix(&root) else {
                continue;
            };
            let parts: Vec<&str> = rest.split('/').collect();
            let bad = |reason: String| KeyError {
                key: key.clone(),
                reason,
            };
            let parse_err = |e: serde_json::Error| bad(format!("invalid JSON: {e}"));
            match parts.as_slice() {
                ["epoch"] => {
                    let v: EpochValue = serde_json::from_str(value).map_err(parse_err)?;
                    state.map.epoch = v.epoch;
                }
                ["counters"] => {
                    state.counters = serde_json::from_str::<Counters>(value).map_err(parse_err)?
                }
                ["flags"] => {
                    state.map.flags = serde_json::from_str::<Flags>(value).map_err(parse_err)?
                }
                ["space"] => {
                    state.map.space =
                        serde_json::from_str::<SpaceSettings>(value).map_err(parse_err)?
                }
                ["pending"] => {
                    state.pending = serde_json::from_str::<Pending>(value).map_err(parse_err)?
                }
                ["osds", _] => {
                    let osd: OsdInfo = serde_json::from_str(value).map_err(parse_err)?;
                    std::sync::Arc::make_mut(&mut state.map.osds).insert(osd.id, osd);
                }
                ["pools", _] => {
                    let pool: PoolInfo = serde_json::from_str(value).map_err(parse_err)?;
                    state.map.pools.insert(pool.id, pool);
                }
                ["pgmaps", _] => {
                    // Its PGs, if written by a monitor before the chunks, or none.
                    let pgmap: PgMap = serde_json::from_str(value).map_err(parse_err)?;
                    state.map.pgmaps.insert(pgmap.pool, pgmap);
                }
                [dir @ ("pgs" | "pgmaps"), pool, index] => {
                    let old = *dir == "pgmaps";
                    let per_key = if old { OLD_KEY_PGS } else { PG_KEY_PGS };
                    let bad_id = |what: &str| bad(format!("invalid {what} in a PG key"));
                    let pool: u32 = pool.parse().map_err(|_| bad_id("pool id"))?;
                    let index: u32 = index.parse().map_err(|_| bad_id("index"))?;
                    let pgs: BTreeMap<u32, PgInfo> =
                        serde_json::from_str(value).map_err(parse_err)?;
                    if let Some(seq) = pgs.keys().find(|s| **s / per_key != index) {
                        return Err(bad(format!(
                            "PG {seq} does not belong in key {index} ({per_key} PGs each)"
                        )));
                    }
                    pg_keys.push((PoolId(pool), key.clone(), pgs, old));
                }
                ["images", _, _] => {
                    let image: ImageInfo = serde_json::from_str(value).map_err(parse_err)?;
                    state.images.insert((image.pool, image.name.clone()), image);
                }
                ["reclaim", _] => {
                    let entry: ReclaimEntry = serde_json::from_str(value).map_err(parse_err)?;
                    state.reclaim.insert(entry.id, entry);
                }
                ["snaps", _, _] => {
                    let snap: SnapInfo = serde_json::from_str(value).map_err(parse_err)?;
                    state.snaps.entry(snap.image).or_default().push(snap);
                }
                ["snaptrim", _] => {
                    let entry: SnapTrimEntry = serde_json::from_str(value).map_err(parse_err)?;
                    state.snap_trims.insert(entry.id, entry);
                }
                ["scrub", "next-id"] => {
                    let v: ScrubCounterValue = serde_json::from_str(value).map_err(parse_err)?;
                    state.scrubs.next_id = v.next_id;
                }
                ["scrub", "requests", _] => {
                    let request: ScrubRequest = serde_json::from_str(value).map_err(parse_err)?;
                    state.scrubs.requests.insert(request.id, request);
                }
                ["auth", "config"] => {
                    state.map.auth =
                        serde_json::from_str::<AuthSettings>(value).map_err(parse_err)?;
                    state.auth.configured = true;
                }
                ["auth", "entities", name] => {
                    let v: ClearEntity = serde_json::from_str(value).map_err(parse_err)?;
                    let entity: fastblock_auth::EntityName =
                        name.parse().map_err(|e| bad(format!("{e}")))?;
                    let key = fastblock_auth::Secret::from_base64(&v.key)
                        .map_err(|e| bad(format!("{e}")))?;
                    let caps = fastblock_mon_core::auth_ops::parse_caps(&entity, &v.caps)
                        .map_err(|e| bad(e.message))?;
                    state.auth.entities.insert(
                        entity,
                        AuthEntity {
                            key,
                            caps,
                            generation: v.generation,
                        },
                    );
                }
                ["mon", ..] | ["readiness-probe"] => {}
                _ => return Err(bad("unknown key".to_string())),
            }
        }
        // PG keys join their pool's PG map, whatever order they came in. Those of a pool
        // without its PG map key are left where they are: the pool is damaged
        // (`PoolDamage::PgMapMissing`) and fenced, and its PGs stay in etcd for a repair.
        // The layouts before come first: a PG in a `pgs/` key as well was written later, by a
        // rewrite in this layout cut short ("Large commits" in `crate::store`), and is taken.
        // (A PG's `pgs/` key is the one its sequence number names: it cannot be in two.)
        pg_keys.sort_by_key(|(_, _, _, old)| !*old);
        for (pool, key, pgs, old) in pg_keys {
            let Some(pgmap) = state.map.pgmaps.get_mut(&pool) else {
                continue;
            };
            for (seq, pg) in pgs {
                if pgmap.pgs.insert(seq, pg).is_some() && old {
                    return Err(KeyError {
                        key,
                        reason: format!("PG {seq} stored twice"),
                    });
                }
            }
        }
        // etcd lists keys in byte order (`snaps/1/10` before `snaps/1/9`): snapshots are kept
        // by id.
        for snaps in state.snaps.values_mut() {
            snaps.sort_by_key(|s| s.id);
        }
        // Re-encoding must reproduce every key: a value stored under the wrong key (an osd
        // JSON whose id differs from its key) would otherwise be silently moved.
        let encoded = self.encode(&state);
        let orphans = self.orphan_chunks(kvs);
        let abandoned = self.abandoned_chunks(kvs);
        for key in kvs.keys() {
            let skip = key.starts_with(&format!("{}/mon/", self.prefix))
                || key.ends_with("/readiness-probe")
                || orphans.contains(key)
                || abandoned.contains(key)
                || self.is_old_pg_key(key);
            if !skip && !encoded.contains_key(key) {
                return Err(KeyError {
                    key: key.clone(),
                    reason: "value does not match its key".to_string(),
                });
            }
        }
        // The map's image table and reclaim list are derived, not stored; so is the damage
        // found in the pools, looked for once here.
        state.derive_data_map();
        state.refresh_damage();
        // Operations derive the PGs they change only (`MonState::derive_pg_states_since`):
        // a state written by another version, or edited by hand, is brought in line once.
        state.derive_pg_states();
        // Damage confined to one pool (a pool without its PG map, a PG naming an unknown OSD)
        // is loaded: health reports it and the pool is fenced (`fastblock_mon_core::damage`),
        // so the other pools keep working. What is not confined to a pool (an id beyond its
        // counter, which a new record could reuse) is an error every call reports.
        state.validate().map_err(|reason| KeyError {
            key: self.root(),
            reason: format!("inconsistent state: {reason}"),
        })?;
        Ok(state)
    }
}

/// The values of the PG keys holding `pgs` (in sequence order): (index, JSON), each key's
/// PGs as `{"<seq>": PgInfo, ...}`.
fn pg_key_values<'a>(pgs: impl Iterator<Item = (&'a u32, &'a PgInfo)>) -> Vec<(u32, String)> {
    let mut out: Vec<(u32, String)> = Vec::new();
    let mut group: BTreeMap<u32, &PgInfo> = BTreeMap::new();
    let mut index = 0;
    let json = |group: &BTreeMap<u32, &PgInfo>| {
        serde_json::to_string(group).expect("PGs always serialize")
    };
    for (seq, pg) in pgs {
        if !group.is_empty() && *seq / PG_KEY_PGS != index {
            out.push((index, json(&group)));
            group.clear();
        }
        index = *seq / PG_KEY_PGS;
        group.insert(*seq, pg);
    }
    if !group.is_empty() {
        out.push((index, json(&group)));
    }
    out
}

/// The indexes of the PG keys within `seqs`, a range of whole keys (a table chunk's).
fn key_indexes(seqs: &Range<u32>) -> Range<u32> {
    #[allow(clippy::modulo_one)] // one PG per key today; the bound holds for any choice
    let aligned = seqs.start % PG_KEY_PGS == 0;
    debug_assert!(aligned, "{seqs:?} starts within a key");
    seqs.start / PG_KEY_PGS..seqs.end.div_ceil(PG_KEY_PGS)
}

/// A pool's PG map key: its pool and version, its PGs in the chunk keys. Written as a `PgMap`
/// with no PGs, so that it reads as one (and a key written before the chunks, with its PGs,
/// reads the same way).
fn pgmap_header(pgmap: &PgMap) -> String {
    let header = PgMap {
        pool: pgmap.pool,
        version: pgmap.version,
        pgs: PgTable::new(),
    };
    serde_json::to_string(&header).expect("a PG map always serializes")
}

mod erased {
    /// Object-safe JSON encoding, so `encode` can take any value through one closure.
    pub trait Json {
        fn to_json(&self) -> String;
    }
    impl<T: serde::Serialize> Json for T {
        fn to_json(&self) -> String {
            serde_json::to_string(self).expect("monitor state always serializes")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One OSD booted into `state` and a pool "p" of `pg_count` PGs of one replica.
    fn one_osd_pool(state: &mut MonState, pg_count: u32) {
        use fastblock_types::api::{BootRequest, CreatePoolRequest};
        use fastblock_types::map::FailureDomain;
        let uuid = "0b6b3c2e-7d2f-4c59-9a55-8c2f1a1e2b3c";
        let id = state.apply_id(uuid).unwrap();
        let boot = BootRequest {
            uuid: uuid.into(),
            address: "127.0.0.1".into(),
            port: 7000,
            shards: 1,
            host: "h".into(),
            capacity_bytes: 1 << 30,
            config: String::new(),
            lease_timing: None,
        };
        state.boot(id, &boot).unwrap();
        let pool = CreatePoolRequest {
            name: "p".into(),
            pg_count,
            size: 1,
            failure_domain: FailureDomain::Osd,
        };
        state.create_pool(&pool).unwrap();
    }
    use fastblock_types::api::ApplyIdRequest;

    #[test]
    fn encode_decode_round_trip() {
        let ks = Keyspace::new("/fb");
        let mut state = MonState::default();
        let before = state.clone();
        let req = ApplyIdRequest {
            uuid: "0b6b3c2e-7d2f-4c59-9a55-8c2f1a1e2b3c".into(),
        };
        state.apply_id(&req.uuid).unwrap();
        state.map.flags.noout = true;
        assert!(state.finish(&before));
        let kvs = ks.encode(&state);
        assert!(kvs.contains_key("/fb/osds/1"));
        let back = ks.decode(&kvs).unwrap();
        assert_eq!(back, state);
    }

    /// The space settings are written only once they differ from the defaults (an untouched
    /// cluster keeps its keys), round-trip with the full OSDs, and go when back at defaults.
    #[test]
    fn space_settings_round_trip_and_are_absent_at_their_defaults() {
        use fastblock_types::api::OsdSpace;
        let ks = Keyspace::new("/fb");
        let mut state = MonState::default();
        let id = state
            .apply_id("0b6b3c2e-7d2f-4c59-9a55-8c2f1a1e2b3c")
            .unwrap();
        assert!(!ks.encode(&state).contains_key("/fb/space"));
        // In, as a booted OSD is: an out OSD is never kept full (`derive_full_osds`).
        std::sync::Arc::make_mut(&mut state.map.osds)
            .get_mut(&id)
            .unwrap()
            .is_in = true;
        let before = state.clone();
        state.set_nearfull_ratio(0.5).unwrap();
        let full = OsdSpace {
            total_bytes: 100,
            free_bytes: 1,
            writable_bytes: None,
        };
        state.record_osd_space(id, full);
        assert!(state.finish(&before), "a new full OSD is a new epoch");
        let kvs = ks.encode(&state);
        assert!(kvs["/fb/space"].contains("\"full_osds\":[1]"), "{kvs:?}");
        assert_eq!(ks.decode(&kvs).unwrap(), state);
        state.set_nearfull_ratio(0.85).unwrap();
        state.record_osd_space(id, OsdSpace::default());
        assert!(!ks.encode(&state).contains_key("/fb/space"));
    }

    #[test]
    fn decode_loads_a_pool_without_its_pg_map_as_damage() {
        use fastblock_mon_core::damage::PoolDamage;
        use fastblock_types::PoolId;
        let ks = Keyspace::new("/fb");
        let mut state = MonState::default();
        one_osd_pool(&mut state, 2);
        state.finish(&MonState::default());
        let mut kvs = ks.encode(&state);
        assert!(ks.decode(&kvs).unwrap().damaged_pools().is_empty());
        kvs.remove("/fb/pgmaps/1").expect("the pool's PG map key");
        let back = ks.decode(&kvs).expect("damage confined to a pool loads");
        assert_eq!(
            back.damaged_pools().into_iter().collect::<Vec<_>>(),
            vec![(PoolId(1), PoolDamage::PgMapMissing)]
        );
        // Its PGs stay in etcd, untouched; re-encoding writes neither a PG map nor PGs for it.
        let orphans = ks.orphan_chunks(&kvs);
        assert_eq!(
            orphans.iter().collect::<Vec<_>>(),
            vec!["/fb/pgs/1/0", "/fb/pgs/1/1"],
            "the pool's PG keys"
        );
        kvs.retain(|k, _| !orphans.contains(k));
        assert_eq!(ks.encode(&back), kvs);
    }

    /// Snapshots and trims round-trip through their keys, and snapshots come back in id order
    /// although etcd lists `snaps/<image>/10` before `snaps/<image>/9`.
    #[test]
    fn snapshots_and_trims_round_trip_in_id_order() {
        use fastblock_types::api::CreateImageRequest;
        use fastblock_types::map::SnapState;
        let ks = Keyspace::new("/fb");
        let mut state = MonState::default();
        one_osd_pool(&mut state, 1);
        let image = state
            .create_image(&CreateImageRequest {
                pool: "p".into(),
                name: "img".into(),
                size_bytes: 1 << 20,
                object_size_bytes: None,
            })
            .unwrap();
        for i in 1..=8 {
            state.create_snap("p", "img", &format!("s{i}"), 5).unwrap();
        }
        // Aborted: each leaves a trim entry.
        assert_eq!(state.tick_snaps(100, 10).len(), 8);
        for i in 9..=10 {
            state.create_snap("p", "img", &format!("s{i}"), 5).unwrap();
        }
        let pg = fastblock_types::PgId::new(image.pool, 0);
        state
            .snap_pg_done(image.id, fastblock_types::SnapId(10), pg)
            .unwrap();
        state.finish(&MonState::default());
        let kvs = ks.encode(&state);
        assert!(kvs.contains_key(&format!("/fb/snaps/{}/9", image.id)));
        assert!(kvs.contains_key(&format!("/fb/snaps/{}/10", image.id)));
        assert!(kvs.contains_key("/fb/snaptrim/8"));
        let back = ks.decode(&kvs).unwrap();
        assert_eq!(back, state);
        let snaps = &back.map.snaps[&image.id];
        assert_eq!(snaps.len(), 2);
        assert_eq!(snaps[0].id, fastblock_types::SnapId(9));
        assert_eq!(snaps[1].state, SnapState::Created);
        assert_eq!(back.map.snap_trims.len(), 8);
        assert!(kvs["/fb/counters"].contains("\"next_snap_trim_id\":9"));
    }

    /// Scrub requests and their counter round-trip; the counter key appears only once a
    /// request was made, and a request beyond it is refused.
    #[test]
    fn scrub_requests_round_trip_with_their_counter() {
        use fastblock_types::{PgId, PoolId};
        let ks = Keyspace::new("/fb");
        let mut state = MonState::default();
        assert!(!ks.encode(&state).contains_key("/fb/scrub/next-id"));
        one_osd_pool(&mut state, 2);
        let pg = PgId::new(PoolId(1), 1);
        state.request_scrub(pg, false).unwrap();
        let deep = state.request_scrub(pg, true).unwrap();
        state.finish(&MonState::default());
        let mut kvs = ks.encode(&state);
        assert_eq!(kvs["/fb/scrub/next-id"], r#"{"next_id":3}"#);
        assert_eq!(
            kvs["/fb/scrub/requests/2"],
            r#"{"id":2,"pg":{"pool":1,"seq":1},"deep":true}"#
        );
        let back = ks.decode(&kvs).unwrap();
        assert_eq!(back, state);
        assert_eq!(back.map.scrub_requests.get(&2), Some(&deep));
        kvs.remove("/fb/scrub/next-id");
        let e = ks.decode(&kvs).unwrap_err();
        assert!(
            e.to_string().contains("scrub request id 1 not in 1..1"),
            "{e}"
        );
    }

    #[test]
    fn decode_rejects_an_id_beyond_its_counter() {
        let ks = Keyspace::new("/fb");
        // The counters of an empty state say the next pool gets id 1.
        let mut kvs = ks.encode(&MonState::default());
        assert!(ks.decode(&kvs).is_ok());
        // A PG map of pool 1 left behind: a new pool would take its id.
        kvs.insert(
            "/fb/pgmaps/1".into(),
            r#"{"pool":1,"version":1,"pgs":{}}"#.into(),
        );
        let e = ks.decode(&kvs).unwrap_err();
        assert!(e.to_string().contains("pool id 1 not below counter"), "{e}");
    }

    #[test]
    fn decode_rejects_unknown_and_misplaced_keys() {
        let ks = Keyspace::new("/fb");
        let mut kvs = ks.encode(&MonState::default());
        kvs.insert("/fb/bogus".into(), "{}".into());
        assert!(ks.decode(&kvs).is_err());
        let mut kvs = ks.encode(&MonState::default());
        kvs.insert("/fb/flags".into(), "not json".into());
        assert!(ks.decode(&kvs).is_err());
    }

    /// A pool's PGs come back from their keys; a PG stored in a key it does not belong in is
    /// refused rather than moved.
    #[test]
    fn pg_keys_round_trip_and_a_misplaced_pg_is_refused() {
        let ks = Keyspace::new("/fb");
        let mut state = MonState::default();
        one_osd_pool(&mut state, 3 * PG_KEY_PGS);
        state.finish(&MonState::default());
        let kvs = ks.encode(&state);
        let keys: Vec<&String> = kvs.keys().filter(|k| k.starts_with("/fb/pgs/1/")).collect();
        assert_eq!(keys, ["/fb/pgs/1/0", "/fb/pgs/1/1", "/fb/pgs/1/2"]);
        assert_eq!(ks.decode(&kvs).unwrap(), state);
        // The first PG of key 1 moved into key 0.
        let seq = PG_KEY_PGS;
        let mut moved = kvs.clone();
        let mut k0: BTreeMap<u32, PgInfo> = serde_json::from_str(&moved["/fb/pgs/1/0"]).unwrap();
        let mut k1: BTreeMap<u32, PgInfo> = serde_json::from_str(&moved["/fb/pgs/1/1"]).unwrap();
        k0.insert(seq, k1.remove(&seq).unwrap());
        moved.insert("/fb/pgs/1/0".into(), serde_json::to_string(&k0).unwrap());
        moved.insert("/fb/pgs/1/1".into(), serde_json::to_string(&k1).unwrap());
        let e = ks.decode(&moved).unwrap_err();
        let expected = format!("PG {seq} does not belong in key 0 ({PG_KEY_PGS} PGs each)");
        assert!(e.reason.contains(&expected), "{e}");
    }

    /// The layouts before `pgs/` (256 PGs to a `pgmaps/<pool>/<chunk>` key, or every PG in
    /// the pool's `pgmaps/<pool>` key) load as the same state; a PG that is in a `pgs/` key as
    /// well (a rewrite cut short) is taken from there; a PG misplaced in the 256-PG layout, or
    /// in both older layouts, is refused.
    #[test]
    fn the_layout_before_loads_and_a_pg_key_overrides_it() {
        let ks = Keyspace::new("/fb");
        let mut state = MonState::default();
        one_osd_pool(&mut state, 600);
        state.finish(&MonState::default());
        let pgs = &state.map.pgmaps[&PoolId(1)].pgs;
        let mut old: BTreeMap<String, String> = ks
            .encode(&state)
            .into_iter()
            .filter(|(k, _)| !k.starts_with("/fb/pgs/"))
            .collect();
        for chunk in 0..3u32 {
            let group: BTreeMap<u32, &PgInfo> = pgs
                .range(chunk * 256, chunk * 256 + 256)
                .map(|(s, p)| (*s, p))
                .collect();
            old.insert(
                format!("/fb/pgmaps/1/{chunk}"),
                serde_json::to_string(&group).unwrap(),
            );
        }
        assert_eq!(ks.decode(&old).unwrap(), state);
        // PG 300 rewritten in its `pgs/` key with a newer version.
        let mut mixed = old.clone();
        let mut newer = pgs.get(&300).unwrap().clone();
        newer.version += 1;
        let index = 300 / PG_KEY_PGS;
        let mut key: BTreeMap<u32, PgInfo> = pgs
            .range(index * PG_KEY_PGS, (index + 1) * PG_KEY_PGS)
            .map(|(s, p)| (*s, p.clone()))
            .collect();
        key.insert(300, newer.clone());
        mixed.insert(
            format!("/fb/pgs/1/{index}"),
            serde_json::to_string(&key).unwrap(),
        );
        let back = ks.decode(&mixed).unwrap();
        assert_eq!(back.map.pgmaps[&PoolId(1)].pgs.get(&300), Some(&newer));
        assert_eq!(back.map.pgmaps[&PoolId(1)].pgs.len(), 600);
        // Every PG in the pool's key as well, as the first layout had them.
        let whole = serde_json::to_string(&state.map.pgmaps[&PoolId(1)]).unwrap();
        let mut first = mixed.clone();
        first.retain(|k, _| !k.starts_with("/fb/pgmaps/1/"));
        first.insert("/fb/pgmaps/1".into(), whole.clone());
        let back = ks.decode(&first).unwrap();
        assert_eq!(back.map.pgmaps[&PoolId(1)].pgs.get(&300), Some(&newer));
        let mut twice = old.clone();
        twice.insert("/fb/pgmaps/1".into(), whole);
        let e = ks.decode(&twice).unwrap_err();
        assert!(e.reason.contains("stored twice"), "{e}");
        // PG 300 (chunk 1) moved into chunk 0 of the old layout.
        let mut c0: BTreeMap<u32, PgInfo> = serde_json::from_str(&old["/fb/pgmaps/1/0"]).unwrap();
        let mut c1: BTreeMap<u32, PgInfo> = serde_json::from_str(&old["/fb/pgmaps/1/1"]).unwrap();
        c0.insert(300, c1.remove(&300).unwrap());
        old.insert("/fb/pgmaps/1/0".into(), serde_json::to_string(&c0).unwrap());
        old.insert("/fb/pgmaps/1/1".into(), serde_json::to_string(&c1).unwrap());
        let e = ks.decode(&old).unwrap_err();
        assert!(
            e.reason
                .contains("PG 300 does not belong in key 0 (256 PGs each)"),
            "{e}"
        );
    }
}

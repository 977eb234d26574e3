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
//! <prefix>/pgmaps/<pool id>        PgMap                  all PGs of one pool
//! <prefix>/images/<pool id>/<name> ImageInfo
//! <prefix>/reclaim/<id>            ReclaimEntry           data the data path must delete
//! <prefix>/snaps/<image id>/<snap id>  SnapInfo           a live snapshot of an image
//! <prefix>/snaptrim/<id>           SnapTrimEntry          a snapshot the PGs must drop
//! <prefix>/scrub/next-id           {"next_id":N}          next scrub request id (once used)
//! <prefix>/scrub/requests/<id>     ScrubRequest           a PG scrub an operator asked for
//! <prefix>/auth/config             AuthSettings           auth mode and key-table epoch
//! <prefix>/auth/entities/<entity>  {key,caps,generation}  one entity's key (base64)
//! <prefix>/mon/leader              MonMember              held with the leader's lease
//! <prefix>/mon/members/<name>      MonMember              each monitor, with its own lease
//! <prefix>/mon/restore             RestoreMarker          the backup a restore wrote (once)
//! ```

use fastblock_mon_core::auth_ops::AuthEntity;
use fastblock_mon_core::state::{MonState, Pending};
use fastblock_types::auth::AuthSettings;
use fastblock_types::map::{
    Counters, Flags, ImageInfo, OsdInfo, PgMap, PoolInfo, ReclaimEntry, ScrubRequest, SnapInfo,
    SnapTrimEntry, SpaceSettings,
};
use fastblock_types::Epoch;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Clone, Debug)]
pub struct Keyspace {
    prefix: String,
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

/// One entity of the key table as stored: the entity key in base64 (etcd is bound to loopback
/// or secured with its own TLS and auth: `docs/security.md`).
#[derive(Debug, Serialize, Deserialize)]
struct AuthEntityValue {
    key: String,
    caps: String,
    generation: u64,
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
        }
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

    pub fn snaps_of_image_prefix(&self, image: u64) -> String {
        format!("{}/snaps/{image}/", self.prefix)
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
        for (id, osd) in &state.map.osds {
            out.insert(format!("{p}/osds/{id}"), json(osd));
        }
        for (id, pool) in &state.map.pools {
            out.insert(format!("{p}/pools/{id}"), json(pool));
        }
        for (id, pgmap) in &state.map.pgmaps {
            out.insert(format!("{p}/pgmaps/{id}"), json(pgmap));
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
                json(&AuthEntityValue {
                    key: e.key.to_base64(),
                    caps: e.caps.to_string(),
                    generation: e.generation,
                }),
            );
        }
        out
    }

    /// Rebuilds the state from the keys under the prefix (the `mon/` keys are skipped).
    pub fn decode(&self, kvs: &BTreeMap<String, String>) -> Result<MonState, KeyError> {
        let mut state = MonState::default();
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
                    state.map.osds.insert(osd.id, osd);
                }
                ["pools", _] => {
                    let pool: PoolInfo = serde_json::from_str(value).map_err(parse_err)?;
                    state.map.pools.insert(pool.id, pool);
                }
                ["pgmaps", _] => {
                    let pgmap: PgMap = serde_json::from_str(value).map_err(parse_err)?;
                    state.map.pgmaps.insert(pgmap.pool, pgmap);
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
                    let v: AuthEntityValue = serde_json::from_str(value).map_err(parse_err)?;
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
        // etcd lists keys in byte order (`snaps/1/10` before `snaps/1/9`): snapshots are kept
        // by id.
        for snaps in state.snaps.values_mut() {
            snaps.sort_by_key(|s| s.id);
        }
        // Re-encoding must reproduce every key: a value stored under the wrong key (an osd
        // JSON whose id differs from its key) would otherwise be silently moved.
        let encoded = self.encode(&state);
        for key in kvs.keys() {
            let skip = key.starts_with(&format!("{}/mon/", self.prefix))
                || key.ends_with("/readiness-probe");
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
        state.map.osds.get_mut(&id).unwrap().is_in = true;
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
        use fastblock_types::api::{BootRequest, CreatePoolRequest};
        use fastblock_types::map::FailureDomain;
        use fastblock_types::PoolId;
        let ks = Keyspace::new("/fb");
        let mut state = MonState::default();
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
            pg_count: 2,
            size: 1,
            failure_domain: FailureDomain::Osd,
        };
        state.create_pool(&pool).unwrap();
        state.finish(&MonState::default());
        let mut kvs = ks.encode(&state);
        assert!(ks.decode(&kvs).unwrap().damaged_pools().is_empty());
        kvs.remove("/fb/pgmaps/1").expect("the pool's PG map key");
        let back = ks.decode(&kvs).expect("damage confined to a pool loads");
        assert_eq!(
            back.damaged_pools().into_iter().collect::<Vec<_>>(),
            vec![(PoolId(1), PoolDamage::PgMapMissing)]
        );
        // Re-encoding writes no PG map for it: loading changes nothing in etcd.
        assert_eq!(ks.encode(&back), kvs);
    }

    /// Snapshots and trims round-trip through their keys, and snapshots come back in id order
    /// although etcd lists `snaps/<image>/10` before `snaps/<image>/9`.
    #[test]
    fn snapshots_and_trims_round_trip_in_id_order() {
        use fastblock_types::api::{BootRequest, CreateImageRequest, CreatePoolRequest};
        use fastblock_types::map::{FailureDomain, SnapState};
        let ks = Keyspace::new("/fb");
        let mut state = MonState::default();
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
        state
            .create_pool(&CreatePoolRequest {
                name: "p".into(),
                pg_count: 1,
                size: 1,
                failure_domain: FailureDomain::Osd,
            })
            .unwrap();
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
        use fastblock_types::api::{BootRequest, CreatePoolRequest};
        use fastblock_types::map::FailureDomain;
        use fastblock_types::{PgId, PoolId};
        let ks = Keyspace::new("/fb");
        let mut state = MonState::default();
        assert!(!ks.encode(&state).contains_key("/fb/scrub/next-id"));
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
        state
            .create_pool(&CreatePoolRequest {
                name: "p".into(),
                pg_count: 2,
                size: 1,
                failure_domain: FailureDomain::Osd,
            })
            .unwrap();
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
}

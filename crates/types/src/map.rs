//! The cluster map model, exactly as the monitor stores it in etcd (one JSON value per key, see
//! `docs/etcd-keys.md`) and serves it to OSDs and clients (`GET /v1/map`).
//!
//! Maps are `BTreeMap`s so that iteration order, and therefore every JSON document and every
//! placement decision made from it, is deterministic.

use crate::ids::{Epoch, ImageId, LogIndex, OsdId, PgId, PoolId, SnapId, Term};
use crate::osd_table::OsdTable;
use crate::pg_state::PgState;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// What replicas of one PG must not share.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum FailureDomain {
    /// Each OSD is its own domain.
    Osd,
    /// OSDs are grouped by the host name they report at boot.
    Host,
}

impl fmt::Display for FailureDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FailureDomain::Osd => "osd",
            FailureDomain::Host => "host",
        })
    }
}

impl FromStr for FailureDomain {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "osd" => Ok(FailureDomain::Osd),
            "host" => Ok(FailureDomain::Host),
            other => Err(format!(
                "unknown failure domain {other:?}: expected \"osd\" or \"host\""
            )),
        }
    }
}

/// One OSD as the monitor knows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OsdInfo {
    pub id: OsdId,
    /// Chosen by the OSD at mkfs; checked at every boot so that a wiped or swapped disk cannot
    /// impersonate the OSD that owned the id.
    pub uuid: String,
    /// Host name reported at boot: the `host` failure domain.
    #[serde(default)]
    pub host: String,
    /// IP address of the data port.
    #[serde(default)]
    pub address: String,
    /// Data-plane TCP port of shard 0 (client IO and Raft traffic); shard `k` listens on
    /// `port + k`.
    #[serde(default)]
    pub port: u16,
    /// Data-path shards (threads); a PG is served by shard `route::pg_shard(pg, shards)`.
    #[serde(default = "one")]
    pub shards: u32,
    /// Capacity of the OSD's disk.
    #[serde(default)]
    pub capacity_bytes: u64,
    pub up: bool,
    #[serde(rename = "in")]
    pub is_in: bool,
    /// Applied an id but never booted: not a placement target yet.
    pub pending_create: bool,
    /// Epoch of the OSD's last boot: lets peers tell a restarted OSD from the old incarnation.
    #[serde(default)]
    pub boot_epoch: Epoch,
    /// The configuration the OSD reported at its last boot.
    #[serde(default)]
    pub config: String,
    /// The lease timing the OSD reported at its last boot (`None`: never booted, or booted by a
    /// build that did not report it).
    #[serde(default)]
    pub lease_timing: Option<crate::lease::LeaseTiming>,
}

fn one() -> u32 {
    1
}

impl OsdInfo {
    /// The data port serving `pg` on this OSD.
    pub fn port_for(&self, pg: crate::PgId) -> u16 {
        let shard = crate::route::pg_shard(pg, self.shards.max(1));
        self.port.saturating_add(shard as u16)
    }

    /// An OSD that can receive new PG replicas.
    pub fn is_placement_target(&self) -> bool {
        self.is_in && !self.pending_create
    }
}

/// Pool configuration. The PG map lives in its own key, [`PgMap`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolInfo {
    pub id: PoolId,
    pub name: String,
    pub pg_count: u32,
    /// Replicas per PG.
    pub size: u32,
    pub failure_domain: FailureDomain,
    pub created_epoch: Epoch,
}

/// One PG of a pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgInfo {
    /// Bumped whenever `state`, `osdlist` or `newosdlist` change; OSDs act on PGs whose version
    /// moved.
    pub version: u64,
    pub state: PgState,
    /// The current Raft voters, as last reported by the PG's leader (or as first placed).
    pub osdlist: Vec<OsdId>,
    /// The target membership while `remapped`; empty otherwise.
    #[serde(default)]
    pub newosdlist: Vec<OsdId>,
    /// Raft members outside `osdlist`, as last reported by the leader: learners, and the
    /// incoming voters while the group is joint. They hold (or are receiving) a replica, so
    /// they keep hosting the PG although `osdlist` does not name them.
    #[serde(default)]
    pub learners: Vec<OsdId>,
    /// The incoming voters while the last reported configuration is joint (then `osdlist` holds
    /// the outgoing ones); empty otherwise. It records the membership change the group is in,
    /// which allows the report that leaves the joint state to drop the outgoing members.
    #[serde(default)]
    pub joint_voters: Vec<OsdId>,
    /// Members (voters of the recorded configuration, either half while joint) that a target
    /// the monitor published since they became members leaves out: a genuine leader may still
    /// drop them although no target in force does, because it can act on a target from an
    /// older map, and its report of the joint configuration can be superseded before it is
    /// sent (`fastblock_mon_core::report_checks`). Monitor bookkeeping; empty for most PGs and
    /// then not written.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub released: Vec<OsdId>,
    /// Restored from a monitor backup and not reported since: the recorded members may be
    /// older than the PG's Raft configuration, so the next report of its leader is recorded
    /// whatever members it names (`fastblock_mon_core::report_checks`). Not written when false.
    #[serde(default, skip_serializing_if = "is_false")]
    pub restored: bool,
    /// The last leader that reported, a hint for clients; `None` until the first election.
    #[serde(default)]
    pub leader: Option<OsdId>,
    /// Term and configuration index of the last accepted leader report: reports that are not
    /// newer than this are stale and ignored (fencing against delayed messages).
    #[serde(default)]
    pub leader_term: Term,
    #[serde(default)]
    pub conf_index: LogIndex,
}

impl PgInfo {
    /// Every OSD the PG names: its voters (both halves while joint), its learners and its
    /// target. The OSDs that hold or are getting a replica: who may confirm work for it, who
    /// follows it in a scoped map.
    pub fn members(&self) -> impl Iterator<Item = &OsdId> {
        self.osdlist
            .iter()
            .chain(&self.newosdlist)
            .chain(&self.learners)
            .chain(&self.joint_voters)
    }

    /// Whether [`PgInfo::members`] holds `osd`.
    pub fn names(&self, osd: OsdId) -> bool {
        self.members().any(|o| *o == osd)
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// All PGs of one pool, stored under one key and changed in one transaction.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgMap {
    pub pool: PoolId,
    /// Bumped whenever any PG of the pool changes.
    pub version: u64,
    pub pgs: crate::pg_table::PgTable,
}

impl PgMap {
    /// Whether every PG of the pool is in `done` (the PGs that confirmed a reclaim, a snapshot
    /// mark or a trim). Asked at each confirmation, so it walks the PGs only once `done` holds
    /// as many as the pool: at 131,072 PGs, walking them at every one of the 131,072
    /// confirmations kept the monitor busy for minutes.
    pub fn all_in(&self, done: &BTreeSet<u32>) -> bool {
        done.len() >= self.pgs.len() && self.pgs.keys().all(|seq| done.contains(seq))
    }
}

/// Cluster-wide flags.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Flags {
    /// Down OSDs are not marked out automatically.
    pub noout: bool,
    /// OSDs coming in do not trigger a rebalance until the flag is cleared.
    pub norebalance: bool,
}

/// One cluster flag settable by operators (`fastblock-client set|unset FLAG`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flag {
    NoOut,
    NoRebalance,
}

impl std::str::FromStr for Flag {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        // The reference spells it "noReblance"; accept that too.
        match s.to_ascii_lowercase().as_str() {
            "noout" => Ok(Flag::NoOut),
            "norebalance" | "noreblance" => Ok(Flag::NoRebalance),
            _ => Err(format!("unknown flag {s:?}: expected noout or norebalance")),
        }
    }
}

/// The full ratio's default: past 95 % used, an OSD takes no more writes.
pub const FULL_RATIO_PPM_DEFAULT: u32 = 950_000;
/// The nearfull ratio's default: past 85 % used, health warns (`OSD_NEARFULL`).
pub const NEARFULL_RATIO_PPM_DEFAULT: u32 = 850_000;
/// A ratio of 1 in parts per million.
pub const RATIO_PPM_ONE: u32 = 1_000_000;

/// Space thresholds and the OSDs past the full ratio (key `space`, `docs/operations.md`,
/// "Capacity and health"). Ratios are kept in parts per million so the map stays `Eq` and
/// exact in JSON.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpaceSettings {
    /// Used share of an OSD's data space past which health warns (`OSD_NEARFULL`).
    pub nearfull_ratio_ppm: u32,
    /// Used share past which the OSD is full (`OSD_FULL`): PG leaders refuse writes to every
    /// PG it is a member of with `NoSpace`.
    pub full_ratio_ppm: u32,
    /// The OSDs whose last report was past the full ratio (decided by the monitor,
    /// `fastblock_mon_core::capacity`; enforced by the shard core's admission).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub full_osds: BTreeSet<OsdId>,
}

impl Default for SpaceSettings {
    fn default() -> Self {
        SpaceSettings {
            nearfull_ratio_ppm: NEARFULL_RATIO_PPM_DEFAULT,
            full_ratio_ppm: FULL_RATIO_PPM_DEFAULT,
            full_osds: BTreeSet::new(),
        }
    }
}

/// An image (virtual disk).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageInfo {
    pub id: ImageId,
    pub pool: PoolId,
    pub pool_name: String,
    pub name: String,
    pub size_bytes: u64,
    pub object_size_bytes: u64,
    pub created_epoch: Epoch,
    /// The last snapshot id given to this image (0: none yet). Ids are never reused, so this
    /// only grows; absent in records written before snapshots existed.
    #[serde(default)]
    pub snap_seq: u64,
    /// The snapshot this image was cloned from, while the clone still reads through to it;
    /// cleared by `flatten-done` once the client copied the parent's data in.
    #[serde(default)]
    pub parent: Option<ParentSpec>,
}

/// Where a clone reads what it has not written itself: a protected snapshot of another image.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParentSpec {
    pub pool: PoolId,
    pub image: ImageId,
    pub image_name: String,
    pub pool_name: String,
    pub snap: SnapId,
    pub snap_name: String,
    /// The parent snapshot's size when the clone was made: reads of the clone beyond it never
    /// go to the parent.
    pub overlap_bytes: u64,
}

/// Whether a snapshot is complete.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SnapState {
    /// Recorded; PG leaders are applying the snap mark (and refusing writes to the image
    /// once they did) until every PG of the pool confirmed.
    Creating,
    /// Every PG of the pool applied the mark: the point in time is complete.
    Created,
}

/// A snapshot of an image: a crash-consistent point in time, marked by each PG of the pool
/// through its Raft log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapInfo {
    pub id: SnapId,
    pub pool: PoolId,
    pub image: ImageId,
    pub image_name: String,
    pub name: String,
    pub state: SnapState,
    /// The image's size when the snapshot was taken (a later resize of the image leaves it).
    pub size_bytes: u64,
    pub object_size_bytes: u64,
    pub created_epoch: Epoch,
    /// A protected snapshot cannot be removed; only protected snapshots can be cloned.
    #[serde(default)]
    pub protected: bool,
    /// PGs of the pool (by sequence number) whose leaders confirmed the mark; empty once
    /// `created`.
    #[serde(default, with = "crate::pg_set")]
    pub done_pgs: BTreeSet<u32>,
    /// The monitor's clock (Unix milliseconds) when the snapshot was recorded: a snapshot
    /// still `creating` `snap_create_timeout_ms` later is aborted.
    #[serde(default)]
    pub started_at_ms: u64,
    /// A snapshot of a clone: the clone's overlap with its parent when the snapshot was taken
    /// (what of the parent the snapshot reads where the clone had not copied up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_overlap_bytes: Option<u64>,
}

/// A snapshot whose data the PGs must drop: it was removed, or its creation was aborted. The
/// entry stays until every PG of the pool confirmed it applied the trim through its log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapTrimEntry {
    pub id: u64,
    pub pool: PoolId,
    pub image: ImageId,
    pub image_name: String,
    pub snap: SnapId,
    /// `removed` or `create timed out`.
    pub reason: String,
    /// The map epoch that recorded it.
    pub epoch: Epoch,
    #[serde(default, with = "crate::pg_set")]
    pub done_pgs: BTreeSet<u32>,
}

/// An operator's request to scrub one PG now (`fastblock-client pg scrub|deep-scrub|repair`):
/// its leader scrubs it and reports the request done in its heartbeat
/// ([`crate::api::PgScrubReport::request_done`]); the monitor then drops the entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScrubRequest {
    /// Increasing over the cluster's life: a leader scrubs for each id above the one it last
    /// reported done.
    pub id: u64,
    pub pg: PgId,
    /// Read and check every block's data too, not only compare the replicas' checksums.
    pub deep: bool,
}

impl ImageInfo {
    pub fn object_count(&self) -> u64 {
        self.size_bytes.div_ceil(self.object_size_bytes)
    }
}

/// Data the data path must delete: a removed image, or the tail cut off by a shrink.
/// The entry stays until the data path confirms the objects are gone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReclaimEntry {
    pub id: u64,
    pub pool: PoolId,
    pub image: ImageId,
    pub image_name: String,
    pub object_size_bytes: u64,
    /// Byte range of the image whose objects are garbage (`from` rounded up to an object).
    pub from_bytes: u64,
    pub to_bytes: u64,
    pub reason: String,
    pub epoch: Epoch,
    /// PGs of the pool (by sequence number) whose leaders confirmed the range is deleted; the
    /// entry goes once every PG of the pool has.
    #[serde(default, with = "crate::pg_set")]
    pub done_pgs: BTreeSet<u32>,
}

impl ReclaimEntry {
    /// Whether the whole image goes (it was removed), not only a shrunk tail.
    pub fn removes_image(&self) -> bool {
        self.from_bytes == 0
    }
}

/// What the data path needs to fence IO by image: the extent of every image that exists and
/// the next image id. Image ids are never reused, so an id below `next_id` that is not in
/// `images` belongs to a removed image.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageTable {
    pub next_id: u64,
    pub images: BTreeMap<ImageId, ImageExtent>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageExtent {
    pub size_bytes: u64,
    pub object_size_bytes: u64,
    /// A clone not flattened yet: its head's overlap with its parent (PG leaders place the
    /// data a copy-up brings by it, `clone_data`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_overlap_bytes: Option<u64>,
}

/// Whether a range of an object may be read or written, by a map's [`ImageTable`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageFence {
    Allowed,
    /// The image was removed.
    Removed,
    /// The range ends beyond the image's size.
    BeyondSize {
        size_bytes: u64,
    },
    /// The image is newer than this map: the map's holder is behind.
    Unknown,
}

impl ImageTable {
    /// Checks `offset_bytes..offset_bytes + length_bytes` of object `object_index` of `image`.
    pub fn check(
        &self,
        image: ImageId,
        object_index: u64,
        offset_bytes: u64,
        length_bytes: u64,
    ) -> ImageFence {
        if image.0 >= self.next_id {
            return ImageFence::Unknown;
        }
        let Some(extent) = self.images.get(&image) else {
            return ImageFence::Removed;
        };
        let end_bytes = object_index
            .checked_mul(extent.object_size_bytes)
            .and_then(|start| start.checked_add(offset_bytes))
            .and_then(|start| start.checked_add(length_bytes));
        match end_bytes {
            Some(end) if end <= extent.size_bytes => ImageFence::Allowed,
            _ => ImageFence::BeyondSize {
                size_bytes: extent.size_bytes,
            },
        }
    }
}

/// Id counters. Ids are never reused, so the counters only grow and live in etcd.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    pub next_osd_id: u32,
    pub next_pool_id: u32,
    pub next_image_id: u64,
    pub next_reclaim_id: u64,
    /// Absent in counters written before snapshots existed: trim ids then start at 1.
    #[serde(default = "one_u64")]
    pub next_snap_trim_id: u64,
}

fn one_u64() -> u64 {
    1
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            next_osd_id: 1,
            next_pool_id: 1,
            next_image_id: 1,
            next_reclaim_id: 1,
            next_snap_trim_id: 1,
        }
    }
}

/// What OSDs and clients need to route IO: served by `GET /v1/map`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterMap {
    pub epoch: Epoch,
    /// Shared between copies until one changes it (`Arc::make_mut`): a daemon copies its map
    /// at every epoch to apply a delta, and most epochs leave the OSDs as they were (at 1,000
    /// OSDs a deep copy was most of what the scale harness's simulated daemons did); an epoch
    /// that changes some OSDs copies the table's references and those OSDs only
    /// ([`crate::osd_table`]).
    pub osds: Arc<OsdTable>,
    pub pools: BTreeMap<PoolId, PoolInfo>,
    pub pgmaps: BTreeMap<PoolId, PgMap>,
    pub flags: Flags,
    /// The images, for fencing IO at the OSDs (derived by the monitor from its image records;
    /// `None` in maps that carry no image table, as the simulator's and unit tests').
    #[serde(default)]
    pub images: Option<ImageTable>,
    /// Data still to delete, for the PG leaders (derived from the monitor's reclaim records).
    #[serde(default)]
    pub reclaim: BTreeMap<u64, ReclaimEntry>,
    /// The live snapshots of each image, `creating` and `created`, sorted by id (derived from
    /// the monitor's snapshot records): PG leaders apply the marks of `creating` ones.
    #[serde(default)]
    pub snaps: BTreeMap<ImageId, Vec<SnapInfo>>,
    /// Snapshots whose data the PG leaders must drop (derived from the monitor's records).
    #[serde(default)]
    pub snap_trims: BTreeMap<u64, SnapTrimEntry>,
    /// Scrubs operators asked for, by request id (derived from the monitor's records).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub scrub_requests: BTreeMap<u64, ScrubRequest>,
    /// How the cluster authenticates (`docs/security.md`); absent in maps written before
    /// authentication existed, which then read as mode `none`.
    #[serde(default)]
    pub auth: crate::auth::AuthSettings,
    /// Full ratios and the full OSDs; absent in maps written before them (the defaults, no
    /// OSD full).
    #[serde(default)]
    pub space: SpaceSettings,
}

impl ClusterMap {
    pub fn pool_by_name(&self, name: &str) -> Option<&PoolInfo> {
        self.pools.values().find(|p| p.name == name)
    }

    pub fn pg(&self, pg: PgId) -> Option<&PgInfo> {
        self.pgmaps.get(&pg.pool)?.pgs.get(&pg.seq)
    }

    /// Every PG whose current or target membership includes `osd`.
    pub fn pgs_of_osd(&self, osd: OsdId) -> Vec<PgId> {
        let mut out = Vec::new();
        for (pool, map) in &self.pgmaps {
            for (seq, pg) in &map.pgs {
                if pg.osdlist.contains(&osd) || pg.newosdlist.contains(&osd) {
                    out.push(PgId::new(*pool, *seq));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a pool counts as confirmed only when each of its PGs is in the done set, however
    /// many entries the set holds. Method: a pool of 4 PGs against sets missing one, holding as
    /// many entries as PGs but one foreign (a PG of a pool since shrunk), and complete.
    #[test]
    fn all_in_wants_every_pg_of_the_pool() {
        let mut pgs = crate::pg_table::PgTable::new();
        for seq in 0..4 {
            let pg: PgInfo =
                serde_json::from_str(r#"{"version":1,"state":1,"osdlist":[1]}"#).unwrap();
            pgs.insert(seq, pg);
        }
        let map = PgMap {
            pool: PoolId(1),
            version: 1,
            pgs,
        };
        assert!(!map.all_in(&[0, 1, 2].into()));
        assert!(!map.all_in(&[0, 1, 2, 9].into()));
        assert!(map.all_in(&[0, 1, 2, 3].into()));
        assert!(map.all_in(&[0, 1, 2, 3, 9].into()));
    }

    #[test]
    fn map_keys_serialize_as_strings_and_back() {
        let mut map = ClusterMap::default();
        std::sync::Arc::make_mut(&mut map.osds).insert(
            OsdId(3),
            OsdInfo {
                id: OsdId(3),
                uuid: "u".into(),
                host: "h".into(),
                address: "127.0.0.1".into(),
                port: 1,
                shards: 1,
                capacity_bytes: 10,
                up: true,
                is_in: true,
                pending_create: false,
                boot_epoch: Epoch(2),
                config: String::new(),
                lease_timing: None,
            },
        );
        let json = serde_json::to_string(&map).unwrap();
        assert!(json.contains("\"3\":{\"id\":3"), "{json}");
        assert!(json.contains("\"in\":true"), "{json}");
        let back: ClusterMap = serde_json::from_str(&json).unwrap();
        assert_eq!(back, map);
    }

    #[test]
    fn records_written_before_snapshots_load_with_defaults() {
        let image: ImageInfo = serde_json::from_str(
            r#"{"id":4,"pool":1,"pool_name":"p","name":"i","size_bytes":4096,
                "object_size_bytes":4096,"created_epoch":2}"#,
        )
        .unwrap();
        assert_eq!(image.snap_seq, 0);
        assert_eq!(image.parent, None);
        let counters: Counters = serde_json::from_str(
            r#"{"next_osd_id":2,"next_pool_id":3,"next_image_id":4,"next_reclaim_id":5}"#,
        )
        .unwrap();
        assert_eq!(counters.next_snap_trim_id, 1);
        let map: ClusterMap = serde_json::from_str(
            r#"{"epoch":1,"osds":{},"pools":{},"pgmaps":{},"flags":{"noout":false,"norebalance":false}}"#,
        )
        .unwrap();
        assert!(map.snaps.is_empty() && map.snap_trims.is_empty());
    }

    #[test]
    fn snap_state_is_lowercase_in_json() {
        assert_eq!(
            serde_json::to_string(&SnapState::Creating).unwrap(),
            "\"creating\""
        );
        let back: SnapState = serde_json::from_str("\"created\"").unwrap();
        assert_eq!(back, SnapState::Created);
    }

    #[test]
    fn failure_domain_parses() {
        assert_eq!("host".parse::<FailureDomain>(), Ok(FailureDomain::Host));
        assert!("rack".parse::<FailureDomain>().is_err());
    }
}

//! Bodies of the monitor's HTTP + JSON API (`docs/mon-api.md`). Shared by the monitor, its
//! client library, the CLI, OSDs and the block client, so that both ends of every call are
//! compiled from one definition.

use crate::ids::{Epoch, ImageId, LogIndex, OsdId, PgId, PoolId, Term};
use crate::lease::LeaseTiming;
use crate::map::{ClusterMap, FailureDomain, Flags, ImageInfo, PgInfo, PoolInfo};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// Machine-readable error codes. `retryable()` tells callers whether the same request may
/// succeed later unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    InvalidArgument,
    PoolExists,
    PoolNotFound,
    ImageExists,
    ImageNotFound,
    OsdNotFound,
    UuidExists,
    UuidMismatch,
    OsdDown,
    NotEnoughDomains,
    NotEnoughOsds,
    /// A pool would put more PG replicas on an OSD than `max_pg_per_osd` allows.
    TooManyPgs,
    ShrinkRefused,
    TooLarge,
    PgNotFound,
    StaleReport,
    /// A PG report whose term or configuration cannot follow the one the monitor recorded
    /// (a term jump beyond the bound, a second leader in one term, a leader that does not host
    /// the PG, members dropped that no recorded membership change leaves out): a bug in the
    /// sender, never a delayed message.
    ImplausibleReport,
    ReclaimNotFound,
    /// The range an image would grow into is still being deleted after an earlier shrink:
    /// retry once it is (`fastblock-client reclaim` shows it).
    ReclaimPending,
    /// The pool's records in etcd are damaged (for example its PG map is missing): the pool
    /// is fenced, only deleting it works. Health names the damage.
    PoolDamaged,
    /// No monitor holds the leadership right now (election in progress).
    NoLeader,
    /// A concurrent change won every retry; try again.
    Conflict,
    /// etcd or a peer monitor could not be reached.
    Unavailable,
    Internal,
    /// An OSD's settings cannot share PGs with another OSD's (its lease timing, see
    /// `lease`): it must be started with other settings.
    IncompatibleConfig,
    /// The call needs authentication (the cluster runs auth mode `sign` or `secure`) and
    /// carried none: pass a keyring (`--keyring`, `$FASTBLOCK_KEYRING`).
    AuthRequired,
    /// The call's authentication failed: unknown or removed entity, wrong key, a time too far
    /// from the monitor's clock, or a replayed request. The message names which.
    AuthFailed,
    /// The call was signed for another monitor incarnation: the leading monitor restarted or
    /// leadership moved since the caller last heard, and the new leader cannot know which
    /// calls the old one served. The answer's `x-fastblock-incarnation` header names the
    /// current one; the caller signs the call again for it (the monitor client does this by
    /// itself).
    StaleIncarnation,
    /// The authenticated entity lacks the capability the call needs (or, for an OSD, is not
    /// the OSD the call speaks for, as a PG report naming another OSD as its leader).
    PermissionDenied,
    /// `auth add` of an entity that already has a key.
    EntityExists,
    /// The entity has no key in the monitor's table.
    EntityNotFound,
    /// No snapshot of that name (or id) on the image.
    SnapNotFound,
    /// The image already has a snapshot of that name.
    SnapExists,
    /// Refused because something depends on it: a protected snapshot, a snapshot with clones,
    /// an image with snapshots or clones. The message names what, and what to do first.
    SnapInUse,
    /// The snapshot is not in a state that allows the call: still being created, or (for a
    /// clone) not protected.
    SnapNotReady,
    /// Not every PG of the pool confirmed the snapshot's mark within the monitor's
    /// `--snap-create-timeout-ms`: the snapshot was aborted. The message names the PGs that
    /// did not confirm. A new `snap create` may be tried.
    SnapCreateTimedOut,
    SnapTrimNotFound,
    /// `osd purge` of an OSD that is up, in, or still named by a PG (it may hold data no other
    /// replica has). The message says which and what to do first.
    OsdInUse,
    /// A config call relayed to an OSD (`POST /v1/osds/{id}/config`) got no answer within the
    /// monitor's wait: the OSD may or may not have applied it (`config get` tells).
    OsdTimedOut,
    /// Too many calls of this kind wait already (config calls to one OSD): retry once they
    /// are answered.
    Busy,
    /// The monitors' etcd is out of space (its `NOSPACE` alarm): no change can be made until
    /// room is made. Retryable: the leader makes room by itself while compaction is on
    /// (health `MON_ETCD_NOSPACE` says how it stands and what to do).
    MonStoreFull,
    /// A code this build does not know (sent by a newer monitor).
    #[serde(other)]
    Unknown,
}

impl ErrorCode {
    pub fn retryable(self) -> bool {
        matches!(
            self,
            ErrorCode::NoLeader
                | ErrorCode::Conflict
                | ErrorCode::Unavailable
                | ErrorCode::ReclaimPending
                | ErrorCode::MonStoreFull
                | ErrorCode::StaleIncarnation
        )
    }

    /// HTTP status the monitor answers with.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::InvalidArgument
            | ErrorCode::NotEnoughDomains
            | ErrorCode::NotEnoughOsds
            | ErrorCode::TooManyPgs
            | ErrorCode::ShrinkRefused
            | ErrorCode::TooLarge
            | ErrorCode::UuidMismatch
            | ErrorCode::OsdDown => 400,
            ErrorCode::AuthRequired | ErrorCode::AuthFailed | ErrorCode::StaleIncarnation => 401,
            ErrorCode::PermissionDenied => 403,
            ErrorCode::PoolNotFound
            | ErrorCode::ImageNotFound
            | ErrorCode::OsdNotFound
            | ErrorCode::PgNotFound
            | ErrorCode::ReclaimNotFound
            | ErrorCode::SnapNotFound
            | ErrorCode::SnapTrimNotFound
            | ErrorCode::EntityNotFound => 404,
            ErrorCode::PoolExists
            | ErrorCode::ImageExists
            | ErrorCode::UuidExists
            | ErrorCode::EntityExists
            | ErrorCode::StaleReport
            | ErrorCode::ImplausibleReport
            | ErrorCode::ReclaimPending
            | ErrorCode::PoolDamaged
            | ErrorCode::IncompatibleConfig
            | ErrorCode::SnapExists
            | ErrorCode::SnapInUse
            | ErrorCode::SnapNotReady
            | ErrorCode::SnapCreateTimedOut
            | ErrorCode::OsdInUse
            | ErrorCode::Busy
            | ErrorCode::Conflict => 409,
            ErrorCode::OsdTimedOut => 504,
            ErrorCode::NoLeader | ErrorCode::Unavailable => 503,
            ErrorCode::MonStoreFull => 507,
            ErrorCode::Internal | ErrorCode::Unknown => 500,
        }
    }
}

/// The error body of every failed call: `{"error": {...}}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    pub retryable: bool,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
            retryable: code.retryable(),
        }
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ApiError,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ApplyIdRequest {
    pub uuid: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ApplyIdResponse {
    pub id: OsdId,
}

fn one() -> u32 {
    1
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BootRequest {
    pub uuid: String,
    pub address: String,
    /// Data port of shard 0; shard `k` listens on `port + k`.
    pub port: u16,
    #[serde(default = "one")]
    pub shards: u32,
    pub host: String,
    pub capacity_bytes: u64,
    /// The OSD's effective configuration, shown by `showconfig`.
    #[serde(default)]
    pub config: String,
    /// The settings its leases depend on, checked against every other OSD's. Absent from OSDs
    /// built before the check: their boot is not checked.
    #[serde(default)]
    pub lease_timing: Option<LeaseTiming>,
}

/// Answer to boot and heartbeat: the epoch lets the OSD see that it must fetch a newer map.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EpochResponse {
    pub epoch: Epoch,
}

/// IO counters of one PG, cumulative since the reporting OSD started. Only the PG's leader
/// reports client IO, so the sum over OSDs counts each IO once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgIoCounters {
    pub pg: Option<PgId>,
    pub read_ops: u64,
    pub read_bytes: u64,
    pub write_ops: u64,
    pub write_bytes: u64,
    /// Bytes and objects recovery still has to copy for this PG, and copied so far.
    #[serde(default)]
    pub recovery_remaining_bytes: u64,
    #[serde(default)]
    pub recovery_remaining_objects: u64,
    #[serde(default)]
    pub recovery_done_bytes: u64,
    /// What the PG holds, as its leader applied it: objects, and the bytes of one copy of its
    /// data (head and image snapshots; 4 KiB blocks). Absent from OSDs that predate it.
    #[serde(default)]
    pub objects: u64,
    #[serde(default)]
    pub stored_bytes: u64,
    /// The PG's scrubs under this leader (absent from OSDs that predate scrub, and before
    /// this leader's first scrub of the PG).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scrub: Option<PgScrubReport>,
}

/// What a PG leader reports of its scrubs of the PG (`docs/design/scrub.md`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgScrubReport {
    /// Scrubs (light or deep) this leader finished, and deep ones among them.
    pub scrubs: u64,
    pub deep_scrubs: u64,
    /// The highest operator request (`ScrubRequest::id`) this leader has finished a scrub for
    /// (0: none): the monitor drops requests up to it.
    pub request_done: u64,
    /// Of the last finished scrub: 4 KiB blocks whose replicas disagreed, blocks bad on a
    /// replica (deep: their data did not match their checksum), and blocks repaired from
    /// the majority. `inconsistent_blocks - repaired_blocks > 0` means some are left
    /// (no majority agreed, or the repair failed): the monitor raises `PG_INCONSISTENT`.
    pub inconsistent_blocks: u64,
    pub repaired_blocks: u64,
    /// Whether the last finished scrub was deep.
    pub last_deep: bool,
    /// Whether a scrub is running now.
    pub running: bool,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct HeartbeatRequest {
    pub uuid: String,
    #[serde(default)]
    pub pgs: Vec<PgIoCounters>,
    /// Snapshot copies of PGs this OSD leads that a member refused for lack of space.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backfill_toofull: Vec<BackfillTooFull>,
    /// The OSD's data space, over its shards (absent from OSDs that predate it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub space: Option<OsdSpace>,
    /// The OSD's op tracker: its slow ops and its slowest recent ones (absent from OSDs that
    /// predate it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ops: Option<OsdOps>,
    /// The OSD's answers to the config calls the last heartbeat answers carried (absent when
    /// none; monitors that predate the relay ignore it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub config_replies: Vec<OsdConfigReply>,
    /// The weakest auth mode the OSD accepts (its `--auth-floor`): with the cluster's mode
    /// below it, the OSD refuses the monitor's maps and answers and health says so
    /// (`AUTH_DOWNGRADE_REFUSED`). Absent from OSDs that predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_floor: Option<crate::auth::AuthMode>,
}

/// Answer to a heartbeat: the epoch (the OSD fetches a newer map when it moved), and the config
/// calls an administrator made to this OSD through the monitor (`POST /v1/osds/{id}/config`),
/// which the OSD answers in its next heartbeat. OSDs that predate the relay read `epoch` only.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HeartbeatResponse {
    pub epoch: Epoch,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub config_calls: Vec<OsdConfigCall>,
}

/// One config call relayed to an OSD; `id` pairs it with its [`OsdConfigReply`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OsdConfigCall {
    pub id: u64,
    pub request: crate::daemon_config::AdminRequest,
}

/// An OSD's answer to the [`OsdConfigCall`] of the same `id`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OsdConfigReply {
    pub id: u64,
    pub reply: crate::daemon_config::AdminReply,
}

/// The data space of one OSD (every shard's data region): what the monitor sums into the
/// cluster's raw capacity.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OsdSpace {
    pub total_bytes: u64,
    pub free_bytes: u64,
    /// What the OSD can still take before one of its shards refuses writes for its own data
    /// reserve: its shard count times the smallest (free − reserve) over its shards, blocks
    /// waiting for a flush counted free (new data spreads over the shards as PGs hash onto
    /// them). Absent from OSDs that predate it: the monitor then takes `free_bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writable_bytes: Option<u64>,
}

/// What the PGs of a pool hold, from their leaders' last reports (`pool ls`, `status`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolUsage {
    pub pool: PoolId,
    pub objects: u64,
    /// Bytes of one copy: the images' data and what their snapshots keep.
    pub stored_bytes: u64,
    /// Raw bytes on the OSDs: `stored_bytes` times the pool's size.
    pub used_bytes: u64,
    /// PGs whose leader has not reported yet: their data is missing from the sums.
    pub pgs_unreported: u32,
}

/// The cluster's space (`status`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterUsage {
    pub objects: u64,
    /// Bytes of one copy, over every pool.
    pub stored_bytes: u64,
    /// Raw bytes the pools' replicas take.
    pub used_bytes: u64,
    /// The data space of the OSDs that are up, and what of it is free (from their reports).
    pub raw_total_bytes: u64,
    pub raw_free_bytes: u64,
}

/// A PG's leader could not start copying the PG to `osd` (a new or lagging member): `osd`
/// has `free_bytes` for it where the copy needs `needed_bytes` (the health check
/// `PG_BACKFILL_TOOFULL`). The leader asks again every few seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackfillTooFull {
    pub pg: PgId,
    pub osd: OsdId,
    pub needed_bytes: u64,
    pub free_bytes: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CreatePoolRequest {
    pub name: String,
    pub pg_count: u32,
    pub size: u32,
    pub failure_domain: FailureDomain,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CreateImageRequest {
    pub pool: String,
    pub name: String,
    pub size_bytes: u64,
    /// Power of two; the monitor's default (4 MiB) when absent.
    #[serde(default)]
    pub object_size_bytes: Option<u64>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ResizeImageRequest {
    pub size_bytes: u64,
    /// Shrinking discards data past the new end, so it must be asked for explicitly.
    #[serde(default)]
    pub allow_shrink: bool,
}

/// Sent by a PG replica that just became leader, with its current Raft configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderElectedRequest {
    pub leader: OsdId,
    pub term: Term,
    /// Index of the configuration entry `voters` comes from (0 for the initial one).
    pub conf_index: LogIndex,
    pub voters: Vec<OsdId>,
    /// Non-empty while the group is in a joint configuration: the outgoing voters.
    #[serde(default)]
    pub voters_outgoing: Vec<OsdId>,
    /// Learners of the configuration (members being caught up before they become voters).
    #[serde(default)]
    pub learners: Vec<OsdId>,
}

/// Sent by the PG leader once a membership change has committed and left the joint state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MembershipFinishedRequest {
    pub leader: OsdId,
    pub term: Term,
    pub conf_index: LogIndex,
    pub voters: Vec<OsdId>,
    /// Learners left in the configuration (normally none once a change finished).
    #[serde(default)]
    pub learners: Vec<OsdId>,
}

/// Answer to PG reports: the PG as the monitor now has it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PgReportResponse {
    pub epoch: Epoch,
    pub pg: PgInfo,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PoolList {
    pub pools: Vec<PoolInfo>,
    /// What each pool holds, in the order of `pools` (absent from monitors that predate it).
    #[serde(default)]
    pub usage: Vec<PoolUsage>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ImageList {
    pub images: Vec<ImageInfo>,
}

/// A row of `pg ls`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PgRow {
    pub pgid: PgId,
    pub state_name: String,
    #[serde(flatten)]
    pub info: PgInfo,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PgList {
    pub epoch: Epoch,
    pub pgs: Vec<PgRow>,
}

/// The map, or "not modified" after a long-poll timeout (`map: None`). Asked with `delta=true`,
/// a holder that has a recent epoch gets `delta` instead: the changes since its epoch
/// (`crate::map_delta`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MapResponse {
    pub epoch: Epoch,
    pub map: Option<ClusterMap>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta: Option<crate::map_delta::MapDelta>,
}

impl MapResponse {
    /// The answer as an update for a `MapFollower`.
    pub fn into_update(self) -> crate::map_delta::MapUpdate {
        use crate::map_delta::MapUpdate;
        match (self.map, self.delta) {
            (Some(map), _) => MapUpdate::Full(map),
            (None, Some(delta)) => MapUpdate::Delta(delta),
            (None, None) => MapUpdate::UpToDate,
        }
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct IoRates {
    pub read_bytes_per_sec: f64,
    pub write_bytes_per_sec: f64,
    pub read_ops_per_sec: f64,
    pub write_ops_per_sec: f64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct RecoveryStatus {
    pub recovering_pgs: u32,
    pub remaining_bytes: u64,
    pub remaining_objects: u64,
    pub bytes_per_sec: f64,
}

impl RecoveryStatus {
    /// Seconds until the bytes left are copied at the current rate, rounded up: `None` when
    /// nothing is left, or when no progress was measured (no rate, so no honest estimate).
    pub fn eta_secs(&self) -> Option<u64> {
        // Below a byte a second (or NaN) the quotient means nothing.
        let measured = self.bytes_per_sec.is_finite() && self.bytes_per_sec >= 1.0;
        if self.remaining_bytes == 0 || !measured {
            return None;
        }
        Some((self.remaining_bytes as f64 / self.bytes_per_sec).ceil() as u64)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MonMember {
    pub name: String,
    pub api_addr: String,
}

/// How bad a health check is: `Err` makes the cluster `HEALTH_ERR`, `Warn` `HEALTH_WARN`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Warn,
    Err,
}

/// One health check (`docs/operations.md`, "Capacity and health"): `code` is stable (tools
/// match on it), `summary` is one line, `detail` names what is affected, one item a line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthCheck {
    pub code: String,
    pub severity: Severity,
    pub summary: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub detail: Vec<String>,
}

impl fmt::Display for HealthCheck {
    /// `CODE: summary`, the line `health` and `status` print.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.summary)
    }
}

/// `GET /v1/health`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HealthResponse {
    /// `HEALTH_OK`, `HEALTH_WARN` or `HEALTH_ERR`.
    pub status: String,
    pub checks: Vec<HealthCheck>,
    pub epoch: Epoch,
}

/// `POST /v1/space/nearfull-ratio` and `/v1/space/full-ratio`: a ratio in (0, 1].
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct SetRatioRequest {
    pub ratio: f64,
}

/// The raw space of the OSDs that are up (`df`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RawSpace {
    pub total_bytes: u64,
    pub used_bytes: u64,
    pub avail_bytes: u64,
    /// OSDs up without a space report yet: their space is missing from the sums.
    pub osds_unreported: u32,
}

/// One pool's row of `df`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolDf {
    pub pool: PoolId,
    pub name: String,
    pub size: u32,
    pub objects: u64,
    /// Bytes of one copy.
    pub stored_bytes: u64,
    /// Raw bytes with replication: `stored_bytes` times `size`.
    pub used_bytes: u64,
    /// Bytes of one copy the pool can still take before the first OSD it places on reaches
    /// the full ratio (`fastblock_mon_core::capacity::pool_max_avail_bytes`).
    pub max_avail_bytes: u64,
    /// PGs whose leader has not reported yet: their data is missing from the sums.
    pub pgs_unreported: u32,
}

/// `GET /v1/df`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DfResponse {
    pub raw: RawSpace,
    pub pools: Vec<PoolDf>,
    pub nearfull_ratio_ppm: u32,
    pub full_ratio_ppm: u32,
}

/// `GET /v1/status`: everything `fastblock-client status` prints.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StatusResponse {
    pub epoch: Epoch,
    pub health: String,
    pub health_checks: Vec<HealthCheck>,
    pub leader: Option<MonMember>,
    pub mons: Vec<MonMember>,
    pub flags: Flags,
    pub osds_total: u32,
    pub osds_up: u32,
    pub osds_in: u32,
    pub pools: u32,
    pub pgs: u32,
    pub images: u32,
    /// PG count per state name (`active`, `undersize+remapped`, ...).
    pub pg_states: BTreeMap<String, u32>,
    pub io: IoRates,
    pub recovery: RecoveryStatus,
    /// Space: stored, used and the raw capacity (absent from monitors that predate it).
    #[serde(default)]
    pub usage: ClusterUsage,
    /// The monitors' etcd: database sizes, quota, compaction, alarms (absent from monitors
    /// that predate it, and before the leader's first look).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd: Option<crate::etcd::EtcdStatus>,
}

/// `GET /v1/status/public`: what the monitor's status page shows, readable without a key
/// (`docs/mon-api.md`, "Status page"). A subset of [`StatusResponse`] restricted to health and
/// operational figures, plus each OSD's state and space; no names, addresses or keys.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PublicStatusResponse {
    pub epoch: Epoch,
    /// `HEALTH_OK`, `HEALTH_WARN` or `HEALTH_ERR`, and the checks as `GET /v1/health` has them.
    pub health: String,
    pub health_checks: Vec<HealthCheck>,
    /// Every OSD of the map (none still being created), by id.
    pub osds: Vec<PublicOsd>,
    pub pools: u32,
    pub pgs: u32,
    pub images: u32,
    /// PG count per state name (`active`, `undersize+remapped`, ...).
    pub pg_states: BTreeMap<String, u32>,
    pub io: IoRates,
    pub recovery: RecoveryStatus,
    /// [`RecoveryStatus::eta_secs`].
    pub recovery_eta_secs: Option<u64>,
    pub usage: ClusterUsage,
    /// The monitors' etcd, without names or addresses (absent before the leader's first look).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd: Option<crate::etcd::PublicEtcd>,
}

/// One OSD as the status page shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublicOsd {
    pub id: OsdId,
    pub up: bool,
    #[serde(rename = "in")]
    pub is_in: bool,
    /// Its data space from its last heartbeat; `None` while down or before its first report.
    pub space: Option<OsdSpace>,
    /// The map marks it full: writes to its PGs are refused (`OSD_FULL`).
    pub full: bool,
}

/// Answer to `POST /v1/reclaim/{id}/pgs/{pg}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReclaimPgDoneResponse {
    /// Every PG of the pool confirmed: the entry is gone.
    pub finished: bool,
}

/// `POST /v1/images/{pool}/{name}/snaps`: take a snapshot.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CreateSnapRequest {
    pub name: String,
}

/// `POST /v1/images/{pool}/{name}/snaps/{snap}/clone`: the new image.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CloneRequest {
    pub pool: String,
    pub name: String,
}

/// Answer to `POST /v1/snaps/{image id}/{snap id}/pgs/{pg}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapPgDoneResponse {
    /// Every PG of the pool confirmed the mark: the snapshot is `created`.
    pub created: bool,
}

/// Answer to `POST /v1/snaptrim/{id}/pgs/{pg}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapTrimPgDoneResponse {
    /// Every PG of the pool confirmed the trim: the entry is gone.
    pub finished: bool,
}

/// The longest `fastblock-mon --snap-create-timeout-ms`: a snapshot create call is answered
/// within it, and it stays below the time a follower waits for a forwarded call (75 s), so a
/// create sent to any monitor gets its answer.
pub const SNAP_CREATE_TIMEOUT_MS_MAX: u64 = 60_000;
/// The default of `--snap-create-timeout-ms`.
pub const SNAP_CREATE_TIMEOUT_MS_DEFAULT: u64 = 30_000;
const _: () = assert!(SNAP_CREATE_TIMEOUT_MS_DEFAULT <= SNAP_CREATE_TIMEOUT_MS_MAX);

/// One entity of the monitor's key table, as `GET /v1/auth` lists it (no key).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthEntityInfo {
    /// `client.NAME` or `osd.N`.
    pub entity: String,
    /// Capabilities in text form (`admin`, `osd`, `pool=NAME`, `pool=*`).
    pub caps: String,
    /// Rises whenever the entity's key or caps change; connections made under an older
    /// generation are closed by OSDs.
    pub generation: u64,
    /// A short, non-secret fingerprint of the key, to tell keys apart.
    pub fingerprint: String,
}

/// `POST /v1/auth` (create), `.../rotate`, `.../get-or-create`: an entity and its key, the
/// key sealed for the caller (base64 of `fastblock_auth::seal_blob(caller's entity key, key)`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AuthKeyResponse {
    pub entity: String,
    pub caps: String,
    pub generation: u64,
    /// The key table's epoch after the change (the sealed key is bound to it, with the
    /// entity, caps and generation).
    #[serde(default)]
    pub epoch: u64,
    /// Base64 of `seal_blob(calling entity's key, new key)`; empty when the call was not
    /// authenticated (auth mode `none`), and then `key` carries it.
    pub sealed_key: String,
    /// The key in clear, only in auth mode `none` (where the API is open anyway and the
    /// caller may hold no key to seal it with).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// `POST /v1/auth`: create an entity.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AuthAddRequest {
    pub entity: String,
    pub caps: String,
}

/// `POST /v1/auth/{entity}/caps`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AuthCapsRequest {
    pub caps: String,
}

/// `GET /v1/auth/entities` (OSDs only): every entity's caps and generation, no keys, and the
/// key table's epoch. OSDs judge tickets and open connections against it for revocation.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AuthEntitiesResponse {
    pub epoch: u64,
    pub mode: crate::auth::AuthMode,
    pub entities: Vec<AuthEntityEntry>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AuthEntityEntry {
    pub entity: String,
    pub caps: String,
    pub generation: u64,
}

/// The most OSDs one `POST /v1/auth/tickets` may ask tickets for.
pub const TICKETS_PER_CALL_MAX: usize = 1024;

/// `POST /v1/auth/tickets`: tickets for the caller to speak to these OSDs.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TicketsRequest {
    pub osds: Vec<u32>,
}

/// The answer: one ticket per OSD the key table holds a key for (the others are listed in
/// `unknown`), each with its session key sealed for the caller (`docs/security.md`,
/// "Tickets").
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TicketsResponse {
    pub auth_epoch: u64,
    pub expires_unix_s: u64,
    pub tickets: Vec<TicketEntry>,
    #[serde(default)]
    pub unknown: Vec<u32>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TicketEntry {
    pub osd: u32,
    /// Base64 of the ticket (`crates/auth/src/ticket.rs`).
    pub ticket: String,
    /// Base64 of the session key sealed under the caller's key, bound to the ticket.
    pub sealed_session_key: String,
}

/// `PUT /v1/auth/mode`: the cluster's new auth mode. Answered with the map's new
/// [`crate::auth::AuthSettings`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AuthModeRequest {
    pub mode: crate::auth::AuthMode,
}

/// The most ops an [`OsdOps`] lists of each kind (oldest in flight, slowest completed): the
/// report rides in every heartbeat, so it stays bounded.
pub const TRACKED_OPS_LISTED_MAX: usize = 20;

/// The most stages a [`TrackedOp`] lists: an op through the log has four, a read three.
pub const TRACKED_OP_STAGES_MAX: usize = 4;

/// What an OSD's op tracker shows (`docs/operations.md`, "Slow ops"): counts of the ops in
/// flight, the oldest of them, and the slowest ops completed in the last 10 minutes, each
/// with the time it spent in every stage.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OsdOps {
    /// An op in flight this long is slow (`--op-complaint-time`).
    pub complaint_time_ms: u64,
    /// Ops in flight when the report was taken.
    pub in_flight: u64,
    /// Of those, the ones in flight for `complaint_time_ms` or longer.
    pub slow: u64,
    /// The oldest ops in flight, oldest first (at most [`TRACKED_OPS_LISTED_MAX`]).
    #[serde(default)]
    pub oldest: Vec<TrackedOp>,
    /// The slowest ops completed in the last 10 minutes, slowest first (at most
    /// [`TRACKED_OPS_LISTED_MAX`]).
    #[serde(default)]
    pub slowest: Vec<TrackedOp>,
}

impl OsdOps {
    /// Adds another shard's report: counts summed, lists merged and bounded again.
    pub fn merge(&mut self, other: OsdOps) {
        self.complaint_time_ms = self.complaint_time_ms.max(other.complaint_time_ms);
        self.in_flight += other.in_flight;
        self.slow += other.slow;
        self.oldest.extend(other.oldest);
        self.oldest
            .sort_by_key(|o| std::cmp::Reverse(o.duration_us));
        self.oldest.truncate(TRACKED_OPS_LISTED_MAX);
        self.slowest.extend(other.slowest);
        self.slowest
            .sort_by_key(|o| std::cmp::Reverse(o.duration_us));
        self.slowest.truncate(TRACKED_OPS_LISTED_MAX);
    }

    /// Cuts the lists to the bounds an OSD keeps: a receiver stores a report from the network
    /// only this large.
    pub fn bounded(mut self) -> OsdOps {
        self.oldest.truncate(TRACKED_OPS_LISTED_MAX);
        self.slowest.truncate(TRACKED_OPS_LISTED_MAX);
        for op in self.oldest.iter_mut().chain(self.slowest.iter_mut()) {
            op.stages.truncate(TRACKED_OP_STAGES_MAX);
        }
        self
    }
}

/// One op an OSD tracks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrackedOp {
    /// The shard that holds it.
    pub shard: u32,
    pub pg: PgId,
    /// `write` (writes, discards, zeroing, copy-ups, rollbacks), `read`, `allocation`,
    /// `snap_read`, `clone_read`, or an op the OSD proposed itself: `reclaim`, `snap_mark`,
    /// `snap_trim`, `repair`.
    pub kind: String,
    /// The client's request id on its connection (0 for the OSD's own ops).
    pub request_id: u64,
    /// In flight: microseconds since its request was read. Completed: from then to its reply.
    pub duration_us: u64,
    /// In flight: the stage it is in. Completed: the stage it spent longest in.
    pub stage: String,
    /// The stages it went through, in order, with the microseconds spent in each; for an op in
    /// flight the last is the one it is in, so far.
    pub stages: Vec<OpStage>,
}

/// Time spent in one stage of an op.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpStage {
    pub stage: String,
    pub us: u64,
}

/// `GET /v1/osds/{id}/ops`: the op tracker of one OSD, as of its last heartbeat.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OsdOpsResponse {
    pub osd: OsdId,
    /// Milliseconds since the monitor received the report (the ages in it are as of then).
    pub report_age_ms: u64,
    pub ops: OsdOps,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recovery(remaining_bytes: u64, bytes_per_sec: f64) -> RecoveryStatus {
        RecoveryStatus {
            recovering_pgs: 1,
            remaining_bytes,
            remaining_objects: 1,
            bytes_per_sec,
        }
    }

    #[test]
    fn recovery_eta_is_remaining_over_rate_rounded_up() {
        assert_eq!(recovery(10 << 20, f64::from(1 << 20)).eta_secs(), Some(10));
        assert_eq!(
            recovery(10 << 20, 3.0 * f64::from(1 << 20)).eta_secs(),
            Some(4)
        );
    }

    #[test]
    fn recovery_eta_is_unknown_without_progress_or_work() {
        assert_eq!(recovery(0, 1e6).eta_secs(), None);
        assert_eq!(recovery(1 << 20, 0.0).eta_secs(), None);
        assert_eq!(recovery(1 << 20, 0.5).eta_secs(), None);
        assert_eq!(recovery(1 << 20, f64::NAN).eta_secs(), None);
        assert_eq!(recovery(1 << 20, f64::INFINITY).eta_secs(), None);
    }
}

/// One thing an OSD tells the monitor about a PG it leads (`POST /v1/osds/{id}/reports`, in
/// batches): what the single-report endpoints carry, one per item.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum OsdReport {
    /// This OSD leads `pg` (or changed its configuration as leader).
    LeaderElected { pg: PgId, req: LeaderElectedRequest },
    /// This OSD leads `pg` and its configuration reached the monitor's target.
    MembershipFinished {
        pg: PgId,
        req: MembershipFinishedRequest,
    },
    /// `pg` applied reclaim entry `id`.
    ReclaimDone { pg: PgId, id: u64 },
    /// `pg` applied the mark of snapshot `snap` of `image`.
    SnapMarked { pg: PgId, image: ImageId, snap: u64 },
    /// `pg` applied snapshot trim entry `id`.
    SnapTrimmed { pg: PgId, id: u64 },
}

impl OsdReport {
    pub fn pg(&self) -> PgId {
        match self {
            OsdReport::LeaderElected { pg, .. }
            | OsdReport::MembershipFinished { pg, .. }
            | OsdReport::ReclaimDone { pg, .. }
            | OsdReport::SnapMarked { pg, .. }
            | OsdReport::SnapTrimmed { pg, .. } => *pg,
        }
    }
}

/// `POST /v1/osds/{id}/reports`: every report an OSD has for the monitor, at most
/// [`REPORT_BATCH_ITEMS_MAX`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportBatch {
    pub reports: Vec<OsdReport>,
}

/// Reports in one batch, at most: a few hundred PGs per OSD lead at the sizes we aim at, and
/// each report is a few hundred bytes of JSON.
pub const REPORT_BATCH_ITEMS_MAX: usize = 4096;

/// Answer to a [`ReportBatch`]: the epoch that recorded it, and one result per report, in order
/// (`None` for a report taken; a refusal says why, and whether it is worth sending again).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportBatchResponse {
    pub epoch: Epoch,
    pub results: Vec<Option<ApiError>>,
}

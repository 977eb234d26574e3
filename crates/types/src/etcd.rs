//! The monitor's etcd as `status`, `health`, `/metrics` and the status page show it, and the
//! format of a monitor backup (`fastblock-client mon backup`, `docs/operations.md`, "Monitor
//! database").

use crate::Epoch;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What a monitor last saw of its etcd cluster (`docs/mon-api.md`, "GET /v1/status").
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EtcdStatus {
    /// Each member as its last status call answered (sorted by name).
    pub members: Vec<EtcdMemberStatus>,
    /// The quota each member enforces (`--etcd-quota-bytes`): past it, etcd raises `NOSPACE`
    /// and refuses every write.
    pub quota_bytes: u64,
    /// `MON_ETCD_NEARFULL` is raised when a member's database file reaches this share of the
    /// quota, in parts per million.
    pub nearfull_ratio_ppm: u32,
    /// The store's current revision (every write adds one).
    pub revision: u64,
    /// The revision this monitor last compacted etcd's history to, while it leads; `None`
    /// before its first compaction (a monitor that just took over knows none older).
    pub compacted_revision: Option<u64>,
    /// When that compaction ran (Unix milliseconds).
    pub last_compaction_unix_ms: Option<u64>,
    /// How often the leader compacts (`--etcd-compact-interval`); 0 when compaction is off.
    pub compact_interval_ms: u64,
    /// Alarms etcd has raised (`NOSPACE`, `CORRUPT`), with the member that raised each.
    pub alarms: Vec<EtcdAlarm>,
    /// The last defragmentation this monitor ran, of any member (Unix milliseconds).
    pub last_defrag_unix_ms: Option<u64>,
    /// What the monitor did about the last `NOSPACE` alarm, once it acted on one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery: Option<String>,
    /// When this view was taken (Unix milliseconds); 0 before the first.
    pub observed_unix_ms: u64,
}

impl EtcdStatus {
    /// The largest database file among the members that answered.
    pub fn db_size_bytes_max(&self) -> u64 {
        self.members
            .iter()
            .map(|m| m.db_size_bytes)
            .max()
            .unwrap_or(0)
    }

    /// Whether etcd refuses writes for lack of space.
    pub fn nospace(&self) -> bool {
        self.alarms.iter().any(|a| a.alarm == ETCD_ALARM_NOSPACE)
    }
}

/// etcd's name for its out-of-space alarm.
pub const ETCD_ALARM_NOSPACE: &str = "NOSPACE";

/// One etcd member.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EtcdMemberStatus {
    pub name: String,
    /// The client URL the monitor asked.
    pub endpoint: String,
    /// The size of the member's database file: what etcd's quota is checked against.
    pub db_size_bytes: u64,
    /// The part of the file holding data (the rest is free pages left by compaction, which
    /// only a defragmentation gives back to the file system).
    pub db_size_in_use_bytes: u64,
    /// The member is etcd's Raft leader.
    pub is_leader: bool,
    /// Why the member did not answer, when it did not (the sizes are then 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One raised etcd alarm.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EtcdAlarm {
    /// The member that raised it (its name, or its id in hexadecimal when unknown).
    pub member: String,
    /// `NOSPACE` or `CORRUPT`.
    pub alarm: String,
}

/// The format name a backup file starts with; a restore refuses any other.
pub const MON_BACKUP_FORMAT: &str = "fastblock-mon-backup-v1";

/// A monitor backup (`GET /v1/mon/backup`, `fastblock-client mon backup FILE`): every key of
/// the cluster's state as one etcd revision held it (the election's `mon/` keys left out).
/// It holds the key table: keep it as secret as a keyring (the CLI writes it with mode 0600).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MonBackup {
    /// [`MON_BACKUP_FORMAT`].
    pub format: String,
    /// The key prefix of the cluster it was taken from (`--key-prefix`); keys are relative to
    /// it, so a backup restores under another prefix too.
    pub prefix: String,
    /// The etcd revision the keys were read at.
    pub revision: u64,
    /// The map epoch the keys hold.
    pub epoch: Epoch,
    /// When it was taken (Unix milliseconds, the monitor's clock): a restore advances the
    /// epoch and the id counters by the time since, so that nothing handed out after the
    /// backup is handed out again (`docs/operations.md`, "Restoring").
    pub taken_unix_ms: u64,
    /// The keys below the prefix (without it) and their JSON values, as stored.
    pub keys: BTreeMap<String, String>,
}

/// The status page's view of etcd (`GET /v1/status/public`): sizes, compaction and alarms,
/// without member names or addresses.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PublicEtcd {
    pub members: u32,
    /// The largest database file among the members.
    pub db_size_bytes: u64,
    /// The data in that member's file.
    pub db_size_in_use_bytes: u64,
    pub quota_bytes: u64,
    pub nearfull_ratio_ppm: u32,
    pub revision: u64,
    pub compacted_revision: Option<u64>,
    pub last_compaction_unix_ms: Option<u64>,
    pub compact_interval_ms: u64,
    /// The kinds of alarm raised (`NOSPACE`, `CORRUPT`), each once.
    pub alarms: Vec<String>,
}

impl From<&EtcdStatus> for PublicEtcd {
    fn from(s: &EtcdStatus) -> Self {
        let biggest = s.members.iter().max_by_key(|m| m.db_size_bytes);
        let mut alarms: Vec<String> = s.alarms.iter().map(|a| a.alarm.clone()).collect();
        alarms.sort();
        alarms.dedup();
        PublicEtcd {
            members: s.members.len() as u32,
            db_size_bytes: biggest.map_or(0, |m| m.db_size_bytes),
            db_size_in_use_bytes: biggest.map_or(0, |m| m.db_size_in_use_bytes),
            quota_bytes: s.quota_bytes,
            nearfull_ratio_ppm: s.nearfull_ratio_ppm,
            revision: s.revision,
            compacted_revision: s.compacted_revision,
            last_compaction_unix_ms: s.last_compaction_unix_ms,
            compact_interval_ms: s.compact_interval_ms,
            alarms,
        }
    }
}

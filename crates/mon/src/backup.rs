//! A backup of the monitor's state and its restore into an empty etcd (`docs/operations.md`,
//! "Backing up and restoring the monitors").
//!
//! A backup is every key of the cluster's state as one etcd revision held it, read in pages at
//! that revision ([`read`]); the election's `mon/` keys are left out (they belong to the
//! monitors running now). It is JSON ([`MonBackup`]), so it can be read and checked with any
//! tool, and it holds the key table as etcd does, each key sealed under the monitor secret
//! (`crate::key_seal`): a restore needs the same secret file, and the backup is as secret as
//! the map (the keys stay sealed, their names and caps are readable).
//!
//! A restore ([`restore`], `fastblock-mon --restore-from FILE`) writes a backup into an etcd
//! that holds no cluster, before the monitor first campaigns. The daemons carry on from a later
//! state than the backup's, so the restore moves forward what they must never see go back:
//! - the **map epoch**, which OSDs and clients only ever let rise (a map older than theirs is
//!   ignored), and every id counter (images, reclaims, snapshot trims, scrub requests, each
//!   image's snapshot ids), whose ids handed out after the backup must never be handed out
//!   again: each is moved forward by the microseconds since the backup was taken, since every
//!   epoch and every id takes an etcd transaction of its own (or shares one with others that
//!   takes far longer than a microsecond each);
//! - **OSD and pool ids** (32 bits), by the milliseconds since, on the same reasoning (an OSD
//!   or a pool is created by a transaction that writes its whole record, taking well over a
//!   millisecond); a backup so old that this would pass half their range is refused;
//! - each **PG** is marked `restored`: the record of its members may be older than its Raft
//!   configuration, so the next report of its leader is taken as its configuration, whatever
//!   members it names (`fastblock_mon_core::report_checks`). Until then the OSDs keep every
//!   replica whose own log says it is still a member (`fastblock_pg::retention`), whatever the
//!   restored map says.
//!
//! A restore is idempotent: `mon/restore` records which backup was written, by which monitor,
//! and whether all of it was. A monitor started again with the same `--restore-from` finds it
//! done and goes on; a restore it cut short (a crash) it writes again from the start; when
//! every monitor is given the backup, one claims the restore (the marker is created only if
//! absent) and the others wait for it to be done, so none of them creates a new, empty cluster
//! meanwhile; etcd holding another cluster is refused, never overwritten.

use crate::keys::{KeyError, Keyspace};
use etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp};
use fastblock_mon_core::MonState;
use fastblock_types::etcd::{MonBackup, MON_BACKUP_FORMAT};
use fastblock_types::Epoch;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Keys read per page of a backup: small enough for etcd-client's 4 MiB answer limit with
/// values of the size the monitor writes (a pool's PG map is the largest).
pub const BACKUP_PAGE_KEYS: i64 = 4;

#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("etcd: {0}")]
    Etcd(#[from] etcd_client::Error),
    #[error("etcd holds a non-UTF-8 key or value under the fastblock prefix")]
    NotUtf8,
    #[error("the state in etcd has no epoch key: no cluster to back up")]
    NoCluster,
}

#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("etcd: {0}")]
    Etcd(#[from] etcd_client::Error),
    #[error("not a fastblock monitor backup (format {found:?}, expected {MON_BACKUP_FORMAT:?})")]
    Format { found: String },
    #[error("the backup is damaged: {0}")]
    Damaged(KeyError),
    #[error(
        "etcd already holds a cluster (epoch {epoch}{what}): a restore only goes into an etcd \
         without one; to restore, stop every monitor and remove each one's data directory (or \
         point --etcd-endpoints at an empty etcd) first"
    )]
    NotEmpty { epoch: String, what: String },
    #[error(
        "the backup was taken {age_days} days ago: moving OSD and pool ids forward by the time \
         since would take them past half their range"
    )]
    TooOld { age_days: u64 },
    #[error("a concurrent restore or monitor wrote to etcd meanwhile; start again")]
    Raced,
    #[error("mon.{owner} is restoring this backup; waiting for it")]
    InProgress { owner: String },
}

/// `mon/restore`: which backup a restore wrote, and whether it finished.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
struct RestoreMarker {
    backup_revision: u64,
    taken_unix_ms: u64,
    /// The monitor writing it.
    owner: String,
    done: bool,
}

/// Reads every key of the cluster's state at one revision, a page at a time.
pub async fn read(
    client: &mut Client,
    keys: &Keyspace,
    now_unix_ms: u64,
) -> Result<MonBackup, BackupError> {
    let root = keys.root();
    let mon_prefix = format!("{root}mon/");
    let pages = crate::store::read_state_pages(client, keys, BACKUP_PAGE_KEYS).await?;
    let revision = pages.revision;
    let mut out = BTreeMap::new();
    for kv in &pages.kvs {
        let key = kv.key_str().map_err(|_| BackupError::NotUtf8)?;
        if key.starts_with(&mon_prefix) {
            continue;
        }
        let value = kv.value_str().map_err(|_| BackupError::NotUtf8)?;
        let relative = key.strip_prefix(&root).unwrap_or(key);
        out.insert(relative.to_string(), value.to_string());
    }
    #[derive(Deserialize)]
    struct EpochValue {
        epoch: Epoch,
    }
    let epoch = out
        .get("epoch")
        .and_then(|v| serde_json::from_str::<EpochValue>(v).ok())
        .ok_or(BackupError::NoCluster)?
        .epoch;
    Ok(MonBackup {
        format: MON_BACKUP_FORMAT.to_string(),
        prefix: root.trim_end_matches('/').to_string(),
        revision: u64::try_from(revision).unwrap_or(0),
        epoch,
        taken_unix_ms: now_unix_ms,
        keys: out,
    })
}

/// The first key after every key starting with `prefix` (etcd's range end for a prefix).
pub(crate) fn prefix_end(prefix: &str) -> String {
    let mut end = prefix.as_bytes().to_vec();
    // The prefix ends in '/', which has a successor in ASCII: no carry is ever needed.
    let last = end.last_mut().expect("the prefix is not empty");
    *last += 1;
    String::from_utf8(end).expect("ASCII successor of '/'")
}

/// What a restore did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Restored {
    /// The backup was written; the state now has this epoch.
    Written { from_epoch: Epoch, epoch: Epoch },
    /// The same backup had been restored already (a monitor started again with the flag).
    AlreadyDone,
}

/// The backup's state as restored at `now_unix_ms`: decoded and checked as a load would, with
/// the epoch, the ids and the PGs moved forward (see the module documentation).
pub fn restored_state(
    keys: &Keyspace,
    backup: &MonBackup,
    now_unix_ms: u64,
) -> Result<MonState, RestoreError> {
    if backup.format != MON_BACKUP_FORMAT {
        return Err(RestoreError::Format {
            found: backup.format.clone(),
        });
    }
    let mut kvs: BTreeMap<String, String> = backup
        .keys
        .iter()
        .map(|(k, v)| (format!("{}{k}", keys.root()), v.clone()))
        .collect();
    // A backup holds the key table as etcd did: sealed (under the secret of the monitors it
    // was taken from, which the restoring monitor must have), or in clear if older.
    keys.open_stored(&mut kvs).map_err(RestoreError::Damaged)?;
    let mut state = keys.decode(&kvs).map_err(RestoreError::Damaged)?;
    let elapsed_ms = now_unix_ms.saturating_sub(backup.taken_unix_ms).max(1);
    let elapsed_us = elapsed_ms.saturating_mul(1000);
    let gap32 = u32::try_from(elapsed_ms)
        .ok()
        .filter(|gap| {
            let c = &state.counters;
            c.next_osd_id
                .max(c.next_pool_id)
                .checked_add(*gap)
                .is_some_and(|n| n < u32::MAX / 2)
        })
        .ok_or(RestoreError::TooOld {
            age_days: elapsed_ms / 86_400_000,
        })?;
    state.map.epoch = Epoch(state.map.epoch.0.saturating_add(elapsed_us));
    let c = &mut state.counters;
    c.next_osd_id += gap32;
    c.next_pool_id += gap32;
    for counter in [
        &mut c.next_image_id,
        &mut c.next_reclaim_id,
        &mut c.next_snap_trim_id,
    ] {
        *counter = counter.saturating_add(elapsed_us);
    }
    state.scrubs.next_id = state.scrubs.next_id.saturating_add(elapsed_us);
    for image in state.images.values_mut() {
        image.snap_seq = image.snap_seq.saturating_add(elapsed_us);
    }
    for pgmap in state.map.pgmaps.values_mut() {
        for pg in pgmap.pgs.values_mut() {
            pg.restored = true;
        }
    }
    state.derive_data_map();
    state.validate().map_err(|reason| {
        RestoreError::Damaged(KeyError {
            key: keys.root(),
            reason,
        })
    })?;
    Ok(state)
}

/// Writes `backup` into etcd unless it holds a cluster already (see the module
/// documentation). `me` is this monitor's name: with several monitors each given the backup,
/// one claims the restore (`mon/restore`, created only if absent) and the others get
/// [`RestoreError::InProgress`] until it is done, then [`Restored::AlreadyDone`].
pub async fn restore(
    client: &mut Client,
    keys: &Keyspace,
    backup: &MonBackup,
    me: &str,
    now_unix_ms: u64,
) -> Result<Restored, RestoreError> {
    let marker_key = keys.restore_marker();
    let this_backup = |m: &RestoreMarker| {
        m.backup_revision == backup.revision && m.taken_unix_ms == backup.taken_unix_ms
    };
    let marker_kv = client
        .get(marker_key.clone(), None)
        .await?
        .kvs()
        .first()
        .cloned();
    let marker = marker_kv
        .as_ref()
        .and_then(|kv| serde_json::from_slice::<RestoreMarker>(kv.value()).ok());
    let epoch_key = format!("{}epoch", keys.root());
    let existing = client.get(epoch_key.clone(), None).await?;
    if let Some(kv) = existing.kvs().first() {
        return match &marker {
            Some(m) if this_backup(m) && m.done => Ok(Restored::AlreadyDone),
            _ => Err(RestoreError::NotEmpty {
                epoch: kv.value_str().unwrap_or("?").to_string(),
                what: match &marker {
                    Some(m) => format!(", restored from a backup of {} ms", m.taken_unix_ms),
                    None => String::new(),
                },
            }),
        };
    }
    // Whose restore is under way, if any.
    let claim = match &marker {
        None => Compare::create_revision(marker_key.clone(), CompareOp::Equal, 0),
        Some(m) if this_backup(m) && m.owner == me => {
            // Ours, cut short (a crash): written again from the start.
            delete_state(client, keys).await?;
            let revision = marker_kv.as_ref().map_or(0, |kv| kv.mod_revision());
            Compare::mod_revision(marker_key.clone(), CompareOp::Equal, revision)
        }
        Some(m) if this_backup(m) => {
            return Err(RestoreError::InProgress {
                owner: m.owner.clone(),
            })
        }
        Some(m) => {
            return Err(RestoreError::NotEmpty {
                epoch: "none".to_string(),
                what: format!(
                    ", but mon.{} is restoring another backup (of {} ms)",
                    m.owner, m.taken_unix_ms
                ),
            })
        }
    };
    if marker.is_none() {
        let others = client
            .get(
                keys.root(),
                Some(
                    GetOptions::new()
                        .with_prefix()
                        .with_keys_only()
                        .with_limit(64),
                ),
            )
            .await?;
        let mon_prefix = format!("{}mon/", keys.root());
        if let Some(key) = others
            .kvs()
            .iter()
            .filter_map(|kv| kv.key_str().ok())
            .find(|k| !k.starts_with(&mon_prefix))
        {
            return Err(RestoreError::NotEmpty {
                epoch: "none".to_string(),
                what: format!(", but key {key}"),
            });
        }
    }
    let state = restored_state(keys, backup, now_unix_ms)?;
    let encoded = keys.encode(&state);
    let marker_value = |done: bool| {
        serde_json::to_string(&RestoreMarker {
            backup_revision: backup.revision,
            taken_unix_ms: backup.taken_unix_ms,
            owner: me.to_string(),
            done,
        })
        .expect("marker serializes")
    };
    let claimed = client
        .txn(Txn::new().when([claim]).and_then([TxnOp::put(
            marker_key.clone(),
            marker_value(false),
            None,
        )]))
        .await?;
    if !claimed.succeeded() {
        return Err(RestoreError::Raced);
    }
    let body = encoded
        .iter()
        .filter(|(k, _)| **k != epoch_key)
        .map(|(k, v)| Ok((k.clone(), keys.stored_value(k, v)?)))
        .collect::<Result<Vec<_>, KeyError>>()
        .map_err(RestoreError::Damaged)?;
    put_all(client, body.into_iter()).await?;
    // The epoch last, with the marker: only a complete state has an epoch key.
    let epoch_value = encoded
        .get(&epoch_key)
        .expect("the encoding always has the epoch key")
        .clone();
    let txn = Txn::new()
        .when([Compare::create_revision(
            epoch_key.clone(),
            CompareOp::Equal,
            0,
        )])
        .and_then([
            TxnOp::put(epoch_key, epoch_value, None),
            TxnOp::put(marker_key, marker_value(true), None),
        ]);
    if !client.txn(txn).await?.succeeded() {
        return Err(RestoreError::Raced);
    }
    Ok(Restored::Written {
        from_epoch: backup.epoch,
        epoch: state.map.epoch,
    })
}

/// Puts `kvs` in transactions that each fit etcd's limits (`crate::txn_limits`).
async fn put_all(
    client: &mut Client,
    kvs: impl Iterator<Item = (String, String)>,
) -> Result<(), etcd_client::Error> {
    let kvs: Vec<(String, String)> = kvs.collect();
    for run in crate::txn_limits::batches(kvs, |(k, v)| k.len() + v.len()) {
        let ops: Vec<TxnOp> = run
            .into_iter()
            .map(|(key, value)| TxnOp::put(key, value, None))
            .collect();
        client.txn(Txn::new().and_then(ops)).await?;
    }
    Ok(())
}

/// Deletes the cluster's state (everything under the prefix but `mon/`).
async fn delete_state(client: &mut Client, keys: &Keyspace) -> Result<(), etcd_client::Error> {
    let root = keys.root();
    let mon = format!("{root}mon/");
    // Two ranges around `mon/`: [root, root+"mon/") and [prefix_end(mon), prefix_end(root)).
    let before = etcd_client::DeleteOptions::new().with_range(mon.clone());
    client.delete(root.clone(), Some(before)).await?;
    let after = etcd_client::DeleteOptions::new().with_range(prefix_end(&root));
    client.delete(prefix_end(&mon), Some(after)).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use fastblock_types::api::{BootRequest, CreateImageRequest, CreatePoolRequest};
    use fastblock_types::map::FailureDomain;

    /// One OSD, a pool of two PGs (reported by their leader) and one image.
    fn cluster() -> MonState {
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
                pg_count: 2,
                size: 1,
                failure_domain: FailureDomain::Osd,
            })
            .unwrap();
        state
            .create_image(&CreateImageRequest {
                pool: "p".into(),
                name: "i".into(),
                size_bytes: 1 << 20,
                object_size_bytes: None,
            })
            .unwrap();
        state.finish(&MonState::default());
        state
    }

    fn backup_of(keys: &Keyspace, state: &MonState, taken_unix_ms: u64) -> MonBackup {
        MonBackup {
            format: MON_BACKUP_FORMAT.into(),
            prefix: "/fb".into(),
            revision: 7,
            epoch: state.map.epoch,
            taken_unix_ms,
            keys: keys
                .encode(state)
                .into_iter()
                .map(|(k, v)| (k.trim_start_matches("/fb/").to_string(), v))
                .collect(),
        }
    }

    /// The epoch and every id counter move forward by the time since the backup (u64 ids by
    /// the microsecond, OSD and pool ids by the millisecond), and every PG is marked restored.
    #[test]
    fn a_restore_moves_the_epoch_and_the_ids_forward_and_marks_every_pg() {
        let keys = Keyspace::new("/fb");
        let state = cluster();
        let taken = 1_700_000_000_000;
        let backup = backup_of(&keys, &state, taken);
        let r = restored_state(&keys, &backup, taken + 5_000).unwrap();
        assert_eq!(r.map.epoch.0, state.map.epoch.0 + 5_000_000);
        let (a, b) = (&state.counters, &r.counters);
        assert_eq!(b.next_osd_id, a.next_osd_id + 5_000);
        assert_eq!(b.next_pool_id, a.next_pool_id + 5_000);
        assert_eq!(b.next_image_id, a.next_image_id + 5_000_000);
        assert_eq!(b.next_reclaim_id, a.next_reclaim_id + 5_000_000);
        assert_eq!(b.next_snap_trim_id, a.next_snap_trim_id + 5_000_000);
        assert_eq!(r.scrubs.next_id, state.scrubs.next_id + 5_000_000);
        let image = r.images.values().next().unwrap();
        assert_eq!(image.snap_seq, 5_000_000);
        let pgs: Vec<bool> = r.map.pgmaps[&fastblock_types::PoolId(1)]
            .pgs
            .values()
            .map(|pg| pg.restored)
            .collect();
        assert_eq!(pgs, vec![true, true]);
        // The rest is the backup's.
        assert_eq!(r.images, {
            let mut images = state.images.clone();
            images.values_mut().for_each(|i| i.snap_seq += 5_000_000);
            images
        });
        assert_eq!(r.map.osds, state.map.osds);
    }

    #[test]
    fn a_backup_of_another_format_or_too_old_is_refused() {
        let keys = Keyspace::new("/fb");
        let state = cluster();
        let mut backup = backup_of(&keys, &state, 0);
        assert!(matches!(
            restored_state(&keys, &backup, u64::from(u32::MAX)),
            Err(RestoreError::TooOld { age_days: 49 })
        ));
        backup.format = "something-else".into();
        assert!(matches!(
            restored_state(&keys, &backup, 1),
            Err(RestoreError::Format { .. })
        ));
    }

    #[test]
    fn a_damaged_backup_is_refused_with_the_key() {
        let keys = Keyspace::new("/fb");
        let mut backup = backup_of(&keys, &cluster(), 0);
        backup.keys.insert("osds/1".into(), "{not json".into());
        let e = restored_state(&keys, &backup, 1).unwrap_err();
        assert!(e.to_string().contains("/fb/osds/1"), "{e}");
    }

    #[test]
    fn a_prefix_range_ends_after_its_last_key() {
        assert_eq!(prefix_end("/fastblock/"), "/fastblock0");
        assert!("/fastblock/zzz" < prefix_end("/fastblock/").as_str());
        assert!("/fastblock0" >= prefix_end("/fastblock/").as_str());
    }
}

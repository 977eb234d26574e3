//! Persistence of [`MonState`] in etcd: load everything, and commit the keys an operation
//! changed in one transaction guarded by revisions.
//!
//! Every commit compares (a) the leader key's create revision with the one this monitor won
//! the election with — a deposed leader's writes fail, even if it has not noticed yet — and (b)
//! each touched key's mod revision with the one last read, so an update made by anyone else
//! (another monitor, an operator with etcdctl) is never overwritten blindly: the commit fails
//! with [`CommitError::Conflict`] and the caller reloads and retries.

use crate::keys::{KeyError, Keyspace};
use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};
use fastblock_mon_core::MonState;
use std::collections::BTreeMap;

/// Proof of leadership: the create revision of the leader key this monitor put.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fence {
    pub leader_create_revision: i64,
}

/// The state as last read or written, with the revision of every key.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub state: MonState,
    pub kvs: BTreeMap<String, String>,
    pub revisions: BTreeMap<String, i64>,
}

#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    #[error("a concurrent change touched the same keys, or leadership was lost")]
    Conflict,
    #[error("etcd: {0}")]
    Etcd(etcd_client::Error),
}

// The message includes the cause's, so the cause is not also its `source()` (a printed
// chain would say it twice): `From` by hand instead of `#[from]`.
impl From<etcd_client::Error> for CommitError {
    fn from(e: etcd_client::Error) -> Self {
        CommitError::Etcd(e)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("etcd: {0}")]
    Etcd(etcd_client::Error),
    #[error("damaged cluster state in etcd: {0}")]
    Damaged(KeyError),
    #[error("etcd holds a non-UTF-8 key or value under the fastblock prefix")]
    NotUtf8,
}

// The message includes the cause's, so the cause is not also its `source()` (a printed
// chain would say it twice): `From` by hand instead of `#[from]`.
impl From<KeyError> for LoadError {
    fn from(e: KeyError) -> Self {
        LoadError::Damaged(e)
    }
}

impl From<etcd_client::Error> for LoadError {
    fn from(e: etcd_client::Error) -> Self {
        LoadError::Etcd(e)
    }
}

pub struct EtcdStore {
    client: etcd_client::Client,
    keys: Keyspace,
}

impl EtcdStore {
    pub fn new(client: etcd_client::Client, keys: Keyspace) -> Self {
        EtcdStore { client, keys }
    }

    pub async fn load(&mut self) -> Result<Snapshot, LoadError> {
        let resp = self
            .client
            .get(self.keys.root(), Some(GetOptions::new().with_prefix()))
            .await?;
        let mut kvs = BTreeMap::new();
        let mut revisions = BTreeMap::new();
        let mon_prefix = format!("{}mon/", self.keys.root());
        for kv in resp.kvs() {
            let key = kv.key_str().map_err(|_| LoadError::NotUtf8)?.to_string();
            if key.starts_with(&mon_prefix) {
                continue;
            }
            let value = kv.value_str().map_err(|_| LoadError::NotUtf8)?.to_string();
            revisions.insert(key.clone(), kv.mod_revision());
            kvs.insert(key, value);
        }
        let state = self.keys.decode(&kvs)?;
        // Normalised re-encoding is what later diffs compare against.
        let kvs = self.keys.encode(&state);
        Ok(Snapshot {
            state,
            kvs,
            revisions,
        })
    }

    /// Writes the difference between `snapshot` and `next` and, on success, makes `next` the
    /// snapshot. Returns what was written: the revision and the bytes of the keys and values
    /// put (etcd keeps each revision's values until a compaction: `crate::etcd_maint`), or
    /// `None` if nothing changed.
    pub async fn commit(
        &mut self,
        fence: Fence,
        snapshot: &mut Snapshot,
        next: MonState,
    ) -> Result<Option<Written>, CommitError> {
        let new_kvs = self.keys.encode(&next);
        let mut compares = vec![Compare::create_revision(
            self.keys.leader(),
            CompareOp::Equal,
            fence.leader_create_revision,
        )];
        let mut ops = Vec::new();
        let mut put_keys = Vec::new();
        let mut put_bytes = 0u64;
        for (key, value) in &new_kvs {
            if snapshot.kvs.get(key) == Some(value) {
                continue;
            }
            match snapshot.revisions.get(key) {
                Some(rev) => {
                    compares.push(Compare::mod_revision(key.clone(), CompareOp::Equal, *rev))
                }
                None => compares.push(Compare::create_revision(key.clone(), CompareOp::Equal, 0)),
            }
            ops.push(TxnOp::put(key.clone(), value.clone(), None));
            put_bytes += (key.len() + value.len()) as u64;
            put_keys.push(key.clone());
        }
        // Images of a deleted pool go with one range delete, and the snapshots of each of
        // them with one more, so a pool with many images and snapshots does not exceed etcd's
        // per-transaction operation limit.
        let deleted_pools: Vec<u32> = snapshot
            .state
            .map
            .pools
            .keys()
            .filter(|id| !next.map.pools.contains_key(id))
            .map(|id| id.0)
            .collect();
        let mut range_deleted: Vec<String> = Vec::new();
        for pool in &deleted_pools {
            range_deleted.push(self.keys.images_of_pool_prefix(*pool));
        }
        for (image, snaps) in &snapshot.state.snaps {
            let in_deleted_pool = snaps
                .first()
                .is_some_and(|s| deleted_pools.contains(&s.pool.0));
            if in_deleted_pool && !next.snaps.contains_key(image) {
                range_deleted.push(self.keys.snaps_of_image_prefix(image.0));
            }
        }
        for prefix in &range_deleted {
            ops.push(TxnOp::delete(
                prefix.clone(),
                Some(etcd_client::DeleteOptions::new().with_prefix()),
            ));
        }
        let mut deleted_keys = Vec::new();
        for key in snapshot.kvs.keys() {
            if new_kvs.contains_key(key) {
                continue;
            }
            deleted_keys.push(key.clone());
            if range_deleted.iter().any(|p| key.starts_with(p)) {
                continue;
            }
            if let Some(rev) = snapshot.revisions.get(key) {
                compares.push(Compare::mod_revision(key.clone(), CompareOp::Equal, *rev));
            }
            ops.push(TxnOp::delete(key.clone(), None));
        }
        if ops.is_empty() {
            snapshot.state = next;
            return Ok(None);
        }
        let txn = Txn::new().when(compares).and_then(ops);
        let resp = self.client.txn(txn).await?;
        if !resp.succeeded() {
            return Err(CommitError::Conflict);
        }
        let revision = resp
            .header()
            .map(|h| h.revision())
            .expect("etcd txn responses carry a header");
        for key in put_keys {
            snapshot.revisions.insert(key, revision);
        }
        for key in deleted_keys {
            snapshot.revisions.remove(&key);
        }
        snapshot.kvs = new_kvs;
        snapshot.state = next;
        Ok(Some(Written {
            revision: u64::try_from(revision).unwrap_or(0),
            bytes: put_bytes,
        }))
    }
}

/// What one commit wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Written {
    /// The etcd revision of the transaction.
    pub revision: u64,
    /// Bytes of the keys and values it put.
    pub bytes: u64,
}

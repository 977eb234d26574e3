//! Persistence of [`MonState`] in etcd: load everything (a page of keys at a time, at one
//! revision), and commit the keys an operation changed in one transaction guarded by
//! revisions.
//!
//! Every commit compares (a) the leader key's create revision with the one this monitor won
//! the election with — a deposed leader's writes fail, even if it has not noticed yet — and (b)
//! each touched key's mod revision with the one last read, so an update made by anyone else
//! (another monitor, an operator with etcdctl) is never overwritten blindly: the commit fails
//! with [`CommitError::Conflict`] and the caller reloads and retries.
//!
//! ## Large commits
//!
//! A commit that would not fit one etcd transaction (`crate::txn_limits`: a pool of many PGs
//! created, or an event that moves PGs in many PG keys) writes its PG keys ahead, in as
//! many transactions as they need, each guarded as above, the first also writing the new
//! epoch; the last transaction writes everything else. Only the last makes the operation
//! visible, and only after it does the monitor publish the new epoch. If the monitor stops
//! or loses leadership in between, the next leader loads what was written:
//! - PG keys of a pool whose creation was cut short have no pool (their id is at or above the
//!   pool counter, which the last transaction raises): they are not part of the state and
//!   the next commit deletes them ([`Keyspace::abandoned_chunks`]);
//! - PG keys of existing pools hold PGs that changed ahead of the rest of the operation. Each
//!   PG on its own is one the monitor could have written (a membership target, state bits,
//!   a leader), the load derives every PG's state again, and the epoch was already raised,
//!   so no daemon that saw the old epoch mistakes the loaded map for it: a new leader's log
//!   starts at the loaded epoch (a daemon behind it gets a whole map), and the same leader
//!   reloading appends the loaded map to its log (`MapLog::resume`: the delta to it).
//! - keys of the PG layout before `pgs/` (`crate::keys`), which the first commit after such a
//!   load rewrites, are deleted ahead too, but after every put: a load then finds each PG in
//!   its `pgs/` key (taken over an older one), or only in the old layout.

use crate::keys::{KeyError, Keyspace};
use crate::txn_limits::{batches_of, TXN_BYTES_MAX, TXN_OPS_MAX};
use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};
use fastblock_mon_core::MonState;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Proof of leadership: the create revision of the leader key this monitor put.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fence {
    pub leader_create_revision: i64,
}

/// The state as last read or written, with the revision of every key.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// Shared with readers (`crate::service::Monitor::read`): a commit replaces it whole.
    pub state: Arc<MonState>,
    /// The keys and values in etcd (the `mon/` keys left out).
    pub kvs: BTreeMap<String, String>,
    pub revisions: BTreeMap<String, i64>,
    /// `kvs` is not `Keyspace::encode(state)`: written by another version (a pool's PGs in
    /// one key, fields added since), or edited by hand. The next commit compares every key
    /// and so writes the state as this version encodes it.
    pub dirty: bool,
    /// Key table entries etcd holds in clear (written by a monitor before the seal,
    /// `crate::key_seal`): the next commit puts them sealed, whatever else it changes.
    pub clear_entities: BTreeSet<String>,
    /// A transaction was sent whose outcome this snapshot does not record: the commit making
    /// it was dropped while it waited (its caller went away). etcd may hold it or not, so the
    /// snapshot's revisions may be stale: its holder reloads before using it again.
    pub in_doubt: bool,
}

/// Keys per page when loading, outside `pgs/` ([`LOAD_PG_PAGE_KEYS`]): below the 4 MiB a gRPC
/// answer may carry with large values (a monitor before the PG keys wrote a pool's PGs in one
/// key of up to ~700 KB at 4,096 PGs, or 256 to a key of some 40 KB: 4 of them fit).
pub const LOAD_PAGE_KEYS: i64 = 4;
/// Keys per page under `pgs/` (`crate::keys`): one PG each, a few hundred bytes, so 4,096 make
/// at most some 2 MB, and a 131,072-PG pool loads in 32 pages, not 32,768.
pub const LOAD_PG_PAGE_KEYS: i64 = 4096;

#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    #[error("a concurrent change touched the same keys, or leadership was lost")]
    Conflict,
    #[error("etcd: {0}")]
    Etcd(etcd_client::Error),
    #[error("sealing the key table: {0}")]
    Seal(KeyError),
}

impl From<KeyError> for CommitError {
    fn from(e: KeyError) -> Self {
        CommitError::Seal(e)
    }
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
    /// Fault injection: a large commit stops after this many of its ahead transactions.
    stop_after_ahead: Option<usize>,
    /// Operations per transaction ([`TXN_OPS_MAX`] unless the etcd is known to take more).
    txn_ops_max: usize,
}

impl EtcdStore {
    pub fn new(client: etcd_client::Client, keys: Keyspace) -> Self {
        EtcdStore {
            client,
            keys,
            stop_after_ahead: None,
            txn_ops_max: TXN_OPS_MAX,
        }
    }

    /// This store cutting its large commits into transactions of at most `ops` operations
    /// (`crate::txn_limits::OWN_MEMBER_TXN_OPS_MAX` on the monitor's own member).
    pub fn with_txn_ops_max(mut self, ops: usize) -> Self {
        assert!(ops >= 1, "a transaction carries at least one operation");
        self.txn_ops_max = ops;
        self
    }

    /// Fault injection for tests: a large commit stops after `runs` of its ahead
    /// transactions and answers [`CommitError::Conflict`], as a monitor that lost its
    /// leadership there would ("Large commits" above). The monitor never sets it.
    pub fn stopping_after_ahead_txns(mut self, runs: usize) -> Self {
        self.stop_after_ahead = Some(runs);
        self
    }

    pub async fn load(&mut self) -> Result<Snapshot, LoadError> {
        let root = self.keys.root();
        let mon_prefix = format!("{root}mon/");
        let mut kvs = BTreeMap::new();
        let mut revisions = BTreeMap::new();
        let pages = read_state_pages(&mut self.client, &self.keys, LOAD_PAGE_KEYS).await?;
        for kv in pages.kvs {
            let key = kv.key_str().map_err(|_| LoadError::NotUtf8)?.to_string();
            // The readiness probe (`etcd_maint`) is no part of the state.
            if key.starts_with(&mon_prefix) || key.ends_with("/readiness-probe") {
                continue;
            }
            let value = kv.value_str().map_err(|_| LoadError::NotUtf8)?.to_string();
            revisions.insert(key.clone(), kv.mod_revision());
            kvs.insert(key, value);
        }
        let keys = &self.keys;
        let (clear_entities, state, dirty) = crate::cpu::heavy(|| {
            let clear_entities = keys.open_stored(&mut kvs)?;
            let state = keys.decode(&kvs)?;
            let orphans = keys.orphan_chunks(&kvs);
            let dirty = keys.encode(&state)
                != kvs
                    .iter()
                    .filter(|(k, _)| !orphans.contains(*k))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect::<BTreeMap<_, _>>();
            Ok::<_, LoadError>((clear_entities, state, dirty))
        })?;
        if dirty {
            tracing::info!(
                "the state in etcd is not as this version writes it (an older layout): the \
                 next commit rewrites it"
            );
        }
        Ok(Snapshot {
            state: Arc::new(state),
            kvs,
            revisions,
            dirty,
            clear_entities,
            in_doubt: false,
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
        let (mut puts, deletes) = crate::cpu::heavy(|| self.changes(snapshot, &next));
        // Entries still in clear in etcd go sealed with this commit, unchanged or not.
        for key in &snapshot.clear_entities {
            let unput = !puts.iter().any(|(k, _)| k == key);
            if let (true, Some(value)) = (unput, snapshot.kvs.get(key)) {
                if !deletes.contains(key) {
                    puts.push((key.clone(), value.clone()));
                }
            }
        }
        // Images of a deleted pool go with one range delete, and the snapshots of each of
        // them with one more, and its PG keys with one per layout, so a pool with many images,
        // snapshots or PGs does not exceed etcd's per-transaction operation limit.
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
            range_deleted.extend(self.keys.pg_key_prefixes(*pool));
        }
        for (image, snaps) in &snapshot.state.snaps {
            let in_deleted_pool = snaps
                .first()
                .is_some_and(|s| deleted_pools.contains(&s.pool.0));
            if in_deleted_pool && !next.snaps.contains_key(image) {
                range_deleted.push(self.keys.snaps_of_image_prefix(image.0));
            }
        }
        let mut single_deletes: Vec<String> = deletes
            .iter()
            .filter(|key| !range_deleted.iter().any(|p| key.starts_with(p)))
            .cloned()
            .collect();
        let ahead = self.ahead_of_final(&mut puts, &mut single_deletes, range_deleted.len());
        let mut txns = TxnSizes::default();
        for (i, run) in ahead.into_iter().enumerate() {
            if self.stop_after_ahead == Some(i) {
                return Err(CommitError::Conflict);
            }
            let (revision, bytes) = self.commit_ahead(fence, snapshot, run).await?;
            txns.record(bytes);
            txns.revision = revision;
        }
        let mut compares = vec![Compare::create_revision(
            self.keys.leader(),
            CompareOp::Equal,
            fence.leader_create_revision,
        )];
        let mut ops = Vec::new();
        let mut final_bytes = 0u64;
        for (key, value) in &puts {
            match snapshot.revisions.get(key) {
                Some(rev) => {
                    compares.push(Compare::mod_revision(key.clone(), CompareOp::Equal, *rev))
                }
                None => compares.push(Compare::create_revision(key.clone(), CompareOp::Equal, 0)),
            }
            let stored = self.keys.stored_value(key, value)?;
            final_bytes += (key.len() + stored.len()) as u64;
            ops.push(TxnOp::put(key.clone(), stored, None));
        }
        for prefix in &range_deleted {
            ops.push(TxnOp::delete(
                prefix.clone(),
                Some(etcd_client::DeleteOptions::new().with_prefix()),
            ));
        }
        for key in &single_deletes {
            if let Some(rev) = snapshot.revisions.get(key) {
                compares.push(Compare::mod_revision(key.clone(), CompareOp::Equal, *rev));
            }
            ops.push(TxnOp::delete(key.clone(), None));
        }
        if ops.is_empty() {
            // Nothing to write, or everything went ahead (a change to PG keys alone).
            snapshot.state = Arc::new(next);
            if txns.count == 0 {
                return Ok(None);
            }
            snapshot.dirty = false;
            return Ok(Some(txns.written()));
        }
        txns.record(final_bytes);
        let revision = self
            .send(snapshot, Txn::new().when(compares).and_then(ops))
            .await?;
        for (key, value) in puts {
            snapshot.revisions.insert(key.clone(), revision);
            snapshot.kvs.insert(key, value);
        }
        for key in deletes {
            snapshot.revisions.remove(&key);
            snapshot.kvs.remove(&key);
        }
        // A range delete took every key under its prefix, listed or not.
        snapshot
            .kvs
            .retain(|k, _| !range_deleted.iter().any(|p| k.starts_with(p)));
        snapshot
            .revisions
            .retain(|k, _| !range_deleted.iter().any(|p| k.starts_with(p)));
        snapshot.state = Arc::new(next);
        snapshot.dirty = false;
        snapshot.clear_entities.clear();
        txns.revision = revision;
        Ok(Some(txns.written()))
    }

    /// The keys to put and to delete to go from `snapshot` to `next`.
    fn changes(
        &self,
        snapshot: &Snapshot,
        next: &MonState,
    ) -> (Vec<(String, String)>, Vec<String>) {
        if snapshot.dirty {
            return full_changes(&self.keys, &snapshot.kvs, &self.keys.encode(next));
        }
        let changes = self.keys.changes(&snapshot.state, &snapshot.kvs, next);
        #[cfg(debug_assertions)]
        {
            let full = full_changes(&self.keys, &snapshot.kvs, &self.keys.encode(next));
            let sorted = |(mut p, mut d): (Vec<(String, String)>, Vec<String>)| {
                p.sort();
                d.sort();
                (p, d)
            };
            debug_assert_eq!(
                sorted(changes.clone()),
                sorted(full),
                "Keyspace::changes differs from comparing every key"
            );
        }
        changes
    }

    /// For a commit too large for one transaction, takes its PG key puts out of `puts` (with
    /// the epoch's, which goes first) and its PG key deletes out of `deletes` (which go last),
    /// and cuts them into runs that each fit one transaction ("Large commits" above);
    /// `other_ops` counts the final transaction's other operations. No run if the commit
    /// fits, or has no PG key to write or delete.
    ///
    /// A PG key is deleted only once every put went in: a key of the layout before `pgs/`
    /// (whose PGs the puts wrote in `pgs/` keys, which a load prefers), or of a pool never
    /// created. A removed pool's keys are not among `deletes` (a range delete takes them).
    fn ahead_of_final(
        &self,
        puts: &mut Vec<(String, String)>,
        deletes: &mut Vec<String>,
        other_ops: usize,
    ) -> Vec<Vec<AheadOp>> {
        let bytes: usize = puts.iter().map(|(k, v)| k.len() + v.len()).sum();
        if puts.len() + deletes.len() + other_ops <= self.txn_ops_max && bytes <= TXN_BYTES_MAX {
            return Vec::new();
        }
        let epoch_key = self.keys.epoch_key();
        let (mut ahead, rest): (Vec<_>, Vec<_>) = std::mem::take(puts)
            .into_iter()
            .partition(|(k, _)| self.keys.is_pg_key(k) || *k == epoch_key);
        let (pg_deletes, other_deletes): (Vec<_>, Vec<_>) = std::mem::take(deletes)
            .into_iter()
            .partition(|k| self.keys.is_pg_key(k));
        *deletes = other_deletes;
        if !ahead.iter().any(|(k, _)| self.keys.is_pg_key(k)) && pg_deletes.is_empty() {
            *puts = rest;
            puts.append(&mut ahead);
            return Vec::new();
        }
        *puts = rest;
        // The epoch first: a load after any ahead transaction sees the new epoch.
        ahead.sort_by_key(|(k, _)| *k != epoch_key);
        let ops: Vec<AheadOp> = ahead
            .into_iter()
            .map(|(k, v)| AheadOp::Put(k, v))
            .chain(pg_deletes.into_iter().map(AheadOp::Delete))
            .collect();
        batches_of(ops, AheadOp::bytes, self.txn_ops_max)
    }

    /// Sends one guarded transaction of a commit; its revision if it went in. `snapshot` is in
    /// doubt while the answer is awaited: dropped then, the commit leaves it so.
    async fn send(&mut self, snapshot: &mut Snapshot, txn: Txn) -> Result<i64, CommitError> {
        snapshot.in_doubt = true;
        let resp = self.client.txn(txn).await;
        // Known: written, refused, or failed (an error the caller reloads after).
        snapshot.in_doubt = false;
        let resp = resp?;
        if !resp.succeeded() {
            return Err(CommitError::Conflict);
        }
        Ok(resp
            .header()
            .map(|h| h.revision())
            .expect("etcd txn responses carry a header"))
    }

    /// Writes one run of a large commit's chunk puts under the same guards as the final
    /// transaction, and records them in `snapshot`, which from then on no longer encodes its
    /// state (`dirty`: whatever happens next, the following commit compares every key).
    /// Returns the transaction's revision and the bytes put.
    async fn commit_ahead(
        &mut self,
        fence: Fence,
        snapshot: &mut Snapshot,
        run: Vec<AheadOp>,
    ) -> Result<(i64, u64), CommitError> {
        let mut compares = vec![Compare::create_revision(
            self.keys.leader(),
            CompareOp::Equal,
            fence.leader_create_revision,
        )];
        let mut ops = Vec::with_capacity(run.len());
        let mut bytes = 0u64;
        for op in &run {
            let key = op.key();
            compares.push(match snapshot.revisions.get(key) {
                Some(rev) => Compare::mod_revision(key.to_string(), CompareOp::Equal, *rev),
                None => Compare::create_revision(key.to_string(), CompareOp::Equal, 0),
            });
            match op {
                AheadOp::Put(key, value) => {
                    let stored = self.keys.stored_value(key, value)?;
                    bytes += (key.len() + stored.len()) as u64;
                    ops.push(TxnOp::put(key.clone(), stored, None));
                }
                AheadOp::Delete(key) => ops.push(TxnOp::delete(key.clone(), None)),
            }
        }
        let revision = self
            .send(snapshot, Txn::new().when(compares).and_then(ops))
            .await?;
        snapshot.dirty = true;
        for op in run {
            match op {
                AheadOp::Put(key, value) => {
                    snapshot.revisions.insert(key.clone(), revision);
                    snapshot.kvs.insert(key, value);
                }
                AheadOp::Delete(key) => {
                    snapshot.revisions.remove(&key);
                    snapshot.kvs.remove(&key);
                }
            }
        }
        Ok((revision, bytes))
    }
}

/// One write of a large commit's runs ahead of its final transaction.
enum AheadOp {
    Put(String, String),
    Delete(String),
}

impl AheadOp {
    fn key(&self) -> &str {
        match self {
            AheadOp::Put(k, _) | AheadOp::Delete(k) => k,
        }
    }

    /// What it weighs against a transaction's byte bound.
    fn bytes(&self) -> usize {
        match self {
            AheadOp::Put(k, v) => k.len() + v.len(),
            AheadOp::Delete(k) => k.len(),
        }
    }
}

/// The transactions of one commit: how many, their bytes, the largest, the last revision.
#[derive(Default)]
struct TxnSizes {
    count: u32,
    bytes: u64,
    largest: u64,
    revision: i64,
}

impl TxnSizes {
    fn record(&mut self, bytes: u64) {
        self.count += 1;
        self.bytes += bytes;
        self.largest = self.largest.max(bytes);
    }

    fn written(&self) -> Written {
        Written {
            revision: u64::try_from(self.revision).unwrap_or(0),
            bytes: self.bytes,
            transactions: self.count,
            txn_bytes_max: self.largest,
        }
    }
}

/// What one commit wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Written {
    /// The etcd revision of its (last) transaction.
    pub revision: u64,
    /// Bytes of the keys and values it put, in all its transactions.
    pub bytes: u64,
    /// Its transactions: more than one for a large commit ("Large commits" above).
    pub transactions: u32,
    /// Bytes put by its largest transaction.
    pub txn_bytes_max: u64,
}

/// The keys to put and to delete to go from `old` to `new`, comparing every key; a damaged
/// pool's PGs (`Keyspace::orphan_chunks`) are never deleted.
fn full_changes(
    keys: &Keyspace,
    old: &BTreeMap<String, String>,
    new: &BTreeMap<String, String>,
) -> (Vec<(String, String)>, Vec<String>) {
    let orphans = keys.orphan_chunks(old);
    let puts = new
        .iter()
        .filter(|(k, v)| old.get(*k) != Some(*v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let deletes = old
        .keys()
        .filter(|k| !new.contains_key(*k) && !orphans.contains(*k))
        .cloned()
        .collect();
    (puts, deletes)
}

/// Every key under `prefix` at one revision, `page_keys` keys per request (a whole keyspace in
/// one answer could pass what one gRPC message may carry).
pub struct Pages {
    pub revision: i64,
    pub kvs: Vec<etcd_client::KeyValue>,
    /// Times the read started again because a compaction overtook it.
    pub restarts: u32,
}

/// A read of many pages is started again from the newest revision at most this many times
/// when a compaction removes the revision it reads at (a new leader compacts to the current
/// revision, `crate::etcd_maint`; a load of a 131,072-PG state takes over a hundred pages).
pub const READ_RESTARTS_MAX: u32 = 5;

pub async fn read_pages(
    client: &mut etcd_client::Client,
    prefix: &str,
    page_keys: i64,
) -> Result<Pages, etcd_client::Error> {
    let whole = PageRange {
        from: prefix.to_string(),
        end: crate::backup::prefix_end(prefix),
        page_keys,
    };
    read_ranges(client, &[whole]).await
}

/// Every key of the cluster state under `keys` (the `mon/` keys too) at one revision: the PG
/// keys ([`Keyspace::pg_keys_root`]) [`LOAD_PG_PAGE_KEYS`] at a time, the others `page_keys`
/// at a time (some are large: a reclaim's done set, a whole pool's PGs in an older layout).
pub async fn read_state_pages(
    client: &mut etcd_client::Client,
    keys: &Keyspace,
    page_keys: i64,
) -> Result<Pages, etcd_client::Error> {
    let (root, pgs) = (keys.root(), keys.pg_keys_root());
    let after_pgs = crate::backup::prefix_end(&pgs);
    let ranges = [
        PageRange {
            from: root.clone(),
            end: pgs.clone(),
            page_keys,
        },
        PageRange {
            from: pgs,
            end: after_pgs.clone(),
            page_keys: LOAD_PG_PAGE_KEYS,
        },
        PageRange {
            from: after_pgs,
            end: crate::backup::prefix_end(&root),
            page_keys,
        },
    ];
    read_ranges(client, &ranges).await
}

/// Keys from `from` (included) to `end` (excluded), read `page_keys` at a time.
pub struct PageRange {
    pub from: String,
    pub end: String,
    pub page_keys: i64,
}

/// The keys of `ranges`, in order, at one revision (started again from the newest when a
/// compaction removes it, at most [`READ_RESTARTS_MAX`] times).
pub async fn read_ranges(
    client: &mut etcd_client::Client,
    ranges: &[PageRange],
) -> Result<Pages, etcd_client::Error> {
    let mut restarts = 0;
    loop {
        match read_ranges_once(client, ranges).await {
            Ok(mut pages) => {
                pages.restarts = restarts;
                return Ok(pages);
            }
            Err(e) if is_compacted(&e) && restarts < READ_RESTARTS_MAX => {
                restarts += 1;
                tracing::info!(
                    restarts,
                    "a compaction removed the revision a paged read was at; reading again"
                );
            }
            other => return other,
        }
    }
}

/// etcd's `ErrCompacted` ("mvcc: required revision has been compacted"): the revision asked
/// for is older than the last compaction.
fn is_compacted(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(status)
        if status.message().contains("required revision has been compacted"))
}

async fn read_ranges_once(
    client: &mut etcd_client::Client,
    ranges: &[PageRange],
) -> Result<Pages, etcd_client::Error> {
    let mut out = Vec::new();
    let mut revision = 0i64;
    for range in ranges {
        let mut from = range.from.clone();
        loop {
            let mut opts = GetOptions::new()
                .with_range(range.end.clone())
                .with_limit(range.page_keys);
            if revision != 0 {
                opts = opts.with_revision(revision);
            }
            let mut resp = client.get(from.clone(), Some(opts)).await?;
            if revision == 0 {
                revision = resp.header().map_or(0, |h| h.revision());
            }
            let more = resp.more();
            let kvs = resp.take_kvs();
            let next = kvs.last().map(|last| {
                let mut next = last.key().to_vec();
                next.push(0);
                next
            });
            out.extend(kvs);
            match next {
                Some(next) if more => from = String::from_utf8_lossy(&next).into_owned(),
                _ => break,
            }
        }
    }
    Ok(Pages {
        revision,
        kvs: out,
        restarts: 0,
    })
}

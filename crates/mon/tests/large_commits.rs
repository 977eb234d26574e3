//! Commits too large for one etcd transaction (`fastblock_mon::store`, "Large commits"), on a
//! real etcd with its default limits (1.5 MiB per request, 128 operations per transaction, as
//! an external etcd cluster may have): a pool of many PGs is created in several transactions
//! and loads whole; an event that changes a PG in every chunk is written the same way; a
//! large commit cut short loads as a state the monitor can lead on, and the next commit
//! cleans up what it left.

mod common;

use common::{all_keys, cluster_state, etcd_with, fence};
use fastblock_mon::keys::Keyspace;
use fastblock_mon::store::{CommitError, EtcdStore, Fence, Snapshot, Written};
use fastblock_mon::txn_limits::{
    OWN_MEMBER_MAX_TXN_OPS, OWN_MEMBER_TXN_OPS_MAX, TXN_BYTES_MAX, TXN_OPS_MAX,
};
use fastblock_mon_core::MonState;
use fastblock_types::api::CreatePoolRequest;
use fastblock_types::map::FailureDomain;
use fastblock_types::{Epoch, OsdId, PoolId};
use std::collections::BTreeMap;

/// A pool this large is some 5 MB of PG chunks: four or more transactions of at most 1 MiB.
const BIG_PGS: u32 = 32_768;

/// Runs `op` on a copy of the snapshot's state, as the monitor does, and commits it.
async fn commit(
    store: &mut EtcdStore,
    fence: Fence,
    snapshot: &mut Snapshot,
    op: impl FnOnce(&mut MonState),
) -> Result<Option<Written>, CommitError> {
    let before = MonState::clone(&snapshot.state);
    let mut next = before.clone();
    op(&mut next);
    assert!(next.finish(&before), "the operation changes the state");
    store.commit(fence, snapshot, next).await
}

fn create_big_pool(s: &mut MonState) {
    s.create_pool(&CreatePoolRequest {
        name: "big".into(),
        pg_count: BIG_PGS,
        size: 3,
        failure_domain: FailureDomain::Osd,
    })
    .unwrap();
}

/// An etcd with a small cluster committed in it (3 OSDs, a pool of 8 PGs), and the store,
/// fence and snapshot that committed it.
async fn started() -> (
    common::Etcd,
    etcd_client::Client,
    Fence,
    EtcdStore,
    Snapshot,
) {
    started_with(&[], TXN_OPS_MAX).await
}

/// [`started`] on an etcd run with `flags`, the store cutting at `txn_ops_max` operations.
async fn started_with(
    flags: &[&str],
    txn_ops_max: usize,
) -> (
    common::Etcd,
    etcd_client::Client,
    Fence,
    EtcdStore,
    Snapshot,
) {
    let (etcd, mut client) = etcd_with(flags).await;
    let fence = fence(&mut client).await;
    let mut store =
        EtcdStore::new(client.clone(), Keyspace::new("/fb")).with_txn_ops_max(txn_ops_max);
    let mut snapshot = store.load().await.unwrap();
    commit(&mut store, fence, &mut snapshot, |s| {
        *s = cluster_state(3, 8, 3);
    })
    .await
    .unwrap();
    (etcd, client, fence, store, snapshot)
}

async fn load(client: &etcd_client::Client) -> Snapshot {
    EtcdStore::new(client.clone(), Keyspace::new("/fb"))
        .load()
        .await
        .unwrap()
}

/// Goal: no transaction grows with a pool's PG count. Method: a pool of 32,768 PGs created,
/// then an OSD marked down (every PG's state changes, so every chunk), each on an etcd with
/// its default limits; both commits go in several transactions, none over the bound, and
/// the state loads back as committed.
#[tokio::test]
async fn a_pool_too_large_for_one_transaction_is_written_in_several_and_loads_whole() {
    let (_etcd, client, fence, mut store, mut snapshot) = started().await;

    let created = commit(&mut store, fence, &mut snapshot, create_big_pool)
        .await
        .unwrap()
        .unwrap();
    assert!(created.transactions >= 4, "{created:?}");
    assert!(created.txn_bytes_max <= TXN_BYTES_MAX as u64, "{created:?}");
    assert!(created.bytes > 4 * TXN_BYTES_MAX as u64, "{created:?}");
    let loaded = load(&client).await;
    assert!(!loaded.dirty);
    assert_eq!(loaded.state, snapshot.state);
    let big = snapshot.state.map.pools.values().find(|p| p.name == "big");
    let big = big.unwrap().id;
    assert_eq!(loaded.state.map.pgmaps[&big].pgs.len(), BIG_PGS as usize);

    let down = commit(&mut store, fence, &mut snapshot, |s| {
        s.mark_down(OsdId(1)).unwrap();
    })
    .await
    .unwrap()
    .unwrap();
    assert!(down.transactions > 1, "{down:?}");
    assert!(down.txn_bytes_max <= TXN_BYTES_MAX as u64, "{down:?}");
    let loaded = load(&client).await;
    assert!(!loaded.dirty);
    assert_eq!(loaded.state, snapshot.state);
    assert!(
        !loaded.state.map.osds[&OsdId(1)].up,
        "the OSD's own key went with the last transaction"
    );

    // A change to PG chunks and the epoch alone (no pool version, no other key): every
    // transaction is an ahead one, and the commit is complete with them.
    let mut next = MonState::clone(&snapshot.state);
    next.map.epoch = Epoch(next.map.epoch.0 + 1);
    let pgs = &mut next.map.pgmaps.get_mut(&big).unwrap().pgs;
    let seqs: Vec<u32> = pgs.keys().copied().collect();
    for seq in seqs {
        pgs.get_mut(&seq).unwrap().restored = true;
    }
    let only_chunks = store
        .commit(fence, &mut snapshot, next.clone())
        .await
        .unwrap()
        .unwrap();
    assert!(only_chunks.transactions > 1, "{only_chunks:?}");
    assert!(!snapshot.dirty);
    assert_eq!(*snapshot.state, next);
    let loaded = load(&client).await;
    assert!(!loaded.dirty);
    assert_eq!(*loaded.state, next);
}

/// Goal: a large commit cut short (the monitor lost its leadership, or stopped, between its
/// transactions) leaves a state a new leader loads and leads on, and nothing behind. Method:
/// a pool creation stops after its first ahead transaction: the load has no such pool, the
/// chunks written are not part of the state, and the next commit deletes them. Then an OSD
/// down stops the same way: the load holds the PGs written ahead, under the new epoch.
#[tokio::test]
async fn a_large_commit_cut_short_loads_as_a_state_to_lead_on_and_is_cleaned_up() {
    let (_etcd, mut client, fence, mut store, snapshot) = started().await;
    let keys = Keyspace::new("/fb");
    let epoch_before = snapshot.state.map.epoch;

    let mut cut = EtcdStore::new(client.clone(), keys.clone()).stopping_after_ahead_txns(1);
    let mut doomed = snapshot.clone();
    let outcome = commit(&mut cut, fence, &mut doomed, create_big_pool).await;
    assert!(matches!(outcome, Err(CommitError::Conflict)), "{outcome:?}");
    let written = all_keys(&mut client).await;
    let next_pool = snapshot.state.counters.next_pool_id;
    let leftovers = |kvs: &BTreeMap<String, (String, i64)>| {
        kvs.keys()
            .filter(|k| k.starts_with(&format!("/fb/pgs/{next_pool}/")))
            .count()
    };
    assert!(leftovers(&written) > 0, "the first run went ahead");

    let mut reloaded = load(&client).await;
    assert!(reloaded.dirty, "the abandoned chunks are not the state");
    assert!(!reloaded.state.map.pools.contains_key(&PoolId(next_pool)));
    assert_eq!(
        reloaded.state.map.epoch,
        Epoch(epoch_before.0 + 1),
        "the epoch went with the first run"
    );
    assert_eq!(reloaded.state.map.pools, snapshot.state.map.pools);
    // The new leader's first commit (any change) takes the abandoned chunks away.
    commit(&mut store, fence, &mut reloaded, |s| {
        s.set_flag(fastblock_mon_core::osd_ops::Flag::NoOut, true);
    })
    .await
    .unwrap();
    assert_eq!(leftovers(&all_keys(&mut client).await), 0);
    let clean = load(&client).await;
    assert!(!clean.dirty);
    assert_eq!(clean.state, reloaded.state);

    // Created in full this time, then an OSD down cut short after one run.
    let mut snapshot = clean;
    commit(&mut store, fence, &mut snapshot, create_big_pool)
        .await
        .unwrap();
    let big = PoolId(next_pool);
    let epoch_before = snapshot.state.map.epoch;
    let mut doomed = snapshot.clone();
    let outcome = commit(&mut cut, fence, &mut doomed, |s| {
        s.mark_down(OsdId(1)).unwrap();
    })
    .await;
    assert!(matches!(outcome, Err(CommitError::Conflict)), "{outcome:?}");
    let mut reloaded = load(&client).await;
    assert_eq!(reloaded.state.map.epoch, Epoch(epoch_before.0 + 1));
    assert!(
        reloaded.state.map.osds[&OsdId(1)].up,
        "the OSD's key goes with the last transaction"
    );
    let pgs = &reloaded.state.map.pgmaps[&big].pgs;
    assert_eq!(pgs.len(), BIG_PGS as usize);
    // What went ahead: the state bits of the PGs the first run held, derived with the OSD
    // down, and their versions. Loading derives every PG's state again from the OSDs as
    // stored (the OSD up): only the raised versions stay, which tell holders to look again.
    let before = &snapshot.state.map.pgmaps[&big].pgs;
    let mut raised = 0;
    for (seq, pg) in pgs.iter() {
        let old = before.get(seq).unwrap();
        raised += usize::from(pg.version != old.version);
        let mut same = pg.clone();
        same.version = old.version;
        assert_eq!(&same, old, "PG {seq}");
    }
    assert!(raised > 0, "the first run went ahead");
    // The new leader marks the OSD down again, in full this time.
    commit(&mut store, fence, &mut reloaded, |s| {
        s.mark_down(OsdId(1)).unwrap();
    })
    .await
    .unwrap();
    let last = load(&client).await;
    assert!(!last.dirty);
    assert_eq!(last.state, reloaded.state);
    assert!(!last.state.map.osds[&OsdId(1)].up);
}

/// Goal: a commit dropped while it waits on etcd (its caller went away: a client hung up on
/// the HTTP call that made it) never leaves the leader acting on revisions etcd no longer
/// has. Method: a large commit is dropped at its first wait (a timeout of zero polls it once:
/// it then waits on its first transaction); its snapshot says it is in doubt (the monitor
/// reloads such a snapshot before its next operation: `service::Monitor::leader_ctx`), and
/// after a reload the same operation commits.
#[tokio::test]
async fn a_commit_dropped_while_it_waits_leaves_its_snapshot_in_doubt() {
    let (_etcd, client, fence, mut store, mut snapshot) = started().await;
    assert!(!snapshot.in_doubt);
    let before = MonState::clone(&snapshot.state);
    let mut next = before.clone();
    create_big_pool(&mut next);
    next.finish(&before);
    let outcome = tokio::time::timeout(
        std::time::Duration::ZERO,
        store.commit(fence, &mut snapshot, next),
    )
    .await;
    assert!(outcome.is_err(), "dropped at its first wait");
    assert!(snapshot.in_doubt);
    // If its request went out, etcd applies it within moments; the reload comes after (one
    // that came before would only make the next commit conflict and reload again, as the
    // monitor does).
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let mut reloaded = load(&client).await;
    assert!(!reloaded.in_doubt);
    commit(&mut store, fence, &mut reloaded, create_big_pool)
        .await
        .unwrap();
    assert_eq!(load(&client).await.state, reloaded.state);
}

/// Goal: on the monitor's own member (`--max-txn-ops 4096`) a large commit takes few
/// transactions, and the cut is what lets it through at all. Method: a pool of 32,768 PGs (one
/// key each) created through a store cutting at `OWN_MEMBER_TXN_OPS_MAX`, on an etcd with the
/// own member's limit: some 32 transactions, not the 512 of 64 keys, and the state loads back
/// whole. The same store on an etcd with the default limit (128) is refused: the figure is
/// bound to the member's flag.
#[tokio::test]
async fn the_own_member_takes_large_commits_in_few_transactions() {
    let limit = OWN_MEMBER_MAX_TXN_OPS.to_string();
    let own = ["--max-txn-ops", limit.as_str()];
    let (_etcd, client, fence, mut store, mut snapshot) =
        started_with(&own, OWN_MEMBER_TXN_OPS_MAX).await;
    let created = commit(&mut store, fence, &mut snapshot, create_big_pool)
        .await
        .unwrap()
        .unwrap();
    let keys = BIG_PGS as usize;
    assert!(
        created.transactions as usize <= keys / OWN_MEMBER_TXN_OPS_MAX + 2,
        "{created:?}"
    );
    assert!(
        (created.transactions as usize) < keys / TXN_OPS_MAX,
        "{created:?}"
    );
    let loaded = load(&client).await;
    assert!(!loaded.dirty);
    assert_eq!(loaded.state, snapshot.state);

    let (_default, _, fence, mut store, mut snapshot) =
        started_with(&[], OWN_MEMBER_TXN_OPS_MAX).await;
    let refused = commit(&mut store, fence, &mut snapshot, create_big_pool).await;
    assert!(matches!(refused, Err(CommitError::Etcd(_))), "{refused:?}");
}

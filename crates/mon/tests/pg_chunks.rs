//! A pool's PGs in etcd, `PG_KEY_PGS` (one) to a `pgs/<pool>/<index>` key
//! (`fastblock_mon::keys`), on a real etcd through the monitor's store: a commit that changes
//! one PG writes that PG's key alone; a state written in a layout before (a pool's PGs in its
//! one `pgmaps/<pool>` key, or 256 to a `pgmaps/<pool>/<chunk>` key) loads, and the first
//! commit rewrites it in `pgs/` keys, also when that rewrite is cut short; a removed pool
//! takes its keys along.

mod common;

use common::{all_keys, cluster_state, etcd, fence};
use fastblock_mon::keys::{Keyspace, PG_KEY_PGS};
use fastblock_mon::store::{CommitError, EtcdStore, Fence};
use fastblock_mon_core::MonState;
use fastblock_types::map::PgMap;
use fastblock_types::{Epoch, PoolId};
use std::collections::BTreeMap;

const PGS: u32 = 1024;

fn state() -> MonState {
    cluster_state(3, PGS, 3)
}

/// Runs `op` on a copy of the snapshot's state, as the monitor does, and commits it.
async fn commit(
    store: &mut EtcdStore,
    fence: Fence,
    snapshot: &mut fastblock_mon::store::Snapshot,
    op: impl FnOnce(&mut MonState),
) -> u64 {
    let before = MonState::clone(&snapshot.state);
    let mut next = before.clone();
    op(&mut next);
    next.finish(&before);
    store
        .commit(fence, snapshot, next)
        .await
        .unwrap()
        .expect("something changed")
        .bytes
}

#[tokio::test]
async fn one_pg_changed_writes_one_key_and_the_first_layout_is_rewritten_in_keys() {
    let (_etcd, mut client) = etcd().await;
    let keys = Keyspace::new("/fb");
    // As a monitor before the chunks wrote it: the pool's PGs in `pgmaps/1`.
    let s = state();
    let old_layout: BTreeMap<String, String> = {
        let mut kvs: BTreeMap<String, String> = keys
            .encode(&s)
            .into_iter()
            .filter(|(k, _)| !k.starts_with("/fb/pgs/1/"))
            .collect();
        let whole: &PgMap = &s.map.pgmaps[&PoolId(1)];
        kvs.insert("/fb/pgmaps/1".into(), serde_json::to_string(whole).unwrap());
        kvs
    };
    for (k, v) in &old_layout {
        client.put(k.as_str(), v.as_str(), None).await.unwrap();
    }
    let fence = fence(&mut client).await;
    let mut store = EtcdStore::new(client.clone(), keys.clone());
    let mut snapshot = store.load().await.unwrap();
    assert!(snapshot.dirty, "the old layout is not this version's");
    assert_eq!(
        snapshot.state.map.pgmaps[&PoolId(1)].pgs.len(),
        PGS as usize
    );

    // The first commit rewrites the pool in `pgs/` keys.
    commit(&mut store, fence, &mut snapshot, |s| {
        s.set_flag(fastblock_mon_core::osd_ops::Flag::NoOut, true);
    })
    .await;
    let after = all_keys(&mut client).await;
    let chunk_keys: Vec<&String> = after
        .keys()
        .filter(|k| k.starts_with("/fb/pgs/1/"))
        .collect();
    assert_eq!(
        chunk_keys.len(),
        (PGS / PG_KEY_PGS) as usize,
        "{chunk_keys:?}"
    );
    let header: PgMap = serde_json::from_str(&after["/fb/pgmaps/1"].0).unwrap();
    assert!(header.pgs.is_empty(), "the PGs moved to the chunks");
    let reloaded = EtcdStore::new(client.clone(), keys.clone())
        .load()
        .await
        .unwrap();
    assert!(!reloaded.dirty);
    assert_eq!(reloaded.state, snapshot.state);

    // One PG changed: its key, the pool's header and the small records, no other PG key.
    let seq = 700;
    let bytes = commit(&mut store, fence, &mut snapshot, |s| {
        let pg = s
            .map
            .pgmaps
            .get_mut(&PoolId(1))
            .unwrap()
            .pgs
            .get_mut(&seq)
            .unwrap();
        pg.leader = Some(pg.osdlist[0]);
        pg.leader_term = fastblock_types::Term(1);
    })
    .await;
    let later = all_keys(&mut client).await;
    let rewritten: Vec<&String> = later
        .iter()
        .filter(|(k, (_, rev))| after.get(*k).is_none_or(|(_, old)| old != rev))
        .map(|(k, _)| k)
        .collect();
    let chunk = format!("/fb/pgs/1/{}", seq / PG_KEY_PGS);
    assert!(rewritten.contains(&&chunk), "{rewritten:?}");
    assert!(
        rewritten
            .iter()
            .all(|k| !k.starts_with("/fb/pgs/1/") || **k == chunk),
        "{rewritten:?}"
    );
    let whole_pool_bytes = serde_json::to_string(&snapshot.state.map.pgmaps[&PoolId(1)])
        .unwrap()
        .len() as u64;
    assert!(
        bytes * 20 < whole_pool_bytes,
        "wrote {bytes} B for one PG, the whole pool is {whole_pool_bytes} B"
    );
    assert!(snapshot.state.map.epoch > Epoch(0));

    // The pool removed: its header and its chunks go.
    commit(&mut store, fence, &mut snapshot, |s| {
        s.delete_pool("p", true).unwrap();
    })
    .await;
    let last = all_keys(&mut client).await;
    assert!(
        last.keys()
            .all(|k| !k.starts_with("/fb/pgmaps/") && !k.starts_with("/fb/pgs/")),
        "{:?}",
        last.keys().collect::<Vec<_>>()
    );
    let reloaded = EtcdStore::new(client.clone(), keys.clone())
        .load()
        .await
        .unwrap();
    assert_eq!(reloaded.state, snapshot.state);
}

/// The layout before `pgs/` keys: 256 PGs to a `pgmaps/<pool>/<chunk>` key, as `state` would
/// be written in it.
fn in_256_pg_chunks(keys: &Keyspace, s: &MonState) -> BTreeMap<String, String> {
    let mut kvs: BTreeMap<String, String> = keys
        .encode(s)
        .into_iter()
        .filter(|(k, _)| !k.starts_with("/fb/pgs/"))
        .collect();
    for (pool, pgmap) in &s.map.pgmaps {
        let mut chunks: BTreeMap<u32, BTreeMap<u32, &fastblock_types::map::PgInfo>> =
            BTreeMap::new();
        for (seq, pg) in pgmap.pgs.iter() {
            chunks.entry(seq / 256).or_default().insert(*seq, pg);
        }
        for (chunk, pgs) in chunks {
            let key = format!("/fb/pgmaps/{pool}/{chunk}");
            kvs.insert(key, serde_json::to_string(&pgs).unwrap());
        }
    }
    kvs
}

/// Goal: a cluster whose PGs are stored 256 to a key (the layout before) moves to `pgs/` keys
/// without losing a PG, even when the move is cut short. Method: a pool of 4,096 PGs written
/// in the old layout; the first commit after the load is cut short after one of its ahead
/// transactions (more than one: 4,096 keys to put, 16 to delete), and a load then holds every
/// PG (those written ahead from their `pgs/` keys); the next commit completes the move: no
/// old key left, and the state loads back equal and not dirty.
#[tokio::test]
async fn the_256_pg_layout_is_rewritten_in_pg_keys_even_when_cut_short() {
    let (_etcd, mut client) = etcd().await;
    let keys = Keyspace::new("/fb");
    let s = cluster_state(3, 4096, 3);
    for (k, v) in &in_256_pg_chunks(&keys, &s) {
        client.put(k.as_str(), v.as_str(), None).await.unwrap();
    }
    let fence = fence(&mut client).await;
    let mut store = EtcdStore::new(client.clone(), keys.clone());
    let old_keys = |kvs: &BTreeMap<String, (String, i64)>| {
        kvs.keys()
            .filter(|k| k.starts_with("/fb/pgmaps/1/"))
            .count()
    };
    let new_keys = |kvs: &BTreeMap<String, (String, i64)>| {
        kvs.keys().filter(|k| k.starts_with("/fb/pgs/1/")).count()
    };
    assert_eq!(old_keys(&all_keys(&mut client).await), 16);

    let snapshot = store.load().await.unwrap();
    assert!(snapshot.dirty, "the old layout is not this version's");
    assert_eq!(snapshot.state.map.pgmaps[&PoolId(1)].pgs.len(), 4096);
    let mut cut = EtcdStore::new(client.clone(), keys.clone()).stopping_after_ahead_txns(1);
    let mut doomed = snapshot.clone();
    let before = MonState::clone(&doomed.state);
    let mut next = before.clone();
    next.set_flag(fastblock_mon_core::osd_ops::Flag::NoOut, true);
    next.finish(&before);
    let outcome = cut.commit(fence, &mut doomed, next).await;
    assert!(matches!(outcome, Err(CommitError::Conflict)), "{outcome:?}");
    let halfway = all_keys(&mut client).await;
    assert_eq!(old_keys(&halfway), 16, "deletes come after every put");
    assert!(
        (1..4096 / PG_KEY_PGS as usize).contains(&new_keys(&halfway)),
        "{} keys went ahead",
        new_keys(&halfway)
    );

    let mut reloaded = store.load().await.unwrap();
    assert!(reloaded.dirty);
    assert_eq!(
        reloaded.state.map.pgmaps[&PoolId(1)].pgs,
        snapshot.state.map.pgmaps[&PoolId(1)].pgs,
        "every PG, once"
    );
    commit(&mut store, fence, &mut reloaded, |s| {
        s.set_flag(fastblock_mon_core::osd_ops::Flag::NoOut, true);
    })
    .await;
    let after = all_keys(&mut client).await;
    assert_eq!(old_keys(&after), 0);
    assert_eq!(new_keys(&after), 4096 / PG_KEY_PGS as usize);
    let clean = store.load().await.unwrap();
    assert!(!clean.dirty);
    assert_eq!(clean.state, reloaded.state);
    assert!(clean.state.map.flags.noout);
}

//! A pool's PGs in etcd, one key per chunk of 256 (`fastblock_mon::keys`), on a real etcd
//! through the monitor's store: a commit that changes one PG writes that PG's chunk alone; a
//! state written by a monitor before the chunks (a pool's PGs in its one `pgmaps/<pool>` key)
//! loads, and the first commit rewrites it in chunks; a removed pool takes its chunks along.

mod common;

use common::{all_keys, cluster_state, etcd, fence};
use fastblock_mon::keys::Keyspace;
use fastblock_mon::store::{EtcdStore, Fence};
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
async fn one_pg_changed_writes_one_chunk_and_an_old_layout_is_rewritten_in_chunks() {
    let (_etcd, mut client) = etcd().await;
    let keys = Keyspace::new("/fb");
    // As a monitor before the chunks wrote it: the pool's PGs in `pgmaps/1`.
    let s = state();
    let old_layout: BTreeMap<String, String> = {
        let mut kvs: BTreeMap<String, String> = keys
            .encode(&s)
            .into_iter()
            .filter(|(k, _)| !k.starts_with("/fb/pgmaps/1/"))
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

    // The first commit rewrites the pool in chunks.
    commit(&mut store, fence, &mut snapshot, |s| {
        s.set_flag(fastblock_mon_core::osd_ops::Flag::NoOut, true);
    })
    .await;
    let after = all_keys(&mut client).await;
    let chunk_keys: Vec<&String> = after
        .keys()
        .filter(|k| k.starts_with("/fb/pgmaps/1/"))
        .collect();
    assert_eq!(chunk_keys.len(), (PGS / 256) as usize, "{chunk_keys:?}");
    let header: PgMap = serde_json::from_str(&after["/fb/pgmaps/1"].0).unwrap();
    assert!(header.pgs.is_empty(), "the PGs moved to the chunks");
    let reloaded = EtcdStore::new(client.clone(), keys.clone())
        .load()
        .await
        .unwrap();
    assert!(!reloaded.dirty);
    assert_eq!(reloaded.state, snapshot.state);

    // One PG changed: its chunk, the pool's header and the small records, no other chunk.
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
    let chunk = format!("/fb/pgmaps/1/{}", seq / 256);
    assert!(rewritten.contains(&&chunk), "{rewritten:?}");
    assert!(
        rewritten
            .iter()
            .all(|k| !k.starts_with("/fb/pgmaps/1/") || **k == chunk),
        "{rewritten:?}"
    );
    let whole_pool_bytes = serde_json::to_string(&snapshot.state.map.pgmaps[&PoolId(1)])
        .unwrap()
        .len() as u64;
    assert!(
        bytes * 3 < whole_pool_bytes,
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
        last.keys().all(|k| !k.starts_with("/fb/pgmaps/")),
        "{:?}",
        last.keys().collect::<Vec<_>>()
    );
    let reloaded = EtcdStore::new(client.clone(), keys.clone())
        .load()
        .await
        .unwrap();
    assert_eq!(reloaded.state, snapshot.state);
}

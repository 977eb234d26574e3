//! A restore into a real etcd (`fastblock_mon::backup`): with two monitors given the same
//! backup, one writes it and the other waits for it, then finds it done; a restore cut short
//! is written again by its owner; another backup, or a cluster already there, is refused and
//! nothing is written.

use fastblock_mon::backup::{read, restore, RestoreError, Restored};
use fastblock_mon::keys::Keyspace;

mod common;

use common::{cluster_state, etcd};

/// A state with one OSD and a pool, written into etcd as the monitor writes it.
async fn write_cluster(client: &mut etcd_client::Client, keys: &Keyspace) {
    let s = cluster_state(1, 16, 1);
    for (k, v) in keys.encode(&s) {
        client.put(k, v, None).await.unwrap();
    }
}

async fn keys_under(client: &mut etcd_client::Client, prefix: &str) -> Vec<String> {
    let opts = etcd_client::GetOptions::new()
        .with_prefix()
        .with_keys_only();
    client
        .get(prefix, Some(opts))
        .await
        .unwrap()
        .kvs()
        .iter()
        .map(|kv| kv.key_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn one_monitor_restores_the_others_wait_and_nothing_is_overwritten() {
    let (_source, mut from) = etcd().await;
    let keys = Keyspace::new("/fb");
    write_cluster(&mut from, &keys).await;
    // Read in pages of a few keys, at one revision: every key, none of `mon/`.
    from.put("/fb/mon/leader", "{}", None).await.unwrap();
    let backup = read(&mut from, &keys, 1_000).await.unwrap();
    assert!(
        backup.keys.contains_key("pgmaps/1"),
        "{:?}",
        backup.keys.keys()
    );
    assert!(backup.keys.keys().all(|k| !k.starts_with("mon/")));
    assert_eq!(
        backup.keys.len(),
        keys_under(&mut from, "/fb/").await.len() - 1
    );

    let (target, mut to) = etcd().await;
    // mon.b finds mon.a's restore under way (its marker, not done) and waits.
    let marker = serde_json::json!({
        "backup_revision": backup.revision, "taken_unix_ms": backup.taken_unix_ms,
        "owner": "a", "done": false,
    });
    to.put("/fb/mon/restore", marker.to_string(), None)
        .await
        .unwrap();
    to.put("/fb/osds/1", "{\"half\":\"written\"}", None)
        .await
        .unwrap();
    let e = restore(&mut to, &keys, &backup, "b", 2_000)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, RestoreError::InProgress { owner } if owner == "a"),
        "{e}"
    );
    // mon.a comes back: its own restore, cut short, is written again from the start.
    let done = restore(&mut to, &keys, &backup, "a", 2_000).await.unwrap();
    assert!(matches!(done, Restored::Written { .. }), "{done:?}");
    let state = keys
        .decode(
            &to.get("/fb/", Some(etcd_client::GetOptions::new().with_prefix()))
                .await
                .unwrap()
                .kvs()
                .iter()
                .map(|kv| {
                    (
                        kv.key_str().unwrap().to_string(),
                        kv.value_str().unwrap().to_string(),
                    )
                })
                .collect(),
        )
        .unwrap();
    assert!(
        state.map.osds[&fastblock_types::OsdId(1)].up,
        "the half-written key was replaced"
    );
    assert!(state.map.pgmaps[&fastblock_types::PoolId(1)]
        .pgs
        .values()
        .all(|pg| pg.restored));
    // mon.b now finds it done; so does mon.a restarted with the flag.
    assert_eq!(
        restore(&mut to, &keys, &backup, "b", 3_000).await.unwrap(),
        Restored::AlreadyDone
    );
    assert_eq!(
        restore(&mut to, &keys, &backup, "a", 3_000).await.unwrap(),
        Restored::AlreadyDone
    );
    // Another backup: refused, nothing changed.
    let before = keys_under(&mut to, "/fb/").await;
    let mut other = backup.clone();
    other.taken_unix_ms += 1;
    let e = restore(&mut to, &keys, &other, "a", 3_000)
        .await
        .unwrap_err();
    assert!(matches!(e, RestoreError::NotEmpty { .. }), "{e}");
    assert_eq!(keys_under(&mut to, "/fb/").await, before);
    drop(target);
}

/// An etcd holding a cluster without any restore marker is never written to.
#[tokio::test]
async fn a_restore_into_an_etcd_holding_a_cluster_is_refused() {
    let (_etcd, mut client) = etcd().await;
    let keys = Keyspace::new("/fb");
    write_cluster(&mut client, &keys).await;
    let backup = read(&mut client, &keys, 1_000).await.unwrap();
    let before = keys_under(&mut client, "/fb/").await;
    let e = restore(&mut client, &keys, &backup, "a", 2_000)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("already holds a cluster"), "{e}");
    assert_eq!(keys_under(&mut client, "/fb/").await, before);
}

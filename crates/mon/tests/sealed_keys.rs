//! The key table sealed in etcd (`fastblock_mon::key_seal`), on a real etcd through the
//! monitor's store: entries written in clear by a monitor before the seal load, and the next
//! commit rewrites them sealed; an entry sealed under another monitor secret stops the load
//! with an error naming the entity and `--mon-secret-file`.

mod common;

use common::{cluster_state, etcd};
use fastblock_auth::Secret;
use fastblock_mon::key_seal::KeyTableSeal;
use fastblock_mon::keys::Keyspace;
use fastblock_mon::secret::{MonSecret, MON_SECRET_BYTES};
use fastblock_mon::store::{EtcdStore, Fence, LoadError};
use fastblock_mon_core::MonState;
use fastblock_types::auth::AuthMode;
use std::sync::Arc;

fn sealed_keys(byte: u8) -> Keyspace {
    let secret = MonSecret::from_bytes([byte; MON_SECRET_BYTES]);
    Keyspace::new("/fb").with_seal(Arc::new(KeyTableSeal::new(&secret)))
}

/// A cluster with authentication set up: client.admin holds `admin`.
fn state(admin: &Secret) -> MonState {
    let mut s = cluster_state(1, 4, 1);
    let before = s.clone();
    s.auth_bootstrap(AuthMode::Sign, Some(admin.clone()))
        .unwrap();
    s.finish(&before);
    s
}

async fn value(client: &mut etcd_client::Client, key: &str) -> String {
    let resp = client.get(key, None).await.unwrap();
    resp.kvs()[0].value_str().unwrap().to_string()
}

#[tokio::test]
async fn entries_in_clear_load_and_the_next_commit_seals_them() {
    let (_etcd, mut client) = etcd().await;
    let admin = Secret::generate().unwrap();
    let s = state(&admin);
    // As a monitor before the seal wrote it: every key as encoded, the entity key in clear.
    for (k, v) in Keyspace::new("/fb").encode(&s) {
        client.put(k, v, None).await.unwrap();
    }
    let key = "/fb/auth/entities/client.admin";
    assert!(value(&mut client, key).await.contains(&admin.to_base64()));
    let rev = client
        .put("/fb/mon/leader", "{}", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    let fence = Fence {
        leader_create_revision: rev,
    };
    let keys = sealed_keys(1);
    let mut store = EtcdStore::new(client.clone(), keys.clone());
    let mut snapshot = store.load().await.unwrap();
    assert_eq!(*snapshot.state, s, "the clear entries load as they are");
    assert!(snapshot.clear_entities.contains(key));
    // A commit of the same state writes the clear entries, sealed.
    let same = MonState::clone(&snapshot.state);
    store
        .commit(fence, &mut snapshot, same)
        .await
        .unwrap()
        .expect("the clear entries are written");
    assert!(snapshot.clear_entities.is_empty());
    let stored = value(&mut client, key).await;
    assert!(!stored.contains(&admin.to_base64()), "sealed: {stored}");
    assert!(stored.contains("\"sealed\""), "{stored}");
    let reloaded = EtcdStore::new(client.clone(), keys).load().await.unwrap();
    assert_eq!(
        *reloaded.state, s,
        "the sealed entries open to the same table"
    );
    assert!(reloaded.clear_entities.is_empty());

    // Another secret: the load names the entity and the flag, and loads nothing.
    let e = EtcdStore::new(client.clone(), sealed_keys(2))
        .load()
        .await
        .unwrap_err();
    assert!(matches!(e, LoadError::Damaged(_)), "{e}");
    let message = e.to_string();
    assert!(
        message.contains("client.admin") && message.contains("--mon-secret-file"),
        "{message}"
    );
}

//! A paged read of the state (the leader's load, a backup) survives a compaction that removes
//! the revision it reads at: it starts again from the newest revision. A new leader compacts
//! to the current revision (`fastblock_mon::etcd_maint`), and at 131,072 PGs a load is over a
//! hundred pages, so a load overtaken by a compaction is what a leadership change at scale
//! meets (seen: "mvcc: required revision has been compacted", the load failing every time).

mod common;

use fastblock_mon::store::read_pages;
use std::time::Duration;

const KEYS: usize = 3000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paged_read_overtaken_by_a_compaction_starts_again_and_reads_everything() {
    let (_etcd, mut client) = common::etcd().await;
    for i in 0..KEYS {
        client
            .put(format!("/fb/k/{i:05}"), format!("v{i}"), None)
            .await
            .unwrap();
    }
    // Two compactions to the newest revision while the read runs, each after a write so that
    // the revision the read is at is gone.
    let mut compactor = client.clone();
    let compactions = tokio::spawn(async move {
        for round in 0..2 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let put = compactor
                .put("/fb/bump", round.to_string(), None)
                .await
                .unwrap();
            let head = put.header().unwrap().revision();
            compactor.compact(head, None).await.unwrap();
        }
    });
    // One key per request: thousands of requests, far longer than the compactor's 100 ms.
    let pages = read_pages(&mut client, "/fb/k/", 1).await.unwrap();
    compactions.await.unwrap();
    assert!(
        pages.restarts >= 1,
        "the read was overtaken by a compaction and started again"
    );
    assert_eq!(pages.kvs.len(), KEYS, "every key read");
    for (i, kv) in pages.kvs.iter().enumerate() {
        assert_eq!(kv.key_str().unwrap(), format!("/fb/k/{i:05}"));
        assert_eq!(kv.value_str().unwrap(), format!("v{i}"));
    }
}

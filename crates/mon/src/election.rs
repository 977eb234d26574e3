//! Monitor leader election on an etcd lease.
//!
//! Each monitor holds one lease (TTL `lease_ttl_secs`, kept alive every third of it) that backs
//! its member key and, when it wins, the leader key. Campaigning is a transaction "create the
//! leader key if it does not exist". The create revision of the won key is the fence every
//! state commit is guarded by (see `store.rs`). A monitor that cannot renew its lease steps down
//! before the lease can expire on the etcd side, so two monitors never both believe they lead
//! for longer than the renewal interval.
//!
//! The election runs on a thread and a tokio runtime of its own, with its own etcd
//! connection ([`run_on_own_thread`]): on the monitor's runtime its renewals waited behind
//! whatever kept the workers busy (a 131,072-PG state encoded, deltas cut for a thousand
//! long-polls) and the shared connection's traffic, and at 1,000 OSDs the leader lost its
//! lease every few seconds. Its role reaches the rest of the monitor through a `watch`, which
//! works across runtimes.

use crate::keys::Keyspace;
use crate::store::Fence;
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use fastblock_types::api::MonMember;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// Following; `leader` is the current leader if one is known.
    Follower {
        leader: Option<MonMember>,
    },
    Leader {
        fence: Fence,
    },
}

pub struct Election {
    pub client: etcd_client::Client,
    pub keys: Keyspace,
    pub me: MonMember,
    pub lease_ttl_secs: i64,
}

/// Publishes "follower" when dropped: a run that ends in any way, a panic included, must not
/// leave this monitor believing it leads once it no longer renews its lease.
struct StepDownOnDrop<'a>(&'a watch::Sender<Role>);

impl Drop for StepDownOnDrop<'_> {
    fn drop(&mut self) {
        self.0.send_replace(Role::Follower { leader: None });
    }
}

/// How to reach etcd from the election's own runtime.
#[derive(Clone, Debug)]
pub struct ElectionEtcd {
    pub endpoints: Vec<String>,
    pub options: etcd_client::ConnectOptions,
}

/// Why the election's thread ended other than by a shutdown.
#[derive(Debug, thiserror::Error)]
pub enum ElectionThreadError {
    #[error("starting the election's thread or runtime: {0}")]
    Start(#[from] std::io::Error),
    #[error("connecting the election to etcd at {endpoints:?}: {source}")]
    Connect {
        endpoints: Vec<String>,
        source: etcd_client::Error,
    },
    #[error("the election's thread panicked")]
    Panicked,
}

/// Connects to etcd and runs the election (until `shutdown`) on a thread and current-thread
/// runtime of its own; resolves when that ends. The role is published on `role` (a follower
/// once it ends, however it ends: a panic unwinds through [`Election::run`]'s step-down).
pub async fn run_on_own_thread(
    etcd: ElectionEtcd,
    keys: Keyspace,
    me: MonMember,
    lease_ttl_secs: i64,
    role: watch::Sender<Role>,
    shutdown: watch::Receiver<bool>,
) -> Result<(), ElectionThreadError> {
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("mon-election".into())
        .spawn(move || {
            let outcome = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(ElectionThreadError::Start)
                .and_then(|runtime| {
                    runtime.block_on(async {
                        let client =
                            etcd_client::Client::connect(&etcd.endpoints, Some(etcd.options))
                                .await
                                .map_err(|source| ElectionThreadError::Connect {
                                    endpoints: etcd.endpoints.clone(),
                                    source,
                                })?;
                        let election = Election {
                            client,
                            keys,
                            me,
                            lease_ttl_secs,
                        };
                        election.run(&role, shutdown).await;
                        Ok(())
                    })
                });
            let _ = done_tx.send(outcome);
        })?;
    done_rx.await.map_err(|_| ElectionThreadError::Panicked)?
}

impl Election {
    /// Runs forever (until `shutdown`), publishing the role; etcd errors are retried here.
    /// Ends as a follower, however it ends.
    pub async fn run(&self, role: &watch::Sender<Role>, mut shutdown: watch::Receiver<bool>) {
        let _step_down = StepDownOnDrop(role);
        loop {
            if *shutdown.borrow() {
                break;
            }
            let result = tokio::select! {
                r = self.term(role) => r,
                _ = shutdown.changed() => Ok(()),
            };
            let _ = role.send(Role::Follower { leader: None });
            if let Err(e) = result {
                tracing::warn!("election: {e}; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                    _ = shutdown.changed() => {}
                }
            }
        }
        self.resign().await;
    }

    /// Deletes our keys on a clean shutdown so a successor does not wait for the lease TTL.
    async fn resign(&self) {
        let mut client = self.client.clone();
        let me = serde_json::to_string(&self.me).expect("member serializes");
        let txn = Txn::new()
            .when([Compare::value(self.keys.leader(), CompareOp::Equal, me)])
            .and_then([TxnOp::delete(self.keys.leader(), None)]);
        let _ = tokio::time::timeout(Duration::from_secs(2), client.txn(txn)).await;
        let _ = tokio::time::timeout(
            Duration::from_secs(2),
            client.delete(self.keys.member(&self.me.name), None),
        )
        .await;
    }

    /// One lease lifetime: grant, register, campaign/follow, keep alive until it fails.
    async fn term(&self, role: &watch::Sender<Role>) -> Result<(), etcd_client::Error> {
        let mut client = self.client.clone();
        let lease = client.lease_grant(self.lease_ttl_secs, None).await?;
        let lease_id = lease.id();
        let me = serde_json::to_string(&self.me).expect("member serializes");
        client
            .put(
                self.keys.member(&self.me.name),
                me.clone(),
                Some(PutOptions::new().with_lease(lease_id)),
            )
            .await?;
        let (mut keeper, mut responses) = client.lease_keep_alive(lease_id).await?;
        let renew_every = Duration::from_millis((self.lease_ttl_secs as u64 * 1000) / 3);
        // Step down once this long has passed without a successful renewal: strictly less than
        // the TTL, so we stop acting as leader before etcd lets anyone else win.
        let valid_for = Duration::from_millis((self.lease_ttl_secs as u64 * 1000) * 2 / 3);
        let mut last_renewed = Instant::now();
        let mut next_renew = Instant::now();
        let mut next_check = Instant::now();
        loop {
            let now = Instant::now();
            if now >= next_renew {
                keeper.keep_alive().await?;
                next_renew = now + renew_every;
            }
            if now >= next_check {
                self.campaign_or_follow(&mut client, lease_id, &me, role)
                    .await?;
                next_check = now + Duration::from_millis(250);
            }
            let wake = next_renew.min(next_check);
            let renewed = tokio::time::timeout_at(wake, responses.message()).await;
            match renewed {
                Ok(Ok(Some(resp))) if resp.ttl() > 0 => last_renewed = Instant::now(),
                Ok(Ok(Some(_))) => {
                    return Err(etcd_client::Error::LeaseKeepAliveError(
                        "lease expired".into(),
                    ))
                }
                Ok(Ok(None)) => {
                    return Err(etcd_client::Error::LeaseKeepAliveError(
                        "stream closed".into(),
                    ))
                }
                Ok(Err(e)) => return Err(e),
                Err(_) => {}
            }
            if last_renewed.elapsed() > valid_for {
                return Err(etcd_client::Error::LeaseKeepAliveError(
                    "lease not renewed in time".into(),
                ));
            }
        }
    }

    async fn campaign_or_follow(
        &self,
        client: &mut etcd_client::Client,
        lease_id: i64,
        me: &str,
        role: &watch::Sender<Role>,
    ) -> Result<(), etcd_client::Error> {
        let key = self.keys.leader();
        // A plain read first: while the leader key exists there is nothing to write. This
        // matters when etcd is out of space (NOSPACE): it refuses every transaction holding a
        // put, even one whose comparison fails, but still serves reads and keeps leases alive,
        // so a leader keeps leading, and recovers etcd (`crate::etcd_maint`).
        let held = client.get(key.clone(), None).await?;
        if let Some(kv) = held.kvs().first() {
            return self.follow_or_keep(kv, lease_id, role);
        }
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.clone(),
                me,
                Some(PutOptions::new().with_lease(lease_id)),
            )])
            .or_else([TxnOp::get(key.clone(), None)]);
        let resp = client.txn(txn).await?;
        if resp.succeeded() {
            let revision = resp.header().map(|h| h.revision()).unwrap_or_default();
            tracing::info!(name = %self.me.name, revision, "won the monitor election");
            role.send_replace(Role::Leader {
                fence: Fence {
                    leader_create_revision: revision,
                },
            });
            return Ok(());
        }
        let current = resp.op_responses().into_iter().find_map(|op| match op {
            etcd_client::TxnOpResponse::Get(get) => get.kvs().first().cloned(),
            _ => None,
        });
        match current {
            Some(kv) => self.follow_or_keep(&kv, lease_id, role),
            None => Ok(()),
        }
    }

    /// The leader key `kv` exists: keep leading if it is ours, else follow its holder.
    fn follow_or_keep(
        &self,
        kv: &etcd_client::KeyValue,
        lease_id: i64,
        role: &watch::Sender<Role>,
    ) -> Result<(), etcd_client::Error> {
        if kv.lease() == lease_id {
            // Still ours: keep the role (and its fence) as it is.
            let fence = Fence {
                leader_create_revision: kv.create_revision(),
            };
            if *role.borrow() != (Role::Leader { fence }) {
                role.send_replace(Role::Leader { fence });
            }
            return Ok(());
        }
        let leader: Option<MonMember> = kv
            .value_str()
            .ok()
            .and_then(|v| serde_json::from_str(v).ok());
        let next = Role::Follower { leader };
        if *role.borrow() != next {
            role.send_replace(next);
        }
        Ok(())
    }
}

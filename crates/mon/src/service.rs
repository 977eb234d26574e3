//! The monitor's leader-side engine: the in-memory state of the current term, the operation
//! pipeline (copy → decide → persist → publish), the liveness ticker and IO statistics.

use crate::election::Role;
use crate::keys::Keyspace;
use crate::stats::IoStats;
use crate::store::{CommitError, EtcdStore, Fence, LoadError, Snapshot};
use fastblock_mon_core::liveness::{Liveness, LivenessConfig, LivenessEvent};
use fastblock_mon_core::{MonState, OpResult};
use fastblock_types::api::{ApiError, ErrorCode, MonMember};
use fastblock_types::Epoch;
use std::time::Duration;
use tokio::sync::{watch, Mutex};
use tokio::time::Instant;

/// How often a conflicting commit is reloaded and retried before the caller gets `conflict`.
const COMMIT_ATTEMPTS_MAX: u32 = 3;

/// Everything that exists only while this monitor leads.
pub struct LeaderCtx {
    pub fence: Fence,
    pub snapshot: Snapshot,
    pub liveness: Liveness,
    pub stats: IoStats,
}

pub struct Monitor {
    pub me: MonMember,
    pub keys: Keyspace,
    pub client: etcd_client::Client,
    pub role: watch::Receiver<Role>,
    pub liveness_config: LivenessConfig,
    pub ctx: Mutex<Option<LeaderCtx>>,
    /// The published epoch: long-polls wait on it.
    pub epoch: watch::Sender<Epoch>,
    started: Instant,
}

fn no_leader() -> ApiError {
    ApiError::new(ErrorCode::NoLeader, "this monitor is not the leader; retry")
}

fn unavailable(e: impl std::fmt::Display) -> ApiError {
    ApiError::new(ErrorCode::Unavailable, format!("etcd unavailable: {e}"))
}

impl Monitor {
    pub fn new(
        me: MonMember,
        keys: Keyspace,
        client: etcd_client::Client,
        role: watch::Receiver<Role>,
        liveness_config: LivenessConfig,
    ) -> Self {
        Monitor {
            me,
            keys,
            client,
            role,
            liveness_config,
            ctx: Mutex::new(None),
            epoch: watch::channel(Epoch(0)).0,
            started: Instant::now(),
        }
    }

    /// Milliseconds on this process's monotonic clock.
    pub fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// The epoch of the last committed change (what an answer should report).
    pub fn published_epoch(&self) -> Epoch {
        *self.epoch.borrow()
    }

    pub fn is_leader(&self) -> bool {
        matches!(*self.role.borrow(), Role::Leader { .. })
    }

    fn store(&self) -> EtcdStore {
        EtcdStore::new(self.client.clone(), self.keys.clone())
    }

    /// Makes sure the context matches the role: load the state on becoming leader, drop it on
    /// losing the leadership. Returns the locked context.
    pub async fn leader_ctx(&self) -> OpResult<tokio::sync::MutexGuard<'_, Option<LeaderCtx>>> {
        let role = self.role.borrow().clone();
        let mut guard = self.ctx.lock().await;
        match role {
            Role::Follower { .. } => {
                *guard = None;
                Err(no_leader())
            }
            Role::Leader { fence } => {
                if guard.as_ref().is_some_and(|c| c.fence == fence) {
                    return Ok(guard);
                }
                let snapshot = self.store().load().await.map_err(|e| match e {
                    LoadError::Etcd(e) => unavailable(e),
                    other => ApiError::new(ErrorCode::Internal, other.to_string()),
                })?;
                let mut liveness = Liveness::new(self.liveness_config);
                let now = self.now_ms();
                // Every OSD gets a fresh grace period under a new leader.
                for osd in snapshot.state.map.osds.values().filter(|o| o.up) {
                    liveness.heartbeat(osd.id, now);
                }
                tracing::info!(epoch = %snapshot.state.map.epoch, "leading; state loaded");
                self.epoch.send_replace(snapshot.state.map.epoch);
                *guard = Some(LeaderCtx {
                    fence,
                    snapshot,
                    liveness,
                    stats: IoStats::default(),
                });
                Ok(guard)
            }
        }
    }

    /// Runs one operation: decide on a copy of the state, persist what changed, then publish.
    /// `op` may run more than once (after a conflict the state is reloaded and it is re-run).
    pub async fn apply<T>(
        &self,
        op: impl Fn(&mut MonState, &mut LeaderSide) -> OpResult<T>,
    ) -> OpResult<T> {
        let mut guard = self.leader_ctx().await?;
        for attempt in 1..=COMMIT_ATTEMPTS_MAX {
            let ctx = guard.as_mut().ok_or_else(no_leader)?;
            let before = &ctx.snapshot.state;
            let mut next = before.clone();
            let mut side = LeaderSide {
                now_ms: self.now_ms(),
                liveness: &mut ctx.liveness,
                stats: &mut ctx.stats,
            };
            let out = op(&mut next, &mut side)?;
            if !next.finish(before) {
                return Ok(out);
            }
            let epoch = next.map.epoch;
            match self
                .store()
                .commit(ctx.fence, &mut ctx.snapshot, next)
                .await
            {
                Ok(()) => {
                    self.epoch.send_replace(epoch);
                    return Ok(out);
                }
                Err(CommitError::Etcd(e)) => {
                    // The outcome is unknown: reload before the next operation.
                    *guard = None;
                    return Err(unavailable(e));
                }
                Err(CommitError::Conflict) => {
                    tracing::warn!(attempt, "commit conflict; reloading state");
                    *guard = None;
                    drop(guard);
                    guard = self.leader_ctx().await?;
                }
            }
        }
        Err(ApiError::new(
            ErrorCode::Conflict,
            "the cluster state kept changing underneath this operation; retry",
        ))
    }

    /// Reads the state without changing it.
    pub async fn read<T>(&self, f: impl FnOnce(&MonState, &LeaderCtx) -> T) -> OpResult<T> {
        let guard = self.leader_ctx().await?;
        let ctx = guard.as_ref().ok_or_else(no_leader)?;
        Ok(f(&ctx.snapshot.state, ctx))
    }

    /// Turns heartbeat silence into down/up/out every `interval`, while leading.
    pub async fn run_ticker(&self, interval: Duration, mut shutdown: watch::Receiver<bool>) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = shutdown.changed() => return,
            }
            if !self.is_leader() {
                let _ = self.leader_ctx().await; // drops a stale context
                continue;
            }
            let result = self
                .apply(|state, side| {
                    let events = side.liveness.tick(state, side.now_ms);
                    for event in &events {
                        match *event {
                            LivenessEvent::Down(id) => state.mark_down(id)?,
                            LivenessEvent::Up(id) => state.mark_up(id)?,
                            LivenessEvent::Out(id) => state.mark_out(id)?,
                        }
                    }
                    Ok(events)
                })
                .await;
            match result {
                Ok(events) => {
                    for e in events {
                        tracing::info!(?e, "osd liveness change");
                    }
                }
                Err(e) if e.code == ErrorCode::NoLeader => {}
                Err(e) => tracing::warn!("liveness tick: {e}"),
            }
        }
    }
}

/// Leader-only bookkeeping an operation may touch besides the persisted state.
pub struct LeaderSide<'a> {
    pub now_ms: u64,
    pub liveness: &'a mut Liveness,
    pub stats: &'a mut IoStats,
}

//! The monitor's leader-side engine: the in-memory state of the current term, the operation
//! pipeline (copy → decide → persist → publish), the liveness ticker, IO statistics and the
//! PG leaders' scrub reports.

use crate::election::Role;
use crate::etcd_maint::EtcdUpkeep;
use crate::keys::Keyspace;
use crate::stats::IoStats;
use crate::store::{CommitError, EtcdStore, Fence, LoadError, Snapshot};
use fastblock_auth::{Caps, EntityName, Keyring, KeyringEntry, Secret};
use fastblock_mon_core::liveness::{Liveness, LivenessConfig};
use fastblock_mon_core::map_log::MapLog;
use fastblock_mon_core::scrub_ops::ScrubStats;
use fastblock_mon_core::{MonState, OpResult};
use fastblock_types::api::{ApiError, ErrorCode, MonMember};
use fastblock_types::auth::AuthMode;
use fastblock_types::Epoch;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Mutex};
use tokio::time::Instant;

/// How often a conflicting commit is reloaded and retried before the caller gets `conflict`.
const COMMIT_ATTEMPTS_MAX: u32 = 3;

/// The persisted state as this monitor leads it, under the commit lock
/// ([`Monitor::ctx`]): held by an operation from its decision until etcd has answered.
pub struct LeaderCtx {
    pub fence: Fence,
    pub snapshot: Snapshot,
}

/// The leader's bookkeeping beside the persisted state: when each OSD was last heard from,
/// IO statistics, what PG leaders reported of their scrubs. Not persisted (a new leader
/// learns it from the next heartbeats) and not under the commit lock: heartbeats record
/// into it while a commit waits on etcd, so that a slow commit never makes a live OSD look
/// silent to the liveness ticker. A `std` mutex, locked for a few statements and never
/// across an await.
pub struct Book {
    /// The leadership this bookkeeping belongs to; `None` while following.
    fence: Option<Fence>,
    pub liveness: Liveness,
    pub stats: IoStats,
    pub scrubs: ScrubStats,
}

impl Book {
    fn idle(config: LivenessConfig) -> Self {
        Book {
            fence: None,
            liveness: Liveness::new(config),
            stats: IoStats::default(),
            scrubs: ScrubStats::default(),
        }
    }

    /// The bookkeeping of a new leadership: every OSD up in `state` gets a fresh grace
    /// period from `now_ms`.
    fn leading(fence: Fence, config: LivenessConfig, state: &MonState, now_ms: u64) -> Self {
        let mut book = Book::idle(config);
        book.fence = Some(fence);
        for osd in state.map.osds.values().filter(|o| o.up) {
            book.liveness.heartbeat(osd.id, now_ms);
        }
        book
    }
}

/// The state last committed or loaded, for readers: they take it without waiting for the
/// commit in progress, and see what was published.
struct View {
    fence: Fence,
    state: Arc<MonState>,
}

/// How this monitor sets up authentication if it creates the cluster (etcd holds no auth
/// config yet). Ignored once the cluster has one.
#[derive(Clone, Debug)]
pub struct AuthBootstrap {
    pub mode: AuthMode,
    /// Where `client.admin`'s key is written (or read from, if the file already holds one).
    /// `None` in mode `none`: no admin key is made.
    pub keyring: Option<PathBuf>,
}

impl Default for AuthBootstrap {
    fn default() -> Self {
        AuthBootstrap {
            mode: AuthMode::None,
            keyring: None,
        }
    }
}

/// An epoch as the monitor published it, and when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Published {
    pub epoch: Epoch,
    pub at: std::time::Instant,
}

impl Published {
    pub fn new(epoch: Epoch) -> Self {
        Published {
            epoch,
            at: std::time::Instant::now(),
        }
    }
}

pub struct Monitor {
    pub me: MonMember,
    pub auth_bootstrap: AuthBootstrap,
    pub keys: Keyspace,
    pub client: etcd_client::Client,
    pub role: watch::Receiver<Role>,
    pub liveness_config: LivenessConfig,
    /// The commit lock: one operation at a time decides and persists.
    pub ctx: Mutex<Option<LeaderCtx>>,
    /// Leader-only bookkeeping, apart from the commit lock ([`Book`]).
    book: std::sync::Mutex<Book>,
    /// What readers see; set by the loads and commits under `ctx`.
    view: std::sync::RwLock<Option<View>>,
    /// The published epoch and when it was published: long-polls wait on it, and their
    /// answers are timed from it (`fastblock_mon_map_wait_answer_seconds`).
    pub epoch: watch::Sender<Published>,
    /// How long a snapshot may stay `creating` before it is aborted
    /// (`--snap-create-timeout-ms`).
    pub snap_create_timeout_ms: u64,
    /// PG replicas per OSD a new pool may bring an OSD to (`--max-pg-per-osd`, settable at
    /// runtime; `fastblock_mon_core::pg_per_osd`).
    pub pg_per_osd_max: Arc<std::sync::atomic::AtomicU32>,
    /// etcd's upkeep (compaction, defragmentation, alarms), told of every commit.
    pub upkeep: Arc<EtcdUpkeep>,
    /// The recent epochs as deltas, while this monitor leads (`GET /v1/map?delta=1`). A lock
    /// of its own, not the state's: the answers are cut from it concurrently.
    pub map_log: std::sync::RwLock<Option<MapLog>>,
    /// Operations per etcd transaction of a large commit (`crate::txn_limits`): more on the
    /// monitor's own member, whose limit it sets.
    pub txn_ops_max: usize,
    /// Seconds each operation took to decide (the state copied, `mon-core`'s decision, its
    /// check against the state before): placement's time is in the decisions that place (a
    /// pool's creation, an OSD out or in). Exported as `fastblock_mon_decide_seconds`.
    pub decide_seconds: prometheus_client::metrics::histogram::Histogram,
    started: Instant,
}

fn no_leader() -> ApiError {
    ApiError::new(ErrorCode::NoLeader, "this monitor is not the leader; retry")
}

fn unavailable(e: impl std::fmt::Display) -> ApiError {
    ApiError::new(ErrorCode::Unavailable, format!("etcd unavailable: {e}"))
}

/// A failed etcd write as the caller sees it: out of space (etcd's `NOSPACE` alarm refuses
/// every write until room is made) is said as such, anything else is `unavailable`.
fn write_failed(e: etcd_client::Error) -> ApiError {
    let text = e.to_string();
    if text.contains("database space exceeded") {
        return ApiError::new(
            ErrorCode::MonStoreFull,
            "the monitors' etcd is out of space (NOSPACE): no change can be made until room \
             is made; `fastblock-client health` says how that stands (MON_ETCD_NOSPACE)",
        );
    }
    unavailable(text)
}

impl Monitor {
    /// The current `max_pg_per_osd`.
    pub fn pg_per_osd_max(&self) -> u32 {
        self.pg_per_osd_max
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn new(
        me: MonMember,
        keys: Keyspace,
        client: etcd_client::Client,
        role: watch::Receiver<Role>,
        liveness_config: LivenessConfig,
        upkeep: Arc<EtcdUpkeep>,
    ) -> Self {
        Monitor {
            me,
            auth_bootstrap: AuthBootstrap::default(),
            keys,
            client,
            role,
            liveness_config,
            ctx: Mutex::new(None),
            book: std::sync::Mutex::new(Book::idle(liveness_config)),
            view: std::sync::RwLock::new(None),
            epoch: watch::channel(Published::new(Epoch(0))).0,
            snap_create_timeout_ms: fastblock_types::api::SNAP_CREATE_TIMEOUT_MS_DEFAULT,
            pg_per_osd_max: Arc::new(std::sync::atomic::AtomicU32::new(
                fastblock_mon_core::limits::PG_PER_OSD_MAX_DEFAULT,
            )),
            upkeep,
            map_log: std::sync::RwLock::new(None),
            txn_ops_max: crate::txn_limits::TXN_OPS_MAX,
            // 0.1 ms to 12.8 s in steps of 1.5x.
            decide_seconds: prometheus_client::metrics::histogram::Histogram::new(
                prometheus_client::metrics::histogram::exponential_buckets(0.0001, 1.5, 30),
            ),
            started: Instant::now(),
        }
    }

    /// Milliseconds on this process's monotonic clock.
    pub fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Milliseconds since the Unix epoch on this host's clock: what snapshot records carry
    /// (`SnapInfo::started_at_ms`), because a monitor that takes over must be able to judge
    /// the age of a snapshot another monitor recorded, which no process-local clock allows.
    pub fn unix_ms(&self) -> u64 {
        unix_now_ms()
    }

    /// The epoch of the last committed change (what an answer should report).
    pub fn published_epoch(&self) -> Epoch {
        self.epoch.borrow().epoch
    }

    pub fn is_leader(&self) -> bool {
        matches!(*self.role.borrow(), Role::Leader { .. })
    }

    /// The leader's bookkeeping, locked: hold the guard for a few statements only.
    pub fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        // A panic while holding it leaves counters and times, each valid on its own.
        self.book
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn set_view(&self, view: Option<View>) {
        *self.view.write().unwrap_or_else(|p| p.into_inner()) = view;
    }

    /// The state readers see: the last one committed or loaded in the current leadership,
    /// without waiting for a commit in progress; loaded first if there is none yet.
    async fn current_state(&self) -> OpResult<Arc<MonState>> {
        let fence = match &*self.role.borrow() {
            Role::Leader { fence } => Some(*fence),
            Role::Follower { .. } => None,
        };
        if let Some(fence) = fence {
            let view = self.view.read().unwrap_or_else(|p| p.into_inner());
            if let Some(v) = view.as_ref().filter(|v| v.fence == fence) {
                return Ok(v.state.clone());
            }
        }
        let guard = self.leader_ctx().await?;
        let ctx = guard.as_ref().ok_or_else(no_leader)?;
        Ok(ctx.snapshot.state.clone())
    }

    fn store(&self) -> EtcdStore {
        EtcdStore::new(self.client.clone(), self.keys.clone()).with_txn_ops_max(self.txn_ops_max)
    }

    /// Makes sure the context matches the role: load the state on becoming leader, drop it on
    /// losing the leadership. Returns the locked context.
    pub async fn leader_ctx(&self) -> OpResult<tokio::sync::MutexGuard<'_, Option<LeaderCtx>>> {
        let role = self.role.borrow().clone();
        let mut guard = self.ctx.lock().await;
        match role {
            Role::Follower { .. } => {
                *guard = None;
                *self.map_log.write().expect("map log lock") = None;
                self.set_view(None);
                *self.book() = Book::idle(self.liveness_config);
                Err(no_leader())
            }
            Role::Leader { fence } => {
                // A commit dropped while it waited leaves its snapshot in doubt: reloaded.
                if guard
                    .as_ref()
                    .is_some_and(|c| c.fence == fence && !c.snapshot.in_doubt)
                {
                    return Ok(guard);
                }
                let mut snapshot = self.store().load().await.map_err(|e| match e {
                    LoadError::Etcd(e) => unavailable(e),
                    other => ApiError::new(ErrorCode::Internal, other.to_string()),
                })?;
                if !snapshot.state.auth.configured {
                    self.bootstrap_auth(fence, &mut snapshot).await?;
                }
                if !snapshot.clear_entities.is_empty() {
                    self.reseal_clear_entities(fence, &mut snapshot).await;
                }
                {
                    // A reload within a leadership (after a conflict) keeps what heartbeats
                    // told; a new leadership starts afresh, every OSD with a grace period.
                    let mut book = self.book();
                    if book.fence != Some(fence) {
                        let now = self.now_ms();
                        *book = Book::leading(fence, self.liveness_config, &snapshot.state, now);
                    }
                }
                tracing::info!(epoch = %snapshot.state.map.epoch, "leading; state loaded");
                // A reload within a leadership keeps the daemons on deltas (`MapLog::resume`);
                // losing the leadership dropped the log (`Role::Follower` above).
                {
                    let mut log = self.map_log.write().expect("map log lock");
                    let map = Arc::new(snapshot.state.map.clone());
                    *log = Some(MapLog::resume(log.take(), map));
                }
                self.set_view(Some(View {
                    fence,
                    state: snapshot.state.clone(),
                }));
                self.epoch
                    .send_replace(Published::new(snapshot.state.map.epoch));
                *guard = Some(LeaderCtx { fence, snapshot });
                Ok(guard)
            }
        }
    }

    /// Sets up authentication in a cluster that has none (this monitor creates it): the mode
    /// from `--auth-mode`, and `client.admin` with the key from the keyring file if it holds
    /// one, else a new key written there first (mode 0600). Writing before committing means
    /// a crash in between leaves a keyring the next attempt reuses, never a table whose admin
    /// key nobody holds.
    async fn bootstrap_auth(&self, fence: Fence, snapshot: &mut Snapshot) -> OpResult<()> {
        let boot = &self.auth_bootstrap;
        let admin_key = match &boot.keyring {
            Some(path) => Some(admin_key_in(path)?),
            None if boot.mode.authenticates() => {
                return Err(ApiError::new(
                    ErrorCode::Internal,
                    format!(
                        "creating the cluster in auth mode {} needs --keyring",
                        boot.mode
                    ),
                ))
            }
            None => None,
        };
        let mut next = MonState::clone(&snapshot.state);
        next.auth_bootstrap(boot.mode, admin_key)?;
        next.finish(&snapshot.state);
        match self.store().commit(fence, snapshot, next).await {
            Ok(written) => {
                if let Some(w) = written {
                    self.upkeep.record_commit(fence, &w);
                }
                tracing::info!(mode = %boot.mode, keyring = ?boot.keyring, "authentication set up");
                Ok(())
            }
            Err(CommitError::Etcd(e)) => Err(write_failed(e)),
            Err(CommitError::Conflict) => Err(ApiError::new(
                ErrorCode::Conflict,
                "another monitor is setting up authentication; retry",
            )),
            Err(e @ CommitError::Seal(_)) => Err(ApiError::new(ErrorCode::Internal, e.to_string())),
        }
    }

    /// Rewrites sealed the key table entries etcd holds in clear (written by a monitor
    /// before the seal, `crate::key_seal`), once this monitor leads. A failure only warns:
    /// the entries stay in `clear_entities`, so the next commit writes them.
    async fn reseal_clear_entities(&self, fence: Fence, snapshot: &mut Snapshot) {
        let count = snapshot.clear_entities.len();
        let same = MonState::clone(&snapshot.state);
        match self.store().commit(fence, snapshot, same).await {
            Ok(written) => {
                if let Some(w) = written {
                    self.upkeep.record_commit(fence, &w);
                }
                tracing::warn!(count, "key table entries stored in clear rewritten sealed");
            }
            Err(e) => tracing::warn!(
                count, error = %e,
                "could not rewrite sealed the key table entries stored in clear; the next \
                 commit will"
            ),
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
            let mut side = LeaderSide {
                now_ms: self.now_ms(),
                unix_ms: self.unix_ms(),
                book: &self.book,
            };
            let before: &MonState = &ctx.snapshot.state;
            let deciding = std::time::Instant::now();
            let decided = crate::cpu::heavy(|| {
                let mut next = before.clone();
                let out = op(&mut next, &mut side)?;
                let changed = next.finish(before);
                Ok::<_, ApiError>((next, out, changed))
            });
            self.decide_seconds
                .observe(deciding.elapsed().as_secs_f64());
            let (next, out, changed) = decided?;
            if !changed {
                return Ok(out);
            }
            let epoch = next.map.epoch;
            match self
                .store()
                .commit(ctx.fence, &mut ctx.snapshot, next)
                .await
            {
                Ok(written) => {
                    if let Some(w) = written {
                        if w.transactions > 1 {
                            tracing::info!(
                                epoch = %epoch,
                                transactions = w.transactions,
                                bytes = w.bytes,
                                "a large commit went in several etcd transactions"
                            );
                        }
                        self.upkeep.record_commit(ctx.fence, &w);
                    }
                    self.record_map(&ctx.snapshot.state.map);
                    self.set_view(Some(View {
                        fence: ctx.fence,
                        state: ctx.snapshot.state.clone(),
                    }));
                    self.epoch.send_replace(Published::new(epoch));
                    return Ok(out);
                }
                Err(CommitError::Etcd(e)) => {
                    let e = write_failed(e);
                    // The outcome is unknown: reload before the next operation. Out of space
                    // is known: etcd refused the transaction, and the snapshot is unchanged
                    // (reloading on every refused call would only load etcd further).
                    if e.code != ErrorCode::MonStoreFull {
                        *guard = None;
                    }
                    return Err(e);
                }
                Err(e @ CommitError::Seal(_)) => {
                    return Err(ApiError::new(ErrorCode::Internal, e.to_string()));
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

    /// Adds a committed map to the log of deltas, before its epoch is published (so that a
    /// holder woken by the epoch finds its delta). A map whose epoch did not move is not new.
    fn record_map(&self, map: &fastblock_types::map::ClusterMap) {
        let mut log = self.map_log.write().expect("map log lock");
        if let Some(log) = log.as_mut() {
            if map.epoch > log.current().epoch {
                log.push(Arc::new(map.clone()));
            }
        }
    }

    /// Reads the last published state, without waiting for a commit in progress.
    pub async fn read<T>(&self, f: impl FnOnce(&MonState) -> T) -> OpResult<T> {
        let state = self.current_state().await?;
        Ok(f(&state))
    }

    /// Reads the last published state and the leader's bookkeeping beside it (locked while
    /// `f` runs: keep it short).
    pub async fn read_with_book<T>(&self, f: impl FnOnce(&MonState, &Book) -> T) -> OpResult<T> {
        let state = self.current_state().await?;
        let book = self.book();
        Ok(f(&state, &book))
    }

    /// Reads the last published state and changes only the leader's bookkeeping beside it
    /// (liveness, IO statistics, scrub reports): no copy of the state, no commit, no epoch,
    /// and no wait for a commit in progress (a heartbeat is recorded when it arrives).
    pub async fn observe<T>(
        &self,
        f: impl FnOnce(&MonState, &mut LeaderSide) -> OpResult<T>,
    ) -> OpResult<T> {
        let state = self.current_state().await?;
        let mut side = LeaderSide {
            now_ms: self.now_ms(),
            unix_ms: self.unix_ms(),
            book: &self.book,
        };
        f(&state, &mut side)
    }

    /// Turns heartbeat silence into down/up/out every `interval`, while leading, and aborts
    /// snapshots still `creating` after `snap_create_timeout_ms`.
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
            let timeout_ms = self.snap_create_timeout_ms;
            let result = self
                .apply(|state, side| {
                    let events = side.book().liveness.tick(state, side.now_ms);
                    state.apply_liveness(&events)?;
                    let aborted = state.tick_snaps(side.unix_ms, timeout_ms);
                    Ok((events, aborted))
                })
                .await;
            match result {
                Ok((events, aborted)) => {
                    for e in events {
                        tracing::info!(?e, "osd liveness change");
                    }
                    for snap in aborted {
                        tracing::warn!(
                            image = %snap.image,
                            snap = %snap.id,
                            name = %snap.name,
                            confirmed_pgs = ?snap.done_pgs,
                            "snapshot still creating after {timeout_ms} ms: aborted"
                        );
                    }
                }
                Err(e) if e.code == ErrorCode::NoLeader => {}
                Err(e) => tracing::warn!("liveness tick: {e}"),
            }
        }
    }
}

/// What an operation may use besides the persisted state: the time, and the leader's
/// bookkeeping ([`Book`]).
pub struct LeaderSide<'a> {
    pub now_ms: u64,
    /// [`Monitor::unix_ms`] when the operation started.
    pub unix_ms: u64,
    book: &'a std::sync::Mutex<Book>,
}

impl LeaderSide<'_> {
    /// The bookkeeping, locked until the guard drops. Operations run with heartbeats
    /// recording beside them: lock it for a statement or two, never around work on the
    /// whole state.
    pub fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// `client.admin`'s key from the keyring at `path`, or a new one added to it (the file is
/// created with mode 0600 if missing; other entries in it are kept).
fn admin_key_in(path: &Path) -> OpResult<Secret> {
    let fail = |e: fastblock_auth::AuthError| {
        ApiError::new(ErrorCode::Internal, format!("setting up client.admin: {e}"))
    };
    let mut ring = if path.exists() {
        Keyring::load(path).map_err(fail)?
    } else {
        Keyring::default()
    };
    if let Some(e) = ring.get(&EntityName::admin()) {
        return Ok(e.key.clone());
    }
    let key = Secret::generate().map_err(fail)?;
    ring.entries.insert(
        EntityName::admin(),
        KeyringEntry {
            key: key.clone(),
            caps: Some(Caps::admin()),
        },
    );
    ring.save(path).map_err(fail)?;
    Ok(key)
}

/// Milliseconds since the Unix epoch on this host's clock.
pub fn unix_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

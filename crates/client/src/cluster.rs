//! [`Cluster`]: the state one client process shares between all its images: the map cache, the
//! leader cache, the connection pool, the in-flight semaphore and the background map watch.

use crate::config::ClientConfig;
use crate::conn::ConnPool;
use crate::image::Image;
use crate::map_cache::MapCache;
use crate::ClientError;
use fastblock_monclient::{MonClient, MonError};
use fastblock_types::api::{ErrorCode, MapResponse};
use fastblock_types::map::{ClusterMap, ImageFence, ImageInfo};
use fastblock_types::map_delta::{MapFollower, MapScope};
use fastblock_types::{Epoch, OsdId, PgId, PoolId};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

/// Pause after a failed map watch before the next one (the monitor client already retried).
const WATCH_RETRY_PAUSE: Duration = Duration::from_secs(1);
/// Pause between map refreshes while waiting for a map that shows an image just opened.
const MAP_BEHIND_PAUSE: Duration = Duration::from_millis(50);

/// Counters of what the client did, for benchmarks and operators.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Object requests started.
    pub object_requests: u64,
    /// Attempts after the first, over all object requests.
    pub retries: u64,
    /// `NotLeader` hints followed.
    pub redirects: u64,
    /// New TCP connections to OSDs.
    pub connects: u64,
    /// Maps installed after the first (watch and on-demand refreshes).
    pub map_updates: u64,
    /// Object requests that ended in `ClientError::Timeout`.
    pub timeouts: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub object_requests: AtomicU64,
    pub retries: AtomicU64,
    pub redirects: AtomicU64,
    pub connects: AtomicU64,
    pub map_updates: AtomicU64,
    pub timeouts: AtomicU64,
}

impl Counters {
    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// A connected client. Cheap to share (`Arc`); images opened from it share its connections,
/// caches and in-flight limit. Dropping the last `Arc` stops the background map watch and
/// closes the connections.
pub struct Cluster {
    pub(crate) config: ClientConfig,
    /// `None` for a cluster built on an injected map ([`Cluster::with_map`]).
    mon: Option<Arc<MonClient>>,
    pub(crate) cache: MapCache,
    pub(crate) pool: ConnPool,
    pub(crate) inflight: Semaphore,
    /// Serialises on-demand map fetches: a burst of `StaleEpoch` replies costs one fetch.
    refresh_lock: tokio::sync::Mutex<()>,
    watcher: Mutex<Option<JoinHandle<()>>>,
    pub(crate) counters: Counters,
    /// Seeds the backoff jitter of each object request (distinct per request).
    pub(crate) backoff_seed: AtomicU64,
    /// For tasks spawned by `&self` methods (background map refreshes).
    me: Weak<Cluster>,
    /// What of the map this client follows (the PG maps of the pools of the images it opened)
    /// and the epoch it has, with a generation that rises at every change of scope, so that an
    /// answer to a request made for an older scope is not taken.
    follower: Mutex<(MapFollower, u64)>,
}

fn lock_follower(m: &Mutex<(MapFollower, u64)>) -> std::sync::MutexGuard<'_, (MapFollower, u64)> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Cluster {
    /// Connects to the monitors, fetches the map and starts the background map watch. Must be
    /// called inside a tokio runtime; the returned handle's IO must run in the same runtime.
    pub async fn connect(config: ClientConfig) -> Result<Arc<Cluster>, ClientError> {
        config.validate()?;
        if config.monitors.is_empty() {
            return Err(ClientError::Config("no monitor endpoint given".to_string()));
        }
        let mut config = config;
        // The same key signs monitor calls and proves the client to OSDs. Unless given, it is
        // read from the keyring: the one configured, else the documented default
        // ($FASTBLOCK_KEYRING, else /etc/fastblock/keyring) if it exists; without one the
        // client can only use a cluster in auth mode none.
        if config.credentials.is_none() {
            let keyring = match &config.keyring {
                Some(p) => Some(p.clone()),
                None => Some(fastblock_auth::keyring::resolve_path(None)).filter(|p| p.exists()),
            };
            if let Some(path) = &keyring {
                let bad = |e: fastblock_auth::AuthError| ClientError::Config(e.to_string());
                let entity: fastblock_auth::EntityName = config.entity.parse().map_err(bad)?;
                config.credentials =
                    Some(crate::auth::load_credentials(path, &entity).map_err(bad)?);
            }
        }
        let mut mon = MonClient::new(config.monitors.clone()).with_deadline(config.op_deadline);
        if let Some((entity, key)) = config.credentials.clone() {
            mon = mon.with_credentials(entity, key);
        }
        let mon = mon.with_auth_floor(config.auth_floor);
        // The pools' records and every other section, but no PG map until an image of the
        // pool is opened (`Cluster::follow_pool`).
        let mut follower =
            MapFollower::new(MapScope::Pools(BTreeSet::new())).with_auth_floor(mon.auth_floor());
        let response = mon
            .map_update(follower.epoch(), follower.scope(), Duration::ZERO)
            .await?;
        let map = match follower.apply(response.into_update()) {
            Ok(Some(map)) => (*map).clone(),
            Err(refused @ fastblock_types::map_delta::MapRefused::BelowFloor { .. }) => {
                return Err(ClientError::Config(refused.to_string()))
            }
            _ => {
                return Err(ClientError::Protocol(
                    "the monitor answered a map fetch without a map".to_string(),
                ))
            }
        };
        let cluster = Cluster::build(config, Some(Arc::new(mon)), map);
        *lock_follower(&cluster.follower) = (follower, 0);
        cluster.start_watch();
        Ok(cluster)
    }

    /// A client over a fixed, injected map and no monitor: for tests with fake or real OSDs
    /// whose map the test builds. [`Cluster::set_map`] installs newer maps; map refreshes
    /// (on `StaleEpoch`, unknown leaders) do nothing.
    pub fn with_map(map: ClusterMap, config: ClientConfig) -> Result<Arc<Cluster>, ClientError> {
        config.validate()?;
        Ok(Cluster::build(config, None, map))
    }

    fn build(config: ClientConfig, mon: Option<Arc<MonClient>>, map: ClusterMap) -> Arc<Cluster> {
        // Tickets come from the monitor; a client over an injected map is given its tickets
        // (`Cluster::tickets`).
        let tickets = match (&mon, &config.credentials) {
            (Some(mon), _) => crate::tickets::Tickets::from_monitor(mon.clone()),
            (None, Some((entity, _))) => Some(crate::tickets::Tickets::given(entity.clone())),
            (None, None) => None,
        };
        Arc::new_cyclic(|me| Cluster {
            pool: ConnPool::new(config.connect_timeout, tickets),
            inflight: Semaphore::new(config.inflight_ops_max),
            config,
            mon,
            cache: MapCache::new(map),
            refresh_lock: tokio::sync::Mutex::new(()),
            watcher: Mutex::new(None),
            counters: Counters::default(),
            backoff_seed: AtomicU64::new(0x9e37_79b9_7f4a_7c15),
            me: me.clone(),
            follower: Mutex::new((MapFollower::new(MapScope::All), 0)),
        })
    }

    /// Makes sure the map this client follows has `pool`'s PG map: adds the pool to what it
    /// follows and fetches the map anew if it did not. No-op without a monitor (an injected
    /// map has what the test put in it).
    pub(crate) async fn follow_pool(&self, pool: PoolId) {
        if self.mon.is_none() {
            return;
        }
        {
            let mut f = lock_follower(&self.follower);
            let scope = match f.0.scope() {
                MapScope::All => return,
                MapScope::Pools(p) if p.contains(&pool) => return,
                MapScope::Pools(p) => {
                    let mut p = p.clone();
                    p.insert(pool);
                    MapScope::Pools(p)
                }
                MapScope::Osd(_) => unreachable!("a client never follows an OSD's scope"),
            };
            f.0.set_scope(scope);
            f.1 += 1;
        }
        let _ = self.fetch_update(Duration::ZERO).await;
    }

    /// One round of following the map: asks for what changed since the epoch held (waiting up
    /// to `wait` for a newer one), and installs it. Returns whether a map was installed, or
    /// `Err` if the monitor could not be asked.
    async fn fetch_update(&self, wait: Duration) -> Result<bool, ()> {
        let Some(mon) = &self.mon else {
            return Ok(false);
        };
        let (have, scope, generation) = self.follow_point();
        match mon.map_update(have, &scope, wait).await {
            Ok(response) => Ok(self.take_update(response, generation).unwrap_or(false)),
            Err(e) => {
                tracing::warn!(epoch = %have, "cluster map fetch failed: {e}");
                Err(())
            }
        }
    }

    /// The epoch held, the scope followed and its generation: what to ask the monitor for.
    fn follow_point(&self) -> (Epoch, MapScope, u64) {
        let f = lock_follower(&self.follower);
        (f.0.epoch(), f.0.scope().clone(), f.1)
    }

    /// Takes the monitor's answer to a request made at scope generation `generation`, and
    /// installs the map it makes. Returns whether a map was installed, or the refusal of a map
    /// below this client's auth floor (logged; the caller pauses before asking again, as the
    /// monitor would answer at once).
    fn take_update(
        &self,
        response: MapResponse,
        generation: u64,
    ) -> Result<bool, fastblock_types::map_delta::MapRefused> {
        let map = {
            let mut f = lock_follower(&self.follower);
            if f.1 != generation {
                // The scope changed meanwhile: this answer is for the old one.
                return Ok(false);
            }
            match f.0.apply(response.into_update()) {
                Ok(map) => map,
                Err(gap @ fastblock_types::map_delta::MapRefused::Gap(_)) => {
                    tracing::debug!("cluster map: {gap}; fetching the whole map");
                    None
                }
                Err(refused) => {
                    tracing::error!("cluster map: {refused}");
                    return Err(refused);
                }
            }
        };
        let Some(map) = map else { return Ok(false) };
        // A wider scope can come at the same epoch: replaced, not only installed when newer.
        let done = self.cache.replace((*map).clone());
        if done {
            Counters::bump(&self.counters.map_updates);
        }
        Ok(done)
    }

    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// The monitor client, to create or list images (absent for [`Cluster::with_map`]).
    pub fn monitor(&self) -> Option<&MonClient> {
        self.mon.as_deref()
    }

    /// Whether an OSD's refusal of this client's handshake (`status`) may pass with a new
    /// ticket: the ticket presented was sealed under a key the OSD no longer has (its key was
    /// rotated since), and the refused handshake dropped it. The monitor is asked (a signed
    /// call, with the same key): while it accepts the key, the refusal is retried like any
    /// retryable error, with a ticket fetched anew; once it does not (the key was removed, or
    /// is wrong) or cannot be asked, the refusal is final.
    pub(crate) async fn refusal_may_pass(&self, status: Option<fastblock_wire::Status>) -> bool {
        if status != Some(fastblock_wire::Status::AuthFailed) {
            return false;
        }
        match &self.mon {
            Some(mon) => mon.map().await.is_ok(),
            None => false,
        }
    }

    /// The tickets this client holds for OSDs (`None` without a key). A client over an
    /// injected map gets none from a monitor: give them with [`crate::tickets::Tickets::insert`].
    pub fn tickets(&self) -> Option<&Arc<crate::tickets::Tickets>> {
        self.pool.tickets()
    }

    /// The newest map this client has.
    pub fn map(&self) -> Arc<ClusterMap> {
        self.cache.map()
    }

    pub fn epoch(&self) -> Epoch {
        self.cache.epoch()
    }

    /// Installs `map` if it is newer than the current one (tests; the watch does this
    /// otherwise). Returns whether it was installed.
    pub fn set_map(&self, map: ClusterMap) -> bool {
        let installed = self.cache.install(map);
        if installed {
            Counters::bump(&self.counters.map_updates);
        }
        installed
    }

    /// The leader this client has cached for `pg`, if any.
    pub fn cached_leader(&self, pg: PgId) -> Option<OsdId> {
        self.cache.leader(pg).map(|t| t.osd)
    }

    /// Finds `pg`'s leader now (cache, else `GetLeader` to the PG's members), retrying until
    /// the deadline like an IO would. For tests and tools ("which OSD do I stop?").
    pub async fn leader_of(&self, pg: PgId) -> Result<OsdId, ClientError> {
        let deadline = tokio::time::Instant::now() + self.config.op_deadline;
        let mut last;
        loop {
            match self.leader_target(pg, self.config.attempt_timeout).await {
                Ok(target) => return Ok(target.osd),
                Err(crate::leader::NoLeader::Final(e)) => return Err(e),
                Err(crate::leader::NoLeader::Retry(why)) => last = why,
            }
            if tokio::time::Instant::now() + crate::policy::BACKOFF_MAX >= deadline {
                return Err(ClientError::Timeout {
                    pg,
                    deadline: self.config.op_deadline,
                    last,
                });
            }
            tokio::time::sleep(crate::policy::BACKOFF_MAX).await;
        }
    }

    pub fn stats(&self) -> ClientStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ClientStats {
            object_requests: get(&c.object_requests),
            retries: get(&c.retries),
            redirects: get(&c.redirects),
            connects: get(&c.connects),
            map_updates: get(&c.map_updates),
            timeouts: get(&c.timeouts),
        }
    }

    /// Opens an image by pool and name (asks the monitor).
    pub async fn open_image(
        self: &Arc<Self>,
        pool: &str,
        name: &str,
    ) -> Result<Image, ClientError> {
        let Some(mon) = &self.mon else {
            return Err(ClientError::Config(
                "open_image needs a monitor; use open_image_info with an injected map".into(),
            ));
        };
        let info = match mon.image(pool, name).await {
            Ok(info) => info,
            Err(MonError::Api(e)) if e.code == ErrorCode::ImageNotFound => {
                return Err(ClientError::ImageNotFound {
                    pool: pool.to_string(),
                    name: name.to_string(),
                })
            }
            Err(MonError::Api(e)) if e.code == ErrorCode::PoolNotFound => {
                return Err(ClientError::PoolNotFound(pool.to_string()))
            }
            Err(e) => return Err(e.into()),
        };
        self.open_image_info(info).await
    }

    /// Opens snapshot `snap` of `pool/name`, read-only (see [`Image::snapshot_view`]); it
    /// must be complete (`created`).
    pub async fn open_snapshot(
        self: &Arc<Self>,
        pool: &str,
        name: &str,
        snap: &str,
    ) -> Result<Image, ClientError> {
        let image = self.open_image(pool, name).await?;
        let mon = self.mon.as_ref().expect("open_image needs the monitor too");
        let snaps = mon.snaps(pool, name).await?;
        let Some(info) = snaps
            .into_iter()
            .find(|s| s.name == snap && s.state == fastblock_types::map::SnapState::Created)
        else {
            return Err(ClientError::SnapNotFound {
                pool: pool.to_string(),
                name: name.to_string(),
                snap: snap.to_string(),
            });
        };
        let view = crate::SnapView {
            id: info.id.0,
            name: info.name,
        };
        // A snapshot of a clone reads what the clone had not copied up then from the same
        // parent, within the overlap of that moment.
        Ok(match info.parent_overlap_bytes {
            Some(overlap) if image.is_clone() => {
                image.clone_snapshot_view(view, info.size_bytes, overlap)
            }
            _ => image.snapshot_view(view, info.size_bytes),
        })
    }

    /// Opens an image whose description the caller already has (tests with an injected map;
    /// a frontend that listed images). The image's pool must be in the map (after one
    /// refresh, for a pool created a moment ago).
    pub async fn open_image_info(self: &Arc<Self>, info: ImageInfo) -> Result<Image, ClientError> {
        self.follow_pool(info.pool).await;
        if !self.map().pools.contains_key(&info.pool) {
            self.refresh_map("image's pool is not in the map").await;
        }
        self.await_image_in_map(&info).await?;
        let map = self.map();
        let Some(pool) = map.pools.get(&info.pool) else {
            return Err(ClientError::PoolNotFound(info.pool_name.clone()));
        };
        let parent = info.parent.clone();
        let image = Image::new(self.clone(), info, pool.pg_count)?;
        let Some(p) = parent else {
            return Ok(image);
        };
        // A clone: its parent snapshot, read-only, whole (the clone's snapshots may read
        // more of it than the head's overlap now covers), itself reading through to its own
        // parent if it is a snapshot of a clone.
        let parent_view =
            Box::pin(self.open_snapshot(&p.pool_name, &p.image_name, &p.snap_name)).await?;
        if parent_view.snapshot().map(|s| s.id) != Some(p.snap.0) {
            return Err(ClientError::Protocol(format!(
                "clone {}/{}: its parent {}/{}@{} has another id than the clone's record",
                image.info().pool_name,
                image.info().name,
                p.pool_name,
                p.image_name,
                p.snap_name
            )));
        }
        Ok(image.with_parent(parent_view, p.overlap_bytes))
    }

    /// Waits until this client's map shows the image at its whole size, refreshing it from
    /// the monitor. Every request carries the epoch of the client's map, and an OSD whose
    /// map is as old as the request's cannot tell an image created (or grown) a moment ago
    /// from one that never existed: it answers `NoSuchImage` (`OutOfRange`) where a newer
    /// request epoch gets `StaleEpoch`, "retry once I have the map". The monitor derives the
    /// map in the same operation that creates or resizes the image, so one refresh usually
    /// suffices; a monitor that answers from behind is retried until the op deadline.
    async fn await_image_in_map(&self, info: &ImageInfo) -> Result<(), ClientError> {
        let deadline = tokio::time::Instant::now() + self.config.op_deadline;
        let mut record_checked = false;
        let mut refreshed = false;
        loop {
            let map = self.map();
            match image_in_map(&map, info) {
                ImageFence::Allowed => return Ok(()),
                ImageFence::Removed => {
                    return Err(ClientError::ImageNotFound {
                        pool: info.pool_name.clone(),
                        name: info.name.clone(),
                    })
                }
                ImageFence::Unknown => {}
                // Smaller in the map than in `info`, even in a map just fetched: the map is
                // behind a grow, or `info` is older than a shrink. The monitor's record tells
                // which (once: a shrunk image does not grow back by waiting).
                ImageFence::BeyondSize { .. } if refreshed && !record_checked => {
                    record_checked = true;
                    if let Some(now) = self.shrunk_since(info).await {
                        return Err(ClientError::ImageResized {
                            pool: info.pool_name.clone(),
                            name: info.name.clone(),
                            size_bytes: now,
                            opened_bytes: info.size_bytes,
                        });
                    }
                }
                ImageFence::BeyondSize { .. } => {}
            }
            // An injected map (no monitor) changes only through `set_map`: nothing to wait for.
            let waited = match self.mon {
                Some(_) => self.config.op_deadline,
                None => Duration::ZERO,
            };
            if self.mon.is_none() || tokio::time::Instant::now() >= deadline {
                return Err(ClientError::MapBehind {
                    pool: info.pool_name.clone(),
                    name: info.name.clone(),
                    epoch: map.epoch,
                    deadline: waited,
                });
            }
            if refreshed {
                tokio::time::sleep(MAP_BEHIND_PAUSE).await;
            }
            self.refresh_map("an image newer than the map was opened")
                .await;
            refreshed = true;
        }
    }

    /// The image's size now, if the monitor's record of it is smaller than `info` says
    /// (it was shrunk after `info` was read). `None` when it is not, or when the monitor
    /// cannot say (the caller goes on waiting for the map).
    async fn shrunk_since(&self, info: &ImageInfo) -> Option<u64> {
        let mon = self.mon.as_ref()?;
        let timeout = self.config.attempt_timeout;
        let now = tokio::time::timeout(timeout, mon.image(&info.pool_name, &info.name))
            .await
            .ok()?
            .ok()?;
        (now.id == info.id && now.size_bytes < info.size_bytes).then_some(now.size_bytes)
    }

    /// Fetches the map from the monitor now, unless a newer map arrived since the caller
    /// noticed it needed one. No-op without a monitor. Failures are logged: the caller's
    /// retry loop goes on with the map it has.
    pub(crate) async fn refresh_map(&self, why: &str) {
        let Some(mon) = &self.mon else { return };
        let seen = self.cache.epoch();
        let _serialised = self.refresh_lock.lock().await;
        if self.cache.epoch() > seen {
            return;
        }
        tracing::debug!(epoch = %seen, "refreshing the cluster map: {why}");
        let _ = mon;
        if tokio::time::timeout(
            self.config.attempt_timeout,
            self.fetch_update(Duration::ZERO),
        )
        .await
        .is_err()
        {
            tracing::warn!("map refresh ({why}) timed out");
        }
    }

    /// Starts a map refresh without waiting for it (used where the request can go on with
    /// what it has, e.g. a leader hint naming an OSD the map does not know yet).
    pub(crate) fn spawn_refresh_map(&self, why: &'static str) {
        if self.mon.is_none() {
            return;
        }
        let Some(me) = self.me.upgrade() else { return };
        tokio::spawn(async move { me.refresh_map(why).await });
    }

    fn start_watch(self: &Arc<Self>) {
        let Some(mon) = self.mon.clone() else { return };
        let me = Arc::downgrade(self);
        let timeout = self.config.map_watch_timeout;
        let handle = tokio::spawn(watch_map_loop(me, mon, timeout));
        *self
            .watcher
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(handle);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let watcher = self
            .watcher
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(handle) = watcher.take() {
            handle.abort();
        }
    }
}

/// Whether `map` shows `info`'s image at its whole size: its last byte may be written. A
/// map without an image table (an injected one) fences nothing, so it shows every image.
fn image_in_map(map: &ClusterMap, info: &ImageInfo) -> ImageFence {
    let Some(table) = &map.images else {
        return ImageFence::Allowed;
    };
    let last_byte = info.size_bytes.saturating_sub(1);
    let object_bytes = info.object_size_bytes.max(1);
    table.check(
        info.id,
        last_byte / object_bytes,
        last_byte % object_bytes,
        info.size_bytes.min(1),
    )
}

/// Long-polls the monitor for what changed since the map held, forever (until the cluster
/// is dropped).
async fn watch_map_loop(me: Weak<Cluster>, mon: Arc<MonClient>, timeout: Duration) {
    loop {
        // The cluster is held only to read and to install, never across the long-poll: its
        // last user dropping it ends this task (`Drop` aborts it).
        let (have, scope, generation) = match me.upgrade() {
            Some(cluster) => cluster.follow_point(),
            None => return,
        };
        match mon.map_update(have, &scope, timeout).await {
            Ok(response) => {
                let Some(cluster) = me.upgrade() else { return };
                if cluster.take_update(response, generation).is_err() {
                    drop(cluster);
                    tokio::time::sleep(WATCH_RETRY_PAUSE).await;
                }
            }
            Err(e) => {
                tracing::warn!(epoch = %have, "cluster map watch failed: {e}");
                tokio::time::sleep(WATCH_RETRY_PAUSE).await;
            }
        }
    }
}

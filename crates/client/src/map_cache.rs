//! The client's view of the cluster: the newest map it has seen, and the PG → leader cache.
//!
//! Why std locks: every critical section is a few map operations with no `.await` inside, so
//! an async lock would only add cost. Poisoning is ignored on purpose (`into_inner`): no code
//! path panics half-way through an update, so the data is consistent either way.

use crate::route::{self, Target};
use fastblock_types::map::ClusterMap;
use fastblock_types::{Epoch, OsdId, PgId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use tokio::sync::watch;

pub(crate) struct MapCache {
    map: RwLock<Arc<ClusterMap>>,
    /// The leader last confirmed (by a `GetLeader` answer or a `NotLeader` hint) for each PG.
    /// Entries are removed when a request to that leader fails in a way that says it may no
    /// longer lead, and pruned or re-addressed when a new map arrives.
    leaders: Mutex<HashMap<PgId, Target>>,
    /// The epoch of the installed map, for requests in flight that wait for the map to move
    /// their PG's leader elsewhere (`leader_moved`).
    installed: watch::Sender<Epoch>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl MapCache {
    pub(crate) fn new(map: ClusterMap) -> Self {
        let (installed, _) = watch::channel(map.epoch);
        MapCache {
            map: RwLock::new(Arc::new(map)),
            leaders: Mutex::new(HashMap::new()),
            installed,
        }
    }

    /// The current map (a cheap snapshot: the map is replaced, never mutated in place).
    pub(crate) fn map(&self) -> Arc<ClusterMap> {
        self.map
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    pub(crate) fn epoch(&self) -> Epoch {
        self.map().epoch
    }

    /// Installs `map` if it is newer than the current one; returns whether it did. Cached
    /// leaders on OSDs the new map does not know or shows down are dropped, and the others
    /// take the map's address (an OSD may have restarted on another port).
    pub(crate) fn install(&self, map: ClusterMap) -> bool {
        self.install_if(map, |new, current| new > current)
    }

    /// Installs `map` unless it is older than the current one: a map of a wider scope (a pool
    /// added to what the client follows) can come at the same epoch.
    pub(crate) fn replace(&self, map: ClusterMap) -> bool {
        self.install_if(map, |new, current| new >= current)
    }

    fn install_if(&self, map: ClusterMap, newer: impl Fn(Epoch, Epoch) -> bool) -> bool {
        let map = Arc::new(map);
        {
            let mut current = self
                .map
                .write()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if !newer(map.epoch, current.epoch) {
                return false;
            }
            *current = map.clone();
        }
        self.installed.send_replace(map.epoch);
        let mut leaders = lock(&self.leaders);
        leaders.retain(|pg, target| {
            if !map.osds.get(&target.osd).is_some_and(|o| o.up) {
                return false;
            }
            match route::target_in_map(&map, target.osd, *pg) {
                Some(mut fresh) => {
                    // The later of the two leaderships the client knows of on this OSD: a
                    // hint may be newer than the map, or the map newer than the hint.
                    fresh.term = fresh.term.max(target.term);
                    *target = fresh;
                    true
                }
                None => false,
            }
        });
        tracing::debug!(epoch = %map.epoch, "installed cluster map");
        true
    }

    /// Resolves, with the reason, once an installed map says a request in flight to `osd`
    /// for `pg`, sent under map `sent`, should be sent again (`route::leader_moved`). Never
    /// resolves otherwise: the caller races it against the reply and the attempt's timeout.
    pub(crate) async fn leader_moved(&self, sent: &ClusterMap, pg: PgId, osd: OsdId) -> String {
        // Subscribe before looking, so a map installed in between is not missed.
        let mut installed = self.installed.subscribe();
        loop {
            if let Some(why) = route::leader_moved(sent, &self.map(), pg, osd) {
                return why;
            }
            if installed.changed().await.is_err() {
                // The sender lives as long as the cache, which outlives every request.
                std::future::pending::<()>().await;
            }
        }
    }

    pub(crate) fn leader(&self, pg: PgId) -> Option<Target> {
        lock(&self.leaders).get(&pg).cloned()
    }

    pub(crate) fn set_leader(&self, pg: PgId, target: Target) {
        lock(&self.leaders).insert(pg, target);
    }

    /// Forgets `pg`'s leader if it is still `osd` (a concurrent request may already have
    /// learned a newer leader, which must survive a late failure of the old one).
    pub(crate) fn forget_leader(&self, pg: PgId, osd: OsdId) {
        let mut leaders = lock(&self.leaders);
        if leaders.get(&pg).is_some_and(|t| t.osd == osd) {
            leaders.remove(&pg);
        }
    }
}

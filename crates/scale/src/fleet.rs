//! The simulated daemons of one run and the admin's view of the map: the OSDs (booted in
//! parallel, bounded), the clients, and an observer that follows the whole map as an admin
//! tool does, which is the harness's clock for events (the epoch at which the monitor made a
//! change, and when it was first published).

use crate::counters::MapCounters;
use crate::error::{Result, ScaleError};
use crate::follow::follow;
use crate::sim_osd::{ReportStats, SimOsd};
use fastblock_auth::{EntityName, Secret};
use fastblock_monclient::MonClient;
use fastblock_types::map::ClusterMap;
use fastblock_types::map_delta::MapScope;
use fastblock_types::{Epoch, PoolId};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

/// A simulated client: follows the PG maps of the pools it opened.
pub struct SimClient {
    pub counters: Arc<MapCounters>,
    task: JoinHandle<()>,
}

impl Drop for SimClient {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub struct Fleet {
    pub admin: Arc<MonClient>,
    pub osds: Vec<SimOsd>,
    pub clients: Vec<SimClient>,
    pub stats: Arc<ReportStats>,
    observer: watch::Receiver<Option<Arc<ClusterMap>>>,
    observer_counters: Arc<MapCounters>,
    observer_task: JoinHandle<()>,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.observer_task.abort();
    }
}

/// How often a wait on the daemons' epochs looks again.
const POLL: Duration = Duration::from_millis(20);

impl Fleet {
    pub fn new(api: &str, admin_key: Secret) -> Fleet {
        let admin = Arc::new(
            MonClient::new(vec![api.to_string()])
                .with_credentials(EntityName::admin(), admin_key)
                .with_auth_floor(None)
                .with_deadline(Duration::from_secs(60)),
        );
        let (tx, rx) = watch::channel(None);
        let observer_counters = Arc::new(MapCounters::default());
        let observer_task = tokio::spawn(follow(
            admin.clone(),
            MapScope::All,
            observer_counters.clone(),
            tx,
        ));
        Fleet {
            admin,
            osds: Vec::new(),
            clients: Vec::new(),
            stats: Arc::new(ReportStats::default()),
            observer: rx,
            observer_counters,
            observer_task,
        }
    }

    /// Registers and boots `hosts.len()` new OSDs, `concurrency` at a time, the i-th on host
    /// `hosts[i]`. They are appended to `osds` in id order.
    pub async fn add_osds(&mut self, hosts: Vec<String>, concurrency: usize) -> Result<()> {
        let mut set: JoinSet<Result<SimOsd>> = JoinSet::new();
        let mut hosts = hosts.into_iter();
        let mut booted = Vec::new();
        loop {
            while set.len() < concurrency {
                let Some(host) = hosts.next() else { break };
                let (admin, stats) = (self.admin.clone(), self.stats.clone());
                set.spawn(async move {
                    let mut osd = SimOsd::register(&admin, host, stats).await?;
                    osd.boot().await?;
                    Ok(osd)
                });
            }
            match set.join_next().await {
                Some(Ok(r)) => booted.push(r?),
                Some(Err(e)) => {
                    return Err(ScaleError::io(
                        "a simulated OSD's boot task",
                        std::io::Error::other(e.to_string()),
                    ))
                }
                None => break,
            }
        }
        booted.sort_by_key(|o| o.id);
        self.osds.extend(booted);
        Ok(())
    }

    /// Starts `n` clients following `pools`. They sign as client.admin and share its
    /// connections: what is measured is the map they are sent, not the key they hold.
    pub fn add_clients(&mut self, n: u32, pools: BTreeSet<PoolId>) {
        for _ in 0..n {
            let counters = Arc::new(MapCounters::default());
            let (tx, _rx) = watch::channel(None);
            let task = tokio::spawn(follow(
                self.admin.clone(),
                MapScope::Pools(pools.clone()),
                counters.clone(),
                tx,
            ));
            self.clients.push(SimClient { counters, task });
        }
    }

    /// The counters of every daemon running now (OSDs not stopped, and clients).
    pub fn live_counters(&self) -> Vec<Arc<MapCounters>> {
        self.live_osd_counters()
            .into_iter()
            .chain(self.clients.iter().map(|c| c.counters.clone()))
            .collect()
    }

    /// The running OSDs' map counters alone (what an OSD receives, clients apart: a client
    /// gets every change of its pools' PGs, an OSD those of its own PGs).
    pub fn live_osd_counters(&self) -> Vec<Arc<MapCounters>> {
        self.osds
            .iter()
            .filter(|o| o.running())
            .map(|o| o.counters.clone())
            .collect()
    }

    /// The observer's map now.
    pub fn map(&self) -> Option<Arc<ClusterMap>> {
        self.observer.borrow().clone()
    }

    /// When the observer first held `epoch` or later.
    pub fn observed(&self, epoch: Epoch) -> Option<Instant> {
        self.observer_counters.reached(epoch)
    }

    /// Waits until the observer's map satisfies `pred`; the map, and when it arrived.
    pub async fn wait_map(
        &mut self,
        what: &str,
        wait: Duration,
        pred: impl Fn(&ClusterMap) -> bool,
    ) -> Result<Arc<ClusterMap>> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(map) = self.observer.borrow_and_update().clone() {
                if pred(&map) {
                    return Ok(map);
                }
            }
            match tokio::time::timeout_at(deadline, self.observer.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => {
                    return Err(ScaleError::Timeout {
                        what: what.to_string(),
                        after: wait,
                    })
                }
            }
        }
    }

    /// Waits until every running daemon holds `epoch` or later; when the last one got there.
    pub async fn wait_all_reach(&self, epoch: Epoch, wait: Duration) -> Result<Instant> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let counters = self.live_counters();
            let reached: Vec<Option<Instant>> = counters.iter().map(|c| c.reached(epoch)).collect();
            if reached.iter().all(Option::is_some) {
                return Ok(reached
                    .into_iter()
                    .flatten()
                    .max()
                    .unwrap_or_else(Instant::now));
            }
            if tokio::time::Instant::now() >= deadline {
                let behind = reached.iter().filter(|r| r.is_none()).count();
                return Err(ScaleError::Timeout {
                    what: format!(
                        "{behind} of {} daemons to hold epoch {epoch}",
                        counters.len()
                    ),
                    after: wait,
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

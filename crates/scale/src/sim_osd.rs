//! A simulated OSD: no data and no Raft, but every control-plane call an OSD makes, signed
//! with its own `osd.N` key: apply-id, boot, a heartbeat every second, the map followed in its
//! scope (`MapScope::Osd`), and its PG reports sent in one batch per map it receives
//! (`MonClient::reports`), as [`crate::leader`] decides them.
//!
//! Stopping it aborts its tasks (a crash: heartbeats stop, the map is no longer followed); a
//! boot after a stop starts them again with no map, as a restarted process has.

use crate::counters::MapCounters;
use crate::error::{Result, ScaleError};
use crate::follow::follow;
use crate::leader;
use fastblock_auth::{EntityName, Secret};
use fastblock_monclient::{MonClient, MonError};
use fastblock_types::api::{BootRequest, HeartbeatRequest, ReportBatch, REPORT_BATCH_ITEMS_MAX};
use fastblock_types::api::{ErrorCode, OsdReport};
use fastblock_types::map::ClusterMap;
use fastblock_types::map_delta::MapScope;
use fastblock_types::{Epoch, OsdId};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinHandle;

const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(1);
/// Boot calls an OSD makes before it gives up (each bounded by the client's 30 s deadline).
const BOOT_ATTEMPTS_MAX: u32 = 5;
/// A report the map does not reflect after this long is sent again (the real OSD repeats a
/// report until it is answered; the monitor refuses a duplicate as stale, harmlessly).
const REPORT_RESEND_AFTER: Duration = Duration::from_secs(3);
/// Refusal messages kept for the run's report (the first ones; they are usually all alike).
const REFUSALS_KEPT_MAX: usize = 20;

/// Reports sent and refused by every simulated OSD together.
#[derive(Default)]
pub struct ReportStats {
    pub sent: AtomicU64,
    /// Refused as anything but stale.
    pub refused: AtomicU64,
    /// Refused as stale or late (see [`harmless`]).
    pub stale: AtomicU64,
    pub batches: AtomicU64,
    /// The first refusals' messages.
    pub refusals: Mutex<Vec<String>>,
}

impl ReportStats {
    fn refusal(&self, message: String) {
        self.refused.fetch_add(1, Ordering::Relaxed);
        let mut kept = self.refusals.lock().unwrap_or_else(|p| p.into_inner());
        if kept.len() < REFUSALS_KEPT_MAX {
            kept.push(message);
        }
    }
}

pub struct SimOsd {
    pub id: OsdId,
    pub uuid: String,
    pub host: String,
    pub counters: Arc<MapCounters>,
    mon: Arc<MonClient>,
    stats: Arc<ReportStats>,
    tasks: Vec<JoinHandle<()>>,
}

impl SimOsd {
    /// A new OSD: an id for a new uuid and its key (`osd.N`, caps `osd`), made with the
    /// admin's client, as `fastblock-osd --mkfs` does. Not booted yet.
    pub async fn register(
        admin: &MonClient,
        host: String,
        stats: Arc<ReportStats>,
    ) -> Result<SimOsd> {
        let uuid = uuid::Uuid::new_v4().to_string();
        let id = admin
            .apply_id(&uuid)
            .await
            .map_err(|e| ScaleError::mon("apply-id", e))?;
        let key: Secret = admin
            .auth_get_or_create(&format!("osd.{id}"), "osd")
            .await
            .map_err(|e| ScaleError::mon(format!("the key of osd.{id}"), e))?
            .key;
        let mon = MonClient::new(admin.endpoints().to_vec())
            .with_credentials(EntityName::Osd(id), key)
            .with_auth_floor(None);
        Ok(SimOsd {
            id,
            uuid,
            host,
            counters: Arc::new(MapCounters::default()),
            mon: Arc::new(mon),
            stats,
            tasks: Vec::new(),
        })
    }

    /// Boots (a distinct fake address and port per OSD) and starts heartbeating, following
    /// the map and reporting. Returns the boot's epoch.
    pub async fn boot(&mut self) -> Result<Epoch> {
        self.stop();
        let req = BootRequest {
            uuid: self.uuid.clone(),
            address: "127.0.0.1".into(),
            port: 20_000 + (self.id.0 % 40_000) as u16,
            shards: 1,
            host: self.host.clone(),
            capacity_bytes: 1 << 40,
            config: format!("{{\"simulated_osd\":{}}}", self.id),
            lease_timing: None,
        };
        // An OSD whose boot finds no monitor answering tries again, as `fastblock-osd` does;
        // bounded here, so that a monitor that never answers ends the run.
        let mut attempt = 1;
        let epoch = loop {
            match self.mon.boot(self.id, &req).await {
                Ok(epoch) => break epoch,
                Err(e @ MonError::Unreachable { .. }) if attempt < BOOT_ATTEMPTS_MAX => {
                    tracing::warn!("osd.{} boot, attempt {attempt}: {e}", self.id);
                    attempt += 1;
                }
                Err(e) => {
                    return Err(ScaleError::mon(
                        format!("boot of osd.{} (attempt {attempt})", self.id),
                        e,
                    ))
                }
            }
        };
        let (tx, rx) = watch::channel(None);
        self.tasks.push(tokio::spawn(heartbeats(
            self.mon.clone(),
            self.id,
            self.uuid.clone(),
        )));
        self.tasks.push(tokio::spawn(follow(
            self.mon.clone(),
            MapScope::Osd(self.id),
            self.counters.clone(),
            tx,
        )));
        self.tasks.push(tokio::spawn(report(
            self.mon.clone(),
            self.id,
            rx,
            self.stats.clone(),
        )));
        Ok(epoch)
    }

    /// A crash: every task stops at once.
    pub fn stop(&mut self) {
        for t in self.tasks.drain(..) {
            t.abort();
        }
    }

    pub fn running(&self) -> bool {
        !self.tasks.is_empty()
    }
}

impl Drop for SimOsd {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn heartbeats(mon: Arc<MonClient>, id: OsdId, uuid: String) {
    let mut tick = tokio::time::interval(HEARTBEAT_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let req = HeartbeatRequest {
            uuid: uuid.clone(),
            ..Default::default()
        };
        if let Err(e) = mon.heartbeat(id, &req).await {
            tracing::warn!("osd.{id} heartbeat: {e}");
        }
    }
}

/// Sends the reports each new map calls for, in one batch, and again those the map still
/// does not reflect after [`REPORT_RESEND_AFTER`].
async fn report(
    mon: Arc<MonClient>,
    id: OsdId,
    mut maps: watch::Receiver<Option<Arc<ClusterMap>>>,
    stats: Arc<ReportStats>,
) {
    // Each report sent (by its text: `OsdReport` has no `Hash`) and when.
    let mut sent: HashMap<String, Instant> = HashMap::new();
    loop {
        // A new map, or the resend period: whichever comes first.
        let changed = tokio::time::timeout(REPORT_RESEND_AFTER, maps.changed()).await;
        if matches!(changed, Ok(Err(_))) {
            return; // the follower is gone
        }
        let Some(map) = maps.borrow_and_update().clone() else {
            continue;
        };
        let now = Instant::now();
        sent.retain(|_, at| now.duration_since(*at) < REPORT_RESEND_AFTER);
        let due: Vec<OsdReport> = leader::reports(&map, id, REPORT_BATCH_ITEMS_MAX)
            .into_iter()
            .filter(|r| !sent.contains_key(&format!("{r:?}")))
            .collect();
        if due.is_empty() {
            continue;
        }
        let batch = ReportBatch { reports: due };
        stats.batches.fetch_add(1, Ordering::Relaxed);
        stats
            .sent
            .fetch_add(batch.reports.len() as u64, Ordering::Relaxed);
        match mon.reports(id, &batch).await {
            Ok(resp) => {
                for (r, result) in batch.reports.iter().zip(resp.results) {
                    match result {
                        Some(e) if harmless(e.code) => {
                            stats.stale.fetch_add(1, Ordering::Relaxed);
                        }
                        Some(e) => stats.refusal(format!("osd.{id} {r:?}: {e}")),
                        None => {}
                    }
                }
            }
            Err(e) => stats.refusal(format!("osd.{id} batch of {}: {e}", batch.reports.len())),
        }
        for r in &batch.reports {
            sent.insert(format!("{r:?}"), now);
        }
    }
}

/// Refusals a real OSD meets too and drops: a report sent again that the monitor had taken
/// already, whose epoch had not reached this OSD yet (`stale_report`), and a confirmation of a
/// reclaim or trim entry that every PG had confirmed meanwhile (the entry is gone: an OSD
/// behind on the map still saw it).
fn harmless(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::StaleReport | ErrorCode::ReclaimNotFound | ErrorCode::SnapTrimNotFound
    )
}

//! The control task: boots the OSD with the monitor, starts the shards, heartbeats with IO
//! counters, follows the cluster map by long-poll and hands it to the shards, reports new PG
//! leaders, and stops the OSD when a shard fails (fail-stop) or on SIGTERM. It supervises
//! every task it starts and every shard thread: one that fails or ends unasked stops the OSD
//! with an error naming it (`docs/design/osd.md`, "Supervision").

use crate::identity::Identity;
use crate::keys::SharedKeyTable;
use crate::metrics::Metrics;
use crate::shard::{self, ShardCommand, ShardEvent, ShardHandle, ShardSpec};
use anyhow::{Context, Result};
use fastblock_monclient::map_watch::{MapWatch, Moved};
use fastblock_monclient::{MonClient, MonError};
use fastblock_pg::PgConfig;
use fastblock_shard::report_outbox::ReportOutbox;
use fastblock_shard::RecoveryLimits;
use fastblock_types::api::{
    BootRequest, ErrorCode, HeartbeatRequest, OsdReport, OsdSpace, ReportBatch, ReportBatchResponse,
};
use fastblock_types::lease::LeaseTiming;
use fastblock_types::map_delta::MapScope;
use fastblock_types::OsdId;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

/// The throttles of the whole OSD that can change while it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rates {
    /// `--recovery-max-bytes-per-sec`.
    pub recovery_bytes_per_sec: u64,
    /// `--scrub-deep-bytes-per-sec`.
    pub scrub_deep_bytes_per_sec: u64,
}

/// One shard's share of an OSD-wide rate: an even split, at least 1 byte per second.
pub fn shard_share(osd_bytes_per_sec: u64, shards: u32) -> u64 {
    (osd_bytes_per_sec / u64::from(shards.max(1))).max(1)
}

#[derive(Clone, Debug)]
pub struct OsdConfig {
    pub data: PathBuf,
    pub monitors: Vec<String>,
    /// IP address peers and clients reach this OSD at.
    pub address: String,
    /// Data port of shard 0; shard k listens on port + k.
    pub port: u16,
    pub host: String,
    pub tick: Duration,
    /// What the PGs' leases depend on (`--tick`, `--election-ticks`, `--lease-reads`),
    /// reported at boot for the monitor to check against the other OSDs'.
    pub lease_timing: LeaseTiming,
    pub heartbeat_interval: Duration,
    /// An op in flight this long is slow and raises `SLOW_OPS` (`--op-complaint-time`); the
    /// next op report follows each new value sent (`fastblock-client config set osd.N
    /// op_complaint_time`).
    pub op_complaint_time: tokio::sync::watch::Receiver<Duration>,
    /// How often applied data is flushed (`--flush-interval`); the shards follow each new
    /// value sent (`fastblock-client config set osd.N flush_interval`).
    pub flush_interval: tokio::sync::watch::Receiver<Duration>,
    /// How a WAL commit makes its write durable (`--wal-sync`).
    pub wal_sync: fastblock_store::disk::SyncMode,
    /// WAL group commits in flight per shard (`--wal-commits-in-flight`).
    pub wal_commits_in_flight_max: usize,
    pub log_retain_entries: u64,
    pub log_lag_max_entries: u64,
    pub pg_config: PgConfig,
    /// Snapshot transfers sent at once by the whole OSD, and their bandwidth.
    pub recovery_max_active: usize,
    /// The recovery and deep-scrub read rates of the whole OSD (split across its shards): the
    /// value at start, then each change the operator makes (`fastblock-client config set`).
    pub rates: tokio::sync::watch::Receiver<Rates>,
    /// When the PG leaders scrub (`--scrub-interval`, `--deep-scrub-interval`); the deep read
    /// rate comes from `rates`, not from here.
    pub scrub: fastblock_shard::ScrubSchedule,
    /// Where Prometheus `/metrics` is served (`--metrics-addr`; by default the port after the
    /// last shard's data port, see [`crate::metrics::MetricsAddr`]).
    pub metrics_addr: crate::metrics::MetricsAddr,
    /// Bytes the file system holding the metadata keeps free (`--host-space-reserve`; None:
    /// derived from the geometry).
    pub host_space_reserve_bytes: Option<u64>,
    /// The OSD's keyring (`--keyring`; default `<data>.keyring`, see [`crate::keys`]): its
    /// key signs the monitor calls and proves the OSD on its peer links.
    pub keyring: Option<PathBuf>,
    /// The weakest auth mode accepted from the monitor (`--auth-floor`; None: `sign` with a
    /// key, else `none`; `fastblock_auth::floor`).
    pub auth_floor: Option<fastblock_types::auth::AuthMode>,
    /// Test-only (`--fault-injection-file`, [`crate::faults`]): the file of disk faults to
    /// inject, polled while the OSD runs. The binary refuses it without
    /// `FASTBLOCK_TEST_FAULTS=1`.
    pub fault_injection_file: Option<PathBuf>,
    /// Answers the config calls the monitor relays in heartbeat answers (the daemon's admin
    /// socket handler, [`crate::config_calls`]); None: they are refused.
    pub config_handler: Option<crate::config_calls::ConfigHandler>,
}

fn bind(address: &str, port: u16) -> Result<std::net::TcpListener> {
    std::net::TcpListener::bind((address, port))
        .with_context(|| format!("binding {address}:{port}"))
}

/// Runs the OSD until SIGTERM/SIGINT (Ok) or a fatal error (Err: the process exits non-zero).
pub async fn run(config: OsdConfig, key_table: SharedKeyTable) -> Result<()> {
    let skips_flushes = crate::no_flush::skips_flushes(config.wal_sync);
    if skips_flushes {
        crate::no_flush::warn();
    }
    let identity = Identity::load(&config.data)?;
    // An older mkfs left data files sparse: allocate them now, or warn.
    crate::space::reserve_data_file(&config.data);
    let mut mon = MonClient::new(config.monitors.clone()).with_deadline(Duration::from_secs(60));
    let credentials =
        crate::keys::osd_credentials(&config.data, config.keyring.as_deref(), identity.id)?;
    if let Some((entity, key)) = credentials.clone() {
        mon = mon.with_credentials(entity, key);
    }
    let mon = Arc::new(mon.with_auth_floor(config.auth_floor));
    tracing::info!(floor = %mon.auth_floor(), "auth floor");
    // This OSD's tickets to its peers, asked of the monitor as its links need them.
    let tickets = fastblock_client::tickets::Tickets::from_monitor(mon.clone());
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let seed = u64::from_le_bytes(identity.uuid_bytes()?[..8].try_into().expect("8 bytes"))
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
    let metrics = Arc::new(Metrics::new());
    metrics.wal_flush_skipped.set(i64::from(skips_flushes));
    let metrics_at = config
        .metrics_addr
        .resolve(&config.address, config.port, identity.shards)?;
    let mut metrics_task = match metrics_at {
        Some(addr) => Some(crate::metrics::serve(addr, metrics.clone()).await?.1),
        None => None,
    };
    // Read once before the shards open, so that a test can fail even their first reads.
    let mut fault_file = config
        .fault_injection_file
        .clone()
        .map(|path| crate::faults::FaultFile::new(path, identity.shards));
    if let Some(file) = &mut fault_file {
        file.poll();
    }
    let rates = *config.rates.borrow();
    let mut shards: Vec<ShardHandle> = Vec::new();
    for index in 0..identity.shards {
        let port = config
            .port
            .checked_add(index as u16)
            .context("shard port overflows")?;
        let listener = bind(&config.address, port)?;
        let spec = ShardSpec {
            index,
            count: identity.shards,
            osd: identity.id,
            data: config.data.clone(),
            pg_config: config.pg_config,
            tick: config.tick,
            flush_interval: config.flush_interval.clone(),
            wal_sync: config.wal_sync,
            wal_commits_in_flight_max: config.wal_commits_in_flight_max,
            log_retain_entries: config.log_retain_entries,
            log_lag_max_entries: config.log_lag_max_entries,
            seed: seed.wrapping_add(u64::from(index)),
            recovery: RecoveryLimits::osd(
                (config.recovery_max_active / identity.shards as usize).max(1),
                shard_share(rates.recovery_bytes_per_sec, identity.shards),
            ),
            scrub: fastblock_shard::ScrubSchedule {
                deep_bytes_per_sec: shard_share(rates.scrub_deep_bytes_per_sec, identity.shards),
                ..config.scrub
            },
            rates: config.rates.clone(),
            stages: metrics.osd.shard(index),
            host_space_reserve_bytes: config.host_space_reserve_bytes,
            keys: key_table.clone(),
            credentials: credentials.clone(),
            tickets: tickets.clone(),
            faults: fault_file
                .as_ref()
                .map_or_else(fastblock_store::FaultPlan::new, |f| f.plan(index)),
        };
        shards.push(shard::spawn(spec, listener, events_tx.clone())?);
    }
    let capacity = std::fs::metadata(&config.data)
        .map(|m| m.len())
        .unwrap_or(0);
    let boot = BootRequest {
        uuid: identity.uuid.clone(),
        address: config.address.clone(),
        port: config.port,
        shards: identity.shards,
        host: config.host.clone(),
        capacity_bytes: capacity,
        config: serde_json::json!({
            "data": config.data, "shards": identity.shards, "tick_ms": config.tick.as_millis(),
            "election_ticks": config.pg_config.election_ticks, "heartbeat_ticks": config.pg_config.heartbeat_ticks,
            // Visible cluster-wide (`fastblock osd config ID`), not only on this host.
            "wal_flush_skipped": skips_flushes,
        })
        .to_string(),
        lease_timing: Some(config.lease_timing),
    };
    warn_if_unreachable(&config.address, &config.monitors).await;
    let epoch = mon.boot(identity.id, &boot).await.map_err(|e| match e {
        // The monitor's own error, once (`MonError::Api` would print its message twice) and
        // findable in the chain: the binary exits 2 on `incompatible_config`.
        MonError::Api(refusal) => {
            anyhow::Error::new(refusal).context("the monitor refused the boot")
        }
        other => anyhow::Error::new(other).context("booting with the monitor"),
    })?;
    tracing::info!(osd = %identity.id, %epoch, shards = identity.shards, "booted");

    let (map_stop_tx, map_stop) = tokio::sync::watch::channel(false);
    let mut map_task = tokio::spawn(follow_map(
        mon.clone(),
        metrics.clone(),
        identity.id,
        shards.iter().map(|s| s.commands.clone()).collect(),
        key_table,
        map_stop.clone(),
    ));
    let mut hb_task = tokio::spawn(heartbeat(
        mon.clone(),
        identity.clone(),
        shards.iter().map(|s| s.commands.clone()).collect(),
        config.heartbeat_interval,
        crate::op_reports::OpReports::new(shards.len(), config.op_complaint_time.clone()),
        config.config_handler.clone(),
        map_stop,
    ));
    let mut faults_task = fault_file.map(|file| tokio::spawn(file.run()));
    // Reports to the monitor wait in the outbox and go in one batch per tick, one batch in
    // flight at a time; a report the monitor cannot take yet waits for the next batch
    // (`fastblock_shard::report_outbox`).
    let mut outbox = ReportOutbox::default();
    let mut in_flight: Option<JoinHandle<SentBatch>> = None;
    let mut report_tick = tokio::time::interval(REPORT_TICK);
    report_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut flush_warning = tokio::time::interval_at(
        tokio::time::Instant::now() + crate::no_flush::WARNING_INTERVAL,
        crate::no_flush::WARNING_INTERVAL,
    );
    // Every task and shard thread is essential: one that fails, or ends while the OSD is not
    // stopping, stops the OSD (`docs/design/osd.md`, "Supervision").
    let outcome = loop {
        tokio::select! {
            _ = term.recv() => break Ok(()),
            _ = int.recv() => break Ok(()),
            _ = flush_warning.tick(), if skips_flushes => crate::no_flush::warn(),
            hb = &mut hb_task => break Err(ended("heartbeat", hb)),
            map = &mut map_task => break Err(ended("map follower", map.map(Ok))),
            served = until_done(&mut metrics_task) => {
                break Err(ended("metrics server", served.map(|r| r.map_err(anyhow::Error::from))))
            }
            polled = until_done(&mut faults_task) => {
                break Err(ended("fault injection file poller", polled.map(Ok)))
            }
            _ = report_tick.tick(), if in_flight.is_none() && !outbox.is_empty() => {
                let batch = outbox.take_batch();
                let (mon, id) = (mon.clone(), identity.id);
                in_flight = Some(tokio::spawn(async move {
                    let answer = mon.reports(id, &ReportBatch { reports: batch.clone() }).await;
                    (batch, answer)
                }));
            }
            sent = until_done(&mut in_flight) => {
                in_flight = None;
                match sent {
                    Ok((batch, Ok(answer))) if answer.results.len() == batch.len() => {
                        let settled = outbox.settle(batch, answer.results);
                        for (report, e) in &settled.dropped {
                            if e.code != ErrorCode::StaleReport {
                                tracing::warn!(pg = %report.pg(), "report refused: {e}");
                            }
                        }
                        tracing::debug!(
                            epoch = %answer.epoch, taken = settled.taken, again = settled.again,
                            "reports sent"
                        );
                    }
                    Ok((batch, Ok(answer))) => {
                        tracing::warn!(
                            sent = batch.len(), answered = answer.results.len(),
                            "the monitor answered a report batch with another count; sending it again"
                        );
                        outbox.requeue(batch);
                    }
                    Ok((batch, Err(e))) => {
                        tracing::warn!(reports = batch.len(), "report batch failed: {e}; sending it again");
                        outbox.requeue(batch);
                    }
                    Err(e) => break Err(ended("a report batch to the monitor", Err(e))),
                }
            }
            event = events.recv() => match event {
                Some(ShardEvent::Report(report)) => outbox.push(report),
                Some(ShardEvent::Fatal { shard, failure }) => break Err(anyhow::anyhow!("shard {shard} failed: {failure}")),
                Some(ShardEvent::Stopped { shard, reason }) => break Err(anyhow::anyhow!("shard {shard} stopped: {reason}")),
                None => break Err(anyhow::anyhow!("all shards stopped")),
            },
        }
    };
    if let Err(e) = &outcome {
        tracing::error!("stopping the OSD: {e:#}");
    }
    let _ = map_stop_tx.send(true);
    map_task.abort();
    hb_task.abort();
    if let Some(task) = in_flight {
        task.abort();
    }
    if let Some(task) = metrics_task {
        task.abort();
    }
    if let Some(task) = faults_task {
        task.abort();
    }
    for s in &shards {
        let (tx, rx) = oneshot::channel();
        if s.commands.send(ShardCommand::Shutdown(tx)).is_ok() {
            let _ = tokio::time::timeout(Duration::from_secs(10), rx).await;
        }
    }
    for s in shards {
        let _ = s.thread.join();
    }
    outcome
}

/// Why a task of the control runtime ended: its error, its panic, or that it ended at all
/// (none of them ends while the OSD runs).
fn ended(task: &str, outcome: Result<Result<()>, tokio::task::JoinError>) -> anyhow::Error {
    match outcome {
        Ok(Ok(())) => anyhow::anyhow!("{task} task ended while the OSD was running"),
        Ok(Err(e)) => e.context(format!("{task} failed")),
        Err(e) if e.is_panic() => anyhow::anyhow!(
            "{task} panicked: {}",
            crate::panic_message(&*e.into_panic())
        ),
        Err(e) => anyhow::anyhow!("{task} was cancelled: {e}"),
    }
}

/// Waits for the task if there is one, forever if not.
async fn until_done<T>(task: &mut Option<JoinHandle<T>>) -> Result<T, tokio::task::JoinError> {
    match task {
        Some(task) => task.await,
        None => std::future::pending().await,
    }
}

/// How often the reports waiting in the outbox go to the monitor, in one batch.
const REPORT_TICK: Duration = Duration::from_millis(50);

/// A batch of reports sent to the monitor, with its answer.
type SentBatch = (Vec<OsdReport>, Result<ReportBatchResponse, MonError>);

/// Long-polls the map and hands every new epoch to all shards. The monitor sends the changes
/// since the epoch this OSD has, cut down to the PGs it takes part in
/// (`fastblock_types::map_delta`); a whole map only at first, or after falling too far behind.
async fn follow_map(
    mon: Arc<MonClient>,
    metrics: Arc<Metrics>,
    osd: OsdId,
    shards: Vec<mpsc::UnboundedSender<ShardCommand>>,
    key_table: SharedKeyTable,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut watch = MapWatch::new(mon.clone(), MapScope::Osd(osd), Duration::from_secs(10));
    // The key-table epoch last fetched; `None` until the first fetch succeeds.
    let mut keys_epoch: Option<u64> = None;
    while !*stop.borrow() {
        let step = tokio::select! {
            step = watch.next() => step,
            // A dropped sender is the daemon going away too.
            changed = stop.changed() => match changed {
                Ok(()) => continue,
                Err(_) => break,
            },
        };
        match step.moved {
            Moved::Full => metrics.map_full.inc(),
            Moved::Delta => metrics.map_deltas.inc(),
        };
        let map = step.map;
        metrics
            .map_epoch
            .set(i64::try_from(map.epoch.0).unwrap_or(i64::MAX));
        if keys_epoch != Some(map.auth.epoch) {
            keys_epoch = refresh_keys(&mon, &key_table, map.auth).await;
        }
        for s in &shards {
            let _ = s.send(ShardCommand::Map(map.clone()));
        }
    }
}

/// Fetches the entity table (caps and generations) for key-table epoch `auth.epoch` and
/// publishes it. Returns the epoch fetched, or `None` to try again at the next map (a failure
/// is logged; the shards keep the table they have).
async fn refresh_keys(
    mon: &MonClient,
    shared: &SharedKeyTable,
    auth: fastblock_types::auth::AuthSettings,
) -> Option<u64> {
    if !auth.mode.authenticates() {
        crate::keys::publish(
            shared,
            fastblock_auth::EntityTable {
                epoch: auth.epoch,
                mode: auth.mode,
                entries: Default::default(),
            },
        );
        return Some(auth.epoch);
    }
    if mon.credentials().is_none() {
        tracing::warn!(mode = %auth.mode, "the cluster authenticates but this OSD has no keyring");
        return None;
    }
    let resp = match mon.auth_entities().await {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!("fetching the key table: {e}");
            return None;
        }
    };
    match fastblock_auth::EntityTable::from_response(&resp) {
        Ok(table) => {
            let epoch = table.epoch;
            tracing::info!(epoch, entities = table.entries.len(), "key table updated");
            crate::keys::publish(shared, table);
            Some(epoch)
        }
        Err(e) => {
            tracing::warn!("reading the entity table: {e}");
            None
        }
    }
}

/// How long resolving one monitor's name may take before the check goes without it.
const MON_RESOLVE_TIMEOUT: Duration = Duration::from_secs(2);

/// Logs a warning if this OSD registers a loopback address with a monitor that is not on
/// loopback (`crate::reach`).
async fn warn_if_unreachable(address: &str, monitors: &[String]) {
    let mut resolved = Vec::new();
    for endpoint in monitors {
        let host_port = crate::reach::endpoint_host_port(endpoint);
        let ips =
            match tokio::time::timeout(MON_RESOLVE_TIMEOUT, tokio::net::lookup_host(host_port))
                .await
            {
                Ok(Ok(addrs)) => addrs.map(|a| a.ip()).collect(),
                _ => Vec::new(),
            };
        resolved.push((endpoint.clone(), ips));
    }
    if let Some(warning) = crate::reach::loopback_registration_warning(address, &resolved) {
        tracing::warn!("{warning}");
    }
}

/// Heartbeats with the shards' IO counters; a monitor that no longer knows us stops the OSD.
async fn heartbeat(
    mon: Arc<MonClient>,
    identity: Identity,
    shards: Vec<mpsc::UnboundedSender<ShardCommand>>,
    interval: Duration,
    mut op_reports: crate::op_reports::OpReports,
    config_handler: Option<crate::config_calls::ConfigHandler>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<()> {
    let mut ticker = tokio::time::interval(interval);
    // Replies to the config calls of the last answer; kept until a heartbeat carries them.
    let mut config_replies = Vec::new();
    while !*stop.borrow() {
        ticker.tick().await;
        // Asked first, taken after the stats: a shard that is not stuck has answered by then.
        op_reports.ask(&shards);
        let mut pgs = Vec::new();
        let mut backfill_toofull = Vec::new();
        let mut space = OsdSpace::default();
        let mut writable_min = u64::MAX;
        let mut shards_answered = 0;
        for s in &shards {
            let (tx, rx) = oneshot::channel();
            if s.send(ShardCommand::Stats(tx)).is_ok() {
                if let Ok(Ok(mut stats)) = tokio::time::timeout(Duration::from_secs(1), rx).await {
                    pgs.append(&mut stats.pgs);
                    backfill_toofull.append(&mut stats.backfill_toofull);
                    space.total_bytes += stats.space.0;
                    space.free_bytes += stats.space.1;
                    writable_min = writable_min.min(stats.writable_bytes);
                    shards_answered += 1;
                }
            }
        }
        // New data spreads over the shards as PGs hash onto them: the first shard to reach
        // its reserve stops writes to its PGs, so the OSD takes about its shard count times
        // that shard's room (`OsdSpace::writable_bytes`).
        space.writable_bytes = Some(writable_min.saturating_mul(shards_answered as u64))
            .filter(|_| shards_answered > 0);
        let req = HeartbeatRequest {
            uuid: identity.uuid.clone(),
            pgs,
            backfill_toofull,
            // A partial sum would show the OSD smaller than it is: only a whole one goes.
            space: (shards_answered == shards.len()).then_some(space),
            ops: op_reports.collect(),
            config_replies: std::mem::take(&mut config_replies),
            auth_floor: Some(mon.auth_floor()),
        };
        match mon.heartbeat(identity.id, &req).await {
            Ok(answer) => {
                config_replies =
                    crate::config_calls::answer(config_handler.as_ref(), answer.config_calls);
            }
            Err(e)
                if matches!(
                    e.code(),
                    Some(ErrorCode::UuidMismatch | ErrorCode::OsdNotFound)
                ) =>
            {
                // The error stays in the chain: the binary exits 2 on it (not worth a restart).
                return Err(anyhow::Error::new(e).context("the monitor refuses this OSD"));
            }
            Err(e) => {
                tracing::warn!("heartbeat: {e}");
                // The monitor may not have taken them: send them again (the calls they answer
                // are bounded per OSD by the monitor, and no new ones come meanwhile).
                config_replies = req.config_replies;
            }
        }
    }
    Ok(())
}

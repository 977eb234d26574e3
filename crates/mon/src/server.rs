//! Wiring: etcd (own member or external), election, ticker and HTTP server, each supervised
//! (`crate::supervise`), with a clean shutdown on SIGTERM/SIGINT or on a task failure that
//! cannot be retried.

use crate::election::Role;
use crate::etcd_auth::{self, EtcdAuthError, EtcdCredentials};
use crate::etcd_identity;
use crate::etcd_maint::policy::UpkeepSettings;
use crate::etcd_maint::{EtcdUpkeep, OwnMember};
use crate::etcd_proc::{self, EtcdMemberConfig};
use crate::forward::Forwarder;
use crate::http::{router, AppState};
use crate::key_seal::KeyTableSeal;
use crate::keys::Keyspace;
use crate::metrics::Metrics;
use crate::secret::MonSecret;
use crate::service::Monitor;
use crate::supervise::{Misconfiguration, Policy, Supervisor};
use anyhow::Context;
use fastblock_mon_core::liveness::LivenessConfig;
use fastblock_types::api::MonMember;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

#[derive(Clone, Debug)]
pub struct MonConfig {
    pub name: String,
    pub api_addr: String,
    /// `None`: run our own etcd member with this config.
    pub etcd_member: Option<EtcdMemberConfig>,
    /// Used when `etcd_member` is `None`.
    pub etcd_endpoints: Vec<String>,
    pub key_prefix: String,
    pub liveness: LivenessConfig,
    pub tick_interval: Duration,
    pub lease_ttl_secs: i64,
    /// How authentication is set up if this monitor creates the cluster.
    pub auth: crate::service::AuthBootstrap,
    /// How long a snapshot may stay `creating` before it is aborted (at most
    /// `SNAP_CREATE_TIMEOUT_MS_MAX`).
    pub snap_create_timeout_ms: u64,
    /// `--max-pg-per-osd`, changed at runtime by the admin socket's `max_pg_per_osd`.
    pub pg_per_osd_max: std::sync::Arc<std::sync::atomic::AtomicU32>,
    /// etcd's upkeep (`crate::etcd_maint`): quota, history kept, defragmentation.
    pub etcd_upkeep: UpkeepSettings,
    /// How often the leader compacts etcd's history (zero: never), changed at runtime by
    /// sending on the other end (the admin socket's `etcd_compact_interval`).
    pub etcd_compact_interval: watch::Receiver<Duration>,
    /// A backup to write into etcd before the first campaign, if etcd holds no cluster yet
    /// (`crate::backup`).
    pub restore_from: Option<std::path::PathBuf>,
    /// The monitor secret (`crate::secret`): the same file on every monitor.
    pub mon_secret_file: std::path::PathBuf,
    /// With an external etcd, the user to log in as (`--etcd-user`); the own member is
    /// always logged in to as `root` (`crate::etcd_auth`).
    pub etcd_credentials: Option<EtcdCredentials>,
    /// Signed calls one entity may make within the replay window before the next are refused
    /// (`--signed-calls-per-entity-max`; `fastblock_auth::request::ReplayCache`).
    pub signed_calls_per_entity_max: usize,
}

/// How long the monitor waits for an external etcd to answer at its start.
const CONNECT_WAIT: Duration = Duration::from_secs(60);

fn connect_options() -> etcd_client::ConnectOptions {
    etcd_client::ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(5))
        .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2))
}

/// Connects to the own member as `root` (turning etcd's authentication on if it is off,
/// `crate::etcd_auth`), or to the external etcd with the operator's credentials if any. A
/// member set up with another monitor secret, or a foreign etcd at the member's address, is a
/// misconfiguration (status 2).
async fn connect(
    member: Option<&EtcdMemberConfig>,
    endpoints: &[String],
    credentials: Option<&EtcdCredentials>,
) -> anyhow::Result<etcd_client::Client> {
    if let (Some(member), Some(credentials)) = (member, credentials) {
        return match etcd_auth::connect_own_member(member, credentials, connect_options()).await {
            Ok(client) => Ok(client),
            Err(e @ EtcdAuthError::Etcd { .. }) => Err(e.into()),
            Err(e) => Err(Misconfiguration::new(e).into()),
        };
    }
    let deadline = tokio::time::Instant::now() + CONNECT_WAIT;
    loop {
        let opts = etcd_auth::with_credentials(connect_options(), credentials);
        match etcd_client::Client::connect(endpoints, Some(opts)).await {
            Ok(client) => return Ok(client),
            Err(e) if tokio::time::Instant::now() < deadline => {
                tracing::debug!("connecting to etcd {endpoints:?}: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e).context(format!("connecting to etcd at {endpoints:?}")),
        }
    }
}

/// Checks at start that every key table entry in etcd opens with this monitor's secret, so
/// a monitor given another secret file says so and exits (status 2) instead of failing
/// each time it would lead. etcd not answering only warns: the leader's load checks again.
async fn check_key_table(client: &mut etcd_client::Client, keys: &Keyspace) -> anyhow::Result<()> {
    let prefix = format!("{}auth/entities/", keys.root());
    let get = client.get(prefix, Some(etcd_client::GetOptions::new().with_prefix()));
    let resp = match tokio::time::timeout(Duration::from_secs(10), get).await {
        Ok(Ok(resp)) => resp,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "could not read the key table to check the monitor secret");
            return Ok(());
        }
        Err(_) => {
            tracing::warn!("etcd did not answer; the key table is checked when this monitor leads");
            return Ok(());
        }
    };
    let mut kvs = std::collections::BTreeMap::new();
    for kv in resp.kvs() {
        if let (Ok(k), Ok(v)) = (kv.key_str(), kv.value_str()) {
            kvs.insert(k.to_string(), v.to_string());
        }
    }
    keys.open_stored(&mut kvs).map_err(Misconfiguration::new)?;
    Ok(())
}

/// How long a restore waits for etcd to take writes (a majority of its members up), or for
/// another monitor's restore of the same backup to finish.
const RESTORE_ETCD_WAIT: Duration = Duration::from_secs(120);

/// Writes the backup at `path` into etcd if it holds no cluster (`crate::backup`), before the
/// first campaign. A backup that cannot be read, or an etcd that holds another cluster, ends
/// the monitor as a misconfiguration (status 2): starting without the restore would create a
/// new, empty cluster.
async fn restore_from(
    path: &std::path::Path,
    client: &mut etcd_client::Client,
    keys: &Keyspace,
    me: &str,
) -> anyhow::Result<()> {
    #[derive(Debug, thiserror::Error)]
    #[error("--restore-from {path}: {reason}")]
    struct BadRestore {
        path: String,
        reason: String,
    }
    let bad = |reason: String| {
        Misconfiguration::new(BadRestore {
            path: path.display().to_string(),
            reason,
        })
    };
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let backup: fastblock_types::etcd::MonBackup =
        serde_json::from_str(&text).map_err(|e| bad(format!("not a monitor backup: {e}")))?;
    // etcd answers writes only once a majority of its members runs: with several monitors,
    // the others may start after this one. Wait for them, bounded.
    let deadline = tokio::time::Instant::now() + RESTORE_ETCD_WAIT;
    let outcome = loop {
        let now = crate::service::unix_now_ms();
        use crate::backup::RestoreError::{Etcd, InProgress, Raced};
        match crate::backup::restore(client, keys, &backup, me, now).await {
            Err(e @ (Etcd(_) | InProgress { .. } | Raced))
                if tokio::time::Instant::now() < deadline =>
            {
                tracing::warn!("restoring a backup: {e}; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            other => break other,
        }
    };
    match outcome {
        Ok(crate::backup::Restored::Written { from_epoch, epoch }) => {
            tracing::warn!(
                file = %path.display(), %from_epoch, %epoch, revision = backup.revision,
                "restored the cluster state from a backup"
            );
            Ok(())
        }
        Ok(crate::backup::Restored::AlreadyDone) => {
            tracing::info!(file = %path.display(), "this backup was restored before; going on");
            Ok(())
        }
        Err(crate::backup::RestoreError::Etcd(e)) => {
            Err(anyhow::Error::from(e).context("restoring a backup"))
        }
        Err(e) => Err(bad(e.to_string()).into()),
    }
}

/// Runs the monitor until SIGTERM or SIGINT (Ok), or until a task whose failure cannot be
/// retried failed (Err: the binary exits non-zero, 2 if `supervise::is_misconfiguration`). Which task is restarted and which ends the
/// monitor is `docs/design/monitor.md`, "Supervision".
pub async fn run(config: MonConfig) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let listener = tokio::net::TcpListener::bind(&config.api_addr)
        .await
        .with_context(|| format!("binding the API address {}", config.api_addr))?;
    // The secret first: without it nothing in etcd is readable, so nothing is started.
    // Only a monitor alone in its cluster may make one; several must share one file.
    let sole_member = match &config.etcd_member {
        Some(m) => matches!(
            etcd_proc::member_names(&m.initial_cluster).as_slice(),
            [only] if *only == config.name
        ),
        None => true,
    };
    let secret = MonSecret::load_or_create(&config.mon_secret_file, sole_member)
        .map_err(Misconfiguration::new)?;
    let seal = Arc::new(KeyTableSeal::new(&secret));
    let mut config = config;
    if let Some(member) = config.etcd_member.as_mut() {
        if crate::etcd_tls::peer_tls_for(&member.data_dir) {
            let dir = crate::etcd_tls::tls_dir(&member.data_dir);
            member.peer_tls = Some(
                crate::etcd_tls::prepare(&secret, &dir, &member.peer_host())
                    .map_err(Misconfiguration::new)?,
            );
        } else {
            tracing::warn!(
                peer = %member.peer_url(),
                "this etcd member was created before peer TLS: its peer links stay in clear \
                 (docs/operations.md, \"Monitor database\")"
            );
        }
    }
    let credentials = match &config.etcd_member {
        Some(_) => Some(EtcdCredentials::root(&secret)),
        None => config.etcd_credentials.clone(),
    };
    drop(secret);
    let (tasks, mut fatal) = Supervisor::new(shutdown_rx.clone());
    let mut handles = Vec::new();
    if let Some(member) = config.etcd_member.clone() {
        let (rx, sup) = (shutdown_rx.clone(), tasks.clone());
        handles.push(
            tasks.spawn("etcd member supervisor", Policy::ExitDaemon, move || {
                let sup = sup.clone();
                let on_exit = move |why: &str| {
                    sup.record("etcd member", why);
                };
                etcd_proc::supervise(member.clone(), rx.clone(), on_exit)
            }),
        );
    }
    let endpoints = match &config.etcd_member {
        Some(member) => vec![member.client_url()],
        None => config.etcd_endpoints.clone(),
    };
    // An etcd member that cannot start ends the wait at once, not after the connect timeout.
    let client = tokio::select! {
        client = connect(config.etcd_member.as_ref(), &endpoints, credentials.as_ref()) => client?,
        Some(failure) = fatal.recv() => return Err(failure.into()),
    };
    let keys = Keyspace::new(&config.key_prefix).with_seal(seal);
    check_key_table(&mut client.clone(), &keys).await?;
    if let Some(path) = &config.restore_from {
        // The etcd at the member's URL must be the own member before anything is written.
        if let Some(member) = &config.etcd_member {
            etcd_identity::wait_own_member(client.clone(), member)
                .await
                .map_err(Misconfiguration::new)?;
        }
        restore_from(path, &mut client.clone(), &keys, &config.name).await?;
    }
    let upkeep = Arc::new(EtcdUpkeep::new(
        config.etcd_upkeep,
        config.etcd_compact_interval.clone(),
        config.etcd_member.as_ref().map(|m| OwnMember {
            name: m.name.clone(),
            endpoint: m.client_url(),
        }),
        credentials.clone(),
    ));
    let me = MonMember {
        name: config.name.clone(),
        api_addr: config.api_addr.clone(),
    };
    let (role_tx, role_rx) = watch::channel(Role::Follower { leader: None });
    // The election on a thread, runtime and etcd connection of its own (`crate::election`).
    let election_etcd = crate::election::ElectionEtcd {
        endpoints: endpoints.clone(),
        options: etcd_auth::with_credentials(connect_options(), credentials.as_ref()),
    };
    // An external etcd is the operator's choice; the own member's client URL is checked to
    // be answered by the own member (crate::etcd_identity) before the first etcd write.
    let (own_member_tx, own_member_rx) = watch::channel(config.etcd_member.is_none());
    if let Some(member) = config.etcd_member.clone() {
        let (client, rx) = (client.clone(), shutdown_rx.clone());
        let own_member_tx = Arc::new(own_member_tx);
        handles.push(
            tasks.spawn("etcd member check", Policy::ExitDaemon, move || {
                let (client, member, mut rx) = (client.clone(), member.clone(), rx.clone());
                let own_member_tx = own_member_tx.clone();
                async move {
                    etcd_identity::wait_own_member(client, &member)
                        .await
                        .map_err(Misconfiguration::new)?;
                    own_member_tx.send_replace(true);
                    let _ = rx.wait_for(|stop| *stop).await;
                    Ok(())
                }
            }),
        );
    }
    let election_task = {
        let rx = shutdown_rx.clone();
        let (keys, me) = (keys.clone(), me.clone());
        let lease_ttl_secs = config.lease_ttl_secs;
        tasks.spawn("election", Policy::Restart, move || {
            let (etcd, role, mut rx) = (election_etcd.clone(), role_tx.clone(), rx.clone());
            let (keys, me) = (keys.clone(), me.clone());
            let mut own_member = own_member_rx.clone();
            async move {
                // No campaign (and so no etcd write: only a leader writes) before the etcd
                // at the member's client URL is known to be this monitor's own.
                tokio::select! {
                    known = own_member.wait_for(|ok| *ok) => {
                        if known.is_err() {
                            return Ok(()); // the check ended: the monitor is stopping
                        }
                    }
                    _ = rx.wait_for(|stop| *stop) => return Ok(()),
                }
                crate::election::run_on_own_thread(etcd, keys, me, lease_ttl_secs, role, rx)
                    .await?;
                Ok(())
            }
        })
    };
    let upkeep_task = {
        let (upkeep, client, keys, me, role, rx) = (
            upkeep.clone(),
            client.clone(),
            keys.clone(),
            me.clone(),
            role_rx.clone(),
            shutdown_rx.clone(),
        );
        tasks.spawn("etcd upkeep", Policy::Restart, move || {
            crate::etcd_maint::run(
                upkeep.clone(),
                client.clone(),
                keys.clone(),
                me.clone(),
                role.clone(),
                rx.clone(),
            )
        })
    };
    let mut mon = Monitor::new(me, keys, client, role_rx, config.liveness, upkeep);
    mon.auth_bootstrap = config.auth.clone();
    mon.snap_create_timeout_ms = config.snap_create_timeout_ms;
    mon.pg_per_osd_max = config.pg_per_osd_max.clone();
    if config.etcd_member.is_some() {
        mon.txn_ops_max = crate::txn_limits::OWN_MEMBER_TXN_OPS_MAX;
    }
    let mon = Arc::new(mon);
    let ticker = {
        let (mon, rx) = (mon.clone(), shutdown_rx.clone());
        let interval = config.tick_interval;
        tasks.spawn("liveness ticker", Policy::Restart, move || {
            let (mon, rx) = (mon.clone(), rx.clone());
            async move {
                mon.run_ticker(interval, rx).await;
                Ok(())
            }
        })
    };
    let (reports, reports_rx) = crate::report_queue::report_queue();
    let committer = {
        let (mon, rx, stop) = (mon.clone(), reports_rx, shutdown_rx.clone());
        tasks.spawn("report committer", Policy::Restart, move || {
            crate::report_queue::run(mon.clone(), rx.clone(), stop.clone())
        })
    };
    let mut metrics = Metrics::new();
    metrics.register_decide_seconds(mon.decide_seconds.clone());
    let app = Arc::new(AppState {
        reports,
        mon,
        metrics,
        forwarder: Forwarder::default(),
        tasks: tasks.clone(),
        replays: std::sync::Mutex::new(fastblock_auth::request::ReplayCache::with_per_entity_max(
            config.signed_calls_per_entity_max,
        )),
        incarnation: fastblock_auth::request::new_incarnation()
            .map_err(|e| anyhow::anyhow!("drawing the monitor's incarnation: {e}"))?,
        config_relay: Default::default(),
        map_answers: Default::default(),
        expected_mons: config
            .etcd_member
            .as_ref()
            .map(|m| crate::etcd_proc::member_names(&m.initial_cluster)),
    });
    tracing::info!(name = %config.name, api = %config.api_addr, "monitor serving");
    // axum retries failed accepts itself; the server ends only on shutdown or a panic, and a
    // monitor that cannot answer is of no use: its end ends the monitor.
    let server_task = {
        let mut listener = Some(listener);
        let rx = shutdown_rx.clone();
        tasks.spawn("API server", Policy::ExitDaemon, move || {
            let listener = listener.take();
            let (app, mut rx) = (app.clone(), rx.clone());
            async move {
                let listener = listener.context("the API listener is gone (served before)")?;
                axum::serve(listener, router(app))
                    .with_graceful_shutdown(async move {
                        let _ = rx.wait_for(|stop| *stop).await;
                    })
                    .await
                    .context("serving the API")
            }
        })
    };
    let outcome = tokio::select! {
        _ = term.recv() => Ok(()),
        _ = int.recv() => Ok(()),
        Some(failure) = fatal.recv() => Err(anyhow::Error::from(failure)),
    };
    tracing::info!("shutting down");
    shutdown_tx.send_replace(true);
    let _ = tokio::time::timeout(Duration::from_secs(5), election_task).await;
    let _ = tokio::time::timeout(Duration::from_secs(2), ticker).await;
    let _ = tokio::time::timeout(Duration::from_secs(2), upkeep_task).await;
    let _ = tokio::time::timeout(Duration::from_secs(2), committer).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), server_task).await;
    for task in handles {
        let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
    }
    outcome
}

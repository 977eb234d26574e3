//! Wiring: etcd (own member or external), election, ticker and HTTP server, with a clean
//! shutdown on SIGTERM/SIGINT.

use crate::election::{Election, Role};
use crate::etcd_proc::{self, EtcdMemberConfig};
use crate::forward::Forwarder;
use crate::http::{router, AppState};
use crate::keys::Keyspace;
use crate::metrics::Metrics;
use crate::service::Monitor;
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
}

async fn connect(endpoints: &[String]) -> anyhow::Result<etcd_client::Client> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let opts = etcd_client::ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_timeout(Duration::from_secs(5))
            .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2));
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

/// Runs the monitor until SIGTERM or SIGINT.
pub async fn run(config: MonConfig) -> anyhow::Result<()> {
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let listener = tokio::net::TcpListener::bind(&config.api_addr)
        .await
        .with_context(|| format!("binding the API address {}", config.api_addr))?;
    let etcd_task = config.etcd_member.clone().map(|member| {
        let rx = shutdown_rx.clone();
        tokio::spawn(etcd_proc::supervise(member, rx))
    });
    let endpoints = match &config.etcd_member {
        Some(member) => vec![member.client_url()],
        None => config.etcd_endpoints.clone(),
    };
    let client = connect(&endpoints).await?;
    let keys = Keyspace::new(&config.key_prefix);
    let me = MonMember {
        name: config.name.clone(),
        api_addr: config.api_addr.clone(),
    };
    let (role_tx, role_rx) = watch::channel(Role::Follower { leader: None });
    let election = Election {
        client: client.clone(),
        keys: keys.clone(),
        me: me.clone(),
        lease_ttl_secs: config.lease_ttl_secs,
    };
    let election_task = tokio::spawn(election.run(role_tx, shutdown_rx.clone()));
    let mon = Arc::new(Monitor::new(me, keys, client, role_rx, config.liveness));
    let ticker = {
        let mon = mon.clone();
        let rx = shutdown_rx.clone();
        let interval = config.tick_interval;
        tokio::spawn(async move { mon.run_ticker(interval, rx).await })
    };
    let app = Arc::new(AppState {
        mon,
        metrics: Metrics::new(),
        forwarder: Forwarder::default(),
    });
    tracing::info!(name = %config.name, api = %config.api_addr, "monitor serving");
    let mut server_shutdown = shutdown_rx.clone();
    let server = axum::serve(listener, router(app)).with_graceful_shutdown(async move {
        let _ = server_shutdown.wait_for(|v| *v).await;
    });
    let server_task = tokio::spawn(async move { server.await });
    wait_for_signal().await;
    tracing::info!("shutting down");
    shutdown_tx.send_replace(true);
    let _ = tokio::time::timeout(Duration::from_secs(5), election_task).await;
    let _ = tokio::time::timeout(Duration::from_secs(2), ticker).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), server_task).await;
    if let Some(task) = etcd_task {
        let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
    }
    Ok(())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("installing SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("installing SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

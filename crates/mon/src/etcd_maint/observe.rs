//! Looking at etcd: each member's database size and data in use, the store's revision, and the
//! raised alarms. Every call is bounded by [`ETCD_CALL_TIMEOUT`]: a member that does not answer
//! is shown with its error, never waited on.
//!
//! Which members a monitor can reach: with an external etcd (`--etcd-endpoints`) every member's
//! advertised client URL. With the monitors' own members only its own: each listens for
//! clients on a loopback address of its host (`docs/security.md`), so the others' sizes come
//! from their monitors' `GET /v1/mon` ([`peer_member_status`]).

use crate::etcd_auth::{with_credentials, EtcdCredentials};
use bytes::Bytes;
use etcd_client::{AlarmAction, AlarmOptions, AlarmType, Client, ConnectOptions};
use fastblock_types::api::MonMember;
use fastblock_types::etcd::{EtcdAlarm, EtcdMemberStatus};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use std::collections::BTreeMap;
use std::time::Duration;

/// Longest a single etcd call of the upkeep may take (a defragmentation excepted).
pub const ETCD_CALL_TIMEOUT: Duration = Duration::from_secs(3);
/// Largest `GET /v1/mon` answer read from a peer.
const PEER_VIEW_BYTES_MAX: usize = 64 << 10;

/// One member as `member_list` names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub id: u64,
    pub name: String,
    pub endpoint: String,
}

/// Clients connected to one member each (the maintenance calls act on the member a client is
/// connected to), made on first use and kept.
pub struct MemberClients {
    clients: BTreeMap<String, Client>,
    credentials: Option<EtcdCredentials>,
}

impl MemberClients {
    /// Clients that log in with `credentials` (`crate::etcd_auth`), if any.
    pub fn new(credentials: Option<EtcdCredentials>) -> Self {
        MemberClients {
            clients: BTreeMap::new(),
            credentials,
        }
    }

    pub async fn get(&mut self, endpoint: &str) -> Result<Client, String> {
        if let Some(c) = self.clients.get(endpoint) {
            return Ok(c.clone());
        }
        // No request timeout on the client: each call is bounded by its caller, a status by
        // ETCD_CALL_TIMEOUT, a defragmentation (which takes as long as the data it copies) by
        // far longer.
        let opts = with_credentials(
            ConnectOptions::new().with_connect_timeout(Duration::from_secs(2)),
            self.credentials.as_ref(),
        );
        let client = Client::connect([endpoint], Some(opts))
            .await
            .map_err(|e| format!("connecting to {endpoint}: {e}"))?;
        self.clients.insert(endpoint.to_string(), client.clone());
        Ok(client)
    }

    /// Forgets a member's client (after an error, so the next call reconnects).
    pub fn drop_client(&mut self, endpoint: &str) {
        self.clients.remove(endpoint);
    }
}

async fn timed<T, E: std::fmt::Display>(
    what: &str,
    f: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout(ETCD_CALL_TIMEOUT, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("{what}: {e}")),
        Err(_) => Err(format!("{what}: no answer within {ETCD_CALL_TIMEOUT:?}")),
    }
}

/// The cluster's members (sorted by name).
pub async fn members(client: &mut Client) -> Result<Vec<Member>, String> {
    let resp = timed("etcd member list", client.member_list()).await?;
    let mut out: Vec<Member> = resp
        .members()
        .iter()
        .map(|m| Member {
            id: m.id(),
            name: m.name().to_string(),
            endpoint: m.client_urls().first().cloned().unwrap_or_default(),
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// One member's status, and the store revision it reported.
pub async fn member_status(
    clients: &mut MemberClients,
    member: &Member,
) -> (EtcdMemberStatus, Option<u64>) {
    let mut status = EtcdMemberStatus {
        name: member.name.clone(),
        endpoint: member.endpoint.clone(),
        ..EtcdMemberStatus::default()
    };
    let answer = match clients.get(&member.endpoint).await {
        Ok(mut c) => timed("etcd status", c.status()).await,
        Err(e) => Err(e),
    };
    match answer {
        Ok(s) => {
            status.db_size_bytes = u64::try_from(s.db_size()).unwrap_or(0);
            status.db_size_in_use_bytes = u64::try_from(s.raft_used_db_size()).unwrap_or(0);
            status.is_leader = s.leader() == member.id;
            let revision = s.header().and_then(|h| u64::try_from(h.revision()).ok());
            (status, revision)
        }
        Err(e) => {
            clients.drop_client(&member.endpoint);
            status.error = Some(e);
            (status, None)
        }
    }
}

/// The alarms raised anywhere in the cluster (etcd replicates them), named by member.
pub async fn alarms(
    client: &mut Client,
    members: &[Member],
) -> Result<Vec<(u64, EtcdAlarm)>, String> {
    let opts = AlarmOptions::new();
    let resp = timed(
        "etcd alarm list",
        client.alarm(AlarmAction::Get, AlarmType::None, Some(opts)),
    )
    .await?;
    Ok(resp
        .alarms()
        .iter()
        .filter(|a| a.alarm() != AlarmType::None)
        .map(|a| {
            let member = members
                .iter()
                .find(|m| m.id == a.member_id())
                .map_or_else(|| format!("{:x}", a.member_id()), |m| m.name.clone());
            let alarm = match a.alarm() {
                AlarmType::Nospace => "NOSPACE",
                AlarmType::Corrupt => "CORRUPT",
                AlarmType::None => "NONE",
            };
            (
                a.member_id(),
                EtcdAlarm {
                    member,
                    alarm: alarm.to_string(),
                },
            )
        })
        .collect())
}

/// What a peer monitor's `GET /v1/mon` says of its own etcd member, if it answers in time.
pub async fn peer_member_status(peer: &MonMember) -> Option<EtcdMemberStatus> {
    #[derive(serde::Deserialize)]
    struct View {
        etcd_member: Option<EtcdMemberStatus>,
    }
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(Duration::from_secs(1)));
    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(connector);
    let uri: hyper::Uri = format!("http://{}/v1/mon", peer.api_addr).parse().ok()?;
    let req = hyper::Request::get(uri).body(Empty::<Bytes>::new()).ok()?;
    let resp = tokio::time::timeout(ETCD_CALL_TIMEOUT, client.request(req))
        .await
        .ok()?
        .ok()?;
    let body = Limited::new(resp.into_body(), PEER_VIEW_BYTES_MAX)
        .collect()
        .await
        .ok()?
        .to_bytes();
    serde_json::from_slice::<View>(&body).ok()?.etcd_member
}

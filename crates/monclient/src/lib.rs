//! Client of the monitor's HTTP API (`docs/mon-api.md`) for the CLI, OSDs and the block client.
//!
//! Module map:
//! - [`MonClient`]: endpoint failover (any monitor answers; followers forward to the leader),
//!   retries of retryable errors with backoff up to a deadline, typed calls.
//! - [`MonError`]: what a caller can act on: the monitor's typed [`ApiError`], or "no monitor
//!   reachable" with the last cause.
//! - [`map_watch`]: following the map in a daemon's scope, as OSDs (and the scale harness's
//!   simulated daemons) do.

pub mod map_watch;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use bytes::Bytes;
use fastblock_auth::request::{
    sign_request, verify_reply, HEADER_INCARNATION, HEADER_REPLY_SIGNATURE, INCARNATION_UNKNOWN,
};
use fastblock_auth::{open_blob, EntityName, KeyBinding, Secret};
use fastblock_types::api::*;
use fastblock_types::auth::{AuthMode, AuthSettings};
use fastblock_types::map::{
    Flags, ImageInfo, OsdInfo, PoolInfo, ReclaimEntry, ScrubRequest, SnapInfo, SnapTrimEntry,
    SpaceSettings,
};
use fastblock_types::{Epoch, ImageId, OsdId, PgId, SnapId};
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Method, Request};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// Largest response accepted: a whole unscoped map at 131,072 PGs is some 21 MB of JSON, with
/// OSDs, images and snapshots beside them (daemons follow scoped deltas, far smaller). As the
/// monitors' relay (`fastblock_mon::forward`).
const RESPONSE_BYTES_MAX: usize = 256 << 20;

/// Decompresses a gzipped answer, refusing one that would exceed `max_bytes` (a few KiB of
/// gzip can expand to gigabytes, and the answer is checked only once decompressed).
fn gunzip(packed: &[u8], max_bytes: usize) -> Result<Bytes, String> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(packed)
        .take(max_bytes as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| e.to_string())?;
    if out.len() > max_bytes {
        return Err(format!("larger than {max_bytes} bytes once decompressed"));
    }
    Ok(Bytes::from(out))
}

#[derive(Debug, thiserror::Error)]
pub enum MonError {
    /// The monitor answered with an error. Transparent: its message is this error's, and
    /// it is not repeated as a cause (an `anyhow` chain printed the message twice).
    #[error(transparent)]
    Api(#[from] ApiError),
    /// No monitor answered before the deadline.
    #[error("no monitor reachable at {endpoints} within {deadline:?}: {last}")]
    Unreachable {
        endpoints: String,
        deadline: Duration,
        last: String,
    },
    /// A monitor answered something that is not our API (wrong port, proxy, version skew).
    #[error("unexpected answer from monitor {endpoint}: {detail}")]
    Protocol { endpoint: String, detail: String },
}

impl MonError {
    /// The API error code, if the monitor answered with one.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            MonError::Api(e) => Some(e.code),
            _ => None,
        }
    }
}

/// An entity's key as received from the monitor (opened).
#[derive(Clone, Debug)]
pub struct EntityKey {
    pub entity: EntityName,
    pub caps: String,
    pub generation: u64,
    pub key: Secret,
}

/// One attempt's failure: either final, or worth another try (maybe at another endpoint),
/// with the monitor's own answer when it gave one (a retryable error code).
enum Attempt {
    Final(MonError),
    Retry(String, Option<ApiError>),
}

/// Longest text of a monitor incarnation taken from an answer (the monitor's are 32 hex
/// digits); anything else is not remembered.
const INCARNATION_CHARS_MAX: usize = 64;
/// A pooled connection to a monitor idle this long is closed. Longer than a heartbeat's
/// interval, so a daemon's steady calls keep reusing theirs.
const POOL_IDLE: Duration = Duration::from_secs(15);

pub struct MonClient {
    endpoints: Vec<String>,
    /// Who signs the calls, with its entity key; `None`: unsigned (auth mode `none`).
    credentials: Option<(EntityName, Secret)>,
    /// The weakest mode accepted, if set (`fastblock_auth::floor`; else the default for what
    /// this client holds): with a floor above `none`, an answer to a signed call must carry
    /// the monitor's valid signature.
    floor: Option<AuthMode>,
    /// The leading monitor's incarnation as last heard, which calls are signed for.
    incarnation: std::sync::Mutex<String>,
    /// The endpoint that answered last: tried first next time.
    preferred: AtomicUsize,
    http: Client<HttpConnector, Full<Bytes>>,
    deadline: Duration,
    request_timeout: Duration,
}

impl MonClient {
    /// `endpoints` are `host:port` of monitors (an `http://` prefix is accepted).
    pub fn new(endpoints: Vec<String>) -> Self {
        assert!(!endpoints.is_empty(), "at least one monitor endpoint");
        let endpoints = endpoints
            .into_iter()
            .map(|e| {
                e.trim()
                    .trim_start_matches("http://")
                    .trim_end_matches('/')
                    .to_string()
            })
            .collect();
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(Duration::from_secs(1)));
        connector.set_nodelay(true);
        MonClient {
            endpoints,
            credentials: None,
            floor: None,
            incarnation: std::sync::Mutex::new(INCARNATION_UNKNOWN.to_string()),
            preferred: AtomicUsize::new(0),
            http: Client::builder(TokioExecutor::new())
                // Without a timer the pool never closes an idle connection: a daemon kept as
                // many as it ever had calls in flight at once (a restart's boot, reports,
                // heartbeats and a long-poll), for good, and the monitor held them all (some
                // 3,900 connections for 1,000 simulated OSDs after a rolling restart).
                .pool_timer(hyper_util::rt::TokioTimer::new())
                .pool_idle_timeout(POOL_IDLE)
                .build(connector),
            deadline: Duration::from_secs(30),
            request_timeout: Duration::from_secs(10),
        }
    }

    /// Signs every call as `entity` with its entity key (`docs/mon-api.md`,
    /// "Authentication"), and accepts only answers the monitor signed (unless
    /// [`MonClient::with_auth_floor`] lowers the floor).
    pub fn with_credentials(mut self, entity: EntityName, key: Secret) -> Self {
        self.credentials = Some((entity, key));
        self
    }

    /// Sets the weakest auth mode accepted (`None`: the default, `sign` with credentials and
    /// `none` without). Below `sign`, unsigned answers are taken (a cluster in mode `none`); a
    /// signature that is present is checked in every case.
    pub fn with_auth_floor(mut self, floor: Option<AuthMode>) -> Self {
        self.floor = floor;
        self
    }

    pub fn auth_floor(&self) -> AuthMode {
        self.floor
            .unwrap_or_else(|| fastblock_auth::floor::default_floor(self.credentials.is_some()))
    }

    fn incarnation(&self) -> String {
        self.incarnation
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn credentials(&self) -> Option<&(EntityName, Secret)> {
        self.credentials.as_ref()
    }

    /// How long retryable failures are retried before giving up.
    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// One call to `endpoint`, signed again at once if the monitor answers that it was signed
    /// for another incarnation (the first call of a client, or one after a monitor restart or
    /// a change of leader).
    async fn attempt(
        &self,
        endpoint: &str,
        method: &Method,
        path: &str,
        body: &Option<Bytes>,
        timeout: Duration,
    ) -> Result<(Bytes, usize), Attempt> {
        // Twice at most: once more for the incarnation the refusal named; a monitor that
        // refuses that too changed again meanwhile, and the caller's retry loop takes over.
        let mut result = self
            .attempt_once(endpoint, method, path, body, timeout)
            .await;
        if let Err(Attempt::Retry(_, Some(answer))) = &result {
            if answer.code == ErrorCode::StaleIncarnation {
                result = self
                    .attempt_once(endpoint, method, path, body, timeout)
                    .await;
            }
        }
        result
    }

    async fn attempt_once(
        &self,
        endpoint: &str,
        method: &Method,
        path: &str,
        body: &Option<Bytes>,
        timeout: Duration,
    ) -> Result<(Bytes, usize), Attempt> {
        // Large answers (map deltas of many PGs) come gzipped (`docs/mon-api.md`,
        // "Compression").
        let mut req = Request::builder()
            .method(method.clone())
            .uri(format!("http://{endpoint}{path}"))
            .header(hyper::header::ACCEPT_ENCODING, "gzip");
        if body.is_some() {
            req = req.header(hyper::header::CONTENT_TYPE, "application/json");
        }
        // Signed per attempt: each carries a fresh nonce and the current time, so a retry is
        // not refused as a replay of the first attempt.
        let mut nonce = None;
        if let Some((entity, key)) = &self.credentials {
            let body_bytes: &[u8] = body.as_deref().unwrap_or(&[]);
            let signed = sign_request(
                entity,
                key,
                method.as_str(),
                path,
                body_bytes,
                now_unix_s(),
                &self.incarnation(),
            )
            .map_err(|e| Attempt::Final(protocol(endpoint, e.to_string())))?;
            nonce = Some(signed.nonce_hex.clone());
            for (name, value) in signed.pairs() {
                req = req.header(name, value);
            }
        }
        let req = req
            .body(Full::new(body.clone().unwrap_or_default()))
            .map_err(|e| Attempt::Final(protocol(endpoint, e.to_string())))?;
        let resp = match tokio::time::timeout(timeout, self.http.request(req)).await {
            Err(_) => {
                return Err(Attempt::Retry(
                    format!("{endpoint}: timed out after {timeout:?}"),
                    None,
                ))
            }
            Ok(Err(e)) => return Err(Attempt::Retry(format!("{endpoint}: {e}"), None)),
            Ok(Ok(resp)) => resp,
        };
        let status = resp.status();
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let (incarnation, reply_signature) =
            (header(HEADER_INCARNATION), header(HEADER_REPLY_SIGNATURE));
        let encoding = header(hyper::header::CONTENT_ENCODING.as_str());
        let bytes = match tokio::time::timeout(
            timeout,
            Limited::new(resp.into_body(), RESPONSE_BYTES_MAX).collect(),
        )
        .await
        {
            Ok(Ok(b)) => b.to_bytes(),
            Ok(Err(e)) => {
                return Err(Attempt::Retry(
                    format!("{endpoint}: reading answer: {e}"),
                    None,
                ))
            }
            Err(_) => {
                return Err(Attempt::Retry(
                    format!("{endpoint}: answer timed out"),
                    None,
                ))
            }
        };
        let wire_bytes = bytes.len();
        // Decompressed before the signature is checked: the monitor signs the JSON.
        let bytes = match encoding.as_deref() {
            None | Some("identity") => bytes,
            Some(e) if e.eq_ignore_ascii_case("gzip") => gunzip(&bytes, RESPONSE_BYTES_MAX)
                .map_err(|e| {
                    Attempt::Retry(format!("{endpoint}: the gzipped answer: {e}"), None)
                })?,
            Some(other) => {
                return Err(Attempt::Final(protocol(
                    endpoint,
                    format!(
                        "the answer is encoded as {other:?}, which this client did not ask for"
                    ),
                )))
            }
        };
        // Unsigned: taken as what it claims to be only below floor `sign`, or when it is an
        // error (a refusal before the call was verified cannot be signed; a forged one can
        // only fail the call, as dropping it would).
        if let (Some((_, key)), Some(nonce)) = (&self.credentials, &nonce) {
            match &reply_signature {
                Some(sig) => verify_reply(key, nonce, status.as_u16(), &bytes, sig).map_err(|e| {
                    Attempt::Final(protocol(
                        endpoint,
                        format!("{e}: refused (someone between this client and the monitor, or a monitor that is not ours)"),
                    ))
                })?,
                None if status.is_success() && self.auth_floor().authenticates() => {
                    return Err(Attempt::Final(protocol(
                        endpoint,
                        format!(
                            "the answer is not signed: the cluster runs auth mode none, or \
                             someone between this client and the monitor removed the signature; \
                             refused below this client's auth floor {} (--auth-floor)",
                            self.auth_floor()
                        ),
                    )));
                }
                None => {}
            }
        }
        if let Some(inc) = incarnation.filter(|i| !i.is_empty() && i.len() <= INCARNATION_CHARS_MAX)
        {
            *self.incarnation.lock().unwrap_or_else(|p| p.into_inner()) = inc;
        }
        if status.is_success() {
            return Ok((bytes, wire_bytes));
        }
        match serde_json::from_slice::<ErrorBody>(&bytes) {
            Ok(body) if body.error.retryable => Err(Attempt::Retry(
                format!("{endpoint}: {}", body.error.message),
                Some(body.error),
            )),
            Ok(body) => Err(Attempt::Final(MonError::Api(body.error))),
            Err(_) => Err(Attempt::Final(protocol(
                endpoint,
                format!(
                    "HTTP {status}: {}",
                    String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
                ),
            ))),
        }
    }

    /// Sends one call, failing over between monitors and retrying retryable errors with
    /// exponential backoff until the deadline.
    async fn call_raw(
        &self,
        method: Method,
        path: &str,
        body: Option<Bytes>,
        timeout: Duration,
    ) -> Result<(Bytes, usize), MonError> {
        let start = Instant::now();
        let mut backoff = Duration::from_millis(50);
        let mut last = String::new();
        let mut last_answer: Option<ApiError> = None;
        let n = self.endpoints.len();
        loop {
            let first = self.preferred.load(Ordering::Relaxed);
            for i in 0..n {
                let index = (first + i) % n;
                let endpoint = &self.endpoints[index];
                match self.attempt(endpoint, &method, path, &body, timeout).await {
                    Ok(answer) => {
                        self.preferred.store(index, Ordering::Relaxed);
                        return Ok(answer);
                    }
                    Err(Attempt::Final(e)) => return Err(e),
                    Err(Attempt::Retry(why, answer)) => {
                        tracing::debug!("monitor call {method} {path}: {why}");
                        last = why;
                        last_answer = answer;
                    }
                }
            }
            if start.elapsed() + backoff > self.deadline {
                // A monitor answered, with an error worth retrying that did not clear in
                // time (no leader, etcd out of space): that answer is the error, not an
                // unreachable monitor.
                if let Some(answer) = last_answer {
                    return Err(MonError::Api(answer));
                }
                return Err(MonError::Unreachable {
                    endpoints: self.endpoints.join(","),
                    deadline: self.deadline,
                    last,
                });
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> Result<T, MonError> {
        let body = body.map(|b| Bytes::from(serde_json::to_vec(b).expect("request serializes")));
        let (bytes, _) = self
            .call_raw(method, path, body, self.request_timeout)
            .await?;
        decode(&self.endpoints.join(","), &bytes)
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, MonError> {
        self.call(Method::GET, path, None::<&()>).await
    }

    async fn post<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &impl Serialize,
    ) -> Result<T, MonError> {
        self.call(Method::POST, path, Some(body)).await
    }

    pub async fn status(&self) -> Result<StatusResponse, MonError> {
        self.get("/v1/status").await
    }

    pub async fn health(&self) -> Result<HealthResponse, MonError> {
        self.get("/v1/health").await
    }

    /// Raw and per-pool space (`df`).
    pub async fn df(&self) -> Result<DfResponse, MonError> {
        self.get("/v1/df").await
    }

    /// Sets the nearfull (`full == false`) or the full ratio; answers the space settings.
    pub async fn set_space_ratio(&self, full: bool, ratio: f64) -> Result<SpaceSettings, MonError> {
        let which = if full { "full-ratio" } else { "nearfull-ratio" };
        self.call(
            Method::PUT,
            &format!("/v1/space/{which}"),
            Some(&SetRatioRequest { ratio }),
        )
        .await
    }

    /// A backup of the monitors' state (every key at one etcd revision; it holds the key
    /// table). Administrators only.
    pub async fn mon_backup(&self) -> Result<fastblock_types::etcd::MonBackup, MonError> {
        self.get("/v1/mon/backup").await
    }

    /// The whole map now.
    pub async fn map(&self) -> Result<MapResponse, MonError> {
        self.get("/v1/map").await
    }

    /// What changed since `have` within `scope` (a delta, or the whole map for a holder with
    /// no map or one too far behind), waiting up to `timeout` for an epoch past `have`
    /// (`docs/mon-api.md`, "Incremental maps"). Feed the answer to a
    /// [`fastblock_types::map_delta::MapFollower`].
    pub async fn map_update(
        &self,
        have: Epoch,
        scope: &fastblock_types::map_delta::MapScope,
        timeout: Duration,
    ) -> Result<MapResponse, MonError> {
        Ok(self.map_update_sized(have, scope, timeout).await?.0)
    }

    /// [`MonClient::map_update`], with the byte length of the answer's body as the monitor
    /// sent it (gzipped when large): what a daemon pays to follow the map (the scale harness,
    /// `crates/scale`, sums it per event).
    pub async fn map_update_sized(
        &self,
        have: Epoch,
        scope: &fastblock_types::map_delta::MapScope,
        timeout: Duration,
    ) -> Result<(MapResponse, usize), MonError> {
        use fastblock_types::map_delta::MapScope;
        let scope = match scope {
            MapScope::All => String::new(),
            MapScope::Osd(osd) => format!("&osd={osd}"),
            MapScope::Pools(pools) => format!(
                "&pools={}",
                pools
                    .iter()
                    .map(|p| p.0.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        };
        let path = format!(
            "/v1/map?after={}&timeout_ms={}&delta=true{scope}",
            have.0,
            timeout.as_millis()
        );
        let (bytes, wire_bytes) = self
            .call_raw(Method::GET, &path, None, timeout + self.request_timeout)
            .await?;
        let resp = decode(&self.endpoints.join(","), &bytes)?;
        Ok((resp, wire_bytes))
    }

    /// Waits until the epoch passes `after` (the map is returned) or `timeout` passes
    /// (`map: None`).
    pub async fn watch_map(
        &self,
        after: Epoch,
        timeout: Duration,
    ) -> Result<MapResponse, MonError> {
        let path = format!(
            "/v1/map?after={}&timeout_ms={}",
            after.0,
            timeout.as_millis()
        );
        let (bytes, _) = self
            .call_raw(Method::GET, &path, None, timeout + self.request_timeout)
            .await?;
        decode(&self.endpoints.join(","), &bytes)
    }

    /// An OSD's op tracker, as of its last heartbeat (`GET /v1/osds/{id}/ops`, admin only).
    pub async fn osd_ops(&self, id: OsdId) -> Result<OsdOpsResponse, MonError> {
        self.get(&format!("/v1/osds/{id}/ops")).await
    }

    pub async fn osds(&self) -> Result<Vec<OsdInfo>, MonError> {
        self.get("/v1/osds").await
    }

    pub async fn apply_id(&self, uuid: &str) -> Result<OsdId, MonError> {
        let r: ApplyIdResponse = self
            .post("/v1/osds/apply-id", &ApplyIdRequest { uuid: uuid.into() })
            .await?;
        Ok(r.id)
    }

    pub async fn boot(&self, id: OsdId, req: &BootRequest) -> Result<Epoch, MonError> {
        let r: EpochResponse = self.post(&format!("/v1/osds/{id}/boot"), req).await?;
        Ok(r.epoch)
    }

    /// The epoch, and the config calls relayed to this OSD (answered in its next heartbeat).
    pub async fn heartbeat(
        &self,
        id: OsdId,
        req: &HeartbeatRequest,
    ) -> Result<HeartbeatResponse, MonError> {
        self.post(&format!("/v1/osds/{id}/heartbeat"), req).await
    }

    /// An OSD's reports in one batch (`POST /v1/osds/{id}/reports`): one result per report.
    pub async fn reports(
        &self,
        id: OsdId,
        batch: &fastblock_types::api::ReportBatch,
    ) -> Result<fastblock_types::api::ReportBatchResponse, MonError> {
        self.post(&format!("/v1/osds/{id}/reports"), batch).await
    }

    /// `config show|get|set` on an OSD, relayed by the monitor in its heartbeats
    /// (`POST /v1/osds/{id}/config`, admin only).
    pub async fn osd_config(
        &self,
        id: OsdId,
        request: &fastblock_types::daemon_config::AdminRequest,
    ) -> Result<fastblock_types::daemon_config::AdminReply, MonError> {
        self.post(&format!("/v1/osds/{id}/config"), request).await
    }

    pub async fn osd_out(&self, id: OsdId) -> Result<Epoch, MonError> {
        let r: EpochResponse = self.post(&format!("/v1/osds/{id}/out"), &()).await?;
        Ok(r.epoch)
    }

    pub async fn osd_in(&self, id: OsdId) -> Result<Epoch, MonError> {
        let r: EpochResponse = self.post(&format!("/v1/osds/{id}/in"), &()).await?;
        Ok(r.epoch)
    }

    /// Removes a down, out OSD that no PG names, for good (`osd purge`); its id is retired.
    pub async fn osd_purge(&self, id: OsdId) -> Result<Epoch, MonError> {
        let r: EpochResponse = self.post(&format!("/v1/osds/{id}/purge"), &()).await?;
        Ok(r.epoch)
    }

    pub async fn pools(&self) -> Result<Vec<PoolInfo>, MonError> {
        Ok(self.pool_list().await?.pools)
    }

    /// The pools with what each holds (`usage`, in the order of `pools`).
    pub async fn pool_list(&self) -> Result<PoolList, MonError> {
        self.get("/v1/pools").await
    }

    pub async fn pool(&self, name: &str) -> Result<PoolInfo, MonError> {
        self.get(&format!("/v1/pools/{name}")).await
    }

    pub async fn create_pool(&self, req: &CreatePoolRequest) -> Result<PoolInfo, MonError> {
        self.post("/v1/pools", req).await
    }

    pub async fn delete_pool(&self, name: &str, force: bool) -> Result<PoolInfo, MonError> {
        self.call(
            Method::DELETE,
            &format!("/v1/pools/{name}?force={force}"),
            None::<&()>,
        )
        .await
    }

    pub async fn pgs(&self, pool: Option<&str>) -> Result<PgList, MonError> {
        self.pgs_as(pool).await
    }

    /// `GET /v1/pgs` decoded as `T`: for callers that read the fields the monitor adds to each
    /// row besides `PgRow`'s (the PG's scrub state, `docs/mon-api.md`).
    pub async fn pgs_as<T: DeserializeOwned>(&self, pool: Option<&str>) -> Result<T, MonError> {
        match pool {
            Some(p) => self.get(&format!("/v1/pgs?pool={p}")).await,
            None => self.get("/v1/pgs").await,
        }
    }

    /// Asks the leader of `pg` to scrub it now (`deep`: read and check all data too). Answers
    /// the request, or the one of the same kind already pending.
    pub async fn scrub_pg(&self, pg: PgId, deep: bool) -> Result<ScrubRequest, MonError> {
        // The body has no type in `fastblock_types::api` (see the monitor's `scrub_pg`).
        let body = serde_json::json!({ "deep": deep });
        self.post(&format!("/v1/pgs/{pg}/scrub"), &body).await
    }

    pub async fn leader_elected(
        &self,
        pg: PgId,
        req: &LeaderElectedRequest,
    ) -> Result<PgReportResponse, MonError> {
        self.post(&format!("/v1/pgs/{pg}/leader"), req).await
    }

    pub async fn membership_finished(
        &self,
        pg: PgId,
        req: &MembershipFinishedRequest,
    ) -> Result<PgReportResponse, MonError> {
        self.post(&format!("/v1/pgs/{pg}/membership"), req).await
    }

    pub async fn images(&self, pool: Option<&str>) -> Result<Vec<ImageInfo>, MonError> {
        let r: ImageList = match pool {
            Some(p) => self.get(&format!("/v1/images?pool={p}")).await?,
            None => self.get("/v1/images").await?,
        };
        Ok(r.images)
    }

    pub async fn create_image(&self, req: &CreateImageRequest) -> Result<ImageInfo, MonError> {
        self.post("/v1/images", req).await
    }

    pub async fn image(&self, pool: &str, name: &str) -> Result<ImageInfo, MonError> {
        self.get(&format!("/v1/images/{pool}/{name}")).await
    }

    pub async fn remove_image(&self, pool: &str, name: &str) -> Result<ImageInfo, MonError> {
        self.call(
            Method::DELETE,
            &format!("/v1/images/{pool}/{name}"),
            None::<&()>,
        )
        .await
    }

    pub async fn resize_image(
        &self,
        pool: &str,
        name: &str,
        req: &ResizeImageRequest,
    ) -> Result<ImageInfo, MonError> {
        self.post(&format!("/v1/images/{pool}/{name}/resize"), req)
            .await
    }

    /// Takes snapshot `snap` of `pool/name`: answers once every PG of the pool applied its
    /// mark (`created`), or fails with `snap_create_timed_out` after the monitor's
    /// `--snap-create-timeout-ms` (the snapshot is then aborted). Each attempt waits that
    /// long at most, plus the usual request timeout.
    pub async fn create_snap(
        &self,
        pool: &str,
        name: &str,
        snap: &str,
    ) -> Result<SnapInfo, MonError> {
        let body = CreateSnapRequest { name: snap.into() };
        let body = Bytes::from(serde_json::to_vec(&body).expect("request serializes"));
        let timeout = self.request_timeout + Duration::from_millis(SNAP_CREATE_TIMEOUT_MS_MAX);
        let (bytes, _) = self
            .call_raw(
                Method::POST,
                &format!("/v1/images/{pool}/{name}/snaps"),
                Some(body),
                timeout,
            )
            .await?;
        decode(&self.endpoints.join(","), &bytes)
    }

    /// The snapshots of `pool/name`, sorted by id.
    pub async fn snaps(&self, pool: &str, name: &str) -> Result<Vec<SnapInfo>, MonError> {
        self.get(&format!("/v1/images/{pool}/{name}/snaps")).await
    }

    pub async fn remove_snap(
        &self,
        pool: &str,
        name: &str,
        snap: &str,
    ) -> Result<SnapInfo, MonError> {
        self.call(
            Method::DELETE,
            &format!("/v1/images/{pool}/{name}/snaps/{snap}"),
            None::<&()>,
        )
        .await
    }

    pub async fn protect_snap(
        &self,
        pool: &str,
        name: &str,
        snap: &str,
    ) -> Result<SnapInfo, MonError> {
        self.post(
            &format!("/v1/images/{pool}/{name}/snaps/{snap}/protect"),
            &(),
        )
        .await
    }

    pub async fn unprotect_snap(
        &self,
        pool: &str,
        name: &str,
        snap: &str,
    ) -> Result<SnapInfo, MonError> {
        self.post(
            &format!("/v1/images/{pool}/{name}/snaps/{snap}/unprotect"),
            &(),
        )
        .await
    }

    /// The images cloned from `pool/name@snap`.
    pub async fn snap_children(
        &self,
        pool: &str,
        name: &str,
        snap: &str,
    ) -> Result<Vec<ImageInfo>, MonError> {
        self.get(&format!("/v1/images/{pool}/{name}/snaps/{snap}/children"))
            .await
    }

    /// Creates image `target_pool/target_name` as a clone of `pool/name@snap`.
    pub async fn clone_snap(
        &self,
        pool: &str,
        name: &str,
        snap: &str,
        target_pool: &str,
        target_name: &str,
    ) -> Result<ImageInfo, MonError> {
        let req = CloneRequest {
            pool: target_pool.into(),
            name: target_name.into(),
        };
        self.post(
            &format!("/v1/images/{pool}/{name}/snaps/{snap}/clone"),
            &req,
        )
        .await
    }

    /// The clone `pool/name` holds all its parent's data now: it stops reading through.
    pub async fn flatten_done(&self, pool: &str, name: &str) -> Result<ImageInfo, MonError> {
        self.post(&format!("/v1/images/{pool}/{name}/flatten-done"), &())
            .await
    }

    /// A PG leader confirms it applied the mark of snapshot `snap` of `image`.
    pub async fn snap_pg_done(
        &self,
        image: ImageId,
        snap: SnapId,
        pg: PgId,
    ) -> Result<SnapPgDoneResponse, MonError> {
        self.post(&format!("/v1/snaps/{image}/{snap}/pgs/{pg}"), &())
            .await
    }

    /// Snapshots whose data the PGs must drop.
    pub async fn snap_trims(&self) -> Result<Vec<SnapTrimEntry>, MonError> {
        self.get("/v1/snaptrim").await
    }

    /// A PG leader confirms it applied snapshot trim `id`.
    pub async fn snap_trim_pg_done(
        &self,
        id: u64,
        pg: PgId,
    ) -> Result<SnapTrimPgDoneResponse, MonError> {
        self.post(&format!("/v1/snaptrim/{id}/pgs/{pg}"), &()).await
    }

    pub async fn flags(&self) -> Result<Flags, MonError> {
        self.get("/v1/flags").await
    }

    pub async fn set_flag(&self, flag: &str, value: bool) -> Result<Flags, MonError> {
        let method = if value { Method::PUT } else { Method::DELETE };
        self.call(method, &format!("/v1/flags/{flag}"), None::<&()>)
            .await
    }

    pub async fn reclaim(&self) -> Result<Vec<ReclaimEntry>, MonError> {
        self.get("/v1/reclaim").await
    }

    /// The key table (admin).
    pub async fn auth_list(&self) -> Result<Vec<AuthEntityInfo>, MonError> {
        self.get("/v1/auth").await
    }

    /// Creates `entity` with `caps`; returns it with its new key.
    pub async fn auth_add(&self, entity: &str, caps: &str) -> Result<EntityKey, MonError> {
        let r: AuthKeyResponse = self
            .post(
                "/v1/auth",
                &AuthAddRequest {
                    entity: entity.into(),
                    caps: caps.into(),
                },
            )
            .await?;
        self.open_key(r)
    }

    /// `entity`'s key, created with `caps` if it has none.
    pub async fn auth_get_or_create(
        &self,
        entity: &str,
        caps: &str,
    ) -> Result<EntityKey, MonError> {
        let r: AuthKeyResponse = self
            .post(
                &format!("/v1/auth/{entity}/get-or-create"),
                &AuthCapsRequest { caps: caps.into() },
            )
            .await?;
        self.open_key(r)
    }

    pub async fn auth_caps(&self, entity: &str, caps: &str) -> Result<AuthEntityInfo, MonError> {
        self.post(
            &format!("/v1/auth/{entity}/caps"),
            &AuthCapsRequest { caps: caps.into() },
        )
        .await
    }

    /// Gives `entity` a new key (the old one stops working).
    pub async fn auth_rotate(&self, entity: &str) -> Result<EntityKey, MonError> {
        let r: AuthKeyResponse = self.post(&format!("/v1/auth/{entity}/rotate"), &()).await?;
        self.open_key(r)
    }

    pub async fn auth_rm(&self, entity: &str) -> Result<Epoch, MonError> {
        let r: EpochResponse = self
            .call(Method::DELETE, &format!("/v1/auth/{entity}"), None::<&()>)
            .await?;
        Ok(r.epoch)
    }

    pub async fn auth_set_mode(&self, mode: AuthMode) -> Result<AuthSettings, MonError> {
        self.call(
            Method::PUT,
            "/v1/auth/mode",
            Some(&AuthModeRequest { mode }),
        )
        .await
    }

    /// Every entity's caps and generation (OSDs only; `EntityTable::from_response`).
    pub async fn auth_entities(&self) -> Result<AuthEntitiesResponse, MonError> {
        self.get("/v1/auth/entities").await
    }

    /// Tickets for this client's entity to speak to `osds` (at most
    /// [`TICKETS_PER_CALL_MAX`]), each with its session key opened with this client's key.
    /// OSDs the monitor has no key for are left out.
    pub async fn tickets(
        &self,
        osds: &[OsdId],
    ) -> Result<Vec<(OsdId, fastblock_auth::handshake::HeldTicket)>, MonError> {
        assert!(
            osds.len() <= TICKETS_PER_CALL_MAX,
            "tickets asked in batches"
        );
        let endpoint = self.endpoints.join(",");
        let Some((entity, own)) = &self.credentials else {
            return Err(protocol(&endpoint, "tickets need a key".into()));
        };
        let req = TicketsRequest {
            osds: osds.iter().map(|o| o.0).collect(),
        };
        let resp: TicketsResponse = self.post("/v1/auth/tickets", &req).await?;
        let mut out = Vec::with_capacity(resp.tickets.len());
        for t in resp.tickets {
            let bad =
                |what: String| protocol(&endpoint, format!("ticket for osd.{}: {what}", t.osd));
            let ticket = STANDARD.decode(&t.ticket).map_err(|e| bad(e.to_string()))?;
            let sealed = STANDARD
                .decode(&t.sealed_session_key)
                .map_err(|e| bad(e.to_string()))?;
            let claims =
                fastblock_auth::ticket::claims_of(&ticket).map_err(|e| bad(e.to_string()))?;
            // What the ticket says of its holder must be what we asked for: the session key
            // below is bound to these bytes, so a ticket for another entity or OSD would be
            // refused by the OSD anyway; this says so at once.
            if &claims.entity != entity || claims.target.0 != t.osd || !req.osds.contains(&t.osd) {
                return Err(bad(format!(
                    "issued to {} for osd.{}",
                    claims.entity, claims.target.0
                )));
            }
            let session_key = fastblock_auth::ticket::open_session_key(own, &ticket, &sealed)
                .map_err(|e| bad(e.to_string()))?;
            out.push((
                OsdId(t.osd),
                fastblock_auth::handshake::HeldTicket {
                    ticket,
                    session_key,
                    claims,
                },
            ));
        }
        Ok(out)
    }

    /// Opens a key the monitor sealed for this client's key (or sent in clear in mode none).
    fn open_key(&self, r: AuthKeyResponse) -> Result<EntityKey, MonError> {
        let endpoint = self.endpoints.join(",");
        let bad = |what: String| protocol(&endpoint, format!("key of {}: {what}", r.entity));
        let entity: EntityName = r.entity.parse().map_err(|e| bad(format!("{e}")))?;
        let key = match (&r.key, &self.credentials) {
            (Some(clear), _) => Secret::from_base64(clear).map_err(|e| bad(e.to_string()))?,
            (None, Some((_, own))) => {
                let sealed = STANDARD
                    .decode(&r.sealed_key)
                    .map_err(|e| bad(e.to_string()))?;
                let binding = KeyBinding {
                    entity: &r.entity,
                    caps: &r.caps,
                    generation: r.generation,
                    epoch: r.epoch,
                };
                let plain = open_blob(own, &sealed, &binding).map_err(|e| bad(e.to_string()))?;
                let bytes: [u8; 32] = plain
                    .as_slice()
                    .try_into()
                    .map_err(|_| bad(format!("{} bytes", plain.len())))?;
                Secret::from_bytes(bytes)
            }
            (None, None) => return Err(bad("sealed, and this client has no key".into())),
        };
        Ok(EntityKey {
            entity,
            caps: r.caps,
            generation: r.generation,
            key,
        })
    }

    /// A PG leader confirms that reclaim entry `id`'s range is deleted from `pg`.
    pub async fn reclaim_pg_done(
        &self,
        id: u64,
        pg: PgId,
    ) -> Result<ReclaimPgDoneResponse, MonError> {
        self.post(&format!("/v1/reclaim/{id}/pgs/{pg}"), &()).await
    }
}

/// Seconds since the Unix epoch by this host's clock (0 before it): what signed calls and
/// tickets are timed by.
pub fn now_unix_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn protocol(endpoint: &str, detail: String) -> MonError {
    MonError::Protocol {
        endpoint: endpoint.to_string(),
        detail,
    }
}

fn decode<T: DeserializeOwned>(endpoint: &str, bytes: &[u8]) -> Result<T, MonError> {
    serde_json::from_slice(bytes)
        .map_err(|e| protocol(endpoint, format!("invalid JSON answer: {e}")))
}

#[cfg(test)]
mod tests {
    use super::gunzip;
    use std::io::Write;

    fn gzip(body: &[u8]) -> Vec<u8> {
        let mut w = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        w.write_all(body).unwrap();
        w.finish().unwrap()
    }

    /// Goal: a gzipped answer is decompressed whole, and one that would expand past the bound
    /// (a few KiB that make megabytes) is refused, never held. Method: 1 MiB of zeros packed,
    /// opened with a bound above and one below its size; garbage refused.
    #[test]
    fn a_gzipped_answer_opens_within_its_bound_only() {
        let body = vec![0u8; 1 << 20];
        let packed = gzip(&body);
        assert!(packed.len() < 8 << 10, "{} bytes", packed.len());
        assert_eq!(&gunzip(&packed, 1 << 20).unwrap()[..], &body[..]);
        let e = gunzip(&packed, (1 << 20) - 1).unwrap_err();
        assert!(e.contains("larger than"), "{e}");
        assert!(gunzip(b"not gzip at all", 1 << 20).is_err());
    }
}

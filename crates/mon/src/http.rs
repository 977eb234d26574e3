//! The HTTP + JSON API (documented in `docs/mon-api.md`). Handlers are thin: parse, call one
//! `mon-core` operation through [`Monitor::apply`] or [`Monitor::read`], answer JSON.

use crate::auth_http::{self, Authenticated};
use crate::election::Role;
use crate::forward::{status_of, Forwarder, FORWARDED_HEADER};
use crate::metrics::{ApiLabels, Metrics};
use crate::service::{Book, Monitor};
use crate::supervise::{panic_message, CatchUnwind, Supervisor};
use axum::body::Bytes;
use axum::extract::{MatchedPath, Path, Query, Request, State};
use axum::http::header;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Extension, Json, Router};
use fastblock_auth::EntityName;
use fastblock_mon_core::capacity::df;
use fastblock_mon_core::health::{health, pg_state_counts, DaemonCheck, Health};
use fastblock_mon_core::osd_ops::Flag;
use fastblock_mon_core::scrub_ops::PgScrubStatus;
use fastblock_mon_core::snap_ops::SnapAbort;
use fastblock_mon_core::Reporter;
use fastblock_types::api::*;
use fastblock_types::map::{
    Flags, ImageInfo, OsdInfo, PoolInfo, ReclaimEntry, ScrubRequest, SnapInfo, SnapState,
    SnapTrimEntry, SpaceSettings,
};
use fastblock_types::map_delta::{MapScope, MapUpdate};
use fastblock_types::{Epoch, ImageId, OsdId, PgId, PoolId, SnapId};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest a map long-poll is held.
const LONG_POLL_MS_MAX: u64 = 60_000;
/// Longest a snapshot create call waits between two looks at whether every PG confirmed.
const SNAP_CREATE_LOOK_INTERVAL_MAX: Duration = Duration::from_millis(1000);

pub struct AppState {
    pub mon: Arc<Monitor>,
    pub metrics: Metrics,
    pub forwarder: Forwarder,
    /// The monitor's task failures, for health.
    pub tasks: Arc<Supervisor>,
    /// Nonces of signed calls served within the clock-skew window (`crate::auth_http`).
    pub replays: std::sync::Mutex<fastblock_auth::request::ReplayCache>,
    /// This process's incarnation, drawn at start: calls must be signed for it, so that a
    /// call captured before a restart or a change of leader is not served again
    /// (`crate::auth_http`).
    pub incarnation: String,
    /// The monitors' names from `--initial-cluster`, for `MON_DOWN`; `None` with an external
    /// etcd, where the monitor cannot know how many monitors there should be.
    pub expected_mons: Option<Vec<String>>,
    /// Config calls to OSDs waiting for their heartbeats (`crate::osd_config`).
    pub config_relay: Arc<crate::osd_config::ConfigRelay>,
    /// The OSDs' report batches, committed together (`crate::report_queue`).
    pub reports: crate::report_queue::ReportQueue,
    /// Map answers shared by the holders of one scope (`crate::map_answers`).
    pub map_answers: crate::map_answers::SharedAnswers,
}

type App = State<Arc<AppState>>;

/// An [`ApiError`] as an HTTP response: status from the code, `{"error": ...}` body.
pub struct ApiErr(pub ApiError);

impl From<ApiError> for ApiErr {
    fn from(e: ApiError) -> Self {
        ApiErr(e)
    }
}

impl IntoResponse for ApiErr {
    fn into_response(self) -> Response {
        (status_of(&self.0), Json(ErrorBody { error: self.0 })).into_response()
    }
}

type ApiResult<T> = Result<Json<T>, ApiErr>;

fn invalid(msg: impl Into<String>) -> ApiErr {
    ApiErr(ApiError::new(ErrorCode::InvalidArgument, msg))
}

/// Parses a JSON body into our error format (axum's own rejection is plain text).
fn parse<T: DeserializeOwned>(body: &Bytes) -> Result<T, ApiErr> {
    serde_json::from_slice(body).map_err(|e| invalid(format!("invalid request body: {e}")))
}

fn parse_osd(id: &str) -> Result<OsdId, ApiErr> {
    id.parse()
        .map_err(|_| invalid(format!("invalid osd id {id:?}")))
}

pub fn router(state: Arc<AppState>) -> Router {
    let api = Router::new()
        .route("/v1/health", get(get_health))
        .route("/v1/status", get(get_status))
        .route(
            "/v1/status/public",
            get(crate::status_page::get_public_status),
        )
        .route("/v1/map", get(get_map))
        .route("/v1/osds", get(list_osds))
        .route("/v1/osds/apply-id", post(apply_id))
        .route("/v1/osds/{id}/boot", post(boot))
        .route("/v1/osds/{id}/heartbeat", post(heartbeat))
        .route("/v1/osds/{id}/reports", post(osd_reports))
        .route("/v1/osds/{id}/ops", get(osd_ops))
        .route("/v1/osds/{id}/config", post(osd_config))
        .route("/v1/osds/{id}/out", post(osd_out))
        .route("/v1/osds/{id}/in", post(osd_in))
        .route("/v1/osds/{id}/purge", post(osd_purge))
        .route("/v1/pools", get(list_pools).post(create_pool))
        .route("/v1/pools/{name}", get(get_pool).delete(delete_pool))
        .route("/v1/pgs", get(list_pgs))
        .route("/v1/pgs/{pgid}/leader", post(pg_leader))
        .route("/v1/pgs/{pgid}/membership", post(pg_membership))
        .route("/v1/pgs/{pgid}/scrub", post(scrub_pg))
        .route("/v1/images", get(list_images).post(create_image))
        .route(
            "/v1/images/{pool}/{name}",
            get(get_image).delete(remove_image),
        )
        .route("/v1/images/{pool}/{name}/resize", post(resize_image))
        .route("/v1/images/{pool}/{name}/flatten-done", post(flatten_done))
        .route(
            "/v1/images/{pool}/{name}/snaps",
            get(list_snaps).post(create_snap),
        )
        .route("/v1/images/{pool}/{name}/snaps/{snap}", delete(remove_snap))
        .route(
            "/v1/images/{pool}/{name}/snaps/{snap}/protect",
            post(protect_snap),
        )
        .route(
            "/v1/images/{pool}/{name}/snaps/{snap}/unprotect",
            post(unprotect_snap),
        )
        .route(
            "/v1/images/{pool}/{name}/snaps/{snap}/children",
            get(snap_children),
        )
        .route(
            "/v1/images/{pool}/{name}/snaps/{snap}/clone",
            post(clone_snap),
        )
        .route("/v1/snaps/{image}/{snap}/pgs/{pgid}", post(snap_pg_done))
        .route("/v1/snaptrim", get(list_snap_trims))
        .route("/v1/snaptrim/{id}/pgs/{pgid}", post(snap_trim_pg_done))
        .route("/v1/df", get(get_df))
        .route("/v1/mon/backup", get(get_backup))
        .route("/v1/space/nearfull-ratio", put(set_nearfull_ratio))
        .route("/v1/space/full-ratio", put(set_full_ratio))
        .route("/v1/flags", get(get_flags))
        .route("/v1/flags/{flag}", put(set_flag).delete(unset_flag))
        .route("/v1/reclaim", get(list_reclaim))
        .route("/v1/reclaim/{id}/pgs/{pgid}", post(reclaim_pg_done))
        .route(
            "/v1/auth",
            get(auth_http::auth_list).post(auth_http::auth_add),
        )
        .route("/v1/auth/mode", put(auth_http::auth_set_mode))
        .route("/v1/auth/entities", get(auth_http::auth_entities))
        .route("/v1/auth/tickets", post(auth_http::auth_tickets))
        .route("/v1/auth/{entity}", delete(auth_http::auth_rm))
        .route("/v1/auth/{entity}/caps", post(auth_http::auth_caps))
        .route("/v1/auth/{entity}/rotate", post(auth_http::auth_rotate))
        .route(
            "/v1/auth/{entity}/get-or-create",
            post(auth_http::auth_get_or_create),
        )
        // Innermost: authentication runs where the call is served (after forwarding).
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            auth_http::authenticate,
        ))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            lead_or_forward,
        ))
        .route_layer(middleware::from_fn_with_state(state.clone(), measure));
    let tasks = state.tasks.clone();
    let timing = state.clone();
    Router::new()
        .route("/metrics", get(get_metrics))
        .route("/v1/mon", get(get_mon))
        // The page's files, from any monitor; its data call is forwarded like any other.
        .merge(crate::status_page::asset_routes())
        .merge(api)
        .fallback(|| async {
            ApiErr(ApiError::new(
                ErrorCode::InvalidArgument,
                "no such endpoint",
            ))
        })
        .with_state(state)
        .layer(middleware::from_fn_with_state(tasks, catch_panic))
        // Compresses what was signed (`crate::compress`).
        .layer(middleware::from_fn(crate::compress::compress_answer))
        // Outermost: the map answers' time, compression included.
        .layer(middleware::from_fn_with_state(timing, time_map_answer))
}

/// A handler that panics (a monitor bug) answers `internal` and is counted in health
/// (`MON_TASK_FAILED: API request handler ...`); the monitor and the connection carry on.
/// Without this, the panic would end the connection's task: the caller would see the
/// connection close, and nothing but stderr would know.
pub async fn catch_panic(
    State(tasks): State<Arc<Supervisor>>,
    req: Request,
    next: Next,
) -> Response {
    let what = format!("{} {}", req.method(), req.uri().path());
    match CatchUnwind::new(next.run(req)).await {
        Ok(resp) => resp,
        Err(payload) => {
            let reason = format!("{what} panicked: {}", panic_message(&*payload));
            let failures = tasks.record("API request handler", &reason);
            tracing::error!(failures, "{reason}");
            ApiErr(ApiError::new(
                ErrorCode::Internal,
                format!("monitor bug: {reason}"),
            ))
            .into_response()
        }
    }
}

async fn measure(State(app): App, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_default();
    let method = req.method().to_string();
    let start = Instant::now();
    let resp = next.run(req).await;
    app.metrics
        .api_latency_seconds
        .get_or_create(&ApiLabels { method, route })
        .observe(start.elapsed().as_secs_f64());
    resp
}

/// Serves the call if this monitor leads; otherwise relays it to the leader.
async fn lead_or_forward(State(app): App, req: Request, next: Next) -> Response {
    let role = app.mon.role.borrow().clone();
    let leader = match role {
        Role::Leader { .. } => return next.run(req).await,
        Role::Follower { leader } => leader,
    };
    let no_leader = || {
        ApiErr(ApiError::new(
            ErrorCode::NoLeader,
            "no monitor leads right now; retry",
        ))
    };
    if req.headers().contains_key(FORWARDED_HEADER) {
        return no_leader().into_response();
    }
    match leader {
        Some(l) if l.name != app.mon.me.name => match app.forwarder.forward(&l.api_addr, req).await
        {
            Ok(resp) => resp,
            Err(e) => ApiErr(e).into_response(),
        },
        _ => no_leader().into_response(),
    }
}

async fn get_metrics(State(app): App) -> Response {
    let upkeep = &app.mon.upkeep;
    app.metrics.set_etcd(&upkeep.status(), &upkeep.counts());
    let tasks = app.tasks.checks();
    let mons = members(&app).await;
    let text = match app
        .mon
        .read_with_book(|s, ctx| {
            let now_ms = app.mon.now_ms();
            crate::metrics::Scrape {
                state: s,
                health: full_health(&app, (s, ctx), &tasks, &mons),
                spaces: ctx.stats.spaces(&s.map),
                recovery: ctx.stats.cluster(now_ms).1,
            }
            .render_with(&app.metrics)
        })
        .await
    {
        Ok(text) => text,
        Err(_) => app.metrics.render(None),
    };
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

#[derive(Serialize)]
struct MonView {
    me: MonMember,
    role: &'static str,
    leader: Option<MonMember>,
    /// This monitor's own task failures (health shows the leader's).
    task_failures: Vec<String>,
    /// This monitor's own etcd member as it last saw it (the leader reads the other members'
    /// sizes from here: each member listens for clients on its own host only).
    #[serde(skip_serializing_if = "Option::is_none")]
    etcd_member: Option<fastblock_types::etcd::EtcdMemberStatus>,
}

async fn get_mon(State(app): App) -> Json<MonView> {
    let role = app.mon.role.borrow().clone();
    let (role, leader) = match role {
        Role::Leader { .. } => ("leader", Some(app.mon.me.clone())),
        Role::Follower { leader } => ("follower", leader),
    };
    Json(MonView {
        me: app.mon.me.clone(),
        role,
        leader,
        task_failures: app.tasks.checks().into_iter().map(|c| c.text).collect(),
        etcd_member: app.mon.upkeep.own_member_status(),
    })
}

/// Health as `health` and `status` show it: the checks the state and this daemon's tasks
/// raise, then those from the PG leaders' last reports (refused backfills, blocks a scrub left
/// inconsistent) and the OSDs' space.
fn full_health(
    app: &AppState,
    (s, ctx): (&fastblock_mon_core::MonState, &Book),
    tasks: &[DaemonCheck],
    mons: &[MonMember],
) -> Health {
    let now_ms = app.mon.now_ms();
    let mut h = health(s, tasks);
    if let Some(expected) = &app.expected_mons {
        let live: Vec<&str> = mons.iter().map(|m| m.name.as_str()).collect();
        h.add_mon_down(expected, &live);
    }
    h.add_backfill_too_full(&ctx.stats.backfill_too_full(now_ms));
    h.add_pg_inconsistent(&ctx.scrubs.inconsistent(s));
    h.add_osd_space(&s.map, &ctx.stats.spaces(&s.map));
    h.add_too_many_pgs(&s.map, app.mon.pg_per_osd_max());
    let fresh_ms = ctx.liveness.config().osd_down_after_ms;
    h.add_slow_ops(&ctx.stats.ops.slow(&s.map, now_ms, fresh_ms));
    h.add_auth_downgrade_refused(&s.map, &ctx.stats.auth_floors);
    h.add_etcd(&app.mon.upkeep.status());
    h
}

async fn get_health(State(app): App) -> ApiResult<HealthResponse> {
    let tasks = app.tasks.checks();
    let mons = members(&app).await;
    let view = app
        .mon
        .read_with_book(|s, ctx| {
            let h = full_health(&app, (s, ctx), &tasks, &mons);
            HealthResponse {
                status: h.status.to_string(),
                checks: h.checks,
                epoch: s.map.epoch,
            }
        })
        .await?;
    Ok(Json(view))
}

pub(crate) async fn members(app: &AppState) -> Vec<MonMember> {
    let mut client = app.mon.client.clone();
    let opts = etcd_client::GetOptions::new().with_prefix();
    let Ok(Ok(resp)) = tokio::time::timeout(
        Duration::from_secs(2),
        client.get(app.mon.keys.members_prefix(), Some(opts)),
    )
    .await
    else {
        return vec![app.mon.me.clone()];
    };
    resp.kvs()
        .iter()
        .filter_map(|kv| serde_json::from_slice(kv.value()).ok())
        .collect()
}

async fn get_status(State(app): App) -> ApiResult<StatusResponse> {
    let mons = members(&app).await;
    let tasks = app.tasks.checks();
    let status = app
        .mon
        .read_with_book(|s, ctx| status_view(&app, (s, ctx), &tasks, mons))
        .await?;
    Ok(Json(status))
}

/// What `GET /v1/status` answers, from the leader's state; the status page's public view is
/// cut from it (`crate::status_page`), so both always agree.
pub(crate) fn status_view(
    app: &AppState,
    (s, ctx): (&fastblock_mon_core::MonState, &Book),
    tasks: &[DaemonCheck],
    mons: Vec<MonMember>,
) -> StatusResponse {
    let h = full_health(app, (s, ctx), tasks, &mons);
    let (io, recovery) = ctx.stats.cluster(app.mon.now_ms());
    let osds = s.map.osds.values().filter(|o| !o.pending_create);
    StatusResponse {
        epoch: s.map.epoch,
        health: h.status.to_string(),
        health_checks: h.checks,
        leader: Some(app.mon.me.clone()),
        mons,
        flags: s.map.flags,
        osds_total: osds.clone().count() as u32,
        osds_up: osds.clone().filter(|o| o.up).count() as u32,
        osds_in: osds.filter(|o| o.is_in).count() as u32,
        pools: s.map.pools.len() as u32,
        pgs: s.map.pgmaps.values().map(|m| m.pgs.len() as u32).sum(),
        images: s.images.len() as u32,
        pg_states: pg_state_counts(s),
        io,
        recovery,
        usage: ctx.stats.cluster_usage(&s.map),
        etcd: Some(app.mon.upkeep.status()).filter(|e| e.observed_unix_ms != 0),
    }
}

#[derive(Deserialize)]
struct MapQuery {
    after: Option<u64>,
    timeout_ms: Option<u64>,
    /// The caller takes deltas (`delta=true`; `docs/mon-api.md`, "Incremental maps").
    #[serde(default)]
    delta: bool,
    /// Scope: the PGs of this OSD only.
    osd: Option<u32>,
    /// Scope: the PG maps of these pools only (comma-separated ids).
    pools: Option<String>,
}

impl MapQuery {
    fn scope(&self) -> Result<MapScope, ApiErr> {
        match (&self.osd, &self.pools) {
            (Some(_), Some(_)) => Err(invalid("give osd or pools, not both")),
            (Some(osd), None) => Ok(MapScope::Osd(OsdId(*osd))),
            (None, Some(pools)) => pools
                .split(',')
                .filter(|p| !p.is_empty())
                .map(|p| {
                    p.parse()
                        .map(PoolId)
                        .map_err(|_| invalid(format!("invalid pool id {p:?}")))
                })
                .collect::<Result<_, _>>()
                .map(MapScope::Pools),
            (None, None) => Ok(MapScope::All),
        }
    }
}

/// A map answer to a long-poll that waited for a new epoch: when that epoch was published.
/// The outermost layer times the answer from it (`time_map_answer`).
#[derive(Clone, Copy, Debug)]
struct WokenBy(Option<std::time::Instant>);

async fn get_map(State(app): App, Query(q): Query<MapQuery>) -> Result<Response, ApiErr> {
    let scope = q.scope()?;
    let mut epochs = app.mon.epoch.subscribe();
    let came = std::time::Instant::now();
    let mut woken = WokenBy(None);
    if let Some(after) = q.after {
        // Make sure the state (and so the published epoch) is loaded before waiting on it.
        app.mon.read(|_| ()).await?;
        let timeout = Duration::from_millis(q.timeout_ms.unwrap_or(30_000).min(LONG_POLL_MS_MAX));
        // Out of time, or the monitor stopping: the epoch as it is.
        let _ = tokio::time::timeout(timeout, epochs.wait_for(|p| p.epoch.0 > after)).await;
        let published = *epochs.borrow();
        if published.epoch.0 <= after {
            return Ok((
                Extension(woken),
                Json(MapResponse {
                    epoch: published.epoch,
                    map: None,
                    delta: None,
                }),
            )
                .into_response());
        }
        // Timed only when the call waited for the epoch: one that came after it was late
        // by its own doing.
        if published.at >= came {
            woken = WokenBy(Some(published.at));
        }
    }
    let answer = |r: MapResponse| Ok((Extension(woken), Json(r)).into_response());
    if q.delta {
        // Cut from the log of deltas, outside the state's lock.
        app.mon.read(|_| ()).await?;
        let have = Epoch(q.after.unwrap_or(0));
        let log = app.mon.map_log.read().expect("map log lock");
        if let Some(epoch) = log.as_ref().map(|l| l.current().epoch) {
            if matches!(scope, MapScope::Osd(_)) {
                let update = log.as_ref().map(|l| l.update_for(have, &scope));
                drop(log);
                return answer(map_response(epoch, update.unwrap_or(MapUpdate::UpToDate)));
            }
            // A client's or an admin's scope: the same answer for every holder at `have`,
            // cut under the log's lock and encoded after it. Holders asking together wait
            // for the one encoding (`crate::cpu::heavy`: off this worker's other tasks).
            let key = crate::map_answers::AnswerKey {
                epoch,
                have,
                scope: scope.clone(),
            };
            let mut log = Some(log);
            let shared = crate::cpu::heavy(|| {
                app.map_answers.get_or_encode(key, || {
                    let held = log.take()?;
                    let update = held.as_ref()?.update_for(have, &scope);
                    drop(held);
                    if update == MapUpdate::UpToDate {
                        return None;
                    }
                    let json = serde_json::to_vec(&map_response(epoch, update));
                    Some(Bytes::from(json.expect("a map encodes as JSON")))
                })
            });
            drop(log);
            let Some(shared) = shared else {
                return answer(map_response(epoch, MapUpdate::UpToDate));
            };
            let mut resp = (
                [(header::CONTENT_TYPE, "application/json")],
                shared.json.clone(),
            )
                .into_response();
            resp.extensions_mut().insert(woken);
            resp.extensions_mut()
                .insert(crate::map_answers::SharedAnswer(shared));
            return Ok(resp);
        }
    }
    let map = app.mon.read(|s| scope.map(&s.map)).await?;
    answer(MapResponse {
        epoch: map.epoch,
        map: Some(map),
        delta: None,
    })
}

fn map_response(epoch: Epoch, update: MapUpdate) -> MapResponse {
    match update {
        MapUpdate::UpToDate => MapResponse {
            epoch,
            map: None,
            delta: None,
        },
        MapUpdate::Delta(d) => MapResponse {
            epoch,
            map: None,
            delta: Some(d),
        },
        MapUpdate::Full(m) => MapResponse {
            epoch,
            map: Some(m),
            delta: None,
        },
    }
}

/// Times the map answers that waited for an epoch, from its publication to the answer leaving
/// the handlers (cut, encoded, signed and compressed): the monitor's share of the time an
/// epoch takes to reach its holders (`docs/scale.md`).
async fn time_map_answer(State(app): App, req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    if let Some(WokenBy(Some(at))) = resp.extensions().get::<WokenBy>() {
        app.metrics
            .map_wait_answer_seconds
            .observe(at.elapsed().as_secs_f64());
    }
    resp
}

/// `GET /v1/mon/backup`: every key of the cluster's state at one etcd revision
/// (`crate::backup`). Administrators only: it holds the key table.
async fn get_backup(State(app): App) -> ApiResult<fastblock_types::etcd::MonBackup> {
    // Served by the leader, like every call, so that a backup is never of a monitor that has
    // lost touch with etcd's quorum.
    app.mon.read(|_| ()).await?;
    let mut client = app.mon.client.clone();
    let backup = crate::backup::read(&mut client, &app.mon.keys, app.mon.unix_ms())
        .await
        .map_err(|e| match e {
            crate::backup::BackupError::Etcd(e) => {
                ApiError::new(ErrorCode::Unavailable, format!("etcd unavailable: {e}"))
            }
            other => ApiError::new(ErrorCode::Internal, other.to_string()),
        })?;
    tracing::info!(
        revision = backup.revision, epoch = %backup.epoch, keys = backup.keys.len(),
        "backup taken"
    );
    Ok(Json(backup))
}

async fn list_osds(State(app): App) -> ApiResult<Vec<OsdInfo>> {
    Ok(Json(
        app.mon
            .read(|s| s.map.osds.values().cloned().collect())
            .await?,
    ))
}

async fn apply_id(State(app): App, body: Bytes) -> ApiResult<ApplyIdResponse> {
    let req: ApplyIdRequest = parse(&body)?;
    let id = app.mon.apply(|s, _| s.apply_id(&req.uuid)).await?;
    Ok(Json(ApplyIdResponse { id }))
}

async fn boot(State(app): App, Path(id): Path<String>, body: Bytes) -> ApiResult<EpochResponse> {
    let id = parse_osd(&id)?;
    let req: BootRequest = parse(&body)?;
    app.mon
        .apply(|s, side| {
            s.boot(id, &req)?;
            let mut book = side.book();
            book.liveness.heartbeat(id, side.now_ms);
            book.stats.forget(id);
            book.scrubs.forget_osd(id);
            Ok(())
        })
        .await?;
    tracing::info!(osd = %id, address = %req.address, port = req.port, "osd booted");
    Ok(Json(EpochResponse {
        epoch: app.mon.published_epoch(),
    }))
}

async fn heartbeat(
    State(app): App,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<HeartbeatResponse> {
    let id = parse_osd(&id)?;
    let req: HeartbeatRequest = parse(&body)?;
    // What changes nothing first, without a copy of the state (`fastblock_mon_core::heartbeat`);
    // then, only if the heartbeat changes the state, an operation.
    let changes = app
        .mon
        .observe(|s, side| {
            s.check_heartbeat(id, &req)?;
            let mut book = side.book();
            book.liveness.heartbeat(id, side.now_ms);
            book.stats
                .record(id, side.now_ms, &req.pgs, &req.backfill_toofull, req.space);
            book.stats.ops.record(id, side.now_ms, req.ops.clone());
            if let Some(floor) = req.auth_floor {
                book.stats.auth_floors.insert(id, floor);
            }
            s.record_scrub_reports(id, &req.pgs, &mut book.scrubs, side.unix_ms);
            Ok(s.heartbeat_changes(id, &req))
        })
        .await?;
    let done = if changes {
        app.mon.apply(|s, _| s.apply_heartbeat(id, &req)).await?
    } else {
        Vec::new()
    };
    for r in done {
        tracing::info!(pg = %r.pg, id = r.id, deep = r.deep, osd = %id, "scrub request done");
    }
    // Only once the heartbeat is accepted (the uuid checked): its replies are this OSD's.
    let config_calls = app.config_relay.exchange(id, req.config_replies);
    // `apply` bumped the epoch if the OSD came back up; report the published one.
    Ok(Json(HeartbeatResponse {
        epoch: app.mon.published_epoch(),
        config_calls,
    }))
}

/// How long a config call waits for the OSD's reply: it goes out in the OSD's next heartbeat
/// answer and its reply comes in the heartbeat after, two heartbeat intervals (1 s by
/// default). Shorter than a client's request timeout, so the caller hears why.
const OSD_CONFIG_WAIT_MS: u64 = 5_000;

/// `config show|get|set` on an OSD, relayed in its heartbeats (`crate::osd_config`).
async fn osd_config(
    State(app): App,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<fastblock_types::daemon_config::AdminReply> {
    let id = parse_osd(&id)?;
    let request: fastblock_types::daemon_config::AdminRequest = parse(&body)?;
    app.mon
        .read(|s| match s.map.osds.get(&id) {
            None => Err(s.missing_osd_error(id)),
            Some(osd) if !osd.up => Err(ApiError::new(
                ErrorCode::OsdDown,
                format!("osd.{id} is down: it takes config calls in its heartbeats"),
            )),
            Some(_) => Ok(()),
        })
        .await??;
    let mut call = app.config_relay.submit(id, request).map_err(|_| {
        ApiErr(ApiError::new(
            ErrorCode::Busy,
            format!(
                "osd.{id} has {} config calls pending already; retry once they are answered",
                crate::osd_config::CALLS_PENDING_PER_OSD_MAX
            ),
        ))
    })?;
    let timed_out = || {
        ApiErr(ApiError::new(
            ErrorCode::OsdTimedOut,
            format!(
                "osd.{id} did not answer within {OSD_CONFIG_WAIT_MS} ms (it may have applied \
                 the call or not: check with config get)"
            ),
        ))
    };
    match tokio::time::timeout(Duration::from_millis(OSD_CONFIG_WAIT_MS), &mut call.reply).await {
        Ok(Ok(reply)) => Ok(Json(reply)),
        // The sender is dropped only with the call; counted as no answer.
        Ok(Err(_)) | Err(_) => Err(timed_out()),
    }
}

async fn osd_out(State(app): App, Path(id): Path<String>) -> ApiResult<EpochResponse> {
    let id = parse_osd(&id)?;
    app.mon.apply(|s, _| s.mark_out(id)).await?;
    Ok(Json(EpochResponse {
        epoch: app.mon.published_epoch(),
    }))
}

async fn osd_in(State(app): App, Path(id): Path<String>) -> ApiResult<EpochResponse> {
    let id = parse_osd(&id)?;
    app.mon.apply(|s, _| s.mark_in(id)).await?;
    Ok(Json(EpochResponse {
        epoch: app.mon.published_epoch(),
    }))
}

/// Removes a down, out OSD that no PG names, for good (`fastblock_mon_core::osd_purge`), and
/// forgets what this leader kept about it.
async fn osd_purge(State(app): App, Path(id): Path<String>) -> ApiResult<EpochResponse> {
    let id = parse_osd(&id)?;
    app.mon
        .apply(|s, side| {
            s.purge_osd(id)?;
            let mut book = side.book();
            book.liveness.forget(id);
            book.stats.forget(id);
            book.scrubs.forget_osd(id);
            Ok(())
        })
        .await?;
    tracing::info!(osd = %id, "osd purged");
    Ok(Json(EpochResponse {
        epoch: app.mon.published_epoch(),
    }))
}

async fn list_pools(State(app): App) -> ApiResult<PoolList> {
    let (pools, usage) = app
        .mon
        .read_with_book(|s, ctx| {
            let pools = s.map.pools.values().cloned().collect();
            (pools, ctx.stats.pool_usage(&s.map))
        })
        .await?;
    Ok(Json(PoolList { pools, usage }))
}

async fn create_pool(State(app): App, body: Bytes) -> ApiResult<PoolInfo> {
    let req: CreatePoolRequest = parse(&body)?;
    let max = app.mon.pg_per_osd_max();
    Ok(Json(
        app.mon
            .apply(|s, _| s.create_pool_within(&req, max))
            .await?,
    ))
}

async fn get_pool(State(app): App, Path(name): Path<String>) -> ApiResult<PoolInfo> {
    Ok(Json(
        app.mon.read(|s| s.pool_by_name(&name).cloned()).await??,
    ))
}

#[derive(Deserialize)]
struct ForceQuery {
    #[serde(default)]
    force: bool,
}

async fn delete_pool(
    State(app): App,
    Path(name): Path<String>,
    Query(q): Query<ForceQuery>,
) -> ApiResult<PoolInfo> {
    Ok(Json(
        app.mon
            .apply(|s, side| {
                let pool = s.delete_pool(&name, q.force)?;
                let mut book = side.book();
                book.stats.forget_pool(pool.id);
                book.scrubs.forget_pool(pool.id);
                Ok(pool)
            })
            .await?,
    ))
}

#[derive(Deserialize)]
struct PoolQuery {
    pool: Option<String>,
}

/// `GET /v1/pgs`: `PgList` whose rows carry the PG's scrub state beside their fields (added
/// fields only, so readers of `PgRow` keep working). The CLI reads it with its own mirror of
/// these fields (`fastblock_cli::pg`, `pg ls`): `fastblock_types::api` holds the scrub
/// contract with the OSDs and is left as it is.
#[derive(Serialize)]
struct PgListView {
    epoch: Epoch,
    pgs: Vec<PgRowView>,
}

#[derive(Serialize)]
struct PgRowView {
    #[serde(flatten)]
    row: PgRow,
    scrub: PgScrubView,
}

/// What this monitor knows of a PG's scrubs (`PgScrubStatus`: the last report, and when
/// scrubs and deep scrubs last finished by its clock), and the blocks left inconsistent.
#[derive(Serialize)]
struct PgScrubView {
    #[serde(flatten)]
    status: PgScrubStatus,
    inconsistent_blocks_left: Option<u64>,
}

async fn list_pgs(State(app): App, Query(q): Query<PoolQuery>) -> ApiResult<PgListView> {
    let list = app
        .mon
        .read_with_book(|s, ctx| {
            let pool_id = match &q.pool {
                Some(name) => Some(s.pool_by_name(name)?.id),
                None => None,
            };
            let mut pgs = Vec::new();
            for (pool, map) in &s.map.pgmaps {
                if pool_id.is_some_and(|p| p != *pool) {
                    continue;
                }
                for (seq, pg) in &map.pgs {
                    let pgid = PgId::new(*pool, *seq);
                    let status = ctx.scrubs.status(pgid).copied().unwrap_or_default();
                    pgs.push(PgRowView {
                        row: PgRow {
                            pgid,
                            state_name: pg.state.name(),
                            info: pg.clone(),
                        },
                        scrub: PgScrubView {
                            status,
                            inconsistent_blocks_left: status.blocks_left(),
                        },
                    });
                }
            }
            Ok::<_, ApiError>(PgListView {
                epoch: s.map.epoch,
                pgs,
            })
        })
        .await??;
    Ok(Json(list))
}

fn parse_pg(pgid: &str) -> Result<PgId, ApiErr> {
    pgid.parse()
        .map_err(|e: fastblock_types::ids::PgIdParseError| invalid(e.to_string()))
}

/// Who sent a PG report, for mon-core's checks (`Reporter`): the OSD whose key signed it, or
/// nobody in auth mode `none`. The route already demands the `osd` cap, which only `osd.N`
/// entities hold; anything else is refused here too rather than trusted.
/// `POST /v1/osds/{id}/reports`: an OSD's reports in one batch, committed with the other
/// batches of the moment (`crate::report_queue`); one result per report.
async fn osd_reports(
    State(app): App,
    Extension(sender): Extension<Authenticated>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<ReportBatchResponse> {
    let id = parse_osd(&id)?;
    let batch: ReportBatch = parse(&body)?;
    if batch.reports.len() > REPORT_BATCH_ITEMS_MAX {
        return Err(invalid(format!(
            "{} reports in one batch, at most {REPORT_BATCH_ITEMS_MAX}",
            batch.reports.len()
        )));
    }
    let reporter = match reporter(&sender)? {
        // The route is the OSD's own (authentication checked that `osd.{id}` sent it).
        Reporter::Osd(osd) if osd != id => {
            return Err(ApiErr(ApiError::new(
                ErrorCode::PermissionDenied,
                format!("osd {osd} sent reports for osd {id}"),
            )))
        }
        r => r,
    };
    let (epoch, results) = app.reports.submit(reporter, batch.reports).await?;
    Ok(Json(ReportBatchResponse { epoch, results }))
}

fn reporter(sender: &Authenticated) -> Result<Reporter, ApiErr> {
    match &sender.0 {
        None => Ok(Reporter::Unauthenticated),
        Some(EntityName::Osd(id)) => Ok(Reporter::Osd(*id)),
        Some(other) => Err(ApiErr(ApiError::new(
            ErrorCode::PermissionDenied,
            format!("{other} is not an OSD and cannot report for a PG"),
        ))),
    }
}

/// The body of `POST /v1/pgs/{pgid}/scrub`. Not in `fastblock_types::api`, which holds the
/// scrub contract with the OSDs as it is; `fastblock_monclient::MonClient::scrub_pg` sends
/// the same JSON.
#[derive(Deserialize)]
struct ScrubPgBody {
    #[serde(default)]
    deep: bool,
}

/// An operator asks for a scrub of a PG: the request (new, or the pending one of the same
/// kind), which the map carries until the PG's leader reports it done.
async fn scrub_pg(
    State(app): App,
    Path(pgid): Path<String>,
    body: Bytes,
) -> ApiResult<ScrubRequest> {
    let pg = parse_pg(&pgid)?;
    let req: ScrubPgBody = parse(&body)?;
    let request = app.mon.apply(|s, _| s.request_scrub(pg, req.deep)).await?;
    tracing::info!(pg = %pg, id = request.id, deep = request.deep, "scrub requested");
    Ok(Json(request))
}

async fn pg_leader(
    State(app): App,
    Extension(sender): Extension<Authenticated>,
    Path(pgid): Path<String>,
    body: Bytes,
) -> ApiResult<PgReportResponse> {
    let reporter = reporter(&sender)?;
    let pg = parse_pg(&pgid)?;
    let req: LeaderElectedRequest = parse(&body)?;
    pg_report(&app, pg, |s| s.leader_elected(pg, &req, reporter)).await
}

async fn pg_membership(
    State(app): App,
    Extension(sender): Extension<Authenticated>,
    Path(pgid): Path<String>,
    body: Bytes,
) -> ApiResult<PgReportResponse> {
    let reporter = reporter(&sender)?;
    let pg = parse_pg(&pgid)?;
    let req: MembershipFinishedRequest = parse(&body)?;
    pg_report(&app, pg, |s| s.membership_finished(pg, &req, reporter)).await
}

/// Applies a PG leader's report and answers with the PG as committed (its state re-derived).
async fn pg_report<T>(
    app: &AppState,
    pg: PgId,
    op: impl Fn(&mut fastblock_mon_core::MonState) -> Result<T, ApiError>,
) -> ApiResult<PgReportResponse> {
    app.mon.apply(|s, _| op(s)).await?;
    let info = app.mon.read(|s| s.map.pg(pg).cloned()).await?;
    let info = info.ok_or_else(|| {
        ApiErr(ApiError::new(
            ErrorCode::PgNotFound,
            format!("pg {pg} was deleted"),
        ))
    })?;
    Ok(Json(PgReportResponse {
        epoch: app.mon.published_epoch(),
        pg: info,
    }))
}

/// The caller's caps, for the image-record routes (always set by `auth_http::authenticate`
/// on them; absent only if a route skipped it, which then sees everything as in mode none).
type Caller = Option<Extension<crate::auth_http::CallerCaps>>;

fn caller_caps(caller: Caller) -> crate::auth_http::CallerCaps {
    caller.map_or(crate::auth_http::CallerCaps(None), |Extension(c)| c)
}

/// The images of the pools the caller may see (`pool`: of that pool only).
async fn list_images(
    State(app): App,
    caller: Caller,
    Query(q): Query<PoolQuery>,
) -> ApiResult<ImageList> {
    let caller = caller_caps(caller);
    if let Some(pool) = &q.pool {
        caller.check_pool(pool)?;
    }
    let images = app
        .mon
        .read(|s| {
            let pool_id = match &q.pool {
                Some(name) => Some(s.pool_by_name(name)?.id),
                None => None,
            };
            Ok::<_, ApiError>(
                s.images
                    .values()
                    .filter(|i| pool_id.is_none_or(|p| p == i.pool))
                    .filter(|i| caller.sees_pool(&i.pool_name))
                    .cloned()
                    .collect(),
            )
        })
        .await??;
    Ok(Json(ImageList { images }))
}

async fn create_image(State(app): App, body: Bytes) -> ApiResult<ImageInfo> {
    let req: CreateImageRequest = parse(&body)?;
    Ok(Json(app.mon.apply(|s, _| s.create_image(&req)).await?))
}

async fn get_image(
    State(app): App,
    caller: Caller,
    Path((pool, name)): Path<(String, String)>,
) -> ApiResult<ImageInfo> {
    caller_caps(caller).check_pool(&pool)?;
    Ok(Json(
        app.mon.read(|s| s.image(&pool, &name).cloned()).await??,
    ))
}

async fn remove_image(
    State(app): App,
    Path((pool, name)): Path<(String, String)>,
) -> ApiResult<ImageInfo> {
    Ok(Json(
        app.mon.apply(|s, _| s.remove_image(&pool, &name)).await?,
    ))
}

async fn resize_image(
    State(app): App,
    Path((pool, name)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult<ImageInfo> {
    let req: ResizeImageRequest = parse(&body)?;
    Ok(Json(
        app.mon
            .apply(|s, _| s.resize_image(&pool, &name, &req))
            .await?,
    ))
}

/// The op tracker of one OSD, as of its last heartbeat (`docs/operations.md`, "Slow ops").
async fn osd_ops(State(app): App, Path(id): Path<String>) -> ApiResult<OsdOpsResponse> {
    let id = parse_osd(&id)?;
    let now_ms = app.mon.now_ms();
    let found = app
        .mon
        .read_with_book(|s, ctx| {
            if !s.map.osds.contains_key(&id) {
                return Err(ApiError::new(
                    ErrorCode::OsdNotFound,
                    format!("osd {id} does not exist"),
                ));
            }
            ctx.stats.ops.of(id, now_ms).ok_or_else(|| {
                ApiError::new(
                    ErrorCode::OsdDown,
                    format!("osd.{id} has sent no op report (is it up?)"),
                )
            })
        })
        .await??;
    Ok(Json(found))
}

async fn get_df(State(app): App) -> ApiResult<DfResponse> {
    Ok(Json(
        app.mon
            .read_with_book(|s, ctx| {
                let usage = ctx.stats.pool_usage(&s.map);
                df(&s.map, &usage, &ctx.stats.spaces(&s.map))
            })
            .await?,
    ))
}

async fn set_nearfull_ratio(State(app): App, body: Bytes) -> ApiResult<SpaceSettings> {
    let req: SetRatioRequest = parse(&body)?;
    let set = app
        .mon
        .apply(|s, _| {
            s.set_nearfull_ratio(req.ratio)?;
            Ok(s.map.space.clone())
        })
        .await?;
    Ok(Json(set))
}

async fn set_full_ratio(State(app): App, body: Bytes) -> ApiResult<SpaceSettings> {
    let req: SetRatioRequest = parse(&body)?;
    let set = app
        .mon
        .apply(|s, side| {
            let spaces = side.book().stats.last_spaces();
            s.set_full_ratio(req.ratio, &spaces)?;
            Ok(s.map.space.clone())
        })
        .await?;
    Ok(Json(set))
}

async fn get_flags(State(app): App) -> ApiResult<Flags> {
    Ok(Json(app.mon.read(|s| s.map.flags).await?))
}

async fn set_flag(State(app): App, Path(flag): Path<String>) -> ApiResult<Flags> {
    change_flag(app, flag, true).await
}

async fn unset_flag(State(app): App, Path(flag): Path<String>) -> ApiResult<Flags> {
    change_flag(app, flag, false).await
}

async fn change_flag(app: Arc<AppState>, flag: String, value: bool) -> ApiResult<Flags> {
    let flag: Flag = flag.parse().map_err(invalid)?;
    Ok(Json(
        app.mon
            .apply(|s, _| {
                s.set_flag(flag, value);
                Ok(s.map.flags)
            })
            .await?,
    ))
}

async fn list_reclaim(State(app): App) -> ApiResult<Vec<ReclaimEntry>> {
    Ok(Json(
        app.mon
            .read(|s| s.reclaim.values().cloned().collect())
            .await?,
    ))
}

/// A PG leader confirms a reclaim entry's range is deleted from its PG.
async fn reclaim_pg_done(
    State(app): App,
    Extension(sender): Extension<Authenticated>,
    Path((id, pgid)): Path<(String, String)>,
) -> ApiResult<ReclaimPgDoneResponse> {
    let id: u64 = id
        .parse()
        .map_err(|_| invalid(format!("invalid reclaim id {id:?}")))?;
    let pg = parse_pg(&pgid)?;
    let reporter = reporter(&sender)?;
    let finished = app
        .mon
        .apply(|s, _| {
            s.check_confirmation(reporter, pg)?;
            s.reclaim_pg_done(id, pg)
        })
        .await?;
    Ok(Json(ReclaimPgDoneResponse { finished }))
}

async fn list_snaps(
    State(app): App,
    caller: Caller,
    Path((pool, name)): Path<(String, String)>,
) -> ApiResult<Vec<SnapInfo>> {
    caller_caps(caller).check_pool(&pool)?;
    Ok(Json(app.mon.read(|s| s.list_snaps(&pool, &name)).await??))
}

/// Records the snapshot, then waits (bounded by `--snap-create-timeout-ms`) until every PG of
/// the pool confirmed its mark; on timeout the snapshot is aborted and the call fails naming
/// the PGs that did not confirm. The wait polls the state: confirmations arrive as separate
/// calls, each its own operation.
async fn create_snap(
    State(app): App,
    Path((pool, name)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult<SnapInfo> {
    let req: CreateSnapRequest = parse(&body)?;
    let timeout_ms = app.mon.snap_create_timeout_ms;
    let deadline = Instant::now() + Duration::from_millis(timeout_ms);
    let snap = app
        .mon
        .apply(|s, side| s.create_snap(&pool, &name, &req.name, side.unix_ms))
        .await?;
    tracing::info!(%pool, image = %name, snap = %snap.name, id = %snap.id, "snapshot creating");
    let (image, id) = (snap.image, snap.id);
    // The error once the snapshot is gone (aborted), from its last state seen.
    let timed_out = |s: &fastblock_mon_core::MonState, last: &SnapInfo| {
        s.snap_timed_out_error(last, &s.snap_missing_pgs(last), timeout_ms)
    };
    let mut last = snap;
    let mut epochs = app.mon.epoch.subscribe();
    loop {
        epochs.borrow_and_update();
        let now = app
            .mon
            .read(|s| {
                s.snap_by_id(image, id)
                    .cloned()
                    .ok_or_else(|| timed_out(s, &last))
            })
            .await??;
        if now.state == SnapState::Created {
            return Ok(Json(now));
        }
        last = now;
        if Instant::now() >= deadline {
            break;
        }
        // The snapshot changes only with a commit: look again at the next epoch rather than
        // on a short timer (each look copies its done set, up to the pool's PG count), and at
        // least every second (a monitor that stopped leading publishes no epoch; the look
        // then fails with the reason).
        let left = deadline
            .saturating_duration_since(Instant::now())
            .min(SNAP_CREATE_LOOK_INTERVAL_MAX);
        if let Ok(Err(_)) = tokio::time::timeout(left, epochs.changed()).await {
            break; // the monitor is stopping
        }
    }
    let outcome = app.mon.apply(|s, _| s.abort_snap_create(image, id)).await?;
    let e = match outcome {
        SnapAbort::Created(done) => return Ok(Json(done)),
        SnapAbort::Aborted { missing_pgs } => {
            app.mon
                .read(|s| s.snap_timed_out_error(&last, &missing_pgs, timeout_ms))
                .await?
        }
        // The ticker aborted it between the last look and the abort.
        SnapAbort::Gone => app.mon.read(|s| timed_out(s, &last)).await?,
    };
    tracing::warn!("{e}");
    Err(ApiErr(e))
}

async fn remove_snap(
    State(app): App,
    Path((pool, name, snap)): Path<(String, String, String)>,
) -> ApiResult<SnapInfo> {
    Ok(Json(
        app.mon
            .apply(|s, _| s.remove_snap(&pool, &name, &snap))
            .await?,
    ))
}

async fn protect_snap(
    State(app): App,
    Path((pool, name, snap)): Path<(String, String, String)>,
) -> ApiResult<SnapInfo> {
    Ok(Json(
        app.mon
            .apply(|s, _| s.protect_snap(&pool, &name, &snap, true))
            .await?,
    ))
}

async fn unprotect_snap(
    State(app): App,
    Path((pool, name, snap)): Path<(String, String, String)>,
) -> ApiResult<SnapInfo> {
    Ok(Json(
        app.mon
            .apply(|s, _| s.protect_snap(&pool, &name, &snap, false))
            .await?,
    ))
}

/// The clones of a snapshot, in the pools the caller may see.
async fn snap_children(
    State(app): App,
    caller: Caller,
    Path((pool, name, snap)): Path<(String, String, String)>,
) -> ApiResult<Vec<ImageInfo>> {
    let caller = caller_caps(caller);
    caller.check_pool(&pool)?;
    let mut children = app
        .mon
        .read(|s| s.snap_children(&pool, &name, &snap))
        .await??;
    children.retain(|c| caller.sees_pool(&c.pool_name));
    Ok(Json(children))
}

async fn clone_snap(
    State(app): App,
    Path((pool, name, snap)): Path<(String, String, String)>,
    body: Bytes,
) -> ApiResult<ImageInfo> {
    let req: CloneRequest = parse(&body)?;
    Ok(Json(
        app.mon
            .apply(|s, _| s.clone_snap(&pool, &name, &snap, &req))
            .await?,
    ))
}

async fn flatten_done(
    State(app): App,
    Path((pool, name)): Path<(String, String)>,
) -> ApiResult<ImageInfo> {
    Ok(Json(
        app.mon.apply(|s, _| s.flatten_done(&pool, &name)).await?,
    ))
}

/// A PG leader confirms it applied a snapshot's mark through its log.
async fn snap_pg_done(
    State(app): App,
    Extension(sender): Extension<Authenticated>,
    Path((image, snap, pgid)): Path<(String, String, String)>,
) -> ApiResult<SnapPgDoneResponse> {
    let image: ImageId = image
        .parse()
        .map_err(|_| invalid(format!("invalid image id {image:?}")))?;
    let snap: SnapId = snap
        .parse()
        .map_err(|_| invalid(format!("invalid snapshot id {snap:?}")))?;
    let pg = parse_pg(&pgid)?;
    let reporter = reporter(&sender)?;
    let created = app
        .mon
        .apply(|s, _| {
            s.check_confirmation(reporter, pg)?;
            s.snap_pg_done(image, snap, pg)
        })
        .await?;
    Ok(Json(SnapPgDoneResponse { created }))
}

async fn list_snap_trims(State(app): App) -> ApiResult<Vec<SnapTrimEntry>> {
    Ok(Json(
        app.mon
            .read(|s| s.snap_trims.values().cloned().collect())
            .await?,
    ))
}

/// A PG leader confirms it applied a snapshot trim through its log.
async fn snap_trim_pg_done(
    State(app): App,
    Extension(sender): Extension<Authenticated>,
    Path((id, pgid)): Path<(String, String)>,
) -> ApiResult<SnapTrimPgDoneResponse> {
    let id: u64 = id
        .parse()
        .map_err(|_| invalid(format!("invalid snapshot trim id {id:?}")))?;
    let pg = parse_pg(&pgid)?;
    let reporter = reporter(&sender)?;
    let finished = app
        .mon
        .apply(|s, _| {
            s.check_confirmation(reporter, pg)?;
            s.snap_trim_pg_done(id, pg)
        })
        .await?;
    Ok(Json(SnapTrimPgDoneResponse { finished }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn boom() -> &'static str {
        panic!("handler bug")
    }

    async fn get_raw(addr: std::net::SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut buf = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await;
        String::from_utf8_lossy(&buf).to_string()
    }

    /// A handler that panics answers `internal` (not a closed connection), is counted for
    /// health, and the server keeps answering.
    #[tokio::test]
    async fn a_panicking_handler_answers_internal_and_is_counted() {
        let (_stop_tx, stop) = tokio::sync::watch::channel(false);
        let (tasks, _fatal) = Supervisor::new(stop);
        let app = Router::new()
            .route("/boom", get(boom))
            .route("/ok", get(|| async { "fine" }))
            .layer(middleware::from_fn_with_state(tasks.clone(), catch_panic));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        let answer = get_raw(addr, "/boom").await;
        assert!(answer.starts_with("HTTP/1.1 500"), "{answer:?}");
        assert!(answer.contains(r#""code":"internal""#), "{answer}");
        assert!(
            answer.contains("GET /boom panicked: handler bug"),
            "{answer}"
        );
        let checks = tasks.checks();
        assert_eq!(checks.len(), 1, "{checks:?}");
        assert!(
            checks[0].text.starts_with(
                "API request handler failed 1 time, last 0s ago: GET /boom panicked: handler bug"
            ),
            "{checks:?}"
        );
        assert!(get_raw(addr, "/ok").await.starts_with("HTTP/1.1 200"));
        server.abort();
    }
}

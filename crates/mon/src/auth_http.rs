//! Authentication of API calls and the key-table endpoints (`docs/mon-api.md`,
//! "Authentication").
//!
//! [`authenticate`] runs where a call is served (on the leader, after a follower forwarded
//! it unchanged: method, path with query, body and the `x-fastblock-*` headers), so the nonce
//! is recorded once, by the monitor that acts on the call. It checks the signature with the
//! entity's monitor key from the table, the incarnation the call was signed for (this
//! process's: a call captured before a restart or a change of leader is refused), then the
//! capability the route needs ([`need_of`]), and hands the entity and its key to the handler
//! as request extensions. The handler's answer is signed for the caller, bound to the call's
//! nonce ([`fastblock_auth::request::sign_reply`]), so that nobody between the two can forge
//! or alter it (a map in mode `none`, a relabelled key). Every answer names this monitor's
//! incarnation.

use crate::http::{ApiErr, AppState};
use axum::body::{Body, Bytes};
use axum::extract::{MatchedPath, Path, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use fastblock_auth::request::{
    sign_reply, verify_request, SignedHeaders, Verifier, HEADER_INCARNATION, HEADER_REPLY_SIGNATURE,
};
use fastblock_auth::{seal_blob, Caps, EntityName, KeyBinding, Secret};
use fastblock_mon_core::auth_ops::{parse_caps, parse_entity, AuthEntity};
use fastblock_types::api::*;
use fastblock_types::auth::{AuthMode, AuthSettings};
use std::sync::Arc;

/// Largest request body read to check its signature (the same bound forwarding uses).
const SIGNED_BODY_BYTES_MAX: usize = 16 << 20;
/// Largest answer signed: the most a relay or the monitor client accepts (a whole unscoped
/// map at 131,072 PGs is some 21 MB).
const SIGNED_ANSWER_BYTES_MAX: usize = 256 << 20;

/// The entity a call was authenticated as; `None` in auth mode `none`. The PG report
/// handlers receive it to check reports against their sender.
#[derive(Clone, Debug)]
pub struct Authenticated(pub Option<EntityName>);

/// The calling entity's key, to seal keys sent back to it (`None` in auth mode `none`).
#[derive(Clone)]
pub struct CallerKey(pub Option<Secret>);

/// The calling entity's caps (`None` in auth mode `none`, where everything is open): image
/// records are shown only for the pools they allow.
#[derive(Clone, Debug)]
pub struct CallerCaps(pub Option<Caps>);

impl CallerCaps {
    /// Whether the caller may see the image records of pool `name` (every caller that may do
    /// IO on it: admins, OSDs, `pool=*`, `pool=NAME`).
    pub fn sees_pool(&self, name: &str) -> bool {
        self.0.as_ref().is_none_or(|c| c.allows_pool(name))
    }

    /// The refusal of a look at pool `name`'s image records, if the caller may not.
    pub fn check_pool(&self, name: &str) -> Result<(), ApiErr> {
        match &self.0 {
            Some(caps) if !caps.allows_pool(name) => Err(ApiErr(ApiError::new(
                ErrorCode::PermissionDenied,
                format!(
                    "caps {:?} do not allow pool {name:?}: its images are not shown",
                    caps.to_string()
                ),
            ))),
            _ => Ok(()),
        }
    }
}

/// What a route asks of its caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Open to anyone (health, the status page's view).
    Nothing,
    /// Any authenticated entity (reads).
    Any,
    /// Caps `admin` (every change but the OSDs' own calls).
    Admin,
    /// Caps `osd` (PG reports, reclaim, snapshot mark and trim confirmations, the entity
    /// table).
    OsdCap,
    /// Only `osd.{id}` for the `{id}` in the path (boot, heartbeat).
    OsdSelf,
}

/// The capability each route needs, by method and route pattern.
pub fn need_of(method: &Method, route: &str) -> Need {
    match (method.as_str(), route) {
        (_, "/v1/health") => Need::Nothing,
        // The status page's view: no secrets, nothing to act on (`crate::status_page`).
        ("GET", "/v1/status/public") => Need::Nothing,
        ("POST", "/v1/osds/{id}/boot" | "/v1/osds/{id}/heartbeat" | "/v1/osds/{id}/reports") => {
            Need::OsdSelf
        }
        ("POST", "/v1/pgs/{pgid}/leader" | "/v1/pgs/{pgid}/membership")
        | ("POST", "/v1/reclaim/{id}/pgs/{pgid}")
        | ("POST", "/v1/snaps/{image}/{snap}/pgs/{pgid}")
        | ("POST", "/v1/snaptrim/{id}/pgs/{pgid}")
        | ("GET", "/v1/auth/entities") => Need::OsdCap,
        // Every entity asks for its own tickets (the answer is sealed for it).
        ("POST", "/v1/auth/tickets") => Need::Any,
        // The key table lists who can do what: administrators only. A backup holds it.
        ("GET", "/v1/auth" | "/v1/mon/backup") => Need::Admin,
        // An op dump names the PGs and clients at work: administrators only.
        ("GET", "/v1/osds/{id}/ops") => Need::Admin,
        // It changes a daemon's settings (the default below; named so that no rule above
        // catches it by mistake).
        ("POST", "/v1/osds/{id}/config") => Need::Admin,
        ("GET", _) => Need::Any,
        _ => Need::Admin,
    }
}

fn now_unix_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn denied(msg: String) -> Response {
    ApiErr(ApiError::new(ErrorCode::PermissionDenied, msg)).into_response()
}

/// Verifies the call's signature and capability and signs the answer (see the module doc).
pub async fn authenticate(State(app): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let incarnation = app.incarnation.clone();
    let mut resp = authenticate_and_serve(app, req, next).await;
    if let Ok(v) = axum::http::HeaderValue::from_str(&incarnation) {
        resp.headers_mut().insert(HEADER_INCARNATION, v);
    }
    resp
}

/// Signs `resp` for the caller whose monitor key is `mon_key`, bound to its call's nonce.
async fn signed_answer(resp: Response, mon_key: &Secret, nonce_hex: &str) -> Response {
    let (mut parts, body) = resp.into_parts();
    let body = match axum::body::to_bytes(body, SIGNED_ANSWER_BYTES_MAX).await {
        Ok(b) => b,
        Err(e) => {
            return ApiErr(ApiError::new(
                ErrorCode::Internal,
                format!("answer too large to sign: {e}"),
            ))
            .into_response()
        }
    };
    let signature = sign_reply(mon_key, nonce_hex, parts.status.as_u16(), &body);
    if let Ok(v) = axum::http::HeaderValue::from_str(&signature) {
        parts.headers.insert(HEADER_REPLY_SIGNATURE, v);
    }
    Response::from_parts(parts, Body::from(body))
}

async fn authenticate_and_serve(app: Arc<AppState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_default();
    let need = need_of(req.method(), &route);
    let (mut parts, body) = req.into_parts();
    let headers =
        SignedHeaders::from_lookup(|h| parts.headers.get(h).and_then(|v| v.to_str().ok()));
    // An open route serves anyone; a signed call to it is verified and answered signed like
    // any other, since its caller accepts only signed answers (`fastblock_auth::floor`).
    if need == Need::Nothing && matches!(headers, Ok(None)) {
        return next.run(Request::from_parts(parts, body)).await;
    }
    let claimed = headers
        .as_ref()
        .ok()
        .and_then(|h| h.as_ref())
        .and_then(|h| h.entity.parse::<EntityName>().ok());
    let looked_up = app
        .mon
        .read(|s| {
            let record = claimed
                .as_ref()
                .and_then(|e| s.auth.entities.get(e))
                .map(|e| (e.key.clone(), e.caps.clone()));
            // A purged OSD's key went with it: say so rather than "unknown entity", so that
            // its daemon, restarted on its old data, stops with the reason.
            let purged = match &claimed {
                Some(EntityName::Osd(id)) if record.is_none() && s.is_purged(*id) => {
                    Some(s.missing_osd_error(*id))
                }
                _ => None,
            };
            (s.map.auth.mode, record, purged)
        })
        .await;
    let (mode, record, purged) = match looked_up {
        Ok(v) => v,
        Err(e) => return ApiErr(e).into_response(),
    };
    if !mode.authenticates() {
        parts.extensions.insert(Authenticated(None));
        parts.extensions.insert(CallerKey(None));
        parts.extensions.insert(CallerCaps(None));
        return next.run(Request::from_parts(parts, body)).await;
    }
    let headers = match headers {
        Ok(Some(h)) => h,
        Ok(None) => {
            return ApiErr(ApiError::new(
                ErrorCode::AuthRequired,
                format!("this cluster runs auth mode {mode}: the call must be signed with a key (pass a keyring: --keyring or $FASTBLOCK_KEYRING)"),
            ))
            .into_response()
        }
        Err(e) => {
            return ApiErr(ApiError::new(ErrorCode::AuthFailed, e.to_string())).into_response()
        }
    };
    if let Some(e) = purged {
        tracing::info!(entity = %headers.entity, "refused call of a purged osd");
        return ApiErr(e).into_response();
    }
    // The exact bytes received: the signature covers their digest.
    let body = match axum::body::to_bytes(body, SIGNED_BODY_BYTES_MAX).await {
        Ok(b) => b,
        Err(e) => {
            return ApiErr(ApiError::new(
                ErrorCode::InvalidArgument,
                format!("request body: {e}"),
            ))
            .into_response()
        }
    };
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/")
        .to_string();
    let verified = {
        let mut replays = app.replays.lock().unwrap_or_else(|p| p.into_inner());
        verify_request(
            &headers,
            |_| record.as_ref().map(|(k, _)| k.mon_key()),
            parts.method.as_str(),
            &path,
            &body,
            Verifier {
                now_unix_s: now_unix_s(),
                incarnation: &app.incarnation,
                replays: &mut replays,
            },
        )
    };
    let entity = match verified {
        Ok(e) => e,
        Err(e @ fastblock_auth::AuthError::StaleIncarnation { .. }) => {
            tracing::debug!(entity = %headers.entity, %path, "call for another incarnation: {e}");
            return ApiErr(ApiError::new(ErrorCode::StaleIncarnation, e.to_string()))
                .into_response();
        }
        Err(e) => {
            tracing::info!(entity = %headers.entity, %path, "refused call: {e}");
            return ApiErr(ApiError::new(ErrorCode::AuthFailed, e.to_string())).into_response();
        }
    };
    let (key, caps) = record.expect("verified against this record");
    let mon_key = key.mon_key();
    let refused = check_need(need, &entity, &caps, &parts);
    let resp = match refused {
        Some(refusal) => refusal,
        None => {
            parts.extensions.insert(Authenticated(Some(entity)));
            parts.extensions.insert(CallerKey(Some(key)));
            parts.extensions.insert(CallerCaps(Some(caps)));
            next.run(Request::from_parts(parts, Body::from(body))).await
        }
    };
    signed_answer(resp, &mon_key, &headers.nonce_hex).await
}

/// The refusal of a verified call whose entity lacks what the route needs, if it does.
fn check_need(
    need: Need,
    entity: &EntityName,
    caps: &Caps,
    parts: &axum::http::request::Parts,
) -> Option<Response> {
    let what = format!("{} {}", parts.method, parts.uri.path());
    match need {
        Need::Nothing | Need::Any => None,
        Need::Admin if caps.admin => None,
        Need::Admin => Some(denied(format!(
            "{entity} (caps {:?}) may not call {what}: it needs caps admin",
            caps.to_string()
        ))),
        Need::OsdCap if caps.osd => None,
        Need::OsdCap => Some(denied(format!(
            "{entity} (caps {:?}) may not call {what}: only OSDs (caps osd) may",
            caps.to_string()
        ))),
        Need::OsdSelf => {
            let id = parts.uri.path().split('/').nth(3).unwrap_or("");
            (!caps.osd || entity.to_string() != format!("osd.{id}"))
                .then(|| denied(format!("{entity} may not call {what}: only osd.{id} may")))
        }
    }
}

type App = State<Arc<AppState>>;
type ApiResult<T> = Result<Json<T>, ApiErr>;

fn parse<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, ApiErr> {
    serde_json::from_slice(body).map_err(|e| {
        ApiErr(ApiError::new(
            ErrorCode::InvalidArgument,
            format!("invalid request body: {e}"),
        ))
    })
}

fn internal(e: fastblock_auth::AuthError) -> ApiErr {
    ApiErr(ApiError::new(ErrorCode::Internal, e.to_string()))
}

/// An entity's key as the caller receives it: sealed with the caller's key, or in clear in
/// auth mode `none` when the caller has no key.
fn key_response(
    entity: &EntityName,
    e: &AuthEntity,
    epoch: u64,
    caller: &CallerKey,
) -> Result<AuthKeyResponse, ApiErr> {
    let (name, caps) = (entity.to_string(), e.caps.to_string());
    let binding = KeyBinding {
        entity: &name,
        caps: &caps,
        generation: e.generation,
        epoch,
    };
    let (sealed_key, key) = match &caller.0 {
        Some(k) => (
            STANDARD.encode(seal_blob(k, e.key.as_bytes(), &binding).map_err(internal)?),
            None,
        ),
        None => (String::new(), Some(e.key.to_base64())),
    };
    Ok(AuthKeyResponse {
        entity: name.clone(),
        caps: caps.clone(),
        generation: e.generation,
        epoch,
        sealed_key,
        key,
    })
}

pub async fn auth_list(State(app): App) -> ApiResult<Vec<AuthEntityInfo>> {
    Ok(Json(
        app.mon
            .read(|s| {
                s.auth
                    .entities
                    .iter()
                    .map(|(name, e)| AuthEntityInfo {
                        entity: name.to_string(),
                        caps: e.caps.to_string(),
                        generation: e.generation,
                        fingerprint: e.key.fingerprint(),
                    })
                    .collect()
            })
            .await?,
    ))
}

pub async fn auth_add(
    State(app): App,
    Extension(caller): Extension<CallerKey>,
    body: Bytes,
) -> ApiResult<AuthKeyResponse> {
    let req: AuthAddRequest = parse(&body)?;
    let entity = parse_entity(&req.entity)?;
    let caps = parse_caps(&entity, &req.caps)?;
    let key = Secret::generate().map_err(internal)?;
    let e = app
        .mon
        .apply(|s, _| {
            s.auth_add(&entity, caps.clone(), key.clone())?;
            Ok((s.auth.entities[&entity].clone(), s.map.auth.epoch))
        })
        .await?;
    Ok(Json(key_response(&entity, &e.0, e.1, &caller)?))
}

pub async fn auth_get_or_create(
    State(app): App,
    Extension(caller): Extension<CallerKey>,
    Path(entity): Path<String>,
    body: Bytes,
) -> ApiResult<AuthKeyResponse> {
    let req: AuthCapsRequest = parse(&body)?;
    let entity = parse_entity(&entity)?;
    let caps = parse_caps(&entity, &req.caps)?;
    let key = Secret::generate().map_err(internal)?;
    let e = app
        .mon
        .apply(|s, _| {
            let e = s.auth_get_or_create(&entity, caps.clone(), key.clone())?;
            Ok((e, s.map.auth.epoch))
        })
        .await?;
    Ok(Json(key_response(&entity, &e.0, e.1, &caller)?))
}

pub async fn auth_caps(
    State(app): App,
    Path(entity): Path<String>,
    body: Bytes,
) -> ApiResult<AuthEntityInfo> {
    let req: AuthCapsRequest = parse(&body)?;
    let entity = parse_entity(&entity)?;
    let caps: Caps = parse_caps(&entity, &req.caps)?;
    let e = app
        .mon
        .apply(|s, _| s.auth_caps(&entity, caps.clone()))
        .await?;
    Ok(Json(AuthEntityInfo {
        entity: entity.to_string(),
        caps: e.caps.to_string(),
        generation: e.generation,
        fingerprint: e.key.fingerprint(),
    }))
}

pub async fn auth_rotate(
    State(app): App,
    Extension(caller): Extension<CallerKey>,
    Path(entity): Path<String>,
) -> ApiResult<AuthKeyResponse> {
    let entity = parse_entity(&entity)?;
    let key = Secret::generate().map_err(internal)?;
    let e = app
        .mon
        .apply(|s, _| {
            let e = s.auth_rotate(&entity, key.clone())?;
            Ok((e, s.map.auth.epoch))
        })
        .await?;
    Ok(Json(key_response(&entity, &e.0, e.1, &caller)?))
}

pub async fn auth_rm(State(app): App, Path(entity): Path<String>) -> ApiResult<EpochResponse> {
    let entity = parse_entity(&entity)?;
    app.mon.apply(|s, _| s.auth_rm(&entity)).await?;
    Ok(Json(EpochResponse {
        epoch: app.mon.published_epoch(),
    }))
}

pub async fn auth_set_mode(State(app): App, body: Bytes) -> ApiResult<AuthSettings> {
    let req: AuthModeRequest = parse(&body)?;
    let mode: AuthMode = req.mode;
    Ok(Json(
        app.mon
            .apply(|s, _| {
                s.auth_set_mode(mode)?;
                Ok(s.map.auth)
            })
            .await?,
    ))
}

/// Every entity's caps and generation, no keys: what OSDs judge tickets and connections
/// against.
pub async fn auth_entities(State(app): App) -> ApiResult<AuthEntitiesResponse> {
    let (settings, entities) = app
        .mon
        .read(|s| (s.map.auth, s.auth.entities.clone()))
        .await?;
    Ok(Json(AuthEntitiesResponse {
        epoch: settings.epoch,
        mode: settings.mode,
        entities: entities
            .iter()
            .map(|(name, e)| AuthEntityEntry {
                entity: name.to_string(),
                caps: e.caps.to_string(),
                generation: e.generation,
            })
            .collect(),
    }))
}

/// Tickets for the caller to speak to the OSDs it names (`docs/security.md`, "Tickets"): each
/// sealed under the target OSD's service key with the caller's entity, caps, generation, the
/// table's epoch and an expiry; its session key sealed for the caller.
pub async fn auth_tickets(
    State(app): App,
    Extension(caller): Extension<CallerKey>,
    Extension(who): Extension<Authenticated>,
    body: Bytes,
) -> ApiResult<TicketsResponse> {
    let (Some(caller_key), Some(entity)) = (caller.0, who.0) else {
        return Err(ApiErr(ApiError::new(
            ErrorCode::AuthRequired,
            "auth mode none has no tickets (connections to OSDs are not authenticated)",
        )));
    };
    let req: TicketsRequest = parse(&body)?;
    if req.osds.len() > TICKETS_PER_CALL_MAX {
        return Err(ApiErr(ApiError::new(
            ErrorCode::InvalidArgument,
            format!(
                "{} OSDs in one call: at most {TICKETS_PER_CALL_MAX}",
                req.osds.len()
            ),
        )));
    }
    let wanted: Vec<EntityName> = req
        .osds
        .iter()
        .map(|id| EntityName::Osd(fastblock_types::OsdId(*id)))
        .collect();
    let (auth_epoch, holder, targets) = app
        .mon
        .read(move |s| {
            let holder = s
                .auth
                .entities
                .get(&entity)
                .map(|e| (entity.clone(), e.caps.to_string(), e.generation));
            let targets: Vec<(u32, Option<Secret>)> = wanted
                .iter()
                .map(|name| {
                    let id = name.osd().expect("an osd name").0;
                    (id, s.auth.entities.get(name).map(|e| e.key.service_key()))
                })
                .collect();
            (s.map.auth.epoch, holder, targets)
        })
        .await?;
    let Some((entity, caps, generation)) = holder else {
        // Removed between the call's check and now.
        return Err(ApiErr(ApiError::new(
            ErrorCode::AuthFailed,
            "the caller's key was removed",
        )));
    };
    let expires_unix_s = now_unix_s() + fastblock_auth::ticket::TICKET_LIFETIME_SECS;
    let mut tickets = Vec::with_capacity(targets.len());
    let mut unknown = Vec::new();
    for (osd, service_key) in targets {
        let Some(service_key) = service_key else {
            unknown.push(osd);
            continue;
        };
        let claims = fastblock_auth::ticket::TicketClaims {
            entity: entity.clone(),
            caps: caps.clone(),
            generation,
            auth_epoch,
            target: fastblock_types::OsdId(osd),
            expires_unix_s,
        };
        let issued = fastblock_auth::ticket::issue(&service_key, &claims).map_err(internal)?;
        let sealed = fastblock_auth::ticket::seal_session_key(
            &caller_key,
            &issued.ticket,
            &issued.session_key,
        )
        .map_err(internal)?;
        tickets.push(TicketEntry {
            osd,
            ticket: STANDARD.encode(&issued.ticket),
            sealed_session_key: STANDARD.encode(sealed),
        });
    }
    Ok(Json(TicketsResponse {
        auth_epoch,
        expires_unix_s,
        tickets,
        unknown,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_need_what_the_docs_say() {
        let get = Method::GET;
        let post = Method::POST;
        assert_eq!(need_of(&get, "/v1/health"), Need::Nothing);
        assert_eq!(need_of(&get, "/v1/status/public"), Need::Nothing);
        assert_eq!(need_of(&get, "/v1/status"), Need::Any);
        assert_eq!(need_of(&post, "/v1/status/public"), Need::Admin);
        assert_eq!(need_of(&get, "/v1/map"), Need::Any);
        assert_eq!(need_of(&get, "/v1/df"), Need::Any);
        assert_eq!(need_of(&Method::PUT, "/v1/space/full-ratio"), Need::Admin);
        assert_eq!(
            need_of(&Method::PUT, "/v1/space/nearfull-ratio"),
            Need::Admin
        );
        assert_eq!(need_of(&get, "/v1/pools/{name}"), Need::Any);
        assert_eq!(need_of(&get, "/v1/auth"), Need::Admin);
        assert_eq!(need_of(&get, "/v1/osds/{id}/ops"), Need::Admin);
        assert_eq!(need_of(&post, "/v1/osds/{id}/config"), Need::Admin);
        assert_eq!(need_of(&get, "/v1/auth/entities"), Need::OsdCap);
        assert_eq!(need_of(&post, "/v1/auth/tickets"), Need::Any);
        assert_eq!(need_of(&post, "/v1/osds/{id}/boot"), Need::OsdSelf);
        assert_eq!(need_of(&post, "/v1/osds/{id}/heartbeat"), Need::OsdSelf);
        assert_eq!(need_of(&post, "/v1/osds/{id}/purge"), Need::Admin);
        assert_eq!(need_of(&post, "/v1/pgs/{pgid}/leader"), Need::OsdCap);
        assert_eq!(need_of(&post, "/v1/pgs/{pgid}/scrub"), Need::Admin);
        assert_eq!(need_of(&post, "/v1/reclaim/{id}/pgs/{pgid}"), Need::OsdCap);
        assert_eq!(
            need_of(&post, "/v1/snaps/{image}/{snap}/pgs/{pgid}"),
            Need::OsdCap
        );
        assert_eq!(need_of(&post, "/v1/snaptrim/{id}/pgs/{pgid}"), Need::OsdCap);
        assert_eq!(need_of(&get, "/v1/snaptrim"), Need::Any);
        assert_eq!(need_of(&get, "/v1/images/{pool}/{name}/snaps"), Need::Any);
        assert_eq!(
            need_of(&post, "/v1/images/{pool}/{name}/snaps"),
            Need::Admin
        );
        assert_eq!(
            need_of(&post, "/v1/images/{pool}/{name}/snaps/{snap}/clone"),
            Need::Admin
        );
        assert_eq!(
            need_of(&Method::DELETE, "/v1/images/{pool}/{name}/snaps/{snap}"),
            Need::Admin
        );
        assert_eq!(
            need_of(&post, "/v1/images/{pool}/{name}/flatten-done"),
            Need::Admin
        );
        assert_eq!(need_of(&post, "/v1/osds/apply-id"), Need::Admin);
        assert_eq!(need_of(&post, "/v1/pools"), Need::Admin);
        assert_eq!(need_of(&Method::DELETE, "/v1/auth/{entity}"), Need::Admin);
        assert_eq!(need_of(&Method::PUT, "/v1/auth/mode"), Need::Admin);
    }
}

//! The web status page (`docs/operations.md`, "Status page"): three static files embedded in
//! the binary (HTML, CSS, vanilla JS; no build step), and `GET /v1/status/public`, the JSON the
//! page polls every few seconds.
//!
//! Why an unsigned endpoint: in auth mode `sign` or `secure` every API call but health,
//! metrics and `/v1/mon` must be signed with a key, and a browser holds no key. The page gets
//! its own read-only view instead of opening `GET /v1/status`, cut from what `status` answers
//! ([`crate::http::status_view`]) down to health and operational figures: the health checks
//! (already public in `GET /v1/health`), counts and PG states and IO rates (already public in
//! `/metrics`), recovery progress and space totals (figures of the same kind), and per OSD its
//! id, up/in, full flag and data space. It carries no key, entity, capability, address or
//! port, and no host, pool or image name beyond what the health checks' text already says in
//! `GET /v1/health` (the host of a down OSD, monitor and pool names, a failed task's error);
//! nothing in it lets a caller act on the cluster: every write
//! stays signed. `docs/mon-api.md`, "Status page", lists the fields and this reasoning.
//!
//! Why the assets are served by every monitor (not forwarded): they are constant; the data
//! call is forwarded to the leader like any other, so a follower's page shows the leader's
//! view.

use crate::http::{members, status_view, ApiErr, AppState};
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use fastblock_types::api::{OsdSpace, PublicOsd, PublicStatusResponse, StatusResponse};
use fastblock_types::map::ClusterMap;
use fastblock_types::OsdId;
use std::collections::BTreeMap;
use std::sync::Arc;

const PAGE_HTML: &str = include_str!("status_page/index.html");
const PAGE_CSS: &str = include_str!("status_page/status.css");
const PAGE_JS: &str = include_str!("status_page/status.js");

/// Only the page's own files and calls back to this origin: no inline script, no framing (the
/// page has no buttons to click-jack, but nothing is lost by refusing), no form posts.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

/// The page's files: `GET /` (the page), `/status.css`, `/status.js`.
pub fn asset_routes() -> Router<Arc<AppState>> {
    Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", PAGE_HTML) }),
        )
        .route(
            "/status.css",
            get(|| async { asset("text/css; charset=utf-8", PAGE_CSS) }),
        )
        .route(
            "/status.js",
            get(|| async { asset("text/javascript; charset=utf-8", PAGE_JS) }),
        )
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            // A new monitor version serves a new page: never keep an old one.
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// `GET /v1/status/public`: the status page's view (see the module doc for what it holds).
pub async fn get_public_status(
    State(app): State<Arc<AppState>>,
) -> Result<Json<PublicStatusResponse>, ApiErr> {
    let mons = members(&app).await;
    let tasks = app.tasks.checks();
    let view = app
        .mon
        .read_with_book(|s, ctx| {
            let status = status_view(&app, (s, ctx), &tasks, mons);
            public_view(status, &s.map, &ctx.stats.spaces(&s.map))
        })
        .await?;
    Ok(Json(view))
}

/// Cuts `status` down to the public view, adding each OSD's row. `spaces` are the last space
/// reports of the OSDs that are up.
pub fn public_view(
    status: StatusResponse,
    map: &ClusterMap,
    spaces: &BTreeMap<OsdId, OsdSpace>,
) -> PublicStatusResponse {
    let osds = map
        .osds
        .values()
        .filter(|o| !o.pending_create)
        .map(|o| PublicOsd {
            id: o.id,
            up: o.up,
            is_in: o.is_in,
            space: spaces.get(&o.id).copied(),
            full: map.space.full_osds.contains(&o.id),
        })
        .collect();
    // Destructured so that a field added to `StatusResponse` must be placed on one side or
    // the other here, deliberately: the compiler refuses an unnamed one.
    let StatusResponse {
        epoch,
        health,
        health_checks,
        leader: _,
        mons: _,
        flags: _,
        osds_total: _,
        osds_up: _,
        osds_in: _,
        pools,
        pgs,
        images,
        pg_states,
        io,
        recovery,
        usage,
        etcd,
    } = status;
    PublicStatusResponse {
        epoch,
        health,
        health_checks,
        osds,
        pools,
        pgs,
        images,
        pg_states,
        io,
        recovery_eta_secs: recovery.eta_secs(),
        recovery,
        usage,
        // Sizes, compaction and alarms only: member names and addresses stay out.
        etcd: etcd.as_ref().map(fastblock_types::etcd::PublicEtcd::from),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fastblock_types::api::{
        ClusterUsage, HealthCheck, IoRates, MonMember, RecoveryStatus, Severity,
    };
    use fastblock_types::etcd::{EtcdMemberStatus, EtcdStatus};
    use fastblock_types::map::{Flags, OsdInfo};
    use fastblock_types::Epoch;

    fn osd(id: u32, up: bool, is_in: bool, pending_create: bool) -> OsdInfo {
        serde_json::from_value(serde_json::json!({
            "id": id, "uuid": format!("uuid-{id}"), "host": format!("secret-host-{id}"),
            "address": "10.9.8.7", "port": 6800, "up": up, "in": is_in,
            "pending_create": pending_create,
        }))
        .expect("an OsdInfo")
    }

    fn status() -> StatusResponse {
        StatusResponse {
            epoch: Epoch(7),
            health: "HEALTH_WARN".into(),
            health_checks: vec![HealthCheck {
                code: "OSD_DOWN".into(),
                severity: Severity::Warn,
                summary: "1 osd down".into(),
                detail: vec!["osd.2 (host h2) is down".into()],
            }],
            leader: Some(MonMember {
                name: "a".into(),
                api_addr: "10.1.2.3:3333".into(),
            }),
            mons: vec![MonMember {
                name: "a".into(),
                api_addr: "10.1.2.3:3333".into(),
            }],
            flags: Flags::default(),
            osds_total: 3,
            osds_up: 2,
            osds_in: 3,
            pools: 1,
            pgs: 8,
            images: 2,
            pg_states: [("undersize".to_string(), 8)].into(),
            io: IoRates::default(),
            recovery: RecoveryStatus {
                recovering_pgs: 2,
                remaining_bytes: 10 << 20,
                remaining_objects: 3,
                bytes_per_sec: f64::from(1 << 20),
            },
            usage: ClusterUsage::default(),
            etcd: Some(EtcdStatus {
                members: vec![EtcdMemberStatus {
                    name: "secret-member".into(),
                    endpoint: "http://10.1.2.3:2379".into(),
                    db_size_bytes: 3 << 20,
                    db_size_in_use_bytes: 1 << 20,
                    is_leader: true,
                    error: None,
                }],
                quota_bytes: 2 << 30,
                revision: 42,
                observed_unix_ms: 1,
                ..EtcdStatus::default()
            }),
        }
    }

    /// Each OSD of the map but those still being created gets a row with its space and full
    /// flag; the monitors' names and addresses and the OSDs' addresses and hosts stay out.
    #[test]
    fn the_public_view_has_osd_rows_and_no_addresses() {
        let mut map = ClusterMap::default();
        for o in [
            osd(1, true, true, false),
            osd(2, false, true, false),
            osd(3, true, true, false),
            osd(4, false, false, true),
        ] {
            std::sync::Arc::make_mut(&mut map.osds).insert(o.id, o);
        }
        map.space.full_osds.insert(OsdId(3));
        let space = OsdSpace {
            total_bytes: 100,
            free_bytes: 40,
            writable_bytes: None,
        };
        let spaces = [(OsdId(1), space), (OsdId(3), space)].into();
        let view = public_view(status(), &map, &spaces);
        let rows: Vec<(u32, bool, bool, bool, bool)> = view
            .osds
            .iter()
            .map(|o| (o.id.0, o.up, o.is_in, o.space.is_some(), o.full))
            .collect();
        assert_eq!(
            rows,
            vec![
                (1, true, true, true, false),
                (2, false, true, false, false),
                (3, true, true, true, true),
            ]
        );
        assert_eq!(view.recovery_eta_secs, Some(10));
        assert_eq!(view.health_checks, status().health_checks);
        let json = serde_json::to_string(&view).expect("JSON");
        let etcd = view.etcd.as_ref().expect("etcd figures");
        assert_eq!(
            (etcd.members, etcd.db_size_bytes, etcd.revision),
            (1, 3 << 20, 42)
        );
        for secret in [
            "10.1.2.3",
            "10.9.8.7",
            "secret-host",
            "uuid-",
            "api_addr",
            "secret-member",
        ] {
            assert!(!json.contains(secret), "{secret} in {json}");
        }
    }
}

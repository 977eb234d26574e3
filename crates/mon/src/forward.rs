//! Forwarding of API calls from a follower monitor to the leader, so that any monitor answers
//! every call. A forwarded request carries `x-fastblock-forwarded`; a monitor that receives one
//! but does not lead (leadership moved meanwhile) answers `no_leader` instead of forwarding
//! again, so requests never loop. The call is relayed byte for byte (method, path with query,
//! body, content type and signature headers), so the leader verifies its signature; the
//! answer comes back with the leader's signature and incarnation, which the caller checks.
//! `Accept-Encoding` is not relayed: the leader answers plain JSON, and this monitor's own
//! outer layer gzips it for a caller that asked (`crate::compress`).

use axum::body::Body;
use axum::http::{HeaderValue, Request, Response, StatusCode};
use bytes::Bytes;
use fastblock_types::api::{ApiError, ErrorCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::time::Duration;

pub const FORWARDED_HEADER: &str = "x-fastblock-forwarded";
const SIGNATURE_HEADERS: [&str; 5] = [
    fastblock_auth::request::HEADER_ENTITY,
    fastblock_auth::request::HEADER_TIME,
    fastblock_auth::request::HEADER_NONCE,
    fastblock_auth::request::HEADER_INCARNATION,
    fastblock_auth::request::HEADER_SIGNATURE,
];
/// The leader's answer headers the caller checks: its incarnation and its signature.
const ANSWER_HEADERS: [&str; 2] = [
    fastblock_auth::request::HEADER_INCARNATION,
    fastblock_auth::request::HEADER_REPLY_SIGNATURE,
];
/// Largest request body relayed (requests are small: a full batch of 4,096 PG reports is
/// about 1.2 MB).
const BODY_BYTES_MAX: usize = 16 << 20;
/// Largest response body relayed: a whole unscoped map (`GET /v1/map`) at 131,072 PGs is
/// some 21 MB of JSON, with OSDs, images and snapshots beside them; the monitor client
/// accepts as much (`fastblock_monclient`).
const RESPONSE_BYTES_MAX: usize = 256 << 20;
/// Long-polls may be held up to 60 s by the leader; allow for that plus slack.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(75);

#[derive(Clone)]
pub struct Forwarder {
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Default for Forwarder {
    fn default() -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(Duration::from_secs(2)));
        connector.set_nodelay(true);
        Forwarder {
            client: Client::builder(TokioExecutor::new()).build(connector),
        }
    }
}

impl Forwarder {
    pub async fn forward(
        &self,
        leader_api: &str,
        req: Request<Body>,
    ) -> Result<Response<Body>, ApiError> {
        let (parts, body) = req.into_parts();
        let body = Limited::new(body, BODY_BYTES_MAX)
            .collect()
            .await
            .map_err(|e| ApiError::new(ErrorCode::InvalidArgument, format!("request body: {e}")))?
            .to_bytes();
        let path = parts
            .uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/");
        let uri = format!("http://{leader_api}{path}");
        let mut out = Request::builder().method(parts.method).uri(&uri);
        if let Some(ct) = parts.headers.get(axum::http::header::CONTENT_TYPE) {
            out = out.header(axum::http::header::CONTENT_TYPE, ct);
        }
        // The signature headers go along unchanged, with the exact path, query and body they
        // sign: the leader verifies the call (and records its nonce), not this monitor.
        for name in SIGNATURE_HEADERS {
            if let Some(v) = parts.headers.get(name) {
                out = out.header(name, v);
            }
        }
        out = out.header(FORWARDED_HEADER, HeaderValue::from_static("1"));
        let out = out
            .body(Full::new(body))
            .map_err(|e| ApiError::new(ErrorCode::Internal, format!("building forward: {e}")))?;
        let unavailable = |e: String| {
            ApiError::new(
                ErrorCode::Unavailable,
                format!("forwarding to leader monitor {leader_api}: {e}"),
            )
        };
        let resp = tokio::time::timeout(FORWARD_TIMEOUT, self.client.request(out))
            .await
            .map_err(|_| unavailable("timed out".into()))?
            .map_err(|e| unavailable(e.to_string()))?;
        let (parts, body) = resp.into_parts();
        let body = Limited::new(body, RESPONSE_BYTES_MAX)
            .collect()
            .await
            .map_err(|e| unavailable(e.to_string()))?
            .to_bytes();
        let mut resp = Response::builder().status(parts.status);
        if let Some(ct) = parts.headers.get(axum::http::header::CONTENT_TYPE) {
            resp = resp.header(axum::http::header::CONTENT_TYPE, ct);
        }
        // The leader signed its answer for the caller: relayed unchanged, with the signature.
        for name in ANSWER_HEADERS {
            if let Some(v) = parts.headers.get(name) {
                resp = resp.header(name, v);
            }
        }
        Ok(resp
            .body(Body::from(body))
            .unwrap_or_else(|_| Response::new(Body::empty())))
    }
}

pub fn status_of(e: &ApiError) -> StatusCode {
    StatusCode::from_u16(e.code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

//! gzip of large answers for callers that ask for it (`Accept-Encoding: gzip`), as the outermost
//! layer: a map delta of thousands of PGs is repetitive JSON (every entry names the same
//! fields), and at 1,000 OSDs and 131,072 PGs the map bytes of a host going out were some
//! 85 KiB per daemon, 1.4 MB per client answer, over the 64 KiB issue 36 allows
//! (`docs/scale.md`). Compression happens after the answer is signed (the signature covers the
//! body as JSON, `docs/security.md`, "Monitor answers"), so the caller decompresses, then
//! verifies. A follower's relay asks the leader for plain JSON and compresses for its own
//! caller (`crate::forward`). Format: `docs/mon-api.md`, "Compression".

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use fastblock_types::api::{ApiError, ErrorCode};
use http_body_util::BodyExt;
use std::io::Write;

/// Answers below this go as they are: the bytes are in the large answers (a client's delta
/// when a host goes out, 1.4 MB at 131,072 PGs; a whole map on first contact), while each OSD
/// gets deltas of a few KiB at every epoch, a thousand per epoch at 1,000 OSDs, where
/// compressing would cost the monitor CPU for little.
pub const COMPRESS_MIN_BYTES: usize = 16 << 10;
/// Answers above this go as they are (compressing means holding the whole body).
pub const COMPRESS_MAX_BYTES: usize = 256 << 20;

/// Whether the caller accepts gzip: a `gzip` coding in `Accept-Encoding` whose `q` is not 0.
pub fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|coding| {
            let mut parts = coding.split(';').map(str::trim);
            let name = parts.next().unwrap_or("");
            let refused = parts.any(|p| {
                p.strip_prefix("q=")
                    .and_then(|q| q.parse::<f32>().ok())
                    .is_some_and(|q| q == 0.0)
            });
            name.eq_ignore_ascii_case("gzip") && !refused
        })
}

/// gzip at the fastest level: the monitor compresses one answer per holder and epoch, and the
/// fastest level takes most of the gain on JSON.
pub fn gzip(body: &[u8]) -> Vec<u8> {
    let mut out = flate2::write::GzEncoder::new(
        Vec::with_capacity(body.len() / 4),
        flate2::Compression::fast(),
    );
    out.write_all(body).expect("writing to a Vec");
    out.finish().expect("writing to a Vec")
}

/// The layer: compresses an answer of a known size in `[COMPRESS_MIN_BYTES,
/// COMPRESS_MAX_BYTES]` for a caller that accepts gzip, unless it is encoded already.
pub async fn compress_answer(req: Request, next: Next) -> Response {
    let wants = accepts_gzip(req.headers());
    let resp = next.run(req).await;
    if !wants || resp.headers().contains_key(header::CONTENT_ENCODING) {
        return resp;
    }
    let size = resp.body().size_hint().exact().map(|n| n as usize);
    if !size.is_some_and(|n| (COMPRESS_MIN_BYTES..=COMPRESS_MAX_BYTES).contains(&n)) {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let bytes = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return crate::http::ApiErr(ApiError::new(
                ErrorCode::Internal,
                format!("reading the answer to compress it: {e}"),
            ))
            .into_response()
        }
    };
    // A body shared between callers (`crate::map_answers`) is compressed once for all.
    let shared = parts
        .extensions
        .get::<crate::map_answers::SharedAnswer>()
        .filter(|s| s.0.json == bytes)
        .cloned();
    let packed = match shared {
        Some(s) => crate::cpu::heavy(|| s.0.gzip().clone()),
        None => Bytes::from(crate::cpu::heavy(|| gzip(&bytes))),
    };
    parts
        .headers
        .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    parts
        .headers
        .append(header::VARY, HeaderValue::from_static("accept-encoding"));
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(packed))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_str(value).unwrap(),
        );
        h
    }

    #[test]
    fn gzip_is_taken_when_offered_and_not_refused() {
        assert!(accepts_gzip(&with("gzip")));
        assert!(accepts_gzip(&with("br, GZIP;q=0.5, deflate")));
        assert!(!accepts_gzip(&with("gzip;q=0")));
        assert!(!accepts_gzip(&with("deflate, br")));
        assert!(!accepts_gzip(&with("x-gzip2")));
        assert!(!accepts_gzip(&HeaderMap::new()));
    }

    #[test]
    fn gzip_round_trips() {
        let body = br#"{"seq":1,"pg":{"version":3,"osdlist":[1,2,3]}}"#.repeat(200);
        let packed = gzip(&body);
        assert!(
            packed.len() * 10 < body.len(),
            "{} of {}",
            packed.len(),
            body.len()
        );
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&packed[..]), &mut out)
            .unwrap();
        assert_eq!(out, body);
    }
}

//! Signed monitor API requests.
//!
//! A request carries four headers: the entity, the time (Unix seconds), a fresh random nonce
//! and an HMAC-SHA256, under the entity's monitor key, of the method, path with query, time,
//! nonce and the SHA-256 of the body. The monitor recomputes it with the key from its table,
//! refuses a time more than [`REQUEST_SKEW_S_MAX`] from its own clock, and refuses a nonce it
//! has seen within that window, so a captured request cannot be replayed or altered and the
//! key never crosses the network. (Responses are not signed: see `docs/security.md`.)

use crate::entity::EntityName;
use crate::error::AuthError;
use crate::secret::Secret;
use std::collections::{BTreeMap, HashMap, HashSet};

pub const HEADER_ENTITY: &str = "x-fastblock-entity";
pub const HEADER_TIME: &str = "x-fastblock-time";
pub const HEADER_NONCE: &str = "x-fastblock-nonce";
pub const HEADER_SIGNATURE: &str = "x-fastblock-signature";

/// How far a request's time may be from the monitor's clock, either way.
pub const REQUEST_SKEW_S_MAX: u64 = 300;
/// Nonces remembered at most (within the skew window) before requests are refused as too many.
pub const REPLAY_NONCES_MAX: usize = 1 << 20;
/// Nonces one entity may have remembered at once: about 218 signed calls per second for the
/// whole window, far above what a daemon makes (an OSD: a heartbeat a second and a report
/// batch at most every 50 ms), so that one key, even one limited to a pool, cannot fill the
/// cache and have every other entity's calls refused.
pub const REPLAY_NONCES_PER_ENTITY_MAX: usize = REPLAY_NONCES_MAX / 16;
const NONCE_BYTES: usize = 16;

/// The authentication headers of one request, as text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignedHeaders {
    pub entity: String,
    pub time_unix_s: u64,
    pub nonce_hex: String,
    pub signature_hex: String,
}

impl SignedHeaders {
    pub fn pairs(&self) -> [(&'static str, String); 4] {
        [
            (HEADER_ENTITY, self.entity.clone()),
            (HEADER_TIME, self.time_unix_s.to_string()),
            (HEADER_NONCE, self.nonce_hex.clone()),
            (HEADER_SIGNATURE, self.signature_hex.clone()),
        ]
    }

    /// Reads the headers through `get` (a header lookup); `Ok(None)` if the request carries
    /// none of them (an unauthenticated request).
    pub fn from_lookup<'a>(
        get: impl Fn(&str) -> Option<&'a str>,
    ) -> Result<Option<SignedHeaders>, AuthError> {
        let (e, t, n, s) = (
            get(HEADER_ENTITY),
            get(HEADER_TIME),
            get(HEADER_NONCE),
            get(HEADER_SIGNATURE),
        );
        if e.is_none() && t.is_none() && n.is_none() && s.is_none() {
            return Ok(None);
        }
        let need = |v: Option<&'a str>, name: &str| {
            v.ok_or_else(|| AuthError::Malformed(format!("header {name} is missing")))
        };
        let time = need(t, HEADER_TIME)?;
        Ok(Some(SignedHeaders {
            entity: need(e, HEADER_ENTITY)?.to_string(),
            time_unix_s: time.parse().map_err(|_| {
                AuthError::Malformed(format!("header {HEADER_TIME} is not a number"))
            })?,
            nonce_hex: need(n, HEADER_NONCE)?.to_string(),
            signature_hex: need(s, HEADER_SIGNATURE)?.to_string(),
        }))
    }
}

fn body_digest(body: &[u8]) -> [u8; 32] {
    ring::digest::digest(&ring::digest::SHA256, body)
        .as_ref()
        .try_into()
        .expect("SHA-256 is 32 bytes")
}

fn message_mac(
    mon_key: &Secret,
    method: &str,
    path_and_query: &str,
    time_unix_s: u64,
    nonce_hex: &str,
    body: &[u8],
) -> [u8; 32] {
    mon_key.mac(&[
        b"fastblock-v1 request",
        method.as_bytes(),
        path_and_query.as_bytes(),
        &time_unix_s.to_le_bytes(),
        nonce_hex.as_bytes(),
        &body_digest(body),
    ])
}

/// Signs a request as `entity` with its entity key (the monitor key is derived here).
pub fn sign_request(
    entity: &EntityName,
    key: &Secret,
    method: &str,
    path_and_query: &str,
    body: &[u8],
    now_unix_s: u64,
) -> Result<SignedHeaders, AuthError> {
    let nonce_hex = hex(&crate::secret::random_bytes::<NONCE_BYTES>()?);
    let mac = message_mac(
        &key.mon_key(),
        method,
        path_and_query,
        now_unix_s,
        &nonce_hex,
        body,
    );
    Ok(SignedHeaders {
        entity: entity.to_string(),
        time_unix_s: now_unix_s,
        nonce_hex,
        signature_hex: hex(&mac),
    })
}

/// Checks a request's signature and freshness with the entity's monitor key and records its
/// nonce. Returns the entity on success.
#[allow(clippy::too_many_arguments)]
pub fn verify_request(
    headers: &SignedHeaders,
    mon_key_of: impl Fn(&EntityName) -> Option<Secret>,
    method: &str,
    path_and_query: &str,
    body: &[u8],
    now_unix_s: u64,
    replays: &mut ReplayCache,
) -> Result<EntityName, AuthError> {
    let entity: EntityName = headers.entity.parse()?;
    if headers.nonce_hex.len() != NONCE_BYTES * 2
        || !headers.nonce_hex.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return Err(AuthError::Malformed(format!(
            "nonce must be {} hex digits",
            NONCE_BYTES * 2
        )));
    }
    let skew = now_unix_s.abs_diff(headers.time_unix_s);
    if skew > REQUEST_SKEW_S_MAX {
        return Err(AuthError::ClockSkew {
            request_unix_s: headers.time_unix_s,
            skew_s: skew,
            window_s: REQUEST_SKEW_S_MAX,
        });
    }
    let mon_key =
        mon_key_of(&entity).ok_or_else(|| AuthError::UnknownEntity(entity.to_string()))?;
    let tag = unhex(&headers.signature_hex)
        .ok_or_else(|| AuthError::Malformed("signature is not hex".into()))?;
    let expected = message_mac(
        &mon_key,
        method,
        path_and_query,
        headers.time_unix_s,
        &headers.nonce_hex,
        body,
    );
    if !crate::secret::ct_eq(&expected, &tag) {
        return Err(AuthError::BadSignature(entity.to_string()));
    }
    // Only a request that proved the key is remembered: forged requests cannot fill the cache.
    replays.check_and_insert(&entity, &headers.nonce_hex, headers.time_unix_s, now_unix_s)?;
    Ok(entity)
}

/// Nonces seen within the skew window, by the time their request carried, and how many each
/// entity has.
#[derive(Debug, Default)]
pub struct ReplayCache {
    seen: HashSet<(String, String)>,
    by_time: BTreeMap<u64, Vec<(String, String)>>,
    per_entity: HashMap<String, usize>,
}

impl ReplayCache {
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }

    fn check_and_insert(
        &mut self,
        entity: &EntityName,
        nonce_hex: &str,
        time_unix_s: u64,
        now_unix_s: u64,
    ) -> Result<(), AuthError> {
        // A request older than the window is refused by the skew check, so its nonce can go.
        let oldest_kept = now_unix_s.saturating_sub(REQUEST_SKEW_S_MAX);
        while let Some((&t, _)) = self.by_time.first_key_value() {
            if t >= oldest_kept {
                break;
            }
            let (_, keys) = self.by_time.pop_first().expect("non-empty");
            for k in keys {
                self.seen.remove(&k);
                let count = self
                    .per_entity
                    .get_mut(&k.0)
                    .expect("counted when inserted");
                *count -= 1;
                if *count == 0 {
                    self.per_entity.remove(&k.0);
                }
            }
        }
        let key = (entity.to_string(), nonce_hex.to_ascii_lowercase());
        if self.seen.contains(&key) {
            return Err(AuthError::Replayed(entity.to_string()));
        }
        let mine = self.per_entity.get(&key.0).copied().unwrap_or(0);
        if mine >= REPLAY_NONCES_PER_ENTITY_MAX {
            return Err(AuthError::EntityCallsMax {
                entity: key.0,
                calls: mine,
                window_s: REQUEST_SKEW_S_MAX,
            });
        }
        if self.seen.len() >= REPLAY_NONCES_MAX {
            return Err(AuthError::ReplayCacheFull {
                window_s: REQUEST_SKEW_S_MAX,
            });
        }
        *self.per_entity.entry(key.0.clone()).or_default() += 1;
        self.seen.insert(key.clone());
        self.by_time.entry(time_unix_s).or_default().push(key);
        debug_assert_eq!(
            self.seen.len(),
            self.by_time.values().map(Vec::len).sum::<usize>()
        );
        debug_assert_eq!(self.seen.len(), self.per_entity.values().sum::<usize>());
        Ok(())
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn unhex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (EntityName, Secret) {
        (EntityName::admin(), Secret::generate().unwrap())
    }

    #[test]
    fn a_signed_request_verifies_once_and_not_when_altered_replayed_or_late() {
        let (who, key) = setup();
        let lookup = |e: &EntityName| (e == &EntityName::admin()).then(|| key.mon_key());
        let now = 1_800_000_000;
        let h = sign_request(&who, &key, "POST", "/v1/pools", b"{}", now).unwrap();
        let mut cache = ReplayCache::default();
        assert_eq!(
            verify_request(&h, lookup, "POST", "/v1/pools", b"{}", now + 1, &mut cache).unwrap(),
            who
        );
        // The same request again: replayed.
        assert!(matches!(
            verify_request(&h, lookup, "POST", "/v1/pools", b"{}", now + 2, &mut cache),
            Err(AuthError::Replayed(_))
        ));
        // Altered body, path or method: bad signature (fresh cache so replay is not the cause).
        for (m, p, b) in [
            ("POST", "/v1/pools", &b"{ }"[..]),
            ("POST", "/v1/pool", b"{}"),
            ("GET", "/v1/pools", b"{}"),
        ] {
            let mut fresh = ReplayCache::default();
            assert!(matches!(
                verify_request(&h, lookup, m, p, b, now, &mut fresh),
                Err(AuthError::BadSignature(_))
            ));
        }
        // Too late or too early.
        let mut fresh = ReplayCache::default();
        assert!(matches!(
            verify_request(
                &h,
                lookup,
                "POST",
                "/v1/pools",
                b"{}",
                now + REQUEST_SKEW_S_MAX + 1,
                &mut fresh
            ),
            Err(AuthError::ClockSkew { .. })
        ));
        // A wrong key and an unknown entity.
        let other = Secret::generate().unwrap();
        let forged = sign_request(&who, &other, "GET", "/v1/map", b"", now).unwrap();
        assert!(matches!(
            verify_request(&forged, lookup, "GET", "/v1/map", b"", now, &mut fresh),
            Err(AuthError::BadSignature(_))
        ));
        let stranger = sign_request(
            &"client.x".parse().unwrap(),
            &key,
            "GET",
            "/v1/map",
            b"",
            now,
        )
        .unwrap();
        assert!(matches!(
            verify_request(&stranger, lookup, "GET", "/v1/map", b"", now, &mut fresh),
            Err(AuthError::UnknownEntity(_))
        ));
    }

    #[test]
    fn the_replay_cache_forgets_nonces_older_than_the_window() {
        let (who, key) = setup();
        let lookup = |_: &EntityName| Some(key.mon_key());
        let mut cache = ReplayCache::default();
        let t0 = 1_000_000;
        for i in 0..10 {
            let h = sign_request(&who, &key, "GET", "/v1/map", b"", t0 + i).unwrap();
            verify_request(&h, lookup, "GET", "/v1/map", b"", t0 + i, &mut cache).unwrap();
        }
        assert_eq!(cache.len(), 10);
        let h = sign_request(&who, &key, "GET", "/v1/map", b"", t0 + 1000).unwrap();
        verify_request(&h, lookup, "GET", "/v1/map", b"", t0 + 1000, &mut cache).unwrap();
        assert_eq!(cache.len(), 1);
    }

    /// One key at its bound is refused, naming itself; the others go on; its nonces age out.
    #[test]
    fn one_entity_cannot_fill_the_replay_cache() {
        let (who, key) = setup();
        let lookup = |_: &EntityName| Some(key.mon_key());
        let mut cache = ReplayCache::default();
        let t0 = 1_000_000;
        // Fill `who`'s share directly (signing 65,536 calls would only slow the test).
        for i in 0..REPLAY_NONCES_PER_ENTITY_MAX {
            cache
                .check_and_insert(&who, &format!("{i:032x}"), t0, t0)
                .unwrap();
        }
        let h = sign_request(&who, &key, "GET", "/v1/map", b"", t0).unwrap();
        match verify_request(&h, lookup, "GET", "/v1/map", b"", t0, &mut cache) {
            Err(AuthError::EntityCallsMax { entity, calls, .. }) => {
                assert_eq!(entity, who.to_string());
                assert_eq!(calls, REPLAY_NONCES_PER_ENTITY_MAX);
            }
            other => panic!("{other:?}"),
        }
        let osd: EntityName = "osd.1".parse().unwrap();
        let h = sign_request(&osd, &key, "POST", "/v1/osds/1/heartbeat", b"{}", t0).unwrap();
        let lookup_any = |_: &EntityName| Some(key.mon_key());
        verify_request(
            &h,
            lookup_any,
            "POST",
            "/v1/osds/1/heartbeat",
            b"{}",
            t0,
            &mut cache,
        )
        .expect("another entity is not held up");
        // Once the window passed, `who` may call again.
        let later = t0 + REQUEST_SKEW_S_MAX + 1;
        let h = sign_request(&who, &key, "GET", "/v1/map", b"", later).unwrap();
        verify_request(&h, lookup, "GET", "/v1/map", b"", later, &mut cache).unwrap();
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn headers_are_all_or_nothing() {
        let none = SignedHeaders::from_lookup(|_| None).unwrap();
        assert!(none.is_none());
        let partial =
            SignedHeaders::from_lookup(|h| (h == HEADER_ENTITY).then_some("client.admin"));
        assert!(matches!(partial, Err(AuthError::Malformed(_))));
        assert_eq!(
            unhex(&hex(&[0, 1, 254, 255])).unwrap(),
            vec![0, 1, 254, 255]
        );
        assert!(unhex("abc").is_none() && unhex("zz").is_none());
    }
}

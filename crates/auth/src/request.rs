//! Signed monitor API requests.
//!
//! A request carries five headers: the entity, the time (Unix seconds), a fresh random nonce,
//! the leading monitor's incarnation and an HMAC-SHA256, under the entity's monitor key, of the
//! method, path with query, time, nonce, incarnation and the SHA-256 of the body. The monitor
//! recomputes it with the key from its table, refuses a time more than [`REQUEST_SKEW_S_MAX`]
//! from its own clock, a nonce it has seen within that window and an incarnation other than
//! its own, so a captured request cannot be altered, nor replayed: not to the same monitor
//! (its nonce is remembered) and not after a restart or a change of leader (the incarnation,
//! drawn at random when a monitor process starts, differs; the caller learns the new one from
//! the refusal and signs again). The key never crosses the network.
//!
//! Answers are signed too ([`sign_reply`]): an HMAC under the caller's monitor key of the
//! request's nonce, the status and the SHA-256 of the body, so an answer cannot be forged,
//! altered or replayed to another call (`docs/security.md`, "Monitor answers").

use crate::entity::EntityName;
use crate::error::AuthError;
use crate::secret::Secret;
use std::collections::{BTreeMap, HashMap, HashSet};

pub const HEADER_ENTITY: &str = "x-fastblock-entity";
pub const HEADER_TIME: &str = "x-fastblock-time";
pub const HEADER_NONCE: &str = "x-fastblock-nonce";
pub const HEADER_SIGNATURE: &str = "x-fastblock-signature";
/// On a request: the incarnation the call is signed for ([`INCARNATION_UNKNOWN`] on first
/// contact). On an answer: the answering leader's incarnation.
pub const HEADER_INCARNATION: &str = "x-fastblock-incarnation";
/// On an answer to a verified call: [`sign_reply`]'s MAC.
pub const HEADER_REPLY_SIGNATURE: &str = "x-fastblock-reply-signature";
/// The incarnation a caller signs for before it has heard one: always refused as stale.
pub const INCARNATION_UNKNOWN: &str = "-";
const INCARNATION_BYTES: usize = 16;

/// How far a request's time may be from the monitor's clock, either way.
pub const REQUEST_SKEW_S_MAX: u64 = 300;
/// Nonces remembered at most (within the skew window) before requests are refused as too many:
/// about 13,981 signed calls per second over the whole window, sized for a thousand OSDs (a
/// heartbeat a second each, and report batches and map polls while the cluster changes); about
/// 256 MiB at most ([`ReplayCache`]).
pub const REPLAY_NONCES_MAX: usize = 4 << 20;
/// Nonces one entity may have remembered at once by default: about 218 signed calls per second
/// for the whole window, far above what a daemon makes (an OSD: a heartbeat a second and a
/// report batch at most every 50 ms), so that one key, even one limited to a pool, cannot fill
/// the cache and have every other entity's calls refused (64 such keys would be needed). The
/// monitor's `--signed-calls-per-entity-max` sets it (at most [`REPLAY_NONCES_MAX`] / 16).
pub const REPLAY_NONCES_PER_ENTITY_MAX: usize = 1 << 16;
const NONCE_BYTES: usize = 16;

/// The authentication headers of one request, as text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignedHeaders {
    pub entity: String,
    pub time_unix_s: u64,
    pub nonce_hex: String,
    pub incarnation: String,
    pub signature_hex: String,
}

impl SignedHeaders {
    pub fn pairs(&self) -> [(&'static str, String); 5] {
        [
            (HEADER_ENTITY, self.entity.clone()),
            (HEADER_TIME, self.time_unix_s.to_string()),
            (HEADER_NONCE, self.nonce_hex.clone()),
            (HEADER_INCARNATION, self.incarnation.clone()),
            (HEADER_SIGNATURE, self.signature_hex.clone()),
        ]
    }

    /// Reads the headers through `get` (a header lookup); `Ok(None)` if the request carries
    /// none of them (an unauthenticated request).
    pub fn from_lookup<'a>(
        get: impl Fn(&str) -> Option<&'a str>,
    ) -> Result<Option<SignedHeaders>, AuthError> {
        let (e, t, n, i, s) = (
            get(HEADER_ENTITY),
            get(HEADER_TIME),
            get(HEADER_NONCE),
            get(HEADER_INCARNATION),
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
            incarnation: need(i, HEADER_INCARNATION)?.to_string(),
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
    incarnation: &str,
    body: &[u8],
) -> [u8; 32] {
    // `mac` length-prefixes each part: no two different calls hash the same bytes.
    mon_key.mac(&[
        b"fastblock-v2 request",
        method.as_bytes(),
        path_and_query.as_bytes(),
        &time_unix_s.to_le_bytes(),
        nonce_hex.as_bytes(),
        incarnation.as_bytes(),
        &body_digest(body),
    ])
}

/// A fresh monitor incarnation: 16 random bytes in hex.
pub fn new_incarnation() -> Result<String, AuthError> {
    Ok(hex(&crate::secret::random_bytes::<INCARNATION_BYTES>()?))
}

/// Signs a request as `entity` with its entity key (the monitor key is derived here), for
/// the monitor incarnation `incarnation` (the last one heard, or [`INCARNATION_UNKNOWN`]).
pub fn sign_request(
    entity: &EntityName,
    key: &Secret,
    method: &str,
    path_and_query: &str,
    body: &[u8],
    now_unix_s: u64,
    incarnation: &str,
) -> Result<SignedHeaders, AuthError> {
    let nonce_hex = hex(&crate::secret::random_bytes::<NONCE_BYTES>()?);
    let mac = message_mac(
        &key.mon_key(),
        method,
        path_and_query,
        now_unix_s,
        &nonce_hex,
        incarnation,
        body,
    );
    Ok(SignedHeaders {
        entity: entity.to_string(),
        time_unix_s: now_unix_s,
        nonce_hex,
        incarnation: incarnation.to_string(),
        signature_hex: hex(&mac),
    })
}

fn reply_mac(mon_key: &Secret, request_nonce_hex: &str, status: u16, body: &[u8]) -> [u8; 32] {
    mon_key.mac(&[
        b"fastblock-v2 reply",
        request_nonce_hex.as_bytes(),
        &status.to_le_bytes(),
        &body_digest(body),
    ])
}

/// The monitor's signature of its answer (`status`, `body`) to the verified call that carried
/// `request_nonce_hex`, under the caller's monitor key.
pub fn sign_reply(
    caller_mon_key: &Secret,
    request_nonce_hex: &str,
    status: u16,
    body: &[u8],
) -> String {
    hex(&reply_mac(caller_mon_key, request_nonce_hex, status, body))
}

/// Checks an answer against the call it answers (its nonce) with the caller's own key.
pub fn verify_reply(
    key: &Secret,
    request_nonce_hex: &str,
    status: u16,
    body: &[u8],
    signature_hex: &str,
) -> Result<(), AuthError> {
    let tag = unhex(signature_hex)
        .ok_or_else(|| AuthError::Malformed("answer signature is not hex".into()))?;
    let expected = reply_mac(&key.mon_key(), request_nonce_hex, status, body);
    if !crate::secret::ct_eq(&expected, &tag) {
        return Err(AuthError::BadSignature("the monitor's answer".into()));
    }
    Ok(())
}

/// What a monitor checks a call against: its clock, its incarnation and the nonces it has seen.
pub struct Verifier<'a> {
    pub now_unix_s: u64,
    pub incarnation: &'a str,
    pub replays: &'a mut ReplayCache,
}

/// Checks a request's signature, incarnation and freshness with the entity's monitor key and
/// records its nonce. Returns the entity on success.
pub fn verify_request(
    headers: &SignedHeaders,
    mon_key_of: impl Fn(&EntityName) -> Option<Secret>,
    method: &str,
    path_and_query: &str,
    body: &[u8],
    verifier: Verifier<'_>,
) -> Result<EntityName, AuthError> {
    let Verifier {
        now_unix_s,
        incarnation,
        replays,
    } = verifier;
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
        &headers.incarnation,
        body,
    );
    if !crate::secret::ct_eq(&expected, &tag) {
        return Err(AuthError::BadSignature(entity.to_string()));
    }
    // Signed for another monitor incarnation: maybe a replay from before a restart or a change
    // of leader, whose nonces this monitor never saw; the caller signs again for this one.
    if headers.incarnation != incarnation {
        return Err(AuthError::StaleIncarnation {
            current: incarnation.to_string(),
        });
    }
    // Only a request that proved the key is remembered: forged requests cannot fill the cache.
    replays.check_and_insert(&entity, &headers.nonce_hex, headers.time_unix_s, now_unix_s)?;
    Ok(entity)
}

/// An entity's number in the [`ReplayCache`]: its name is kept once, not with every nonce.
type EntitySlot = u32;

/// One remembered call: who made it and its nonce, 20 bytes.
type Seen = (EntitySlot, [u8; NONCE_BYTES]);

/// Nonces seen within the skew window, by the time their request carried, and how many each
/// entity has. About 64 bytes per nonce (a hash-set slot and a time-list slot of 20 bytes each,
/// plus the set's control bytes and spare capacity; measured with 1 Mi nonces of 1,000
/// entities, where the cache keyed by strings took 310): [`REPLAY_NONCES_MAX`] of them hold
/// about 256 MiB.
#[derive(Debug)]
pub struct ReplayCache {
    /// Nonces one entity may have remembered at once.
    per_entity_max: usize,
    seen: HashSet<Seen>,
    by_time: BTreeMap<u64, Vec<Seen>>,
    /// Each entity with nonces in the cache: its name and how many; forgotten at none.
    entities: HashMap<EntitySlot, (String, usize)>,
    slots: HashMap<String, EntitySlot>,
    next_slot: EntitySlot,
}

impl Default for ReplayCache {
    fn default() -> Self {
        ReplayCache::with_per_entity_max(REPLAY_NONCES_PER_ENTITY_MAX)
    }
}

impl ReplayCache {
    /// A cache where one entity may have at most `per_entity_max` calls remembered (1 to
    /// [`REPLAY_NONCES_MAX`] / 16, so that at least 16 entities fit whole).
    pub fn with_per_entity_max(per_entity_max: usize) -> ReplayCache {
        assert!(
            (1..=REPLAY_NONCES_MAX / 16).contains(&per_entity_max),
            "per-entity bound {per_entity_max} out of range"
        );
        ReplayCache {
            per_entity_max,
            seen: HashSet::new(),
            by_time: BTreeMap::new(),
            entities: HashMap::new(),
            slots: HashMap::new(),
            next_slot: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.seen.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }

    /// Forgets the nonces of calls older than the window (the skew check refuses them).
    fn expire(&mut self, now_unix_s: u64) {
        let oldest_kept = now_unix_s.saturating_sub(REQUEST_SKEW_S_MAX);
        while let Some((&t, _)) = self.by_time.first_key_value() {
            if t >= oldest_kept {
                break;
            }
            let (_, keys) = self.by_time.pop_first().expect("non-empty");
            for k in keys {
                let removed = self.seen.remove(&k);
                debug_assert!(removed, "every timed nonce is in the set");
                let (name, count) = self.entities.get_mut(&k.0).expect("counted when inserted");
                *count -= 1;
                if *count == 0 {
                    let name = std::mem::take(name);
                    self.entities.remove(&k.0);
                    self.slots.remove(&name);
                }
            }
        }
    }

    fn check_and_insert(
        &mut self,
        entity: &EntityName,
        nonce_hex: &str,
        time_unix_s: u64,
        now_unix_s: u64,
    ) -> Result<(), AuthError> {
        self.expire(now_unix_s);
        let nonce: [u8; NONCE_BYTES] = unhex(nonce_hex)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| {
                AuthError::Malformed(format!("nonce must be {} hex digits", NONCE_BYTES * 2))
            })?;
        let name = entity.to_string();
        let slot = self.slots.get(&name).copied();
        if let Some(slot) = slot {
            if self.seen.contains(&(slot, nonce)) {
                return Err(AuthError::Replayed(name));
            }
            let mine = self.entities[&slot].1;
            if mine >= self.per_entity_max {
                return Err(AuthError::EntityCallsMax {
                    entity: name,
                    calls: mine,
                    window_s: REQUEST_SKEW_S_MAX,
                });
            }
        }
        if self.seen.len() >= REPLAY_NONCES_MAX {
            return Err(AuthError::ReplayCacheFull {
                window_s: REQUEST_SKEW_S_MAX,
            });
        }
        let slot = match slot {
            Some(slot) => slot,
            None => {
                // Slots of forgotten entities are not reused while the counter lasts (2^32
                // entities seen with no call in between); past it, a free one is found.
                let mut slot = self.next_slot;
                while self.entities.contains_key(&slot) {
                    slot = slot.wrapping_add(1);
                }
                self.next_slot = slot.wrapping_add(1);
                self.slots.insert(name.clone(), slot);
                self.entities.insert(slot, (name, 0));
                slot
            }
        };
        self.entities.get_mut(&slot).expect("interned above").1 += 1;
        self.seen.insert((slot, nonce));
        self.by_time
            .entry(time_unix_s)
            .or_default()
            .push((slot, nonce));
        debug_assert_eq!(self.slots.len(), self.entities.len());
        debug_assert!(self.entities.values().all(|(_, n)| *n > 0));
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

    const INC: &str = "00112233445566778899aabbccddeeff";

    fn at(now_unix_s: u64, replays: &mut ReplayCache) -> Verifier<'_> {
        Verifier {
            now_unix_s,
            incarnation: INC,
            replays,
        }
    }

    fn setup() -> (EntityName, Secret) {
        (EntityName::admin(), Secret::generate().unwrap())
    }

    #[test]
    fn a_signed_request_verifies_once_and_not_when_altered_replayed_or_late() {
        let (who, key) = setup();
        let lookup = |e: &EntityName| (e == &EntityName::admin()).then(|| key.mon_key());
        let now = 1_800_000_000;
        let h = sign_request(&who, &key, "POST", "/v1/pools", b"{}", now, INC).unwrap();
        let mut cache = ReplayCache::default();
        assert_eq!(
            verify_request(
                &h,
                lookup,
                "POST",
                "/v1/pools",
                b"{}",
                at(now + 1, &mut cache)
            )
            .unwrap(),
            who
        );
        // The same request again: replayed.
        assert!(matches!(
            verify_request(
                &h,
                lookup,
                "POST",
                "/v1/pools",
                b"{}",
                at(now + 2, &mut cache)
            ),
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
                verify_request(&h, lookup, m, p, b, at(now, &mut fresh)),
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
                at(now + REQUEST_SKEW_S_MAX + 1, &mut fresh)
            ),
            Err(AuthError::ClockSkew { .. })
        ));
        // A wrong key and an unknown entity.
        let other = Secret::generate().unwrap();
        let forged = sign_request(&who, &other, "GET", "/v1/map", b"", now, INC).unwrap();
        assert!(matches!(
            verify_request(&forged, lookup, "GET", "/v1/map", b"", at(now, &mut fresh)),
            Err(AuthError::BadSignature(_))
        ));
        let stranger = sign_request(
            &"client.x".parse().unwrap(),
            &key,
            "GET",
            "/v1/map",
            b"",
            now,
            INC,
        )
        .unwrap();
        assert!(matches!(
            verify_request(
                &stranger,
                lookup,
                "GET",
                "/v1/map",
                b"",
                at(now, &mut fresh)
            ),
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
            let h = sign_request(&who, &key, "GET", "/v1/map", b"", t0 + i, INC).unwrap();
            verify_request(&h, lookup, "GET", "/v1/map", b"", at(t0 + i, &mut cache)).unwrap();
        }
        assert_eq!(cache.len(), 10);
        let h = sign_request(&who, &key, "GET", "/v1/map", b"", t0 + 1000, INC).unwrap();
        verify_request(&h, lookup, "GET", "/v1/map", b"", at(t0 + 1000, &mut cache)).unwrap();
        assert_eq!(cache.len(), 1);
    }

    /// An entity whose nonces all aged out is forgotten, name and all; a new one takes a
    /// slot of its own, and nonces of one entity never count as another's.
    #[test]
    fn the_cache_forgets_entities_with_no_nonce_left() {
        let key = Secret::generate().unwrap();
        let lookup = |_: &EntityName| Some(key.mon_key());
        let mut cache = ReplayCache::default();
        let t0 = 1_000_000;
        let a: EntityName = "client.a".parse().unwrap();
        let b: EntityName = "client.b".parse().unwrap();
        let h = sign_request(&a, &key, "GET", "/v1/map", b"", t0, INC).unwrap();
        verify_request(&h, lookup, "GET", "/v1/map", b"", at(t0, &mut cache)).unwrap();
        // The same nonce from another entity is another call.
        cache
            .check_and_insert(&b, &h.nonce_hex, t0, t0)
            .expect("b's nonce is b's");
        assert!(matches!(
            cache.check_and_insert(&a, &h.nonce_hex.to_ascii_uppercase(), t0, t0),
            Err(AuthError::Replayed(_))
        ));
        assert_eq!((cache.len(), cache.entities.len()), (2, 2));
        let later = t0 + REQUEST_SKEW_S_MAX + 1;
        let h = sign_request(&b, &key, "GET", "/v1/map", b"", later, INC).unwrap();
        verify_request(&h, lookup, "GET", "/v1/map", b"", at(later, &mut cache)).unwrap();
        assert_eq!(
            (cache.len(), cache.entities.len(), cache.slots.len()),
            (1, 1, 1)
        );
        assert!(cache.slots.contains_key("client.b"));
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
        let h = sign_request(&who, &key, "GET", "/v1/map", b"", t0, INC).unwrap();
        match verify_request(&h, lookup, "GET", "/v1/map", b"", at(t0, &mut cache)) {
            Err(AuthError::EntityCallsMax { entity, calls, .. }) => {
                assert_eq!(entity, who.to_string());
                assert_eq!(calls, REPLAY_NONCES_PER_ENTITY_MAX);
            }
            other => panic!("{other:?}"),
        }
        let osd: EntityName = "osd.1".parse().unwrap();
        let h = sign_request(&osd, &key, "POST", "/v1/osds/1/heartbeat", b"{}", t0, INC).unwrap();
        let lookup_any = |_: &EntityName| Some(key.mon_key());
        verify_request(
            &h,
            lookup_any,
            "POST",
            "/v1/osds/1/heartbeat",
            b"{}",
            at(t0, &mut cache),
        )
        .expect("another entity is not held up");
        // Once the window passed, `who` may call again.
        let later = t0 + REQUEST_SKEW_S_MAX + 1;
        let h = sign_request(&who, &key, "GET", "/v1/map", b"", later, INC).unwrap();
        verify_request(&h, lookup, "GET", "/v1/map", b"", at(later, &mut cache)).unwrap();
        assert_eq!(cache.len(), 1);
    }

    /// A call signed for another incarnation (captured before a restart or a change of
    /// leader) is refused before its nonce is remembered, naming the current incarnation; the
    /// same call signed again for it passes.
    #[test]
    fn a_call_signed_for_another_incarnation_is_refused_and_not_remembered() {
        let (who, key) = setup();
        let lookup = |_: &EntityName| Some(key.mon_key());
        let now = 1_800_000_000;
        let mut cache = ReplayCache::default();
        for stale in ["ffeeddccbbaa99887766554433221100", INCARNATION_UNKNOWN] {
            let h = sign_request(&who, &key, "POST", "/v1/pools", b"{}", now, stale).unwrap();
            match verify_request(&h, lookup, "POST", "/v1/pools", b"{}", at(now, &mut cache)) {
                Err(AuthError::StaleIncarnation { current }) => assert_eq!(current, INC),
                other => panic!("{other:?}"),
            }
            // Relabelled to the current incarnation: the signature no longer matches.
            let relabelled = SignedHeaders {
                incarnation: INC.into(),
                ..h
            };
            assert!(matches!(
                verify_request(
                    &relabelled,
                    lookup,
                    "POST",
                    "/v1/pools",
                    b"{}",
                    at(now, &mut cache)
                ),
                Err(AuthError::BadSignature(_))
            ));
        }
        assert!(cache.is_empty());
        assert_ne!(new_incarnation().unwrap(), new_incarnation().unwrap());
    }

    /// An answer verifies only with the caller's key, for the call it answers, unaltered.
    #[test]
    fn an_answer_is_bound_to_its_call_and_the_callers_key() {
        let (who, key) = setup();
        let h = sign_request(&who, &key, "GET", "/v1/map", b"", 1, INC).unwrap();
        let sig = sign_reply(&key.mon_key(), &h.nonce_hex, 200, b"{\"auth\":\"sign\"}");
        verify_reply(&key, &h.nonce_hex, 200, b"{\"auth\":\"sign\"}", &sig).unwrap();
        let other_call = sign_request(&who, &key, "GET", "/v1/map", b"", 1, INC).unwrap();
        let other_key = Secret::generate().unwrap();
        for (k, nonce, status, body) in [
            (&key, &h.nonce_hex, 200, &b"{\"auth\":\"none\"}"[..]),
            (&key, &h.nonce_hex, 404, b"{\"auth\":\"sign\"}"),
            (&key, &other_call.nonce_hex, 200, b"{\"auth\":\"sign\"}"),
            (&other_key, &h.nonce_hex, 200, b"{\"auth\":\"sign\"}"),
        ] {
            assert!(matches!(
                verify_reply(k, nonce, status, body, &sig),
                Err(AuthError::BadSignature(_))
            ));
        }
        assert!(matches!(
            verify_reply(&key, &h.nonce_hex, 200, b"", "not hex"),
            Err(AuthError::Malformed(_))
        ));
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

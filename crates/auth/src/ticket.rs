//! Tickets: how a client or an OSD proves itself to an OSD that holds no key but its own, in
//! the shape of Kerberos and cephx.
//!
//! The monitor, which holds every entity's key, issues a ticket for one entity to speak to
//! one OSD: a fresh random session key, sealed (AES-256-GCM) under that OSD's service key
//! (`Secret::service_key` of `osd.N`'s key) together with who the holder is, its caps and
//! generation, the key-table epoch, the target OSD and an expiry, all bound as associated
//! data. The holder gets the same session key sealed under its own key
//! ([`seal_session_key`]), bound to the ticket. On the data plane it presents the ticket in
//! its `AuthHello` and proves it holds the session key (`crate::handshake`); the OSD opens
//! the ticket with its service key and learns the session key, the entity and its caps.
//!
//! So an OSD holds only its own key: it can open tickets made for itself and no other, and a
//! compromised OSD can neither speak as another OSD nor as any client it never saw a ticket
//! of. A ticket is for one target: the session key inside is not shared with any other OSD,
//! so an OSD that opened a client's ticket cannot use it elsewhere.
//!
//! Format of a ticket (little-endian; `docs/wire-protocol.md`, "Tickets"):
//!
//! ```text
//! version u8 (1) | target osd u32 | generation u64 | auth epoch u64 | expires (unix s) u64
//! | entity length u16 | caps length u16 | entity | caps | sealed session key (60 bytes)
//! ```
//!
//! The sealed session key is `nonce (12) || ciphertext (32) || tag (16)`, its associated data
//! `"fastblock-v1 ticket"` followed by every byte of the ticket before it.

use crate::entity::EntityName;
use crate::error::AuthError;
use crate::secret::{aead_key, blob_key, open_with_aad, seal_with_aad, Secret, SECRET_BYTES};
use fastblock_types::OsdId;

/// How long a ticket is valid after the monitor issues it. Holders ask for a new one when
/// half of it has passed; a connection made with a ticket outlives it (revocation, not
/// expiry, closes connections: `docs/security.md`, "Rotation and revocation").
pub const TICKET_LIFETIME_SECS: u64 = 3600;
/// How far an OSD's clock may be behind the monitor's before a fresh ticket looks expired
/// (it is checked against the OSD's clock).
pub const TICKET_CLOCK_SKEW_SECS: u64 = 60;
/// The most bytes a ticket may take in a Hello.
pub const TICKET_BYTES_MAX: usize = 1024;

const TICKET_VERSION: u8 = 1;
/// version, target, generation, epoch, expiry, two lengths.
const FIXED_BYTES: usize = 1 + 4 + 8 + 8 + 8 + 2 + 2;
/// nonce, the 32-byte session key, tag.
const SEALED_BYTES: usize = 12 + SECRET_BYTES + 16;
const LABEL_TICKET: &[u8] = b"fastblock-v1 ticket";
const LABEL_SESSION_KEY: &[u8] = b"fastblock-v1 session key";
/// The most bytes of caps text a ticket carries (a long list of pools).
const CAPS_BYTES_MAX: usize = 512;

/// What a ticket says about its holder, readable by anyone, trusted only once it opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TicketClaims {
    pub entity: EntityName,
    /// The holder's caps as the monitor's key table had them (`Caps`' text form).
    pub caps: String,
    /// The holder's key generation when the ticket was issued.
    pub generation: u64,
    /// The key table's epoch when the ticket was issued.
    pub auth_epoch: u64,
    /// The OSD the ticket is for: no other can open it.
    pub target: OsdId,
    pub expires_unix_s: u64,
}

impl TicketClaims {
    fn encode_clear(&self) -> Result<Vec<u8>, AuthError> {
        let entity = self.entity.to_string();
        if self.caps.len() > CAPS_BYTES_MAX {
            return Err(AuthError::Malformed(format!(
                "caps of {} bytes do not fit a ticket (at most {CAPS_BYTES_MAX})",
                self.caps.len()
            )));
        }
        let mut out = Vec::with_capacity(FIXED_BYTES + entity.len() + self.caps.len() + 60);
        out.push(TICKET_VERSION);
        out.extend_from_slice(&self.target.0.to_le_bytes());
        out.extend_from_slice(&self.generation.to_le_bytes());
        out.extend_from_slice(&self.auth_epoch.to_le_bytes());
        out.extend_from_slice(&self.expires_unix_s.to_le_bytes());
        out.extend_from_slice(&(entity.len() as u16).to_le_bytes());
        out.extend_from_slice(&(self.caps.len() as u16).to_le_bytes());
        out.extend_from_slice(entity.as_bytes());
        out.extend_from_slice(self.caps.as_bytes());
        Ok(out)
    }

    /// Parses the clear part; returns the claims and where the sealed session key starts.
    fn decode_clear(ticket: &[u8]) -> Result<(TicketClaims, usize), AuthError> {
        let bad = |why: String| AuthError::Malformed(format!("ticket: {why}"));
        if ticket.len() > TICKET_BYTES_MAX {
            return Err(bad(format!(
                "{} bytes, at most {TICKET_BYTES_MAX}",
                ticket.len()
            )));
        }
        if ticket.len() < FIXED_BYTES + SEALED_BYTES {
            return Err(bad(format!("{} bytes is too short", ticket.len())));
        }
        if ticket[0] != TICKET_VERSION {
            return Err(bad(format!("unknown version {}", ticket[0])));
        }
        let u64_at = |at: usize| u64::from_le_bytes(ticket[at..at + 8].try_into().expect("8"));
        let target = OsdId(u32::from_le_bytes(ticket[1..5].try_into().expect("4")));
        let (generation, auth_epoch, expires_unix_s) = (u64_at(5), u64_at(13), u64_at(21));
        let entity_len = u16::from_le_bytes([ticket[29], ticket[30]]) as usize;
        let caps_len = u16::from_le_bytes([ticket[31], ticket[32]]) as usize;
        let sealed_at = FIXED_BYTES + entity_len + caps_len;
        if ticket.len() != sealed_at + SEALED_BYTES {
            return Err(bad(format!(
                "lengths {entity_len} and {caps_len} do not match its {} bytes",
                ticket.len()
            )));
        }
        let text = |range: std::ops::Range<usize>, what: &str| {
            std::str::from_utf8(&ticket[range]).map_err(|_| bad(format!("{what} is not UTF-8")))
        };
        let entity: EntityName = text(FIXED_BYTES..FIXED_BYTES + entity_len, "entity")?.parse()?;
        let caps = text(FIXED_BYTES + entity_len..sealed_at, "caps")?.to_string();
        let claims = TicketClaims {
            entity,
            caps,
            generation,
            auth_epoch,
            target,
            expires_unix_s,
        };
        Ok((claims, sealed_at))
    }
}

fn aad(clear: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(LABEL_TICKET.len() + clear.len());
    out.extend_from_slice(LABEL_TICKET);
    out.extend_from_slice(clear);
    out
}

/// A ticket as the monitor issued it, and the session key inside it.
pub struct Issued {
    pub ticket: Vec<u8>,
    pub session_key: Secret,
}

/// Issues a ticket for `claims` (the monitor's side): `service_key` is the target OSD's.
pub fn issue(service_key: &Secret, claims: &TicketClaims) -> Result<Issued, AuthError> {
    let session_key = Secret::generate()?;
    let mut ticket = claims.encode_clear()?;
    let sealed = seal_with_aad(
        &aead_key(&service_key.derive(LABEL_TICKET)),
        session_key.as_bytes(),
        &aad(&ticket),
    )?;
    debug_assert_eq!(sealed.len(), SEALED_BYTES);
    ticket.extend_from_slice(&sealed);
    Ok(Issued {
        ticket,
        session_key,
    })
}

/// Reads a ticket's claims without opening it (a holder looking at what it was given).
pub fn claims_of(ticket: &[u8]) -> Result<TicketClaims, AuthError> {
    TicketClaims::decode_clear(ticket).map(|(claims, _)| claims)
}

/// Opens a ticket with this OSD's service key (the OSD's side): the claims and the session
/// key, if it was sealed under this key and not altered. Expiry and target are the caller's
/// to check ([`check_usable`]).
pub fn open(service_key: &Secret, ticket: &[u8]) -> Result<(TicketClaims, Secret), AuthError> {
    let (claims, sealed_at) = TicketClaims::decode_clear(ticket)?;
    let plain = open_with_aad(
        &aead_key(&service_key.derive(LABEL_TICKET)),
        &ticket[sealed_at..],
        &aad(&ticket[..sealed_at]),
    )
    .map_err(|_| {
        AuthError::BadTicket(format!(
            "the ticket of {} for osd.{} does not open with this OSD's key (made for another OSD or cluster, or altered)",
            claims.entity, claims.target.0
        ))
    })?;
    let bytes: [u8; SECRET_BYTES] = plain
        .as_slice()
        .try_into()
        .map_err(|_| AuthError::Malformed("ticket session key length".into()))?;
    Ok((claims, Secret::from_bytes(bytes)))
}

/// Whether an opened ticket may be used at OSD `me` at time `now_unix_s` (the OSD's clock).
pub fn check_usable(claims: &TicketClaims, me: OsdId, now_unix_s: u64) -> Result<(), AuthError> {
    if claims.target != me {
        return Err(AuthError::BadTicket(format!(
            "the ticket of {} is for osd.{}, not osd.{}",
            claims.entity, claims.target.0, me.0
        )));
    }
    if now_unix_s > claims.expires_unix_s.saturating_add(TICKET_CLOCK_SKEW_SECS) {
        return Err(AuthError::TicketExpired {
            entity: claims.entity.to_string(),
            expired_s_ago: now_unix_s - claims.expires_unix_s,
        });
    }
    Ok(())
}

/// The session key sealed for the ticket's holder (under a key derived from its own key),
/// bound to the ticket: it opens only with that holder's key and only for that ticket.
pub fn seal_session_key(
    holder_key: &Secret,
    ticket: &[u8],
    session_key: &Secret,
) -> Result<Vec<u8>, AuthError> {
    seal_with_aad(
        &blob_key(holder_key),
        session_key.as_bytes(),
        &session_aad(ticket),
    )
}

/// Opens what [`seal_session_key`] made for this holder and ticket.
pub fn open_session_key(
    holder_key: &Secret,
    ticket: &[u8],
    sealed: &[u8],
) -> Result<Secret, AuthError> {
    let plain =
        open_with_aad(&blob_key(holder_key), sealed, &session_aad(ticket)).map_err(|_| {
            AuthError::BadSignature(
                "the session key of a ticket (not sealed for this key, or for another ticket)"
                    .into(),
            )
        })?;
    let bytes: [u8; SECRET_BYTES] = plain
        .as_slice()
        .try_into()
        .map_err(|_| AuthError::Malformed("session key length".into()))?;
    Ok(Secret::from_bytes(bytes))
}

fn session_aad(ticket: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(LABEL_SESSION_KEY.len() + ticket.len());
    out.extend_from_slice(LABEL_SESSION_KEY);
    out.extend_from_slice(ticket);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims() -> TicketClaims {
        TicketClaims {
            entity: "client.vm".parse().unwrap(),
            caps: "pool=a".into(),
            generation: 3,
            auth_epoch: 7,
            target: OsdId(2),
            expires_unix_s: 10_000,
        }
    }

    #[test]
    fn a_ticket_opens_only_at_its_osd_and_unaltered() {
        let osd2 = Secret::generate().unwrap();
        let osd3 = Secret::generate().unwrap();
        let issued = issue(&osd2.service_key(), &claims()).unwrap();
        let (got, session) = open(&osd2.service_key(), &issued.ticket).unwrap();
        assert_eq!(got, claims());
        assert_eq!(session, issued.session_key);
        assert_eq!(claims_of(&issued.ticket).unwrap(), claims());
        // Another OSD's key, or osd.2's entity key itself (not its service key).
        assert!(matches!(
            open(&osd3.service_key(), &issued.ticket),
            Err(AuthError::BadTicket(_))
        ));
        assert!(open(&osd2, &issued.ticket).is_err());
        // Every byte of the clear part is bound: relabelled entity, caps, generation,
        // epoch, target or expiry does not open.
        for at in 0..issued.ticket.len() {
            let mut t = issued.ticket.clone();
            t[at] ^= 1;
            assert!(open(&osd2.service_key(), &t).is_err(), "byte {at}");
        }
        for cut in 0..issued.ticket.len() {
            assert!(open(&osd2.service_key(), &issued.ticket[..cut]).is_err());
        }
    }

    #[test]
    fn usable_only_at_its_target_and_before_its_expiry_with_the_skew_allowed() {
        let c = claims();
        assert!(check_usable(&c, OsdId(2), 9_000).is_ok());
        assert!(check_usable(&c, OsdId(2), 10_000 + TICKET_CLOCK_SKEW_SECS).is_ok());
        assert!(matches!(
            check_usable(&c, OsdId(2), 10_001 + TICKET_CLOCK_SKEW_SECS),
            Err(AuthError::TicketExpired { .. })
        ));
        assert!(matches!(
            check_usable(&c, OsdId(3), 9_000),
            Err(AuthError::BadTicket(_))
        ));
    }

    #[test]
    fn the_session_key_opens_for_its_holder_and_ticket_only() {
        let holder = Secret::generate().unwrap();
        let osd = Secret::generate().unwrap();
        let a = issue(&osd.service_key(), &claims()).unwrap();
        let b = issue(&osd.service_key(), &claims()).unwrap();
        let sealed = seal_session_key(&holder, &a.ticket, &a.session_key).unwrap();
        assert_eq!(
            open_session_key(&holder, &a.ticket, &sealed).unwrap(),
            a.session_key
        );
        assert!(open_session_key(&Secret::generate().unwrap(), &a.ticket, &sealed).is_err());
        // Moved to another ticket.
        assert!(open_session_key(&holder, &b.ticket, &sealed).is_err());
        assert_ne!(a.session_key, b.session_key, "each ticket its own key");
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_as_a_ticket_are_an_error_not_a_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..300)) {
            let key = Secret::from_bytes([5; 32]);
            let _ = open(&key, &bytes);
            let _ = claims_of(&bytes);
        }
    }
}

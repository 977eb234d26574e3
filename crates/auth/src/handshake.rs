//! The data-plane handshake: how a client or OSD proves itself to an OSD (and the OSD proves
//! itself in turn) before any other frame, in cephx's shape: a ticket from the monitor, no key
//! on the wire, no replay.
//!
//! ```text
//! connector                                        acceptor (osd.N)
//!   Hello { mode, entity, client_nonce, ticket } -->  opens the ticket with its service key:
//!                                                     the session key sk, entity, caps
//!                                              <--  Challenge { server_nonce }
//!   Proof { HMAC_sk(connector, ..) }             -->  checks it with sk
//!                                              <--  Done { HMAC_sk(acceptor, ..) }
//! ```
//!
//! The ticket (`crate::ticket`) was issued by the monitor for this entity and this OSD only;
//! the connector got `sk` from the monitor sealed under its own key. So the connector proves
//! it is the entity the ticket names (only it could open `sk`), and the acceptor proves it is
//! osd.N (only osd.N's service key opens the ticket). Neither holds the other's key. Both
//! proofs cover the entity, the mode and both nonces, so a recorded proof is worthless on any
//! other connection (each side draws a fresh nonce) and a downgrade of the mode is detected.
//! The connection's frame keys, one per direction, are derived from `sk` and both nonces.
//! Payload layouts are in `docs/wire-protocol.md`.
//!
//! Both ends are pure: the caller draws the nonces, reads the clock and carries the payloads.

use crate::entity::EntityName;
use crate::error::AuthError;
use crate::secret::Secret;
use crate::ticket::{self, TicketClaims, TICKET_BYTES_MAX};
use fastblock_types::auth::AuthMode;
use fastblock_types::OsdId;

pub const NONCE_BYTES: usize = 32;
pub const PROOF_BYTES: usize = 32;
/// The handshake's version, in the Hello's second byte: 2 carries a ticket (version 1, from
/// before tickets, had a zero there and no ticket).
pub const HANDSHAKE_VERSION: u8 = 2;
/// Fixed part of a Hello: mode (1), version (1), reserved (4), entity length (2), nonce (32).
const HELLO_FIXED_BYTES: usize = 40;
const ENTITY_BYTES_MAX: usize = 80;

/// What a handshake leaves behind: who the peer is and the keys for its frames.
#[derive(Debug)]
pub struct Session {
    pub entity: EntityName,
    pub mode: AuthMode,
    /// Protects frames from the connector to the acceptor.
    pub to_acceptor: Secret,
    /// Protects frames from the acceptor to the connector.
    pub to_connector: Secret,
}

fn proof(
    sk: &Secret,
    who: &[u8],
    entity: &EntityName,
    mode: AuthMode,
    cn: &[u8],
    sn: &[u8],
) -> [u8; 32] {
    sk.mac(&[
        b"fastblock-v2 handshake",
        who,
        entity.to_string().as_bytes(),
        &[mode.wire_byte()],
        cn,
        sn,
    ])
}

fn session(sk: &Secret, entity: EntityName, mode: AuthMode, cn: &[u8], sn: &[u8]) -> Session {
    let base = Secret::from_bytes(sk.mac(&[
        b"fastblock-v2 session",
        entity.to_string().as_bytes(),
        &[mode.wire_byte()],
        cn,
        sn,
    ]));
    Session {
        to_acceptor: base.derive(b"to acceptor"),
        to_connector: base.derive(b"to connector"),
        entity,
        mode,
    }
}

fn fixed<const N: usize>(payload: &[u8], what: &str) -> Result<[u8; N], AuthError> {
    payload.try_into().map_err(|_| {
        AuthError::Malformed(format!("{what} of {} bytes, expected {N}", payload.len()))
    })
}

/// What a connector holds for one target OSD: the ticket the monitor issued and the session
/// key inside it (opened with the connector's own key).
#[derive(Clone, Debug)]
pub struct HeldTicket {
    pub ticket: Vec<u8>,
    pub session_key: Secret,
    pub claims: TicketClaims,
}

/// The connecting end.
pub struct Connector {
    entity: EntityName,
    sk: Secret,
    mode: AuthMode,
    client_nonce: [u8; NONCE_BYTES],
    server_nonce: Option<[u8; NONCE_BYTES]>,
}

impl Connector {
    /// Starts a handshake as `entity` with `held`, its ticket for the target OSD; returns the
    /// Hello payload.
    pub fn start(
        entity: EntityName,
        held: &HeldTicket,
        mode: AuthMode,
        client_nonce: [u8; NONCE_BYTES],
    ) -> (Connector, Vec<u8>) {
        assert!(mode.authenticates(), "no handshake in mode none");
        assert!(
            held.ticket.len() <= TICKET_BYTES_MAX,
            "the monitor issues tickets of at most {TICKET_BYTES_MAX} bytes"
        );
        let name = entity.to_string();
        let mut hello = Vec::with_capacity(HELLO_FIXED_BYTES + name.len() + 2 + held.ticket.len());
        hello.push(mode.wire_byte());
        hello.push(HANDSHAKE_VERSION);
        hello.extend_from_slice(&[0; 4]);
        hello.extend_from_slice(&(name.len() as u16).to_le_bytes());
        hello.extend_from_slice(&client_nonce);
        hello.extend_from_slice(name.as_bytes());
        hello.extend_from_slice(&(held.ticket.len() as u16).to_le_bytes());
        hello.extend_from_slice(&held.ticket);
        let c = Connector {
            entity,
            sk: held.session_key.clone(),
            mode,
            client_nonce,
            server_nonce: None,
        };
        (c, hello)
    }

    /// Answers the acceptor's Challenge with the Proof payload.
    pub fn on_challenge(&mut self, payload: &[u8]) -> Result<Vec<u8>, AuthError> {
        if self.server_nonce.is_some() {
            return Err(AuthError::Malformed("a second challenge".into()));
        }
        let sn: [u8; NONCE_BYTES] = fixed(payload, "challenge")?;
        self.server_nonce = Some(sn);
        Ok(proof(
            &self.sk,
            b"connector",
            &self.entity,
            self.mode,
            &self.client_nonce,
            &sn,
        )
        .to_vec())
    }

    /// Checks the acceptor's Done: it must have opened the ticket, so it is the OSD the
    /// ticket was issued for.
    pub fn on_done(self, payload: &[u8]) -> Result<Session, AuthError> {
        let sn = self
            .server_nonce
            .ok_or_else(|| AuthError::Malformed("done before challenge".into()))?;
        let got: [u8; PROOF_BYTES] = fixed(payload, "done")?;
        let want = proof(
            &self.sk,
            b"acceptor",
            &self.entity,
            self.mode,
            &self.client_nonce,
            &sn,
        );
        if !crate::secret::ct_eq(&want, &got) {
            return Err(AuthError::BadSignature(format!(
                "the OSD's proof for {} (it could not open the ticket: not the OSD it was issued for, or not of this cluster)",
                self.entity
            )));
        }
        Ok(session(
            &self.sk,
            self.entity,
            self.mode,
            &self.client_nonce,
            &sn,
        ))
    }
}

/// What the acceptor needs to judge a Hello: its own service key and id, and its clock.
pub struct AcceptorIdentity<'a> {
    pub service_key: &'a Secret,
    pub osd: OsdId,
    pub now_unix_s: u64,
}

/// The accepting end (an OSD).
pub struct Acceptor {
    mode: AuthMode,
    server_nonce: [u8; NONCE_BYTES],
    peer: Option<(EntityName, Secret, [u8; NONCE_BYTES])>,
}

impl Acceptor {
    /// `mode` is the cluster's; `server_nonce` must be fresh for this connection.
    pub fn new(mode: AuthMode, server_nonce: [u8; NONCE_BYTES]) -> Acceptor {
        assert!(mode.authenticates(), "no handshake in mode none");
        Acceptor {
            mode,
            server_nonce,
            peer: None,
        }
    }

    /// Reads the Hello and opens its ticket. Returns the ticket's claims (who the peer is, its
    /// caps, generation and key-table epoch, for the caller's revocation check) and the
    /// Challenge payload.
    pub fn on_hello(
        &mut self,
        payload: &[u8],
        me: &AcceptorIdentity<'_>,
    ) -> Result<(TicketClaims, Vec<u8>), AuthError> {
        if self.peer.is_some() {
            return Err(AuthError::Malformed("a second hello".into()));
        }
        if payload.len() < HELLO_FIXED_BYTES {
            return Err(AuthError::Malformed(format!(
                "hello of {} bytes is shorter than {HELLO_FIXED_BYTES}",
                payload.len()
            )));
        }
        let mode = AuthMode::from_wire_byte(payload[0])
            .ok_or_else(|| AuthError::Malformed(format!("unknown mode byte {}", payload[0])))?;
        if payload[1] != HANDSHAKE_VERSION {
            return Err(AuthError::Malformed(format!(
                "handshake version {} (this OSD speaks version {HANDSHAKE_VERSION}, with tickets: upgrade the client)",
                payload[1]
            )));
        }
        if payload[2..6] != [0; 4] {
            return Err(AuthError::Malformed(
                "reserved hello bytes are not zero".into(),
            ));
        }
        let name_len = u16::from_le_bytes([payload[6], payload[7]]) as usize;
        let ticket_at = HELLO_FIXED_BYTES + name_len + 2;
        if name_len > ENTITY_BYTES_MAX || payload.len() < ticket_at {
            return Err(AuthError::Malformed(format!(
                "hello entity length {name_len} does not fit its {} bytes",
                payload.len()
            )));
        }
        let cn: [u8; NONCE_BYTES] = payload[8..40].try_into().expect("32 bytes");
        let name = std::str::from_utf8(&payload[40..40 + name_len])
            .map_err(|_| AuthError::Malformed("entity name is not UTF-8".into()))?;
        let entity: EntityName = name.parse()?;
        let ticket_len =
            u16::from_le_bytes([payload[ticket_at - 2], payload[ticket_at - 1]]) as usize;
        if payload.len() != ticket_at + ticket_len {
            return Err(AuthError::Malformed(format!(
                "hello ticket length {ticket_len} does not match its {} bytes",
                payload.len()
            )));
        }
        if mode != self.mode {
            return Err(AuthError::ModeMismatch {
                ours: self.mode.to_string(),
                peer: mode.to_string(),
            });
        }
        let (claims, sk) = ticket::open(me.service_key, &payload[ticket_at..])?;
        if claims.entity != entity {
            return Err(AuthError::BadTicket(format!(
                "{entity} presented a ticket issued to {}",
                claims.entity
            )));
        }
        ticket::check_usable(&claims, me.osd, me.now_unix_s)?;
        self.peer = Some((entity, sk, cn));
        Ok((claims, self.server_nonce.to_vec()))
    }

    /// Checks the Proof; on success returns the Done payload and the session.
    pub fn on_proof(self, payload: &[u8]) -> Result<(Vec<u8>, Session), AuthError> {
        let (entity, sk, cn) = self
            .peer
            .ok_or_else(|| AuthError::Malformed("proof before hello".into()))?;
        let got: [u8; PROOF_BYTES] = fixed(payload, "proof")?;
        let want = proof(
            &sk,
            b"connector",
            &entity,
            self.mode,
            &cn,
            &self.server_nonce,
        );
        if !crate::secret::ct_eq(&want, &got) {
            return Err(AuthError::BadSignature(format!(
                "{entity}'s proof (it does not hold the ticket's session key)"
            )));
        }
        let done = proof(
            &sk,
            b"acceptor",
            &entity,
            self.mode,
            &cn,
            &self.server_nonce,
        )
        .to_vec();
        Ok((
            done,
            session(&sk, entity, self.mode, &cn, &self.server_nonce),
        ))
    }
}

/// A ticket issued straight from keys, for tests and tools that hold both the entity's key and
/// the target OSD's (a monitor does this in `crates/mon`): what the monitor would send, opened.
pub fn ticket_for_test(
    entity: &EntityName,
    entity_key: &Secret,
    caps: &str,
    osd: OsdId,
    osd_key: &Secret,
    expires_unix_s: u64,
) -> Result<HeldTicket, AuthError> {
    let claims = TicketClaims {
        entity: entity.clone(),
        caps: caps.to_string(),
        generation: 1,
        auth_epoch: 1,
        target: osd,
        expires_unix_s,
    };
    let issued = ticket::issue(&osd_key.service_key(), &claims)?;
    let sealed = ticket::seal_session_key(entity_key, &issued.ticket, &issued.session_key)?;
    let session_key = ticket::open_session_key(entity_key, &issued.ticket, &sealed)?;
    Ok(HeldTicket {
        ticket: issued.ticket,
        session_key,
        claims,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_000_000;

    struct Osd {
        key: Secret,
        service: Secret,
        id: OsdId,
    }

    fn osd(id: u32) -> Osd {
        let key = Secret::generate().unwrap();
        Osd {
            service: key.service_key(),
            key,
            id: OsdId(id),
        }
    }

    impl Osd {
        fn me(&self) -> AcceptorIdentity<'_> {
            AcceptorIdentity {
                service_key: &self.service,
                osd: self.id,
                now_unix_s: NOW,
            }
        }
        fn ticket(&self, entity: &EntityName, key: &Secret) -> HeldTicket {
            ticket_for_test(entity, key, "admin", self.id, &self.key, NOW + 3600).unwrap()
        }
    }

    #[test]
    fn a_handshake_agrees_on_the_session_keys() {
        let key = Secret::generate().unwrap();
        let o = osd(1);
        let held = o.ticket(&EntityName::admin(), &key);
        let (mut c, hello) =
            Connector::start(EntityName::admin(), &held, AuthMode::Secure, [1; 32]);
        let mut a = Acceptor::new(AuthMode::Secure, [2; 32]);
        let (claims, challenge) = a.on_hello(&hello, &o.me()).unwrap();
        assert_eq!(claims.entity, EntityName::admin());
        assert_eq!(claims.caps, "admin");
        let p = c.on_challenge(&challenge).unwrap();
        let (done, sa) = a.on_proof(&p).unwrap();
        let sc = c.on_done(&done).unwrap();
        assert_eq!(sa.to_acceptor, sc.to_acceptor);
        assert_eq!(sa.to_connector, sc.to_connector);
        assert_ne!(sa.to_acceptor, sa.to_connector);
        assert_eq!(sa.entity, EntityName::admin());
    }

    #[test]
    fn a_wrong_session_key_a_replayed_proof_and_a_wrong_mode_are_refused() {
        let key = Secret::generate().unwrap();
        let o = osd(1);
        // A ticket seen on the wire, without its session key.
        let mut stolen = o.ticket(&EntityName::admin(), &key);
        stolen.session_key = Secret::generate().unwrap();
        let (mut c, hello) =
            Connector::start(EntityName::admin(), &stolen, AuthMode::Sign, [1; 32]);
        let mut a = Acceptor::new(AuthMode::Sign, [2; 32]);
        let (_, ch) = a.on_hello(&hello, &o.me()).unwrap();
        let p = c.on_challenge(&ch).unwrap();
        assert!(matches!(a.on_proof(&p), Err(AuthError::BadSignature(_))));

        // A proof recorded on one connection, replayed on another (fresh server nonce).
        let held = o.ticket(&EntityName::admin(), &key);
        let (mut c, hello) = Connector::start(EntityName::admin(), &held, AuthMode::Sign, [1; 32]);
        let mut a1 = Acceptor::new(AuthMode::Sign, [2; 32]);
        let (_, ch) = a1.on_hello(&hello, &o.me()).unwrap();
        let recorded = c.on_challenge(&ch).unwrap();
        let mut a2 = Acceptor::new(AuthMode::Sign, [3; 32]);
        a2.on_hello(&hello, &o.me()).unwrap();
        assert!(matches!(
            a2.on_proof(&recorded),
            Err(AuthError::BadSignature(_))
        ));

        // Mode mismatch.
        let (_, hello) = Connector::start(EntityName::admin(), &held, AuthMode::Sign, [1; 32]);
        let mut a = Acceptor::new(AuthMode::Secure, [2; 32]);
        assert!(matches!(
            a.on_hello(&hello, &o.me()),
            Err(AuthError::ModeMismatch { .. })
        ));
    }

    #[test]
    fn a_ticket_works_only_at_its_osd_for_its_entity_until_it_expires() {
        let key = Secret::generate().unwrap();
        let (o1, o2) = (osd(1), osd(2));
        let held = o1.ticket(&EntityName::admin(), &key);
        // At another OSD: it does not open.
        let (_, hello) = Connector::start(EntityName::admin(), &held, AuthMode::Sign, [1; 32]);
        assert!(matches!(
            Acceptor::new(AuthMode::Sign, [2; 32]).on_hello(&hello, &o2.me()),
            Err(AuthError::BadTicket(_))
        ));
        // osd.2 given osd.1's key would open it, but the target is osd.1.
        let confused = AcceptorIdentity {
            service_key: &o1.service,
            osd: OsdId(2),
            now_unix_s: NOW,
        };
        assert!(matches!(
            Acceptor::new(AuthMode::Sign, [2; 32]).on_hello(&hello, &confused),
            Err(AuthError::BadTicket(_))
        ));
        // Presented under another entity's name.
        let (_, hello) = Connector::start("osd.7".parse().unwrap(), &held, AuthMode::Sign, [1; 32]);
        assert!(matches!(
            Acceptor::new(AuthMode::Sign, [2; 32]).on_hello(&hello, &o1.me()),
            Err(AuthError::BadTicket(_))
        ));
        // Expired.
        let (_, hello) = Connector::start(EntityName::admin(), &held, AuthMode::Sign, [1; 32]);
        let late = AcceptorIdentity {
            now_unix_s: NOW + 3600 + ticket::TICKET_CLOCK_SKEW_SECS + 1,
            ..o1.me()
        };
        assert!(matches!(
            Acceptor::new(AuthMode::Sign, [2; 32]).on_hello(&hello, &late),
            Err(AuthError::TicketExpired { .. })
        ));
    }

    #[test]
    fn a_connector_refuses_an_acceptor_that_cannot_open_its_ticket() {
        let key = Secret::generate().unwrap();
        let o = osd(1);
        let held = o.ticket(&EntityName::admin(), &key);
        let (mut c, _) = Connector::start(EntityName::admin(), &held, AuthMode::Sign, [1; 32]);
        // An impostor cannot open the ticket: it answers with a made-up challenge and proof.
        c.on_challenge(&[2; 32]).unwrap();
        assert!(matches!(
            c.on_done(&[0; 32]),
            Err(AuthError::BadSignature(_))
        ));
    }

    #[test]
    fn malformed_hellos_are_refused_not_panicked_on() {
        let key = Secret::generate().unwrap();
        let o = osd(1);
        let held = o.ticket(&EntityName::admin(), &key);
        let (_, hello) = Connector::start(EntityName::admin(), &held, AuthMode::Sign, [1; 32]);
        for cut in 0..hello.len() {
            let mut a = Acceptor::new(AuthMode::Sign, [2; 32]);
            assert!(a.on_hello(&hello[..cut], &o.me()).is_err());
        }
        for (at, value) in [(1, 0), (1, 1), (3, 1), (0, 9)] {
            let mut bad = hello.clone();
            bad[at] = value;
            assert!(
                Acceptor::new(AuthMode::Sign, [2; 32])
                    .on_hello(&bad, &o.me())
                    .is_err(),
                "byte {at} = {value}"
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_as_a_hello_are_an_error_not_a_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..400)) {
            let key = Secret::from_bytes([5; 32]);
            let me = AcceptorIdentity { service_key: &key, osd: OsdId(1), now_unix_s: NOW };
            let mut a = Acceptor::new(AuthMode::Sign, [2; 32]);
            let _ = a.on_hello(&bytes, &me);
            let _ = Acceptor::new(AuthMode::Sign, [2; 32]).on_proof(&bytes);
        }
    }
}

//! The data-plane handshake: how a client or OSD proves its key to an OSD (and the OSD proves
//! it knows that key too) before any other frame, in cephx's shape: no key on the wire, no
//! replay.
//!
//! ```text
//! connector                                   acceptor (an OSD)
//!   Hello { mode, entity, client_nonce }  -->
//!                                         <--  Challenge { server_nonce }
//!   Proof { HMAC_dk(client, ..) }         -->   checks it with the entity's data key dk
//!                                         <--  Done { HMAC_dk(server, ..) }
//! ```
//!
//! `dk` is the entity's data key (derived from its key; OSDs get data keys from the monitor's
//! key table, never entity keys). Both proofs cover the entity, the mode and both nonces, so
//! a recorded proof is worthless on any other connection (each side draws a fresh nonce) and
//! a downgrade of the mode is detected. The connection's frame keys, one per direction, are
//! derived from `dk` and both nonces. Payload layouts are in `docs/wire-protocol.md`.
//!
//! Both ends are pure: the caller draws the nonces and carries the payloads.

use crate::entity::EntityName;
use crate::error::AuthError;
use crate::secret::Secret;
use fastblock_types::auth::AuthMode;

pub const NONCE_BYTES: usize = 32;
pub const PROOF_BYTES: usize = 32;
/// Fixed part of a Hello: mode (1), reserved (5), entity length (2), nonce (32).
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
    dk: &Secret,
    who: &[u8],
    entity: &EntityName,
    mode: AuthMode,
    cn: &[u8],
    sn: &[u8],
) -> [u8; 32] {
    dk.mac(&[
        b"fastblock-v1 handshake",
        who,
        entity.to_string().as_bytes(),
        &[mode.wire_byte()],
        cn,
        sn,
    ])
}

fn session(dk: &Secret, entity: EntityName, mode: AuthMode, cn: &[u8], sn: &[u8]) -> Session {
    let base = Secret::from_bytes(dk.mac(&[
        b"fastblock-v1 session",
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

/// The connecting end.
pub struct Connector {
    entity: EntityName,
    dk: Secret,
    mode: AuthMode,
    client_nonce: [u8; NONCE_BYTES],
    server_nonce: Option<[u8; NONCE_BYTES]>,
}

impl Connector {
    /// Starts a handshake as `entity` holding `key` (its entity key); returns the Hello payload.
    pub fn start(
        entity: EntityName,
        key: &Secret,
        mode: AuthMode,
        client_nonce: [u8; NONCE_BYTES],
    ) -> (Connector, Vec<u8>) {
        assert!(mode.authenticates(), "no handshake in mode none");
        let name = entity.to_string();
        let mut hello = Vec::with_capacity(HELLO_FIXED_BYTES + name.len());
        hello.push(mode.wire_byte());
        hello.extend_from_slice(&[0; 5]);
        hello.extend_from_slice(&(name.len() as u16).to_le_bytes());
        hello.extend_from_slice(&client_nonce);
        hello.extend_from_slice(name.as_bytes());
        let c = Connector {
            entity,
            dk: key.data_key(),
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
            &self.dk,
            b"connector",
            &self.entity,
            self.mode,
            &self.client_nonce,
            &sn,
        )
        .to_vec())
    }

    /// Checks the acceptor's Done: it must know the same data key.
    pub fn on_done(self, payload: &[u8]) -> Result<Session, AuthError> {
        let sn = self
            .server_nonce
            .ok_or_else(|| AuthError::Malformed("done before challenge".into()))?;
        let got: [u8; PROOF_BYTES] = fixed(payload, "done")?;
        let want = proof(
            &self.dk,
            b"acceptor",
            &self.entity,
            self.mode,
            &self.client_nonce,
            &sn,
        );
        if !crate::secret::ct_eq(&want, &got) {
            return Err(AuthError::BadSignature(format!(
                "the OSD's proof for {} (it does not hold this key: not a member of this cluster, or the key was rotated)",
                self.entity
            )));
        }
        Ok(session(
            &self.dk,
            self.entity,
            self.mode,
            &self.client_nonce,
            &sn,
        ))
    }
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

    /// Reads the Hello; `data_key_of` looks the entity up in the key table. Returns the entity
    /// (for the caller's caps lookup) and the Challenge payload.
    pub fn on_hello(
        &mut self,
        payload: &[u8],
        data_key_of: impl Fn(&EntityName) -> Option<Secret>,
    ) -> Result<(EntityName, Vec<u8>), AuthError> {
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
        if payload[1..6] != [0; 5] {
            return Err(AuthError::Malformed(
                "reserved hello bytes are not zero".into(),
            ));
        }
        let name_len = u16::from_le_bytes([payload[6], payload[7]]) as usize;
        if name_len > ENTITY_BYTES_MAX || payload.len() != HELLO_FIXED_BYTES + name_len {
            return Err(AuthError::Malformed(format!(
                "hello entity length {name_len} does not match its {} bytes",
                payload.len()
            )));
        }
        let cn: [u8; NONCE_BYTES] = payload[8..40].try_into().expect("32 bytes");
        let name = std::str::from_utf8(&payload[40..])
            .map_err(|_| AuthError::Malformed("entity name is not UTF-8".into()))?;
        let entity: EntityName = name.parse()?;
        if mode != self.mode {
            return Err(AuthError::ModeMismatch {
                ours: self.mode.to_string(),
                peer: mode.to_string(),
            });
        }
        let dk =
            data_key_of(&entity).ok_or_else(|| AuthError::UnknownEntity(entity.to_string()))?;
        self.peer = Some((entity.clone(), dk, cn));
        Ok((entity, self.server_nonce.to_vec()))
    }

    /// Checks the Proof; on success returns the Done payload and the session.
    pub fn on_proof(self, payload: &[u8]) -> Result<(Vec<u8>, Session), AuthError> {
        let (entity, dk, cn) = self
            .peer
            .ok_or_else(|| AuthError::Malformed("proof before hello".into()))?;
        let got: [u8; PROOF_BYTES] = fixed(payload, "proof")?;
        let want = proof(
            &dk,
            b"connector",
            &entity,
            self.mode,
            &cn,
            &self.server_nonce,
        );
        if !crate::secret::ct_eq(&want, &got) {
            return Err(AuthError::BadSignature(entity.to_string()));
        }
        let done = proof(
            &dk,
            b"acceptor",
            &entity,
            self.mode,
            &cn,
            &self.server_nonce,
        )
        .to_vec();
        Ok((
            done,
            session(&dk, entity, self.mode, &cn, &self.server_nonce),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(key: &Secret) -> impl Fn(&EntityName) -> Option<Secret> + '_ {
        move |e: &EntityName| (e == &EntityName::admin()).then(|| key.data_key())
    }

    #[test]
    fn a_handshake_agrees_on_the_session_keys() {
        let key = Secret::generate().unwrap();
        let (mut c, hello) = Connector::start(EntityName::admin(), &key, AuthMode::Secure, [1; 32]);
        let mut a = Acceptor::new(AuthMode::Secure, [2; 32]);
        let (who, challenge) = a.on_hello(&hello, table(&key)).unwrap();
        assert_eq!(who, EntityName::admin());
        let p = c.on_challenge(&challenge).unwrap();
        let (done, sa) = a.on_proof(&p).unwrap();
        let sc = c.on_done(&done).unwrap();
        assert_eq!(sa.to_acceptor, sc.to_acceptor);
        assert_eq!(sa.to_connector, sc.to_connector);
        assert_ne!(sa.to_acceptor, sa.to_connector);
        assert_eq!(sa.entity, EntityName::admin());
    }

    #[test]
    fn a_wrong_key_a_replayed_proof_and_a_wrong_mode_are_refused() {
        let key = Secret::generate().unwrap();
        // Wrong key.
        let wrong = Secret::generate().unwrap();
        let (mut c, hello) = Connector::start(EntityName::admin(), &wrong, AuthMode::Sign, [1; 32]);
        let mut a = Acceptor::new(AuthMode::Sign, [2; 32]);
        let (_, ch) = a.on_hello(&hello, table(&key)).unwrap();
        let p = c.on_challenge(&ch).unwrap();
        assert!(matches!(a.on_proof(&p), Err(AuthError::BadSignature(_))));

        // A proof recorded on one connection, replayed on another (fresh server nonce).
        let (mut c, hello) = Connector::start(EntityName::admin(), &key, AuthMode::Sign, [1; 32]);
        let mut a1 = Acceptor::new(AuthMode::Sign, [2; 32]);
        let (_, ch) = a1.on_hello(&hello, table(&key)).unwrap();
        let recorded = c.on_challenge(&ch).unwrap();
        let mut a2 = Acceptor::new(AuthMode::Sign, [3; 32]);
        a2.on_hello(&hello, table(&key)).unwrap();
        assert!(matches!(
            a2.on_proof(&recorded),
            Err(AuthError::BadSignature(_))
        ));

        // Mode mismatch and unknown entity.
        let (_, hello) = Connector::start(EntityName::admin(), &key, AuthMode::Sign, [1; 32]);
        let mut a = Acceptor::new(AuthMode::Secure, [2; 32]);
        assert!(matches!(
            a.on_hello(&hello, table(&key)),
            Err(AuthError::ModeMismatch { .. })
        ));
        let (_, hello) =
            Connector::start("client.x".parse().unwrap(), &key, AuthMode::Sign, [1; 32]);
        let mut a = Acceptor::new(AuthMode::Sign, [2; 32]);
        assert!(matches!(
            a.on_hello(&hello, table(&key)),
            Err(AuthError::UnknownEntity(_))
        ));
    }

    #[test]
    fn a_connector_refuses_an_acceptor_that_does_not_hold_its_key() {
        let key = Secret::generate().unwrap();
        let (mut c, hello) = Connector::start(EntityName::admin(), &key, AuthMode::Sign, [1; 32]);
        // An impostor acceptor that accepts anything and answers with a made-up proof.
        let impostor_key = Secret::generate().unwrap();
        let mut a = Acceptor::new(AuthMode::Sign, [2; 32]);
        let (_, ch) = a
            .on_hello(&hello, |_| Some(impostor_key.data_key()))
            .unwrap();
        c.on_challenge(&ch).unwrap();
        assert!(matches!(
            c.on_done(&[0; 32]),
            Err(AuthError::BadSignature(_))
        ));
    }

    #[test]
    fn malformed_hellos_are_refused_not_panicked_on() {
        let key = Secret::generate().unwrap();
        let (_, hello) = Connector::start(EntityName::admin(), &key, AuthMode::Sign, [1; 32]);
        for cut in 0..hello.len() {
            let mut a = Acceptor::new(AuthMode::Sign, [2; 32]);
            assert!(a.on_hello(&hello[..cut], table(&key)).is_err());
        }
        let mut bad = hello.clone();
        bad[3] = 1;
        assert!(Acceptor::new(AuthMode::Sign, [2; 32])
            .on_hello(&bad, table(&key))
            .is_err());
        let mut bad = hello.clone();
        bad[0] = 9;
        assert!(Acceptor::new(AuthMode::Sign, [2; 32])
            .on_hello(&bad, table(&key))
            .is_err());
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_as_a_hello_are_an_error_or_a_valid_entity(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
            let key = Secret::from_bytes([5; 32]);
            let mut a = Acceptor::new(AuthMode::Sign, [2; 32]);
            let _ = a.on_hello(&bytes, |_| Some(key.data_key()));
            let _ = Acceptor::new(AuthMode::Sign, [2; 32]).on_proof(&bytes);
        }
    }
}

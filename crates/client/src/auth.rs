//! The connecting end of the data-plane handshake (`docs/wire-protocol.md`, section 10), over
//! any byte stream: the client library's connections and the OSDs' peer links both use it.
//! The decisions (proofs, session keys) are `fastblock_auth::handshake`'s; this is its I/O.

use bytes::BytesMut;
use fastblock_auth::frame::{FrameOpener, FrameSealer};
use fastblock_auth::handshake::{Connector, HeldTicket, NONCE_BYTES};
use fastblock_auth::{AuthError, AuthMode, EntityName, Keyring, Secret};
use fastblock_wire::{encode_frame, Frame, FrameDecoder, Kind, Protection, Reply, Status};
use std::path::Path;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Who a client or an OSD is: its entity and its entity key (which signs its monitor calls and
/// opens the session keys of its tickets; it never crosses the network).
pub type Credentials = (EntityName, Secret);

/// Reads `entity`'s key from the keyring at `path` (`fastblock_auth::keyring::resolve_path`
/// gives the default location), or says which file lacks what.
pub fn load_credentials(path: &Path, entity: &EntityName) -> Result<Credentials, AuthError> {
    let ring = Keyring::load(path)?;
    let key = ring.key_for(path, entity)?.clone();
    Ok((entity.clone(), key))
}

/// Why a handshake did not give a session.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The OSD answered with an error (`AuthFailed`, `AuthRequired`, ...; `StaleTicket` for a
    /// ticket issued before a rotation it knows of). Final unless the status is retryable.
    #[error("{peer} refused the handshake: {status:?}: {message}")]
    Refused {
        peer: String,
        status: Status,
        message: String,
    },
    /// The OSD's answer is wrong: it could not open our ticket (an impostor, or another
    /// cluster), or it broke the protocol. Final.
    #[error("{peer}: {error}")]
    Auth { peer: String, error: AuthError },
    /// The connection broke or went silent: retryable.
    #[error("handshake with {peer}: {why}")]
    Io { peer: String, why: String },
}

impl HandshakeError {
    /// Whether the ticket presented is spent: the OSD refused the handshake or could not
    /// open the ticket (issued before a rotation of either key or a change of caps, or
    /// expired), so the next connection asks the monitor for a new one. A broken connection
    /// says nothing of the ticket.
    pub fn spends_ticket(&self) -> bool {
        !matches!(self, HandshakeError::Io { .. })
    }

    /// Whether a new connection may succeed (the OSD or the network may heal).
    pub fn is_retryable(&self) -> bool {
        match self {
            HandshakeError::Refused { status, .. } => status.is_retryable(),
            HandshakeError::Auth { .. } => false,
            HandshakeError::Io { .. } => true,
        }
    }
}

/// Frame protection for both directions of a connection the handshake opened.
pub struct Protected {
    pub sealer: FrameSealer,
    pub opener: FrameOpener,
}

/// Reads one unprotected frame, keeping what follows in `buf`.
async fn read_frame<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
    peer: &str,
) -> Result<Frame, HandshakeError> {
    let io = |why: String| HandshakeError::Io {
        peer: peer.to_string(),
        why,
    };
    let mut decoder = FrameDecoder::default();
    loop {
        match decoder.decode(buf) {
            Ok(Some(frame)) => return Ok(frame),
            Ok(None) => {}
            Err(e) => return Err(io(format!("bad frame: {e}"))),
        }
        match stream.read_buf(buf).await {
            Ok(0) => return Err(io("closed the connection".into())),
            Ok(_) => {}
            Err(e) => return Err(io(format!("read: {e}"))),
        }
    }
}

/// A frame the OSD sent instead of the next handshake step: its error reply, or a
/// protocol error.
fn unexpected(frame: &Frame, wanted: Kind, peer: &str) -> HandshakeError {
    if frame.kind == Kind::Reply && frame.protection == Protection::None {
        if let Ok(Reply::Error {
            status, message, ..
        }) = Reply::decode(frame)
        {
            return HandshakeError::Refused {
                peer: peer.to_string(),
                status,
                message,
            };
        }
    }
    HandshakeError::Auth {
        peer: peer.to_string(),
        error: AuthError::Malformed(format!(
            "{:?} frame where {wanted:?} was expected",
            frame.kind
        )),
    }
}

/// Runs the handshake as `entity` with `ticket` (its ticket for this OSD) in `mode` on a fresh
/// connection to `peer` and checks the OSD's proof. The caller bounds it with a timeout. Bytes
/// read past `AuthDone` stay in `buf` (an OSD sends none before the first request).
pub async fn connect<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
    entity: &EntityName,
    ticket: &HeldTicket,
    mode: AuthMode,
    peer: &str,
) -> Result<Protected, HandshakeError> {
    let auth = |error: AuthError| HandshakeError::Auth {
        peer: peer.to_string(),
        error,
    };
    let io = |e: std::io::Error| HandshakeError::Io {
        peer: peer.to_string(),
        why: format!("write: {e}"),
    };
    let nonce = fastblock_auth::random_bytes::<NONCE_BYTES>().map_err(auth)?;
    let (mut connector, hello) = Connector::start(entity.clone(), ticket, mode, nonce);
    let mut out = BytesMut::new();
    encode_frame(Kind::AuthHello, 1, &[&hello], &mut out);
    stream.write_all(&out).await.map_err(io)?;

    let challenge = read_frame(stream, buf, peer).await?;
    if challenge.kind != Kind::AuthChallenge || challenge.protection != Protection::None {
        return Err(unexpected(&challenge, Kind::AuthChallenge, peer));
    }
    let proof = connector.on_challenge(&challenge.payload).map_err(auth)?;
    out.clear();
    encode_frame(Kind::AuthProof, 2, &[&proof], &mut out);
    stream.write_all(&out).await.map_err(io)?;

    let done = read_frame(stream, buf, peer).await?;
    if done.kind != Kind::AuthDone || done.protection != Protection::None {
        return Err(unexpected(&done, Kind::AuthDone, peer));
    }
    let session = connector.on_done(&done.payload).map_err(auth)?;
    Ok(Protected {
        sealer: FrameSealer::new(mode, &session.to_acceptor),
        opener: FrameOpener::new(mode, &session.to_connector),
    })
}

/// Protects the frame just encoded at `out[start..]` with `sealer` (flag, tag, crcs; the
/// payload encrypted in place in `secure`).
pub fn seal_frame(out: &mut BytesMut, start: usize, sealer: &mut FrameSealer) {
    let encrypts = sealer.encrypts();
    fastblock_wire::protect_frame(out, start, encrypts, |header, payload| {
        sealer.seal(header, payload)
    });
}

/// Checks (and in `secure` decrypts in place) one received frame with `opener`: it must
/// carry the connection's flag and a tag that verifies. An error is final for the
/// connection.
pub fn open_frame(
    frame: fastblock_wire::FrameMut,
    opener: &mut FrameOpener,
) -> Result<Frame, AuthError> {
    let mut frame = frame;
    let tag = match (frame.protection, opener.decrypts()) {
        (Protection::Signed(tag), false) | (Protection::Sealed(tag), true) => tag,
        _ => {
            return Err(AuthError::Malformed(format!(
                "a {:?} frame without this connection's protection",
                frame.kind
            )))
        }
    };
    let header = frame.tag_header();
    opener.open(&header, &mut frame.payload, &tag)?;
    Ok(frame.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;
    use fastblock_wire::{ObjectAddr, Request};

    /// Not asserted: prints what protecting and checking one 4 KiB write frame costs
    /// (`cargo test -p fastblock-client --release sealing_cost -- --nocapture`). A frame that
    /// opens proves the in-place seal/open round trip.
    #[test]
    fn sealing_cost_per_4k_frame() {
        let key = Secret::from_bytes([3; 32]);
        let write = Request::Write {
            addr: ObjectAddr {
                pg: fastblock_types::PgId::new(fastblock_types::PoolId(1), 0),
                image: fastblock_types::ImageId(1),
                object_index: 0,
            },
            offset: 0,
            epoch: fastblock_types::Epoch(1),
            term: 0,
            data: bytes::Bytes::from(vec![0x5a; 4096]),
        };
        let frames = 20_000u32;
        for mode in [AuthMode::Sign, AuthMode::Secure] {
            let mut sealer = FrameSealer::new(mode, &key);
            let mut opener = FrameOpener::new(mode, &key);
            let mut decoder = FrameDecoder::default();
            let started = std::time::Instant::now();
            for _ in 0..frames {
                let mut out = BytesMut::with_capacity(write.frame_len() + 16);
                write.encode(1, &mut out);
                seal_frame(&mut out, 0, &mut sealer);
                let frame = decoder.decode_mut(&mut out).unwrap().unwrap();
                let frame = open_frame(frame, &mut opener).unwrap();
                assert_eq!(frame.payload.len(), 48 + 4096);
            }
            let per = started.elapsed() / frames;
            println!("{mode}: seal + open of a 4 KiB write frame (with encode/decode): {per:?}");
        }
        let started = std::time::Instant::now();
        let mut decoder = FrameDecoder::default();
        for _ in 0..frames {
            let mut out = BytesMut::with_capacity(write.frame_len());
            write.encode(1, &mut out);
            decoder.decode(&mut out).unwrap().unwrap();
        }
        println!(
            "none: encode + decode only: {:?}",
            started.elapsed() / frames
        );
    }
}

//! Authentication of a shard's connections (`docs/wire-protocol.md`, section 10): the
//! acceptor's handshake on every accepted connection when the map's mode is `sign` or
//! `secure`, the checked reader that follows it, and the authorization of each request
//! against the peer's caps. Mode `none` does not come here (`net::reader_task`).
//!
//! Nothing reaches the shard core from a connection before its handshake succeeded, and
//! after it only frames whose tag verifies and whose request the peer's caps allow.

use super::net::{decode_request, InputQueue, SharedOutbox, FRAME_PAYLOAD_BYTES_MAX};
use super::Clock;
use crate::keys::SharedKeyTable;
use bytes::BytesMut;
use fastblock_auth::frame::{FrameOpener, FrameSealer};
use fastblock_auth::handshake::{Acceptor, AcceptorIdentity, NONCE_BYTES};
use fastblock_auth::table::TicketRefusal;
use fastblock_auth::{AuthError, AuthMode, Caps, EntityName};
use fastblock_shard::{ConnId, Input};
use fastblock_types::map::ClusterMap;
use fastblock_types::{OsdId, PgId};
use fastblock_wire::{encode_frame, Frame, FrameDecoder, Kind, Protection, Reply, Request, Status};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::tcp::OwnedReadHalf;
use tokio::sync::Notify;

/// Longest a connection may take to authenticate before it is closed.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a refused connection is drained (its bytes discarded) after the error reply, so
/// the reply is not lost to a reset.
const REFUSED_DRAIN: Duration = Duration::from_secs(1);

/// Who an authenticated peer is, as its ticket said at its handshake.
#[derive(Debug)]
pub struct PeerAuth {
    pub entity: EntityName,
    pub generation: u64,
    pub caps: Caps,
    /// The key table's epoch when the ticket was issued.
    pub ticket_epoch: u64,
}

impl PeerAuth {
    /// Whether the current table still lets this connection stay open: same entity, same
    /// generation, same caps (or a table older than the ticket, which knows nothing newer).
    pub fn still_valid(&self, table: &fastblock_auth::EntityTable) -> bool {
        table.still_valid(&self.entity, self.generation, &self.caps, self.ticket_epoch)
    }
}

/// What the shard's connections share for authentication.
pub struct AuthContext {
    /// The shard's newest map (pool names for caps; the auth epoch).
    pub map: RefCell<Arc<ClusterMap>>,
    pub keys: SharedKeyTable,
    /// This OSD's id and service key (derived from its own key; `None` without a keyring):
    /// the tickets peers present open with it, and with nothing else.
    pub me: OsdId,
    pub service_key: Option<fastblock_auth::Secret>,
}

/// A request the peer may not make.
#[derive(Debug, PartialEq, Eq)]
pub struct Refusal {
    pub status: Status,
    pub message: String,
    /// Close the connection after the reply (an OSD-to-OSD kind from a non-OSD: hostile).
    pub close: bool,
}

fn pool_check(peer: &PeerAuth, pg: PgId, map: &ClusterMap) -> Result<(), Refusal> {
    let caps = &peer.caps;
    if caps.admin || caps.osd || caps.pools == fastblock_auth::caps::PoolScope::All {
        return Ok(());
    }
    match map.pools.get(&pg.pool) {
        Some(pool) if caps.allows_pool(&pool.name) => Ok(()),
        Some(pool) => Err(Refusal {
            status: Status::PermissionDenied,
            message: format!(
                "permission denied: {} (caps {:?}) may not use pool {}",
                peer.entity,
                caps.to_string(),
                pool.name
            ),
            close: false,
        }),
        // The client's map is newer than ours: retryable.
        None => Err(Refusal {
            status: Status::StaleEpoch,
            message: format!(
                "pool {} is not in this OSD's map (epoch {})",
                pg.pool, map.epoch
            ),
            close: false,
        }),
    }
}

fn peer_check(peer: &PeerAuth, from: OsdId, kind: Kind) -> Result<(), Refusal> {
    if !peer.caps.is_peer() || peer.entity.osd() != Some(from) {
        return Err(Refusal {
            status: Status::PermissionDenied,
            message: format!(
                "permission denied: {kind:?} as osd.{} from {} (OSD-to-OSD messages need the osd cap and the sender's own id)",
                from.0, peer.entity
            ),
            close: true,
        });
    }
    Ok(())
}

/// Whether `peer` may make `req`, given the shard's map.
pub fn authorize(peer: &PeerAuth, req: &Request, map: &ClusterMap) -> Result<(), Refusal> {
    match req {
        Request::Write { addr, .. }
        | Request::Read { addr, .. }
        | Request::Discard { addr, .. }
        | Request::WriteZeroes { addr, .. }
        | Request::Allocation { addr, .. }
        | Request::SnapRead { addr, .. }
        | Request::Rollback { addr, .. }
        | Request::CloneRead { addr, .. }
        | Request::CopyUp { addr, .. }
        | Request::CopyUpDone { addr, .. }
        | Request::ReplicaRead { addr, .. } => pool_check(peer, addr.pg, map),
        Request::GetLeader { pg, .. }
        | Request::ReplicaDigest { pg }
        | Request::Usage { pg, .. } => pool_check(peer, *pg, map),
        Request::ShardSpace => Ok(()),
        Request::Hello { osd, .. } => peer_check(peer, *osd, Kind::Hello),
        Request::RaftBatch { from, .. } => peer_check(peer, *from, Kind::RaftBatch),
        Request::SnapChunk(c) => peer_check(peer, c.from, Kind::SnapChunk),
        Request::SnapAck { from, .. } => peer_check(peer, *from, Kind::SnapAck),
        Request::Repair(m) => peer_check(peer, m.from, Kind::Repair),
        Request::Scrub(m) => peer_check(peer, m.from, Kind::Scrub),
    }
}

/// Reads one frame (the handshake's: no tag expected) or says why not.
async fn read_frame(
    stream: &mut OwnedReadHalf,
    buf: &mut BytesMut,
    decoder: &mut FrameDecoder,
) -> Result<Frame, String> {
    loop {
        match decoder.decode(buf) {
            Ok(Some(frame)) => return Ok(frame),
            Ok(None) => {}
            Err(e) => return Err(format!("framing error: {e}")),
        }
        match stream.read_buf(buf).await {
            Ok(0) => return Err("closed by peer".into()),
            Ok(_) => {}
            Err(e) => return Err(format!("read error: {e}")),
        }
    }
}

fn send(outbox: &SharedOutbox, encode: impl FnOnce(&mut BytesMut)) {
    let mut o = outbox.borrow_mut();
    o.push_frame(encode);
    o.flush_now();
}

fn send_error(outbox: &SharedOutbox, request_id: u64, status: Status, message: &str) {
    send(outbox, |b| {
        Reply::error(status, None, message).encode(request_id, b)
    });
}

/// The acceptor's handshake: the Hello's ticket must open with this OSD's service key, be
/// for this OSD, unexpired, and not older than a rotation, change of caps or removal the
/// entity table knows of. Err: why it failed, after the error reply was sent.
async fn handshake(
    stream: &mut OwnedReadHalf,
    buf: &mut BytesMut,
    outbox: &SharedOutbox,
    ctx: &AuthContext,
    mode: AuthMode,
) -> Result<(PeerAuth, FrameOpener, FrameSealer), String> {
    let mut decoder = FrameDecoder::new(FRAME_PAYLOAD_BYTES_MAX);
    let hello = read_frame(stream, buf, &mut decoder).await?;
    if hello.kind != Kind::AuthHello || hello.protection != Protection::None {
        let why = format!(
            "authentication required (auth mode {mode}): the first frame must be AuthHello, not {:?}",
            hello.kind
        );
        send_error(outbox, hello.request_id, Status::AuthRequired, &why);
        return Err(why);
    }
    let failed = |status: Status, why: String| {
        send_error(outbox, hello.request_id, status, &why);
        why
    };
    let Some(service_key) = &ctx.service_key else {
        return Err(failed(
            Status::AuthFailed,
            format!("auth mode {mode} and this OSD has no key (its keyring) to open tickets with"),
        ));
    };
    let nonce = fastblock_auth::random_bytes::<NONCE_BYTES>()
        .map_err(|e| failed(Status::Internal, e.to_string()))?;
    let table = crate::keys::current(&ctx.keys);
    let mut acceptor = Acceptor::new(mode, nonce);
    let me = AcceptorIdentity {
        service_key,
        osd: ctx.me,
        now_unix_s: fastblock_monclient::now_unix_s(),
    };
    let (claims, challenge) = match acceptor.on_hello(&hello.payload, &me) {
        Ok(ok) => ok,
        // Expired: the holder asks for a new ticket.
        Err(e @ AuthError::TicketExpired { .. }) => {
            return Err(failed(Status::StaleTicket, e.to_string()))
        }
        Err(e) => return Err(failed(Status::AuthFailed, e.to_string())),
    };
    match table.judge(&claims) {
        Ok(()) => {}
        Err(TicketRefusal::Stale(why)) => return Err(failed(Status::StaleTicket, why)),
        Err(TicketRefusal::Revoked(why)) => return Err(failed(Status::AuthFailed, why)),
    }
    let caps: Caps = claims
        .caps
        .parse()
        .map_err(|e: AuthError| failed(Status::AuthFailed, format!("ticket caps: {e}")))?;
    send(outbox, |b| {
        encode_frame(Kind::AuthChallenge, hello.request_id, &[&challenge], b)
    });
    let proof = read_frame(stream, buf, &mut decoder).await?;
    if proof.kind != Kind::AuthProof || proof.protection != Protection::None {
        return Err(failed(
            Status::AuthFailed,
            format!("{:?} frame where AuthProof was expected", proof.kind),
        ));
    }
    let (done, session) = acceptor
        .on_proof(&proof.payload)
        .map_err(|e| failed(Status::AuthFailed, e.to_string()))?;
    send(outbox, |b| {
        encode_frame(Kind::AuthDone, proof.request_id, &[&done], b)
    });
    Ok((
        PeerAuth {
            entity: claims.entity,
            generation: claims.generation,
            caps,
            ticket_epoch: claims.auth_epoch,
        },
        FrameOpener::new(mode, &session.to_acceptor),
        FrameSealer::new(mode, &session.to_connector),
    ))
}

/// Serves an accepted connection in mode sign/secure: the handshake (bounded), then the
/// checked reader. Reports `Closed` to the core when it ends.
#[allow(clippy::too_many_arguments)]
pub async fn serve_accepted(
    conn: ConnId,
    mut stream: OwnedReadHalf,
    outbox: SharedOutbox,
    inputs: InputQueue,
    wake_loop: Arc<Notify>,
    clock: Clock,
    ctx: Rc<AuthContext>,
    mode: AuthMode,
) {
    let mut buf = BytesMut::with_capacity(64 << 10);
    let shaken = tokio::time::timeout(
        HANDSHAKE_TIMEOUT,
        handshake(&mut stream, &mut buf, &outbox, &ctx, mode),
    )
    .await;
    let reason = match shaken {
        Ok(Ok((peer, opener, sealer))) => {
            tracing::debug!(conn, entity = %peer.entity, "authenticated");
            let peer = Rc::new(peer);
            {
                let mut o = outbox.borrow_mut();
                o.sealer = Some(sealer);
                o.peer = Some(peer.clone());
            }
            read_checked(
                conn,
                &mut stream,
                buf,
                opener,
                &outbox,
                Some((peer, ctx)),
                &inputs,
                &wake_loop,
                clock,
            )
            .await
        }
        Ok(Err(why)) => {
            tracing::warn!(conn, "handshake refused: {why}");
            drain(&mut stream, &outbox).await;
            format!("handshake refused: {why}")
        }
        Err(_) => {
            tracing::warn!(conn, "no handshake within {HANDSHAKE_TIMEOUT:?}: closing");
            format!("no handshake within {HANDSHAKE_TIMEOUT:?}")
        }
    };
    tracing::debug!(conn, "connection closed: {reason}");
    // Closed at once from this side, whatever the runtime does with the outbox.
    outbox.borrow().shutdown_socket(libc::SHUT_RDWR);
    inputs.borrow_mut().push_back(Input::Closed { conn });
    wake_loop.notify_one();
}

/// After a refusal: let the reply leave, then discard what the peer still sends (bounded).
async fn drain(stream: &mut OwnedReadHalf, outbox: &SharedOutbox) {
    outbox.borrow().shutdown_socket(libc::SHUT_WR);
    let mut scratch = vec![0u8; 16 << 10];
    let _ = tokio::time::timeout(REFUSED_DRAIN, async {
        while let Ok(n) = stream.read(&mut scratch).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
}

/// Reads protected frames until the connection ends or breaks the rules; returns why it
/// ended. `authz`: the peer and context to authorize requests against (accepted
/// connections); None on a peer link this OSD opened (the other end is the acceptor).
#[allow(clippy::too_many_arguments)]
pub async fn read_checked(
    conn: ConnId,
    stream: &mut OwnedReadHalf,
    mut buf: BytesMut,
    mut opener: FrameOpener,
    outbox: &SharedOutbox,
    authz: Option<(Rc<PeerAuth>, Rc<AuthContext>)>,
    inputs: &InputQueue,
    wake_loop: &Arc<Notify>,
    clock: Clock,
) -> String {
    let mut decoder = FrameDecoder::new(FRAME_PAYLOAD_BYTES_MAX);
    loop {
        let arrived = clock.now();
        let mut pushed = false;
        loop {
            let frame = match decoder.decode_mut(&mut buf) {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(e) => return format!("framing error: {e}"),
            };
            let frame = match fastblock_client::auth::open_frame(frame, &mut opener) {
                Ok(frame) => frame,
                Err(e) => {
                    let who = authz.as_ref().map(|(p, _)| p.entity.to_string());
                    tracing::warn!(conn, peer = ?who, "closing the connection: {e}");
                    if pushed {
                        wake_loop.notify_one();
                    }
                    return e.to_string();
                }
            };
            let input = decode_request(conn, &frame, arrived);
            if let (Some((peer, ctx)), Input::Request { req, .. }) = (&authz, &input) {
                let map = ctx.map.borrow().clone();
                if let Err(refusal) = authorize(peer, req, &map) {
                    send_error(outbox, frame.request_id, refusal.status, &refusal.message);
                    if refusal.close {
                        tracing::warn!(conn, entity = %peer.entity, "{}", refusal.message);
                        if pushed {
                            wake_loop.notify_one();
                        }
                        return refusal.message;
                    }
                    continue;
                }
            }
            inputs.borrow_mut().push_back(input);
            pushed = true;
        }
        if pushed {
            wake_loop.notify_one();
        }
        if buf.capacity() - buf.len() < 64 << 10 {
            buf.reserve(256 << 10);
        }
        match stream.read_buf(&mut buf).await {
            Ok(0) => return "closed by peer".into(),
            Ok(_) => {}
            Err(e) => return format!("read error: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fastblock_types::{Epoch, ImageId, PoolId};
    use fastblock_wire::ObjectAddr;

    fn map_with_pools() -> ClusterMap {
        let mut map = ClusterMap::default();
        for (id, name) in [(1, "a"), (2, "b")] {
            map.pools.insert(
                PoolId(id),
                fastblock_types::map::PoolInfo {
                    id: PoolId(id),
                    name: name.into(),
                    pg_count: 1,
                    size: 1,
                    failure_domain: fastblock_types::map::FailureDomain::Osd,
                    created_epoch: Epoch(1),
                },
            );
        }
        map
    }

    fn peer(entity: &str, caps: &str) -> PeerAuth {
        PeerAuth {
            entity: entity.parse().unwrap(),
            generation: 1,
            caps: caps.parse().unwrap(),
            ticket_epoch: 1,
        }
    }

    fn read(pool: u32) -> Request {
        Request::Read {
            addr: ObjectAddr {
                pg: PgId::new(PoolId(pool), 0),
                image: ImageId(1),
                object_index: 0,
            },
            offset: 0,
            length: 4096,
            epoch: Epoch(1),
        }
    }

    #[test]
    fn pools_and_peer_kinds_are_authorized_by_caps() {
        let map = map_with_pools();
        let a = peer("client.a", "pool=a");
        assert_eq!(authorize(&a, &read(1), &map), Ok(()));
        let refused = authorize(&a, &read(2), &map).unwrap_err();
        assert_eq!(refused.status, Status::PermissionDenied);
        assert!(refused.message.contains("pool b"), "{}", refused.message);
        assert_eq!(
            authorize(&a, &read(9), &map).unwrap_err().status,
            Status::StaleEpoch
        );
        assert_eq!(
            authorize(&peer("client.admin", "admin"), &read(2), &map),
            Ok(())
        );
        assert_eq!(
            authorize(&peer("client.x", "pool=*"), &read(9), &map),
            Ok(())
        );

        let hello = Request::Hello {
            osd: OsdId(3),
            boot_epoch: Epoch(1),
        };
        let batch = Request::RaftBatch {
            from: OsdId(3),
            to: OsdId(1),
            msgs: vec![],
        };
        assert_eq!(authorize(&peer("osd.3", "osd"), &hello, &map), Ok(()));
        assert_eq!(authorize(&peer("osd.3", "osd"), &batch, &map), Ok(()));
        // Another OSD's name, or no osd cap: refused and closed.
        for (who, caps) in [("osd.4", "osd"), ("client.admin", "admin"), ("osd.3", "")] {
            for req in [&hello, &batch] {
                let r = authorize(&peer(who, caps), req, &map).unwrap_err();
                assert!(r.close && r.status == Status::PermissionDenied, "{who}");
            }
        }
    }

    // The real acceptor (`serve_accepted`, as the runtime spawns it) against the real
    // connector (`fastblock_client::auth::connect`) over TCP.
    mod tcp {
        use super::*;
        use crate::shard::net::{writer_task, Outbox};
        use fastblock_auth::handshake::ticket_for_test;
        use fastblock_auth::table::TableEntry;
        use fastblock_auth::{EntityTable, Secret};
        use fastblock_client::auth::{connect, open_frame, seal_frame, HandshakeError, Protected};
        use std::collections::VecDeque;
        use tokio::io::AsyncWriteExt;
        use tokio::net::{TcpListener, TcpStream};

        struct Osd {
            addr: std::net::SocketAddr,
            inputs: InputQueue,
            /// This OSD's own key (osd.1's): the tickets below are issued for it.
            key: Secret,
            table: EntityTable,
        }

        /// The entity table (no keys): who exists, with which caps.
        fn table(mode: AuthMode, keys: &[(&str, &Secret, &str)]) -> EntityTable {
            let mut t = EntityTable {
                epoch: 1,
                mode,
                ..EntityTable::default()
            };
            for (name, _key, caps) in keys {
                t.entries.insert(
                    name.parse().unwrap(),
                    TableEntry {
                        caps: caps.parse().unwrap(),
                        generation: 1,
                    },
                );
            }
            t
        }

        /// An acceptor like a shard's (osd.1's), serving every connection on a local port.
        async fn osd(mode: AuthMode, table: EntityTable) -> Osd {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let inputs: InputQueue = Rc::new(RefCell::new(VecDeque::new()));
            let mut map = map_with_pools();
            map.auth.mode = mode;
            map.auth.epoch = 1;
            let key = Secret::generate().unwrap();
            let ctx = Rc::new(AuthContext {
                map: RefCell::new(Arc::new(map)),
                keys: Arc::new(std::sync::RwLock::new(Arc::new(table.clone()))),
                me: OsdId(1),
                service_key: Some(key.service_key()),
            });
            let queue = inputs.clone();
            tokio::task::spawn_local(async move {
                let mut conn = 1;
                loop {
                    let (stream, _) = listener.accept().await.unwrap();
                    let (read, write) = stream.into_split();
                    let outbox = Outbox::new(Some(write), mode);
                    tokio::task::spawn_local(writer_task(outbox.clone()));
                    tokio::task::spawn_local(serve_accepted(
                        conn,
                        read,
                        outbox,
                        queue.clone(),
                        Arc::new(Notify::new()),
                        Clock::start(),
                        ctx.clone(),
                        mode,
                    ));
                    conn += 1;
                }
            });
            Osd {
                addr,
                inputs,
                key,
                table,
            }
        }

        /// Requests that reached the core, by kind.
        fn requests(osd: &Osd) -> Vec<Kind> {
            osd.inputs
                .borrow()
                .iter()
                .filter_map(|i| match i {
                    Input::Request { req, .. } => Some(req.kind()),
                    _ => None,
                })
                .collect()
        }

        async fn reply(
            stream: &mut TcpStream,
            buf: &mut BytesMut,
            p: Option<&mut Protected>,
        ) -> Option<Reply> {
            let mut decoder = FrameDecoder::default();
            let mut p = p;
            loop {
                if let Some(f) = decoder.decode_mut(buf).unwrap() {
                    let f = match p.as_mut() {
                        Some(p) => open_frame(f, &mut p.opener).unwrap(),
                        None => f.freeze(),
                    };
                    return Some(Reply::decode(&f).unwrap());
                }
                let n = tokio::time::timeout(Duration::from_secs(5), stream.read_buf(buf))
                    .await
                    .expect("an answer or a close within 5 s")
                    .unwrap_or(0);
                if n == 0 {
                    return None;
                }
            }
        }

        async fn send(stream: &mut TcpStream, req: &Request, id: u64, p: Option<&mut Protected>) {
            let mut out = BytesMut::new();
            req.encode(id, &mut out);
            if let Some(p) = p {
                seal_frame(&mut out, 0, &mut p.sealer);
            }
            stream.write_all(&out).await.unwrap();
        }

        /// A ticket for `who` (holding `key`) to this OSD, with the caps the table gives it
        /// (`admin` if it has none), issued under `osd_key`'s service key: the OSD's own
        /// for a genuine ticket, any other for a forged one.
        fn ticket(
            osd: &Osd,
            who: &str,
            key: &Secret,
            osd_key: &Secret,
        ) -> fastblock_auth::handshake::HeldTicket {
            let entity: EntityName = who.parse().unwrap();
            let caps = osd
                .table
                .entries
                .get(&entity)
                .map_or("admin".to_string(), |e| e.caps.to_string());
            ticket_for_test(&entity, key, &caps, OsdId(1), osd_key, u64::MAX / 2).unwrap()
        }

        async fn open_with(
            osd: &Osd,
            who: &str,
            ticket: &fastblock_auth::handshake::HeldTicket,
            mode: AuthMode,
        ) -> Result<(TcpStream, BytesMut, Protected), HandshakeError> {
            let mut stream = TcpStream::connect(osd.addr).await.unwrap();
            let mut buf = BytesMut::new();
            let entity: EntityName = who.parse().unwrap();
            let p = connect(&mut stream, &mut buf, &entity, ticket, mode, "osd").await?;
            Ok((stream, buf, p))
        }

        async fn open(
            osd: &Osd,
            who: &str,
            key: &Secret,
            mode: AuthMode,
        ) -> Result<(TcpStream, BytesMut, Protected), HandshakeError> {
            open_with(osd, who, &ticket(osd, who, key, &osd.key), mode).await
        }

        fn local<F: std::future::Future>(f: F) -> F::Output {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            tokio::task::LocalSet::new().block_on(&rt, f)
        }

        #[test]
        fn sign_and_secure_serve_allowed_pools_and_deny_others() {
            local(async {
                for mode in [AuthMode::Sign, AuthMode::Secure] {
                    let key = Secret::generate().unwrap();
                    let osd = osd(mode, table(mode, &[("client.a", &key, "pool=a")])).await;
                    let (mut s, mut buf, mut p) = open(&osd, "client.a", &key, mode).await.unwrap();
                    send(&mut s, &read(1), 1, Some(&mut p)).await;
                    send(&mut s, &read(2), 2, Some(&mut p)).await;
                    match reply(&mut s, &mut buf, Some(&mut p)).await {
                        Some(Reply::Error {
                            status: Status::PermissionDenied,
                            message,
                            ..
                        }) => {
                            assert!(message.contains("pool b"), "{message}")
                        }
                        other => panic!("{mode}: {other:?}"),
                    }
                    // Only the pool-a read reached the core.
                    assert_eq!(requests(&osd), vec![Kind::Read], "{mode}");
                }
            });
        }

        #[test]
        fn a_wrong_key_and_a_replayed_handshake_are_refused() {
            local(async {
                let key = Secret::generate().unwrap();
                let osd = osd(
                    AuthMode::Sign,
                    table(AuthMode::Sign, &[("client.a", &key, "pool=a")]),
                )
                .await;
                // A ticket forged without this OSD's key.
                let forged = ticket(&osd, "client.a", &key, &Secret::generate().unwrap());
                match open_with(&osd, "client.a", &forged, AuthMode::Sign).await {
                    Err(HandshakeError::Refused {
                        status: Status::AuthFailed,
                        message,
                        ..
                    }) => {
                        assert!(message.contains("does not open"), "{message}")
                    }
                    other => panic!("{:?}", other.map(|_| ())),
                }
                // A genuine ticket of an entity the table (at the ticket's epoch) does not hold:
                // removed.
                match open(&osd, "client.nobody", &key, AuthMode::Sign).await {
                    Err(HandshakeError::Refused {
                        status: Status::AuthFailed,
                        message,
                        ..
                    }) => {
                        assert!(message.contains("not in this OSD's key table"), "{message}")
                    }
                    other => panic!("{:?}", other.map(|_| ())),
                }
                match open(&osd, "client.a", &key, AuthMode::Secure).await {
                    Err(HandshakeError::Refused {
                        status: Status::AuthFailed,
                        ..
                    }) => {}
                    other => panic!("mode mismatch: {:?}", other.map(|_| ())),
                }

                // Record a genuine handshake's Hello and Proof, replay them on a new connection.
                let (mut c, hello) = fastblock_auth::handshake::Connector::start(
                    "client.a".parse().unwrap(),
                    &ticket(&osd, "client.a", &key, &osd.key),
                    AuthMode::Sign,
                    [7; 32],
                );
                let mut s = TcpStream::connect(osd.addr).await.unwrap();
                let mut out = BytesMut::new();
                encode_frame(Kind::AuthHello, 1, &[&hello], &mut out);
                s.write_all(&out).await.unwrap();
                let mut buf = BytesMut::new();
                let mut decoder = FrameDecoder::default();
                let challenge = loop {
                    if let Some(f) = decoder.decode(&mut buf).unwrap() {
                        break f;
                    }
                    s.read_buf(&mut buf).await.unwrap();
                };
                let proof = c.on_challenge(&challenge.payload).unwrap();
                let mut recorded = out.clone();
                encode_frame(Kind::AuthProof, 2, &[&proof], &mut recorded);
                let mut replay = TcpStream::connect(osd.addr).await.unwrap();
                replay.write_all(&recorded).await.unwrap();
                let mut buf = BytesMut::new();
                // The challenge (a new nonce), then the refusal.
                let mut frames = Vec::new();
                while frames.len() < 2 {
                    if let Some(f) = decoder.decode(&mut buf).unwrap() {
                        frames.push(f);
                        continue;
                    }
                    if replay.read_buf(&mut buf).await.unwrap() == 0 {
                        break;
                    }
                }
                assert_eq!(frames[0].kind, Kind::AuthChallenge);
                assert_ne!(frames[0].payload, challenge.payload);
                match Reply::decode(&frames[1]).unwrap() {
                    Reply::Error {
                        status: Status::AuthFailed,
                        ..
                    } => {}
                    other => panic!("{other:?}"),
                }
                assert!(requests(&osd).is_empty());
            });
        }

        #[test]
        fn a_flipped_payload_bit_closes_the_connection() {
            local(async {
                for mode in [AuthMode::Sign, AuthMode::Secure] {
                    let key = Secret::generate().unwrap();
                    let osd = osd(mode, table(mode, &[("client.admin", &key, "admin")])).await;
                    let (mut s, mut buf, mut p) =
                        open(&osd, "client.admin", &key, mode).await.unwrap();
                    let mut out = BytesMut::new();
                    read(1).encode(1, &mut out);
                    seal_frame(&mut out, 0, &mut p.sealer);
                    out[32 + 3] ^= 1;
                    // Fix the payload crc so that only the tag can tell.
                    let crc = crc32c_of(&out[32..out.len() - 16]);
                    out[20..24].copy_from_slice(&crc.to_le_bytes());
                    let hcrc = crc32c_of(&out[..28]);
                    out[28..32].copy_from_slice(&hcrc.to_le_bytes());
                    s.write_all(&out).await.unwrap();
                    assert!(
                        reply(&mut s, &mut buf, None).await.is_none(),
                        "{mode}: closed"
                    );
                    assert!(requests(&osd).is_empty(), "{mode}");
                }
            });
        }

        fn crc32c_of(b: &[u8]) -> u32 {
            let mut crc = !0u32;
            for &byte in b {
                crc ^= u32::from(byte);
                for _ in 0..8 {
                    crc = (crc >> 1) ^ (0x82F6_3B78 & (crc & 1).wrapping_neg());
                }
            }
            !crc
        }

        #[test]
        fn unauthenticated_and_client_peer_messages_never_reach_the_core() {
            local(async {
                let key = Secret::generate().unwrap();
                let osd_key = Secret::generate().unwrap();
                let osd = osd(
                    AuthMode::Sign,
                    table(
                        AuthMode::Sign,
                        &[("client.admin", &key, "admin"), ("osd.3", &osd_key, "osd")],
                    ),
                )
                .await;
                let batch = Request::RaftBatch {
                    from: OsdId(3),
                    to: OsdId(1),
                    msgs: vec![],
                };
                let chunk = Request::SnapChunk(fastblock_wire::SnapChunk {
                    from: OsdId(3),
                    to: OsdId(1),
                    pg: PgId::new(PoolId(1), 0),
                    transfer: 1,
                    index: 1,
                    term: 1,
                    seq: 0,
                    last: true,
                    image: ImageId(1),
                    object_index: 0,
                    offset: 0,
                    total_bytes: 0,
                    data: bytes::Bytes::new(),
                });
                for req in [&batch, &chunk] {
                    let mut s = TcpStream::connect(osd.addr).await.unwrap();
                    let mut buf = BytesMut::new();
                    send(&mut s, req, 9, None).await;
                    match reply(&mut s, &mut buf, None).await {
                        Some(Reply::Error {
                            status: Status::AuthRequired,
                            ..
                        }) => {}
                        other => panic!("{other:?}"),
                    }
                    assert!(reply(&mut s, &mut buf, None).await.is_none(), "then closed");
                }
                // An admin client is not an OSD.
                let (mut s, mut buf, mut p) = open(&osd, "client.admin", &key, AuthMode::Sign)
                    .await
                    .unwrap();
                send(&mut s, &batch, 1, Some(&mut p)).await;
                match reply(&mut s, &mut buf, Some(&mut p)).await {
                    Some(Reply::Error {
                        status: Status::PermissionDenied,
                        ..
                    }) => {}
                    other => panic!("{other:?}"),
                }
                assert!(requests(&osd).is_empty());
                // osd.3 with its key may.
                let (mut s, _buf, mut p) =
                    open(&osd, "osd.3", &osd_key, AuthMode::Sign).await.unwrap();
                send(&mut s, &batch, 1, Some(&mut p)).await;
                tokio::time::timeout(Duration::from_secs(5), async {
                    while requests(&osd).is_empty() {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                })
                .await
                .expect("osd.3's batch reaches the core");
                assert_eq!(requests(&osd), vec![Kind::RaftBatch]);
            });
        }
    }
}

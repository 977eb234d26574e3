//! Authentication of the data plane on real monitor and OSD processes in auth mode `sign`
//! (`docs/security.md`): frames from a connection that did not prove a key are refused and
//! change nothing; a forged ticket and a replayed handshake are refused; a compromised OSD
//! cannot speak as another OSD; a client limited to one pool cannot touch another; removing a
//! client's key cuts it off.

mod common;

use bytes::{Bytes, BytesMut};
use common::{pool_with_image, start_osds, MonCluster, MonOptions, OsdProc, TempDir};
use fastblock_auth::handshake::{ticket_for_test, Connector, HeldTicket};
use fastblock_auth::{AuthMode, EntityName, Keyring, Secret};
use fastblock_client::{ClientConfig, ClientError, Cluster};
use fastblock_types::{Epoch, ImageId, PgId};
use fastblock_wire::{encode_frame, Frame, FrameDecoder, Kind, ObjectAddr, Reply, Request, Status};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const MIB: u64 = 1 << 20;
const WAIT: Duration = Duration::from_secs(30);

struct Setup {
    mons: MonCluster,
    _dir: TempDir,
    osds: Vec<OsdProc>,
}

async fn setup(pools: &[&str]) -> Setup {
    let mons = MonCluster::start(1, MonOptions::default()).await;
    let dir = TempDir::new("auth-data");
    let osds = start_osds(&mons, dir.path(), 3, "256M", 1, WAIT).await;
    let client = mons.client();
    for pool in pools {
        pool_with_image(&client, (pool, 4, 3), ("img", 8 * MIB, MIB)).await;
    }
    Setup {
        mons,
        _dir: dir,
        osds,
    }
}

fn pattern(seed: u8, len: usize) -> Bytes {
    (0..len)
        .map(|i| seed.wrapping_add((i % 251) as u8))
        .collect::<Vec<u8>>()
        .into()
}

fn osd_addr(osd: &OsdProc) -> String {
    format!("127.0.0.1:{}", osd.port)
}

/// The next frame from `stream`, or `None` once the OSD closed the connection.
async fn next_frame(stream: &mut TcpStream, buf: &mut BytesMut) -> Option<Frame> {
    let mut decoder = FrameDecoder::default();
    loop {
        if let Some(frame) = decoder.decode(buf).expect("a valid frame from the OSD") {
            return Some(frame);
        }
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read_buf(buf))
            .await
            .expect("the OSD answers or closes within 10 s")
            .ok()?;
        if n == 0 {
            return None;
        }
    }
}

/// Sends `frame` as the first bytes of a fresh connection; returns the OSD's error status and
/// checks that it then closed the connection.
async fn refused_first_frame(addr: &str, frame: &[u8]) -> Status {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(frame).await.unwrap();
    let mut buf = BytesMut::new();
    let reply = next_frame(&mut s, &mut buf).await.expect("an error reply");
    let status = match Reply::decode(&reply).expect("a reply") {
        Reply::Error { status, .. } => status,
        other => panic!("expected an error, got {other:?}"),
    };
    assert!(
        next_frame(&mut s, &mut buf).await.is_none(),
        "the OSD closes the connection after refusing it"
    );
    status
}

fn encoded(req: &Request) -> BytesMut {
    let mut out = BytesMut::new();
    req.encode(1, &mut out);
    out
}

fn read_req(pool: u32, epoch: u64) -> Request {
    Request::Read {
        addr: ObjectAddr {
            pg: PgId::new(fastblock_types::PoolId(pool), 0),
            image: ImageId(1),
            object_index: 0,
        },
        offset: 0,
        length: 4096,
        epoch: Epoch(epoch),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_without_a_proven_key_are_refused_and_change_nothing() {
    let s = setup(&["a"]).await;
    let cluster = Cluster::connect(s.mons.client_config()).await.unwrap();
    let image = cluster.open_image("a", "img").await.unwrap();
    let data = pattern(7, 64 * 1024);
    image.write(0, data.clone()).await.unwrap();
    let pool = s.mons.client().pool("a").await.unwrap().id.0;

    let addr = osd_addr(&s.osds[0]);
    // A client request, a Raft batch and a snapshot chunk, each as a connection's first frame.
    let raft = Request::RaftBatch {
        from: s.osds[1].id,
        to: s.osds[0].id,
        msgs: Vec::new(),
    };
    let hello = Request::Hello {
        osd: s.osds[1].id,
        boot_epoch: Epoch(1),
    };
    for (what, req) in [
        ("read", read_req(pool, 1_000)),
        ("raft batch", raft),
        ("hello", hello),
    ] {
        assert_eq!(
            refused_first_frame(&addr, &encoded(&req)).await,
            Status::AuthRequired,
            "{what}"
        );
    }

    // A handshake with client.admin's name and a ticket forged without the OSD's key.
    let mut stream = TcpStream::connect(&addr).await.unwrap();
    let mut buf = BytesMut::new();
    let forged = ticket_for_test(
        &EntityName::admin(),
        &Secret::generate().unwrap(),
        "admin",
        s.osds[0].id,
        &Secret::generate().unwrap(),
        u64::MAX / 2,
    )
    .unwrap();
    let e = fastblock_client::auth::connect(
        &mut stream,
        &mut buf,
        &EntityName::admin(),
        &forged,
        AuthMode::Sign,
        &addr,
    )
    .await
    .err()
    .expect("a forged ticket is refused");
    assert!(
        e.to_string().contains("AuthFailed") && e.to_string().contains("does not open"),
        "{e}"
    );

    // Nothing changed: the data reads back and every OSD still runs.
    assert_eq!(image.read(0, data.len() as u64).await.unwrap(), data);
    for o in &s.osds {
        assert!(o.proc.is_some());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_captured_handshake_replayed_is_refused() {
    let s = setup(&["a"]).await;
    let addr = osd_addr(&s.osds[0]);
    let ticket = ticket_from_monitor(s.mons.client(), s.osds[0].id).await;

    // A genuine handshake, recorded as an eavesdropper would see it (ticket included).
    let (mut connector, hello) =
        Connector::start(EntityName::admin(), &ticket, AuthMode::Sign, [5; 32]);
    let mut s1 = TcpStream::connect(&addr).await.unwrap();
    let mut buf = BytesMut::new();
    let mut out = BytesMut::new();
    encode_frame(Kind::AuthHello, 1, &[&hello], &mut out);
    s1.write_all(&out).await.unwrap();
    let challenge = next_frame(&mut s1, &mut buf).await.unwrap();
    assert_eq!(challenge.kind, Kind::AuthChallenge);
    let proof = connector.on_challenge(&challenge.payload).unwrap();
    let mut proof_frame = BytesMut::new();
    encode_frame(Kind::AuthProof, 2, &[&proof], &mut proof_frame);
    s1.write_all(&proof_frame).await.unwrap();
    let done = next_frame(&mut s1, &mut buf).await.unwrap();
    assert_eq!(done.kind, Kind::AuthDone, "the genuine handshake succeeds");
    connector.on_done(&done.payload).unwrap();

    // The same bytes on a new connection: the OSD's challenge differs, the proof fails.
    let mut s2 = TcpStream::connect(&addr).await.unwrap();
    let mut buf = BytesMut::new();
    s2.write_all(&out).await.unwrap();
    let challenge2 = next_frame(&mut s2, &mut buf).await.unwrap();
    assert_eq!(challenge2.kind, Kind::AuthChallenge);
    assert_ne!(
        challenge2.payload, challenge.payload,
        "a fresh nonce per connection"
    );
    s2.write_all(&proof_frame).await.unwrap();
    let reply = next_frame(&mut s2, &mut buf).await.expect("an error reply");
    match Reply::decode(&reply).unwrap() {
        Reply::Error { status, .. } => assert_eq!(status, Status::AuthFailed),
        other => panic!("a replayed proof was answered {other:?}"),
    }
    assert!(next_frame(&mut s2, &mut buf).await.is_none());
}

/// The ticket `mon`'s entity gets from the monitor for `osd`.
async fn ticket_from_monitor(
    mon: fastblock_monclient::MonClient,
    osd: fastblock_types::OsdId,
) -> HeldTicket {
    let mut got = mon.tickets(&[osd]).await.expect("a ticket");
    assert_eq!(got.len(), 1);
    got.pop().unwrap().1
}

/// A handshake on a fresh connection to `addr` as `entity` with `ticket`; the protected
/// connection, or the OSD's refusal.
async fn handshake(
    addr: &str,
    entity: &EntityName,
    ticket: &HeldTicket,
) -> Result<(TcpStream, BytesMut, fastblock_client::auth::Protected), String> {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let mut buf = BytesMut::new();
    let p = fastblock_client::auth::connect(
        &mut stream,
        &mut buf,
        entity,
        ticket,
        AuthMode::Sign,
        addr,
    )
    .await
    .map_err(|e| e.to_string())?;
    Ok((stream, buf, p))
}

/// What an attacker holding osd.1's files (its keyring) can do: get tickets naming osd.1 and
/// no other. It cannot present them as another OSD, cannot make a ticket another OSD opens,
/// and on a connection as osd.1 it cannot send Raft traffic as another OSD. No key of any
/// other entity is in what the monitor sends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compromised_osd_cannot_speak_as_another_osd() {
    let s = setup(&["a"]).await;
    let cluster = Cluster::connect(s.mons.client_config()).await.unwrap();
    let image = cluster.open_image("a", "img").await.unwrap();
    let data = pattern(9, 64 * 1024);
    image.write(0, data.clone()).await.unwrap();

    let (victim, thief, impersonated) = (&s.osds[0], &s.osds[1], &s.osds[2]);
    let keyring = Keyring::load(&fastblock_osd::keys::keyring_path(&thief.data)).unwrap();
    let thief_name = EntityName::Osd(thief.id);
    let thief_key = keyring.entries[&thief_name].key.clone();
    let as_thief = || {
        fastblock_monclient::MonClient::new(s.mons.endpoints())
            .with_credentials(thief_name.clone(), thief_key.clone())
            .with_deadline(Duration::from_secs(30))
    };

    // What the monitor sends an OSD about other entities: names, caps and generations only.
    let entities = as_thief().auth_entities().await.unwrap();
    assert_eq!(entities.entities.len(), 4, "{:?}", entities.entities);
    let json = serde_json::to_string(&entities).unwrap();
    for word in ["key", "sealed", "secret"] {
        assert!(!json.contains(word), "{word} in {json}");
    }
    // The key table itself is for administrators.
    let e = as_thief().auth_list().await.unwrap_err();
    assert!(e.to_string().contains("needs caps admin"), "{e}");

    let addr = osd_addr(victim);
    let ticket = ticket_from_monitor(as_thief(), victim.id).await;
    assert_eq!(ticket.claims.entity, thief_name);
    // Its own ticket presented under the other OSD's name.
    let e = handshake(&addr, &EntityName::Osd(impersonated.id), &ticket)
        .await
        .err()
        .expect("a ticket presented under another name is refused");
    assert!(e.contains("AuthFailed") && e.contains("issued to"), "{e}");
    // A ticket naming the other OSD, made with every key the thief holds: osd.1's own key and
    // the service key derived from it. It does not open at osd.0.
    for key in [thief_key.clone(), thief_key.service_key()] {
        let forged = ticket_for_test(
            &EntityName::Osd(impersonated.id),
            &thief_key,
            "osd",
            victim.id,
            &key,
            u64::MAX / 2,
        )
        .unwrap();
        let e = handshake(&addr, &EntityName::Osd(impersonated.id), &forged)
            .await
            .err()
            .expect("a forged ticket is refused");
        assert!(
            e.contains("AuthFailed") && e.contains("does not open"),
            "{e}"
        );
    }
    // As itself it gets in, but a Raft batch claiming to come from the other OSD is refused
    // and the connection closed.
    let (mut conn, mut buf, mut p) = handshake(&addr, &thief_name, &ticket).await.unwrap();
    let forged_batch = Request::RaftBatch {
        from: impersonated.id,
        to: victim.id,
        msgs: Vec::new(),
    };
    let mut out = BytesMut::new();
    forged_batch.encode(7, &mut out);
    fastblock_client::auth::seal_frame(&mut out, 0, &mut p.sealer);
    conn.write_all(&out).await.unwrap();
    let frame = loop {
        if let Some(f) = FrameDecoder::default().decode_mut(&mut buf).unwrap() {
            break fastblock_client::auth::open_frame(f, &mut p.opener).unwrap();
        }
        let n = tokio::time::timeout(Duration::from_secs(10), conn.read_buf(&mut buf))
            .await
            .expect("an answer within 10 s")
            .unwrap();
        assert!(n > 0, "closed without a refusal");
    };
    match Reply::decode(&frame).unwrap() {
        Reply::Error { status, .. } => assert_eq!(status, Status::PermissionDenied),
        other => panic!("a batch as another OSD was answered {other:?}"),
    }
    assert!(
        next_frame(&mut conn, &mut buf).await.is_none(),
        "then closed"
    );

    // Nothing changed: the data reads back and every OSD still runs.
    assert_eq!(image.read(0, data.len() as u64).await.unwrap(), data);
    for o in &s.osds {
        assert!(o.proc.is_some());
    }
}

fn auth_status(e: &ClientError) -> Option<Status> {
    match e {
        ClientError::Auth { status, .. } => *status,
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_limited_to_a_pool_cannot_touch_another_and_is_cut_when_removed() {
    let s = setup(&["a", "b"]).await;
    let admin = s.mons.client();
    let vm = admin.auth_add("client.vm", "pool=a").await.unwrap();
    let config = ClientConfig {
        credentials: Some((vm.entity.clone(), vm.key.clone())),
        ..ClientConfig::new(s.mons.endpoints())
    };
    let cluster = Cluster::connect(config).await.unwrap();

    let a = cluster.open_image("a", "img").await.unwrap();
    let data = pattern(3, 8192);
    a.write(4096, data.clone()).await.unwrap();
    assert_eq!(a.read(4096, 8192).await.unwrap(), data);

    // Pool b: the monitor does not show its image records to this key (so it does not
    // open by name); opened from the admin's record, its IO is refused by the OSDs.
    let e = cluster.open_image("b", "img").await.unwrap_err();
    assert!(e.to_string().contains("do not allow pool \"b\""), "{e}");
    let info = admin.image("b", "img").await.unwrap();
    let b = cluster.open_image_info(info).await.unwrap();
    let e = b.write(0, pattern(1, 4096)).await.unwrap_err();
    assert_eq!(auth_status(&e), Some(Status::PermissionDenied), "{e}");
    let e = b.read(0, 4096).await.unwrap_err();
    assert_eq!(auth_status(&e), Some(Status::PermissionDenied), "{e}");
    // And it wrote nothing there.
    let admin_cluster = Cluster::connect(s.mons.client_config()).await.unwrap();
    let b_admin = admin_cluster.open_image("b", "img").await.unwrap();
    assert_eq!(b_admin.read(0, 4096).await.unwrap(), vec![0u8; 4096]);

    // Removing the key cuts the open client off within a bounded time.
    admin.auth_rm("client.vm").await.unwrap();
    let removed = Instant::now();
    loop {
        match a.read(4096, 4096).await {
            Ok(_) => {}
            Err(e) => {
                assert!(
                    matches!(e, ClientError::Auth { .. }),
                    "a removed client gets an authentication error, not {e}"
                );
                break;
            }
        }
        assert!(
            removed.elapsed() < Duration::from_secs(10),
            "the removed client still reads after 10 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("cut off {:?} after its key was removed", removed.elapsed());
}

/// Rotating an OSD's key (the documented way: `auth rotate osd.N`, its keyring replaced, the
/// OSD restarted) keeps every link working: the tickets clients and the other OSDs hold for it
/// were sealed under its old key and no longer open, so they ask for new ones. With another
/// OSD stopped, every write needs the rotated OSD and its peer links both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn io_goes_on_after_an_osds_key_is_rotated() {
    let mut s = setup(&["a"]).await;
    let cluster = Cluster::connect(s.mons.client_config()).await.unwrap();
    let image = cluster.open_image("a", "img").await.unwrap();
    let before = pattern(5, (8 * MIB) as usize);
    image.write(0, before.clone()).await.unwrap();

    let admin = s.mons.client();
    let rotated = &mut s.osds[0];
    let name = EntityName::Osd(rotated.id);
    let new = admin.auth_rotate(&name.to_string()).await.unwrap();
    assert_eq!(new.generation, 2);
    assert!(rotated.stop());
    Keyring::single(name.clone(), new.key.clone(), None)
        .save(&fastblock_osd::keys::keyring_path(&rotated.data))
        .unwrap();
    rotated.start();
    assert!(s.osds[1].stop());

    let after = pattern(6, (8 * MIB) as usize);
    let started = Instant::now();
    loop {
        match image.write(0, after.clone()).await {
            Ok(()) => break,
            Err(e) => {
                assert!(
                    started.elapsed() < Duration::from_secs(60),
                    "no write through the rotated OSD within 60 s: {e}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    eprintln!("writes go on {:?} after the restart", started.elapsed());
    assert_eq!(image.read(0, 8 * MIB).await.unwrap(), after);
}

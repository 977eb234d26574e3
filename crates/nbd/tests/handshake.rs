//! Option haggling against a real server on a socket (in-memory exports): every option this
//! server implements, the errors of the spec for the ones it refuses or cannot parse, and
//! disconnects where the spec demands them. Section names refer to NBD `doc/proto.md`.
// NBD fields are big-endian; the tests build them by hand.
#![allow(clippy::big_endian_bytes)]

use fastblock_nbd::consts::*;
use fastblock_nbd::memory::{MemoryExport, MemoryExports};
use fastblock_nbd::testing::*;
use fastblock_nbd::Limits;

/// "Option types": LIST answers one SERVER per export, then ACK.
#[tokio::test]
async fn list_names_every_export() {
    let exports = MemoryExports::new()
        .with(MemoryExport::new("fb/a", 4096))
        .with(MemoryExport::new("fb/b", 8192));
    let mut server = TestServer::start(exports, Limits::default()).await;
    let mut c = RawClient::connect(server.addr).await;
    let replies = c.option(OPT_LIST, &[]).await;
    let names: Vec<String> = replies
        .iter()
        .filter(|r| r.kind == REP_SERVER)
        .map(|r| String::from_utf8(r.payload[4..].to_vec()).unwrap())
        .collect();
    assert_eq!(names, ["fb/a", "fb/b"]);
    assert_eq!(replies.last().unwrap().kind, REP_ACK);
    // ABORT is acknowledged and the server closes.
    assert_eq!(c.option(OPT_ABORT, &[]).await[0].kind, REP_ACK);
    assert!(c.closed().await);
    server.stop().await;
}

/// INFO describes an export (size, flags, name, description, block sizes) without entering
/// transmission; GO does the same and enters it.
#[tokio::test]
async fn info_then_go() {
    let mut server = TestServer::one(1 << 20).await;
    let mut c = RawClient::connect(server.addr).await;
    let replies = c
        .option(
            OPT_INFO,
            &info_payload("fb/img", &[INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE]),
        )
        .await;
    let info = |t: u16| {
        replies
            .iter()
            .find(|r| r.kind == REP_INFO && r.payload[..2] == t.to_be_bytes())
            .unwrap_or_else(|| panic!("info {t} missing"))
    };
    let export = &info(INFO_EXPORT).payload;
    assert_eq!(
        u64::from_be_bytes(export[2..10].try_into().unwrap()),
        1 << 20
    );
    let flags = u16::from_be_bytes(export[10..12].try_into().unwrap());
    for flag in [
        TFLAG_HAS_FLAGS,
        TFLAG_SEND_FLUSH,
        TFLAG_SEND_FUA,
        TFLAG_SEND_TRIM,
        TFLAG_SEND_WRITE_ZEROES,
        TFLAG_CAN_MULTI_CONN,
        TFLAG_SEND_CACHE,
        TFLAG_SEND_FAST_ZERO,
    ] {
        assert_ne!(flags & flag, 0, "flag {flag:#x} missing");
    }
    assert_eq!(flags & TFLAG_SEND_DF, 0, "DF needs structured replies");
    assert_eq!(&info(INFO_NAME).payload[2..], b"fb/img");
    assert!(String::from_utf8_lossy(&info(INFO_DESCRIPTION).payload[2..]).contains("fb/img"));
    let sizes = &info(INFO_BLOCK_SIZE).payload[2..];
    assert_eq!(sizes[..4], 1u32.to_be_bytes());
    assert_eq!(sizes[4..8], 4096u32.to_be_bytes());
    assert_eq!(sizes[8..12], PAYLOAD_BYTES_MAX.to_be_bytes());
    c.structured().await;
    let (size, flags) = c.go("fb/img").await.unwrap();
    assert_eq!(size, 1 << 20);
    assert_ne!(
        flags & TFLAG_SEND_DF,
        0,
        "DF once structured replies are on"
    );
    // In transmission now: a flush is answered.
    c.request(0, CMD_FLUSH, 1, 0, 0, &[]).await;
    assert_eq!(c.simple_reply().await, (0, 1));
    server.stop().await;
}

/// Errors that leave the session usable: unknown export (ERR_UNKNOWN), bad name
/// (ERR_INVALID), malformed payload (ERR_INVALID), unknown option and STARTTLS (ERR_UNSUP),
/// meta context before structured replies (ERR_INVALID), oversized option (ERR_TOO_BIG).
#[tokio::test]
async fn option_errors_keep_the_session() {
    let mut server = TestServer::one(4096).await;
    let mut c = RawClient::connect(server.addr).await;
    assert_eq!(c.go("fb/nope").await, Err(REP_ERR_UNKNOWN));
    let mut bad = info_payload("fb/img", &[1]);
    bad.push(0);
    assert_eq!(c.option(OPT_GO, &bad).await[0].kind, REP_ERR_INVALID);
    assert_eq!(c.option(77, &[1, 2, 3]).await[0].kind, REP_ERR_UNSUP);
    assert_eq!(c.option(OPT_STARTTLS, &[]).await[0].kind, REP_ERR_UNSUP);
    assert_eq!(c.option(OPT_LIST, &[9]).await[0].kind, REP_ERR_INVALID);
    let r = c.set_meta("fb/img", &[META_BASE_ALLOCATION]).await;
    assert_eq!(r[0].kind, REP_ERR_INVALID);
    let big = vec![0u8; OPTION_BYTES_MAX as usize + 1];
    let r = c.option(OPT_GO, &big).await;
    assert_eq!(r[0].kind, REP_ERR_TOO_BIG);
    assert!(!r[0].payload.is_empty(), "errors carry a message");
    // Still usable.
    assert!(c.go("fb/img").await.is_ok());
    server.stop().await;
}

/// LIST_META_CONTEXT lists base:allocation for an empty query or `base:`; SET selects it by
/// exact name only, with a non-zero id, and only for the export it names.
#[tokio::test]
async fn meta_contexts_list_and_set() {
    let mut server = TestServer::one(4096).await;
    let mut c = RawClient::connect(server.addr).await;
    c.structured().await;
    for queries in [&[][..], &["base:"][..]] {
        let r = c
            .option(OPT_LIST_META_CONTEXT, &meta_payload("fb/img", queries))
            .await;
        assert_eq!(r.len(), 2, "{queries:?}");
        assert_eq!(r[0].kind, REP_META_CONTEXT);
        assert_eq!(&r[0].payload[4..], META_BASE_ALLOCATION.as_bytes());
    }
    let r = c.set_meta("fb/img", &["x-other:thing"]).await;
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].kind, REP_ACK);
    let r = c.set_meta("fb/img", &[META_BASE_ALLOCATION]).await;
    assert_eq!(r[0].kind, REP_META_CONTEXT);
    assert_eq!(r[0].payload[..4], META_BASE_ALLOCATION_ID.to_be_bytes());
    let r = c.set_meta("fb/nope", &[META_BASE_ALLOCATION]).await;
    assert_eq!(r[0].kind, REP_ERR_UNKNOWN);
    server.stop().await;
}

/// EXPORT_NAME: size and flags, then 124 zeros unless NO_ZEROES was negotiated; an unknown
/// name cannot be answered with an error, so the server disconnects.
#[tokio::test]
async fn export_name_with_and_without_zeroes() {
    let mut server = TestServer::one(8192).await;
    let mut c = RawClient::connect(server.addr).await;
    c.send_option(OPT_EXPORT_NAME, b"fb/img").await;
    let answer = c.read(10).await;
    assert_eq!(u64::from_be_bytes(answer[..8].try_into().unwrap()), 8192);
    c.request(0, CMD_FLUSH, 5, 0, 0, &[]).await;
    assert_eq!(c.simple_reply().await, (0, 5));

    let mut c = RawClient::connect_raw(server.addr).await;
    c.send(&1u32.to_be_bytes()).await; // fixed newstyle, zeroes wanted
    c.send_option(OPT_EXPORT_NAME, b"fb/img").await;
    let answer = c.read(10 + 124).await;
    assert!(answer[10..].iter().all(|b| *b == 0));

    let mut c = RawClient::connect(server.addr).await;
    c.send_option(OPT_EXPORT_NAME, b"fb/missing").await;
    assert!(c.closed().await);
    server.stop().await;
}

/// Protocol violations that break framing end that connection only: a bad option magic,
/// unknown client flags. Other connections keep being served.
#[tokio::test]
async fn violations_disconnect_only_the_offender() {
    let mut server = TestServer::one(4096).await;
    let mut good = RawClient::connect(server.addr).await;

    let mut c = RawClient::connect(server.addr).await;
    c.send(&[0u8; 16]).await;
    assert!(c.closed().await);

    let mut c = RawClient::connect_raw(server.addr).await;
    c.send(&0x8000_0000u32.to_be_bytes()).await;
    assert!(c.closed().await);

    assert!(good.go("fb/img").await.is_ok());
    server.stop().await;
}

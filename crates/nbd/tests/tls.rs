//! STARTTLS and the allow lists against a real server on a socket (in-memory exports), with
//! certificates made by `certs::generate` and a rustls client. Section names refer to NBD
//! `doc/proto.md`, "TLS support".
// NBD fields are big-endian; the tests build them by hand.
#![allow(clippy::big_endian_bytes)]

use fastblock_nbd::access::{parse_allow_rule, AllowList, TlsMode};
use fastblock_nbd::certs::{self, client_dir};
use fastblock_nbd::consts::*;
use fastblock_nbd::memory::{MemoryExport, MemoryExports};
use fastblock_nbd::testing::*;
use fastblock_nbd::tls::TlsCredentials;
use fastblock_nbd::ServerConfig;

/// Certificates for server `127.0.0.1` and clients `alice` and `mallory`.
fn make_certs(tag: &str) -> TempDir {
    let dir = TempDir::new(tag);
    certs::generate(
        &dir.0,
        &["127.0.0.1".into(), "localhost".into()],
        &["alice".into(), "mallory".into()],
    )
    .unwrap();
    dir
}

fn exports() -> MemoryExports {
    MemoryExports::new()
        .with(MemoryExport::new("fb/open", 1 << 20))
        .with(MemoryExport::new("fb/secret", 2 << 20))
}

async fn server(certs: &TempDir, mode: TlsMode, verify: bool, allow: &[&str]) -> TestServer {
    let config = ServerConfig {
        tls_mode: mode,
        tls_credentials: Some(TlsCredentials::load(&certs.0, verify).unwrap()),
        allow: AllowList::new(allow.iter().map(|r| parse_allow_rule(r).unwrap()).collect()),
        ..ServerConfig::default()
    };
    TestServer::start_with(exports(), config).await
}

fn names(replies: &[OptReply]) -> Vec<String> {
    replies
        .iter()
        .filter(|r| r.kind == REP_SERVER)
        .map(|r| String::from_utf8(r.payload[4..].to_vec()).unwrap())
        .collect()
}

/// FORCEDTLS: every option but STARTTLS and ABORT gets ERR_TLS_REQD before TLS (GO, INFO,
/// LIST, STRUCTURED_REPLY); after STARTTLS haggling goes on inside TLS, GO enters
/// transmission and data moves; a second STARTTLS is ERR_INVALID.
#[tokio::test]
async fn require_refuses_until_starttls_then_go_works() {
    let certs = make_certs("require");
    let mut s = server(&certs, TlsMode::Require, false, &[]).await;
    let mut c = RawClient::connect(s.addr).await;
    for (option, payload) in [
        (OPT_GO, info_payload("fb/open", &[])),
        (OPT_INFO, info_payload("fb/open", &[])),
        (OPT_LIST, vec![]),
        (OPT_STRUCTURED_REPLY, vec![]),
    ] {
        let replies = c.option(option, &payload).await;
        assert_eq!(replies.len(), 1);
        assert_eq!(replies[0].kind, REP_ERR_TLS_REQD, "option {option}");
        assert!(String::from_utf8_lossy(&replies[0].payload).contains("TLS is required"));
    }
    let config = tls_client_config(&client_dir(&certs.0, "alice"), false);
    let mut c = c.starttls(config, "127.0.0.1").await;
    assert_eq!(
        names(&c.option(OPT_LIST, &[]).await),
        ["fb/open", "fb/secret"]
    );
    let twice = c.option(OPT_STARTTLS, &[]).await;
    assert_eq!(twice[0].kind, REP_ERR_INVALID);
    let (size, _) = c.go("fb/open").await.unwrap();
    assert_eq!(size, 1 << 20);
    let data = pattern(4096, 3);
    c.request(0, CMD_WRITE, 1, 8192, 4096, &data).await;
    assert_eq!(c.simple_reply().await, (0, 1));
    c.request(0, CMD_READ, 2, 8192, 4096, &[]).await;
    assert_eq!(c.simple_reply().await, (0, 2));
    assert_eq!(c.read(4096).await, data);
    assert_eq!(
        s.exports.get("fb/open").unwrap().contents()[8192..12288],
        data
    );
    s.stop().await;
}

/// FORCEDTLS: EXPORT_NAME before TLS cannot be answered an error, so the server closes; ABORT
/// is still acknowledged.
#[tokio::test]
async fn require_disconnects_export_name_and_acks_abort() {
    let certs = make_certs("export-name");
    let mut s = server(&certs, TlsMode::Require, false, &[]).await;
    let mut c = RawClient::connect(s.addr).await;
    c.send_option(OPT_EXPORT_NAME, b"fb/open").await;
    assert!(c.closed().await);
    let mut c = RawClient::connect(s.addr).await;
    assert_eq!(c.option(OPT_ABORT, &[]).await[0].kind, REP_ACK);
    assert!(c.closed().await);
    s.stop().await;
}

/// SELECTIVETLS (`--tls on`): options work in the clear, STARTTLS is offered, and structured
/// replies negotiated in the clear are forgotten inside TLS (GO then gives a DF-less export:
/// DF is advertised only with structured replies).
#[tokio::test]
async fn on_is_optional_and_tls_restarts_negotiation() {
    let certs = make_certs("on");
    let mut s = server(&certs, TlsMode::On, false, &[]).await;
    let mut plain = RawClient::connect(s.addr).await;
    assert_eq!(plain.go("fb/open").await.unwrap().0, 1 << 20);
    let mut c = RawClient::connect(s.addr).await;
    c.structured().await;
    let config = tls_client_config(&client_dir(&certs.0, "alice"), false);
    let mut c = c.starttls(config, "localhost").await;
    let (_, flags) = c.go("fb/open").await.unwrap();
    assert_eq!(
        flags & TFLAG_SEND_DF,
        0,
        "structured replies must be renegotiated"
    );
    s.stop().await;
}

/// NOTLS: STARTTLS is ERR_UNSUP and nothing ever says TLS_REQD.
#[tokio::test]
async fn off_refuses_starttls() {
    let mut s = TestServer::start_with(exports(), ServerConfig::default()).await;
    let mut c = RawClient::connect(s.addr).await;
    assert_eq!(c.option(OPT_STARTTLS, &[]).await[0].kind, REP_ERR_UNSUP);
    assert!(c.go("fb/open").await.is_ok());
    s.stop().await;
}

/// Allow lists by certificate common name: `fb/secret` is only for alice. Mallory (a valid
/// certificate of the same CA) does not see it in LIST and gets ERR_POLICY for INFO, GO and
/// SET_META_CONTEXT on it (and for a name under no image, the same answer), while the
/// export without a list stays open to her.
#[tokio::test]
async fn allow_list_by_common_name() {
    let certs = make_certs("allow");
    let mut s = server(&certs, TlsMode::Require, true, &["fb/secret=alice"]).await;
    let tls = |name: &str| tls_client_config(&client_dir(&certs.0, name), true);

    let c = RawClient::connect(s.addr).await;
    let mut mallory = c.starttls(tls("mallory"), "127.0.0.1").await;
    assert_eq!(names(&mallory.option(OPT_LIST, &[]).await), ["fb/open"]);
    let info = mallory
        .option(OPT_INFO, &info_payload("fb/secret", &[]))
        .await;
    assert_eq!(info.len(), 1);
    assert_eq!(info[0].kind, REP_ERR_POLICY);
    assert!(String::from_utf8_lossy(&info[0].payload).contains("allow list"));
    mallory.structured().await;
    let meta = mallory.set_meta("fb/secret", &["base:allocation"]).await;
    assert_eq!(meta[0].kind, REP_ERR_POLICY);
    assert_eq!(mallory.go("fb/secret").await, Err(REP_ERR_POLICY));
    assert!(mallory.go("fb/open").await.is_ok());

    let c = RawClient::connect(s.addr).await;
    let mut alice = c.starttls(tls("alice"), "127.0.0.1").await;
    assert_eq!(
        names(&alice.option(OPT_LIST, &[]).await),
        ["fb/open", "fb/secret"]
    );
    assert_eq!(alice.go("fb/secret").await.unwrap().0, 2 << 20);

    // EXPORT_NAME cannot carry the refusal: the server closes.
    let c = RawClient::connect(s.addr).await;
    let mut mallory = c.starttls(tls("mallory"), "127.0.0.1").await;
    mallory.send_option(OPT_EXPORT_NAME, b"fb/secret").await;
    assert!(mallory.closed().await);
    s.stop().await;
}

/// Allow lists by source address: the test client connects from 127.0.0.1.
#[tokio::test]
async fn allow_list_by_address() {
    let certs = make_certs("allow-addr");
    let mut s = server(
        &certs,
        TlsMode::On,
        false,
        &["fb/secret=10.0.0.0/8", "fb/open=127.0.0.0/8"],
    )
    .await;
    let mut c = RawClient::connect(s.addr).await;
    assert_eq!(names(&c.option(OPT_LIST, &[]).await), ["fb/open"]);
    assert_eq!(c.go("fb/secret").await, Err(REP_ERR_POLICY));
    assert!(c.go("fb/open").await.is_ok());
    s.stop().await;
}

/// With `--tls-verify-peer`, a client without a certificate, or with one from another CA,
/// fails the TLS handshake and the session ends (the spec: "the server MUST terminate the
/// session"); the server goes on serving others.
#[tokio::test]
async fn bad_client_certificates_end_the_session() {
    let certs = make_certs("verify");
    let other = make_certs("verify-other");
    let mut s = server(&certs, TlsMode::Require, true, &[]).await;
    let ours = client_dir(&certs.0, "alice");

    let c = RawClient::connect(s.addr).await;
    let no_cert = tls_client_config(&ours, false);
    refused(c.try_starttls(no_cert, "127.0.0.1").await).await;

    // Trusts our server, but its certificate is signed by another CA.
    let foreign = client_dir(&other.0, "alice");
    std::fs::copy(ours.join("ca-cert.pem"), foreign.join("ca-cert.pem")).unwrap();
    let c = RawClient::connect(s.addr).await;
    refused(
        c.try_starttls(tls_client_config(&foreign, true), "127.0.0.1")
            .await,
    )
    .await;

    let c = RawClient::connect(s.addr).await;
    let mut good = c
        .starttls(tls_client_config(&ours, true), "127.0.0.1")
        .await;
    assert!(good.go("fb/open").await.is_ok());
    s.stop().await;
}

/// The handshake failed, or (TLS 1.3) the first read after it shows the server hung up.
async fn refused(result: std::io::Result<RawClient>) {
    if let Ok(mut c) = result {
        c.send_option(OPT_LIST, &[]).await;
        assert!(c.closed().await, "the server must end the session");
    }
}

/// Settings that cannot work are refused at bind: TLS on without credentials, a common name
/// in an allow list without verified client certificates.
#[tokio::test]
async fn unusable_tls_settings_fail_at_bind() {
    let certs = make_certs("bind");
    let no_creds = ServerConfig {
        tcp: Some("127.0.0.1:0".parse().unwrap()),
        tls_mode: TlsMode::Require,
        ..ServerConfig::default()
    };
    let e = fastblock_nbd::Server::bind(no_creds, exports())
        .await
        .err()
        .unwrap();
    assert!(e.to_string().contains("--tls-creds"), "{e}");
    let unverified = ServerConfig {
        tcp: Some("127.0.0.1:0".parse().unwrap()),
        tls_mode: TlsMode::Require,
        tls_credentials: Some(TlsCredentials::load(&certs.0, false).unwrap()),
        allow: AllowList::new(vec![parse_allow_rule("fb/secret=alice").unwrap()]),
        ..ServerConfig::default()
    };
    let e = fastblock_nbd::Server::bind(unverified, exports())
        .await
        .err()
        .unwrap();
    assert!(e.to_string().contains("--tls-verify-peer"), "{e}");
    let missing = TlsCredentials::load(&certs.0.join("nowhere"), false).unwrap_err();
    assert!(missing.to_string().contains("server-cert.pem"), "{missing}");
}

/// `gen-certs` writes keys readable by the owner only and refuses to overwrite anything.
#[test]
fn gen_certs_layout_modes_and_no_overwrite() {
    use std::os::unix::fs::PermissionsExt;
    let certs = make_certs("layout");
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    for key in [
        "ca-key.pem",
        "server-key.pem",
        "client-alice/client-key.pem",
    ] {
        assert_eq!(mode(&certs.0.join(key)), 0o600, "{key}");
    }
    for cert in [
        "ca-cert.pem",
        "server-cert.pem",
        "client-alice/client-cert.pem",
    ] {
        assert_eq!(mode(&certs.0.join(cert)), 0o644, "{cert}");
    }
    let again = certs::generate(&certs.0, &["127.0.0.1".into()], &[])
        .err()
        .unwrap();
    assert!(again.to_string().contains("ca-cert.pem"), "{again}");
}

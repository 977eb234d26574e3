//! Test support (feature `test-util`): a raw NBD client that sends exactly the bytes a test
//! asks for and hands back the server's answers unparsed beyond their framing, so malformed
//! input and the server's exact replies can both be tested; and a server on in-memory
//! exports. Every read is bounded by a timeout; failures panic (this is test code).
// NBD fields are big-endian; this client builds and reads them by hand.
#![allow(clippy::big_endian_bytes)]

use crate::consts::*;
use crate::memory::{MemoryExport, MemoryExports};
use crate::{Limits, Server, ServerConfig};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub const TIMEOUT: Duration = Duration::from_secs(10);

/// A server on an ephemeral port; `stop` shuts it down and waits for it.
pub struct TestServer {
    pub addr: SocketAddr,
    pub exports: MemoryExports,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl TestServer {
    pub async fn start(exports: MemoryExports, limits: Limits) -> TestServer {
        let config = ServerConfig {
            limits,
            ..ServerConfig::default()
        };
        TestServer::start_with(exports, config).await
    }

    /// A server with `config` (its TCP address replaced by an ephemeral port on 127.0.0.1).
    pub async fn start_with(exports: MemoryExports, config: ServerConfig) -> TestServer {
        let config = ServerConfig {
            tcp: Some("127.0.0.1:0".parse().unwrap()),
            ..config
        };
        let server = Server::bind(config, exports.clone()).await.unwrap();
        let addr = server.tcp_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(server.run(async move {
            let _ = stopped.await;
        }));
        TestServer {
            addr,
            exports,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// One export "fb/img" of `size` bytes.
    pub async fn one(size: u64) -> TestServer {
        let exports = MemoryExports::new().with(MemoryExport::new("fb/img", size));
        TestServer::start(exports, Limits::default()).await
    }

    pub fn export(&self) -> MemoryExport {
        self.exports.get("fb/img").unwrap().clone()
    }

    /// Signals shutdown; returns once the server has drained and stopped.
    pub async fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(TIMEOUT, task)
                .await
                .expect("server stops in time")
                .unwrap();
        }
    }
}

/// One option reply: type and payload.
#[derive(Debug)]
pub struct OptReply {
    pub kind: u32,
    pub payload: Vec<u8>,
}

/// One structured chunk.
#[derive(Debug)]
pub struct Chunk {
    pub flags: u16,
    pub kind: u16,
    pub handle: u64,
    pub payload: Vec<u8>,
}

/// A byte stream the raw client talks over: TCP, or TLS over TCP after `STARTTLS`.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

pub struct RawClient {
    pub stream: Box<dyn Io>,
}

/// A directory removed on drop (certificates for TLS tests).
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("fbnbd-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A TLS client configuration from a client directory of `gen-certs` (`ca-cert.pem`, and
/// `client-cert.pem` with `client-key.pem` when `with_certificate`).
pub fn tls_client_config(dir: &Path, with_certificate: bool) -> Arc<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(dir.join("ca-cert.pem")).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = if with_certificate {
        let chain = CertificateDer::pem_file_iter(dir.join("client-cert.pem"))
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_file(dir.join("client-key.pem")).unwrap();
        builder.with_client_auth_cert(chain, key).unwrap()
    } else {
        builder.with_no_client_auth()
    };
    Arc::new(config)
}

/// Whether a TCP connect to `addr` succeeds now (to wait for a server process).
pub async fn accepts(addr: SocketAddr) -> bool {
    matches!(
        tokio::time::timeout(Duration::from_secs(1), TcpStream::connect(addr)).await,
        Ok(Ok(_))
    )
}

impl RawClient {
    /// Connects and reads the greeting; does not send the client flags yet.
    pub async fn connect_raw(addr: SocketAddr) -> RawClient {
        let stream = tokio::time::timeout(TIMEOUT, TcpStream::connect(addr))
            .await
            .unwrap()
            .unwrap();
        RawClient::greeted(stream).await
    }

    /// Reads the greeting on a new connection.
    async fn greeted(stream: TcpStream) -> RawClient {
        let mut c = RawClient {
            stream: Box::new(stream),
        };
        let greeting = c.read(18).await;
        assert_eq!(&greeting[..16], b"NBDMAGICIHAVEOPT");
        assert_eq!(&greeting[16..], &[0, 3], "fixed newstyle and no zeroes");
        c
    }

    /// As [`RawClient::connect_raw`] from a socket whose receive buffer is `bytes` (the
    /// kernel doubles it), fixed before connecting so that it does not grow: the replies a
    /// client does not read then stay in the server.
    pub async fn connect_raw_with_receive_buffer(addr: SocketAddr, bytes: u32) -> RawClient {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(bytes).unwrap();
        let stream = tokio::time::timeout(TIMEOUT, socket.connect(addr))
            .await
            .unwrap()
            .unwrap();
        RawClient::greeted(stream).await
    }

    /// Connects and sends client flags fixed-newstyle + no-zeroes.
    pub async fn connect(addr: SocketAddr) -> RawClient {
        let mut c = RawClient::connect_raw(addr).await;
        c.send(&3u32.to_be_bytes()).await;
        c
    }

    /// `STARTTLS`, which must be acknowledged, then the TLS handshake as a client of
    /// `server_name`. Panics if either fails; see [`RawClient::try_starttls`].
    pub async fn starttls(self, config: Arc<rustls::ClientConfig>, server_name: &str) -> RawClient {
        self.try_starttls(config, server_name)
            .await
            .expect("TLS handshake")
    }

    /// As [`RawClient::starttls`], returning the TLS handshake's error.
    pub async fn try_starttls(
        mut self,
        config: Arc<rustls::ClientConfig>,
        server_name: &str,
    ) -> std::io::Result<RawClient> {
        let reply = self.option(OPT_STARTTLS, &[]).await;
        assert_eq!(reply[0].kind, REP_ACK, "STARTTLS acknowledged");
        let name = ServerName::try_from(server_name.to_owned()).unwrap();
        let connector = tokio_rustls::TlsConnector::from(config);
        let mut stream = tokio::time::timeout(TIMEOUT, connector.connect(name, self.stream))
            .await
            .expect("TLS handshake in time")?;
        // With TLS 1.3 the server checks the client's certificate after the client's side of
        // the handshake is done, so a refused certificate shows on the first read instead.
        stream.flush().await?;
        Ok(RawClient {
            stream: Box::new(stream),
        })
    }

    pub async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.unwrap();
    }

    pub async fn read(&mut self, n: usize) -> Vec<u8> {
        let mut buf = vec![0u8; n];
        tokio::time::timeout(TIMEOUT, self.stream.read_exact(&mut buf))
            .await
            .expect("server answered in time")
            .expect("server did not close");
        buf
    }

    /// Whether the server closed the connection (EOF within the timeout).
    pub async fn closed(&mut self) -> bool {
        let mut byte = [0u8; 1];
        match tokio::time::timeout(TIMEOUT, self.stream.read(&mut byte)).await {
            Ok(Ok(0)) | Ok(Err(_)) => true,
            Ok(Ok(_)) => false,
            Err(_) => panic!("neither data nor EOF within {TIMEOUT:?}"),
        }
    }

    pub async fn send_option(&mut self, option: u32, payload: &[u8]) {
        let mut b = OPTION_MAGIC.to_be_bytes().to_vec();
        b.extend_from_slice(&option.to_be_bytes());
        b.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        b.extend_from_slice(payload);
        self.send(&b).await;
    }

    pub async fn read_opt_reply(&mut self, option: u32) -> OptReply {
        let h = self.read(20).await;
        assert_eq!(
            u64::from_be_bytes(h[..8].try_into().unwrap()),
            OPTION_REPLY_MAGIC
        );
        assert_eq!(u32::from_be_bytes(h[8..12].try_into().unwrap()), option);
        let kind = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
        let payload = self.read(len).await;
        OptReply { kind, payload }
    }

    /// Sends an option and reads replies up to the final one (ACK or an error).
    pub async fn option(&mut self, option: u32, payload: &[u8]) -> Vec<OptReply> {
        self.send_option(option, payload).await;
        let mut out = Vec::new();
        loop {
            let r = self.read_opt_reply(option).await;
            let last = r.kind == REP_ACK || r.kind & (1 << 31) != 0;
            out.push(r);
            if last {
                return out;
            }
        }
    }

    pub async fn structured(&mut self) {
        let r = self.option(OPT_STRUCTURED_REPLY, &[]).await;
        assert_eq!(r[0].kind, REP_ACK);
    }

    pub async fn set_meta(&mut self, name: &str, queries: &[&str]) -> Vec<OptReply> {
        self.option(OPT_SET_META_CONTEXT, &meta_payload(name, queries))
            .await
    }

    /// `GO`; returns (size, transmission flags) or the error reply type.
    pub async fn go(&mut self, name: &str) -> Result<(u64, u16), u32> {
        let replies = self.option(OPT_GO, &info_payload(name, &[])).await;
        let last = replies.last().unwrap();
        if last.kind != REP_ACK {
            return Err(last.kind);
        }
        let export = replies
            .iter()
            .find(|r| r.kind == REP_INFO && r.payload[..2] == [0, 0])
            .expect("NBD_INFO_EXPORT");
        let size = u64::from_be_bytes(export.payload[2..10].try_into().unwrap());
        let flags = u16::from_be_bytes(export.payload[10..12].try_into().unwrap());
        Ok((size, flags))
    }

    pub async fn request(
        &mut self,
        flags: u16,
        kind: u16,
        handle: u64,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) {
        let b = request_bytes(flags, kind, handle, offset, length, payload);
        self.send(&b).await;
    }

    /// A simple reply: (error, handle).
    pub async fn simple_reply(&mut self) -> (u32, u64) {
        let h = self.read(16).await;
        assert_eq!(
            u32::from_be_bytes(h[..4].try_into().unwrap()),
            SIMPLE_REPLY_MAGIC
        );
        (
            u32::from_be_bytes(h[4..8].try_into().unwrap()),
            u64::from_be_bytes(h[8..16].try_into().unwrap()),
        )
    }

    pub async fn chunk(&mut self) -> Chunk {
        let h = self.read(20).await;
        assert_eq!(
            u32::from_be_bytes(h[..4].try_into().unwrap()),
            STRUCTURED_REPLY_MAGIC,
            "expected a structured chunk"
        );
        let len = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
        Chunk {
            flags: u16::from_be_bytes(h[4..6].try_into().unwrap()),
            kind: u16::from_be_bytes(h[6..8].try_into().unwrap()),
            handle: u64::from_be_bytes(h[8..16].try_into().unwrap()),
            payload: self.read(len).await,
        }
    }

    /// Chunks of one reply up to its `DONE` chunk (no other request in flight).
    pub async fn chunks(&mut self) -> Vec<Chunk> {
        let mut out = Vec::new();
        loop {
            let c = self.chunk().await;
            let done = c.flags & REPLY_FLAG_DONE != 0;
            out.push(c);
            if done {
                return out;
            }
        }
    }

    /// A structured read reassembled: data and holes into one buffer; or the error value.
    pub async fn structured_read(&mut self, offset: u64, len: usize) -> Result<Vec<u8>, u32> {
        let mut data = vec![0xeeu8; len];
        for c in self.chunks().await {
            match c.kind {
                REPLY_TYPE_OFFSET_DATA => {
                    let at = u64::from_be_bytes(c.payload[..8].try_into().unwrap()) - offset;
                    let bytes = &c.payload[8..];
                    data[at as usize..at as usize + bytes.len()].copy_from_slice(bytes);
                }
                REPLY_TYPE_OFFSET_HOLE => {
                    let at = u64::from_be_bytes(c.payload[..8].try_into().unwrap()) - offset;
                    let n = u32::from_be_bytes(c.payload[8..12].try_into().unwrap());
                    data[at as usize..at as usize + n as usize].fill(0);
                }
                REPLY_TYPE_NONE => {}
                REPLY_TYPE_ERROR => {
                    return Err(u32::from_be_bytes(c.payload[..4].try_into().unwrap()))
                }
                other => panic!("unexpected chunk type {other}"),
            }
        }
        Ok(data)
    }
}

/// One request as sent: header then payload (to pipeline many in one write).
pub fn request_bytes(
    flags: u16,
    kind: u16,
    handle: u64,
    offset: u64,
    length: u32,
    payload: &[u8],
) -> Vec<u8> {
    let mut b = REQUEST_MAGIC.to_be_bytes().to_vec();
    b.extend_from_slice(&flags.to_be_bytes());
    b.extend_from_slice(&kind.to_be_bytes());
    b.extend_from_slice(&handle.to_be_bytes());
    b.extend_from_slice(&offset.to_be_bytes());
    b.extend_from_slice(&length.to_be_bytes());
    b.extend_from_slice(payload);
    b
}

pub fn info_payload(name: &str, requests: &[u16]) -> Vec<u8> {
    let mut p = (name.len() as u32).to_be_bytes().to_vec();
    p.extend_from_slice(name.as_bytes());
    p.extend_from_slice(&(requests.len() as u16).to_be_bytes());
    for r in requests {
        p.extend_from_slice(&r.to_be_bytes());
    }
    p
}

pub fn meta_payload(name: &str, queries: &[&str]) -> Vec<u8> {
    let mut p = (name.len() as u32).to_be_bytes().to_vec();
    p.extend_from_slice(name.as_bytes());
    p.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        p.extend_from_slice(&(q.len() as u32).to_be_bytes());
        p.extend_from_slice(q.as_bytes());
    }
    p
}

/// Bytes whose value depends on their position and a seed.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1)
        .collect()
}

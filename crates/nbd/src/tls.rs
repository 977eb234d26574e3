//! The server side of TLS: credentials loaded from a directory in qemu's x509 layout
//! (`ca-cert.pem`, `server-cert.pem`, `server-key.pem`), optionally verifying client
//! certificates against `ca-cert.pem`, and the handshake on an accepted connection.
//!
//! rustls with the `ring` provider; TLS 1.2 and 1.3 (the NBD spec requires 1.2 at least). TLS
//! with pre-shared keys (qemu's `tls-creds-psk`) is not available: rustls does not implement
//! it.

use crate::cert_name::subject_common_name;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncWrite};

pub const CA_CERT_FILE: &str = "ca-cert.pem";
pub const SERVER_CERT_FILE: &str = "server-cert.pem";
pub const SERVER_KEY_FILE: &str = "server-key.pem";

/// Why the TLS credentials could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {error}")]
    Pem {
        path: PathBuf,
        error: rustls::pki_types::pem::Error,
    },
    #[error("{0}: no certificate in the file")]
    NoCertificate(PathBuf),
    #[error("{path}: {error}")]
    BadCa { path: PathBuf, error: rustls::Error },
    #[error("client certificate verifier: {0}")]
    Verifier(rustls::server::VerifierBuilderError),
    #[error("TLS configuration: {0}")]
    Config(rustls::Error),
}

// The message includes the cause's, so the cause is not also its `source()` (a printed
// chain would say it twice): `From` by hand instead of `#[from]`.
impl From<rustls::Error> for TlsError {
    fn from(e: rustls::Error) -> Self {
        TlsError::Config(e)
    }
}

impl From<rustls::server::VerifierBuilderError> for TlsError {
    fn from(e: rustls::server::VerifierBuilderError) -> Self {
        TlsError::Verifier(e)
    }
}

/// The server's TLS credentials, ready to accept connections.
#[derive(Clone)]
pub struct TlsCredentials {
    acceptor: tokio_rustls::TlsAcceptor,
    verify_peer: bool,
}

impl std::fmt::Debug for TlsCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsCredentials")
            .field("verify_peer", &self.verify_peer)
            .finish_non_exhaustive()
    }
}

/// A connection after the TLS handshake, and the verified client certificate's common name.
pub struct Accepted<S> {
    pub stream: tokio_rustls::server::TlsStream<S>,
    pub common_name: Option<String>,
}

impl TlsCredentials {
    /// Loads `dir/server-cert.pem` (the certificate, then any intermediates) and
    /// `dir/server-key.pem`; with `verify_peer`, also `dir/ca-cert.pem`, and then every client
    /// must present a certificate signed by that CA.
    pub fn load(dir: &Path, verify_peer: bool) -> Result<TlsCredentials, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain = read_certs(&dir.join(SERVER_CERT_FILE))?;
        let key_path = dir.join(SERVER_KEY_FILE);
        let key = PrivateKeyDer::from_pem_file(&key_path).map_err(|error| TlsError::Pem {
            path: key_path,
            error,
        })?;
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?;
        let builder = if verify_peer {
            let ca_path = dir.join(CA_CERT_FILE);
            let mut roots = rustls::RootCertStore::empty();
            for cert in read_certs(&ca_path)? {
                roots.add(cert).map_err(|error| TlsError::BadCa {
                    path: ca_path.clone(),
                    error,
                })?;
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()?;
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let config = builder.with_single_cert(chain, key)?;
        Ok(TlsCredentials {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
            verify_peer,
        })
    }

    pub fn verify_peer(&self) -> bool {
        self.verify_peer
    }

    /// The TLS handshake on `stream` (the caller bounds it by a timeout).
    pub async fn accept<S>(&self, stream: S) -> std::io::Result<Accepted<S>>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let stream = self.acceptor.accept(stream).await?;
        let common_name = stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first())
            .and_then(|leaf| subject_common_name(leaf));
        Ok(Accepted {
            stream,
            common_name,
        })
    }
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem_error = |error| TlsError::Pem {
        path: path.to_owned(),
        error,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(pem_error)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem_error)?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate(path.to_owned()));
    }
    Ok(certs)
}

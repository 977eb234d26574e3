//! `fastblock-nbd gen-certs`: a CA, a server certificate and client certificates in qemu's
//! x509 directory layout, made in process with rcgen (ECDSA P-256 keys):
//!
//! ```text
//! DIR/ca-cert.pem  ca-key.pem  server-cert.pem  server-key.pem     the server's --tls-creds DIR
//! DIR/client-NAME/ca-cert.pem  client-cert.pem  client-key.pem    a client's dir (qemu, libnbd)
//! ```
//!
//! Keys are written mode 0600, certificates 0644, new directories 0700. No existing file is
//! overwritten (a CA key is never replaced by accident): the command fails naming the file.

use crate::tls::{CA_CERT_FILE, SERVER_CERT_FILE, SERVER_KEY_FILE};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

pub const CA_KEY_FILE: &str = "ca-key.pem";
pub const CLIENT_CERT_FILE: &str = "client-cert.pem";
pub const CLIENT_KEY_FILE: &str = "client-key.pem";

#[derive(Debug, thiserror::Error)]
pub enum CertsError {
    #[error("no --host given: the server certificate needs at least one name or address")]
    NoHost,
    #[error("client name {0:?}: use letters, digits, '.', '_' and '-'")]
    BadClientName(String),
    #[error("generating a certificate: {0}")]
    Generate(rcgen::Error),
    #[error("writing {path}: {error}")]
    Write {
        path: PathBuf,
        error: std::io::Error,
    },
}

// The message includes the cause's, so the cause is not also its `source()` (a printed
// chain would say it twice): `From` by hand instead of `#[from]`.
impl From<rcgen::Error> for CertsError {
    fn from(e: rcgen::Error) -> Self {
        CertsError::Generate(e)
    }
}

/// The files written, for the caller to print.
pub struct Written {
    pub server_dir: PathBuf,
    pub client_dirs: Vec<PathBuf>,
}

/// The directory of client `name`'s credentials under `dir`.
pub fn client_dir(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("client-{name}"))
}

/// Writes a new CA, a server certificate for `hosts` (each an IP address or a DNS name; all
/// are subject alternative names, the first is also the common name) and one client
/// certificate per name in `clients` (its common name), under `dir`.
pub fn generate(dir: &Path, hosts: &[String], clients: &[String]) -> Result<Written, CertsError> {
    let first_host = hosts.first().ok_or(CertsError::NoHost)?;
    if let Some(bad) = clients.iter().find(|c| !valid_client_name(c)) {
        return Err(CertsError::BadClientName(bad.clone()));
    }
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name = name("fastblock-nbd CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key)?;
    let issue = |subject_alt_names: Vec<String>, common_name: &str, server: bool| {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(subject_alt_names)?;
        params.distinguished_name = name(common_name);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![if server {
            ExtendedKeyUsagePurpose::ServerAuth
        } else {
            ExtendedKeyUsagePurpose::ClientAuth
        }];
        params.use_authority_key_identifier_extension = true;
        let cert = params.signed_by(&key, &ca_cert, &ca_key)?;
        Ok::<_, CertsError>((cert.pem(), key.serialize_pem()))
    };
    let (server_cert, server_key) = issue(hosts.to_vec(), first_host, true)?;
    let mut issued = Vec::new();
    for client in clients {
        issued.push((client, issue(Vec::new(), client, false)?));
    }

    make_dir(dir)?;
    write_file(&dir.join(CA_CERT_FILE), &ca_cert.pem(), 0o644)?;
    write_file(&dir.join(CA_KEY_FILE), &ca_key.serialize_pem(), 0o600)?;
    write_file(&dir.join(SERVER_CERT_FILE), &server_cert, 0o644)?;
    write_file(&dir.join(SERVER_KEY_FILE), &server_key, 0o600)?;
    let mut client_dirs = Vec::new();
    for (client, (cert, key)) in issued {
        let cdir = client_dir(dir, client);
        make_dir(&cdir)?;
        write_file(&cdir.join(CA_CERT_FILE), &ca_cert.pem(), 0o644)?;
        write_file(&cdir.join(CLIENT_CERT_FILE), &cert, 0o644)?;
        write_file(&cdir.join(CLIENT_KEY_FILE), &key, 0o600)?;
        client_dirs.push(cdir);
    }
    Ok(Written {
        server_dir: dir.to_owned(),
        client_dirs,
    })
}

fn name(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "fastblock");
    dn.push(DnType::CommonName, common_name);
    dn
}

fn valid_client_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

fn make_dir(dir: &Path) -> Result<(), CertsError> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(CertsError::Write {
            path: dir.to_owned(),
            error: e,
        }),
        _ => Ok(()),
    }
}

fn write_file(path: &Path, contents: &str, mode: u32) -> Result<(), CertsError> {
    let fail = |error| CertsError::Write {
        path: path.to_owned(),
        error,
    };
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(fail)?;
    file.write_all(contents.as_bytes()).map_err(fail)?;
    file.sync_all().map_err(fail)
}

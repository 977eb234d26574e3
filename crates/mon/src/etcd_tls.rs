//! TLS on the peer links of the monitors' own etcd members, mutually authenticated, with no
//! file to distribute but the monitor secret (`docs/security.md`, "etcd").
//!
//! Every monitor derives the same Ed25519 key from the secret ([`MonSecret::etcd_peer_ca_seed`])
//! and makes from it a CA certificate of a fixed name; each then issues its own member a
//! certificate for its peer address with a fresh key, signed by that CA, at every start. etcd
//! runs its peer listener with `--peer-client-cert-auth` and trusts that CA alone, so a peer
//! link is encrypted, and each end is a member whose monitor holds the secret: someone on the
//! network between monitors reads nothing of what the members replicate (the map, the entity
//! names, etcd's own user records) and cannot inject Raft traffic.
//!
//! The CA certificates the monitors make are not byte for byte the same (serial, validity),
//! but their name and key are, which is what a chain is checked by: a member certificate
//! issued by one monitor verifies against the CA certificate of any other.
//!
//! A member created before this (its data has peer URLs in clear) keeps them: etcd stores its
//! members' peer URLs, and changing the scheme of a running cluster is a member update per
//! member (`docs/operations.md`, "Monitor database"). [`peer_tls_for`] says which applies.

use crate::secret::MonSecret;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};
use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The common name of the peer CA: fixed, so that every monitor's CA certificate has the same
/// subject.
const CA_NAME: &str = "fastblock etcd peer CA";
pub const CA_FILE: &str = "peer-ca.pem";
pub const CERT_FILE: &str = "peer-cert.pem";
pub const KEY_FILE: &str = "peer-key.pem";
/// An Ed25519 private key in PKCS#8 v1 (RFC 8410) is this prefix and the 32-byte seed.
const ED25519_PKCS8_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];

#[derive(Debug, thiserror::Error)]
pub enum PeerTlsError {
    #[error("making the etcd peer certificates: {0}")]
    Generate(String),
    #[error("writing {path}: {error}")]
    Write {
        path: PathBuf,
        error: std::io::Error,
    },
}

impl From<rcgen::Error> for PeerTlsError {
    fn from(e: rcgen::Error) -> Self {
        PeerTlsError::Generate(e.to_string())
    }
}

/// Where a member's peer TLS files are: the CA certificate it trusts, its certificate and key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerTlsFiles {
    pub dir: PathBuf,
}

impl PeerTlsFiles {
    pub fn ca(&self) -> PathBuf {
        self.dir.join(CA_FILE)
    }
    pub fn cert(&self) -> PathBuf {
        self.dir.join(CERT_FILE)
    }
    pub fn key(&self) -> PathBuf {
        self.dir.join(KEY_FILE)
    }
}

/// The directory of a member's peer TLS files, beside its data directory.
pub fn tls_dir(etcd_data_dir: &Path) -> PathBuf {
    etcd_data_dir.with_extension("peer-tls")
}

/// Whether the member at `etcd_data_dir` runs its peer links with TLS: a new member does; one
/// whose data predates peer TLS (data, but no TLS directory) keeps its clear peer URLs.
pub fn peer_tls_for(etcd_data_dir: &Path) -> bool {
    !etcd_data_dir.join("member").exists() || tls_dir(etcd_data_dir).exists()
}

fn distinguished(name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, name);
    dn
}

/// The peer CA's key, the same on every monitor holding `secret`.
fn ca_key(secret: &MonSecret) -> Result<KeyPair, PeerTlsError> {
    let mut pkcs8 = ED25519_PKCS8_PREFIX.to_vec();
    pkcs8.extend_from_slice(&secret.etcd_peer_ca_seed());
    let key = KeyPair::try_from(pkcs8.as_slice())?;
    Ok(key)
}

/// The CA certificate and a member certificate for `peer_host` (the host part of its peer
/// address: an IP address, or a name), both PEM, and the member's key (PEM).
pub fn issue(
    secret: &MonSecret,
    peer_host: &str,
) -> Result<(String, String, String), PeerTlsError> {
    let ca_key = ca_key(secret)?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name = distinguished(CA_NAME);
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key)?;

    // ECDSA P-256: what every TLS stack reads (the CA key is Ed25519 only to be derivable).
    let member_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let mut member = CertificateParams::new(Vec::<String>::new())?;
    member.distinguished_name = distinguished(&format!("fastblock etcd member {peer_host}"));
    member.subject_alt_names = match peer_host.parse::<IpAddr>() {
        Ok(ip) => vec![SanType::IpAddress(ip)],
        Err(_) => vec![SanType::DnsName(peer_host.try_into()?)],
    };
    member.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    // A member is a server to the peers that dial it and a client of those it dials.
    member.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let member_cert = member.signed_by(&member_key, &ca_cert, &ca_key)?;
    Ok((ca_cert.pem(), member_cert.pem(), member_key.serialize_pem()))
}

/// Writes the CA certificate and a fresh member certificate and key for `peer_host` under
/// `dir` (made mode 0700; the key 0600), replacing what a previous start wrote.
pub fn prepare(
    secret: &MonSecret,
    dir: &Path,
    peer_host: &str,
) -> Result<PeerTlsFiles, PeerTlsError> {
    let (ca, cert, key) = issue(secret, peer_host)?;
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |error| PeerTlsError::Write { path, error }
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io(dir))?;
    let files = PeerTlsFiles {
        dir: dir.to_path_buf(),
    };
    for (path, text, mode) in [
        (files.ca(), ca, 0o644),
        (files.cert(), cert, 0o644),
        (files.key(), key, 0o600),
    ] {
        // Written beside and renamed over, so etcd never reads a half-written file.
        let tmp = path.with_extension("tmp");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)
            .map_err(io(&tmp))?;
        f.write_all(text.as_bytes()).map_err(io(&tmp))?;
        f.sync_all().map_err(io(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(io(&path))?;
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_monitor_derives_the_same_ca_key_from_the_secret_and_no_other() {
        let a = MonSecret::from_bytes([3; 32]);
        let b = MonSecret::from_bytes([3; 32]);
        let other = MonSecret::from_bytes([4; 32]);
        let public = |s: &MonSecret| ca_key(s).unwrap().public_key_raw().to_vec();
        assert_eq!(public(&a), public(&b));
        assert_ne!(public(&a), public(&other));
        // Two members' certificates: each fresh key, the same issuer.
        let (ca1, cert1, key1) = issue(&a, "10.0.0.1").unwrap();
        let (ca2, cert2, key2) = issue(&b, "10.0.0.2").unwrap();
        assert_ne!(cert1, cert2);
        assert_ne!(key1, key2);
        assert!(ca1.starts_with("-----BEGIN CERTIFICATE-----"), "{ca1}");
        assert!(ca2.starts_with("-----BEGIN CERTIFICATE-----"), "{ca2}");
        assert!(issue(&a, "etcd-1.example").is_ok());
    }

    #[test]
    fn a_new_member_uses_tls_and_an_old_one_keeps_its_clear_urls() {
        let dir = std::env::temp_dir().join(format!("etcd-tls-{}", std::process::id()));
        let data = dir.join("etcd");
        assert!(peer_tls_for(&data), "a new member");
        std::fs::create_dir_all(data.join("member")).unwrap();
        assert!(!peer_tls_for(&data), "data from before peer TLS");
        let files = prepare(
            &MonSecret::from_bytes([5; 32]),
            &tls_dir(&data),
            "127.0.0.1",
        )
        .unwrap();
        assert!(peer_tls_for(&data), "a member started with TLS");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(files.key()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

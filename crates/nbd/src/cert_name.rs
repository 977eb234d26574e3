//! The subject common name of an X.509 certificate, from its DER bytes, sans IO. The allow
//! lists name clients by it. The certificate has already been verified by rustls (webpki) when
//! this runs, but the walk still checks every length and returns `None` rather than trusting
//! the bytes: it is network input.
//!
//! The path, from RFC 5280 section 4.1: `Certificate ::= SEQUENCE { tbsCertificate, ... }`,
//! `TBSCertificate ::= SEQUENCE { [0] version OPTIONAL, serialNumber, signature, issuer,
//! validity, subject, ... }`, `Name ::= SEQUENCE OF SET OF SEQUENCE { type OID, value }`.

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const OID: u8 = 0x06;
const VERSION: u8 = 0xa0;
/// id-at-commonName, 2.5.4.3.
const OID_COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];
const UTF8_STRING: u8 = 0x0c;
const PRINTABLE_STRING: u8 = 0x13;
const IA5_STRING: u8 = 0x16;

/// One tag-length-value: (tag, value bytes, the bytes after it).
fn tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        // Long form: the low bits count the length bytes; four are plenty for a certificate.
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 || rest.len() < count {
            return None;
        }
        let len = rest[..count]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, &rest[count..])
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &rest[len..]))
}

/// The value of a TLV with tag `want`, and what follows it.
fn expect(input: &[u8], want: u8) -> Option<(&[u8], &[u8])> {
    let (tag, value, rest) = tlv(input)?;
    (tag == want).then_some((value, rest))
}

/// The first common name in the certificate's subject, if it is a UTF-8, printable or IA5
/// string.
pub fn subject_common_name(der: &[u8]) -> Option<String> {
    let (cert, _) = expect(der, SEQUENCE)?;
    let (tbs, _) = expect(cert, SEQUENCE)?;
    let mut fields = tbs;
    if fields.first() == Some(&VERSION) {
        fields = tlv(fields)?.2;
    }
    // serialNumber, signature, issuer, validity: skipped whatever they hold.
    for _ in 0..4 {
        fields = tlv(fields)?.2;
    }
    let (mut subject, _) = expect(fields, SEQUENCE)?;
    while !subject.is_empty() {
        let (mut set, rest) = expect(subject, SET)?;
        subject = rest;
        while !set.is_empty() {
            let (attribute, rest) = expect(set, SEQUENCE)?;
            set = rest;
            let (oid, value) = expect(attribute, OID)?;
            if oid != OID_COMMON_NAME {
                continue;
            }
            let (tag, bytes, _) = tlv(value)?;
            if ![UTF8_STRING, PRINTABLE_STRING, IA5_STRING].contains(&tag) {
                return None;
            }
            return String::from_utf8(bytes.to_vec()).ok();
        }
    }
    None
}

#[cfg(all(test, feature = "server"))]
mod tests {
    use super::*;

    /// A self-signed certificate whose subject is O=fastblock, plus CN=`common_name` if given.
    fn certificate(common_name: Option<&str>) -> Vec<u8> {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["x.example".to_owned()]).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "fastblock");
        if let Some(cn) = common_name {
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, cn);
        }
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn common_name_of_a_generated_certificate() {
        let der = certificate(Some("alice"));
        assert_eq!(subject_common_name(&der).as_deref(), Some("alice"));
    }

    #[test]
    fn no_common_name_and_garbage_give_none() {
        let der = certificate(None);
        assert_eq!(subject_common_name(&der), None);
        // Every truncation of a real certificate, and every single-byte corruption of its
        // first 200 bytes, is handled without a panic.
        for len in 0..der.len() {
            let _ = subject_common_name(&der[..len]);
        }
        for at in 0..200.min(der.len()) {
            let mut bad = der.clone();
            bad[at] ^= 0xff;
            let _ = subject_common_name(&bad);
        }
        assert_eq!(
            subject_common_name(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]),
            None
        );
    }
}

//! Keys. An entity key never leaves the keyring and the monitor's key table; each use gets
//! its own key derived from it with HMAC-SHA256, so a key learned by one party cannot be used
//! for another purpose: the monitor key signs API requests, an OSD's service key opens the
//! tickets the monitor issues for it (`crate::ticket`), the seal key opens what the monitor
//! sends its owner sealed. No entity ever holds another's key or a key derived from it.

use crate::error::AuthError;
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use ring::aead::{self, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

pub const SECRET_BYTES: usize = 32;
/// Label of the derived key that signs monitor API calls.
const LABEL_MON: &[u8] = b"fastblock-v1 mon";
/// Label of an OSD's service key: the key its tickets are sealed under.
const LABEL_SERVICE: &[u8] = b"fastblock-v1 service";
/// Label of the derived key that encrypts keys sent to their owner.
const LABEL_SEAL: &[u8] = b"fastblock-v1 seal";

/// A 32-byte secret. `Debug` never prints it; it is wiped when dropped.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret([u8; SECRET_BYTES]);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Drop for Secret {
    fn drop(&mut self) {
        // Volatile writes so the compiler keeps the wipe of a value about to die.
        for b in self.0.iter_mut() {
            // SAFETY: `b` is a valid, aligned, exclusive reference into our own array.
            unsafe { std::ptr::write_volatile(b, 0) };
        }
    }
}

impl Secret {
    pub fn from_bytes(bytes: [u8; SECRET_BYTES]) -> Secret {
        Secret(bytes)
    }

    /// A fresh random key from the operating system.
    pub fn generate() -> Result<Secret, AuthError> {
        Ok(Secret(random_bytes::<SECRET_BYTES>()?))
    }

    pub fn as_bytes(&self) -> &[u8; SECRET_BYTES] {
        &self.0
    }

    /// The key's text form (standard base64, 44 characters).
    pub fn to_base64(&self) -> String {
        STANDARD.encode(self.0)
    }

    pub fn from_base64(text: &str) -> Result<Secret, AuthError> {
        let bytes = STANDARD
            .decode(text.trim())
            .map_err(|e| AuthError::BadKey(format!("not base64: {e}")))?;
        let arr: [u8; SECRET_BYTES] = bytes.try_into().map_err(|b: Vec<u8>| {
            AuthError::BadKey(format!("{} bytes, expected {SECRET_BYTES}", b.len()))
        })?;
        Ok(Secret(arr))
    }

    /// HMAC-SHA256 of `parts` (each length-prefixed, so no two lists of parts collide) under
    /// this key.
    pub fn mac(&self, parts: &[&[u8]]) -> [u8; 32] {
        let key = hmac::Key::new(hmac::HMAC_SHA256, &self.0);
        let mut ctx = hmac::Context::with_key(&key);
        for p in parts {
            ctx.update(&(p.len() as u64).to_le_bytes());
            ctx.update(p);
        }
        let tag = ctx.sign();
        tag.as_ref().try_into().expect("HMAC-SHA256 is 32 bytes")
    }

    /// Whether `tag` is this key's MAC of `parts`, compared in constant time.
    pub fn verify_mac(&self, parts: &[&[u8]], tag: &[u8]) -> bool {
        let expected = self.mac(parts);
        ct_eq(&expected, tag)
    }

    /// A key derived for one purpose.
    pub fn derive(&self, label: &[u8]) -> Secret {
        Secret(self.mac(&[label]))
    }

    /// The key that signs this entity's monitor API calls.
    pub fn mon_key(&self) -> Secret {
        self.derive(LABEL_MON)
    }

    /// An OSD's service key (derived from `osd.N`'s key): the monitor seals the tickets it
    /// issues for OSD N under it, and only OSD N (and the monitor) can open them.
    pub fn service_key(&self) -> Secret {
        self.derive(LABEL_SERVICE)
    }

    /// Short, non-secret fingerprint for logs and listings (first 8 bytes of a derived MAC).
    pub fn fingerprint(&self) -> String {
        let m = self.mac(&[b"fastblock-v1 fingerprint"]);
        m[..8].iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Whether two byte strings are equal, in time that depends only on their lengths (so a
/// forger learns nothing from how long a refusal takes).
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// `N` random bytes from the operating system.
pub fn random_bytes<const N: usize>() -> Result<[u8; N], AuthError> {
    let mut out = [0u8; N];
    SystemRandom::new()
        .fill(&mut out)
        .map_err(|_| AuthError::Random)?;
    Ok(out)
}

const NONCE_BYTES: usize = 12;
const TAG_BYTES: usize = 16;

/// What a sealed key is bound to (the AEAD's associated data): the entity it belongs to, its
/// caps and generation, and the key-table epoch it was sealed at. A sealed key relabelled
/// (given to another entity, other caps, an older generation or table) does not open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyBinding<'a> {
    pub entity: &'a str,
    pub caps: &'a str,
    pub generation: u64,
    pub epoch: u64,
}

impl KeyBinding<'_> {
    fn aad(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.entity.len() + self.caps.len());
        out.extend_from_slice(b"fastblock-v2 blob");
        for text in [self.entity, self.caps] {
            out.extend_from_slice(&(text.len() as u64).to_le_bytes());
            out.extend_from_slice(text.as_bytes());
        }
        out.extend_from_slice(&self.generation.to_le_bytes());
        out.extend_from_slice(&self.epoch.to_le_bytes());
        out
    }
}

/// Encrypts `plaintext` for the owner of `owner_key` (an entity key or its monitor key),
/// bound to `binding`: `nonce (12) || ciphertext || tag (16)`, AES-256-GCM under a key derived
/// from it. Used to send keys over the monitor API, which is signed but not encrypted.
pub fn seal_blob(
    owner_key: &Secret,
    plaintext: &[u8],
    binding: &KeyBinding<'_>,
) -> Result<Vec<u8>, AuthError> {
    seal_with_aad(&blob_key(owner_key), plaintext, &binding.aad())
}

/// Opens what [`seal_blob`] made for `owner_key` with the same `binding`.
pub fn open_blob(
    owner_key: &Secret,
    sealed: &[u8],
    binding: &KeyBinding<'_>,
) -> Result<Vec<u8>, AuthError> {
    open_with_aad(&blob_key(owner_key), sealed, &binding.aad())
        .map_err(|_| AuthError::BadSignature(format!("sealed key of {}", binding.entity)))
}

/// `nonce (12) || ciphertext || tag (16)`: AES-256-GCM of `plaintext` under `key` with a
/// fresh random nonce, `aad` as associated data.
pub(crate) fn seal_with_aad(
    key: &LessSafeKey,
    plaintext: &[u8],
    aad: &[u8],
) -> Result<Vec<u8>, AuthError> {
    let nonce_bytes = random_bytes::<NONCE_BYTES>()?;
    let mut buf = plaintext.to_vec();
    let tag = key
        .seal_in_place_separate_tag(
            Nonce::assume_unique_for_key(nonce_bytes),
            aead::Aad::from(aad),
            &mut buf,
        )
        .map_err(|_| AuthError::Random)?;
    let mut out = Vec::with_capacity(NONCE_BYTES + buf.len() + TAG_BYTES);
    out.extend_from_slice(&nonce_bytes);
    out.extend_from_slice(&buf);
    out.extend_from_slice(tag.as_ref());
    Ok(out)
}

/// Opens what [`seal_with_aad`] made under `key` with the same `aad`; an error names no
/// cause beyond "does not open" (the caller says what it was opening).
pub(crate) fn open_with_aad(
    key: &LessSafeKey,
    sealed: &[u8],
    aad: &[u8],
) -> Result<Vec<u8>, AuthError> {
    if sealed.len() < NONCE_BYTES + TAG_BYTES {
        return Err(AuthError::Malformed(format!(
            "sealed blob of {} bytes is shorter than its nonce and tag",
            sealed.len()
        )));
    }
    let (nonce, rest) = sealed.split_at(NONCE_BYTES);
    let nonce: [u8; NONCE_BYTES] = nonce.try_into().expect("split at 12");
    let mut buf = rest.to_vec();
    let plain = key
        .open_in_place(
            Nonce::assume_unique_for_key(nonce),
            aead::Aad::from(aad),
            &mut buf,
        )
        .map_err(|_| AuthError::BadSignature("a sealed blob".into()))?;
    Ok(plain.to_vec())
}

/// The AES-256-GCM key for blobs sealed for the owner of `owner_key`.
pub(crate) fn blob_key(owner_key: &Secret) -> LessSafeKey {
    aead_key(&owner_key.derive(LABEL_SEAL))
}

pub(crate) fn aead_key(k: &Secret) -> LessSafeKey {
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, k.as_bytes()).expect("32-byte AES key"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_through_base64_and_reject_bad_text() {
        let k = Secret::generate().unwrap();
        assert_eq!(Secret::from_base64(&k.to_base64()).unwrap(), k);
        assert!(matches!(
            Secret::from_base64("not base64!"),
            Err(AuthError::BadKey(_))
        ));
        assert!(matches!(
            Secret::from_base64("AAAA"),
            Err(AuthError::BadKey(_))
        ));
        assert_eq!(format!("{k:?}"), "Secret(..)");
    }

    #[test]
    fn derived_keys_differ_by_purpose_and_macs_separate_parts() {
        let k = Secret::from_bytes([7; 32]);
        assert_ne!(k.mon_key(), k.service_key());
        assert_ne!(k.mon_key(), k);
        // Length prefixes: ("ab","c") and ("a","bc") are different messages.
        assert_ne!(k.mac(&[b"ab", b"c"]), k.mac(&[b"a", b"bc"]));
        let tag = k.mac(&[b"x"]);
        assert!(k.verify_mac(&[b"x"], &tag));
        assert!(!k.verify_mac(&[b"y"], &tag));
        assert!(!Secret::from_bytes([8; 32]).verify_mac(&[b"x"], &tag));
    }

    #[test]
    fn a_sealed_blob_opens_only_with_its_owners_key_and_unaltered() {
        let owner = Secret::generate().unwrap();
        let bound = KeyBinding {
            entity: "client.vm",
            caps: "pool=a",
            generation: 3,
            epoch: 9,
        };
        let sealed = seal_blob(&owner, b"the key", &bound).unwrap();
        assert_eq!(open_blob(&owner, &sealed, &bound).unwrap(), b"the key");
        assert!(open_blob(&Secret::generate().unwrap(), &sealed, &bound).is_err());
        let mut altered = sealed.clone();
        altered[14] ^= 1;
        assert!(open_blob(&owner, &altered, &bound).is_err());
        assert!(open_blob(&owner, &sealed[..10], &bound).is_err());
        // Relabelled: another entity, other caps, an older generation or table.
        for other in [
            KeyBinding {
                entity: "osd.1",
                ..bound.clone()
            },
            KeyBinding {
                caps: "admin osd",
                ..bound.clone()
            },
            KeyBinding {
                generation: 2,
                ..bound.clone()
            },
            KeyBinding {
                epoch: 8,
                ..bound.clone()
            },
        ] {
            assert!(open_blob(&owner, &sealed, &other).is_err(), "{other:?}");
        }
    }
}

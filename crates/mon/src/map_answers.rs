//! Map answers shared between the holders of one scope. Every client of a pool follows the
//! same scope (`MapScope::Pools`), so at an epoch the clients at the same starting epoch get
//! the same answer: at 131,072 PGs a host going out is a delta of 1.2 MB of JSON for each of
//! them (some 300 KB gzipped), which the monitor cut, encoded and compressed once per client.
//! Here it is cut and encoded once per (epoch, starting epoch, scope), and compressed once
//! ([`Encoded::gzip`], used by `crate::compress`); each answer is still signed for its own
//! call. An OSD's scope is its own, so OSD answers are not kept.
//!
//! Bounded: at most [`SHARED_ANSWERS_MAX`] answers, all of the current epoch (an answer of an
//! earlier epoch is dropped at the first answer of a later one).

use axum::body::Bytes;
use fastblock_types::map_delta::MapScope;
use fastblock_types::Epoch;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, OnceLock};

/// Answers kept: a few pools' clients at a few starting epochs.
pub const SHARED_ANSWERS_MAX: usize = 16;

/// What identifies an answer: the epoch it brings the holder to, the holder's epoch, its scope.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AnswerKey {
    pub epoch: Epoch,
    pub have: Epoch,
    pub scope: MapScope,
}

/// One answer's JSON body, and its gzip once a caller that accepts gzip needed it.
#[derive(Debug)]
pub struct Encoded {
    pub json: Bytes,
    gzip: OnceLock<Bytes>,
}

impl Encoded {
    pub fn new(json: Bytes) -> Self {
        Encoded {
            json,
            gzip: OnceLock::new(),
        }
    }

    /// The body gzipped (`crate::compress::gzip`), compressed by the first caller that asks.
    pub fn gzip(&self) -> &Bytes {
        self.gzip
            .get_or_init(|| Bytes::from(crate::compress::gzip(&self.json)))
    }
}

/// The answer a response carries when its body is a shared one: the compression layer takes
/// its gzip from here instead of compressing the body again.
#[derive(Clone, Debug)]
pub struct SharedAnswer(pub Arc<Encoded>);

type Slot = Arc<OnceLock<Option<Arc<Encoded>>>>;

/// See the module documentation.
#[derive(Debug, Default)]
pub struct SharedAnswers {
    slots: Mutex<VecDeque<(AnswerKey, Slot)>>,
}

impl SharedAnswers {
    /// The answer for `key`, encoded by `encode` if no holder of that key asked yet (`None`:
    /// nothing to share, as for a holder up to date). Holders asking together wait for the
    /// one that encodes, rather than each encoding it.
    pub fn get_or_encode(
        &self,
        key: AnswerKey,
        encode: impl FnOnce() -> Option<Bytes>,
    ) -> Option<Arc<Encoded>> {
        let slot = {
            let mut slots = self.slots.lock().expect("shared answers lock");
            slots.retain(|(k, _)| k.epoch >= key.epoch);
            match slots.iter().find(|(k, _)| *k == key) {
                Some((_, slot)) => slot.clone(),
                None => {
                    if slots.len() == SHARED_ANSWERS_MAX {
                        slots.pop_front();
                    }
                    let slot = Slot::default();
                    slots.push_back((key, slot.clone()));
                    slot
                }
            }
        };
        slot.get_or_init(|| encode().map(|json| Arc::new(Encoded::new(json))))
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fastblock_types::PoolId;
    use std::cell::Cell;

    fn key(epoch: u64, have: u64, pool: u32) -> AnswerKey {
        AnswerKey {
            epoch: Epoch(epoch),
            have: Epoch(have),
            scope: MapScope::Pools([PoolId(pool)].into()),
        }
    }

    /// Goal: holders of one key share one encoding and one compression; another key, and a
    /// later epoch, encode anew; earlier epochs are dropped; the count stays bounded.
    /// Method: count the encodings.
    #[test]
    fn one_encoding_per_key_and_epoch() {
        let answers = SharedAnswers::default();
        let encoded = Cell::new(0);
        let encode = |body: &'static str| {
            encoded.set(encoded.get() + 1);
            Some(Bytes::from_static(body.as_bytes()))
        };
        let a = answers.get_or_encode(key(5, 4, 1), || encode("a")).unwrap();
        let b = answers.get_or_encode(key(5, 4, 1), || encode("b")).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(encoded.get(), 1);
        assert!(std::ptr::eq(a.gzip(), b.gzip()), "compressed once");
        let mut plain = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&a.gzip()[..]), &mut plain)
            .unwrap();
        assert_eq!(plain, b"a");
        answers.get_or_encode(key(5, 3, 1), || encode("c")).unwrap();
        answers.get_or_encode(key(5, 4, 2), || encode("d")).unwrap();
        assert_eq!(encoded.get(), 3);
        assert!(answers.get_or_encode(key(5, 5, 1), || None).is_none());
        // A later epoch drops the earlier answers.
        answers.get_or_encode(key(6, 5, 1), || encode("e")).unwrap();
        assert_eq!(answers.slots.lock().unwrap().len(), 1);
        for have in 0..(SHARED_ANSWERS_MAX as u64 + 5) {
            answers.get_or_encode(key(6, have, 3), || encode("f"));
        }
        assert_eq!(answers.slots.lock().unwrap().len(), SHARED_ANSWERS_MAX);
    }
}

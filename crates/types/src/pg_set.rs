//! The JSON form of a set of PG sequence numbers (the PGs that confirmed a reclaim entry, a
//! snapshot's mark or a snapshot trim: `done_pgs`):
//! - an array of sequence numbers, `[0,1,5]`, while the set has at most
//!   [`ARRAY_SEQS_MAX`] elements or the array is the shorter form;
//! - else a bitmap, as a base64 string: bit `s % 8` of byte `s / 8` set for sequence number `s`,
//!   trailing zero bytes left out. A pool's whole set fits in 16 KiB (22 KB of base64) at the
//!   largest PG count, where the array would be some 900 KB: such a set stays far below one
//!   etcd request (1.5 MiB), and so does a map delta that carries it.
//!
//! Either form reads back; a sequence number at or past `PG_SEQ_LIMIT` (or a bitmap longer
//! than that many bits) is refused, so a forged or damaged value cannot make a reader build a
//! huge set.

use base64::Engine as _;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeSet;

/// Sequence numbers are below this: the largest PG count a pool may have
/// (`fastblock_placement::PG_COUNT_MAX`, which this crate cannot name).
pub const PG_SEQ_LIMIT: u32 = 1 << 17;

/// Sets this small are always arrays, the form a reader takes in at a glance.
pub const ARRAY_SEQS_MAX: usize = 64;
/// Bytes of the array form per element, about (digits and a comma, for large pools).
const ARRAY_BYTES_PER_SEQ: usize = 7;

#[derive(Deserialize)]
#[serde(untagged)]
enum Form {
    Array(Vec<u32>),
    Bitmap(String),
}

/// `#[serde(with = "crate::pg_set")]` for a `BTreeSet<u32>` of PG sequence numbers.
pub fn serialize<S: Serializer>(set: &BTreeSet<u32>, s: S) -> Result<S::Ok, S::Error> {
    let bitmap_len = set.last().map_or(0, |max| *max as usize / 8 + 1);
    let base64_len = bitmap_len.div_ceil(3) * 4;
    if set.len() <= ARRAY_SEQS_MAX || set.len() * ARRAY_BYTES_PER_SEQ <= base64_len {
        return set.serialize(s);
    }
    let mut bytes = vec![0u8; bitmap_len];
    for seq in set {
        bytes[*seq as usize / 8] |= 1 << (seq % 8);
    }
    base64::engine::general_purpose::STANDARD
        .encode(bytes)
        .serialize(s)
}

pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeSet<u32>, D::Error> {
    match Form::deserialize(d)? {
        Form::Array(seqs) => {
            if let Some(bad) = seqs.iter().find(|s| **s >= PG_SEQ_LIMIT) {
                return Err(D::Error::custom(format!(
                    "PG sequence number {bad} is not below {PG_SEQ_LIMIT}"
                )));
            }
            Ok(seqs.into_iter().collect())
        }
        Form::Bitmap(text) => {
            // Checked before decoding: base64 takes 4 characters per 3 bytes.
            let limit_bytes = PG_SEQ_LIMIT as usize / 8;
            if text.len() > limit_bytes.div_ceil(3) * 4 {
                return Err(D::Error::custom(format!(
                    "a PG bitmap of {} base64 characters is longer than {PG_SEQ_LIMIT} bits",
                    text.len()
                )));
            }
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(text.as_bytes())
                .map_err(|e| D::Error::custom(format!("a PG bitmap is not base64: {e}")))?;
            if bytes.len() > limit_bytes {
                return Err(D::Error::custom(format!(
                    "a PG bitmap of {} bytes is longer than {PG_SEQ_LIMIT} bits",
                    bytes.len()
                )));
            }
            Ok(bytes
                .iter()
                .enumerate()
                .flat_map(|(i, byte)| {
                    (0..8u32)
                        .filter(move |bit| byte & (1 << bit) != 0)
                        .map(move |bit| i as u32 * 8 + bit)
                })
                .collect())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Holder {
        #[serde(with = "crate::pg_set")]
        done: BTreeSet<u32>,
    }

    fn json(done: impl IntoIterator<Item = u32>) -> String {
        serde_json::to_string(&Holder {
            done: done.into_iter().collect(),
        })
        .unwrap()
    }

    #[test]
    fn small_sets_are_arrays_and_large_ones_bitmaps_of_bounded_size() {
        assert_eq!(json([]), r#"{"done":[]}"#);
        assert_eq!(json([0, 1, 5]), r#"{"done":[0,1,5]}"#);
        // Every PG of the largest pool: 16 KiB of bits, 21,848 characters of base64.
        let all = json(0..PG_SEQ_LIMIT);
        assert!(all.len() < 22_000, "{}", all.len());
        assert!(all.starts_with(r#"{"done":"//////"#), "{}", &all[..20]);
        // Half of them, every other one: the same bound.
        assert!(json((0..PG_SEQ_LIMIT).step_by(2)).len() < 22_000);
    }

    #[test]
    fn either_form_reads_back_and_bad_values_are_refused_with_the_reason() {
        let read = |text: &str| serde_json::from_str::<Holder>(text).map(|h| h.done);
        assert_eq!(read(r#"{"done":[3,1]}"#).unwrap(), [1, 3].into());
        assert_eq!(read(r#"{"done":"Ig=="}"#).unwrap(), [1, 5].into());
        let e = read(r#"{"done":[131072]}"#).unwrap_err().to_string();
        assert!(e.contains("not below 131072"), "{e}");
        let e = read(r#"{"done":"not base64!"}"#).unwrap_err().to_string();
        assert!(e.contains("not base64"), "{e}");
        let long = format!(r#"{{"done":"{}"}}"#, "A".repeat(30_000));
        let e = read(&long).unwrap_err().to_string();
        assert!(e.contains("longer than 131072 bits"), "{e}");
    }

    proptest! {
        #[test]
        fn any_set_round_trips(
            seqs in proptest::collection::btree_set(0u32..PG_SEQ_LIMIT, 0..3000),
            dense_from in 0u32..PG_SEQ_LIMIT,
            dense_len in 0u32..5000,
        ) {
            let mut done = seqs;
            done.extend(dense_from..(dense_from + dense_len).min(PG_SEQ_LIMIT));
            let text = serde_json::to_string(&Holder { done: done.clone() }).unwrap();
            let back: Holder = serde_json::from_str(&text).unwrap();
            prop_assert_eq!(back.done, done);
        }
    }
}

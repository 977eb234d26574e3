//! A bounds-checked big-endian reader over a byte slice.
//!
//! Why big-endian here when the workspace denies `big_endian_bytes`: the NBD protocol fixes
//! network byte order for every field, and this module is the only place that reads it.
//! Why not `bytes::Buf`: its getters panic on a short buffer, and the parsers must never panic
//! on what a client sends.
#![allow(clippy::big_endian_bytes)]

/// A field ran past the end of its message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{what} needs {need} bytes, {have} left")]
pub struct Short {
    pub what: &'static str,
    pub need: usize,
    pub have: usize,
}

pub struct BeReader<'a> {
    bytes: &'a [u8],
}

impl<'a> BeReader<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        BeReader { bytes }
    }

    pub fn remaining(&self) -> usize {
        self.bytes.len()
    }

    pub fn take(&mut self, count: usize, what: &'static str) -> Result<&'a [u8], Short> {
        if count > self.bytes.len() {
            return Err(Short {
                what,
                need: count,
                have: self.bytes.len(),
            });
        }
        let (head, rest) = self.bytes.split_at(count);
        self.bytes = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], Short> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    pub fn u16(&mut self, what: &'static str) -> Result<u16, Short> {
        Ok(u16::from_be_bytes(self.array(what)?))
    }

    pub fn u32(&mut self, what: &'static str) -> Result<u32, Short> {
        Ok(u32::from_be_bytes(self.array(what)?))
    }

    pub fn u64(&mut self, what: &'static str) -> Result<u64, Short> {
        Ok(u64::from_be_bytes(self.array(what)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_network_order_and_refuses_short_input() {
        let mut r = BeReader::new(&[0, 1, 0, 0, 0, 2, 9]);
        assert_eq!(r.u16("a"), Ok(1));
        assert_eq!(r.u32("b"), Ok(2));
        assert_eq!(
            r.u16("c"),
            Err(Short {
                what: "c",
                need: 2,
                have: 1
            })
        );
        assert_eq!(r.remaining(), 1);
    }
}

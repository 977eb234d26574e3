//! Explicit little-endian encoding helpers. Decoding never panics on disk input: every read is
//! bounds-checked and returns `None` past the end.

pub(crate) fn put_u8(out: &mut Vec<u8>, v: u8) {
    out.push(v);
}
pub(crate) fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}
pub(crate) fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}
pub(crate) fn put_u64_list(out: &mut Vec<u8>, v: &[u64]) {
    put_u32(out, u32::try_from(v.len()).expect("list length fits u32"));
    for x in v {
        put_u64(out, *x);
    }
}

/// Writes `v` at `at` inside an already sized buffer.
pub(crate) fn set_u32(buf: &mut [u8], at: usize, v: u32) {
    buf[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn set_u64(buf: &mut [u8], at: usize, v: u64) {
    buf[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn get_u32(buf: &[u8], at: usize) -> Option<u32> {
    let b = buf.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes(b.try_into().ok()?))
}
pub(crate) fn get_u64(buf: &[u8], at: usize) -> Option<u64> {
    let b = buf.get(at..at.checked_add(8)?)?;
    Some(u64::from_le_bytes(b.try_into().ok()?))
}

/// A bounds-checked cursor over untrusted bytes.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }
    pub(crate) fn u8(&mut self) -> Option<u8> {
        let v = *self.buf.get(self.pos)?;
        self.pos += 1;
        Some(v)
    }
    pub(crate) fn u32(&mut self) -> Option<u32> {
        let v = get_u32(self.buf, self.pos)?;
        self.pos += 4;
        Some(v)
    }
    pub(crate) fn u64(&mut self) -> Option<u64> {
        let v = get_u64(self.buf, self.pos)?;
        self.pos += 8;
        Some(v)
    }
    pub(crate) fn bytes(&mut self, len: usize) -> Option<&'a [u8]> {
        let b = self.buf.get(self.pos..self.pos.checked_add(len)?)?;
        self.pos += len;
        Some(b)
    }
    /// A u64 list whose claimed length must fit in what is left (no huge allocation from a
    /// corrupt count).
    pub(crate) fn u64_list(&mut self) -> Option<Vec<u64>> {
        let n = self.u32()? as usize;
        if n > self.remaining() / 8 {
            return None;
        }
        (0..n).map(|_| self.u64()).collect()
    }
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    pub(crate) fn is_empty(&self) -> bool {
        self.remaining() == 0
    }
}

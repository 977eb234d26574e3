//! A heap buffer aligned for O_DIRECT (4 KiB, which also satisfies 512 B devices).

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

pub const BUF_ALIGN_BYTES: usize = 4096;

pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    capacity: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out &[u8].
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes.
    pub fn zeroed(len: usize) -> Self {
        let capacity = len.max(1).next_multiple_of(BUF_ALIGN_BYTES);
        let layout = Layout::from_size_align(capacity, BUF_ALIGN_BYTES).expect("valid layout");
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len, capacity }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Changes the length within the capacity, leaving whatever bytes were there (zeros, or
    /// what an earlier, longer length held): for a caller that overwrites all of the new
    /// bytes at once, where zeroing them first was a memset per WAL record. The bytes are
    /// always initialised (the buffer is allocated zeroed), so this is no unsafety, only
    /// unspecified content until overwritten.
    pub fn set_len_for_overwrite(&mut self, len: usize) {
        assert!(
            len <= self.capacity,
            "length {len} beyond capacity {}",
            self.capacity
        );
        self.len = len;
    }

    /// Changes the length within the capacity; new bytes are zero.
    pub fn resize(&mut self, len: usize) {
        assert!(
            len <= self.capacity,
            "resize {len} beyond capacity {}",
            self.capacity
        );
        if len > self.len {
            let old = self.len;
            self.len = len;
            self[old..].fill(0);
        } else {
            self.len = len;
        }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for `capacity >= len` initialised (zeroed) bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.capacity, BUF_ALIGN_BYTES).expect("valid layout");
        // SAFETY: allocated in `zeroed` with this exact layout.
        unsafe { dealloc(self.ptr.as_ptr(), layout) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::AlignedBuf;

    #[test]
    fn resize_zeroes_new_bytes_and_set_len_for_overwrite_keeps_them() {
        let mut buf = AlignedBuf::zeroed(8192);
        assert!(buf.iter().all(|b| *b == 0));
        buf.fill(7);
        buf.resize(0);
        buf.resize(4096);
        assert!(buf.iter().all(|b| *b == 0), "resize must zero what it adds");
        buf.fill(9);
        buf.resize(0);
        buf.set_len_for_overwrite(8192);
        assert!(buf[..4096].iter().all(|b| *b == 9));
        assert!(buf[4096..].iter().all(|b| *b == 7));
        assert_eq!(buf.len(), 8192);
    }

    #[test]
    #[should_panic(expected = "beyond capacity")]
    fn set_len_for_overwrite_stays_within_the_capacity() {
        let mut buf = AlignedBuf::zeroed(4096);
        buf.set_len_for_overwrite(4097);
    }
}

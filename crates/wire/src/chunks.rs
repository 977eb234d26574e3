//! Queues of byte chunks handed to vectored writes: which chunks a write took, so the next
//! write starts where the socket stopped. The client's connection task and the NBD server's
//! reply queue both write frames this way.

use bytes::{Buf, Bytes};
use std::collections::VecDeque;

/// Drops the first `written` bytes of `chunks`: whole chunks the write took, and the start of
/// the chunk it stopped in.
///
/// # Panics
/// If `written` is more than the chunks hold (a caller bug: a write cannot take more than it
/// was given).
pub fn advance_chunks(chunks: &mut VecDeque<Bytes>, mut written: usize) {
    while written > 0 {
        let first = chunks.front_mut().expect("written bytes were queued");
        if written >= first.len() {
            written -= first.len();
            chunks.pop_front();
        } else {
            first.advance(written);
            written = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_chunks_go_and_a_partial_one_keeps_its_rest() {
        let mut q: VecDeque<Bytes> = ["abc", "de", "fghi"]
            .iter()
            .map(|s| Bytes::from_static(s.as_bytes()))
            .collect();
        advance_chunks(&mut q, 0);
        assert_eq!(q.len(), 3);
        advance_chunks(&mut q, 4);
        assert_eq!(q, [Bytes::from_static(b"e"), Bytes::from_static(b"fghi")]);
        advance_chunks(&mut q, 3);
        assert_eq!(q, [Bytes::from_static(b"hi")]);
        advance_chunks(&mut q, 2);
        assert!(q.is_empty());
    }

    #[test]
    #[should_panic(expected = "written bytes were queued")]
    fn more_than_queued_is_a_caller_bug() {
        let mut q: VecDeque<Bytes> = [Bytes::from_static(b"ab")].into_iter().collect();
        advance_chunks(&mut q, 3);
    }
}

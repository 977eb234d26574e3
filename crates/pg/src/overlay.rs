//! [`OverlayStorage`]: the driver's storage plus the entries handed out in log writes that the
//! driver has not persisted yet.
//!
//! Why: with raft-rs's asynchronous ready, `advance_append_async` moves the ready's entries out
//! of Raft's unstable log at once, and from then on Raft reads them through `Storage` (its last
//! index, their terms, entries to send to followers) — before the driver has written them,
//! which it does for all PGs together later in its loop iteration. TiKV solves this by putting
//! the entries into its storage's in-memory cache right away; we keep the core free of I/O by
//! serving them from this overlay until `on_persisted` says the driver's storage has them.
//!
//! The overlay shadows the inner storage from its first index on: a follower's new entries
//! that replace a conflicting suffix hide the old ones even before the driver truncates them.

use raft::eraftpb::{Entry, Snapshot, SnapshotMetadata};
use raft::{GetEntriesContext, RaftState, Storage, StorageError};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;

#[derive(Default, Debug)]
pub struct Overlay {
    /// Not yet persisted entries, contiguous, each with the ready number that wrote it.
    entries: VecDeque<(u64, Entry)>,
    /// A snapshot handed out but not yet persisted: (ready number, metadata).
    snapshot: Option<(u64, SnapshotMetadata)>,
}

impl Overlay {
    /// Records a ready's log write (called before `advance_append_async`).
    pub fn push(&mut self, number: u64, snapshot: Option<&Snapshot>, entries: &[Entry]) {
        if let Some(s) = snapshot {
            self.entries.clear();
            self.snapshot = Some((number, s.get_metadata().clone()));
        }
        if let Some(first) = entries.first() {
            while self
                .entries
                .back()
                .is_some_and(|(_, e)| e.index >= first.index)
            {
                self.entries.pop_back();
            }
            if let Some((_, last)) = self.entries.back() {
                assert_eq!(
                    last.index + 1,
                    first.index,
                    "overlay entries must stay contiguous"
                );
            }
            for e in entries {
                self.entries.push_back((number, e.clone()));
            }
        }
    }

    /// Everything written by readies up to `number` is now in the inner storage.
    pub fn persisted(&mut self, number: u64) {
        while self.entries.front().is_some_and(|(n, _)| *n <= number) {
            self.entries.pop_front();
        }
        if self.snapshot.as_ref().is_some_and(|(n, _)| *n <= number) {
            self.snapshot = None;
        }
    }

    fn first(&self) -> Option<u64> {
        self.entries.front().map(|(_, e)| e.index)
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.snapshot.is_none()
    }
}

pub struct OverlayStorage<S: Storage> {
    pub inner: S,
    pub overlay: Rc<RefCell<Overlay>>,
}

impl<S: Storage> Storage for OverlayStorage<S> {
    fn initial_state(&self) -> raft::Result<RaftState> {
        self.inner.initial_state()
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        let max_size = max_size.into();
        let o = self.overlay.borrow();
        if let Some((_, md)) = &o.snapshot {
            if low <= md.index {
                return Err(raft::Error::Store(StorageError::Compacted));
            }
        }
        let split = o.first().unwrap_or(u64::MAX);
        let mut out = if low < split {
            let inner_high = high.min(split);
            if o.snapshot.is_some() && o.first().is_none() {
                Vec::new()
            } else {
                self.inner.entries(low, inner_high, max_size, context)?
            }
        } else {
            Vec::new()
        };
        let mut size: u64 = out
            .iter()
            .map(|e| protobuf::Message::compute_size(e) as u64)
            .sum();
        let inner_complete = out.last().is_none_or(|e| e.index + 1 >= split.min(high));
        if inner_complete && high > split {
            for (_, e) in o
                .entries
                .iter()
                .filter(|(_, e)| e.index >= low && e.index < high)
            {
                let s = protobuf::Message::compute_size(e) as u64;
                if !out.is_empty() && max_size.is_some_and(|m| size + s > m) {
                    break;
                }
                size += s;
                out.push(e.clone());
            }
        }
        Ok(out)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        let o = self.overlay.borrow();
        if let Some((_, md)) = &o.snapshot {
            if idx == md.index {
                return Ok(md.term);
            }
            if idx < md.index {
                return Err(raft::Error::Store(StorageError::Compacted));
            }
        }
        if let Some(first) = o.first() {
            if idx >= first {
                return match o.entries.get((idx - first) as usize) {
                    Some((_, e)) => Ok(e.term),
                    None => Err(raft::Error::Store(StorageError::Unavailable)),
                };
            }
        }
        drop(o);
        self.inner.term(idx)
    }

    fn first_index(&self) -> raft::Result<u64> {
        if let Some((_, md)) = &self.overlay.borrow().snapshot {
            return Ok(md.index + 1);
        }
        self.inner.first_index()
    }

    fn last_index(&self) -> raft::Result<u64> {
        let o = self.overlay.borrow();
        if let Some((_, e)) = o.entries.back() {
            return Ok(e.index);
        }
        if let Some((_, md)) = &o.snapshot {
            return Ok(md.index);
        }
        drop(o);
        self.inner.last_index()
    }

    fn snapshot(&self, request_index: u64, to: u64) -> raft::Result<Snapshot> {
        self.inner.snapshot(request_index, to)
    }
}

//! WAL commits in flight on the io_uring disk ([`super::Disk::submit_durable`]).
//!
//! Each commit is a few writes and, once they have all completed, an fdatasync of its own
//! (the two-step order `SyncMode::TwoStep` measured fastest; with `SyncMode::DsyncWrites` the
//! writes carry RWF_DSYNC and need none; with `SyncMode::NoFlushBenchmarkOnly` they carry
//! nothing and get none: a commit is reported once its writes completed). Commits finish in any order but are reported in
//! submission order, so "commit k is durable" always means every earlier one is too. A
//! commit's buffers stay here until all of its operations completed, so the kernel never
//! touches freed memory. An operation a signal interrupted (-EINTR, -EAGAIN) is submitted
//! again, as the synchronous path does.

use super::AlignedBuf;
use io_uring::{opcode, types, IoUring};
use std::collections::VecDeque;
use std::io;

/// Tags the user data of commit operations (bit 63 tags background writes).
pub(super) const COMMIT_TAG: u64 = 1 << 62;
/// The slot of a commit's fdatasync in its user data; writes use slots below it.
const SYNC_SLOT: u64 = 0xFF;
/// Writes of one commit at most (a WAL commit has one or two).
pub(super) const WRITES_PER_COMMIT_MAX: usize = 8;
/// Resubmissions of one commit's interrupted operations before the error is returned.
const INTERRUPTED_RETRIES_MAX: u32 = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SyncState {
    /// Waits for the commit's writes.
    Waiting,
    /// Queued or submitted.
    Started,
    /// Completed (or skipped after a failed write).
    Done,
    /// None is issued: the writes are durable on their own (RWF_DSYNC), or flushes are
    /// skipped (`CommitSync::Skipped`).
    NotNeeded,
}

struct Commit {
    id: u64,
    writes: Vec<(u64, AlignedBuf)>,
    writes_left: usize,
    sync: SyncState,
    error: Option<io::Error>,
    retries: u32,
}

impl Commit {
    fn finished(&self) -> bool {
        self.writes_left == 0 && matches!(self.sync, SyncState::Done | SyncState::NotNeeded)
    }
}

/// What makes a commit's writes durable once they completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum CommitSync {
    /// An fdatasync of its own after its writes.
    Fdatasync,
    /// Each write carries RWF_DSYNC: durable when it completes.
    DsyncWrites,
    /// Nothing: the writes are reported as soon as they completed, in the device's volatile
    /// cache at best (`SyncMode::NoFlushBenchmarkOnly`, measurement only).
    Skipped,
}

pub(super) struct InFlight {
    fd: types::Fd,
    sync: CommitSync,
    commits: VecDeque<Commit>,
    next_id: u64,
    /// Operations to put on the ring: (commit id, slot).
    due: VecDeque<(u64, u64)>,
    /// fdatasyncs issued.
    pub(super) fsyncs: u64,
    /// Writes issued with RWF_DSYNC.
    pub(super) dsync_writes: u64,
}

fn interrupted(res: i32) -> bool {
    res == -libc::EINTR || res == -libc::EAGAIN
}

impl InFlight {
    pub(super) fn new(fd: types::Fd, sync: CommitSync) -> InFlight {
        InFlight {
            fd,
            sync,
            commits: VecDeque::new(),
            next_id: 0,
            due: VecDeque::new(),
            fsyncs: 0,
            dsync_writes: 0,
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.commits.is_empty()
    }

    /// Whether the oldest commit finished: [`InFlight::take_done`] has something to report.
    pub(super) fn front_finished(&self) -> bool {
        self.commits.front().is_some_and(Commit::finished)
    }

    pub(super) fn owns(user_data: u64) -> bool {
        user_data & COMMIT_TAG != 0
    }

    /// Queues a commit; [`InFlight::push`] puts its writes on the ring.
    pub(super) fn add(&mut self, writes: Vec<(u64, AlignedBuf)>) {
        assert!(
            !writes.is_empty() && writes.len() <= WRITES_PER_COMMIT_MAX,
            "a commit of {} writes",
            writes.len()
        );
        let id = self.next_id;
        self.next_id += 1;
        for slot in 0..writes.len() {
            self.due.push_back((id, slot as u64));
        }
        self.commits.push_back(Commit {
            id,
            writes_left: writes.len(),
            writes,
            sync: match self.sync {
                CommitSync::Fdatasync => SyncState::Waiting,
                CommitSync::DsyncWrites | CommitSync::Skipped => SyncState::NotNeeded,
            },
            error: None,
            retries: 0,
        });
    }

    fn commit_mut(&mut self, id: u64) -> &mut Commit {
        let first = self.commits.front().expect("a commit in flight").id;
        let at = id
            .checked_sub(first)
            .expect("completion of a reported commit") as usize;
        let c = &mut self.commits[at];
        assert_eq!(c.id, id, "commits out of order");
        c
    }

    /// Records one completion of a commit operation.
    pub(super) fn complete(&mut self, user_data: u64, res: i32) {
        let id = (user_data & !COMMIT_TAG) >> 8;
        let slot = user_data & 0xFF;
        let c = self.commit_mut(id);
        if interrupted(res) && c.retries < INTERRUPTED_RETRIES_MAX {
            c.retries += 1;
            self.due.push_back((id, slot));
            return;
        }
        let failure = if res < 0 {
            Some(io::Error::from_raw_os_error(-res))
        } else if slot != SYNC_SLOT && res as usize != c.writes[slot as usize].1.len() {
            Some(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "short WAL commit write: {res} of {} bytes",
                    c.writes[slot as usize].1.len()
                ),
            ))
        } else {
            None
        };
        if let Some(e) = failure {
            c.error.get_or_insert(e);
        }
        if slot == SYNC_SLOT {
            assert_eq!(c.sync, SyncState::Started, "an fdatasync nobody started");
            c.sync = SyncState::Done;
            return;
        }
        assert!(c.writes_left > 0, "more write completions than writes");
        c.writes_left -= 1;
        if c.writes_left == 0 && c.sync == SyncState::Waiting {
            if c.error.is_some() {
                // Failed: nothing to make durable; it is reported as failed.
                c.sync = SyncState::Done;
            } else {
                c.sync = SyncState::Started;
                self.due.push_back((id, SYNC_SLOT));
            }
        }
    }

    /// Puts the due operations on the ring and submits them (without waiting).
    pub(super) fn push(&mut self, ring: &mut IoUring) -> io::Result<()> {
        if self.due.is_empty() {
            return Ok(());
        }
        {
            let mut sq = ring.submission();
            while let Some(&(id, slot)) = self.due.front() {
                if sq.is_full() {
                    break; // the rest goes out at the next push
                }
                let user_data = COMMIT_TAG | (id << 8) | slot;
                let sqe = if slot == SYNC_SLOT {
                    self.fsyncs += 1;
                    opcode::Fsync::new(self.fd)
                        .flags(types::FsyncFlags::DATASYNC)
                        .build()
                        .user_data(user_data)
                } else {
                    let dsync = self.sync == CommitSync::DsyncWrites;
                    if dsync {
                        self.dsync_writes += 1;
                    }
                    let fd = self.fd;
                    let (offset, buf) = &self.commit_mut(id).writes[slot as usize];
                    let mut op =
                        opcode::Write::new(fd, buf.as_ptr(), buf.len() as u32).offset(*offset);
                    if dsync {
                        op = op.rw_flags(libc::RWF_DSYNC);
                    }
                    op.build().user_data(user_data)
                };
                // SAFETY: the buffer belongs to a commit in `self.commits`, which is removed
                // (and its buffers freed) only once every operation of it completed.
                unsafe { sq.push(&sqe) }.map_err(|_| io::Error::other("submission queue full"))?;
                self.due.pop_front();
            }
        }
        match ring.submit() {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Whether every commit finished (durable or failed).
    pub(super) fn all_finished(&self) -> bool {
        self.commits.iter().all(Commit::finished)
    }

    /// The error of a finished commit, if any (a copy: the original is reported by
    /// [`InFlight::take_done`]).
    pub(super) fn failure(&self) -> Option<io::Error> {
        self.commits.iter().find_map(|c| {
            c.error.as_ref().map(|e| match e.raw_os_error() {
                Some(code) => io::Error::from_raw_os_error(code),
                None => io::Error::new(e.kind(), e.to_string()),
            })
        })
    }

    /// Removes the finished commits at the front: how many, and their buffers. The first
    /// failed one is returned as the error instead.
    pub(super) fn take_done(&mut self) -> io::Result<(usize, Vec<AlignedBuf>)> {
        let mut count = 0;
        let mut bufs = Vec::new();
        while self.commits.front().is_some_and(Commit::finished) {
            if self.commits.front().is_some_and(|c| c.error.is_some()) && count > 0 {
                break; // the ones before it first; the failure at the next call
            }
            let c = self.commits.pop_front().expect("checked");
            if let Some(e) = c.error {
                return Err(e);
            }
            count += 1;
            bufs.extend(c.writes.into_iter().map(|(_, b)| b));
        }
        Ok((count, bufs))
    }
}

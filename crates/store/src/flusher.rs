//! The flusher thread: runs a flush's metadata commit ([`MetaCommit::run`]) off the thread
//! that owns the store, so that the OSD shard keeps serving IO during redb's page writes and
//! fsync (see `objects/commit.rs`).
//!
//! One commit at a time: the store prepares one, hands it over, and takes it back (with its
//! result) before preparing the next. The thread calls `notify` after each commit so the
//! owner's event loop wakes to finish it. It ends when the store drops its sender.
//!
//! The store talks to it through [`FlushRunner`], so an owner that must decide when a commit
//! finishes (the simulator, which explores flushes completing between any two steps of the
//! shard core) supplies its own runner instead of a thread.

use crate::error::{Error, Result};
use crate::objects::MetaCommit;
use std::sync::mpsc;
use std::time::{Duration, Instant};

type Done = (Box<MetaCommit>, Result<()>, Duration);

/// Runs flushes' metadata commits on the owner's behalf, one at a time.
pub trait FlushRunner {
    /// Hands over a prepared commit. Never called while [`FlushRunner::busy`].
    fn submit(&mut self, commit: MetaCommit);
    /// Whether a handed-over commit has not been taken back yet.
    fn busy(&self) -> bool;
    /// The handed-over commit, if it has finished (never blocks).
    fn try_finished(&mut self) -> Option<Finished>;
    /// Finishes the handed-over commit (waiting for it, or running it now), if any.
    fn wait(&mut self) -> Option<Finished>;
}

pub struct Flusher {
    jobs: Option<mpsc::Sender<Box<MetaCommit>>>,
    done: mpsc::Receiver<Done>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// When the commit now running was handed over.
    running_since: Option<Instant>,
}

/// A finished background commit, back on the owning thread.
pub struct Finished {
    /// `None` when the thread died with it (the result is then an error).
    pub commit: Option<MetaCommit>,
    pub result: Result<()>,
    /// How long the commit itself took on the flusher thread.
    pub commit_time: Duration,
    /// From hand-over to now (includes waiting for a CPU and for the owner to look).
    pub since_start: Duration,
}

impl Flusher {
    pub fn start(name: String, notify: Box<dyn Fn() + Send>) -> Result<Flusher> {
        let (jobs, rx) = mpsc::channel::<Box<MetaCommit>>();
        let (tx, done) = mpsc::channel::<Done>();
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                while let Ok(mut commit) = rx.recv() {
                    let start = Instant::now();
                    let result = commit.run();
                    if tx.send((commit, result, start.elapsed())).is_err() {
                        return;
                    }
                    notify();
                }
            })
            .map_err(|e| Error::Io {
                op: "spawn flusher thread",
                offset_bytes: 0,
                source: e,
            })?;
        Ok(Flusher {
            jobs: Some(jobs),
            done,
            thread: Some(thread),
            running_since: None,
        })
    }

    fn finished(&mut self, (commit, result, commit_time): Done, since: Instant) -> Finished {
        self.running_since = None;
        Finished {
            commit: Some(*commit),
            result,
            commit_time,
            since_start: since.elapsed(),
        }
    }

    /// The thread died (a panic in redb) with the commit: nothing to give back, so the store
    /// must stop. Reported as an I/O error, which fails the store.
    fn lost(&mut self, since: Instant) -> Finished {
        self.running_since = None;
        Finished {
            commit: None,
            result: Err(Error::Io {
                op: "metadata commit (flusher thread died)",
                offset_bytes: 0,
                source: std::io::Error::other("flusher thread died"),
            }),
            commit_time: Duration::ZERO,
            since_start: since.elapsed(),
        }
    }
}

impl FlushRunner for Flusher {
    fn busy(&self) -> bool {
        self.running_since.is_some()
    }

    fn submit(&mut self, commit: MetaCommit) {
        assert!(!self.busy(), "one background commit at a time");
        self.running_since = Some(Instant::now());
        let sent = self.jobs.as_ref().map(|j| j.send(Box::new(commit)));
        // The thread only exits when `jobs` is dropped or a send back fails (the receiver
        // is ours and alive), so a failed send means it panicked: say so on the next look.
        if !matches!(sent, Some(Ok(()))) {
            tracing::error!("flusher thread is gone");
        }
    }

    fn try_finished(&mut self) -> Option<Finished> {
        let since = self.running_since?;
        match self.done.try_recv() {
            Ok(d) => Some(self.finished(d, since)),
            Err(mpsc::TryRecvError::Empty) => None,
            Err(mpsc::TryRecvError::Disconnected) => Some(self.lost(since)),
        }
    }

    fn wait(&mut self) -> Option<Finished> {
        let since = self.running_since?;
        Some(match self.done.recv() {
            Ok(d) => self.finished(d, since),
            Err(_) => self.lost(since),
        })
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        // Let a running commit finish (it may be the one a clean shutdown waits for), then
        // end the thread.
        self.jobs.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

//! The simulator's flush runner: it holds a flush's metadata commit until the simulator
//! releases it, so that a flush can finish between any two steps of the shard core (between a
//! WAL commit and its durability, between an apply and the next commit, ...) instead of at
//! once.
//!
//! The store hands a prepared [`MetaCommit`] to [`fastblock_store::FlushRunner::submit`]; the
//! OSD runs it on a thread, this runner keeps it. The cluster schedules a `FlushDone` event
//! after a seeded delay when a step says a flush started; that event calls
//! [`FlushGate::release`] (the commit runs now: redb's page writes and sync, where a crash
//! point may strike) and then steps `Input::FlushDone`, whose `flush_poll` takes the result
//! back. When the store must flush synchronously (a removed PG, a full WAL) it calls
//! [`fastblock_store::FlushRunner::wait`], which runs a held commit at once.
//!
//! The node and its store share the gate (`Rc<RefCell<_>>`: one thread); a crash drops both.

use fastblock_store::{Finished, FlushRunner, MetaCommit};
use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

/// A flush's metadata commit, from hand-over to the store taking it back.
#[derive(Default)]
pub struct FlushGate {
    /// Handed over, not released yet.
    held: Option<MetaCommit>,
    /// Released (run), its result not yet taken back by the store.
    done: Option<(MetaCommit, fastblock_store::Result<()>)>,
}

impl FlushGate {
    /// Runs the held commit now, if there is one; the store takes the result back at its next
    /// `flush_poll`. Returns whether a commit ran.
    pub fn release(&mut self) -> bool {
        let Some(mut commit) = self.held.take() else {
            return false;
        };
        assert!(self.done.is_none(), "two flush commits handed over at once");
        let result = commit.run();
        self.done = Some((commit, result));
        true
    }

    /// Whether a commit is held, waiting for [`FlushGate::release`].
    pub fn holds(&self) -> bool {
        self.held.is_some()
    }

    fn take_done(&mut self) -> Option<Finished> {
        let (commit, result) = self.done.take()?;
        Some(Finished {
            commit: Some(commit),
            result,
            // Virtual time passes between events only: a commit takes none.
            commit_time: Duration::ZERO,
            since_start: Duration::ZERO,
        })
    }
}

/// The store's side of a shared [`FlushGate`].
pub struct SharedGate(pub Rc<RefCell<FlushGate>>);

impl FlushRunner for SharedGate {
    fn submit(&mut self, commit: MetaCommit) {
        let mut gate = self.0.borrow_mut();
        assert!(
            gate.held.is_none() && gate.done.is_none(),
            "a flush commit handed over while another is out"
        );
        gate.held = Some(commit);
    }

    fn busy(&self) -> bool {
        let gate = self.0.borrow();
        gate.held.is_some() || gate.done.is_some()
    }

    fn try_finished(&mut self) -> Option<Finished> {
        self.0.borrow_mut().take_done()
    }

    fn wait(&mut self) -> Option<Finished> {
        let mut gate = self.0.borrow_mut();
        gate.release();
        gate.take_done()
    }
}

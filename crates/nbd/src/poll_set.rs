//! A set of futures run by the one task that owns them (the connection's task): the requests
//! of a connection proceed concurrently without a task each. Each future has its own waker, so
//! a completion costs one poll of that future, not a poll of every request in flight; and the
//! owner is woken once however many futures became ready before it next looks.
//!
//! The workspace does not depend on the `futures` crate, whose `FuturesUnordered` does the same
//! with more generality (intrusive lists, per-future allocations); this one keeps a slot per
//! future, reuses the slots (no allocation per request once warm) and has no `unsafe`.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};

/// Which slots were woken since the owner last polled.
#[derive(Default)]
struct Ready {
    /// Woken slots, each at most once (see `queued`).
    slots: Vec<usize>,
    queued: Vec<bool>,
    /// The owner's waker. Taken by the first wake, so that the futures completing between two
    /// polls of the owner wake it once.
    owner: Option<Waker>,
}

#[derive(Default)]
struct Shared {
    ready: Mutex<Ready>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Ready> {
        // Nothing panics while holding the lock; a poisoned one still holds consistent data.
        self.ready.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn mark(ready: &mut Ready, slot: usize) {
        if !ready.queued[slot] {
            ready.queued[slot] = true;
            ready.slots.push(slot);
        }
    }
}

/// The waker of one slot: queues the slot and wakes the owner.
struct SlotWaker {
    slot: usize,
    shared: Arc<Shared>,
}

impl Wake for SlotWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let owner = {
            let mut ready = self.shared.lock();
            Shared::mark(&mut ready, self.slot);
            ready.owner.take()
        };
        if let Some(owner) = owner {
            owner.wake();
        }
    }
}

/// Futures polled when woken; their outputs come out in completion order.
pub(crate) struct PollSet<F> {
    /// `None` in a free slot. Boxed once per slot, so that a future never moves.
    slots: Vec<Pin<Box<Option<F>>>>,
    wakers: Vec<Waker>,
    free: Vec<usize>,
    len: usize,
    shared: Arc<Shared>,
    /// The woken slots being polled (kept to reuse its allocation).
    polling: Vec<usize>,
}

impl<F: Future> PollSet<F> {
    pub(crate) fn new() -> Self {
        PollSet {
            slots: Vec::new(),
            wakers: Vec::new(),
            free: Vec::new(),
            len: 0,
            shared: Arc::default(),
            polling: Vec::new(),
        }
    }

    /// Futures not yet complete.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Adds `future`; it is first polled by the next [`PollSet::poll_completed`].
    pub(crate) fn push(&mut self, future: F) {
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                let slot = self.slots.len();
                self.slots.push(Box::pin(None));
                self.wakers.push(Waker::from(Arc::new(SlotWaker {
                    slot,
                    shared: self.shared.clone(),
                })));
                self.shared.lock().queued.push(false);
                slot
            }
        };
        assert!(self.slots[slot].is_none(), "slot {slot} is free");
        self.slots[slot].set(Some(future));
        self.len += 1;
        Shared::mark(&mut self.shared.lock(), slot);
    }

    /// Polls every future that was woken (or added) since the last call and appends the
    /// outputs of those that completed to `done`. Ready when at least one completed; otherwise
    /// pending, and the task of `cx` is woken when one of the futures is.
    pub(crate) fn poll_completed(
        &mut self,
        cx: &mut Context<'_>,
        done: &mut Vec<F::Output>,
    ) -> Poll<()> {
        let before = done.len();
        {
            let mut ready = self.shared.lock();
            if !ready
                .owner
                .as_ref()
                .is_some_and(|w| w.will_wake(cx.waker()))
            {
                ready.owner = Some(cx.waker().clone());
            }
            std::mem::swap(&mut self.polling, &mut ready.slots);
            // Cleared before polling: a future that wakes itself while being polled is
            // queued again.
            for &slot in &self.polling {
                ready.queued[slot] = false;
            }
        }
        for slot in self.polling.drain(..) {
            // A free slot or a newer future in it: a wake from a future that already
            // completed. Polling a future that was not woken is allowed, so nothing is lost.
            let Some(future) = self.slots[slot].as_mut().as_pin_mut() else {
                continue;
            };
            let mut slot_cx = Context::from_waker(&self.wakers[slot]);
            if let Poll::Ready(output) = future.poll(&mut slot_cx) {
                self.slots[slot].set(None);
                self.free.push(slot);
                self.len -= 1;
                done.push(output);
            }
        }
        if done.len() > before {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::sync::oneshot;

    async fn completed<F: Future>(set: &mut PollSet<F>) -> Vec<F::Output> {
        let mut done = Vec::new();
        std::future::poll_fn(|cx| set.poll_completed(cx, &mut done)).await;
        done
    }

    /// A future that counts its polls in `polls[index]` and returns `(index, value)`.
    fn counted(
        index: usize,
        polls: Arc<Vec<AtomicUsize>>,
        mut rx: oneshot::Receiver<u32>,
    ) -> impl Future<Output = (usize, u32)> {
        std::future::poll_fn(move |cx| {
            polls[index].fetch_add(1, Ordering::Relaxed);
            Pin::new(&mut rx).poll(cx).map(|v| (index, v.unwrap()))
        })
    }

    /// Futures complete in the order their events arrive, not the order they were added;
    /// only the woken futures are polled again; slots are reused.
    #[tokio::test]
    async fn outputs_come_in_completion_order_and_only_woken_futures_are_polled() {
        let polls: Arc<Vec<AtomicUsize>> = Arc::new((0..5).map(|_| AtomicUsize::new(0)).collect());
        let mut set = PollSet::new();
        let mut senders = Vec::new();
        for i in 0..4 {
            let (tx, rx) = oneshot::channel();
            senders.push(Some(tx));
            set.push(counted(i, polls.clone(), rx));
        }
        assert_eq!(set.len(), 4);
        // Nothing ready yet: the first poll of each future registers its waker.
        let mut done = Vec::new();
        let first = std::future::poll_fn(|cx| Poll::Ready(set.poll_completed(cx, &mut done)));
        assert!(first.await.is_pending());
        senders[2].take().unwrap().send(20).unwrap();
        senders[0].take().unwrap().send(0).unwrap();
        let mut out = completed(&mut set).await;
        out.sort_unstable();
        assert_eq!(out, [(0, 0), (2, 20)]);
        let counts: Vec<usize> = polls.iter().map(|p| p.load(Ordering::Relaxed)).collect();
        assert_eq!(counts, [2, 1, 2, 1, 0], "futures 1 and 3 were not woken");
        assert_eq!(set.len(), 2);
        let (tx, rx) = oneshot::channel();
        tx.send(40).unwrap();
        set.push(counted(4, polls.clone(), rx));
        assert_eq!(set.slots.len(), 4, "a free slot is reused");
        assert_eq!(completed(&mut set).await, [(4, 40)]);
        senders[3].take().unwrap().send(30).unwrap();
        senders[1].take().unwrap().send(10).unwrap();
        let mut rest = Vec::new();
        while rest.len() < 2 {
            rest.extend(completed(&mut set).await);
        }
        rest.sort_unstable();
        assert_eq!(rest, [(1, 10), (3, 30)]);
        assert!(set.is_empty());
    }
}

//! Bounded concurrency for the copies: [`Flight`] runs at most `max` chunk tasks at once, in
//! any order (import, cp: each task reads and writes its own chunk); [`Ordered`] keeps at most
//! `max` reads in flight and hands their results back in the order they were started (export
//! to a stream, which must be written in order). Both bound memory to `max` chunks and stop at
//! the first error; dropping them aborts what is still running.

use anyhow::{anyhow, Result};
use std::collections::VecDeque;
use std::future::Future;
use tokio::task::{JoinError, JoinHandle, JoinSet};

/// Tasks returning the data bytes they moved; the sum is kept.
pub struct Flight {
    tasks: JoinSet<Result<u64>>,
    max: usize,
    data_bytes: u64,
}

impl Flight {
    pub fn new(max: usize) -> Flight {
        assert!(max > 0, "a flight of no tasks");
        Flight {
            tasks: JoinSet::new(),
            max,
            data_bytes: 0,
        }
    }

    /// Starts `task` once fewer than `max` run; an error of a finished task is returned here.
    pub async fn spawn<F>(&mut self, task: F) -> Result<()>
    where
        F: Future<Output = Result<u64>> + Send + 'static,
    {
        while self.tasks.len() >= self.max {
            self.join_one().await?;
        }
        self.tasks.spawn(task);
        Ok(())
    }

    /// Waits for every task; the data bytes all of them moved.
    pub async fn finish(mut self) -> Result<u64> {
        while !self.tasks.is_empty() {
            self.join_one().await?;
        }
        Ok(self.data_bytes)
    }

    async fn join_one(&mut self) -> Result<()> {
        match self.tasks.join_next().await {
            None => Ok(()),
            Some(Ok(Ok(bytes))) => {
                self.data_bytes += bytes;
                Ok(())
            }
            Some(Ok(Err(e))) => Err(e),
            Some(Err(e)) => Err(joined(e)),
        }
    }
}

/// Tasks whose results are taken in the order they were started.
pub struct Ordered<T> {
    tasks: VecDeque<JoinHandle<Result<T>>>,
    max: usize,
}

impl<T: Send + 'static> Ordered<T> {
    pub fn new(max: usize) -> Ordered<T> {
        assert!(max > 0, "a flight of no tasks");
        Ordered {
            tasks: VecDeque::with_capacity(max),
            max,
        }
    }

    /// Starts `task`; when `max` already run, first waits for the oldest and returns its
    /// result (the caller consumes it before starting more).
    pub async fn push<F>(&mut self, task: F) -> Result<Option<T>>
    where
        F: Future<Output = Result<T>> + Send + 'static,
    {
        let oldest = if self.tasks.len() >= self.max {
            self.next().await.transpose()?
        } else {
            None
        };
        self.tasks.push_back(tokio::spawn(task));
        Ok(oldest)
    }

    /// The oldest task's result; `None` when none is left.
    pub async fn next(&mut self) -> Option<Result<T>> {
        let task = self.tasks.pop_front()?;
        Some(match task.await {
            Ok(result) => result,
            Err(e) => Err(joined(e)),
        })
    }
}

impl<T> Drop for Ordered<T> {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

fn joined(e: JoinError) -> anyhow::Error {
    if e.is_panic() {
        std::panic::resume_unwind(e.into_panic());
    }
    anyhow!("copy task: {e}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test]
    async fn a_flight_never_runs_more_than_its_limit_and_sums_the_bytes() {
        let running = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let mut flight = Flight::new(3);
        for i in 0..20u64 {
            let (running, peak) = (running.clone(), peak.clone());
            flight
                .spawn(async move {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(1 + i % 3)).await;
                    running.fetch_sub(1, Ordering::SeqCst);
                    Ok(i)
                })
                .await
                .unwrap();
        }
        assert_eq!(flight.finish().await.unwrap(), (0..20).sum::<u64>());
        assert_eq!(peak.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_failed_task_fails_the_flight() {
        let mut flight = Flight::new(2);
        flight.spawn(async { Ok(1) }).await.unwrap();
        flight
            .spawn(async { Err(anyhow!("disk on fire")) })
            .await
            .unwrap();
        let e = flight.finish().await.unwrap_err();
        assert_eq!(e.to_string(), "disk on fire");
    }

    #[tokio::test]
    async fn ordered_results_come_in_the_order_started() {
        let mut ordered = Ordered::new(4);
        let mut got = Vec::new();
        for i in 0..10u64 {
            // Later tasks finish first.
            let task = async move {
                tokio::time::sleep(Duration::from_millis(10 - i)).await;
                Ok(i)
            };
            if let Some(done) = ordered.push(task).await.unwrap() {
                got.push(done);
            }
        }
        while let Some(done) = ordered.next().await {
            got.push(done.unwrap());
        }
        assert_eq!(got, (0..10).collect::<Vec<_>>());
    }
}

//! Work that holds a CPU for long (decoding or encoding the whole state, deciding an operation
//! on a large cluster) runs off the async workers' turn, so the tasks that must run on time
//! (the election's lease renewals above all: a leader that misses them steps down) keep
//! running meanwhile. With a pool of 131,072 PGs a load decodes some 20 MB of JSON.
//!
//! `block_in_place` leaves the calling thread to the blocking pool, which ends idle threads:
//! no child that must live as long as the monitor may be forked from a worker
//! (`crate::child_anchor` forks the etcd member).

/// Runs `f` on this thread, first handing this worker's other tasks to another one
/// (`tokio::task::block_in_place`) on a multi-threaded runtime; on a current-thread runtime
/// (unit tests) it just runs `f`.
pub fn heavy<T>(f: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

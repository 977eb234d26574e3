//! What the server serves: a catalogue of named exports ([`Exports`]) and the block IO of one
//! export ([`Export`]). The cluster implements them over the client library (`cluster`); the
//! tests and the fuzz target use the in-memory [`crate::memory`] one.
//!
//! The futures are `Send` because a connection's requests run on the connection's tokio task,
//! which may move between worker threads.

use bytes::Bytes;
use std::future::Future;

/// Why an IO failed, in the classes NBD can tell a client apart.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IoError {
    /// The request does not fit the export (the server checks ranges first, so this is a
    /// race with a resize or a backend's own limit).
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("no space: {0}")]
    NoSpace(String),
    /// A write to a read-only export (a snapshot).
    #[error("read-only: {0}")]
    ReadOnly(String),
    /// Anything else: the cluster failed the IO or did not answer in time.
    #[error("I/O error: {0}")]
    Io(String),
}

impl IoError {
    /// The NBD error value sent to the client.
    pub fn nbd_error(&self) -> u32 {
        match self {
            IoError::Invalid(_) => crate::consts::EINVAL,
            IoError::NoSpace(_) => crate::consts::ENOSPC,
            IoError::ReadOnly(_) => crate::consts::EPERM,
            IoError::Io(_) => crate::consts::EIO,
        }
    }
}

/// Why an export could not be listed or opened.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ExportError {
    #[error("no export named {0:?}")]
    NotFound(String),
    /// The name cannot name an export (not `pool/image`).
    #[error("{0}")]
    BadName(String),
    /// The catalogue could not be asked (monitor unreachable).
    #[error("exports unavailable: {0}")]
    Unavailable(String),
}

/// One open export. Cheap to clone; clones share the same image.
pub trait Export: Clone + Send + Sync + 'static {
    fn size_bytes(&self) -> u64;
    /// Whether the export refuses writes (`NBD_FLAG_READ_ONLY`; writes, trims and
    /// write-zeroes are answered `EPERM` without reaching the backend).
    fn read_only(&self) -> bool {
        false
    }
    /// A human description (`NBD_INFO_DESCRIPTION`).
    fn description(&self) -> String;
    fn read(&self, offset: u64, len: u32) -> impl Future<Output = Result<Bytes, IoError>> + Send;
    /// Returns once the data is durable (every acknowledged write of fastblock is).
    fn write(&self, offset: u64, data: Bytes) -> impl Future<Output = Result<(), IoError>> + Send;
    /// Unmaps the range: it reads as zeros and its space goes back to the store.
    fn discard(&self, offset: u64, len: u64) -> impl Future<Output = Result<(), IoError>> + Send;
    /// Zeros the range without sending data (may unmap it, like `discard`).
    fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
    ) -> impl Future<Output = Result<(), IoError>> + Send;
    /// Returns once every write completed before the call is durable.
    fn flush(&self) -> impl Future<Output = Result<(), IoError>> + Send;
    /// The data-holding `(offset, length)` ranges inside `offset..offset + len`, sorted and
    /// not overlapping; the rest reads as zeros.
    fn allocated_ranges(
        &self,
        offset: u64,
        len: u64,
    ) -> impl Future<Output = Result<Vec<(u64, u64)>, IoError>> + Send;
}

/// The named exports a server offers.
pub trait Exports: Send + Sync + 'static {
    type Export: Export;
    fn list(&self) -> impl Future<Output = Result<Vec<String>, ExportError>> + Send;
    fn open(&self, name: &str) -> impl Future<Output = Result<Self::Export, ExportError>> + Send;
}

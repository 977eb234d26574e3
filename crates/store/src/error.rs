//! The engine's typed errors. Each variant carries what a caller needs to decide what to do next
//! (retry after freeing space, fail-stop, report corruption), never only a string.

use fastblock_types::{ImageId, PgId};
use std::io;

/// Which on-disk area ran out of space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpaceArea {
    /// No WAL segment can be recycled: some PG has not compacted its log.
    Wal,
    /// The data region's allocator has no free block left.
    Data,
}

/// The address of one object: `(PG, image, object index)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectId {
    pub image: ImageId,
    pub index: u64,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Nothing was changed; the same call succeeds once space is freed (objects deleted and
    /// flushed, or logs compacted).
    #[error("no space left in the {area:?} area: {needed_bytes} bytes needed, {free_bytes} free")]
    NoSpace {
        area: SpaceArea,
        needed_bytes: u64,
        free_bytes: u64,
    },
    /// The first I/O error of this engine. The engine is now failed: every later call returns
    /// [`Error::PreviousIo`]. Restart and recover from the log.
    #[error("I/O error during {op} at byte {offset_bytes}: {source}")]
    Io {
        op: &'static str,
        offset_bytes: u64,
        #[source]
        source: io::Error,
    },
    /// An earlier I/O error stopped this engine (fail-stop: it never guesses what reached disk).
    #[error("the engine stopped after an earlier I/O error; reopen it to recover")]
    PreviousIo,
    /// A 4 KiB data block does not match its checksum.
    #[error("checksum mismatch in PG {pg} object {object:?} block {block_index} (disk block {physical_block})")]
    Checksum {
        pg: PgId,
        object: ObjectId,
        block_index: u64,
        physical_block: u64,
    },
    /// A 4 KiB data block could not be read: the device answered an error for it. Like
    /// [`Error::Checksum`], it concerns that block alone (a read changes nothing on disk, so
    /// the engine goes on); the owner repairs the block from another replica and counts the
    /// errors to take a failing disk out of service.
    #[error("read error in PG {pg} object {object:?} block {block_index} (disk block {physical_block}): {source}")]
    BlockUnreadable {
        pg: PgId,
        object: ObjectId,
        block_index: u64,
        physical_block: u64,
        #[source]
        source: io::Error,
    },
    /// A read or rollback named a snapshot this PG does not hold for the image (never
    /// created here, or removed). `snap` 0: the image has no snapshots in this PG.
    #[error("PG {pg} holds no snapshot {snap} of image {image}")]
    NoSuchImageSnap {
        pg: PgId,
        image: fastblock_types::ImageId,
        snap: u64,
    },
    /// The log is damaged before its tail: a record that was durable cannot be read. Never
    /// skipped silently.
    #[error(
        "WAL corrupt before its tail in segment {segment_seq} at byte {offset_bytes}: {reason}"
    )]
    LogCorrupt {
        segment_seq: u64,
        offset_bytes: u64,
        reason: String,
    },
    /// The log ends before a point that the metadata says was durable.
    #[error("WAL ends at LSN {end_lsn} but LSN {flushed_lsn} was recorded as durable")]
    LogTruncated { end_lsn: u64, flushed_lsn: u64 },
    #[error("bad superblock: {0}")]
    BadSuperblock(String),
    #[error("device is not empty (found data in its first {checked_bytes} bytes); use force to format it")]
    NotEmpty { checked_bytes: u64 },
    #[error(
        "device size {actual_bytes} bytes is smaller than the formatted size {expected_bytes}"
    )]
    DeviceTooSmall {
        expected_bytes: u64,
        actual_bytes: u64,
    },
    #[error("metadata belongs to OSD {found} but the superblock says {expected}")]
    UuidMismatch { expected: String, found: String },
    /// The metadata database failed. Treated like an I/O error: the engine stops.
    #[error("metadata database error: {0}")]
    Meta(String),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The pending WAL batch is at its size limit; call `commit()` first.
    #[error("WAL batch full: {pending_bytes} bytes pending, limit {batch_bytes_max}")]
    BatchFull {
        pending_bytes: u64,
        batch_bytes_max: u64,
    },
    #[error("PG {0} has no log in this store")]
    PgNotFound(PgId),
    /// Compaction may only drop entries whose effects are flushed to the object store.
    #[error("PG {pg}: cannot compact to {index}, only {flushed_applied} is applied and flushed")]
    CompactBeyondFlushed {
        pg: PgId,
        index: u64,
        flushed_applied: u64,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Errors after which the engine must stop (the disk state is unknown).
    pub fn is_fatal(&self) -> bool {
        matches!(self, Error::Io { .. } | Error::Meta(_) | Error::PreviousIo)
    }

    /// The damaged block this error is about, if it is about one data block whose copy on
    /// this disk is bad (a checksum mismatch or a read error): another replica's copy can
    /// repair it.
    pub fn bad_block(&self) -> Option<(PgId, ObjectId, u64)> {
        match self {
            Error::Checksum {
                pg,
                object,
                block_index,
                ..
            }
            | Error::BlockUnreadable {
                pg,
                object,
                block_index,
                ..
            } => Some((*pg, *object, *block_index)),
            _ => None,
        }
    }
}

impl From<redb::Error> for Error {
    fn from(e: redb::Error) -> Self {
        Error::Meta(e.to_string())
    }
}

macro_rules! meta_error_from {
    ($($t:ty),*) => {$(
        impl From<$t> for Error {
            fn from(e: $t) -> Self {
                Error::Meta(e.to_string())
            }
        }
    )*};
}
meta_error_from!(
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);

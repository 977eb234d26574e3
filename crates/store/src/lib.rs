//! fastblock-store: the local storage engine of one OSD disk (layer 2).
//!
//! Module map:
//! - [`disk`]: the `Disk` trait (aligned batched reads and writes, sync, discard; each with
//!   its durability contract), the O_DIRECT + io_uring implementation, the simulated disk
//!   with seeded crashes, and [`FaultyDisk`], a wrapper that injects I/O errors, delays and
//!   corrupted reads by the rules of a [`FaultPlan`] (tests on real processes).
//! - [`superblock`]: the superblock (geometry, OSD uuid) and the WAL anchor.
//! - [`wal`]: the write-ahead log shared by all PGs of a shard: packed, checksummed records in
//!   group-committed batches, recycled segments, replay with a clean tail cut.
//! - [`raft_storage`]: reading entries back and `raft::Storage` per PG.
//! - [`objects`]: thin copy-on-write object store with a crc32c per 4 KiB block; block map,
//!   object list and applied indexes in redb, the block map's hot part cached in memory.
//! - [`store`]: the facade an OSD shard drives, with fail-stop on I/O errors.
//! - [`error`]: typed errors.
//! - [`flusher`]: [`FlushRunner`], and the optional thread that runs a flush's metadata commit off the owner's
//!   thread (`objects/commit.rs` says why that is safe).
//! - `fuzzing` (hidden): entry points shared by the cargo-fuzz target and the recovery
//!   property test.
//!
//! How an OSD shard drives it, once per loop iteration: for every PG with a Raft `Ready`,
//! `append_entries` + `set_hard_state` (+ `set_conf_state`, `apply_snapshot`); then one
//! `commit` (one write + one fdatasync for all PGs; `BatchFull` means commit first); apply
//! committed entries with `write_object` / `zero_object` / `delete_object` and `set_applied`;
//! every so often `flush` (or, with the flusher thread, `flush_begin` and later `flush_poll`),
//! then `compact` each PG up to `flushed_applied_index` (and `commit`).
//!
//! The on-disk format, the write path with every write and sync, and the recovery algorithm
//! are in `docs/design/store-format.md`.
//!
//! Invariants:
//! - Nothing reported durable is lost: `commit` returns after one write and one fdatasync of
//!   the batch; `flush` syncs data before committing the metadata that points at it.
//! - A data block referenced by flushed metadata is never overwritten (copy-on-write), so
//!   applying needs no sync and replay after a crash is idempotent.
//! - Damage is never silent: torn WAL tails are cut, damage before the tail is
//!   [`Error::LogCorrupt`], a bad data block is [`Error::Checksum`] (or
//!   [`Error::BlockUnreadable`]), noted for repair from another replica
//!   (`objects/damage.rs`); a bad block never stops the engine.
//! - After an I/O error every call returns [`Error::PreviousIo`].
//!
//! This crate is synchronous and deterministic: no async, no clock, no hidden randomness
//! (the simulated disk's and the fault plan's randomness comes from a caller-given seed; a
//! fault plan's delays sleep the calling thread, only when a test sets one), and no threads
//! unless the owner starts the flusher (the OSD does; the simulator and the tests flush
//! inline). It depends only on `fastblock-types` among workspace crates.

// raft-rs messages (rust-protobuf) are built field by field, as raft-rs itself does.
#![allow(clippy::field_reassign_with_default)]

pub(crate) mod codec;
pub mod disk;
pub mod error;
pub mod flusher;
#[doc(hidden)]
pub mod fuzzing;
pub mod objects;
pub mod raft_storage;
pub mod store;
pub mod superblock;
pub mod wal;

pub use disk::{Disk, FaultPlan, FaultRule, FaultyDisk, SimDisk, SimFile, UringDisk, UringOptions};
pub use error::{Error, ObjectId, Result, SpaceArea};
pub use flusher::{Finished, FlushRunner};
pub use objects::transfer::{BlockVersion, ChunkVersions};
pub use objects::ObjectRead;
pub use objects::{
    BlockCacheStats, DamageCounts, DamagedBlock, ImageSnaps, ImageUsage, MetaCommit, ScrubDigest,
    ScrubFindings, IMAGE_SNAP_ID_MAX, SCRUB_GROUP_BLOCKS,
};
pub use raft_storage::PgStorage;
pub use store::{meta_path, FlushDone, MkfsOptions, Store, StoreOptions};

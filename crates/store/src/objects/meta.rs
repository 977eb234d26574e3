//! Object metadata in redb. The database lives in its own file beside the data device
//! (`<device>.meta` by default), or on any `redb::StorageBackend` (the simulator passes a
//! [`crate::disk::SimFile`] that crashes together with the simulated device).
//!
//! Why a separate file and not a region of the device: redb grows and shrinks its file and
//! syncs it itself; giving it a fixed region would mean writing a second allocator for redb's
//! pages. The cost is that the two must be kept consistent: the OSD uuid is stored in both
//! and checked at open, and the WAL's durable LSN at each flush is recorded here.

use crate::error::{Error, Result};
use redb::{Database, TableDefinition};

/// (pg, image, object index, block index) -> (physical block, crc32c).
pub const BLOCKS: TableDefinition<(u64, u64, u64, u32), (u64, u32)> =
    TableDefinition::new("blocks");
/// (pg, image, object index) -> highest byte ever written + 1.
pub const OBJECTS: TableDefinition<(u64, u64, u64), u64> = TableDefinition::new("objects");
/// pg -> applied index flushed with the objects.
pub const APPLIED: TableDefinition<u64, u64> = TableDefinition::new("applied");
/// pg -> installed snapshot: index u64 LE, term u64 LE, then the ConfState as in a WAL
/// snapshot record.
/// Written in the same commit as the snapshot's objects, so that opening the store can finish
/// an install whose WAL record did not become durable (see `Store::install_snapshot`).
pub const SNAPSHOTS: TableDefinition<u64, &[u8]> = TableDefinition::new("snapshots");
/// (pg, image, object index, block index, snapshot id) -> (physical block | birth << 40,
/// crc32c): head blocks replaced since a snapshot, kept under the newest snapshot that sees
/// them (see `image_snaps.rs`).
pub const SNAP_BLOCKS: TableDefinition<SnapBlockKey, (u64, u32)> =
    TableDefinition::new("snap_blocks");
/// The key of [`SNAP_BLOCKS`].
pub type SnapBlockKey = (u64, u64, u64, u32, u64);
/// (pg, image) -> snapshot state: seq u64 LE, count u32 LE, live snapshot ids u64 LE.
pub const IMAGE_SNAPS: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("image_snaps");
/// (pg, image, object index) -> 1: objects of clones that hold their own data (copied up
/// from the parent snapshot; see `clones.rs`).
pub const COPIED: TableDefinition<(u64, u64, u64), u8> = TableDefinition::new("copied");
/// Store-wide values.
pub const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");

pub const KEY_UUID: &str = "osd_uuid";
pub const KEY_FLUSHED_LSN: &str = "flushed_lsn";

pub fn create(db: &Database, osd_uuid: &[u8; 16]) -> Result<()> {
    let tx = db.begin_write()?;
    {
        tx.open_table(BLOCKS)?;
        tx.open_table(OBJECTS)?;
        tx.open_table(APPLIED)?;
        tx.open_table(SNAPSHOTS)?;
        tx.open_table(SNAP_BLOCKS)?;
        tx.open_table(IMAGE_SNAPS)?;
        tx.open_table(COPIED)?;
        let mut meta = tx.open_table(META)?;
        meta.insert(KEY_UUID, &osd_uuid[..])?;
        meta.insert(KEY_FLUSHED_LSN, &0u64.to_le_bytes()[..])?;
    }
    tx.commit()?;
    Ok(())
}

/// Creates the tables a store formatted by an older version lacks (they start empty), so
/// that reads can open every table.
pub fn create_missing_tables(db: &Database) -> Result<()> {
    let missing = {
        let tx = db.begin_read()?;
        let snap_blocks = matches!(
            tx.open_table(SNAP_BLOCKS),
            Err(redb::TableError::TableDoesNotExist(_))
        );
        let image_snaps = matches!(
            tx.open_table(IMAGE_SNAPS),
            Err(redb::TableError::TableDoesNotExist(_))
        );
        let copied = matches!(
            tx.open_table(COPIED),
            Err(redb::TableError::TableDoesNotExist(_))
        );
        snap_blocks || image_snaps || copied
    };
    if missing {
        let tx = db.begin_write()?;
        tx.open_table(SNAP_BLOCKS)?;
        tx.open_table(IMAGE_SNAPS)?;
        tx.open_table(COPIED)?;
        tx.commit()?;
    }
    Ok(())
}

pub struct Loaded {
    pub osd_uuid: Vec<u8>,
    pub flushed_lsn: u64,
}

pub fn load(db: &Database) -> Result<Loaded> {
    let tx = db.begin_read()?;
    let meta = tx.open_table(META)?;
    let uuid = meta
        .get(KEY_UUID)?
        .ok_or_else(|| Error::Meta("no OSD uuid in the metadata".into()))?
        .value()
        .to_vec();
    let lsn = meta
        .get(KEY_FLUSHED_LSN)?
        .ok_or_else(|| Error::Meta("no flushed LSN in the metadata".into()))?
        .value()
        .try_into()
        .map(u64::from_le_bytes)
        .map_err(|_| Error::Meta("flushed LSN is not 8 bytes".into()))?;
    Ok(Loaded {
        osd_uuid: uuid,
        flushed_lsn: lsn,
    })
}

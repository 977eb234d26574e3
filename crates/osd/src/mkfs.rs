//! `fastblock-osd --mkfs`: prepare the device, register a new OSD id with the monitor, format
//! one store per shard region, and record the identity.

use crate::identity::{identity_path, Identity};
use crate::region::RegionDisk;
use crate::shard_meta_path;
use anyhow::{bail, Context, Result};
use fastblock_monclient::MonClient;
use fastblock_store::disk::AlignedBuf;
use fastblock_store::superblock::Superblock;
use fastblock_store::{Disk, MkfsOptions, Store, UringDisk, UringOptions};
use std::os::unix::fs::FileTypeExt;
use std::path::PathBuf;

/// How much of a data *file* mkfs writes (with zeros) before formatting. A block device is
/// never pre-written.
///
/// Why: on a file system, the first write to a block of a sparse (or fallocated) file
/// allocates it, and the fdatasync that follows must then commit the file system's journal
/// too: a WAL commit that should cost one device flush costs a journal commit as well
/// (measured on the development VM's ext4: fio QD1 write+fdatasync 212 us on a sparse file,
/// 98 us on a written one; the OSD's WAL commit at 1-replica QD1 ~300 us -> ~170 us).
/// Overwriting blocks written once is a plain data write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Preallocate {
    /// Leave the file sparse.
    None,
    /// Write the WAL region of every shard, which every commit then overwrites: the WAL
    /// commits on the write path never allocate. Applied data still allocates on first
    /// use (flushes pay that, and a WAL commit after a background data write may).
    #[default]
    Wal,
    /// Write the whole file: nothing ever allocates (as a block device, or fio's test file).
    Full,
}

impl std::str::FromStr for Preallocate {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Preallocate::None),
            "wal" => Ok(Preallocate::Wal),
            "full" => Ok(Preallocate::Full),
            other => Err(format!(
                "unknown preallocation {other:?}: none, wal or full"
            )),
        }
    }
}

/// Most data-path shards (threads) one OSD may be formatted with.
pub const SHARDS_MAX: u32 = 64;

pub struct MkfsArgs {
    pub data: PathBuf,
    /// Size of a data file to create (ignored for block devices and existing files).
    pub size_bytes: Option<u64>,
    /// What of a data file to write before formatting (ignored for block devices).
    pub preallocate: Preallocate,
    pub uuid: Option<String>,
    pub force: bool,
    pub shards: u32,
    pub monitors: Vec<String>,
}

/// WAL geometry scaled to the region: 16 segments of 1/64 of it, between 8 and 64 MiB each
/// (a quarter of the region at most), with batches of at most a quarter of a segment.
fn mkfs_options(uuid: [u8; 16], region_bytes: u64, force: bool) -> MkfsOptions {
    let mut o = MkfsOptions::new(uuid);
    let segment = (region_bytes / 64).clamp(8 << 20, 64 << 20) / (1 << 20) * (1 << 20);
    o.segment_size_bytes = segment;
    o.segment_count = 16;
    o.batch_bytes_max = o.batch_bytes_max.min(segment / 4);
    o.force = force;
    o
}

/// Writes zeros over the first `bytes` of a shard's region (rounded down to 4 KiB) and syncs.
fn write_zeros(disk: &mut impl Disk, bytes: u64) -> Result<()> {
    const CHUNK_BYTES: u64 = 4 << 20;
    let bytes = bytes / 4096 * 4096;
    let zeros = AlignedBuf::zeroed(CHUNK_BYTES as usize);
    let mut offset = 0;
    while offset < bytes {
        let n = CHUNK_BYTES.min(bytes - offset);
        let last = offset + n == bytes;
        disk.write(offset, &zeros[..n as usize], last)?;
        offset += n;
    }
    Ok(())
}

pub async fn mkfs(args: MkfsArgs) -> Result<Identity> {
    if args.shards == 0 || args.shards > SHARDS_MAX {
        bail!("--shards must be between 1 and {SHARDS_MAX}");
    }
    if identity_path(&args.data).exists() && !args.force {
        let old = Identity::load(&args.data)?;
        bail!(
            "{} already holds osd {} (uuid {}); pass --force to format it again",
            args.data.display(),
            old.id,
            old.uuid
        );
    }
    let is_device = std::fs::metadata(&args.data)
        .map(|m| m.file_type().is_block_device())
        .unwrap_or(false);
    if !is_device {
        let exists = args.data.exists();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&args.data)
            .with_context(|| format!("creating {}", args.data.display()))?;
        if !exists || file.metadata()?.len() == 0 {
            let size = args
                .size_bytes
                .context("--size is needed to create a data file")?;
            file.set_len(size)
                .with_context(|| format!("sizing {}", args.data.display()))?;
        }
    }
    let uuid = match &args.uuid {
        Some(u) => uuid::Uuid::parse_str(u).with_context(|| format!("invalid --uuid {u}"))?,
        None => uuid::Uuid::new_v4(),
    };
    let monitors = MonClient::new(args.monitors.clone());
    let id = monitors
        .apply_id(&uuid.to_string())
        .await
        .context("registering with the monitor")?;
    for index in 0..args.shards {
        let disk = UringDisk::open(&args.data, UringOptions::default())
            .with_context(|| format!("opening {}", args.data.display()))?;
        let disk = RegionDisk::new(disk, index, args.shards)?;
        let region = fastblock_store::Disk::size_bytes(&disk);
        let meta = shard_meta_path(&args.data, index);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(args.force)
            .open(&meta)
            .with_context(|| format!("creating {}", meta.display()))?;
        let backend = redb::backends::FileBackend::new(file)?;
        let opts = mkfs_options(*uuid.as_bytes(), region, args.force);
        let mut disk = disk;
        if !is_device {
            let layout = Superblock::layout(
                opts.osd_uuid,
                region,
                opts.segment_size_bytes,
                opts.segment_count,
                opts.batch_bytes_max,
            )?;
            let bytes = match args.preallocate {
                Preallocate::None => 0,
                Preallocate::Wal => layout.data_offset_bytes,
                Preallocate::Full => region,
            };
            write_zeros(&mut disk, bytes).with_context(|| {
                format!("preallocating shard {index} of {}", args.data.display())
            })?;
        }
        Store::mkfs(disk, backend, &opts, crate::shard::store_options())
            .with_context(|| format!("formatting shard {index} of {}", args.data.display()))?;
    }
    let identity = Identity {
        format: 1,
        id,
        uuid: uuid.to_string(),
        shards: args.shards,
    };
    identity.save(&args.data)?;
    Ok(identity)
}

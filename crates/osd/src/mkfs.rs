//! `fastblock-osd --mkfs`: prepare the device, register a new OSD id with the monitor, format
//! one store per shard region, and record the identity.

use crate::identity::{identity_path, Identity};
use crate::region::{RegionDisk, REGION_ALIGN_BYTES};
use crate::shard_meta_path;
use crate::space::{self, Reserved};
use anyhow::{bail, Context, Result};
use fastblock_monclient::MonClient;
use fastblock_shard::ShardConfig;
use fastblock_store::disk::AlignedBuf;
use fastblock_store::superblock::Superblock;
use fastblock_store::{Disk, MkfsOptions, Store, UringDisk, UringOptions};
use std::os::unix::fs::FileTypeExt;
use std::path::PathBuf;

/// What mkfs does to a data *file* before formatting. A block device is never touched.
///
/// Every mode allocates the whole file, so that no WAL or data write ever needs a block from
/// the file system: on a full file system a sparse file's next write would fail with ENOSPC
/// and stop the OSD, and its restart would replay into the same error (`space.rs`). Where
/// the file system has no `fallocate`, mkfs writes the whole file instead.
///
/// Why `wal` writes zeros too: on a file system, the first write to a block of a sparse (or
/// fallocated) file allocates it (or converts its unwritten extent), and the fdatasync that
/// follows must then commit the file system's journal too: a WAL commit that should cost one
/// device flush costs a journal commit as well (measured on the development VM's ext4: fio
/// QD1 write+fdatasync 212 us on a sparse file, 98 us on a written one; the OSD's WAL commit
/// at 1-replica QD1 ~300 us -> ~170 us). Overwriting blocks written once is a plain data
/// write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Preallocate {
    /// Allocate the file without writing it: fast (tests, throwaway clusters); the first
    /// write of each block costs a journal commit once.
    Reserve,
    /// Allocate the file and write the WAL region of every shard, which every commit then
    /// overwrites: the WAL commits on the write path never convert a block. Applied data
    /// still converts on first use (flushes pay that, and a WAL commit after a background
    /// data write may).
    #[default]
    Wal,
    /// Write the whole file: nothing ever converts (as a block device, or fio's test file).
    Full,
}

impl std::str::FromStr for Preallocate {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "reserve" => Ok(Preallocate::Reserve),
            "wal" => Ok(Preallocate::Wal),
            "full" => Ok(Preallocate::Full),
            "none" => Err(
                "`none` is no longer offered: a sparse data file meets ENOSPC when \
                 its file system fills up; use reserve (allocate without writing), wal or full"
                    .into(),
            ),
            other => Err(format!(
                "unknown preallocation {other:?}: reserve, wal or full"
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
    /// Bytes of the file system that must stay free beside the data file for the metadata
    /// (`--host-space-reserve`; None: the default for the OSD's geometry).
    pub host_space_reserve_bytes: Option<u64>,
    pub uuid: Option<String>,
    pub force: bool,
    pub shards: u32,
    pub monitors: Vec<String>,
    /// The admin keyring (`--keyring`, else `$FASTBLOCK_KEYRING`, else the default path)
    /// whose client.admin key applies for the id and creates the OSD's key.
    pub keyring: Option<PathBuf>,
}

/// WAL segments of every shard.
const SEGMENT_COUNT: u32 = 16;

/// WAL segment size for a region: 1/64 of it, between 8 and 64 MiB, in whole MiB.
fn segment_size_bytes(region_bytes: u64) -> u64 {
    (region_bytes / 64).clamp(8 << 20, 64 << 20) / (1 << 20) * (1 << 20)
}

/// WAL geometry scaled to the region: 16 segments of 1/64 of it, between 8 and 64 MiB each
/// (a quarter of the region at most), with batches of at most a quarter of a segment.
fn mkfs_options(uuid: [u8; 16], region_bytes: u64, force: bool) -> MkfsOptions {
    let mut o = MkfsOptions::new(uuid);
    let segment = segment_size_bytes(region_bytes);
    o.segment_size_bytes = segment;
    o.segment_count = SEGMENT_COUNT;
    o.batch_bytes_max = o.batch_bytes_max.min(segment / 4);
    o.force = force;
    o
}

/// The default host file system reserve of an OSD of `size_bytes` in `shards` shards (what
/// the runtime derives from the formatted geometry, `ShardConfig::host_space_reserve_bytes`).
pub fn default_host_space_reserve_bytes(size_bytes: u64, shards: u32) -> u64 {
    let region = size_bytes / u64::from(shards.max(1)) / REGION_ALIGN_BYTES * REGION_ALIGN_BYTES;
    let wal = segment_size_bytes(region) * u64::from(SEGMENT_COUNT);
    ShardConfig::host_space_reserve_bytes(shards, region, wal)
}

/// Creates (or takes) the data file at `args.data`, sized, and allocates it all. Refuses up
/// front, before anything is created, when its file system cannot hold the file and still
/// keep the metadata's reserve free. Returns how the file was reserved.
fn prepare_data_file(args: &MkfsArgs) -> Result<Reserved> {
    let path = &args.data;
    let existing_len = std::fs::metadata(path)
        .map(|m| m.len())
        .ok()
        .filter(|len| *len > 0);
    let size = match existing_len {
        Some(len) => len,
        None => args
            .size_bytes
            .context("--size is needed to create a data file")?,
    };
    let allocated = match existing_len {
        Some(_) => std::fs::File::open(path)
            .and_then(|f| space::allocated_bytes(&f))
            .with_context(|| format!("reading {}", path.display()))?,
        None => 0,
    };
    let needed = size.saturating_sub(allocated);
    let keep_free = args
        .host_space_reserve_bytes
        .unwrap_or_else(|| default_host_space_reserve_bytes(size, args.shards));
    let dir = space::parent_dir(path);
    let free = space::free_bytes(dir)
        .with_context(|| format!("reading the free space of {}", dir.display()))?;
    if free < needed.saturating_add(keep_free) {
        let fits = (free.saturating_sub(keep_free) + allocated) >> 20;
        bail!(
            "{}: its file system has {free} bytes free, but the data file needs {needed} more \
             and {keep_free} must stay free for the OSD's metadata (--host-space-reserve); use \
             a smaller --size (at most {fits}M here)",
            path.display()
        );
    }
    let exists = path.exists();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    let reserved = (|| -> std::io::Result<Reserved> {
        if existing_len.is_none() {
            file.set_len(size)?;
        }
        space::reserve(&file, size)
    })();
    match reserved {
        Ok(r) => Ok(r),
        Err(e) => {
            if !exists {
                // Ours, and empty: leave nothing behind.
                let _ = std::fs::remove_file(path);
            }
            Err(e).with_context(|| format!("allocating {size} bytes for {}", path.display()))
        }
    }
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
    let reserved = if is_device {
        None
    } else {
        Some(prepare_data_file(&args)?)
    };
    let uuid = match &args.uuid {
        Some(u) => uuid::Uuid::parse_str(u).with_context(|| format!("invalid --uuid {u}"))?,
        None => uuid::Uuid::new_v4(),
    };
    let mut monitors = MonClient::new(args.monitors.clone());
    let admin_path = fastblock_auth::keyring::resolve_path(args.keyring.as_deref());
    let signed = admin_path.exists();
    if signed {
        let ring = fastblock_auth::Keyring::load(&admin_path)?;
        let key = ring
            .key_for(&admin_path, &fastblock_auth::EntityName::admin())?
            .clone();
        monitors = monitors.with_credentials(fastblock_auth::EntityName::admin(), key);
    }
    let id = monitors
        .apply_id(&uuid.to_string())
        .await
        .with_context(|| {
            if signed {
                "registering with the monitor".to_string()
            } else {
                format!(
                    "registering with the monitor (no admin keyring at {}: pass --keyring or set FASTBLOCK_KEYRING)",
                    admin_path.display()
                )
            }
        })?;
    // The OSD's own key, beside its identity. Without an admin key the cluster runs auth
    // mode none (apply-id succeeded unsigned) and the OSD needs none.
    if signed {
        let entity = fastblock_auth::EntityName::Osd(id);
        let k = monitors
            .auth_get_or_create(&entity.to_string(), "osd")
            .await
            .with_context(|| format!("creating the key of {entity}"))?;
        let path = crate::keys::keyring_path(&args.data);
        fastblock_auth::Keyring::single(entity, k.key, Some(fastblock_auth::Caps::osd()))
            .save(&path)?;
    }
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
        if let Some(reserved) = reserved {
            let layout = Superblock::layout(
                opts.osd_uuid,
                region,
                opts.segment_size_bytes,
                opts.segment_count,
                opts.batch_bytes_max,
            )?;
            let bytes = match (args.preallocate, reserved) {
                // Without fallocate only writing allocates.
                (Preallocate::Full, _) | (_, Reserved::Unsupported) => region,
                (Preallocate::Wal, Reserved::Allocated) => layout.data_offset_bytes,
                (Preallocate::Reserve, Reserved::Allocated) => 0,
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

//! `fastblock-osd --mkfs`: prepare the device, register a new OSD id with the monitor, format
//! one store per shard region, and record the identity.

use crate::identity::{identity_path, Identity};
use crate::region::RegionDisk;
use crate::shard_meta_path;
use anyhow::{bail, Context, Result};
use fastblock_monclient::MonClient;
use fastblock_store::{MkfsOptions, Store, UringDisk, UringOptions};
use std::os::unix::fs::FileTypeExt;
use std::path::PathBuf;

pub struct MkfsArgs {
    pub data: PathBuf,
    /// Size of a data file to create (ignored for block devices and existing files).
    pub size_bytes: Option<u64>,
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

pub async fn mkfs(args: MkfsArgs) -> Result<Identity> {
    if args.shards == 0 || args.shards > 64 {
        bail!("--shards must be between 1 and 64");
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

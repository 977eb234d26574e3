//! The host file system under an OSD's files: reserving them so that writes into them never
//! meet ENOSPC, and measuring what is left for what still grows.
//!
//! A data *file* is allocated in full (`fallocate`: the blocks are the file's, read as zeros,
//! and nothing is written) at mkfs and again at every start, so the WAL and data
//! writes never need a block from the file system; only the redb metadata files still grow.
//! Their holes (redb grows a file by `set_len`, then writes its pages as it needs them) are
//! allocated as soon as the runtime sees them ([`fill_holes`]), so a commit finds its pages
//! already allocated even on a file system another process just filled. What is left is
//! sampled once a second ([`free_bytes`]) and the shard core refuses writes below a reserve
//! (`fastblock_shard::space`). On a copy-on-write file system (btrfs, ZFS) an allocated block
//! is no promise for the next write; there the samples and the reserve are what protects.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// How [`reserve`] made a file's blocks its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reserved {
    /// `fallocate` allocated them.
    Allocated,
    /// The file system has no `fallocate`: only writing the file (zeros) allocates it.
    Unsupported,
}

/// Bytes available to an unprivileged writer on the file system holding `path` (a file or
/// a directory): `statvfs`'s `f_bavail * f_frsize`.
// `fsblkcnt_t` and `c_ulong` are u64 on 64-bit Linux, narrower elsewhere.
#[allow(clippy::useless_conversion)]
pub fn free_bytes(path: &Path) -> io::Result<u64> {
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path with a NUL byte"))?;
    // SAFETY: `statvfs` is a plain C struct: all-zero bytes are a valid value of it.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid NUL-terminated path and a statvfs buffer of the right type.
    if unsafe { libc::statvfs(c_path.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(u64::from(st.f_bavail).saturating_mul(u64::from(st.f_frsize)))
}

/// Bytes of `file` the file system has allocated (its blocks, `st_blocks * 512`).
pub fn allocated_bytes(file: &File) -> io::Result<u64> {
    Ok(file.metadata()?.blocks().saturating_mul(512))
}

/// Bytes of the first `len_bytes` of `file` that are holes (not allocated), at most.
pub fn unallocated_bytes(file: &File, len_bytes: u64) -> io::Result<u64> {
    Ok(len_bytes.saturating_sub(allocated_bytes(file)?))
}

/// Allocates the first `len_bytes` of `file` without writing them (`fallocate` with
/// `FALLOC_FL_KEEP_SIZE`: what is written stays, and the file's size never changes, even
/// if its owner shrank it meanwhile). Idempotent, and fast where the file is allocated
/// already. A failure part way (ENOSPC) may leave some of the range allocated.
pub fn reserve(file: &File, len_bytes: u64) -> io::Result<Reserved> {
    if len_bytes == 0 {
        return Ok(Reserved::Allocated);
    }
    let len = libc::off_t::try_from(len_bytes)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file too large"))?;
    loop {
        // SAFETY: fallocate(2) on a descriptor `file` owns, over a checked range.
        let r = unsafe { libc::fallocate(file.as_raw_fd(), libc::FALLOC_FL_KEEP_SIZE, 0, len) };
        if r == 0 {
            return Ok(Reserved::Allocated);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => return Ok(Reserved::Unsupported),
            _ => return Err(e),
        }
    }
}

/// Allocates the holes of a file that grows by `set_len` (a redb metadata file), if the file
/// system has room for all of them: a page written later then needs no new block. Returns
/// the bytes that were holes (0: nothing to do). Never takes the file system's last bytes
/// for it: with too little room the holes stay, and the samples' reserve protects.
pub fn fill_holes(file: &File, dir: &Path) -> io::Result<u64> {
    let len = file.metadata()?.len();
    let holes = unallocated_bytes(file, len)?;
    if holes == 0 || free_bytes(dir)? < holes {
        return Ok(0);
    }
    reserve(file, len)?;
    Ok(holes)
}

/// The directory whose file system holds `path` (a file that may not exist yet).
pub fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// At OSD start: allocates what an older mkfs (or a copy) left sparse of the data file at
/// `data`, so that data writes never meet ENOSPC. Does nothing for a block device. Only
/// warns when it cannot: writes are still refused in time by the samples of the file
/// system's free space.
pub fn reserve_data_file(data: &Path) {
    let file = match std::fs::OpenOptions::new().write(true).open(data) {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(data = %data.display(), error = %e, "not reserving the data file");
            return;
        }
    };
    let result = (|| -> io::Result<Option<String>> {
        let meta = file.metadata()?;
        if !meta.file_type().is_file() {
            return Ok(None);
        }
        let holes = unallocated_bytes(&file, meta.len())?;
        if holes == 0 {
            return Ok(None);
        }
        let free = free_bytes(parent_dir(data))?;
        if free < holes {
            return Ok(Some(format!(
                "the data file has {holes} bytes unallocated and its file system only {free} \
                 free: left sparse"
            )));
        }
        Ok(match reserve(&file, meta.len())? {
            Reserved::Allocated => {
                tracing::info!(data = %data.display(), bytes = holes, "allocated the sparse part of the data file");
                None
            }
            Reserved::Unsupported => {
                Some("the file system has no fallocate: the data file stays sparse".into())
            }
        })
    })();
    match result {
        Ok(None) => {}
        Ok(Some(why)) => tracing::warn!(data = %data.display(), "{why}; writes are refused \
            when the file system runs low, but a data write may still meet ENOSPC"),
        Err(e) => tracing::warn!(data = %data.display(), error = %e, "reserving the data file"),
    }
}

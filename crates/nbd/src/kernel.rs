//! The Linux nbd driver's ioctl interface: find a free `/dev/nbdX`, hand it a connected
//! socket whose other end this process serves, and disconnect it.
//!
//! The kernel speaks only the transmission phase, without structured replies; the handshake
//! is the attaching program's job. Since both ends are ours, `map` skips it: the server end
//! of a socket pair starts in transmission directly (`crate::map`).
//!
//! The ioctl numbers are `_IO(0xab, n)` from `<linux/nbd.h>`.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

const NBD_SET_SOCK: libc::Ioctl = 0xab00;
const NBD_SET_BLKSIZE: libc::Ioctl = 0xab01;
const NBD_DO_IT: libc::Ioctl = 0xab03;
const NBD_CLEAR_SOCK: libc::Ioctl = 0xab04;
const NBD_CLEAR_QUE: libc::Ioctl = 0xab05;
const NBD_SET_SIZE_BLOCKS: libc::Ioctl = 0xab07;
const NBD_DISCONNECT: libc::Ioctl = 0xab08;
const NBD_SET_FLAGS: libc::Ioctl = 0xab0a;

/// Block size the device is given; the export's size is rounded down to it.
pub const KERNEL_BLOCK_BYTES: u64 = 4096;

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error(
        "the nbd kernel module is not loaded (no /sys/block/nbd0); load it with `modprobe nbd`"
    )]
    ModuleMissing,
    #[error("every nbd device is in use")]
    NoFreeDevice,
    #[error("{what} {device}: {source}")]
    Io {
        what: &'static str,
        device: PathBuf,
        source: io::Error,
    },
}

/// Whether the nbd driver is loaded (it creates `nbd0` and up when it is).
pub fn module_loaded() -> bool {
    Path::new("/sys/block/nbd0").exists()
}

/// The first `/dev/nbdN` no process has attached (the driver shows a `pid` file while one
/// is attached).
pub fn free_device() -> Result<PathBuf, KernelError> {
    if !module_loaded() {
        return Err(KernelError::ModuleMissing);
    }
    let mut indexes: Vec<u32> = std::fs::read_dir("/sys/block")
        .map_err(|source| KernelError::Io {
            what: "listing",
            device: "/sys/block".into(),
            source,
        })?
        .filter_map(|entry| entry.ok())
        .filter_map(|entry| {
            entry
                .file_name()
                .to_str()?
                .strip_prefix("nbd")?
                .parse()
                .ok()
        })
        .collect();
    indexes.sort_unstable();
    indexes
        .into_iter()
        .find(|n| !Path::new(&format!("/sys/block/nbd{n}/pid")).exists())
        .map(|n| PathBuf::from(format!("/dev/nbd{n}")))
        .ok_or(KernelError::NoFreeDevice)
}

fn open(device: &Path) -> Result<File, KernelError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(device)
        .map_err(|source| KernelError::Io {
            what: "opening",
            device: device.to_path_buf(),
            source,
        })
}

fn ioctl(
    file: &File,
    device: &Path,
    request: libc::Ioctl,
    arg: libc::c_ulong,
) -> Result<(), KernelError> {
    // SAFETY: ioctl(2) on a file descriptor we own, with an nbd request whose argument is an
    // integer passed by value (no pointer is handed to the kernel).
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), request, arg) };
    if rc < 0 {
        return Err(KernelError::Io {
            what: "ioctl on",
            device: device.to_path_buf(),
            source: io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// A device handed to the kernel; the thread runs `NBD_DO_IT` until it is disconnected.
pub struct Attachment {
    pub device: PathBuf,
    thread: JoinHandle<Result<(), KernelError>>,
}

impl Attachment {
    /// Whether the device was disconnected (`unmap`, or the socket closed).
    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }

    /// Waits for the disconnect.
    pub fn wait(self) -> Result<(), KernelError> {
        self.thread.join().unwrap_or_else(|_| {
            Err(KernelError::Io {
                what: "NBD_DO_IT thread panicked for",
                device: self.device.clone(),
                source: io::Error::other("panic"),
            })
        })
    }
}

/// Configures `device` for an export of `size_bytes` with transmission `flags` and hands it
/// `socket` (one end of a connection whose other end serves the export). Returns once the
/// device is live.
pub fn attach(
    device: &Path,
    size_bytes: u64,
    flags: u16,
    socket: OwnedFd,
) -> Result<Attachment, KernelError> {
    let file = open(device)?;
    ioctl(
        &file,
        device,
        NBD_SET_BLKSIZE,
        KERNEL_BLOCK_BYTES as libc::c_ulong,
    )?;
    ioctl(
        &file,
        device,
        NBD_SET_SIZE_BLOCKS,
        (size_bytes / KERNEL_BLOCK_BYTES) as libc::c_ulong,
    )?;
    ioctl(&file, device, NBD_SET_FLAGS, libc::c_ulong::from(flags))?;
    ioctl(
        &file,
        device,
        NBD_SET_SOCK,
        socket.as_raw_fd() as libc::c_ulong,
    )?;
    let path = device.to_path_buf();
    let thread = std::thread::Builder::new()
        .name("nbd-do-it".into())
        .spawn(move || {
            // Blocks while the device is attached; the kernel holds its own reference to the
            // socket, ours is closed after it returns.
            let served = ioctl(&file, &path, NBD_DO_IT, 0);
            let _ = ioctl(&file, &path, NBD_CLEAR_QUE, 0);
            let _ = ioctl(&file, &path, NBD_CLEAR_SOCK, 0);
            drop(socket);
            served
        })
        .map_err(|source| KernelError::Io {
            what: "starting the NBD_DO_IT thread for",
            device: device.to_path_buf(),
            source,
        })?;
    Ok(Attachment {
        device: device.to_path_buf(),
        thread,
    })
}

/// Disconnects `device` (as `nbd-client -d` does): the attaching process's `NBD_DO_IT`
/// returns and it exits.
pub fn detach(device: &Path) -> Result<(), KernelError> {
    if !module_loaded() {
        return Err(KernelError::ModuleMissing);
    }
    let file = open(device)?;
    ioctl(&file, device, NBD_DISCONNECT, 0)?;
    ioctl(&file, device, NBD_CLEAR_SOCK, 0)
}

//! What `image import` reads: a regular file or block device (read at any offset, only where
//! it holds data), or a stream (a pipe, read in order). Blocking calls: the callers run them
//! on tokio's blocking pool.

use crate::command::DataPath;
use anyhow::{anyhow, Context, Result};
use std::fs::File;
use std::io::{IsTerminal, Read};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::sync::Arc;

pub enum Input {
    /// A regular file or a block device (or stdin redirected from one).
    File {
        file: Arc<File>,
        len_bytes: u64,
        name: String,
    },
    /// A pipe or a character device: read in order, its length unknown in advance.
    Stream {
        reader: Box<dyn Read + Send>,
        name: String,
    },
}

impl Input {
    /// Opens `path`; stdin is used as a file when it is one (`< disk.raw`).
    pub fn open(path: &DataPath) -> Result<Input> {
        let (file, name) = match path {
            DataPath::File(p) => (
                File::open(p).with_context(|| format!("cannot open {}", p.display()))?,
                p.display().to_string(),
            ),
            DataPath::Stdio => {
                if std::io::stdin().is_terminal() {
                    // Typed image data is never meant: this would wait for it forever.
                    return Err(anyhow!(
                        "stdin is a terminal: pipe the data in, or name a FILE to import"
                    ));
                }
                // A `File` of its own (positioned reads, metadata), without closing fd 0.
                let fd = std::io::stdin()
                    .as_fd()
                    .try_clone_to_owned()
                    .context("cannot duplicate stdin")?;
                (File::from(fd), "stdin".to_string())
            }
        };
        let meta = file
            .metadata()
            .with_context(|| format!("cannot stat {name}"))?;
        let kind = meta.file_type();
        if kind.is_dir() {
            return Err(anyhow!("{name} is a directory"));
        }
        let len_bytes = if kind.is_file() {
            meta.len()
        } else if kind.is_block_device() {
            // A block device's length is where its end is.
            std::io::Seek::seek(&mut &file, std::io::SeekFrom::End(0))
                .with_context(|| format!("cannot find the size of {name}"))?
        } else {
            return Ok(Input::Stream {
                reader: Box::new(file),
                name,
            });
        };
        Ok(Input::File {
            file: Arc::new(file),
            len_bytes,
            name,
        })
    }

    /// The input's length, when known before reading it.
    pub fn len_bytes(&self) -> Option<u64> {
        match self {
            Input::File { len_bytes, .. } => Some(*len_bytes),
            Input::Stream { .. } => None,
        }
    }

    pub fn name(&self) -> &str {
        match self {
            Input::File { name, .. } | Input::Stream { name, .. } => name,
        }
    }
}

/// The parts of `[from, to)` where `file` holds data, `(offset, length)` in order, found with
/// `SEEK_DATA`/`SEEK_HOLE`. A file system (or device) without them reports everything as
/// data; the zero-block test then still keeps zeros out of the image.
pub fn data_ranges(file: &File, from: u64, to: u64) -> std::io::Result<Vec<(u64, u64)>> {
    let mut out = Vec::new();
    let mut at = from;
    while at < to {
        let data = match seek(file, at, libc::SEEK_DATA) {
            Ok(data) => data,
            // No data at or after `at`: the rest is a hole.
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => break,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                out.push((at, to - at));
                break;
            }
            Err(e) => return Err(e),
        };
        if data >= to {
            break;
        }
        let hole = match seek(file, data, libc::SEEK_HOLE) {
            Ok(hole) => hole.min(to),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENXIO | libc::EINVAL)) => to,
            Err(e) => return Err(e),
        };
        if hole <= data {
            // A file system answering this would loop forever; report the rest as data.
            out.push((data, to - data));
            break;
        }
        out.push((data, hole - data));
        at = hole;
    }
    Ok(out)
}

fn seek(file: &File, offset: u64, whence: i32) -> std::io::Result<u64> {
    let offset =
        i64::try_from(offset).map_err(|_| std::io::Error::from_raw_os_error(libc::EOVERFLOW))?;
    // SAFETY: lseek on a file descriptor `file` owns and keeps open for the call; it only
    // moves the descriptor's offset, which no other code here relies on (reads are
    // positioned).
    let at = unsafe { libc::lseek(file.as_raw_fd(), offset, whence) };
    if at < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(at as u64)
}

/// Reads exactly `len` bytes at `offset`. A file that ends first (it shrank since it was
/// measured) is an error, not zeros: the import would otherwise store a silently cut copy.
pub fn read_exact_at(file: &File, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; len as usize];
    let mut done = 0usize;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => {
                return Err(anyhow!(
                    "short read: {name} ended at byte {} while {} bytes were expected \
                     (did it change during the import?)",
                    offset + done as u64,
                    offset + len
                ))
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                return Err(anyhow!(
                    "reading {name} at byte {}: {e}",
                    offset + done as u64
                ))
            }
        }
    }
    Ok(buf)
}

/// Reads up to `len` bytes from a stream, fewer only at its end.
pub fn read_stream(reader: &mut dyn Read, name: &str, len: u64) -> Result<Vec<u8>> {
    let mut buf = Vec::with_capacity(len as usize);
    reader
        .take(len)
        .read_to_end(&mut buf)
        .with_context(|| format!("reading {name}"))?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn temp(tag: &str) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("fastblock-input-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        p
    }

    /// A sparse file's data ranges cover its written blocks and no hole larger than the file
    /// system's block (tmpfs and ext4 answer with 4 KiB granularity; a file system without
    /// SEEK_DATA would report everything, which the assertions below would catch).
    #[test]
    fn data_ranges_find_the_written_parts_of_a_sparse_file() {
        let p = temp("sparse");
        let f = File::create(&p).unwrap();
        f.set_len(64 << 20).unwrap();
        f.write_at(&[1u8; 4096], 8 << 20).unwrap();
        f.write_at(&[2u8; 8192], 40 << 20).unwrap();
        f.sync_all().unwrap();
        let f = File::open(&p).unwrap();
        let ranges = data_ranges(&f, 0, 64 << 20).unwrap();
        let total: u64 = ranges.iter().map(|r| r.1).sum();
        assert!(ranges
            .iter()
            .any(|&(o, l)| o <= 8 << 20 && o + l >= (8 << 20) + 4096));
        assert!(ranges
            .iter()
            .any(|&(o, l)| o <= 40 << 20 && o + l >= (40 << 20) + 8192));
        // Allocation units of up to 1 MiB around each write, not the whole 64 MiB.
        assert!(total <= 4 << 20, "{ranges:?}");
        // A window in the middle of a hole has no data; one cut inside data is cut too.
        assert!(data_ranges(&f, 16 << 20, 32 << 20).unwrap().is_empty());
        let cut = data_ranges(&f, 0, (8 << 20) + 2048).unwrap();
        assert_eq!(cut.last().map(|r| r.0 + r.1), Some((8 << 20) + 2048));
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn a_file_that_ends_early_is_a_short_read() {
        let p = temp("short");
        std::fs::File::create(&p)
            .unwrap()
            .write_all(&[7u8; 5000])
            .unwrap();
        let f = File::open(&p).unwrap();
        assert_eq!(read_exact_at(&f, "x", 4096, 904).unwrap(), vec![7u8; 904]);
        let e = read_exact_at(&f, "x", 4096, 4096).unwrap_err().to_string();
        assert!(e.contains("short read: x ended at byte 5000"), "{e}");
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn missing_files_and_directories_are_named() {
        let e = Input::open(&DataPath::File("/nonexistent/disk.raw".into()))
            .err()
            .unwrap();
        assert!(
            format!("{e:#}").contains("cannot open /nonexistent/disk.raw"),
            "{e:#}"
        );
        let e = Input::open(&DataPath::File("/".into())).err().unwrap();
        assert!(e.to_string().contains("is a directory"), "{e}");
    }
}

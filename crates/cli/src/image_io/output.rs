//! Where `image export` writes: a regular file, written sparse (holes and all-zero blocks are
//! skipped, its length set at the end), or a stream (stdout, a device, a pipe) that gets
//! every byte in order, zeros for holes. Blocking calls: the caller runs them on tokio's
//! blocking pool.

use crate::command::DataPath;
use anyhow::{anyhow, Context, Result};
use fastblock_client::zeros::zero_runs;
use std::fs::{File, OpenOptions};
use std::io::{IsTerminal, Write};
use std::os::unix::fs::FileExt;

/// Zeros written for a hole of a stream, this much at a time.
const ZEROS_BYTES: usize = 1 << 20;
static ZEROS: [u8; ZEROS_BYTES] = [0; ZEROS_BYTES];

pub enum Output {
    /// A regular file, empty when opened.
    Sparse { file: File, name: String },
    /// Everything else: bytes in order, `position` of them written so far.
    Stream {
        writer: Box<dyn Write + Send>,
        position: u64,
        name: String,
    },
}

impl Output {
    /// Opens `target`. An existing regular file is replaced only with `overwrite`; devices,
    /// pipes and stdout are written as they are (a terminal is refused: image data would
    /// garble it).
    pub fn open(target: &DataPath, overwrite: bool) -> Result<Output> {
        let path = match target {
            DataPath::Stdio => {
                let stdout = std::io::stdout();
                if stdout.is_terminal() {
                    return Err(anyhow!(
                        "stdout is a terminal: redirect it, or name a FILE to export to"
                    ));
                }
                return Ok(Output::Stream {
                    writer: Box::new(stdout),
                    position: 0,
                    name: "stdout".into(),
                });
            }
            DataPath::File(path) => path,
        };
        let name = path.display().to_string();
        match std::fs::metadata(path) {
            Ok(meta) if meta.file_type().is_file() && !overwrite => {
                Err(crate::exit::Failure::Refused(format!(
                    "{name} exists: pass --overwrite to replace it"
                ))
                .into())
            }
            Ok(meta) if meta.file_type().is_file() => {
                let file = OpenOptions::new()
                    .write(true)
                    .truncate(true)
                    .open(path)
                    .with_context(|| format!("cannot open {name}"))?;
                Ok(Output::Sparse { file, name })
            }
            Ok(meta) if meta.is_dir() => Err(anyhow!("{name} is a directory")),
            Ok(_) => {
                // A device or a pipe: its old content is not ours to punch holes in.
                let file = OpenOptions::new()
                    .write(true)
                    .open(path)
                    .with_context(|| format!("cannot open {name}"))?;
                Ok(Output::Stream {
                    writer: Box::new(file),
                    position: 0,
                    name,
                })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let file = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(path)
                    .with_context(|| format!("cannot create {name}"))?;
                Ok(Output::Sparse { file, name })
            }
            Err(e) => Err(anyhow!("cannot stat {name}: {e}")),
        }
    }

    pub fn name(&self) -> &str {
        match self {
            Output::Sparse { name, .. } | Output::Stream { name, .. } => name,
        }
    }

    /// Writes `data`, the image's bytes at `offset`; returns how many of them are not in
    /// all-zero blocks. A stream is first filled with zeros up to `offset`: chunks come in
    /// order, and what lies between them is holes.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Result<u64> {
        let runs = zero_runs(offset, data);
        let data_bytes: u64 = runs.iter().filter(|r| !r.zero).map(|r| r.len as u64).sum();
        match self {
            Output::Sparse { file, name } => {
                for run in runs.iter().filter(|r| !r.zero) {
                    let at = offset + run.start as u64;
                    file.write_all_at(&data[run.start..run.start + run.len], at)
                        .with_context(|| format!("writing {name} at byte {at}"))?;
                }
            }
            Output::Stream {
                writer,
                position,
                name,
            } => {
                fill_zeros(writer, position, offset, name)?;
                writer
                    .write_all(data)
                    .with_context(|| format!("writing {name} at byte {offset}"))?;
                *position += data.len() as u64;
            }
        }
        Ok(data_bytes)
    }

    /// Ends the output at `size_bytes`: a file gets its length (the holes at its end) and is
    /// synced; a stream gets the zeros of a trailing hole and is flushed.
    pub fn finish(&mut self, size_bytes: u64) -> Result<()> {
        match self {
            Output::Sparse { file, name } => {
                file.set_len(size_bytes)
                    .with_context(|| format!("setting the length of {name}"))?;
                file.sync_all().with_context(|| format!("syncing {name}"))?;
            }
            Output::Stream {
                writer,
                position,
                name,
            } => {
                fill_zeros(writer, position, size_bytes, name)?;
                writer.flush().with_context(|| format!("flushing {name}"))?;
            }
        }
        Ok(())
    }
}

fn fill_zeros(
    writer: &mut Box<dyn Write + Send>,
    position: &mut u64,
    to: u64,
    name: &str,
) -> Result<()> {
    assert!(
        *position <= to,
        "export chunks out of order: at {position}, asked to write at {to}"
    );
    while *position < to {
        let n = (to - *position).min(ZEROS_BYTES as u64) as usize;
        writer
            .write_all(&ZEROS[..n])
            .with_context(|| format!("writing {name} at byte {position}"))?;
        *position += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_file_gets_no_zero_blocks_and_its_length_at_the_end() {
        let p = std::env::temp_dir().join(format!("fastblock-output-{}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        let target = DataPath::File(p.clone());
        let mut out = Output::open(&target, false).unwrap();
        let mut data = vec![0u8; 3 * 4096];
        data[4096..8192].fill(9);
        assert_eq!(out.write(1 << 20, &data).unwrap(), 4096);
        out.finish(64 << 20).unwrap();
        let meta = std::fs::metadata(&p).unwrap();
        assert_eq!(meta.len(), 64 << 20);
        // One 4 KiB block of data (a file system may allocate a little more, never MiBs).
        assert!(meta.blocks() * 512 <= 64 << 10, "{} blocks", meta.blocks());
        let back = std::fs::read(&p).unwrap();
        assert!(back[(1 << 20) + 4096..(1 << 20) + 8192]
            .iter()
            .all(|&b| b == 9));
        assert_eq!(back.iter().filter(|&&b| b != 0).count(), 4096);
        // It exists now: refused unless replaced on purpose.
        let e = Output::open(&target, false).err().unwrap().to_string();
        assert!(e.contains("exists: pass --overwrite"), "{e}");
        Output::open(&target, true).unwrap().finish(0).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 0);
        std::fs::remove_file(&p).unwrap();
    }

    /// A writer whose bytes the test can read after the output took it.
    #[derive(Clone, Default)]
    struct Shared(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stream_gets_every_byte_zeros_for_holes() {
        let bytes = Shared::default();
        let mut out = Output::Stream {
            writer: Box::new(bytes.clone()),
            position: 0,
            name: "test".into(),
        };
        assert_eq!(out.write(4096, &[5u8; 10]).unwrap(), 10);
        assert_eq!(out.write(3 << 20, &[0u8; 4096]).unwrap(), 0);
        out.finish(5 << 20).unwrap();
        let got = bytes.0.lock().unwrap().clone();
        assert_eq!(got.len(), 5 << 20);
        assert!(got[4096..4106].iter().all(|&b| b == 5));
        assert_eq!(got.iter().filter(|&&b| b != 0).count(), 10);
    }
}

//! A simulated disk that tells the truth about fsync (after redb's `crash_consistency.rs`): it
//! keeps the bytes as last written and the bytes known durable. A crash rebuilds the device
//! from the durable image plus a seeded choice of the unsynced writes, each dropped, kept, or
//! torn at sector granularity. No clock, no thread, no hidden randomness: the seed decides.
//!
//! [`SimDisk`] is the aligned block device; [`SimFile`] is a byte-addressed, resizable file
//! with the same crash model, used as redb's `StorageBackend` so that the metadata database
//! crashes consistently with the data it describes.

use super::{assert_io_aligned, DataSync, Disk, ReadOp, WriteOp};
use fastblock_types::units::SECTOR_SIZE_BYTES;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

/// The seeded generator of crash choices (SplitMix64, shared with the PG core).
pub use fastblock_types::rng::SplitMix64 as Prng;

/// The shared state of one simulated device or file.
#[derive(Debug)]
pub struct SimImage {
    written: Vec<u8>,
    durable: Vec<u8>,
    /// Unsynced writes in issue order: (offset, bytes).
    pending: Vec<(u64, Vec<u8>)>,
    /// Fault injection: the I/O operation with this ordinal (0-based) and every later one fail.
    fail_at_io: Option<u64>,
    ios: u64,
    /// Counters for tests.
    pub syncs: u64,
    pub writes: u64,
}

impl SimImage {
    fn new(size_bytes: usize) -> Self {
        SimImage {
            written: vec![0; size_bytes],
            durable: vec![0; size_bytes],
            pending: Vec::new(),
            fail_at_io: None,
            ios: 0,
            syncs: 0,
            writes: 0,
        }
    }

    fn tick_io(&mut self, what: &str) -> io::Result<()> {
        let n = self.ios;
        self.ios += 1;
        match self.fail_at_io {
            Some(at) if n >= at => Err(io::Error::other(format!("injected I/O error on {what}"))),
            _ => Ok(()),
        }
    }

    fn write_at(&mut self, offset: u64, data: &[u8]) {
        let start = offset as usize;
        let end = start + data.len();
        if end > self.written.len() {
            self.written.resize(end, 0);
        }
        self.written[start..end].copy_from_slice(data);
        self.pending.push((offset, data.to_vec()));
        self.writes += 1;
    }

    fn sync_all(&mut self) {
        // Replaying the pending writes is much cheaper than copying the whole image.
        if self.durable.len() < self.written.len() {
            self.durable.resize(self.written.len(), 0);
        }
        for (offset, data) in self.pending.drain(..) {
            self.durable[offset as usize..offset as usize + data.len()].copy_from_slice(&data);
        }
        self.syncs += 1;
    }

    /// Simulates power loss: the device keeps the durable image plus, for each unsynced write
    /// in order, nothing, all of it, or a random subset of its sectors.
    pub fn crash(&mut self, seed: u64) {
        let mut rng = Prng::new(seed);
        let mut image = std::mem::take(&mut self.durable);
        if image.len() < self.written.len() {
            // Sizes changed by set_len are treated as durable (see SimFile::set_len).
            image.resize(self.written.len(), 0);
        }
        for (offset, data) in std::mem::take(&mut self.pending) {
            match rng.below(3) {
                0 => {}
                1 => image[offset as usize..offset as usize + data.len()].copy_from_slice(&data),
                _ => {
                    let mut pos = offset;
                    let end = offset + data.len() as u64;
                    while pos < end {
                        let sector_end = ((pos / SECTOR_SIZE_BYTES) + 1) * SECTOR_SIZE_BYTES;
                        let chunk_end = sector_end.min(end);
                        if rng.below(2) == 0 {
                            let src = (pos - offset) as usize..(chunk_end - offset) as usize;
                            image[pos as usize..chunk_end as usize].copy_from_slice(&data[src]);
                        }
                        pos = chunk_end;
                    }
                }
            }
        }
        self.written.clone_from(&image);
        self.durable = image;
        self.fail_at_io = None;
        self.ios = 0;
    }

    /// Simulates the power loss [`SimImage::crash`] may draw where no unsynced write reached
    /// the media: the device keeps exactly its durable image. For tests that need to know
    /// what a crash lost (a WAL commit in flight, say) rather than draw it.
    pub fn crash_losing_unsynced(&mut self) {
        self.pending.clear();
        if self.durable.len() < self.written.len() {
            // Sizes changed by set_len are treated as durable, as in `crash`.
            self.durable.resize(self.written.len(), 0);
        }
        self.written.clone_from(&self.durable);
        self.fail_at_io = None;
        self.ios = 0;
    }

    /// Every I/O from the `n`-th from now on fails (fail-stop tests).
    pub fn fail_after_ios(&mut self, n: u64) {
        self.fail_at_io = Some(self.ios + n);
    }

    pub fn clear_faults(&mut self) {
        self.fail_at_io = None;
    }

    /// Direct access for corruption tests: changes both images, as a disk going bad would.
    pub fn corrupt(&mut self, offset: u64, f: impl FnOnce(&mut [u8])) -> usize {
        let len = self.written.len();
        let start = (offset as usize).min(len);
        f(&mut self.written[start..]);
        self.durable.clone_from(&self.written);
        len
    }

    pub fn bytes(&self) -> &[u8] {
        &self.written
    }

    pub fn pending_writes(&self) -> usize {
        self.pending.len()
    }
}

/// Handle to a simulated device; clones share the image (the test keeps one to crash it).
#[derive(Clone, Debug)]
pub struct SimDisk {
    image: Arc<Mutex<SimImage>>,
    size_bytes: u64,
}

impl SimDisk {
    pub fn new(size_bytes: u64) -> Self {
        assert!(size_bytes.is_multiple_of(SECTOR_SIZE_BYTES));
        SimDisk {
            image: Arc::new(Mutex::new(SimImage::new(size_bytes as usize))),
            size_bytes,
        }
    }

    /// A device holding `bytes` (durable), e.g. a saved or fuzzed image.
    pub fn from_bytes(mut bytes: Vec<u8>) -> Self {
        let size_bytes = bytes.len() as u64 / SECTOR_SIZE_BYTES * SECTOR_SIZE_BYTES;
        bytes.truncate(size_bytes as usize);
        let mut img = SimImage::new(0);
        img.written.clone_from(&bytes);
        img.durable = bytes;
        SimDisk {
            image: Arc::new(Mutex::new(img)),
            size_bytes,
        }
    }

    /// Locks the image for crash, fault and corruption control.
    pub fn image(&self) -> MutexGuard<'_, SimImage> {
        self.image.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// [`SimDisk`]'s [`DataSync`]: syncs the shared image when the simulator runs the flush
/// that carries it (a crash before then keeps the writes unsynced).
struct SimSync(Arc<Mutex<SimImage>>);

impl DataSync for SimSync {
    fn sync(&mut self) -> io::Result<()> {
        let mut img = self.0.lock().unwrap_or_else(|e| e.into_inner());
        img.tick_io("sync")?;
        img.sync_all();
        Ok(())
    }
}

impl Disk for SimDisk {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn data_sync(&self) -> Option<Box<dyn DataSync>> {
        Some(Box::new(SimSync(self.image.clone())))
    }

    fn read_many(&mut self, reads: &mut [ReadOp<'_>]) -> io::Result<()> {
        let size = self.size_bytes;
        let mut img = self.image();
        for r in reads.iter_mut() {
            assert_io_aligned("sim read", r.offset_bytes, r.buf.len() as u64, size);
            img.tick_io("read")?;
            let start = r.offset_bytes as usize;
            r.buf
                .copy_from_slice(&img.written[start..start + r.buf.len()]);
        }
        Ok(())
    }

    fn write_many(&mut self, writes: &[WriteOp<'_>], sync: bool) -> io::Result<()> {
        let size = self.size_bytes;
        let mut img = self.image();
        for w in writes {
            assert_io_aligned("sim write", w.offset_bytes, w.buf.len() as u64, size);
            img.tick_io("write")?;
            img.write_at(w.offset_bytes, w.buf);
        }
        if sync {
            img.tick_io("sync")?;
            img.sync_all();
        }
        Ok(())
    }

    fn discard(&mut self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        assert_io_aligned("sim discard", offset_bytes, len_bytes, self.size_bytes);
        // Keeping the old content is one of the allowed outcomes, and the strictest for the
        // engine (it must never rely on discarded ranges reading as zeros).
        self.image().tick_io("discard")
    }
}

/// A simulated byte-addressed file, used as redb's storage backend in tests.
#[derive(Clone, Debug)]
pub struct SimFile {
    image: Arc<Mutex<SimImage>>,
}

impl Default for SimFile {
    fn default() -> Self {
        Self::new()
    }
}

impl SimFile {
    pub fn new() -> Self {
        SimFile {
            image: Arc::new(Mutex::new(SimImage::new(0))),
        }
    }

    pub fn image(&self) -> MutexGuard<'_, SimImage> {
        self.image.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl redb::StorageBackend for SimFile {
    fn len(&self) -> io::Result<u64> {
        Ok(self.image().written.len() as u64)
    }

    fn read(&self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let mut img = self.image();
        img.tick_io("meta read")?;
        let start = offset as usize;
        img.written
            .get(start..start + len)
            .map(<[u8]>::to_vec)
            .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "read past end"))
    }

    /// The simplification of this model: length changes are durable at once (a file system
    /// that journals the size). redb tolerates either outcome; the data written into the new
    /// range still follows the crash model.
    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut img = self.image();
        img.tick_io("meta set_len")?;
        img.written.resize(len as usize, 0);
        img.durable.resize(len as usize, 0);
        img.pending.retain(|(o, d)| o + d.len() as u64 <= len);
        Ok(())
    }

    fn sync_data(&self, _eventual: bool) -> io::Result<()> {
        let mut img = self.image();
        img.tick_io("meta sync")?;
        img.sync_all();
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut img = self.image();
        img.tick_io("meta write")?;
        img.write_at(offset, data);
        Ok(())
    }
}

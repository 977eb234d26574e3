//! In-memory exports for tests: a byte vector per export, with 4 KiB-block allocation that
//! behaves like the OSD's (writes allocate the blocks they touch, discards and write-zeroes
//! unmap whole blocks and zero partial ones), optional delays on reads at given offsets so
//! that tests can force out-of-order replies, and a count of the reads served. A test double,
//! not a model of durability.

use crate::backend::{Export, ExportError, Exports, IoError};
use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

const BLOCK_BYTES: u64 = 4096;

#[derive(Default)]
struct State {
    data: Vec<u8>,
    allocated: BTreeSet<u64>,
    flushes: u64,
    reads: u64,
}

/// One in-memory export. Clones share the data.
#[derive(Clone)]
pub struct MemoryExport {
    name: String,
    state: Arc<Mutex<State>>,
    /// Reads starting at these offsets take this much longer.
    slow_reads: Vec<(u64, Duration)>,
    read_only: bool,
}

impl MemoryExport {
    pub fn new(name: &str, size_bytes: u64) -> MemoryExport {
        MemoryExport {
            name: name.to_owned(),
            state: Arc::new(Mutex::new(State {
                data: vec![0; size_bytes as usize],
                ..State::default()
            })),
            slow_reads: Vec::new(),
            read_only: false,
        }
    }

    /// The export refuses writes (as a snapshot's does).
    pub fn read_only(mut self) -> MemoryExport {
        self.read_only = true;
        self
    }

    /// Reads starting at `offset` take `delay` longer (to reorder replies in tests); may be
    /// given for several offsets.
    pub fn with_slow_read(mut self, offset: u64, delay: Duration) -> MemoryExport {
        self.slow_reads.push((offset, delay));
        self
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A copy of the whole export.
    pub fn contents(&self) -> Vec<u8> {
        self.lock().data.clone()
    }

    /// Blocks holding data.
    pub fn allocated_blocks(&self) -> usize {
        self.lock().allocated.len()
    }

    pub fn flushes(&self) -> u64 {
        self.lock().flushes
    }

    /// Reads that returned their data (after any delay), on every connection.
    pub fn reads_served(&self) -> u64 {
        self.lock().reads
    }

    fn check(&self, offset: u64, len: u64) -> Result<(), IoError> {
        let size = self.size_bytes();
        match offset.checked_add(len) {
            Some(end) if end <= size => Ok(()),
            _ => Err(IoError::Invalid(format!(
                "{offset}+{len} outside {size} bytes"
            ))),
        }
    }

    fn zero(&self, offset: u64, len: u64) -> Result<(), IoError> {
        self.check(offset, len)?;
        let mut s = self.lock();
        let end = offset + len;
        s.data[offset as usize..end as usize].fill(0);
        for block in offset.div_ceil(BLOCK_BYTES)..end / BLOCK_BYTES {
            s.allocated.remove(&block);
        }
        Ok(())
    }
}

impl Export for MemoryExport {
    fn read_only(&self) -> bool {
        self.read_only
    }

    fn size_bytes(&self) -> u64 {
        self.lock().data.len() as u64
    }

    fn description(&self) -> String {
        format!("in-memory export {}", self.name)
    }

    async fn read(&self, offset: u64, len: u32) -> Result<Bytes, IoError> {
        self.check(offset, u64::from(len))?;
        let delay = self.slow_reads.iter().find(|(at, _)| *at == offset);
        if let Some((_, delay)) = delay {
            tokio::time::sleep(*delay).await;
        }
        let mut s = self.lock();
        s.reads += 1;
        Ok(Bytes::copy_from_slice(
            &s.data[offset as usize..(offset + u64::from(len)) as usize],
        ))
    }

    async fn write(&self, offset: u64, data: Bytes) -> Result<(), IoError> {
        self.check(offset, data.len() as u64)?;
        let mut s = self.lock();
        let end = offset + data.len() as u64;
        s.data[offset as usize..end as usize].copy_from_slice(&data);
        for block in offset / BLOCK_BYTES..end.div_ceil(BLOCK_BYTES) {
            s.allocated.insert(block);
        }
        Ok(())
    }

    async fn discard(&self, offset: u64, len: u64) -> Result<(), IoError> {
        self.zero(offset, len)
    }

    async fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), IoError> {
        self.zero(offset, len)
    }

    async fn flush(&self) -> Result<(), IoError> {
        self.lock().flushes += 1;
        Ok(())
    }

    async fn allocated_ranges(&self, offset: u64, len: u64) -> Result<Vec<(u64, u64)>, IoError> {
        self.check(offset, len)?;
        let s = self.lock();
        let end = offset + len;
        let mut out: Vec<(u64, u64)> = Vec::new();
        let first = offset / BLOCK_BYTES;
        for &block in s.allocated.range(first..end.div_ceil(BLOCK_BYTES)) {
            let lo = (block * BLOCK_BYTES).max(offset);
            let hi = ((block + 1) * BLOCK_BYTES).min(end);
            match out.last_mut() {
                Some((start, l)) if *start + *l == lo => *l += hi - lo,
                _ => out.push((lo, hi - lo)),
            }
        }
        Ok(out)
    }
}

/// A fixed set of in-memory exports by name.
#[derive(Clone, Default)]
pub struct MemoryExports {
    exports: BTreeMap<String, MemoryExport>,
}

impl MemoryExports {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with(mut self, export: MemoryExport) -> Self {
        self.exports.insert(export.name.clone(), export);
        self
    }

    pub fn get(&self, name: &str) -> Option<&MemoryExport> {
        self.exports.get(name)
    }
}

impl Exports for MemoryExports {
    type Export = MemoryExport;

    async fn list(&self) -> Result<Vec<String>, ExportError> {
        Ok(self.exports.keys().cloned().collect())
    }

    async fn open(&self, name: &str) -> Result<MemoryExport, ExportError> {
        self.exports
            .get(name)
            .cloned()
            .ok_or_else(|| ExportError::NotFound(name.to_owned()))
    }
}

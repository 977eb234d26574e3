//! A window of a disk: each shard owns one equal, aligned region of the OSD's device and runs
//! its own store (WAL and objects) in it, so shards never share a lock or a queue.

use fastblock_store::disk::{
    AlignedBuf, BackgroundRun, OwnedWrite, ReadOp, Reaped, Submitted, WriteOp,
};
use fastblock_store::{Disk, FaultPlan, FaultyDisk};
use std::io;

/// Region boundaries are aligned to this, far above any sector or block size.
pub const REGION_ALIGN_BYTES: u64 = 1 << 20;

pub struct RegionDisk<D: Disk> {
    inner: D,
    offset_bytes: u64,
    size_bytes: u64,
}

impl RegionDisk<FaultyDisk<fastblock_store::UringDisk>> {
    /// [`fastblock_store::UringDisk::wait_completion`] (the ring is the whole device's; a wait
    /// is never faulted).
    pub fn wait_completion(
        &mut self,
        timeout: std::time::Duration,
    ) -> io::Result<Option<fastblock_store::disk::CompletionWait>> {
        self.inner.wait_completion(timeout)
    }

    /// [`fastblock_store::UringDisk::commits_reportable`] (the ring is the whole device's).
    pub fn commits_reportable(&mut self) -> bool {
        self.inner.commits_reportable()
    }
}

impl<D: Disk> RegionDisk<FaultyDisk<D>> {
    /// Region `index` of `count` of `inner`, which a [`FaultyDisk`] wraps with `plan` (a shard's
    /// disk: the plan is empty unless `--fault-injection-file` fills it). The plan's ranges
    /// are relative to the region, as the shard's store sees its offsets.
    pub fn new_faulty(inner: D, plan: FaultPlan, index: u32, count: u32) -> io::Result<Self> {
        let (offset_bytes, _) = region_bounds(inner.size_bytes(), index, count)?;
        RegionDisk::new(
            FaultyDisk::new(inner, plan).with_origin(offset_bytes),
            index,
            count,
        )
    }
}

/// Offset and size of region `index` of `count` equal regions of a device of `device_bytes`.
fn region_bounds(device_bytes: u64, index: u32, count: u32) -> io::Result<(u64, u64)> {
    assert!(index < count, "region {index} of {count}");
    let region = device_bytes / u64::from(count) / REGION_ALIGN_BYTES * REGION_ALIGN_BYTES;
    if region == 0 {
        return Err(io::Error::other(format!(
            "device of {device_bytes} bytes is too small for {count} shards"
        )));
    }
    Ok((region * u64::from(index), region))
}

impl<D: Disk> RegionDisk<D> {
    /// Region `index` of `count` equal regions of `inner`.
    pub fn new(inner: D, index: u32, count: u32) -> io::Result<Self> {
        let (offset_bytes, size_bytes) = region_bounds(inner.size_bytes(), index, count)?;
        Ok(RegionDisk {
            inner,
            offset_bytes,
            size_bytes,
        })
    }

    fn shift<'a>(&self, ops: &[WriteOp<'a>]) -> Vec<WriteOp<'a>> {
        ops.iter()
            .map(|w| {
                self.check(w.offset_bytes, w.buf.len());
                WriteOp {
                    offset_bytes: w.offset_bytes + self.offset_bytes,
                    buf: w.buf,
                }
            })
            .collect()
    }

    fn check(&self, offset: u64, len: usize) {
        assert!(
            offset + len as u64 <= self.size_bytes,
            "region access {offset}+{len} beyond {}",
            self.size_bytes
        );
    }
}

impl<D: Disk> Disk for RegionDisk<D> {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// The whole device's sync: it covers this region's writes too.
    fn data_sync(&self) -> Option<Box<dyn fastblock_store::disk::DataSync>> {
        self.inner.data_sync()
    }

    fn read_many(&mut self, reads: &mut [ReadOp<'_>]) -> io::Result<()> {
        for r in reads.iter_mut() {
            self.check(r.offset_bytes, r.buf.len());
            r.offset_bytes += self.offset_bytes;
        }
        let result = self.inner.read_many(reads);
        for r in reads.iter_mut() {
            r.offset_bytes -= self.offset_bytes;
        }
        result
    }

    fn write_many(&mut self, writes: &[WriteOp<'_>], sync: bool) -> io::Result<()> {
        let shifted: Vec<WriteOp<'_>> = writes
            .iter()
            .map(|w| {
                self.check(w.offset_bytes, w.buf.len());
                WriteOp {
                    offset_bytes: w.offset_bytes + self.offset_bytes,
                    buf: w.buf,
                }
            })
            .collect();
        self.inner.write_many(&shifted, sync)
    }

    fn write_durable_with(
        &mut self,
        durable: &[WriteOp<'_>],
        background: &[WriteOp<'_>],
    ) -> io::Result<()> {
        let durable = self.shift(durable);
        let background = self.shift(background);
        self.inner.write_durable_with(&durable, &background)
    }

    fn write_background(&mut self, buf: AlignedBuf, runs: &[BackgroundRun]) -> io::Result<()> {
        let shifted: Vec<BackgroundRun> = runs
            .iter()
            .map(|r| {
                self.check(r.disk_offset_bytes, r.len);
                BackgroundRun {
                    disk_offset_bytes: r.disk_offset_bytes + self.offset_bytes,
                    ..*r
                }
            })
            .collect();
        self.inner.write_background(buf, &shifted)
    }

    fn wait_background(&mut self) -> io::Result<()> {
        self.inner.wait_background()
    }

    fn background_mark(&self) -> u64 {
        self.inner.background_mark()
    }

    fn background_written(&mut self, mark: u64) -> io::Result<bool> {
        self.inner.background_written(mark)
    }

    fn submit_durable(&mut self, writes: Vec<OwnedWrite>) -> io::Result<Submitted> {
        let shifted = writes
            .into_iter()
            .map(|w| {
                self.check(w.offset_bytes, w.buf.len());
                OwnedWrite {
                    offset_bytes: w.offset_bytes + self.offset_bytes,
                    buf: w.buf,
                }
            })
            .collect();
        self.inner.submit_durable(shifted)
    }

    fn reap_durable(&mut self, wait: bool) -> io::Result<Reaped> {
        self.inner.reap_durable(wait)
    }

    fn sync(&mut self) -> io::Result<()> {
        self.inner.sync()
    }

    fn discard(&mut self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        self.check(offset_bytes, len_bytes as usize);
        self.inner
            .discard(offset_bytes + self.offset_bytes, len_bytes)
    }
}

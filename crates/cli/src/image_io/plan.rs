//! Pure decisions of `image import|export|cp`: how the image is walked (windows for the
//! allocation queries, chunks for the IO), the size an import creates, and the summary line.
//! The unit tests below pin them.

use fastblock_client::zeros::HOLE_BLOCK_BYTES;
use fastblock_types::units::format_size;
use serde::Serialize;
use std::time::Duration;

/// Most bytes of one chunk: the unit read and written by one task. 4 MiB, the default object
/// size, so that a chunk of an image with default objects is one object (four 1 MiB write
/// requests, `fastblock_client::split::WRITE_PIECE_BYTES_MAX`).
pub const CHUNK_BYTES_MAX: u64 = 4 << 20;

/// Bytes of the image (or the file) one allocation question covers: the cluster's allocated
/// ranges, or a file's SEEK_DATA/SEEK_HOLE walk, are asked for one window at a time, so
/// that a huge, fragmented image never lists all its ranges in memory at once. 256 MiB is
/// 64 objects of 4 MiB per question.
pub const WINDOW_BYTES: u64 = 256 << 20;

/// An image's size is a multiple of this (the monitor refuses others).
pub const IMAGE_SIZE_ALIGN_BYTES: u64 = 4096;

// Windows are cut into whole chunks, so that no chunk spans two windows.
const _: () = assert!(WINDOW_BYTES % CHUNK_BYTES_MAX == 0);
// Chunks start on block boundaries, so that the zero-block test of a chunk's data sees the
// same aligned blocks whatever the chunking.
const _: () = assert!(CHUNK_BYTES_MAX % HOLE_BLOCK_BYTES == 0);

/// The windows of `[0, size_bytes)`: `(offset, length)`, in order.
pub fn windows(size_bytes: u64) -> impl Iterator<Item = (u64, u64)> {
    (0..size_bytes.div_ceil(WINDOW_BYTES)).map(move |i| {
        let offset = i * WINDOW_BYTES;
        (offset, WINDOW_BYTES.min(size_bytes - offset))
    })
}

/// Cuts data `ranges` (`(offset, length)`, in order, not overlapping) into chunks that never
/// cross a multiple of [`CHUNK_BYTES_MAX`], in order. Empty ranges give nothing.
pub fn chunks(ranges: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for &(offset, len) in ranges {
        let end = offset + len;
        let mut at = offset;
        while at < end {
            let boundary = (at / CHUNK_BYTES_MAX + 1) * CHUNK_BYTES_MAX;
            let chunk_end = boundary.min(end);
            out.push((at, chunk_end - at));
            at = chunk_end;
        }
    }
    out
}

/// The size of the image an import creates: `--size` if given (at least the file's length,
/// so no data is cut), else the file's length rounded up to 4 KiB (the tail reads as
/// zeros). A stream's length is unknown in advance: it needs `--size`.
pub fn import_size(file_bytes: Option<u64>, size_flag_bytes: Option<u64>) -> Result<u64, String> {
    match (file_bytes, size_flag_bytes) {
        (None, None) => Err(
            "the input is not a regular file or device (a pipe?): its length is unknown, \
             give the image's size with --size"
                .into(),
        ),
        (None, Some(size)) => Ok(size),
        (Some(file), Some(size)) if size < file => Err(format!(
            "--size {} is smaller than the input ({file} bytes): the import would cut data",
            format_size(size)
        )),
        (Some(_), Some(size)) => Ok(size),
        (Some(0), None) => {
            Err("the input is empty: give --size to create an empty image of that size".into())
        }
        (Some(file), None) => Ok(file.div_ceil(IMAGE_SIZE_ALIGN_BYTES) * IMAGE_SIZE_ALIGN_BYTES),
    }
}

/// What an import, export or copy did, printed as one line (or JSON with `--json`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    /// `imported`, `exported` or `copied`.
    pub verb: &'static str,
    pub source: String,
    pub target: String,
    /// The image's size.
    pub bytes: u64,
    /// Bytes that held data (not holes, not all-zero blocks): what was written to the image,
    /// or to the file outside its holes.
    pub data_bytes: u64,
    pub seconds: f64,
    /// `data_bytes` per second, in MB (10^6 bytes).
    pub mb_per_s: f64,
}

impl Summary {
    pub fn new(
        verb: &'static str,
        source: String,
        target: String,
        bytes: u64,
        data_bytes: u64,
        elapsed: Duration,
    ) -> Summary {
        let seconds = elapsed.as_secs_f64();
        // A copy of nothing can finish within the clock's resolution.
        let mb_per_s = data_bytes as f64 / 1e6 / seconds.max(1e-6);
        Summary {
            verb,
            source,
            target,
            bytes,
            data_bytes,
            seconds,
            mb_per_s,
        }
    }

    /// `imported disk.raw into rbd/vm1: 10 GiB, 1 MiB of data in 1.52 s (0.7 MB/s)`.
    pub fn line(&self) -> String {
        format!(
            "{} {} into {}: {}, {} of data in {:.2} s ({:.1} MB/s)",
            self.verb,
            self.source,
            self.target,
            format_size(self.bytes),
            format_size(self.data_bytes),
            self.seconds,
            self.mb_per_s
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn windows_cover_the_image_once() {
        assert_eq!(windows(0).count(), 0);
        let w: Vec<_> = windows(WINDOW_BYTES * 2 + 4096).collect();
        assert_eq!(
            w,
            vec![
                (0, WINDOW_BYTES),
                (WINDOW_BYTES, WINDOW_BYTES),
                (2 * WINDOW_BYTES, 4096)
            ]
        );
        assert_eq!(windows(WINDOW_BYTES).count(), 1);
    }

    #[test]
    fn chunks_stop_at_every_chunk_boundary() {
        let c = chunks(&[(MIB, 8 * MIB), (20 * MIB, 4096), (24 * MIB - 4096, 8192)]);
        assert_eq!(
            c,
            vec![
                (MIB, 3 * MIB),
                (4 * MIB, 4 * MIB),
                (8 * MIB, MIB),
                (20 * MIB, 4096),
                (24 * MIB - 4096, 4096),
                (24 * MIB, 4096),
            ]
        );
        assert!(chunks(&[]).is_empty());
        assert!(chunks(&[(5, 0)]).is_empty());
        for (offset, len) in c {
            assert!(len > 0 && len <= CHUNK_BYTES_MAX);
            assert_eq!(
                offset / CHUNK_BYTES_MAX,
                (offset + len - 1) / CHUNK_BYTES_MAX
            );
        }
    }

    #[test]
    fn an_import_takes_the_files_size_rounded_up_or_a_larger_size() {
        assert_eq!(import_size(Some(8192), None), Ok(8192));
        assert_eq!(import_size(Some(8193), None), Ok(12288));
        assert_eq!(import_size(Some(8193), Some(MIB)), Ok(MIB));
        assert_eq!(import_size(None, Some(MIB)), Ok(MIB));
        assert!(import_size(Some(2 * MIB), Some(MIB))
            .unwrap_err()
            .contains("smaller than the input"));
        assert!(import_size(None, None).unwrap_err().contains("--size"));
        assert!(import_size(Some(0), None).unwrap_err().contains("empty"));
    }

    #[test]
    fn the_summary_says_sizes_time_and_rate() {
        let s = Summary::new(
            "imported",
            "disk.raw".into(),
            "rbd/vm1".into(),
            10 << 30,
            2_000_000,
            Duration::from_secs(2),
        );
        assert_eq!(s.mb_per_s, 1.0);
        assert_eq!(
            s.line(),
            "imported disk.raw into rbd/vm1: 10 GiB, 1.91 MiB of data in 2.00 s (1.0 MB/s)"
        );
        let instant = Summary::new("copied", "a".into(), "b".into(), 0, 0, Duration::ZERO);
        assert!(instant.mb_per_s.is_finite());
    }
}

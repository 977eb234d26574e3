//! One validated request against an export, into its reply. Runs as one future among those
//! of its connection's task, so requests of a connection proceed concurrently and are answered
//! as they finish.

use crate::backend::{Export, IoError};
use crate::consts::*;
use crate::extents::allocation_descriptors;
use crate::reply::{self, ReplyBytes};
use crate::request::Command;
use bytes::Bytes;

/// Zeros written by `WRITE_ZEROES` with `NO_HOLE` (which must allocate), a chunk at a time.
/// Static, so that a large write-zeroes costs no allocation.
static ZEROS: [u8; ZERO_CHUNK_BYTES] = [0; ZERO_CHUNK_BYTES];
const ZERO_CHUNK_BYTES: usize = 4 << 20;

/// Runs `command` (with its payload, for a write) and builds the reply for `handle`.
pub async fn execute<X: Export>(
    export: &X,
    command: Command,
    handle: u64,
    payload: Bytes,
    structured: bool,
) -> ReplyBytes {
    let failed = |e: IoError| reply::error(handle, structured, e.nbd_error(), &e.to_string());
    let done = |r: Result<(), IoError>| match r {
        Ok(()) => reply::simple(handle, 0),
        Err(e) => failed(e),
    };
    let writes = matches!(
        command,
        Command::Write { .. } | Command::Trim { .. } | Command::WriteZeroes { .. }
    );
    if writes && export.read_only() {
        return failed(IoError::ReadOnly("the export is read-only".into()));
    }
    match command {
        Command::Read { offset, length, df } => match export.read(offset, length).await {
            Ok(data) if data.len() != length as usize => failed(IoError::Io(format!(
                "read of {length} bytes returned {}",
                data.len()
            ))),
            Ok(data) if structured => reply::structured_read(handle, offset, data, df),
            Ok(data) => reply::simple_read(handle, data),
            Err(e) => failed(e),
        },
        Command::Write { offset, .. } => done(export.write(offset, payload).await),
        Command::Flush => done(export.flush().await),
        Command::Trim { offset, length } => done(export.discard(offset, u64::from(length)).await),
        // There is no server-side cache to fill: the OSDs serve every read from their store.
        Command::Cache { .. } => reply::simple(handle, 0),
        Command::WriteZeroes {
            offset,
            length,
            no_hole,
            fast_zero,
        } => {
            if no_hole && fast_zero {
                // Allocating zeros means writing them: no faster than a write, so the spec
                // wants ENOTSUP at once (the client then writes zeros itself).
                return reply::error(
                    handle,
                    structured,
                    ENOTSUP,
                    "zeroing with NO_HOLE is not faster than writing",
                );
            }
            if no_hole {
                done(write_zero_chunks(export, offset, u64::from(length)).await)
            } else {
                done(export.write_zeroes(offset, u64::from(length)).await)
            }
        }
        Command::BlockStatus {
            offset,
            length,
            req_one,
        } => {
            // The spec lets an answer cover less than asked; the client continues from its end.
            let window = length.min(BLOCK_STATUS_BYTES_MAX as u32);
            match export.allocated_ranges(offset, u64::from(window)).await {
                Ok(ranges) => {
                    let descriptors = allocation_descriptors(offset, window, &ranges, req_one);
                    reply::block_status(handle, META_BASE_ALLOCATION_ID, &descriptors)
                }
                Err(e) => failed(e),
            }
        }
        // The connection stops reading at a disconnect and never runs it.
        Command::Disconnect => failed(IoError::Invalid("disconnect has no reply".into())),
    }
}

/// Writes real zero blocks (so they are allocated), one chunk after another.
async fn write_zero_chunks<X: Export>(export: &X, offset: u64, len: u64) -> Result<(), IoError> {
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(ZERO_CHUNK_BYTES as u64) as usize;
        export
            .write(offset + done, Bytes::from_static(&ZEROS[..n]))
            .await?;
        done += n as u64;
    }
    Ok(())
}

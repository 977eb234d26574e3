//! [`Image`]: async block IO on one image. Every call checks its range, splits it at object
//! boundaries ([`crate::split`]), runs the object requests concurrently, and returns the first
//! error (the other requests are cancelled; a failed write leaves its range undefined, like a
//! failed write to a disk).

use crate::cluster::Cluster;
use crate::leader::reply_name;
use crate::split::{check_range, split, Extent, PIECE_BYTES_MAX, WRITE_PIECE_BYTES_MAX};
use crate::ClientError;
use bytes::{Bytes, BytesMut};
use fastblock_types::map::ImageInfo;
use fastblock_types::PgId;
use fastblock_wire::{ObjectAddr, Reply, Request};
use std::sync::Arc;
use tokio::task::JoinSet;

/// An open image. Cheap to clone (clones share the image and its flush gate).
#[derive(Clone)]
pub struct Image {
    inner: Arc<Inner>,
}

struct Inner {
    cluster: Arc<Cluster>,
    info: ImageInfo,
    /// The pool's PG count at open: it fixes where every object lives (pools are not split).
    pg_count: u32,
    /// Writes hold it shared; `flush` takes it exclusively, so it returns only after every
    /// write that was in flight when it was called has finished.
    write_gate: tokio::sync::RwLock<()>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Read,
    Write,
    Discard,
    WriteZeroes,
}

impl Image {
    pub(crate) fn new(
        cluster: Arc<Cluster>,
        info: ImageInfo,
        pg_count: u32,
    ) -> Result<Image, ClientError> {
        // Offsets within an object are u32 on the wire.
        if info.object_size_bytes == 0 || info.object_size_bytes > 1 << 32 {
            return Err(ClientError::Protocol(format!(
                "image {}/{} has object size {} bytes; the wire addresses 1 byte to 4 GiB",
                info.pool_name, info.name, info.object_size_bytes
            )));
        }
        if pg_count == 0 {
            return Err(ClientError::Protocol(format!(
                "pool {} of image {} has no PGs",
                info.pool_name, info.name
            )));
        }
        Ok(Image {
            inner: Arc::new(Inner {
                cluster,
                info,
                pg_count,
                write_gate: tokio::sync::RwLock::new(()),
            }),
        })
    }

    pub fn info(&self) -> &ImageInfo {
        &self.inner.info
    }

    pub fn size_bytes(&self) -> u64 {
        self.inner.info.size_bytes
    }

    pub fn cluster(&self) -> &Arc<Cluster> {
        &self.inner.cluster
    }

    /// The PG that holds object `object_index` of this image.
    pub fn object_pg(&self, object_index: u64) -> PgId {
        let info = &self.inner.info;
        crate::route::object_pg(info.pool, self.inner.pg_count, info.id, object_index)
    }

    /// Reads `len` bytes at `offset`. Never-written bytes read as zeros (the OSD's job).
    pub async fn read(&self, offset: u64, len: u64) -> Result<Bytes, ClientError> {
        let pieces = self.run(Op::Read, offset, len, None).await?;
        if pieces.len() == 1 {
            // The common case: one object, the reply's buffer is returned as is.
            return Ok(pieces.into_iter().next().flatten().unwrap_or_default());
        }
        let mut out = BytesMut::with_capacity(len as usize);
        for piece in pieces.into_iter().flatten() {
            out.extend_from_slice(&piece);
        }
        debug_assert_eq!(out.len() as u64, len);
        Ok(out.freeze())
    }

    /// Writes `data` at `offset`. Acknowledged only when durable on a majority of every PG it
    /// touched.
    pub async fn write(&self, offset: u64, data: Bytes) -> Result<(), ClientError> {
        let _gate = self.inner.write_gate.read().await;
        let len = data.len() as u64;
        self.run(Op::Write, offset, len, Some(data)).await.map(drop)
    }

    /// Discards `len` bytes at `offset`: they read as zeros afterwards.
    pub async fn discard(&self, offset: u64, len: u64) -> Result<(), ClientError> {
        let _gate = self.inner.write_gate.read().await;
        self.run(Op::Discard, offset, len, None).await.map(drop)
    }

    /// Writes zeros over `len` bytes at `offset` without sending them.
    pub async fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), ClientError> {
        let _gate = self.inner.write_gate.read().await;
        self.run(Op::WriteZeroes, offset, len, None).await.map(drop)
    }

    /// Returns once every write issued before this call has finished. An acknowledged write
    /// is already durable on a majority, so there is nothing more to wait for.
    pub async fn flush(&self) -> Result<(), ClientError> {
        drop(self.inner.write_gate.write().await);
        Ok(())
    }

    /// Checks the range, splits it, and runs the pieces; returns read data in piece order.
    async fn run(
        &self,
        op: Op,
        offset: u64,
        len: u64,
        data: Option<Bytes>,
    ) -> Result<Vec<Option<Bytes>>, ClientError> {
        check_range(offset, len, self.size_bytes())?;
        let piece_bytes_max = match op {
            Op::Write => WRITE_PIECE_BYTES_MAX,
            Op::Read | Op::Discard | Op::WriteZeroes => PIECE_BYTES_MAX,
        };
        let extents = split(
            offset,
            len,
            self.inner.info.object_size_bytes,
            piece_bytes_max,
        );
        let piece_data = |e: &Extent| {
            data.as_ref().map(|d| {
                let start = e.buffer_offset as usize;
                d.slice(start..start + e.len as usize)
            })
        };
        match extents.as_slice() {
            [] => Ok(Vec::new()),
            // One piece: no task to spawn.
            [only] => Ok(vec![self.object_op(op, *only, piece_data(only)).await?]),
            many => {
                let mut tasks = JoinSet::new();
                for (index, extent) in many.iter().enumerate() {
                    let image = self.clone();
                    let extent = *extent;
                    let piece = piece_data(&extent);
                    tasks.spawn(async move { (index, image.object_op(op, extent, piece).await) });
                }
                let mut out = vec![None; many.len()];
                while let Some(joined) = tasks.join_next().await {
                    let (index, result) = match joined {
                        Ok(done) => done,
                        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                        Err(e) => return Err(ClientError::Protocol(format!("IO task: {e}"))),
                    };
                    // The first error wins; dropping `tasks` cancels the others.
                    out[index] = result?;
                }
                Ok(out)
            }
        }
    }

    async fn object_op(
        &self,
        op: Op,
        extent: Extent,
        data: Option<Bytes>,
    ) -> Result<Option<Bytes>, ClientError> {
        let pg = self.object_pg(extent.object_index);
        let addr = ObjectAddr {
            pg,
            image: self.inner.info.id,
            object_index: extent.object_index,
        };
        let (offset, length) = (extent.object_offset, extent.len);
        let data = data.unwrap_or_default();
        let build = move |epoch| match op {
            Op::Read => Request::Read {
                addr,
                offset,
                length,
                epoch,
            },
            Op::Write => Request::Write {
                addr,
                offset,
                epoch,
                data: data.clone(),
            },
            Op::Discard => Request::Discard {
                addr,
                offset,
                length,
                epoch,
            },
            Op::WriteZeroes => Request::WriteZeroes {
                addr,
                offset,
                length,
                epoch,
            },
        };
        let reply = self.inner.cluster.execute(pg, &build).await?;
        match (op, reply) {
            (Op::Read, Reply::Data(bytes)) if bytes.len() == length as usize => Ok(Some(bytes)),
            (Op::Read, Reply::Data(bytes)) => Err(ClientError::Protocol(format!(
                "PG {pg}: read of {length} bytes at object {}+{offset} answered with {} bytes",
                extent.object_index,
                bytes.len()
            ))),
            (Op::Write | Op::Discard | Op::WriteZeroes, Reply::Ok) => Ok(None),
            (op, other) => Err(ClientError::Protocol(format!(
                "PG {pg}: unexpected {} reply to {op:?}",
                reply_name(&other)
            ))),
        }
    }
}

impl std::fmt::Debug for Image {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Image")
            .field("info", &self.inner.info)
            .finish()
    }
}

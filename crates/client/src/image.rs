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
use fastblock_wire::{AllocatedRange, ObjectAddr, Reply, Request};
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
    /// A read-only view of this image snapshot (`info.size_bytes` is then the snapshot's
    /// size), or the image's head.
    snap: Option<SnapView>,
    /// The parent snapshot of a clone (`docs/design/snapshots.md`, "Clones").
    parent: Option<ParentLink>,
}

/// A clone's parent: objects the clone has not copied up read from here, within the
/// overlap.
struct ParentLink {
    /// A read-only view of the parent snapshot, `overlap_bytes` large.
    view: Image,
    overlap_bytes: u64,
    /// Objects known to be copied up (a cache: the OSD's mark is the truth).
    copied: std::sync::Mutex<std::collections::HashSet<u64>>,
    /// One copy-up at a time per object, so that this client's writes wait for it.
    locks: std::sync::Mutex<std::collections::HashMap<u64, Arc<tokio::sync::Mutex<()>>>>,
}

/// A copy-up is written in pieces of at most this much (each a log entry).
const COPY_UP_PIECE_BYTES_MAX: u64 = WRITE_PIECE_BYTES_MAX;

/// Which snapshot a read-only [`Image`] shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapView {
    pub id: u64,
    pub name: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Read,
    Write,
    Discard,
    WriteZeroes,
    Allocation,
    Rollback,
}

/// What one object request returned.
enum Piece {
    Done,
    Data(Bytes),
    /// Allocated ranges, already checked and made image-absolute: (offset, length).
    Allocated(Vec<(u64, u64)>),
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
                snap: None,
                parent: None,
            }),
        })
    }

    /// This image as a clone of `parent` (a read-only view of the parent snapshot), whose
    /// data reads through to it within `overlap_bytes` until copied up.
    pub(crate) fn with_parent(self, parent: Image, overlap_bytes: u64) -> Image {
        let inner = &self.inner;
        Image {
            inner: Arc::new(Inner {
                cluster: inner.cluster.clone(),
                info: inner.info.clone(),
                pg_count: inner.pg_count,
                write_gate: tokio::sync::RwLock::new(()),
                snap: inner.snap.clone(),
                parent: Some(ParentLink {
                    view: parent,
                    overlap_bytes,
                    copied: Default::default(),
                    locks: Default::default(),
                }),
            }),
        }
    }

    /// Whether this image is a clone that still reads through to a parent snapshot.
    pub fn is_clone(&self) -> bool {
        self.inner.parent.is_some()
    }

    /// Copies every object of a clone that it has not copied up yet from its parent,
    /// `objects_in_flight_max` at a time, calling `progress` with (objects done, objects in
    /// all) after each; the clone then holds all its data (the caller tells the monitor,
    /// which ends the link). Not a clone: nothing to do.
    pub async fn flatten(
        &self,
        objects_in_flight_max: usize,
        progress: &(dyn Fn(u64, u64) + Send + Sync),
    ) -> Result<(), ClientError> {
        self.writable()?;
        let Some(link) = &self.inner.parent else {
            return Ok(());
        };
        let object_bytes = self.inner.info.object_size_bytes;
        // Every object some version reads from the parent: the head's overlap and every
        // snapshot's (a deep flatten, so that the snapshots stand alone too).
        let count = self.parent_reach_bytes(link).div_ceil(object_bytes);
        self.for_each_object(
            count,
            objects_in_flight_max,
            progress,
            |image, object| async move { image.ensure_copied(object).await },
        )
        .await
    }

    /// Runs `op` on objects `0..count` of this image, `objects_in_flight_max` at a time,
    /// calling `progress` with (objects done, objects in all) after each; the first error
    /// ends it (the tasks still running are cancelled).
    async fn for_each_object<F, Fut>(
        &self,
        count: u64,
        objects_in_flight_max: usize,
        progress: &(dyn Fn(u64, u64) + Send + Sync),
        op: F,
    ) -> Result<(), ClientError>
    where
        F: Fn(Image, u64) -> Fut,
        Fut: std::future::Future<Output = Result<(), ClientError>> + Send + 'static,
    {
        let mut tasks = JoinSet::new();
        let (mut next, mut done) = (0u64, 0u64);
        while done < count {
            while next < count && tasks.len() < objects_in_flight_max.max(1) {
                tasks.spawn(op(self.clone(), next));
                next += 1;
            }
            match tasks.join_next().await {
                Some(Ok(r)) => {
                    r?;
                    done += 1;
                    progress(done, count);
                }
                Some(Err(e)) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Some(Err(e)) => return Err(ClientError::Protocol(format!("IO task: {e}"))),
                None => break,
            }
        }
        Ok(())
    }

    fn addr(&self, object_index: u64) -> ObjectAddr {
        ObjectAddr {
            pg: self.object_pg(object_index),
            image: self.inner.info.id,
            object_index,
        }
    }

    /// Makes object `object_index` of a clone hold its own data before it is changed: reads
    /// the parent's object (within the overlap), writes it in pieces (all-zero pieces are
    /// holes already), then marks the object copied (`docs/design/snapshots.md`, "Clones").
    async fn ensure_copied(&self, object_index: u64) -> Result<(), ClientError> {
        let Some(link) = &self.inner.parent else {
            return Ok(());
        };
        let known = |l: &ParentLink| {
            l.copied
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(&object_index)
        };
        if known(link) {
            return Ok(());
        }
        let lock = link
            .locks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(object_index)
            .or_default()
            .clone();
        let _held = lock.lock().await;
        if known(link) {
            return Ok(());
        }
        let addr = self.addr(object_index);
        let probe = move |epoch| Request::CloneRead {
            addr,
            offset: 0,
            length: 0,
            epoch,
        };
        // An object beyond the head's size (a deep flatten for a snapshot of a shrunk clone)
        // cannot be probed: copy it up; pieces and the mark do nothing if it was already.
        let beyond_head = object_index * self.inner.info.object_size_bytes >= self.size_bytes();
        let copied = if beyond_head {
            false
        } else {
            match self.inner.cluster.execute(addr.pg, &probe).await {
                Ok(Reply::Data(_)) => true,
                Err(ClientError::Io {
                    status: fastblock_wire::Status::ObjectAbsent,
                    ..
                }) => false,
                Ok(other) => {
                    return Err(ClientError::Protocol(format!(
                        "PG {}: unexpected {} reply to a clone read",
                        addr.pg,
                        reply_name(&other)
                    )))
                }
                Err(e) => return Err(e),
            }
        };
        if !copied {
            let object_bytes = self.inner.info.object_size_bytes;
            let start = object_index * object_bytes;
            // The head's overlap and every snapshot's: the PG leader places each part
            // (`fastblock_types::clone_data`).
            let reach = self.parent_reach_bytes(link);
            if start < reach {
                let len = object_bytes.min(reach - start);
                let data = link.view.read_boxed(start, len).await?;
                let mut at = 0u64;
                while at < len {
                    let piece_len = COPY_UP_PIECE_BYTES_MAX.min(len - at);
                    let piece = data.slice(at as usize..(at + piece_len) as usize);
                    if piece.iter().any(|b| *b != 0) {
                        let offset = at as u32;
                        let build = move |epoch| Request::CopyUp {
                            addr,
                            offset,
                            epoch,
                            term: 0,
                            data: piece.clone(),
                        };
                        self.expect_ok(addr.pg, &build).await?;
                    }
                    at += piece_len;
                }
            }
            let done = move |epoch| Request::CopyUpDone {
                addr,
                epoch,
                term: 0,
            };
            self.expect_ok(addr.pg, &done).await?;
        }
        link.copied
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(object_index);
        Ok(())
    }

    /// How far any version of this clone reads its parent: the head's overlap (from the
    /// map, which a shrink by another client cuts) and the overlap of each live snapshot.
    fn parent_reach_bytes(&self, link: &ParentLink) -> u64 {
        let map = self.inner.cluster.map();
        let id = self.inner.info.id;
        let head = head_overlap_bytes(&map, id, link);
        let snaps = map.snaps.get(&id).into_iter().flatten();
        snaps
            .filter_map(|s| s.parent_overlap_bytes)
            .fold(head, u64::max)
            .min(link.view.size_bytes())
    }

    /// Whether snapshot `snap` of this clone reads object `object_index` from the parent
    /// beyond what the head's overlap covers now.
    fn snapshot_reads_more(&self, link: &ParentLink, object_index: u64, snap: u64) -> bool {
        let map = self.inner.cluster.map();
        let id = self.inner.info.id;
        let head = head_overlap_bytes(&map, id, link);
        let Some(listed) = map
            .snaps
            .get(&id)
            .and_then(|l| l.iter().find(|s| s.id.0 == snap))
        else {
            // This client's map is older than the snapshot: it cannot tell, and a copy-up
            // is never wrong (only extra work).
            return true;
        };
        let Some(snap_overlap) = listed.parent_overlap_bytes else {
            return false;
        };
        let object_bytes = self.inner.info.object_size_bytes;
        let (start, end) = (
            object_index * object_bytes,
            (object_index + 1) * object_bytes,
        );
        start < snap_overlap && end > head
    }

    async fn expect_ok(
        &self,
        pg: PgId,
        build: &(dyn Fn(fastblock_types::Epoch) -> Request + Sync),
    ) -> Result<(), ClientError> {
        match self.inner.cluster.execute(pg, build).await? {
            Reply::Ok => Ok(()),
            other => Err(ClientError::Protocol(format!(
                "PG {pg}: unexpected {} reply to a copy-up",
                reply_name(&other)
            ))),
        }
    }

    /// [`Image::read`] as a boxed `Send` future: a clone reads its parent through it, and
    /// the boxing ends the recursion in the future's type (read -> object request -> parent
    /// read).
    fn read_boxed(
        &self,
        offset: u64,
        len: u64,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Bytes, ClientError>> + Send + '_>>
    {
        Box::pin(self.read(offset, len))
    }

    /// A clone's read of one piece (of its head, or of one of its snapshots): from the
    /// clone if it copied the object up (before the snapshot was taken), else from the
    /// parent.
    async fn clone_read(&self, extent: Extent) -> Result<Piece, ClientError> {
        let addr = self.addr(extent.object_index);
        let (offset, length) = (extent.object_offset, extent.len);
        let snap = self.inner.snap.as_ref().map(|s| s.id);
        let build = move |epoch| match snap {
            Some(snap) => Request::SnapRead {
                addr,
                offset,
                length,
                epoch,
                snap,
            },
            None => Request::CloneRead {
                addr,
                offset,
                length,
                epoch,
            },
        };
        match self.inner.cluster.execute(addr.pg, &build).await {
            Ok(Reply::Data(bytes)) if bytes.len() == length as usize => Ok(Piece::Data(bytes)),
            Err(ClientError::Io {
                status: fastblock_wire::Status::ObjectAbsent,
                ..
            }) => Ok(Piece::Data(self.read_parent(extent).await?)),
            Ok(other) => Err(ClientError::Protocol(format!(
                "PG {}: unexpected {} reply to a clone read of {length} bytes",
                addr.pg,
                reply_name(&other)
            ))),
            Err(e) => Err(e),
        }
    }

    /// A clone's read of one piece of an object that it has not copied up: the parent's
    /// bytes within the overlap, zeros beyond.
    async fn read_parent(&self, extent: Extent) -> Result<Bytes, ClientError> {
        let link = self
            .inner
            .parent
            .as_ref()
            .expect("only clones read their parent");
        let start = extent.object_index * self.inner.info.object_size_bytes
            + u64::from(extent.object_offset);
        let len = u64::from(extent.len);
        // The head's overlap as the map shows it now: another client may have shrunk the
        // clone since this one opened it (a snapshot keeps the overlap of its moment).
        let overlap = match &self.inner.snap {
            Some(_) => link.overlap_bytes,
            None => {
                let map = self.inner.cluster.map();
                head_overlap_bytes(&map, self.inner.info.id, link).min(link.overlap_bytes)
            }
        };
        let from_parent = overlap.saturating_sub(start).min(len);
        if from_parent == len {
            return link.view.read_boxed(start, len).await;
        }
        let mut out = BytesMut::zeroed(len as usize);
        if from_parent > 0 {
            let data = link.view.read_boxed(start, from_parent).await?;
            out[..from_parent as usize].copy_from_slice(&data);
        }
        Ok(out.freeze())
    }

    /// A read-only view of snapshot `snap` of this image, `size_bytes` large (the image's
    /// size when the snapshot was taken). Reads go to the snapshot; writes fail with
    /// [`ClientError::ReadOnly`].
    pub fn snapshot_view(&self, snap: SnapView, size_bytes: u64) -> Image {
        let mut info = self.inner.info.clone();
        info.size_bytes = size_bytes;
        Image {
            inner: Arc::new(Inner {
                cluster: self.inner.cluster.clone(),
                info,
                pg_count: self.inner.pg_count,
                write_gate: tokio::sync::RwLock::new(()),
                snap: Some(snap),
                parent: None,
            }),
        }
    }

    /// A read-only view of snapshot `snap` of this clone, taken when the clone's overlap
    /// was `overlap_bytes`: what the clone had not copied up then, it reads from the same
    /// parent within that overlap.
    pub(crate) fn clone_snapshot_view(
        &self,
        snap: SnapView,
        size_bytes: u64,
        overlap_bytes: u64,
    ) -> Image {
        let view = self.snapshot_view(snap, size_bytes);
        match &self.inner.parent {
            Some(link) => view.with_parent(link.view.clone(), overlap_bytes),
            None => view,
        }
    }

    /// The snapshot this view shows, if it is one (then it is read-only).
    pub fn snapshot(&self) -> Option<&SnapView> {
        self.inner.snap.as_ref()
    }

    fn writable(&self) -> Result<(), ClientError> {
        match &self.inner.snap {
            None => Ok(()),
            Some(s) => Err(ClientError::ReadOnly {
                what: format!(
                    "{}/{}@{}",
                    self.inner.info.pool_name, self.inner.info.name, s.name
                ),
            }),
        }
    }

    /// Makes every object of the image up to `snap_size_bytes` hold what snapshot `snap`
    /// holds, through each PG's log, `objects_in_flight_max` objects at a time; `progress`
    /// is called with (objects done, objects in all) after each. The image must be at least
    /// `snap_size_bytes` large (grow it first); a tail beyond it is the caller's to cut.
    pub async fn rollback_objects(
        &self,
        snap: u64,
        snap_size_bytes: u64,
        objects_in_flight_max: usize,
        progress: &(dyn Fn(u64, u64) + Send + Sync),
    ) -> Result<(), ClientError> {
        self.writable()?;
        let _gate = self.inner.write_gate.read().await;
        let object_bytes = self.inner.info.object_size_bytes;
        let count = snap_size_bytes.div_ceil(object_bytes);
        if snap_size_bytes > self.size_bytes() {
            return Err(ClientError::OutOfRange {
                offset: 0,
                len: snap_size_bytes,
                size: self.size_bytes(),
            });
        }
        self.for_each_object(
            count,
            objects_in_flight_max,
            progress,
            |image, object| async move {
                let extent = Extent {
                    object_index: object,
                    object_offset: 0,
                    len: 0,
                    buffer_offset: 0,
                };
                image
                    .object_op(Op::Rollback, extent, None, snap)
                    .await
                    .map(|_| ())
            },
        )
        .await
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

    /// The pool's PG count at open (where every object of the image lives).
    pub fn pg_count(&self) -> u32 {
        self.inner.pg_count
    }

    /// The PG that holds object `object_index` of this image.
    pub fn object_pg(&self, object_index: u64) -> PgId {
        let info = &self.inner.info;
        crate::route::object_pg(info.pool, self.inner.pg_count, info.id, object_index)
    }

    /// Reads `len` bytes at `offset`. Never-written bytes read as zeros (the OSD's job).
    pub async fn read(&self, offset: u64, len: u64) -> Result<Bytes, ClientError> {
        let mut pieces = self.run(Op::Read, offset, len, None).await?;
        if pieces.len() == 1 {
            // The common case: one object, the reply's buffer is returned as is.
            if let Some(Piece::Data(data)) = pieces.pop() {
                return Ok(data);
            }
            return Ok(Bytes::new());
        }
        let mut out = BytesMut::with_capacity(len as usize);
        for piece in pieces {
            if let Piece::Data(data) = piece {
                out.extend_from_slice(&data);
            }
        }
        debug_assert_eq!(out.len() as u64, len);
        Ok(out.freeze())
    }

    /// Writes `data` at `offset`. Acknowledged only when durable on a majority of every PG it
    /// touched.
    pub async fn write(&self, offset: u64, data: Bytes) -> Result<(), ClientError> {
        self.writable()?;
        let _gate = self.inner.write_gate.read().await;
        let len = data.len() as u64;
        self.run(Op::Write, offset, len, Some(data)).await.map(drop)
    }

    /// Discards `len` bytes at `offset`: they read as zeros afterwards.
    pub async fn discard(&self, offset: u64, len: u64) -> Result<(), ClientError> {
        self.writable()?;
        let _gate = self.inner.write_gate.read().await;
        self.run(Op::Discard, offset, len, None).await.map(drop)
    }

    /// Writes zeros over `len` bytes at `offset` without sending them.
    pub async fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), ClientError> {
        self.writable()?;
        let _gate = self.inner.write_gate.read().await;
        self.run(Op::WriteZeroes, offset, len, None).await.map(drop)
    }

    /// The parts of `[offset, offset + len)` that hold data on the cluster, as image-absolute
    /// `(offset, length)` ranges in order, adjacent ranges merged; the rest of the range is
    /// holes (never written, or discarded) and reads as zeros. Block granularity is the OSD's
    /// (4 KiB). Each object is asked on its PG leader behind the read barrier, so the answer
    /// covers every write acknowledged before the call.
    pub async fn allocated_ranges(
        &self,
        offset: u64,
        len: u64,
    ) -> Result<Vec<(u64, u64)>, ClientError> {
        if self.inner.snap.is_some() || self.inner.parent.is_some() {
            // The OSDs answer block status for the head only, and a clone's holes may be its
            // parent's data: a snapshot or a clone reports its whole range as data (correct,
            // not sparse).
            check_range(offset, len, self.size_bytes())?;
            return Ok(if len == 0 {
                Vec::new()
            } else {
                vec![(offset, len)]
            });
        }
        let pieces = self.run(Op::Allocation, offset, len, None).await?;
        let mut out: Vec<(u64, u64)> = Vec::new();
        for piece in pieces {
            let Piece::Allocated(ranges) = piece else {
                continue;
            };
            for (start, length) in ranges {
                match out.last_mut() {
                    Some((last_start, last_len)) if *last_start + *last_len == start => {
                        *last_len += length;
                    }
                    _ => out.push((start, length)),
                }
            }
        }
        Ok(out)
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
    ) -> Result<Vec<Piece>, ClientError> {
        check_range(offset, len, self.size_bytes())?;
        let piece_bytes_max = match op {
            Op::Write => WRITE_PIECE_BYTES_MAX,
            Op::Read | Op::Discard | Op::WriteZeroes | Op::Allocation | Op::Rollback => {
                PIECE_BYTES_MAX
            }
        };
        let snap = self.inner.snap.as_ref().map_or(0, |s| s.id);
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
            [only] => Ok(vec![
                self.object_op(op, *only, piece_data(only), snap).await?,
            ]),
            many => {
                let mut tasks = JoinSet::new();
                for (index, extent) in many.iter().enumerate() {
                    let image = self.clone();
                    let extent = *extent;
                    let piece = piece_data(&extent);
                    tasks.spawn(
                        async move { (index, image.object_op(op, extent, piece, snap).await) },
                    );
                }
                let mut out: Vec<Piece> = many.iter().map(|_| Piece::Done).collect();
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

    /// One object request. `snap`: the snapshot a read or rollback names (0: the head).
    async fn object_op(
        &self,
        op: Op,
        extent: Extent,
        data: Option<Bytes>,
        snap: u64,
    ) -> Result<Piece, ClientError> {
        if let Some(link) = &self.inner.parent {
            match op {
                Op::Read => return self.clone_read(extent).await,
                Op::Write | Op::Discard | Op::WriteZeroes => {
                    self.ensure_copied(extent.object_index).await?
                }
                // The snapshot read more of the parent than the head does now (the clone was
                // shrunk since): copy the object up first, which keeps that part for the
                // snapshot, so that the rollback finds all of it in the clone.
                Op::Rollback if self.snapshot_reads_more(link, extent.object_index, snap) => {
                    self.ensure_copied(extent.object_index).await?
                }
                Op::Allocation | Op::Rollback => {}
            }
        }
        let pg = self.object_pg(extent.object_index);
        let addr = ObjectAddr {
            pg,
            image: self.inner.info.id,
            object_index: extent.object_index,
        };
        let (offset, length) = (extent.object_offset, extent.len);
        let data = data.unwrap_or_default();
        let build = move |epoch| match op {
            Op::Read if snap != 0 => Request::SnapRead {
                addr,
                offset,
                length,
                epoch,
                snap,
            },
            Op::Read => Request::Read {
                addr,
                offset,
                length,
                epoch,
            },
            Op::Rollback => Request::Rollback {
                addr,
                epoch,
                term: 0,
                snap,
            },
            Op::Write => Request::Write {
                addr,
                offset,
                epoch,
                term: 0,
                data: data.clone(),
            },
            Op::Discard => Request::Discard {
                addr,
                offset,
                length,
                epoch,
                term: 0,
            },
            Op::WriteZeroes => Request::WriteZeroes {
                addr,
                offset,
                length,
                epoch,
                term: 0,
            },
            Op::Allocation => Request::Allocation {
                addr,
                offset,
                length,
                epoch,
            },
        };
        let reply = self.inner.cluster.execute(pg, &build).await?;
        match (op, reply) {
            (Op::Read, Reply::Data(bytes)) if bytes.len() == length as usize => {
                Ok(Piece::Data(bytes))
            }
            (Op::Read, Reply::Data(bytes)) => Err(ClientError::Protocol(format!(
                "PG {pg}: read of {length} bytes at object {}+{offset} answered with {} bytes",
                extent.object_index,
                bytes.len()
            ))),
            (Op::Write | Op::Discard | Op::WriteZeroes | Op::Rollback, Reply::Ok) => {
                Ok(Piece::Done)
            }
            (Op::Allocation, Reply::Allocated(ranges)) => {
                let object_start = extent.object_index * self.inner.info.object_size_bytes;
                allocated_in_image(&ranges, object_start, offset, length)
                    .map(Piece::Allocated)
                    .map_err(|why| {
                        ClientError::Protocol(format!(
                            "PG {pg}: allocation of object {}+{offset}+{length}: {why}",
                            extent.object_index
                        ))
                    })
            }
            (op, other) => Err(ClientError::Protocol(format!(
                "PG {pg}: unexpected {} reply to {op:?}",
                reply_name(&other)
            ))),
        }
    }
}

/// The head's overlap of clone `id` with its parent as `map` shows it (a shrink by another
/// client cuts it), else as this client opened it; 0 once the map shows it flattened.
fn head_overlap_bytes(
    map: &fastblock_types::map::ClusterMap,
    id: fastblock_types::ImageId,
    link: &ParentLink,
) -> u64 {
    map.images
        .as_ref()
        .and_then(|t| t.images.get(&id))
        .map_or(link.overlap_bytes, |e| e.parent_overlap_bytes.unwrap_or(0))
}

/// Checks an OSD's allocated ranges for one object request (in order, not overlapping, not
/// empty, inside the asked `offset..offset + length`) and makes them image-absolute.
fn allocated_in_image(
    ranges: &[AllocatedRange],
    object_start: u64,
    offset: u32,
    length: u32,
) -> Result<Vec<(u64, u64)>, String> {
    let asked_end = u64::from(offset) + u64::from(length);
    let mut previous_end = u64::from(offset);
    let mut out = Vec::with_capacity(ranges.len());
    for range in ranges {
        let start = u64::from(range.offset);
        let end = start + u64::from(range.length);
        if range.length == 0 || start < previous_end || end > asked_end {
            return Err(format!(
                "range {}+{} is empty, out of order or outside the asked range",
                range.offset, range.length
            ));
        }
        previous_end = end;
        out.push((object_start + start, u64::from(range.length)));
    }
    Ok(out)
}

impl std::fmt::Debug for Image {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Image")
            .field("info", &self.inner.info)
            .finish()
    }
}

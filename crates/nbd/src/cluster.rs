//! The cluster's images as NBD exports named `pool/image`, and their snapshots, read-only,
//! as `pool/image@snap`, over the client library.
//!
//! Every connection opens its own [`Image`] handle (one monitor lookup), so a resized image is
//! seen by the next connection. All handles share the process's one [`Cluster`]: its OSD
//! connections, caches and in-flight limit.

use crate::backend::{Export, ExportError, Exports, IoError};
use bytes::Bytes;
use fastblock_client::wire::Status;
use fastblock_client::{ClientError, Cluster, Image};
use std::sync::Arc;

/// All images of the cluster.
#[derive(Clone)]
pub struct ClusterExports {
    cluster: Arc<Cluster>,
}

impl ClusterExports {
    pub fn new(cluster: Arc<Cluster>) -> Self {
        ClusterExports { cluster }
    }

    /// The cluster client's counters (retries, timeouts, ...), shared by every export.
    pub fn client_stats(&self) -> fastblock_client::ClientStats {
        self.cluster.stats()
    }
}

/// `pool/image` → (pool, image). The image part may not be empty; a pool name has no `/`.
pub fn split_export_name(name: &str) -> Result<(&str, &str), ExportError> {
    match name.split_once('/') {
        Some((pool, image)) if !pool.is_empty() && !image.is_empty() => Ok((pool, image)),
        _ => Err(ExportError::BadName(format!(
            "export name {name:?} is not pool/image"
        ))),
    }
}

impl Exports for ClusterExports {
    type Export = ImageExport;

    async fn list(&self) -> Result<Vec<String>, ExportError> {
        let Some(mon) = self.cluster.monitor() else {
            return Ok(Vec::new());
        };
        let images = mon
            .images(None)
            .await
            .map_err(|e| ExportError::Unavailable(e.to_string()))?;
        // Snapshots from the map (complete ones only), after their images.
        let map = self.cluster.map();
        let mut names = Vec::new();
        for i in images {
            names.push(format!("{}/{}", i.pool_name, i.name));
            for s in map.snaps.get(&i.id).into_iter().flatten() {
                if s.state == fastblock_client::types::map::SnapState::Created {
                    names.push(format!("{}/{}@{}", i.pool_name, i.name, s.name));
                }
            }
        }
        Ok(names)
    }

    async fn open(&self, name: &str) -> Result<ImageExport, ExportError> {
        let (pool, image) = split_export_name(name)?;
        let opened = match image.split_once('@') {
            None => self.cluster.open_image(pool, image).await,
            Some((image, snap)) if !image.is_empty() && !snap.is_empty() => {
                self.cluster.open_snapshot(pool, image, snap).await
            }
            Some(_) => {
                return Err(ExportError::BadName(format!(
                    "export name {name:?} is not pool/image or pool/image@snapshot"
                )))
            }
        };
        match opened {
            Ok(image) => Ok(ImageExport { image }),
            Err(
                ClientError::ImageNotFound { .. }
                | ClientError::PoolNotFound(_)
                | ClientError::SnapNotFound { .. },
            ) => Err(ExportError::NotFound(name.to_owned())),
            Err(e) => Err(ExportError::Unavailable(e.to_string())),
        }
    }
}

/// One image as an export.
#[derive(Clone, Debug)]
pub struct ImageExport {
    image: Image,
}

impl ImageExport {
    pub fn new(image: Image) -> Self {
        ImageExport { image }
    }
}

/// Client errors in NBD's classes: a full OSD is `ENOSPC`, a range the client refused is
/// `EINVAL`, everything else (timeouts included) `EIO`.
fn io_error(e: ClientError) -> IoError {
    match &e {
        ClientError::OutOfRange { .. } => IoError::Invalid(e.to_string()),
        ClientError::ReadOnly { .. } => IoError::ReadOnly(e.to_string()),
        ClientError::Io {
            status: Status::NoSpace,
            ..
        } => IoError::NoSpace(e.to_string()),
        _ => IoError::Io(e.to_string()),
    }
}

impl Export for ImageExport {
    fn size_bytes(&self) -> u64 {
        self.image.size_bytes()
    }

    fn read_only(&self) -> bool {
        self.image.snapshot().is_some()
    }

    fn description(&self) -> String {
        let info = self.image.info();
        let snap = match self.image.snapshot() {
            Some(s) => format!("@{} (snapshot {}, read-only)", s.name, s.id),
            None => String::new(),
        };
        format!(
            "fastblock image {}/{}{snap} (id {}, {} byte objects)",
            info.pool_name, info.name, info.id, info.object_size_bytes
        )
    }

    async fn read(&self, offset: u64, len: u32) -> Result<Bytes, IoError> {
        self.image
            .read(offset, u64::from(len))
            .await
            .map_err(io_error)
    }

    async fn write(&self, offset: u64, data: Bytes) -> Result<(), IoError> {
        self.image.write(offset, data).await.map_err(io_error)
    }

    async fn discard(&self, offset: u64, len: u64) -> Result<(), IoError> {
        self.image.discard(offset, len).await.map_err(io_error)
    }

    async fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), IoError> {
        self.image.write_zeroes(offset, len).await.map_err(io_error)
    }

    async fn flush(&self) -> Result<(), IoError> {
        self.image.flush().await.map_err(io_error)
    }

    async fn allocated_ranges(&self, offset: u64, len: u64) -> Result<Vec<(u64, u64)>, IoError> {
        self.image
            .allocated_ranges(offset, len)
            .await
            .map_err(io_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_names_are_pool_slash_image() {
        assert_eq!(split_export_name("rbd/vm1"), Ok(("rbd", "vm1")));
        assert_eq!(split_export_name("rbd/a/b"), Ok(("rbd", "a/b")));
        for bad in ["", "rbd", "/vm1", "rbd/"] {
            assert!(split_export_name(bad).is_err(), "{bad:?}");
        }
    }
}

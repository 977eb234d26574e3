//! [`BlockingImage`]: the [`Image`] API for synchronous callers (an NBD server written with
//! threads, a C binding, a test). Each call blocks the calling thread on the async call.
//!
//! Must not be called from inside an async context (tokio panics on a nested `block_on`).

use crate::{ClientConfig, ClientError, Cluster, Image};
use bytes::Bytes;
use fastblock_types::map::ImageInfo;
use std::future::Future;
use tokio::runtime::{Handle, Runtime};

/// Worker threads of a runtime a [`BlockingImage`] creates for itself: IO here is network-
/// bound, two threads keep one busy connection's reader and writer apart.
const OWNED_RUNTIME_THREADS: usize = 2;

enum Driver {
    Owned(Runtime),
    /// A handle to a multi-thread runtime owned elsewhere (a current-thread runtime would not
    /// make progress while this thread blocks).
    Borrowed(Handle),
}

pub struct BlockingImage {
    image: Image,
    driver: Driver,
}

impl BlockingImage {
    /// Connects with its own runtime and opens `pool/name`.
    pub fn open(config: ClientConfig, pool: &str, name: &str) -> Result<Self, ClientError> {
        let runtime = owned_runtime()?;
        let image = runtime.block_on(async {
            let cluster = Cluster::connect(config).await?;
            cluster.open_image(pool, name).await
        })?;
        Ok(BlockingImage {
            image,
            driver: Driver::Owned(runtime),
        })
    }

    /// Wraps an image opened on the multi-thread runtime `handle` belongs to.
    pub fn new(image: Image, handle: Handle) -> Self {
        BlockingImage {
            image,
            driver: Driver::Borrowed(handle),
        }
    }

    /// Connects a cluster on an injected map with its own runtime and opens `info` (tests).
    pub fn with_map(
        map: fastblock_types::map::ClusterMap,
        config: ClientConfig,
        info: ImageInfo,
    ) -> Result<Self, ClientError> {
        let runtime = owned_runtime()?;
        let image = runtime.block_on(async {
            let cluster = Cluster::with_map(map, config)?;
            cluster.open_image_info(info).await
        })?;
        Ok(BlockingImage {
            image,
            driver: Driver::Owned(runtime),
        })
    }

    fn block_on<F: Future>(&self, future: F) -> F::Output {
        match &self.driver {
            Driver::Owned(runtime) => runtime.block_on(future),
            Driver::Borrowed(handle) => handle.block_on(future),
        }
    }

    /// The async image, for mixing both styles.
    pub fn image(&self) -> &Image {
        &self.image
    }

    pub fn info(&self) -> &ImageInfo {
        self.image.info()
    }

    pub fn size_bytes(&self) -> u64 {
        self.image.size_bytes()
    }

    pub fn read(&self, offset: u64, len: u64) -> Result<Bytes, ClientError> {
        self.block_on(self.image.read(offset, len))
    }

    pub fn write(&self, offset: u64, data: Bytes) -> Result<(), ClientError> {
        self.block_on(self.image.write(offset, data))
    }

    pub fn discard(&self, offset: u64, len: u64) -> Result<(), ClientError> {
        self.block_on(self.image.discard(offset, len))
    }

    pub fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), ClientError> {
        self.block_on(self.image.write_zeroes(offset, len))
    }

    pub fn flush(&self) -> Result<(), ClientError> {
        self.block_on(self.image.flush())
    }
}

fn owned_runtime() -> Result<Runtime, ClientError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(OWNED_RUNTIME_THREADS)
        .enable_all()
        .thread_name("fastblock-client")
        .build()
        .map_err(|e| ClientError::Config(format!("cannot start a tokio runtime: {e}")))
}

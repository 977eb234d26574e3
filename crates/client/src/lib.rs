//! fastblock-client: the block client library (layer 4). The NBD server, `block_bench` and the
//! fio engine reach the cluster through it.
//!
//! An image is cut into objects of the image's object size; object `offset / object_size` goes
//! to the PG `fastblock_types::route::object_pg(pool, pg_count, image, index)`; the request is
//! sent to that PG's leader OSD on the shard port `OsdInfo::port_for(pg)`. The whole path, the
//! retry rules and the caches are written down in `docs/data-path.md`.
//!
//! Module map:
//! - [`config`]: [`ClientConfig`] (monitors, deadline, in-flight limit, timeouts).
//! - [`error`]: [`ClientError`], what a caller or an operator can act on.
//! - [`cluster`]: [`Cluster`], the shared client state: map cache, connection pool, the
//!   in-flight semaphore, the background map watch. Built by `connect` (monitor) or
//!   `with_map` (tests: an injected map, no monitor).
//! - `map_cache`: the current cluster map and the PG → leader cache.
//! - [`route`]: pure routing: object → PG, leader candidates, OSD → address and port.
//! - [`policy`]: pure retry decisions: reply classification, redirect and backoff pacing.
//!   The simulator's clients call [`route`] and [`policy`] too, so it tests these decisions.
//! - `leader`: leader discovery (`GetLeader` to the PG's members).
//! - `retry`: the per-object-request loop: carries out `policy` in real time, keeps the
//!   caches, enforces the deadline.
//! - [`auth`]: the connecting end of the data-plane handshake and frame protection.
//! - `conn`: one multiplexed TCP connection per (address, port): a writer task batching
//!   frames into one `write_all`, a reader task matching replies to requests by id.
//! - [`split`]: pure IO splitting at object boundaries.
//! - [`tickets`]: [`tickets::Tickets`], the tickets this entity holds for the OSDs it connects
//!   to (the OSDs' peer links use it too).
//! - [`image`]: [`Image`], async block IO on one image.
//! - [`blocking`]: [`BlockingImage`], the same IO for synchronous callers.
//! - [`usage`]: [`usage::ImageUsage`], what an image holds on the OSDs (`Image::usage`).
//! - [`zeros`]: pure: where read data is whole, aligned all-zero blocks (holes to skip).
//! - [`testing`] (feature `test-util`): an in-memory fake OSD and map builders.
//!
//! Invariants:
//! - No IO leaves for a range outside the image (`OutOfRange` first), and no object request
//!   crosses an object boundary.
//! - At most `inflight_ops_max` object requests are in flight per [`Cluster`]; callers beyond
//!   it wait (backpressure), no queue grows without bound.
//! - Every object request ends by `op_deadline`: success, a non-retryable error, or
//!   `ClientError::Timeout` naming the PG and the last failure.
//! - A reply is only ever delivered to the request with its `request_id` on its connection;
//!   a connection that sends anything undecodable is closed and its requests retried.
//! - Nothing received from the network is unwrapped: bad frames and replies become errors.
//!
//! Must not depend on: the OSD, the monitor's internals, etcd. It speaks the monitor API
//! (`fastblock-monclient`) and the wire protocol (`fastblock-wire`) only.

pub mod auth;
pub mod blocking;
pub mod cluster;
pub mod config;
mod conn;
pub mod error;
pub mod image;
mod leader;
mod map_cache;
pub mod policy;
mod retry;
pub mod route;
pub mod split;
#[cfg(any(test, feature = "test-util"))]
pub mod testing;
pub mod tickets;
pub mod usage;
pub mod zeros;

pub use blocking::BlockingImage;
pub use bytes::Bytes;
pub use cluster::{ClientStats, Cluster};
pub use config::ClientConfig;
pub use error::ClientError;
pub use image::{Image, SnapView};

// Re-exported because they appear in this crate's API.
pub use fastblock_monclient::{MonClient, MonError};
pub use fastblock_types as types;
pub use fastblock_wire as wire;

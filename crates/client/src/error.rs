//! The one error type of the client. Every variant carries what a retry (by the caller) or an
//! operator needs: the PG, the OSD, the status the OSD answered, the last retryable failure.

use fastblock_monclient::MonError;
use fastblock_types::{Epoch, OsdId, PgId};
use fastblock_wire::Status;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The monitor refused a call or could not be reached (after its own retries). The
    /// message includes the monitor's, so the `MonError` is not also given as the source:
    /// a printed chain would say it twice.
    #[error("monitor: {0}")]
    Monitor(MonError),
    /// The configuration cannot work (checked before anything is sent).
    #[error("invalid client configuration: {0}")]
    Config(String),
    #[error("pool {0:?} does not exist")]
    PoolNotFound(String),
    #[error("image {pool}/{name} does not exist")]
    ImageNotFound { pool: String, name: String },
    /// The byte range is not inside the image; nothing was sent.
    #[error("IO of {len} bytes at offset {offset} is outside the image of {size} bytes")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    /// Retryable failures (no leader, PG not ready, OSD busy or unreachable, ...) lasted until
    /// the deadline, e.g. a PG that lost its majority. The same request may succeed later; for
    /// a write the outcome is unknown (it may or may not have been applied).
    #[error("PG {pg}: no success within the {deadline:?} deadline; last failure: {last}")]
    Timeout {
        pg: PgId,
        deadline: Duration,
        last: String,
    },
    /// The image was created or resized, but the cluster map the monitors serve did not show
    /// it within the deadline (the monitors are behind or unreachable). Nothing was sent to
    /// an OSD: without that map, the OSDs would refuse the IO as for an image that does not
    /// exist.
    #[error(
        "image {pool}/{name} is not in the cluster map yet (epoch {epoch}) after {deadline:?}"
    )]
    MapBehind {
        pool: String,
        name: String,
        epoch: Epoch,
        deadline: Duration,
    },
    /// The image was shrunk after the description it was opened with was read: open it
    /// again (by name) to use its new size. Nothing was sent to an OSD.
    #[error("image {pool}/{name} is {size_bytes} bytes now, not the {opened_bytes} it was opened with; open it again")]
    ImageResized {
        pool: String,
        name: String,
        size_bytes: u64,
        opened_bytes: u64,
    },
    /// No complete snapshot of that name (never taken, removed, or still being taken).
    #[error("image {pool}/{name} has no snapshot {snap:?}")]
    SnapNotFound {
        pool: String,
        name: String,
        snap: String,
    },
    /// A write to a read-only view (an image snapshot). Nothing was sent.
    #[error("{what} is a snapshot: read-only")]
    ReadOnly { what: String },
    /// An OSD answered a non-retryable error (IoError, Checksum, NoSpace, InvalidArgument,
    /// OutOfRange, Internal, UnknownOp, NoSuchImage: the image was removed).
    #[error("PG {pg}: osd.{osd} answered {status:?}: {message}")]
    Io {
        pg: PgId,
        osd: OsdId,
        status: Status,
        message: String,
    },
    /// The data plane refused this client, finally (retrying with the same key gives the same
    /// answer): its handshake failed (unknown, wrong or revoked key, a mode mismatch, an OSD
    /// that does not hold the key), or its caps do not allow the pool (`PermissionDenied`).
    /// `status` is the OSD's answer, when it gave one; `message` names the cause.
    #[error("{target}: {message}")]
    Auth {
        target: String,
        status: Option<Status>,
        message: String,
    },
    /// An OSD or the monitor answered something the protocol does not allow (a reply of the
    /// wrong kind, a short read, an image with an object size the wire cannot address).
    #[error("protocol error: {0}")]
    Protocol(String),
}

impl From<MonError> for ClientError {
    fn from(e: MonError) -> Self {
        ClientError::Monitor(e)
    }
}

impl ClientError {
    /// Whether the same call may succeed later unchanged (the cluster may heal).
    pub fn is_retryable(&self) -> bool {
        match self {
            ClientError::Timeout { .. } | ClientError::MapBehind { .. } => true,
            ClientError::Monitor(MonError::Unreachable { .. }) => true,
            ClientError::Monitor(MonError::Api(e)) => e.retryable,
            _ => false,
        }
    }

    /// The PG the error is about, if it is about one.
    pub fn pg(&self) -> Option<PgId> {
        match self {
            ClientError::Timeout { pg, .. } | ClientError::Io { pg, .. } => Some(*pg),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fastblock_types::api::{ApiError, ErrorCode};
    use std::error::Error as _;

    /// Every message of the chain, as `anyhow`'s `{:#}` prints it.
    fn chain(e: &dyn std::error::Error) -> String {
        let mut out = e.to_string();
        let mut cause = e.source();
        while let Some(c) = cause {
            out += &format!(": {c}");
            cause = c.source();
        }
        out
    }

    #[test]
    fn a_monitor_refusal_is_printed_once() {
        let e = ClientError::from(MonError::from(ApiError::new(
            ErrorCode::AuthRequired,
            "the call must be signed",
        )));
        assert_eq!(chain(&e), "monitor: the call must be signed");
        assert!(e.source().is_none());
    }
}

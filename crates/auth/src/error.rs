//! Every way authentication fails, each with what the user needs to fix it.

use crate::entity::EntityName;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("invalid key: {0}")]
    BadKey(String),
    #[error("invalid entity name {name:?}: {why}")]
    BadEntity { name: String, why: &'static str },
    #[error("invalid caps {caps:?}: {why}")]
    BadCaps { caps: String, why: String },
    #[error("keyring {path}: {why}")]
    Keyring { path: String, why: String },
    #[error("keyring {path} has no key for {entity}")]
    NoKeyFor { path: String, entity: EntityName },
    #[error("unknown entity {0} (no such key, or it was removed)")]
    UnknownEntity(String),
    #[error("signature check failed for {0}: wrong key, or the message was altered")]
    BadSignature(String),
    #[error("request time {request_unix_s} is {skew_s} s away from the monitor's clock (at most {window_s} s allowed)")]
    ClockSkew {
        request_unix_s: u64,
        skew_s: u64,
        window_s: u64,
    },
    #[error("replayed request: nonce already used by {0}")]
    Replayed(String),
    #[error("too many signed requests in the last {window_s} s to check them for replays; retry")]
    ReplayCacheFull { window_s: u64 },
    #[error(
        "{entity} made {calls} signed requests in the last {window_s} s, the most one entity may; \
         retry later"
    )]
    EntityCallsMax {
        entity: String,
        calls: usize,
        window_s: u64,
    },
    /// The call was signed for another monitor incarnation (a restart or a change of leader
    /// since the caller last heard): sign it again for `current`.
    #[error("the call was signed for another monitor incarnation (the monitor restarted or the leader changed); sign it again for {current}")]
    StaleIncarnation { current: String },
    /// A ticket that does not open at this OSD (made for another, altered, or of another
    /// cluster) or is not for it.
    #[error("bad ticket: {0}")]
    BadTicket(String),
    /// A ticket past its expiry (plus the clock skew allowed): the holder asks the monitor for
    /// a new one.
    #[error("the ticket of {entity} expired {expired_s_ago} s ago: ask the monitor for a new one")]
    TicketExpired { entity: String, expired_s_ago: u64 },
    #[error("malformed authentication message: {0}")]
    Malformed(String),
    #[error("the peer wants auth mode {peer}, this end runs {ours}")]
    ModeMismatch { ours: String, peer: String },
    #[error(
        "frame authentication failed: the frame was altered, replayed or sent with another key"
    )]
    FrameTag,
    #[error("could not draw random bytes from the operating system")]
    Random,
}

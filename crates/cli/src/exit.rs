//! Exit statuses of `fastblock-client`, so that scripts can tell failures apart without
//! reading the message (`docs/cli.md`, "Exit status"):
//!
//! | status | meaning |
//! |---|---|
//! | 0 | done |
//! | 1 | failed otherwise (an internal error, an IO error, a timeout of the data path) |
//! | 2 | usage: bad arguments (nothing was sent) |
//! | 3 | not found: the pool, image, snapshot, OSD, PG or entity named does not exist |
//! | 4 | refused: the cluster understood and said no (exists, in use, too large, not enough OSDs, permission denied, ...) |
//! | 5 | unreachable: no monitor answered, or the cluster cannot serve the call now (no leader, unavailable); trying later may succeed |
//!
//! The status comes from the first error in the chain that says which it is: a monitor's
//! error code ([`MonError`]), the block client's error ([`ClientError`]), a [`Failure`]
//! raised by the CLI itself, or the cause a [`Worded`] message keeps.

use fastblock_client::ClientError;
use fastblock_monclient::MonError;
use fastblock_types::api::ErrorCode;

pub const EXIT_OK: i32 = 0;
pub const EXIT_FAILURE: i32 = 1;
pub const EXIT_USAGE: i32 = 2;
pub const EXIT_NOT_FOUND: i32 = 3;
pub const EXIT_REFUSED: i32 = 4;
pub const EXIT_UNREACHABLE: i32 = 5;

/// A failure the CLI finds itself (not in a monitor's answer), with its kind.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Refused(String),
    /// Bad arguments found after parsing (e.g. `config show` of a daemon name that is none).
    #[error("{0}")]
    Usage(String),
    /// A daemon that does not answer (e.g. no admin socket for `config`).
    #[error("{0}")]
    Unreachable(String),
    /// Already printed (the reference syntax prints its failures on stdout in its own words):
    /// only its exit status remains to be given.
    #[error("{0}")]
    Reported(MonError),
}

/// A message that says its cause in its own words and order (the cause inside a sentence,
/// a hint after it), where `context` would print the cause after a colon. It keeps the cause
/// for its exit status only: as a source, the cause would be printed twice.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Worded {
    pub message: String,
    pub cause: anyhow::Error,
}

impl Worded {
    pub fn error(message: String, cause: anyhow::Error) -> anyhow::Error {
        Worded { message, cause }.into()
    }
}

/// The exit status of a monitor's error code.
pub fn code_status(code: ErrorCode) -> i32 {
    use ErrorCode::*;
    match code {
        PoolNotFound | ImageNotFound | OsdNotFound | PgNotFound | ReclaimNotFound
        | EntityNotFound | SnapNotFound | SnapTrimNotFound => EXIT_NOT_FOUND,
        InvalidArgument | PoolExists | ImageExists | UuidExists | UuidMismatch | OsdDown
        | NotEnoughDomains | NotEnoughOsds | TooManyPgs | ShrinkRefused | TooLarge
        | PoolDamaged | IncompatibleConfig | AuthRequired | AuthFailed | StaleIncarnation
        | PermissionDenied | EntityExists | SnapExists | SnapInUse | SnapNotReady | OsdInUse => {
            EXIT_REFUSED
        }
        NoLeader | Unavailable | Conflict | ReclaimPending | OsdTimedOut | Busy | MonStoreFull => {
            EXIT_UNREACHABLE
        }
        _ => EXIT_FAILURE,
    }
}

fn mon_status(e: &MonError) -> i32 {
    match e {
        MonError::Unreachable { .. } => EXIT_UNREACHABLE,
        MonError::Protocol { .. } => EXIT_FAILURE,
        MonError::Api(api) => code_status(api.code),
    }
}

/// The exit status of a failed command.
pub fn status_of(error: &anyhow::Error) -> i32 {
    for cause in error.chain() {
        if let Some(failure) = cause.downcast_ref::<Failure>() {
            return match failure {
                Failure::NotFound(_) => EXIT_NOT_FOUND,
                Failure::Refused(_) => EXIT_REFUSED,
                Failure::Usage(_) => EXIT_USAGE,
                Failure::Unreachable(_) => EXIT_UNREACHABLE,
                Failure::Reported(e) => mon_status(e),
            };
        }
        if let Some(e) = cause.downcast_ref::<MonError>() {
            return mon_status(e);
        }
        if let Some(e) = cause.downcast_ref::<ClientError>() {
            if let Some(status) = client_status(e) {
                return status;
            }
        }
        if let Some(worded) = cause.downcast_ref::<Worded>() {
            return status_of(&worded.cause);
        }
    }
    EXIT_FAILURE
}

/// The status of a block client's error, when it is one of the kinds a status names; the
/// rest (an IO error, a data-path timeout) are failures (1).
fn client_status(e: &ClientError) -> Option<i32> {
    match e {
        ClientError::PoolNotFound(_)
        | ClientError::ImageNotFound { .. }
        | ClientError::SnapNotFound { .. } => Some(EXIT_NOT_FOUND),
        // The MonError is inside, not a source (its message is in this one's).
        ClientError::Monitor(m) => Some(mon_status(m)),
        // No key, a wrong key, or caps that do not allow the pool: refused.
        ClientError::Auth { .. } => Some(EXIT_REFUSED),
        _ => None,
    }
}

/// Whether the error was already printed (then only its status is given).
pub fn already_reported(error: &anyhow::Error) -> bool {
    matches!(error.downcast_ref::<Failure>(), Some(Failure::Reported(_)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use fastblock_types::api::ApiError;
    use std::time::Duration;

    fn api(code: ErrorCode) -> anyhow::Error {
        MonError::Api(ApiError::new(code, format!("{code:?}"))).into()
    }

    #[test]
    fn statuses_follow_the_kind_of_failure() {
        assert_eq!(status_of(&api(ErrorCode::ImageNotFound)), EXIT_NOT_FOUND);
        assert_eq!(status_of(&api(ErrorCode::PoolExists)), EXIT_REFUSED);
        assert_eq!(status_of(&api(ErrorCode::NoLeader)), EXIT_UNREACHABLE);
        assert_eq!(status_of(&api(ErrorCode::Internal)), EXIT_FAILURE);
        let unreachable: anyhow::Error = MonError::Unreachable {
            endpoints: "127.0.0.1:1".into(),
            deadline: Duration::from_secs(1),
            last: "refused".into(),
        }
        .into();
        assert_eq!(
            status_of(&unreachable.context("listing pools")),
            EXIT_UNREACHABLE
        );
        let local: anyhow::Error = Failure::NotFound("pg 1.9 does not exist".into()).into();
        assert_eq!(status_of(&local), EXIT_NOT_FOUND);
        assert_eq!(status_of(&anyhow::anyhow!("disk on fire")), EXIT_FAILURE);
    }

    /// The block client's errors (what `image import|export|cp` and `snap rollback` meet)
    /// have the statuses of the same failures reported by the monitor, wrapped or not.
    #[test]
    fn client_errors_have_the_statuses_of_their_kind() {
        let client = |e: ClientError| -> anyhow::Error { e.into() };
        let missing = client(ClientError::ImageNotFound {
            pool: "fb".into(),
            name: "vm".into(),
        });
        assert_eq!(
            status_of(&missing.context("opening the source")),
            EXIT_NOT_FOUND
        );
        assert_eq!(
            status_of(&client(ClientError::PoolNotFound("fb".into()))),
            EXIT_NOT_FOUND
        );
        let no_snap = client(ClientError::SnapNotFound {
            pool: "fb".into(),
            name: "vm".into(),
            snap: "s1".into(),
        });
        assert_eq!(status_of(&no_snap), EXIT_NOT_FOUND);
        let unreachable = client(ClientError::Monitor(MonError::Unreachable {
            endpoints: "127.0.0.1:1".into(),
            deadline: Duration::from_secs(1),
            last: "refused".into(),
        }));
        assert_eq!(status_of(&unreachable), EXIT_UNREACHABLE);
        let refused = client(ClientError::Monitor(MonError::Api(ApiError::new(
            ErrorCode::PermissionDenied,
            "no",
        ))));
        assert_eq!(status_of(&refused), EXIT_REFUSED);
        assert_eq!(
            status_of(&client(ClientError::Protocol("short".into()))),
            EXIT_FAILURE
        );
    }

    /// A worded message has its cause's status, and prints only itself.
    #[test]
    fn a_worded_message_keeps_its_cause_status() {
        let e = Worded::error("lost it; try again".into(), api(ErrorCode::NoLeader));
        assert_eq!(status_of(&e), EXIT_UNREACHABLE);
        assert_eq!(format!("{e:#}"), "lost it; try again");
        let plain = Worded::error("disk on fire".into(), anyhow::anyhow!("EIO"));
        assert_eq!(status_of(&plain), EXIT_FAILURE);
    }

    #[test]
    fn reported_failures_keep_their_status_and_are_not_printed_again() {
        let inner = MonError::Api(ApiError::new(ErrorCode::PoolExists, "pool fb exists"));
        let e: anyhow::Error = Failure::Reported(inner).into();
        assert!(already_reported(&e));
        assert_eq!(status_of(&e), EXIT_REFUSED);
        assert!(!already_reported(&api(ErrorCode::PoolExists)));
    }
}

//! What can stop a scale run, typed so that the binary prints a cause and the test can tell a
//! timeout (a figure that did not converge) from a setup failure.

use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ScaleError {
    /// Starting, finding or talking to a local process or file failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// The monitor process did not become leader or write its keyring in time.
    #[error("the monitor did not start: {0}")]
    MonStart(String),
    /// A monitor call failed (its error names the call and the monitor's code).
    #[error("{what}: {source}")]
    Mon {
        what: String,
        #[source]
        source: fastblock_monclient::MonError,
    },
    /// A wait the harness bounds ran out: the cluster did not reach the state in time.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout { what: String, after: Duration },
    /// The options cannot describe a run (checked before anything starts).
    #[error("invalid options: {0}")]
    Options(String),
    /// The keyring the monitor wrote could not be read.
    #[error("reading the admin keyring {path}: {detail}")]
    Keyring { path: String, detail: String },
}

impl ScaleError {
    pub fn io(what: impl Into<String>, source: std::io::Error) -> ScaleError {
        ScaleError::Io {
            what: what.into(),
            source,
        }
    }

    pub fn mon(what: impl Into<String>, source: fastblock_monclient::MonError) -> ScaleError {
        ScaleError::Mon {
            what: what.into(),
            source,
        }
    }
}

pub type Result<T> = std::result::Result<T, ScaleError>;

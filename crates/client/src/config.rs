//! Client configuration.

use crate::auth::Credentials;
use crate::ClientError;
use fastblock_auth::EntityName;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How a [`crate::Cluster`] reaches the cluster and how long it keeps trying.
///
/// Build with `ClientConfig::new(monitors)` or `ClientConfig { monitors, ..Default::default() }`.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Monitor endpoints, `host:port` (an `http://` prefix is accepted).
    pub monitors: Vec<String>,
    /// How long one object request keeps retrying retryable failures (leader changes, PGs not
    /// ready, backpressure, lost connections) before it fails with `ClientError::Timeout`.
    pub op_deadline: Duration,
    /// Object requests in flight at once, over all images of the cluster handle. Callers past
    /// the limit wait for a slot: backpressure instead of an unbounded queue.
    pub inflight_ops_max: usize,
    /// Limit of one TCP connect to an OSD.
    pub connect_timeout: Duration,
    /// Limit of one request on one connection (never more than what is left of the deadline).
    /// An OSD answers a slow commit itself with `Timeout`; silence this long means the
    /// connection or the OSD is broken, so the connection is closed and the request retried.
    pub attempt_timeout: Duration,
    /// Long-poll timeout of the background map watch.
    pub map_watch_timeout: Duration,
    /// Keyring holding `entity`'s key; `None`: `$FASTBLOCK_KEYRING`, else
    /// `/etc/fastblock/keyring`, if it exists, else no key (a cluster in auth mode `none`).
    /// Read by `Cluster::connect` unless `credentials` are given.
    pub keyring: Option<PathBuf>,
    /// The entity this client acts as (`client.NAME`).
    pub entity: String,
    /// Who this client is, for monitor calls and OSD connections, when the cluster's auth mode
    /// is `sign` or `secure`. See [`ClientConfig::with_keyring`].
    pub credentials: Option<Credentials>,
    /// The weakest auth mode this client accepts from the monitor (`None`: `sign` when it has
    /// a key, else `none`): a map or answer in a weaker mode is refused as a downgrade
    /// (`fastblock_auth::floor`, `docs/security.md`, "No downgrade").
    pub auth_floor: Option<fastblock_types::auth::AuthMode>,
}

impl ClientConfig {
    pub fn new(monitors: Vec<String>) -> Self {
        ClientConfig {
            monitors,
            ..Default::default()
        }
    }

    /// Takes `entity`'s key from the keyring at `path` (None: `$FASTBLOCK_KEYRING`, else
    /// `/etc/fastblock/keyring`; `fastblock_auth::keyring::resolve_path`).
    pub fn with_keyring(
        mut self,
        path: Option<&Path>,
        entity: &EntityName,
    ) -> Result<Self, ClientError> {
        let path = fastblock_auth::keyring::resolve_path(path);
        let credentials = crate::auth::load_credentials(&path, entity)
            .map_err(|e| ClientError::Config(e.to_string()))?;
        self.credentials = Some(credentials);
        Ok(self)
    }

    /// Rejects settings no client can work with, before anything is connected.
    pub fn validate(&self) -> Result<(), ClientError> {
        let bad = |why: &str| Err(ClientError::Config(why.to_string()));
        if self.inflight_ops_max == 0 {
            return bad("inflight_ops_max must be at least 1");
        }
        if self.op_deadline.is_zero() {
            return bad("op_deadline must be above zero");
        }
        if self.connect_timeout.is_zero() || self.attempt_timeout.is_zero() {
            return bad("connect_timeout and attempt_timeout must be above zero");
        }
        if self.map_watch_timeout.is_zero() {
            return bad("map_watch_timeout must be above zero");
        }
        Ok(())
    }
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            monitors: Vec::new(),
            op_deadline: Duration::from_secs(30),
            inflight_ops_max: 256,
            connect_timeout: Duration::from_secs(1),
            attempt_timeout: Duration::from_secs(10),
            map_watch_timeout: Duration::from_secs(30),
            keyring: None,
            entity: "client.admin".to_string(),
            credentials: None,
            auth_floor: None,
        }
    }
}

//! etcd authentication: every etcd client of the monitor connects with credentials
//! ([`EtcdCredentials`]), and the monitor's own member has etcd's authentication turned on
//! ([`connect_own_member`]), so a local user of a monitor host who holds no monitor file can
//! neither read nor write etcd (`docs/security.md`, "etcd").
//!
//! The own member's only user is `root` (role `root`), its password derived from the monitor
//! secret (`crate::secret`): every monitor of a cluster derives the same one, so whichever
//! starts first turns authentication on and the others log in. Turning it on is idempotent and
//! safe when several monitors start at once: adding `root` when it exists, granting it the
//! role it has and enabling authentication that is on all succeed or are skipped, and a
//! monitor that finds authentication turned on meanwhile (its unauthenticated calls refused)
//! logs in on its next attempt.
//!
//! With an external etcd (`--etcd-endpoints`), authentication is the operator's: the monitor
//! logs in only if given `--etcd-user` and `--etcd-password-file`.

use crate::etcd_identity::{wait_own_member, NotOwnMember};
use crate::etcd_proc::EtcdMemberConfig;
use crate::secret::MonSecret;
use etcd_client::{Client, ConnectOptions};
use std::time::Duration;

/// The own member's user.
pub const ROOT_USER: &str = "root";

/// A user and password of etcd. `Debug` never prints the password.
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdCredentials {
    pub user: String,
    pub password: String,
}

impl std::fmt::Debug for EtcdCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EtcdCredentials({}, ..)", self.user)
    }
}

impl EtcdCredentials {
    /// `root` of the own member, with the password derived from the monitor secret.
    pub fn root(secret: &MonSecret) -> EtcdCredentials {
        EtcdCredentials {
            user: ROOT_USER.to_string(),
            password: secret.etcd_root_password(),
        }
    }

    /// `opts` logging in as this user, with etcd-client renewing the token etcd drops (after
    /// its `--auth-token-ttl` of idleness, or when the member restarts) instead of failing
    /// the calls that find it gone.
    pub fn apply(&self, opts: ConnectOptions) -> ConnectOptions {
        opts.with_user(self.user.clone(), self.password.clone())
            .with_auto_token_refresh(true)
    }
}

/// `opts` with `credentials`, if any.
pub fn with_credentials(
    opts: ConnectOptions,
    credentials: Option<&EtcdCredentials>,
) -> ConnectOptions {
    match credentials {
        Some(c) => c.apply(opts),
        None => opts,
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EtcdAuthError {
    #[error(
        "the etcd member at {endpoint} refused user {user} with the password derived from \
         this monitor's secret: its authentication was set up with another monitor secret. \
         Give this monitor the cluster's secret file (--mon-secret-file, the same on every \
         monitor)"
    )]
    WrongSecret { endpoint: String, user: String },
    #[error(transparent)]
    NotOwnMember(#[from] NotOwnMember),
    #[error("etcd at {endpoint}: {source}")]
    Etcd {
        endpoint: String,
        source: etcd_client::Error,
    },
}

/// What etcd says when it has no authentication to log in to.
const AUTH_NOT_ENABLED: &str = "authentication is not enabled";
/// What etcd says to a wrong user or password.
const AUTH_FAILED: &str = "authentication failed";
/// What etcd says when a user added is there already.
const USER_EXISTS: &str = "user name already exists";

fn says(e: &etcd_client::Error, what: &str) -> bool {
    e.to_string().contains(what)
}

/// How often a monitor whose member does not take its login yet says so.
const WAITING_LOG_INTERVAL: Duration = Duration::from_secs(30);

/// Connects to the own member as `root`, turning etcd's authentication on first if it is off.
/// Before anything is written, the etcd at the member's client URL is checked to be the own
/// member (`crate::etcd_identity`): authentication is never turned on in a foreign etcd.
/// Retries for as long as etcd does not answer: a login and the setup go through etcd's Raft
/// log, so they wait for a majority of `--initial-cluster` to run, however late the other
/// monitors start (the caller stops waiting if the member itself fails). A member that refuses
/// the password, or a foreign etcd, ends it.
pub async fn connect_own_member(
    member: &EtcdMemberConfig,
    credentials: &EtcdCredentials,
    opts: ConnectOptions,
) -> Result<Client, EtcdAuthError> {
    let endpoint = member.client_url();
    let started = tokio::time::Instant::now();
    let mut next_log = started + WAITING_LOG_INTERVAL;
    loop {
        let last = match Client::connect([&endpoint], Some(credentials.apply(opts.clone()))).await {
            Ok(client) => return Ok(client),
            Err(e) if says(&e, AUTH_FAILED) => {
                return Err(EtcdAuthError::WrongSecret {
                    endpoint: endpoint.clone(),
                    user: credentials.user.clone(),
                })
            }
            Err(e) if says(&e, AUTH_NOT_ENABLED) => {
                match enable(member, credentials, opts.clone()).await {
                    // Logged in at the next turn.
                    Ok(()) => continue,
                    Err(EtcdAuthError::Etcd { source, .. }) => source,
                    Err(other) => return Err(other),
                }
            }
            Err(e) => e,
        };
        if tokio::time::Instant::now() >= next_log {
            tracing::warn!(
                %endpoint, waited = ?started.elapsed(), error = %last,
                "the own etcd member does not take this monitor's login yet (it does once a \
                 majority of --initial-cluster runs)"
            );
            next_log += WAITING_LOG_INTERVAL;
        }
        tracing::debug!(%endpoint, error = %last, "connecting to the own etcd member");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Adds `root` with its role and turns authentication on, in the own member (checked to be
/// it first). Each step tolerates having been done already, by this monitor or another.
async fn enable(
    member: &EtcdMemberConfig,
    credentials: &EtcdCredentials,
    opts: ConnectOptions,
) -> Result<(), EtcdAuthError> {
    let endpoint = member.client_url();
    let etcd = |source| EtcdAuthError::Etcd {
        endpoint: endpoint.clone(),
        source,
    };
    let mut client = Client::connect([&endpoint], Some(opts))
        .await
        .map_err(etcd)?;
    wait_own_member(client.clone(), member).await?;
    match client
        .user_add(credentials.user.clone(), credentials.password.clone(), None)
        .await
    {
        Ok(_) => {}
        // Another monitor added it; with another secret, the login says so.
        Err(e) if says(&e, USER_EXISTS) => {}
        Err(e) => return Err(etcd(e)),
    }
    client
        .user_grant_role(credentials.user.clone(), ROOT_USER)
        .await
        .map_err(etcd)?;
    client.auth_enable().await.map_err(etcd)?;
    tracing::warn!(%endpoint, user = %credentials.user, "etcd authentication turned on");
    Ok(())
}

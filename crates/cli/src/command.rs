//! The command model both syntaxes parse into.

use fastblock_types::auth::AuthMode;
use fastblock_types::map::FailureDomain;
use fastblock_types::OsdId;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    Status,
    Health,
    OsdLs {
        detail: bool,
    },
    OsdOut(OsdId),
    OsdIn(OsdId),
    OsdApplyId(String),
    /// PG members per OSD (`getpgosds`).
    OsdPgs {
        pool: Option<String>,
        pool_id: Option<u32>,
    },
    /// The configuration an OSD reported at boot (`showconfig`).
    OsdConfig(OsdId),
    PoolCreate {
        name: String,
        pg_count: u32,
        size: u32,
        failure_domain: FailureDomain,
    },
    PoolRm {
        name: String,
        force: bool,
    },
    PoolLs,
    PgLs {
        pool: Option<String>,
    },
    ImageCreate {
        pool: String,
        name: String,
        size_bytes: u64,
        object_size_bytes: Option<u64>,
    },
    ImageRm {
        pool: String,
        name: String,
    },
    ImageResize {
        pool: String,
        name: String,
        size_bytes: u64,
        allow_shrink: bool,
    },
    ImageInfo {
        pool: String,
        name: String,
    },
    ImageLs {
        pool: Option<String>,
    },
    Flag {
        flag: String,
        set: bool,
    },
    /// The cluster map; `watch` keeps printing changes until interrupted.
    Map {
        watch: bool,
    },
    ReclaimLs,
    AuthAdd {
        entity: String,
        caps: String,
        output: Option<PathBuf>,
    },
    AuthGetOrCreate {
        entity: String,
        caps: String,
        output: Option<PathBuf>,
    },
    AuthLs,
    AuthRm(String),
    AuthCaps {
        entity: String,
        caps: String,
    },
    AuthRotate {
        entity: String,
        output: Option<PathBuf>,
    },
    /// Set the auth mode, or print it (`None`).
    AuthMode(Option<AuthMode>),
}

/// How results are printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    Human,
    Json,
    /// The reference system's output shapes.
    Legacy,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invocation {
    pub command: Command,
    pub style: Style,
    pub monitors: Vec<String>,
    /// How long unavailable monitors are retried.
    pub timeout: Duration,
    /// `--keyring` (else `$FASTBLOCK_KEYRING`, else `/etc/fastblock/keyring`).
    pub keyring: Option<PathBuf>,
    /// `--name`: the entity whose key signs the calls.
    pub name: String,
}

/// The entity the CLI acts as unless `--name` says otherwise.
pub const DEFAULT_ENTITY: &str = "client.admin";

/// Default monitor address, overridable with `--mon` / `-endpoint` or `FASTBLOCK_MON`.
pub fn default_monitors() -> Vec<String> {
    std::env::var("FASTBLOCK_MON")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.split(',').map(str::to_string).collect())
        .unwrap_or_else(|| vec!["127.0.0.1:3333".to_string()])
}

/// Splits `POOL/NAME`.
pub fn split_image_spec(spec: &str) -> Result<(String, String), String> {
    match spec.split_once('/') {
        Some((pool, name)) if !pool.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((pool.to_string(), name.to_string()))
        }
        _ => Err(format!("invalid image {spec:?}: expected POOL/NAME")),
    }
}

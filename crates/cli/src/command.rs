//! The command model both syntaxes parse into.

use fastblock_types::auth::AuthMode;
use fastblock_types::map::FailureDomain;
use fastblock_types::{OsdId, PgId};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    Status,
    /// The health checks; `detail` adds their detail lines (`crate::capacity`).
    Health {
        detail: bool,
    },
    /// Raw and per-pool space (`crate::capacity`).
    Df,
    /// `osd set-full-ratio` (`full`) or `osd set-nearfull-ratio` (`crate::capacity`).
    OsdSetRatio {
        full: bool,
        ratio: crate::capacity::Ratio,
    },
    OsdLs {
        detail: bool,
    },
    /// A daemon's settings through its admin socket on this host, or an OSD's through the
    /// monitor when its socket is not here (`crate::daemon_config`).
    Config {
        run_dir: PathBuf,
        target: String,
        request: crate::daemon_config::AdminRequest,
    },
    OsdOut(OsdId),
    OsdIn(OsdId),
    /// Remove a down, out OSD no PG names, for good (`fastblock_mon_core::osd_purge`).
    OsdPurge(OsdId),
    OsdApplyId(String),
    /// PG members per OSD (`getpgosds`).
    OsdPgs {
        pool: Option<String>,
        pool_id: Option<u32>,
    },
    /// The configuration an OSD reported at boot (`showconfig`).
    OsdConfig(OsdId),
    /// An OSD's ops in flight, or (`historic`) its slowest recent ones (`crate::ops`).
    OsdOps {
        id: OsdId,
        historic: bool,
    },
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
    /// Ask a PG's leader to scrub it now (`pg scrub`, `pg deep-scrub`, `pg repair`: a repair
    /// is a deep scrub).
    PgScrub {
        pg: PgId,
        deep: bool,
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
    /// Take a snapshot (`image snap create`).
    SnapCreate(SnapSpec),
    /// The image's snapshots (`image snap ls`).
    SnapLs(ImageSpec),
    /// Remove a snapshot (`image snap rm`).
    SnapRm(SnapSpec),
    /// Make the image's head equal to the snapshot, size included (`image snap rollback`):
    /// monitor and data path.
    SnapRollback {
        snap: SnapSpec,
        objects_in_flight_max: usize,
    },
    /// Protect (`true`) or unprotect a snapshot.
    SnapProtect {
        snap: SnapSpec,
        protect: bool,
    },
    /// A writable clone of a protected snapshot (`image clone`).
    ImageClone {
        source: SnapSpec,
        target: ImageSpec,
    },
    /// Copy a clone's parent data in, then end the link (`image flatten`): data path, then
    /// the monitor.
    ImageFlatten {
        image: ImageSpec,
        objects_in_flight_max: usize,
    },
    /// The clones of a snapshot (`image children`).
    ImageChildren(SnapSpec),
    /// Copy a file or stdin into a new image (`image import`): data path.
    ImageImport(ImportArgs),
    /// Copy an image or snapshot into a file or stdout (`image export`): data path.
    ImageExport(ExportArgs),
    /// Copy an image or snapshot into a new image (`image cp`): data path.
    ImageCp(CopyArgs),
    Flag {
        flag: String,
        set: bool,
    },
    /// The cluster map; `watch` keeps printing changes until interrupted.
    Map {
        watch: bool,
    },
    ReclaimLs,
    /// `mon backup FILE`.
    MonBackup(PathBuf),
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
    /// `--auth-floor` (else `$FASTBLOCK_AUTH_FLOOR`; None: `sign` with a key, else `none`).
    pub auth_floor: Option<fastblock_types::auth::AuthMode>,
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

/// Parses a PG id, `POOL.SEQ` (`1.0`).
pub fn parse_pgid(s: &str) -> Result<PgId, String> {
    s.parse()
        .map_err(|e: fastblock_types::ids::PgIdParseError| e.to_string())
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

/// An image named `POOL/IMAGE`, as the snapshot and clone commands take it (no `@`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageSpec {
    pub pool: String,
    pub image: String,
}

impl std::fmt::Display for ImageSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.pool, self.image)
    }
}

/// A snapshot named `POOL/IMAGE@SNAP`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapSpec {
    pub pool: String,
    pub image: String,
    pub snap: String,
}

impl std::fmt::Display for SnapSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}@{}", self.pool, self.image, self.snap)
    }
}

/// Where `image import` reads or `image export` writes: `-` (stdin, stdout) or a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DataPath {
    Stdio,
    File(PathBuf),
}

impl DataPath {
    pub fn parse(s: &str) -> DataPath {
        if s == "-" {
            DataPath::Stdio
        } else {
            DataPath::File(PathBuf::from(s))
        }
    }
}

/// An image's head or one of its snapshots, `POOL/IMAGE[@SNAP]`: what export and cp read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageOrSnap {
    pub image: ImageSpec,
    pub snap: Option<String>,
}

impl std::fmt::Display for ImageOrSnap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.snap {
            Some(snap) => write!(f, "{}@{snap}", self.image),
            None => write!(f, "{}", self.image),
        }
    }
}

/// Parses `POOL/IMAGE` or `POOL/IMAGE@SNAP` (as [`parse_image_spec`], [`parse_snap_spec`]).
pub fn parse_image_or_snap(spec: &str) -> Result<ImageOrSnap, String> {
    if spec.contains('@') {
        let s = parse_snap_spec(spec)?;
        return Ok(ImageOrSnap {
            image: ImageSpec {
                pool: s.pool,
                image: s.image,
            },
            snap: Some(s.snap),
        });
    }
    Ok(ImageOrSnap {
        image: parse_image_spec(spec)?,
        snap: None,
    })
}

/// `image import FILE|- POOL/IMAGE` (`docs/cli.md`, "Moving data in and out").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImportArgs {
    pub source: DataPath,
    pub target: ImageSpec,
    /// The image's size; else the file's, rounded up to 4 KiB. Needed for a pipe.
    pub size_bytes: Option<u64>,
    pub object_size_bytes: Option<u64>,
    /// Replace an existing image (removed first).
    pub overwrite: bool,
    pub chunks_in_flight_max: usize,
}

/// `image export POOL/IMAGE[@SNAP] FILE|-`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportArgs {
    pub source: ImageOrSnap,
    pub target: DataPath,
    /// Replace an existing regular file.
    pub overwrite: bool,
    pub chunks_in_flight_max: usize,
}

/// `image cp POOL/IMAGE[@SNAP] POOL/IMAGE`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopyArgs {
    pub source: ImageOrSnap,
    pub target: ImageSpec,
    /// The copy's object size; else the source's.
    pub object_size_bytes: Option<u64>,
    /// Replace an existing image (removed first).
    pub overwrite: bool,
    pub chunks_in_flight_max: usize,
}

/// Parses `POOL/IMAGE@SNAP`: exactly one `/`, then exactly one `@`, no empty part. Each
/// refusal says which rule the spec breaks (pool, image and snapshot names never contain
/// `/` or `@`, so a second one is always a mistake).
pub fn parse_snap_spec(spec: &str) -> Result<SnapSpec, String> {
    let bad = |why: &str| {
        Err(format!(
            "invalid snapshot {spec:?}: {why}; expected POOL/IMAGE@SNAP"
        ))
    };
    let slashes = spec.matches('/').count();
    let ats = spec.matches('@').count();
    if spec.is_empty() {
        return bad("empty");
    }
    if ats == 0 {
        return bad("missing @SNAP");
    }
    if ats > 1 {
        return bad("more than one '@'");
    }
    if slashes == 0 {
        return bad("missing POOL/");
    }
    if slashes > 1 {
        return bad("more than one '/'");
    }
    let (pool, rest) = spec.split_once('/').expect("one '/' counted above");
    let Some((image, snap)) = rest.split_once('@') else {
        return bad("the @SNAP part must come after the image name");
    };
    if pool.is_empty() {
        return bad("empty pool name");
    }
    if image.is_empty() {
        return bad("empty image name");
    }
    if snap.is_empty() {
        return bad("empty snapshot name");
    }
    Ok(SnapSpec {
        pool: pool.to_string(),
        image: image.to_string(),
        snap: snap.to_string(),
    })
}

/// Parses `POOL/IMAGE` where a snapshot would be wrong (`snap ls`, `flatten`, a clone's
/// name): as [`split_image_spec`], and refusing `@SNAP`.
pub fn parse_image_spec(spec: &str) -> Result<ImageSpec, String> {
    if spec.contains('@') {
        return Err(format!(
            "invalid image {spec:?}: expected POOL/IMAGE without @SNAP"
        ));
    }
    let (pool, image) = split_image_spec(spec)?;
    Ok(ImageSpec { pool, image })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_names_split_in_three() {
        let s = parse_snap_spec("rbd/vm-1.x@before_upgrade").unwrap();
        assert_eq!(
            s,
            SnapSpec {
                pool: "rbd".into(),
                image: "vm-1.x".into(),
                snap: "before_upgrade".into()
            }
        );
        assert_eq!(s.to_string(), "rbd/vm-1.x@before_upgrade");
        let i = parse_image_spec("rbd/vm1").unwrap();
        assert_eq!(i.to_string(), "rbd/vm1");
    }

    #[test]
    fn malformed_snapshot_names_say_why() {
        for (spec, why) in [
            ("", "empty"),
            ("rbd/vm1", "missing @SNAP"),
            ("vm1@s", "missing POOL/"),
            ("rbd/vm1@", "empty snapshot name"),
            ("rbd/@s", "empty image name"),
            ("/vm1@s", "empty pool name"),
            ("a/b/c@s", "more than one '/'"),
            ("a/b@c@d", "more than one '@'"),
            ("a@b/c", "after the image name"),
        ] {
            let e = parse_snap_spec(spec).unwrap_err();
            assert!(e.contains(why), "{spec:?}: {e}");
            assert!(e.contains("expected POOL/IMAGE@SNAP"), "{spec:?}: {e}");
        }
        assert!(parse_image_spec("rbd/vm1@s")
            .unwrap_err()
            .contains("without @SNAP"));
        assert!(parse_image_spec("rbd").is_err());
    }
}

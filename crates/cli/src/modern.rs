//! The modern syntax: `fastblock-client [--mon ADDR] [--json] <noun> <verb> ...`.

use crate::command::{
    default_monitors, split_image_spec, Command, Invocation, Style, DEFAULT_ENTITY,
};
use crate::{EXIT_FAILURE, EXIT_USAGE};
use clap::{Parser, Subcommand};
use fastblock_types::auth::AuthMode;
use fastblock_types::map::FailureDomain;
use fastblock_types::units::{duration_arg, parse_size};
use fastblock_types::OsdId;
use std::path::PathBuf;
use std::time::Duration;

fn size(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

/// Administer a fastblock cluster.
#[derive(Parser, Debug)]
#[command(
    name = "fastblock-client",
    version,
    after_help = "The reference syntax works too: fastblock-client -op=createpool -poolname=P -pgcount=8 -pgsize=3"
)]
struct Cli {
    /// Monitor API address(es), comma-separated [env: FASTBLOCK_MON; default 127.0.0.1:3333].
    #[arg(long, global = true, value_delimiter = ',')]
    mon: Vec<String>,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    /// How long to keep retrying while no monitor answers.
    #[arg(long, global = true, default_value = "30s", value_parser = duration_arg)]
    timeout: Duration,
    /// Keyring holding the key of --name [env: FASTBLOCK_KEYRING; default /etc/fastblock/keyring].
    #[arg(long, global = true)]
    keyring: Option<PathBuf>,
    /// The entity to act as.
    #[arg(long = "name", id = "entity_name", value_name = "ENTITY", global = true, default_value = DEFAULT_ENTITY)]
    entity_name: String,
    #[command(subcommand)]
    command: Top,
}

#[derive(Subcommand, Debug)]
enum Top {
    /// Cluster summary, like `ceph -s`.
    Status,
    /// Health status and the checks behind it.
    Health,
    /// OSD commands.
    #[command(subcommand)]
    Osd(OsdCmd),
    /// Pool commands.
    #[command(subcommand)]
    Pool(PoolCmd),
    /// Placement-group commands.
    #[command(subcommand)]
    Pg(PgCmd),
    /// Image commands.
    #[command(subcommand)]
    Image(ImageCmd),
    /// Set a cluster flag (noout, norebalance).
    Set { flag: String },
    /// Clear a cluster flag.
    Unset { flag: String },
    /// Print the cluster map.
    Map {
        /// Keep printing each new epoch until interrupted.
        #[arg(long)]
        watch: bool,
    },
    /// Data of removed images and shrunk tails still to be deleted.
    Reclaim,
    /// Keys and capabilities (`docs/security.md`).
    #[command(subcommand)]
    Auth(AuthCmd),
}

#[derive(Subcommand, Debug)]
enum AuthCmd {
    /// Create ENTITY (client.NAME) with a new key; print its keyring or write it to -o.
    Add {
        entity: String,
        /// admin, pool=NAME, pool=* (space-separated).
        #[arg(long, default_value = "")]
        caps: String,
        /// Write the new keyring here (mode 0600) instead of printing it.
        #[arg(short = 'o', long)]
        output: Option<PathBuf>,
    },
    /// ENTITY's key, created with --caps if it has none.
    GetOrCreate {
        entity: String,
        #[arg(long, default_value = "")]
        caps: String,
        #[arg(short = 'o', long)]
        output: Option<PathBuf>,
    },
    /// List entities, their caps and key fingerprints.
    Ls,
    /// Remove ENTITY's key: its calls and connections are refused from now on.
    Rm { entity: String },
    /// Replace ENTITY's capabilities.
    Caps { entity: String, caps: String },
    /// Give ENTITY a new key; the old one stops working.
    Rotate {
        entity: String,
        #[arg(short = 'o', long)]
        output: Option<PathBuf>,
    },
    /// Print the auth mode, or set it (none, sign, secure).
    Mode { mode: Option<AuthMode> },
}

#[derive(Subcommand, Debug)]
enum OsdCmd {
    /// List OSDs.
    Ls {
        #[arg(long)]
        detail: bool,
    },
    /// Mark an OSD out: its PGs move elsewhere.
    Out { id: OsdId },
    /// Mark an OSD in again (it must be up).
    In { id: OsdId },
    /// Register a new OSD uuid and print its id.
    ApplyId { uuid: String },
    /// The configuration an OSD reported at boot.
    Config { id: OsdId },
    /// PG members and preferred leaders per OSD.
    Pgs {
        #[arg(long)]
        pool: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
enum PoolCmd {
    /// Create a pool.
    Create {
        name: String,
        #[arg(long)]
        pg_count: u32,
        /// Replicas per PG.
        #[arg(long, default_value_t = 3)]
        size: u32,
        /// osd or host.
        #[arg(long, default_value = "osd")]
        failure_domain: FailureDomain,
    },
    /// Delete a pool (refused while it holds images, unless --force).
    #[command(alias = "delete")]
    Rm {
        name: String,
        #[arg(long)]
        force: bool,
    },
    /// List pools.
    Ls,
}

#[derive(Subcommand, Debug)]
enum PgCmd {
    /// List PGs with state and members.
    Ls {
        #[arg(long)]
        pool: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
enum ImageCmd {
    /// Create an image: POOL/NAME --size 10G.
    Create {
        spec: String,
        #[arg(long, value_parser = size)]
        size: u64,
        /// Power of two, 4K..64M (default 4M).
        #[arg(long, value_parser = size)]
        object_size: Option<u64>,
    },
    /// Remove an image; its data is reclaimed by the OSDs.
    #[command(alias = "remove")]
    Rm { spec: String },
    /// Grow an image (or shrink it with --allow-shrink).
    Resize {
        spec: String,
        #[arg(long, value_parser = size)]
        size: u64,
        #[arg(long)]
        allow_shrink: bool,
    },
    /// Show an image.
    Info { spec: String },
    /// List images, optionally of one pool.
    Ls { pool: Option<String> },
}

/// Parses modern arguments. Errors come with their exit status (0 for --help/--version).
pub fn parse(argv: &[String]) -> Result<Invocation, (i32, String)> {
    let args = std::iter::once("fastblock-client".to_string()).chain(argv.iter().cloned());
    let cli = Cli::try_parse_from(args).map_err(|e| {
        let code = if e.use_stderr() { EXIT_USAGE } else { 0 };
        (code, e.render().to_string())
    })?;
    let image = |spec: &str| split_image_spec(spec).map_err(|e| (EXIT_USAGE, e));
    let command = match cli.command {
        Top::Status => Command::Status,
        Top::Health => Command::Health,
        Top::Osd(OsdCmd::Ls { detail }) => Command::OsdLs { detail },
        Top::Osd(OsdCmd::Out { id }) => Command::OsdOut(id),
        Top::Osd(OsdCmd::In { id }) => Command::OsdIn(id),
        Top::Osd(OsdCmd::ApplyId { uuid }) => Command::OsdApplyId(uuid),
        Top::Osd(OsdCmd::Pgs { pool }) => Command::OsdPgs {
            pool,
            pool_id: None,
        },
        Top::Osd(OsdCmd::Config { id }) => Command::OsdConfig(id),
        Top::Pool(PoolCmd::Create {
            name,
            pg_count,
            size,
            failure_domain,
        }) => Command::PoolCreate {
            name,
            pg_count,
            size,
            failure_domain,
        },
        Top::Pool(PoolCmd::Rm { name, force }) => Command::PoolRm { name, force },
        Top::Pool(PoolCmd::Ls) => Command::PoolLs,
        Top::Pg(PgCmd::Ls { pool }) => Command::PgLs { pool },
        Top::Image(ImageCmd::Create {
            spec,
            size,
            object_size,
        }) => {
            let (pool, name) = image(&spec)?;
            Command::ImageCreate {
                pool,
                name,
                size_bytes: size,
                object_size_bytes: object_size,
            }
        }
        Top::Image(ImageCmd::Rm { spec }) => {
            let (pool, name) = image(&spec)?;
            Command::ImageRm { pool, name }
        }
        Top::Image(ImageCmd::Resize {
            spec,
            size,
            allow_shrink,
        }) => {
            let (pool, name) = image(&spec)?;
            Command::ImageResize {
                pool,
                name,
                size_bytes: size,
                allow_shrink,
            }
        }
        Top::Image(ImageCmd::Info { spec }) => {
            let (pool, name) = image(&spec)?;
            Command::ImageInfo { pool, name }
        }
        Top::Image(ImageCmd::Ls { pool }) => Command::ImageLs { pool },
        Top::Set { flag } => Command::Flag { flag, set: true },
        Top::Unset { flag } => Command::Flag { flag, set: false },
        Top::Map { watch } => Command::Map { watch },
        Top::Reclaim => Command::ReclaimLs,
        Top::Auth(AuthCmd::Add {
            entity,
            caps,
            output,
        }) => Command::AuthAdd {
            entity,
            caps,
            output,
        },
        Top::Auth(AuthCmd::GetOrCreate {
            entity,
            caps,
            output,
        }) => Command::AuthGetOrCreate {
            entity,
            caps,
            output,
        },
        Top::Auth(AuthCmd::Ls) => Command::AuthLs,
        Top::Auth(AuthCmd::Rm { entity }) => Command::AuthRm(entity),
        Top::Auth(AuthCmd::Caps { entity, caps }) => Command::AuthCaps { entity, caps },
        Top::Auth(AuthCmd::Rotate { entity, output }) => Command::AuthRotate { entity, output },
        Top::Auth(AuthCmd::Mode { mode }) => Command::AuthMode(mode),
    };
    let _ = EXIT_FAILURE;
    Ok(Invocation {
        command,
        style: if cli.json { Style::Json } else { Style::Human },
        monitors: if cli.mon.is_empty() {
            default_monitors()
        } else {
            cli.mon
        },
        timeout: cli.timeout,
        keyring: cli.keyring,
        name: cli.entity_name,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Invocation, (i32, String)> {
        parse(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn parses_pool_create() {
        let inv = p(&[
            "pool",
            "create",
            "rbd",
            "--pg-count",
            "32",
            "--size",
            "3",
            "--failure-domain",
            "host",
        ])
        .unwrap();
        assert_eq!(
            inv.command,
            Command::PoolCreate {
                name: "rbd".into(),
                pg_count: 32,
                size: 3,
                failure_domain: FailureDomain::Host
            }
        );
        assert_eq!(inv.style, Style::Human);
    }

    #[test]
    fn parses_image_sizes_and_json() {
        let inv = p(&["--json", "image", "create", "rbd/vm1", "--size", "10G"]).unwrap();
        assert_eq!(
            inv.command,
            Command::ImageCreate {
                pool: "rbd".into(),
                name: "vm1".into(),
                size_bytes: 10 << 30,
                object_size_bytes: None
            }
        );
        assert_eq!(inv.style, Style::Json);
    }

    #[test]
    fn usage_errors_exit_2() {
        assert_eq!(p(&["pool", "create", "x"]).unwrap_err().0, EXIT_USAGE);
        assert_eq!(
            p(&["image", "create", "novolume", "--size", "1G"])
                .unwrap_err()
                .0,
            EXIT_USAGE
        );
        assert_eq!(
            p(&["image", "create", "a/b", "--size", "1Q"])
                .unwrap_err()
                .0,
            EXIT_USAGE
        );
        assert_eq!(p(&["osd", "out", "x"]).unwrap_err().0, EXIT_USAGE);
        assert_eq!(p(&["--help"]).unwrap_err().0, 0);
    }
}

//! The modern syntax: `fastblock-client [--mon ADDR] [--json] <noun> <verb> ...`.

use crate::command::{
    default_monitors, parse_image_or_snap, parse_image_spec, parse_pgid, parse_snap_spec,
    split_image_spec, Command, CopyArgs, DataPath, ExportArgs, ImageOrSnap, ImageSpec, ImportArgs,
    Invocation, SnapSpec, Style, DEFAULT_ENTITY,
};
use crate::{EXIT_FAILURE, EXIT_USAGE};
use clap::{CommandFactory, Parser, Subcommand};
use fastblock_types::auth::AuthMode;
use fastblock_types::map::FailureDomain;
use fastblock_types::units::{duration_arg, parse_size};
use fastblock_types::{OsdId, PgId};
use std::path::PathBuf;
use std::time::Duration;

/// A cluster flag's name, checked here so that a typo is a usage error (status 2), not the
/// monitor's refusal.
fn flag_arg(s: &str) -> Result<String, String> {
    s.parse::<fastblock_types::map::Flag>()?;
    Ok(s.to_string())
}

fn size(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

/// Administer a fastblock cluster.
#[derive(Parser, Debug)]
#[command(
    name = "fastblock-client",
    version = fastblock_version::VERSION,
    after_help = "The reference syntax works too: fastblock-client -op=createpool -poolname=P -pgcount=8 -pgsize=3"
)]
struct Cli {
    /// Monitor API address(es), comma-separated [env: FASTBLOCK_MON; default 127.0.0.1:3333].
    #[arg(long, global = true, value_delimiter = ',')]
    mon: Vec<String>,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    /// How long to keep retrying while no monitor answers (rollback, flatten, import, export
    /// and cp: also how long each object request keeps retrying).
    #[arg(long, global = true, default_value = "30s", value_parser = duration_arg)]
    timeout: Duration,
    /// Keyring holding the key of --name [env: FASTBLOCK_KEYRING; default /etc/fastblock/keyring].
    #[arg(long, global = true)]
    keyring: Option<PathBuf>,
    /// The weakest auth mode accepted from the monitor (none, sign, secure) [default: sign
    /// with a key, else none]: an answer or map in a weaker mode is refused as a downgrade.
    /// Lower it only to use a cluster in a weaker mode on purpose.
    #[arg(long, global = true, env = "FASTBLOCK_AUTH_FLOOR", value_name = "MODE")]
    auth_floor: Option<fastblock_types::auth::AuthMode>,
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
    /// Health status and its checks, one `CODE: summary` line each.
    Health {
        /// Add each check's detail lines (what it is about: OSDs, PGs, pools).
        #[arg(long)]
        detail: bool,
    },
    /// Raw space and per-pool usage: stored, used with replication, objects, max available.
    Df,
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
    Set {
        /// noout or norebalance.
        #[arg(value_parser = flag_arg)]
        flag: String,
    },
    /// Clear a cluster flag.
    Unset {
        /// noout or norebalance.
        #[arg(value_parser = flag_arg)]
        flag: String,
    },
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
    /// The monitors' own state (docs/operations.md, "Monitor database").
    #[command(subcommand)]
    Mon(MonCmd),
    /// A daemon's settings, read and changed at runtime through its admin socket on this host,
    /// or for an OSD without one here through the monitor (docs/operations.md, "Configuration").
    #[command(subcommand)]
    Config(ConfigCmd),
    /// Print the shell completion script for SHELL (e.g. `source <(fastblock-client
    /// completions bash)`).
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Write the man pages of fastblock-client and every subcommand into DIR.
    Man {
        /// Directory to write the pages to (created if missing), e.g. /usr/local/share/man/man1.
        dir: PathBuf,
    },
}

#[derive(Subcommand, Debug)]
enum MonCmd {
    /// Write a backup of the monitors' state (every key at one etcd revision) to FILE, mode
    /// 0600: it holds every key of the key table. Restore it with `fastblock-mon
    /// --restore-from FILE` into an empty etcd.
    Backup {
        /// Where to write it (replaced atomically if it exists).
        file: PathBuf,
    },
}

#[derive(Subcommand, Debug)]
enum ConfigCmd {
    /// Every setting of the daemon: its value, where it came from (default, file, env, flag,
    /// runtime) and whether `config set` can change it.
    Show {
        #[command(flatten)]
        daemon: ConfigDaemon,
    },
    /// One setting's value.
    Get {
        #[command(flatten)]
        daemon: ConfigDaemon,
        /// The setting: a long flag name with `_` for `-` (e.g. log_level).
        key: String,
    },
    /// Change a setting of the running daemon (not its config file: a restart forgets it).
    Set {
        #[command(flatten)]
        daemon: ConfigDaemon,
        /// The setting, e.g. log_level (`config show` marks the settable ones).
        key: String,
        /// The new value, e.g. `debug` or `info,fastblock_osd=debug`.
        value: String,
    },
}

/// Which daemon `config` talks to, and where its admin socket is.
#[derive(clap::Args, Debug)]
struct ConfigDaemon {
    /// osd.N, mon (the one monitor of this host), mon.NAME or nbd. An OSD whose socket is not
    /// in --run-dir is reached through the monitor (--mon, with an admin key); mon and nbd only
    /// through their sockets.
    target: String,
    /// The daemons' --run-dir, which holds their admin sockets `<target>.asok`.
    #[arg(long, env = "FASTBLOCK_RUN_DIR", default_value = "/run/fastblock")]
    run_dir: PathBuf,
}

#[derive(Subcommand, Debug)]
enum AuthCmd {
    /// Create ENTITY (client.NAME) with a new key; print its keyring or write it to -o.
    Add {
        /// The new entity, client.NAME.
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
        /// The entity, client.NAME.
        entity: String,
        /// Caps if it is created: admin, pool=NAME, pool=* (space-separated).
        #[arg(long, default_value = "")]
        caps: String,
        /// Write the keyring here (mode 0600) instead of printing it.
        #[arg(short = 'o', long)]
        output: Option<PathBuf>,
    },
    /// List entities, their caps and key fingerprints.
    Ls,
    /// Remove ENTITY's key: its calls and connections are refused from now on.
    Rm {
        /// The entity, client.NAME.
        entity: String,
    },
    /// Replace ENTITY's capabilities.
    Caps {
        /// The entity, client.NAME.
        entity: String,
        /// admin, pool=NAME, pool=* (space-separated).
        caps: String,
    },
    /// Give ENTITY a new key; the old one stops working.
    Rotate {
        /// The entity, client.NAME.
        entity: String,
        /// Write the new keyring here (mode 0600) instead of printing it.
        #[arg(short = 'o', long)]
        output: Option<PathBuf>,
    },
    /// Print the auth mode, or set it (none, sign, secure).
    Mode {
        /// The new mode: none, sign or secure; absent: print the current one.
        mode: Option<AuthMode>,
    },
}

#[derive(Subcommand, Debug)]
enum OsdCmd {
    /// List OSDs.
    Ls {
        /// Add each OSD's uuid and boot epoch.
        #[arg(long)]
        detail: bool,
    },
    /// Mark an OSD out: its PGs move elsewhere.
    Out {
        /// The OSD id.
        id: OsdId,
    },
    /// Mark an OSD in again (it must be up).
    In {
        /// The OSD id.
        id: OsdId,
    },
    /// Remove an OSD for good: it must be down and out, and no PG may name it any more (its
    /// PGs moved off it). Its record and key go; its id is retired, never given again.
    Purge {
        /// The OSD id.
        id: OsdId,
    },
    /// Register a new OSD uuid and print its id.
    ApplyId {
        /// The OSD's uuid.
        uuid: String,
    },
    /// The configuration an OSD reported at boot.
    Config {
        /// The OSD id.
        id: OsdId,
    },
    /// The OSD's ops in flight, oldest first, with the stage each is in (as of the OSD's
    /// last heartbeat; docs/operations.md, "Slow ops").
    Ops {
        /// The OSD id.
        id: OsdId,
    },
    /// The OSD's slowest ops of the last 10 minutes, with the time each spent in every
    /// stage.
    HistoricOps {
        /// The OSD id.
        id: OsdId,
    },
    /// PG members and preferred leaders per OSD.
    Pgs {
        /// Only the PGs of this pool.
        #[arg(long)]
        pool: Option<String>,
    },
    /// Set the used share past which health warns (OSD_NEARFULL; default 0.85).
    SetNearfullRatio {
        /// A number above 0 and below the full ratio.
        #[arg(value_parser = crate::capacity::parse_ratio)]
        ratio: crate::capacity::Ratio,
    },
    /// Set the used share past which an OSD is full and writes to its PGs are refused
    /// (OSD_FULL; default 0.95).
    SetFullRatio {
        /// A number above the nearfull ratio and at most 1.
        #[arg(value_parser = crate::capacity::parse_ratio)]
        ratio: crate::capacity::Ratio,
    },
}

#[derive(Subcommand, Debug)]
enum PoolCmd {
    /// Create a pool.
    Create {
        /// The new pool's name.
        name: String,
        /// Placement groups of the pool.
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
        /// The pool's name.
        name: String,
        /// Delete it with its images (not when they have clones in other pools).
        #[arg(long)]
        force: bool,
    },
    /// List pools.
    Ls,
}

#[derive(Subcommand, Debug)]
enum PgCmd {
    /// List PGs with state, members, last scrubs and blocks left inconsistent.
    ///
    /// LAST-SCRUB and LAST-DEEP-SCRUB are when the leader monitor saw a scrub of the PG
    /// finish (UTC; `-`: none since it leads), INCONSISTENT the blocks the last scrub could not
    /// repair (`-`: no scrub reported).
    Ls {
        /// Only the PGs of this pool.
        #[arg(long)]
        pool: Option<String>,
    },
    /// Ask a PG's leader to scrub it now: the replicas compare their per-block checksums.
    ///
    /// Every scrub repairs the blocks on which a majority of replicas agrees; blocks without
    /// a majority stay inconsistent (health check PG_INCONSISTENT). The command returns once
    /// the request is recorded; `pg ls` shows when the scrub finished. Asking again while a
    /// request is pending returns that request.
    Scrub {
        /// The PG, POOL.SEQ (for example 1.0).
        #[arg(value_name = "PGID", value_parser = parse_pgid)]
        pgid: PgId,
    },
    /// Ask a PG's leader to deep-scrub it now: also read every block's data and check it.
    ///
    /// As `pg scrub`, and each replica also reads all its data and checks it against its
    /// checksums, so a bad copy is found even where the checksums agree. Every scrub repairs
    /// what a majority of replicas agrees on.
    DeepScrub {
        /// The PG, POOL.SEQ (for example 1.0).
        #[arg(value_name = "PGID", value_parser = parse_pgid)]
        pgid: PgId,
    },
    /// Repair a PG: a deep scrub, which repairs every block a majority of replicas agrees on.
    ///
    /// Scrubs always repair what a majority of replicas agrees on, so this is `pg deep-scrub`
    /// under the name an operator looks for. Blocks with no majority cannot be repaired this
    /// way and stay in PG_INCONSISTENT.
    Repair {
        /// The PG, POOL.SEQ (for example 1.0).
        #[arg(value_name = "PGID", value_parser = parse_pgid)]
        pgid: PgId,
    },
}

#[derive(Subcommand, Debug)]
enum ImageCmd {
    /// Create an image: POOL/NAME --size 10G.
    Create {
        /// The new image, POOL/NAME.
        #[arg(value_name = "POOL/NAME")]
        spec: String,
        /// Its size in bytes, binary units accepted (10G, 512M, 4K); a multiple of 4 KiB.
        #[arg(long, value_parser = size)]
        size: u64,
        /// Power of two, 4K..64M (default 4M).
        #[arg(long, value_parser = size)]
        object_size: Option<u64>,
    },
    /// Remove an image; its data is reclaimed by the OSDs.
    ///
    /// Refused while the image has snapshots or clones: the error names them.
    #[command(alias = "remove")]
    Rm {
        /// The image, POOL/NAME.
        #[arg(value_name = "POOL/NAME")]
        spec: String,
    },
    /// Grow an image (or shrink it with --allow-shrink).
    Resize {
        /// The image, POOL/NAME.
        #[arg(value_name = "POOL/NAME")]
        spec: String,
        /// The new size, binary units accepted (10G, 512M, 4K).
        #[arg(long, value_parser = size)]
        size: u64,
        /// Allow a size below the current one: the cut tail is deleted.
        #[arg(long)]
        allow_shrink: bool,
    },
    /// Show an image: size, objects, snapshot count, and a clone's parent.
    Info {
        /// The image, POOL/NAME.
        #[arg(value_name = "POOL/NAME")]
        spec: String,
    },
    /// List images, optionally of one pool.
    Ls {
        /// Only the images of this pool.
        pool: Option<String>,
    },
    /// Snapshot commands: create, ls, rm, rollback, protect, unprotect.
    #[command(subcommand)]
    Snap(SnapCmd),
    /// Create a writable clone of a protected snapshot.
    ///
    /// The clone has the snapshot's size and object size and reads through to the snapshot
    /// wherever it has not written itself, until `image flatten`.
    Clone {
        /// The parent snapshot, POOL/IMAGE@SNAP; it must be protected (`image snap protect`).
        #[arg(value_name = "POOL/IMAGE@SNAP", value_parser = parse_snap_spec)]
        source: SnapSpec,
        /// The new image, POOL/NAME (in any pool).
        #[arg(value_name = "POOL/NEW", value_parser = parse_image_spec)]
        target: ImageSpec,
    },
    /// Copy a clone's parent data into it, so that it stands alone.
    ///
    /// Copies every object the clone has not written yet from the parent snapshot, for the
    /// clone and for each of its snapshots (a progress bar on stderr when it is a
    /// terminal), then tells the monitor, which ends the link: afterwards the parent
    /// snapshot can be unprotected and removed. The clone stays usable meanwhile; an
    /// interrupted flatten can be run again.
    Flatten {
        /// The clone, POOL/NAME.
        #[arg(value_name = "POOL/NAME", value_parser = parse_image_spec)]
        spec: ImageSpec,
        /// Objects copied at once.
        #[arg(
            long,
            value_name = "N",
            default_value_t = OBJECTS_IN_FLIGHT_DEFAULT,
            value_parser = objects_in_flight
        )]
        objects_in_flight: usize,
    },
    /// List the clones of a snapshot that still read through to it.
    Children {
        /// The snapshot, POOL/IMAGE@SNAP.
        #[arg(value_name = "POOL/IMAGE@SNAP", value_parser = parse_snap_spec)]
        spec: SnapSpec,
    },
    /// Copy a raw disk image from a file or stdin (-) into a new image.
    ///
    /// The image gets the file's size rounded up to 4 KiB (or --size; a pipe needs it).
    /// Holes of the file (SEEK_DATA/SEEK_HOLE) and all-zero 4 KiB blocks are not written. While
    /// it runs the image has a snapshot named import-incomplete, removed at the end: an
    /// interrupted import leaves it there (docs/cli.md).
    Import {
        /// The file to read, or - for stdin.
        #[arg(value_name = "FILE|-")]
        source: String,
        /// The new image, POOL/NAME.
        #[arg(value_name = "POOL/NAME", value_parser = parse_image_spec)]
        target: ImageSpec,
        /// The image's size (binary units accepted); at least the file's.
        #[arg(long, value_parser = size)]
        size: Option<u64>,
        /// Power of two, 4K..64M (default 4M).
        #[arg(long, value_parser = size)]
        object_size: Option<u64>,
        /// Replace an existing image: remove it (refused if it has snapshots), then import.
        #[arg(long)]
        overwrite: bool,
        /// Chunks of up to 4 MiB moved at once.
        #[arg(long, value_name = "N", default_value_t = CHUNKS_IN_FLIGHT_DEFAULT, value_parser = chunks_in_flight)]
        chunks_in_flight: usize,
    },
    /// Copy an image or a snapshot into a file, or to stdout (-).
    ///
    /// Only the ranges the cluster holds data in are read (a snapshot is read whole). A
    /// regular file is written sparse: holes and all-zero 4 KiB blocks are skipped. Stdout
    /// and devices get every byte. Export a snapshot for a consistent copy of a live image.
    Export {
        /// The image or snapshot, POOL/IMAGE[@SNAP].
        #[arg(value_name = "POOL/IMAGE[@SNAP]", value_parser = parse_image_or_snap)]
        source: ImageOrSnap,
        /// The file to write, or - for stdout.
        #[arg(value_name = "FILE|-")]
        target: String,
        /// Replace an existing regular file.
        #[arg(long)]
        overwrite: bool,
        /// Chunks of up to 4 MiB moved at once.
        #[arg(long, value_name = "N", default_value_t = CHUNKS_IN_FLIGHT_DEFAULT, value_parser = chunks_in_flight)]
        chunks_in_flight: usize,
    },
    /// Copy an image or a snapshot into a new image of the same size.
    ///
    /// Reads only the ranges the source holds data in (a snapshot is read whole) and writes
    /// no all-zero 4 KiB block. While it runs the copy has a snapshot named cp-incomplete,
    /// removed at the end.
    Cp {
        /// The image or snapshot to copy, POOL/IMAGE[@SNAP].
        #[arg(value_name = "POOL/IMAGE[@SNAP]", value_parser = parse_image_or_snap)]
        source: ImageOrSnap,
        /// The new image, POOL/NAME (in any pool).
        #[arg(value_name = "POOL/NAME", value_parser = parse_image_spec)]
        target: ImageSpec,
        /// The copy's object size (default: the source's).
        #[arg(long, value_parser = size)]
        object_size: Option<u64>,
        /// Replace an existing image: remove it (refused if it has snapshots), then copy.
        #[arg(long)]
        overwrite: bool,
        /// Chunks of up to 4 MiB moved at once.
        #[arg(long, value_name = "N", default_value_t = CHUNKS_IN_FLIGHT_DEFAULT, value_parser = chunks_in_flight)]
        chunks_in_flight: usize,
    },
}

#[derive(Subcommand, Debug)]
enum SnapCmd {
    /// Take a snapshot: a crash-consistent point in time of the image.
    ///
    /// Every write acknowledged before the command returns is in it; no write issued after
    /// it returned is. Taking it copies no data. A clone's snapshot reads what the clone had
    /// not written yet from the clone's parent, as the clone did then.
    Create {
        /// The new snapshot, POOL/IMAGE@SNAP.
        #[arg(value_name = "POOL/IMAGE@SNAP", value_parser = parse_snap_spec)]
        spec: SnapSpec,
    },
    /// List an image's snapshots: id, name, size, state, protected, creation time.
    Ls {
        /// The image, POOL/NAME.
        #[arg(value_name = "POOL/NAME", value_parser = parse_image_spec)]
        spec: ImageSpec,
    },
    /// Remove a snapshot; the OSDs drop the data only it kept.
    ///
    /// Refused while it is protected, has clones, or is still being created.
    #[command(alias = "remove")]
    Rm {
        /// The snapshot, POOL/IMAGE@SNAP.
        #[arg(value_name = "POOL/IMAGE@SNAP", value_parser = parse_snap_spec)]
        spec: SnapSpec,
    },
    /// Roll the image back to the snapshot, size included. Stop every writer first.
    ///
    /// Makes the image's head equal to the snapshot: grows the image first if it is smaller
    /// than the snapshot, rolls every object back (a progress bar on stderr when it is a
    /// terminal), then shrinks the image to the snapshot's size if it was larger.
    ///
    /// Stop every writer of the image before (VMs, NBD clients, mapped devices): a write
    /// that lands during the rollback leaves the image a mix of both states. An interrupted
    /// rollback leaves the image partly rolled back; run it again to finish. A snapshot still
    /// being created cannot be rolled back to.
    Rollback {
        /// The snapshot, POOL/IMAGE@SNAP.
        #[arg(value_name = "POOL/IMAGE@SNAP", value_parser = parse_snap_spec)]
        spec: SnapSpec,
        /// Objects rolled back at once.
        #[arg(
            long,
            value_name = "N",
            default_value_t = OBJECTS_IN_FLIGHT_DEFAULT,
            value_parser = objects_in_flight
        )]
        objects_in_flight: usize,
    },
    /// Protect a snapshot: it can then be cloned, and cannot be removed.
    Protect {
        /// The snapshot, POOL/IMAGE@SNAP.
        #[arg(value_name = "POOL/IMAGE@SNAP", value_parser = parse_snap_spec)]
        spec: SnapSpec,
    },
    /// Unprotect a snapshot (refused while it has clones: flatten or remove them first).
    Unprotect {
        /// The snapshot, POOL/IMAGE@SNAP.
        #[arg(value_name = "POOL/IMAGE@SNAP", value_parser = parse_snap_spec)]
        spec: SnapSpec,
    },
}

/// Objects a rollback or flatten works on at once unless `--objects-in-flight` says otherwise.
const OBJECTS_IN_FLIGHT_DEFAULT: usize = 16;
/// The most `--objects-in-flight` accepts: each object may be several requests, and the
/// client caps requests in flight at its `inflight_ops_max` anyway.
const OBJECTS_IN_FLIGHT_MAX: usize = 1024;

fn objects_in_flight(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (1..=OBJECTS_IN_FLIGHT_MAX).contains(&n) => Ok(n),
        _ => Err(format!(
            "expected a number of objects from 1 to {OBJECTS_IN_FLIGHT_MAX}"
        )),
    }
}

/// Chunks an import, export or cp moves at once unless `--chunks-in-flight` says otherwise:
/// 8 chunks of 4 MiB keep 32 write requests of 1 MiB in flight, enough to hide the network
/// and replication round trips, in 32 MiB of buffers.
const CHUNKS_IN_FLIGHT_DEFAULT: usize = 8;
/// The most `--chunks-in-flight` accepts: each chunk is a buffer of up to 4 MiB.
const CHUNKS_IN_FLIGHT_MAX: usize = 64;

fn chunks_in_flight(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (1..=CHUNKS_IN_FLIGHT_MAX).contains(&n) => Ok(n),
        _ => Err(format!(
            "expected a number of chunks from 1 to {CHUNKS_IN_FLIGHT_MAX}"
        )),
    }
}

fn config_command(cmd: ConfigCmd) -> Command {
    use crate::daemon_config::AdminRequest;
    let (daemon, request) = match cmd {
        ConfigCmd::Show { daemon } => (daemon, AdminRequest::Show),
        ConfigCmd::Get { daemon, key } => (daemon, AdminRequest::Get { key }),
        ConfigCmd::Set { daemon, key, value } => (daemon, AdminRequest::Set { key, value }),
    };
    Command::Config {
        run_dir: daemon.run_dir,
        target: daemon.target,
        request,
    }
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
        // Local commands: their output takes the path of --help's (status 0, to stdout).
        Top::Completions { shell } => {
            return Err((0, crate::manual::completions(Cli::command(), shell)))
        }
        Top::Man { dir } => {
            return match crate::manual::man_pages(Cli::command(), &dir) {
                Ok(pages) => Err((
                    0,
                    format!("wrote {} man pages to {}\n", pages.len(), dir.display()),
                )),
                Err(e) => Err((
                    EXIT_FAILURE,
                    format!("error: writing man pages to {}: {e}", dir.display()),
                )),
            };
        }
        Top::Status => Command::Status,
        Top::Health { detail } => Command::Health { detail },
        Top::Df => Command::Df,
        Top::Osd(OsdCmd::SetNearfullRatio { ratio }) => Command::OsdSetRatio { full: false, ratio },
        Top::Osd(OsdCmd::SetFullRatio { ratio }) => Command::OsdSetRatio { full: true, ratio },
        Top::Osd(OsdCmd::Ls { detail }) => Command::OsdLs { detail },
        Top::Osd(OsdCmd::Out { id }) => Command::OsdOut(id),
        Top::Osd(OsdCmd::In { id }) => Command::OsdIn(id),
        Top::Osd(OsdCmd::Purge { id }) => Command::OsdPurge(id),
        Top::Osd(OsdCmd::ApplyId { uuid }) => Command::OsdApplyId(uuid),
        Top::Osd(OsdCmd::Pgs { pool }) => Command::OsdPgs {
            pool,
            pool_id: None,
        },
        Top::Osd(OsdCmd::Config { id }) => Command::OsdConfig(id),
        Top::Osd(OsdCmd::Ops { id }) => Command::OsdOps {
            id,
            historic: false,
        },
        Top::Osd(OsdCmd::HistoricOps { id }) => Command::OsdOps { id, historic: true },
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
        Top::Pg(PgCmd::Scrub { pgid }) => Command::PgScrub {
            pg: pgid,
            deep: false,
        },
        Top::Pg(PgCmd::DeepScrub { pgid } | PgCmd::Repair { pgid }) => Command::PgScrub {
            pg: pgid,
            deep: true,
        },
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
        Top::Image(ImageCmd::Snap(snap)) => snap_command(snap),
        Top::Image(ImageCmd::Clone { source, target }) => Command::ImageClone { source, target },
        Top::Image(ImageCmd::Flatten {
            spec,
            objects_in_flight,
        }) => Command::ImageFlatten {
            image: spec,
            objects_in_flight_max: objects_in_flight,
        },
        Top::Image(ImageCmd::Children { spec }) => Command::ImageChildren(spec),
        Top::Image(ImageCmd::Import {
            source,
            target,
            size,
            object_size,
            overwrite,
            chunks_in_flight,
        }) => Command::ImageImport(ImportArgs {
            source: DataPath::parse(&source),
            target,
            size_bytes: size,
            object_size_bytes: object_size,
            overwrite,
            chunks_in_flight_max: chunks_in_flight,
        }),
        Top::Image(ImageCmd::Export {
            source,
            target,
            overwrite,
            chunks_in_flight,
        }) => Command::ImageExport(ExportArgs {
            source,
            target: DataPath::parse(&target),
            overwrite,
            chunks_in_flight_max: chunks_in_flight,
        }),
        Top::Image(ImageCmd::Cp {
            source,
            target,
            object_size,
            overwrite,
            chunks_in_flight,
        }) => Command::ImageCp(CopyArgs {
            source,
            target,
            object_size_bytes: object_size,
            overwrite,
            chunks_in_flight_max: chunks_in_flight,
        }),
        Top::Set { flag } => Command::Flag { flag, set: true },
        Top::Unset { flag } => Command::Flag { flag, set: false },
        Top::Map { watch } => Command::Map { watch },
        Top::Reclaim => Command::ReclaimLs,
        Top::Mon(MonCmd::Backup { file }) => Command::MonBackup(file),
        Top::Config(cmd) => config_command(cmd),
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
        auth_floor: cli.auth_floor,
        name: cli.entity_name,
    })
}

fn snap_command(snap: SnapCmd) -> Command {
    match snap {
        SnapCmd::Create { spec } => Command::SnapCreate(spec),
        SnapCmd::Ls { spec } => Command::SnapLs(spec),
        SnapCmd::Rm { spec } => Command::SnapRm(spec),
        SnapCmd::Rollback {
            spec,
            objects_in_flight,
        } => Command::SnapRollback {
            snap: spec,
            objects_in_flight_max: objects_in_flight,
        },
        SnapCmd::Protect { spec } => Command::SnapProtect {
            snap: spec,
            protect: true,
        },
        SnapCmd::Unprotect { spec } => Command::SnapProtect {
            snap: spec,
            protect: false,
        },
    }
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
        // An unknown cluster flag is a usage error, not the monitor's refusal (status 4).
        for verb in ["set", "unset"] {
            let (code, text) = p(&[verb, "foo"]).unwrap_err();
            assert_eq!(code, EXIT_USAGE);
            assert!(text.contains("expected noout or norebalance"), "{text}");
        }
        assert!(matches!(
            p(&["set", "noRebalance"]).unwrap().command,
            Command::Flag { set: true, .. }
        ));
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

    fn snap(spec: &str) -> SnapSpec {
        parse_snap_spec(spec).unwrap()
    }

    fn image(spec: &str) -> ImageSpec {
        parse_image_spec(spec).unwrap()
    }

    #[test]
    fn parses_every_snapshot_command() {
        let cases: Vec<(Vec<&str>, Command)> = vec![
            (
                vec!["image", "snap", "create", "rbd/vm1@s1"],
                Command::SnapCreate(snap("rbd/vm1@s1")),
            ),
            (
                vec!["image", "snap", "ls", "rbd/vm1"],
                Command::SnapLs(image("rbd/vm1")),
            ),
            (
                vec!["image", "snap", "rm", "rbd/vm1@s1"],
                Command::SnapRm(snap("rbd/vm1@s1")),
            ),
            (
                vec!["image", "snap", "remove", "rbd/vm1@s1"],
                Command::SnapRm(snap("rbd/vm1@s1")),
            ),
            (
                vec!["image", "snap", "rollback", "rbd/vm1@s1"],
                Command::SnapRollback {
                    snap: snap("rbd/vm1@s1"),
                    objects_in_flight_max: OBJECTS_IN_FLIGHT_DEFAULT,
                },
            ),
            (
                vec![
                    "image",
                    "snap",
                    "rollback",
                    "rbd/vm1@s1",
                    "--objects-in-flight",
                    "4",
                ],
                Command::SnapRollback {
                    snap: snap("rbd/vm1@s1"),
                    objects_in_flight_max: 4,
                },
            ),
            (
                vec!["image", "snap", "protect", "rbd/vm1@s1"],
                Command::SnapProtect {
                    snap: snap("rbd/vm1@s1"),
                    protect: true,
                },
            ),
            (
                vec!["image", "snap", "unprotect", "rbd/vm1@s1"],
                Command::SnapProtect {
                    snap: snap("rbd/vm1@s1"),
                    protect: false,
                },
            ),
            (
                vec!["image", "clone", "rbd/vm1@s1", "other/kid"],
                Command::ImageClone {
                    source: snap("rbd/vm1@s1"),
                    target: image("other/kid"),
                },
            ),
            (
                vec!["image", "flatten", "other/kid"],
                Command::ImageFlatten {
                    image: image("other/kid"),
                    objects_in_flight_max: OBJECTS_IN_FLIGHT_DEFAULT,
                },
            ),
            (
                vec!["image", "flatten", "other/kid", "--objects-in-flight=1024"],
                Command::ImageFlatten {
                    image: image("other/kid"),
                    objects_in_flight_max: 1024,
                },
            ),
            (
                vec!["image", "children", "rbd/vm1@s1"],
                Command::ImageChildren(snap("rbd/vm1@s1")),
            ),
        ];
        for (args, want) in cases {
            let inv = p(&args).unwrap_or_else(|e| panic!("{args:?}: {e:?}"));
            assert_eq!(inv.command, want, "{args:?}");
            assert_eq!(inv.style, Style::Human, "{args:?}");
        }
        let spec = snap("rbd/vm1@s1");
        assert_eq!(
            (spec.pool.as_str(), spec.image.as_str(), spec.snap.as_str()),
            ("rbd", "vm1", "s1")
        );
        assert_eq!(spec.to_string(), "rbd/vm1@s1");
    }

    #[test]
    fn json_is_global_for_the_snapshot_commands() {
        for args in [
            vec!["--json", "image", "snap", "ls", "rbd/vm1"],
            vec!["image", "snap", "ls", "rbd/vm1", "--json"],
            vec!["image", "--json", "children", "rbd/vm1@s"],
            vec!["image", "snap", "create", "--json", "rbd/vm1@s"],
            vec!["image", "snap", "rollback", "rbd/vm1@s", "--json"],
            vec!["image", "flatten", "rbd/kid", "--json"],
        ] {
            assert_eq!(p(&args).unwrap().style, Style::Json, "{args:?}");
        }
    }

    /// Every malformed `POOL/IMAGE@SNAP` is a usage error (exit 2) whose message says what is
    /// wrong; nothing reaches the monitor.
    #[test]
    fn malformed_snapshot_names_are_usage_errors() {
        let cases = [
            ("rbd/vm1", "missing @SNAP"),
            ("vm1@s", "missing POOL/"),
            ("rbd/vm1@", "empty snapshot name"),
            ("rbd/@s", "empty image name"),
            ("/vm1@s", "empty pool name"),
            ("@", "missing POOL/"),
            ("/@", "empty pool name"),
            ("rbd/vm1/x@s", "more than one '/'"),
            ("rbd/vm1@s/x", "more than one '/'"),
            ("rbd/vm1@s@t", "more than one '@'"),
            ("rbd@s/vm1", "after the image name"),
        ];
        for (spec, why) in cases {
            for command in [
                vec!["image", "snap", "create", spec],
                vec!["image", "snap", "rm", spec],
                vec!["image", "snap", "rollback", spec],
                vec!["image", "snap", "protect", spec],
                vec!["image", "snap", "unprotect", spec],
                vec!["image", "clone", spec, "rbd/kid"],
                vec!["image", "children", spec],
            ] {
                let (code, message) = p(&command).unwrap_err();
                assert_eq!(code, EXIT_USAGE, "{command:?}");
                assert!(message.contains(why), "{command:?}: {message}");
                assert!(
                    message.contains("POOL/IMAGE@SNAP"),
                    "{command:?}: {message}"
                );
            }
        }
        let (code, message) = p(&["image", "snap", "create", ""]).unwrap_err();
        assert_eq!(code, EXIT_USAGE);
        assert!(message.contains("empty"), "{message}");
        // A missing argument is a usage error too.
        assert_eq!(p(&["image", "snap", "create"]).unwrap_err().0, EXIT_USAGE);
        assert_eq!(
            p(&["image", "clone", "rbd/vm1@s"]).unwrap_err().0,
            EXIT_USAGE
        );
    }

    /// Where an image is expected, a snapshot (or a malformed name) is a usage error.
    #[test]
    fn malformed_image_names_are_usage_errors() {
        for command in [
            vec!["image", "snap", "ls", "rbd/vm1@s"],
            vec!["image", "snap", "ls", "vm1"],
            vec!["image", "snap", "ls", "rbd/a/b"],
            vec!["image", "flatten", "rbd/kid@s"],
            vec!["image", "flatten", "/kid"],
            vec!["image", "clone", "rbd/vm1@s", "rbd/kid@t"],
            vec!["image", "clone", "rbd/vm1@s", "kid"],
        ] {
            let (code, message) = p(&command).unwrap_err();
            assert_eq!(code, EXIT_USAGE, "{command:?}");
            assert!(message.contains("POOL/"), "{command:?}: {message}");
        }
    }

    #[test]
    fn objects_in_flight_is_bounded() {
        for n in ["0", "1025", "-1", "many", ""] {
            let arg = format!("--objects-in-flight={n}");
            let (code, message) = p(&["image", "flatten", "rbd/kid", &arg]).unwrap_err();
            assert_eq!(code, EXIT_USAGE, "{n}");
            assert!(message.contains("from 1 to 1024"), "{n}: {message}");
        }
    }

    #[test]
    fn parses_import_export_and_cp() {
        let cases: Vec<(Vec<&str>, Command)> = vec![
            (
                vec!["image", "import", "disk.raw", "rbd/vm1"],
                Command::ImageImport(ImportArgs {
                    source: DataPath::File("disk.raw".into()),
                    target: image("rbd/vm1"),
                    size_bytes: None,
                    object_size_bytes: None,
                    overwrite: false,
                    chunks_in_flight_max: CHUNKS_IN_FLIGHT_DEFAULT,
                }),
            ),
            (
                vec![
                    "image",
                    "import",
                    "-",
                    "rbd/vm1",
                    "--size",
                    "10G",
                    "--object-size",
                    "1M",
                    "--overwrite",
                    "--chunks-in-flight",
                    "3",
                ],
                Command::ImageImport(ImportArgs {
                    source: DataPath::Stdio,
                    target: image("rbd/vm1"),
                    size_bytes: Some(10 << 30),
                    object_size_bytes: Some(1 << 20),
                    overwrite: true,
                    chunks_in_flight_max: 3,
                }),
            ),
            (
                vec!["image", "export", "rbd/vm1@s1", "-"],
                Command::ImageExport(ExportArgs {
                    source: ImageOrSnap {
                        image: image("rbd/vm1"),
                        snap: Some("s1".into()),
                    },
                    target: DataPath::Stdio,
                    overwrite: false,
                    chunks_in_flight_max: CHUNKS_IN_FLIGHT_DEFAULT,
                }),
            ),
            (
                vec!["image", "cp", "rbd/vm1", "ssd/vm2", "--overwrite"],
                Command::ImageCp(CopyArgs {
                    source: ImageOrSnap {
                        image: image("rbd/vm1"),
                        snap: None,
                    },
                    target: image("ssd/vm2"),
                    object_size_bytes: None,
                    overwrite: true,
                    chunks_in_flight_max: CHUNKS_IN_FLIGHT_DEFAULT,
                }),
            ),
        ];
        for (args, want) in cases {
            assert_eq!(p(&args).unwrap().command, want, "{args:?}");
        }
        // A snapshot cannot be a target; the in-flight count is bounded.
        for args in [
            vec!["image", "import", "disk.raw", "rbd/vm1@s1"],
            vec!["image", "cp", "rbd/vm1", "rbd/vm2@s"],
            vec!["image", "export", "rbd", "out.raw"],
            vec![
                "image",
                "export",
                "rbd/vm1",
                "out.raw",
                "--chunks-in-flight",
                "65",
            ],
            vec![
                "image",
                "export",
                "rbd/vm1",
                "out.raw",
                "--chunks-in-flight",
                "0",
            ],
        ] {
            assert_eq!(p(&args).unwrap_err().0, EXIT_USAGE, "{args:?}");
        }
    }

    #[test]
    fn parses_the_scrub_commands_and_refuses_a_bad_pgid() {
        let pg = "1.7".parse::<PgId>().unwrap();
        for (args, deep) in [
            (vec!["pg", "scrub", "1.7"], false),
            (vec!["pg", "deep-scrub", "1.7"], true),
            (vec!["pg", "repair", "1.7"], true),
        ] {
            let inv = p(&args).unwrap();
            assert_eq!(inv.command, Command::PgScrub { pg, deep }, "{args:?}");
        }
        assert_eq!(
            p(&["pg", "scrub", "1.7", "--json"]).unwrap().style,
            Style::Json
        );
        for bad in ["1", "x.1", "1.-1", "1.2.3", ""] {
            let (code, message) = p(&["pg", "scrub", bad]).unwrap_err();
            assert_eq!(code, EXIT_USAGE, "{bad:?}");
            assert!(message.contains("expected POOL.SEQ"), "{bad:?}: {message}");
        }
        assert_eq!(p(&["pg", "repair"]).unwrap_err().0, EXIT_USAGE);
        let (_, help) = p(&["pg", "repair", "--help"]).unwrap_err();
        assert!(help.contains("majority of replicas agrees"), "{help}");
    }

    /// The rollback's help says what it does to the size and that writers must be stopped.
    #[test]
    fn rollback_help_says_to_stop_writers() {
        let (code, help) = p(&["image", "snap", "rollback", "--help"]).unwrap_err();
        assert_eq!(code, 0);
        assert!(help.contains("Stop every writer"), "{help}");
        assert!(help.contains("run it again"), "{help}");
        assert!(help.contains("shrinks the image"), "{help}");
    }

    /// Every argument and subcommand of the modern syntax has a help text.
    #[test]
    fn every_argument_has_help() {
        use clap::CommandFactory;
        fn walk(cmd: &clap::Command, path: String, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if id != "help" && id != "version" && arg.get_help().is_none() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                if sub.get_about().is_none() {
                    missing.push(format!("{path} {} (command)", sub.get_name()));
                }
                walk(sub, format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "fastblock-client".into(), &mut missing);
        assert!(missing.is_empty(), "without help: {missing:#?}");
    }
}

//! Where every daemon flag's value comes from: the command line, then the environment, then the
//! daemon's TOML file, then the flag's default (docs/operations.md, "Configuration").
//!
//! One mechanism for all three daemons, built on the clap model the binaries already declare,
//! so that a new flag gets its file key, its environment variable and its line in the reference
//! without any code of its own:
//! - the file's values become the flags' defaults ([`file`]), checked with the flag's own value
//!   parser first so that a wrong value names its key and file;
//! - every flag that does not declare an environment variable gets `FASTBLOCK_<DAEMON>_<KEY>`
//!   (clap's `env`, which ranks below the command line and above defaults);
//! - clap's `value_source` then tells where each value came from ([`Setting`]).
//!
//! `--print-config-reference` prints the table docs/config.md carries ([`reference`]); a test
//! compares the two so the page cannot drift from the code.

pub mod file;
pub mod reference;

use clap::parser::ValueSource;
use clap::{ArgMatches, Command};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The flags every daemon has besides its own: the config file, the log filter and the
/// directory of the admin socket (`crate::admin_socket`). Flattened into each daemon's `Args`.
#[derive(clap::Args, Debug, Clone)]
pub struct DaemonArgs {
    /// TOML file of flag values, keyed by the long flag names with `_` for `-`
    /// [default: /etc/fastblock/<daemon>.toml, read only if it exists].
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Log filter in tracing's EnvFilter syntax (`info`, `warn,fastblock_osd=debug`); settable
    /// at runtime with `fastblock-client config set`.
    #[arg(long, global = true, default_value = "info", env = "RUST_LOG", value_parser = log_filter_arg)]
    pub log_level: String,
    /// Directory of this daemon's admin socket `<entity>.asok`, through which
    /// `fastblock-client config` on this host reads and changes its settings (created if
    /// missing; without it the daemon runs with no admin socket and says so).
    #[arg(
        long,
        global = true,
        default_value = "/run/fastblock",
        env = "FASTBLOCK_RUN_DIR"
    )]
    pub run_dir: PathBuf,
}

fn log_filter_arg(input: &str) -> Result<String, String> {
    crate::logging::parse_filter(input).map(|_| input.to_string())
}

/// The flag that prints the reference instead of starting (handled before clap parses, so that
/// required flags need not be given).
pub const PRINT_REFERENCE_FLAG: &str = "--print-config-reference";

/// The flag that writes the daemon's man page (section 1) into the directory after it instead
/// of starting, handled like [`PRINT_REFERENCE_FLAG`] (`fastblock-client man DIR` writes the
/// client's).
pub const WRITE_MAN_PAGES_FLAG: &str = "--write-man-pages";

/// One daemon: its short name and, for a binary with subcommands, the one that runs the daemon.
#[derive(Clone, Copy, Debug)]
pub struct Daemon {
    /// `mon`, `osd` or `nbd`.
    pub name: &'static str,
    /// `serve` for `fastblock-nbd`: its flags are the daemon's besides the global ones.
    pub subcommand: Option<&'static str>,
}

impl Daemon {
    pub fn env_var(&self, key: &str) -> String {
        format!(
            "FASTBLOCK_{}_{}",
            self.name.to_uppercase(),
            key.to_uppercase()
        )
    }

    pub fn default_file(&self) -> PathBuf {
        PathBuf::from(format!("/etc/fastblock/{}.toml", self.name))
    }
}

/// Where a setting's value came from, in rising precedence (`Runtime` last: set through the
/// admin socket after start).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Default,
    File,
    Env,
    Flag,
    Runtime,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Default => "default",
            Source::File => "file",
            Source::Env => "env",
            Source::Flag => "flag",
            Source::Runtime => "runtime",
        }
    }
}

/// One flag's effective value (its values joined by `,`; empty when unset) and its source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Setting {
    pub key: String,
    pub value: String,
    pub source: Source,
}

/// The parsed command line with the file and the environment folded in.
pub struct Loaded {
    pub matches: ArgMatches,
    pub settings: Vec<Setting>,
    /// The file read, if any.
    pub file: Option<PathBuf>,
}

impl Loaded {
    /// Logs the config file the settings came from (once logging is set up), so that an
    /// operator can tell which file a daemon read.
    pub fn log_file(&self) {
        if let Some(path) = &self.file {
            tracing::info!(file = %path.display(), "settings read from the config file");
        }
    }
}

/// Arguments that are not settings: clap's own and the file's name itself.
fn is_setting(arg: &clap::Arg) -> bool {
    let id = arg.get_id().as_str();
    !arg.is_positional() && !matches!(id, "help" | "version" | "config")
}

/// The commands whose flags are the daemon's settings: the binary's, then its daemon
/// subcommand's (global flags are listed once, with the binary's).
fn setting_commands<'a>(daemon: &Daemon, cmd: &'a Command) -> Vec<&'a Command> {
    let mut commands = vec![cmd];
    if let Some(sub) = daemon.subcommand.and_then(|name| cmd.find_subcommand(name)) {
        commands.push(sub);
    }
    commands
}

/// Every setting's key, in the order of the reference.
pub fn setting_keys(daemon: &Daemon, cmd: &Command) -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    for command in setting_commands(daemon, cmd) {
        for arg in command.get_arguments().filter(|a| is_setting(a)) {
            let key = arg.get_id().to_string();
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
    }
    keys
}

/// The config file named by `--config FILE` / `--config=FILE` on the command line, else by the
/// environment, else the default path if it exists.
fn config_path(daemon: &Daemon, argv: &[OsString]) -> Option<PathBuf> {
    let mut args = argv.iter().skip(1);
    while let Some(arg) = args.next() {
        let Some(text) = arg.to_str() else { continue };
        if text == "--" {
            break;
        }
        if text == "--config" {
            return args.next().map(PathBuf::from);
        }
        if let Some(path) = text.strip_prefix("--config=") {
            return Some(PathBuf::from(path));
        }
    }
    if let Some(path) = std::env::var_os(daemon.env_var("config")) {
        return Some(PathBuf::from(path));
    }
    let default = daemon.default_file();
    default.exists().then_some(default)
}

/// Gives every setting without its own environment variable `FASTBLOCK_<DAEMON>_<KEY>`.
fn with_env_vars(daemon: &Daemon, cmd: Command) -> Command {
    let add = |arg: clap::Arg| {
        if is_setting(&arg) && arg.get_env().is_none() {
            let var = daemon.env_var(arg.get_id().as_str());
            arg.env(var)
        } else {
            arg
        }
    };
    let mut cmd = cmd.mut_args(add);
    if let Some(sub) = daemon.subcommand {
        cmd = cmd.mut_subcommand(sub, |s| s.mut_args(add));
    }
    cmd
}

/// Parses `argv` with the file and environment folded in. A bad file or value is an error
/// (`Err`), as is what clap refuses (returned as its own error so that it prints and exits
/// as clap does: `--help` with status 0, usage errors with 2).
pub fn load(daemon: &Daemon, cmd: Command, argv: Vec<OsString>) -> Result<Loaded, LoadError> {
    // Before the file's values are applied, which moves their flags to the end of the list.
    let keys = setting_keys(daemon, &cmd);
    let (cmd, file) = match config_path(daemon, &argv) {
        Some(path) => {
            let values = file::read(&path)?;
            let cmd = file::apply(daemon, cmd, &path, &values)?;
            (cmd, Some((path, values)))
        }
        None => (cmd, None),
    };
    let cmd = with_env_vars(daemon, cmd);
    let matches = cmd.try_get_matches_from(argv)?;
    let file_keys: Vec<&str> = file
        .as_ref()
        .map(|(_, values)| values.iter().map(|(k, _)| k.as_str()).collect())
        .unwrap_or_default();
    let settings = settings_of(daemon, keys, &matches, &file_keys);
    Ok(Loaded {
        matches,
        settings,
        file: file.map(|(path, _)| path),
    })
}

fn settings_of(
    daemon: &Daemon,
    keys: Vec<String>,
    matches: &ArgMatches,
    file_keys: &[&str],
) -> Vec<Setting> {
    let sub_matches = daemon
        .subcommand
        .and_then(|name| matches.subcommand_matches(name));
    let mut settings = Vec::new();
    for key in keys {
        // A subcommand's matches hold its own flags and the global ones; a subcommand other
        // than the daemon's has none of the daemon's own flags to show.
        let Some(m) = [sub_matches, Some(matches)]
            .into_iter()
            .flatten()
            .find(|m| m.try_contains_id(&key).is_ok())
        else {
            continue;
        };
        let value = match m.try_get_raw(&key) {
            Ok(Some(raw)) => raw
                .map(|v| v.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(","),
            _ => String::new(),
        };
        let source = match m.value_source(&key) {
            Some(ValueSource::CommandLine) => Source::Flag,
            Some(ValueSource::EnvVariable) => Source::Env,
            _ if file_keys.contains(&key.as_str()) => Source::File,
            _ => Source::Default,
        };
        settings.push(Setting { key, value, source });
    }
    settings
}

/// Why a daemon did not start from its configuration.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    File(#[from] file::FileError),
    #[error(transparent)]
    Clap(#[from] clap::Error),
}

/// [`load`] for a daemon's `main`: prints the reference and exits for
/// `--print-config-reference`; prints a configuration error and exits with status 2 (usage),
/// clap's errors as clap does.
pub fn load_or_exit(daemon: &Daemon, cmd: Command) -> Loaded {
    let argv: Vec<OsString> = std::env::args_os().collect();
    if argv.iter().skip(1).any(|a| a == PRINT_REFERENCE_FLAG) {
        print!("{}", reference::render(daemon, &with_env_vars(daemon, cmd)));
        std::process::exit(0);
    }
    if let Some(at) = argv.iter().position(|a| a == WRITE_MAN_PAGES_FLAG) {
        let Some(dir) = argv.get(at + 1) else {
            eprintln!("error: {WRITE_MAN_PAGES_FLAG} needs a directory");
            std::process::exit(2);
        };
        match fastblock_cli::manual::man_pages(with_env_vars(daemon, cmd), Path::new(dir)) {
            Ok(written) => {
                for path in written {
                    println!("{}", path.display());
                }
                std::process::exit(0);
            }
            Err(e) => {
                eprintln!(
                    "error: writing man pages into {}: {e}",
                    Path::new(dir).display()
                );
                std::process::exit(1);
            }
        }
    }
    match load(daemon, cmd, argv) {
        Ok(loaded) => loaded,
        Err(LoadError::Clap(e)) => e.exit(),
        Err(LoadError::File(e)) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    }
}

/// The path of a daemon's admin socket: `<run_dir>/<entity>.asok`.
pub fn admin_socket_path(run_dir: &Path, entity: &str) -> PathBuf {
    run_dir.join(format!("{entity}.asok"))
}

//! A daemon's TOML config file: one `key = value` per flag, the key being the long flag name
//! with `_` for `-` (`flush_interval = "2s"`, `mon = ["10.0.0.1:3333", "10.0.0.2:3333"]`,
//! `lease_reads = false`). Strings, integers, floats, booleans and arrays of them; anything
//! else, and any key that is not a flag of the daemon, is refused naming the key and the file,
//! never ignored (a misspelt key would otherwise leave its default in force unnoticed).

use super::{is_setting, setting_commands, setting_keys, Daemon};
use clap::{ArgAction, Command};
use std::path::{Path, PathBuf};

/// The most a config file may hold: a file this large is not a config file.
pub const CONFIG_FILE_BYTES_MAX: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("config file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {}: larger than {CONFIG_FILE_BYTES_MAX} bytes", path.display())]
    TooLarge { path: PathBuf },
    #[error("config file {}: not a regular file", path.display())]
    NotAFile { path: PathBuf },
    #[error("config file {}: not valid TOML: {message}", path.display())]
    Syntax { path: PathBuf, message: String },
    #[error("config file {}: unknown key {key:?} (the keys are: {known})", path.display())]
    UnknownKey {
        path: PathBuf,
        key: String,
        known: String,
    },
    #[error("config file {}: key {key:?}: {why}", path.display())]
    BadValue {
        path: PathBuf,
        key: String,
        why: String,
    },
}

/// The file's keys and their values as text, in the file's order.
pub type FileValues = Vec<(String, Vec<String>)>;

/// Reads and parses the file; every value is turned into text, as it would be given as a flag.
pub fn read(path: &Path) -> Result<FileValues, FileError> {
    let read_error = |source| FileError::Read {
        path: path.to_path_buf(),
        source,
    };
    // A regular file only: a device or FIFO (`/dev/zero`, `/dev/stdin`) would never end or
    // block the start; its reported length says nothing either.
    let meta = std::fs::metadata(path).map_err(read_error)?;
    if !meta.is_file() {
        return Err(FileError::NotAFile {
            path: path.to_path_buf(),
        });
    }
    // Read at most one byte past the limit: the file may grow after `metadata`.
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| {
            use std::io::Read;
            f.take(CONFIG_FILE_BYTES_MAX + 1).read_to_string(&mut text)
        })
        .map_err(read_error)?;
    if meta.len() > CONFIG_FILE_BYTES_MAX || text.len() as u64 > CONFIG_FILE_BYTES_MAX {
        return Err(FileError::TooLarge {
            path: path.to_path_buf(),
        });
    }
    let doc = toml_edit::Document::parse(text).map_err(|e| FileError::Syntax {
        path: path.to_path_buf(),
        message: e.to_string().trim_end().replace('\n', " "),
    })?;
    let mut values = Vec::new();
    for (key, item) in doc.as_table().iter() {
        let bad = |why: String| FileError::BadValue {
            path: path.to_path_buf(),
            key: key.to_string(),
            why,
        };
        let texts = match item.as_value() {
            Some(toml_edit::Value::Array(array)) => array
                .iter()
                .map(scalar_text)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|t| {
                    bad(format!(
                        "an array of {t}s; expected strings, numbers or booleans"
                    ))
                })?,
            Some(value) => vec![scalar_text(value).map_err(|t| {
                bad(format!(
                    "a {t}; expected a string, a number, a boolean or an array of them"
                ))
            })?],
            None => {
                return Err(bad(format!(
                    "a {}; expected a string, a number, a boolean or an array of them",
                    item.type_name()
                )))
            }
        };
        values.push((key.to_string(), texts));
    }
    Ok(values)
}

/// A scalar's text, or the type name of what is not a scalar.
fn scalar_text(value: &toml_edit::Value) -> Result<String, &'static str> {
    match value {
        toml_edit::Value::String(s) => Ok(s.value().clone()),
        toml_edit::Value::Integer(i) => Ok(i.value().to_string()),
        toml_edit::Value::Float(f) => Ok(f.value().to_string()),
        toml_edit::Value::Boolean(b) => Ok(b.value().to_string()),
        other => Err(other.type_name()),
    }
}

/// Makes the file's values the defaults of their flags, after checking each with the flag's own
/// parser. A flag the file gives is no longer required on the command line.
pub fn apply(
    daemon: &Daemon,
    cmd: Command,
    path: &Path,
    values: &FileValues,
) -> Result<Command, FileError> {
    let known = setting_keys(daemon, &cmd);
    let mut cmd = cmd;
    for (key, texts) in values {
        if !known.contains(key) {
            return Err(FileError::UnknownKey {
                path: path.to_path_buf(),
                key: key.clone(),
                known: known.join(", "),
            });
        }
        let in_sub = setting_commands(daemon, &cmd)
            .iter()
            .position(|c| {
                c.get_arguments()
                    .any(|a| a.get_id() == key && is_setting(a))
            })
            .unwrap_or(0);
        let owner = setting_commands(daemon, &cmd)[in_sub].clone();
        let arg = owner
            .get_arguments()
            .find(|a| a.get_id() == key)
            .expect("a known key is an argument")
            .clone();
        check_value(&arg, texts).map_err(|why| FileError::BadValue {
            path: path.to_path_buf(),
            key: key.clone(),
            why,
        })?;
        let texts = texts.clone();
        let set = move |a: clap::Arg| a.default_values(texts).required(false);
        cmd = if in_sub == 0 {
            cmd.mut_arg(key, set)
        } else {
            let sub = daemon
                .subcommand
                .expect("a second command is the subcommand");
            cmd.mut_subcommand(sub, |s| s.mut_arg(key, set))
        };
    }
    Ok(cmd)
}

/// Runs `texts` through the flag's parser, as if given on the command line.
fn check_value(arg: &clap::Arg, texts: &[String]) -> Result<(), String> {
    let takes_no_value = matches!(
        arg.get_action(),
        ArgAction::SetTrue | ArgAction::SetFalse | ArgAction::Count
    );
    if takes_no_value {
        return match texts {
            [t] if t == "true" || t == "false" => Ok(()),
            _ => Err("expected true or false".to_string()),
        };
    }
    let multiple = arg
        .get_num_args()
        .map(|n| n.max_values() > 1)
        .unwrap_or(false)
        || matches!(arg.get_action(), ArgAction::Append);
    if texts.len() > 1 && !multiple {
        return Err("takes one value, not an array".to_string());
    }
    let long = arg.get_long().unwrap_or(arg.get_id().as_str()).to_string();
    let probe = Command::new("config-file")
        .no_binary_name(true)
        .arg(arg.clone().required(false).global(false));
    let argv: Vec<String> = texts.iter().map(|t| format!("--{long}={t}")).collect();
    probe.try_get_matches_from(argv).map(|_| ()).map_err(|e| {
        let rendered = e.render().to_string();
        let first = rendered.lines().next().unwrap_or_default();
        first.strip_prefix("error: ").unwrap_or(first).to_string()
    })
}

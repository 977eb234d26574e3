//! The table of a daemon's settings that docs/config.md carries: flag, file key, environment
//! variable, default and help, straight from the clap model (`--print-config-reference`).

use super::{is_setting, setting_commands, Daemon};
use clap::Command;

/// Markdown: a heading line, then one table row per setting. `cmd` is the daemon's command
/// with its environment variables added (`super::with_env_vars`), so that the table shows the
/// variables the daemon really reads.
pub fn render(daemon: &Daemon, cmd: &Command) -> String {
    let mut out = format!(
        "### fastblock-{}\n\nConfig file: `--config FILE`, else `${}`, else `{}` if it exists.\n\n",
        daemon.name,
        daemon.env_var("config"),
        daemon.default_file().display(),
    );
    out.push_str("| flag | file key | environment | default | meaning |\n");
    out.push_str("|---|---|---|---|---|\n");
    let mut seen: Vec<String> = Vec::new();
    for command in setting_commands(daemon, cmd) {
        for arg in command.get_arguments().filter(|a| is_setting(a)) {
            let key = arg.get_id().to_string();
            if seen.contains(&key) {
                continue;
            }
            seen.push(key.clone());
            let env = match arg.get_env() {
                Some(var) => format!("`{}`", var.to_string_lossy()),
                None => "(none)".to_string(),
            };
            let defaults: Vec<String> = arg
                .get_default_values()
                .iter()
                .map(|v| v.to_string_lossy().into_owned())
                .collect();
            // A switch's `false` is clap's implicit default, added only when the command is
            // built.
            let switch = matches!(arg.get_action(), clap::ArgAction::SetTrue);
            let default = if defaults.is_empty() && switch {
                "`false`".to_string()
            } else if defaults.is_empty() {
                "(none)".to_string()
            } else {
                format!("`{}`", defaults.join(","))
            };
            let help = arg
                .get_long_help()
                .or(arg.get_help())
                .map(|h| h.to_string())
                .unwrap_or_default();
            out.push_str(&format!(
                "| `--{}` | `{key}` | {env} | {default} | {} |\n",
                arg.get_long().unwrap_or(&key),
                cell(&help),
            ));
        }
    }
    out
}

/// One table cell: on one line, with `|` escaped.
fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

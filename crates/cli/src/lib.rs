//! `fastblock-client`, the admin CLI.
//!
//! Two syntaxes reach one [`command::Command`] model:
//! - [`modern`]: `fastblock-client pool create NAME --pg-count 32 --size 3` (clap), `--json` on
//!   every read command;
//! - [`legacy`]: the reference system's Go-style flags, `-op=createpool -poolname=P ...`, with
//!   its output shapes ([`render::legacy`]).
//!
//! [`auth`] loads the key the CLI signs with (`--keyring`, `--name`) and runs the `auth`
//! commands. [`capacity`] runs `health`, `df` and the full-ratio commands. [`daemon_config`] reads and sets a daemon's settings through its admin socket. [`exec`] runs a command against the monitor through `fastblock-monclient`; [`render`] turns
//! answers into text. [`pg`] runs `pg ls` and the scrub commands. [`ops`] runs `osd ops` and `osd historic-ops`. [`mon`] runs `mon backup`. [`snap`] runs the snapshot and clone commands; its rollback and flatten
//! also move data through the block client library (`fastblock-client`), as [`image_io`] does
//! for `image import`, `image export` and `image cp`. Every failure ends as one line on
//! stderr, `error: ...`, and an exit status that says which kind of failure it was ([`exit`]).

pub mod auth;
pub mod capacity;
pub mod command;
pub mod daemon_config;
pub mod exec;
pub mod exit;
pub mod image_io;
pub mod legacy;
pub mod manual;
pub mod modern;
pub mod mon;
pub mod ops;
pub mod pg;
pub mod render;
pub mod snap;

use std::io::Write;

pub use exit::{EXIT_FAILURE, EXIT_USAGE};

/// Runs the CLI on `argv` (without the program name), writing results to `out`. Returns the
/// process exit status; error messages go to `err`.
pub async fn run(argv: Vec<String>, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let parsed = if legacy::is_legacy(&argv) {
        legacy::parse(&argv).map_err(|e| (EXIT_USAGE, e))
    } else {
        modern::parse(&argv)
    };
    let invocation = match parsed {
        Ok(inv) => inv,
        Err((code, message)) => {
            if code == 0 {
                let _ = write!(out, "{message}");
                return 0;
            }
            // clap's messages carry the prefix already; ours (the reference syntax, specs
            // checked after parsing) get it here, so that every failure reads the same.
            let message = message.trim_end();
            let prefix = if message.starts_with("error: ") {
                ""
            } else {
                "error: "
            };
            let _ = writeln!(err, "{prefix}{message}");
            return code;
        }
    };
    match exec::execute(&invocation, out).await {
        Ok(()) => 0,
        Err(e) => {
            if !exit::already_reported(&e) {
                let _ = writeln!(err, "error: {e:#}");
            }
            exit::status_of(&e)
        }
    }
}

//! Moving data in and out: `image import FILE|- POOL/IMAGE`, `image export
//! POOL/IMAGE[@SNAP] FILE|-`, `image cp POOL/IMAGE[@SNAP] POOL/IMAGE` (`docs/cli.md`, "Moving
//! data in and out").
//!
//! All three stream: the image is walked in windows ([`plan::windows`]); within a window only
//! the ranges that hold data are moved (a file's SEEK_DATA/SEEK_HOLE, the cluster's allocated
//! ranges: `Image::allocated_ranges`, the `base:allocation` of the NBD server), cut into
//! chunks of up to 4 MiB ([`plan::chunks`]) of which `--chunks-in-flight` are in flight
//! ([`flight`]). All-zero 4 KiB blocks are not written either
//! (`fastblock_client::zeros::zero_runs`, the NBD server's hole test).
//!
//! Module map: [`plan`] (pure: windows, chunks, the import's size, the summary), [`input`]
//! (the file or stream an import reads), [`output`] (the sparse file or stream an export
//! writes), [`flight`] (bounded task sets), [`target`] (creating the new image of an import
//! or cp, with its `*-incomplete` marker snapshot), [`copy`] (the three loops).

mod copy;
mod flight;
mod input;
mod output;
pub mod plan;
mod target;

use crate::command::{Command, DataPath, Invocation, Style};
use anyhow::{anyhow, Result};
use fastblock_monclient::MonClient;
use indicatif::{ProgressBar, ProgressStyle};
use plan::Summary;
use std::io::{IsTerminal, Write};
use std::time::Instant;

/// Runs `image import`, `image export` or `image cp`.
pub async fn execute(inv: &Invocation, client: &MonClient, out: &mut dyn Write) -> Result<()> {
    let started = Instant::now();
    let (summary, to_stderr) = match &inv.command {
        Command::ImageImport(args) => (copy::import(inv, client, args, started).await?, false),
        Command::ImageExport(args) => (
            copy::export(inv, client, args, started).await?,
            args.target == DataPath::Stdio,
        ),
        Command::ImageCp(args) => (copy::cp(inv, client, args, started).await?, false),
        other => return Err(anyhow!("not an import, export or cp: {other:?}")),
    };
    // An export to stdout has its data there: the summary goes to stderr.
    let mut stderr = std::io::stderr();
    let sink: &mut dyn Write = if to_stderr { &mut stderr } else { out };
    match inv.style {
        Style::Json => writeln!(sink, "{}", serde_json::to_string_pretty(&summary)?)?,
        _ => writeln!(sink, "{}", summary.line())?,
    }
    Ok(())
}

/// A bar on stderr over the image's bytes, shown only when stderr is a terminal (never in
/// logs or in what a script captures).
fn progress_bar(what: String, total_bytes: u64) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let style = ProgressStyle::with_template(
        "{msg} [{bar:30}] {bytes}/{total_bytes} ({binary_bytes_per_sec}, {eta})",
    )
    .map(|s| s.progress_chars("=> "))
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    let bar = ProgressBar::new(total_bytes).with_style(style);
    bar.set_message(what);
    bar
}

fn summary(
    verb: &'static str,
    source: String,
    target: String,
    bytes: u64,
    data_bytes: u64,
    started: Instant,
) -> Summary {
    Summary::new(verb, source, target, bytes, data_bytes, started.elapsed())
}

//! `fastblock-scale`: the control-plane scale harness (`docs/scale.md`).

use clap::Parser;
use fastblock_scale::Options;

/// Measures the monitor at N simulated OSDs and M simulated clients: boot, a pool created, a
/// host down and out, an OSD added, an image removed, a snapshot, a rolling restart.
#[derive(Parser)]
#[command(name = "fastblock-scale", version)]
struct Cli {
    #[command(flatten)]
    options: Options,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    json_file: Option<std::path::PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<std::process::ExitCode> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new("error,fastblock_scale::scenarios=info")
            }),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    // A flag no run can use is a usage error, as clap's own are (status 2).
    if let Err(e) = cli.options.check() {
        eprintln!("fastblock-scale: {e}");
        return Ok(std::process::ExitCode::from(2));
    }
    // Ctrl-C drops the run: the simulated daemons stop and the monitor is killed by its PID.
    let report = tokio::select! {
        r = fastblock_scale::run(&cli.options) => r?,
        _ = tokio::signal::ctrl_c() => {
            eprintln!("fastblock-scale: interrupted; the monitor is stopped");
            return Ok(std::process::ExitCode::from(130));
        }
    };
    if let Some(path) = &cli.json_file {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
    }
    if cli.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.table());
    }
    let failures = report.failures();
    for f in &failures {
        eprintln!("fastblock-scale: {f}");
    }
    Ok(if failures.is_empty() {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    })
}

//! The daemons' logging: tracing to stderr through a filter that can be replaced while the
//! daemon runs (`fastblock-client config set <daemon> log_level ...`), so that turning on
//! debug output for one module never needs a restart.

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter, Registry};

/// Replaces the filter of the running daemon's logging.
#[derive(Clone)]
pub struct LogLevel {
    handle: reload::Handle<EnvFilter, Registry>,
}

/// Parses a filter (`info`, `warn,fastblock_osd=debug`), refusing what EnvFilter would ignore.
pub fn parse_filter(text: &str) -> Result<EnvFilter, String> {
    EnvFilter::builder()
        .with_regex(false)
        .parse(text)
        .map_err(|e| format!("{text:?} is not a log filter: {e}"))
}

impl LogLevel {
    /// Installs the global subscriber with `filter` (already checked by the flag's parser).
    pub fn init(filter: &str) -> LogLevel {
        let filter = parse_filter(filter).unwrap_or_else(|_| EnvFilter::new("info"));
        let (layer, handle) = reload::Layer::new(filter);
        tracing_subscriber::registry()
            .with(layer)
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
            )
            .init();
        LogLevel { handle }
    }

    /// Replaces the filter; returns it as set.
    pub fn set(&self, text: &str) -> Result<String, String> {
        let filter = parse_filter(text)?;
        self.handle
            .reload(filter)
            .map_err(|e| format!("replacing the log filter: {e}"))?;
        Ok(text.to_string())
    }
}

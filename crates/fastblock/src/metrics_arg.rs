//! `--metrics-addr ADDR:PORT|none`: the flag of the daemons that serve `/metrics` on a port of
//! their own (the OSD and the NBD server; the monitor serves it on its API address). Absent,
//! each daemon derives its default (`docs/metrics.md`).

use std::net::SocketAddr;

/// A given `--metrics-addr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricsArg {
    /// `none`: no metrics server.
    Off,
    At(SocketAddr),
}

/// Parses `none` or `ADDR:PORT` (clap's value parser).
pub fn parse_metrics_addr(s: &str) -> Result<MetricsArg, String> {
    if s == "none" {
        return Ok(MetricsArg::Off);
    }
    s.parse()
        .map(MetricsArg::At)
        .map_err(|_| format!("{s:?} is neither ADDR:PORT (e.g. 127.0.0.1:9100) nor none"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn none_address_or_a_clear_error() {
        assert_eq!(parse_metrics_addr("none"), Ok(MetricsArg::Off));
        assert_eq!(
            parse_metrics_addr("127.0.0.1:9100"),
            Ok(MetricsArg::At("127.0.0.1:9100".parse().unwrap()))
        );
        let err = parse_metrics_addr("9100").unwrap_err();
        assert!(err.contains("neither ADDR:PORT"), "{err}");
        assert!(parse_metrics_addr("off").is_err());
    }
}

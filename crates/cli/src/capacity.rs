//! `health [--detail]`, `df` and `osd set-nearfull-ratio|set-full-ratio`: the checks with
//! their codes, the space, and the thresholds (`docs/operations.md`, "Capacity and health").

use crate::command::{Command, Invocation, Style};
use crate::render::table;
use anyhow::{bail, Result};
use fastblock_monclient::MonClient;
use fastblock_types::api::{DfResponse, HealthResponse};
use fastblock_types::units::format_size;
use std::io::Write;

/// A ratio as given on the command line; the monitor validates it (`0 < nearfull < full <=
/// 1`), so that the rule lives in one place. Compared bit for bit, so commands stay `Eq`.
#[derive(Clone, Copy, Debug)]
pub struct Ratio(pub f64);

impl PartialEq for Ratio {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

impl Eq for Ratio {}

/// Parses a ratio argument (`0.85`); the range is checked by the monitor.
pub fn parse_ratio(s: &str) -> Result<Ratio, String> {
    s.parse::<f64>()
        .map(Ratio)
        .map_err(|_| format!("invalid ratio {s:?}: expected a number such as 0.85"))
}

pub async fn execute(inv: &Invocation, client: &MonClient, out: &mut dyn Write) -> Result<()> {
    match &inv.command {
        Command::Health { detail } => {
            let h = client.health().await?;
            match inv.style {
                Style::Json => writeln!(out, "{}", serde_json::to_string_pretty(&h)?)?,
                _ => write!(out, "{}", health_text(&h, *detail))?,
            }
        }
        Command::Df => {
            let d = client.df().await?;
            match inv.style {
                Style::Json => writeln!(out, "{}", serde_json::to_string_pretty(&d)?)?,
                _ => write!(out, "{}", df_text(&d))?,
            }
        }
        Command::OsdSetRatio { full, ratio } => {
            let set = client.set_space_ratio(*full, ratio.0).await?;
            match inv.style {
                Style::Json => writeln!(out, "{}", serde_json::to_string_pretty(&set)?)?,
                _ => writeln!(
                    out,
                    "nearfull ratio {}, full ratio {}",
                    ppm_ratio(set.nearfull_ratio_ppm),
                    ppm_ratio(set.full_ratio_ppm)
                )?,
            }
        }
        other => bail!("not a capacity command: {other:?}"),
    }
    Ok(())
}

fn ppm_ratio(ppm: u32) -> f64 {
    f64::from(ppm) / 1_000_000.0
}

/// `HEALTH_WARN`, then `CODE: summary` per check, with `detail` its lines indented.
pub fn health_text(h: &HealthResponse, detail: bool) -> String {
    let mut s = format!("{}\n", h.status);
    for c in &h.checks {
        s.push_str(&format!("{c}\n"));
        if detail {
            for line in &c.detail {
                s.push_str(&format!("    {line}\n"));
            }
        }
    }
    s
}

/// `part` of `whole` as a percentage with two decimals (`0.00` of nothing).
fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "0.00".into();
    }
    format!("{:.2}", part as f64 * 100.0 / whole as f64)
}

/// The raw space, then one row per pool, as `ceph df` lays them out.
pub fn df_text(d: &DfResponse) -> String {
    let raw = &d.raw;
    let mut s = String::from("RAW STORAGE:\n");
    s.push_str(&table(
        &["SIZE", "AVAIL", "USED", "%USED"],
        &[vec![
            format_size(raw.total_bytes),
            format_size(raw.avail_bytes),
            format_size(raw.used_bytes),
            percent(raw.used_bytes, raw.total_bytes),
        ]],
    ));
    if raw.osds_unreported > 0 {
        s.push_str(&format!(
            "({} osds up have not reported their space yet)\n",
            raw.osds_unreported
        ));
    }
    s.push_str("\nPOOLS:\n");
    let rows: Vec<Vec<String>> = d
        .pools
        .iter()
        .map(|p| {
            vec![
                p.name.clone(),
                p.pool.to_string(),
                p.size.to_string(),
                format_size(p.stored_bytes),
                p.objects.to_string(),
                format_size(p.used_bytes),
                percent(
                    p.used_bytes,
                    // A monitor's figure can be huge (an empty pool over large OSDs):
                    // never an overflow panic.
                    p.used_bytes
                        .saturating_add(p.max_avail_bytes.saturating_mul(u64::from(p.size))),
                ),
                format_size(p.max_avail_bytes),
            ]
        })
        .collect();
    s.push_str(&table(
        &[
            "POOL",
            "ID",
            "SIZE",
            "STORED",
            "OBJECTS",
            "USED",
            "%USED",
            "MAX AVAIL",
        ],
        &rows,
    ));
    s.push_str(&format!(
        "\nnearfull ratio {}, full ratio {}\n",
        ppm_ratio(d.nearfull_ratio_ppm),
        ppm_ratio(d.full_ratio_ppm)
    ));
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use fastblock_types::api::{HealthCheck, PoolDf, RawSpace, Severity};
    use fastblock_types::{Epoch, PoolId};

    #[test]
    fn health_prints_codes_and_details_only_when_asked() {
        let h = HealthResponse {
            status: "HEALTH_WARN".into(),
            checks: vec![HealthCheck {
                code: "OSD_NEARFULL".into(),
                severity: Severity::Warn,
                summary: "1 nearfull osd".into(),
                detail: vec!["osd.2 is 87.0% full (nearfull ratio 85.0%)".into()],
            }],
            epoch: Epoch(4),
        };
        assert_eq!(
            health_text(&h, false),
            "HEALTH_WARN\nOSD_NEARFULL: 1 nearfull osd\n"
        );
        assert_eq!(
            health_text(&h, true),
            "HEALTH_WARN\nOSD_NEARFULL: 1 nearfull osd\n    osd.2 is 87.0% full (nearfull ratio 85.0%)\n"
        );
    }

    #[test]
    fn df_shows_raw_and_pool_rows() {
        let d = DfResponse {
            raw: RawSpace {
                total_bytes: 3 << 30,
                used_bytes: 3 << 20,
                avail_bytes: (3 << 30) - (3 << 20),
                osds_unreported: 0,
            },
            pools: vec![PoolDf {
                pool: PoolId(1),
                name: "rbd".into(),
                size: 3,
                objects: 1,
                stored_bytes: 1 << 20,
                used_bytes: 3 << 20,
                max_avail_bytes: 1 << 30,
                pgs_unreported: 0,
            }],
            nearfull_ratio_ppm: 850_000,
            full_ratio_ppm: 950_000,
        };
        let text = df_text(&d);
        assert!(text.contains("RAW STORAGE:"), "{text}");
        assert!(text.contains("MAX AVAIL"), "{text}");
        let row = text.lines().find(|l| l.starts_with("rbd")).expect(&text);
        assert!(
            row.contains("1 MiB") && row.contains("3 MiB") && row.contains("1 GiB"),
            "{row}"
        );
        assert!(
            text.ends_with("nearfull ratio 0.85, full ratio 0.95\n"),
            "{text}"
        );
        // Figures past what u64 can multiply print, not panic.
        let mut huge = d.clone();
        huge.pools[0].max_avail_bytes = u64::MAX / 2;
        assert!(df_text(&huge).contains("rbd"));
        assert_eq!(parse_ratio("0.9"), Ok(Ratio(0.9)));
        assert!(parse_ratio("ninety").is_err());
    }
}

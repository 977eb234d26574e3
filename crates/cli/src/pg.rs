//! Placement groups: `pg ls` (state, members, scrubs) and `pg scrub|deep-scrub|repair`
//! (`docs/cli.md`, "Scrubs").

use crate::command::{Command, Invocation, Style};
use crate::render::{format_unix_ms_rfc3339, members, table};
use anyhow::Result;
use fastblock_monclient::MonClient;
use fastblock_types::api::{PgRow, PgScrubReport};
use fastblock_types::Epoch;
use serde::{Deserialize, Serialize};
use std::io::Write;

/// `GET /v1/pgs` as this CLI reads it: `PgList` with the scrub state the monitor adds to each
/// row (the monitor's `PgListView`; not in `fastblock_types::api`, which holds the scrub
/// contract with the OSDs as it is). Printed as it is by `pg ls --json`.
#[derive(Debug, Serialize, Deserialize)]
struct PgLsList {
    epoch: Epoch,
    pgs: Vec<PgLsRow>,
}

#[derive(Debug, Serialize, Deserialize)]
struct PgLsRow {
    #[serde(flatten)]
    row: PgRow,
    /// Absent from monitors that predate scrub.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    scrub: Option<PgScrubView>,
}

/// What the leader monitor knows of a PG's scrubs (`docs/mon-api.md`, "Scrubs").
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
struct PgScrubView {
    /// The last report of a leader that had scrubbed the PG.
    #[serde(default)]
    report: Option<PgScrubReport>,
    /// When the monitor saw a scrub (light or deep), and a deep one, finish: Unix ms.
    #[serde(default)]
    last_scrub_unix_ms: Option<u64>,
    #[serde(default)]
    last_deep_scrub_unix_ms: Option<u64>,
    /// Blocks the last scrub found inconsistent and did not repair.
    #[serde(default)]
    inconsistent_blocks_left: Option<u64>,
}

fn json(out: &mut dyn Write, value: &impl Serialize) -> Result<()> {
    writeln!(out, "{}", serde_json::to_string_pretty(value)?)?;
    Ok(())
}

/// Runs a `pg` command.
pub async fn execute(inv: &Invocation, client: &MonClient, out: &mut dyn Write) -> Result<()> {
    match &inv.command {
        Command::PgLs { pool } => ls(client, inv.style, pool.as_deref(), out).await,
        Command::PgScrub { pg, deep } => {
            let request = client.scrub_pg(*pg, *deep).await?;
            match inv.style {
                Style::Json => json(out, &request)?,
                _ => writeln!(
                    out,
                    "{} of pg {} requested (request {}): its leader scrubs it and repairs \
                     what a majority of replicas agrees on; `pg ls` shows when it finished",
                    if request.deep { "deep scrub" } else { "scrub" },
                    request.pg,
                    request.id
                )?,
            }
            Ok(())
        }
        other => unreachable!("not a pg command: {other:?}"),
    }
}

async fn ls(
    client: &MonClient,
    style: Style,
    pool: Option<&str>,
    out: &mut dyn Write,
) -> Result<()> {
    let list: PgLsList = client.pgs_as(pool).await?;
    match style {
        Style::Json => json(out, &list)?,
        Style::Legacy => {
            let rows: Vec<Vec<String>> = list
                .pgs
                .iter()
                .map(|r| {
                    let r = &r.row;
                    let newcore = if r.info.newosdlist.is_empty() {
                        String::new()
                    } else {
                        "0".into()
                    };
                    vec![
                        r.pgid.to_string(),
                        r.state_name.clone(),
                        "0".into(),
                        members(&r.info.osdlist),
                        newcore,
                        members(&r.info.newosdlist),
                    ]
                })
                .collect();
            write!(
                out,
                "{}",
                table(
                    &["PGID", "STATE", "CORE", "OSDLIST", "NEWCORE", "NEWOSDLIST"],
                    &rows
                )
            )?;
        }
        Style::Human => {
            let rows: Vec<Vec<String>> = list.pgs.iter().map(human_row).collect();
            write!(
                out,
                "{}",
                table(
                    &[
                        "PG",
                        "STATE",
                        "OSDS",
                        "TARGET",
                        "LEADER",
                        "VERSION",
                        "LAST-SCRUB",
                        "LAST-DEEP-SCRUB",
                        "INCONSISTENT"
                    ],
                    &rows
                )
            )?;
        }
    }
    Ok(())
}

fn human_row(r: &PgLsRow) -> Vec<String> {
    let scrub = r.scrub.unwrap_or_default();
    let info = &r.row.info;
    let target = if info.newosdlist.is_empty() {
        "-".to_string()
    } else {
        members(&info.newosdlist)
    };
    let time = |ms: Option<u64>| ms.map_or("-".to_string(), format_unix_ms_rfc3339);
    vec![
        r.row.pgid.to_string(),
        r.row.state_name.clone(),
        members(&info.osdlist),
        target,
        info.leader.map_or("-".to_string(), |l| l.to_string()),
        info.version.to_string(),
        time(scrub.last_scrub_unix_ms),
        time(scrub.last_deep_scrub_unix_ms),
        scrub
            .inconsistent_blocks_left
            .map_or("-".to_string(), |n| n.to_string()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row as the monitor sends it decodes with its scrub state, and one from a monitor
    /// that predates scrub decodes without; the table shows `-` for what is unknown.
    #[test]
    fn rows_decode_with_and_without_scrub_state() {
        let base = r#""pgid":{"pool":1,"seq":3},"state_name":"active","version":4,"state":2,
            "osdlist":[1,2,3],"newosdlist":[],"leader":2,"leader_term":1,"conf_index":0"#;
        let with = format!(
            r#"{{{base},"scrub":{{"report":{{"scrubs":2,"deep_scrubs":1,"request_done":5,
            "inconsistent_blocks":3,"repaired_blocks":1,"last_deep":true,"running":false}},
            "last_scrub_unix_ms":1764092718000,"last_deep_scrub_unix_ms":null,
            "inconsistent_blocks_left":2}}}}"#
        );
        let row: PgLsRow = serde_json::from_str(&with).unwrap();
        let cells = human_row(&row);
        assert_eq!(cells[0], "1.3");
        assert_eq!(cells[4], "2");
        assert_eq!(cells[6], "2025-11-25T17:45:18Z");
        assert_eq!(cells[7], "-");
        assert_eq!(cells[8], "2");
        let out = serde_json::to_value(&row).unwrap();
        assert_eq!(out["scrub"]["report"]["request_done"], 5);
        assert_eq!(out["osdlist"], serde_json::json!([1, 2, 3]));

        let old: PgLsRow = serde_json::from_str(&format!("{{{base}}}")).unwrap();
        assert!(old.scrub.is_none());
        assert_eq!(&human_row(&old)[6..], ["-", "-", "-"]);
    }
}

//! `osd ops ID` and `osd historic-ops ID`: an OSD's op tracker, as of its last heartbeat to
//! the monitor (`docs/operations.md`, "Slow ops"; the monitor serves it to `admin` callers
//! only, `GET /v1/osds/{id}/ops`).

use crate::command::{Command, Invocation, Style};
use crate::render::table;
use anyhow::{bail, Result};
use fastblock_monclient::MonClient;
use fastblock_types::api::{OsdOpsResponse, TrackedOp};
use std::io::Write;

pub async fn execute(inv: &Invocation, client: &MonClient, out: &mut dyn Write) -> Result<()> {
    let Command::OsdOps { id, historic } = &inv.command else {
        bail!("not an op tracker command: {:?}", inv.command);
    };
    let r = client.osd_ops(*id).await?;
    match (inv.style, historic) {
        (Style::Json, false) => json(out, &in_flight_json(&r))?,
        (Style::Json, true) => json(out, &historic_json(&r))?,
        (_, false) => write!(out, "{}", in_flight_text(&r))?,
        (_, true) => write!(out, "{}", historic_text(&r))?,
    }
    Ok(())
}

fn json(out: &mut dyn Write, value: &serde_json::Value) -> Result<()> {
    writeln!(out, "{}", serde_json::to_string_pretty(value)?)?;
    Ok(())
}

fn in_flight_json(r: &OsdOpsResponse) -> serde_json::Value {
    serde_json::json!({
        "osd": r.osd,
        "report_age_ms": r.report_age_ms,
        "complaint_time_ms": r.ops.complaint_time_ms,
        "in_flight": r.ops.in_flight,
        "slow": r.ops.slow,
        "ops": r.ops.oldest,
    })
}

fn historic_json(r: &OsdOpsResponse) -> serde_json::Value {
    serde_json::json!({
        "osd": r.osd,
        "report_age_ms": r.report_age_ms,
        "ops": r.ops.slowest,
    })
}

/// Microseconds as the unit that reads best: `850us`, `12.3ms`, `3.512s`.
fn duration(us: u64) -> String {
    match us {
        0..=999 => format!("{us}us"),
        1_000..=999_999 => format!("{:.1}ms", us as f64 / 1e3),
        _ => format!("{:.3}s", us as f64 / 1e6),
    }
}

fn rows(ops: &[TrackedOp]) -> Vec<Vec<String>> {
    ops.iter()
        .map(|op| {
            let stages: Vec<String> = op
                .stages
                .iter()
                .map(|s| format!("{} {}", s.stage, duration(s.us)))
                .collect();
            vec![
                duration(op.duration_us),
                op.stage.clone(),
                op.kind.clone(),
                op.pg.to_string(),
                op.shard.to_string(),
                op.request_id.to_string(),
                stages.join(", "),
            ]
        })
        .collect()
}

fn in_flight_text(r: &OsdOpsResponse) -> String {
    let o = &r.ops;
    let mut s = format!(
        "osd.{}: {} in flight, {} slow (in flight {}s or longer), as of {} ago\n",
        r.osd,
        o.in_flight,
        o.slow,
        o.complaint_time_ms as f64 / 1000.0,
        duration(r.report_age_ms * 1000)
    );
    if !o.oldest.is_empty() {
        let header = ["AGE", "STAGE", "KIND", "PG", "SHARD", "REQUEST", "STAGES"];
        s.push_str(&table(&header, &rows(&o.oldest)));
    }
    s
}

fn historic_text(r: &OsdOpsResponse) -> String {
    let o = &r.ops;
    let mut s = format!(
        "osd.{}: the {} slowest ops of the last 10 minutes, as of {} ago\n",
        r.osd,
        o.slowest.len(),
        duration(r.report_age_ms * 1000)
    );
    if !o.slowest.is_empty() {
        let header = [
            "DURATION", "SLOWEST", "KIND", "PG", "SHARD", "REQUEST", "STAGES",
        ];
        s.push_str(&table(&header, &rows(&o.slowest)));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use fastblock_types::api::{OpStage, OsdOps};
    use fastblock_types::{OsdId, PgId, PoolId};

    #[test]
    fn in_flight_ops_show_their_age_stage_and_stages() {
        let op = TrackedOp {
            shard: 1,
            pg: PgId::new(PoolId(2), 7),
            kind: "write".into(),
            request_id: 42,
            duration_us: 3_512_000,
            stage: "wal_commit".into(),
            stages: vec![
                OpStage {
                    stage: "queue".into(),
                    us: 12,
                },
                OpStage {
                    stage: "wal_commit".into(),
                    us: 3_511_988,
                },
            ],
        };
        let r = OsdOpsResponse {
            osd: OsdId(3),
            report_age_ms: 400,
            ops: OsdOps {
                complaint_time_ms: 1_000,
                in_flight: 4,
                slow: 1,
                oldest: vec![op],
                slowest: Vec::new(),
            },
        };
        let text = in_flight_text(&r);
        assert!(text.starts_with(
            "osd.3: 4 in flight, 1 slow (in flight 1s or longer), as of 400.0ms ago\n"
        ));
        assert!(text.contains("3.512s"), "{text}");
        assert!(text.contains("queue 12us, wal_commit 3.512s"), "{text}");
        assert!(historic_text(&r).starts_with("osd.3: the 0 slowest ops"));
        assert_eq!(in_flight_json(&r)["ops"][0]["stage"], "wal_commit");
    }
}

//! The health summary and the counts `status` prints.
//!
//! A check is one line; checks about damage or failures start with a stable code
//! (`POOL_PGMAP_MISSING: ...`, `MON_TASK_FAILED: ...`) that tools can match on.

use crate::state::MonState;
use fastblock_types::api::BackfillTooFull;
use fastblock_types::units::format_size;
use std::collections::BTreeMap;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Health {
    /// `HEALTH_OK`, `HEALTH_WARN` or `HEALTH_ERR`.
    pub status: &'static str,
    pub checks: Vec<String>,
}

/// A check the state does not show, raised by the daemon that runs the monitor (a failed
/// background task).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DaemonCheck {
    /// Makes the status `HEALTH_ERR` (else `HEALTH_WARN`).
    pub err: bool,
    pub text: String,
}

fn plural(n: usize, word: &str) -> String {
    if n == 1 {
        format!("1 {word}")
    } else {
        format!("{n} {word}s")
    }
}

/// PG count per state name.
pub fn pg_state_counts(state: &MonState) -> BTreeMap<String, u32> {
    let mut counts = BTreeMap::new();
    for pgmap in state.map.pgmaps.values() {
        for pg in pgmap.pgs.values() {
            *counts.entry(pg.state.name()).or_insert(0) += 1;
        }
    }
    counts
}

/// ERR when some PG cannot serve IO (down) or a pool is damaged (`crate::damage`); WARN when
/// something is degraded, moving, or a flag suppresses automatic repair; OK otherwise. The
/// daemon's own checks come first, then damage, then the rest.
pub fn health(state: &MonState, daemon: &[DaemonCheck]) -> Health {
    let mut checks: Vec<String> = daemon.iter().map(|c| c.text.clone()).collect();
    let mut err = daemon.iter().any(|c| c.err);
    for (pool, damage) in state.damaged_pools() {
        err = true;
        checks.push(state.describe_damage(pool, &damage));
    }
    let down_osds = state
        .map
        .osds
        .values()
        .filter(|o| !o.up && o.is_in && !o.pending_create)
        .count();
    if down_osds > 0 {
        checks.push(format!("{} down", plural(down_osds, "osd")));
    }
    let mut by_bit = [0usize; 5];
    for pgmap in state.map.pgmaps.values() {
        for pg in pgmap.pgs.values() {
            for (i, bit) in [1u64, 2, 4, 8, 16].iter().enumerate() {
                if pg.state.0 & bit != 0 {
                    by_bit[i] += 1;
                }
            }
        }
    }
    let [creating, _active, undersize, down, remapped] = by_bit;
    if down > 0 {
        err = true;
        checks.push(format!(
            "{} down (no majority of replicas up)",
            plural(down, "pg")
        ));
    }
    if undersize > 0 {
        checks.push(format!("{} undersize", plural(undersize, "pg")));
    }
    if remapped > 0 {
        checks.push(format!("{} remapped", plural(remapped, "pg")));
    }
    if creating > 0 {
        checks.push(format!("{} creating", plural(creating, "pg")));
    }
    if state.map.flags.noout {
        checks.push("noout flag set".to_string());
    }
    if state.map.flags.norebalance {
        checks.push("norebalance flag set".to_string());
    }
    let status = if err {
        "HEALTH_ERR"
    } else if checks.is_empty() {
        "HEALTH_OK"
    } else {
        "HEALTH_WARN"
    };
    Health { status, checks }
}

impl Health {
    /// Adds `PG_BACKFILL_TOOFULL`, one detail per refused copy (from the PG leaders'
    /// heartbeats): the PG stays degraded or remapped until room is made on the target.
    pub fn add_backfill_too_full(&mut self, refused: &[BackfillTooFull]) {
        if refused.is_empty() {
            return;
        }
        let pgs: std::collections::BTreeSet<_> = refused.iter().map(|r| r.pg).collect();
        let mut check = format!(
            "PG_BACKFILL_TOOFULL: {} waiting for room on the target:",
            plural(pgs.len(), "pg")
        );
        for r in refused {
            check.push_str(&format!(
                " pg {} cannot copy {} to osd.{} ({} free there);",
                r.pg,
                format_size(r.needed_bytes),
                r.osd,
                format_size(r.free_bytes)
            ));
        }
        check.pop();
        self.checks.push(check);
        if self.status == "HEALTH_OK" {
            self.status = "HEALTH_WARN";
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fastblock_types::{OsdId, PgId, PoolId};

    #[test]
    fn a_refused_backfill_warns_naming_the_pg_the_osd_and_the_sizes() {
        let mut h = health(&MonState::default(), &[]);
        assert_eq!(h.status, "HEALTH_OK");
        h.add_backfill_too_full(&[]);
        assert_eq!((h.status, h.checks.len()), ("HEALTH_OK", 0));
        let refused = |seq, osd| BackfillTooFull {
            pg: PgId {
                pool: PoolId(1),
                seq,
            },
            osd: OsdId(osd),
            needed_bytes: 3 << 20,
            free_bytes: 1 << 20,
        };
        h.add_backfill_too_full(&[refused(2, 4), refused(5, 4)]);
        assert_eq!(h.status, "HEALTH_WARN");
        let check = &h.checks[0];
        assert!(check.starts_with("PG_BACKFILL_TOOFULL: 2 pgs"), "{check}");
        assert!(
            check.contains("pg 1.2 cannot copy 3 MiB to osd.4 (1 MiB free there)"),
            "{check}"
        );
        assert!(check.contains("pg 1.5"), "{check}");
    }
}

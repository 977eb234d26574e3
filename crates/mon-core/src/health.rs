//! The health summary and the counts `status` prints.
//!
//! A check is one line; checks about damage or failures start with a stable code
//! (`POOL_PGMAP_MISSING: ...`, `MON_TASK_FAILED: ...`) that tools can match on.

use crate::state::MonState;
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

//! The health summary and the counts `status` prints.
//!
//! A check is one line; checks about damage or failures start with a stable code
//! (`POOL_PGMAP_MISSING: ...`, `MON_TASK_FAILED: ...`) that tools can match on.

use crate::state::MonState;
use fastblock_types::api::BackfillTooFull;
use fastblock_types::units::format_size;
use fastblock_types::PgId;
use std::collections::BTreeMap;

/// The most PGs `PG_INCONSISTENT` names; the rest are counted (one health line stays short
/// when a whole pool is affected).
pub const INCONSISTENT_PGS_NAMED_MAX: usize = 16;

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

    /// Adds `PG_INCONSISTENT` for the PGs whose last scrub left blocks its replicas disagree
    /// on and could not repair (no majority agreed, or the repair failed), with the blocks
    /// left per PG (`crate::scrub_ops::ScrubStats::inconsistent`). ERR, as Ceph's
    /// `PG_DAMAGED`: a read of such a block may return data that no majority vouches for, and
    /// only an operator can decide which copy is right.
    pub fn add_pg_inconsistent(&mut self, left: &[(PgId, u64)]) {
        if left.is_empty() {
            return;
        }
        let blocks = |n: u64| {
            if n == 1 {
                "1 block".to_string()
            } else {
                format!("{n} blocks")
            }
        };
        let named: Vec<String> = left
            .iter()
            .take(INCONSISTENT_PGS_NAMED_MAX)
            .map(|(pg, n)| format!("pg {pg} ({} left)", blocks(*n)))
            .collect();
        let mut check = format!(
            "PG_INCONSISTENT: {} with blocks scrub found inconsistent and could not repair: {}",
            plural(left.len(), "pg"),
            named.join(", ")
        );
        if left.len() > named.len() {
            check.push_str(&format!(" and {} more", left.len() - named.len()));
        }
        self.checks.push(check);
        self.status = "HEALTH_ERR";
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

    #[test]
    fn inconsistent_pgs_are_an_error_naming_at_most_a_bounded_number() {
        let mut h = health(&MonState::default(), &[]);
        h.add_pg_inconsistent(&[]);
        assert_eq!((h.status, h.checks.len()), ("HEALTH_OK", 0));
        let pg = |seq| PgId::new(PoolId(2), seq);
        h.add_pg_inconsistent(&[(pg(1), 1), (pg(7), 12)]);
        assert_eq!(h.status, "HEALTH_ERR");
        assert_eq!(
            h.checks[0],
            "PG_INCONSISTENT: 2 pgs with blocks scrub found inconsistent and could not \
             repair: pg 2.1 (1 block left), pg 2.7 (12 blocks left)"
        );
        let many: Vec<(PgId, u64)> = (0..20).map(|seq| (pg(seq), 1)).collect();
        let mut h = health(&MonState::default(), &[]);
        h.add_pg_inconsistent(&many);
        let check = &h.checks[0];
        assert!(check.starts_with("PG_INCONSISTENT: 20 pgs"), "{check}");
        assert!(
            check.contains("pg 2.15 (1 block left) and 4 more"),
            "{check}"
        );
        assert!(!check.contains("pg 2.16"), "{check}");
    }
}

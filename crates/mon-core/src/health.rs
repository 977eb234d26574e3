//! The health summary and the counts `status` prints.
//!
//! Every check is a [`HealthCheck`]: a stable code tools match on (`OSD_DOWN`, `PG_DOWN`,
//! `OSD_FULL`, ...), a severity, a one-line summary and detail lines naming what is affected
//! (at most [`DETAIL_LINES_MAX`], then `and N more`). The codes, their severities and when they
//! are raised are listed in `docs/mon-api.md`, "Health checks". The checks the state shows are
//! built by [`health`]; the daemon adds those it keeps outside the state (the PG leaders' last
//! reports, the OSDs' space) with the `add_*` methods, so that every check is built here.

use crate::capacity::{classify, used_ppm, SpaceLevel};
use crate::state::MonState;
use fastblock_types::api::{BackfillTooFull, HealthCheck, OsdOps, OsdSpace, Severity};
use fastblock_types::map::ClusterMap;
use fastblock_types::pg_state::PgState;
use fastblock_types::units::format_size;
use fastblock_types::{OsdId, PgId};
use std::collections::{BTreeMap, BTreeSet};

/// The most PGs `PG_INCONSISTENT` names in its summary; the rest are counted (one health line
/// stays short when a whole pool is affected).
pub const INCONSISTENT_PGS_NAMED_MAX: usize = 16;

/// The most detail lines one check carries; the rest are counted in a last line, so a check
/// about a whole cluster stays readable and its answer bounded.
pub const DETAIL_LINES_MAX: usize = 50;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Health {
    /// `HEALTH_OK`, `HEALTH_WARN` or `HEALTH_ERR`: the worst severity among the checks.
    pub status: &'static str,
    pub checks: Vec<HealthCheck>,
}

/// A check the state does not show, raised by the daemon that runs the monitor (a failed
/// background task): it becomes one line of `MON_TASK_FAILED`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DaemonCheck {
    /// Makes the check an error (else a warning).
    pub err: bool,
    /// What failed, without the code: `liveness ticker failed 3 times, last 2s ago: ...`.
    pub text: String,
}

fn plural(n: usize, word: &str) -> String {
    if n == 1 {
        format!("1 {word}")
    } else {
        format!("{n} {word}s")
    }
}

/// A ratio in parts per million as a percentage with one decimal (`85.0%`).
pub fn percent(ppm: u32) -> String {
    format!("{:.1}%", f64::from(ppm) / 10_000.0)
}

/// Bounds `lines` to [`DETAIL_LINES_MAX`], counting the rest in a last line.
fn bounded(mut lines: Vec<String>) -> Vec<String> {
    if lines.len() > DETAIL_LINES_MAX {
        let more = lines.len() - (DETAIL_LINES_MAX - 1);
        lines.truncate(DETAIL_LINES_MAX - 1);
        lines.push(format!("and {more} more"));
    }
    lines
}

pub(crate) fn check(
    code: &str,
    severity: Severity,
    summary: String,
    detail: Vec<String>,
) -> HealthCheck {
    HealthCheck {
        code: code.to_string(),
        severity,
        summary,
        detail: bounded(detail),
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

fn osd_list(osds: &[OsdId]) -> String {
    let names: Vec<String> = osds.iter().map(|o| format!("osd.{o}")).collect();
    names.join(", ")
}

/// One detail line per PG whose state has `bit`, in PG order.
fn pgs_with(map: &ClusterMap, bit: PgState) -> Vec<String> {
    let mut lines = Vec::new();
    for (pool, pgmap) in &map.pgmaps {
        for (seq, pg) in &pgmap.pgs {
            if !pg.state.contains(bit) {
                continue;
            }
            let id = PgId::new(*pool, *seq);
            let (state, members) = (pg.state.name(), osd_list(&pg.osdlist));
            let mut line = format!("pg {id} is {state}: members {members}");
            if !pg.newosdlist.is_empty() {
                line.push_str(&format!(", moving to {}", osd_list(&pg.newosdlist)));
            }
            lines.push(line);
        }
    }
    lines
}

/// ERR when some PG cannot serve IO (`PG_DOWN`), a pool is damaged (`crate::damage`) or a
/// monitor task failed recently; WARN when something is degraded, moving, or a flag suppresses
/// automatic repair; OK otherwise. The daemon's own checks come first, then damage, then the
/// rest.
pub fn health(state: &MonState, daemon: &[DaemonCheck]) -> Health {
    let mut h = Health {
        status: "HEALTH_OK",
        checks: Vec::new(),
    };
    h.add_task_failures(daemon);
    let mut damage: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
    for (pool, d) in state.damaged_pools() {
        damage
            .entry(d.code())
            .or_default()
            .push(state.damage_summary(pool, &d));
    }
    for (code, lines) in damage {
        let summary = match lines.as_slice() {
            [one] => one.clone(),
            _ => format!("{} damaged ({code})", plural(lines.len(), "pool")),
        };
        h.push(check(code, Severity::Err, summary, lines));
    }
    let map = &state.map;
    let down: Vec<String> = map
        .osds
        .values()
        .filter(|o| !o.up && o.is_in && !o.pending_create)
        .map(|o| format!("osd.{} (host {}) is down", o.id, o.host))
        .collect();
    if !down.is_empty() {
        let summary = format!("{} down", plural(down.len(), "osd"));
        h.push(check("OSD_DOWN", Severity::Warn, summary, down));
    }
    let pg_checks = [
        (
            PgState::DOWN,
            "PG_DOWN",
            Severity::Err,
            "down (no majority of replicas up)",
        ),
        (
            PgState::UNDERSIZE,
            "PG_DEGRADED",
            Severity::Warn,
            "undersize (fewer replicas up than the pool size)",
        ),
        (
            PgState::REMAPPED,
            "PG_REMAPPED",
            Severity::Warn,
            "remapped (moving to new members)",
        ),
        (PgState::CREATING, "PG_CREATING", Severity::Warn, "creating"),
    ];
    for (bit, code, severity, what) in pg_checks {
        let lines = pgs_with(map, bit);
        if !lines.is_empty() {
            let summary = format!("{} {what}", plural(lines.len(), "pg"));
            h.push(check(code, severity, summary, lines));
        }
    }
    let mut flags = Vec::new();
    if map.flags.noout {
        flags.push("noout: down OSDs are not marked out".to_string());
    }
    if map.flags.norebalance {
        flags.push("norebalance: OSDs coming in move no data".to_string());
    }
    if !flags.is_empty() {
        let names: Vec<&str> = flags.iter().filter_map(|f| f.split(':').next()).collect();
        let summary = format!("{} flag(s) set", names.join(","));
        h.push(check("OSDMAP_FLAGS", Severity::Warn, summary, flags));
    }
    h
}

impl Health {
    /// Adds a check, raising the status to its severity.
    pub fn push(&mut self, c: HealthCheck) {
        self.status = match (self.status, c.severity) {
            (_, Severity::Err) | ("HEALTH_ERR", _) => "HEALTH_ERR",
            _ => "HEALTH_WARN",
        };
        self.checks.push(c);
    }

    /// Adds `MON_TASK_FAILED`, one detail line per failed task of the monitor: an error if
    /// one failed recently.
    pub fn add_task_failures(&mut self, daemon: &[DaemonCheck]) {
        let summary = match daemon {
            [] => return,
            [one] => one.text.clone(),
            many => format!("{} monitor tasks failed", many.len()),
        };
        let severity = if daemon.iter().any(|c| c.err) {
            Severity::Err
        } else {
            Severity::Warn
        };
        let lines = daemon.iter().map(|c| c.text.clone()).collect();
        self.push(check("MON_TASK_FAILED", severity, summary, lines));
    }

    /// Adds `MON_DOWN` for the monitors of `expected` (the names in `--initial-cluster`) that
    /// hold no live member key (`live`: each monitor keeps one under its own lease, so a dead
    /// monitor's goes within the lease TTL). WARN: the others keep leading while a majority of
    /// the etcd members is up.
    pub fn add_mon_down(&mut self, expected: &[String], live: &[&str]) {
        let down: Vec<String> = expected
            .iter()
            .filter(|name| !live.contains(&name.as_str()))
            .map(|name| format!("mon.{name} is down (no live member key)"))
            .collect();
        if down.is_empty() {
            return;
        }
        let summary = format!("{} down of {}", plural(down.len(), "mon"), expected.len());
        self.push(check("MON_DOWN", Severity::Warn, summary, down));
    }

    /// Adds `PG_BACKFILL_TOOFULL`, one detail per refused copy (from the PG leaders'
    /// heartbeats): the PG stays degraded or remapped until room is made on the target.
    pub fn add_backfill_too_full(&mut self, refused: &[BackfillTooFull]) {
        if refused.is_empty() {
            return;
        }
        let pgs: BTreeSet<_> = refused.iter().map(|r| r.pg).collect();
        let summary = format!("{} waiting for room on the target", plural(pgs.len(), "pg"));
        let lines = refused
            .iter()
            .map(|r| {
                format!(
                    "pg {} cannot copy {} to osd.{} ({} free there)",
                    r.pg,
                    format_size(r.needed_bytes),
                    r.osd,
                    format_size(r.free_bytes)
                )
            })
            .collect();
        self.push(check("PG_BACKFILL_TOOFULL", Severity::Warn, summary, lines));
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
        let all: Vec<String> = left
            .iter()
            .map(|(pg, n)| format!("pg {pg} ({} left)", blocks(*n)))
            .collect();
        let named = &all[..all.len().min(INCONSISTENT_PGS_NAMED_MAX)];
        let mut summary = format!(
            "{} with blocks scrub found inconsistent and could not repair: {}",
            plural(left.len(), "pg"),
            named.join(", ")
        );
        if all.len() > named.len() {
            summary.push_str(&format!(" and {} more", all.len() - named.len()));
        }
        self.push(check("PG_INCONSISTENT", Severity::Err, summary, all));
    }

    /// Adds `AUTH_DOWNGRADE_REFUSED` for the up OSDs whose auth floor (from their heartbeats:
    /// `floors`) is above the cluster's mode in `map`: they refuse the maps and answers of a
    /// mode weaker than their floor (`docs/security.md`, "No downgrade"), so they keep the last
    /// map they accepted and fall behind. ERR: either someone lowered the mode (on purpose or
    /// not), or their floor is wrong.
    pub fn add_auth_downgrade_refused(
        &mut self,
        map: &ClusterMap,
        floors: &BTreeMap<OsdId, fastblock_types::auth::AuthMode>,
    ) {
        let mode = map.auth.mode;
        let refusing: Vec<(&OsdId, &fastblock_types::auth::AuthMode)> = floors
            .iter()
            .filter(|(osd, floor)| **floor > mode && map.osds.get(osd).is_some_and(|o| o.up))
            .collect();
        if refusing.is_empty() {
            return;
        }
        let names: Vec<String> = refusing.iter().map(|(o, _)| format!("osd.{o}")).collect();
        let summary = format!(
            "{} refuse{} the cluster's auth mode {mode} as a downgrade: set the mode back \
             (fastblock-client auth mode ...), or lower their --auth-floor on purpose",
            names.join(","),
            if refusing.len() == 1 { "s" } else { "" }
        );
        let lines = refusing
            .iter()
            .map(|(osd, floor)| {
                format!(
                    "osd.{osd} has auth floor {floor} and keeps its last map of a mode it accepts"
                )
            })
            .collect();
        self.push(check(
            "AUTH_DOWNGRADE_REFUSED",
            Severity::Err,
            summary,
            lines,
        ));
    }

    /// Adds `SLOW_OPS` for the OSDs whose last op tracker report (`slow`: the fresh reports
    /// of up OSDs) counts ops in flight past the complaint time: one detail line per OSD with
    /// its oldest op's age and stage. WARN, as Ceph's: the IO is late, not lost.
    pub fn add_slow_ops(&mut self, slow: &BTreeMap<OsdId, OsdOps>) {
        let slow: Vec<(&OsdId, &OsdOps)> = slow.iter().filter(|(_, o)| o.slow > 0).collect();
        if slow.is_empty() {
            return;
        }
        let secs = |us: u64| format!("{:.1}s", us as f64 / 1e6);
        let total: u64 = slow.iter().map(|(_, o)| o.slow).sum();
        let oldest = slow
            .iter()
            .filter_map(|(osd, o)| Some((*osd, o.oldest.first()?)))
            .max_by_key(|(_, op)| op.duration_us);
        let names: Vec<String> = slow.iter().map(|(osd, _)| format!("osd.{osd}")).collect();
        let mut summary = format!(
            "{} on {}",
            plural(total as usize, "slow op"),
            names.join(",")
        );
        if let Some((osd, op)) = oldest {
            summary.push_str(&format!(
                ", oldest blocked for {} in {} on osd.{osd}",
                secs(op.duration_us),
                op.stage
            ));
        }
        let lines = slow
            .iter()
            .map(|(osd, o)| {
                let mut line = format!(
                    "osd.{osd} has {} in flight for {}s or longer",
                    plural(o.slow as usize, "op"),
                    o.complaint_time_ms as f64 / 1000.0
                );
                if let Some(op) = o.oldest.first() {
                    line.push_str(&format!(
                        ", the oldest for {} in {} ({} on pg {})",
                        secs(op.duration_us),
                        op.stage,
                        op.kind,
                        op.pg
                    ));
                }
                line
            })
            .collect();
        self.push(check("SLOW_OPS", Severity::Warn, summary, lines));
    }

    /// Adds `OSD_FULL` for the OSDs the map marks full (those whose PGs refuse writes, ERR)
    /// and `OSD_NEARFULL` for the others whose last report (`spaces`) is past the nearfull
    /// ratio (WARN). `spaces` are the last reports of the OSDs that are up.
    pub fn add_osd_space(&mut self, map: &ClusterMap, spaces: &BTreeMap<OsdId, OsdSpace>) {
        let settings = &map.space;
        let full: Vec<String> = settings
            .full_osds
            .iter()
            .map(|osd| {
                let ratio = percent(settings.full_ratio_ppm);
                match spaces.get(osd).and_then(|s| used_ppm(*s)) {
                    Some(ppm) => format!("osd.{osd} is {} full (full ratio {ratio})", percent(ppm)),
                    // Marked by an earlier report: a down OSD (its PGs still hold it, under
                    // noout say) or one not heard since this monitor began leading.
                    None => {
                        let why = if map.osds.get(osd).is_some_and(|o| o.up) {
                            "no report since"
                        } else {
                            "down since"
                        };
                        format!("osd.{osd} was past the full ratio ({ratio}) at its last report ({why})")
                    }
                }
            })
            .collect();
        if !full.is_empty() {
            let summary = format!(
                "{}: writes to their PGs are refused",
                plural(full.len(), "full osd")
            );
            self.push(check("OSD_FULL", Severity::Err, summary, full));
        }
        let nearfull: Vec<String> = spaces
            .iter()
            .filter(|(osd, s)| {
                classify(**s, settings) != SpaceLevel::Ok && !settings.full_osds.contains(osd)
            })
            .filter_map(|(osd, s)| {
                let ppm = used_ppm(*s)?;
                Some(format!(
                    "osd.{osd} is {} full (nearfull ratio {})",
                    percent(ppm),
                    percent(settings.nearfull_ratio_ppm)
                ))
            })
            .collect();
        if !nearfull.is_empty() {
            let summary = plural(nearfull.len(), "nearfull osd");
            self.push(check("OSD_NEARFULL", Severity::Warn, summary, nearfull));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fastblock_types::{OsdId, PgId, PoolId};

    #[test]
    fn an_osd_whose_floor_is_above_the_mode_raises_an_error() {
        use fastblock_types::auth::AuthMode;
        let mut s = active_cluster();
        let osds: Vec<OsdId> = s.map.osds.keys().copied().collect();
        s.mark_down(osds[2]).unwrap();
        let floors: BTreeMap<OsdId, AuthMode> = [
            (osds[0], AuthMode::Sign),
            (osds[1], AuthMode::None),
            (osds[2], AuthMode::Secure),
        ]
        .into();
        s.map.auth.mode = AuthMode::Sign;
        let mut h = health(&s, &[]);
        let before = h.checks.len();
        h.add_auth_downgrade_refused(&s.map, &floors);
        assert_eq!(h.checks.len(), before, "{:?}", h.checks);
        s.map.auth.mode = AuthMode::None;
        let mut h = health(&s, &[]);
        h.add_auth_downgrade_refused(&s.map, &floors);
        let c = h.checks.last().unwrap();
        assert_eq!(
            (c.code.as_str(), c.severity),
            ("AUTH_DOWNGRADE_REFUSED", Severity::Err)
        );
        assert_eq!(h.status, "HEALTH_ERR");
        // Only the up OSD above the mode is named (the down one is not).
        let first = format!("osd.{} refuses the cluster's auth mode none", osds[0]);
        assert!(c.summary.starts_with(&first), "{}", c.summary);
        assert_eq!(c.detail.len(), 1, "{:?}", c.detail);
    }

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
        let c = &h.checks[0];
        assert_eq!(
            c.to_string(),
            "PG_BACKFILL_TOOFULL: 2 pgs waiting for room on the target"
        );
        assert_eq!(
            c.detail[0],
            "pg 1.2 cannot copy 3 MiB to osd.4 (1 MiB free there)"
        );
        assert!(c.detail[1].starts_with("pg 1.5"), "{c:?}");
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
            h.checks[0].to_string(),
            "PG_INCONSISTENT: 2 pgs with blocks scrub found inconsistent and could not \
             repair: pg 2.1 (1 block left), pg 2.7 (12 blocks left)"
        );
        let many: Vec<(PgId, u64)> = (0..60).map(|seq| (pg(seq), 1)).collect();
        let mut h = health(&MonState::default(), &[]);
        h.add_pg_inconsistent(&many);
        let c = &h.checks[0];
        assert!(c.summary.starts_with("60 pgs"), "{c:?}");
        assert!(
            c.summary.ends_with("pg 2.15 (1 block left) and 44 more"),
            "{c:?}"
        );
        assert_eq!(c.detail.len(), DETAIL_LINES_MAX);
        assert_eq!(c.detail[DETAIL_LINES_MAX - 1], "and 11 more");
    }

    /// Three OSDs up and a pool of 4 PGs with 3 replicas, every PG led (active).
    fn active_cluster() -> MonState {
        use fastblock_types::api::{BootRequest, CreatePoolRequest};
        use fastblock_types::map::FailureDomain;
        let mut s = MonState::default();
        for i in 0..3u32 {
            let uuid = format!("{i:08x}-0000-4000-8000-{i:012x}");
            let id = s.apply_id(&uuid).unwrap();
            let boot = BootRequest {
                uuid,
                address: "127.0.0.1".into(),
                port: 7000,
                shards: 1,
                host: format!("h{i}"),
                capacity_bytes: 1 << 30,
                config: String::new(),
                lease_timing: None,
            };
            s.boot(id, &boot).unwrap();
        }
        s.create_pool(&CreatePoolRequest {
            name: "p".into(),
            pg_count: 4,
            size: 3,
            failure_domain: FailureDomain::Osd,
        })
        .unwrap();
        for pg in s.map.pgmaps.values_mut().flat_map(|m| m.pgs.values_mut()) {
            pg.leader = pg.osdlist.first().copied();
        }
        s.derive_pg_states();
        s
    }

    fn codes(h: &Health) -> Vec<&str> {
        h.checks.iter().map(|c| c.code.as_str()).collect()
    }

    #[test]
    fn down_osds_and_pgs_and_flags_have_their_codes_and_details() {
        let mut s = active_cluster();
        assert_eq!(
            health(&s, &[]),
            Health {
                status: "HEALTH_OK",
                checks: vec![]
            }
        );
        let osds: Vec<OsdId> = s.map.osds.keys().copied().collect();
        s.mark_down(osds[0]).unwrap();
        s.derive_pg_states();
        let h = health(&s, &[]);
        assert_eq!(h.status, "HEALTH_WARN");
        assert_eq!(codes(&h), ["OSD_DOWN", "PG_DEGRADED"]);
        assert_eq!(h.checks[0].to_string(), "OSD_DOWN: 1 osd down");
        assert_eq!(
            h.checks[0].detail,
            [format!("osd.{} (host h0) is down", osds[0])]
        );
        let degraded = &h.checks[1];
        assert!(
            degraded.summary.starts_with("4 pgs undersize"),
            "{degraded:?}"
        );
        assert_eq!(degraded.detail.len(), 4);
        assert!(degraded.detail[0].starts_with("pg 1.0 is undersize: members osd."));
        // A second OSD down: no majority, PG_DOWN is an error.
        s.mark_down(osds[1]).unwrap();
        s.set_flag(crate::osd_ops::Flag::NoOut, true);
        s.derive_pg_states();
        let h = health(&s, &[]);
        assert_eq!(h.status, "HEALTH_ERR");
        assert_eq!(codes(&h), ["OSD_DOWN", "PG_DOWN", "OSDMAP_FLAGS"]);
        assert_eq!(h.checks[1].severity, Severity::Err);
        assert_eq!(h.checks[2].to_string(), "OSDMAP_FLAGS: noout flag(s) set");
    }

    #[test]
    fn nearfull_osds_warn_and_full_ones_are_an_error() {
        let mut s = active_cluster();
        let osds: Vec<OsdId> = s.map.osds.keys().copied().collect();
        let space = |free_bytes| OsdSpace {
            total_bytes: 1000,
            free_bytes,
            writable_bytes: None,
        };
        let spaces: BTreeMap<OsdId, OsdSpace> = [
            (osds[0], space(500)),
            (osds[1], space(120)),
            (osds[2], space(40)),
        ]
        .into();
        // osd 2 is past the full ratio but not marked yet: nearfull until the map says full.
        let mut h = health(&s, &[]);
        h.add_osd_space(&s.map, &spaces);
        assert_eq!(codes(&h), ["OSD_NEARFULL"]);
        assert_eq!(h.checks[0].summary, "2 nearfull osds");
        assert_eq!(
            h.checks[0].detail[0],
            format!("osd.{} is 88.0% full (nearfull ratio 85.0%)", osds[1])
        );
        s.record_osd_space(osds[2], spaces[&osds[2]]);
        let mut h = health(&s, &[]);
        h.add_osd_space(&s.map, &spaces);
        assert_eq!(h.status, "HEALTH_ERR");
        assert_eq!(codes(&h), ["OSD_FULL", "OSD_NEARFULL"]);
        assert_eq!(
            h.checks[0].to_string(),
            "OSD_FULL: 1 full osd: writes to their PGs are refused"
        );
        assert_eq!(
            h.checks[0].detail,
            [format!("osd.{} is 96.0% full (full ratio 95.0%)", osds[2])]
        );
        assert_eq!(h.checks[1].summary, "1 nearfull osd");
        // Down, it stays marked (its PGs still hold it): named without a report.
        let before = s.clone();
        s.mark_down(osds[2]).unwrap();
        s.finish(&before);
        let up_spaces: BTreeMap<OsdId, OsdSpace> =
            spaces.into_iter().filter(|(o, _)| *o != osds[2]).collect();
        let mut h = health(&s, &[]);
        h.add_osd_space(&s.map, &up_spaces);
        let full = h.checks.iter().find(|c| c.code == "OSD_FULL").unwrap();
        assert_eq!(
            full.detail,
            [format!(
                "osd.{} was past the full ratio (95.0%) at its last report (down since)",
                osds[2]
            )]
        );
    }

    #[test]
    fn slow_ops_name_each_osd_and_the_oldest_op_with_its_stage() {
        use fastblock_types::api::TrackedOp;
        let op = |us, stage: &str| TrackedOp {
            shard: 0,
            pg: PgId::new(PoolId(1), 3),
            kind: "write".into(),
            request_id: 9,
            duration_us: us,
            stage: stage.into(),
            stages: Vec::new(),
        };
        let report = |slow, oldest| OsdOps {
            complaint_time_ms: 1_000,
            in_flight: 5,
            slow,
            oldest,
            slowest: Vec::new(),
        };
        let mut h = health(&MonState::default(), &[]);
        // An OSD without slow ops raises nothing.
        h.add_slow_ops(&[(OsdId(0), report(0, vec![op(10, "queue")]))].into());
        assert_eq!((h.status, h.checks.len()), ("HEALTH_OK", 0));
        let slow: BTreeMap<OsdId, OsdOps> = [
            (OsdId(1), report(2, vec![op(3_500_000, "wal_commit")])),
            (OsdId(2), report(1, vec![op(1_200_000, "replication")])),
        ]
        .into();
        h.add_slow_ops(&slow);
        assert_eq!(h.status, "HEALTH_WARN");
        assert_eq!(
            h.checks[0].to_string(),
            "SLOW_OPS: 3 slow ops on osd.1,osd.2, oldest blocked for 3.5s in wal_commit on osd.1"
        );
        assert_eq!(
            h.checks[0].detail,
            [
                "osd.1 has 2 ops in flight for 1s or longer, the oldest for 3.5s in wal_commit (write on pg 1.3)",
                "osd.2 has 1 op in flight for 1s or longer, the oldest for 1.2s in replication (write on pg 1.3)",
            ]
        );
    }

    #[test]
    fn a_monitor_without_a_live_member_key_is_down() {
        let expected = ["a".to_string(), "b".to_string(), "c".to_string()];
        let mut h = health(&MonState::default(), &[]);
        h.add_mon_down(&expected, &["a", "b", "c"]);
        assert_eq!((h.status, h.checks.len()), ("HEALTH_OK", 0));
        h.add_mon_down(&expected, &["a", "c"]);
        assert_eq!(h.status, "HEALTH_WARN");
        assert_eq!(h.checks[0].to_string(), "MON_DOWN: 1 mon down of 3");
        assert_eq!(h.checks[0].detail, ["mon.b is down (no live member key)"]);
    }

    #[test]
    fn task_failures_are_one_check_an_error_while_recent() {
        let mut h = health(&MonState::default(), &[]);
        let old = DaemonCheck {
            err: false,
            text: "a failed 1 time, last 70s ago: x".into(),
        };
        h.add_task_failures(std::slice::from_ref(&old));
        assert_eq!(h.status, "HEALTH_WARN");
        assert_eq!(
            h.checks[0].to_string(),
            "MON_TASK_FAILED: a failed 1 time, last 70s ago: x"
        );
        let recent = DaemonCheck {
            err: true,
            text: "b failed 2 times, last 1s ago: y".into(),
        };
        let h = health(&MonState::default(), &[old, recent]);
        assert_eq!(h.status, "HEALTH_ERR");
        assert_eq!(h.checks.len(), 1);
        assert_eq!(h.checks[0].summary, "2 monitor tasks failed");
        assert_eq!(h.checks[0].detail.len(), 2);
    }
}

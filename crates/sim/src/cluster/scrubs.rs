//! Scrubs: the monitor's scrub requests during the fault phase, the heartbeats that carry the
//! leaders' scrub reports back to it, and the deep scrub of every PG that ends every run
//! (`docs/design/simulator.md`, "Faults" and "Checkers").

use super::{Cluster, FinalScrub};
use crate::options::{RngExt, MS};
use fastblock_shard::repair::REPORT_RETRY_MS;
use fastblock_shard::RepairCounts;
use fastblock_types::api::PgScrubReport;
use fastblock_types::map::PgInfo;
use fastblock_types::{OsdId, PgId};
use std::collections::BTreeMap;

/// Liveness checks in a row (250 ms apart) without a repair started or finished anywhere
/// before the final scrub counts as done: a repair under way in a clean network finishes
/// within a few ticks.
const QUIET_CHECKS_MIN: u32 = 2;
/// Rounds of the final scrub at most. A round follows another when a request was one already
/// pending, or when the last round left blocks it found unrepaired (as an operator repeats
/// `pg repair` while `PG_INCONSISTENT` shows): a leader drops a repair its PG refuses as
/// busy (`pending_ops_max`), and a scrub that finds more bad blocks at once than the PG has
/// room for leaves the rest to the next scrub. Such a round waits until members report
/// again the bad copies they reported in the last one (`REPORT_RETRY_MS`).
const FINAL_ROUNDS_MAX: u32 = 4;

impl Cluster {
    /// The monitor asks for a scrub of a random PG, deep half the time.
    pub(super) fn request_scrub(&mut self) {
        let pgs: Vec<PgId> = self.pg_infos().into_keys().collect();
        let pg = self.rot_rng.pick(&pgs);
        let deep = self.rot_rng.chance_pct(50);
        match self.mon_call(|m| m.request_scrub(pg, deep)) {
            Ok(_) => self.probes.hit("scrub.requested"),
            Err(e) => self.fail(format!(
                "the monitor refused a scrub of pg {pg}: {:?}: {}",
                e.code, e.message
            )),
        }
    }

    /// Every running node's heartbeat reaches the monitor with its leaders' scrub reports
    /// (`MonState::on_scrub_reports`, which drops the requests they finished); a change
    /// publishes a new map.
    pub(super) fn heartbeat(&mut self) {
        let before = self.mon.clone();
        let now_ms = self.now / MS;
        let ids: Vec<OsdId> = self.nodes.keys().copied().collect();
        for id in ids {
            let node = &self.nodes[&id];
            let Some(core) = node.core().filter(|c| c.failure().is_none()) else {
                continue;
            };
            let life = node.incarnation;
            let stats = core.stats();
            for c in &stats {
                if let (Some(pg), Some(report)) = (c.pg, c.scrub) {
                    self.count_scrub_report(id, life, pg, report);
                }
            }
            self.mon
                .on_scrub_reports(id, &stats, &mut self.scrub_stats, now_ms);
        }
        if self.mon.finish(&before) {
            self.publish();
        }
    }

    /// Counts what a leader's scrub report shows since it was last counted.
    fn count_scrub_report(&mut self, id: OsdId, life: u64, pg: PgId, r: PgScrubReport) {
        let (_, seen) = self
            .seen_reports
            .get(&(id, pg))
            .copied()
            .filter(|(l, s)| *l == life && s.scrubs <= r.scrubs)
            .unwrap_or_default();
        self.probes
            .add("scrub.finished", r.scrubs.saturating_sub(seen.scrubs));
        self.probes.add(
            "scrub.deep_finished",
            r.deep_scrubs.saturating_sub(seen.deep_scrubs),
        );
        self.probes.add(
            "scrub.inconsistent_block",
            r.inconsistent_blocks
                .saturating_sub(seen.inconsistent_blocks),
        );
        self.probes.add(
            "scrub.repaired_block",
            r.repaired_blocks.saturating_sub(seen.repaired_blocks),
        );
        self.seen_reports.insert((id, pg), (life, r));
    }

    /// The leader of `pg` among its members, and its scrub report of `pg`'s (inconsistent,
    /// repaired) blocks ((0, 0) before its first scrub).
    fn leader_report(&self, pg: PgId, info: &PgInfo) -> Option<(OsdId, u64, u64)> {
        info.osdlist.iter().find_map(|m| {
            let core = self.nodes[m].core()?;
            core.replica(pg).filter(|r| r.is_leader())?;
            let report = core
                .stats()
                .into_iter()
                .find(|c| c.pg == Some(pg))
                .and_then(|c| c.scrub)
                .unwrap_or_default();
            Some((*m, report.inconsistent_blocks, report.repaired_blocks))
        })
    }

    /// Asks the monitor for a deep scrub of every PG: round `number` of the final scrub.
    fn ask_final_scrub(
        &mut self,
        infos: &BTreeMap<PgId, PgInfo>,
        number: u32,
    ) -> Result<FinalScrub, String> {
        let mut round = FinalScrub {
            round: number,
            ..FinalScrub::default()
        };
        for (pg, info) in infos {
            round.reused |= self
                .mon
                .map
                .scrub_requests
                .values()
                .any(|r| r.pg == *pg && r.deep);
            let request = self.mon_call(|m| m.request_scrub(*pg, true)).map_err(|e| {
                format!(
                    "the monitor refused the final deep scrub of pg {pg}: {:?}: {}",
                    e.code, e.message
                )
            })?;
            round.requests.insert(*pg, request.id);
            if let Some(b) = self.leader_report(*pg, info) {
                round.baseline.insert(*pg, b);
            }
        }
        self.probes.hit("scrub.final_requested");
        Ok(round)
    }

    /// Whether the final deep scrub is done: every PG's request dropped by the monitor (its
    /// leader reported it finished), every repair it started applied, and no repair started
    /// or finished anywhere for [`QUIET_CHECKS_MIN`] checks. Asks for it (again) when needed.
    pub(super) fn final_scrub_done(
        &mut self,
        infos: &BTreeMap<PgId, PgInfo>,
    ) -> Result<bool, String> {
        if self.final_scrub.as_ref().is_some_and(|f| f.done) {
            return Ok(true);
        }
        if self.final_scrub.is_none() {
            self.final_scrub = Some(self.ask_final_scrub(infos, 1)?);
            return Ok(false);
        }
        self.heartbeat();
        let f = self.final_scrub.as_ref().expect("asked");
        let scrub_requests = &self.mon.map.scrub_requests;
        if f.requests
            .values()
            .any(|id| scrub_requests.contains_key(id))
        {
            return Ok(false);
        }
        let round = f.round;
        if f.reused && round < FINAL_ROUNDS_MAX {
            self.final_scrub = Some(self.ask_final_scrub(infos, round + 1)?);
            return Ok(false);
        }
        let repairs: BTreeMap<OsdId, RepairCounts> = self
            .nodes
            .iter()
            .filter_map(|(id, n)| n.core().map(|c| (*id, c.repair_counts())))
            .collect();
        let f = self.final_scrub.as_mut().expect("asked");
        if repairs != f.repairs {
            f.repairs = repairs;
            f.quiet_checks = 0;
            return Ok(false);
        }
        f.quiet_checks += 1;
        if f.quiet_checks < QUIET_CHECKS_MIN {
            return Ok(false);
        }
        let left = self.final_scrub_left(infos);
        if !left.is_empty() && round < FINAL_ROUNDS_MAX {
            let f = self.final_scrub.as_mut().expect("asked");
            let at = *f
                .next_round_at
                .get_or_insert(self.now + REPORT_RETRY_MS * MS);
            if self.now >= at {
                self.probes.hit("scrub.final_repeated");
                self.final_scrub = Some(self.ask_final_scrub(infos, round + 1)?);
            }
            return Ok(false);
        }
        if !left.is_empty() {
            return Err(format!(
                "{round} rounds of the final deep scrub left blocks unrepaired: {}",
                left.join("; ")
            ));
        }
        self.final_scrub.as_mut().expect("asked").done = true;
        self.probes.hit("scrub.final_done");
        Ok(true)
    }

    /// The PGs whose final scrub started repairs that were not applied (or found groups no
    /// majority agreed on), as reasons.
    fn final_scrub_left(&self, infos: &BTreeMap<PgId, PgInfo>) -> Vec<String> {
        let Some(f) = &self.final_scrub else {
            return Vec::new();
        };
        let mut left = Vec::new();
        for (pg, info) in infos {
            let Some((leader, inconsistent, repaired)) = self.leader_report(*pg, info) else {
                continue;
            };
            // A leader's counts start at zero when it takes the PG over.
            let (i0, r0) = match f.baseline.get(pg) {
                Some((l, i, r)) if *l == leader && *i <= inconsistent && *r <= repaired => (*i, *r),
                _ => (0, 0),
            };
            let (found, fixed) = (inconsistent - i0, repaired - r0);
            if found > fixed {
                left.push(format!(
                    "pg {pg}: the final deep scrub on leader osd {leader} found {found} \
                     inconsistent blocks and repaired {fixed}"
                ));
            }
        }
        left
    }

    /// Why the final scrub is not done, if it is not.
    pub(super) fn final_scrub_reason(&self, infos: &BTreeMap<PgId, PgInfo>) -> Option<String> {
        let f = self.final_scrub.as_ref().filter(|f| !f.done)?;
        let pending: Vec<(PgId, u64)> = f
            .requests
            .iter()
            .filter(|(_, id)| self.mon.map.scrub_requests.contains_key(id))
            .map(|(pg, id)| (*pg, *id))
            .collect();
        if !pending.is_empty() {
            return Some(format!(
                "the final deep scrub requests (pg, id) {pending:?} are not reported done"
            ));
        }
        let left = self.final_scrub_left(infos);
        if !left.is_empty() {
            return Some(left.join("; "));
        }
        Some(format!(
            "repairs are still starting or finishing (quiet for {} checks)",
            f.quiet_checks
        ))
    }
}

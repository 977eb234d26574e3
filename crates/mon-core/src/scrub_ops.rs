//! Scrubs: operators' requests to scrub a PG now, and what PG leaders report of their scrubs
//! (`docs/mon-api.md`, "Scrubs").
//!
//! A request (`fastblock-client pg scrub|deep-scrub|repair`) is recorded with a new id and
//! carried in the map (`ClusterMap::scrub_requests`, derived from [`ScrubRecords`]). The PG's
//! leader scrubs the PG and reports, in every heartbeat, the highest request id it finished a
//! scrub for (`PgScrubReport::request_done`); [`MonState::on_scrub_reports`] then drops the
//! PG's requests up to that id. Only the leader the map records is heard: a deposed leader
//! that still reports, or an OSD that leads by its own account before the monitor recorded it,
//! changes nothing.
//!
//! Ids rise over the cluster's life ([`ScrubRecords::next_id`] is persisted and never goes
//! back), because a leader scrubs for every id above the one it last reported done: a reused
//! id would be taken as done already. At most one request per (PG, deep) is pending, and a
//! repeat returns it, so the list holds at most two requests per PG.
//!
//! What leaders report is kept by [`ScrubStats`], in the leader monitor's memory only, like
//! the IO counters: a new leader monitor starts empty and learns each PG's state from the next
//! report. It keeps, per PG, the last report (for `PG_INCONSISTENT`, [`crate::health`]) and
//! the monitor's wall-clock time when the PG's count of scrubs, and of deep scrubs, last rose.
//! The counts are per leader ("scrubs this leader finished"), so a rise is measured against
//! the same OSD's previous report; the first report this monitor hears from an OSD for a PG
//! is only a baseline (its scrubs happened at a time the monitor cannot know).

use crate::state::MonState;
use crate::{err, OpResult};
use fastblock_types::api::{ErrorCode, PgIoCounters, PgScrubReport};
use fastblock_types::map::{PgInfo, ScrubRequest};
use fastblock_types::{OsdId, PgId, PoolId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// The persisted scrub records (`scrub/next-id` and `scrub/requests/<id>` in etcd).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScrubRecords {
    /// The id the next request gets. Starts at 1 (0 is the `request_done` of a leader that
    /// finished none) and never goes back.
    pub next_id: u64,
    /// Pending requests by id.
    pub requests: BTreeMap<u64, ScrubRequest>,
}

impl Default for ScrubRecords {
    fn default() -> Self {
        ScrubRecords {
            next_id: 1,
            requests: BTreeMap::new(),
        }
    }
}

impl MonState {
    /// Records a request to scrub `pg` (`deep`: read and check every block's data too), or
    /// returns the pending one of the same kind.
    pub fn request_scrub(&mut self, pg: PgId, deep: bool) -> OpResult<ScrubRequest> {
        self.check_pool_usable(pg.pool)?;
        self.check_pg_exists(pg)?;
        if let Some(pending) = self
            .scrubs
            .requests
            .values()
            .find(|r| r.pg == pg && r.deep == deep)
        {
            return Ok(pending.clone());
        }
        let id = self.scrubs.next_id;
        assert!(id >= 1, "scrub request ids start at 1, next is {id}");
        assert!(
            self.scrubs.requests.keys().all(|old| *old < id),
            "scrub request ids must rise: next {id}, pending {:?}",
            self.scrubs.requests.keys().collect::<Vec<_>>()
        );
        self.scrubs.next_id += 1;
        let request = ScrubRequest { id, pg, deep };
        self.scrubs.requests.insert(id, request.clone());
        Ok(request)
    }

    /// `pg_not_found` naming what is missing: the pool, or the PG in a pool that has fewer.
    fn check_pg_exists(&self, pg: PgId) -> OpResult<()> {
        if self.map.pg(pg).is_some() {
            return Ok(());
        }
        let why = match self.map.pools.get(&pg.pool) {
            None => format!("no pool has id {}", pg.pool),
            Some(pool) if pool.pg_count == 0 => format!("pool {:?} has no PGs", pool.name),
            Some(pool) => format!(
                "pool {:?} has {} PGs, {}.0 to {}.{}",
                pool.name,
                pool.pg_count,
                pg.pool,
                pg.pool,
                pool.pg_count - 1
            ),
        };
        err(
            ErrorCode::PgNotFound,
            format!("pg {pg} does not exist: {why}"),
        )
    }
    /// The scrub reports of an OSD's heartbeat: recorded in `stats`, and the operators'
    /// requests its PGs finished dropped (returned). Reports for a PG this OSD does not lead
    /// (per the record) are ignored.
    pub fn on_scrub_reports(
        &mut self,
        osd: OsdId,
        pgs: &[PgIoCounters],
        stats: &mut ScrubStats,
        unix_ms: u64,
    ) -> Vec<ScrubRequest> {
        self.record_scrub_reports(osd, pgs, stats, unix_ms);
        let ids = self.finished_scrub_requests(osd, pgs);
        ids.into_iter()
            .map(|id| {
                self.scrubs
                    .requests
                    .remove(&id)
                    .expect("listed as finished")
            })
            .collect()
    }

    /// What [`MonState::on_scrub_reports`] records in `stats`, without changing the state.
    pub fn record_scrub_reports(
        &self,
        osd: OsdId,
        pgs: &[PgIoCounters],
        stats: &mut ScrubStats,
        unix_ms: u64,
    ) {
        for (pg, info, counters) in self.led_reports(osd, pgs) {
            let members: BTreeSet<OsdId> = info.members().copied().collect();
            // An operator's request this report finishes is a scrub finished since it was
            // asked for, whatever the counts say: a leader first heard after its scrub ended
            // is otherwise only a baseline (a test saw `pg scrub` done and never timed).
            let done = counters.scrub.map_or(0, |r| r.request_done);
            let finished = self
                .scrubs
                .requests
                .range(..=done)
                .filter(|(_, r)| r.pg == pg)
                .fold(Finished::default(), |f, (_, r)| Finished {
                    scrub: true,
                    deep: f.deep || r.deep,
                });
            stats.record(pg, osd, counters.scrub, unix_ms, &members, finished);
        }
    }

    /// The operators' scrub requests these reports finish (of PGs this OSD leads): what
    /// [`MonState::on_scrub_reports`] drops. Empty in the common case, found without a
    /// change, so that a heartbeat that finishes nothing changes nothing.
    pub fn finished_scrub_requests(&self, osd: OsdId, pgs: &[PgIoCounters]) -> Vec<u64> {
        if self.scrubs.requests.is_empty() {
            return Vec::new();
        }
        let mut ids = Vec::new();
        for (pg, _, counters) in self.led_reports(osd, pgs) {
            let done = counters.scrub.map_or(0, |r| r.request_done);
            ids.extend(
                self.scrubs
                    .requests
                    .range(..=done)
                    .filter(|(_, r)| r.pg == pg)
                    .map(|(id, _)| *id),
            );
        }
        ids
    }

    /// The reports among `pgs` that count: of PGs the map says `osd` leads, in pools that are
    /// not damaged.
    fn led_reports<'a>(
        &'a self,
        osd: OsdId,
        pgs: &'a [PgIoCounters],
    ) -> impl Iterator<Item = (PgId, &'a PgInfo, &'a PgIoCounters)> + 'a {
        pgs.iter().filter_map(move |counters| {
            let pg = counters.pg?;
            let info = self.map.pg(pg)?;
            (info.leader == Some(osd) && self.pool_damage(pg.pool).is_none())
                .then_some((pg, info, counters))
        })
    }

    /// Drops the scrub requests of a deleted pool.
    pub(crate) fn forget_scrubs_of_pool(&mut self, pool: PoolId) {
        self.scrubs.requests.retain(|_, r| r.pg.pool != pool);
    }

    /// Checks of the scrub records not confined to one pool, for [`MonState::validate`]: ids
    /// below the counter (a new request must never take a pending or finished one's id).
    pub(crate) fn validate_scrubs(&self) -> Result<(), String> {
        if self.scrubs.next_id == 0 {
            return Err("scrub request counter is 0".to_string());
        }
        for (id, request) in &self.scrubs.requests {
            if *id != request.id {
                return Err(format!("scrub request {} listed under id {id}", request.id));
            }
            if *id == 0 || *id >= self.scrubs.next_id {
                return Err(format!(
                    "scrub request id {id} not in 1..{}",
                    self.scrubs.next_id
                ));
            }
        }
        Ok(())
    }
}

/// What the monitor knows of one PG's scrubs (`GET /v1/pgs`, `pg ls`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgScrubStatus {
    /// The last report of a leader that had scrubbed the PG (`None`: none reported since this
    /// monitor leads).
    pub report: Option<PgScrubReport>,
    /// When this monitor saw the PG's scrubs (light or deep) rise, and its deep scrubs, in
    /// Unix milliseconds of its wall clock (`None`: not since it leads).
    pub last_scrub_unix_ms: Option<u64>,
    pub last_deep_scrub_unix_ms: Option<u64>,
}

impl PgScrubStatus {
    /// Blocks the last scrub found inconsistent and did not repair (`None`: no report).
    pub fn blocks_left(&self) -> Option<u64> {
        self.report
            .map(|r| r.inconsistent_blocks.saturating_sub(r.repaired_blocks))
    }
}

/// The operators' requests a report finishes for one PG: a scrub, and whether a deep one.
#[derive(Clone, Copy, Debug, Default)]
struct Finished {
    scrub: bool,
    deep: bool,
}

#[derive(Clone, Debug, Default)]
struct PgScrubTrack {
    status: PgScrubStatus,
    /// The last report of each member that reported as the PG's leader, a report without
    /// scrubs counting as zeros: what a rise is measured from. Only the PG's members are kept,
    /// so it holds at most a few entries.
    seen: BTreeMap<OsdId, PgScrubReport>,
}

/// The scrub reports of PG leaders, per PG. In the leader monitor's memory only (see the
/// module documentation); time is passed in by the caller.
#[derive(Clone, Debug, Default)]
pub struct ScrubStats {
    pgs: BTreeMap<PgId, PgScrubTrack>,
}

impl ScrubStats {
    /// Records the scrub part of a report from `leader`, the PG's leader by the map; `members`
    /// are the PG's members (reports of OSDs outside them are forgotten).
    fn record(
        &mut self,
        pg: PgId,
        leader: OsdId,
        scrub: Option<PgScrubReport>,
        unix_ms: u64,
        members: &BTreeSet<OsdId>,
        finished: Finished,
    ) {
        let track = self.pgs.entry(pg).or_default();
        let now = scrub.unwrap_or_default();
        let (scrubbed, deep_scrubbed) = match track.seen.get(&leader) {
            // The same series: a rise is a scrub finished since the last report.
            Some(before)
                if now.scrubs >= before.scrubs && now.deep_scrubs >= before.deep_scrubs =>
            {
                (
                    now.scrubs > before.scrubs,
                    now.deep_scrubs > before.deep_scrubs,
                )
            }
            // The counts went back: the OSD restarted them (a restart the monitor did not see
            // as a boot), and what it counts now was finished since its last report.
            Some(_) => (now.scrubs > 0, now.deep_scrubs > 0),
            // First heard: a baseline.
            None => (false, false),
        };
        if scrubbed || finished.scrub {
            track.status.last_scrub_unix_ms = Some(unix_ms);
        }
        if deep_scrubbed || finished.deep {
            track.status.last_deep_scrub_unix_ms = Some(unix_ms);
        }
        if scrub.is_some() {
            track.status.report = scrub;
        }
        track.seen.insert(leader, now);
        track
            .seen
            .retain(|osd, _| *osd == leader || members.contains(osd));
    }

    /// What the monitor knows of `pg`'s scrubs (`None`: nothing reported yet).
    pub fn status(&self, pg: PgId) -> Option<&PgScrubStatus> {
        self.pgs.get(&pg).map(|t| &t.status)
    }

    /// The PGs of `state` whose last report leaves blocks inconsistent, with how many, in
    /// PG order.
    pub fn inconsistent(&self, state: &MonState) -> Vec<(PgId, u64)> {
        self.pgs
            .iter()
            .filter(|(pg, _)| state.map.pg(**pg).is_some())
            .filter_map(|(pg, t)| t.status.blocks_left().map(|left| (*pg, left)))
            .filter(|(_, left)| *left > 0)
            .collect()
    }

    /// Forgets `osd`'s counts: it booted, and counts from zero again.
    pub fn forget_osd(&mut self, osd: OsdId) {
        for track in self.pgs.values_mut() {
            track.seen.remove(&osd);
        }
    }

    /// Forgets the PGs of a deleted pool.
    pub fn forget_pool(&mut self, pool: PoolId) {
        self.pgs.retain(|pg, _| pg.pool != pool);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Reporter;
    use fastblock_types::api::{BootRequest, CreatePoolRequest, LeaderElectedRequest};
    use fastblock_types::map::FailureDomain;
    use fastblock_types::{LogIndex, Term};

    /// Runs one operation as the service does: on the state, then `finish`.
    fn op<T>(s: &mut MonState, f: impl FnOnce(&mut MonState) -> T) -> T {
        let before = s.clone();
        let out = f(s);
        s.finish(&before);
        out
    }

    /// Three OSDs and pool `p` (4 PGs of 3 replicas); PG 1.0 led by its first member.
    fn cluster() -> MonState {
        let mut s = MonState::default();
        for i in 0..3u32 {
            let uuid = format!("{i:08x}-0000-4000-8000-{i:012x}");
            let id = op(&mut s, |s| s.apply_id(&uuid)).unwrap();
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
            op(&mut s, |s| s.boot(id, &boot)).unwrap();
        }
        op(&mut s, |s| {
            s.create_pool(&CreatePoolRequest {
                name: "p".into(),
                pg_count: 4,
                size: 3,
                failure_domain: FailureDomain::Osd,
            })
        })
        .unwrap();
        let voters = s.map.pg(pg(0)).unwrap().osdlist.clone();
        let req = LeaderElectedRequest {
            leader: voters[0],
            term: Term(1),
            conf_index: LogIndex(0),
            voters,
            voters_outgoing: Vec::new(),
            learners: Vec::new(),
        };
        op(&mut s, |s| {
            s.leader_elected(pg(0), &req, Reporter::Unauthenticated)
        })
        .unwrap();
        s
    }

    fn pg(seq: u32) -> PgId {
        PgId::new(PoolId(1), seq)
    }

    fn leader(s: &MonState, pg: PgId) -> OsdId {
        s.map.pg(pg).unwrap().leader.expect("the PG has a leader")
    }

    fn not_leader(s: &MonState, pg: PgId) -> OsdId {
        let l = leader(s, pg);
        *s.map
            .pg(pg)
            .unwrap()
            .osdlist
            .iter()
            .find(|o| **o != l)
            .unwrap()
    }

    fn counters(pg: PgId, scrub: Option<PgScrubReport>) -> PgIoCounters {
        PgIoCounters {
            pg: Some(pg),
            scrub,
            ..Default::default()
        }
    }

    fn report(scrubs: u64, deep_scrubs: u64, request_done: u64) -> PgScrubReport {
        PgScrubReport {
            scrubs,
            deep_scrubs,
            request_done,
            last_deep: deep_scrubs > 0,
            ..Default::default()
        }
    }

    /// A heartbeat from `osd` at `unix_ms` carrying `entries`, run as one operation.
    fn heartbeat(
        s: &mut MonState,
        stats: &mut ScrubStats,
        osd: OsdId,
        unix_ms: u64,
        entries: &[PgIoCounters],
    ) -> Vec<ScrubRequest> {
        op(s, |s| s.on_scrub_reports(osd, entries, stats, unix_ms))
    }

    #[test]
    fn a_request_is_recorded_with_a_new_id_and_carried_in_the_map() {
        let mut s = cluster();
        let epoch = s.map.epoch;
        let light = op(&mut s, |s| s.request_scrub(pg(0), false)).unwrap();
        assert_eq!((light.id, light.pg, light.deep), (1, pg(0), false));
        assert!(s.map.epoch > epoch, "a new request is a new epoch");
        assert_eq!(s.map.scrub_requests.get(&1), Some(&light));
        let deep = op(&mut s, |s| s.request_scrub(pg(0), true)).unwrap();
        let other = op(&mut s, |s| s.request_scrub(pg(3), false)).unwrap();
        assert_eq!((deep.id, other.id), (2, 3));
        assert_eq!(s.map.scrub_requests.len(), 3);
        assert_eq!(s.scrubs.next_id, 4);
    }

    #[test]
    fn a_repeat_returns_the_pending_request_and_changes_nothing() {
        let mut s = cluster();
        let first = op(&mut s, |s| s.request_scrub(pg(1), true)).unwrap();
        let before = s.clone();
        let again = op(&mut s, |s| s.request_scrub(pg(1), true)).unwrap();
        assert_eq!(again, first);
        assert_eq!(s, before, "no new id, no new epoch");
    }

    #[test]
    fn a_pg_that_does_not_exist_is_pg_not_found_naming_what_is_missing() {
        let mut s = cluster();
        let before = s.clone();
        let e = op(&mut s, |s| s.request_scrub(pg(4), false)).unwrap_err();
        assert_eq!(e.code, ErrorCode::PgNotFound);
        assert!(e.message.contains("pg 1.4 does not exist"), "{}", e.message);
        assert!(e.message.contains("4 PGs, 1.0 to 1.3"), "{}", e.message);
        let e = op(&mut s, |s| s.request_scrub(PgId::new(PoolId(9), 0), false)).unwrap_err();
        assert_eq!(e.code, ErrorCode::PgNotFound);
        assert!(e.message.contains("no pool has id 9"), "{}", e.message);
        assert_eq!(s, before);
    }

    #[test]
    fn the_leaders_report_drops_the_requests_it_finished() {
        let mut s = cluster();
        let mut stats = ScrubStats::default();
        let light = op(&mut s, |s| s.request_scrub(pg(0), false)).unwrap();
        let other = op(&mut s, |s| s.request_scrub(pg(2), false)).unwrap();
        let deep = op(&mut s, |s| s.request_scrub(pg(0), true)).unwrap();
        let l = leader(&s, pg(0));
        // Without a scrub report nothing is done.
        assert!(heartbeat(&mut s, &mut stats, l, 10, &[counters(pg(0), None)]).is_empty());
        // Done up to the light request: the deep one (a later id) stays, and so does PG
        // 1.2's request although its id is lower than what PG 1.0 reports.
        let epoch = s.map.epoch;
        let dropped = heartbeat(
            &mut s,
            &mut stats,
            l,
            20,
            &[counters(pg(0), Some(report(1, 0, deep.id - 1)))],
        );
        assert_eq!(dropped, vec![light.clone()]);
        assert!(s.map.epoch > epoch);
        assert_eq!(
            s.map.scrub_requests.keys().copied().collect::<Vec<_>>(),
            vec![other.id, deep.id]
        );
        let dropped = heartbeat(
            &mut s,
            &mut stats,
            l,
            30,
            &[counters(pg(0), Some(report(2, 1, deep.id)))],
        );
        assert_eq!(dropped, vec![deep]);
        assert_eq!(
            s.map.scrub_requests.keys().copied().collect::<Vec<_>>(),
            vec![other.id]
        );
        // The same report again changes nothing.
        let before = s.clone();
        let repeat = [counters(pg(0), Some(report(2, 1, 3)))];
        assert!(heartbeat(&mut s, &mut stats, l, 40, &repeat).is_empty());
        assert_eq!(s, before);
        // A new request after that gets a new id, above every one done.
        let next = op(&mut s, |s| s.request_scrub(pg(0), false)).unwrap();
        assert_eq!(next.id, 4);
        assert_ne!(next, light);
    }

    #[test]
    fn a_report_from_an_osd_the_map_does_not_record_as_leader_is_ignored() {
        let mut s = cluster();
        let mut stats = ScrubStats::default();
        op(&mut s, |s| s.request_scrub(pg(0), false)).unwrap();
        op(&mut s, |s| s.request_scrub(pg(1), false)).unwrap();
        let member = not_leader(&s, pg(0));
        let before = s.clone();
        let bad = PgScrubReport {
            inconsistent_blocks: 5,
            ..report(1, 0, 10)
        };
        // A member of PG 1.0 that is not its leader, and PG 1.1, which has none recorded.
        let entries = [counters(pg(0), Some(bad)), counters(pg(1), Some(bad))];
        assert!(heartbeat(&mut s, &mut stats, member, 10, &entries).is_empty());
        assert_eq!(s, before, "the requests stay");
        assert_eq!(stats.status(pg(0)), None, "nothing recorded");
        assert!(stats.inconsistent(&s).is_empty());
        // Entries without a PG id, or for a PG that does not exist, are ignored too.
        let odd = [counters(pg(9), Some(bad)), PgIoCounters::default()];
        let l = leader(&s, pg(0));
        assert!(heartbeat(&mut s, &mut stats, l, 20, &odd).is_empty());
        assert_eq!(s, before);
    }

    #[test]
    fn last_scrub_times_are_when_the_leaders_counts_rose() {
        let mut s = cluster();
        let mut stats = ScrubStats::default();
        let l = leader(&s, pg(0));
        let at = |s: &mut MonState, stats: &mut ScrubStats, ms, scrub| {
            heartbeat(s, stats, l, ms, &[counters(pg(0), scrub)]);
            *stats.status(pg(0)).unwrap()
        };
        // The first report is a baseline, even one that counts scrubs already: when they
        // happened is unknown.
        let st = at(&mut s, &mut stats, 100, Some(report(3, 1, 0)));
        assert_eq!(
            (st.last_scrub_unix_ms, st.last_deep_scrub_unix_ms),
            (None, None)
        );
        assert_eq!(st.report, Some(report(3, 1, 0)));
        let st = at(&mut s, &mut stats, 200, Some(report(4, 1, 0)));
        assert_eq!(
            (st.last_scrub_unix_ms, st.last_deep_scrub_unix_ms),
            (Some(200), None)
        );
        let st = at(&mut s, &mut stats, 300, Some(report(5, 2, 0)));
        assert_eq!(
            (st.last_scrub_unix_ms, st.last_deep_scrub_unix_ms),
            (Some(300), Some(300))
        );
        let st = at(&mut s, &mut stats, 400, Some(report(5, 2, 0)));
        assert_eq!(st.last_scrub_unix_ms, Some(300), "no rise, no new time");
        // A report without scrubs keeps the last report.
        let st = at(&mut s, &mut stats, 450, None);
        assert_eq!(st.report, Some(report(5, 2, 0)));
        // Counts that went back (a restart) count from zero.
        let st = at(&mut s, &mut stats, 500, Some(report(1, 0, 0)));
        assert_eq!(
            (st.last_scrub_unix_ms, st.last_deep_scrub_unix_ms),
            (Some(500), Some(300))
        );
        // After a boot the OSD's next report is a baseline again.
        stats.forget_osd(l);
        let st = at(&mut s, &mut stats, 600, Some(report(2, 0, 0)));
        assert_eq!(st.last_scrub_unix_ms, Some(500));
    }

    /// The leader's first report comes after the scrub an operator asked for ended (its counts
    /// are a baseline then): finishing the request gives the PG its times all the same.
    #[test]
    fn a_request_finished_in_the_first_report_heard_gets_a_time() {
        let mut s = cluster();
        let mut stats = ScrubStats::default();
        let l = leader(&s, pg(0));
        let light = op(&mut s, |s| s.request_scrub(pg(0), false)).unwrap();
        let first = [counters(pg(0), Some(report(1, 0, light.id)))];
        assert_eq!(heartbeat(&mut s, &mut stats, l, 300, &first), vec![light]);
        let st = stats.status(pg(0)).unwrap();
        assert_eq!(
            (st.last_scrub_unix_ms, st.last_deep_scrub_unix_ms),
            (Some(300), None)
        );
        // The same report again finishes nothing: no new time.
        heartbeat(&mut s, &mut stats, l, 400, &first);
        assert_eq!(stats.status(pg(0)).unwrap().last_scrub_unix_ms, Some(300));
        // A deep request, finished in the first report a monitor that just took over hears.
        let deep = op(&mut s, |s| s.request_scrub(pg(0), true)).unwrap();
        let mut fresh = ScrubStats::default();
        let first = [counters(pg(0), Some(report(2, 1, deep.id)))];
        assert_eq!(heartbeat(&mut s, &mut fresh, l, 500, &first), vec![deep]);
        let st = fresh.status(pg(0)).unwrap();
        assert_eq!(
            (st.last_scrub_unix_ms, st.last_deep_scrub_unix_ms),
            (Some(500), Some(500))
        );
    }

    #[test]
    fn a_pg_first_heard_without_scrubs_then_scrubbed_gets_a_time() {
        let mut s = cluster();
        let mut stats = ScrubStats::default();
        let l = leader(&s, pg(0));
        heartbeat(&mut s, &mut stats, l, 100, &[counters(pg(0), None)]);
        assert_eq!(stats.status(pg(0)).unwrap().report, None);
        heartbeat(
            &mut s,
            &mut stats,
            l,
            200,
            &[counters(pg(0), Some(report(1, 1, 0)))],
        );
        let st = stats.status(pg(0)).unwrap();
        assert_eq!(
            (st.last_scrub_unix_ms, st.last_deep_scrub_unix_ms),
            (Some(200), Some(200))
        );
    }

    #[test]
    fn pg_inconsistent_is_raised_while_blocks_are_left_and_cleared_by_a_later_report() {
        let mut s = cluster();
        let mut stats = ScrubStats::default();
        let l = leader(&s, pg(0));
        let health = |s: &MonState, stats: &ScrubStats| {
            let mut h = crate::health::health(s, &[]);
            h.add_pg_inconsistent(&stats.inconsistent(s));
            h
        };
        let found = PgScrubReport {
            inconsistent_blocks: 7,
            repaired_blocks: 4,
            ..report(1, 1, 0)
        };
        heartbeat(&mut s, &mut stats, l, 100, &[counters(pg(0), Some(found))]);
        assert_eq!(stats.inconsistent(&s), vec![(pg(0), 3)]);
        let h = health(&s, &stats);
        assert_eq!(h.status, "HEALTH_ERR");
        let check = h
            .checks
            .iter()
            .find(|c| c.code == "PG_INCONSISTENT")
            .expect("the check is raised")
            .to_string();
        assert!(check.contains("1 pg"), "{check}");
        assert!(check.contains("pg 1.0 (3 blocks left)"), "{check}");
        // Everything repaired: nothing left.
        let repaired = PgScrubReport {
            inconsistent_blocks: 7,
            repaired_blocks: 7,
            ..report(1, 1, 0)
        };
        heartbeat(
            &mut s,
            &mut stats,
            l,
            200,
            &[counters(pg(0), Some(repaired))],
        );
        assert!(stats.inconsistent(&s).is_empty());
        // Again, and then a later scrub that finds nothing clears it.
        heartbeat(&mut s, &mut stats, l, 300, &[counters(pg(0), Some(found))]);
        assert!(health(&s, &stats)
            .checks
            .iter()
            .any(|c| c.code == "PG_INCONSISTENT"));
        heartbeat(
            &mut s,
            &mut stats,
            l,
            400,
            &[counters(pg(0), Some(report(2, 1, 0)))],
        );
        let h = health(&s, &stats);
        assert!(
            !h.checks.iter().any(|c| c.code == "PG_INCONSISTENT"),
            "{h:?}"
        );
        // A report without scrubs (a new leader that has not scrubbed yet) clears nothing.
        heartbeat(&mut s, &mut stats, l, 500, &[counters(pg(0), Some(found))]);
        heartbeat(&mut s, &mut stats, l, 600, &[counters(pg(0), None)]);
        assert_eq!(stats.inconsistent(&s), vec![(pg(0), 3)]);
        // A deleted pool's PGs are no longer named.
        op(&mut s, |s| s.delete_pool("p", true)).unwrap();
        assert!(stats.inconsistent(&s).is_empty());
    }

    #[test]
    fn a_deleted_pool_takes_its_requests_and_a_damaged_one_is_fenced() {
        let mut s = cluster();
        op(&mut s, |s| s.request_scrub(pg(0), false)).unwrap();
        op(&mut s, |s| s.delete_pool("p", true)).unwrap();
        assert!(s.scrubs.requests.is_empty());
        assert!(s.map.scrub_requests.is_empty());
        assert_eq!(s.scrubs.next_id, 2, "ids are not reused");

        let mut s = cluster();
        op(&mut s, |s| s.request_scrub(pg(0), false)).unwrap();
        let l = leader(&s, pg(0));
        // Damage the pool as a hand edit in etcd could: a PG naming an OSD that does not exist.
        s.map
            .pgmaps
            .get_mut(&PoolId(1))
            .unwrap()
            .pgs
            .get_mut(&1)
            .unwrap()
            .osdlist[0] = OsdId(99);
        s.refresh_damage();
        let e = s.request_scrub(pg(0), true).unwrap_err();
        assert_eq!(e.code, ErrorCode::PoolDamaged);
        let mut stats = ScrubStats::default();
        let dropped =
            s.on_scrub_reports(l, &[counters(pg(0), Some(report(1, 0, 1)))], &mut stats, 5);
        assert!(dropped.is_empty());
        assert_eq!(s.scrubs.requests.len(), 1);
    }

    #[test]
    fn validate_refuses_ids_at_or_beyond_the_counter() {
        let mut s = cluster();
        op(&mut s, |s| s.request_scrub(pg(0), false)).unwrap();
        assert!(s.validate().is_ok());
        s.scrubs.next_id = 1;
        let e = s.validate().unwrap_err();
        assert!(e.contains("scrub request id 1 not in 1..1"), "{e}");
    }
}

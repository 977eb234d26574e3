//! The OSDs' op tracker reports, from their heartbeats: what `GET /v1/osds/{id}/ops` serves
//! and what `SLOW_OPS` is raised from (`docs/operations.md`, "Slow ops"). Kept in memory
//! only: a new leader monitor has them again after one heartbeat.

use fastblock_types::api::{OsdOps, OsdOpsResponse};
use fastblock_types::map::ClusterMap;
use fastblock_types::OsdId;
use std::collections::BTreeMap;

#[derive(Clone, Debug, Default)]
pub struct OpReports {
    /// Per OSD: when its last report arrived (monitor ms) and the report.
    osds: BTreeMap<OsdId, (u64, OsdOps)>,
}

impl OpReports {
    /// The report of a heartbeat, cut to the bounds an OSD keeps; a heartbeat without one
    /// forgets the last.
    pub fn record(&mut self, osd: OsdId, now_ms: u64, ops: Option<OsdOps>) {
        match ops {
            Some(ops) => {
                self.osds.insert(osd, (now_ms, ops.bounded()));
            }
            None => {
                self.osds.remove(&osd);
            }
        }
    }

    pub fn forget(&mut self, osd: OsdId) {
        self.osds.remove(&osd);
    }

    /// The last report of `osd`, with its age.
    pub fn of(&self, osd: OsdId, now_ms: u64) -> Option<OsdOpsResponse> {
        let (at, ops) = self.osds.get(&osd)?;
        Some(OsdOpsResponse {
            osd,
            report_age_ms: now_ms.saturating_sub(*at),
            ops: ops.clone(),
        })
    }

    /// The reports with slow ops of the OSDs that are up, received within `fresh_ms`
    /// (`SLOW_OPS`). The caller passes the monitor's `--osd-down-after`: an OSD that
    /// heartbeats at all does so more often than that (or it is marked down), however long
    /// its heartbeat interval, so its report does not flap out between two heartbeats; a
    /// report older than that is of an OSD whose being down is `OSD_DOWN`'s to say, even
    /// before the monitor's liveness check marks it down.
    pub fn slow(&self, map: &ClusterMap, now_ms: u64, fresh_ms: u64) -> BTreeMap<OsdId, OsdOps> {
        self.osds
            .iter()
            .filter(|(id, (at, ops))| {
                ops.slow > 0
                    && now_ms.saturating_sub(*at) <= fresh_ms
                    && map.osds.get(id).is_some_and(|o| o.up)
            })
            .map(|(id, (_, ops))| (*id, ops.clone()))
            .collect()
    }
}

#[cfg(test)]
#[path = "op_reports_tests.rs"]
mod tests;

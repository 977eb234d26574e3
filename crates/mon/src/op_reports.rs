//! The OSDs' op tracker reports, from their heartbeats: what `GET /v1/osds/{id}/ops` serves
//! and what `SLOW_OPS` is raised from (`docs/operations.md`, "Slow ops"). Kept in memory
//! only: a new leader monitor has them again after one heartbeat.

use fastblock_types::api::{OsdOps, OsdOpsResponse};
use fastblock_types::map::ClusterMap;
use fastblock_types::OsdId;
use std::collections::BTreeMap;

/// A report older than this no longer raises `SLOW_OPS` (the OSD stopped heartbeating; its
/// being down is `OSD_DOWN`'s to say).
pub const REPORT_FRESH_MS: u64 = 5_000;

#[derive(Clone, Debug, Default)]
pub struct OpReports {
    /// Per OSD: when its last report arrived (monitor ms) and the report.
    osds: BTreeMap<OsdId, (u64, OsdOps)>,
}

impl OpReports {
    /// The report of a heartbeat; a heartbeat without one forgets the last.
    pub fn record(&mut self, osd: OsdId, now_ms: u64, ops: Option<OsdOps>) {
        match ops {
            Some(ops) => {
                self.osds.insert(osd, (now_ms, ops));
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

    /// The fresh reports of the OSDs that are up and have slow ops (`SLOW_OPS`).
    pub fn slow(&self, map: &ClusterMap, now_ms: u64) -> BTreeMap<OsdId, OsdOps> {
        self.osds
            .iter()
            .filter(|(id, (at, ops))| {
                ops.slow > 0
                    && now_ms.saturating_sub(*at) <= REPORT_FRESH_MS
                    && map.osds.get(id).is_some_and(|o| o.up)
            })
            .map(|(id, (_, ops))| (*id, ops.clone()))
            .collect()
    }
}

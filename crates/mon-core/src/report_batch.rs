//! An OSD's reports in one batch (`POST /v1/osds/{id}/reports`): each applied as its own call
//! would be, all in one operation, so that the leaders' reports after an event cost the
//! monitor a few epochs, not one per PG.
//!
//! Every report operation checks before it changes anything, so a refused report leaves the
//! state as it was and the others of the batch go on (asserted in debug builds).

use crate::report_checks::check_confirmer;
use crate::{MonState, OpResult, Reporter};
use fastblock_types::api::{ApiError, OsdReport};
use fastblock_types::PgId;
use fastblock_types::SnapId;

impl MonState {
    /// One report, as its single-report call would apply it.
    pub fn apply_report(&mut self, reporter: Reporter, report: &OsdReport) -> OpResult<()> {
        #[cfg(debug_assertions)]
        let before = self.clone();
        let result = match report {
            OsdReport::LeaderElected { pg, req } => {
                self.leader_elected(*pg, req, reporter).map(drop)
            }
            OsdReport::MembershipFinished { pg, req } => {
                self.membership_finished(*pg, req, reporter).map(drop)
            }
            OsdReport::ReclaimDone { pg, id } => self
                .check_confirmation(reporter, *pg)
                .and_then(|()| self.reclaim_pg_done(*id, *pg))
                .map(drop),
            OsdReport::SnapMarked { pg, image, snap } => self
                .check_confirmation(reporter, *pg)
                .and_then(|()| self.snap_pg_done(*image, SnapId(*snap), *pg))
                .map(drop),
            OsdReport::SnapTrimmed { pg, id } => self
                .check_confirmation(reporter, *pg)
                .and_then(|()| self.snap_trim_pg_done(*id, *pg))
                .map(drop),
        };
        #[cfg(debug_assertions)]
        if result.is_err() {
            debug_assert!(
                *self == before,
                "a refused report changed the state: {report:?}"
            );
        }
        result
    }

    /// A reclaim, snapshot-mark or snapshot-trim confirmation for `pg` must come from an OSD
    /// the PG names (`report_checks::check_confirmer`). A PG or pool that does not exist is
    /// left to the confirmation itself, which says so.
    pub fn check_confirmation(&self, reporter: Reporter, pg: PgId) -> OpResult<()> {
        match self
            .map
            .pgmaps
            .get(&pg.pool)
            .and_then(|m| m.pgs.get(&pg.seq))
        {
            Some(info) => check_confirmer(pg, info, reporter),
            None => Ok(()),
        }
    }

    /// Every report of a batch, in order; one result each (`None`: taken).
    pub fn apply_reports(
        &mut self,
        reporter: Reporter,
        reports: &[OsdReport],
    ) -> Vec<Option<ApiError>> {
        reports
            .iter()
            .map(|r| self.apply_report(reporter, r).err())
            .collect()
    }
}

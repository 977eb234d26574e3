//! An OSD's heartbeat, in two parts: what it says about the OSD that changes nothing (its
//! liveness, IO, space and scrub reports, kept beside the state), and what changes the state
//! (an OSD seen up again, one that became full or stopped being, the operators' scrub
//! requests its PGs finished). A thousand OSDs heartbeat every second; the first part costs
//! the monitor no copy of its state, the second runs only when there is something to change.

use crate::{err, MonState, OpResult};
use fastblock_types::api::{ErrorCode, HeartbeatRequest};
use fastblock_types::map::ScrubRequest;
use fastblock_types::OsdId;

impl MonState {
    /// Whether `id` may heartbeat: it exists (a purged one is told so), has this uuid and has
    /// booted.
    pub fn check_heartbeat(&self, id: OsdId, req: &HeartbeatRequest) -> OpResult<()> {
        let Some(osd) = self.map.osds.get(&id) else {
            return Err(self.missing_osd_error(id));
        };
        if !osd.uuid.eq_ignore_ascii_case(&req.uuid) {
            return err(ErrorCode::UuidMismatch, format!("osd {id}: uuid mismatch"));
        }
        if osd.pending_create {
            return err(
                ErrorCode::InvalidArgument,
                format!("osd {id} must boot first"),
            );
        }
        Ok(())
    }

    /// Whether [`MonState::apply_heartbeat`] would change anything.
    pub fn heartbeat_changes(&self, id: OsdId, req: &HeartbeatRequest) -> bool {
        let Some(osd) = self.map.osds.get(&id) else {
            return false;
        };
        !osd.up
            || req
                .space
                .is_some_and(|space| self.space_report_changes(id, space))
            || !self.finished_scrub_requests(id, &req.pgs).is_empty()
    }

    /// The state's part of a heartbeat: the OSD up, its fullness, the scrub requests its PGs
    /// finished (returned).
    pub fn apply_heartbeat(
        &mut self,
        id: OsdId,
        req: &HeartbeatRequest,
    ) -> OpResult<Vec<ScrubRequest>> {
        self.check_heartbeat(id, req)?;
        if !self.map.osds[&id].up {
            self.mark_up(id)?;
        }
        if let Some(space) = req.space {
            self.record_osd_space(id, space);
        }
        let finished = self.finished_scrub_requests(id, &req.pgs);
        Ok(finished
            .into_iter()
            .map(|r| self.scrubs.requests.remove(&r).expect("listed as finished"))
            .collect())
    }
}

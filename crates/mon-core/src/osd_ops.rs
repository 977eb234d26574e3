//! OSD lifecycle: apply-id, boot, down/up, out/in, and the cluster flags.
//!
//! Every function changes `self` only; the caller calls [`MonState::finish`] afterwards (the
//! `apply` wrappers in the service do) so that PG states, versions and the epoch follow.

use crate::state::MonState;
use crate::{err, OpResult};
use fastblock_types::api::{BootRequest, ErrorCode};
use fastblock_types::lease::{LeaseTiming, CLOCK_RATE_MARGIN_PERCENT};
use fastblock_types::map::OsdInfo;
use fastblock_types::{Epoch, OsdId};
use std::net::IpAddr;

/// Cluster flags settable by operators (defined beside the map's [`fastblock_types::map::Flags`],
/// so that the CLI refuses an unknown one as the monitor does).
pub use fastblock_types::map::Flag;

/// Accepts the canonical textual UUID form (8-4-4-4-12 hex digits).
pub fn is_valid_uuid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, len)| g.len() == len && g.chars().all(|c| c.is_ascii_hexdigit()))
}

impl MonState {
    fn osd_mut(&mut self, id: OsdId) -> OpResult<&mut OsdInfo> {
        if !self.map.osds.contains_key(&id) {
            return Err(self.missing_osd_error(id));
        }
        Ok(std::sync::Arc::make_mut(&mut self.map.osds)
            .get_mut(&id)
            .expect("checked above"))
    }

    /// Registers a new OSD by its uuid and returns its id (never reused).
    pub fn apply_id(&mut self, uuid: &str) -> OpResult<OsdId> {
        if !is_valid_uuid(uuid) {
            return err(ErrorCode::InvalidArgument, format!("invalid uuid {uuid:?}"));
        }
        let uuid = uuid.to_ascii_lowercase();
        if let Some(existing) = self.map.osds.values().find(|o| o.uuid == uuid) {
            return err(
                ErrorCode::UuidExists,
                format!("uuid {uuid} already belongs to osd {}", existing.id),
            );
        }
        let id = OsdId(self.counters.next_osd_id);
        self.counters.next_osd_id += 1;
        std::sync::Arc::make_mut(&mut self.map.osds).insert(
            id,
            OsdInfo {
                id,
                uuid,
                host: String::new(),
                address: String::new(),
                port: 0,
                shards: 1,
                capacity_bytes: 0,
                up: false,
                is_in: false,
                pending_create: true,
                boot_epoch: Epoch(0),
                config: String::new(),
                lease_timing: None,
            },
        );
        Ok(id)
    }

    /// An OSD (re)starts: it becomes up and in. A restart of an OSD still marked up is a new
    /// incarnation, not an error, so that a crashed OSD can rejoin before its down timer fires.
    pub fn boot(&mut self, id: OsdId, req: &BootRequest) -> OpResult<()> {
        if req.address.parse::<IpAddr>().is_err() {
            return err(
                ErrorCode::InvalidArgument,
                format!("boot address {:?} is not an IP address", req.address),
            );
        }
        if req.port == 0 {
            return err(ErrorCode::InvalidArgument, "boot port must not be 0");
        }
        if req.shards == 0 || req.shards > 256 || u32::from(req.port) + req.shards > 65536 {
            return err(
                ErrorCode::InvalidArgument,
                format!(
                    "boot shards {} must be 1..=256 with ports fitting below 65536",
                    req.shards
                ),
            );
        }
        if req.host.is_empty() {
            return err(
                ErrorCode::InvalidArgument,
                "boot host name must not be empty",
            );
        }
        let epoch = self.next_epoch();
        let osd = self.osd_mut(id)?;
        if !osd.uuid.eq_ignore_ascii_case(&req.uuid) {
            return err(
                ErrorCode::UuidMismatch,
                format!(
                    "osd {id} was applied with uuid {}, but booted with {}",
                    osd.uuid, req.uuid
                ),
            );
        }
        self.check_lease_timing(id, req.lease_timing)?;
        let osd = self.osd_mut(id)?;
        let was_in = osd.is_in;
        osd.address = req.address.clone();
        osd.port = req.port;
        osd.shards = req.shards;
        osd.host = req.host.clone();
        osd.capacity_bytes = req.capacity_bytes;
        osd.config = req.config.clone();
        osd.lease_timing = req.lease_timing;
        osd.up = true;
        osd.is_in = true;
        osd.pending_create = false;
        osd.boot_epoch = epoch;
        self.after_osd_available(id, !was_in);
        Ok(())
    }

    /// Refuses the boot of `id` if its lease timing does not fit every other OSD's, both ways
    /// (`fastblock_types::lease`): PGs move between any OSDs. Every recorded OSD counts, down
    /// and out ones too: an OSD marked down may still be running and serving its PGs (cut off
    /// from the monitor, not from its peers), and its next heartbeat brings it up again without
    /// a boot. Its own record does not count (it restarts with new settings). An OSD that
    /// reported no timing (a build from before this check) is not compared, and neither is a
    /// boot that reports none.
    fn check_lease_timing(&self, id: OsdId, timing: Option<LeaseTiming>) -> OpResult<()> {
        let Some(mine) = timing else {
            return Ok(());
        };
        if let Err(e) = mine.validate() {
            return err(
                ErrorCode::InvalidArgument,
                format!("osd {id} boots with an invalid lease timing: {e}"),
            );
        }
        for other in self.map.osds.values().filter(|o| o.id != id) {
            let Some(theirs) = other.lease_timing else {
                continue;
            };
            let (leader, member, conflict) = match mine.lease_fits(&theirs) {
                Err(c) => (id, other.id, c),
                Ok(()) => match theirs.lease_fits(&mine) {
                    Err(c) => (other.id, id, c),
                    Ok(()) => continue,
                },
            };
            return err(
                ErrorCode::IncompatibleConfig,
                format!(
                    "osd {id} ({mine}) cannot serve PGs with osd {} ({theirs}): a leader on osd \
                     {leader} would answer reads under a lease of {} ms, but osd {member} may \
                     vote for another leader {} ms after hearing from it (a lease must stay \
                     {CLOCK_RATE_MARGIN_PERCENT}% below that); start osd {id} with settings that \
                     fit (docs/design/osd.md, \"Reads\")",
                    other.id, conflict.lease_ms, conflict.window_ms
                ),
            );
        }
        Ok(())
    }

    /// The liveness tracker saw no heartbeat for `osd_down_after`.
    pub fn mark_down(&mut self, id: OsdId) -> OpResult<()> {
        let osd = self.osd_mut(id)?;
        osd.up = false;
        Ok(())
    }

    /// A heartbeat arrived from an OSD marked down (for example after a partition healed).
    pub fn mark_up(&mut self, id: OsdId) -> OpResult<()> {
        let osd = self.osd_mut(id)?;
        if osd.pending_create {
            return err(ErrorCode::InvalidArgument, format!("osd {id} never booted"));
        }
        osd.up = true;
        self.after_osd_available(id, false);
        Ok(())
    }

    /// Out (manual, or automatic after `osd_out_after`): the OSD's PGs get a replacement member.
    /// Idempotent.
    pub fn mark_out(&mut self, id: OsdId) -> OpResult<()> {
        let osd = self.osd_mut(id)?;
        if !osd.is_in {
            return Ok(());
        }
        osd.is_in = false;
        self.repair_all();
        Ok(())
    }

    /// The liveness events of one tick, in one pass: every OSD marked down, up or out, then
    /// one repair of every pool for all of them (a host of 20 OSDs going out is one repair, not
    /// twenty). The same outcome as the events one by one, since repair only fills the slots
    /// of OSDs that are not placement targets from those that are.
    pub fn apply_liveness(&mut self, events: &[crate::liveness::LivenessEvent]) -> OpResult<()> {
        use crate::liveness::LivenessEvent;
        let mut repair = false;
        for event in events {
            match *event {
                LivenessEvent::Down(id) => self.mark_down(id)?,
                LivenessEvent::Up(id) => {
                    let osd = self.osd_mut(id)?;
                    if osd.pending_create {
                        return err(ErrorCode::InvalidArgument, format!("osd {id} never booted"));
                    }
                    osd.up = true;
                    repair = true;
                }
                LivenessEvent::Out(id) => {
                    let osd = self.osd_mut(id)?;
                    repair |= osd.is_in;
                    osd.is_in = false;
                }
            }
        }
        if repair {
            self.repair_all();
        }
        Ok(())
    }

    /// Manual in. Refused while the OSD is down: it would be a placement target that cannot
    /// take data.
    pub fn mark_in(&mut self, id: OsdId) -> OpResult<()> {
        let osd = self.osd_mut(id)?;
        if osd.pending_create {
            return err(ErrorCode::OsdDown, format!("osd {id} has never booted"));
        }
        if !osd.up {
            return err(
                ErrorCode::OsdDown,
                format!("osd {id} is down; start it first"),
            );
        }
        if osd.is_in {
            return Ok(());
        }
        osd.is_in = true;
        self.after_osd_available(id, true);
        Ok(())
    }

    /// After an OSD came up or in: fill PG slots that had no candidate, and on in, cancel the
    /// remaps its out caused if they are no longer needed and rebalance unless `norebalance`
    /// defers it.
    fn after_osd_available(&mut self, id: OsdId, came_in: bool) {
        if came_in {
            self.cancel_unneeded_remaps_for(id);
        }
        self.repair_all();
        if came_in {
            if self.map.flags.norebalance {
                self.pending.rebalance_deferred = true;
            } else {
                self.rebalance_all();
            }
        }
    }

    pub fn set_flag(&mut self, flag: Flag, value: bool) {
        match flag {
            Flag::NoOut => self.map.flags.noout = value,
            Flag::NoRebalance => {
                self.map.flags.norebalance = value;
                if !value && self.pending.rebalance_deferred {
                    self.pending.rebalance_deferred = false;
                    self.rebalance_all();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_validation() {
        assert!(is_valid_uuid("0b6b3c2e-7d2f-4c59-9a55-8c2f1a1e2b3c"));
        assert!(!is_valid_uuid("0b6b3c2e7d2f4c599a558c2f1a1e2b3c"));
        assert!(!is_valid_uuid("zb6b3c2e-7d2f-4c59-9a55-8c2f1a1e2b3c"));
        assert!(!is_valid_uuid(""));
    }

    #[test]
    fn flags_parse_both_spellings() {
        assert_eq!("noout".parse::<Flag>(), Ok(Flag::NoOut));
        assert_eq!("noReblance".parse::<Flag>(), Ok(Flag::NoRebalance));
        assert_eq!("norebalance".parse::<Flag>(), Ok(Flag::NoRebalance));
        assert!("nodown".parse::<Flag>().is_err());
    }
}

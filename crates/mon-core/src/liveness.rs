//! Turns heartbeat silence into down and out decisions. Time is passed in by the caller as
//! milliseconds on a monotonic clock, so the simulator can drive it with virtual time.
//!
//! Not persisted: a new monitor leader starts every up OSD's timer afresh, which can only delay
//! a down by one `osd_down_after`, never cause a false one.

use crate::state::MonState;
use fastblock_types::OsdId;
use std::collections::BTreeMap;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LivenessConfig {
    /// Up → down after this long without a heartbeat.
    pub osd_down_after_ms: u64,
    /// Down → out after this much further time, unless `noout`.
    pub osd_out_after_ms: u64,
}

impl Default for LivenessConfig {
    fn default() -> Self {
        LivenessConfig {
            osd_down_after_ms: 10_000,
            osd_out_after_ms: 30_000,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LivenessEvent {
    Down(OsdId),
    Up(OsdId),
    Out(OsdId),
}

#[derive(Clone, Debug, Default)]
pub struct Liveness {
    config: LivenessConfig,
    last_heartbeat_ms: BTreeMap<OsdId, u64>,
    down_since_ms: BTreeMap<OsdId, u64>,
}

impl Liveness {
    pub fn new(config: LivenessConfig) -> Self {
        Liveness {
            config,
            ..Default::default()
        }
    }

    pub fn config(&self) -> LivenessConfig {
        self.config
    }

    /// Records a heartbeat (or a boot).
    pub fn heartbeat(&mut self, osd: OsdId, now_ms: u64) {
        self.last_heartbeat_ms.insert(osd, now_ms);
        self.down_since_ms.remove(&osd);
    }

    /// Drops what is known of a purged OSD.
    pub fn forget(&mut self, osd: OsdId) {
        self.last_heartbeat_ms.remove(&osd);
        self.down_since_ms.remove(&osd);
    }

    /// The decisions due at `now_ms`, in OSD order. Each event is returned once per condition:
    /// the caller applies it to the state, which changes what the next tick sees.
    pub fn tick(&mut self, state: &MonState, now_ms: u64) -> Vec<LivenessEvent> {
        let mut events = Vec::new();
        for osd in state.map.osds.values() {
            if osd.pending_create {
                continue;
            }
            if osd.up {
                // An up OSD never heard from by this monitor gets a full grace period.
                let last = *self.last_heartbeat_ms.entry(osd.id).or_insert(now_ms);
                if now_ms.saturating_sub(last) >= self.config.osd_down_after_ms {
                    events.push(LivenessEvent::Down(osd.id));
                    self.down_since_ms.insert(osd.id, now_ms);
                }
                continue;
            }
            if let Some(last) = self.last_heartbeat_ms.get(&osd.id) {
                if now_ms.saturating_sub(*last) < self.config.osd_down_after_ms {
                    // Heard from recently while marked down: it is back (a healed partition).
                    events.push(LivenessEvent::Up(osd.id));
                    continue;
                }
            }
            let down_since = *self.down_since_ms.entry(osd.id).or_insert(now_ms);
            let down_ms = now_ms.saturating_sub(down_since);
            if osd.is_in && !state.map.flags.noout && down_ms >= self.config.osd_out_after_ms {
                events.push(LivenessEvent::Out(osd.id));
            }
        }
        events
    }
}

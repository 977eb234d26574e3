//! The config relay: `POST /v1/osds/{id}/config` hands an administrator's `config show|get|set`
//! to an OSD in its next heartbeat answer and takes the OSD's reply from the heartbeat after
//! (docs/mon-api.md). The monitor opens no connection to OSDs; they call it every heartbeat
//! interval, so that is the way in.
//!
//! Calls are held in this monitor's memory only: a new leader starts with none, and a caller
//! whose call was lost that way gets `osd_timed_out`. Each OSD has at most
//! [`CALLS_PENDING_PER_OSD_MAX`] calls queued or awaiting their reply.

use fastblock_types::api::{OsdConfigCall, OsdConfigReply};
use fastblock_types::daemon_config::{AdminReply, AdminRequest};
use fastblock_types::OsdId;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

/// Config calls one OSD may have pending (queued for its next heartbeat or sent and not yet
/// answered). Administrators make them one at a time; the bound keeps a runaway script from
/// growing the monitor's memory or the heartbeat answers.
pub const CALLS_PENDING_PER_OSD_MAX: usize = 8;

#[derive(Default)]
struct Pending {
    /// Not yet sent to the OSD, in the order made.
    queued: Vec<OsdConfigCall>,
    /// Every pending call's waiting caller, sent or not.
    waiting: HashMap<u64, oneshot::Sender<AdminReply>>,
}

pub struct ConfigRelay {
    next_id: AtomicU64,
    osds: Mutex<BTreeMap<OsdId, Pending>>,
}

impl Default for ConfigRelay {
    /// Ids start at a random point, not 0: an OSD may answer a call of the previous leader
    /// to the next one, which must not take it for one of its own (two monitors' ranges of a
    /// few calls each meet with a chance of about 2^-60).
    fn default() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let seed = nanos ^ (u64::from(std::process::id()) << 32);
        let start = fastblock_types::rng::SplitMix64::new(seed).next_u64();
        ConfigRelay {
            next_id: AtomicU64::new(start),
            osds: Mutex::new(BTreeMap::new()),
        }
    }
}

/// Full: the OSD already has [`CALLS_PENDING_PER_OSD_MAX`] calls pending.
#[derive(Debug, PartialEq, Eq)]
pub struct Full;

/// A caller's pending call: await [`Call::reply`]. Dropping it (the answer came, the wait ran
/// out, the HTTP caller went away) forgets the call, so nothing outlives its caller.
pub struct Call {
    relay: Arc<ConfigRelay>,
    osd: OsdId,
    id: u64,
    pub reply: oneshot::Receiver<AdminReply>,
}

impl Drop for Call {
    fn drop(&mut self) {
        let mut osds = self.relay.lock();
        if let Some(p) = osds.get_mut(&self.osd) {
            p.queued.retain(|c| c.id != self.id);
            p.waiting.remove(&self.id);
            if p.queued.is_empty() && p.waiting.is_empty() {
                osds.remove(&self.osd);
            }
        }
    }
}

impl ConfigRelay {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<OsdId, Pending>> {
        // Nothing panics while holding it; a poisoned map is still consistent.
        self.osds.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `request` for `osd`'s next heartbeat.
    pub fn submit(self: &Arc<Self>, osd: OsdId, request: AdminRequest) -> Result<Call, Full> {
        let mut osds = self.lock();
        let pending = osds.entry(osd).or_default();
        if pending.waiting.len() >= CALLS_PENDING_PER_OSD_MAX {
            return Err(Full);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        pending.queued.push(OsdConfigCall { id, request });
        pending.waiting.insert(id, tx);
        Ok(Call {
            relay: self.clone(),
            osd,
            id,
            reply: rx,
        })
    }

    /// One heartbeat of `osd`: hands its replies to their callers (a reply whose caller is gone
    /// is dropped) and returns the calls to send it now.
    pub fn exchange(&self, osd: OsdId, replies: Vec<OsdConfigReply>) -> Vec<OsdConfigCall> {
        let mut osds = self.lock();
        let Some(pending) = osds.get_mut(&osd) else {
            return Vec::new();
        };
        for r in replies {
            if let Some(caller) = pending.waiting.remove(&r.id) {
                let _ = caller.send(r.reply);
            }
        }
        std::mem::take(&mut pending.queued)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(value: &str) -> AdminRequest {
        AdminRequest::Set {
            key: "log_level".into(),
            value: value.into(),
        }
    }

    fn answer(id: u64) -> OsdConfigReply {
        OsdConfigReply {
            id,
            reply: AdminReply::refused(format!("reply {id}")),
        }
    }

    #[tokio::test]
    async fn a_call_goes_out_once_and_its_reply_reaches_its_caller() {
        let relay = Arc::new(ConfigRelay::default());
        let osd = OsdId(3);
        let mut call = relay.submit(osd, set("debug")).unwrap();
        assert!(relay.exchange(OsdId(4), Vec::new()).is_empty());
        let sent = relay.exchange(osd, Vec::new());
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].request, set("debug"));
        // Sent once: the next heartbeat carries nothing new.
        assert!(relay.exchange(osd, Vec::new()).is_empty());
        relay.exchange(osd, vec![answer(sent[0].id + 1000), answer(sent[0].id)]);
        let reply = (&mut call.reply).await.unwrap();
        assert_eq!(
            reply.error.as_deref(),
            Some(&*format!("reply {}", sent[0].id))
        );
    }

    #[test]
    fn calls_are_bounded_per_osd_and_freed_by_their_callers() {
        let relay = Arc::new(ConfigRelay::default());
        let mut calls: Vec<Call> = (0..CALLS_PENDING_PER_OSD_MAX)
            .map(|_| relay.submit(OsdId(1), AdminRequest::Show).unwrap())
            .collect();
        assert!(matches!(
            relay.submit(OsdId(1), AdminRequest::Show),
            Err(Full)
        ));
        // Another OSD has its own bound.
        assert!(relay.submit(OsdId(2), AdminRequest::Show).is_ok());
        // Sent but unanswered calls still count; a caller that gives up frees its place.
        assert_eq!(
            relay.exchange(OsdId(1), Vec::new()).len(),
            CALLS_PENDING_PER_OSD_MAX
        );
        assert!(relay.submit(OsdId(1), AdminRequest::Show).is_err());
        calls.pop();
        assert!(relay.submit(OsdId(1), AdminRequest::Show).is_ok());
    }

    #[test]
    fn a_call_dropped_before_its_heartbeat_is_never_sent() {
        let relay = Arc::new(ConfigRelay::default());
        let call = relay.submit(OsdId(1), set("debug")).unwrap();
        drop(call);
        assert!(relay.exchange(OsdId(1), Vec::new()).is_empty());
        assert!(relay.lock().is_empty());
    }
}

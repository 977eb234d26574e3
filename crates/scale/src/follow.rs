//! Following the map as a daemon does: the OSD's own loop
//! ([`fastblock_monclient::map_watch::MapWatch`], as `crates/osd/src/control.rs`'s
//! `follow_map`), every answer that moves the map logged with its size in a [`MapCounters`],
//! and the new map published to the daemon's other tasks.

use crate::counters::{Answer, AnswerKind, MapCounters};
use fastblock_monclient::map_watch::{MapWatch, Moved};
use fastblock_monclient::MonClient;
use fastblock_types::map::ClusterMap;
use fastblock_types::map_delta::MapScope;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How long one long-poll waits for a new epoch (as the OSD's).
const POLL_WAIT: Duration = Duration::from_secs(10);

/// Follows the map in `scope` until the task is aborted, publishing each new map on `out`
/// (a watch: the latest map only, so a slow reader never queues maps).
pub async fn follow(
    mon: Arc<MonClient>,
    scope: MapScope,
    counters: Arc<MapCounters>,
    out: watch::Sender<Option<Arc<ClusterMap>>>,
) {
    let mut watch = MapWatch::new(mon, scope, POLL_WAIT);
    loop {
        let step = watch.next().await;
        counters.record(Answer {
            at: Instant::now(),
            kind: match step.moved {
                Moved::Full => AnswerKind::Full,
                Moved::Delta => AnswerKind::Delta,
            },
            bytes: step.body_bytes as u64,
            epoch: step.map.epoch,
        });
        out.send_replace(Some(step.map));
    }
}

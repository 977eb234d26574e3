//! Following the map as a daemon does (`crates/osd/src/control.rs`, `follow_map`): long-polls
//! for what changed since the epoch held (`MonClient::map_update`), applied by a
//! [`MapFollower`] in the daemon's scope; every answer that moves the map is logged with its
//! size in a [`MapCounters`], and the new map is published to the daemon's other tasks.

use crate::counters::{Answer, AnswerKind, MapCounters};
use fastblock_monclient::MonClient;
use fastblock_types::map::ClusterMap;
use fastblock_types::map_delta::{MapFollower, MapRefused, MapScope, MapUpdate};
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
    let mut follower = MapFollower::new(scope).with_auth_floor(mon.auth_floor());
    loop {
        let (resp, bytes) = match mon
            .map_update_sized(follower.epoch(), follower.scope(), POLL_WAIT)
            .await
        {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("map watch: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        let update = resp.into_update();
        let kind = match &update {
            MapUpdate::Full(_) => AnswerKind::Full,
            MapUpdate::Delta(_) => AnswerKind::Delta,
            MapUpdate::UpToDate => continue,
        };
        match follower.apply(update) {
            Ok(Some(map)) => {
                counters.record(Answer {
                    at: Instant::now(),
                    kind,
                    bytes: bytes as u64,
                    epoch: map.epoch,
                });
                out.send_replace(Some(map));
            }
            Ok(None) => {}
            // The next request asks for a whole map.
            Err(MapRefused::Gap(gap)) => tracing::warn!("map watch: {gap}"),
            Err(refused @ MapRefused::BelowFloor { .. }) => {
                tracing::error!("map watch: {refused}");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

//! Following the map as a daemon does: long-polls for the changes since the epoch held
//! ([`MonClient::map_update_sized`]), applied in the daemon's scope by a [`MapFollower`]
//! (`docs/mon-api.md`, "Incremental maps"). The OSD (`fastblock-osd`'s map watch) and the scale
//! harness's simulated daemons both follow the map through this one loop, so the harness
//! measures what an OSD does.

use crate::MonClient;
use fastblock_types::map::ClusterMap;
use fastblock_types::map_delta::{MapFollower, MapRefused, MapScope, MapUpdate};
use std::sync::Arc;
use std::time::Duration;

/// The pause after a failed long-poll (no monitor reachable, an error answer) before the
/// next: the monitor may be restarting or electing.
const RETRY_PAUSE: Duration = Duration::from_millis(500);
/// The pause after a map below this daemon's auth floor: the monitor answers at once while
/// the daemon is behind, so without it the refusal would spin.
const BELOW_FLOOR_PAUSE: Duration = Duration::from_secs(1);

/// How an answer moved the map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Moved {
    /// A whole map (first contact, or too far behind for a delta).
    Full,
    /// The changes since the epoch held.
    Delta,
}

/// A map that moved, with what brought it.
#[derive(Clone, Debug)]
pub struct MapStep {
    pub map: Arc<ClusterMap>,
    pub moved: Moved,
    /// The answer's body as the monitor sent it, bytes.
    pub body_bytes: usize,
}

/// One daemon's watch of the map in its scope.
pub struct MapWatch {
    mon: Arc<MonClient>,
    follower: MapFollower,
    /// How long one long-poll waits for a new epoch.
    poll: Duration,
}

impl MapWatch {
    /// A watch holding no map yet: its first answer is a whole map. It refuses maps below
    /// the client's auth floor ([`MonClient::auth_floor`]).
    pub fn new(mon: Arc<MonClient>, scope: MapScope, poll: Duration) -> Self {
        let follower = MapFollower::new(scope).with_auth_floor(mon.auth_floor());
        MapWatch {
            mon,
            follower,
            poll,
        }
    }

    /// Waits for the next map that moves and returns it. A failed long-poll is logged and
    /// tried again after a pause; a gap in the deltas makes the next request ask for a whole
    /// map. Cancel-safe: dropped while it waits, it has changed nothing.
    pub async fn next(&mut self) -> MapStep {
        loop {
            let (resp, body_bytes) = match self
                .mon
                .map_update_sized(self.follower.epoch(), self.follower.scope(), self.poll)
                .await
            {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!("map watch: {e}");
                    tokio::time::sleep(RETRY_PAUSE).await;
                    continue;
                }
            };
            let update = resp.into_update();
            let moved = match &update {
                MapUpdate::Full(_) => Moved::Full,
                MapUpdate::Delta(_) => Moved::Delta,
                MapUpdate::UpToDate => continue,
            };
            match self.follower.apply(update) {
                Ok(Some(map)) => {
                    return MapStep {
                        map,
                        moved,
                        body_bytes,
                    }
                }
                Ok(None) => {}
                Err(MapRefused::Gap(gap)) => {
                    tracing::warn!("map watch: {gap}; fetching the whole map")
                }
                // The map held stays; health says so from the floor in the heartbeats.
                Err(refused @ MapRefused::BelowFloor { .. }) => {
                    tracing::error!("map watch: {refused}");
                    tokio::time::sleep(BELOW_FLOOR_PAUSE).await;
                }
            }
        }
    }
}

//! The recent map epochs as deltas, so that a daemon that has epoch `e` is sent what changed
//! since `e` rather than the whole map (`fastblock_types::map_delta`). The monitor service
//! keeps one per leadership; the simulator keeps one for its monitor and hands its nodes the
//! same updates.
//!
//! Bounded: deltas are kept while their entries (one per OSD, PG, image, ... that changed) add
//! up to at most [`MAP_LOG_ENTRIES_MAX`] and their count to [`MAP_LOG_EPOCHS_MAX`]; a holder
//! behind the oldest kept gets the whole map, scoped. A new leader's log starts at the epoch it
//! loaded (the map at an epoch is the same whoever leads): a holder at that epoch gets deltas,
//! one behind it a whole map. A leader that reloads (after a conflict, or a commit dropped while
//! it waited) keeps its log and appends the loaded map if it is later ([`MapLog::resume`]), so
//! its daemons stay on deltas.

use fastblock_types::map::ClusterMap;
use fastblock_types::map_delta::{DeltaMembers, MapDelta, MapScope, MapUpdate, PgIndex};
use fastblock_types::Epoch;
use std::collections::VecDeque;
use std::sync::{Arc, OnceLock};

/// Changed entries kept in all: a few times what one large event changes (a host of 20 OSDs
/// out moves some 8,000 PGs of 131,072).
pub const MAP_LOG_ENTRIES_MAX: usize = 200_000;
/// Epochs kept: a daemon that missed more gets a whole map.
pub const MAP_LOG_EPOCHS_MAX: usize = 2_000;
/// Merged deltas kept for the current epoch, one per starting epoch asked for: the holders
/// woken by an epoch are mostly at one of a few epochs, and each merge copies every entry of
/// the deltas it spans.
pub const MERGED_DELTAS_MAX: usize = 8;

/// See the module documentation.
#[derive(Debug)]
pub struct MapLog {
    current: Arc<ClusterMap>,
    /// `current`'s PGs by OSD, built at its first use (what scoped deltas cut done sets to),
    /// then advanced by each delta pushed.
    index: std::sync::OnceLock<PgIndex>,
    /// Consecutive deltas, oldest first; the last ends at `current.epoch`.
    deltas: VecDeque<(MapDelta, usize)>,
    /// The last delta's OSDs, built at the first OSD's cut of it; emptied at each push.
    last_members: OnceLock<DeltaMembers>,
    entries: usize,
    /// The deltas from an epoch to `current` merged, for the holders at that epoch; emptied
    /// at each push.
    merged: std::sync::Mutex<VecDeque<(Epoch, Arc<Merged>)>>,
}

/// Deltas merged from one epoch to the current one, with their OSDs once an OSD's cut built
/// them.
#[derive(Debug)]
struct Merged {
    delta: MapDelta,
    members: OnceLock<DeltaMembers>,
}

fn entries(d: &MapDelta) -> usize {
    d.osds.changed.len()
        + d.osds.removed.len()
        + d.pools.changed.len()
        + d.pools.removed.len()
        + d.pgmaps
            .iter()
            .map(|p| p.changed.len() + p.removed.len() + 1)
            .sum::<usize>()
        + d.removed_pgmaps.len()
        + d.images
            .as_ref()
            .map_or(0, |i| i.images.changed.len() + i.images.removed.len() + 1)
        + d.reclaim.changed.len()
        + d.reclaim.removed.len()
        + d.snaps.changed.len()
        + d.snaps.removed.len()
        + d.snap_trims.changed.len()
        + d.snap_trims.removed.len()
        + d.scrub_requests.changed.len()
        + d.scrub_requests.removed.len()
        + 1
}

impl MapLog {
    pub fn new(map: Arc<ClusterMap>) -> Self {
        MapLog {
            current: map,
            index: std::sync::OnceLock::new(),
            deltas: VecDeque::new(),
            last_members: OnceLock::new(),
            entries: 0,
            merged: Default::default(),
        }
    }

    /// The log for a leader that (re)loaded `map` from etcd, given the log it had (`None`:
    /// none, or a new leadership). A reload within a leadership (after a conflict, or a commit
    /// dropped while it waited) keeps the log if `map` is its current map, and appends `map`
    /// if it is later (a commit whose transactions went in but was never published): the
    /// holders go on with deltas instead of a whole map each. Anything else starts anew.
    pub fn resume(previous: Option<MapLog>, map: Arc<ClusterMap>) -> MapLog {
        match previous {
            Some(log) if log.current.epoch == map.epoch && *log.current == *map => log,
            Some(mut log) if log.current.epoch < map.epoch => {
                log.push(map);
                log
            }
            _ => MapLog::new(map),
        }
    }

    pub fn current(&self) -> &Arc<ClusterMap> {
        &self.current
    }

    /// Records the next map (a later epoch than the current one).
    pub fn push(&mut self, next: Arc<ClusterMap>) {
        assert!(
            next.epoch > self.current.epoch,
            "map epochs rise: {} after {}",
            next.epoch,
            self.current.epoch
        );
        let delta = MapDelta::between(&self.current, &next);
        if let Some(mut index) = self.index.take() {
            index.advance(&self.current, &delta);
            self.index = index.into();
        }
        let n = entries(&delta);
        self.deltas.push_back((delta, n));
        self.entries += n;
        self.current = next;
        self.last_members = OnceLock::new();
        self.merged.get_mut().expect("merged deltas lock").clear();
        while self.entries > MAP_LOG_ENTRIES_MAX || self.deltas.len() > MAP_LOG_EPOCHS_MAX {
            let (_, n) = self.deltas.pop_front().expect("entries count kept deltas");
            self.entries -= n;
        }
        debug_assert_eq!(
            self.deltas.back().map(|(d, _)| d.to),
            Some(self.current.epoch)
        );
    }

    /// The oldest epoch a delta can start from.
    pub fn oldest(&self) -> Epoch {
        self.deltas
            .front()
            .map_or(self.current.epoch, |(d, _)| d.from)
    }

    /// What a holder at epoch `have` (0: none) with `scope` needs.
    pub fn update_for(&self, have: Epoch, scope: &MapScope) -> MapUpdate {
        if have == self.current.epoch {
            return MapUpdate::UpToDate;
        }
        if have.0 == 0 || have < self.oldest() || have > self.current.epoch {
            return MapUpdate::Full(scope.map(&self.current));
        }
        let mut pending = self.deltas.iter().skip_while(|(d, _)| d.from < have);
        let (first, _) = pending.next().expect("have is within the kept deltas");
        let index = self.index.get_or_init(|| PgIndex::of(&self.current));
        // A holder one epoch behind (the usual case) gets the one delta cut to its scope
        // without a copy of it first: at a pool's creation that delta holds every PG of the
        // pool, and a thousand daemons copying it each took most of the monitor's CPU.
        let Some((second, _)) = pending.next() else {
            debug_assert_eq!((first.from, first.to), (have, self.current.epoch));
            return MapUpdate::Delta(scope.delta(first, &self.current, index, &self.last_members));
        };
        // Several behind: merged once per starting epoch and kept for the other holders
        // there. Merged under the lock, so that the holders woken together by an epoch wait
        // for one merge instead of each making it.
        let merged = {
            let mut kept = self.merged.lock().expect("merged deltas lock");
            match kept.iter().find(|(from, _)| *from == have) {
                Some((_, m)) => m.clone(),
                None => {
                    let mut merged = first.clone();
                    merged.merge(second);
                    for (d, _) in pending {
                        merged.merge(d);
                    }
                    let merged = Arc::new(Merged {
                        delta: merged,
                        members: OnceLock::new(),
                    });
                    if kept.len() == MERGED_DELTAS_MAX {
                        kept.pop_front();
                    }
                    kept.push_back((have, merged.clone()));
                    merged
                }
            }
        };
        debug_assert_eq!(
            (merged.delta.from, merged.delta.to),
            (have, self.current.epoch)
        );
        MapUpdate::Delta(scope.delta(&merged.delta, &self.current, index, &merged.members))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fastblock_types::map_delta::MapFollower;
    use fastblock_types::{OsdId, PoolId};

    fn at(epoch: u64, noout: bool) -> Arc<ClusterMap> {
        let mut m = ClusterMap {
            epoch: Epoch(epoch),
            ..ClusterMap::default()
        };
        m.flags.noout = noout;
        Arc::new(m)
    }

    #[test]
    fn a_holder_gets_deltas_while_kept_and_a_whole_map_after() {
        let mut log = MapLog::new(at(1, false));
        for e in 2..=10 {
            log.push(at(e, e % 2 == 0));
        }
        let scope = MapScope::Osd(OsdId(1));
        assert_eq!(log.update_for(Epoch(10), &scope), MapUpdate::UpToDate);
        match log.update_for(Epoch(3), &scope) {
            MapUpdate::Delta(d) => {
                assert_eq!((d.from, d.to), (Epoch(3), Epoch(10)));
                assert_eq!(d.flags.map(|f| f.noout), Some(true));
            }
            other => panic!("{other:?}"),
        }
        assert!(
            matches!(log.update_for(Epoch(0), &scope), MapUpdate::Full(m) if m.epoch == Epoch(10))
        );
        // A follower from scratch, then by delta.
        let mut f = MapFollower::new(MapScope::Pools([PoolId(1)].into()));
        f.apply(log.update_for(f.epoch(), f.scope())).unwrap();
        assert_eq!(f.epoch(), Epoch(10));
        log.push(at(11, false));
        let update = log.update_for(f.epoch(), f.scope());
        assert!(matches!(update, MapUpdate::Delta(_)));
        let m = f.apply(update).unwrap().expect("a newer map");
        assert_eq!((m.epoch, m.flags.noout), (Epoch(11), false));
    }

    /// Goal: the holders several epochs behind share one merge per starting epoch, and get
    /// what a merge of their own would give. Method: answers for two scopes at one epoch (one
    /// merge kept), at another epoch (a second), each against the deltas merged by hand; a
    /// push drops what was kept.
    #[test]
    fn holders_at_one_epoch_share_one_merge() {
        let mut log = MapLog::new(at(1, false));
        for e in 2..=6 {
            log.push(at(e, e % 2 == 0));
        }
        let by_hand = |from: u64| {
            let mut m: Option<MapDelta> = None;
            for (d, _) in log.deltas.iter().filter(|(d, _)| d.from.0 >= from) {
                match &mut m {
                    None => m = Some(d.clone()),
                    Some(m) => m.merge(d),
                }
            }
            m.expect("deltas from there")
        };
        let index = PgIndex::of(&log.current);
        for scope in [MapScope::All, MapScope::Osd(OsdId(1))] {
            assert_eq!(
                log.update_for(Epoch(3), &scope),
                MapUpdate::Delta(scope.delta(&by_hand(3), &log.current, &index, &OnceLock::new()))
            );
        }
        assert_eq!(log.merged.lock().unwrap().len(), 1);
        assert!(matches!(
            log.update_for(Epoch(2), &MapScope::All),
            MapUpdate::Delta(d) if d == by_hand(2)
        ));
        assert_eq!(log.merged.lock().unwrap().len(), 2);
        // One behind: cut directly, nothing kept.
        assert!(matches!(
            log.update_for(Epoch(5), &MapScope::All),
            MapUpdate::Delta(d) if d == by_hand(5)
        ));
        assert_eq!(log.merged.lock().unwrap().len(), 2);
        log.push(at(7, false));
        assert!(log.merged.lock().unwrap().is_empty());
        let last = MERGED_DELTAS_MAX as u64 + 10;
        for e in 8..=last {
            log.push(at(e, e % 2 == 0));
        }
        for from in 1..last - 1 {
            log.update_for(Epoch(from), &MapScope::All);
        }
        assert_eq!(log.merged.lock().unwrap().len(), MERGED_DELTAS_MAX);
    }

    #[test]
    fn the_oldest_deltas_go_past_the_bound() {
        let mut log = MapLog::new(at(1, false));
        for e in 2..=(MAP_LOG_EPOCHS_MAX as u64 + 10) {
            log.push(at(e, e % 2 == 0));
        }
        assert_eq!(log.deltas.len(), MAP_LOG_EPOCHS_MAX);
        assert!(matches!(
            log.update_for(Epoch(2), &MapScope::All),
            MapUpdate::Full(_)
        ));
        assert!(matches!(
            log.update_for(log.oldest(), &MapScope::All),
            MapUpdate::Delta(_)
        ));
    }

    /// Goal: a leader that reloads its state (a conflict, a commit dropped while it waited)
    /// does not send every daemon a whole map. Method: holders at the log's epochs, the log
    /// resumed with the same map (kept), a later one (appended: a delta), an earlier or a
    /// different one at the same epoch (a new log: whole maps).
    #[test]
    fn a_reload_resumes_the_log_when_the_map_follows_it() {
        let mut log = MapLog::new(at(1, false));
        log.push(at(2, true));
        let same = MapLog::resume(Some(log), at(2, true));
        assert_eq!(same.oldest(), Epoch(1), "kept");
        let later = MapLog::resume(Some(same), at(3, false));
        assert_eq!(later.current().epoch, Epoch(3));
        assert!(matches!(
            later.update_for(Epoch(2), &MapScope::All),
            MapUpdate::Delta(d) if d.from == Epoch(2) && d.to == Epoch(3)
        ));
        assert!(matches!(
            later.update_for(Epoch(1), &MapScope::All),
            MapUpdate::Delta(_)
        ));
        // Not following: a holder gets a whole map.
        let other = MapLog::resume(Some(MapLog::new(at(3, true))), at(3, false));
        assert!(matches!(
            other.update_for(Epoch(2), &MapScope::All),
            MapUpdate::Full(_)
        ));
        let older = MapLog::resume(Some(MapLog::new(at(5, false))), at(3, false));
        assert_eq!(older.current().epoch, Epoch(3));
        assert!(matches!(
            older.update_for(Epoch(2), &MapScope::All),
            MapUpdate::Full(_)
        ));
    }
}

//! Pure routing over a cluster map: which PG holds an object, which OSDs to ask for a PG's
//! leader, and where an OSD serves a PG. No I/O, so the tests can pin it with hand-built maps.

use fastblock_types::map::ClusterMap;
use fastblock_types::{ImageId, OsdId, PgId, PoolId};
use fastblock_wire::LeaderHint;
use std::fmt;

/// Where a request for one PG is sent: an OSD and its shard port for that PG, and the Raft
/// term of its leadership as far as the client knows (0: unknown), which mutations name (the
/// leader refuses any other: `docs/wire-protocol.md` 3.1, "Term fencing").
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Target {
    pub osd: OsdId,
    pub address: String,
    pub port: u16,
    pub term: u64,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "osd.{} at {}:{}", self.osd, self.address, self.port)
    }
}

/// The PG of object `index` of `image` (the stable function of `fastblock_types::route`).
pub(crate) fn object_pg(pool: PoolId, pg_count: u32, image: ImageId, index: u64) -> PgId {
    fastblock_types::route::object_pg(pool, pg_count, image, index)
}

/// Where `osd` serves `pg` according to the map, if the map knows the OSD and its address;
/// with the map's `leader_term` if the map records `osd` as the PG's leader, else term 0.
pub(crate) fn target_in_map(map: &ClusterMap, osd: OsdId, pg: PgId) -> Option<Target> {
    let info = map.osds.get(&osd)?;
    if info.address.is_empty() || info.port == 0 {
        return None;
    }
    let term = map_leader_term(map, pg, osd);
    Some(Target {
        osd,
        address: info.address.clone(),
        port: info.port_for(pg),
        term,
    })
}

/// The term of `osd`'s leadership of `pg` as the map records it: the map's `leader_term` if
/// it records `osd` as the leader, else 0 (unknown). What a mutation routed by the map alone
/// names (`docs/wire-protocol.md` 3.1, "Term fencing").
pub fn map_leader_term(map: &ClusterMap, pg: PgId, osd: OsdId) -> u64 {
    map.pg(pg)
        .filter(|p| p.leader == Some(osd))
        .map_or(0, |p| p.leader_term.0)
}

/// Where a leader hint points. The map is preferred for the address (it is what the OSD
/// registered); the hint's own address is used for an OSD the map does not know yet (the
/// caller then refreshes the map). `None` for an empty hint (`osd` 0). The term is the
/// hint's when it names one, else the map's.
pub(crate) fn target_from_hint(map: &ClusterMap, hint: &LeaderHint, pg: PgId) -> Option<Target> {
    if hint.osd.get() == 0 {
        return None;
    }
    if let Some(mut target) = target_in_map(map, hint.osd, pg) {
        if hint.term != 0 {
            target.term = hint.term;
        }
        return Some(target);
    }
    if hint.address.is_empty() || hint.port == 0 {
        return None;
    }
    Some(Target {
        osd: hint.osd,
        address: hint.address.clone(),
        port: hint.port,
        term: hint.term,
    })
}

/// The OSDs to ask `GetLeader` for `pg`, in order: the leader the map last recorded, then the
/// current members, then the target members of a remap, each once and only if the map says it
/// is up. Empty when the map has no such PG or no member is up.
pub fn leader_candidates(map: &ClusterMap, pg: PgId) -> Vec<OsdId> {
    let Some(info) = map.pg(pg) else {
        return Vec::new();
    };
    let is_up = |osd: &OsdId| map.osds.get(osd).is_some_and(|o| o.up);
    let mut candidates: Vec<OsdId> = Vec::with_capacity(info.osdlist.len() + 1);
    let ordered = info
        .leader
        .iter()
        .chain(info.osdlist.iter())
        .chain(info.newosdlist.iter());
    for osd in ordered {
        if is_up(osd) && !candidates.contains(osd) {
            candidates.push(*osd);
        }
    }
    candidates
}

/// Why a request in flight to `osd` for `pg` should be abandoned for a new attempt, given
/// the map it was sent under (`sent`) and a newer one (`now`): `osd` was up in `sent` and is
/// down in `now`, or `now` records an up leader other than `osd` and other than the one
/// `sent` recorded. Only changes since the send count: an OSD already down in the map (a
/// leader cut off from the monitor alone still leads) or a stale record the client already
/// overrode by a `GetLeader` answer or hint must not abort a call that can succeed.
/// `None`: keep waiting.
pub(crate) fn leader_moved(
    sent: &ClusterMap,
    now: &ClusterMap,
    pg: PgId,
    osd: OsdId,
) -> Option<String> {
    let up = |map: &ClusterMap, osd: OsdId| map.osds.get(&osd).map(|o| o.up);
    if up(sent, osd) == Some(true) && up(now, osd) == Some(false) {
        return Some(format!(
            "the map of epoch {} shows osd.{osd} down",
            now.epoch
        ));
    }
    let recorded = sent.pg(pg).and_then(|info| info.leader);
    let leader = now.pg(pg)?.leader?;
    (leader != osd && Some(leader) != recorded && up(now, leader) == Some(true)).then(|| {
        format!(
            "the map of epoch {} records osd.{leader} as PG {pg}'s leader",
            now.epoch
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{MapBuilder, POOL};

    #[test]
    fn candidates_start_with_the_recorded_leader_and_skip_down_osds() {
        let mut map = MapBuilder::new(2)
            .osd(1, 7001)
            .osd(2, 7002)
            .osd(3, 7003)
            .members(&[1, 2, 3])
            .build();
        let pg = PgId::new(POOL, 0);
        assert_eq!(leader_candidates(&map, pg), [OsdId(1), OsdId(2), OsdId(3)]);
        let pg_info = map.pgmaps.get_mut(&POOL).unwrap().pgs.get_mut(&0).unwrap();
        pg_info.leader = Some(OsdId(3));
        pg_info.newosdlist = vec![OsdId(2), OsdId(4)];
        std::sync::Arc::make_mut(&mut map.osds)
            .get_mut(&OsdId(2))
            .unwrap()
            .up = false;
        assert_eq!(leader_candidates(&map, pg), [OsdId(3), OsdId(1)]);
        assert!(leader_candidates(&map, PgId::new(POOL, 99)).is_empty());
    }

    #[test]
    fn a_call_is_abandoned_when_its_osd_goes_down_or_the_recorded_leader_moves() {
        let sent = MapBuilder::new(1)
            .osd(1, 7001)
            .osd(2, 7002)
            .osd(3, 7003)
            .members(&[1, 2, 3])
            .build();
        let pg = PgId::new(POOL, 0);
        let (one, two, three) = (OsdId(1), OsdId(2), OsdId(3));
        assert_eq!(leader_moved(&sent, &sent, pg, one), None);
        // The map still records 1 while the client learned 2 from a hint: keep waiting on 2.
        assert_eq!(leader_moved(&sent, &sent, pg, two), None);
        let record = |map: &mut ClusterMap, osd| {
            map.pgmaps
                .get_mut(&POOL)
                .unwrap()
                .pgs
                .get_mut(&0)
                .unwrap()
                .leader = Some(osd);
        };
        let mut now = sent.clone();
        record(&mut now, three);
        assert!(leader_moved(&sent, &now, pg, one)
            .unwrap()
            .contains("records osd.3"));
        assert_eq!(leader_moved(&sent, &now, pg, three), None);
        std::sync::Arc::make_mut(&mut now.osds)
            .get_mut(&three)
            .unwrap()
            .up = false;
        assert_eq!(
            leader_moved(&sent, &now, pg, one),
            None,
            "a leader recorded on a down OSD is no reason to give up"
        );
        assert!(leader_moved(&sent, &now, pg, three)
            .unwrap()
            .contains("osd.3 down"));
        // Down already when the request was sent (a leader cut off from the monitor alone,
        // reached through a hint): only a change since the send aborts the call.
        assert_eq!(leader_moved(&now, &now, pg, three), None);
        assert_eq!(leader_moved(&sent, &now, PgId::new(POOL, 9), two), None);
        // An OSD the maps do not know yet (followed from a hint) is not down.
        assert_eq!(leader_moved(&sent, &now, pg, OsdId(9)), None);
    }

    #[test]
    fn targets_use_the_shard_port() {
        let mut map = MapBuilder::new(4).osd(1, 7000).members(&[1]).build();
        std::sync::Arc::make_mut(&mut map.osds)
            .get_mut(&OsdId(1))
            .unwrap()
            .shards = 4;
        for seq in 0..4 {
            let pg = PgId::new(POOL, seq);
            let t = target_in_map(&map, OsdId(1), pg).unwrap();
            let shard = fastblock_types::route::pg_shard(pg, 4) as u16;
            assert_eq!(t.port, 7000 + shard);
        }
        assert!(target_in_map(&map, OsdId(9), PgId::new(POOL, 0)).is_none());
    }

    #[test]
    fn a_target_has_the_map_term_only_if_the_map_records_it_as_leader() {
        let mut map = MapBuilder::new(1)
            .osd(1, 7001)
            .osd(2, 7002)
            .members(&[1, 2])
            .build();
        let pg = PgId::new(POOL, 0);
        let info = map.pgmaps.get_mut(&POOL).unwrap().pgs.get_mut(&0).unwrap();
        info.leader = Some(OsdId(2));
        info.leader_term = fastblock_types::Term(6);
        assert_eq!(target_in_map(&map, OsdId(2), pg).unwrap().term, 6);
        assert_eq!(target_in_map(&map, OsdId(1), pg).unwrap().term, 0);
    }

    #[test]
    fn hints_prefer_the_map_and_fall_back_to_their_address() {
        let map = MapBuilder::new(1).osd(1, 7000).members(&[1]).build();
        let pg = PgId::new(POOL, 0);
        let hint = |osd, port| LeaderHint {
            osd: OsdId(osd),
            address: "10.0.0.9".into(),
            port,
            term: 4,
        };
        let known = target_from_hint(&map, &hint(1, 9999), pg).unwrap();
        assert_eq!((known.port, known.term), (7000, 4));
        let unknown = target_from_hint(&map, &hint(5, 9999), pg).unwrap();
        assert_eq!(
            (unknown.address.as_str(), unknown.port, unknown.term),
            ("10.0.0.9", 9999, 4)
        );
        assert!(target_from_hint(&map, &hint(0, 9999), pg).is_none());
        assert!(target_from_hint(&map, &hint(5, 0), pg).is_none());
    }
}

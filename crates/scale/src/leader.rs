//! The PG leader a simulated OSD plays, as a pure function of the map it holds: which PGs it
//! leads and what a genuine Raft leader of each would report next (`docs/mon-api.md`, "PG
//! reports"; the checks in `crates/mon-core/src/report_checks.rs`). No data, no Raft: the
//! election and the membership change are stepped by the map, one step per report:
//!
//! 1. the leader is the recorded one while it is up and a voter; otherwise the first up voter
//!    (the incoming voters while joint), if a majority of the voters (of both halves while
//!    joint) is up, as a Raft election needs; it reports `LeaderElected` at the next term;
//! 2. a leader whose PG has a target (`newosdlist`) enters the joint configuration towards it
//!    (`LeaderElected`, next configuration index, the old voters outgoing);
//! 3. a joint configuration is left (`MembershipFinished`, next index, the incoming voters);
//!    if the leader is not an incoming voter, step 1 elects one first;
//! 4. a PG it leads confirms the reclaim entries, snapshot marks and snapshot trims of its
//!    pool that the map still waits for (`ReclaimDone`, `SnapMarked`, `SnapTrimmed`).
//!
//! The monitor makes every decision; this only answers it as the OSD would.

use fastblock_types::api::{LeaderElectedRequest, MembershipFinishedRequest, OsdReport};
use fastblock_types::map::{ClusterMap, PgInfo, SnapState};
use fastblock_types::osd_table::UpOsds;
use fastblock_types::{LogIndex, OsdId, PgId, Term};

/// Every report `me` would send for the PGs of `map` it leads, in PG order, at most `max`.
pub fn reports(map: &ClusterMap, me: OsdId, max: usize) -> Vec<OsdReport> {
    // Built once per map: looked up for each of the OSD's PGs.
    let up = UpOsds::of(&map.osds);
    let mut out = Vec::new();
    for (pool, pgmap) in &map.pgmaps {
        for (seq, pg) in pgmap.pgs.iter() {
            if out.len() >= max {
                return out;
            }
            let id = PgId {
                pool: *pool,
                seq: *seq,
            };
            if leader_of(&up, pg) != Some(me) {
                continue;
            }
            if let Some(r) = membership_step(id, pg, me) {
                out.push(r);
                continue;
            }
            confirmations(map, id, &mut out);
        }
    }
    out.truncate(max);
    out
}

/// Whether a majority of `voters` is up (none: trivially).
fn majority_up(up: &UpOsds, voters: &[OsdId]) -> bool {
    voters.is_empty() || voters.iter().filter(|o| up.is_up(**o)).count() * 2 > voters.len()
}

/// Who leads `pg` in this model: the voters that can lead are the incoming ones while joint.
pub fn leader_of(up: &UpOsds, pg: &PgInfo) -> Option<OsdId> {
    let joint = !pg.joint_voters.is_empty();
    let candidates = if joint { &pg.joint_voters } else { &pg.osdlist };
    if !majority_up(up, &pg.osdlist) || !majority_up(up, &pg.joint_voters) {
        return None;
    }
    match pg.leader {
        Some(l) if candidates.contains(&l) && up.is_up(l) => Some(l),
        _ => candidates.iter().copied().find(|o| up.is_up(*o)),
    }
}

/// The next election or membership report of `pg`, led by `me`, if one is due.
fn membership_step(id: PgId, pg: &PgInfo, me: OsdId) -> Option<OsdReport> {
    let joint = !pg.joint_voters.is_empty();
    if pg.leader != Some(me) {
        let (voters, outgoing) = if joint {
            (pg.joint_voters.clone(), pg.osdlist.clone())
        } else {
            (pg.osdlist.clone(), Vec::new())
        };
        return Some(OsdReport::LeaderElected {
            pg: id,
            req: LeaderElectedRequest {
                leader: me,
                term: Term(pg.leader_term.0 + 1),
                conf_index: pg.conf_index,
                voters,
                voters_outgoing: outgoing,
                learners: pg.learners.clone(),
            },
        });
    }
    if joint {
        return Some(OsdReport::MembershipFinished {
            pg: id,
            req: MembershipFinishedRequest {
                leader: me,
                term: pg.leader_term,
                conf_index: LogIndex(pg.conf_index.0 + 1),
                voters: pg.joint_voters.clone(),
                learners: Vec::new(),
            },
        });
    }
    let target_differs = !pg.newosdlist.is_empty() && !same_set(&pg.newosdlist, &pg.osdlist);
    if target_differs {
        return Some(OsdReport::LeaderElected {
            pg: id,
            req: LeaderElectedRequest {
                leader: me,
                term: pg.leader_term,
                conf_index: LogIndex(pg.conf_index.0 + 1),
                voters: pg.newosdlist.clone(),
                voters_outgoing: pg.osdlist.clone(),
                learners: Vec::new(),
            },
        });
    }
    None
}

fn same_set(a: &[OsdId], b: &[OsdId]) -> bool {
    a.len() == b.len() && a.iter().all(|o| b.contains(o))
}

/// The confirmations the map waits for from the leader of `id`.
fn confirmations(map: &ClusterMap, id: PgId, out: &mut Vec<OsdReport>) {
    for e in map.reclaim.values() {
        if e.pool == id.pool && !e.done_pgs.contains(&id.seq) {
            out.push(OsdReport::ReclaimDone { pg: id, id: e.id });
        }
    }
    for (image, snaps) in &map.snaps {
        for s in snaps {
            if s.pool == id.pool && s.state == SnapState::Creating && !s.done_pgs.contains(&id.seq)
            {
                out.push(OsdReport::SnapMarked {
                    pg: id,
                    image: *image,
                    snap: s.id.0,
                });
            }
        }
    }
    for e in map.snap_trims.values() {
        if e.pool == id.pool && !e.done_pgs.contains(&id.seq) {
            out.push(OsdReport::SnapTrimmed { pg: id, id: e.id });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fastblock_types::map::PgMap;
    use fastblock_types::PoolId;

    fn osd(id: u32, up: bool) -> fastblock_types::map::OsdInfo {
        serde_json::from_value(serde_json::json!({
            "id": id, "uuid": format!("u{id}"), "host": format!("h{id}"), "address": "127.0.0.1",
            "port": 1, "shards": 1, "capacity_bytes": 1, "up": up, "in": true,
            "pending_create": false, "boot_epoch": 1, "config": ""
        }))
        .expect("an OsdInfo")
    }

    /// A map with OSDs 1..=5 (those in `down` down) and pool 1 holding PG 1.0 as `pg`.
    fn map_with(pg: serde_json::Value, down: &[u32]) -> ClusterMap {
        let mut map = ClusterMap::default();
        for id in 1..=5 {
            std::sync::Arc::make_mut(&mut map.osds).insert(OsdId(id), osd(id, !down.contains(&id)));
        }
        let mut pgmap: PgMap = serde_json::from_value(serde_json::json!({
            "pool": 1, "version": 1, "pgs": {}
        }))
        .expect("a PgMap");
        let mut pg_json = serde_json::json!({
            "version": 1, "state": 1, "osdlist": [1, 2, 3], "leader": null,
            "leader_term": 0, "conf_index": 0
        });
        for (k, v) in pg.as_object().expect("fields") {
            pg_json[k] = v.clone();
        }
        pgmap
            .pgs
            .insert(0, serde_json::from_value(pg_json).expect("a PgInfo"));
        map.pgmaps.insert(PoolId(1), pgmap);
        map
    }

    fn ids(v: &[u32]) -> Vec<OsdId> {
        v.iter().map(|i| OsdId(*i)).collect()
    }

    #[test]
    fn a_new_pg_is_claimed_by_its_first_up_voter_only() {
        let map = map_with(serde_json::json!({}), &[]);
        let r = reports(&map, OsdId(1), 10);
        assert!(
            matches!(&r[..], [OsdReport::LeaderElected { req, .. }]
                if req.term == Term(1) && req.voters == ids(&[1, 2, 3]) && req.leader == OsdId(1)),
            "{r:?}"
        );
        assert!(reports(&map, OsdId(2), 10).is_empty());
        // The first voter down: the next one is elected at the next term.
        let map = map_with(serde_json::json!({"leader": 1, "leader_term": 4}), &[1]);
        let r = reports(&map, OsdId(2), 10);
        assert!(
            matches!(&r[..], [OsdReport::LeaderElected { req, .. }] if req.term == Term(5)),
            "{r:?}"
        );
        // No majority up: no election.
        let map = map_with(serde_json::json!({}), &[1, 2]);
        assert!(reports(&map, OsdId(3), 10).is_empty());
    }

    #[test]
    fn a_target_is_reached_through_a_joint_configuration() {
        let map = map_with(
            serde_json::json!({"leader": 1, "leader_term": 2, "conf_index": 7,
                               "newosdlist": [1, 2, 4]}),
            &[3],
        );
        let r = reports(&map, OsdId(1), 10);
        assert!(
            matches!(&r[..], [OsdReport::LeaderElected { req, .. }]
                if req.conf_index == LogIndex(8) && req.term == Term(2)
                    && req.voters == ids(&[1, 2, 4]) && req.voters_outgoing == ids(&[1, 2, 3])),
            "{r:?}"
        );
        // Joint, with the leader among the outgoing only: an incoming voter takes over first,
        // then leaves the joint state.
        let joint = serde_json::json!({"leader": 1, "leader_term": 2, "conf_index": 8,
                                       "joint_voters": [2, 3, 4]});
        let map = map_with(joint, &[]);
        assert!(reports(&map, OsdId(1), 10).is_empty());
        let r = reports(&map, OsdId(2), 10);
        assert!(
            matches!(&r[..], [OsdReport::LeaderElected { req, .. }]
                if req.term == Term(3) && req.voters == ids(&[2, 3, 4])),
            "{r:?}"
        );
        let map = map_with(
            serde_json::json!({"leader": 2, "leader_term": 3, "conf_index": 8,
                               "joint_voters": [2, 3, 4]}),
            &[],
        );
        let r = reports(&map, OsdId(2), 10);
        assert!(
            matches!(&r[..], [OsdReport::MembershipFinished { req, .. }]
                if req.conf_index == LogIndex(9) && req.voters == ids(&[2, 3, 4])),
            "{r:?}"
        );
    }

    #[test]
    fn a_settled_leader_confirms_what_its_pool_waits_for() {
        let mut map = map_with(serde_json::json!({"leader": 1, "leader_term": 1}), &[]);
        let entry = serde_json::json!({
            "id": 9, "pool": 1, "image": 3, "image_name": "i", "object_size_bytes": 4096,
            "from_bytes": 0, "to_bytes": 4096, "reason": "removed", "epoch": 5, "done_pgs": []
        });
        map.reclaim.insert(
            9,
            serde_json::from_value(entry.clone()).expect("a ReclaimEntry"),
        );
        let r = reports(&map, OsdId(1), 10);
        assert!(
            matches!(&r[..], [OsdReport::ReclaimDone { id: 9, .. }]),
            "{r:?}"
        );
        let mut done = entry;
        done["done_pgs"] = serde_json::json!([0]);
        map.reclaim
            .insert(9, serde_json::from_value(done).expect("a ReclaimEntry"));
        assert!(reports(&map, OsdId(1), 10).is_empty());
    }
}

//! Property tests of [`super`]: random sequences of maps (each a random change of the last),
//! and the rules of the module documentation checked on them.

use super::*;
use crate::map::{
    FailureDomain, ImageTable, OsdInfo, PgInfo, PgMap, PoolInfo, ReclaimEntry, SnapInfo, SnapState,
    SnapTrimEntry,
};
use crate::{LogIndex, PgId, PgState, Term};
use proptest::prelude::*;

fn osd(id: u32, up: bool) -> OsdInfo {
    OsdInfo {
        id: OsdId(id),
        uuid: format!("u{id}"),
        host: format!("h{id}"),
        address: "10.0.0.1".into(),
        port: 6800,
        shards: 1,
        capacity_bytes: 1,
        up,
        is_in: true,
        pending_create: false,
        boot_epoch: Epoch(1),
        config: String::new(),
        lease_timing: None,
    }
}

fn pg(members: &[u32], leader: u32) -> PgInfo {
    PgInfo {
        version: 1,
        state: PgState::ACTIVE,
        osdlist: members.iter().map(|o| OsdId(*o)).collect(),
        newosdlist: Vec::new(),
        learners: Vec::new(),
        joint_voters: Vec::new(),
        released: Vec::new(),
        restored: false,
        leader: Some(OsdId(leader)),
        leader_term: Term(1),
        conf_index: LogIndex(1),
    }
}

fn base() -> ClusterMap {
    let mut m = ClusterMap {
        epoch: Epoch(1),
        images: Some(ImageTable::default()),
        ..ClusterMap::default()
    };
    for id in 1..=6 {
        std::sync::Arc::make_mut(&mut m.osds).insert(OsdId(id), osd(id, true));
    }
    for pool in 1..=2u32 {
        m.pools.insert(
            PoolId(pool),
            PoolInfo {
                id: PoolId(pool),
                name: format!("p{pool}"),
                pg_count: 600,
                size: 3,
                failure_domain: FailureDomain::Osd,
                created_epoch: Epoch(1),
            },
        );
        let pgs = (0..600u32)
            .map(|s| {
                (
                    s,
                    pg(&[1 + s % 6, 1 + (s + 1) % 6, 1 + (s + 2) % 6], 1 + s % 6),
                )
            })
            .collect();
        m.pgmaps.insert(
            PoolId(pool),
            PgMap {
                pool: PoolId(pool),
                version: 1,
                pgs,
            },
        );
    }
    m
}

/// One random change of `m`, chosen by `(kind, a, b)`.
fn change(m: &mut ClusterMap, (kind, a, b): (u8, u32, u32)) {
    let pool = PoolId(1 + a % 3);
    match kind % 9 {
        0..=2 => {
            // A PG's members move (it may lose or gain any OSD).
            if let Some(map) = m.pgmaps.get_mut(&pool) {
                let seq = b % 700;
                if let Some(p) = map.pgs.get_mut(&seq) {
                    let x = OsdId(1 + a % 7);
                    if p.osdlist.contains(&x) {
                        p.osdlist.retain(|o| *o != x);
                    } else if kind % 3 == 0 {
                        p.newosdlist = vec![x];
                    } else {
                        p.learners.push(x);
                    }
                    p.leader_term = Term(p.leader_term.0 + 1);
                    map.version += 1;
                }
            }
        }
        3 => {
            if let Some(map) = m.pgmaps.get_mut(&pool) {
                map.pgs.insert(600 + b % 100, pg(&[1 + a % 6], 1 + a % 6));
            }
        }
        4 => {
            if let Some(map) = m.pgmaps.get_mut(&pool) {
                map.pgs.remove(&(b % 700));
            }
        }
        5 => {
            let id = 1 + a % 8;
            match std::sync::Arc::make_mut(&mut m.osds).get_mut(&OsdId(id)) {
                Some(_) if b % 3 == 0 => {
                    std::sync::Arc::make_mut(&mut m.osds).remove(&OsdId(id));
                }
                Some(o) => o.up = !o.up,
                None => {
                    std::sync::Arc::make_mut(&mut m.osds).insert(OsdId(id), osd(id, true));
                }
            }
        }
        6 => {
            m.flags.noout = !m.flags.noout;
            m.auth.epoch += u64::from(b % 2);
        }
        7 => {
            let t = m.images.get_or_insert_with(ImageTable::default);
            let id = ImageId(u64::from(a % 5));
            if t.images.remove(&id).is_none() {
                t.images.insert(
                    id,
                    ImageExtent {
                        size_bytes: u64::from(b),
                        object_size_bytes: 4096,
                        parent_overlap_bytes: None,
                    },
                );
            }
            t.next_id = t.next_id.max(id.0 + 1);
            let key = u64::from(b % 4);
            if m.reclaim.remove(&key).is_none() {
                m.reclaim.insert(
                    key,
                    ReclaimEntry {
                        id: key,
                        pool,
                        image: id,
                        image_name: "i".into(),
                        object_size_bytes: 4096,
                        from_bytes: 0,
                        to_bytes: 4096,
                        reason: "removed".into(),
                        epoch: m.epoch,
                        done_pgs: [b % 10].into(),
                    },
                );
            }
            // A snapshot being marked and a trim: more PGs done, or gone.
            if b % 5 == 0 {
                m.snaps.remove(&id);
                m.snap_trims.remove(&key);
            } else {
                let snaps = m.snaps.entry(id).or_default();
                if snaps.is_empty() {
                    snaps.push(SnapInfo {
                        id: crate::SnapId(1),
                        pool,
                        image: id,
                        image_name: "i".into(),
                        name: "s".into(),
                        state: SnapState::Creating,
                        size_bytes: 4096,
                        object_size_bytes: 4096,
                        created_epoch: m.epoch,
                        protected: false,
                        done_pgs: BTreeSet::new(),
                        started_at_ms: 0,
                        parent_overlap_bytes: None,
                    });
                }
                snaps[0].done_pgs.insert(b % 12);
                let trim = m.snap_trims.entry(key).or_insert_with(|| SnapTrimEntry {
                    id: key,
                    pool,
                    image: id,
                    image_name: "i".into(),
                    snap: crate::SnapId(1),
                    reason: "removed".into(),
                    epoch: m.epoch,
                    done_pgs: BTreeSet::new(),
                });
                trim.done_pgs.insert(a % 9);
            }
        }
        _ => {
            // A pool goes, or comes back.
            if m.pgmaps.remove(&pool).is_none() {
                let pgs = (0..50u32)
                    .map(|s| (s, pg(&[1 + s % 6], 1 + s % 6)))
                    .collect();
                m.pgmaps.insert(
                    pool,
                    PgMap {
                        pool,
                        version: 1,
                        pgs,
                    },
                );
            } else {
                m.pools.remove(&pool);
            }
        }
    }
}

/// Every done set a delta carries, with its pool.
fn done_sets(d: &MapDelta) -> Vec<(PoolId, &BTreeSet<u32>)> {
    let reclaim = d.reclaim.changed.iter().map(|(_, e)| (e.pool, &e.done_pgs));
    let snaps = d
        .snaps
        .changed
        .iter()
        .flat_map(|(_, s)| s.iter().map(|s| (s.pool, &s.done_pgs)));
    let trims = d
        .snap_trims
        .changed
        .iter()
        .map(|(_, t)| (t.pool, &t.done_pgs));
    reclaim.chain(snaps).chain(trims).collect()
}

/// Maps `m0, m1, ...`, each a few random changes of the last at the next epoch.
fn history(steps: Vec<Vec<(u8, u32, u32)>>) -> Vec<ClusterMap> {
    let mut maps = vec![base()];
    for changes in steps {
        let mut m = maps.last().unwrap().clone();
        for c in changes {
            change(&mut m, c);
        }
        m.epoch = Epoch(m.epoch.0 + 1);
        maps.push(m);
    }
    maps
}

fn steps() -> impl Strategy<Value = Vec<Vec<(u8, u32, u32)>>> {
    prop::collection::vec(
        prop::collection::vec((0u8..9, 0u32..1000, 0u32..1000), 1..6),
        1..8,
    )
}

proptest! {
    #[test]
    fn a_delta_takes_a_map_to_the_next(steps in steps()) {
        let maps = history(steps);
        for w in maps.windows(2) {
            let d = MapDelta::between(&w[0], &w[1]);
            let mut m = w[0].clone();
            d.apply(&mut m).unwrap();
            prop_assert_eq!(&m, &w[1]);
            // Through JSON too: what goes over the wire.
            let d: MapDelta = serde_json::from_str(&serde_json::to_string(&d).unwrap()).unwrap();
            let mut m = w[0].clone();
            d.apply(&mut m).unwrap();
            prop_assert_eq!(&m, &w[1]);
        }
    }

    #[test]
    fn merged_deltas_equal_the_steps(steps in steps()) {
        let maps = history(steps);
        let mut merged = MapDelta::between(&maps[0], &maps[1]);
        for w in maps[1..].windows(2) {
            merged.merge(&MapDelta::between(&w[0], &w[1]));
        }
        let mut m = maps[0].clone();
        merged.apply(&mut m).unwrap();
        prop_assert_eq!(&m, maps.last().unwrap());
    }

    #[test]
    fn a_scoped_holder_follows_with_scoped_deltas(steps in steps(), who in 1u32..9, pools in 1u32..4) {
        let maps = history(steps);
        for scope in [MapScope::Osd(OsdId(who)), MapScope::Pools([PoolId(pools)].into()), MapScope::All] {
            let mut held = scope.map(&maps[0]);
            for w in maps.windows(2) {
                let index = PgIndex::of(&w[1]);
                let d = scope.delta(&MapDelta::between(&w[0], &w[1]), &w[1], &index, &OnceLock::new());
                // What a done set carries: an OSD's PGs of the pool, a client nothing.
                for (pool, done) in done_sets(&d) {
                    match &scope {
                        MapScope::Osd(o) => prop_assert!(
                            done.iter().all(|s| index.pgs(*o, pool).contains(s)),
                            "{:?} cut to {:?}'s PGs {:?}", done, o, index.pgs(*o, pool)
                        ),
                        MapScope::Pools(_) => prop_assert!(done.is_empty()),
                        MapScope::All => {}
                    }
                }
                d.apply(&mut held).unwrap();
                scope.prune(&mut held);
                prop_assert_eq!(&held, &scope.map(&w[1]), "scope {:?}", scope);
            }
            // The index kept across the steps is the index of each map.
            let mut index = PgIndex::of(&maps[0]);
            for w in maps.windows(2) {
                index.advance(&w[0], &MapDelta::between(&w[0], &w[1]));
                prop_assert_eq!(&index, &PgIndex::of(&w[1]));
            }
            // Merged, then scoped: the same.
            let mut merged = MapDelta::between(&maps[0], &maps[1]);
            for w in maps[1..].windows(2) {
                merged.merge(&MapDelta::between(&w[0], &w[1]));
            }
            let mut held = scope.map(&maps[0]);
            let last = maps.last().unwrap();
            scope.delta(&merged, last, &PgIndex::of(last), &OnceLock::new()).apply(&mut held).unwrap();
            scope.prune(&mut held);
            prop_assert_eq!(&held, &scope.map(maps.last().unwrap()));
        }
    }
}

#[test]
fn a_delta_for_another_epoch_is_refused() {
    let maps = history(vec![vec![(6, 0, 0)], vec![(6, 0, 1)]]);
    let d = MapDelta::between(&maps[1], &maps[2]);
    let mut m = maps[0].clone();
    assert_eq!(
        d.apply(&mut m),
        Err(DeltaGap {
            from: Epoch(2),
            have: Epoch(1)
        })
    );
    assert_eq!(m, maps[0], "nothing applied");
}

#[test]
fn an_osd_learns_it_left_a_pg() {
    let a = base();
    let mut b = a.clone();
    b.epoch = Epoch(2);
    let p = b
        .pgmaps
        .get_mut(&PoolId(1))
        .unwrap()
        .pgs
        .get_mut(&0)
        .unwrap();
    p.osdlist = vec![OsdId(5), OsdId(6)];
    let scope = MapScope::Osd(OsdId(1));
    let d = scope.delta(
        &MapDelta::between(&a, &b),
        &b,
        &PgIndex::of(&b),
        &OnceLock::new(),
    );
    let entries = &d.pgmaps[0].changed;
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].left, vec![OsdId(1), OsdId(2), OsdId(3)]);
    let mut held = scope.map(&a);
    assert!(held.pg(PgId::new(PoolId(1), 0)).is_some());
    d.apply(&mut held).unwrap();
    scope.prune(&mut held);
    assert!(held.pg(PgId::new(PoolId(1), 0)).is_none());
}

/// A follower with floor `sign` takes no map in mode `none`, whole or by delta, and keeps the
/// map it has; the same update is taken by a follower without a floor.
#[test]
fn a_map_below_the_auth_floor_is_refused_and_the_held_map_stays() {
    use crate::auth::AuthMode;
    let mut signed = base();
    signed.auth.mode = AuthMode::Sign;
    let mut downgraded = signed.clone();
    downgraded.epoch = Epoch(signed.epoch.0 + 1);
    downgraded.auth.mode = AuthMode::None;
    let mut follower = MapFollower::new(MapScope::All).with_auth_floor(AuthMode::Sign);
    assert!(matches!(
        follower.apply(MapUpdate::Full(downgraded.clone())),
        Err(MapRefused::BelowFloor {
            mode: AuthMode::None,
            floor: AuthMode::Sign,
            ..
        })
    ));
    assert_eq!(follower.epoch(), Epoch(0));
    follower
        .apply(MapUpdate::Full(signed.clone()))
        .unwrap()
        .expect("a signed map is taken");
    let delta = MapDelta::between(&signed, &downgraded);
    let refused = follower.apply(MapUpdate::Delta(delta.clone()));
    assert!(
        matches!(refused, Err(MapRefused::BelowFloor { epoch, .. }) if epoch == downgraded.epoch),
        "{refused:?}"
    );
    assert_eq!(*follower.map().unwrap(), signed, "the held map stays");
    let mut open = MapFollower::new(MapScope::All);
    open.apply(MapUpdate::Full(signed)).unwrap();
    assert_eq!(
        open.apply(MapUpdate::Delta(delta))
            .unwrap()
            .unwrap()
            .auth
            .mode,
        AuthMode::None
    );
}

/// Goal: a reclaim in a large pool costs an OSD the sequence numbers of its own PGs per
/// epoch, and a client none, not the pool's. Method: a pool of 60,000 PGs of 2 replicas over
/// 600 OSDs (pool 1 of `base` grown); a reclaim entry with 50,000 PGs done changes (one more PG done); the
/// delta for osd.1 carries the done PGs osd.1 takes part in, the one for a client of the pool
/// an empty set, the whole delta all 50,001.
#[test]
fn done_sets_in_a_delta_are_cut_to_what_each_holder_needs() {
    let mut a = base();
    let pool = PoolId(1);
    let pgs: BTreeMap<u32, PgInfo> = (0..60_000u32)
        .map(|s| (s, pg(&[1 + s % 600, 1 + (s + 1) % 600], 1 + s % 600)))
        .collect();
    a.pgmaps.get_mut(&pool).unwrap().pgs = pgs.into_iter().collect();
    let entry = ReclaimEntry {
        id: 1,
        pool,
        image: ImageId(1),
        image_name: "i".into(),
        object_size_bytes: 4096,
        from_bytes: 0,
        to_bytes: 4096,
        reason: "removed".into(),
        epoch: a.epoch,
        done_pgs: (0..50_000).collect(),
    };
    a.reclaim.insert(1, entry);
    let mut b = a.clone();
    b.epoch = Epoch(2);
    b.reclaim.get_mut(&1).unwrap().done_pgs.insert(50_000);
    let whole = MapDelta::between(&a, &b);
    let index = PgIndex::of(&b);
    let done = |d: &MapDelta| d.reclaim.changed[0].1.done_pgs.clone();
    assert_eq!(done(&whole).len(), 50_001);
    let mine = MapScope::Osd(OsdId(1)).delta(&whole, &b, &index, &OnceLock::new());
    let expected: BTreeSet<u32> = (0..=50_000u32)
        .filter(|s| s % 600 == 0 || (s + 1) % 600 == 0)
        .collect();
    assert_eq!(done(&mine), expected);
    let client = MapScope::Pools([pool].into()).delta(&whole, &b, &index, &OnceLock::new());
    assert!(done(&client).is_empty());
    // What goes over the wire: the OSD's share of a whole pool's bitmap.
    let bytes = |d: &MapDelta| serde_json::to_string(d).unwrap().len();
    assert!(
        bytes(&mine) * 4 < bytes(&whole),
        "{} of {}",
        bytes(&mine),
        bytes(&whole)
    );
    // Its held map, cut the same way, follows.
    let scope = MapScope::Osd(OsdId(1));
    let mut held = scope.map(&a);
    mine.apply(&mut held).unwrap();
    scope.prune(&mut held);
    assert_eq!(held, scope.map(&b));
}

/// Goal: a delta's members list, for each OSD, exactly the changed entries an OSD's cut keeps
/// (named after the change or among those that left), once each and in order. Method: two
/// pools' changes naming OSDs as voters, a learner that is also a voter, and a departed OSD,
/// against the entries picked by hand.
#[test]
fn delta_members_list_each_osds_entries_once_in_order() {
    let entry = |seq: u32, pg: PgInfo, left: &[u32]| PgEntry {
        seq,
        pg,
        left: left.iter().map(|o| OsdId(*o)).collect(),
    };
    let mut learner = pg(&[1, 2], 1);
    learner.learners = vec![OsdId(2)];
    let delta = MapDelta {
        from: Epoch(1),
        to: Epoch(2),
        pgmaps: vec![
            PgMapDelta {
                pool: PoolId(1),
                version: 2,
                changed: vec![
                    entry(0, pg(&[1, 2, 3], 1), &[]),
                    entry(5, learner, &[4]),
                    entry(9, pg(&[3, 4], 3), &[]),
                ],
                removed: vec![7],
            },
            PgMapDelta {
                pool: PoolId(2),
                version: 1,
                changed: vec![entry(1, pg(&[2], 2), &[1])],
                removed: Vec::new(),
            },
        ],
        ..MapDelta::default()
    };
    let m = DeltaMembers::of(&delta);
    assert_eq!(m.entries(OsdId(1), PoolId(1)), [0, 1]);
    assert_eq!(
        m.entries(OsdId(2), PoolId(1)),
        [0, 1],
        "named twice in 5, once"
    );
    assert_eq!(m.entries(OsdId(4), PoolId(1)), [1, 2], "left 5, joined 9");
    assert_eq!(m.entries(OsdId(1), PoolId(2)), [0], "left pool 2's PG 1");
    assert!(m.entries(OsdId(9), PoolId(1)).is_empty());
    assert!(m.entries(OsdId(3), PoolId(2)).is_empty());
    // The cut for osd.4 takes those entries and every removal.
    let current = ClusterMap {
        epoch: Epoch(2),
        ..ClusterMap::default()
    };
    let cut =
        MapScope::Osd(OsdId(4)).delta(&delta, &current, &PgIndex::of(&current), &OnceLock::new());
    let seqs: Vec<(PoolId, Vec<u32>, Vec<u32>)> = cut
        .pgmaps
        .iter()
        .map(|d| {
            (
                d.pool,
                d.changed.iter().map(|e| e.seq).collect(),
                d.removed.clone(),
            )
        })
        .collect();
    assert_eq!(
        seqs,
        [
            (PoolId(1), vec![5, 9], vec![7]),
            (PoolId(2), vec![], vec![])
        ]
    );
}

//! The monitor's side of image snapshots and clones (`docs/mon-api.md`, "Snapshots"): a
//! snapshot is `creating` until every PG of the pool confirmed its mark, aborted into a trim
//! entry when that takes longer than the timeout, and removed into a trim entry confirmed PG
//! by PG; protection, clones and snapshots refuse the removals that would orphan something.

mod common;

use common::{boot_request, op, uuid};
use fastblock_mon_core::snap_ops::SnapAbort;
use fastblock_mon_core::MonState;
use fastblock_types::api::*;
use fastblock_types::map::{FailureDomain, SnapState};
use fastblock_types::{Epoch, ImageId, PgId, PoolId, SnapId};

const MIB: u64 = 1 << 20;
const TIMEOUT_MS: u64 = 30_000;

fn create_pool(s: &mut MonState, name: &str, pg_count: u32) {
    op(s, |s| {
        s.create_pool(&CreatePoolRequest {
            name: name.into(),
            pg_count,
            size: 3,
            failure_domain: FailureDomain::Osd,
        })
    })
    .unwrap();
}

fn create_image(s: &mut MonState, pool: &str, name: &str) -> ImageId {
    op(s, |s| {
        s.create_image(&CreateImageRequest {
            pool: pool.into(),
            name: name.into(),
            size_bytes: 16 * MIB,
            object_size_bytes: Some(MIB),
        })
    })
    .unwrap()
    .id
}

/// Three OSDs, pool `p` (4 PGs) with image `img`, pool `q` (2 PGs).
fn cluster() -> MonState {
    let mut s = MonState::default();
    for i in 0..3u32 {
        let id = op(&mut s, |s| s.apply_id(&uuid(i))).unwrap();
        op(&mut s, |s| s.boot(id, &boot_request(i, None))).unwrap();
    }
    create_pool(&mut s, "p", 4);
    create_pool(&mut s, "q", 2);
    create_image(&mut s, "p", "img");
    s
}

fn pg(seq: u32) -> PgId {
    PgId::new(PoolId(1), seq)
}

fn snap_create(s: &mut MonState, name: &str, now_ms: u64) -> Result<SnapId, ApiError> {
    op(s, |s| s.create_snap("p", "img", name, now_ms)).map(|snap| snap.id)
}

/// Creates snapshot `name` of `p/img` and confirms it on every PG.
fn snap_created(s: &mut MonState, name: &str) -> SnapId {
    let id = snap_create(s, name, 0).unwrap();
    let image = s.image("p", "img").unwrap().id;
    for seq in 0..4 {
        op(s, |s| s.snap_pg_done(image, id, pg(seq))).unwrap();
    }
    assert_eq!(s.snap_by_id(image, id).unwrap().state, SnapState::Created);
    id
}

fn clone_of(s: &mut MonState, snap: &str, pool: &str, name: &str) -> Result<ImageId, ApiError> {
    op(s, |s| {
        s.clone_snap(
            "p",
            "img",
            snap,
            &CloneRequest {
                pool: pool.into(),
                name: name.into(),
            },
        )
    })
    .map(|i| i.id)
}

fn code<T: std::fmt::Debug>(r: Result<T, ApiError>) -> (ErrorCode, String) {
    let e = r.expect_err("the operation must be refused");
    (e.code, e.message)
}

#[test]
fn a_snapshot_is_created_once_every_pg_confirmed_its_mark() {
    let mut s = cluster();
    let image = s.image("p", "img").unwrap().id;
    let epoch = s.map.epoch;
    let snap = op(&mut s, |s| s.create_snap("p", "img", "s1", 1234)).unwrap();
    assert_eq!(
        s.map.epoch,
        Epoch(epoch.0 + 1),
        "recording a snapshot bumps the epoch"
    );
    assert_eq!(snap.id, SnapId(1));
    assert_eq!(snap.state, SnapState::Creating);
    assert_eq!(snap.size_bytes, 16 * MIB);
    assert_eq!(snap.object_size_bytes, MIB);
    assert_eq!(snap.started_at_ms, 1234);
    assert_eq!(snap.created_epoch, s.map.epoch);
    assert_eq!(s.image("p", "img").unwrap().snap_seq, 1);
    assert_eq!(
        s.map.snaps[&image],
        vec![snap.clone()],
        "the map carries it"
    );

    for seq in 0..3 {
        let created = op(&mut s, |s| s.snap_pg_done(image, snap.id, pg(seq))).unwrap();
        assert!(!created, "pg {seq} of 4 is not all of them");
    }
    // A repeated confirmation changes nothing.
    let before = s.clone();
    assert!(!op(&mut s, |s| s.snap_pg_done(image, snap.id, pg(2))).unwrap());
    assert_eq!(s, before);
    let creating = s.snap_by_id(image, snap.id).unwrap().clone();
    assert_eq!(creating.done_pgs.len(), 3);
    assert_eq!(s.snap_missing_pgs(&creating), vec![pg(3)]);

    let epoch = s.map.epoch;
    assert!(op(&mut s, |s| s.snap_pg_done(image, snap.id, pg(3))).unwrap());
    assert_eq!(s.map.epoch, Epoch(epoch.0 + 1), "created is a new epoch");
    let created = &s.map.snaps[&image][0];
    assert_eq!(created.state, SnapState::Created);
    assert!(created.done_pgs.is_empty(), "cleared once created");
    // A late confirmation of a created snapshot is answered, not refused.
    assert!(op(&mut s, |s| s.snap_pg_done(image, snap.id, pg(0))).unwrap());
}

#[test]
fn confirmations_of_unknown_snapshots_and_pgs_are_refused() {
    let mut s = cluster();
    let image = s.image("p", "img").unwrap().id;
    let id = snap_create(&mut s, "s1", 0).unwrap();
    let before = s.clone();
    let (c, m) = code(op(&mut s, |s| s.snap_pg_done(image, SnapId(9), pg(0))));
    assert_eq!(c, ErrorCode::SnapNotFound, "{m}");
    let (c, _) = code(op(&mut s, |s| s.snap_pg_done(ImageId(77), id, pg(0))));
    assert_eq!(c, ErrorCode::SnapNotFound);
    let (c, m) = code(op(&mut s, |s| {
        s.snap_pg_done(image, id, PgId::new(PoolId(2), 0))
    }));
    assert_eq!(c, ErrorCode::InvalidArgument, "a PG of another pool: {m}");
    let (c, _) = code(op(&mut s, |s| s.snap_pg_done(image, id, pg(4))));
    assert_eq!(c, ErrorCode::PgNotFound);
    assert_eq!(s, before, "refusals change nothing");
}

#[test]
fn snapshot_names_follow_the_image_rules_and_are_unique_per_image() {
    let mut s = cluster();
    create_image(&mut s, "p", "other");
    for bad in ["", "a@b", "a/b", ".x", "-x", "sp ace"] {
        let (c, m) = code(snap_create(&mut s, bad, 0));
        assert_eq!(c, ErrorCode::InvalidArgument, "{bad:?}: {m}");
    }
    snap_create(&mut s, "s1", 0).unwrap();
    let (c, m) = code(snap_create(&mut s, "s1", 0));
    assert_eq!(c, ErrorCode::SnapExists);
    assert!(m.contains("p/img@s1 already exists"), "{m}");
    // Unique per image only.
    op(&mut s, |s| s.create_snap("p", "other", "s1", 0)).unwrap();
    let (c, _) = code(op(&mut s, |s| s.create_snap("p", "nope", "s1", 0)));
    assert_eq!(c, ErrorCode::ImageNotFound);
    let (c, _) = code(op(&mut s, |s| s.create_snap("nope", "img", "s1", 0)));
    assert_eq!(c, ErrorCode::PoolNotFound);
}

#[test]
fn snapshot_ids_increase_per_image_and_are_never_reused() {
    let mut s = cluster();
    let a = snap_created(&mut s, "a");
    let b = snap_created(&mut s, "b");
    assert_eq!((a, b), (SnapId(1), SnapId(2)));
    op(&mut s, |s| s.remove_snap("p", "img", "b")).unwrap();
    let c = snap_create(&mut s, "c", 0).unwrap();
    assert_eq!(
        c,
        SnapId(3),
        "the id of a removed snapshot is not given again"
    );
    // Another image counts from 1.
    create_image(&mut s, "p", "other");
    let first = op(&mut s, |s| s.create_snap("p", "other", "a", 0)).unwrap();
    assert_eq!(first.id, SnapId(1));
    let image = s.image("p", "img").unwrap().id;
    let ids: Vec<SnapId> = s.map.snaps[&image].iter().map(|x| x.id).collect();
    assert_eq!(ids, vec![SnapId(1), SnapId(3)], "sorted by id");
}

#[test]
fn the_last_snapshot_id_below_the_limit_is_given_and_then_creates_are_refused() {
    let mut s = cluster();
    let key = (PoolId(1), "img".to_string());
    s.images.get_mut(&key).unwrap().snap_seq = SnapId::LIMIT - 2;
    let last = snap_create(&mut s, "last", 0).unwrap();
    assert_eq!(last, SnapId(SnapId::LIMIT - 1));
    let before = s.clone();
    let (c, m) = code(snap_create(&mut s, "beyond", 0));
    assert_eq!(c, ErrorCode::TooLarge);
    assert!(m.contains("snapshot ids"), "{m}");
    assert_eq!(s, before);
}

#[test]
fn an_image_holds_at_most_its_live_snapshot_limit_and_a_removal_makes_room() {
    let mut s = cluster();
    for n in 0..SnapId::LIVE_PER_IMAGE_MAX {
        snap_created(&mut s, &format!("s{n}"));
    }
    let before = s.clone();
    let (c, m) = code(snap_create(&mut s, "one-more", 0));
    assert_eq!(c, ErrorCode::TooLarge);
    assert!(m.contains("remove some"), "{m}");
    assert_eq!(s, before, "a refused create changes nothing");
    op(&mut s, |s| s.remove_snap("p", "img", "s0")).unwrap();
    snap_create(&mut s, "one-more", 0).expect("room after a removal");
}

#[test]
fn a_snapshot_still_creating_after_the_timeout_is_aborted_into_a_trim_entry() {
    let mut s = cluster();
    let image = s.image("p", "img").unwrap().id;
    let slow = snap_create(&mut s, "slow", 1_000).unwrap();
    let done = snap_created(&mut s, "done"); // started at 0: created, never aborted
    op(&mut s, |s| s.snap_pg_done(image, slow, pg(1))).unwrap();

    let aborted = op(&mut s, |s| {
        Ok(s.tick_snaps(1_000 + TIMEOUT_MS - 1, TIMEOUT_MS))
    })
    .unwrap();
    assert!(aborted.is_empty(), "not yet");
    assert!(s.snap_by_id(image, slow).is_some());

    let epoch = s.map.epoch;
    let aborted = op(&mut s, |s| Ok(s.tick_snaps(1_000 + TIMEOUT_MS, TIMEOUT_MS))).unwrap();
    assert_eq!(aborted.len(), 1);
    assert_eq!(aborted[0].id, slow);
    assert_eq!(s.map.epoch, Epoch(epoch.0 + 1));
    assert!(s.snap_by_id(image, slow).is_none(), "removed");
    assert!(s.snap_by_id(image, done).is_some(), "a created one stays");
    let trims: Vec<_> = s.map.snap_trims.values().cloned().collect();
    assert_eq!(trims.len(), 1, "{trims:?}");
    assert_eq!(trims[0].snap, slow);
    assert_eq!(trims[0].image, image);
    assert_eq!(trims[0].reason, "create timed out");
    assert_eq!(trims[0].epoch, s.map.epoch);
    assert!(trims[0].done_pgs.is_empty());
    // A confirmation arriving after the abort is told the snapshot is gone.
    let (c, _) = code(op(&mut s, |s| s.snap_pg_done(image, slow, pg(2))));
    assert_eq!(c, ErrorCode::SnapNotFound);
}

#[test]
fn a_start_time_ahead_of_the_clock_waits_rather_than_aborting_at_once() {
    let mut s = cluster();
    let image = s.image("p", "img").unwrap().id;
    let id = snap_create(&mut s, "s", 50_000).unwrap();
    let aborted = op(&mut s, |s| Ok(s.tick_snaps(10_000, TIMEOUT_MS))).unwrap();
    assert!(aborted.is_empty());
    assert!(s.snap_by_id(image, id).is_some());
}

#[test]
fn the_create_call_giving_up_aborts_unless_every_pg_confirmed() {
    let mut s = cluster();
    let image = s.image("p", "img").unwrap().id;
    let id = snap_create(&mut s, "s", 0).unwrap();
    op(&mut s, |s| s.snap_pg_done(image, id, pg(0))).unwrap();
    op(&mut s, |s| s.snap_pg_done(image, id, pg(2))).unwrap();
    let snap = s.snap_by_id(image, id).unwrap().clone();
    let outcome = op(&mut s, |s| s.abort_snap_create(image, id)).unwrap();
    assert_eq!(
        outcome,
        SnapAbort::Aborted {
            missing_pgs: vec![pg(1), pg(3)]
        }
    );
    assert!(s.snap_by_id(image, id).is_none());
    assert_eq!(s.snap_trims.len(), 1);
    let e = s.snap_timed_out_error(&snap, &[pg(1), pg(3)], 500);
    assert_eq!(e.code, ErrorCode::SnapCreateTimedOut);
    assert!(!e.retryable);
    assert!(e.message.contains("p/img@s"), "{}", e.message);
    assert!(e.message.contains("2: 1.1, 1.3"), "{}", e.message);
    assert!(e.message.contains("500 ms"), "{}", e.message);
    // Twice: gone.
    assert_eq!(
        op(&mut s, |s| s.abort_snap_create(image, id)).unwrap(),
        SnapAbort::Gone
    );
    // One that made it is left alone.
    let made = snap_created(&mut s, "made");
    let before = s.clone();
    let outcome = op(&mut s, |s| s.abort_snap_create(image, made)).unwrap();
    assert!(matches!(outcome, SnapAbort::Created(ref x) if x.id == made));
    assert_eq!(s, before);
}

#[test]
fn removing_a_snapshot_leaves_a_trim_entry_confirmed_pg_by_pg() {
    let mut s = cluster();
    let image = s.image("p", "img").unwrap().id;
    let id = snap_created(&mut s, "s");
    op(&mut s, |s| s.protect_snap("p", "img", "s", true)).unwrap();
    let before = s.clone();
    let (c, m) = code(op(&mut s, |s| s.remove_snap("p", "img", "s")));
    assert_eq!(c, ErrorCode::SnapInUse);
    assert!(m.contains("protected; unprotect it first"), "{m}");
    assert_eq!(s, before);
    op(&mut s, |s| s.protect_snap("p", "img", "s", false)).unwrap();

    let gone = op(&mut s, |s| s.remove_snap("p", "img", "s")).unwrap();
    assert_eq!(gone.id, id);
    assert!(!s.map.snaps.contains_key(&image), "no snapshots left");
    let (trim_id, trim) = s
        .map
        .snap_trims
        .iter()
        .next()
        .map(|(k, v)| (*k, v.clone()))
        .unwrap();
    assert_eq!(trim.reason, "removed");
    assert_eq!((trim.image, trim.snap, trim.pool), (image, id, PoolId(1)));
    let (c, _) = code(op(&mut s, |s| s.remove_snap("p", "img", "s")));
    assert_eq!(c, ErrorCode::SnapNotFound);

    for seq in 0..3 {
        assert!(!op(&mut s, |s| s.snap_trim_pg_done(trim_id, pg(seq))).unwrap());
    }
    assert!(
        !op(&mut s, |s| s.snap_trim_pg_done(trim_id, pg(1))).unwrap(),
        "idempotent"
    );
    assert_eq!(s.map.snap_trims[&trim_id].done_pgs.len(), 3);
    let (c, _) = code(op(&mut s, |s| {
        s.snap_trim_pg_done(trim_id, PgId::new(PoolId(2), 0))
    }));
    assert_eq!(c, ErrorCode::InvalidArgument);
    assert!(op(&mut s, |s| s.snap_trim_pg_done(trim_id, pg(3))).unwrap());
    assert!(s.map.snap_trims.is_empty());
    let (c, _) = code(op(&mut s, |s| s.snap_trim_pg_done(trim_id, pg(0))));
    assert_eq!(c, ErrorCode::SnapTrimNotFound);
    assert_eq!(
        s.counters.next_snap_trim_id,
        trim_id + 1,
        "trim ids are not reused"
    );
}

#[test]
fn protect_needs_a_created_snapshot_and_unprotect_is_refused_while_clones_exist() {
    let mut s = cluster();
    snap_create(&mut s, "creating", 0).unwrap();
    let (c, m) = code(op(&mut s, |s| s.protect_snap("p", "img", "creating", true)));
    assert_eq!(c, ErrorCode::SnapNotReady, "{m}");
    snap_created(&mut s, "s");
    let protected = op(&mut s, |s| s.protect_snap("p", "img", "s", true)).unwrap();
    assert!(protected.protected);
    let before = s.clone();
    op(&mut s, |s| s.protect_snap("p", "img", "s", true)).unwrap();
    assert_eq!(s, before, "protecting twice changes nothing");
    clone_of(&mut s, "s", "q", "c1").unwrap();
    clone_of(&mut s, "s", "p", "c2").unwrap();
    let (c, m) = code(op(&mut s, |s| s.protect_snap("p", "img", "s", false)));
    assert_eq!(c, ErrorCode::SnapInUse);
    assert!(
        m.contains("q/c1") && m.contains("p/c2"),
        "names the clones: {m}"
    );
    let (c, _) = code(op(&mut s, |s| s.protect_snap("p", "img", "nope", true)));
    assert_eq!(c, ErrorCode::SnapNotFound);
}

#[test]
fn an_image_with_snapshots_or_clones_cannot_be_removed() {
    let mut s = cluster();
    snap_created(&mut s, "a");
    snap_create(&mut s, "b", 0).unwrap();
    let before = s.clone();
    let (c, m) = code(op(&mut s, |s| s.remove_image("p", "img")));
    assert_eq!(c, ErrorCode::SnapInUse);
    assert!(
        m.contains("image has 2 snapshots: a, b; remove them first"),
        "{m}"
    );
    assert_eq!(s, before);
    op(&mut s, |s| s.protect_snap("p", "img", "a", true)).unwrap();
    clone_of(&mut s, "a", "q", "child").unwrap();
    // The cloned snapshot cannot go while the clone exists.
    let (c, m) = code(op(&mut s, |s| s.remove_snap("p", "img", "a")));
    assert_eq!(c, ErrorCode::SnapInUse, "{m}");
    op(&mut s, |s| s.protect_snap("p", "img", "a", false)).unwrap_err();
    let (c, m) = code(op(&mut s, |s| s.remove_image("p", "img")));
    assert_eq!(c, ErrorCode::SnapInUse, "{m}");
    // A clone itself can be removed; then the parent's snapshots, then the parent.
    op(&mut s, |s| s.remove_image("q", "child")).unwrap();
    op(&mut s, |s| s.protect_snap("p", "img", "a", false)).unwrap();
    op(&mut s, |s| s.remove_snap("p", "img", "a")).unwrap();
    // "b" is still creating: it cannot be removed, its timeout aborts it.
    let (c, m) = code(op(&mut s, |s| s.remove_snap("p", "img", "b")));
    assert_eq!(c, ErrorCode::SnapNotReady, "{m}");
    assert_eq!(
        op(&mut s, |s| Ok(s.tick_snaps(TIMEOUT_MS, TIMEOUT_MS)))
            .unwrap()
            .len(),
        1
    );
    op(&mut s, |s| s.remove_image("p", "img")).unwrap();
    let reclaimed: Vec<&str> = s.reclaim.values().map(|r| r.image_name.as_str()).collect();
    assert_eq!(
        reclaimed,
        vec!["child", "img"],
        "removed images are reclaimed as before"
    );
    assert_eq!(s.snap_trims.len(), 2);
}

#[test]
fn an_image_that_is_the_parent_of_clones_cannot_be_removed() {
    let mut s = cluster();
    snap_created(&mut s, "a");
    op(&mut s, |s| s.protect_snap("p", "img", "a", true)).unwrap();
    clone_of(&mut s, "a", "q", "child").unwrap();
    // Drop the snapshot record under the clone (as if removed by hand) to reach the
    // clone rule on its own: the parent must still refuse to go.
    s.snaps.clear();
    s.derive_data_map();
    let before = s.clone();
    let (c, m) = code(op(&mut s, |s| s.remove_image("p", "img")));
    assert_eq!(c, ErrorCode::SnapInUse);
    assert!(m.contains("parent of 1 clone(s): q/child"), "{m}");
    assert_eq!(s, before);
}

#[test]
fn a_resize_leaves_the_snapshots_their_size() {
    let mut s = cluster();
    let image = s.image("p", "img").unwrap().id;
    snap_created(&mut s, "s");
    op(&mut s, |s| {
        s.resize_image(
            "p",
            "img",
            &ResizeImageRequest {
                size_bytes: 32 * MIB,
                allow_shrink: false,
            },
        )
    })
    .unwrap();
    assert_eq!(s.image("p", "img").unwrap().size_bytes, 32 * MIB);
    assert_eq!(s.map.snaps[&image][0].size_bytes, 16 * MIB);
    let later = snap_create(&mut s, "t", 0).unwrap();
    assert_eq!(s.snap_by_id(image, later).unwrap().size_bytes, 32 * MIB);
}

#[test]
fn a_clone_of_a_protected_snapshot_reads_through_until_flattened() {
    let mut s = cluster();
    let parent = s.image("p", "img").unwrap().clone();
    snap_create(&mut s, "creating", 0).unwrap();
    let (c, m) = code(clone_of(&mut s, "creating", "q", "c"));
    assert_eq!(c, ErrorCode::SnapNotReady, "{m}");
    let snap = snap_created(&mut s, "s");
    let before = s.clone();
    let (c, m) = code(clone_of(&mut s, "s", "q", "c"));
    assert_eq!(c, ErrorCode::SnapNotReady);
    assert!(m.contains("not protected; protect it first"), "{m}");
    assert_eq!(s, before);
    op(&mut s, |s| s.protect_snap("p", "img", "s", true)).unwrap();
    // The head grows after the snapshot: the clone has the snapshot's size.
    op(&mut s, |s| {
        s.resize_image(
            "p",
            "img",
            &ResizeImageRequest {
                size_bytes: 64 * MIB,
                allow_shrink: false,
            },
        )
    })
    .unwrap();

    let id = clone_of(&mut s, "s", "q", "c").unwrap();
    let clone = s.image("q", "c").unwrap().clone();
    assert_eq!(clone.id, id);
    assert_eq!(clone.size_bytes, 16 * MIB);
    assert_eq!(clone.object_size_bytes, MIB);
    assert_eq!(clone.snap_seq, 0);
    let p = clone.parent.clone().expect("a clone has a parent");
    assert_eq!((p.pool, p.image, p.snap), (parent.pool, parent.id, snap));
    assert_eq!((p.pool_name.as_str(), p.image_name.as_str()), ("p", "img"));
    assert_eq!(p.snap_name, "s");
    assert_eq!(p.overlap_bytes, 16 * MIB);
    assert!(
        s.map.images.as_ref().unwrap().images.contains_key(&id),
        "fenced like any image"
    );
    let (c, _) = code(clone_of(&mut s, "s", "q", "c"));
    assert_eq!(c, ErrorCode::ImageExists);
    let (c, _) = code(clone_of(&mut s, "s", "nope", "c"));
    assert_eq!(c, ErrorCode::PoolNotFound);
    let (c, _) = code(clone_of(&mut s, "s", "q", "a/b"));
    assert_eq!(c, ErrorCode::InvalidArgument);
    clone_of(&mut s, "s", "p", "c").unwrap();

    let children = s.snap_children("p", "img", "s").unwrap();
    let names: Vec<String> = children
        .iter()
        .map(|c| format!("{}/{}", c.pool_name, c.name))
        .collect();
    assert_eq!(names, vec!["p/c", "q/c"]);
    let (c, _) = code(s.snap_children("p", "img", "nope"));
    assert_eq!(c, ErrorCode::SnapNotFound);

    let flat = op(&mut s, |s| s.flatten_done("q", "c")).unwrap();
    assert_eq!(flat.parent, None);
    assert_eq!(s.image("q", "c").unwrap().parent, None);
    let before = s.clone();
    op(&mut s, |s| s.flatten_done("q", "c")).unwrap();
    assert_eq!(s, before, "flatten-done twice changes nothing");
    assert_eq!(s.snap_children("p", "img", "s").unwrap().len(), 1);
    // A clone can itself be snapshotted.
    op(&mut s, |s| s.create_snap("q", "c", "x", 0)).unwrap();
}

/// Confirms snapshot `snap` of `p/name` on every PG (as their leaders would).
fn confirm_snap(s: &mut MonState, name: &str, snap: &str) {
    let image = s.image("p", name).unwrap().id;
    let id = s
        .snaps_of_image(image)
        .iter()
        .find(|x| x.name == snap)
        .unwrap()
        .id;
    for seq in 0..4 {
        op(s, |s| s.snap_pg_done(image, id, pg(seq))).unwrap();
    }
}

/// Snapshots of a clone record the clone's overlap of their moment; the map's image table
/// carries the head's, which a shrink cuts while the snapshots keep theirs; a snapshot of a
/// clone can be cloned again, up to the depth limit.
#[test]
fn snapshots_of_clones_keep_the_overlap_of_their_moment() {
    let mut s = cluster();
    snap_created(&mut s, "s");
    op(&mut s, |s| s.protect_snap("p", "img", "s", true)).unwrap();
    let kid = clone_of(&mut s, "s", "p", "kid").unwrap();
    let extent = |s: &MonState| s.map.images.as_ref().unwrap().images[&kid];
    assert_eq!(extent(&s).parent_overlap_bytes, Some(16 * MIB));
    let k1 = op(&mut s, |s| s.create_snap("p", "kid", "k1", 0)).unwrap();
    assert_eq!(k1.parent_overlap_bytes, Some(16 * MIB));
    confirm_snap(&mut s, "kid", "k1");
    let resize = |s: &mut MonState, size_bytes| {
        op(s, |s| {
            s.resize_image(
                "p",
                "kid",
                &ResizeImageRequest {
                    size_bytes,
                    allow_shrink: true,
                },
            )
        })
        .unwrap();
    };
    resize(&mut s, 4 * MIB);
    let reclaim = *s.reclaim.keys().next().unwrap();
    for seq in 0..4 {
        op(&mut s, |s| s.reclaim_pg_done(reclaim, pg(seq))).unwrap();
    }
    resize(&mut s, 32 * MIB);
    assert_eq!(
        extent(&s).parent_overlap_bytes,
        Some(4 * MIB),
        "cut for good"
    );
    let k2 = op(&mut s, |s| s.create_snap("p", "kid", "k2", 0)).unwrap();
    assert_eq!(k2.parent_overlap_bytes, Some(4 * MIB));
    confirm_snap(&mut s, "kid", "k2");
    assert_eq!(
        s.snap_by_id(kid, k1.id).unwrap().parent_overlap_bytes,
        Some(16 * MIB),
        "an older snapshot keeps its overlap"
    );
    // A snapshot of an image that is not a clone has none.
    let plain = snap_created(&mut s, "t");
    let img = s.image("p", "img").unwrap().id;
    assert_eq!(s.snap_by_id(img, plain).unwrap().parent_overlap_bytes, None);
    // Clones of snapshots of clones, up to the limit.
    let clone = |s: &mut MonState, parent: &str, snap: &str, name: &str| {
        op(s, |s| {
            s.clone_snap(
                "p",
                parent,
                snap,
                &CloneRequest {
                    pool: "p".into(),
                    name: name.into(),
                },
            )
        })
    };
    let (mut parent, mut snap) = ("kid".to_string(), "k2".to_string());
    for level in 2..=fastblock_mon_core::snap_ops::CLONE_DEPTH_MAX {
        op(&mut s, |s| s.protect_snap("p", &parent, &snap, true)).unwrap();
        let name = format!("level{level}");
        clone(&mut s, &parent, &snap, &name).unwrap();
        assert_eq!(s.clone_depth(s.image("p", &name).unwrap().id), level);
        op(&mut s, |s| s.create_snap("p", &name, "x", 0)).unwrap();
        confirm_snap(&mut s, &name, "x");
        (parent, snap) = (name, "x".to_string());
    }
    op(&mut s, |s| s.protect_snap("p", &parent, "x", true)).unwrap();
    let before = s.clone();
    let (c, m) = code(clone(&mut s, &parent, "x", "too-deep"));
    assert_eq!(c, ErrorCode::TooLarge, "{m}");
    assert!(m.contains("flatten it first"), "{m}");
    assert_eq!(s, before);
}

#[test]
fn deleting_a_pool_drops_its_snapshots_and_trims_but_not_under_foreign_clones() {
    let mut s = cluster();
    let image = s.image("p", "img").unwrap().id;
    snap_created(&mut s, "s");
    snap_created(&mut s, "gone");
    op(&mut s, |s| s.remove_snap("p", "img", "gone")).unwrap();
    op(&mut s, |s| s.protect_snap("p", "img", "s", true)).unwrap();
    clone_of(&mut s, "s", "q", "c").unwrap();
    let before = s.clone();
    let (c, m) = code(op(&mut s, |s| s.delete_pool("p", true)));
    assert_eq!(c, ErrorCode::SnapInUse);
    assert!(m.contains("q/c"), "{m}");
    assert_eq!(s, before);
    // A clone inside the pool does not hold it.
    clone_of(&mut s, "s", "p", "inner").unwrap();
    op(&mut s, |s| s.flatten_done("q", "c")).unwrap();
    op(&mut s, |s| s.delete_pool("p", true)).unwrap();
    assert!(!s.snaps.contains_key(&image));
    assert!(s.map.snaps.is_empty());
    assert!(s.snap_trims.is_empty() && s.map.snap_trims.is_empty());
    assert!(s.image("q", "c").is_ok());
}

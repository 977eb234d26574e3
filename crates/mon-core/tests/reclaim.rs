//! The monitor's side of reclaim: entries for removals and shrinks, confirmed PG by PG, gone
//! once every PG of the pool confirmed; no grow over a range still being deleted; the map's
//! image table follows the images.

mod common;

use common::{boot_osds, op};
use fastblock_mon_core::{MonState, OpResult};
use fastblock_types::api::*;
use fastblock_types::map::{FailureDomain, ImageFence};
use fastblock_types::{ImageId, PgId, PoolId};

const MIB: u64 = 1 << 20;

/// Runs one operation as the service does: on a copy, then `finish`.
fn cluster() -> MonState {
    let mut s = MonState::default();
    boot_osds(&mut s, 3);
    op(&mut s, |s| {
        s.create_pool(&CreatePoolRequest {
            name: "p".into(),
            pg_count: 4,
            size: 3,
            failure_domain: FailureDomain::Osd,
        })
    })
    .unwrap();
    op(&mut s, |s| {
        s.create_image(&CreateImageRequest {
            pool: "p".into(),
            name: "img".into(),
            size_bytes: 16 * MIB,
            object_size_bytes: Some(MIB),
        })
    })
    .unwrap();
    s
}

fn resize(s: &mut MonState, size_bytes: u64) -> OpResult<()> {
    op(s, |s| {
        s.resize_image(
            "p",
            "img",
            &ResizeImageRequest {
                size_bytes,
                allow_shrink: true,
            },
        )
        .map(|_| ())
    })
}

fn pg(seq: u32) -> PgId {
    PgId::new(PoolId(1), seq)
}

#[test]
fn a_shrink_is_confirmed_pg_by_pg_and_blocks_a_grow_until_then() {
    let mut s = cluster();
    let image = s.image("p", "img").unwrap().id;
    let table = s
        .map
        .images
        .clone()
        .expect("the map carries the image table");
    assert_eq!(table.check(image, 15, 0, MIB), ImageFence::Allowed);
    resize(&mut s, 5 * MIB + 4096).unwrap();
    assert_eq!(s.map.reclaim.len(), 1, "the map lists the cut tail");
    let entry = s.map.reclaim.values().next().unwrap().clone();
    assert_eq!(
        (entry.from_bytes, entry.to_bytes),
        (5 * MIB + 4096, 16 * MIB)
    );
    let table = s.map.images.clone().unwrap();
    assert_eq!(
        table.check(image, 5, 4096, 4096),
        ImageFence::BeyondSize {
            size_bytes: 5 * MIB + 4096
        }
    );
    assert_eq!(table.check(image, 5, 0, 4096), ImageFence::Allowed);
    // Growing over the range being deleted waits; shrinking further does not.
    let e = resize(&mut s, 16 * MIB).unwrap_err();
    assert_eq!(e.code, ErrorCode::ReclaimPending, "{e}");
    assert!(e.retryable);
    for seq in 0..3 {
        let finished = op(&mut s, |s| s.reclaim_pg_done(entry.id, pg(seq))).unwrap();
        assert!(!finished, "pg {seq} of 4");
        assert!(s.map.reclaim[&entry.id].done_pgs.contains(&seq));
    }
    // A confirmation twice, or for a PG of another pool, changes nothing.
    assert!(!op(&mut s, |s| s.reclaim_pg_done(entry.id, pg(0))).unwrap());
    let e = op(&mut s, |s| {
        s.reclaim_pg_done(entry.id, PgId::new(PoolId(9), 0))
    })
    .unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidArgument);
    assert_eq!(
        resize(&mut s, 16 * MIB).unwrap_err().code,
        ErrorCode::ReclaimPending
    );
    assert!(op(&mut s, |s| s.reclaim_pg_done(entry.id, pg(3))).unwrap());
    assert!(s.reclaim.is_empty() && s.map.reclaim.is_empty());
    let e = op(&mut s, |s| s.reclaim_pg_done(entry.id, pg(3))).unwrap_err();
    assert_eq!(e.code, ErrorCode::ReclaimNotFound);
    resize(&mut s, 16 * MIB).unwrap();
    let table = s.map.images.clone().unwrap();
    assert_eq!(table.check(image, 15, 0, MIB), ImageFence::Allowed);
}

#[test]
fn a_removed_image_is_fenced_and_a_newer_one_is_unknown() {
    let mut s = cluster();
    let image = s.image("p", "img").unwrap().id;
    op(&mut s, |s| s.remove_image("p", "img")).unwrap();
    let entry = s.map.reclaim.values().next().unwrap().clone();
    assert!(entry.removes_image());
    let table = s.map.images.clone().unwrap();
    assert_eq!(table.check(image, 0, 0, 4096), ImageFence::Removed);
    assert_eq!(
        table.check(ImageId(image.0 + 1), 0, 0, 4096),
        ImageFence::Unknown,
        "an id this map has not given out yet"
    );
    // The map's image table is derived, so a state decoded from etcd carries it as well.
    let mut reloaded = s.clone();
    reloaded.map.images = None;
    reloaded.map.reclaim.clear();
    reloaded.derive_data_map();
    assert_eq!(reloaded, s);
}

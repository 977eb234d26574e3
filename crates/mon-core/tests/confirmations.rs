//! Reclaim, snapshot-mark and snapshot-trim confirmations count only from an OSD the PG names
//! (`report_checks::check_confirmer`): a compromised OSD that does not host a PG cannot declare
//! its reclaim done or its snapshot marked.

mod common;

use common::{boot_osds, op};
use fastblock_mon_core::{MonState, Reporter};
use fastblock_types::api::*;
use fastblock_types::map::{FailureDomain, SnapState};
use fastblock_types::{OsdId, PgId, PoolId};

const MIB: u64 = 1 << 20;

/// Four OSDs, a pool of 8 PGs with 2 replicas, one image: every PG leaves two OSDs out.
fn cluster() -> MonState {
    let mut s = MonState::default();
    boot_osds(&mut s, 4);
    op(&mut s, |s| {
        s.create_pool(&CreatePoolRequest {
            name: "p".into(),
            pg_count: 8,
            size: 2,
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

/// PG 1.0, one OSD it names and one it does not.
fn member_and_stranger(s: &MonState) -> (PgId, OsdId, OsdId) {
    let pg = PgId::new(PoolId(1), 0);
    let info = s.map.pgmaps[&PoolId(1)].pgs.get(&0).unwrap().clone();
    let member = info.osdlist[0];
    let stranger = *s
        .map
        .osds
        .keys()
        .find(|o| !info.osdlist.contains(o) && !info.newosdlist.contains(o))
        .expect("4 OSDs, 2 replicas");
    (pg, member, stranger)
}

fn batch(s: &mut MonState, from: OsdId, report: OsdReport) -> Option<ApiError> {
    let mut results = op(s, |s| Ok(s.apply_reports(Reporter::Osd(from), &[report]))).unwrap();
    results.pop().unwrap()
}

#[test]
fn a_reclaim_confirmation_counts_only_from_an_osd_the_pg_names() {
    let mut s = cluster();
    op(&mut s, |s| {
        s.resize_image(
            "p",
            "img",
            &ResizeImageRequest {
                size_bytes: 4 * MIB,
                allow_shrink: true,
            },
        )
        .map(drop)
    })
    .unwrap();
    let id = *s
        .reclaim
        .keys()
        .next()
        .expect("the shrink left a reclaim entry");
    let (pg, member, stranger) = member_and_stranger(&s);
    let before = s.clone();
    let refused = batch(&mut s, stranger, OsdReport::ReclaimDone { pg, id })
        .expect("a stranger's confirmation is refused");
    assert_eq!(refused.code, ErrorCode::ImplausibleReport, "{refused:?}");
    assert!(
        refused.message.contains(&format!("osd {stranger}")),
        "{refused:?}"
    );
    assert_eq!(s.reclaim, before.reclaim, "nothing recorded");
    // The PG's own member confirms, and in auth mode `none` nobody is checked.
    assert_eq!(
        batch(&mut s, member, OsdReport::ReclaimDone { pg, id }),
        None
    );
    assert!(s.reclaim[&id].done_pgs.contains(&0));
    let pg1 = PgId::new(PoolId(1), 1);
    op(&mut s, |s| {
        Ok(s.apply_reports(
            Reporter::Unauthenticated,
            &[OsdReport::ReclaimDone { pg: pg1, id }],
        ))
    })
    .unwrap();
    assert!(s.reclaim[&id].done_pgs.contains(&1));
}

#[test]
fn a_snapshot_is_not_created_on_a_mark_confirmed_by_an_osd_outside_the_pg() {
    let mut s = cluster();
    let snap = op(&mut s, |s| s.create_snap("p", "img", "s1", 1_000)).unwrap();
    let (pg, member, stranger) = member_and_stranger(&s);
    let mark = OsdReport::SnapMarked {
        pg,
        image: snap.image,
        snap: snap.id.0,
    };
    let before = s.snaps.clone();
    let refused = batch(&mut s, stranger, mark.clone()).expect("refused");
    assert_eq!(refused.code, ErrorCode::ImplausibleReport, "{refused:?}");
    assert_eq!(s.snaps, before, "nothing recorded");
    // Every other PG confirms from a member; the stranger's mark of pg 1.0 did not count.
    for seq in 1..8 {
        let pg = PgId::new(PoolId(1), seq);
        let info = s.map.pgmaps[&PoolId(1)].pgs.get(&seq).unwrap().clone();
        let report = OsdReport::SnapMarked {
            pg,
            image: snap.image,
            snap: snap.id.0,
        };
        assert_eq!(batch(&mut s, info.osdlist[0], report), None);
    }
    let still = s.snaps[&snap.image]
        .iter()
        .find(|x| x.id == snap.id)
        .unwrap();
    assert_eq!(
        still.state,
        SnapState::Creating,
        "created without pg 1.0's mark: {still:?}"
    );
    assert_eq!(batch(&mut s, member, mark), None);
    let now = s.snaps[&snap.image]
        .iter()
        .find(|x| x.id == snap.id)
        .unwrap();
    assert_eq!(now.state, SnapState::Created, "{now:?}");
}

//! The monitor's boot check of lease timing (`fastblock_types::lease`): an OSD whose leaders'
//! leases could outlast another OSD's refusal to vote, or whose refusal is shorter than another
//! OSD's leases, is refused with `incompatible_config`, naming both OSDs and their settings,
//! and nothing changes; settings that fit, and OSDs that report none, boot.

mod common;

use common::{boot_request, op, uuid};
use fastblock_mon_core::{MonState, OpResult};
use fastblock_types::api::ErrorCode;
use fastblock_types::lease::LeaseTiming;
use fastblock_types::OsdId;

fn timing(tick_ms: u64, election_ticks: u64, lease_reads: bool) -> Option<LeaseTiming> {
    Some(LeaseTiming {
        tick_ms,
        election_ticks,
        lease_reads,
    })
}

/// The OSD defaults: 100 ms ticks, 10 election ticks, lease reads on.
fn default_timing() -> Option<LeaseTiming> {
    timing(100, 10, true)
}

fn boot(s: &mut MonState, id: OsdId, lease_timing: Option<LeaseTiming>) -> OpResult<()> {
    let req = boot_request(id.0, lease_timing);
    op(s, |s| s.boot(id, &req))
}

/// Applies for the next id (they count from 1, and so do the uuids here) and boots it.
fn new_osd(s: &mut MonState, lease_timing: Option<LeaseTiming>) -> (OsdId, OpResult<()>) {
    let n = s.map.osds.len() as u32 + 1;
    let id = op(s, |s| s.apply_id(&uuid(n))).expect("apply id");
    assert_eq!(id.0, n);
    (id, boot(s, id, lease_timing))
}

fn cluster(n: usize) -> MonState {
    let mut s = MonState::default();
    for _ in 0..n {
        new_osd(&mut s, default_timing())
            .1
            .expect("same settings boot");
    }
    s
}

#[test]
fn equal_settings_boot_and_are_recorded() {
    let s = cluster(3);
    for osd in s.map.osds.values() {
        assert!(osd.up && osd.is_in);
        assert_eq!(osd.lease_timing, default_timing());
    }
}

#[test]
fn a_longer_lease_is_refused_naming_both_osds_and_nothing_changes() {
    let mut s = cluster(2);
    let before = s.clone();
    // 200 ms ticks: its leaders would lease 1600 ms against the others' 895 ms refusal.
    let n = s.map.osds.len() as u32 + 1;
    let id = op(&mut s, |s| s.apply_id(&uuid(n))).unwrap();
    let applied = s.clone();
    let e = boot(&mut s, id, timing(200, 10, true)).unwrap_err();
    assert_eq!(e.code, ErrorCode::IncompatibleConfig);
    assert!(!e.retryable);
    assert_eq!(e.code.http_status(), 409);
    assert!(
        e.message
            .contains("osd 3 (--tick 200ms --election-ticks 10 --lease-reads true)"),
        "{}",
        e.message
    );
    assert!(
        e.message
            .contains("osd 1 (--tick 100ms --election-ticks 10 --lease-reads true)"),
        "{}",
        e.message
    );
    assert!(
        e.message.contains("a leader on osd 3") && e.message.contains("1600 ms"),
        "{}",
        e.message
    );
    assert!(e.message.contains("895 ms"), "{}", e.message);
    assert_eq!(s, applied, "a refused boot changes nothing");
    assert!(s.map.osds[&id].pending_create && !s.map.osds[&id].up);
    assert_eq!(before.map.osds.len() + 1, s.map.osds.len());
    // The same OSD with the cluster's settings boots.
    boot(&mut s, id, default_timing()).unwrap();
    assert!(s.map.osds[&id].up);
}

#[test]
fn a_shorter_refusal_is_refused_even_without_lease_reads() {
    let mut s = cluster(2);
    // 50 ms ticks, no lease of its own: it may vote again after 445 ms, inside the others'
    // 800 ms leases.
    let (id, r) = new_osd(&mut s, timing(50, 10, false));
    let e = r.unwrap_err();
    assert_eq!(e.code, ErrorCode::IncompatibleConfig);
    assert!(
        e.message.contains("a leader on osd 1") && e.message.contains(&format!("osd {id} may")),
        "{}",
        e.message
    );
    // A longer refusal and no lease of its own fits.
    boot(&mut s, id, timing(100, 20, false)).unwrap();
    // Different settings whose leases fit both ways: 90 ms x 11 (lease 810 ms, 895 ms window).
    assert!(new_osd(&mut s, timing(90, 11, true)).1.is_ok());
}

#[test]
fn down_and_out_osds_still_count() {
    let mut s = cluster(2);
    for id in [OsdId(1), OsdId(2)] {
        op(&mut s, |s| s.mark_down(id)).unwrap();
        op(&mut s, |s| s.mark_out(id)).unwrap();
        assert!(!s.map.osds[&id].up && !s.map.osds[&id].is_in);
    }
    // Either may still be running, cut off from the monitor only.
    let (_, r) = new_osd(&mut s, timing(200, 10, true));
    assert_eq!(r.unwrap_err().code, ErrorCode::IncompatibleConfig);
}

#[test]
fn a_restart_is_checked_against_the_others_not_its_own_old_record() {
    let mut s = cluster(1);
    // Alone, an OSD may change its settings at will.
    boot(&mut s, OsdId(1), timing(200, 10, true)).unwrap();
    assert_eq!(s.map.osds[&OsdId(1)].lease_timing, timing(200, 10, true));
    // With another OSD at 200 ms, going back to 100 ms leaves the other's leases too long.
    new_osd(&mut s, timing(200, 10, true)).1.unwrap();
    let e = boot(&mut s, OsdId(1), default_timing()).unwrap_err();
    assert_eq!(e.code, ErrorCode::IncompatibleConfig);
    assert!(e.message.contains("a leader on osd 2"), "{}", e.message);
}

#[test]
fn osds_that_report_no_timing_are_not_compared() {
    // An OSD built before the check reports none: it boots, and others boot beside it.
    let mut s = MonState::default();
    let (old, r) = new_osd(&mut s, None);
    r.unwrap();
    assert_eq!(s.map.osds[&old].lease_timing, None);
    new_osd(&mut s, timing(200, 10, true)).1.unwrap();
    new_osd(&mut s, None).1.unwrap();
    // Its restart with a timing is checked against the recorded ones.
    let e = boot(&mut s, old, default_timing()).unwrap_err();
    assert_eq!(e.code, ErrorCode::IncompatibleConfig);
}

#[test]
fn an_out_of_range_timing_is_an_invalid_argument() {
    let mut s = cluster(1);
    for bad in [
        timing(0, 10, true),
        timing(100, 2, true),
        timing(100_000, 10, true),
    ] {
        let (_, r) = new_osd(&mut s, bad);
        assert_eq!(r.unwrap_err().code, ErrorCode::InvalidArgument, "{bad:?}");
    }
}

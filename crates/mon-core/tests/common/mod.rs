//! Helpers shared by the monitor-core tests.

use fastblock_mon_core::{MonState, OpResult};
use fastblock_types::api::BootRequest;
use fastblock_types::lease::LeaseTiming;

/// Runs one operation on the state itself and refreshes its derived parts. The monitor's
/// service runs operations on a copy it drops on failure; applying them in place here lets a
/// test see that a refused operation changes nothing by itself.
pub fn op<T>(s: &mut MonState, f: impl FnOnce(&mut MonState) -> OpResult<T>) -> OpResult<T> {
    let before = s.clone();
    let r = f(s);
    s.finish(&before);
    r
}

/// OSD `i`'s uuid: distinct per `i`, and stable across runs.
pub fn uuid(i: u32) -> String {
    format!("{i:08x}-0000-4000-8000-{i:012x}")
}

/// The boot of test OSD `i`: host `h{i}`, 1 GiB, one shard.
pub fn boot_request(i: u32, lease_timing: Option<LeaseTiming>) -> BootRequest {
    BootRequest {
        uuid: uuid(i),
        address: "127.0.0.1".into(),
        port: 7000,
        shards: 1,
        host: format!("h{i}"),
        capacity_bytes: 1 << 30,
        config: String::new(),
        lease_timing,
    }
}

/// Boots test OSDs `0..n` (ids 1..=n) into `s`.
#[allow(dead_code)] // not every test binary boots OSDs this way
pub fn boot_osds(s: &mut MonState, n: u32) {
    for i in 0..n {
        let id = op(s, |s| s.apply_id(&uuid(i))).unwrap();
        op(s, |s| s.boot(id, &boot_request(i, None))).unwrap();
    }
}

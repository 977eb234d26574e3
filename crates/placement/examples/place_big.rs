//! How long placement takes at scale: a pool of `PGS` PGs of size 3 on `OSDS` OSDs (20 per
//! host, failure domain host), then the repair after a host's OSDs go out, and the balance.
//!
//!     cargo run --release -p fastblock-placement --example place_big -- 1000 131072

use fastblock_placement::{load, place_pool, repair, PoolSpec};
use fastblock_types::map::{FailureDomain, OsdInfo};
use fastblock_types::{OsdId, PoolId};
use std::collections::BTreeMap;
use std::time::Instant;

fn main() {
    let args: Vec<u32> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (n, pgs) = (
        args.first().copied().unwrap_or(1000),
        args.get(1).copied().unwrap_or(131_072),
    );
    let mut osds = fastblock_types::osd_table::OsdTable::new();
    for id in 1..=n {
        let info: OsdInfo = serde_json::from_value(serde_json::json!({
            "id": id, "uuid": format!("u{id}"), "host": format!("h{}", (id - 1) / 20),
            "address": "10.0.0.1", "port": 6800, "up": true, "in": true, "pending_create": false,
        }))
        .unwrap();
        osds.insert(OsdId(id), info);
    }
    let spec = PoolSpec {
        pool: PoolId(1),
        pg_count: pgs,
        size: 3,
        failure_domain: FailureDomain::Host,
    };
    let t = Instant::now();
    let lists = place_pool(&spec, &osds).unwrap();
    println!("place_pool: {:?}", t.elapsed());
    let targets: BTreeMap<u32, Vec<OsdId>> = lists
        .into_iter()
        .enumerate()
        .map(|(s, l)| (s as u32, l))
        .collect();
    let l = load(&targets);
    let (min, max) = (
        l.values().map(|x| x.0).min().unwrap(),
        l.values().map(|x| x.0).max().unwrap(),
    );
    println!("members per OSD: {min}..{max}");
    for id in 1..=20 {
        osds.get_mut(&OsdId(id)).unwrap().is_in = false;
    }
    let t = Instant::now();
    let changes = repair(&spec, &targets, &osds);
    println!(
        "repair after a host out: {:?}, {} PGs changed",
        t.elapsed(),
        changes.len()
    );
}

//! What the monitor's operations cost at scale, in one process (no etcd, no HTTP): a pool of
//! `--pgs` PGs on `--osds` OSDs (20 per host), then the operations a large cluster repeats,
//! each timed as the service runs it (a copy of the state, the operation, `finish`).
//!
//!     cargo run --release -p fastblock-mon-core --example scale_ops -- 1000 131072
//!
//! The numbers feed `docs/scale.md`; the scale harness (`fastblock-scale`) measures the
//! same on a real monitor.

use fastblock_mon_core::liveness::LivenessEvent;
use fastblock_mon_core::{MonState, Reporter};
use fastblock_types::api::{BootRequest, CreatePoolRequest, LeaderElectedRequest};
use fastblock_types::map::FailureDomain;
use fastblock_types::{LogIndex, OsdId, PgId, PoolId, Term};
use std::time::Instant;

fn timed<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let out = f();
    println!("{what}: {:?}", t.elapsed());
    out
}

fn main() {
    let args: Vec<u32> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let osds = args.first().copied().unwrap_or(1000);
    let pgs = args.get(1).copied().unwrap_or(131_072);
    let mut s = MonState::default();
    timed(&format!("{osds} OSDs boot"), || {
        for i in 0..osds {
            let uuid = format!("{i:08x}-0000-4000-8000-{i:012x}");
            let id = s.apply_id(&uuid).unwrap();
            let before = s.clone();
            s.boot(
                id,
                &BootRequest {
                    uuid,
                    address: "10.0.0.1".into(),
                    port: 6800,
                    shards: 1,
                    host: format!("h{}", i / 20),
                    capacity_bytes: 1 << 40,
                    config: String::new(),
                    lease_timing: None,
                },
            )
            .unwrap();
            s.finish(&before);
        }
    });
    timed(&format!("create a pool of {pgs} PGs"), || {
        let before = s.clone();
        s.create_pool(&CreatePoolRequest {
            name: "big".into(),
            pg_count: pgs,
            size: 3,
            failure_domain: FailureDomain::Host,
        })
        .unwrap();
        s.finish(&before);
    });
    let copies = 20;
    timed(&format!("{copies} copies of the state"), || {
        for _ in 0..copies {
            std::hint::black_box(s.clone());
        }
    });
    // Every PG's first leader report, one operation each for the first 2,000.
    let pool = PoolId(1);
    let t = Instant::now();
    let n = pgs.min(2000);
    for seq in 0..n {
        let pg = PgId::new(pool, seq);
        let info = s.map.pg(pg).unwrap().clone();
        let leader = info.osdlist[0];
        let before = s.clone();
        s.leader_elected(
            pg,
            &LeaderElectedRequest {
                leader,
                term: Term(6),
                conf_index: LogIndex(5),
                voters: info.osdlist.clone(),
                voters_outgoing: Vec::new(),
                learners: Vec::new(),
            },
            Reporter::Osd(leader),
        )
        .unwrap();
        s.finish(&before);
    }
    println!(
        "{n} leader reports, one operation each: {:?} per report",
        t.elapsed() / n
    );
    {
        let before = s.clone();
        let mut c = s.clone();
        timed("  derive_pg_states", || c.derive_pg_states());
        timed("  derive_data_map", || c.derive_data_map());
        timed("  state == before", || c == before);
        timed("  validate", || c.validate().unwrap());
        timed("  damage", || c.damaged_pools());
    }
    timed("one heartbeat-like no-op operation", || {
        let before = s.clone();
        s.finish(&before)
    });
    timed("a host of 20 OSDs down", || {
        let before = s.clone();
        for id in 1..=20 {
            s.mark_down(OsdId(id)).unwrap();
        }
        s.finish(&before);
    });
    timed(
        "the same 20 OSDs out (one liveness tick: one repair)",
        || {
            let before = s.clone();
            let outs: Vec<LivenessEvent> =
                (1..=20).map(|id| LivenessEvent::Out(OsdId(id))).collect();
            s.apply_liveness(&outs).unwrap();
            s.finish(&before);
        },
    );
    let remapped = s.map.pgmaps[&pool]
        .pgs
        .values()
        .filter(|p| !p.newosdlist.is_empty())
        .count();
    println!("PGs remapped: {remapped}");
}

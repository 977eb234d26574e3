//! Client IO and recovery rates from the cumulative counters OSDs send with their heartbeats.
//!
//! Each OSD reports, per PG it leads, counters cumulative since the OSD started. A rate is the
//! difference between an OSD's last two samples divided by the time between them; the cluster
//! rate is the sum over OSDs whose last sample is recent. A restarted OSD (counters going
//! backwards) starts a new series instead of producing a negative rate.

use fastblock_types::api::{
    BackfillTooFull, ClusterUsage, IoRates, OsdSpace, PgIoCounters, PoolUsage, RecoveryStatus,
};
use fastblock_types::map::ClusterMap;
use fastblock_types::{OsdId, PgId, PoolId};
use std::collections::BTreeMap;

/// Samples older than this no longer count towards the current rate.
const SAMPLE_FRESH_MS: u64 = 5_000;

#[derive(Clone, Copy, Debug, Default)]
struct Totals {
    read_ops: u64,
    read_bytes: u64,
    write_ops: u64,
    write_bytes: u64,
    recovery_done_bytes: u64,
}

#[derive(Clone, Debug, Default)]
struct OsdSeries {
    last_ms: u64,
    last: Totals,
    rates: IoRates,
    recovery_bytes_per_sec: f64,
    recovering_pgs: u32,
    remaining_bytes: u64,
    remaining_objects: u64,
    /// Snapshot copies the OSD's PGs could not start for lack of space on the target.
    backfill_too_full: Vec<BackfillTooFull>,
    /// Its data space, from its last heartbeat that carried one.
    space: Option<OsdSpace>,
}

/// What a PG holds, from the last report of an OSD that led it.
#[derive(Clone, Copy, Debug, Default)]
struct PgHeld {
    objects: u64,
    stored_bytes: u64,
}

#[derive(Clone, Debug, Default)]
pub struct IoStats {
    osds: BTreeMap<OsdId, OsdSeries>,
    /// Kept across leader changes and OSD restarts: a PG's data does not go away when its
    /// leader does, and its next leader reports within a heartbeat.
    pgs: BTreeMap<PgId, PgHeld>,
    /// The OSDs' op tracker reports (slow ops).
    pub ops: crate::op_reports::OpReports,
    /// Each OSD's auth floor, from its last heartbeat (health `AUTH_DOWNGRADE_REFUSED`).
    pub auth_floors: BTreeMap<OsdId, fastblock_types::auth::AuthMode>,
}

fn rate(now: u64, before: u64, dt_ms: u64) -> f64 {
    now.saturating_sub(before) as f64 * 1000.0 / dt_ms as f64
}

impl IoStats {
    pub fn record(
        &mut self,
        osd: OsdId,
        now_ms: u64,
        pgs: &[PgIoCounters],
        backfill_too_full: &[BackfillTooFull],
        space: Option<OsdSpace>,
    ) {
        for pg in pgs {
            if let Some(id) = pg.pg {
                self.pgs.insert(
                    id,
                    PgHeld {
                        objects: pg.objects,
                        stored_bytes: pg.stored_bytes,
                    },
                );
            }
        }
        let mut t = Totals::default();
        let mut recovering = 0;
        let (mut rem_bytes, mut rem_objects) = (0, 0);
        for pg in pgs {
            t.read_ops += pg.read_ops;
            t.read_bytes += pg.read_bytes;
            t.write_ops += pg.write_ops;
            t.write_bytes += pg.write_bytes;
            t.recovery_done_bytes += pg.recovery_done_bytes;
            if pg.recovery_remaining_bytes > 0 || pg.recovery_remaining_objects > 0 {
                recovering += 1;
            }
            rem_bytes += pg.recovery_remaining_bytes;
            rem_objects += pg.recovery_remaining_objects;
        }
        let series = self.osds.entry(osd).or_default();
        let dt = now_ms.saturating_sub(series.last_ms);
        let went_back = t.read_ops < series.last.read_ops || t.write_ops < series.last.write_ops;
        if series.last_ms != 0 && dt > 0 && !went_back {
            series.rates = IoRates {
                read_bytes_per_sec: rate(t.read_bytes, series.last.read_bytes, dt),
                write_bytes_per_sec: rate(t.write_bytes, series.last.write_bytes, dt),
                read_ops_per_sec: rate(t.read_ops, series.last.read_ops, dt),
                write_ops_per_sec: rate(t.write_ops, series.last.write_ops, dt),
            };
            series.recovery_bytes_per_sec =
                rate(t.recovery_done_bytes, series.last.recovery_done_bytes, dt);
        } else {
            series.rates = IoRates::default();
            series.recovery_bytes_per_sec = 0.0;
        }
        series.last_ms = now_ms.max(1);
        series.last = t;
        series.recovering_pgs = recovering;
        series.remaining_bytes = rem_bytes;
        series.remaining_objects = rem_objects;
        series.backfill_too_full = backfill_too_full.to_vec();
        if space.is_some() {
            series.space = space;
        }
    }

    /// Forgets what the PGs of a deleted pool held.
    pub fn forget_pool(&mut self, pool: PoolId) {
        self.pgs.retain(|pg, _| pg.pool != pool);
    }

    /// What each pool of `map` holds, in pool id order.
    pub fn pool_usage(&self, map: &ClusterMap) -> Vec<PoolUsage> {
        map.pools
            .values()
            .map(|pool| {
                let mut u = PoolUsage {
                    pool: pool.id,
                    ..PoolUsage::default()
                };
                let pgs = map.pgmaps.get(&pool.id).map(|m| m.pgs.keys());
                for seq in pgs.into_iter().flatten() {
                    match self.pgs.get(&PgId::new(pool.id, *seq)) {
                        Some(held) => {
                            u.objects += held.objects;
                            u.stored_bytes += held.stored_bytes;
                        }
                        None => u.pgs_unreported += 1,
                    }
                }
                u.used_bytes = u.stored_bytes.saturating_mul(u64::from(pool.size));
                u
            })
            .collect()
    }

    /// The cluster's space: the pools' sums, and the data space of the OSDs that are up.
    pub fn cluster_usage(&self, map: &ClusterMap) -> ClusterUsage {
        let mut u = ClusterUsage::default();
        for p in self.pool_usage(map) {
            u.objects += p.objects;
            u.stored_bytes += p.stored_bytes;
            u.used_bytes += p.used_bytes;
        }
        for (id, series) in &self.osds {
            let up = map.osds.get(id).is_some_and(|o| o.up);
            if let (true, Some(space)) = (up, series.space) {
                u.raw_total_bytes += space.total_bytes;
                u.raw_free_bytes += space.free_bytes;
            }
        }
        u
    }

    /// The last space report of every OSD that sent one since this monitor began leading,
    /// down ones included: a new full ratio classifies them all again, so that raising it
    /// lets writes in to the PGs of a full OSD that is down (kept in under `noout`, say).
    pub fn last_spaces(&self) -> BTreeMap<OsdId, OsdSpace> {
        self.osds
            .iter()
            .filter_map(|(id, series)| Some((*id, series.space?)))
            .collect()
    }

    /// The last space report of each OSD that is up (`df`, `OSD_NEARFULL`).
    pub fn spaces(&self, map: &ClusterMap) -> BTreeMap<OsdId, OsdSpace> {
        self.osds
            .iter()
            .filter(|(id, _)| map.osds.get(id).is_some_and(|o| o.up))
            .filter_map(|(id, series)| Some((*id, series.space?)))
            .collect()
    }

    /// The refused snapshot copies the OSDs reported in their last recent heartbeats.
    pub fn backfill_too_full(&self, now_ms: u64) -> Vec<BackfillTooFull> {
        self.osds
            .values()
            .filter(|s| now_ms.saturating_sub(s.last_ms) <= SAMPLE_FRESH_MS)
            .flat_map(|s| s.backfill_too_full.iter().copied())
            .collect()
    }

    pub fn forget(&mut self, osd: OsdId) {
        self.osds.remove(&osd);
        self.ops.forget(osd);
    }

    pub fn cluster(&self, now_ms: u64) -> (IoRates, RecoveryStatus) {
        let mut io = IoRates::default();
        let mut rec = RecoveryStatus::default();
        for s in self.osds.values() {
            if now_ms.saturating_sub(s.last_ms) > SAMPLE_FRESH_MS {
                continue;
            }
            io.read_bytes_per_sec += s.rates.read_bytes_per_sec;
            io.write_bytes_per_sec += s.rates.write_bytes_per_sec;
            io.read_ops_per_sec += s.rates.read_ops_per_sec;
            io.write_ops_per_sec += s.rates.write_ops_per_sec;
            rec.recovering_pgs += s.recovering_pgs;
            rec.remaining_bytes += s.remaining_bytes;
            rec.remaining_objects += s.remaining_objects;
            rec.bytes_per_sec += s.recovery_bytes_per_sec;
        }
        (io, rec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pg(write_ops: u64, write_bytes: u64) -> PgIoCounters {
        PgIoCounters {
            write_ops,
            write_bytes,
            ..Default::default()
        }
    }

    #[test]
    fn rates_come_from_deltas_and_restarts_reset() {
        let mut s = IoStats::default();
        s.record(OsdId(1), 1000, &[pg(100, 409_600)], &[], None);
        s.record(OsdId(1), 2000, &[pg(300, 1_228_800)], &[], None);
        let (io, _) = s.cluster(2000);
        assert_eq!(io.write_ops_per_sec, 200.0);
        assert_eq!(io.write_bytes_per_sec, 819_200.0);
        // Restart: counters go back; no negative or huge rate.
        s.record(OsdId(1), 3000, &[pg(5, 20_480)], &[], None);
        assert_eq!(s.cluster(3000).0.write_ops_per_sec, 0.0);
        // Stale samples stop counting.
        s.record(OsdId(1), 4000, &[pg(105, 430_080)], &[], None);
        assert_eq!(s.cluster(4000).0.write_ops_per_sec, 100.0);
        assert_eq!(s.cluster(10_000).0.write_ops_per_sec, 0.0);
    }

    /// A monitor state with OSDs 0..3 up and pool `p` (size 3, 4 PGs), `q` (size 2, 2 PGs).
    fn state() -> fastblock_mon_core::MonState {
        use fastblock_types::api::{BootRequest, CreatePoolRequest};
        use fastblock_types::map::FailureDomain;
        let mut s = fastblock_mon_core::MonState::default();
        for i in 0..3u32 {
            let uuid = format!("{i:08x}-0000-4000-8000-{i:012x}");
            let id = s.apply_id(&uuid).unwrap();
            let boot = BootRequest {
                uuid,
                address: "127.0.0.1".into(),
                port: 7000,
                shards: 1,
                host: format!("h{i}"),
                capacity_bytes: 1 << 30,
                config: String::new(),
                lease_timing: None,
            };
            s.boot(id, &boot).unwrap();
        }
        for (name, pg_count, size) in [("p", 4, 3), ("q", 2, 2)] {
            s.create_pool(&CreatePoolRequest {
                name: name.into(),
                pg_count,
                size,
                failure_domain: FailureDomain::Osd,
            })
            .unwrap();
        }
        s
    }

    fn held(pg: PgId, objects: u64, stored_bytes: u64) -> PgIoCounters {
        PgIoCounters {
            pg: Some(pg),
            objects,
            stored_bytes,
            ..Default::default()
        }
    }

    #[test]
    fn pool_usage_sums_the_last_report_of_each_pg_times_the_pool_size() {
        let mon = state();
        let (p, q) = (
            mon.map.pool_by_name("p").unwrap().id,
            mon.map.pool_by_name("q").unwrap().id,
        );
        let osds: Vec<OsdId> = mon.map.osds.keys().copied().collect();
        let mut s = IoStats::default();
        let space = |total, free| {
            Some(OsdSpace {
                total_bytes: total,
                free_bytes: free,
                writable_bytes: None,
            })
        };
        // One OSD leads two PGs of p, another one PG of p and one of q; PG p.3 and q.1 are silent.
        let a = [
            held(PgId::new(p, 0), 2, 8192),
            held(PgId::new(p, 1), 1, 4096),
        ];
        s.record(osds[0], 1000, &a, &[], space(1000, 400));
        let b = [
            held(PgId::new(p, 2), 3, 12288),
            held(PgId::new(q, 0), 1, 4096),
        ];
        s.record(osds[1], 1000, &b, &[], space(1000, 900));
        let pools = s.pool_usage(&mon.map);
        assert_eq!(
            pools[0],
            PoolUsage {
                pool: p,
                objects: 6,
                stored_bytes: 24576,
                used_bytes: 3 * 24576,
                pgs_unreported: 1,
            }
        );
        assert_eq!((pools[1].stored_bytes, pools[1].used_bytes), (4096, 8192));
        assert_eq!(pools[1].pgs_unreported, 1);
        let c = s.cluster_usage(&mon.map);
        assert_eq!((c.stored_bytes, c.used_bytes, c.objects), (28672, 81920, 7));
        assert_eq!((c.raw_total_bytes, c.raw_free_bytes), (2000, 1300));
        // A new leader's report replaces the old one; removed data makes the sums fall.
        s.record(osds[2], 2000, &[held(PgId::new(p, 0), 0, 0)], &[], None);
        assert_eq!(s.pool_usage(&mon.map)[0].stored_bytes, 16384);
        // A heartbeat without space keeps the last one; a deleted pool is forgotten.
        s.record(osds[0], 3000, &[], &[], None);
        assert_eq!(s.cluster_usage(&mon.map).raw_total_bytes, 2000);
        s.forget_pool(p);
        assert_eq!(s.pool_usage(&mon.map)[0].pgs_unreported, 4);
    }

    /// Goal: raising the full ratio lets writes in to a full OSD that is down (its PGs keep it
    /// as a member under `noout`), not only to those that are up. Method: two OSDs report,
    /// one full; it goes down; the full ratio is raised with the reports the HTTP handler
    /// passes (`last_spaces`).
    #[test]
    fn a_new_full_ratio_classifies_down_osds_by_their_last_report() {
        let mut mon = state();
        let osds: Vec<OsdId> = mon.map.osds.keys().copied().collect();
        let mut s = IoStats::default();
        let space = |free_bytes| {
            Some(OsdSpace {
                total_bytes: 1000,
                free_bytes,
                writable_bytes: None,
            })
        };
        s.record(osds[0], 1000, &[], &[], space(500));
        s.record(osds[1], 1000, &[], &[], space(30));
        mon.record_osd_space(osds[1], space(30).unwrap());
        assert!(mon.map.space.full_osds.contains(&osds[1]));
        let before = mon.clone();
        mon.set_flag(fastblock_mon_core::osd_ops::Flag::NoOut, true);
        mon.mark_down(osds[1]).unwrap();
        mon.finish(&before);
        assert!(
            mon.map.space.full_osds.contains(&osds[1]),
            "down, still full"
        );
        assert!(
            !s.spaces(&mon.map).contains_key(&osds[1]),
            "df: up ones only"
        );
        mon.set_full_ratio(0.99, &s.last_spaces()).unwrap();
        assert!(
            mon.map.space.full_osds.is_empty(),
            "97% used is below the raised ratio"
        );
    }
}

//! Client IO and recovery rates from the cumulative counters OSDs send with their heartbeats.
//!
//! Each OSD reports, per PG it leads, counters cumulative since the OSD started. A rate is the
//! difference between an OSD's last two samples divided by the time between them; the cluster
//! rate is the sum over OSDs whose last sample is recent. A restarted OSD (counters going
//! backwards) starts a new series instead of producing a negative rate.

use fastblock_types::api::{BackfillTooFull, IoRates, PgIoCounters, RecoveryStatus};
use fastblock_types::OsdId;
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
}

#[derive(Clone, Debug, Default)]
pub struct IoStats {
    osds: BTreeMap<OsdId, OsdSeries>,
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
    ) {
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
        s.record(OsdId(1), 1000, &[pg(100, 409_600)], &[]);
        s.record(OsdId(1), 2000, &[pg(300, 1_228_800)], &[]);
        let (io, _) = s.cluster(2000);
        assert_eq!(io.write_ops_per_sec, 200.0);
        assert_eq!(io.write_bytes_per_sec, 819_200.0);
        // Restart: counters go back; no negative or huge rate.
        s.record(OsdId(1), 3000, &[pg(5, 20_480)], &[]);
        assert_eq!(s.cluster(3000).0.write_ops_per_sec, 0.0);
        // Stale samples stop counting.
        s.record(OsdId(1), 4000, &[pg(105, 430_080)], &[]);
        assert_eq!(s.cluster(4000).0.write_ops_per_sec, 100.0);
        assert_eq!(s.cluster(10_000).0.write_ops_per_sec, 0.0);
    }
}

//! Capacity: the full ratios, which OSDs are full, and what `df` shows.
//!
//! OSDs report their data space (`OsdSpace`) in every heartbeat. From those reports the
//! monitor decides here, and nowhere else:
//!
//! - **which OSDs are full** ([`MonState::record_osd_space`]): an OSD whose used share reaches
//!   the full ratio is put in the map's `space.full_osds`, and taken out by the first report
//!   below it. The map carries the set to the OSDs; the shard core's admission refuses writes
//!   to every PG with a full member (`fastblock_shard`, `space.rs`). Deciding it here, from the
//!   reports of all OSDs, means a PG leader refuses a write that a full *follower* would have
//!   to store, which the follower alone could not do without stalling the PG's log.
//! - **the ratios** ([`MonState::set_nearfull_ratio`], [`MonState::set_full_ratio`]):
//!   `0 < nearfull < full <= 1`; a new full ratio is applied at once to every OSD whose last
//!   report the caller passes.
//! - **`df`** ([`df`]): the raw space of the OSDs that are up, and per pool what it holds and
//!   the most it can still take ([`pool_max_avail_bytes`]).

use crate::state::MonState;
use crate::{err, OpResult};
use fastblock_types::api::{DfResponse, ErrorCode, OsdSpace, PoolDf, PoolUsage, RawSpace};
use fastblock_types::map::{ClusterMap, SpaceSettings, RATIO_PPM_ONE};
use fastblock_types::{OsdId, PoolId};
use std::collections::BTreeMap;

/// How full an OSD is against the ratios.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum SpaceLevel {
    Ok,
    NearFull,
    Full,
}

/// The used share of an OSD's data space in parts per million; `None` for an OSD that reports
/// no space at all (nothing to be full of).
pub fn used_ppm(space: OsdSpace) -> Option<u32> {
    if space.total_bytes == 0 {
        return None;
    }
    let used = u128::from(space.total_bytes.saturating_sub(space.free_bytes));
    let ppm = used * u128::from(RATIO_PPM_ONE) / u128::from(space.total_bytes);
    Some(ppm as u32)
}

/// Where an OSD's report stands against the ratios: a share equal to a ratio is past it.
pub fn classify(space: OsdSpace, settings: &SpaceSettings) -> SpaceLevel {
    match used_ppm(space) {
        Some(ppm) if ppm >= settings.full_ratio_ppm => SpaceLevel::Full,
        Some(ppm) if ppm >= settings.nearfull_ratio_ppm => SpaceLevel::NearFull,
        _ => SpaceLevel::Ok,
    }
}

/// A ratio from the API (a fraction, `0.85`) in parts per million, refused unless it is a
/// number in (0, 1] that does not round to 0.
pub fn ratio_ppm(ratio: f64) -> OpResult<u32> {
    if !ratio.is_finite() || ratio <= 0.0 || ratio > 1.0 {
        return err(
            ErrorCode::InvalidArgument,
            format!("a ratio must be above 0 and at most 1, not {ratio}"),
        );
    }
    let ppm = (ratio * f64::from(RATIO_PPM_ONE)).round() as u32;
    if ppm == 0 {
        return err(
            ErrorCode::InvalidArgument,
            format!("ratio {ratio} is below one part per million"),
        );
    }
    Ok(ppm)
}

fn check_order(nearfull_ppm: u32, full_ppm: u32) -> OpResult<()> {
    if nearfull_ppm >= full_ppm {
        return err(
            ErrorCode::InvalidArgument,
            format!(
                "the nearfull ratio ({}) must be below the full ratio ({})",
                f64::from(nearfull_ppm) / f64::from(RATIO_PPM_ONE),
                f64::from(full_ppm) / f64::from(RATIO_PPM_ONE)
            ),
        );
    }
    Ok(())
}

impl MonState {
    /// Sets the ratio past which health warns (`OSD_NEARFULL`); it must stay below the full
    /// ratio.
    pub fn set_nearfull_ratio(&mut self, ratio: f64) -> OpResult<()> {
        let ppm = ratio_ppm(ratio)?;
        check_order(ppm, self.map.space.full_ratio_ppm)?;
        self.map.space.nearfull_ratio_ppm = ppm;
        Ok(())
    }

    /// Sets the ratio past which an OSD is full; it must stay above the nearfull ratio. The
    /// OSDs with a report in `spaces` are classified again at once (the others on their next
    /// report).
    pub fn set_full_ratio(
        &mut self,
        ratio: f64,
        spaces: &BTreeMap<OsdId, OsdSpace>,
    ) -> OpResult<()> {
        let ppm = ratio_ppm(ratio)?;
        check_order(self.map.space.nearfull_ratio_ppm, ppm)?;
        self.map.space.full_ratio_ppm = ppm;
        for (osd, space) in spaces {
            self.record_osd_space(*osd, *space);
        }
        Ok(())
    }

    /// Unmarks the OSDs that are out (run by [`MonState::finish`]): their PGs move off them, so
    /// their fullness no longer stops writes nor raises `OSD_FULL`. One that comes back in is
    /// classified again by its next report.
    pub(crate) fn derive_full_osds(&mut self) {
        let osds = &self.map.osds;
        self.map
            .space
            .full_osds
            .retain(|id| osds.get(id).is_some_and(|o| o.is_in));
    }

    /// Whether [`MonState::record_osd_space`] would change the map.
    pub fn space_report_changes(&self, osd: OsdId, space: OsdSpace) -> bool {
        if !self.map.osds.contains_key(&osd) {
            return false;
        }
        let full = classify(space, &self.map.space) == SpaceLevel::Full;
        full != self.map.space.full_osds.contains(&osd)
    }

    /// An OSD's space report: marks it full in the map once its used share reaches the full
    /// ratio, and not full once a report is below it. Changes the map only when the OSD's
    /// fullness changes, so steady reports cost no epoch.
    pub fn record_osd_space(&mut self, osd: OsdId, space: OsdSpace) {
        if !self.map.osds.contains_key(&osd) {
            return;
        }
        let settings = &mut self.map.space;
        if classify(space, settings) == SpaceLevel::Full {
            settings.full_osds.insert(osd);
        } else {
            settings.full_osds.remove(&osd);
        }
    }
}

/// The bytes of one copy pool `pool` can still take before the first OSD it places on reaches
/// the full ratio, if the new data spreads over its PGs evenly (as objects hash over them).
///
/// An OSD that is a member of `r` of the pool's `n` PGs receives `r / n` of every byte written
/// to the pool (each PG keeps one copy on each member). It stops taking writes after
/// `headroom` more bytes, the smaller of `total × full_ratio − used` (the monitor marks it
/// full) and `writable` (a shard reaches its own data reserve, see
/// [`OsdSpace::writable_bytes`]; `free` from OSDs that do not report it), 0 when past either;
/// so the pool can take `headroom × n / r` more; the pool's figure is the smallest over its
/// OSDs. Both halves assume new data spreads evenly (over the PGs, and over each OSD's
/// shards): PGs hash unevenly onto shards, so a shard can refuse writes somewhat earlier. The
/// members counted are the PGs' targets (`newosdlist` while remapping, else `osdlist`): where
/// the data ends up. OSDs without a report in `spaces` (down, or not reported since the
/// monitor started leading) are left out; a pool none of whose OSDs reported has 0. Other
/// pools sharing the OSDs are not accounted for: their writes take from the same headroom, as
/// in Ceph's `MAX AVAIL`.
pub fn pool_max_avail_bytes(
    map: &ClusterMap,
    pool: PoolId,
    spaces: &BTreeMap<OsdId, OsdSpace>,
) -> u64 {
    let Some(pgmap) = map.pgmaps.get(&pool) else {
        return 0;
    };
    let pg_count = pgmap.pgs.len() as u128;
    let mut memberships: BTreeMap<OsdId, u128> = BTreeMap::new();
    for pg in pgmap.pgs.values() {
        let target = if pg.newosdlist.is_empty() {
            &pg.osdlist
        } else {
            &pg.newosdlist
        };
        for osd in target {
            *memberships.entry(*osd).or_default() += 1;
        }
    }
    let full_ppm = u128::from(map.space.full_ratio_ppm);
    memberships
        .iter()
        .filter_map(|(osd, r)| {
            let s = spaces.get(osd)?;
            let limit = u128::from(s.total_bytes) * full_ppm / u128::from(RATIO_PPM_ONE);
            let used = u128::from(s.total_bytes.saturating_sub(s.free_bytes));
            let writable = u128::from(s.writable_bytes.unwrap_or(s.free_bytes));
            let headroom = limit.saturating_sub(used).min(writable);
            Some(headroom * pg_count / r)
        })
        .min()
        .map_or(0, |b| u64::try_from(b).unwrap_or(u64::MAX))
}

/// The raw space of the OSDs that are up: the sums of their last reports (`spaces`).
pub fn raw_space(map: &ClusterMap, spaces: &BTreeMap<OsdId, OsdSpace>) -> RawSpace {
    let mut raw = RawSpace::default();
    for osd in map.osds.values().filter(|o| o.up && !o.pending_create) {
        match spaces.get(&osd.id) {
            Some(s) => {
                raw.total_bytes += s.total_bytes;
                raw.avail_bytes += s.free_bytes.min(s.total_bytes);
                raw.used_bytes += s.total_bytes.saturating_sub(s.free_bytes);
            }
            None => raw.osds_unreported += 1,
        }
    }
    raw
}

/// `df`: the raw space and, per pool in id order, what it holds (`usage`, from the PG leaders'
/// reports) and the most it can still take.
pub fn df(map: &ClusterMap, usage: &[PoolUsage], spaces: &BTreeMap<OsdId, OsdSpace>) -> DfResponse {
    let pools = map
        .pools
        .values()
        .map(|pool| {
            let u = usage.iter().find(|u| u.pool == pool.id);
            let u = u.cloned().unwrap_or_default();
            PoolDf {
                pool: pool.id,
                name: pool.name.clone(),
                size: pool.size,
                objects: u.objects,
                stored_bytes: u.stored_bytes,
                used_bytes: u.used_bytes,
                max_avail_bytes: pool_max_avail_bytes(map, pool.id, spaces),
                pgs_unreported: u.pgs_unreported,
            }
        })
        .collect();
    DfResponse {
        raw: raw_space(map, spaces),
        pools,
        nearfull_ratio_ppm: map.space.nearfull_ratio_ppm,
        full_ratio_ppm: map.space.full_ratio_ppm,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fastblock_types::api::{BootRequest, CreatePoolRequest};
    use fastblock_types::map::FailureDomain;

    const GIB: u64 = 1 << 30;

    /// `osds` OSDs up and pool "p" of `pg_count` PGs and `size` replicas over them.
    fn state(osds: u32, pg_count: u32, size: u32) -> MonState {
        let mut s = MonState::default();
        for i in 0..osds {
            let uuid = format!("{i:08x}-0000-4000-8000-{i:012x}");
            let id = s.apply_id(&uuid).unwrap();
            let boot = BootRequest {
                uuid,
                address: "127.0.0.1".into(),
                port: 7000,
                shards: 1,
                host: format!("h{i}"),
                capacity_bytes: GIB,
                config: String::new(),
                lease_timing: None,
            };
            s.boot(id, &boot).unwrap();
        }
        s.create_pool(&CreatePoolRequest {
            name: "p".into(),
            pg_count,
            size,
            failure_domain: FailureDomain::Osd,
        })
        .unwrap();
        s
    }

    fn space(total_bytes: u64, free_bytes: u64) -> OsdSpace {
        OsdSpace {
            total_bytes,
            free_bytes,
            writable_bytes: None,
        }
    }

    /// A report from an OSD whose shards can take `writable_bytes` more before their reserve.
    fn space_writable(total_bytes: u64, free_bytes: u64, writable_bytes: u64) -> OsdSpace {
        OsdSpace {
            writable_bytes: Some(writable_bytes),
            ..space(total_bytes, free_bytes)
        }
    }

    #[test]
    fn ratios_are_validated_and_kept_ordered() {
        let mut s = state(3, 4, 3);
        let none = BTreeMap::new();
        for bad in [0.0, -0.1, 1.01, f64::NAN, f64::INFINITY, 1e-9] {
            assert!(s.set_full_ratio(bad, &none).is_err(), "{bad}");
            assert!(s.set_nearfull_ratio(bad).is_err(), "{bad}");
        }
        // Nearfull must stay below full, whichever is set.
        assert!(s.set_nearfull_ratio(0.95).is_err());
        assert!(s.set_full_ratio(0.85, &none).is_err());
        s.set_nearfull_ratio(0.5).unwrap();
        s.set_full_ratio(1.0, &none).unwrap();
        assert_eq!(s.map.space.nearfull_ratio_ppm, 500_000);
        assert_eq!(s.map.space.full_ratio_ppm, 1_000_000);
        assert!(s.set_full_ratio(0.5, &none).is_err());
        s.set_full_ratio(0.6, &none).unwrap();
        assert_eq!(s.map.space.full_ratio_ppm, 600_000);
    }

    #[test]
    fn an_osd_is_full_from_the_full_ratio_and_not_after_a_report_below_it() {
        let mut s = state(3, 4, 3);
        let osd = *s.map.osds.keys().next().unwrap();
        let settings = s.map.space.clone();
        assert_eq!(classify(space(1000, 151), &settings), SpaceLevel::Ok);
        assert_eq!(classify(space(1000, 150), &settings), SpaceLevel::NearFull);
        assert_eq!(classify(space(1000, 50), &settings), SpaceLevel::Full);
        assert_eq!(classify(space(0, 0), &settings), SpaceLevel::Ok);
        s.record_osd_space(osd, space(1000, 60));
        assert!(s.map.space.full_osds.is_empty());
        s.record_osd_space(osd, space(1000, 50));
        assert!(s.map.space.full_osds.contains(&osd));
        // A lower full ratio applies to the reports passed at once.
        s.record_osd_space(osd, space(1000, 400));
        assert!(s.map.space.full_osds.is_empty());
        s.set_nearfull_ratio(0.3).unwrap();
        let reports = BTreeMap::from([(osd, space(1000, 400))]);
        s.set_full_ratio(0.6, &reports).unwrap();
        assert!(s.map.space.full_osds.contains(&osd));
        // An OSD the map does not know is ignored.
        s.record_osd_space(OsdId(99), space(1000, 0));
        assert!(!s.map.space.full_osds.contains(&OsdId(99)));
        // Down, it stays full (its PGs still hold it); out, it is unmarked, and its reports
        // while out do not mark it again.
        let before = s.clone();
        s.mark_down(osd).unwrap();
        s.finish(&before);
        assert!(s.map.space.full_osds.contains(&osd));
        let before = s.clone();
        s.mark_out(osd).unwrap();
        s.record_osd_space(osd, space(1000, 0));
        s.finish(&before);
        assert!(s.map.space.full_osds.is_empty());
    }

    #[test]
    fn max_avail_is_the_fullest_osds_headroom_scaled_by_its_share_of_the_pool() {
        // Three OSDs, three replicas: each holds a whole copy.
        let s = state(3, 8, 3);
        let osds: Vec<OsdId> = s.map.osds.keys().copied().collect();
        let mut spaces: BTreeMap<OsdId, OsdSpace> = osds
            .iter()
            .map(|o| (*o, space(100 * GIB, 100 * GIB)))
            .collect();
        let pool = s.map.pool_by_name("p").unwrap().id;
        // 95 GiB before the full ratio on each; one copy of everything on each.
        assert_eq!(pool_max_avail_bytes(&s.map, pool, &spaces), 95 * GIB);
        // The fullest OSD decides.
        spaces.insert(osds[1], space(100 * GIB, 40 * GIB));
        assert_eq!(pool_max_avail_bytes(&s.map, pool, &spaces), 35 * GIB);
        // Past the full ratio: nothing.
        spaces.insert(osds[1], space(100 * GIB, 2 * GIB));
        assert_eq!(pool_max_avail_bytes(&s.map, pool, &spaces), 0);
        // No report at all: nothing known, nothing promised.
        assert_eq!(pool_max_avail_bytes(&s.map, pool, &BTreeMap::new()), 0);

        // Six OSDs, three replicas: each OSD holds about half of the pool's data, so the pool
        // takes twice the headroom of its fullest OSD (scaled by that OSD's own share).
        let s = state(6, 64, 3);
        let pool = s.map.pool_by_name("p").unwrap().id;
        let osds: Vec<OsdId> = s.map.osds.keys().copied().collect();
        let spaces: BTreeMap<OsdId, OsdSpace> = osds
            .iter()
            .map(|o| (*o, space(100 * GIB, 100 * GIB)))
            .collect();
        // Each OSD holds about half (64 PGs × 3 copies over 6 OSDs), the fullest a little
        // more: a bit under twice 95 GiB, never more.
        let avail = pool_max_avail_bytes(&s.map, pool, &spaces);
        assert!(avail > 180 * GIB && avail <= 190 * GIB, "{avail}");
    }

    #[test]
    fn max_avail_stops_at_the_shards_reserve_before_the_full_ratio() {
        // Three OSDs, three replicas: each holds a whole copy.
        let s = state(3, 8, 3);
        let pool = s.map.pool_by_name("p").unwrap().id;
        let osds: Vec<OsdId> = s.map.osds.keys().copied().collect();
        let mut spaces: BTreeMap<OsdId, OsdSpace> = osds
            .iter()
            .map(|o| (*o, space_writable(100 * GIB, 100 * GIB, 100 * GIB)))
            .collect();
        // Room to the reserve beyond the full ratio: the ratio decides.
        assert_eq!(pool_max_avail_bytes(&s.map, pool, &spaces), 95 * GIB);
        // A small OSD whose reserve (or a fuller shard) leaves 1 GiB writable while the full
        // ratio would leave 4.5 GiB: its shards refuse writes first.
        spaces.insert(osds[2], space_writable(10 * GIB, 10 * GIB, GIB));
        assert_eq!(pool_max_avail_bytes(&s.map, pool, &spaces), GIB);
        // Nothing writable: nothing promised, though below the full ratio.
        spaces.insert(osds[2], space_writable(10 * GIB, 10 * GIB, 0));
        assert_eq!(pool_max_avail_bytes(&s.map, pool, &spaces), 0);
    }

    #[test]
    fn df_sums_the_up_osds_and_lists_every_pool() {
        let mut s = state(3, 4, 3);
        let osds: Vec<OsdId> = s.map.osds.keys().copied().collect();
        let spaces: BTreeMap<OsdId, OsdSpace> = [
            (osds[0], space(10 * GIB, 4 * GIB)),
            (osds[1], space(10 * GIB, 6 * GIB)),
        ]
        .into();
        s.mark_down(osds[1]).unwrap();
        let pool = s.map.pool_by_name("p").unwrap().id;
        let usage = [PoolUsage {
            pool,
            objects: 3,
            stored_bytes: GIB,
            used_bytes: 3 * GIB,
            pgs_unreported: 1,
        }];
        let d = df(&s.map, &usage, &spaces);
        // osd 1 is down: not counted; osd 2 is up without a report.
        assert_eq!(
            d.raw,
            RawSpace {
                total_bytes: 10 * GIB,
                used_bytes: 6 * GIB,
                avail_bytes: 4 * GIB,
                osds_unreported: 1,
            }
        );
        assert_eq!(d.pools.len(), 1);
        let p = &d.pools[0];
        assert_eq!((p.objects, p.stored_bytes, p.used_bytes), (3, GIB, 3 * GIB));
        assert_eq!(p.size, 3);
        assert_eq!(p.pgs_unreported, 1);
        assert_eq!(
            p.max_avail_bytes,
            pool_max_avail_bytes(&s.map, pool, &spaces)
        );
        assert_eq!(d.full_ratio_ppm, 950_000);
    }
}

//! PG replicas per OSD, bounded as Ceph's `mon_max_pg_per_osd` bounds them: every PG replica
//! costs its OSD a Raft group (memory, log, heartbeats, an election after a failure) whatever
//! data it holds, so a pool that would pile thousands on a few OSDs is refused when it is
//! created, with the count and the limit, and `health` warns about OSDs over the limit
//! (`TOO_MANY_PGS`: after OSDs went out, or after the limit was lowered).
//!
//! A PG counts on the OSDs it settles on: its target (`newosdlist`) while it moves, its
//! members (`osdlist`) otherwise.

use crate::health::{check, Health};
use crate::{err, MonState, OpResult};
use fastblock_types::api::{CreatePoolRequest, ErrorCode, Severity};
use fastblock_types::map::{ClusterMap, PoolInfo};
use fastblock_types::OsdId;
use std::collections::BTreeMap;

/// PG replicas per OSD over every pool (OSDs carrying none are absent).
pub fn pgs_per_osd(map: &ClusterMap) -> BTreeMap<OsdId, u32> {
    let mut out: BTreeMap<OsdId, u32> = BTreeMap::new();
    for pgmap in map.pgmaps.values() {
        for pg in pgmap.pgs.values() {
            let settles_on = if pg.newosdlist.is_empty() {
                &pg.osdlist
            } else {
                &pg.newosdlist
            };
            for osd in settles_on {
                *out.entry(*osd).or_default() += 1;
            }
        }
    }
    out
}

impl MonState {
    /// Creates the pool as [`MonState::create_pool`] does, unless it would put more than
    /// `pg_per_osd_max` PG replicas on some OSD (`too_many_pgs`; the caller discards the
    /// state, as after any refused operation).
    pub fn create_pool_within(
        &mut self,
        req: &CreatePoolRequest,
        pg_per_osd_max: u32,
    ) -> OpResult<PoolInfo> {
        let pool = self.create_pool(req)?;
        let counts = pgs_per_osd(&self.map);
        let worst = counts.iter().max_by_key(|(_, n)| **n);
        if let Some((osd, n)) = worst.filter(|(_, n)| **n > pg_per_osd_max) {
            let osds = counts.len().max(1) as u64;
            let others: u64 = counts.values().map(|n| u64::from(*n)).sum::<u64>()
                - u64::from(req.pg_count) * u64::from(req.size);
            // The most PGs the pool could have within the limit, spread evenly.
            let room = (u64::from(pg_per_osd_max) * osds).saturating_sub(others)
                / u64::from(req.size.max(1));
            return err(
                ErrorCode::TooManyPgs,
                format!(
                    "pool {:?} ({} PGs of {} replicas) would put {n} PG replicas on osd.{osd}, \
                     more than max_pg_per_osd {pg_per_osd_max}: give it fewer PGs (about {room} \
                     fit), add OSDs, or raise the limit (fastblock-client config set mon \
                     max_pg_per_osd N, or --max-pg-per-osd)",
                    req.name, req.pg_count, req.size
                ),
            );
        }
        Ok(pool)
    }
}

impl Health {
    /// Adds `TOO_MANY_PGS` (WARN) for the OSDs that carry more than `pg_per_osd_max` PG
    /// replicas, one detail line each.
    pub fn add_too_many_pgs(&mut self, map: &ClusterMap, pg_per_osd_max: u32) {
        let over: Vec<String> = pgs_per_osd(map)
            .into_iter()
            .filter(|(_, n)| *n > pg_per_osd_max)
            .map(|(osd, n)| format!("osd.{osd} carries {n} PG replicas"))
            .collect();
        if over.is_empty() {
            return;
        }
        let summary = match over.len() {
            1 => format!("1 osd carries more than {pg_per_osd_max} PG replicas (max_pg_per_osd)"),
            n => format!("{n} osds carry more than {pg_per_osd_max} PG replicas (max_pg_per_osd)"),
        };
        self.push(check("TOO_MANY_PGS", Severity::Warn, summary, over));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::PG_PER_OSD_MAX_DEFAULT;
    use fastblock_types::api::BootRequest;
    use fastblock_types::map::FailureDomain;

    fn cluster(osds: u32) -> MonState {
        let mut s = MonState::default();
        for i in 0..osds {
            let uuid = format!("0b6b3c2e-7d2f-4c59-9a55-8c2f1a1e2b{i:02}");
            let id = s.apply_id(&uuid).unwrap();
            s.boot(
                id,
                &BootRequest {
                    uuid,
                    address: "127.0.0.1".into(),
                    port: 7000,
                    shards: 1,
                    host: format!("h{i}"),
                    capacity_bytes: 1 << 30,
                    config: String::new(),
                    lease_timing: None,
                },
            )
            .unwrap();
        }
        s
    }

    fn pool(name: &str, pg_count: u32) -> CreatePoolRequest {
        CreatePoolRequest {
            name: name.into(),
            pg_count,
            size: 3,
            failure_domain: FailureDomain::Osd,
        }
    }

    /// As the service runs an operation: on a copy, kept only if it succeeded.
    fn create(s: &mut MonState, req: &CreatePoolRequest, max: u32) -> OpResult<PoolInfo> {
        let mut next = s.clone();
        let out = next.create_pool_within(req, max)?;
        next.finish(s);
        *s = next;
        Ok(out)
    }

    #[test]
    fn a_pool_over_the_limit_is_refused_naming_the_count_and_the_limit() {
        let mut s = cluster(4);
        let e = create(&mut s, &pool("big", 4096), PG_PER_OSD_MAX_DEFAULT).unwrap_err();
        assert_eq!(e.code, ErrorCode::TooManyPgs);
        // 4,096 PGs of 3 on 4 OSDs: 3,072 each; 333 fit.
        assert!(e.message.contains("would put 3072 PG replicas"), "{e}");
        assert!(e.message.contains("max_pg_per_osd 250"), "{e}");
        assert!(e.message.contains("about 333 fit"), "{e}");
        // Within the limit: created, and a second pool counts the first one's PGs.
        assert!(s.map.pools.is_empty(), "nothing created");
        create(&mut s, &pool("a", 256), PG_PER_OSD_MAX_DEFAULT).unwrap();
        assert_eq!(pgs_per_osd(&s.map).values().sum::<u32>(), 256 * 3);
        let e = create(&mut s, &pool("b", 128), PG_PER_OSD_MAX_DEFAULT).unwrap_err();
        assert!(e.message.contains("about 77 fit"), "{e}");
        s.create_pool_within(&pool("b", 64), PG_PER_OSD_MAX_DEFAULT)
            .unwrap();
        assert!(s.create_pool_within(&pool("c", 4096), 4096 * 3).is_ok());
    }

    #[test]
    fn health_warns_about_osds_over_the_limit() {
        let mut s = cluster(4);
        create(&mut s, &pool("a", 256), PG_PER_OSD_MAX_DEFAULT).unwrap();
        let mut h = crate::health::health(&s, &[]);
        h.add_too_many_pgs(&s.map, PG_PER_OSD_MAX_DEFAULT);
        assert!(h.checks.iter().all(|c| c.code != "TOO_MANY_PGS"), "{h:?}");
        // The limit lowered: every OSD carries 192.
        h.add_too_many_pgs(&s.map, 100);
        let c = h.checks.iter().find(|c| c.code == "TOO_MANY_PGS").unwrap();
        assert_eq!(
            c.summary,
            "4 osds carry more than 100 PG replicas (max_pg_per_osd)"
        );
        assert_eq!(c.detail[0], "osd.1 carries 192 PG replicas");
        assert_eq!(h.status, "HEALTH_WARN");
    }
}

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
    /// `pg_per_osd_max` PG replicas on some OSD (`too_many_pgs`, and nothing changes). The
    /// pool is placed on a copy (which shares the other pools' PGs) and counted there.
    pub fn create_pool_within(
        &mut self,
        req: &CreatePoolRequest,
        pg_per_osd_max: u32,
    ) -> OpResult<PoolInfo> {
        let mut next = self.clone();
        let pool = next.create_pool(req)?;
        let counts = pgs_per_osd(&next.map);
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
        *self = next;
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

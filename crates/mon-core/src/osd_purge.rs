//! Purging an OSD: removing one that is gone for good (a dead disk, a decommissioned host)
//! from the cluster, as Ceph's `osd purge` does, with the checks that make it safe.
//!
//! What a purge removes: the OSD's record (`osds/<id>` in etcd), its key (`osd.N`, if the key
//! table has one) and, through [`MonState::finish`], its place in the full-OSD set. What it
//! keeps: the id counter. Ids are never reused (an invariant of [`MonState`]), so a purged id
//! is **retired**, not freed: the next OSD gets a new id, unlike Ceph, where the id is freed.
//! A retired id is one below the counter with no record, which is how a later boot, heartbeat
//! or signed call of the purged OSD is told apart from an id that never existed
//! ([`MonState::missing_osd_error`]).
//!
//! What a purge refuses (`osd_in_use`): an OSD that is up (it would come back at its next
//! heartbeat, and may serve PGs), one that is in (placement still targets it), and one that any
//! PG still names as a member: `osdlist`, `newosdlist`, `learners` or `joint_voters`. A PG
//! names an out OSD until its leader reported the membership change that moved the PG off it,
//! so while it does, the OSD may hold the only copy of some acknowledged write (a PG that is
//! `down` cannot move at all). A pool whose PG map is missing (damaged, `crate::damage`) also
//! refuses every purge: nothing says which OSDs hold its PGs.

use crate::damage::PoolDamage;
use crate::state::MonState;
use crate::{err, OpResult};
use fastblock_auth::EntityName;
use fastblock_types::api::{ApiError, ErrorCode};
use fastblock_types::{OsdId, PgId};

/// PGs named in a refusal at most (the count is always given).
const REFUSAL_PGS_NAMED_MAX: usize = 8;

impl MonState {
    /// Whether `id` was given to an OSD that has since been purged: below the id counter, with
    /// no record (apply-id creates the record with the id, and only a purge removes it).
    pub fn is_purged(&self, id: OsdId) -> bool {
        id.0 >= 1 && id.0 < self.counters.next_osd_id && !self.map.osds.contains_key(&id)
    }

    /// The error for a call about OSD `id`, which has no record: purged, or never created.
    pub fn missing_osd_error(&self, id: OsdId) -> ApiError {
        if self.is_purged(id) {
            ApiError::new(
                ErrorCode::OsdNotFound,
                format!(
                    "osd {id} was purged from the cluster: its id is retired and its data \
                     belongs to no PG; to use this disk again, format it as a new OSD \
                     (`fastblock-osd --mkfs --force`), which gets a new id"
                ),
            )
        } else {
            ApiError::new(ErrorCode::OsdNotFound, format!("osd {id} does not exist"))
        }
    }

    /// The PGs that name `id` as a member, current, target, learner or incoming voter.
    pub fn pgs_naming(&self, id: OsdId) -> Vec<PgId> {
        let mut pgs = Vec::new();
        for (pool, pgmap) in &self.map.pgmaps {
            for (seq, pg) in &pgmap.pgs {
                let named = [&pg.osdlist, &pg.newosdlist, &pg.learners, &pg.joint_voters]
                    .iter()
                    .any(|list| list.contains(&id));
                if named {
                    pgs.push(PgId {
                        pool: *pool,
                        seq: *seq,
                    });
                }
            }
        }
        pgs
    }

    /// Removes OSD `id` for good: its record and its key; its id is retired (module docs).
    /// Refused with `osd_in_use` unless it is down, out and no PG names it.
    pub fn purge_osd(&mut self, id: OsdId) -> OpResult<()> {
        let Some(osd) = self.map.osds.get(&id) else {
            return Err(self.missing_osd_error(id));
        };
        if osd.up {
            return err(
                ErrorCode::OsdInUse,
                format!(
                    "osd {id} is up: stop its daemon first, then mark it out \
                     (`fastblock-client osd out {id}`) and wait until no PG names it"
                ),
            );
        }
        if osd.is_in {
            return err(
                ErrorCode::OsdInUse,
                format!(
                    "osd {id} is in: mark it out (`fastblock-client osd out {id}`) and wait \
                     until its PGs have moved to other OSDs"
                ),
            );
        }
        let pgs = self.pgs_naming(id);
        if !pgs.is_empty() {
            let named: Vec<String> = pgs
                .iter()
                .take(REFUSAL_PGS_NAMED_MAX)
                .map(ToString::to_string)
                .collect();
            let more = pgs.len().saturating_sub(REFUSAL_PGS_NAMED_MAX);
            return err(
                ErrorCode::OsdInUse,
                format!(
                    "osd {id} is still a member of {} PG{} ({}{}): it may hold data no other \
                     replica has; wait until they have moved off it (`fastblock-client pg ls`), \
                     which needs the other members of each PG up",
                    pgs.len(),
                    if pgs.len() == 1 { "" } else { "s" },
                    named.join(", "),
                    if more > 0 {
                        format!(" and {more} more")
                    } else {
                        String::new()
                    }
                ),
            );
        }
        let unknown = self
            .damaged_pools()
            .into_iter()
            .find(|(_, damage)| *damage == PoolDamage::PgMapMissing);
        if let Some((pool, _)) = unknown {
            return err(
                ErrorCode::OsdInUse,
                format!(
                    "pool {pool} has no PG map (its records are damaged, see `health`): \
                     nothing says whether osd {id} holds its data; restore or remove the pool \
                     first"
                ),
            );
        }
        std::sync::Arc::make_mut(&mut self.map.osds).remove(&id);
        let entity = EntityName::Osd(id);
        if self.auth.entities.contains_key(&entity) {
            self.auth.entities.remove(&entity);
            self.map.auth.epoch += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fastblock_auth::{Caps, Secret};
    use fastblock_types::api::BootRequest;
    use fastblock_types::map::{FailureDomain, PgInfo};
    use fastblock_types::PoolId;

    const UUIDS: [&str; 4] = [
        "00000000-0000-4000-8000-000000000001",
        "00000000-0000-4000-8000-000000000002",
        "00000000-0000-4000-8000-000000000003",
        "00000000-0000-4000-8000-000000000004",
    ];

    /// Four booted OSDs (ids 1-4) on hosts h1-h4, each with a key.
    fn cluster() -> MonState {
        let mut s = MonState::default();
        for (i, uuid) in UUIDS.iter().enumerate() {
            let id = s.apply_id(uuid).unwrap();
            s.boot(
                id,
                &BootRequest {
                    uuid: uuid.to_string(),
                    address: "127.0.0.1".into(),
                    port: 6800 + i as u16,
                    shards: 1,
                    host: format!("h{}", i + 1),
                    capacity_bytes: 1 << 30,
                    config: String::new(),
                    lease_timing: None,
                },
            )
            .unwrap();
            s.auth.entities.insert(
                EntityName::Osd(id),
                entity_with(Secret::generate().unwrap()),
            );
        }
        let before = MonState::default();
        s.finish(&before);
        s
    }

    fn entity_with(key: Secret) -> crate::auth_ops::AuthEntity {
        crate::auth_ops::AuthEntity {
            key,
            caps: Caps::osd(),
            generation: 1,
        }
    }

    /// One PG of pool 1 with `osdlist` as its members (the pool record is made to fit).
    fn with_pg(s: &mut MonState, osdlist: &[u32]) {
        s.create_pool(&fastblock_types::api::CreatePoolRequest {
            name: "p".into(),
            pg_count: 1,
            size: osdlist.len() as u32,
            failure_domain: FailureDomain::Osd,
        })
        .unwrap();
        let pg = s
            .map
            .pgmaps
            .get_mut(&PoolId(1))
            .unwrap()
            .pgs
            .get_mut(&0)
            .unwrap();
        *pg = PgInfo {
            osdlist: osdlist.iter().map(|&i| OsdId(i)).collect(),
            ..pg.clone()
        };
    }

    fn purge(s: &mut MonState, id: u32) -> OpResult<bool> {
        let before = s.clone();
        s.purge_osd(OsdId(id))?;
        Ok(s.finish(&before))
    }

    #[test]
    fn refuses_an_osd_that_is_up_or_in() {
        let mut s = cluster();
        let e = purge(&mut s, 2).unwrap_err();
        assert_eq!(e.code, ErrorCode::OsdInUse);
        assert!(e.message.contains("osd 2 is up"), "{e}");
        s.mark_down(OsdId(2)).unwrap();
        let e = purge(&mut s, 2).unwrap_err();
        assert_eq!(e.code, ErrorCode::OsdInUse);
        assert!(e.message.contains("osd 2 is in"), "{e}");
        assert!(s.map.osds.contains_key(&OsdId(2)));
    }

    #[test]
    fn refuses_an_osd_that_a_pg_still_names() {
        for field in ["osdlist", "newosdlist", "learners", "joint_voters"] {
            let mut s = cluster();
            with_pg(&mut s, &[1, 2, 3]);
            let pg = s
                .map
                .pgmaps
                .get_mut(&PoolId(1))
                .unwrap()
                .pgs
                .get_mut(&0)
                .unwrap();
            let list = match field {
                "osdlist" => &mut pg.osdlist,
                "newosdlist" => &mut pg.newosdlist,
                "learners" => &mut pg.learners,
                _ => &mut pg.joint_voters,
            };
            if field == "osdlist" {
                list.push(OsdId(4));
            } else {
                *list = vec![OsdId(4)];
            }
            s.mark_down(OsdId(4)).unwrap();
            std::sync::Arc::make_mut(&mut s.map.osds)
                .get_mut(&OsdId(4))
                .unwrap()
                .is_in = false;
            let e = s.purge_osd(OsdId(4)).unwrap_err();
            assert_eq!(e.code, ErrorCode::OsdInUse, "{field}");
            assert!(e.message.contains("member of 1 PG (1.0)"), "{field}: {e}");
        }
    }

    #[test]
    fn refuses_while_a_pool_has_no_pg_map() {
        let mut s = cluster();
        with_pg(&mut s, &[1, 2, 3]);
        s.map.pgmaps.clear();
        s.refresh_damage();
        s.mark_down(OsdId(4)).unwrap();
        std::sync::Arc::make_mut(&mut s.map.osds)
            .get_mut(&OsdId(4))
            .unwrap()
            .is_in = false;
        let e = s.purge_osd(OsdId(4)).unwrap_err();
        assert_eq!(e.code, ErrorCode::OsdInUse);
        assert!(e.message.contains("pool 1 has no PG map"), "{e}");
    }

    #[test]
    fn purges_a_down_out_unused_osd_and_retires_its_id() {
        let mut s = cluster();
        with_pg(&mut s, &[1, 2, 3]);
        s.mark_down(OsdId(4)).unwrap();
        s.mark_out(OsdId(4)).unwrap();
        s.map.space.full_osds.insert(OsdId(4));
        let epoch = s.map.epoch;
        let auth_epoch = s.map.auth.epoch;
        assert!(purge(&mut s, 4).unwrap(), "a purge changes the map");
        assert!(!s.map.osds.contains_key(&OsdId(4)));
        assert!(!s.auth.entities.contains_key(&EntityName::Osd(OsdId(4))));
        assert!(!s.map.space.full_osds.contains(&OsdId(4)));
        assert_eq!(s.map.epoch.0, epoch.0 + 1);
        assert_eq!(
            s.map.auth.epoch,
            auth_epoch + 1,
            "OSDs refetch the key table"
        );
        // Retired: the next OSD gets a new id, and the purged one is told apart.
        assert!(s.is_purged(OsdId(4)));
        assert!(!s.is_purged(OsdId(5)), "never given");
        assert!(!s.is_purged(OsdId(3)), "exists");
        let new = s.apply_id("00000000-0000-4000-8000-000000000005").unwrap();
        assert_eq!(new, OsdId(5));
        let e = s.missing_osd_error(OsdId(4));
        assert_eq!(e.code, ErrorCode::OsdNotFound);
        assert!(e.message.contains("osd 4 was purged"), "{e}");
        let e = s.missing_osd_error(OsdId(9));
        assert_eq!(e.message, "osd 9 does not exist");
    }

    #[test]
    fn a_purged_osd_cannot_boot_heartbeat_or_be_purged_again() {
        let mut s = cluster();
        s.mark_down(OsdId(4)).unwrap();
        s.mark_out(OsdId(4)).unwrap();
        purge(&mut s, 4).unwrap();
        let boot = BootRequest {
            uuid: UUIDS[3].into(),
            address: "127.0.0.1".into(),
            port: 6803,
            shards: 1,
            host: "h4".into(),
            capacity_bytes: 1 << 30,
            config: String::new(),
            lease_timing: None,
        };
        let e = s.boot(OsdId(4), &boot).unwrap_err();
        assert!(e.message.contains("was purged"), "{e}");
        let e = s.mark_up(OsdId(4)).unwrap_err();
        assert!(e.message.contains("was purged"), "{e}");
        let e = s.purge_osd(OsdId(4)).unwrap_err();
        assert_eq!(e.code, ErrorCode::OsdNotFound);
        assert!(e.message.contains("was purged"), "{e}");
    }

    #[test]
    fn an_osd_that_never_booted_can_be_purged() {
        let mut s = MonState::default();
        let id = s.apply_id(UUIDS[0]).unwrap();
        s.finish(&MonState::default());
        assert!(purge(&mut s, id.0).unwrap());
        assert!(s.is_purged(id));
    }
}

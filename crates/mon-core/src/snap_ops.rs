//! Image snapshots and clones: the monitor's records and decisions (`docs/mon-api.md`,
//! "Snapshots"). The data path does the rest through its Raft logs.
//!
//! A snapshot is recorded `creating`; the PG leaders of the image's pool each apply a snap
//! mark through their log (refusing writes to the image from then on, retryably) and confirm
//! ([`MonState::snap_pg_done`]). When every PG of the pool confirmed, the snapshot becomes
//! `created` and writes flow again: no write is acknowledged between the first mark and that
//! epoch. A snapshot still `creating` after the timeout is aborted ([`MonState::tick_snaps`],
//! [`MonState::abort_snap_create`]) and, like a removed snapshot, leaves a trim entry telling
//! every PG to drop what it marked; the entry goes once every PG confirmed
//! ([`MonState::snap_trim_pg_done`]).
//!
//! Dependencies are refused, never cascaded: a protected snapshot or one with clones cannot
//! be removed, an image with snapshots or clones cannot be removed, and only a `created`,
//! protected snapshot can be cloned (a snapshot of a clone too, up to [`CLONE_DEPTH_MAX`]
//! parents deep). A clone reads through to its parent until the client copied the data in
//! and called `flatten-done`; a snapshot of a clone records the clone's overlap of that
//! moment, which its reads of the parent stop at.

use crate::state::MonState;
use crate::{err, OpResult};
use fastblock_types::api::{ApiError, CloneRequest, ErrorCode};
use fastblock_types::map::{ImageInfo, ParentSpec, SnapInfo, SnapState, SnapTrimEntry};
use fastblock_types::names::validate_name;
use fastblock_types::{ImageId, PgId, SnapId};
use std::collections::BTreeSet;

/// What [`MonState::abort_snap_create`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SnapAbort {
    /// Every PG confirmed in time after all: nothing was aborted.
    Created(SnapInfo),
    /// The snapshot was removed and a trim entry recorded; these PGs had not confirmed.
    Aborted { missing_pgs: Vec<PgId> },
    /// The snapshot is gone already (aborted by the tick, or removed).
    Gone,
}

/// The most parents a clone may read through (a clone of a snapshot of a clone ...): every
/// read of data not copied up walks the chain.
pub const CLONE_DEPTH_MAX: usize = 8;

/// The trim reason of a snapshot removed by the operator.
pub const TRIM_REASON_REMOVED: &str = "removed";
/// The trim reason of a snapshot whose creation timed out.
pub const TRIM_REASON_TIMED_OUT: &str = "create timed out";

fn names_of(snaps: &[&SnapInfo]) -> String {
    snaps
        .iter()
        .map(|s| s.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

fn clone_names(children: &[ImageInfo]) -> String {
    children
        .iter()
        .map(|c| format!("{}/{}", c.pool_name, c.name))
        .collect::<Vec<_>>()
        .join(", ")
}

impl MonState {
    /// The error of a snapshot create that timed out, naming the PGs that did not confirm.
    pub fn snap_timed_out_error(
        &self,
        snap: &SnapInfo,
        missing_pgs: &[PgId],
        timeout_ms: u64,
    ) -> ApiError {
        let pool = self
            .map
            .pools
            .get(&snap.pool)
            .map_or_else(|| snap.pool.to_string(), |p| p.name.clone());
        let pgs: Vec<String> = missing_pgs.iter().map(|p| p.to_string()).collect();
        let pgs = if pgs.is_empty() {
            "none (aborted while the last confirmation arrived)".to_string()
        } else {
            format!("{}: {}", pgs.len(), pgs.join(", "))
        };
        ApiError::new(
            ErrorCode::SnapCreateTimedOut,
            format!(
                "snapshot {pool}/{}@{} aborted: PGs that did not confirm its mark within \
                 {timeout_ms} ms: {pgs}",
                snap.image_name, snap.name
            ),
        )
    }

    /// The live snapshots of `image`, sorted by id.
    pub fn snaps_of_image(&self, image: ImageId) -> &[SnapInfo] {
        self.snaps.get(&image).map_or(&[], |v| v.as_slice())
    }

    /// The snapshots of `pool/name`, sorted by id.
    pub fn list_snaps(&self, pool: &str, name: &str) -> OpResult<Vec<SnapInfo>> {
        let image = self.image(pool, name)?;
        Ok(self.snaps_of_image(image.id).to_vec())
    }

    /// Snapshot `snap` of `pool/name`, with its image.
    pub fn snap(&self, pool: &str, name: &str, snap: &str) -> OpResult<(ImageInfo, SnapInfo)> {
        let image = self.image(pool, name)?.clone();
        match self
            .snaps_of_image(image.id)
            .iter()
            .find(|s| s.name == snap)
        {
            Some(s) => Ok((image, s.clone())),
            None => err(
                ErrorCode::SnapNotFound,
                format!("snapshot {pool}/{name}@{snap} does not exist"),
            ),
        }
    }

    /// Snapshot `snap` of image `image` by ids, if it is live.
    pub fn snap_by_id(&self, image: ImageId, snap: SnapId) -> Option<&SnapInfo> {
        self.snaps_of_image(image).iter().find(|s| s.id == snap)
    }

    fn snap_mut(&mut self, image: ImageId, snap: SnapId) -> Option<&mut SnapInfo> {
        self.snaps
            .get_mut(&image)?
            .iter_mut()
            .find(|s| s.id == snap)
    }

    /// Every image cloned from snapshot `snap` of `image` (still reading through to it).
    pub fn children_of(&self, image: ImageId, snap: SnapId) -> Vec<ImageInfo> {
        self.images
            .values()
            .filter(|i| {
                i.parent
                    .as_ref()
                    .is_some_and(|p| p.image == image && p.snap == snap)
            })
            .cloned()
            .collect()
    }

    /// The clones of `pool/name@snap`.
    pub fn snap_children(&self, pool: &str, name: &str, snap: &str) -> OpResult<Vec<ImageInfo>> {
        let (image, snap) = self.snap(pool, name, snap)?;
        Ok(self.children_of(image.id, snap.id))
    }

    /// The PGs of the snapshot's pool that have not confirmed its mark.
    pub fn snap_missing_pgs(&self, snap: &SnapInfo) -> Vec<PgId> {
        let Some(pgmap) = self.map.pgmaps.get(&snap.pool) else {
            return Vec::new();
        };
        pgmap
            .pgs
            .keys()
            .filter(|seq| !snap.done_pgs.contains(seq))
            .map(|seq| PgId::new(snap.pool, *seq))
            .collect()
    }

    /// Records a new snapshot of `pool/name`, `creating`, with the image's current size.
    /// `now_ms` is the monitor's clock (Unix milliseconds), for the create timeout.
    pub fn create_snap(
        &mut self,
        pool: &str,
        name: &str,
        snap_name: &str,
        now_ms: u64,
    ) -> OpResult<SnapInfo> {
        let image = self.image(pool, name)?.clone();
        self.check_pool_usable(image.pool)?;
        if let Err(e) = validate_name(snap_name) {
            return err(ErrorCode::InvalidArgument, format!("snapshot name: {e}"));
        }
        // Already refused by the alphabet above; said again because `pool/image@snap` is
        // how snapshots are named, so these two must never become legal by a change there.
        if snap_name.contains('@') || snap_name.contains('/') {
            return err(
                ErrorCode::InvalidArgument,
                format!("snapshot name {snap_name:?} must not contain '@' or '/'"),
            );
        }
        if self
            .snaps_of_image(image.id)
            .iter()
            .any(|s| s.name == snap_name)
        {
            return err(
                ErrorCode::SnapExists,
                format!("snapshot {pool}/{name}@{snap_name} already exists"),
            );
        }
        let live = self.snaps_of_image(image.id).len();
        if live >= SnapId::LIVE_PER_IMAGE_MAX {
            return err(
                ErrorCode::TooLarge,
                format!(
                    "{pool}/{name} has {live} snapshots, the most an image may have \
                     ({}): remove some first",
                    SnapId::LIVE_PER_IMAGE_MAX
                ),
            );
        }
        let id = image.snap_seq + 1;
        if id >= SnapId::LIMIT {
            return err(
                ErrorCode::TooLarge,
                format!(
                    "{pool}/{name} has used all {} snapshot ids (ids are never reused): \
                     copy the image to a new one to take more snapshots",
                    SnapId::LIMIT - 1
                ),
            );
        }
        let snap = SnapInfo {
            id: SnapId(id),
            pool: image.pool,
            image: image.id,
            image_name: image.name.clone(),
            name: snap_name.to_string(),
            state: SnapState::Creating,
            size_bytes: image.size_bytes,
            object_size_bytes: image.object_size_bytes,
            created_epoch: self.next_epoch(),
            protected: false,
            done_pgs: BTreeSet::new(),
            started_at_ms: now_ms,
            // Where the clone had not copied up, the snapshot reads its parent within the
            // overlap of this moment (`clone_data`).
            parent_overlap_bytes: image.parent.as_ref().map(|p| p.overlap_bytes),
        };
        self.images
            .get_mut(&(image.pool, image.name.clone()))
            .expect("image looked up above")
            .snap_seq = id;
        let list = self.snaps.entry(image.id).or_default();
        assert!(
            list.last().is_none_or(|last| last.id < snap.id),
            "snapshot ids of image {} must increase: {} after {:?}",
            image.id,
            snap.id,
            list.last().map(|s| s.id)
        );
        list.push(snap.clone());
        Ok(snap)
    }

    /// The leader of `pg` confirms it applied the mark of snapshot `snap` of `image` through
    /// its log. Idempotent. Once every PG of the pool confirmed, the snapshot is `created`
    /// (and its `done_pgs` cleared). Returns whether it is created.
    pub fn snap_pg_done(&mut self, image: ImageId, snap: SnapId, pg: PgId) -> OpResult<bool> {
        let Some(found) = self.snap_by_id(image, snap) else {
            return err(
                ErrorCode::SnapNotFound,
                format!("no snapshot {snap} of image {image} (removed or aborted)"),
            );
        };
        let pool = found.pool;
        if pg.pool != pool {
            return err(
                ErrorCode::InvalidArgument,
                format!("snapshot {snap} of image {image} is in pool {pool}, not pg {pg}"),
            );
        }
        self.check_pool_usable(pool)?;
        let Some(pgmap) = self.map.pgmaps.get(&pool) else {
            return err(ErrorCode::PgNotFound, format!("pool {pool} has no PG map"));
        };
        if !pgmap.pgs.contains_key(&pg.seq) {
            return err(ErrorCode::PgNotFound, format!("no pg {pg}"));
        }
        let entry = self.snap_mut(image, snap).expect("looked up above");
        if entry.state == SnapState::Created {
            return Ok(true);
        }
        entry.done_pgs.insert(pg.seq);
        let done = &self
            .snap_by_id(image, snap)
            .expect("looked up above")
            .done_pgs;
        let created = self.map.pgmaps.get(&pool).is_some_and(|m| m.all_in(done));
        if created {
            let entry = self.snap_mut(image, snap).expect("looked up above");
            entry.state = SnapState::Created;
            entry.done_pgs.clear();
        }
        Ok(created)
    }

    fn push_snap_trim(&mut self, snap: &SnapInfo, reason: &str) -> u64 {
        let id = self.counters.next_snap_trim_id;
        self.counters.next_snap_trim_id += 1;
        let entry = SnapTrimEntry {
            id,
            pool: snap.pool,
            image: snap.image,
            image_name: snap.image_name.clone(),
            snap: snap.id,
            reason: reason.to_string(),
            epoch: self.next_epoch(),
            done_pgs: BTreeSet::new(),
        };
        self.snap_trims.insert(id, entry);
        id
    }

    /// Drops a live snapshot from the records (and the image's list if it empties).
    fn drop_snap(&mut self, image: ImageId, snap: SnapId) -> SnapInfo {
        let list = self.snaps.get_mut(&image).expect("the image has snapshots");
        let index = list
            .iter()
            .position(|s| s.id == snap)
            .expect("the snapshot is live");
        let gone = list.remove(index);
        if list.is_empty() {
            self.snaps.remove(&image);
        }
        gone
    }

    /// Aborts the creation of snapshot `snap` of `image` when its create call gave up waiting:
    /// if it is still `creating`, it is removed and a trim entry recorded.
    pub fn abort_snap_create(&mut self, image: ImageId, snap: SnapId) -> OpResult<SnapAbort> {
        let Some(found) = self.snap_by_id(image, snap).cloned() else {
            return Ok(SnapAbort::Gone);
        };
        if found.state == SnapState::Created {
            return Ok(SnapAbort::Created(found));
        }
        let missing_pgs = self.snap_missing_pgs(&found);
        self.drop_snap(image, snap);
        self.push_snap_trim(&found, TRIM_REASON_TIMED_OUT);
        Ok(SnapAbort::Aborted { missing_pgs })
    }

    /// Aborts every snapshot still `creating` `timeout_ms` after it was recorded (by the
    /// monitor's clock, `now_ms`; a start in the future, after a leader change to a monitor
    /// whose clock is behind, waits until it passes). Returns the aborted ones.
    pub fn tick_snaps(&mut self, now_ms: u64, timeout_ms: u64) -> Vec<SnapInfo> {
        let stale: Vec<SnapInfo> = self
            .snaps
            .values()
            .flatten()
            .filter(|s| {
                s.state == SnapState::Creating
                    && now_ms.saturating_sub(s.started_at_ms) >= timeout_ms
            })
            .cloned()
            .collect();
        for snap in &stale {
            self.drop_snap(snap.image, snap.id);
            self.push_snap_trim(snap, TRIM_REASON_TIMED_OUT);
        }
        stale
    }

    /// Removes snapshot `snap` of `pool/name` and records a trim entry for its data. Refused
    /// while it is still being created, protected, or has clones.
    pub fn remove_snap(&mut self, pool: &str, name: &str, snap: &str) -> OpResult<SnapInfo> {
        let (image, found) = self.snap(pool, name, snap)?;
        self.check_pool_usable(image.pool)?;
        // Its create call is still waiting for the PGs; it ends, created or aborted, within
        // the create timeout.
        if found.state == SnapState::Creating {
            return err(
                ErrorCode::SnapNotReady,
                format!(
                    "snapshot {pool}/{name}@{snap} is still being created; remove it once it \
                     is created (or it is aborted when its create times out)"
                ),
            );
        }
        if found.protected {
            return err(
                ErrorCode::SnapInUse,
                format!("snapshot {pool}/{name}@{snap} is protected; unprotect it first"),
            );
        }
        let children = self.children_of(image.id, found.id);
        if !children.is_empty() {
            return err(
                ErrorCode::SnapInUse,
                format!(
                    "snapshot {pool}/{name}@{snap} has {} clone(s): {}; remove or flatten them first",
                    children.len(),
                    clone_names(&children)
                ),
            );
        }
        let gone = self.drop_snap(image.id, found.id);
        self.push_snap_trim(&gone, TRIM_REASON_REMOVED);
        Ok(gone)
    }

    /// Protects (`true`) or unprotects snapshot `snap` of `pool/name`. Idempotent. Only a
    /// `created` snapshot can be protected; unprotecting is refused while clones of it exist.
    pub fn protect_snap(
        &mut self,
        pool: &str,
        name: &str,
        snap: &str,
        protected: bool,
    ) -> OpResult<SnapInfo> {
        let (image, found) = self.snap(pool, name, snap)?;
        self.check_pool_usable(image.pool)?;
        if protected && found.state != SnapState::Created {
            return err(
                ErrorCode::SnapNotReady,
                format!("snapshot {pool}/{name}@{snap} is still being created"),
            );
        }
        if !protected {
            let children = self.children_of(image.id, found.id);
            if !children.is_empty() {
                return err(
                    ErrorCode::SnapInUse,
                    format!(
                        "snapshot {pool}/{name}@{snap} has {} clone(s): {}; flatten or remove them first",
                        children.len(),
                        clone_names(&children)
                    ),
                );
            }
        }
        let entry = self.snap_mut(image.id, found.id).expect("looked up above");
        entry.protected = protected;
        Ok(entry.clone())
    }

    /// Creates image `req.pool/req.name` as a clone of the protected, `created` snapshot
    /// `snap` of `pool/name`: same object size, the snapshot's size, no data of its own yet.
    pub fn clone_snap(
        &mut self,
        pool: &str,
        name: &str,
        snap: &str,
        req: &CloneRequest,
    ) -> OpResult<ImageInfo> {
        let (parent, found) = self.snap(pool, name, snap)?;
        self.check_pool_usable(parent.pool)?;
        if found.state != SnapState::Created {
            return err(
                ErrorCode::SnapNotReady,
                format!("snapshot {pool}/{name}@{snap} is still being created"),
            );
        }
        if !found.protected {
            return err(
                ErrorCode::SnapNotReady,
                format!("snapshot {pool}/{name}@{snap} is not protected; protect it first"),
            );
        }
        let depth = self.clone_depth(parent.id) + 1;
        if depth > CLONE_DEPTH_MAX {
            return err(
                ErrorCode::TooLarge,
                format!(
                    "{pool}/{name} is a clone {} levels deep; a clone of its snapshot would \
                     read through {depth} parents, more than {CLONE_DEPTH_MAX}: flatten it first",
                    depth - 1
                ),
            );
        }
        let target = self.pool_by_name(&req.pool)?.clone();
        self.check_pool_usable(target.id)?;
        if let Err(e) = validate_name(&req.name) {
            return err(ErrorCode::InvalidArgument, format!("image name: {e}"));
        }
        let key = (target.id, req.name.clone());
        if self.images.contains_key(&key) {
            return err(
                ErrorCode::ImageExists,
                format!("image {}/{} already exists", req.pool, req.name),
            );
        }
        let image = ImageInfo {
            id: ImageId(self.counters.next_image_id),
            pool: target.id,
            pool_name: target.name.clone(),
            name: req.name.clone(),
            size_bytes: found.size_bytes,
            object_size_bytes: found.object_size_bytes,
            created_epoch: self.next_epoch(),
            snap_seq: 0,
            parent: Some(ParentSpec {
                pool: parent.pool,
                image: parent.id,
                image_name: parent.name.clone(),
                pool_name: parent.pool_name.clone(),
                snap: found.id,
                snap_name: found.name.clone(),
                overlap_bytes: found.size_bytes,
            }),
        };
        self.counters.next_image_id += 1;
        self.images.insert(key, image.clone());
        Ok(image)
    }

    /// How many parents `image` reads through (0: not a clone).
    pub fn clone_depth(&self, image: ImageId) -> usize {
        let mut depth = 0;
        let mut at = image;
        while let Some(p) = self
            .images
            .values()
            .find(|i| i.id == at)
            .and_then(|i| i.parent.as_ref())
        {
            depth += 1;
            at = p.image;
            // Parents are older images: a chain cannot loop. Bounded anyway.
            assert!(
                depth <= self.images.len(),
                "image {image}: its parent chain loops"
            );
        }
        depth
    }

    /// The client copied every byte the clone `pool/name` read from its parent into the clone:
    /// it no longer depends on the parent. Idempotent.
    pub fn flatten_done(&mut self, pool: &str, name: &str) -> OpResult<ImageInfo> {
        let image = self.image(pool, name)?.clone();
        self.check_pool_usable(image.pool)?;
        let entry = self
            .images
            .get_mut(&(image.pool, image.name.clone()))
            .expect("image looked up above");
        entry.parent = None;
        Ok(entry.clone())
    }

    /// Why `image` cannot be removed because of snapshots: it has some, or it is the parent
    /// of clones.
    pub(crate) fn check_no_snap_dependents(&self, image: &ImageInfo) -> OpResult<()> {
        let what = format!("{}/{}", image.pool_name, image.name);
        let snaps: Vec<&SnapInfo> = self.snaps_of_image(image.id).iter().collect();
        if !snaps.is_empty() {
            return err(
                ErrorCode::SnapInUse,
                format!(
                    "{what}: image has {} snapshots: {}; remove them first",
                    snaps.len(),
                    names_of(&snaps)
                ),
            );
        }
        let children: Vec<ImageInfo> = self
            .images
            .values()
            .filter(|i| i.parent.as_ref().is_some_and(|p| p.image == image.id))
            .cloned()
            .collect();
        if !children.is_empty() {
            return err(
                ErrorCode::SnapInUse,
                format!(
                    "{what}: image is the parent of {} clone(s): {}; flatten or remove them first",
                    children.len(),
                    clone_names(&children)
                ),
            );
        }
        Ok(())
    }

    /// The leader of `pg` confirms it applied trim entry `id` through its log. The entry goes
    /// once every PG of its pool confirmed. Returns whether it went.
    pub fn snap_trim_pg_done(&mut self, id: u64, pg: PgId) -> OpResult<bool> {
        let Some(pool) = self.snap_trims.get(&id).map(|e| e.pool) else {
            return err(
                ErrorCode::SnapTrimNotFound,
                format!("no snapshot trim entry {id}"),
            );
        };
        if pg.pool != pool {
            return err(
                ErrorCode::InvalidArgument,
                format!("snapshot trim {id} is for pool {pool}, not pg {pg}"),
            );
        }
        self.check_pool_usable(pool)?;
        let Some(pgmap) = self.map.pgmaps.get(&pool) else {
            return err(ErrorCode::PgNotFound, format!("pool {pool} has no PG map"));
        };
        if !pgmap.pgs.contains_key(&pg.seq) {
            return err(ErrorCode::PgNotFound, format!("no pg {pg}"));
        }
        let entry = self.snap_trims.get_mut(&id).expect("looked up above");
        entry.done_pgs.insert(pg.seq);
        let finished = pgmap.all_in(&entry.done_pgs);
        if finished {
            self.snap_trims.remove(&id);
        }
        Ok(finished)
    }

    /// Drops the snapshot records of the images of a deleted pool, and its trim entries.
    pub(crate) fn forget_snaps_of_pool(&mut self, pool: fastblock_types::PoolId) {
        self.snaps
            .retain(|_, list| list.first().is_none_or(|s| s.pool != pool));
        self.snap_trims.retain(|_, t| t.pool != pool);
    }

    /// Images of other pools cloned from an image of `pool`: deleting `pool` would leave
    /// them without their parent.
    pub(crate) fn clones_outside_pool(&self, pool: fastblock_types::PoolId) -> Vec<ImageInfo> {
        self.images
            .values()
            .filter(|i| i.pool != pool && i.parent.as_ref().is_some_and(|p| p.pool == pool))
            .cloned()
            .collect()
    }

    /// Checks of the snapshot records not confined to one pool, for [`MonState::validate`].
    pub(crate) fn validate_snaps(&self) -> Result<(), String> {
        for (image, list) in &self.snaps {
            let mut last = 0;
            for snap in list {
                if snap.image != *image {
                    return Err(format!(
                        "snapshot {} listed under image {image} names image {}",
                        snap.id, snap.image
                    ));
                }
                if snap.id.0 <= last {
                    return Err(format!(
                        "snapshots of image {image} not in increasing id order at {}",
                        snap.id
                    ));
                }
                if snap.id.0 >= SnapId::LIMIT {
                    return Err(format!(
                        "snapshot {} of image {image} at or beyond the id limit",
                        snap.id
                    ));
                }
                last = snap.id.0;
            }
            if let Some(owner) = self.images.values().find(|i| i.id == *image) {
                if owner.snap_seq < last {
                    return Err(format!(
                        "image {image} has snapshot {last} beyond its snap_seq {}",
                        owner.snap_seq
                    ));
                }
            }
        }
        for id in self.snap_trims.keys() {
            if *id >= self.counters.next_snap_trim_id {
                return Err(format!("snapshot trim id {id} not below counter"));
            }
        }
        Ok(())
    }
}

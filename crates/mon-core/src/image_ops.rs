//! Images: create, remove, resize, and the reclaim list that makes the data path delete the
//! objects of removed images and of shrunk tails, so that no data leaks.

use crate::limits::{
    IMAGE_SIZE_ALIGN_BYTES, IMAGE_SIZE_MAX_BYTES, OBJECT_SIZE_DEFAULT_BYTES, OBJECT_SIZE_MAX_BYTES,
    OBJECT_SIZE_MIN_BYTES,
};
use crate::state::MonState;
use crate::{err, OpResult};
use fastblock_types::api::{CreateImageRequest, ErrorCode, ResizeImageRequest};
use fastblock_types::map::{ImageExtent, ImageInfo, ImageTable, ReclaimEntry};
use fastblock_types::names::validate_name;
use fastblock_types::units::format_size;
use fastblock_types::{ImageId, PgId};

fn check_size(size_bytes: u64) -> OpResult<()> {
    if size_bytes == 0 {
        return err(
            ErrorCode::InvalidArgument,
            "image size must be greater than 0",
        );
    }
    if size_bytes > IMAGE_SIZE_MAX_BYTES {
        return err(
            ErrorCode::TooLarge,
            format!(
                "image size {} exceeds the maximum of {}",
                format_size(size_bytes),
                format_size(IMAGE_SIZE_MAX_BYTES)
            ),
        );
    }
    if size_bytes % IMAGE_SIZE_ALIGN_BYTES != 0 {
        return err(
            ErrorCode::InvalidArgument,
            format!("image size {size_bytes} is not a multiple of {IMAGE_SIZE_ALIGN_BYTES} bytes"),
        );
    }
    Ok(())
}

impl MonState {
    pub fn image(&self, pool: &str, name: &str) -> OpResult<&ImageInfo> {
        let pool_id = self.pool_by_name(pool)?.id;
        match self.images.get(&(pool_id, name.to_string())) {
            Some(image) => Ok(image),
            None => err(
                ErrorCode::ImageNotFound,
                format!("image {pool}/{name} does not exist"),
            ),
        }
    }

    pub fn create_image(&mut self, req: &CreateImageRequest) -> OpResult<ImageInfo> {
        let pool = self.pool_by_name(&req.pool)?.clone();
        self.check_pool_usable(pool.id)?;
        if let Err(e) = validate_name(&req.name) {
            return err(ErrorCode::InvalidArgument, format!("image name: {e}"));
        }
        check_size(req.size_bytes)?;
        let object_size = req.object_size_bytes.unwrap_or(OBJECT_SIZE_DEFAULT_BYTES);
        if !object_size.is_power_of_two()
            || !(OBJECT_SIZE_MIN_BYTES..=OBJECT_SIZE_MAX_BYTES).contains(&object_size)
        {
            return err(
                ErrorCode::InvalidArgument,
                format!(
                    "object size {object_size} must be a power of two between {} and {}",
                    format_size(OBJECT_SIZE_MIN_BYTES),
                    format_size(OBJECT_SIZE_MAX_BYTES)
                ),
            );
        }
        let key = (pool.id, req.name.clone());
        if self.images.contains_key(&key) {
            return err(
                ErrorCode::ImageExists,
                format!("image {}/{} already exists", req.pool, req.name),
            );
        }
        let image = ImageInfo {
            id: ImageId(self.counters.next_image_id),
            pool: pool.id,
            pool_name: pool.name.clone(),
            name: req.name.clone(),
            size_bytes: req.size_bytes,
            object_size_bytes: object_size,
            created_epoch: self.next_epoch(),
            snap_seq: 0,
            parent: None,
        };
        self.counters.next_image_id += 1;
        self.images.insert(key, image.clone());
        Ok(image)
    }

    fn push_reclaim(&mut self, image: &ImageInfo, from_bytes: u64, to_bytes: u64, reason: &str) {
        assert!(from_bytes < to_bytes, "empty reclaim range");
        let id = self.counters.next_reclaim_id;
        self.counters.next_reclaim_id += 1;
        let entry = ReclaimEntry {
            id,
            pool: image.pool,
            image: image.id,
            image_name: image.name.clone(),
            object_size_bytes: image.object_size_bytes,
            from_bytes,
            to_bytes,
            reason: reason.to_string(),
            epoch: self.next_epoch(),
            done_pgs: Default::default(),
        };
        self.reclaim.insert(id, entry);
    }

    /// Removes an image's metadata and records its whole range for the data path to delete.
    /// Refused while the image has snapshots or clones (`crate::snap_ops`).
    pub fn remove_image(&mut self, pool: &str, name: &str) -> OpResult<ImageInfo> {
        let image = self.image(pool, name)?.clone();
        // Its reclaim could never be confirmed by the pool's PGs; `pool rm` removes it all.
        self.check_pool_usable(image.pool)?;
        self.check_no_snap_dependents(&image)?;
        self.images.remove(&(image.pool, image.name.clone()));
        self.push_reclaim(&image, 0, image.size_bytes, "image removed");
        Ok(image)
    }

    /// Grows an image, or shrinks it when `allow_shrink` is set; a shrink records the cut range
    /// for deletion, so a later grow reads zeros there rather than old data.
    pub fn resize_image(
        &mut self,
        pool: &str,
        name: &str,
        req: &ResizeImageRequest,
    ) -> OpResult<ImageInfo> {
        check_size(req.size_bytes)?;
        let old = self.image(pool, name)?.clone();
        self.check_pool_usable(old.pool)?;
        if req.size_bytes > old.size_bytes {
            // A grow over a range still being deleted would let that deletion remove the new
            // data written there: wait until the leaders confirmed it.
            if let Some(r) = self
                .reclaim
                .values()
                .find(|r| r.image == old.id && r.from_bytes < req.size_bytes)
            {
                return err(
                    ErrorCode::ReclaimPending,
                    format!(
                        "{pool}/{name}: bytes from {} on are still being deleted (reclaim {}, {} of {} PGs done); retry",
                        r.from_bytes,
                        r.id,
                        r.done_pgs.len(),
                        self.map.pgmaps.get(&r.pool).map_or(0, |m| m.pgs.len())
                    ),
                );
            }
        }
        if req.size_bytes < old.size_bytes {
            if !req.allow_shrink {
                return err(
                    ErrorCode::ShrinkRefused,
                    format!(
                        "shrinking {pool}/{name} from {} to {} discards data; pass allow_shrink",
                        format_size(old.size_bytes),
                        format_size(req.size_bytes)
                    ),
                );
            }
            self.push_reclaim(&old, req.size_bytes, old.size_bytes, "image shrunk");
        }
        let image = self
            .images
            .get_mut(&(old.pool, old.name.clone()))
            .expect("image looked up above");
        image.size_bytes = req.size_bytes;
        // A clone shrunk below its overlap no longer reads that tail from its parent, even if
        // it grows again: the tail reads zeros, as in any image (Ceph cuts the overlap too).
        if let Some(p) = &mut image.parent {
            p.overlap_bytes = p.overlap_bytes.min(req.size_bytes);
        }
        Ok(image.clone())
    }

    /// The leader of `pg` confirms that the range of reclaim entry `id` is deleted from it
    /// (applied through its log on every member). The entry goes once every PG of its pool
    /// confirmed. Returns whether it went.
    pub fn reclaim_pg_done(&mut self, id: u64, pg: PgId) -> OpResult<bool> {
        let Some(pool) = self.reclaim.get(&id).map(|e| e.pool) else {
            return err(ErrorCode::ReclaimNotFound, format!("no reclaim entry {id}"));
        };
        if pg.pool != pool {
            return err(
                ErrorCode::InvalidArgument,
                format!("reclaim {id} is for pool {pool}, not pg {pg}"),
            );
        }
        self.check_pool_usable(pool)?;
        let Some(pgmap) = self.map.pgmaps.get(&pool) else {
            return err(ErrorCode::PgNotFound, format!("pool {pool} has no PG map"));
        };
        if !pgmap.pgs.contains_key(&pg.seq) {
            return err(ErrorCode::PgNotFound, format!("no pg {pg}"));
        }
        let Some(entry) = self.reclaim.get_mut(&id) else {
            return err(ErrorCode::ReclaimNotFound, format!("no reclaim entry {id}"));
        };
        entry.done_pgs.insert(pg.seq);
        let finished = pgmap.all_in(&entry.done_pgs);
        if finished {
            self.reclaim.remove(&id);
        }
        Ok(finished)
    }

    /// Copies what the data path needs from the image, reclaim, snapshot and scrub records
    /// into the map: the image table (for fencing IO), the pending reclaims, the live
    /// snapshots, the pending snapshot trims and the pending scrub requests (for the PG
    /// leaders).
    pub fn derive_data_map(&mut self) {
        self.map.images = Some(ImageTable {
            next_id: self.counters.next_image_id,
            images: self
                .images
                .values()
                .map(|i| {
                    (
                        i.id,
                        ImageExtent {
                            size_bytes: i.size_bytes,
                            object_size_bytes: i.object_size_bytes,
                            parent_overlap_bytes: i.parent.as_ref().map(|p| p.overlap_bytes),
                        },
                    )
                })
                .collect(),
        });
        self.map.reclaim = self.reclaim.clone();
        self.map.snaps = self.snaps.clone();
        self.map.snap_trims = self.snap_trims.clone();
        self.map.scrub_requests = self.scrubs.requests.clone();
    }
}

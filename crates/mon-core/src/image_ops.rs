//! Images: create, remove, resize, and the reclaim list that makes the data path delete the
//! objects of removed images and of shrunk tails, so that no data leaks.

use crate::limits::{
    IMAGE_SIZE_ALIGN_BYTES, IMAGE_SIZE_MAX_BYTES, OBJECT_SIZE_DEFAULT_BYTES, OBJECT_SIZE_MAX_BYTES,
    OBJECT_SIZE_MIN_BYTES,
};
use crate::state::MonState;
use crate::{err, OpResult};
use fastblock_types::api::{CreateImageRequest, ErrorCode, ResizeImageRequest};
use fastblock_types::map::{ImageInfo, ReclaimEntry};
use fastblock_types::names::validate_name;
use fastblock_types::units::format_size;
use fastblock_types::ImageId;

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
        };
        self.reclaim.insert(id, entry);
    }

    /// Removes an image's metadata and records its whole range for the data path to delete.
    pub fn remove_image(&mut self, pool: &str, name: &str) -> OpResult<ImageInfo> {
        let image = self.image(pool, name)?.clone();
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
        Ok(image.clone())
    }

    /// The data path confirms that a reclaim entry's objects are gone.
    pub fn reclaim_done(&mut self, id: u64) -> OpResult<()> {
        match self.reclaim.remove(&id) {
            Some(_) => Ok(()),
            None => err(ErrorCode::ReclaimNotFound, format!("no reclaim entry {id}")),
        }
    }
}

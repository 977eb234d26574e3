//! The new image an import or cp fills, and the marker that says it is not complete yet.
//!
//! Right after creating the image, a snapshot named `import-incomplete` (cp:
//! `cp-incomplete`) is taken; it is removed once every byte is written and acknowledged. An
//! import or cp that is interrupted (an error, Ctrl-C, a crash) leaves it: `image snap ls`
//! and `image info` show it, and `image rm` is refused until it is removed. Taking it copies
//! nothing (the image is empty then), and the data written after it is the head's alone.

use crate::command::ImageSpec;
use anyhow::{anyhow, Result};
use fastblock_monclient::{MonClient, MonError};
use fastblock_types::api::{CreateImageRequest, ErrorCode};
use fastblock_types::map::ImageInfo;

/// The snapshot names that mark an incomplete import and an incomplete cp.
pub const IMPORT_MARKER: &str = "import-incomplete";
pub const CP_MARKER: &str = "cp-incomplete";

/// Creates `spec` with `size_bytes` (and `object_size_bytes`, else the monitor's default),
/// then its `marker` snapshot. An existing image is an error unless `overwrite`: then it is
/// removed first (refused, with the reason, when it has snapshots other than a marker or
/// clones).
pub async fn create(
    client: &MonClient,
    spec: &ImageSpec,
    size_bytes: u64,
    object_size_bytes: Option<u64>,
    overwrite: bool,
    marker: &str,
) -> Result<ImageInfo> {
    let req = CreateImageRequest {
        pool: spec.pool.clone(),
        name: spec.image.clone(),
        size_bytes,
        object_size_bytes,
    };
    let info = match client.create_image(&req).await {
        Ok(info) => info,
        Err(e) if e.code() == Some(ErrorCode::ImageExists) && !overwrite => {
            return Err(anyhow!(
                "image {spec} already exists: pass --overwrite to replace it (its data is lost)"
            ))
        }
        Err(e) if e.code() == Some(ErrorCode::ImageExists) => {
            remove(client, spec).await?;
            client.create_image(&req).await?
        }
        Err(e) => return Err(e.into()),
    };
    if let Err(e) = client.create_snap(&spec.pool, &spec.image, marker).await {
        // Without its marker the empty image would look complete: take it away again.
        let undone = match client.remove_image(&spec.pool, &spec.image).await {
            Ok(_) => "the new image was removed".to_string(),
            Err(rm) => format!("removing the new image failed too ({rm}): remove it"),
        };
        return Err(anyhow!(
            "marking {spec} as incomplete (snapshot {marker}): {e}; {undone}"
        ));
    }
    Ok(info)
}

/// Removes the image an `--overwrite` replaces, with the markers an interrupted import or
/// cp left on it.
async fn remove(client: &MonClient, spec: &ImageSpec) -> Result<()> {
    let snaps = client.snaps(&spec.pool, &spec.image).await?;
    for snap in snaps
        .iter()
        .filter(|s| s.name == IMPORT_MARKER || s.name == CP_MARKER)
    {
        client
            .remove_snap(&spec.pool, &spec.image, &snap.name)
            .await
            .map_err(|e| anyhow!("replacing {spec}: removing its snapshot {}: {e}", snap.name))?;
    }
    match client.remove_image(&spec.pool, &spec.image).await {
        Ok(_) => Ok(()),
        Err(e) => {
            let e = crate::snap::explain_image_rm(client, &spec.pool, &spec.image, e).await;
            Err(anyhow!("replacing {spec}: {e:#}"))
        }
    }
}

/// Removes the marker: the image is complete.
pub async fn complete(client: &MonClient, spec: &ImageSpec, marker: &str) -> Result<()> {
    client
        .remove_snap(&spec.pool, &spec.image, marker)
        .await
        .map(drop)
        .map_err(|e: MonError| {
            anyhow!(
                "every byte of {spec} is written, but its snapshot {marker} could not be \
                 removed: {e}; remove it with `fastblock-client image snap rm {spec}@{marker}`"
            )
        })
}

/// What an interrupted import or cp says: where the data stands and what to do.
pub fn interrupted(spec: &ImageSpec, marker: &str, e: anyhow::Error) -> anyhow::Error {
    anyhow!(
        "{e:#}; {spec} holds a partial copy, marked by its snapshot {marker}: run the command \
         again with --overwrite, or remove it (`image snap rm {spec}@{marker}`, then \
         `image rm {spec}`)"
    )
}

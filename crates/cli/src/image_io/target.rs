//! The new image an import or cp fills, and the marker that says it is not complete yet.
//!
//! Right after creating the image, a snapshot named `import-incomplete` (cp:
//! `cp-incomplete`) is taken; it is removed once every byte is written and acknowledged. An
//! import or cp that is interrupted (an error, Ctrl-C, a crash) leaves it: `image snap ls`
//! and `image info` show it, and `image rm` is refused until it is removed. Taking it copies
//! nothing (the image is empty then), and the data written after it is the head's alone.

use crate::command::ImageSpec;
use crate::exit::{Failure, Worded};
use anyhow::{Context, Result};
use fastblock_monclient::{MonClient, MonError};
use fastblock_types::api::{CreateImageRequest, ErrorCode};
use fastblock_types::map::{ImageInfo, SnapInfo};

/// The snapshot names that mark an incomplete import and an incomplete cp.
pub const IMPORT_MARKER: &str = "import-incomplete";
pub const CP_MARKER: &str = "cp-incomplete";

fn is_marker(name: &str) -> bool {
    name == IMPORT_MARKER || name == CP_MARKER
}

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
            return Err(Failure::Refused(format!(
                "image {spec} already exists: pass --overwrite to replace it (its data is lost)"
            ))
            .into())
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
        return Err(Worded::error(
            format!("marking {spec} as incomplete (snapshot {marker}): {e}; {undone}"),
            e.into(),
        ));
    }
    Ok(info)
}

/// Removes the image an `--overwrite` replaces, with the markers an interrupted import or
/// cp left on it. Everything that would make the monitor refuse the removal is checked
/// before a marker is touched: a partial image must never lose its marker and stay.
async fn remove(client: &MonClient, spec: &ImageSpec) -> Result<()> {
    let snaps = client
        .snaps(&spec.pool, &spec.image)
        .await
        .with_context(|| format!("replacing {spec}: listing its snapshots"))?;
    let mut clones = Vec::new();
    for snap in snaps.iter().filter(|s| is_marker(&s.name)) {
        let children = client
            .snap_children(&spec.pool, &spec.image, &snap.name)
            .await
            .with_context(|| format!("replacing {spec}: listing the clones of {}", snap.name))?;
        clones.extend(children.iter().map(|c| (snap.name.clone(), c.clone())));
    }
    if let Some(why) = overwrite_refusal(spec, &snaps, &clones) {
        return Err(Failure::Refused(why).into());
    }
    let mut removed = Vec::new();
    for snap in snaps.iter().filter(|s| is_marker(&s.name)) {
        if let Err(e) = client
            .remove_snap(&spec.pool, &spec.image, &snap.name)
            .await
        {
            let what = format!("replacing {spec}: removing its snapshot {}: {e}", snap.name);
            return Err(restore_markers(client, spec, &removed, what, e.into()).await);
        }
        removed.push(snap.name.clone());
    }
    if let Err(e) = client.remove_image(&spec.pool, &spec.image).await {
        let e = crate::snap::explain_image_rm(client, &spec.pool, &spec.image, e).await;
        let what = format!("replacing {spec}: {e:#}");
        return Err(restore_markers(client, spec, &removed, what, e).await);
    }
    Ok(())
}

/// Why `--overwrite` will not remove the image holding `snaps` (marker snapshots with the
/// `clones` made of them), if it will not: any snapshot but a marker, a protected marker, a
/// clone of a marker. Each would make the removal fail after the markers were gone.
fn overwrite_refusal(
    spec: &ImageSpec,
    snaps: &[SnapInfo],
    clones: &[(String, ImageInfo)],
) -> Option<String> {
    let others: Vec<&str> = snaps
        .iter()
        .filter(|s| !is_marker(&s.name))
        .map(|s| s.name.as_str())
        .collect();
    if !others.is_empty() {
        return Some(format!(
            "--overwrite does not replace {spec}: it has snapshot(s) {} (only the \
             {IMPORT_MARKER}/{CP_MARKER} markers are removed with it); remove them first",
            others.join(", ")
        ));
    }
    if let Some(s) = snaps.iter().find(|s| s.protected) {
        return Some(format!(
            "--overwrite does not replace {spec}: its snapshot {} is protected",
            s.name
        ));
    }
    if !clones.is_empty() {
        let names: Vec<String> = clones
            .iter()
            .map(|(snap, c)| format!("{}/{} (of {snap})", c.pool_name, c.name))
            .collect();
        return Some(format!(
            "--overwrite does not replace {spec}: clone(s) {} depend on it; flatten or remove \
             them first",
            names.join(", ")
        ));
    }
    None
}

/// A removal that failed after the `removed` markers were gone: takes them again (best
/// effort, so that the partial image stays marked) and says what came of it after `what`.
async fn restore_markers(
    client: &MonClient,
    spec: &ImageSpec,
    removed: &[String],
    what: String,
    cause: anyhow::Error,
) -> anyhow::Error {
    let mut notes = Vec::new();
    for marker in removed {
        match client.create_snap(&spec.pool, &spec.image, marker).await {
            Ok(_) => notes.push(format!("its snapshot {marker} was taken again")),
            // The removal went through after all (its answer was lost).
            Err(e) if e.code() == Some(ErrorCode::ImageNotFound) => {
                notes.push(format!("{spec} was removed after all"));
                break;
            }
            Err(e) => notes.push(format!(
                "taking its snapshot {marker} again failed ({e}): {spec} holds a partial copy \
                 and is not marked so; remove it (`image rm {spec}`)"
            )),
        }
    }
    if notes.is_empty() {
        return Worded::error(what, cause);
    }
    Worded::error(format!("{what}; {}", notes.join("; ")), cause)
}

/// Refuses to read from `spec` while it carries a marker: an import or cp into it was
/// interrupted, and what it holds (and every snapshot of it, all taken after the marker) is a
/// partial copy.
pub async fn check_complete(client: &MonClient, spec: &ImageSpec) -> Result<()> {
    let snaps = client
        .snaps(&spec.pool, &spec.image)
        .await
        .with_context(|| format!("listing the snapshots of {spec}"))?;
    match incomplete_refusal(spec, &snaps) {
        Some(why) => Err(Failure::Refused(why).into()),
        None => Ok(()),
    }
}

fn incomplete_refusal(spec: &ImageSpec, snaps: &[SnapInfo]) -> Option<String> {
    let marker = snaps.iter().find(|s| is_marker(&s.name))?;
    let (verb, redo) = match marker.name.as_str() {
        IMPORT_MARKER => ("an import", "image import FILE"),
        _ => ("a cp", "image cp SOURCE"),
    };
    Some(format!(
        "{spec} is incomplete: {verb} into it was interrupted (its snapshot {m} marks it); \
         finish it with `{redo} {spec} --overwrite`, or, to use the partial copy as it is, \
         remove the marker (`image snap rm {spec}@{m}`)",
        m = marker.name
    ))
}

/// Removes the marker: the image is complete.
pub async fn complete(client: &MonClient, spec: &ImageSpec, marker: &str) -> Result<()> {
    client
        .remove_snap(&spec.pool, &spec.image, marker)
        .await
        .map(drop)
        .map_err(|e: MonError| {
            let message = format!(
                "every byte of {spec} is written, but its snapshot {marker} could not be \
                 removed: {e}; remove it with `fastblock-client image snap rm {spec}@{marker}`"
            );
            Worded::error(message, e.into())
        })
}

/// What an interrupted import or cp says: where the data stands and what to do.
pub fn interrupted(spec: &ImageSpec, marker: &str, e: anyhow::Error) -> anyhow::Error {
    let message = format!(
        "{e:#}; {spec} holds a partial copy, marked by its snapshot {marker}: run the command \
         again with --overwrite, or remove it (`image snap rm {spec}@{marker}`, then \
         `image rm {spec}`)"
    );
    Worded::error(message, e)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> ImageSpec {
        ImageSpec {
            pool: "fb".into(),
            image: "vm".into(),
        }
    }

    fn snap(name: &str, protected: bool) -> SnapInfo {
        serde_json::from_value(serde_json::json!({
            "id": 1, "pool": 1, "image": 1, "image_name": "vm", "name": name,
            "state": "created", "size_bytes": 4096, "object_size_bytes": 4096,
            "created_epoch": 1, "protected": protected,
        }))
        .expect("a snapshot record")
    }

    /// Only an image whose snapshots are all unprotected markers without clones is removed
    /// by `--overwrite`; anything else is refused before a marker is touched.
    #[test]
    fn overwrite_removes_only_an_image_marked_and_nothing_else() {
        let s = spec();
        assert_eq!(overwrite_refusal(&s, &[], &[]), None);
        let markers = [snap(IMPORT_MARKER, false), snap(CP_MARKER, false)];
        assert_eq!(overwrite_refusal(&s, &markers, &[]), None);
        let kept = [snap(IMPORT_MARKER, false), snap("keep", false)];
        let why = overwrite_refusal(&s, &kept, &[]).expect("refused");
        assert!(why.contains("snapshot(s) keep ("), "{why}");
        let protected = [snap(CP_MARKER, true)];
        let why = overwrite_refusal(&s, &protected, &[]).expect("refused");
        assert!(why.contains("cp-incomplete is protected"), "{why}");
        let clone: ImageInfo = serde_json::from_value(serde_json::json!({
            "id": 2, "pool": 1, "pool_name": "fb", "name": "child", "size_bytes": 4096,
            "object_size_bytes": 4096, "created_epoch": 1,
        }))
        .expect("an image record");
        let why = overwrite_refusal(&s, &markers[..1], &[(IMPORT_MARKER.into(), clone)])
            .expect("refused");
        assert!(why.contains("fb/child (of import-incomplete)"), "{why}");
    }

    #[test]
    fn a_marked_source_is_refused_naming_its_marker_and_the_way_out() {
        let s = spec();
        assert_eq!(incomplete_refusal(&s, &[snap("backup", false)]), None);
        let why = incomplete_refusal(&s, &[snap("backup", false), snap(IMPORT_MARKER, false)])
            .expect("refused");
        assert!(why.contains("an import into it was interrupted"), "{why}");
        assert!(
            why.contains("`image import FILE fb/vm --overwrite`"),
            "{why}"
        );
        assert!(
            why.contains("`image snap rm fb/vm@import-incomplete`"),
            "{why}"
        );
        let why = incomplete_refusal(&s, &[snap(CP_MARKER, false)]).expect("refused");
        assert!(why.contains("`image cp SOURCE fb/vm --overwrite`"), "{why}");
    }
}

//! Snapshots and clones: `image snap create|ls|rm|rollback|protect|unprotect`, `image clone`,
//! `image flatten`, `image children` (`docs/cli.md`, `docs/design/snapshots.md`).
//!
//! Most are one monitor call. Rollback and flatten move data too: they open the image through
//! the block client library ([`connect`]), signing as the same entity with the same key as the
//! monitor calls, then finish with a monitor call (a resize, `flatten-done`). What a rollback
//! does is decided first, as data ([`plan_rollback`]), so the decision is tested without a
//! cluster.

use crate::command::{Command, ImageSpec, Invocation, SnapSpec, Style};
use crate::render::{children_table, snaps_table, ImageDetails, SnapUsage, UsageDetails};
use anyhow::{anyhow, Result};
use fastblock_client::{ClientConfig, Cluster};
use fastblock_monclient::{MonClient, MonError};
use fastblock_types::api::{ErrorCode, ResizeImageRequest};
use fastblock_types::map::{ImageInfo, SnapInfo, SnapState};
use fastblock_types::units::format_size;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use std::io::{IsTerminal, Write};
use std::sync::Arc;

fn json(out: &mut dyn Write, value: &impl Serialize) -> Result<()> {
    writeln!(out, "{}", serde_json::to_string_pretty(value)?)?;
    Ok(())
}

/// Runs a snapshot or clone command.
pub async fn execute(inv: &Invocation, client: &MonClient, out: &mut dyn Write) -> Result<()> {
    let style = inv.style;
    match &inv.command {
        Command::SnapCreate(spec) => {
            let s = client
                .create_snap(&spec.pool, &spec.image, &spec.snap)
                .await?;
            match style {
                Style::Json => json(out, &s)?,
                _ => writeln!(
                    out,
                    "snapshot {spec} created: id {}, size {}",
                    s.id,
                    format_size(s.size_bytes)
                )?,
            }
        }
        Command::SnapLs(spec) => {
            let snaps = client.snaps(&spec.pool, &spec.image).await?;
            match style {
                Style::Json => json(out, &snaps)?,
                _ => write!(out, "{}", snaps_table(&snaps))?,
            }
        }
        Command::SnapRm(spec) => {
            let s = match client
                .remove_snap(&spec.pool, &spec.image, &spec.snap)
                .await
            {
                Ok(s) => s,
                Err(e) => return Err(explain_snap_rm(client, spec, e).await),
            };
            match style {
                Style::Json => json(out, &s)?,
                _ => writeln!(
                    out,
                    "snapshot {spec} removed; the OSDs drop the data only it kept"
                )?,
            }
        }
        Command::SnapProtect { snap, protect } => {
            let s = if *protect {
                client
                    .protect_snap(&snap.pool, &snap.image, &snap.snap)
                    .await?
            } else {
                client
                    .unprotect_snap(&snap.pool, &snap.image, &snap.snap)
                    .await?
            };
            match style {
                Style::Json => json(out, &s)?,
                _ => writeln!(
                    out,
                    "snapshot {snap} {}",
                    if s.protected {
                        "protected"
                    } else {
                        "unprotected"
                    }
                )?,
            }
        }
        Command::SnapRollback {
            snap,
            objects_in_flight_max,
        } => rollback(inv, client, snap, *objects_in_flight_max, out).await?,
        Command::ImageClone { source, target } => {
            let i = client
                .clone_snap(
                    &source.pool,
                    &source.image,
                    &source.snap,
                    &target.pool,
                    &target.image,
                )
                .await?;
            match style {
                Style::Json => json(out, &i)?,
                _ => writeln!(
                    out,
                    "image {target} cloned from {source}: size {}, object size {}",
                    format_size(i.size_bytes),
                    format_size(i.object_size_bytes)
                )?,
            }
        }
        Command::ImageFlatten {
            image,
            objects_in_flight_max,
        } => flatten(inv, client, image, *objects_in_flight_max, out).await?,
        Command::ImageChildren(spec) => {
            let children = client
                .snap_children(&spec.pool, &spec.image, &spec.snap)
                .await?;
            match style {
                Style::Json => json(out, &children)?,
                _ => write!(out, "{}", children_table(&children))?,
            }
        }
        other => return Err(anyhow!("not a snapshot command: {other:?}")),
    }
    Ok(())
}

/// How long `image info` waits for the PGs' usage before it prints the rest without it.
const USAGE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// What `image info` adds to the monitor's record (see [`ImageDetails`]): the snapshot
/// count, and what the image and each snapshot hold on the OSDs (asked of every PG's
/// leader; if the data path cannot answer, the reason instead, and the rest still prints).
pub async fn image_details(
    inv: &Invocation,
    client: &MonClient,
    image: &ImageInfo,
) -> Result<ImageDetails> {
    let snaps = client.snaps(&image.pool_name, &image.name).await?;
    let replicas = client
        .pools()
        .await?
        .into_iter()
        .find(|p| p.id == image.pool)
        .map_or(1, |p| u64::from(p.size));
    let usage = async {
        let cluster = connect(inv, client).await?;
        let opened = cluster.open_image_info(image.clone()).await?;
        anyhow::Ok(opened.usage().await?)
    };
    // The rest of the record does not wait long for PGs without a leader.
    let bound = inv.timeout.min(USAGE_WAIT);
    let usage = match tokio::time::timeout(bound, usage).await {
        Ok(r) => r,
        Err(_) => Err(anyhow!(
            "the PGs of pool {} did not all answer within {bound:?}",
            image.pool_name
        )),
    };
    let (usage, usage_error) = match usage {
        Ok(u) => (
            Some(UsageDetails {
                objects: u.objects,
                head_bytes: u.head_bytes,
                snapshots_bytes: u.snaps_bytes,
                raw_bytes: u.total_bytes().saturating_mul(replicas),
                snapshots: snaps
                    .iter()
                    .map(|s| SnapUsage {
                        id: s.id.0,
                        name: s.name.clone(),
                        bytes: u.by_snap.get(&s.id.0).copied().unwrap_or(0),
                    })
                    .collect(),
            }),
            None,
        ),
        Err(e) => (None, Some(format!("{e:#}"))),
    };
    Ok(ImageDetails {
        snapshot_count: snaps.len(),
        usage,
        usage_error,
    })
}

/// The steps of a rollback, decided from the snapshot and the image's current size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RollbackPlan {
    /// Grow the image to this size first: it is smaller than the snapshot, and the objects
    /// are rolled back only within the image.
    pub grow_to_bytes: Option<u64>,
    /// The snapshot's id, and its size: the objects up to it are rolled back.
    pub snap_id: u64,
    pub snap_size_bytes: u64,
    /// Objects rolled back (the snapshot's size in objects).
    pub object_count: u64,
    /// Shrink the image to this size afterwards: it is larger than the snapshot.
    pub shrink_to_bytes: Option<u64>,
}

/// Decides a rollback of an image of `image_size_bytes` to `snap`: refused while the
/// snapshot is still being created (its point in time is not complete on every PG).
pub fn plan_rollback(
    spec: &SnapSpec,
    snap: &SnapInfo,
    image_size_bytes: u64,
) -> Result<RollbackPlan, String> {
    if snap.state != SnapState::Created {
        return Err(format!(
            "snapshot {spec} is still being created: roll back to it once it is created \
             (`image snap ls` shows its state)"
        ));
    }
    if snap.object_size_bytes == 0 {
        return Err(format!(
            "snapshot {spec} has object size 0 in the monitor's record"
        ));
    }
    let size = snap.size_bytes;
    Ok(RollbackPlan {
        grow_to_bytes: (image_size_bytes < size).then_some(size),
        snap_id: snap.id.0,
        snap_size_bytes: size,
        object_count: size.div_ceil(snap.object_size_bytes),
        shrink_to_bytes: (image_size_bytes > size).then_some(size),
    })
}

/// What `image snap rollback --json` prints.
#[derive(Serialize)]
struct RollbackReport<'a> {
    snap: &'a SnapInfo,
    /// The image after the rollback (its size is the snapshot's).
    image: &'a ImageInfo,
    size_before_bytes: u64,
    objects: u64,
}

/// `image snap rollback`: grow if needed, roll every object back, shrink if needed
/// ([`plan_rollback`]). Each step can be repeated, so an interrupted rollback is finished
/// by running it again.
async fn rollback(
    inv: &Invocation,
    client: &MonClient,
    spec: &SnapSpec,
    objects_in_flight_max: usize,
    out: &mut dyn Write,
) -> Result<()> {
    let snaps = client.snaps(&spec.pool, &spec.image).await?;
    let Some(snap) = snaps.iter().find(|s| s.name == spec.snap) else {
        return Err(
            crate::exit::Failure::NotFound(format!("snapshot {spec} does not exist")).into(),
        );
    };
    let before = client.image(&spec.pool, &spec.image).await?;
    let plan = plan_rollback(spec, snap, before.size_bytes).map_err(|e| anyhow!(e))?;
    if let Some(size_bytes) = plan.grow_to_bytes {
        let req = ResizeImageRequest {
            size_bytes,
            allow_shrink: false,
        };
        client
            .resize_image(&spec.pool, &spec.image, &req)
            .await
            .map_err(|e| {
                anyhow!(
                    "growing {}/{} to the snapshot's size ({}) before the rollback: {e}",
                    spec.pool,
                    spec.image,
                    format_size(size_bytes)
                )
            })?;
    }
    let cluster = connect(inv, client).await?;
    let image = cluster.open_image(&spec.pool, &spec.image).await?;
    let bar = progress_bar(format!("rolling back to {spec}"));
    let progress = |done: u64, all: u64| {
        bar.set_length(all);
        bar.set_position(done);
    };
    let rolled = image
        .rollback_objects(
            plan.snap_id,
            plan.snap_size_bytes,
            objects_in_flight_max,
            &progress,
        )
        .await;
    bar.finish_and_clear();
    rolled.map_err(|e| {
        anyhow!(
            "rolling back to {spec}: {e}; the image is partly rolled back: run the rollback again"
        )
    })?;
    let after = match plan.shrink_to_bytes {
        Some(size_bytes) => {
            let req = ResizeImageRequest {
                size_bytes,
                allow_shrink: true,
            };
            client
                .resize_image(&spec.pool, &spec.image, &req)
                .await
                .map_err(|e| {
                    anyhow!(
                        "shrinking {}/{} to the snapshot's size ({}) after the rollback: {e}; \
                         run the rollback again",
                        spec.pool,
                        spec.image,
                        format_size(size_bytes)
                    )
                })?
        }
        None => client.image(&spec.pool, &spec.image).await?,
    };
    match inv.style {
        Style::Json => json(
            out,
            &RollbackReport {
                snap,
                image: &after,
                size_before_bytes: before.size_bytes,
                objects: plan.object_count,
            },
        )?,
        _ => {
            let resized = match (plan.grow_to_bytes, plan.shrink_to_bytes) {
                (Some(_), _) => format!(" (grown from {})", format_size(before.size_bytes)),
                (_, Some(_)) => format!(" (shrunk from {})", format_size(before.size_bytes)),
                _ => String::new(),
            };
            writeln!(
                out,
                "image {}/{} rolled back to snapshot {} (id {}): {} objects, size {}{resized}",
                spec.pool,
                spec.image,
                spec.snap,
                snap.id,
                plan.object_count,
                format_size(after.size_bytes)
            )?;
        }
    }
    Ok(())
}

/// `image flatten`: copy up every object the clone has not, then tell the monitor. A clone
/// whose objects are all copied (a flatten cut short after the copy) only needs the call.
async fn flatten(
    inv: &Invocation,
    client: &MonClient,
    spec: &ImageSpec,
    objects_in_flight_max: usize,
    out: &mut dyn Write,
) -> Result<()> {
    let info = client.image(&spec.pool, &spec.image).await?;
    let Some(parent) = &info.parent else {
        return Err(anyhow!(
            "image {spec} is not a clone (or is flattened already): nothing to flatten"
        ));
    };
    let parent_name = format!(
        "{}/{}@{}",
        parent.pool_name, parent.image_name, parent.snap_name
    );
    let cluster = connect(inv, client).await?;
    let image = cluster.open_image(&spec.pool, &spec.image).await?;
    let bar = progress_bar(format!("flattening {spec}"));
    let progress = |done: u64, all: u64| {
        bar.set_length(all);
        bar.set_position(done);
    };
    let copied = image.flatten(objects_in_flight_max, &progress).await;
    bar.finish_and_clear();
    copied.map_err(|e| {
        anyhow!(
            "flattening {spec}: {e}; it still reads through to {parent_name}: \
             run the flatten again"
        )
    })?;
    let after = client.flatten_done(&spec.pool, &spec.image).await?;
    match inv.style {
        Style::Json => json(out, &after)?,
        _ => writeln!(
            out,
            "image {spec} flattened: it no longer depends on {parent_name}"
        )?,
    }
    Ok(())
}

/// A block client for the data-path commands: the same monitors, entity and key as the
/// monitor calls, with `--timeout` as the deadline of each object request.
///
/// Without a key (no keyring file: a cluster in auth mode `none`) the library looks for the
/// default keyring (`$FASTBLOCK_KEYRING`, else `/etc/fastblock/keyring`) itself; the CLI found
/// none there unless `--keyring` named another file.
pub(crate) async fn connect(inv: &Invocation, client: &MonClient) -> Result<Arc<Cluster>> {
    let config = ClientConfig {
        op_deadline: inv.timeout,
        entity: inv.name.clone(),
        credentials: client.credentials().cloned(),
        auth_floor: Some(client.auth_floor()),
        ..ClientConfig::new(inv.monitors.clone())
    };
    Ok(Cluster::connect(config).await?)
}

/// A bar on stderr for a long copy, shown only when stderr is a terminal (never in logs or
/// in what a script captures).
fn progress_bar(what: String) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let style = ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} objects ({eta})")
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    let bar = ProgressBar::new(0).with_style(style);
    bar.set_message(what);
    bar
}

/// A refused `snap rm` of a protected snapshot names only the protection. When clones depend
/// on the snapshot too, the message says which, so that one line tells everything to do
/// first. Any other error is returned as it is.
async fn explain_snap_rm(client: &MonClient, spec: &SnapSpec, e: MonError) -> anyhow::Error {
    if e.code() != Some(ErrorCode::SnapInUse) {
        return e.into();
    }
    let Ok(children) = client
        .snap_children(&spec.pool, &spec.image, &spec.snap)
        .await
    else {
        return e.into();
    };
    let names = clone_names(&children);
    let message = e.to_string();
    if names.iter().all(|n| message.contains(n.as_str())) {
        return e.into();
    }
    // Still the monitor's refusal, in more words: it keeps that exit status.
    crate::exit::Failure::Refused(format!(
        "{message}, after flattening or removing its {} clone(s): {}",
        names.len(),
        names.join(", ")
    ))
    .into()
}

/// A refused `image rm` of an image with snapshots names the snapshots. When some of them
/// have clones, the message says which too (they must be flattened or removed before the
/// snapshots can go). Any other error is returned as it is.
pub async fn explain_image_rm(
    client: &MonClient,
    pool: &str,
    name: &str,
    e: MonError,
) -> anyhow::Error {
    if e.code() != Some(ErrorCode::SnapInUse) {
        return e.into();
    }
    let Ok(snaps) = client.snaps(pool, name).await else {
        return e.into();
    };
    let message = e.to_string();
    let mut cloned = Vec::new();
    for s in &snaps {
        let Ok(children) = client.snap_children(pool, name, &s.name).await else {
            return e.into();
        };
        let names = clone_names(&children);
        if !names.is_empty() && !names.iter().all(|n| message.contains(n.as_str())) {
            cloned.push(format!("{} has clone(s) {}", s.name, names.join(", ")));
        }
    }
    if cloned.is_empty() {
        return e.into();
    }
    crate::exit::Failure::Refused(format!(
        "{message}; snapshot {}",
        cloned.join("; snapshot ")
    ))
    .into()
}

fn clone_names(children: &[ImageInfo]) -> Vec<String> {
    children
        .iter()
        .map(|c| format!("{}/{}", c.pool_name, c.name))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use fastblock_types::{Epoch, ImageId, PoolId, SnapId};

    const MIB: u64 = 1 << 20;

    fn snap(state: SnapState, size_bytes: u64) -> SnapInfo {
        SnapInfo {
            id: SnapId(3),
            pool: PoolId(1),
            image: ImageId(7),
            image_name: "vm1".into(),
            name: "s".into(),
            state,
            size_bytes,
            object_size_bytes: MIB,
            created_epoch: Epoch(5),
            protected: false,
            done_pgs: Default::default(),
            started_at_ms: 1,
            parent_overlap_bytes: None,
        }
    }

    fn spec() -> SnapSpec {
        crate::command::parse_snap_spec("rbd/vm1@s").unwrap()
    }

    #[test]
    fn a_rollback_grows_a_smaller_image_first() {
        let plan = plan_rollback(&spec(), &snap(SnapState::Created, 8 * MIB), 2 * MIB).unwrap();
        assert_eq!(plan.grow_to_bytes, Some(8 * MIB));
        assert_eq!(plan.shrink_to_bytes, None);
        assert_eq!(plan.snap_id, 3);
        assert_eq!(plan.snap_size_bytes, 8 * MIB);
        assert_eq!(plan.object_count, 8);
    }

    #[test]
    fn a_rollback_shrinks_a_larger_image_afterwards() {
        let plan =
            plan_rollback(&spec(), &snap(SnapState::Created, 4 * MIB + 4096), 16 * MIB).unwrap();
        assert_eq!(plan.grow_to_bytes, None);
        assert_eq!(plan.shrink_to_bytes, Some(4 * MIB + 4096));
        // A partial last object is rolled back too.
        assert_eq!(plan.object_count, 5);
    }

    #[test]
    fn a_rollback_of_an_image_of_the_snapshots_size_only_rolls_back() {
        let plan = plan_rollback(&spec(), &snap(SnapState::Created, 4 * MIB), 4 * MIB).unwrap();
        assert_eq!((plan.grow_to_bytes, plan.shrink_to_bytes), (None, None));
        assert_eq!(plan.object_count, 4);
    }

    #[test]
    fn a_rollback_to_a_snapshot_still_being_created_is_refused() {
        let e = plan_rollback(&spec(), &snap(SnapState::Creating, 4 * MIB), 4 * MIB).unwrap_err();
        assert!(e.contains("rbd/vm1@s is still being created"), "{e}");
    }
}

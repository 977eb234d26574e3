//! What an image holds on the OSDs: [`Image::usage`] asks the leader of every PG of the
//! image's pool (`Usage`, `docs/wire-protocol.md` 3.13) and sums the answers. Each leader
//! answers from counters it keeps in memory, so this costs one small request per PG, whatever
//! the image's size.

use crate::image::Image;
use crate::leader::reply_name;
use crate::ClientError;
use fastblock_types::units::BLOCK_SIZE_BYTES;
use fastblock_types::{ImageId, PgId};
use fastblock_wire::{Reply, Request};
use std::collections::BTreeMap;
use tokio::task::JoinSet;

/// Usage requests in flight at once (one per PG of the pool).
const USAGE_REQUESTS_IN_FLIGHT_MAX: usize = 32;

/// What an image holds, summed over the PGs of its pool, as each PG's leader has applied it.
/// Bytes are of one copy: a pool of size 3 stores each of them three times.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageUsage {
    /// Objects of the image's head (written or copied up).
    pub objects: u64,
    /// Data the head maps, in bytes (4 KiB blocks: a block written in part counts whole).
    pub head_bytes: u64,
    /// Data kept for the image's snapshots, in all.
    pub snaps_bytes: u64,
    /// Snapshot id -> the bytes kept for it: what removing that snapshot alone would free
    /// or hand to an older snapshot.
    pub by_snap: BTreeMap<u64, u64>,
}

impl ImageUsage {
    /// Everything the image holds: head and snapshots.
    pub fn total_bytes(&self) -> u64 {
        self.head_bytes + self.snaps_bytes
    }
}

impl Image {
    /// What this image holds on the OSDs (see the module doc). A snapshot view reports its
    /// image's usage too.
    pub async fn usage(&self) -> Result<ImageUsage, ClientError> {
        let image = self.info().id;
        let pool = self.info().pool;
        let mut tasks = JoinSet::new();
        let mut sum = ImageUsage::default();
        let mut next = 0u32;
        loop {
            while next < self.pg_count() && tasks.len() < USAGE_REQUESTS_IN_FLIGHT_MAX {
                let cluster = self.cluster().clone();
                let pg = PgId::new(pool, next);
                tasks.spawn(async move { pg_usage(&cluster, pg, image).await });
                next += 1;
            }
            match tasks.join_next().await {
                Some(Ok(part)) => add(&mut sum, part?),
                Some(Err(e)) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Some(Err(e)) => return Err(ClientError::Protocol(format!("usage task: {e}"))),
                None => break,
            }
        }
        Ok(sum)
    }
}

fn add(sum: &mut ImageUsage, part: ImageUsage) {
    sum.objects += part.objects;
    sum.head_bytes += part.head_bytes;
    sum.snaps_bytes += part.snaps_bytes;
    for (snap, bytes) in part.by_snap {
        *sum.by_snap.entry(snap).or_insert(0) += bytes;
    }
}

async fn pg_usage(
    cluster: &crate::Cluster,
    pg: PgId,
    image: ImageId,
) -> Result<ImageUsage, ClientError> {
    let build = move |_epoch| Request::Usage { pg, image };
    match cluster.execute(pg, &build).await? {
        Reply::Usage {
            objects,
            head_blocks,
            kept_blocks,
            snaps,
        } => {
            let by_snap: BTreeMap<u64, u64> = snaps
                .iter()
                .map(|(snap, blocks)| (*snap, blocks.saturating_mul(BLOCK_SIZE_BYTES)))
                .collect();
            let listed: u64 = snaps.iter().map(|(_, b)| *b).sum();
            if listed > kept_blocks {
                return Err(ClientError::Protocol(format!(
                    "PG {pg}: usage lists {listed} kept blocks by snapshot, {kept_blocks} in all"
                )));
            }
            Ok(ImageUsage {
                objects,
                head_bytes: head_blocks.saturating_mul(BLOCK_SIZE_BYTES),
                snaps_bytes: kept_blocks.saturating_mul(BLOCK_SIZE_BYTES),
                by_snap,
            })
        }
        other => Err(ClientError::Protocol(format!(
            "PG {pg}: unexpected {} reply to a usage request",
            reply_name(&other)
        ))),
    }
}

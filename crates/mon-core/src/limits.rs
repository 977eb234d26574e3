//! Bounds the monitor enforces on user input. Units are in the names.

use fastblock_types::units::{BLOCK_SIZE_BYTES, KIB, MIB, PIB};

/// PGs per pool: placement's bound (one placement of a pool this size takes well under a
/// second). Such a pool's PGs are some 20 MB of JSON in etcd, written in chunk keys of 256
/// PGs over as many transactions as etcd's limits need (`fastblock_mon::store`, "Large
/// commits").
pub const PG_COUNT_MAX: u32 = fastblock_placement::PG_COUNT_MAX;
/// PG replicas an OSD may carry when a pool is created (`max_pg_per_osd`, settable on the
/// monitor), as Ceph's `mon_max_pg_per_osd`: each PG costs an OSD memory, a Raft group and
/// heartbeats, whatever data it holds.
pub const PG_PER_OSD_MAX_DEFAULT: u32 = 250;
/// Replicas per PG.
pub const POOL_SIZE_MAX: u32 = 7;
/// Largest image: 1 PiB. Object indexes and byte offsets stay far from u64 overflow.
pub const IMAGE_SIZE_MAX_BYTES: u64 = PIB;
/// Image sizes are whole blocks, because every frontend exposes 4 KiB blocks.
pub const IMAGE_SIZE_ALIGN_BYTES: u64 = BLOCK_SIZE_BYTES;
pub const OBJECT_SIZE_MIN_BYTES: u64 = 4 * KIB;
pub const OBJECT_SIZE_MAX_BYTES: u64 = 64 * MIB;
pub const OBJECT_SIZE_DEFAULT_BYTES: u64 = 4 * MIB;

const _: () = assert!(OBJECT_SIZE_MIN_BYTES.is_power_of_two());
const _: () = assert!(OBJECT_SIZE_MAX_BYTES.is_power_of_two());
// An object must hold whole blocks so that per-block checksums never straddle objects.
const _: () = assert!(OBJECT_SIZE_MIN_BYTES % BLOCK_SIZE_BYTES == 0);
const _: () = assert!(OBJECT_SIZE_DEFAULT_BYTES >= OBJECT_SIZE_MIN_BYTES);
const _: () = assert!(OBJECT_SIZE_DEFAULT_BYTES <= OBJECT_SIZE_MAX_BYTES);

/// How far one PG report may raise the PG's recorded Raft term. Terms of a genuine leader rise
/// only through real elections: every replica runs pre-vote, so a partitioned or restarting
/// replica does not inflate terms by campaigning alone, and each election adds one. A PG would
/// need about a million elections without one accepted report in between to reach this bound
/// (at one election per second, twelve days of reports lost). A report beyond it is a bug in
/// its sender, and refusing it keeps a single report from jumping the term towards 2^64-1,
/// where no genuine leader could ever report again.
pub const REPORT_TERM_STEP_MAX: u64 = 1 << 20;

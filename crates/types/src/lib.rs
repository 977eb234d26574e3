//! Layer 0 of fastblock: the vocabulary every other crate speaks.
//!
//! Module map:
//! - [`ids`]: newtype identifiers (`OsdId`, `PoolId`, `PgId`, `ImageId`, `Epoch`, ...). No raw
//!   integer id crosses a crate boundary.
//! - [`units`]: byte-size constants and the human size parser/formatter (`10G`, `512M`).
//! - [`pg_state`]: the PG state bits shared with the reference system (creating 1, active 2,
//!   undersize 4, down 8, remapped 16) and their display strings.
//! - [`pg_table`]: the PGs of a pool in chunks shared between copies, so that copying and
//!   comparing maps costs what changed, not the pool's size.
//! - [`osd_table`]: the map's OSDs, each shared between copies, so that an epoch that marks
//!   OSDs down copies those OSDs, not every OSD.
//! - [`map`]: the cluster map model (OSDs, pools, PG maps, flags, images, snapshots) exactly as it is stored
//!   in etcd as JSON and served by the monitor.
//! - [`pg_set`]: the bounded JSON form of a set of PG sequence numbers (`done_pgs`).
//! - [`map_delta`]: incremental maps (what changed from one epoch to a later one) and the
//!   scope of a map a daemon needs (an OSD's PGs, a client's pools).
//! - [`rng`]: the seeded SplitMix64 generator used wherever randomness must be replayable.
//! - [`route`]: object → PG and PG → shard, the stable routing functions.
//! - [`names`]: validation of pool and image names.
//! - [`api`]: request and response bodies of the monitor's HTTP API and its typed error.
//! - [`panics`]: the text of a caught panic's payload.
//! - [`lease`]: an OSD's lease timing and the rule by which two OSDs' timings may share PGs.
//! - [`auth`]: the cluster's authentication mode and key-table epoch as the map carries them.
//! - [`daemon_config`]: a daemon's runtime settings as `config show|get|set` reads and changes
//!   them (admin socket and monitor relay).
//! - [`clone_data`]: where a clone's copy-up puts the parent's data (head, a snapshot, nowhere).
//! - [`etcd`]: the monitor's etcd as status and health show it, and the monitor backup format.
//!
//! This crate must not depend on anything that does I/O, reads a clock or draws randomness:
//! the simulator and the pure cores build on it.

pub mod api;
pub mod auth;
pub mod clone_data;
pub mod daemon_config;
pub mod etcd;
pub mod ids;
pub mod lease;
pub mod map;
pub mod map_delta;
pub mod names;
pub mod osd_table;
pub mod panics;
pub mod pg_set;
pub mod pg_state;
pub mod pg_table;
pub mod rng;
pub mod route;
pub mod units;

pub use ids::{Epoch, ImageId, LogIndex, OsdId, PgId, PoolId, SnapId, Term};
pub use pg_state::PgState;

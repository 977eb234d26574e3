//! The fastblock binaries live in `src/bin/` as thin mains over the node libraries:
//! - `fastblock-mon`: the monitor (`fastblock-mon` crate);
//! - `fastblock-osd`: the storage daemon (`fastblock-osd` crate);
//! - `fastblock-nbd`: the NBD server (`fastblock-nbd` crate);
//! - `fastblock-client`: the admin CLI (`fastblock-cli` crate).
//!
//! What the three daemons share lives here: [`config`] folds each daemon's TOML file and
//! environment into its flags and tells where each value came from, [`logging`] installs a log
//! filter that can change while the daemon runs, and [`admin_socket`] serves
//! `fastblock-client config` (docs/operations.md, "Configuration").
//!
//! `tests/` holds the end-to-end tests, which run these binaries as real processes against a
//! real etcd on loopback ports (`tests/common` is the harness).

pub mod admin_socket;
pub mod config;
pub mod logging;
pub mod metrics_arg;

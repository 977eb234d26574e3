//! The fastblock binaries live in `src/bin/` as thin mains over the node libraries:
//! - `fastblock-mon`: the monitor (`fastblock-mon` crate);
//! - `fastblock-client`: the admin CLI (`fastblock-cli` crate).
//!
//! `tests/` holds the end-to-end tests, which run these binaries as real processes against a
//! real etcd on loopback ports (`tests/common` is the harness).

pub mod metrics_arg;

//! The monitor service, `fastblock-mon`: owns the cluster map in etcd.
//!
//! Module map:
//! - [`etcd_proc`]: starts and supervises the monitor's own etcd member (the default) and
//!   stops it on exit; [`etcd_identity`] checks that the etcd at its addresses is really it;
//!   [`etcd_tls`] makes the certificates of its mutually authenticated peer links from the
//!   monitor secret.
//! - [`secret`]: the monitor secret, the same file on every monitor, and what is derived from
//!   it; [`etcd_auth`]: etcd's authentication, on in the own member, and the monitor's
//!   credentials.
//! - [`keys`]: the etcd keyspace, one JSON value per key (`docs/etcd-keys.md`); [`key_seal`]:
//!   the key table sealed at rest under a key derived from the monitor secret.
//! - [`store`]: loading the state and committing changes in revision-guarded transactions;
//!   [`txn_limits`]: what one etcd transaction may carry, and the cutting of a large write.
//! - [`etcd_maint`]: etcd's upkeep: compaction of its history, defragmentation of its members,
//!   recovery from its out-of-space alarm, and the view `status` and health show.
//! - [`backup`]: a backup of the state, and its restore into an empty etcd.
//! - [`election`]: leader election on an etcd lease; the won key's revision fences commits.
//! - [`service`]: the leader's in-memory state and the operation pipeline
//!   (copy → decide in `mon-core` → persist → publish), the liveness ticker.
//! - [`auth_http`]: authentication of every API call (signature, replay, capability per
//!   route) and the key-table endpoints.
//! - [`http`]: the HTTP + JSON API (`docs/mon-api.md`); [`forward`] relays calls from
//!   followers to the leader so any monitor answers; [`compress`]: gzip of large answers
//!   for callers that accept it; [`map_answers`]: map answers cut, encoded and compressed once
//!   for all the holders of one scope.
//! - [`report_queue`]: the OSDs' report batches, applied and committed together (one epoch
//!   for the reports of a moment).
//! - [`stats`]: client IO and recovery rates from OSD heartbeats.
//! - [`op_reports`]: the OSDs' op tracker reports (`SLOW_OPS`, `GET /v1/osds/{id}/ops`).
//! - [`metrics`]: Prometheus `/metrics`.
//! - [`status_page`]: the web status page (a static page embedded in the binary) and the
//!   unsigned, read-only view it polls.
//! - [`supervise`]: every background task is supervised: a failure is logged, counted in
//!   health (`MON_TASK_FAILED`), and the task restarted with a back-off or the monitor
//!   stopped.
//! - [`cpu`]: long CPU work (the whole state decoded, an operation decided) run so that the
//!   lease renewals and the other tasks keep their turn; [`child_anchor`]: the thread the own
//!   etcd member is forked from, so that it dies with the monitor and only then.
//! - [`server`]: wiring of all of the above for the binary and for tests.
//!
//! Decisions live in `fastblock-mon-core`; this crate only performs them. Only monitors talk
//! to etcd: OSDs and clients use the HTTP API.

pub mod auth_http;
pub mod backup;
pub mod child_anchor;
pub mod compress;
pub mod cpu;
pub mod election;
pub mod etcd_auth;
pub mod etcd_identity;
pub mod etcd_maint;
pub mod etcd_proc;
pub mod etcd_tls;
pub mod forward;
pub mod http;
pub mod key_seal;
pub mod keys;
pub mod map_answers;
pub mod metrics;
pub mod op_reports;
pub mod osd_config;
pub mod report_queue;
pub mod secret;
pub mod server;
pub mod service;
pub mod stats;
pub mod status_page;
pub mod store;
pub mod supervise;
pub mod txn_limits;

//! fastblock-nbd: an NBD server for the cluster's images (layer 5), written to the protocol
//! specification (NetworkBlockDevice `doc/proto.md`). The Linux kernel driver, qemu, libnbd's
//! tools and fio all speak NBD, so this is how users attach fastblock block devices.
//!
//! What is supported, the flags advertised, why `CAN_MULTI_CONN` holds, the limits and how to
//! use it with each client are in `docs/nbd.md`.
//!
//! Module map. Sans IO (pure parsing and encoding; fuzzed, always built):
//! - [`consts`]: protocol numbers and this server's limits.
//! - `be`: the bounds-checked big-endian reader every parser uses.
//! - [`option`]: handshake parsing: client flags, option header, each option's payload.
//! - [`option_reply`]: handshake encoding: greeting, option replies, transmission flags.
//! - [`request`]: request header parsing and validation into a [`request::Command`].
//! - [`reply`]: simple replies and structured chunks (data, holes, block status, errors).
//! - [`extents`]: zero-block runs of read data, `base:allocation` descriptors.
//! - [`backend`]: the [`backend::Exports`] / [`backend::Export`] traits the server serves.
//! - [`access`]: the TLS mode, the gate it puts before every option, the allow lists.
//! - `cert_name`: the subject common name of a client certificate (for the allow lists).
//! - `fuzzing` (hidden): the parser properties shared by the fuzz target and a property test.
//!
//! With feature `server` (default; tokio and the client library):
//! - [`handshake`]: option haggling on a connection, across the `STARTTLS` upgrade.
//! - [`tls`]: TLS credentials (qemu's x509 directory layout) and the TLS handshake.
//! - [`certs`]: `gen-certs`, a CA with server and client certificates in that layout.
//! - [`transmission`]: the request loop of a connection, on one task: reading, admission
//!   limits, the requests' executions, the reply writes.
//! - `intake`: requests out of the read buffer (header, admission, payload, validation).
//! - `flight`: the request slots and bytes a connection holds against its limits.
//! - `poll_set`: the executions of a connection, polled on its task when woken.
//! - `outbox`: replies waiting for the socket, written in vectored writes.
//! - `execute`: one request against an export.
//! - [`server`]: TCP and Unix listeners, connection tasks, shutdown with draining.
//! - [`cluster`]: the cluster's images as exports `pool/image`.
//! - [`memory`]: in-memory exports (tests).
//! - [`metrics`]: per-export IO counters and latency (a wrapper around any exports) and the
//!   `/metrics` endpoint.
//! - `testing` (feature `test-util`): a raw NBD client and a server on in-memory exports.
//! - [`kernel`], [`map`]: attaching an export to `/dev/nbdX` through the kernel driver.
//! - [`local_users`]: which users of this host may connect (`--local-users`), and how the
//!   server finds a local client's user.
//!
//! Invariants:
//! - Nothing a client sends is unwrapped or trusted: every length is checked before use, and
//!   a malformed request gets the protocol's error (or, when the stream's framing is lost, a
//!   disconnect); other connections never notice.
//! - Memory per connection is bounded: at most `inflight_requests_max` requests and
//!   `inflight_bytes_max` payload bytes are admitted, their replies counting until written;
//!   the connection stops reading the socket beyond that.
//! - A reply is sent only after the export finished the request; write replies mean the data
//!   is durable on a majority of the PG's replicas.
//!
//! Must not depend on: the OSD, the monitor or the wire protocol directly; the cluster is
//! reached only through `fastblock-client`.

pub mod access;
mod be;
#[cfg(feature = "server")]
mod cert_name;
pub mod consts;
pub mod extents;
pub mod option;
pub mod option_reply;
pub mod reply;
pub mod request;

pub mod backend;
#[doc(hidden)]
pub mod fuzzing;

#[cfg(feature = "server")]
pub mod certs;
#[cfg(feature = "server")]
pub mod cluster;
#[cfg(feature = "server")]
mod execute;
#[cfg(feature = "server")]
mod flight;
#[cfg(feature = "server")]
pub mod handshake;
#[cfg(feature = "server")]
mod intake;
#[cfg(feature = "server")]
pub mod kernel;
#[cfg(feature = "server")]
pub mod local_users;
#[cfg(feature = "server")]
pub mod map;
#[cfg(feature = "server")]
pub mod memory;
#[cfg(feature = "server")]
pub mod metrics;
#[cfg(feature = "server")]
mod outbox;
#[cfg(feature = "server")]
mod poll_set;
#[cfg(feature = "server")]
pub mod server;
#[cfg(all(feature = "server", any(test, feature = "test-util")))]
pub mod testing;
#[cfg(feature = "server")]
pub mod tls;
#[cfg(feature = "server")]
pub mod transmission;

#[cfg(feature = "server")]
pub use server::{Server, ServerConfig};
#[cfg(feature = "server")]
pub use transmission::Limits;

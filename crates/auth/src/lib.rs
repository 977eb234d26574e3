//! Authentication for fastblock (`docs/security.md`): who an entity is, what it may do, and
//! how it proves both to the monitor and to OSDs without its key ever crossing the network.
//!
//! Module map:
//! - [`secret`]: [`Secret`], a 32-byte key, its base64 text form, random generation and the
//!   per-purpose keys derived from an entity key (one for the monitor, one for the data plane),
//!   and [`seal_blob`]/[`open_blob`] for sending a key to its owner encrypted, bound to its
//!   entity, caps, generation and table epoch ([`KeyBinding`]).
//! - [`floor`]: the weakest auth mode an end accepts by default ([`floor::default_floor`]).
//! - [`entity`]: [`EntityName`] (`client.admin`, `client.NAME`, `osd.N`).
//! - [`caps`]: [`Caps`], what an entity may do (`admin`, `osd`, `pool=NAME`, `pool=*`).
//! - [`keyring`]: the keyring file (format, mode 0600, default location).
//! - [`private_file`]: [`write_private`], the one writer of files only their owner may read.
//! - [`request`]: signatures of monitor API requests and responses, and the replay cache.
//! - [`ticket`]: tickets the monitor issues for one entity to speak to one OSD, sealed under
//!   that OSD's service key, with the session key the holder proves (Kerberos' and cephx's
//!   shape: no OSD holds any key but its own).
//! - [`handshake`]: the data-plane challenge-response handshake over a ticket (sans-IO: both
//!   ends are pure state machines fed with the peer's messages, nonces and the time).
//! - [`frame`]: per-connection frame protection after the handshake: an authentication tag on
//!   every frame (`sign`) or authenticated encryption of every payload (`secure`).
//! - [`table`]: [`EntityTable`], the entities' caps and generations (no keys) an OSD checks
//!   tickets and open connections against for revocation.
//! - [`error`]: [`AuthError`], one variant per cause a user must be told about.
//!
//! Cryptography is `ring`'s: HMAC-SHA256 for derivations and proofs, AES-256-GCM for frames
//! and sealed keys. Nothing here reads a clock; callers pass the time.

pub mod caps;
pub mod entity;
pub mod error;
pub mod floor;
pub mod frame;
pub mod handshake;
pub mod keyring;
pub mod private_file;
pub mod request;
pub mod secret;
pub mod table;
pub mod ticket;

pub use caps::Caps;
pub use entity::EntityName;
pub use error::AuthError;
pub use fastblock_types::auth::{AuthMode, AuthSettings};
pub use keyring::{Keyring, KeyringEntry};
pub use private_file::{write_private, Existing};
pub use secret::{open_blob, random_bytes, seal_blob, KeyBinding, Secret};
pub use table::EntityTable;

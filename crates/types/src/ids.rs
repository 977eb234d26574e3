//! Newtype identifiers. Each is a plain integer on the wire and in JSON (`#[serde(transparent)]`),
//! but a distinct type in code so that an OSD id can never be passed where a pool id is meant.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

macro_rules! id_newtype {
    ($(#[$meta:meta])* $name:ident($inner:ty)) => {
        $(#[$meta])*
        #[derive(
            Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
        )]
        #[serde(transparent)]
        pub struct $name(pub $inner);

        impl $name {
            /// The raw value, for encoders and display only.
            pub const fn get(self) -> $inner {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0)
            }
        }

        impl FromStr for $name {
            type Err = std::num::ParseIntError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                s.parse::<$inner>().map($name)
            }
        }
    };
}

id_newtype!(
    /// An OSD. Ids start at 1 and are never reused (0 means "none" in reference formats).
    OsdId(u32)
);
id_newtype!(
    /// A pool. Ids start at 1 and are never reused, also across monitor restarts.
    PoolId(u32)
);
id_newtype!(
    /// An image. Ids start at 1 and are never reused; object ids are built from them so that a
    /// new image with a removed image's name can never see the old image's data.
    ImageId(u64)
);
id_newtype!(
    /// A snapshot of an image. Ids are allocated per image from 1 and never reused (the image
    /// records the last one given, `ImageInfo::snap_seq`); the OSD store packs them in 21 bits,
    /// so they stay below [`SnapId::LIMIT`].
    SnapId(u64)
);

impl SnapId {
    /// Snapshot ids are below this: the OSD store packs them in 21 bits and keeps the top
    /// value free.
    pub const LIMIT: u64 = 1 << 20;

    /// Live snapshots an image may have at once. Every snapshot is listed in the cluster map
    /// that every OSD and client holds, and a snapshot's removal walks the blocks it keeps:
    /// a bound keeps both small (Ceph RBD images rarely carry more than a few dozen).
    pub const LIVE_PER_IMAGE_MAX: usize = 512;
}

id_newtype!(
    /// The cluster-map epoch: bumped by every change the monitor persists.
    Epoch(u64)
);
id_newtype!(
    /// A Raft term.
    Term(u64)
);
id_newtype!(
    /// A Raft log index.
    LogIndex(u64)
);

/// A placement group: `pool.seq`, displayed like the reference system (`1.0`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PgId {
    pub pool: PoolId,
    pub seq: u32,
}

impl PgId {
    pub const fn new(pool: PoolId, seq: u32) -> Self {
        PgId { pool, seq }
    }
}

impl fmt::Display for PgId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.pool, self.seq)
    }
}

/// Error of parsing `pool.seq`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid PG id {0:?}: expected POOL.SEQ, for example 1.0")]
pub struct PgIdParseError(pub String);

impl FromStr for PgId {
    type Err = PgIdParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || PgIdParseError(s.to_string());
        let (pool, seq) = s.split_once('.').ok_or_else(err)?;
        Ok(PgId {
            pool: PoolId(pool.parse().map_err(|_| err())?),
            seq: seq.parse().map_err(|_| err())?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pg_id_round_trips_through_display() {
        let pg = PgId::new(PoolId(3), 17);
        assert_eq!(pg.to_string(), "3.17");
        assert_eq!("3.17".parse::<PgId>().unwrap(), pg);
        assert!("3".parse::<PgId>().is_err());
        assert!("a.1".parse::<PgId>().is_err());
        assert!("1.-1".parse::<PgId>().is_err());
    }

    #[test]
    fn ids_are_plain_numbers_in_json() {
        assert_eq!(serde_json::to_string(&OsdId(7)).unwrap(), "7");
        let back: OsdId = serde_json::from_str("7").unwrap();
        assert_eq!(back, OsdId(7));
    }
}

//! PG state bits, numerically identical to the reference system's `pgstate` so that tools and
//! operators used to it read the same numbers: creating 1, active 2, undersize 4, down 8,
//! remapped 16.
//!
//! fastblock derives the bits from the PG's facts instead of setting them imperatively (see
//! `mon-core`): `creating` until a leader has reported, `remapped` while a target membership is
//! pending, `undersize`/`down` from how many members are up, and `active` exactly when none of
//! the other bits is set.

use serde::{Deserialize, Serialize};
use std::fmt;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PgState(pub u64);

impl PgState {
    pub const CREATING: PgState = PgState(1);
    pub const ACTIVE: PgState = PgState(2);
    pub const UNDERSIZE: PgState = PgState(4);
    pub const DOWN: PgState = PgState(8);
    pub const REMAPPED: PgState = PgState(16);

    pub const fn contains(self, other: PgState) -> bool {
        self.0 & other.0 == other.0 && other.0 != 0
    }

    pub const fn union(self, other: PgState) -> PgState {
        PgState(self.0 | other.0)
    }

    /// Builds the state from its facts; `active` is set exactly when nothing else is.
    pub fn derive(creating: bool, undersize: bool, down: bool, remapped: bool) -> PgState {
        assert!(
            !(undersize && down),
            "a PG is either undersize or down, not both"
        );
        let mut bits = 0;
        if creating {
            bits |= Self::CREATING.0;
        }
        if undersize {
            bits |= Self::UNDERSIZE.0;
        }
        if down {
            bits |= Self::DOWN.0;
        }
        if remapped {
            bits |= Self::REMAPPED.0;
        }
        if bits == 0 {
            bits = Self::ACTIVE.0;
        }
        PgState(bits)
    }

    pub fn is_active(self) -> bool {
        self == Self::ACTIVE
    }

    /// The display string: the reference's names joined with `+` (`undersize+remapped`).
    pub fn name(self) -> String {
        if self.0 == 0 {
            return "unknown".to_string();
        }
        let parts: Vec<&str> = [
            (Self::CREATING, "creating"),
            (Self::ACTIVE, "active"),
            (Self::UNDERSIZE, "undersize"),
            (Self::DOWN, "down"),
            (Self::REMAPPED, "remapped"),
        ]
        .iter()
        .filter(|(bit, _)| self.contains(*bit))
        .map(|(_, name)| *name)
        .collect();
        if parts.is_empty() || self.0 >= 32 {
            return "unknown".to_string();
        }
        parts.join("+")
    }
}

impl fmt::Display for PgState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_match_the_reference() {
        assert_eq!(PgState::derive(true, false, false, false).0, 1);
        assert_eq!(PgState::derive(false, false, false, false).0, 2);
        assert_eq!(PgState::derive(false, true, false, false).0, 4);
        assert_eq!(PgState::derive(false, false, true, false).0, 8);
        assert_eq!(PgState::derive(false, false, false, true).0, 16);
        assert_eq!(PgState::derive(true, true, false, false).0, 5);
        assert_eq!(PgState::derive(false, true, false, true).0, 20);
        assert_eq!(PgState::derive(false, false, true, true).0, 24);
    }

    #[test]
    fn names_join_bits() {
        assert_eq!(PgState(2).name(), "active");
        assert_eq!(PgState(20).name(), "undersize+remapped");
        assert_eq!(PgState(9).name(), "creating+down");
        assert_eq!(PgState(0).name(), "unknown");
        assert_eq!(PgState(64).name(), "unknown");
    }

    #[test]
    #[should_panic(expected = "either undersize or down")]
    fn undersize_and_down_are_exclusive() {
        PgState::derive(false, true, true, false);
    }
}

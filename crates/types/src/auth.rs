//! The cluster's authentication setting as the map carries it (`docs/security.md`).
//!
//! The mode is chosen per cluster and read by every daemon and client from the map, so all
//! ends of a connection agree on it. `epoch` rises with every change of the monitor's key
//! table (an entity added, removed, rotated or given new caps): OSDs refetch the table when it
//! moves and close the connections of entities that lost their key or caps.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// How the cluster authenticates, and what it protects on the data plane.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    /// No authentication anywhere: the monitor API is open and OSD ports take any frame.
    /// For benchmarks and isolated labs only.
    #[default]
    None,
    /// Every monitor call is signed; every data connection starts with a challenge-response
    /// handshake and every frame on it carries an authentication tag (integrity, no secrecy).
    Sign,
    /// As `Sign`, and every data frame's payload is encrypted (integrity and secrecy).
    Secure,
}

impl AuthMode {
    /// Whether entities must prove their keys (every mode but `None`).
    pub fn authenticates(self) -> bool {
        self != AuthMode::None
    }

    pub fn as_str(self) -> &'static str {
        match self {
            AuthMode::None => "none",
            AuthMode::Sign => "sign",
            AuthMode::Secure => "secure",
        }
    }

    /// The mode's byte in the data-plane handshake.
    pub fn wire_byte(self) -> u8 {
        match self {
            AuthMode::None => 0,
            AuthMode::Sign => 1,
            AuthMode::Secure => 2,
        }
    }

    pub fn from_wire_byte(b: u8) -> Option<AuthMode> {
        match b {
            0 => Some(AuthMode::None),
            1 => Some(AuthMode::Sign),
            2 => Some(AuthMode::Secure),
            _ => None,
        }
    }
}

impl fmt::Display for AuthMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for AuthMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(AuthMode::None),
            "sign" => Ok(AuthMode::Sign),
            "secure" => Ok(AuthMode::Secure),
            other => Err(format!(
                "unknown auth mode {other:?} (expected none, sign or secure)"
            )),
        }
    }
}

/// The map's authentication section.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthSettings {
    pub mode: AuthMode,
    /// Version of the key table; rises with every change to it.
    pub epoch: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_round_trip_through_text_and_wire() {
        for m in [AuthMode::None, AuthMode::Sign, AuthMode::Secure] {
            assert_eq!(m.as_str().parse::<AuthMode>().unwrap(), m);
            assert_eq!(AuthMode::from_wire_byte(m.wire_byte()), Some(m));
        }
        assert!("cephx".parse::<AuthMode>().is_err());
        assert_eq!(AuthMode::from_wire_byte(3), None);
        assert!(!AuthMode::None.authenticates());
        assert!(AuthMode::Sign.authenticates());
    }
}

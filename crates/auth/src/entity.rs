//! Entity names: who holds a key. `client.admin` administers the cluster, `client.NAME` is a
//! named client, `osd.N` is OSD N (its key is made when the OSD is created).

use crate::error::AuthError;
use fastblock_types::OsdId;
use std::fmt;
use std::str::FromStr;

/// Longest client name (after `client.`).
pub const CLIENT_NAME_BYTES_MAX: usize = 64;

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EntityName {
    Client(String),
    Osd(OsdId),
}

impl EntityName {
    pub fn admin() -> EntityName {
        EntityName::Client("admin".into())
    }

    pub fn osd(&self) -> Option<OsdId> {
        match self {
            EntityName::Osd(id) => Some(*id),
            EntityName::Client(_) => None,
        }
    }
}

impl fmt::Display for EntityName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EntityName::Client(n) => write!(f, "client.{n}"),
            EntityName::Osd(id) => write!(f, "osd.{}", id.0),
        }
    }
}

impl FromStr for EntityName {
    type Err = AuthError;
    fn from_str(s: &str) -> Result<Self, AuthError> {
        let bad = |why| AuthError::BadEntity {
            name: s.to_string(),
            why,
        };
        if let Some(name) = s.strip_prefix("client.") {
            if name.is_empty() || name.len() > CLIENT_NAME_BYTES_MAX {
                return Err(bad("a client name has 1 to 64 characters"));
            }
            if !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            {
                return Err(bad("a client name has only letters, digits, '_' and '-'"));
            }
            Ok(EntityName::Client(name.to_string()))
        } else if let Some(id) = s.strip_prefix("osd.") {
            // Canonical decimal only, so each OSD has exactly one name.
            if id.is_empty() || (id.len() > 1 && id.starts_with('0')) {
                return Err(bad("an OSD name is osd.N with N a decimal number"));
            }
            let n: u32 = id
                .parse()
                .map_err(|_| bad("an OSD name is osd.N with N a decimal number"))?;
            Ok(EntityName::Osd(OsdId(n)))
        } else {
            Err(bad("an entity is client.NAME or osd.N"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_canonically_and_print_back() {
        for s in ["client.admin", "client.vm-17_a", "osd.0", "osd.4294967295"] {
            assert_eq!(s.parse::<EntityName>().unwrap().to_string(), s);
        }
        for s in [
            "client.",
            "client.a b",
            "client.a.b",
            "osd.",
            "osd.01",
            "osd.-1",
            "osd.x",
            "mon.a",
            "admin",
            "osd.4294967296",
        ] {
            assert!(s.parse::<EntityName>().is_err(), "{s} accepted");
        }
        assert_eq!(EntityName::admin().to_string(), "client.admin");
        assert_eq!("osd.3".parse::<EntityName>().unwrap().osd(), Some(OsdId(3)));
    }
}

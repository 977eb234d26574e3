//! Capabilities: what an authenticated entity may do.
//!
//! Text form: space-separated tokens.
//! - `admin`: every monitor call (pools, images, OSDs, flags, keys) and IO on every pool.
//! - `osd`: what an OSD daemon does: boot and heartbeat as itself, report the PGs it leads,
//!   read the key table, and speak to other OSDs. Given only to `osd.N` entities.
//! - `pool=NAME` / `pool=*`: read and write the images of pool NAME (or of every pool), read
//!   the image records of those pools, and read the cluster map (which a client needs to route
//!   IO).
//!
//! Every authenticated entity may read the map, health and status.

use crate::error::AuthError;
use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Caps {
    pub admin: bool,
    pub osd: bool,
    pub pools: PoolScope,
}

/// The pools an entity may do IO on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum PoolScope {
    #[default]
    Nothing,
    Named(BTreeSet<String>),
    All,
}

impl Caps {
    pub fn admin() -> Caps {
        Caps {
            admin: true,
            ..Caps::default()
        }
    }

    pub fn osd() -> Caps {
        Caps {
            osd: true,
            ..Caps::default()
        }
    }

    /// Whether IO on pool `name` is allowed.
    pub fn allows_pool(&self, name: &str) -> bool {
        if self.admin || self.osd {
            return true;
        }
        match &self.pools {
            PoolScope::Nothing => false,
            PoolScope::All => true,
            PoolScope::Named(names) => names.contains(name),
        }
    }

    /// Whether OSD-to-OSD messages (Raft, snapshots) may come from this entity.
    pub fn is_peer(&self) -> bool {
        self.osd
    }
}

impl fmt::Display for Caps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut tokens: Vec<String> = Vec::new();
        if self.admin {
            tokens.push("admin".into());
        }
        if self.osd {
            tokens.push("osd".into());
        }
        match &self.pools {
            PoolScope::Nothing => {}
            PoolScope::All => tokens.push("pool=*".into()),
            PoolScope::Named(names) => tokens.extend(names.iter().map(|n| format!("pool={n}"))),
        }
        f.write_str(&tokens.join(" "))
    }
}

impl FromStr for Caps {
    type Err = AuthError;
    fn from_str(s: &str) -> Result<Self, AuthError> {
        let bad = |why: String| AuthError::BadCaps {
            caps: s.to_string(),
            why,
        };
        let mut caps = Caps::default();
        let mut named = BTreeSet::new();
        let mut all = false;
        for token in s.split_whitespace() {
            match token {
                "admin" => caps.admin = true,
                "osd" => caps.osd = true,
                _ => match token.strip_prefix("pool=") {
                    Some("*") => all = true,
                    Some(name) => {
                        fastblock_types::names::validate_name(name)
                            .map_err(|e| bad(format!("pool name {name:?}: {e}")))?;
                        named.insert(name.to_string());
                    }
                    None => {
                        return Err(bad(format!(
                            "unknown token {token:?} (expected admin, osd, pool=NAME or pool=*)"
                        )))
                    }
                },
            }
        }
        caps.pools = if all {
            PoolScope::All
        } else if named.is_empty() {
            PoolScope::Nothing
        } else {
            PoolScope::Named(named)
        };
        Ok(caps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_parse_print_and_decide_pools() {
        let c: Caps = "pool=vm pool=images".parse().unwrap();
        assert!(c.allows_pool("vm") && c.allows_pool("images"));
        assert!(!c.allows_pool("other"));
        assert!(!c.admin && !c.is_peer());
        assert_eq!(c.to_string(), "pool=images pool=vm");
        assert_eq!(c.to_string().parse::<Caps>().unwrap(), c);

        let all: Caps = "pool=*".parse().unwrap();
        assert!(all.allows_pool("anything"));
        assert!("admin".parse::<Caps>().unwrap().allows_pool("x"));
        assert!("osd".parse::<Caps>().unwrap().is_peer());
        assert!(!"".parse::<Caps>().unwrap().allows_pool("x"));

        assert!("root".parse::<Caps>().is_err());
        assert!("pool=".parse::<Caps>().is_err());
        assert!("pool=a/b".parse::<Caps>().is_err());
    }
}

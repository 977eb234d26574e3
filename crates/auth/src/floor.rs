//! The auth floor: the weakest mode an end accepts from the monitor.
//!
//! The mode is a cluster setting carried in the map, so that every end agrees; but the map
//! comes over the network. An end that holds a key takes its floor from its own configuration
//! (`--auth-floor`, default [`default_floor`]) and refuses anything weaker, so that whoever
//! sits between it and the monitor cannot switch it to `none` (`docs/security.md`, "No
//! downgrade"). The two rules that apply it: the monitor client refuses an unsigned answer at a
//! floor above `none` (`fastblock_monclient`), and a map follower refuses a map in a mode below
//! the floor (`fastblock_types::map_delta::MapFollower::with_auth_floor`).

use fastblock_types::auth::AuthMode;

/// The floor an end has when nothing configures it: `sign` if it holds a key, else `none`.
pub fn default_floor(has_key: bool) -> AuthMode {
    if has_key {
        AuthMode::Sign
    } else {
        AuthMode::None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_end_with_a_key_accepts_sign_at_least() {
        assert_eq!(default_floor(true), AuthMode::Sign);
        assert_eq!(default_floor(false), AuthMode::None);
    }
}

//! The auth floor: the weakest mode an end accepts from a map, an answer or a peer.
//!
//! The mode is a cluster setting carried in the map, so that every end agrees; but the map
//! comes over the network. An end that holds a key takes its floor from its own configuration
//! (`--auth-floor`, default `sign` when it holds a key) and refuses anything weaker, so that
//! whoever sits between it and the monitor cannot switch it to `none` (`docs/security.md`,
//! "No downgrade").

use crate::error::AuthError;
use fastblock_types::auth::AuthMode;

/// The floor an end has when nothing configures it: `sign` if it holds a key, else `none`.
pub fn default_floor(has_key: bool) -> AuthMode {
    if has_key {
        AuthMode::Sign
    } else {
        AuthMode::None
    }
}

/// Refuses `offered` (the mode of `what`) if it is weaker than `floor`.
pub fn check(floor: AuthMode, offered: AuthMode, what: &str) -> Result<(), AuthError> {
    if offered < floor {
        return Err(AuthError::BelowFloor {
            what: what.to_string(),
            offered: offered.to_string(),
            floor: floor.to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_weaker_modes_are_refused() {
        use AuthMode::*;
        for (floor, offered, ok) in [
            (None, None, true),
            (None, Secure, true),
            (Sign, None, false),
            (Sign, Sign, true),
            (Sign, Secure, true),
            (Secure, Sign, false),
            (Secure, Secure, true),
        ] {
            let got = check(floor, offered, "the map of epoch 7");
            assert_eq!(got.is_ok(), ok, "floor {floor}, offered {offered}");
            if let Err(e) = got {
                let text = e.to_string();
                assert!(
                    text.contains("epoch 7") && text.contains(floor.as_str()),
                    "{text}"
                );
            }
        }
        assert_eq!(default_floor(true), Sign);
        assert_eq!(default_floor(false), None);
    }
}

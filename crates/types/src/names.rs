//! Validation of user-chosen names (pools, images). Names become etcd key segments and NBD
//! export names (`pool/image`), so the alphabet is restricted to what is safe in both.

/// The longest pool or image name accepted.
pub const NAME_LEN_MAX: usize = 128;

/// Why a name was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NameError {
    #[error("name is empty")]
    Empty,
    #[error("name {0:?} is longer than {NAME_LEN_MAX} characters")]
    TooLong(String),
    #[error("name {0:?} may only contain letters, digits, '-', '_' and '.', and must not start with '.' or '-'")]
    BadCharacter(String),
}

/// Checks a pool or image name: 1..=128 characters from `[A-Za-z0-9._-]`, not starting with `.`
/// or `-` (so it can't be `.`/`..` in a key path or look like a CLI flag).
pub fn validate_name(name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > NAME_LEN_MAX {
        return Err(NameError::TooLong(name.to_string()));
    }
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if !name.chars().all(ok_char) || name.starts_with('.') || name.starts_with('-') {
        return Err(NameError::BadCharacter(name.to_string()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_ordinary_names() {
        for name in ["fb", "vm-disk_01", "a.b", "X9"] {
            assert_eq!(validate_name(name), Ok(()), "{name}");
        }
    }

    #[test]
    fn refuses_unsafe_names() {
        assert_eq!(validate_name(""), Err(NameError::Empty));
        assert!(matches!(
            validate_name(&"a".repeat(129)),
            Err(NameError::TooLong(_))
        ));
        for bad in ["a/b", "..", ".hidden", "-x", "sp ace", "é", "a\0"] {
            assert!(
                matches!(validate_name(bad), Err(NameError::BadCharacter(_))),
                "{bad}"
            );
        }
    }
}

//! The version every fastblock binary prints for `--version`: the workspace version and the
//! git commit it was built from (`0.1.0 (1a2b3c4)`, or `(unknown)` outside a git checkout).
//!
//! A leaf crate on purpose: its build script reruns on every commit (`build.rs`), and only the
//! crates of binaries depend on it, so a commit does not rebuild the libraries.

/// The short git hash of the build, or "unknown".
pub const GIT_HASH: &str = env!("FASTBLOCK_GIT_HASH");

/// `--version` text: "VERSION (HASH)".
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("FASTBLOCK_GIT_HASH"),
    ")"
);

#[cfg(test)]
mod tests {
    #[test]
    fn the_version_names_a_commit() {
        assert!(super::VERSION.starts_with(env!("CARGO_PKG_VERSION")));
        assert!(super::VERSION.ends_with(&format!("({})", super::GIT_HASH)));
        assert!(!super::GIT_HASH.is_empty());
    }
}

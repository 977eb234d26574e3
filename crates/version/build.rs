//! Puts the git commit of the build into `FASTBLOCK_GIT_HASH` for `--version`.
//!
//! The hash comes from `$FASTBLOCK_GIT_HASH` when set (a package built from a tarball), else
//! from `git rev-parse --short HEAD`, else it is "unknown" (no git, or not a checkout).
//!
//! Why the rerun lines: without any, cargo reruns a build script whenever a file of its
//! package changes, and with none of ours this one would be rerun only then, missing new
//! commits. Watching `HEAD` (a checkout or a branch switch) and the file of the branch it
//! points to (a commit), plus `packed-refs`, reruns it on exactly those events. Only this
//! leaf crate and the crates of binaries depend on it, so a commit rebuilds those, not the
//! libraries under them.

use std::path::{Path, PathBuf};
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_string())
}

/// A path git printed, relative to this crate's directory (where git ran) unless absolute.
fn git_path(text: String) -> PathBuf {
    let path = PathBuf::from(text);
    if path.is_absolute() {
        path
    } else {
        Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default()).join(path)
    }
}

fn watch(path: &Path) {
    // A file that does not exist would make cargo rerun this script on every build.
    if path.exists() {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=FASTBLOCK_GIT_HASH");
    let hash = match std::env::var("FASTBLOCK_GIT_HASH") {
        Ok(hash) if !hash.trim().is_empty() => hash.trim().to_string(),
        _ => {
            // In a worktree, HEAD lives in the worktree's git dir and the branches in the
            // common one.
            if let Some(git_dir) = git(&["rev-parse", "--git-dir"]).map(git_path) {
                let head = git_dir.join("HEAD");
                watch(&head);
                let common = git(&["rev-parse", "--git-common-dir"])
                    .map(git_path)
                    .unwrap_or(git_dir);
                if let Some(reference) = std::fs::read_to_string(&head)
                    .ok()
                    .and_then(|h| h.strip_prefix("ref:").map(|r| r.trim().to_string()))
                {
                    watch(&common.join(reference));
                }
                watch(&common.join("packed-refs"));
            }
            git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".to_string())
        }
    };
    println!("cargo:rustc-env=FASTBLOCK_GIT_HASH={hash}");
}

//! Test-only disk fault injection: `--fault-injection-file PATH` (refused unless the
//! environment holds `FASTBLOCK_TEST_FAULTS=1`). Every shard's disk is a
//! [`fastblock_store::FaultyDisk`] with a plan of its own, empty unless this module fills it
//! from the file, which it reads at start and then every [`POLL_INTERVAL`]. The file format
//! and how the faults meet the store are in `docs/testing.md`.
//!
//! Why a file polled by the OSD and not a signal or an API call: a test (or a chaos script)
//! changes a disk's behaviour in a running process with one `write`, no protocol of the OSD
//! learns about faults, and a production OSD, which never has the option, has nothing that
//! could turn them on.

use fastblock_store::disk::{FaultCounts, FaultKind, FaultOp};
use fastblock_store::{FaultPlan, FaultRule};
use serde::Deserialize;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The environment variable that must be `1` for `--fault-injection-file` to be taken.
pub const TEST_FAULTS_VAR: &str = "FASTBLOCK_TEST_FAULTS";
/// How often the file is read again.
pub const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// A larger file is refused (and logged) without being parsed.
const FILE_BYTES_MAX: u64 = 1 << 20;

/// The usage check of `--fault-injection-file` against the value of [`TEST_FAULTS_VAR`]: an
/// error to print before exiting with status 2.
pub fn check(file: Option<&Path>, test_faults: Option<&OsStr>) -> Result<(), String> {
    match file {
        Some(path) if test_faults != Some(OsStr::new("1")) => Err(format!(
            "--fault-injection-file {} is for tests only (it makes this OSD's disk fail on \
             purpose): refused unless the environment holds {TEST_FAULTS_VAR}=1",
            path.display()
        )),
        _ => Ok(()),
    }
}

/// The file: `{"seed": 1, "rules": [...]}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSpec {
    /// Seeds the rules' probabilities; shard k draws from `seed + k`.
    #[serde(default)]
    seed: u64,
    #[serde(default)]
    rules: Vec<FileRule>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileRule {
    op: FileOp,
    kind: FileKind,
    /// `[start, end)` in bytes of the shard's region; absent or null: all of it.
    #[serde(default)]
    range: Option<[u64; 2]>,
    #[serde(default = "certain")]
    probability: f64,
    /// Fires at most this many times (per shard); absent or null: without limit.
    #[serde(default)]
    count: Option<u64>,
    /// Only this shard; absent or null: every shard.
    #[serde(default)]
    shard: Option<u32>,
}

fn certain() -> f64 {
    1.0
}

#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
enum FileOp {
    Read,
    Write,
    Sync,
}

/// `"eio"`, `"enospc"`, `"corrupt"` or `{"delay_ms": N}`.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
enum FileKind {
    Eio,
    Enospc,
    DelayMs(u64),
    Corrupt,
}

/// Parses the file's text into each shard's (seed, rules), checked: an error names the
/// first thing wrong. Blank text means no faults.
fn parse(text: &str, shards: u32) -> Result<Vec<(u64, Vec<FaultRule>)>, String> {
    let spec = if text.trim().is_empty() {
        FileSpec {
            seed: 0,
            rules: Vec::new(),
        }
    } else {
        serde_json::from_str::<FileSpec>(text).map_err(|e| e.to_string())?
    };
    let mut plans: Vec<(u64, Vec<FaultRule>)> = (0..shards)
        .map(|k| (spec.seed.wrapping_add(u64::from(k)), Vec::new()))
        .collect();
    for (index, r) in spec.rules.iter().enumerate() {
        let rule = FaultRule {
            op: match r.op {
                FileOp::Read => FaultOp::Read,
                FileOp::Write => FaultOp::Write,
                FileOp::Sync => FaultOp::Sync,
            },
            kind: match r.kind {
                FileKind::Eio => FaultKind::Eio,
                FileKind::Enospc => FaultKind::Enospc,
                FileKind::DelayMs(ms) => FaultKind::DelayMs(ms),
                FileKind::Corrupt => FaultKind::Corrupt,
            },
            range: r.range.map(|[start, end]| start..end),
            probability: r.probability,
            fires_max: r.count,
        };
        match r.shard {
            Some(k) if k >= shards => {
                return Err(format!(
                    "rule {index}: shard {k}, but this OSD has {shards} shard(s)"
                ))
            }
            Some(k) => plans[k as usize].1.push(rule),
            None => plans.iter_mut().for_each(|p| p.1.push(rule.clone())),
        }
    }
    for (k, (_, rules)) in plans.iter().enumerate() {
        FaultPlan::check_rules(rules).map_err(|e| format!("shard {k}: {e}"))?;
    }
    Ok(plans)
}

/// The fault injection file of one OSD and the plans of its shards.
pub struct FaultFile {
    path: PathBuf,
    plans: Vec<FaultPlan>,
    /// What the last read found (`None`: not read yet): a change is installed (or logged).
    seen: Option<Result<Vec<u8>, String>>,
    /// The faults fired at the last log of them.
    logged: FaultCounts,
}

impl FaultFile {
    /// Empty plans for `shards` shards, to be filled from `path`.
    pub fn new(path: PathBuf, shards: u32) -> FaultFile {
        FaultFile {
            path,
            plans: (0..shards).map(|_| FaultPlan::new()).collect(),
            seen: None,
            logged: FaultCounts::default(),
        }
    }

    /// The plan of shard `index`, for its disk.
    pub fn plan(&self, index: u32) -> FaultPlan {
        self.plans[index as usize].clone()
    }

    /// Reads the file and installs its rules if it changed; logs what it did and what fired.
    /// Never fails: an unreadable or unparsable file is logged and the rules stay as they
    /// were; an absent or blank file means no faults.
    pub fn poll(&mut self) {
        let read = self.read();
        if self.seen.as_ref() != Some(&read) {
            match &read {
                Ok(content) => self.install(content),
                Err(e) => tracing::warn!(
                    "fault injection file {}: {e}; the faults stay as they were",
                    self.path.display()
                ),
            }
            self.seen = Some(read);
        }
        self.log_fired();
    }

    /// The file's content (empty if it does not exist), or why it cannot be read.
    fn read(&self) -> Result<Vec<u8>, String> {
        let absent = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
        match std::fs::metadata(&self.path) {
            Err(e) if absent(&e) => return Ok(Vec::new()),
            Ok(m) if m.len() > FILE_BYTES_MAX => {
                return Err(format!(
                    "{} bytes, more than the {FILE_BYTES_MAX} a fault file may hold",
                    m.len()
                ))
            }
            _ => {}
        }
        match std::fs::read(&self.path) {
            Err(e) if absent(&e) => Ok(Vec::new()),
            other => other.map_err(|e| e.to_string()),
        }
    }

    fn install(&self, content: &[u8]) {
        let path = self.path.display();
        let parsed = std::str::from_utf8(content)
            .map_err(|e| e.to_string())
            .and_then(|text| parse(text, self.plans.len() as u32));
        let plans = match parsed {
            Ok(plans) => plans,
            Err(e) => {
                tracing::warn!(
                    "fault injection file {path} ignored: {e}; the faults stay as they were"
                );
                return;
            }
        };
        for (shard, (plan, (seed, rules))) in self.plans.iter().zip(plans).enumerate() {
            let count = rules.len();
            match plan.set_rules(seed, rules) {
                // `parse` checked the rules: this cannot happen, and is no reason to stop.
                Err(e) => tracing::warn!("fault injection file {path}: shard {shard}: {e}"),
                Ok(()) if count > 0 => tracing::warn!(shard, seed, rules = ?plan.rules(),
                    "fault injection (test-only): {count} rule(s) set from {path}"),
                Ok(()) => {}
            }
        }
        if self.plans.iter().all(FaultPlan::is_empty) {
            tracing::info!("fault injection (test-only): no rules in {path}");
        }
    }

    fn log_fired(&mut self) {
        let mut fired = FaultCounts::default();
        for plan in &self.plans {
            let c = plan.fired();
            fired.eio += c.eio;
            fired.enospc += c.enospc;
            fired.delay += c.delay;
            fired.corrupt += c.corrupt;
        }
        if fired != self.logged {
            tracing::warn!(
                eio = fired.eio,
                enospc = fired.enospc,
                delay = fired.delay,
                corrupt = fired.corrupt,
                "faults injected so far (test-only fault injection)"
            );
            self.logged = fired;
        }
    }

    /// Polls the file every [`POLL_INTERVAL`], forever.
    pub async fn run(mut self) {
        let mut ticker = tokio::time::interval(POLL_INTERVAL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            // A small file: reading it on the control runtime is quicker than handing it off.
            self.poll();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_option_needs_the_test_variable() {
        let path = Path::new("/tmp/faults.json");
        assert!(check(None, None).is_ok());
        assert!(check(None, Some(OsStr::new("0"))).is_ok());
        assert!(check(Some(path), Some(OsStr::new("1"))).is_ok());
        for value in [None, Some(OsStr::new("0")), Some(OsStr::new("yes"))] {
            let e = check(Some(path), value).unwrap_err();
            assert!(e.contains("for tests only"), "{e}");
            assert!(e.contains("FASTBLOCK_TEST_FAULTS=1"), "{e}");
        }
    }

    #[test]
    fn the_file_format() {
        let text = r#"{"seed": 7, "rules": [
            {"op": "write", "kind": "eio", "range": null, "probability": 1.0, "count": null,
             "shard": null},
            {"op": "read", "kind": "corrupt", "range": [4096, 8192], "shard": 1},
            {"op": "sync", "kind": {"delay_ms": 20}, "probability": 0.5, "count": 3}
        ]}"#;
        let plans = parse(text, 2).unwrap();
        assert_eq!(plans.len(), 2);
        assert_eq!(plans[0].0, 7);
        assert_eq!(plans[1].0, 8, "each shard draws from its own seed");
        assert_eq!(
            plans[0].1,
            vec![
                FaultRule::new(FaultOp::Write, FaultKind::Eio),
                FaultRule::new(FaultOp::Sync, FaultKind::DelayMs(20))
                    .with_probability(0.5)
                    .with_fires_max(3),
            ]
        );
        assert_eq!(plans[1].1.len(), 3);
        assert_eq!(
            plans[1].1[1],
            FaultRule::new(FaultOp::Read, FaultKind::Corrupt).with_range(4096..8192)
        );
        for blank in ["", "  \n", r#"{}"#, r#"{"seed": 3, "rules": []}"#] {
            assert!(parse(blank, 2).unwrap().iter().all(|p| p.1.is_empty()));
        }
    }

    #[test]
    fn bad_files_are_refused_with_a_reason() {
        for (text, says) in [
            ("{", "EOF"),
            (
                r#"{"rules": [{"op": "trim", "kind": "eio"}]}"#,
                "unknown variant",
            ),
            (
                r#"{"rules": [{"op": "read", "kind": "eio", "typo": 1}]}"#,
                "unknown field",
            ),
            (
                r#"{"rules": [{"op": "read", "kind": "eio", "shard": 2}]}"#,
                "2 shard(s)",
            ),
            (
                r#"{"rules": [{"op": "write", "kind": "corrupt"}]}"#,
                "reads only",
            ),
            (
                r#"{"rules": [{"op": "read", "kind": "eio", "probability": 2}]}"#,
                "probability",
            ),
            (
                r#"{"rules": [{"op": "read", "kind": "eio", "range": [9, 3]}]}"#,
                "empty",
            ),
        ] {
            let e = parse(text, 2).unwrap_err();
            assert!(e.contains(says), "{text}: {e}");
        }
    }

    #[test]
    fn polling_installs_changes_and_ignores_bad_files() {
        let dir = std::env::temp_dir().join(format!("fastblock-faults-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("faults.json");
        let _ = std::fs::remove_file(&path);
        let mut file = FaultFile::new(path.clone(), 2);
        file.poll();
        assert!(
            file.plan(0).is_empty() && file.plan(1).is_empty(),
            "absent: no faults"
        );
        std::fs::write(
            &path,
            r#"{"rules": [{"op": "write", "kind": "eio", "shard": 1}]}"#,
        )
        .unwrap();
        file.poll();
        assert!(file.plan(0).is_empty());
        assert_eq!(file.plan(1).rules().len(), 1);
        std::fs::write(&path, "{ not json").unwrap();
        file.poll();
        assert_eq!(file.plan(1).rules().len(), 1, "a bad file changes nothing");
        std::fs::write(&path, "").unwrap();
        file.poll();
        assert!(file.plan(1).is_empty(), "empty: no faults");
        std::fs::write(&path, r#"{"rules": [{"op": "read", "kind": "eio"}]}"#).unwrap();
        file.poll();
        assert!(!file.plan(0).is_empty() && !file.plan(1).is_empty());
        std::fs::remove_file(&path).unwrap();
        file.poll();
        assert!(
            file.plan(0).is_empty() && file.plan(1).is_empty(),
            "removed: no faults"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

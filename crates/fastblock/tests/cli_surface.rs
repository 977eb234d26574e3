//! The command-line surface of every fastblock binary (`docs/cli.md`, "Every binary"): `--help`
//! and `--version` answer and exit 0, an unknown flag is a usage error (exit 2, one `error:`
//! line), and none of them starts work: nothing appears in the directory it runs in (once
//! `store-bench --help` took `--help` as its file name and wrote 1.4 GB). Then the exit
//! statuses of `fastblock-client` against a real monitor: not found, refused, unreachable.

mod common;

use common::{MonCluster, MonOptions, TempDir};
use std::path::PathBuf;
use std::process::{Command, Output};

/// Every binary a user runs. The ones of other packages are built with the workspace, next to
/// ours.
const BINARIES: [&str; 8] = [
    "fastblock-mon",
    "fastblock-osd",
    "fastblock-nbd",
    "fastblock-client",
    "block_bench",
    "rtt_bench",
    "store-bench",
    "vopr",
];

fn binary(name: &str) -> PathBuf {
    let path = common::bin("fastblock-mon").with_file_name(name);
    assert!(
        path.exists(),
        "{} not built: build the workspace's binaries first (cargo build --workspace --bins)",
        path.display()
    );
    path
}

/// Runs `name ARGS` in the empty directory `cwd`, with no monitor or keyring in reach.
fn run(name: &str, args: &[&str], cwd: &TempDir) -> Output {
    Command::new(binary(name))
        .args(args)
        .current_dir(cwd.path())
        .env_remove("FASTBLOCK_MON")
        .env("FASTBLOCK_KEYRING", cwd.path().join("no-keyring"))
        .output()
        .expect("running the binary")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The commit the binaries were built from, as `git` sees it now (`None` outside git).
fn git_hash() -> Option<String> {
    let out = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| text(&out.stdout).trim().to_string())
}

fn assert_nothing_written(name: &str, what: &str, cwd: &TempDir) {
    let left: Vec<_> = std::fs::read_dir(cwd.path())
        .expect("reading the test directory")
        .map(|e| e.expect("a directory entry").file_name())
        .collect();
    assert!(left.is_empty(), "{name} {what} wrote {left:?}");
}

/// Runs `name PATH... --help` and checks it, then each subcommand it lists.
fn check_help(name: &str, path: &[String], cwd: &TempDir) {
    let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
    args.push("--help");
    let help = run(name, &args, cwd);
    let stdout = text(&help.stdout);
    let what = format!("{name} {}", args.join(" "));
    assert_eq!(
        help.status.code(),
        Some(0),
        "{what}: {stdout}{}",
        text(&help.stderr)
    );
    let summary = stdout.lines().next().unwrap_or_default();
    assert!(
        !summary.is_empty() && !summary.contains("Layer") && !summary.starts_with("Usage"),
        "{what} must open with what the command does: {summary:?}"
    );
    assert!(stdout.contains("Usage:"), "{what}: {stdout}");
    // Every entry of the Arguments, Options and Commands lists has help: on its own line
    // (after two spaces) or on the next line, indented deeper (clap's long form).
    let lines: Vec<&str> = stdout.lines().collect();
    let mut section = "";
    let mut commands = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if !line.starts_with(' ') {
            section = line.trim_end_matches(':');
            continue;
        }
        let entry = line.trim_start();
        let indent = line.len() - entry.len();
        // Entries start in column 2, or 6 for long-only options; help lines run deeper.
        let is_entry = indent <= 6 && ["Arguments", "Options", "Commands"].contains(&section);
        if !is_entry || entry.is_empty() {
            continue;
        }
        // A default or an env var alone (`[default: 16]`) is not a help text.
        let is_help = |text: &str| !text.is_empty() && !text.starts_with('[');
        let same_line = entry
            .split_once("  ")
            .is_some_and(|(_, rest)| is_help(rest.trim()));
        let next_deeper = lines
            .get(i + 1)
            .is_some_and(|next| next.len() - next.trim_start().len() > 6 && is_help(next.trim()));
        assert!(
            same_line || next_deeper,
            "{what}: {entry:?} has no help text"
        );
        if section == "Commands" {
            let command = entry.split_whitespace().next().unwrap_or_default();
            if command != "help" {
                commands.push(command.to_string());
            }
        }
    }
    for command in commands {
        let mut sub = path.to_vec();
        sub.push(command);
        check_help(name, &sub, cwd);
    }
}

/// Goal: `--help` describes the tool (its own summary, not a crate's internal description)
/// and every argument and subcommand has help text; `--version` names the git commit; a bogus
/// flag is a usage error. Method: run each binary (and each subcommand's `--help`) in an empty
/// directory and look at exit status, output and the directory.
#[test]
fn every_binary_answers_help_version_and_bad_flags_without_starting() {
    let hash = git_hash();
    for name in BINARIES {
        let cwd = TempDir::new("surface");

        check_help(name, &[], &cwd);
        assert_nothing_written(name, "--help", &cwd);

        let version = run(name, &["--version"], &cwd);
        let line = text(&version.stdout);
        assert_eq!(version.status.code(), Some(0), "{name} --version: {line}");
        let expected = format!(
            "{name} {} ({})",
            env!("CARGO_PKG_VERSION"),
            hash.as_deref().unwrap_or("unknown")
        );
        assert_eq!(
            line.trim(),
            expected,
            "{name} --version (built before the last commit? the binaries of other packages \
             are rebuilt by `cargo build --workspace --bins`)"
        );
        assert_nothing_written(name, "--version", &cwd);

        let bogus = run(name, &["--no-such-flag"], &cwd);
        let stderr = text(&bogus.stderr);
        assert_eq!(
            bogus.status.code(),
            Some(2),
            "{name} --no-such-flag: {stderr}"
        );
        assert!(stderr.starts_with("error: "), "{name}: {stderr}");
        assert_eq!(
            stderr.matches("error:").count(),
            1,
            "{name}: one error: {stderr}"
        );
        assert!(bogus.stdout.is_empty(), "{name}: {}", text(&bogus.stdout));
        assert_nothing_written(name, "--no-such-flag", &cwd);
    }
}

/// Goal: `fastblock-client completions` and `man` work from the same model as the parser.
#[test]
fn completions_and_man_pages_are_generated() {
    let cwd = TempDir::new("surface-man");
    let bash = run("fastblock-client", &["completions", "bash"], &cwd);
    assert_eq!(bash.status.code(), Some(0), "{}", text(&bash.stderr));
    let script = text(&bash.stdout);
    assert!(
        script.contains("complete -F _fastblock__client") && script.contains("fastblock-client"),
        "{script}"
    );
    assert!(
        script.contains("snap") && script.contains("--pg-count"),
        "every subcommand"
    );
    let bad = run("fastblock-client", &["completions", "tcsh"], &cwd);
    assert_eq!(bad.status.code(), Some(2));

    let man = run("fastblock-client", &["man", "pages"], &cwd);
    assert_eq!(man.status.code(), Some(0), "{}", text(&man.stderr));
    let dir = cwd.path().join("pages");
    let top = std::fs::read_to_string(dir.join("fastblock-client.1")).expect("the main page");
    assert!(top.contains(".TH FASTBLOCK-CLIENT 1"), "{top}");
    let create = std::fs::read_to_string(dir.join("fastblock-client-pool-create.1"))
        .expect("a page per subcommand");
    assert!(create.contains("pg\\-count"), "{create}");

    // Each daemon writes its own, from its own model, without starting.
    for (daemon, flag) in [
        ("fastblock-mon", "etcd\\-endpoints"),
        ("fastblock-osd", "wal\\-commits\\-in\\-flight"),
        ("fastblock-nbd", "export"),
    ] {
        let out = run(daemon, &["--write-man-pages", "daemon-pages"], &cwd);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{daemon}: {}",
            text(&out.stderr)
        );
        let path = cwd.path().join("daemon-pages").join(format!("{daemon}.1"));
        let page = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{daemon}: {e}"));
        assert!(
            page.contains(&format!(".TH {} 1", daemon.to_uppercase())),
            "{page}"
        );
        assert!(page.contains(flag), "{daemon} page lacks {flag}:\n{page}");
        assert!(text(&out.stdout).contains(&format!("{daemon}.1")));
        let missing = run(daemon, &["--write-man-pages"], &cwd);
        assert_eq!(missing.status.code(), Some(2), "{daemon}");
    }
}

/// Goal: scripts can tell a missing object, a refusal and an unreachable cluster apart by the
/// exit status alone (`docs/cli.md`, "Exit status"), and each failure prints one line.
/// Method: a real monitor without OSDs; a pool that does not exist (3), a pool it cannot
/// place (4), and a port nobody listens on (5).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_exit_statuses_say_what_failed() {
    let mons = MonCluster::start(1, MonOptions::default()).await;
    let check = |args: &[&str], code: i32, needle: &str| {
        let out = mons.cli(args);
        assert_eq!(out.code, code, "{args:?}: {}", out.stderr);
        if code == 2 {
            // clap adds a hint line to usage errors.
            assert!(out.stderr.contains(needle), "{args:?}: {}", out.stderr);
        } else {
            out.fails_with(needle);
        }
        assert!(
            out.stderr.starts_with("error: "),
            "{args:?}: {}",
            out.stderr
        );
    };
    check(&["image", "info", "nosuch/vm"], 3, "nosuch");
    check(&["pool", "rm", "nosuch"], 3, "does not exist");
    check(&["osd", "config", "42"], 3, "osd 42 does not exist");
    check(
        &["pool", "create", "p", "--pg-count", "8", "--size", "3"],
        4,
        "",
    );
    check(&["image", "create", "p/x", "--size", "ten"], 2, "");

    let dead = Command::new(binary("fastblock-client"))
        .args(["--mon", "127.0.0.1:1", "--timeout", "1s", "status"])
        .env("FASTBLOCK_KEYRING", mons.keyring())
        .output()
        .expect("running fastblock-client");
    let stderr = text(&dead.stderr);
    assert_eq!(dead.status.code(), Some(5), "{stderr}");
    assert!(
        stderr.starts_with("error: no monitor reachable"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    // The data path too: `image export` and `cp` reach the monitor through the block client,
    // whose error carries the monitor's inside it.
    let cwd = TempDir::new("cli-export-unreachable");
    let target = cwd.path().join("out.raw");
    for args in [
        vec!["image", "export", "fb/vm", target.to_str().unwrap()],
        vec!["image", "cp", "fb/vm", "fb/copy"],
    ] {
        let dead = Command::new(binary("fastblock-client"))
            .args(["--mon", "127.0.0.1:1", "--timeout", "1s"])
            .args(&args)
            .env("FASTBLOCK_KEYRING", mons.keyring())
            .output()
            .expect("running fastblock-client");
        let stderr = text(&dead.stderr);
        assert_eq!(dead.status.code(), Some(5), "{args:?}: {stderr}");
        assert!(
            stderr.contains("no monitor reachable"),
            "{args:?}: {stderr}"
        );
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
    }
    assert!(
        !target.exists(),
        "an export that reached no monitor left a file"
    );
    // The reference syntax too.
    let dead = Command::new(binary("fastblock-client"))
        .args(["-op=listpools", "-endpoint=127.0.0.1:1", "-timeout=1s"])
        .env("FASTBLOCK_KEYRING", mons.keyring())
        .output()
        .expect("running fastblock-client");
    assert_eq!(dead.status.code(), Some(5), "{}", text(&dead.stderr));
}

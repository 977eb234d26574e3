//! Bad daemon arguments are a clear startup error (exit code 2 and what is wrong), never a
//! panic later: a zero interval used to panic the OSD's timers (`--tick 0`).

mod common;

use common::{bin, free_port, Proc, TempDir};
use std::process::Command;
use std::time::{Duration, Instant};

/// Runs `daemon ARGS` and checks that it exits at once with status 2 and `needle` on stderr.
/// A daemon that takes the arguments would run on: it is killed (by PID) after a bounded wait.
fn refused(daemon: &str, args: &[&str], needle: &str) {
    refused_with_env(daemon, args, &[], needle)
}

/// [`refused`] with environment variables set (`Some`) or removed (`None`).
fn refused_with_env(daemon: &str, args: &[&str], env: &[(&str, Option<&str>)], needle: &str) {
    let dir = TempDir::new("daemon-args");
    let log = dir.path().join("out.log");
    let mut cmd = Command::new(bin(daemon));
    cmd.args(args);
    for (name, value) in env {
        match value {
            Some(v) => cmd.env(name, v),
            None => cmd.env_remove(name),
        };
    }
    let mut proc = Proc::spawn(daemon, cmd, log.clone());
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        let child = proc.child.as_mut().expect("spawned");
        if let Some(status) = child.try_wait().expect("try_wait") {
            // Reaped: its PID may be reused, so it must never be signalled again.
            proc.child = None;
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "{daemon} {args:?} still running: the arguments were accepted\n{}",
            proc.log_tail()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let stderr = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(status.code(), Some(2), "{daemon} {args:?}: {stderr}");
    assert!(stderr.contains(needle), "{daemon} {args:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{daemon} {args:?}: {stderr}");
}

#[test]
fn zero_intervals_and_bad_durations_are_refused_at_startup() {
    let data = ["--data", "/nonexistent/osd.img"];
    for flag in ["--tick", "--heartbeat-interval", "--flush-interval"] {
        refused("fastblock-osd", &[&data[..], &[flag, "0"]].concat(), "zero");
    }
    refused(
        "fastblock-osd",
        &[&data[..], &["--tick", "soon"]].concat(),
        "invalid duration",
    );
    refused(
        "fastblock-osd",
        &[&data[..], &["--heartbeat-ticks", "5"]].concat(),
        "election_ticks must exceed",
    );
    for flag in ["--tick-interval", "--osd-down-after", "--lease-ttl"] {
        refused("fastblock-mon", &[flag, "0ms"], "zero");
    }
}

/// Counts and timings whose value would break something later: a lease of zero or negative
/// ticks, arithmetic that overflows, a tick of minutes (a unit left out), a port the monitor
/// would refuse, an etcd lease TTL etcd counts in whole seconds only.
#[test]
fn counts_and_timings_out_of_range_are_refused_at_startup() {
    let osd = |extra: &[&str], needle: &str| {
        refused(
            "fastblock-osd",
            &[&["--data", "/nonexistent/osd.img"][..], extra].concat(),
            needle,
        )
    };
    for ticks in ["0", "2"] {
        osd(
            &["--election-ticks", ticks, "--heartbeat-ticks", "1"],
            "election ticks",
        );
    }
    osd(&["--election-ticks", "100000"], "not within 3..=10000");
    // 2 * heartbeat ticks overflows.
    osd(
        &["--heartbeat-ticks", "9223372036854775808"],
        "election_ticks must exceed",
    );
    // A bare number is seconds.
    osd(&["--tick", "100"], "a bare number is seconds");
    osd(&["--port", "0"], "--port");
    osd(&["--mkfs", "--shards", "0"], "--shards");
    osd(&["--mkfs", "--shards", "65"], "--shards");
    // Free ports: a monitor that took the arguments would serve until killed.
    let api = format!("127.0.0.1:{}", free_port());
    let mon = |extra: &[&str], needle: &str| {
        let args = [
            &[
                "--data-dir",
                "/nonexistent/mon",
                "--etcd-binary",
                "/nonexistent/etcd",
                "--api-addr",
                &api,
            ][..],
            extra,
        ]
        .concat();
        refused("fastblock-mon", &args, needle)
    };
    mon(&["--lease-ttl", "500ms"], "whole number of seconds");
    mon(&["--lease-ttl", "1500ms"], "whole number of seconds");
    mon(&["--lease-ttl", "10000000000s"], "longest lease TTL");
    // The NBD server's runtime threads (on a port nobody listens on, in case the server took
    // the arguments).
    let bind = format!("127.0.0.1:{}", free_port());
    for threads in ["0", "65"] {
        let args = ["serve", "--bind", &bind, "--threads", threads];
        refused("fastblock-nbd", &args, "--threads");
    }
}

/// `--preallocate none` (a sparse data file, which a full file system turns into a crash
/// loop) is gone: refused with the values that remain.
/// The monitor's own etcd member holds the key table: its client port stays on loopback.
#[test]
fn a_monitor_refuses_to_expose_its_etcd() {
    for addr in ["0.0.0.0:2379", "192.0.2.7:2379"] {
        refused(
            "fastblock-mon",
            &["--etcd-client-addr", addr],
            "is not a loopback address",
        );
    }
    refused(
        "fastblock-mon",
        &["--etcd-client-addr", "localhost"],
        "IP:PORT",
    );
}

#[test]
fn a_sparse_data_file_is_no_longer_offered() {
    let data = ["--data", "/nonexistent/osd.img", "--mkfs", "--size", "1G"];
    refused(
        "fastblock-osd",
        &[&data[..], &["--preallocate", "none"]].concat(),
        "use reserve (allocate without writing), wal or full",
    );
    refused(
        "fastblock-osd",
        &[&data[..], &["--preallocate", "sparse"]].concat(),
        "reserve, wal or full",
    );
}

/// `--help` opens with what the program is, not with the description of the crate that
/// builds it (`about` without a value took the package's).
#[test]
fn help_opens_with_what_each_program_is() {
    for (program, says) in [
        ("fastblock-mon", "monitor"),
        ("fastblock-osd", "storage daemon"),
        ("fastblock-client", "Administer a fastblock cluster"),
        ("fastblock-nbd", "NBD server"),
    ] {
        let out = Command::new(bin(program))
            .arg("--help")
            .output()
            .expect("running --help");
        let text = String::from_utf8_lossy(&out.stdout);
        let first = text.lines().next().unwrap_or_default();
        assert!(out.status.success(), "{program} --help: {text}");
        assert!(
            first.contains(says),
            "{program} --help opens with {first:?}"
        );
        assert!(
            !first.contains("Layer"),
            "{program} --help opens with {first:?}"
        );
    }
}

/// `--fault-injection-file` makes the OSD's disk fail on purpose: it is for tests only, and
/// refused (exit status 2, saying so) unless the environment holds `FASTBLOCK_TEST_FAULTS=1`
/// exactly. With it, the option passes the check (this OSD then stops on its missing data).
#[test]
fn fault_injection_is_refused_outside_tests() {
    let args = [
        "--data",
        "/nonexistent/osd.img",
        "--fault-injection-file",
        "/nonexistent/faults.json",
    ];
    for value in [None, Some("0"), Some("yes")] {
        refused_with_env(
            "fastblock-osd",
            &args,
            &[("FASTBLOCK_TEST_FAULTS", value)],
            "is for tests only",
        );
        refused_with_env(
            "fastblock-osd",
            &args,
            &[("FASTBLOCK_TEST_FAULTS", value)],
            "FASTBLOCK_TEST_FAULTS=1",
        );
    }
    let dir = TempDir::new("daemon-args");
    let log = dir.path().join("out.log");
    let mut cmd = Command::new(bin("fastblock-osd"));
    cmd.args(args).env("FASTBLOCK_TEST_FAULTS", "1");
    let mut proc = Proc::spawn("fastblock-osd", cmd, log.clone());
    let status = proc
        .wait_exit(Duration::from_secs(20))
        .expect("an OSD without its data stops at once");
    let stderr = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("for tests only"), "{stderr}");
}

//! Bad daemon arguments are a clear startup error (exit code 2 and what is wrong), never a
//! panic later: a zero interval used to panic the OSD's timers (`--tick 0`).

mod common;

use common::bin;
use std::process::Command;

fn refused(daemon: &str, args: &[&str], needle: &str) {
    let out = Command::new(bin(daemon)).args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{daemon} {args:?}: {stderr}");
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

/// `--preallocate none` (a sparse data file, which a full file system turns into a crash
/// loop) is gone: refused with the values that remain.
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

//! Runtime configuration (docs/operations.md, "Configuration"), on real processes: each daemon
//! folds its TOML file and its environment into its flags (command line > environment > file >
//! default), refuses a file key that is no flag with status 2 naming key and file, prints the
//! settings reference docs/config.md carries, and `fastblock-client config` reads its settings
//! through its admin socket and changes the log filter of the running daemon.

mod common;

use common::*;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// The OSD's runtime-settable keys, as it lists them (docs/operations.md, "Configuration").
const OSD_SETTABLE: &str = "flush_interval, log_level, op_complaint_time, recovery_max_bytes_per_sec, scrub_deep_bytes_per_sec";

/// The `show` line of `key`: `(value, source)`.
fn shown(show: &str, key: &str) -> (String, String) {
    let line = show
        .lines()
        .find(|l| l.split_whitespace().next() == Some(key))
        .unwrap_or_else(|| panic!("no {key} in config show:\n{show}"));
    let fields: Vec<&str> = line.split_whitespace().collect();
    let source = fields
        .iter()
        .find_map(|f| f.strip_prefix('('))
        .map(|f| f.trim_end_matches(')').to_string())
        .unwrap_or_else(|| panic!("no source in {line:?}"));
    (fields[1].to_string(), source)
}

fn read_osd_log(osd: &OsdProc) -> String {
    let path = &osd.proc.as_ref().expect("running").log;
    std::fs::read_to_string(path).unwrap_or_default()
}

fn debug_lines(log: &str) -> usize {
    log.lines().filter(|l| l.contains(" DEBUG ")).count()
}

/// Opens and drops a TCP connection to the OSD's data port: the shard logs the closed
/// connection at debug level.
async fn poke(port: u16) {
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await;
    drop(stream.expect("connecting to the OSD"));
}

/// A log-level change through `config set` takes effect in the running OSD and is undone by
/// setting it back; a new flush interval and new recovery and deep-scrub rates reach the
/// shards; a flag from the OSD's TOML file shows as `file`; keys that are no
/// runtime setting and bad filters are refused with the list of settable keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn osd_log_level_changes_at_runtime() {
    let mons = MonCluster::start(1, MonOptions::default()).await;
    let dir = TempDir::new("runtime-config");
    let file = dir.path().join("osd.toml");
    std::fs::write(&file, "flush_interval = \"2s\"\nlease_reads = true\n").unwrap();
    let file_arg = file.to_str().unwrap();
    let mut osd = OsdProc::format_in(
        &mons,
        (dir.path(), dir.path()),
        "h0",
        "1G",
        1,
        &["--config", file_arg],
    );
    osd.start();
    wait_osds_up(&mons.client(), &[osd.id], Duration::from_secs(60)).await;
    let run = osd.run_dir();
    let target = format!("osd.{}", osd.id);
    let socket = run.join(format!("{target}.asok"));
    wait_until(Duration::from_secs(10), "the admin socket", || async {
        socket.exists().then_some(())
    })
    .await;

    assert!(
        read_osd_log(&osd).contains(&format!(
            "settings read from the config file file={}",
            file.display()
        )),
        "{}",
        read_osd_log(&osd)
    );
    let show = config_cli(&run, &["show", &target]);
    let show = show.ok();
    assert_eq!(shown(show, "flush_interval"), ("2s".into(), "file".into()));
    assert_eq!(shown(show, "tick"), ("50ms".into(), "flag".into()));
    assert_eq!(shown(show, "wal_sync"), ("dsync".into(), "default".into()));
    assert_eq!(shown(show, "log_level").0, "info", "{show}");
    assert!(show.contains("settable"), "{show}");

    // At info, connections come and go without a debug line.
    poke(osd.port).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let log_path = osd.proc.as_ref().unwrap().log.clone();
    let read_log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    assert_eq!(debug_lines(&read_log()), 0, "{}", read_log());

    let set = config_cli(
        &run,
        &["set", &target, "log_level", "info,fastblock_osd=debug"],
    );
    assert!(set.ok().contains("runtime"), "{}", set.stdout);
    let got = config_cli(&run, &["get", &target, "log_level"]);
    assert_eq!(got.ok().trim(), "info,fastblock_osd=debug");
    let show = config_cli(&run, &["show", &target]);
    assert_eq!(
        shown(show.ok(), "log_level"),
        ("info,fastblock_osd=debug".into(), "runtime".into())
    );
    wait_until(
        Duration::from_secs(10),
        "debug lines in the OSD's log",
        || async {
            poke(osd.port).await;
            (debug_lines(&read_log()) > 0).then_some(())
        },
    )
    .await;

    // A tunable: the shard threads take the new flush interval (they log it at debug level).
    let set = config_cli(&run, &["set", &target, "flush_interval", "3s"]);
    assert!(set.ok().contains("3s"), "{}", set.stdout);
    assert_eq!(
        shown(config_cli(&run, &["show", &target]).ok(), "flush_interval"),
        ("3s".into(), "runtime".into())
    );
    wait_until(
        Duration::from_secs(10),
        "the shard to take the interval",
        || async { read_log().contains("flush interval changed").then_some(()) },
    )
    .await;
    let zero = config_cli(&run, &["set", &target, "flush_interval", "0s"]);
    assert_eq!(zero.code, 4, "{}", zero.stderr);
    zero.fails_with("zero");

    // The throttles: the shard core takes its share of each new rate (and logs it at info).
    config_cli(&run, &["set", &target, "recovery_max_bytes_per_sec", "32M"]).ok();
    config_cli(&run, &["set", &target, "scrub_deep_bytes_per_sec", "8M"]).ok();
    let show = config_cli(&run, &["show", &target]);
    assert_eq!(
        shown(show.ok(), "recovery_max_bytes_per_sec"),
        ("32M".into(), "runtime".into())
    );
    wait_until(
        Duration::from_secs(10),
        "the shard to take the rates",
        || async {
            read_log()
                .lines()
                .any(|l| {
                    l.contains("rates changed")
                        && l.contains("recovery_bytes_per_sec=33554432")
                        && l.contains("scrub_deep_bytes_per_sec=8388608")
                })
                .then_some(())
        },
    )
    .await;
    let zero = config_cli(&run, &["set", &target, "recovery_max_bytes_per_sec", "0"]);
    assert_eq!(zero.code, 4, "{}", zero.stderr);
    zero.fails_with("the rate must be positive");

    config_cli(&run, &["set", &target, "log_level", "info"]).ok();
    let before = read_log().len();
    poke(osd.port).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let after = read_log();
    assert_eq!(debug_lines(&after[before..]), 0, "{}", &after[before..]);

    // Not settable at runtime, not a setting, not a filter: refused (status 4), nothing changed.
    let refused = config_cli(&run, &["set", &target, "wal_sync", "two-step"]);
    assert_eq!(refused.code, 4, "{}", refused.stderr);
    refused.fails_with(&format!(
        "cannot be changed at runtime; the settable ones are: {OSD_SETTABLE}"
    ));
    let unknown = config_cli(&run, &["set", &target, "flush_intervall", "5s"]);
    assert_eq!(unknown.code, 4, "{}", unknown.stderr);
    unknown.fails_with(&format!(
        "is not a setting; the settable ones are: {OSD_SETTABLE}"
    ));
    let zero = config_cli(&run, &["set", &target, "op_complaint_time", "0s"]);
    assert_eq!(zero.code, 4, "{}", zero.stderr);
    zero.fails_with("is zero");
    let bad = config_cli(&run, &["set", &target, "log_level", "fastblock_osd=loud"]);
    assert_eq!(bad.code, 4, "{}", bad.stderr);
    bad.fails_with("is not a log filter");
    assert_eq!(
        config_cli(&run, &["get", &target, "log_level"]).ok().trim(),
        "info"
    );
    // No such daemon on this host: unreachable (5); a bad name: usage (2).
    let missing = config_cli(&run, &["show", "osd.999"]);
    assert_eq!(missing.code, 5, "{}", missing.stderr);
    let bad_target = config_cli(&run, &["show", "osd.x"]);
    assert_eq!(bad_target.code, 2, "{}", bad_target.stderr);
    assert!(osd.is_running(), "{}", osd.log_tail());
}

/// A monitor started with a TOML file, an environment variable and flags: each setting comes
/// from the highest-ranked place that gives it (flag > env > file > default), and
/// `config show mon` says which.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn precedence_flag_env_file_default() {
    let dir = TempDir::new("config-precedence");
    let file = dir.path().join("mon.toml");
    std::fs::write(
        &file,
        "# every key a flag\n\
         osd_down_after = \"7s\"\n\
         osd_out_after = \"40s\"\n\
         tick_interval = \"300ms\"\n\
         auth_mode = \"none\"\n",
    )
    .unwrap();
    let run = dir.path().join("run");
    let mut cmd = Command::new(bin("fastblock-mon"));
    cmd.arg("--config")
        .arg(&file)
        .arg("--data-dir")
        .arg(dir.path().join("mon"))
        .args(["--api-addr", &format!("127.0.0.1:{}", free_port())])
        .args(["--etcd-client-addr", &format!("127.0.0.1:{}", free_port())])
        .args(["--etcd-peer-addr", &format!("127.0.0.1:{}", free_port())])
        .args(["--tick-interval", "200ms"])
        .env("FASTBLOCK_MON_OSD_OUT_AFTER", "50s")
        .env("FASTBLOCK_MON_TICK_INTERVAL", "250ms")
        .env("FASTBLOCK_RUN_DIR", &run)
        .env_remove("RUST_LOG");
    let mon = Proc::spawn("mon.a", cmd, dir.path().join("mon.log"));
    let socket = run.join("mon.a.asok");
    wait_until(
        Duration::from_secs(20),
        "the monitor's admin socket",
        || async { socket.exists().then_some(()) },
    )
    .await;
    let show = config_cli(&run, &["show", "mon"]);
    let show = show.ok();
    assert_eq!(
        shown(show, "tick_interval"),
        ("200ms".into(), "flag".into())
    );
    assert_eq!(shown(show, "osd_out_after"), ("50s".into(), "env".into()));
    assert_eq!(shown(show, "osd_down_after"), ("7s".into(), "file".into()));
    assert_eq!(shown(show, "auth_mode"), ("none".into(), "file".into()));
    assert_eq!(shown(show, "lease_ttl"), ("5s".into(), "default".into()));
    assert_eq!(shown(show, "log_level"), ("info".into(), "default".into()));
    // In the order the flags are declared (`--help`'s), wherever their values came from.
    let position = |key: &str| show.lines().position(|l| l.starts_with(&format!("{key} ")));
    assert!(position("osd_down_after") < position("lease_ttl"), "{show}");
    assert!(position("auth_mode") < position("keyring"), "{show}");
    assert_eq!(shown(show, "keyring").0, "-", "unset reads -: {show}");
    let json = config_cli(&run, &["show", "mon.a", "--json"]);
    let json: serde_json::Value = serde_json::from_str(json.ok()).unwrap();
    let run_dir = json
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["key"] == "run_dir")
        .unwrap();
    assert_eq!(run_dir["source"], "env", "{run_dir}");
    drop(mon);
}

/// What a daemon refuses in its config file, before it does anything: a key that is no flag,
/// a value its flag's parser refuses, a value of the wrong TOML type, a missing file given
/// with `--config`. Each is one `error:` line naming the file and the key, exit status 2.
#[test]
fn bad_config_files_are_refused() {
    let dir = TempDir::new("config-refused");
    let cases: &[(&str, &[&str], &str, &[&str])] = &[
        (
            "fastblock-osd",
            &[],
            "flush_intervall = \"1s\"\n",
            &["unknown key \"flush_intervall\"", "flush_interval"],
        ),
        (
            "fastblock-osd",
            &[],
            "data = \"/x\"\nflush_interval = \"soon\"\n",
            &["key \"flush_interval\"", "soon"],
        ),
        (
            "fastblock-osd",
            &[],
            "data = \"/x\"\nport = \"many\"\n",
            &["key \"port\""],
        ),
        (
            "fastblock-osd",
            &[],
            "data = \"/x\"\n[flush]\ninterval = 1\n",
            &["key \"flush\"", "table"],
        ),
        (
            "fastblock-mon",
            &[],
            "tick = \"1s\"\n",
            &["unknown key \"tick\"", "tick_interval"],
        ),
        (
            "fastblock-mon",
            &[],
            "lease_ttl = true\n",
            &["key \"lease_ttl\""],
        ),
        (
            "fastblock-nbd",
            &["serve"],
            "bind = 10809\n",
            &["key \"bind\""],
        ),
        (
            "fastblock-nbd",
            &["serve"],
            "dir = \"/tmp\"\n",
            &["unknown key \"dir\""],
        ),
    ];
    for (i, (daemon, args, text, needles)) in cases.iter().enumerate() {
        let file = dir.path().join(format!("case{i}.toml"));
        std::fs::write(&file, text).unwrap();
        let out = CliOutput::from(
            Command::new(bin(daemon))
                .arg("--config")
                .arg(&file)
                .args(*args)
                .current_dir(dir.path())
                .output()
                .unwrap(),
        );
        assert_eq!(out.code, 2, "{daemon} {text:?}: {}", out.stderr);
        out.fails_with(&format!("config file {}", file.display()));
        for needle in *needles {
            assert!(
                out.stderr.contains(needle),
                "{daemon} {text:?}: {needle:?} in {}",
                out.stderr
            );
        }
    }
    let missing = dir.path().join("absent.toml");
    let out = CliOutput::from(
        Command::new(bin("fastblock-mon"))
            .arg("--config")
            .arg(&missing)
            .output()
            .unwrap(),
    );
    assert_eq!(out.code, 2, "{}", out.stderr);
    out.fails_with(&format!("config file {}", missing.display()));
    // A device is no config file: refused at once, never read (`/dev/zero` would never end).
    let out = CliOutput::from(
        Command::new(bin("fastblock-osd"))
            .args(["--config", "/dev/zero"])
            .output()
            .unwrap(),
    );
    assert_eq!(out.code, 2, "{}", out.stderr);
    out.fails_with("config file /dev/zero: not a regular file");
    // A flag the file gives need not be on the command line (`--data` is required otherwise):
    // the OSD gets past parsing and fails on the data file itself.
    let file = dir.path().join("data.toml");
    std::fs::write(
        &file,
        format!("data = \"{}\"\n", dir.path().join("none.img").display()),
    )
    .unwrap();
    let out = CliOutput::from(
        Command::new(bin("fastblock-osd"))
            .arg("--config")
            .arg(&file)
            .output()
            .unwrap(),
    );
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(out.stderr.contains("none.img"), "{}", out.stderr);
}

/// docs/config.md carries each daemon's `--print-config-reference` verbatim, so the page lists
/// every flag with its file key, environment variable and default, and cannot drift.
#[test]
fn config_reference_matches_the_docs() {
    let doc_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/config.md");
    let doc = std::fs::read_to_string(&doc_path).expect("docs/config.md");
    for daemon in ["fastblock-mon", "fastblock-osd", "fastblock-nbd"] {
        let out = Command::new(bin(daemon))
            .arg("--print-config-reference")
            .output()
            .unwrap();
        assert!(out.status.success(), "{daemon}");
        let reference = String::from_utf8(out.stdout).unwrap();
        assert!(reference.contains("| `--log-level` |"), "{reference}");
        assert!(
            doc.contains(&reference),
            "docs/config.md lacks {daemon}'s reference verbatim; regenerate it with \
             `{daemon} --print-config-reference`:\n{reference}"
        );
    }
}

/// The NBD server's log filter changes at runtime too, before it has reached any monitor: its
/// admin socket is up while it retries an unreachable one, whose failed attempts it logs at
/// debug level only once `log_level` says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nbd_log_level_changes_at_runtime() {
    let dir = TempDir::new("config-nbd");
    let run = dir.path().join("run");
    let log = dir.path().join("nbd.log");
    let mut cmd = Command::new(bin("fastblock-nbd"));
    // Nothing listens on the monitor port: the server keeps retrying it.
    cmd.args(["serve", "--mon", &format!("127.0.0.1:{}", free_port())])
        .args(["--bind", &format!("127.0.0.1:{}", free_port())])
        .arg("--run-dir")
        .arg(&run)
        .env_remove("RUST_LOG")
        .env("FASTBLOCK_NBD_THREADS", "2");
    let _nbd = Proc::spawn("fastblock-nbd", cmd, log.clone());
    let socket = run.join("nbd.asok");
    wait_until(Duration::from_secs(10), "the NBD admin socket", || async {
        socket.exists().then_some(())
    })
    .await;
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let show = config_cli(&run, &["show", "nbd"]);
    let show = show.ok();
    assert_eq!(shown(show, "threads"), ("2".into(), "env".into()));
    assert_eq!(shown(show, "run_dir").1, "flag", "{show}");
    assert_eq!(shown(show, "tls"), ("off".into(), "default".into()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(debug_lines(&read_log()), 0, "{}", read_log());
    config_cli(&run, &["set", "nbd", "log_level", "debug"]).ok();
    wait_until(
        Duration::from_secs(10),
        "debug lines in the NBD log",
        || async { (debug_lines(&read_log()) > 0).then_some(()) },
    )
    .await;
    let refused = config_cli(&run, &["set", "nbd", "flush_interval", "1s"]);
    assert_eq!(refused.code, 4, "{}", refused.stderr);
    refused.fails_with("\"flush_interval\" is not a setting; the settable ones are: log_level");
}

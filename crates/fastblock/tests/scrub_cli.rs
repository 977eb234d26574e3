//! The scrub commands of `fastblock-client` (`docs/cli.md`, "Scrubs"), run as the real binary
//! against a real cluster: a monitor on etcd and three `fastblock-osd` processes holding a
//! 3-replica pool with some data.
//!
//! A request is answered and published in the map; the PG's leader scrubs the PG and reports
//! it done, the monitor drops the request, and `pg ls` shows when the PG was scrubbed. PG ids
//! that do not parse, or name no PG, fail cleanly: exit 2 and exit 1 with one line saying why.

mod common;

use common::{
    stamped_block, start_osds, wait_all_active, wait_until, CliOutput, MonCluster, MonOptions,
    OsdProc, TempDir, BLOCK,
};
use fastblock_client::Cluster;
use fastblock_monclient::MonClient;
use fastblock_types::api::CreatePoolRequest;
use fastblock_types::map::{ClusterMap, FailureDomain, ScrubRequest};
use fastblock_types::PgId;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long a requested scrub may take to be reported done: the PGs hold little data, so
/// the scrub is quick; the leader reports it with its next heartbeat (1 s).
const SCRUB_DONE_WAIT: Duration = Duration::from_secs(30);

/// A monitor, three OSDs and pool `fb3` (8 PGs of 3 replicas) holding 8 MiB of data, every
/// PG active.
struct Setup {
    mons: MonCluster,
    _dir: TempDir,
    _osds: Vec<OsdProc>,
}

impl Setup {
    async fn start() -> Setup {
        let mons = MonCluster::start(1, MonOptions::default()).await;
        let dir = TempDir::new("scrubcli");
        let osds = start_osds(&mons, dir.path(), 3, "512M", 1, Duration::from_secs(20)).await;
        let client = mons.client();
        client
            .create_pool(&CreatePoolRequest {
                name: "fb3".into(),
                pg_count: 8,
                size: 3,
                failure_domain: FailureDomain::Osd,
            })
            .await
            .unwrap();
        wait_all_active(&client, Duration::from_secs(30)).await;
        let s = Setup {
            mons,
            _dir: dir,
            _osds: osds,
        };
        s.cli(&[
            "image",
            "create",
            "fb3/vm",
            "--size",
            "8M",
            "--object-size",
            "1M",
        ])
        .await
        .ok();
        let cluster = Cluster::connect(s.mons.client_config()).await.unwrap();
        let vm = cluster.open_image("fb3", "vm").await.unwrap();
        let mut data = Vec::new();
        for block in 0..(8 << 20) / BLOCK {
            data.extend_from_slice(&stamped_block(block * BLOCK, 1));
        }
        vm.write(0, data.into()).await.unwrap();
        s
    }

    /// Runs `fastblock-client ARGS` (on a blocking thread: the test's tasks keep running).
    async fn cli(&self, args: &[&str]) -> CliOutput {
        tokio::task::block_in_place(|| self.mons.cli(args))
    }

    /// `pg ls --json`'s row of `pg`.
    async fn pg_row(&self, pg: &str) -> serde_json::Value {
        let list = self.cli(&["--json", "pg", "ls"]).await.json();
        let rows = list["pgs"].as_array().expect("a list of PGs");
        rows.iter()
            .find(|r| format!("{}.{}", r["pgid"]["pool"], r["pgid"]["seq"]) == pg)
            .unwrap_or_else(|| panic!("no row for pg {pg}: {list}"))
            .clone()
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The first map after `after` that carries a scrub request for `pg`, if one comes within
/// 10 s. Started before the request is made, it sees the map of the request's epoch at once,
/// long before the PG's leader could scrub and report it done with its next heartbeat.
async fn map_with_request(client: MonClient, after: u64, pg: PgId) -> Option<ClusterMap> {
    let mut epoch = fastblock_types::Epoch(after);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tokio::time::Instant::now() < deadline {
        let next = client.watch_map(epoch, Duration::from_secs(2)).await.ok()?;
        if let Some(map) = next.map {
            if map.scrub_requests.values().any(|r| r.pg == pg) {
                return Some(map);
            }
            epoch = map.epoch;
        }
    }
    None
}

/// A usage error: exit 2, nothing on stdout, and stderr says what a PG id looks like.
#[track_caller]
fn usage_error(out: &CliOutput) {
    assert_eq!(out.code, 2, "stdout={} stderr={}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains("expected POOL.SEQ"),
        "stderr: {}",
        out.stderr
    );
    assert!(out.stdout.is_empty(), "stdout: {}", out.stdout);
}

/// A scrub and a repair through the CLI: each request is answered and published in the map,
/// the PGs' leaders scrub (the repair deeply) and report them done, the monitor drops them,
/// and `pg ls` shows the times, in JSON and in the table; then the refusals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrub_and_repair_requests_through_the_cli() {
    let s = Setup::start().await;
    let client = s.mons.client();

    // Before any scrub: the rows carry an empty scrub state, shown as `-`.
    let row = s.pg_row("1.0").await;
    assert!(row["scrub"].is_object(), "{row}");
    assert!(row["scrub"]["last_scrub_unix_ms"].is_null(), "{row}");
    assert!(row["scrub"]["last_deep_scrub_unix_ms"].is_null(), "{row}");
    let table = s.cli(&["pg", "ls"]).await;
    let header = table.ok().lines().next().unwrap().to_string();
    for column in ["LAST-SCRUB", "LAST-DEEP-SCRUB", "INCONSISTENT"] {
        assert!(header.contains(column), "{header}");
    }

    // A light scrub of 1.0: answered, and the map of its epoch carries it.
    let pg0: PgId = "1.0".parse().unwrap();
    let started_ms = unix_ms();
    let epoch = client.map().await.unwrap().epoch;
    let watcher = tokio::spawn(map_with_request(s.mons.client(), epoch.0, pg0));
    let answer = s.cli(&["--json", "pg", "scrub", "1.0"]).await.json();
    let scrub: ScrubRequest = serde_json::from_value(answer.clone()).unwrap();
    assert_eq!((scrub.pg, scrub.deep), (pg0, false), "{answer}");
    assert!(scrub.id >= 1, "{answer}");
    let map = watcher
        .await
        .unwrap()
        .expect("a map carrying the scrub request");
    assert_eq!(map.scrub_requests.get(&scrub.id), Some(&scrub));

    // A repair of 1.1 is a deep scrub, with a later id.
    let repair = s.cli(&["pg", "repair", "1.1"]).await;
    let text = repair.ok();
    assert!(text.contains("deep scrub of pg 1.1 requested"), "{text}");
    assert!(text.contains("majority of replicas"), "{text}");

    // The leaders scrub and report: the monitor drops both requests and records when.
    wait_until(SCRUB_DONE_WAIT, "the scrub requests to be done", || async {
        let map = client.map().await.ok()?.map?;
        map.scrub_requests.is_empty().then_some(())
    })
    .await;
    let row0 = wait_until(SCRUB_DONE_WAIT, "pg 1.0's last scrub time", || async {
        let row = s.pg_row("1.0").await;
        row["scrub"]["last_scrub_unix_ms"].is_u64().then_some(row)
    })
    .await;
    let row1 = wait_until(SCRUB_DONE_WAIT, "pg 1.1's last deep scrub time", || async {
        let row = s.pg_row("1.1").await;
        row["scrub"]["last_deep_scrub_unix_ms"]
            .is_u64()
            .then_some(row)
    })
    .await;
    let done_ms = unix_ms();
    let at = row0["scrub"]["last_scrub_unix_ms"].as_u64().unwrap();
    assert!((started_ms..=done_ms).contains(&at), "{at} {row0}");
    assert!(row0["scrub"]["report"]["request_done"].as_u64().unwrap() >= scrub.id);
    assert_eq!(row0["scrub"]["inconsistent_blocks_left"], 0, "{row0}");
    assert!(row0["scrub"]["last_deep_scrub_unix_ms"].is_null(), "{row0}");
    assert_eq!(row1["scrub"]["report"]["last_deep"], true, "{row1}");
    assert_eq!(row1["scrub"]["inconsistent_blocks_left"], 0, "{row1}");

    // The table shows the times as RFC 3339.
    let table = s.cli(&["pg", "ls", "--pool", "fb3"]).await;
    let line = table
        .ok()
        .lines()
        .find(|l| l.starts_with("1.1 "))
        .expect("pg 1.1's row")
        .to_string();
    let cells: Vec<&str> = line.split_whitespace().collect();
    let n = cells.len();
    assert!(cells[n - 3].ends_with('Z'), "{line}");
    assert!(cells[n - 2].ends_with('Z'), "{line}");
    assert_eq!(cells[n - 1], "0", "{line}");

    // Nothing inconsistent: no PG_INCONSISTENT.
    let status = s.cli(&["status"]).await;
    assert!(
        !status.ok().contains("PG_INCONSISTENT"),
        "{}",
        status.stdout
    );
    assert!(
        status.stdout.contains("health: HEALTH_OK"),
        "{}",
        status.stdout
    );

    // A PG id that does not parse is a usage error; one that names no PG fails with one line.
    for bad in ["1", "x.0", "1.-1", "1.0.0"] {
        usage_error(&s.cli(&["pg", "scrub", bad]).await);
    }
    usage_error(&s.cli(&["pg", "deep-scrub", "one"]).await);
    let missing = s.cli(&["pg", "scrub", "1.8"]).await;
    missing.fails_with("pg 1.8 does not exist: pool \"fb3\" has 8 PGs, 1.0 to 1.7");
    assert_eq!(missing.code, 3, "not found");
    // As `docs/cli.md` ("Scrubs") shows it.
    assert!(
        missing.stderr.starts_with("error: pg 1.8 does not exist"),
        "{}",
        missing.stderr
    );
    let no_pool = s.cli(&["--json", "pg", "repair", "9.0"]).await;
    no_pool.fails_with("pg 9.0 does not exist: no pool has id 9");
    assert_eq!(no_pool.code, 3, "not found");
    assert!(no_pool.stdout.is_empty(), "{}", no_pool.stdout);
    let map = client.map().await.unwrap().map.unwrap();
    assert!(map.scrub_requests.is_empty(), "{:?}", map.scrub_requests);
}

//! Disk faults on real processes (issue 19, "Fault injection"): an OSD's disk made to fail
//! through the test-only `--fault-injection-file` (`docs/testing.md`), with real etcd, a real
//! monitor and real OSDs, the client writing stamped blocks before, during and after.
//!
//! The store is fail-stop on a failed write or sync (`docs/design/osd.md`, "Errors"): the OSD
//! must exit by itself, naming the I/O error, and the cluster must carry on without it.

mod common;

use bytes::Bytes;
use common::faults::{with_fault_file, write_fault_file};
use common::BLOCK;
use common::{stamped_block, wait_osds_up, wait_until, MonCluster, MonOptions, OsdProc, TempDir};
use fastblock_client::{Cluster, Image};
use fastblock_monclient::MonClient;
use fastblock_types::map::ClusterMap;
use fastblock_types::{OsdId, PgId};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const OBJECT_BYTES: u64 = MIB;
const OBJECTS: u64 = 16;
const PG_COUNT: u32 = 8;
const WAIT: Duration = Duration::from_secs(30);
/// How long the faulty OSD may take to stop: the faults are installed within 100 ms (the
/// file's poll interval), the next WAL commit fails, and the control task shuts the shards
/// down (each waits at most 10 s).
const EXIT_WAIT: Duration = Duration::from_secs(30);

/// Block `slot` of object `object` of the image: each phase of the test writes its own slot,
/// so that what an earlier phase wrote is checked again after the later ones.
fn block_offset(object: u64, slot: u64) -> u64 {
    object * OBJECT_BYTES + slot * BLOCK
}

fn all_pgs(map: &ClusterMap) -> impl Iterator<Item = (PgId, &fastblock_types::map::PgInfo)> {
    map.pgmaps
        .iter()
        .flat_map(|(pool, m)| m.pgs.iter().map(|(seq, i)| (PgId::new(*pool, *seq), i)))
}

async fn map(client: &MonClient) -> ClusterMap {
    client.map().await.unwrap().map.expect("a cluster map")
}

/// Writes generation `generation` into `slot` of each object in `objects`. Any failure fails
/// the test: an OSD whose disk fails answers its clients `NotReady`, which the client retries
/// on the PG's other replicas, so no write reaches the application as an I/O error.
async fn write_slot(image: &Image, objects: &[u64], slot: u64, generation: u64) {
    for &object in objects {
        let offset = block_offset(object, slot);
        if let Err(e) = image.write(offset, stamped_block(offset, generation)).await {
            panic!("write of object {object} slot {slot}: {e}");
        }
    }
}

/// Checks `slot` of each object: generation `generation`, or, for the objects in `unknown`,
/// that generation or `previous` (the block as it was before a write of unknown outcome).
async fn check_slot(
    image: &Image,
    objects: &[u64],
    slot: u64,
    generation: u64,
    unknown: &[u64],
    what: &str,
) {
    for &object in objects {
        let offset = block_offset(object, slot);
        let data: Bytes = image
            .read(offset, BLOCK)
            .await
            .unwrap_or_else(|e| panic!("{what}: read of object {object} slot {slot}: {e}"));
        let expected = stamped_block(offset, generation);
        if unknown.contains(&object) {
            assert!(
                data == expected || data.iter().all(|b| *b == 0),
                "{what}: object {object} slot {slot} is neither generation {generation} nor \
                 unwritten"
            );
        } else {
            assert!(
                data == expected,
                "{what}: object {object} slot {slot} is not generation {generation}"
            );
        }
    }
}

/// Three OSDs, each started with its own fault injection file (absent: no faults), the
/// monitor marking a silent OSD down after 2 s and never out (the PGs keep their members, so
/// the tests see leaders move, not data), and a 3-replica pool holding the image, opened
/// with a 60 s deadline per operation.
struct Faulty {
    mons: MonCluster,
    dir: TempDir,
    osds: Vec<OsdProc>,
    fault_files: BTreeMap<OsdId, PathBuf>,
    ids: Vec<OsdId>,
    image: Image,
    cluster: std::sync::Arc<Cluster>,
}

impl Faulty {
    async fn start(tag: &str) -> Faulty {
        let mons = MonCluster::start(
            1,
            MonOptions {
                osd_down_after: "2s",
                osd_out_after: "600s",
                ..MonOptions::default()
            },
        )
        .await;
        let dir = TempDir::new(tag);
        let mut osds: Vec<OsdProc> = Vec::new();
        let mut fault_files: BTreeMap<OsdId, PathBuf> = BTreeMap::new();
        for i in 0..3 {
            let mut osd = OsdProc::create(&mons, dir.path(), &format!("h{i}"), "256M", 1);
            let file = dir.path().join(format!("faults-{i}.json"));
            with_fault_file(&mut osd, &file);
            fault_files.insert(osd.id, file);
            osds.push(osd);
        }
        let client = mons.client();
        let ids: Vec<OsdId> = osds.iter().map(|o| o.id).collect();
        wait_osds_up(&client, &ids, WAIT).await;
        common::pool_with_image(
            &client,
            ("fb", PG_COUNT, 3),
            ("img", OBJECTS * OBJECT_BYTES, OBJECT_BYTES),
        )
        .await;
        let mut config = mons.client_config();
        config.op_deadline = Duration::from_secs(60);
        let cluster = Cluster::connect(config).await.unwrap();
        let image = cluster.open_image("fb", "img").await.unwrap();
        Faulty {
            mons,
            dir,
            osds,
            fault_files,
            ids,
            image,
            cluster,
        }
    }
}

/// Goal: an OSD whose disk fails every write and sync stops by itself (fail-stop), the
/// monitor marks it down, its PGs get new leaders, and IO goes on; no acknowledged write is
/// lost, no write reaches the application as an I/O error, and the OSD, restarted without
/// faults, recovers from its WAL.
/// Method: three OSDs with fault files (absent: no faults), one 3-replica pool. Write slot 0,
/// pick an OSD that leads some PGs but not all, make its disk fail writes and syncs with EIO,
/// write slot 1 through every PG until it exits (the writes it leads are answered `NotReady`
/// and retried by the client on the new leaders; any failure fails the test), then write
/// slot 2 everywhere and check every slot; finally restart it without faults.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_osd_whose_disk_fails_writes_stops_and_the_cluster_carries_on() {
    let Faulty {
        mons,
        dir: _dir,
        mut osds,
        fault_files,
        ids,
        image,
        cluster: _cluster,
    } = Faulty::start("disk-faults").await;
    let client = mons.client();
    let objects: Vec<u64> = (0..OBJECTS).collect();

    // Phase 0: no faults.
    write_slot(&image, &objects, 0, 1).await;
    check_slot(&image, &objects, 0, 1, &[], "before the faults").await;

    // The victim leads the PGs of some of the image's objects (so they need new leaders) and
    // follows those of the others (whose writes make it append to its WAL while a healthy
    // leader acknowledges them). Which OSD leads which PG is up to the elections, so the
    // victim is the first OSD for which both hold, not any OSD that leads some PG: one whose
    // PGs held none of the objects made this test fail at random.
    let (victim, led) = wait_until(
        WAIT,
        "an OSD that leads the PGs of some of the image's objects but not all",
        || {
            let client = &client;
            let ids = &ids;
            let image = &image;
            let objects = &objects;
            async move {
                let m = map(client).await;
                let leaders: Vec<(PgId, Option<OsdId>)> =
                    all_pgs(&m).map(|(pg, i)| (pg, i.leader)).collect();
                if leaders.iter().any(|(_, l)| l.is_none()) {
                    return None;
                }
                ids.iter().find_map(|id| {
                    let led: Vec<PgId> = leaders
                        .iter()
                        .filter(|(_, l)| *l == Some(*id))
                        .map(|(pg, _)| *pg)
                        .collect();
                    let through = objects
                        .iter()
                        .filter(|o| led.contains(&image.object_pg(**o)))
                        .count();
                    (through > 0 && through < objects.len()).then_some((*id, led))
                })
            }
        },
    )
    .await;
    let through_victim = objects
        .iter()
        .filter(|o| led.contains(&image.object_pg(**o)))
        .count();
    assert!(
        through_victim > 0 && through_victim < objects.len(),
        "osd {victim} leads {through_victim} of the image's {} objects' PGs",
        objects.len()
    );
    eprintln!("victim osd {victim} leads {led:?}, the PGs of {through_victim} objects");

    // Phase 1: the victim's disk fails every write and sync.
    write_fault_file(
        &fault_files[&victim],
        r#"{"seed": 1, "rules": [
            {"op": "write", "kind": "eio", "range": null, "probability": 1.0, "count": null,
             "shard": null},
            {"op": "sync", "kind": "eio"}
        ]}"#,
    );
    let t = Instant::now();
    // The faults are installed within the file's poll interval; writes keep going to the
    // victim's WAL until it stops.
    let mut acked: Vec<u64> = Vec::new();
    let status = loop {
        let proc = osds
            .iter_mut()
            .find(|o| o.id == victim)
            .and_then(|o| o.proc.as_mut())
            .expect("the victim runs");
        if let Some(status) = proc.wait_exit(Duration::from_millis(200)) {
            break status;
        }
        assert!(
            t.elapsed() < EXIT_WAIT,
            "osd {victim} still runs {EXIT_WAIT:?} after its disk began failing: the fault \
             injection did nothing\n{}",
            proc.log_tail()
        );
        write_slot(&image, &objects, 1, 2).await;
        for o in &objects {
            if !acked.contains(o) {
                acked.push(*o);
            }
        }
    };
    // Written at least once (generation 2 then, whatever later writes did), or never
    // acknowledged: generation 2 or nothing.
    let unknown: Vec<u64> = objects
        .iter()
        .copied()
        .filter(|o| !acked.contains(o))
        .collect();
    eprintln!(
        "osd {victim} exited ({status}) {:?} after the faults",
        t.elapsed()
    );
    assert!(!status.success(), "osd {victim} exited with {status}");
    assert_eq!(
        status.code(),
        Some(1),
        "fail-stop is exit status 1: {status}"
    );
    let victim_osd = osds.iter_mut().find(|o| o.id == victim).unwrap();
    victim_osd.proc = None;
    let log = victim_osd.all_logs();
    assert!(
        log.contains("I/O error during") && log.contains("Input/output error (os error 5)"),
        "the victim's log names the I/O error:\n{log}"
    );
    assert!(log.contains("stopping the OSD"), "{log}");
    assert!(log.contains("fault injection (test-only)"), "{log}");

    // The monitor marks it down; its PGs get new leaders.
    wait_until(WAIT, "the victim marked down", || {
        let client = &client;
        async move {
            let osds = client.osds().await.ok()?;
            let o = osds.iter().find(|o| o.id == victim)?;
            (!o.up).then_some(())
        }
    })
    .await;
    wait_until(WAIT, "new leaders for the victim's PGs", || {
        let client = &client;
        async move {
            let m = map(client).await;
            let led_elsewhere = all_pgs(&m).all(|(_, i)| i.leader.is_some_and(|l| l != victim));
            led_elsewhere.then_some(())
        }
    })
    .await;
    eprintln!("new leaders {:?} after the faults", t.elapsed());

    // Phase 2: IO goes on through every PG, including those the victim led.
    write_slot(&image, &objects, 2, 3).await;
    check_slot(&image, &objects, 0, 1, &[], "after the failure").await;
    check_slot(&image, &objects, 1, 2, &unknown, "after the failure").await;
    check_slot(&image, &objects, 2, 3, &[], "after the failure").await;
    for osd in osds.iter_mut().filter(|o| o.id != victim) {
        assert!(osd.is_running(), "osd {} stopped too", osd.id);
    }

    // The victim, restarted without faults, recovers and serves again.
    write_fault_file(&fault_files[&victim], "");
    osds.iter_mut().find(|o| o.id == victim).unwrap().start();
    wait_osds_up(&client, &ids, WAIT).await;
    common::wait_all_active(&client, Duration::from_secs(60)).await;
    check_slot(&image, &objects, 0, 1, &[], "after the restart").await;
    check_slot(&image, &objects, 1, 2, &unknown, "after the restart").await;
    check_slot(&image, &objects, 2, 3, &[], "after the restart").await;
    eprintln!(
        "{} writes of unknown outcome; every acknowledged write read back",
        unknown.len()
    );
}

/// Goal: an OSD whose disk fails every read of data stops by itself once 16 distinct blocks
/// failed (`docs/design/repair.md`, "A failing disk"), its PGs fail over, and every read the
/// client made, before, during and after, returned the right data (the blocks it could not
/// read were answered `Repairing` and retried, or repaired from another replica).
/// Method: three OSDs with fault files, blocks written everywhere; the OSD leading the most
/// PGs gets EIO on every read of its data region; the client reads every block until that
/// OSD has exited, then again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_osd_whose_disk_fails_reads_stops_after_16_blocks_and_reads_stay_correct() {
    let Faulty {
        mons,
        dir: _dir,
        mut osds,
        fault_files,
        ids: _,
        image,
        cluster: _cluster,
    } = Faulty::start("disk-read-faults").await;
    let client = mons.client();
    let objects: Vec<u64> = (0..OBJECTS).collect();
    const SLOTS: u64 = 8;
    for slot in 0..SLOTS {
        write_slot(&image, &objects, slot, 1).await;
    }

    let m = map(&client).await;
    let mut led: BTreeMap<OsdId, usize> = BTreeMap::new();
    for (_, i) in all_pgs(&m) {
        *led.entry(i.leader.expect("active PGs have leaders"))
            .or_default() += 1;
    }
    let (&victim, _) = led.iter().max_by_key(|(_, n)| **n).unwrap();
    let victim_pgs: Vec<PgId> = all_pgs(&m)
        .filter(|(_, i)| i.leader == Some(victim))
        .map(|(pg, _)| pg)
        .collect();
    let victim_blocks = objects
        .iter()
        .filter(|o| victim_pgs.contains(&image.object_pg(**o)))
        .count() as u64
        * SLOTS;
    assert!(
        victim_blocks >= 16,
        "osd {victim} leads {victim_blocks} blocks, fewer than the 16 that stop it"
    );
    let path = osds.iter().find(|o| o.id == victim).unwrap().data.clone();
    let start = common::data_file::data_offset(&path);
    write_fault_file(
        &fault_files[&victim],
        &format!(
            r#"{{"seed": 1, "rules": [
                {{"op": "read", "kind": "eio", "range": [{start}, 18446744073709551615]}}
            ]}}"#
        ),
    );
    // Let the OSD install the rules (it reads the file every 100 ms).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t = Instant::now();
    let mut rounds = 0;
    let status = loop {
        let proc = osds
            .iter_mut()
            .find(|o| o.id == victim)
            .and_then(|o| o.proc.as_mut())
            .expect("the victim runs");
        if let Some(status) = proc.wait_exit(Duration::from_millis(100)) {
            break status;
        }
        assert!(
            t.elapsed() < EXIT_WAIT,
            "osd {victim} still runs {EXIT_WAIT:?} after its reads began failing\n{}",
            proc.log_tail()
        );
        for slot in 0..SLOTS {
            check_slot(&image, &objects, slot, 1, &[], "while the reads fail").await;
        }
        rounds += 1;
    };
    eprintln!(
        "osd {victim} exited ({status}) {:?} and {rounds} rounds of reads after its reads began failing",
        t.elapsed()
    );
    assert_eq!(
        status.code(),
        Some(1),
        "fail-stop is exit status 1: {status}"
    );
    let victim_osd = osds.iter_mut().find(|o| o.id == victim).unwrap();
    victim_osd.proc = None;
    let log = victim_osd.all_logs();
    assert!(
        log.contains("data blocks failed to read (limit 16): the disk is failing"),
        "the victim's log says why it stopped:\n{log}"
    );
    assert!(log.contains("bad block copy found"), "{log}");
    wait_until(WAIT, "new leaders for the victim's PGs", || {
        let client = &client;
        async move {
            let m = map(client).await;
            let moved = all_pgs(&m).all(|(_, i)| i.leader.is_some_and(|l| l != victim));
            moved.then_some(())
        }
    })
    .await;
    for slot in 0..SLOTS {
        check_slot(&image, &objects, slot, 1, &[], "after the failover").await;
    }
    for osd in osds.iter_mut().filter(|o| o.id != victim) {
        assert!(osd.is_running(), "osd {} stopped too", osd.id);
    }
}

//! Scenario tests over the simulated cluster: known-hard cases written step by step
//! (`fastblock_sim::scenario`). Every read still goes through the image model.

use fastblock_sim::node::ClientReply;
use fastblock_sim::options::{MS, SEC};
use fastblock_sim::scenario::Scenario;
use fastblock_types::{ImageId, OsdId, PgId};
use fastblock_wire::{Reply, Status};

/// Goal: a leader cut off from its followers must not serve a read that misses a write the
/// new leader acknowledged (reads are linearizable, also under check-quorum leases).
/// Method: isolate the leader from the other OSDs (clients still reach it), run until a new
/// leader exists while the old one still believes it leads, write through the new leader,
/// then read the same block at the old one. The image model checks the read. Tried over
/// several seeds, since whether the two leaderships overlap depends on timer phases.
#[test]
fn isolated_leader_serves_no_stale_read() {
    let mut overlaps = 0;
    for seed in 0..24 {
        let mut t = Scenario::new(seed, 3, 3).unwrap();
        let old = t.wait_leader().unwrap();
        t.run_for(300 * MS).unwrap();
        assert!(t.write(0, old, 0).unwrap().is_ok());
        t.isolate(&[old]);
        t.run_until(10 * SEC, |s| s.leaders().len() >= 2 || !s.leads(old))
            .unwrap();
        let Some(new) = t.leaders().into_iter().find(|l| *l != old) else {
            continue; // the old leader stepped down first: no overlap with this seed
        };
        assert!(
            t.write(1, new, 0).unwrap().is_ok(),
            "seed {seed}: the new leader takes writes"
        );
        if !t.leads(old) {
            continue;
        }
        overlaps += 1;
        match t.read(0, old, 0) {
            Ok(reply) => println!(
                "seed {seed}: read at the deposed leader: {}",
                describe(&reply)
            ),
            Err(e) => panic!("seed {seed}: {e}"),
        }
    }
    println!("{overlaps} seeds had two leaders at once");
    assert!(
        overlaps > 0,
        "no seed reached the window this scenario is about"
    );
}

/// Goal: a leader that serves reads under a lease (`fastblock_pg::lease`) never serves a stale
/// one after it is cut off. Method: as above, but the old leader first serves reads (so it
/// holds a lease, renewed while it reads), then is cut off and read from every 50 ms while a
/// new leader is elected and takes a write; the model rejects any read that misses it.
#[test]
fn isolated_leader_with_a_lease_serves_no_stale_read() {
    let mut lease_reads_after_cut = 0;
    for seed in 0..24 {
        let mut t = Scenario::with_options(seed, 3, 3, |o| o.lease_reads = true).unwrap();
        let old = t.wait_leader().unwrap();
        t.run_for(300 * MS).unwrap();
        assert!(t.write(0, old, 0).unwrap().is_ok());
        for _ in 0..5 {
            assert!(t.read(0, old, 0).unwrap().is_data());
            t.run_for(50 * MS).unwrap();
        }
        t.isolate(&[old]);
        let mut wrote = false;
        for _ in 0..200 {
            // A read at the cut-off leader: answered from its lease, or not at all (the
            // scripted client gives up); the model checks what it returns.
            if t.read(0, old, 0).is_ok_and(|r| r.is_data()) {
                lease_reads_after_cut += 1;
            }
            if !wrote {
                if let Some(new) = t.leaders().into_iter().find(|l| *l != old) {
                    wrote = t.write(1, new, 0).is_ok_and(|r| r.is_ok());
                }
            }
            t.run_for(50 * MS).unwrap();
            if wrote && !t.leads(old) {
                break;
            }
        }
        assert!(wrote, "seed {seed}: a new leader took the write");
    }
    println!("{lease_reads_after_cut} reads answered from a lease after the cut");
    assert!(
        lease_reads_after_cut > 0,
        "no read was served from a lease after the cut: the test did not test it"
    );
}

fn describe(reply: &ClientReply) -> String {
    match reply {
        ClientReply::Osd(Reply::Data(d)) => {
            format!("{:?}", fastblock_sim::model::decode_block(&d[..4096]))
        }
        other => format!("{other:?}"),
    }
}

/// Goal: a leader cut off from its followers keeps taking writes it cannot commit until it
/// steps down; when they fill its WAL it must refuse more, not stop (the design: bad load
/// gives a clear error, never a fail-stop of the OSD). Method: a small WAL (4 x 256 KiB),
/// the leader isolated, then 400 clients each send it a 4 KiB write at once.
#[test]
fn isolated_leader_with_a_full_wal_refuses_instead_of_failing() {
    let mut t = Scenario::with_options(5, 3, 3, |o| {
        o.wal_segment_bytes = 256 << 10;
        o.wal_segments = 4;
        o.wal_batch_bytes_max = 64 << 10;
        o.pg.pending_ops_max = 1024;
        o.pg.election_ticks = 20;
        o.log_retain_entries = 1;
    })
    .unwrap();
    let old = t.wait_leader().unwrap();
    t.isolate(&[old]);
    let clients: Vec<u32> = (0..400).map(|_| t.c.add_scripted_client()).collect();
    for (i, c) in clients.iter().enumerate() {
        t.c.submit(*c, old, true, 0, i as u64 % 16);
    }
    t.run_for(2 * SEC).unwrap();
    t.heal();
    let new = t.wait_leader().unwrap();
    assert!(t.write(0, new, 0).unwrap().is_ok());
}

/// Goal: a full host file system under an OSD's metadata is an admission decision, never a
/// crash (docs/design/osd.md, "Space"): writes get `NoSpace` naming the file system, reads
/// are served, and writes resume by themselves once a sample shows room again. Method: one
/// OSD, one replica; the runtime's samples are scripted: empty, then plenty.
#[test]
fn a_full_host_file_system_refuses_writes_serves_reads_and_recovers() {
    let mut t = Scenario::new(3, 1, 1).unwrap();
    let osd = t.wait_leader().unwrap();
    assert!(t.write(0, osd, 0).unwrap().is_ok());
    t.host_space(osd, 0);
    let refused = t.write(0, osd, 1).unwrap();
    match &refused {
        ClientReply::Osd(Reply::Error {
            status: Status::NoSpace,
            message,
            ..
        }) => assert!(message.contains("file system"), "{message}"),
        other => panic!("a write on a full file system: {}", describe(other)),
    }
    assert!(t.read(1, osd, 0).unwrap().is_data(), "reads are served");
    assert!(t.c.node(osd).core().unwrap().failure().is_none());
    t.host_space(osd, 1 << 40);
    assert!(t.write(0, osd, 1).unwrap().is_ok(), "writes resume");
    assert!(t.read(1, osd, 1).unwrap().is_data());
}

/// The node among `nodes` that believes it leads `pg`, if any.
fn leader_of(t: &Scenario, pg: PgId, nodes: &[OsdId]) -> Option<OsdId> {
    nodes.iter().copied().find(|n| {
        t.c.node(*n)
            .core()
            .and_then(|core| core.replica(pg))
            .is_some_and(|r| r.is_leader())
    })
}

/// Whether `node` holds snapshot `snap` of the image in `pg` (applied its mark).
fn holds_snapshot(t: &Scenario, node: OsdId, pg: PgId, snap: u64) -> bool {
    t.c.node(node).core().is_some_and(|core| {
        core.store()
            .image_snaps(pg, ImageId(1))
            .live
            .contains(&snap)
    })
}

/// Goal: a write acknowledged while a snapshot is being taken is in it (the promise of
/// `docs/design/snapshots.md`: every PG refuses writes from its mark until its map shows the
/// snapshot created), also when the PG's leader changes to a node whose map is older than the
/// snapshot. Method: two PGs with leaders on different nodes; the other nodes' map watches
/// stall; the monitor takes a snapshot, which the leader of the written PG marks and the
/// other PG (led by a stalled node) cannot; the written PG's leader is cut off, a stalled
/// node takes over and is sent a write; then the maps flow, the snapshot is created, and the
/// block is read from it (the model checks the read against the acknowledged write).
/// Before the shard core froze writes behind a mark its leader's map did not show, the
/// stalled leader acknowledged the write at seed 0 and the model found the snapshot's block
/// stale.
#[test]
fn a_leader_whose_map_is_older_than_a_snapshot_takes_no_write_the_snapshot_misses() {
    let mut reached = 0;
    for seed in 0..24 {
        let mut t = Scenario::with_options(seed, 3, 3, |o| {
            o.pg_count = 2;
            o.snap_create_timeout_us = 60 * SEC;
        })
        .unwrap();
        let nodes: Vec<OsdId> = (1..=3).map(OsdId).collect();
        let p = t.c.object_pg(0);
        let q = *t.c.pg_infos().keys().find(|pg| **pg != p).unwrap();
        let led = t
            .run_until(10 * SEC, |s| {
                leader_of(s, p, &nodes).is_some() && leader_of(s, q, &nodes).is_some()
            })
            .unwrap();
        assert!(led, "seed {seed}: both PGs elect a leader");
        t.run_for(300 * MS).unwrap();
        let a = leader_of(&t, p, &nodes).unwrap();
        if leader_of(&t, q, &nodes) == Some(a) {
            continue; // one node leads both: it would mark both and create the snapshot
        }
        assert!(t.write(0, a, 0).unwrap().is_ok(), "seed {seed}");
        let others: Vec<OsdId> = nodes.iter().copied().filter(|n| *n != a).collect();
        for n in &others {
            t.c.stall_map(*n, 5 * SEC);
        }
        let snap = t.c.take_snapshot().unwrap();
        let marked = t
            .run_until(2 * SEC, |s| holds_snapshot(s, a, p, snap))
            .unwrap();
        assert!(
            marked,
            "seed {seed}: the leader of pg {p} marks the snapshot"
        );
        t.isolate(&[a]);
        let taken = t
            .run_until(4 * SEC, |s| {
                leader_of(s, p, &others).is_some_and(|l| holds_snapshot(s, l, p, snap))
            })
            .unwrap();
        if !taken || t.c.snapshot_created(snap) {
            continue;
        }
        let l2 = leader_of(&t, p, &others).unwrap();
        reached += 1;
        let reply = t.write(1, l2, 0).unwrap();
        println!(
            "seed {seed}: osd {l2}, leading pg {p} with a map older than snapshot {snap}: \
             write {}",
            describe(&reply)
        );
        t.heal();
        let created = t
            .run_until(20 * SEC, |s| s.c.snapshot_created(snap))
            .unwrap();
        assert!(
            created,
            "seed {seed}: the snapshot is created once the maps flow"
        );
        let led = t
            .run_until(5 * SEC, |s| leader_of(s, p, &nodes).is_some())
            .unwrap();
        assert!(led, "seed {seed}: pg {p} has a leader after the heal");
        let leader = leader_of(&t, p, &nodes).unwrap();
        t.c.submit_snap_read(0, leader, snap, (0, 0));
        let read = t.run_until(5 * SEC, |s| s.c.result(0).is_some());
        match read {
            Ok(true) => println!(
                "seed {seed}: snapshot read: {}",
                describe(t.c.result(0).unwrap())
            ),
            Ok(false) => panic!("seed {seed}: no answer to the snapshot read"),
            Err(e) => panic!("seed {seed}: {e}"),
        }
    }
    assert!(
        reached > 0,
        "no seed reached a new leader with a map older than the snapshot"
    );
}

/// Goal: a bit flipped in the leader's copy of a block is never handed to a client, and the
/// block is repaired from a follower's copy (`docs/design/repair.md`). Method: write block 0
/// and let every member apply and flush it; flip a bit of the leader's copy on its disk
/// (`Cluster::flip_block`, as `--bad-blocks` runs do); read the block at the leader. The
/// leader answers `Repairing` while it fetches a follower's copy and logs the repair; a
/// retry then reads the data the model allows.
#[test]
fn a_flipped_bit_in_the_leaders_copy_is_repaired_from_a_follower() {
    let mut t = Scenario::new(3, 3, 3).unwrap();
    let leader = t.wait_leader().unwrap();
    assert!(t.write(0, leader, 0).unwrap().is_ok());
    t.run_for(3 * SEC).unwrap();
    assert!(
        t.c.flip_block(leader, 0),
        "osd {leader} holds block 0 on its disk"
    );
    let first = t.read(0, leader, 0).unwrap();
    assert_eq!(
        first.status(),
        Some(Status::Repairing),
        "the first read: {}",
        describe(&first)
    );
    t.run_for(SEC).unwrap();
    let again = t.read(0, leader, 0).unwrap();
    assert!(
        again.is_data(),
        "the read after the repair: {}",
        describe(&again)
    );
    let repairs = t.c.node(leader).core().unwrap().repair_counts();
    assert_eq!((repairs.started, repairs.repaired), (1, 1), "{repairs:?}");
}

/// Goal: a write whose client gave up while its leader was cut off from everyone never takes
/// effect after a later write of the same block: the chaos run's stale reads (2026-11-27 and
/// -28), where the given-up request waited in the client's kernel and reached the old leader
/// once it led again. Method: the leader is cut off from the other OSDs and from the clients;
/// client 1's write of block 0 to it waits there and is given up; client 0 writes block 0 at
/// the new leader; the OSDs' partition heals and the old leader is made to lead again (the
/// others cut off in turn) while client 1's request still waits; then the clients' cut heals
/// and block 0 is read at the old leader. With connections aborted on giving up (the client
/// library's) the request is discarded. With orderly closes (`client_close_orderly`, the
/// library before the reset) the request reaches the old leader, which applied it over client
/// 0's write before the term fence; now the request names the term of the leadership it was
/// sent to, the old leader leads in a newer one and refuses it (`docs/data-path.md` section
/// 4), so the model accepts the read either way: the fence closes the window even without the
/// reset (which also stands for bytes the OSD's kernel had already acknowledged).
#[test]
fn a_write_given_up_in_a_partition_never_lands_after_a_newer_one() {
    /// The read at the old leader and how many given-up requests reached a node late.
    fn run(seed: u64, orderly: bool) -> Result<Option<(String, u64)>, String> {
        let mut t = Scenario::with_options(seed, 3, 3, |o| {
            o.client_close_orderly = orderly;
            o.attempt_timeout_us = 300 * MS;
        })?;
        let old = t.wait_leader()?;
        t.run_for(300 * MS)?;
        if !t.write(0, old, 0)?.is_ok() {
            return Err("the first write failed".into());
        }
        t.isolate(&[old]);
        t.cut_clients(&[old]);
        // Waits at the cut-off leader's link and is given up after the attempt timeout.
        let given_up = t.write(1, old, 0)?;
        if given_up.is_ok() {
            return Err(format!("the cut-off leader answered: {given_up:?}"));
        }
        t.run_until(10 * SEC, |s| !s.leads(old) && s.leaders().len() == 1)?;
        let Some(new) = t.leaders().into_iter().find(|l| *l != old) else {
            return Err("no new leader".into());
        };
        if !t.write(0, new, 0)?.is_ok() {
            return Err("the new leader refused the write".into());
        }
        // The OSDs reach each other again, and the old leader is brought back to lead in a
        // newer term, while the clients still cannot reach it.
        let term = t.term(new);
        let back = |s: &Scenario| s.leads(old) && s.term(old) > term && s.leaders() == [old];
        for _ in 0..20 {
            if back(&t) {
                break;
            }
            match t.leaders().into_iter().find(|l| *l != old) {
                Some(other) => t.isolate(&[other]),
                None => t.isolate(&[]),
            }
            t.run_until(5 * SEC, back)?;
        }
        if !back(&t) {
            return Ok(None); // this seed never gave it back: nothing to tell
        }
        t.isolate(&[]);
        // The clients' cut heals: client 1's request, given up long ago, is discarded, or
        // with orderly closes arrives at its next retransmission, at the old leader leading
        // again.
        t.cut_clients(&[]);
        t.run_until(150 * SEC, |s| {
            s.c.probes.count("net.client_given_up_discarded")
                + s.c.probes.count("net.client_given_up_delivered")
                > 0
        })?;
        t.run_for(100 * MS)?;
        let delivered = t.c.probes.count("net.client_given_up_delivered");
        let fenced = t.c.probes.count("admission.stale_term");
        if delivered > 0 && fenced == 0 {
            return Err("the given-up write was delivered and not refused for its term".into());
        }
        t.read(0, old, 0)
            .map(|reply| Some((describe(&reply), delivered)))
    }
    let (mut told, mut told_orderly) = (0, 0);
    for seed in 0..8 {
        match run(seed, false) {
            Ok(Some((read, _))) => {
                told += 1;
                println!("seed {seed}: read {read}");
            }
            Ok(None) => {}
            Err(e) => panic!("seed {seed}, aborted connections: {e}"),
        }
        match run(seed, true) {
            Ok(Some((read, delivered))) => {
                told_orderly += u64::from(delivered > 0);
                println!("seed {seed}, orderly closes: read {read}, {delivered} late deliveries");
            }
            Ok(None) => {}
            Err(e) => panic!(
                "seed {seed}, orderly closes (the term fence must refuse the late write): {e}"
            ),
        }
    }
    assert!(told > 0, "no seed brought the old leader back");
    assert!(
        told_orderly > 0,
        "with orderly closes no seed delivered the given-up write to the old leader leading \
         again: the scenario does not reach the window it is about"
    );
}

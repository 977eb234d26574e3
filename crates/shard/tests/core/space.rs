//! Space (`fastblock_shard::space`): a full data region or host file system refuses writes
//! with `NoSpace`, serves reads, never stops the shard, and takes writes again once space
//! comes back.

use crate::harness::{self, addr, pg, read, write, Cluster};
use crate::status;
use fastblock_shard::{Input, Report, ShardConfig};
use fastblock_types::Epoch;
use fastblock_wire::{Reply, Request, Status};

const CHUNK_BYTES: u32 = 32 << 10;

/// One OSD leading PG 0 alone, with `cfg` adjusting the harness's configuration.
fn single_with(adjust: impl Fn(&mut ShardConfig)) -> Cluster {
    let mut c = Cluster::with(&[1], |id| {
        let mut cfg = harness::config(id);
        adjust(&mut cfg);
        cfg
    });
    c.map(harness::map(1, &[1], &[(0, &[1], &[])]));
    c.elect(1, pg(0));
    c
}

/// The reply to a read of `length` bytes of `object` at `offset`, after the read barrier.
fn read_back(c: &mut Cluster, object: u64, offset: u32, length: u32) -> Reply {
    let r = c.request(1, read(pg(0), object, offset, length, 1));
    for _ in 0..5 {
        if c.reply(r).is_some() {
            break;
        }
        c.tick();
    }
    c.reply(r).cloned().expect("the read is answered")
}

fn message(reply: Option<&Reply>) -> String {
    match reply {
        Some(Reply::Error { message, .. }) => message.clone(),
        other => panic!("expected an error reply, got {other:?}"),
    }
}

fn no_failure(c: &Cluster) {
    assert!(c.core(1).failure().is_none(), "the shard must keep serving");
    assert!(
        !c.reports.iter().any(|(_, r)| matches!(r, Report::Fatal(_))),
        "no fatal report"
    );
}

/// The byte chunk `n` of [`fill`] is made of (never zero).
fn fill_byte(n: u64) -> u8 {
    (n % 251) as u8 + 1
}

/// Writes distinct 32 KiB chunks (object `i / 64`, so 2 MiB objects) while the data region
/// has at least `keep_bytes + CHUNK_BYTES` free; returns how many.
fn fill(c: &mut Cluster, keep_bytes: u64) -> u64 {
    let mut n = 0;
    while c.core(1).store().free_data_bytes() >= keep_bytes + u64::from(CHUNK_BYTES) {
        let (object, offset) = (n / 64, (n % 64) as u32 * CHUNK_BYTES);
        let w = c.request(
            1,
            write(pg(0), object, offset, &[fill_byte(n); 32 << 10], 1),
        );
        assert_eq!(c.reply(w), Some(&Reply::Ok), "chunk {n}");
        n += 1;
    }
    n
}

/// Goal: a host file system below its reserve refuses writes (with a message naming the file
/// system) but not reads or discards, and writes resume with the next sample that shows room.
/// Method: one OSD; `HostSpace` samples as the OSD's runtime steps them once a second.
#[test]
fn a_full_host_file_system_refuses_writes_until_a_sample_shows_room() {
    let mut c = single_with(|_| {});
    let reserve = c.core(1).config().host_space_reserve_bytes;
    let w = c.request(1, write(pg(0), 1, 0, &[5u8; 4096], 1));
    assert_eq!(c.reply(w), Some(&Reply::Ok));
    // Room for the reserve but not for the write on top of it.
    c.step(
        1,
        Input::HostSpace {
            free_bytes: reserve + 4095,
        },
    );
    let refused = c.request(1, write(pg(0), 1, 4096, &[6u8; 4096], 1));
    assert_eq!(status(c.reply(refused)), Some(Status::NoSpace));
    let m = message(c.reply(refused));
    assert!(
        m.contains("file system") && m.contains(&format!("reserve of {reserve}")),
        "{m}"
    );
    assert_eq!(
        read_back(&mut c, 1, 0, 4096),
        Reply::Data(vec![5u8; 4096].into())
    );
    let discard = c.request(
        1,
        Request::Discard {
            addr: addr(pg(0), 1),
            offset: 0,
            length: 4096,
            epoch: Epoch(1),
        },
    );
    assert_eq!(
        c.reply(discard),
        Some(&Reply::Ok),
        "discards give space back"
    );
    no_failure(&c);
    c.step(
        1,
        Input::HostSpace {
            free_bytes: reserve + 4096,
        },
    );
    let resumed = c.request(1, write(pg(0), 1, 4096, &[6u8; 4096], 1));
    assert_eq!(c.reply(resumed), Some(&Reply::Ok));
    assert_eq!(
        read_back(&mut c, 1, 4096, 4096),
        Reply::Data(vec![6u8; 4096].into())
    );
}

/// Goal: writes admitted together (one batch from the sockets, none applied yet) never
/// overrun the data region: each is admitted against the space the others will take, so
/// applying them cannot fail and stop the shard. Method: a small reserve (4 KiB); fill the
/// region until about seven chunks are left, then send eight at once.
#[test]
fn writes_admitted_together_never_overrun_the_data_region() {
    let mut c = single_with(|cfg| cfg.data_reserve_bytes = 4 << 10);
    let left_bytes = 4096 + 6 * u64::from(CHUNK_BYTES);
    let n = fill(&mut c, left_bytes);
    let free = c.core(1).store().free_data_bytes();
    assert!(free >= left_bytes && free < left_bytes + u64::from(CHUNK_BYTES));
    let burst: Vec<Request> = (0..8)
        .map(|i| write(pg(0), 1000, i * CHUNK_BYTES, &[0xAB; 32 << 10], 1))
        .collect();
    let ids = c.request_batch(1, burst);
    no_failure(&c);
    let ok = ids
        .iter()
        .filter(|id| c.reply(**id) == Some(&Reply::Ok))
        .count();
    let full = ids
        .iter()
        .filter(|id| status(c.reply(**id)) == Some(Status::NoSpace))
        .count();
    assert_eq!(ok + full, 8, "every write is answered Ok or NoSpace");
    assert!(ok >= 6 && full >= 1, "{ok} written, {full} refused");
    assert_eq!(
        read_back(
            &mut c,
            (n - 1) / 64,
            ((n - 1) % 64) as u32 * CHUNK_BYTES,
            4096
        ),
        Reply::Data(vec![fill_byte(n - 1); 4096].into())
    );
}

/// Goal: space a client frees is writable at once, not only after the next flush (which is
/// what returns freed blocks to the allocator). Method: fill to `NoSpace`, discard a 2 MiB
/// object, and write before anything flushes.
#[test]
fn space_freed_by_a_discard_is_writable_before_the_next_flush() {
    let mut c = single_with(|_| {});
    // Up to the reserve: the last chunks are admitted one at a time, each applied at once.
    let reserve = c.core(1).config().data_reserve_bytes;
    let n = fill(&mut c, reserve);
    let refused = c.request(1, write(pg(0), 5000, 0, &[9u8; 32 << 10], 1));
    assert_eq!(status(c.reply(refused)), Some(Status::NoSpace));
    assert!(message(c.reply(refused)).contains("data region"));
    assert!(n >= 64, "at least one whole object was written");
    let discard = c.request(
        1,
        Request::Discard {
            addr: addr(pg(0), 0),
            offset: 0,
            length: 2 << 20,
            epoch: Epoch(1),
        },
    );
    assert_eq!(c.reply(discard), Some(&Reply::Ok));
    assert!(
        c.core(1).store().pending_free_bytes() >= 2 << 20,
        "nothing flushed yet: the freed blocks still wait"
    );
    let w = c.request(1, write(pg(0), 5000, 0, &[9u8; 32 << 10], 1));
    assert_eq!(c.reply(w), Some(&Reply::Ok), "{:?}", c.reply(w));
    no_failure(&c);
    assert_eq!(
        read_back(&mut c, 5000, 0, 4096),
        Reply::Data(vec![9u8; 4096].into())
    );
    assert_eq!(
        read_back(&mut c, 0, 0, 4096),
        Reply::Data(vec![0u8; 4096].into())
    );
}

/// The reply to `request_id`, ticking until it comes (at most 20 ticks).
fn answer(c: &mut Cluster, request_id: u64) -> Option<Reply> {
    for _ in 0..20 {
        if c.reply(request_id).is_some() {
            break;
        }
        c.tick();
    }
    c.reply(request_id).cloned()
}

/// The harness map at `epoch` over OSDs 1 and 2 with PG 0 on both, `full` marked full.
fn map_with_full(epoch: u64, full: &[u32]) -> std::sync::Arc<fastblock_types::map::ClusterMap> {
    let mut m = (*harness::map(epoch, &[1, 2], &[(0, &[1, 2], &[])])).clone();
    m.space.full_osds = full.iter().map(|o| fastblock_types::OsdId(*o)).collect();
    std::sync::Arc::new(m)
}

/// Goal: a PG with a member the map marks full (past the full ratio) refuses writes with
/// `NoSpace` naming that member, at its leader, even when the leader itself has room; reads
/// and discards go on, and writes resume with the map that clears the mark. Method: two
/// OSDs, PG 0 on both led by OSD 1; the map marks follower 2 full, then clears it.
#[test]
fn a_member_past_the_full_ratio_stops_writes_to_its_pgs_until_the_map_clears_it() {
    let mut c = Cluster::new(&[1, 2]);
    c.map(map_with_full(1, &[]));
    c.elect(1, pg(0));
    let w = c.request(1, write(pg(0), 1, 0, &[5u8; 4096], 1));
    assert_eq!(answer(&mut c, w), Some(Reply::Ok));

    c.map(map_with_full(2, &[2]));
    let refused = c.request(1, write(pg(0), 1, 4096, &[6u8; 4096], 2));
    assert_eq!(status(c.reply(refused)), Some(Status::NoSpace));
    let m = message(c.reply(refused));
    assert!(m.contains("osd.2 is full") && m.contains("pg 1.0"), "{m}");
    let r = c.request(1, read(pg(0), 1, 0, 4096, 2));
    assert_eq!(answer(&mut c, r), Some(Reply::Data(vec![5u8; 4096].into())));
    let discard = c.request(
        1,
        Request::Discard {
            addr: addr(pg(0), 2),
            offset: 0,
            length: 4096,
            epoch: Epoch(2),
        },
    );
    assert_eq!(answer(&mut c, discard), Some(Reply::Ok), "discards go on");
    assert!(c.core(1).failure().is_none());

    c.map(map_with_full(3, &[]));
    let resumed = c.request(1, write(pg(0), 1, 4096, &[6u8; 4096], 3));
    assert_eq!(answer(&mut c, resumed), Some(Reply::Ok));
}

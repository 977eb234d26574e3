//! Space (`fastblock_shard::space`): a full data region or host file system refuses writes
//! with `NoSpace`, serves reads, never stops the shard, and takes writes again once space
//! comes back.

use crate::harness::{self, addr, pg, read, single_with, write, Cluster};
use crate::status;
use fastblock_shard::{Input, Report};
use fastblock_types::Epoch;
use fastblock_wire::{Reply, Request, Status};

const CHUNK_BYTES: u32 = 32 << 10;

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
            term: 0,
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
            term: 0,
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
            term: 0,
        },
    );
    assert_eq!(answer(&mut c, discard), Some(Reply::Ok), "discards go on");
    assert!(c.core(1).failure().is_none());

    c.map(map_with_full(3, &[]));
    let resumed = c.request(1, write(pg(0), 1, 4096, &[6u8; 4096], 3));
    assert_eq!(answer(&mut c, resumed), Some(Reply::Ok));
}

/// The one-OSD map with the harness image (64 MiB, 64 KiB objects) and, if `state` says so,
/// its snapshot 1.
fn image_map(
    epoch: u64,
    state: Option<fastblock_types::map::SnapState>,
) -> std::sync::Arc<fastblock_types::map::ClusterMap> {
    use fastblock_types::map::{ImageExtent, ImageTable, SnapInfo};
    let mut m = (*harness::map(epoch, &[1], &[(0, &[1], &[])])).clone();
    let extent = ImageExtent {
        size_bytes: 64 << 20,
        object_size_bytes: 64 << 10,
        parent_overlap_bytes: None,
    };
    m.images = Some(ImageTable {
        next_id: harness::IMAGE.0 + 1,
        images: [(harness::IMAGE, extent)].into_iter().collect(),
    });
    if let Some(state) = state {
        let snap = SnapInfo {
            id: fastblock_types::SnapId(1),
            pool: pg(0).pool,
            image: harness::IMAGE,
            image_name: "img".into(),
            name: "s1".into(),
            state,
            size_bytes: 64 << 20,
            object_size_bytes: 64 << 10,
            created_epoch: Epoch(epoch),
            protected: false,
            done_pgs: Default::default(),
            started_at_ms: 0,
            parent_overlap_bytes: None,
        };
        m.snaps.insert(harness::IMAGE, vec![snap]);
    }
    std::sync::Arc::new(m)
}

/// Goal: rollbacks admitted together (as `rollback_objects` sends 16 objects at once) never
/// overrun the data region: each is admitted against the whole object it may copy back and
/// the space the others in flight may take, so applying one cannot fail `NoSpace`, which
/// would stop the shard on every replica. Method: eight 64 KiB objects written, snapshotted
/// and discarded (their blocks stay, kept for the snapshot); the region filled until less
/// than three objects are left above a small reserve, nothing waiting to be freed; then
/// eight rollbacks in one batch.
#[test]
fn rollbacks_admitted_together_never_overrun_the_data_region() {
    use fastblock_types::map::SnapState;
    const OBJECT_BYTES: u64 = 64 << 10;
    // A small reserve (4 KiB), so that what the burst overruns is the region itself.
    let mut c = single_with(|cfg| cfg.data_reserve_bytes = 4 << 10);
    c.map(image_map(2, None));
    for object in 0..8u64 {
        for half in 0..2u32 {
            let data = [fill_byte(object); 32 << 10];
            let w = c.request(1, write(pg(0), object, half * CHUNK_BYTES, &data, 2));
            assert_eq!(c.reply(w), Some(&Reply::Ok));
        }
    }
    c.map(image_map(3, Some(SnapState::Creating)));
    c.tick();
    c.map(image_map(4, Some(SnapState::Created)));
    for object in 0..8u64 {
        let d = c.request(
            1,
            Request::Discard {
                addr: addr(pg(0), object),
                offset: 0,
                length: OBJECT_BYTES as u32,
                epoch: Epoch(4),
                term: 0,
            },
        );
        assert_eq!(c.reply(d), Some(&Reply::Ok));
    }
    let reserve = c.core(1).config().data_reserve_bytes;
    let keep = reserve + 2 * OBJECT_BYTES + u64::from(CHUNK_BYTES);
    let mut n = 0u64;
    while c.core(1).store().free_data_bytes() >= keep + u64::from(CHUNK_BYTES) {
        let (object, offset) = (100 + n / 2, (n % 2) as u32 * CHUNK_BYTES);
        let w = c.request(1, write(pg(0), object, offset, &[0xEE; 32 << 10], 4));
        assert_eq!(c.reply(w), Some(&Reply::Ok), "chunk {n}");
        n += 1;
    }
    c.settle();
    assert_eq!(
        c.core(1).store().pending_free_bytes(),
        0,
        "nothing a flush could give back"
    );
    let free = c.core(1).store().free_data_bytes();
    assert!(free < reserve + 3 * OBJECT_BYTES, "{free}");
    let burst: Vec<Request> = (0..8u64)
        .map(|object| Request::Rollback {
            addr: addr(pg(0), object),
            epoch: Epoch(4),
            term: 0,
            snap: 1,
        })
        .collect();
    let ids = c.request_batch(1, burst);
    no_failure(&c);
    let ok = some_ok_some_refused(&c, &ids, "rollback");
    for object in ok {
        assert_eq!(
            read_back(&mut c, object, 0, 4096),
            Reply::Data(vec![fill_byte(object); 4096].into()),
            "object {object} rolled back"
        );
    }
}

/// Goal: discards with unaligned ends, which rewrite their partial end blocks into new blocks,
/// are counted in flight like writes: a burst of them over unwritten ranges (nothing to give
/// back) never overruns the data region; those that cannot fit are refused `NoSpace` instead
/// of failing their apply. Method: a small reserve (4 KiB); fill until fewer than eight
/// blocks are free above it; send eight discards of 4 KiB + 2 bytes (two partial blocks
/// each) to objects never written, in one batch.
#[test]
fn unaligned_discards_admitted_together_never_overrun_the_data_region() {
    let mut c = single_with(|cfg| cfg.data_reserve_bytes = 4 << 10);
    fill(&mut c, (4 << 10) + 3 * 8192);
    c.settle();
    assert_eq!(c.core(1).store().pending_free_bytes(), 0);
    let free = c.core(1).store().free_data_bytes();
    assert!(free < (4 << 10) + 8 * 8192, "{free}");
    let burst: Vec<Request> = (0..8u64)
        .map(|object| Request::Discard {
            addr: addr(pg(0), 3000 + object),
            offset: 1,
            length: 4096 + 2,
            epoch: Epoch(1),
            term: 0,
        })
        .collect();
    let ids = c.request_batch(1, burst);
    no_failure(&c);
    let ok = some_ok_some_refused(&c, &ids, "discard");
    for object in ok {
        assert_eq!(
            read_back(&mut c, 3000 + object, 0, 8192),
            Reply::Data(vec![0u8; 8192].into())
        );
    }
}

/// The indexes of the burst `ids` answered `Ok`, after checking that every request of it was
/// answered `Ok` or `NoSpace`, and that some were each.
fn some_ok_some_refused(c: &Cluster, ids: &[u64], what: &str) -> Vec<u64> {
    let ok: Vec<u64> = (0..ids.len() as u64)
        .filter(|i| c.reply(ids[*i as usize]) == Some(&Reply::Ok))
        .collect();
    let full = ids
        .iter()
        .filter(|id| status(c.reply(**id)) == Some(Status::NoSpace))
        .count();
    assert_eq!(
        ok.len() + full,
        ids.len(),
        "every {what} is answered Ok or NoSpace"
    );
    assert!(
        !ok.is_empty() && full >= 1,
        "{what}: {ok:?} applied, {full} refused"
    );
    ok
}

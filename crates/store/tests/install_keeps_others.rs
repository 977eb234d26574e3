//! Installing one PG's snapshot flushes the whole store (`Store::install_snapshot`): what
//! another PG wrote since the last flush, and while a flush of its own was still running on
//! the flusher thread, must read back unchanged before and after.
// raft-rs messages (rust-protobuf) are built field by field, as raft-rs itself does.
#![allow(clippy::field_reassign_with_default)]

mod common;
use common::*;
use raft::eraftpb::ConfState;

fn conf(voters: &[u64]) -> ConfState {
    let mut cs = ConfState::default();
    cs.voters = voters.to_vec();
    cs
}

fn read1(s: &mut fastblock_store::Store<fastblock_store::disk::SimDisk>) -> Vec<u8> {
    let mut buf = vec![0u8; 8192];
    s.read_object(pg(1), obj(5), 0, &mut buf).unwrap();
    buf
}

/// With and without the flusher thread: writes v1 (flushed), v2 (in a flush begun), v3
/// (dirty); another PG's snapshot installed; v3 reads back, then v4 after the next flush.
#[test]
fn install_of_one_pg_keeps_another_pgs_latest_writes() {
    for background in [false, true] {
        let (_disk, _meta, mut s) = new_sim(DEVICE_BYTES);
        s.set_conf_state(pg(0), &conf(&[1, 2, 3])).unwrap();
        s.set_conf_state(pg(1), &conf(&[1, 2, 3])).unwrap();
        s.commit().unwrap();
        s.write_object(pg(1), obj(5), 0, &pattern(1, 8192)).unwrap();
        s.set_applied(pg(1), 1).unwrap();
        s.flush().unwrap();
        if background {
            s.start_flusher("t".into(), Box::new(|| {})).unwrap();
        }
        s.write_object(pg(1), obj(5), 0, &pattern(2, 8192)).unwrap();
        s.set_applied(pg(1), 2).unwrap();
        assert!(s.flush_begin().unwrap());
        s.write_object(pg(1), obj(5), 0, &pattern(3, 8192)).unwrap();
        s.set_applied(pg(1), 3).unwrap();
        assert_eq!(read1(&mut s), pattern(3, 8192));
        s.snapshot_write(pg(0), 7, obj(2), 0, &pattern(9, 8192))
            .unwrap();
        assert_eq!(read1(&mut s), pattern(3, 8192));
        s.install_snapshot(pg(0), 40, 3, &conf(&[1, 2, 4])).unwrap();
        assert_eq!(read1(&mut s), pattern(3, 8192), "background {background}");
        s.commit().unwrap();
        s.write_object(pg(1), obj(5), 0, &pattern(4, 8192)).unwrap();
        s.set_applied(pg(1), 4).unwrap();
        let _ = s.flush_poll().unwrap();
        assert_eq!(read1(&mut s), pattern(4, 8192), "background {background}");
        s.flush().unwrap();
        assert_eq!(read1(&mut s), pattern(4, 8192), "background {background}");
    }
}

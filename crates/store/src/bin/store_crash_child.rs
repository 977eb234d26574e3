//! Child process of `tests/crash_real.rs`: drives the engine on a real file through the
//! io_uring disk and prints every durable step to stdout, until it is SIGKILLed.
//!
//! Usage: `store-crash-child <path> <round>`. Output lines:
//! - `READY`
//! - `C <pg> <index> <op>`: entry `index` of PG `pg`, data `pattern(op)`, is durable.
//! - `F <op>`: every object write up to op `op` is flushed.
// raft-rs messages (rust-protobuf) are built field by field, as raft-rs itself does.
#![allow(clippy::field_reassign_with_default)]

use fastblock_store::{ObjectId, Store, StoreOptions, UringOptions};
use fastblock_types::{ImageId, PgId, PoolId};
use raft::eraftpb::Entry;
use std::io::Write;
use std::path::PathBuf;

pub const PGS: u32 = 4;
pub const BLOCKS_PER_OBJECT: u64 = 32;

/// 4 KiB whose first 8 bytes are `op`; the rest derives from it.
pub fn pattern(op: u64) -> Vec<u8> {
    let mut v: Vec<u8> = (0..4096u64)
        .map(|i| (op.wrapping_mul(0x9E37_79B9).wrapping_add(i * 13) >> 5) as u8)
        .collect();
    v[..8].copy_from_slice(&op.to_le_bytes());
    v
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(path), Some(round)) = (args.next(), args.next()) else {
        eprintln!("usage: store-crash-child <path> <round>");
        std::process::exit(2);
    };
    let round: u64 = round.parse().expect("round is a number");
    let path = PathBuf::from(path);
    let mut s = Store::open_path(
        &path,
        None,
        None,
        UringOptions::default(),
        StoreOptions::default(),
    )
    .unwrap_or_else(|e| panic!("open failed: {e}"));
    let out = std::io::stdout();
    let mut out = out.lock();
    writeln!(out, "READY").expect("stdout");
    let object = ObjectId {
        image: ImageId(1),
        index: round,
    };
    for k in 0u64.. {
        let op = round * 1_000_000 + k;
        let pg = PgId::new(PoolId(1), (k % u64::from(PGS)) as u32);
        let index = s.log_bounds(pg).1 + 1;
        let mut e = Entry::default();
        e.index = index;
        e.term = 1;
        e.data = pattern(op).into();
        s.append_entries(pg, &[e]).expect("append");
        s.commit().expect("commit");
        writeln!(out, "C {} {index} {op}", pg.seq).expect("stdout");
        s.write_object(pg, object, (k % BLOCKS_PER_OBJECT) * 4096, &pattern(op))
            .expect("apply");
        s.set_applied(pg, index).expect("applied");
        if k % 16 == 15 {
            s.flush().expect("flush");
            writeln!(out, "F {op}").expect("stdout");
            for p in 0..PGS {
                let pg = PgId::new(PoolId(1), p);
                let to = s.flushed_applied_index(pg).saturating_sub(2);
                s.compact(pg, to).expect("compact");
            }
            s.commit().expect("commit");
        }
    }
}

//! Signals delivered to a thread blocked in io_uring (a profiler, ptrace, SIGCHLD) interrupt
//! the wait; the disk must wait again, not lose completions or report an I/O error.

use fastblock_store::disk::SyncMode;
use fastblock_store::{Disk, UringDisk, UringOptions};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

extern "C" fn ignore(_: libc::c_int) {}

#[test]
fn interrupted_waits_are_retried() {
    // The default (RWF_DSYNC writes) and the mode with the most waits (write, then fsync).
    for mode in [SyncMode::DsyncWrites, SyncMode::TwoStep] {
        writes_survive_signals(mode);
    }
}

fn writes_survive_signals(sync_mode: SyncMode) {
    let dir = std::env::temp_dir().join(format!(
        "fastblock-uring-sig-{}-{sync_mode:?}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("disk");
    std::fs::File::create(&path)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let options = UringOptions {
        sync_mode,
        ..UringOptions::default()
    };
    let mut disk = UringDisk::open(&path, options).unwrap();
    if !disk.uses_io_uring() {
        eprintln!("io_uring unavailable here; the fallback path has no such wait");
        return;
    }
    // SAFETY: installs a no-op handler (without SA_RESTART, so blocking calls see EINTR).
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = ignore as extern "C" fn(libc::c_int) as usize;
        libc::sigaction(libc::SIGUSR1, &action, std::ptr::null_mut());
    }
    // SAFETY: pthread_self is always valid for the calling thread.
    let me = unsafe { libc::pthread_self() } as usize;
    let stop = Arc::new(AtomicBool::new(false));
    let pester = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                // SAFETY: the target thread outlives this loop (joined below).
                unsafe { libc::pthread_kill(me as libc::pthread_t, libc::SIGUSR1) };
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
        })
    };
    let mut buf = fastblock_store::disk::AlignedBuf::zeroed(1 << 20);
    for i in 0..200u64 {
        buf[0] = i as u8;
        disk.write((i % 64) << 20, &buf, true)
            .expect("write survives signals");
    }
    stop.store(true, Ordering::Relaxed);
    pester.join().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

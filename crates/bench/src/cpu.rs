//! CPU time of this process (all threads, user + system), for the CPU cost per IO that the
//! benchmark kit reports next to the OSDs' own (`bench/run.sh` reads theirs from /proc).

use std::time::Duration;

/// User and system CPU time used so far by every thread of this process; `None` if the
/// kernel refuses (it does not on Linux).
pub fn process_cpu() -> Option<Duration> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a `rusage` into the pointer we pass, which points at a
    // properly sized and aligned value; it reads nothing from it.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: getrusage returned 0, so it filled the whole struct (and it was zeroed before).
    let usage = unsafe { usage.assume_init() };
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    Some(time(usage.ru_utime) + time(usage.ru_stime))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_grows_with_work() {
        let before = process_cpu().expect("getrusage works on Linux");
        let mut x = 0u64;
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_millis(30) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let after = process_cpu().expect("getrusage works on Linux");
        assert!(after > before, "{before:?} -> {after:?}");
    }
}

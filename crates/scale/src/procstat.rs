//! CPU time and memory of a local process, from `/proc/<pid>/stat` and `/proc/<pid>/status`.

use serde::Serialize;

#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct ProcSample {
    /// User plus system CPU seconds since the process started.
    pub cpu_secs: f64,
    /// Resident set now (`VmRSS`).
    pub rss_bytes: u64,
    /// Peak resident set since the process started (`VmHWM`).
    pub rss_peak_bytes: u64,
}

/// A sample of `pid`, or `None` once it is gone.
pub fn sample(pid: u32) -> Option<ProcSample> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after the name.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf reads a constant of the system and has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .map_or(0, |k| k * 1024)
    };
    Some(ProcSample {
        cpu_secs: ticks as f64 / hz,
        rss_bytes: kib("VmRSS:"),
        rss_peak_bytes: kib("VmHWM:"),
    })
}

/// `pid` runs (exists and is not a zombie waiting to be reaped).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let state = s.rsplit_once(')')?.1.split_whitespace().next()?.to_string();
            Some(state != "Z" && state != "X")
        })
        .unwrap_or(false)
}

/// The children of `pid` (the monitor's etcd member), found by their parent in `/proc`.
pub fn children(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|s| {
                    let after = s.rsplit_once(')')?.1.to_string();
                    after.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn this_process_has_cpu_and_memory() {
        let s = super::sample(std::process::id()).expect("own /proc entry");
        assert!(s.rss_bytes > 0 && s.rss_peak_bytes >= s.rss_bytes, "{s:?}");
    }
}

//! `-m CORES`: the reference's core list (one bench worker per listed core) and the pinning of
//! a worker's threads to its core.
//!
//! The reference is an SPDK app, so `-m` takes what SPDK's `spdk_cpuset_parse` takes: a list
//! in brackets with ranges (`[16,17]`, `[0-3,8]`) or a hex mask (`0x30000`). We also take a
//! list without brackets (`16,17`, `0-3`), which SPDK would reject. A bare number (`16`) is
//! refused: SPDK reads it as a hex mask (cores 1, 2 and 4), a user probably means core 16, and
//! guessing either way silently benchmarks other cores than intended.
//!
//! Like SPDK's cpuset, the list is a set: repeated cores count once, workers run in core order.

use std::collections::BTreeSet;

/// Highest core number plus one, as in SPDK (`SPDK_CPUSET_SIZE`) and glibc's `CPU_SETSIZE`.
pub const CORE_COUNT_MAX: usize = 1024;

/// Parses `-m`. Returns the cores in ascending order, at least one.
pub fn parse_core_list(text: &str) -> Result<Vec<usize>, String> {
    let text = text.trim();
    // No need to repeat the value in the errors: clap names the flag and the value.
    let cores: BTreeSet<usize> =
        if let Some(hex) = text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
            parse_mask(hex)?
        } else if let Some(inner) = text.strip_prefix('[') {
            let Some(inner) = inner.strip_suffix(']') else {
                return Err("a list opened with [ must end with ]".to_string());
            };
            parse_list(inner)?
        } else if text.contains(',') || text.contains('-') {
            parse_list(text)?
        } else {
            return Err(format!(
                "ambiguous: write [{text}] for core {text} or 0x{text} for a hex mask of cores"
            ));
        };
    if cores.is_empty() {
        return Err("names no core".to_string());
    }
    Ok(cores.into_iter().collect())
}

fn parse_mask(hex: &str) -> Result<BTreeSet<usize>, String> {
    if hex.is_empty() {
        return Err("an empty hex mask".to_string());
    }
    let mut cores = BTreeSet::new();
    // The last digit holds cores 0-3, the one before it 4-7, and so on.
    for (position, c) in hex.chars().rev().enumerate() {
        let Some(digit) = c.to_digit(16) else {
            return Err(format!("{c:?} is not a hex digit"));
        };
        for bit in 0..4 {
            if digit & (1 << bit) != 0 {
                let core = position * 4 + bit;
                if core >= CORE_COUNT_MAX {
                    return Err(format!("core {core} is not below {CORE_COUNT_MAX}"));
                }
                cores.insert(core);
            }
        }
    }
    Ok(cores)
}

fn parse_core(text: &str) -> Result<usize, String> {
    let text = text.trim();
    let core: usize = text
        .parse()
        .map_err(|_| format!("{text:?} is not a core number"))?;
    if core >= CORE_COUNT_MAX {
        return Err(format!("core {core} is not below {CORE_COUNT_MAX}"));
    }
    Ok(core)
}

fn parse_list(inner: &str) -> Result<BTreeSet<usize>, String> {
    let mut cores = BTreeSet::new();
    for item in inner.split(',') {
        match item.split_once('-') {
            Some((low, high)) => {
                let (low, high) = (parse_core(low)?, parse_core(high)?);
                if low > high {
                    return Err(format!("the range {low}-{high} runs backwards"));
                }
                cores.extend(low..=high);
            }
            None => {
                cores.insert(parse_core(item)?);
            }
        }
    }
    Ok(cores)
}

/// The cores this process may run on (its affinity mask: the machine's cores less what
/// taskset or a cgroup took away). `None` if the kernel refuses to say.
pub fn available_cores() -> Option<BTreeSet<usize>> {
    // SAFETY: cpu_set_t is a plain bit array; all zeroes is a valid (empty) set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: we pass the size of the set we own; the kernel writes at most that many bytes.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return None;
    }
    // SAFETY: CPU_ISSET reads the set we own, for cores below its size.
    Some(
        (0..CORE_COUNT_MAX)
            .filter(|&core| unsafe { libc::CPU_ISSET(core, &set) })
            .collect(),
    )
}

/// Pins the calling thread to `core`.
pub fn pin_current_thread(core: usize) -> std::io::Result<()> {
    assert!(core < CORE_COUNT_MAX, "core {core} beyond the cpu set");
    // SAFETY: as in `available_cores`; CPU_SET writes a bit of the set we own.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    unsafe { libc::CPU_SET(core, &mut set) };
    // SAFETY: pid 0 is the calling thread; the set is ours and fully initialised.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The core the calling thread runs on now (`None` if the kernel refuses to say).
pub fn current_core() -> Option<usize> {
    // SAFETY: sched_getcpu takes no arguments and touches no memory of ours.
    let core = unsafe { libc::sched_getcpu() };
    usize::try_from(core).ok()
}

/// Ranges for a one-line list of cores: `0-3,8`.
pub fn format_cores(cores: &[usize]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cores.len() {
        let mut j = i;
        while j + 1 < cores.len() && cores[j + 1] == cores[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            cores[i].to_string()
        } else {
            format!("{}-{}", cores[i], cores[j])
        });
        i = j + 1;
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_forms_parse() {
        assert_eq!(parse_core_list("[16,17]").unwrap(), [16, 17]);
        assert_eq!(parse_core_list("[0,13,34,35]").unwrap(), [0, 13, 34, 35]);
        assert_eq!(parse_core_list("[0-3,8]").unwrap(), [0, 1, 2, 3, 8]);
        assert_eq!(parse_core_list(" [ 1 , 2 ] ").unwrap(), [1, 2]);
        assert_eq!(parse_core_list("0x8").unwrap(), [3]);
        assert_eq!(parse_core_list("0x30000").unwrap(), [16, 17]);
        assert_eq!(parse_core_list("0XF").unwrap(), [0, 1, 2, 3]);
    }

    #[test]
    fn lists_without_brackets_and_repeats() {
        assert_eq!(parse_core_list("16,17").unwrap(), [16, 17]);
        assert_eq!(parse_core_list("2-4").unwrap(), [2, 3, 4]);
        assert_eq!(
            parse_core_list("[3,1,3]").unwrap(),
            [1, 3],
            "a set, in core order"
        );
    }

    #[test]
    fn bad_lists_say_why() {
        let err = |t: &str| parse_core_list(t).unwrap_err();
        assert!(err("16").contains("ambiguous"), "{}", err("16"));
        assert!(err("[16").contains("must end with ]"));
        assert!(err("[]").contains("not a core number"));
        assert!(err("[a]").contains("not a core number"));
        assert!(err("[5-2]").contains("backwards"));
        assert!(err("[1024]").contains("not below 1024"));
        assert!(err("0x").contains("empty hex mask"));
        assert!(err("0xg").contains("not a hex digit"));
        assert!(err("0x0").contains("names no core"));
    }

    #[test]
    fn core_lists_print_as_ranges() {
        assert_eq!(format_cores(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(format_cores(&[5]), "5");
        assert_eq!(format_cores(&[]), "");
    }

    #[test]
    fn a_thread_pins_to_an_available_core() {
        let available = available_cores().expect("sched_getaffinity works on Linux");
        let core = *available
            .iter()
            .next()
            .expect("this process runs somewhere");
        std::thread::spawn(move || {
            pin_current_thread(core).unwrap();
            assert_eq!(current_core(), Some(core));
        })
        .join()
        .unwrap();
    }
}

//! Sizes. Byte counts are `u64` with a `_bytes` suffix in names; human input such as `10G` or
//! `512M` uses binary multiples (K = 1024), as `rbd` and `qemu-img` do.

/// The device sector: the unit of O_DIRECT alignment and of torn writes.
pub const SECTOR_SIZE_BYTES: u64 = 512;
/// The block size fastblock exposes to block-device frontends and checksums on disk.
pub const BLOCK_SIZE_BYTES: u64 = 4096;

// A block must be a whole number of sectors, or a torn sector could split a checksummed block.
const _: () = assert!(BLOCK_SIZE_BYTES % SECTOR_SIZE_BYTES == 0);

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;
pub const TIB: u64 = 1 << 40;
pub const PIB: u64 = 1 << 50;

/// Error of [`parse_size`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SizeParseError {
    #[error("empty size")]
    Empty,
    #[error(
        "invalid size {0:?}: expected a number with an optional unit (K, M, G, T, P), e.g. 10G"
    )]
    Invalid(String),
    #[error("size {0:?} does not fit in 64 bits")]
    Overflow(String),
}

/// Parses `4096`, `4K`, `4KiB`, `10G`, `1.5G` (fractions are allowed only where the result is a
/// whole number of bytes). Units are binary: `1K` = 1024.
pub fn parse_size(input: &str) -> Result<u64, SizeParseError> {
    let s = input.trim();
    if s.is_empty() {
        return Err(SizeParseError::Empty);
    }
    let invalid = || SizeParseError::Invalid(input.to_string());
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let multiplier = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "K" | "KB" | "KIB" => KIB,
        "M" | "MB" | "MIB" => MIB,
        "G" | "GB" | "GIB" => GIB,
        "T" | "TB" | "TIB" => TIB,
        "P" | "PB" | "PIB" => PIB,
        _ => return Err(invalid()),
    };
    if number.is_empty() {
        return Err(invalid());
    }
    match number.split_once('.') {
        None => {
            let n: u64 = number.parse().map_err(|_| invalid())?;
            n.checked_mul(multiplier)
                .ok_or_else(|| SizeParseError::Overflow(input.to_string()))
        }
        Some((whole, frac)) => {
            if frac.is_empty() || frac.contains('.') || frac.len() > 9 {
                return Err(invalid());
            }
            let whole: u64 = if whole.is_empty() {
                0
            } else {
                whole.parse().map_err(|_| invalid())?
            };
            let frac_digits: u64 = frac.parse().map_err(|_| invalid())?;
            let scale = 10u64.pow(frac.len() as u32);
            let overflow = || SizeParseError::Overflow(input.to_string());
            let whole_bytes = whole.checked_mul(multiplier).ok_or_else(overflow)?;
            let frac_scaled = (frac_digits as u128) * (multiplier as u128);
            if frac_scaled % (scale as u128) != 0 {
                return Err(invalid());
            }
            let frac_bytes = u64::try_from(frac_scaled / scale as u128).map_err(|_| overflow())?;
            whole_bytes.checked_add(frac_bytes).ok_or_else(overflow)
        }
    }
}

/// Formats a byte count with the largest binary unit that keeps it readable: `10 GiB`,
/// `1.5 MiB`, `512 B`. At most two decimals, trailing zeros trimmed.
pub fn format_size(bytes: u64) -> String {
    format_scaled(
        bytes as f64,
        &["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"],
        " ",
    )
}

/// Formats a rate in the reference system's `status` units: `B/s, kB/s, MB/s, GB/s, TB/s`
/// (1024-based), two decimals at most, trailing zeros trimmed.
pub fn format_rate(bytes_per_sec: f64) -> String {
    format_scaled(bytes_per_sec, &["B/s", "kB/s", "MB/s", "GB/s", "TB/s"], " ")
}

fn format_scaled(mut value: f64, units: &[&str], sep: &str) -> String {
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < units.len() {
        value /= 1024.0;
        unit += 1;
    }
    let mut text = format!("{value:.2}");
    if text.contains('.') {
        while text.ends_with('0') {
            text.pop();
        }
        if text.ends_with('.') {
            text.pop();
        }
    }
    format!("{text}{sep}{}", units[unit])
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_plain_and_suffixed_sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("512M"), Ok(512 * MIB));
        assert_eq!(parse_size("10G"), Ok(10 * GIB));
        assert_eq!(parse_size("10GiB"), Ok(10 * GIB));
        assert_eq!(parse_size("1.5G"), Ok(3 * GIB / 2));
        assert_eq!(parse_size(" 2T "), Ok(2 * TIB));
    }

    #[test]
    fn rejects_garbage_and_overflow() {
        assert_eq!(parse_size(""), Err(SizeParseError::Empty));
        assert!(matches!(parse_size("G"), Err(SizeParseError::Invalid(_))));
        assert!(matches!(parse_size("10X"), Err(SizeParseError::Invalid(_))));
        assert!(matches!(parse_size("-1"), Err(SizeParseError::Invalid(_))));
        assert!(matches!(
            parse_size("1.2.3K"),
            Err(SizeParseError::Invalid(_))
        ));
        assert!(matches!(
            parse_size("0.0001K"),
            Err(SizeParseError::Invalid(_))
        ));
        assert!(matches!(
            parse_size("99999999P"),
            Err(SizeParseError::Overflow(_))
        ));
    }

    #[test]
    fn formats_sizes_and_rates() {
        assert_eq!(format_size(512), "512 B");
        assert_eq!(format_size(10 * GIB), "10 GiB");
        assert_eq!(format_size(3 * MIB / 2), "1.5 MiB");
        assert_eq!(format_rate(0.0), "0 B/s");
        assert_eq!(format_rate(1.2 * 1024.0 * 1024.0), "1.2 MB/s");
    }

    proptest! {
        #[test]
        fn whole_numbers_round_trip(n in 0u64..1_000_000, unit in 0usize..5) {
            let suffix = ["", "K", "M", "G", "T"][unit];
            let mult = [1, KIB, MIB, GIB, TIB][unit];
            prop_assert_eq!(parse_size(&format!("{n}{suffix}")), Ok(n * mult));
        }

        #[test]
        fn never_panics(s in ".{0,24}") {
            let _ = parse_size(&s);
        }
    }
}

/// Error of [`parse_duration_ms`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid duration {0:?}: expected a number with a unit (ms, s, m, h), e.g. 500ms or 10s")]
pub struct DurationParseError(pub String);

/// Parses `500ms`, `10s`, `2m`, `1h` (a bare number means seconds) into milliseconds.
pub fn parse_duration_ms(input: &str) -> Result<u64, DurationParseError> {
    let s = input.trim();
    let bad = || DurationParseError(input.to_string());
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let n: u64 = number.parse().map_err(|_| bad())?;
    let mult = match unit {
        "ms" => 1,
        "" | "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(bad()),
    };
    n.checked_mul(mult).ok_or_else(bad)
}

/// A duration command-line argument (`parse_duration_ms`), for clap's `value_parser`.
pub fn duration_arg(input: &str) -> Result<std::time::Duration, String> {
    parse_duration_ms(input)
        .map(std::time::Duration::from_millis)
        .map_err(|e| e.to_string())
}

/// An interval command-line argument: a duration greater than zero (a timer of 0 would spin
/// or panic), for clap's `value_parser`.
pub fn interval_arg(input: &str) -> Result<std::time::Duration, String> {
    let d = duration_arg(input)?;
    if d.is_zero() {
        return Err(format!(
            "{input:?} is zero: an interval must be at least 1ms"
        ));
    }
    Ok(d)
}

#[cfg(test)]
mod duration_tests {
    use super::*;

    #[test]
    fn intervals_must_be_positive() {
        assert_eq!(
            interval_arg("100ms"),
            Ok(std::time::Duration::from_millis(100))
        );
        assert!(interval_arg("0").unwrap_err().contains("zero"));
        assert!(interval_arg("0ms").is_err());
        assert_eq!(duration_arg("0s"), Ok(std::time::Duration::ZERO));
        assert!(duration_arg("soon").is_err());
    }

    #[test]
    fn parses_durations() {
        assert_eq!(parse_duration_ms("500ms"), Ok(500));
        assert_eq!(parse_duration_ms("10s"), Ok(10_000));
        assert_eq!(parse_duration_ms("10"), Ok(10_000));
        assert_eq!(parse_duration_ms("2m"), Ok(120_000));
        assert!(parse_duration_ms("").is_err());
        assert!(parse_duration_ms("5x").is_err());
        assert!(parse_duration_ms("-5s").is_err());
    }
}

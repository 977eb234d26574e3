//! Latency statistics and the reference's report lines.
//!
//! Latencies are recorded in whole microseconds in an hdrhistogram with 4 significant digits:
//! exact to 1 µs below 32.768 ms and within 0.01% above (to 60 s). Unlike the reference, whose
//! final percentiles are derived from per-interval ones, the final percentiles here come from
//! one histogram of every post-warm-up IO. The mean uses the exact nanosecond sum.

use hdrhistogram::Histogram;
use serde::Serialize;
use std::time::Duration;

/// Highest latency the histogram holds; slower IOs are recorded as this (the client's own
/// deadline is 30 s).
const LATENCY_US_MAX: u64 = 60_000_000;
const SIGNIFICANT_DIGITS: u8 = 4;
/// The percentiles the reference prints, in its order.
pub const QUANTILES: [(&str, f64); 6] = [
    ("p0.1", 0.1),
    ("p0.5", 0.5),
    ("p0.9", 0.9),
    ("p0.95", 0.95),
    ("p0.99", 0.99),
    ("p0.999", 0.999),
];

/// Latencies of a set of IOs.
#[derive(Clone, Debug)]
pub struct Latencies {
    histogram: Histogram<u64>,
    sum_nanos: u128,
}

impl Default for Latencies {
    fn default() -> Self {
        Latencies {
            histogram: Histogram::new_with_bounds(1, LATENCY_US_MAX, SIGNIFICANT_DIGITS)
                .expect("constant histogram bounds are valid"),
            sum_nanos: 0,
        }
    }
}

impl Latencies {
    pub fn record(&mut self, latency: Duration) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.histogram
            .saturating_record(micros.clamp(1, LATENCY_US_MAX));
        self.sum_nanos += latency.as_nanos();
    }

    pub fn count(&self) -> u64 {
        self.histogram.len()
    }

    pub fn mean_us(&self) -> f64 {
        match self.count() {
            0 => 0.0,
            n => self.sum_nanos as f64 / n as f64 / 1000.0,
        }
    }

    fn quantile_us(&self, q: f64) -> u64 {
        match self.count() {
            0 => 0,
            _ => self.histogram.value_at_quantile(q),
        }
    }

    /// Points of the cumulative distribution: the latency at every percent, then finer steps
    /// through the tail (99.1 ... 99.9, 99.95, 99.99, max). Empty without IOs.
    pub fn cdf(&self) -> Vec<(u64, f64)> {
        if self.count() == 0 {
            return Vec::new();
        }
        let mut quantiles: Vec<f64> = (1..=99).map(|p| f64::from(p) / 100.0).collect();
        quantiles.extend((1..=9).map(|p| 0.99 + f64::from(p) / 1000.0));
        quantiles.extend([0.9995, 0.9999, 1.0]);
        quantiles
            .into_iter()
            .map(|q| (self.histogram.value_at_quantile(q), q))
            .collect()
    }

    /// Adds `other`'s IOs to these (another worker's, for the total of a phase).
    pub fn add(&mut self, other: &Latencies) {
        // Both histograms have the same constant bounds, so adding cannot fail.
        self.histogram
            .add(&other.histogram)
            .expect("histograms of equal bounds add");
        self.sum_nanos += other.sum_nanos;
    }

    pub fn reset(&mut self) {
        self.histogram.reset();
        self.sum_nanos = 0;
    }

    /// The figures of this set of IOs over `duration` (0 IOPS for an empty duration).
    pub fn summary(&self, duration: Duration, total_io_count: u64) -> Summary {
        let count = self.count();
        let seconds = duration.as_secs_f64();
        Summary {
            mean_us: self.mean_us(),
            percentiles_us: QUANTILES.map(|(_, q)| self.quantile_us(q)),
            min_us: if count == 0 { 0 } else { self.histogram.min() },
            max_us: if count == 0 { 0 } else { self.histogram.max() },
            stdev_us: if count == 0 {
                0.0
            } else {
                self.histogram.stdev()
            },
            iops: if seconds > 0.0 {
                count as f64 / seconds
            } else {
                0.0
            },
            iops_dur_sec: seconds,
            measured_io_count: count,
            total_io_count,
        }
    }
}

/// Figures of one phase or one interval.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    pub mean_us: f64,
    /// At [`QUANTILES`], in that order.
    pub percentiles_us: [u64; 6],
    pub min_us: u64,
    pub max_us: u64,
    /// Population ("biased") standard deviation.
    pub stdev_us: f64,
    /// Measured IOs per second of the measured time.
    pub iops: f64,
    pub iops_dur_sec: f64,
    /// IOs after the warm-up: what the latency figures cover.
    pub measured_io_count: u64,
    /// All IOs completed, warm-up included.
    pub total_io_count: u64,
}

fn percentile_list(s: &Summary) -> String {
    QUANTILES
        .iter()
        .zip(s.percentiles_us)
        .map(|((name, _), value)| format!("{name}: {value}us"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The reference's periodic line.
pub fn interval_line(s: &Summary) -> String {
    format!(
        "{}, mean: {:.3}us, min: {}us, max: {}us, biased stdv: {:.3}, iops: {:.0}, \
         iops_dur_sec: {:.2}s, total_io_count: {}",
        percentile_list(s),
        s.mean_us,
        s.min_us,
        s.max_us,
        s.stdev_us,
        s.iops,
        s.iops_dur_sec,
        s.total_io_count
    )
}

/// The reference's final block for one phase (`name` is "write" or "read").
pub fn final_block(name: &str, s: &Summary) -> String {
    let banner = match name {
        "read" => {
            "===============================[read  latency]========================================"
        }
        _ => {
            "===============================[write latency]========================================"
        }
    };
    format!(
        "{banner}\nmean: {:.3}us, {}, iops: {:.0}, iops_dur_sec: {:.2}s, total_io_count: {}\n{}",
        s.mean_us,
        percentile_list(s),
        s.iops,
        s.iops_dur_sec,
        s.total_io_count,
        "=".repeat(banner.len())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn latencies(micros: impl IntoIterator<Item = u64>) -> Latencies {
        let mut l = Latencies::default();
        for us in micros {
            l.record(Duration::from_micros(us));
        }
        l
    }

    #[test]
    fn percentiles_are_exact_at_microsecond_precision() {
        let l = latencies(1..=1000);
        let s = l.summary(Duration::from_secs(2), 1000);
        assert_eq!(s.percentiles_us, [100, 500, 900, 950, 990, 999]);
        assert_eq!((s.min_us, s.max_us), (1, 1000));
        assert!((s.mean_us - 500.5).abs() < 1e-9);
        assert!((s.iops - 500.0).abs() < 1e-9);
        // Still 1 µs apart in the tens of milliseconds.
        let l = latencies([20_001, 20_002, 20_003]);
        assert_eq!(
            l.summary(Duration::from_secs(1), 3).percentiles_us[5],
            20_003
        );
    }

    #[test]
    fn the_final_block_matches_the_reference_layout() {
        let s = Summary {
            mean_us: 126.596,
            percentiles_us: [90, 120, 150, 170, 250, 900],
            min_us: 50,
            max_us: 3000,
            stdev_us: 20.0,
            iops: 7894.6,
            iops_dur_sec: 12.666,
            measured_io_count: 100_000,
            total_io_count: 100_000,
        };
        let expected = "\
===============================[write latency]========================================
mean: 126.596us, p0.1: 90us, p0.5: 120us, p0.9: 150us, p0.95: 170us, p0.99: 250us, p0.999: 900us, iops: 7895, iops_dur_sec: 12.67s, total_io_count: 100000
======================================================================================";
        assert_eq!(final_block("write", &s), expected);
        let read = final_block("read", &s);
        assert!(read.starts_with("===============================[read  latency]====="));
        let lines: Vec<&str> = read.lines().collect();
        assert_eq!(lines[0].len(), lines[2].len());
        assert_eq!(
            interval_line(&s),
            "p0.1: 90us, p0.5: 120us, p0.9: 150us, p0.95: 170us, p0.99: 250us, p0.999: 900us, \
             mean: 126.596us, min: 50us, max: 3000us, biased stdv: 20.000, iops: 7895, \
             iops_dur_sec: 12.67s, total_io_count: 100000"
        );
    }

    #[test]
    fn the_cdf_climbs_to_the_maximum() {
        let l = latencies(1..=1000);
        let cdf = l.cdf();
        assert_eq!(cdf.first(), Some(&(10, 0.01)));
        assert_eq!(cdf.last(), Some(&(1000, 1.0)));
        assert!(cdf.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 < w[1].1));
        assert!(Latencies::default().cdf().is_empty());
    }

    #[test]
    fn empty_sets_print_zeros() {
        let s = Latencies::default().summary(Duration::ZERO, 0);
        assert_eq!(s.percentiles_us, [0; 6]);
        assert_eq!(s.iops, 0.0);
        assert!(final_block("read", &s).contains("iops: 0,"));
    }
}

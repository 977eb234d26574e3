//! The measurement-only WAL mode without device flushes (`--wal-sync no-flush-benchmark-only`,
//! [`SyncMode::NoFlushBenchmarkOnly`]): the OSD acknowledges writes its disk never flushed, so
//! a power loss or host crash loses them. It exists so that `bench/run.sh` can show
//! fastblock's own latency and CPU without the device's flush time, beside the durable
//! figures. Nobody should run it unknowingly: the OSD takes it only when the environment
//! acknowledges the loss ([`check`]), and then says so at start and every
//! [`WARNING_INTERVAL`] in its log ([`warn`]) and in `fastblock_osd_wal_flush_skipped` on
//! `/metrics`.

use crate::SyncMode;
use std::ffi::OsStr;
use std::time::Duration;

/// The environment variable that must hold [`ACKNOWLEDGEMENT`] for the mode to be taken.
pub const ACKNOWLEDGEMENT_VAR: &str = "FASTBLOCK_BENCHMARK_ONLY_SKIP_FLUSH";
/// The only value of [`ACKNOWLEDGEMENT_VAR`] that is taken.
pub const ACKNOWLEDGEMENT: &str = "acknowledged-writes-may-be-lost";
/// How often a running OSD in this mode repeats its warning.
pub const WARNING_INTERVAL: Duration = Duration::from_secs(60);

/// The mode was asked for without the acknowledgement.
#[derive(Debug, thiserror::Error)]
#[error(
    "--wal-sync no-flush-benchmark-only never flushes the disk: writes are acknowledged before \
     they are durable and a power loss loses them. It is for benchmarks only (bench/run.sh) \
     and needs {ACKNOWLEDGEMENT_VAR}={ACKNOWLEDGEMENT} in the environment ({found})"
)]
pub struct NotAcknowledged {
    found: String,
}

/// Whether `mode` skips the device flushes.
pub fn skips_flushes(mode: SyncMode) -> bool {
    mode == SyncMode::NoFlushBenchmarkOnly
}

/// Refuses [`SyncMode::NoFlushBenchmarkOnly`] unless `acknowledgement` (the value of
/// [`ACKNOWLEDGEMENT_VAR`]) is exactly [`ACKNOWLEDGEMENT`]; every other mode passes.
pub fn check(mode: SyncMode, acknowledgement: Option<&OsStr>) -> Result<(), NotAcknowledged> {
    if !skips_flushes(mode) || acknowledgement == Some(OsStr::new(ACKNOWLEDGEMENT)) {
        return Ok(());
    }
    let found = match acknowledgement {
        None => format!("{ACKNOWLEDGEMENT_VAR} is not set"),
        Some(v) => format!(
            "{ACKNOWLEDGEMENT_VAR} is {:?}, not the exact text",
            v.to_string_lossy()
        ),
    };
    Err(NotAcknowledged { found })
}

/// The warning a running OSD in this mode logs at start and every [`WARNING_INTERVAL`].
pub fn warn() {
    tracing::warn!(
        "BENCHMARK-ONLY MODE, NOT FOR DATA: --wal-sync no-flush-benchmark-only skips every \
         device flush; acknowledged writes are lost on power failure \
         ({ACKNOWLEDGEMENT_VAR}={ACKNOWLEDGEMENT})"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_acknowledgement_lets_the_mode_through() {
        let mode = SyncMode::NoFlushBenchmarkOnly;
        assert!(check(mode, Some(OsStr::new(ACKNOWLEDGEMENT))).is_ok());
        let unset = check(mode, None).unwrap_err().to_string();
        assert!(unset.contains("is not set"), "{unset}");
        for wrong in [
            "",
            "1",
            "yes",
            "acknowledged-writes-may-be-lost ",
            "ACKNOWLEDGED-WRITES-MAY-BE-LOST",
        ] {
            let e = check(mode, Some(OsStr::new(wrong)))
                .unwrap_err()
                .to_string();
            assert!(e.contains("not the exact text"), "{wrong:?}: {e}");
            assert!(
                e.contains(ACKNOWLEDGEMENT_VAR) && e.contains(ACKNOWLEDGEMENT),
                "{e}"
            );
        }
        for durable in [
            SyncMode::DsyncWrites,
            SyncMode::TwoStep,
            SyncMode::Fdatasync,
            SyncMode::FdatasyncSyscall,
        ] {
            assert!(check(durable, None).is_ok(), "{durable:?}");
            assert!(!skips_flushes(durable), "{durable:?}");
        }
    }
}

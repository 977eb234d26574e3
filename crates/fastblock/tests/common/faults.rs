//! The test-only disk fault injection of real OSDs (`fastblock-osd --fault-injection-file`,
//! `docs/testing.md`, "Disk fault injection"): turning it on for an OSD, and writing its rules.

use super::OsdProc;
use std::path::Path;

/// The variable an OSD's environment must hold (set to `1`) for it to accept the option.
pub const ALLOW_VAR: &str = "FASTBLOCK_TEST_FAULTS";

/// Gives every later start of `osd` the fault injection file `file` (absent: no faults) and
/// the variable that allows the option. Does not start or restart it.
pub fn use_fault_file(osd: &mut OsdProc, file: &Path) {
    osd.extra_args.extend([
        "--fault-injection-file".to_string(),
        file.display().to_string(),
    ]);
    osd.extra_env.push((ALLOW_VAR.to_string(), "1".to_string()));
}

/// Restarts a just-created OSD with a fault injection file (absent: no faults) and the
/// variable that allows the option, for every later start too.
pub fn with_fault_file(osd: &mut OsdProc, file: &Path) {
    assert!(osd.stop(), "osd {} stops on SIGTERM", osd.id);
    use_fault_file(osd, file);
    osd.start();
}

/// Writes `content` whole, as one rename, so the OSD never reads half of it. An empty
/// `content` clears the faults.
pub fn write_fault_file(path: &Path, content: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, content).expect("writing the fault file");
    std::fs::rename(&tmp, path).expect("renaming the fault file");
}

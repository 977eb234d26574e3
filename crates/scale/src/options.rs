//! The run's parameters (the binary's flags) and their checks, done before any process starts
//! so that a bad flag is an error message, never a half-started cluster.

use crate::error::{Result, ScaleError};
use std::path::PathBuf;
use std::time::Duration;

/// Every knob of a run. Units are in the names.
#[derive(Clone, Debug, clap::Args)]
pub struct Options {
    /// Simulated OSDs booted at the start.
    #[arg(long, default_value_t = 30)]
    pub osds: u32,
    /// Simulated clients following the big pool's map (started once the pool exists).
    #[arg(long, default_value_t = 2)]
    pub clients: u32,
    /// PGs of the pool the scenarios use, at most the monitor's PG_COUNT_MAX (131,072).
    #[arg(long, default_value_t = 4096)]
    pub pg_count: u32,
    /// Replicas per PG.
    #[arg(long, default_value_t = 3)]
    pub pool_size: u32,
    /// OSDs per host name (the failure domain), at most: a tenth of --osds when that is
    /// fewer, at least one. The host stopped in "host down" is the first.
    #[arg(long, default_value_t = 20)]
    pub host_size: u32,
    /// OSDs restarted in the rolling restart (default: every OSD up at that point).
    #[arg(long)]
    pub rolling_restart_osds: Option<u32>,
    /// OSDs restarted together in each step of the rolling restart.
    #[arg(long, default_value_t = 1)]
    pub rolling_restart_batch_osds: u32,
    /// The monitor's --osd-down-after.
    #[arg(long, default_value_t = 5)]
    pub osd_down_after_secs: u64,
    /// The monitor's --osd-out-after (counted from the down mark).
    #[arg(long, default_value_t = 10)]
    pub osd_out_after_secs: u64,
    /// Bound of every wait for the cluster to reach a state.
    #[arg(long, default_value_t = 300)]
    pub wait_secs: u64,
    /// Simulated OSDs registering and booting at once.
    #[arg(long, default_value_t = 16)]
    pub boot_concurrency: u32,
    /// The monitor binary (default: `fastblock-mon` beside this binary, else on PATH).
    #[arg(long)]
    pub mon_bin: Option<PathBuf>,
    /// Keep the monitor's directory (logs, etcd data) after the run, and print where it is.
    #[arg(long)]
    pub keep_dir: bool,
    /// The monitor's log filter (its `RUST_LOG`) in its `mon.log`: `info` logs each snapshot,
    /// election and large commit.
    #[arg(long, default_value = "warn")]
    pub mon_log: String,
}

impl Options {
    /// A small run, as the CI test makes it.
    pub fn small() -> Options {
        Options {
            osds: 12,
            clients: 2,
            pg_count: 128,
            pool_size: 3,
            host_size: 20,
            rolling_restart_osds: Some(3),
            rolling_restart_batch_osds: 1,
            osd_down_after_secs: 3,
            osd_out_after_secs: 4,
            wait_secs: 120,
            boot_concurrency: 8,
            mon_bin: None,
            keep_dir: false,
            mon_log: "warn".into(),
        }
    }

    /// Refuses what no run can do, with the reason.
    pub fn check(&self) -> Result<()> {
        let bad = |m: String| Err(ScaleError::Options(m));
        if self.pool_size == 0 {
            return bad("--pool-size must be at least 1".into());
        }
        if self.host_size == 0 {
            return bad("--host-size must be at least 1".into());
        }
        if self.osds == 0 {
            return bad("--osds must be at least 1".into());
        }
        let hosts = self.osds.div_ceil(self.host_osds());
        // One host is stopped and pushed out; the pool (failure domain host) still needs
        // `pool_size` hosts, so one more than that.
        if hosts <= self.pool_size {
            return bad(format!(
                "--osds {} in hosts of {} OSDs make {hosts} hosts; a pool of --pool-size {} \
                 with failure domain host needs more than {} (one host is stopped)",
                self.osds,
                self.host_osds(),
                self.pool_size,
                self.pool_size
            ));
        }
        let pg_max = fastblock_mon_core::limits::PG_COUNT_MAX;
        if self.pg_count == 0 || self.pg_count > pg_max {
            return bad(format!("--pg-count must be between 1 and {pg_max}"));
        }
        if self.osd_down_after_secs == 0 || self.osd_out_after_secs == 0 {
            return bad("--osd-down-after-secs and --osd-out-after-secs must be at least 1".into());
        }
        if self.rolling_restart_batch_osds == 0 {
            return bad("--rolling-restart-batch-osds must be at least 1".into());
        }
        if self.boot_concurrency == 0 {
            return bad("--boot-concurrency must be at least 1".into());
        }
        if self.wait_secs == 0 {
            return bad("--wait-secs must be at least 1".into());
        }
        Ok(())
    }

    pub fn wait(&self) -> Duration {
        Duration::from_secs(self.wait_secs)
    }

    /// OSDs per host: `--host-size`, or a tenth of the OSDs when that is fewer, at least one
    /// (so that a run of a few dozen OSDs still has hosts enough for failure domain host).
    pub fn host_osds(&self) -> u32 {
        self.host_size.min((self.osds / 10).max(1))
    }

    /// The monitor's --max-pg-per-osd: the default, or twice the even share of PG replicas
    /// when that is larger (the share grows once a host is out), so that the pool the run
    /// needs is not refused at small N.
    pub fn max_pg_per_osd(&self) -> u32 {
        let share = (u64::from(self.pg_count) * u64::from(self.pool_size))
            .div_ceil(u64::from(self.osds.max(1)));
        let want = u32::try_from(share * 2).unwrap_or(u32::MAX);
        want.max(fastblock_mon_core::limits::PG_PER_OSD_MAX_DEFAULT)
    }
}

//! The scenarios, run in order against one monitor, each ending in a settled state that has
//! reached every running daemon, and each giving one [`Row`]:
//!
//! 1. `boot`: N OSDs register and boot;
//! 2. `pool create`: the pool of `--pg-count` PGs, until every PG has a leader; the clients
//!    start following it here;
//! 3. `host down/out`: the first host's OSDs stop (heartbeats and map), until the monitor
//!    marks them down, then out, and every PG has left them;
//! 4. `osd add`: one OSD more on the last host, until the rebalance is done;
//! 5. `image remove`: an image created and removed, until the PG leaders' reclaim is done;
//! 6. `snapshot`: a snapshot of an image in the pool, until it is `created`;
//! 7. `mon restart`: the monitor SIGKILLed (its etcd member dies with it) and started again
//!    on its data; the new leader loads the state, and a change made through it reaches every
//!    daemon as a delta, no OSD marked down meanwhile (a single monitor: its failover is its
//!    restart);
//! 8. `rolling restart`: `--rolling-restart-osds` OSDs stopped until marked down and booted
//!    again, `--rolling-restart-batch-osds` at a time, under `noout`.

use crate::cluster::MonProcess;
use crate::error::{Result, ScaleError};
use crate::figures::{traffic, Check, Moves, Row};
use crate::fleet::Fleet;
use crate::http::{etcd_gauges, histogram, metrics_page, Buckets, DECISIONS, MAP_ANSWERS};
use crate::options::Options;
use crate::procstat;
use fastblock_types::api::{CreateImageRequest, CreatePoolRequest};
use fastblock_types::map::{ClusterMap, FailureDomain, PgInfo, SnapState};
use fastblock_types::{Epoch, OsdId, PoolId};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

const POOL_NAME: &str = "scale";

/// What a run holds between scenarios.
pub struct Run<'a> {
    pub opts: &'a Options,
    pub mon: &'a mut MonProcess,
    pub fleet: Fleet,
    pool: Option<PoolId>,
}

/// The state at a scenario's start, against which its figures are taken.
struct Start {
    at: Instant,
    epoch: Epoch,
    mon_cpu: f64,
    etcd_cpu: Option<f64>,
    harness_cpu: f64,
    /// The monitor's map answer times and decision times so far.
    answers: Option<Buckets>,
    decisions: Option<Buckets>,
}

/// What the scenario's event was, and the epoch that reflects it.
struct Event {
    what: String,
    at: Instant,
    epoch: Epoch,
}

impl<'a> Run<'a> {
    pub fn new(opts: &'a Options, mon: &'a mut MonProcess) -> Run<'a> {
        let fleet = Fleet::new(&mon.api, mon.admin_key.clone());
        Run {
            opts,
            mon,
            fleet,
            pool: None,
        }
    }

    fn etcd_pid(&self) -> Option<u32> {
        procstat::children(self.mon.pid()?).into_iter().next()
    }

    async fn start(&self) -> Start {
        // Read before the CPU figures start.
        let page = metrics_page(&self.mon.api).await;
        let mon = self.mon.pid().and_then(procstat::sample);
        Start {
            answers: histogram(page.as_deref(), MAP_ANSWERS),
            decisions: histogram(page.as_deref(), DECISIONS),
            at: Instant::now(),
            epoch: self.fleet.map().map_or(Epoch(0), |m| m.epoch),
            mon_cpu: mon.map_or(0.0, |s| s.cpu_secs),
            harness_cpu: harness_cpu_secs(),
            etcd_cpu: self
                .etcd_pid()
                .and_then(procstat::sample)
                .map(|s| s.cpu_secs),
        }
    }

    /// The row of a scenario that began at `start` and settled at `settled` (an epoch every
    /// running daemon holds now).
    async fn finish(
        &self,
        name: &str,
        start: Start,
        settled: Epoch,
        event: Event,
        moves: Option<Moves>,
        checks: Vec<Check>,
    ) -> Row {
        let end = Instant::now();
        let counters = self.fleet.live_counters();
        let (full, delta) = traffic(&counters, start.at, end);
        let osd_counters = self.fleet.live_osd_counters();
        let (osd_full, osd_delta) = traffic(&osd_counters, start.at, end);
        let epochs = settled.0.saturating_sub(start.epoch.0);
        let sent = full.bytes + delta.bytes;
        let observed = self.fleet.observed(event.epoch);
        let all = counters
            .iter()
            .map(|c| c.reached(event.epoch))
            .collect::<Option<Vec<_>>>();
        // From the first holder of the epoch (the observer or a daemon) to each daemon, in
        // order: the last is the spread; the median and the 99th tell stragglers from a slow
        // whole.
        let offsets_ms: Option<Vec<f64>> = all.and_then(|v| {
            let first = v.iter().copied().chain(observed).min()?;
            let mut ms: Vec<f64> = v
                .into_iter()
                .map(|t| t.saturating_duration_since(first).as_secs_f64() * 1e3)
                .collect();
            ms.sort_by(f64::total_cmp);
            Some(ms)
        });
        let nth = |q: f64| {
            offsets_ms.as_ref().and_then(|v| {
                let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len().max(1)) - 1;
                v.get(i).copied()
            })
        };
        let spread_ms = nth(1.0);
        let since = |now: Option<Buckets>, before: &Option<Buckets>| match (now, before) {
            (Some(now), Some(before)) => Some(now.since(before)),
            (now, _) => now,
        };
        let mon = self
            .mon
            .pid()
            .and_then(procstat::sample)
            .unwrap_or_default();
        // Read after the CPU figures end.
        let page = metrics_page(&self.mon.api).await;
        let answers = since(histogram(page.as_deref(), MAP_ANSWERS), &start.answers);
        let decisions = since(histogram(page.as_deref(), DECISIONS), &start.decisions);
        let etcd_proc = self.etcd_pid().and_then(procstat::sample);
        Row {
            scenario: name.to_string(),
            event: event.what,
            epochs,
            daemons: counters.len(),
            full,
            delta,
            sent_bytes: sent,
            osds: osd_counters.len(),
            osd_sent_bytes: osd_full.bytes + osd_delta.bytes,
            bytes_per_epoch_per_daemon: sent as f64
                / (epochs.max(1) as f64 * counters.len().max(1) as f64),
            event_ms: observed.map(|o| o.saturating_duration_since(event.at).as_secs_f64() * 1e3),
            spread_ms,
            spread_p50_ms: nth(0.5),
            spread_p99_ms: nth(0.99),
            mon_answers: answers.as_ref().map_or(0, Buckets::total),
            decisions: decisions.as_ref().map_or(0, Buckets::total),
            decide_max_ms: decisions.as_ref().and_then(|d| d.quantile_ms(1.0)),
            mon_answer_p99_ms: answers.as_ref().and_then(|a| a.quantile_ms(0.99)),
            mon_answer_max_ms: answers.as_ref().and_then(|a| a.quantile_ms(1.0)),
            settle_ms: end.duration_since(start.at).as_secs_f64() * 1e3,
            mon_cpu_secs: mon.cpu_secs - start.mon_cpu,
            harness_cpu_secs: harness_cpu_secs() - start.harness_cpu,
            mon,
            etcd_cpu_secs: match (etcd_proc, start.etcd_cpu) {
                (Some(p), Some(c)) => Some(p.cpu_secs - c),
                _ => None,
            },
            etcd_proc,
            etcd: etcd_gauges(page.as_deref()),
            moves,
            checks,
        }
    }

    fn pool(&self) -> Result<PoolId> {
        self.pool
            .ok_or_else(|| ScaleError::Options("the pool scenario did not run".into()))
    }

    fn host_name(&self, ordinal: u32) -> String {
        format!("scale-host-{:04}", ordinal / self.opts.host_osds())
    }

    /// Every running daemon holds `epoch`: a check, and the wait that bounds it.
    async fn reach(&self, epoch: Epoch, checks: &mut Vec<Check>) -> Result<()> {
        let r = self.fleet.wait_all_reach(epoch, self.opts.wait()).await;
        checks.push(Check {
            what: format!("every running daemon holds epoch {epoch}"),
            ok: r.is_ok(),
            detail: r.as_ref().err().map(|e| e.to_string()).unwrap_or_default(),
        });
        r.map(|_| ())
    }

    pub async fn boot(&mut self) -> Result<Row> {
        let start = self.start().await;
        let hosts: Vec<String> = (0..self.opts.osds).map(|i| self.host_name(i)).collect();
        self.fleet
            .add_osds(hosts, self.opts.boot_concurrency as usize)
            .await?;
        let ids: Vec<OsdId> = self.fleet.osds.iter().map(|o| o.id).collect();
        let map = self
            .fleet
            .wait_map("every OSD up", self.opts.wait(), |m| {
                ids.iter()
                    .all(|id| m.osds.get(id).is_some_and(|o| o.up && o.is_in))
            })
            .await?;
        let mut checks = vec![check(
            "every OSD booted is up and in",
            true,
            format!("{} OSDs", ids.len()),
        )];
        self.reach(map.epoch, &mut checks).await?;
        checks.push(deltas_after_first_contact(&self.fleet, start.at));
        let event = Event {
            what: format!("{} OSDs boot; from the first apply-id", ids.len()),
            at: start.at,
            epoch: map.epoch,
        };
        Ok(self
            .finish("boot", start, map.epoch, event, None, checks)
            .await)
    }

    pub async fn pool_create(&mut self) -> Result<Row> {
        let start = self.start().await;
        let req = CreatePoolRequest {
            name: POOL_NAME.into(),
            pg_count: self.opts.pg_count,
            size: self.opts.pool_size,
            failure_domain: FailureDomain::Host,
        };
        let info = self
            .fleet
            .admin
            .create_pool(&req)
            .await
            .map_err(|e| ScaleError::mon(format!("creating pool {POOL_NAME}"), e))?;
        self.pool = Some(info.id);
        let pool = info.id;
        let map = self
            .fleet
            .wait_map("every PG of the pool led", self.opts.wait(), |m| {
                pool_settled(m, pool) && pgs(m, pool).all(|pg| pg.leader.is_some())
            })
            .await?;
        self.fleet
            .add_clients(self.opts.clients, BTreeSet::from([pool]));
        let mut checks = vec![check(
            "every PG of the pool has a leader",
            true,
            format!("{} PGs", pgs(&map, pool).count()),
        )];
        self.reach(map.epoch, &mut checks).await?;
        checks.push(deltas_after_first_contact(&self.fleet, start.at));
        let event = Event {
            what: format!(
                "pool of {} PGs created; from the create call, until every PG is led",
                self.opts.pg_count
            ),
            at: start.at,
            epoch: map.epoch,
        };
        Ok(self
            .finish("pool create", start, map.epoch, event, None, checks)
            .await)
    }

    pub async fn host_down_out(&mut self) -> Result<Row> {
        let pool = self.pool()?;
        let before = self.fleet.map().ok_or_else(no_map)?;
        let host = self.host_name(0);
        let start = self.start().await;
        let mut stopped = BTreeSet::new();
        for osd in self.fleet.osds.iter_mut().filter(|o| o.host == host) {
            osd.stop();
            stopped.insert(osd.id);
        }
        let t_stop = Instant::now();
        let wait = self.opts.wait();
        let down = self
            .fleet
            .wait_map("the stopped host's OSDs marked down", wait, |m| {
                stopped
                    .iter()
                    .all(|id| m.osds.get(id).is_some_and(|o| !o.up))
            })
            .await?;
        let mut checks = vec![check(
            "the stopped OSDs are marked down",
            true,
            format!("{} OSDs of {host}", stopped.len()),
        )];
        self.reach(down.epoch, &mut checks).await?;
        let out = self
            .fleet
            .wait_map("the stopped host's OSDs marked out", wait, |m| {
                stopped
                    .iter()
                    .all(|id| m.osds.get(id).is_some_and(|o| !o.is_in))
            })
            .await?;
        checks.push(check(
            "the stopped OSDs are marked out",
            true,
            format!("at epoch {}", out.epoch),
        ));
        let settled = self
            .fleet
            .wait_map("every PG off the stopped OSDs", wait, |m| {
                pool_settled(m, pool)
                    && pgs(m, pool).all(|pg| !stopped.iter().any(|o| pg.names(*o)))
            })
            .await?;
        checks.push(check("no PG names a stopped OSD", true, String::new()));
        self.reach(settled.epoch, &mut checks).await?;
        checks.push(deltas_after_first_contact(&self.fleet, start.at));
        let moves = moves_out(&before, &settled, pool, &stopped);
        let event = Event {
            what: format!(
                "{} OSDs of one host stop; event from the stop of heartbeats to the down mark \
                 (epoch {}), out at epoch {}",
                stopped.len(),
                down.epoch,
                out.epoch
            ),
            at: t_stop,
            epoch: down.epoch,
        };
        Ok(self
            .finish(
                "host down/out",
                start,
                settled.epoch,
                event,
                Some(moves),
                checks,
            )
            .await)
    }

    pub async fn osd_add(&mut self) -> Result<Row> {
        let pool = self.pool()?;
        let before = self.fleet.map().ok_or_else(no_map)?;
        let start = self.start().await;
        let last = self.host_name(self.opts.osds.saturating_sub(1));
        self.fleet.add_osds(vec![last], 1).await?;
        let new = self.fleet.osds.last().map(|o| o.id).ok_or_else(no_map)?;
        let settled = self
            .fleet
            .wait_map("the rebalance onto the new OSD", self.opts.wait(), |m| {
                m.osds.get(&new).is_some_and(|o| o.up && o.is_in)
                    && pool_settled(m, pool)
                    && pgs(m, pool).any(|pg| pg.names(new))
            })
            .await?;
        let mut checks = vec![check("the new OSD holds PGs", true, format!("osd.{new}"))];
        self.reach(settled.epoch, &mut checks).await?;
        checks.push(deltas_after_first_contact(&self.fleet, start.at));
        let moves = moves_in(&before, &settled, pool, new);
        let boot_epoch = settled
            .osds
            .get(&new)
            .map_or(settled.epoch, |o| o.boot_epoch);
        let event = Event {
            what: format!("osd.{new} boots; event from its apply-id to its boot's epoch"),
            at: start.at,
            epoch: boot_epoch,
        };
        Ok(self
            .finish("osd add", start, settled.epoch, event, Some(moves), checks)
            .await)
    }

    pub async fn image_remove(&mut self) -> Result<Row> {
        self.pool()?;
        let start = self.start().await;
        let image = self.create_image("scale-removed").await?;
        // The observer must see the image before its removal can be told from its absence.
        self.fleet
            .wait_map("the created image in the map", self.opts.wait(), |m| {
                m.images
                    .as_ref()
                    .is_some_and(|t| t.images.contains_key(&image))
            })
            .await?;
        let t_rm = Instant::now();
        self.fleet
            .admin
            .remove_image(POOL_NAME, "scale-removed")
            .await
            .map_err(|e| ScaleError::mon("removing image scale-removed", e))?;
        let recorded = self
            .fleet
            .wait_map("the removal of the image", self.opts.wait(), |m| {
                m.images
                    .as_ref()
                    .is_none_or(|t| !t.images.contains_key(&image))
            })
            .await?;
        let done = self
            .fleet
            .wait_map(
                "the reclaim of the removed image done",
                self.opts.wait(),
                // The removal and its reclaim entry are one commit: past the removal, no
                // entry means every PG confirmed.
                |m| m.epoch >= recorded.epoch && !m.reclaim.values().any(|e| e.image == image),
            )
            .await?;
        let mut checks = vec![check(
            "the reclaim entry is gone (every PG leader confirmed)",
            true,
            format!("image id {image}"),
        )];
        self.reach(done.epoch, &mut checks).await?;
        checks.push(deltas_after_first_contact(&self.fleet, start.at));
        let event = Event {
            what: format!(
                "an image created and removed; event from the remove call to the removal's \
                 epoch ({}), reclaim done at epoch {}",
                recorded.epoch, done.epoch
            ),
            at: t_rm,
            epoch: recorded.epoch,
        };
        Ok(self
            .finish("image remove", start, done.epoch, event, None, checks)
            .await)
    }

    async fn create_image(&self, name: &str) -> Result<fastblock_types::ImageId> {
        let req = CreateImageRequest {
            pool: POOL_NAME.into(),
            name: name.into(),
            size_bytes: 1 << 30,
            object_size_bytes: None,
        };
        let info = self
            .fleet
            .admin
            .create_image(&req)
            .await
            .map_err(|e| ScaleError::mon(format!("creating image {name}"), e))?;
        Ok(info.id)
    }

    pub async fn snapshot(&mut self) -> Result<Row> {
        self.pool()?;
        let image = self.create_image("scale-snapped").await?;
        let start = self.start().await;
        let snap = self
            .fleet
            .admin
            .create_snap(POOL_NAME, "scale-snapped", "s1")
            .await
            .map_err(|e| ScaleError::mon("creating snapshot scale-snapped@s1", e))?;
        let call_ms = start.at.elapsed().as_secs_f64() * 1e3;
        let created = self
            .fleet
            .wait_map("the snapshot created in the map", self.opts.wait(), |m| {
                m.snaps.get(&image).is_some_and(|l| {
                    l.iter()
                        .any(|s| s.id == snap.id && s.state == SnapState::Created)
                })
            })
            .await?;
        let mut checks = vec![check(
            "the snapshot is created",
            snap.state == SnapState::Created,
            format!("{:?} after {call_ms:.0} ms", snap.state),
        )];
        self.reach(created.epoch, &mut checks).await?;
        checks.push(deltas_after_first_contact(&self.fleet, start.at));
        let event = Event {
            what: format!(
                "a snapshot of an image in the pool; the create call answered `created` after \
                 {call_ms:.0} ms; event from the call to the epoch that records it created"
            ),
            at: start.at,
            epoch: created.epoch,
        };
        Ok(self
            .finish("snapshot", start, created.epoch, event, None, checks)
            .await)
    }

    async fn set_noout(&self, on: bool) -> Result<()> {
        self.fleet
            .admin
            .set_flag("noout", on)
            .await
            .map(|_| ())
            .map_err(|e| ScaleError::mon("setting noout", e))
    }

    pub async fn mon_restart(&mut self) -> Result<Row> {
        let mut start = self.start().await;
        let before = self.fleet.map().ok_or_else(no_map)?;
        let mut checks = Vec::new();
        self.reach(before.epoch, &mut checks).await?;
        let wait = self.opts.wait();
        let killed = Instant::now();
        let down_for = self.mon.kill_and_restart(wait).await?;
        // The figures of CPU are the new processes', from their start.
        start.mon_cpu = 0.0;
        start.etcd_cpu = Some(0.0);
        start.answers = None;
        start.decisions = None;
        self.set_noout(true).await?;
        let set = self
            .fleet
            .wait_map("noout set through the restarted monitor", wait, |m| {
                m.flags.noout
            })
            .await?;
        self.set_noout(false).await?;
        let settled = self
            .fleet
            .wait_map("noout cleared", wait, |m| !m.flags.noout)
            .await?;
        self.reach(settled.epoch, &mut checks).await?;
        let marked_down: Vec<OsdId> = before
            .osds
            .values()
            .filter(|o| o.up && settled.osds.get(&o.id).is_some_and(|now| !now.up))
            .map(|o| o.id)
            .collect();
        checks.push(check(
            "no OSD marked down across the monitor's restart",
            marked_down.is_empty(),
            format!("marked down: {marked_down:?}"),
        ));
        checks.push(check(
            "the restarted monitor's state is the one it was killed with",
            set.epoch > before.epoch && set.osds == before.osds && set.pools == before.pools,
            format!("epoch {} before, {} after", before.epoch, set.epoch),
        ));
        checks.push(deltas_after_first_contact(&self.fleet, killed));
        let event = Event {
            what: format!(
                "the monitor SIGKILLed and started again (leading after {:.0} ms); event from the kill to the observer holding a flag set through it",
                down_for.as_secs_f64() * 1e3
            ),
            at: killed,
            epoch: set.epoch,
        };
        Ok(self
            .finish("mon restart", start, settled.epoch, event, None, checks)
            .await)
    }

    pub async fn rolling_restart(&mut self) -> Result<Row> {
        let pool = self.pool()?;
        let start = self.start().await;
        let running: Vec<usize> = (0..self.fleet.osds.len())
            .filter(|i| self.fleet.osds[*i].running())
            .collect();
        let count = self
            .opts
            .rolling_restart_osds
            .map_or(running.len(), |n| (n as usize).min(running.len()));
        self.set_noout(true).await?;
        let wait = self.opts.wait();
        let mut restarted = 0usize;
        let mut worst_down_ms: f64 = 0.0;
        let mut first_down: Option<(Instant, Epoch)> = None;
        for batch in running[..count].chunks(self.opts.rolling_restart_batch_osds as usize) {
            let ids: Vec<OsdId> = batch.iter().map(|i| self.fleet.osds[*i].id).collect();
            for i in batch {
                self.fleet.osds[*i].stop();
            }
            let t_stop = Instant::now();
            let down = self
                .fleet
                .wait_map("restarted OSDs marked down", wait, |m| {
                    ids.iter().all(|id| m.osds.get(id).is_some_and(|o| !o.up))
                })
                .await?;
            let seen = self.fleet.observed(down.epoch).unwrap_or_else(Instant::now);
            worst_down_ms = worst_down_ms.max(seen.duration_since(t_stop).as_secs_f64() * 1e3);
            first_down.get_or_insert((t_stop, down.epoch));
            for i in batch {
                self.fleet.osds[*i].boot().await?;
            }
            self.fleet
                .wait_map("restarted OSDs up again", wait, |m| {
                    ids.iter().all(|id| m.osds.get(id).is_some_and(|o| o.up))
                })
                .await?;
            restarted += batch.len();
        }
        self.set_noout(false).await?;
        let settled = self
            .fleet
            .wait_map("every PG led by an up OSD after the restarts", wait, |m| {
                pool_settled(m, pool)
                    && pgs(m, pool).all(|pg| {
                        pg.leader
                            .is_some_and(|l| m.osds.get(&l).is_some_and(|o| o.up))
                    })
            })
            .await?;
        let mut checks = vec![check(
            "every restarted OSD was marked down and came back up",
            restarted == count,
            format!("{restarted} of {count}"),
        )];
        self.reach(settled.epoch, &mut checks).await?;
        let (t0, e0) = first_down.unwrap_or((start.at, settled.epoch));
        let event = Event {
            what: format!(
                "{count} OSDs restarted, {} at a time, under noout; event: the first stop of \
                 heartbeats to its down mark (slowest down mark of any step: {worst_down_ms:.0} ms)",
                self.opts.rolling_restart_batch_osds
            ),
            at: t0,
            epoch: e0,
        };
        Ok(self
            .finish("rolling restart", start, settled.epoch, event, None, checks)
            .await)
    }
}

fn check(what: &str, ok: bool, detail: String) -> Check {
    Check {
        what: what.to_string(),
        ok,
        detail,
    }
}

fn no_map() -> ScaleError {
    ScaleError::MonStart("the observer holds no map".into())
}

fn pgs(map: &ClusterMap, pool: PoolId) -> impl Iterator<Item = &PgInfo> {
    map.pgmaps
        .get(&pool)
        .into_iter()
        .flat_map(|m| m.pgs.iter().map(|(_, pg)| pg))
}

/// No PG of `pool` is moving: no target and no joint configuration.
fn pool_settled(map: &ClusterMap, pool: PoolId) -> bool {
    map.pgmaps.contains_key(&pool)
        && pgs(map, pool).all(|pg| pg.newosdlist.is_empty() && pg.joint_voters.is_empty())
}

/// Every PG's voters, by sequence number.
fn members(map: &ClusterMap, pool: PoolId) -> BTreeMap<u32, BTreeSet<OsdId>> {
    map.pgmaps
        .get(&pool)
        .map(|m| {
            m.pgs
                .iter()
                .map(|(seq, pg)| (*seq, pg.osdlist.iter().copied().collect()))
                .collect()
        })
        .unwrap_or_default()
}

/// Moves between `before` and `after`, and the least the removal of `gone` needed.
fn moves_out(
    before: &ClusterMap,
    after: &ClusterMap,
    pool: PoolId,
    gone: &BTreeSet<OsdId>,
) -> Moves {
    let (b, a) = (members(before, pool), members(after, pool));
    let mut m = diff(&b, &a);
    for set in b.values() {
        let on = set.intersection(gone).count() as u64;
        m.replicas_min += on;
        m.pgs_min += u64::from(on > 0);
    }
    m
}

/// Moves between `before` and `after`, and the least that gives `new` what it holds after.
fn moves_in(before: &ClusterMap, after: &ClusterMap, pool: PoolId, new: OsdId) -> Moves {
    let (b, a) = (members(before, pool), members(after, pool));
    let mut m = diff(&b, &a);
    let on_new = a.values().filter(|s| s.contains(&new)).count() as u64;
    m.replicas_min = on_new;
    m.pgs_min = on_new;
    m
}

fn diff(b: &BTreeMap<u32, BTreeSet<OsdId>>, a: &BTreeMap<u32, BTreeSet<OsdId>>) -> Moves {
    let mut m = Moves::default();
    for (seq, after) in a {
        let before = b.get(seq).cloned().unwrap_or_default();
        if *after != before {
            m.pgs += 1;
        }
        m.replicas += after.difference(&before).count() as u64;
    }
    m
}

/// Since `since`, every daemon got deltas only after its first answer (`docs/mon-api.md`,
/// "Incremental maps"): the whole map is for first contact. Not checked across the rolling
/// restart, where each restarted OSD makes a new first contact.
fn deltas_after_first_contact(fleet: &Fleet, since: Instant) -> Check {
    let counters = fleet.live_counters();
    let bad = counters
        .iter()
        .filter(|c| c.fulls_after_first(since) > 0)
        .count();
    check(
        "daemons get deltas, not whole maps, after their first answer",
        bad == 0,
        format!("{bad} of {} daemons got a whole map again", counters.len()),
    )
}

/// The run's scenarios in order; stops at the first error, keeping the rows done.
pub async fn run_all(run: &mut Run<'_>, rows: &mut Vec<Row>) -> Result<()> {
    for step in 0..8 {
        let row = match step {
            0 => run.boot().await?,
            1 => run.pool_create().await?,
            2 => run.host_down_out().await?,
            3 => run.osd_add().await?,
            4 => run.image_remove().await?,
            5 => run.snapshot().await?,
            6 => run.mon_restart().await?,
            _ => run.rolling_restart().await?,
        };
        // Progress on stderr (the binary shows this target at info): a large run takes minutes.
        tracing::info!(
            "{} done: {} epochs, settled in {:.1} s",
            row.scenario,
            row.epochs,
            row.settle_ms / 1e3
        );
        rows.push(row);
    }
    Ok(())
}

/// This process's CPU time so far (the simulated OSDs and clients, and the harness itself).
fn harness_cpu_secs() -> f64 {
    procstat::sample(std::process::id()).map_or(0.0, |s| s.cpu_secs)
}

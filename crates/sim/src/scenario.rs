//! Scenario tests: the cases we already know are hard, written step by step over the same
//! simulated cluster (TigerBeetle's `replica_test.zig`, TiKV's network filters). No random
//! faults and no random workload run; the scenario partitions, crashes and sends operations
//! itself, and the image model still checks every read.
//!
//! ```ignore
//! let mut t = Scenario::new(7, 3, 3)?;
//! let old = t.wait_leader()?;
//! t.write(0, old, 0)?;
//! t.isolate(old);
//! ```

use crate::cluster::Cluster;
use crate::node::ClientReply;
use crate::options::{SimOptions, MS, SEC};
use fastblock_types::{OsdId, PgId};
use std::collections::BTreeSet;

pub struct Scenario {
    pub c: Cluster,
    clients: u32,
}

impl Scenario {
    /// A cluster of `nodes` nodes with one PG of `replicas` replicas and the PG timing and
    /// store geometry of `seed`, without faults or workload; two scripted clients (0 and 1).
    pub fn new(seed: u64, nodes: u32, replicas: u32) -> Result<Scenario, String> {
        Self::with_options(seed, nodes, replicas, |_| {})
    }

    /// [`Scenario::new`], with the options adjusted by `adjust` before the cluster starts.
    pub fn with_options(
        seed: u64,
        nodes: u32,
        replicas: u32,
        adjust: impl FnOnce(&mut SimOptions),
    ) -> Result<Scenario, String> {
        let mut o = SimOptions::from_seed(seed);
        o.nodes = nodes;
        o.replicas = replicas;
        o.pg_count = 1;
        o.clients = 0;
        o.objects = 1;
        o.loss_ppm = 0;
        o.dup_ppm = 0;
        o.spike_ppm = 0;
        o.delay_us_min = 100;
        o.delay_us_max = 2 * MS;
        o.tick_jitter_pct = 0;
        o.crash_every_us = 0;
        o.fuse_every_us = 0;
        o.partition_every_us = 0;
        o.slow_every_us = 0;
        o.outin_every_us = 0;
        o.bad_block_every_us = 0;
        o.scrub_every_us = 0;
        // A scenario shrinks the image or takes snapshots itself if it wants to (the seed's
        // times and sizes are for its own image and fault phase).
        o.shrink_at_us = 0;
        o.snap_at_us.clear();
        o.fault_phase_us = u64::MAX / 4;
        adjust(&mut o);
        let trace = std::env::var_os("SIM_TRACE").is_some();
        let mut c = Cluster::new(o, trace)?;
        let mut clients = 0;
        while clients < 2 {
            c.add_scripted_client();
            clients += 1;
        }
        Ok(Scenario { c, clients })
    }

    pub fn pg(&self) -> PgId {
        *self.c.pg_infos().keys().next().expect("one PG")
    }

    pub fn members(&self) -> Vec<OsdId> {
        self.c.members(self.pg())
    }

    /// Runs the simulation for `us` of virtual time.
    pub fn run_for(&mut self, us: u64) -> Result<(), String> {
        let end = self.c.now + us;
        while self.c.next_event_time().is_some_and(|t| t <= end) {
            self.c.step_event()?;
        }
        self.c.now = end;
        Ok(())
    }

    /// Runs until `done` holds (checked after every event) or `us` passed; returns whether
    /// it held.
    pub fn run_until(&mut self, us: u64, done: impl Fn(&Scenario) -> bool) -> Result<bool, String> {
        let end = self.c.now + us;
        while !done(self) {
            match self.c.next_event_time() {
                Some(t) if t <= end => self.c.step_event()?,
                _ => return Ok(false),
            }
        }
        Ok(true)
    }

    /// Whether `node` currently believes it leads the PG.
    pub fn leads(&self, node: OsdId) -> bool {
        self.role(node).is_some_and(|(leads, _)| leads)
    }

    /// The Raft term `node`'s replica of the PG is in (0: none open).
    pub fn term(&self, node: OsdId) -> u64 {
        self.role(node).map_or(0, |(_, term)| term)
    }

    /// Whether `node`'s replica of the PG leads, and its term, if it has one open.
    fn role(&self, node: OsdId) -> Option<(bool, u64)> {
        let pg = self.pg();
        let core = self.c.node(node).core()?;
        core.replica(pg).map(|r| (r.is_leader(), r.term().0))
    }

    /// The members that believe they lead (more than one during a stale leadership).
    pub fn leaders(&self) -> Vec<OsdId> {
        self.members()
            .into_iter()
            .filter(|m| self.leads(*m))
            .collect()
    }

    /// Waits up to 10 s for a leader.
    pub fn wait_leader(&mut self) -> Result<OsdId, String> {
        if !self.run_until(10 * SEC, |s| !s.leaders().is_empty())? {
            return Err("no leader within 10 s".into());
        }
        Ok(self.leaders()[0])
    }

    /// Cuts `nodes` off from the other nodes (clients still reach them: see
    /// [`Scenario::cut_clients`]).
    pub fn isolate(&mut self, nodes: &[OsdId]) {
        self.c
            .set_partition(Some(nodes.iter().copied().collect::<BTreeSet<_>>()));
    }

    /// Cuts the clients off from `nodes` as well: their requests to them wait, as TCP
    /// retransmits them, until [`Scenario::heal`].
    pub fn cut_clients(&mut self, nodes: &[OsdId]) {
        self.c.cut_clients(nodes.iter().copied().collect());
    }

    pub fn heal(&mut self) {
        self.c.set_partition(None);
        self.c.cut_clients(BTreeSet::new());
    }

    /// The file system holding `node`'s metadata has `free_bytes` free, from now on.
    pub fn host_space(&mut self, node: OsdId, free_bytes: u64) {
        self.c.host_space(node, free_bytes);
    }

    fn op(
        &mut self,
        client: u32,
        node: OsdId,
        write: bool,
        block: u64,
    ) -> Result<ClientReply, String> {
        assert!(
            client < self.clients,
            "scenarios have clients 0..{}",
            self.clients
        );
        self.c.submit(client, node, write, 0, block);
        if !self.run_until(5 * SEC, |s| s.c.result(client).is_some())? {
            return Err(format!("client {client}: no outcome within 5 s"));
        }
        Ok(self.c.result(client).cloned().expect("an outcome"))
    }

    /// Client `client` writes a fresh stamp to block `block` at `node`, one attempt.
    pub fn write(&mut self, client: u32, node: OsdId, block: u64) -> Result<ClientReply, String> {
        self.op(client, node, true, block)
    }

    /// Client `client` reads block `block` at `node`, one attempt; the model checks the data.
    pub fn read(&mut self, client: u32, node: OsdId, block: u64) -> Result<ClientReply, String> {
        self.op(client, node, false, block)
    }
}

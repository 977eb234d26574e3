//! Cluster builders and measurements shared by the integration tests.
#![allow(dead_code)]

use fastblock_placement::{load, PoolSpec};
use fastblock_types::map::{FailureDomain, OsdInfo};
use fastblock_types::osd_table::OsdTable;
use fastblock_types::{OsdId, PoolId};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

/// How an OSD is generated: most are in; some are out or still pending creation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    In,
    Out,
    Pending,
}

pub fn osd(id: u32, host: &str, status: Status) -> OsdInfo {
    OsdInfo {
        id: OsdId(id),
        uuid: format!("uuid-{id}"),
        host: host.to_string(),
        address: "127.0.0.1".into(),
        port: 7000,
        shards: 1,
        capacity_bytes: 1 << 40,
        up: id % 5 != 0, // up or down must not matter
        is_in: status != Status::Out,
        pending_create: status == Status::Pending,
        boot_epoch: Default::default(),
        config: String::new(),
        lease_timing: None,
    }
}

/// A cluster from per-host OSD statuses; OSD ids are assigned 1.. in host order, hosts are named
/// `host-<n>`.
pub fn cluster(hosts: &[Vec<Status>]) -> OsdTable {
    let mut osds = OsdTable::new();
    let mut id = 1;
    for (h, statuses) in hosts.iter().enumerate() {
        for &status in statuses {
            osds.insert(OsdId(id), osd(id, &format!("host-{h}"), status));
            id += 1;
        }
    }
    osds
}

pub fn spec(pool: u32, pg_count: u32, size: u32, failure_domain: FailureDomain) -> PoolSpec {
    PoolSpec {
        pool: PoolId(pool),
        pg_count,
        size,
        failure_domain,
    }
}

pub fn status_strategy() -> impl Strategy<Value = Status> {
    prop_oneof![8 => Just(Status::In), 1 => Just(Status::Out), 1 => Just(Status::Pending)]
}

/// 1..=12 hosts of 1..=4 OSDs, some out or pending.
pub fn hosts_strategy() -> impl Strategy<Value = Vec<Vec<Status>>> {
    prop::collection::vec(prop::collection::vec(status_strategy(), 1..=4), 1..=12)
}

pub fn domain_strategy() -> impl Strategy<Value = FailureDomain> {
    prop_oneof![Just(FailureDomain::Osd), Just(FailureDomain::Host)]
}

pub fn as_map(lists: &[Vec<OsdId>]) -> BTreeMap<u32, Vec<OsdId>> {
    lists
        .iter()
        .enumerate()
        .map(|(seq, l)| (seq as u32, l.clone()))
        .collect()
}

pub fn targets_of(osds: &OsdTable) -> Vec<OsdId> {
    osds.values()
        .filter(|o| o.is_placement_target())
        .map(|o| o.id)
        .collect()
}

/// Per target OSD (idle ones included as 0): (members, primaries).
pub fn target_loads(
    lists: &BTreeMap<u32, Vec<OsdId>>,
    osds: &OsdTable,
) -> BTreeMap<OsdId, (u32, u32)> {
    let counts = load(lists);
    targets_of(osds)
        .into_iter()
        .map(|o| (o, counts.get(&o).copied().unwrap_or_default()))
        .collect()
}

pub fn spread(values: impl Iterator<Item = u32>) -> u32 {
    let v: Vec<u32> = values.collect();
    match (v.iter().max(), v.iter().min()) {
        (Some(max), Some(min)) => max - min,
        _ => 0,
    }
}

/// (member spread, primary spread) over target OSDs.
pub fn spreads(lists: &BTreeMap<u32, Vec<OsdId>>, osds: &OsdTable) -> (u32, u32) {
    let loads = target_loads(lists, osds);
    (
        spread(loads.values().map(|l| l.0)),
        spread(loads.values().map(|l| l.1)),
    )
}

/// Per host with targets: members held by the host's target OSDs.
pub fn host_loads(lists: &BTreeMap<u32, Vec<OsdId>>, osds: &OsdTable) -> BTreeMap<String, u32> {
    let loads = target_loads(lists, osds);
    let mut hosts = BTreeMap::new();
    for (osd, (members, _)) in loads {
        *hosts.entry(osds[&osd].host.clone()).or_insert(0) += members;
    }
    hosts
}

pub fn domain_of(domain: FailureDomain, osd: OsdId, osds: &OsdTable) -> String {
    match domain {
        FailureDomain::Osd => format!("osd.{osd}"),
        FailureDomain::Host => osds
            .get(&osd)
            .map_or(format!("unknown.{osd}"), |o| o.host.clone()),
    }
}

pub fn distinct_domains(domain: FailureDomain, list: &[OsdId], osds: &OsdTable) -> bool {
    let set: BTreeSet<String> = list.iter().map(|&o| domain_of(domain, o, osds)).collect();
    set.len() == list.len()
}

pub fn domain_count(domain: FailureDomain, osds: &OsdTable) -> u32 {
    let set: BTreeSet<String> = targets_of(osds)
        .into_iter()
        .map(|o| domain_of(domain, o, osds))
        .collect();
    set.len() as u32
}

/// Applies changed lists on top of `base`.
pub fn merged(
    base: &BTreeMap<u32, Vec<OsdId>>,
    changes: &BTreeMap<u32, Vec<OsdId>>,
) -> BTreeMap<u32, Vec<OsdId>> {
    let mut out = base.clone();
    for (seq, list) in changes {
        out.insert(*seq, list.clone());
    }
    out
}

/// Number of positions that differ between the two versions of the changed PGs: the data
/// movement (a lower bound on the moves made).
pub fn moved_positions(
    base: &BTreeMap<u32, Vec<OsdId>>,
    changes: &BTreeMap<u32, Vec<OsdId>>,
) -> usize {
    changes
        .iter()
        .map(|(seq, list)| {
            let old = &base[seq];
            assert_eq!(old.len(), list.len(), "rebalance keeps the PG size");
            old.iter().zip(list).filter(|(a, b)| a != b).count()
        })
        .sum()
}

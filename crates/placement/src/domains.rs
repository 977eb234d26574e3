//! Failure domains and the candidate topology every algorithm works on.
//!
//! A [`Topology`] is built once per call from the OSD map: the placement-target OSDs, grouped by
//! failure domain, each with a dense index so that loads live in plain vectors. Domains are
//! sorted by key and OSDs by id, so iteration order never depends on hashing.

use crate::hash;
use fastblock_types::map::FailureDomain;
use fastblock_types::osd_table::OsdTable;
use fastblock_types::OsdId;
use std::collections::{BTreeMap, BTreeSet};

/// The identity of a failure domain: what two replicas of one PG must not share.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum DomainKey {
    /// `FailureDomain::Osd`: every OSD is its own domain.
    Osd(OsdId),
    /// `FailureDomain::Host`: the host name the OSD reported at boot.
    Host(String),
    /// An OSD that is listed in a PG but missing from the OSD map: its host is unknown, so it
    /// is treated as a domain of its own (it can never be a candidate either).
    Unknown(OsdId),
}

/// The domain key of any OSD, target or not.
pub(crate) fn domain_key(domain: FailureDomain, osd: OsdId, osds: &OsdTable) -> DomainKey {
    match (domain, osds.get(&osd)) {
        (FailureDomain::Osd, _) => DomainKey::Osd(osd),
        (FailureDomain::Host, Some(info)) => DomainKey::Host(info.host.clone()),
        (FailureDomain::Host, None) => DomainKey::Unknown(osd),
    }
}

/// True if no two members of `members` share a failure domain (and no OSD appears twice).
pub(crate) fn domains_distinct(domain: FailureDomain, members: &[OsdId], osds: &OsdTable) -> bool {
    let keys: BTreeSet<DomainKey> = members
        .iter()
        .map(|&osd| domain_key(domain, osd, osds))
        .collect();
    keys.len() == members.len()
}

/// One failure domain with at least one placement-target OSD.
#[derive(Debug)]
pub(crate) struct Domain {
    pub key: DomainKey,
    /// Stable integer standing for the domain in tie-breaks.
    pub tie_id: u64,
    /// Indices into [`Topology::osds`], ascending by OSD id.
    pub members: Vec<usize>,
}

impl Domain {
    /// The weight used to balance domains against each other: the number of target OSDs.
    pub fn weight(&self) -> u64 {
        self.members.len() as u64
    }
}

/// The placement targets of one call, grouped by failure domain.
#[derive(Debug)]
pub(crate) struct Topology {
    pub domain: FailureDomain,
    /// Placement-target OSDs, ascending by id.
    pub osds: Vec<OsdId>,
    /// Domain index of each entry of `osds`.
    pub osd_domain: Vec<usize>,
    /// Domains, ascending by key; every domain has at least one member.
    pub domains: Vec<Domain>,
    /// OSD id -> index into `osds`.
    index: BTreeMap<OsdId, usize>,
    /// Domain key -> index into `domains`.
    domain_index: BTreeMap<DomainKey, usize>,
}

impl Topology {
    pub fn new(domain: FailureDomain, osds: &OsdTable) -> Topology {
        let mut grouped: BTreeMap<DomainKey, Vec<OsdId>> = BTreeMap::new();
        for (&id, info) in osds {
            // The map is keyed by id; a mismatching `info.id` would be a monitor bug, but the id
            // used everywhere here is the key.
            if info.is_placement_target() {
                grouped
                    .entry(domain_key(domain, id, osds))
                    .or_default()
                    .push(id);
            }
        }
        let mut topo = Topology {
            domain,
            osds: Vec::new(),
            osd_domain: Vec::new(),
            domains: Vec::new(),
            index: BTreeMap::new(),
            domain_index: BTreeMap::new(),
        };
        let mut all: Vec<(OsdId, usize)> = Vec::new();
        for (d, (key, members)) in grouped.into_iter().enumerate() {
            let tie_id = match &key {
                DomainKey::Osd(id) | DomainKey::Unknown(id) => u64::from(id.get()),
                DomainKey::Host(name) => hash::name_hash(name),
            };
            all.extend(members.iter().map(|&id| (id, d)));
            topo.domain_index.insert(key.clone(), d);
            topo.domains.push(Domain {
                key,
                tie_id,
                members: Vec::new(),
            });
        }
        all.sort_unstable();
        for (i, (id, d)) in all.into_iter().enumerate() {
            topo.osds.push(id);
            topo.osd_domain.push(d);
            topo.index.insert(id, i);
            topo.domains[d].members.push(i);
        }
        for d in &topo.domains {
            assert!(!d.members.is_empty(), "empty domain {:?}", d.key);
        }
        topo
    }

    /// Index of a placement-target OSD, `None` for any other OSD.
    pub fn target_index(&self, osd: OsdId) -> Option<usize> {
        self.index.get(&osd).copied()
    }

    /// Domain index of any OSD whose domain has placement targets (the OSD itself need not be a
    /// target: an out OSD on a host with in OSDs still occupies that host in its PG).
    pub fn domain_of(&self, osd: OsdId, osds: &OsdTable) -> Option<usize> {
        match self.target_index(osd) {
            Some(i) => Some(self.osd_domain[i]),
            None => self
                .domain_index
                .get(&domain_key(self.domain, osd, osds))
                .copied(),
        }
    }

    /// Per-OSD membership counts (indexed like `osds`) over the target members of `lists`.
    pub fn member_loads<'a>(&self, lists: impl Iterator<Item = &'a Vec<OsdId>>) -> Vec<u64> {
        let mut loads = vec![0u64; self.osds.len()];
        for list in lists {
            for &osd in list {
                if let Some(i) = self.target_index(osd) {
                    loads[i] += 1;
                }
            }
        }
        loads
    }

    /// Per-domain membership counts, from per-OSD counts.
    pub fn domain_loads(&self, osd_loads: &[u64]) -> Vec<u64> {
        assert_eq!(osd_loads.len(), self.osds.len());
        self.domains
            .iter()
            .map(|d| d.members.iter().map(|&i| osd_loads[i]).sum())
            .collect()
    }
}

/// Compares the marginal cost of adding one member to domain A (load `la`, weight `wa`) with
/// that of domain B: `(2·la + 1) / wa` against `(2·lb + 1) / wb`.
///
/// This is the increase of the potential `Σ load² / weight` that placement minimises; with equal
/// weights it is just "least loaded first". Exact integer arithmetic, no floats.
pub(crate) fn cmp_marginal(la: u64, wa: u64, lb: u64, wb: u64) -> std::cmp::Ordering {
    assert!(wa > 0 && wb > 0, "domain weights must be positive");
    let a = u128::from(2 * la + 1) * u128::from(wb);
    let b = u128::from(2 * lb + 1) * u128::from(wa);
    a.cmp(&b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::osd;

    #[test]
    fn topology_groups_targets_by_host() {
        let mut osds = OsdTable::new();
        for (id, host, is_in) in [
            (1, "b", true),
            (2, "a", true),
            (3, "b", false),
            (4, "b", true),
        ] {
            osds.insert(OsdId(id), osd(id, host, is_in));
        }
        let topo = Topology::new(FailureDomain::Host, &osds);
        assert_eq!(topo.osds, vec![OsdId(1), OsdId(2), OsdId(4)]);
        assert_eq!(topo.domains.len(), 2);
        assert_eq!(topo.domains[0].key, DomainKey::Host("a".into()));
        assert_eq!(topo.domains[1].members, vec![0, 2]);
        // OSD 3 is out but sits on host b, which still has targets.
        assert_eq!(topo.domain_of(OsdId(3), &osds), Some(1));
        assert_eq!(topo.domain_of(OsdId(9), &osds), None);
        assert!(!domains_distinct(
            FailureDomain::Host,
            &[OsdId(1), OsdId(3)],
            &osds
        ));
        assert!(domains_distinct(
            FailureDomain::Osd,
            &[OsdId(1), OsdId(3)],
            &osds
        ));
    }

    #[test]
    fn marginal_cost_weights_by_osd_count() {
        use std::cmp::Ordering::*;
        assert_eq!(cmp_marginal(1, 1, 2, 1), Less);
        // A host of 2 OSDs holding 3 members is less full than a host of 1 holding 2.
        assert_eq!(cmp_marginal(3, 2, 2, 1), Less);
        assert_eq!(cmp_marginal(0, 1, 0, 1), Equal);
    }
}

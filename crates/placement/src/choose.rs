//! The one selection rule shared by initial placement and repair: pick the domain whose
//! weighted load grows least by one more member, then the least-loaded OSD inside it.

use crate::domains::{cmp_marginal, Topology};
use crate::hash;

/// Loads of one pool over a topology: per target OSD and per domain, kept in step.
#[derive(Clone, Debug)]
pub(crate) struct Loads {
    pub osd: Vec<u64>,
    pub domain: Vec<u64>,
}

impl Loads {
    pub fn new(topo: &Topology, osd: Vec<u64>) -> Loads {
        let domain = topo.domain_loads(&osd);
        Loads { osd, domain }
    }

    pub fn add(&mut self, topo: &Topology, osd_index: usize) {
        self.osd[osd_index] += 1;
        self.domain[topo.osd_domain[osd_index]] += 1;
    }

    pub fn remove(&mut self, topo: &Topology, osd_index: usize) {
        assert!(
            self.osd[osd_index] > 0,
            "load underflow on {}",
            topo.osds[osd_index]
        );
        self.osd[osd_index] -= 1;
        self.domain[topo.osd_domain[osd_index]] -= 1;
    }
}

/// Chooses a new member for PG `seq` of `pool`: a target OSD whose domain is not in
/// `used_domains` (a per-domain flag). Returns its index into `topo.osds`, or `None` if every
/// domain is used.
///
/// The domain is the one with the smallest marginal cost `(2·load + 1) / weight` (ties: hash of
/// pool, seq and domain); the OSD is the least-loaded one of that domain (ties: hash of pool,
/// seq and OSD id). With the `Osd` domain every weight is 1, so this is "least-loaded OSD".
pub(crate) fn choose_member(
    topo: &Topology,
    loads: &Loads,
    pool: u32,
    seq: u32,
    used_domains: &[bool],
) -> Option<usize> {
    assert_eq!(used_domains.len(), topo.domains.len());
    let mut best: Option<usize> = None;
    for (d, domain) in topo.domains.iter().enumerate() {
        if used_domains[d] {
            continue;
        }
        let better = match best {
            None => true,
            Some(b) => {
                let other = &topo.domains[b];
                cmp_marginal(
                    loads.domain[d],
                    domain.weight(),
                    loads.domain[b],
                    other.weight(),
                )
                .then_with(|| {
                    hash::tie(pool, seq, domain.tie_id).cmp(&hash::tie(pool, seq, other.tie_id))
                })
                .then_with(|| d.cmp(&b))
                .is_lt()
            }
        };
        if better {
            best = Some(d);
        }
    }
    let d = best?;
    let osd = topo.domains[d]
        .members
        .iter()
        .copied()
        .min_by_key(|&i| {
            (
                loads.osd[i],
                hash::tie(pool, seq, u64::from(topo.osds[i].get())),
                i,
            )
        })
        .expect("domains are never empty");
    Some(osd)
}

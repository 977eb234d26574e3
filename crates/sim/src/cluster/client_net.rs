//! The clients' side of the network. A node may be cut off from the clients: by a partition
//! fault that isolates one node (as the chaos run's isolation takes an OSD's link down, and
//! its clients' requests with it; partitions between groups of nodes leave the clients
//! through), or by a scenario. A request sent to a node cut off waits as TCP keeps it: in the
//! sender's kernel, retransmitted, until the cut heals; then it arrives at the next
//! retransmission. A client that gives up on a request aborts its connection (the library
//! closes with `SO_LINGER` 0, `crates/client/src/conn.rs`), so what waits for a given-up
//! attempt is discarded. With [`SimOptions::client_close_orderly`] it is delivered anyway, as
//! it was before that fix: the old leader, leading again by then, applied the given-up write
//! over newer acknowledged ones (the chaos run's stale reads, 2026-11-27 and -28).
//!
//! [`SimOptions::client_close_orderly`]: crate::options::SimOptions::client_close_orderly

use super::{Cluster, Ev};
use crate::node::ClientTag;
use crate::options::{MS, SEC};
use fastblock_types::OsdId;
use fastblock_wire::Request;
use std::collections::BTreeSet;

/// TCP's first retransmission timeout and its ceiling (Linux: 200 ms, doubling to 120 s).
const RTO_FIRST_US: u64 = 200 * MS;
const RTO_MAX_US: u64 = 120 * SEC;

/// A client request waiting in its sender's kernel for a partition to heal.
pub(super) struct HeldSend {
    node: OsdId,
    /// The node's incarnation when it was sent: a node restarted meanwhile has no such
    /// connection any more (it answers the retransmission with a reset).
    life: u64,
    tag: ClientTag,
    req: Request,
    sent_us: u64,
}

/// When the retransmissions of a segment first sent at `sent_us` reach the wire at or after
/// `now_us`.
fn next_retransmission(sent_us: u64, now_us: u64) -> u64 {
    let (mut at, mut rto) = (sent_us + RTO_FIRST_US, RTO_FIRST_US);
    while at < now_us {
        rto = (rto * 2).min(RTO_MAX_US);
        at += rto;
    }
    at
}

impl Cluster {
    /// Whether `node` is cut off from the clients.
    pub(super) fn cut_from_clients(&self, node: OsdId) -> bool {
        self.clients_cut.contains(&node)
    }

    /// Cuts the clients off from `nodes` (empty: heals), and lets through what waited for a
    /// node no longer cut off.
    pub(super) fn set_clients_cut(&mut self, nodes: BTreeSet<OsdId>) {
        self.clients_cut = nodes;
        self.release_held_sends();
    }

    /// Keeps a client request sent to a node cut off from the clients.
    pub(super) fn hold_client_send(&mut self, node: OsdId, tag: ClientTag, req: Request) {
        self.probes.hit("net.client_held");
        let life = self.nodes[&node].incarnation;
        self.held_client_sends.push(HeldSend {
            node,
            life,
            tag,
            req,
            sent_us: self.now,
        });
    }

    /// Whether a client request arriving now was given up by its client: its connection was
    /// aborted and the request discarded with it (unless closes are orderly).
    pub(super) fn send_given_up(&self, tag: ClientTag) -> bool {
        !self.o.client_close_orderly && !self.current_attempt(tag)
    }

    fn release_held_sends(&mut self) {
        let held = std::mem::take(&mut self.held_client_sends);
        for h in held {
            if self.cut_from_clients(h.node) {
                self.held_client_sends.push(h);
                continue;
            }
            if self.send_given_up(h.tag) {
                self.probes.hit("net.client_given_up_discarded");
                continue;
            }
            if self.nodes[&h.node].incarnation != h.life {
                self.probes.hit("net.client_held_reset");
                continue;
            }
            let at = next_retransmission(h.sent_us, self.now);
            let (node, tag, req) = (h.node, h.tag, h.req);
            self.after(at - self.now, Ev::ClientSend { node, tag, req });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retransmissions_back_off_from_the_send() {
        assert_eq!(next_retransmission(0, 0), 200 * MS);
        assert_eq!(next_retransmission(0, 200 * MS), 200 * MS);
        assert_eq!(next_retransmission(0, 201 * MS), 600 * MS);
        assert_eq!(next_retransmission(1000, 2 * SEC), 1000 + 3 * SEC);
        // Capped at 120 s between retransmissions.
        let far = next_retransmission(0, 1000 * SEC);
        assert!((1000 * SEC..1000 * SEC + RTO_MAX_US).contains(&far));
    }
}

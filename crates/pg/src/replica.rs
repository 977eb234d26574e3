//! [`PgReplica`]: the input handlers and the Ready → Output translation.

use crate::config::PgConfig;
use crate::lease::{Lease, RENEW_CTX};
use crate::membership::{self, ConfView, MemberProgress, Step};
use crate::op::ClientOp;
use crate::output::{Apply, Event, LeaderReport, LogWrite, OpId, OpOutcome, Output, PgError};
use crate::overlay::{Overlay, OverlayStorage};
use crate::rng::SplitMix64;
use fastblock_types::{LogIndex, OsdId, PgId, Term};
use protobuf::Message as _;
use raft::eraftpb::{
    ConfChange, ConfChangeSingle, ConfChangeTransition, ConfChangeType, ConfChangeV2, Entry,
    EntryType, Message, MessageType,
};
use raft::{ProgressState, RawNode, ReadOnlyOption, SnapshotStatus, StateRole, Storage};
use std::cell::RefCell;
use std::collections::{BTreeSet, VecDeque};

/// A leader whose configuration reached the target repeats its report this often (in ticks)
/// until the driver clears the target, so a lost report is not fatal.
const FINISHED_REPORT_TICKS: u32 = 20;
use std::rc::Rc;

/// What an outside observer last saw of the Raft state; a change triggers events and a fresh
/// seeded election timeout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Observed {
    role: StateRole,
    leader: u64,
    term: u64,
}

pub struct PgReplica<S: Storage> {
    pg: PgId,
    me: OsdId,
    node: RawNode<OverlayStorage<S>>,
    overlay: Rc<RefCell<Overlay>>,
    config: PgConfig,
    rng: SplitMix64,
    /// Proposed operations awaiting their entry's application: (index, term, op).
    proposals: VecDeque<(u64, u64, OpId)>,
    /// Operations whose outcome is known, released once `applied` reaches their index.
    completed: VecDeque<(u64, OpId, OpOutcome)>,
    /// Reads that reached a leader before it committed an entry of its term: raft-rs drops
    /// read-index requests until then, so they are held here and asked for afterwards.
    reads_deferred: VecDeque<OpId>,
    /// Reads waiting for their read index from Raft, with when they asked (driver ms) and
    /// the lease generation then: a confirmed round renews the lease from that time.
    reads_waiting: VecDeque<(OpId, u64, u64)>,
    /// Reads with a read index, released once `applied` reaches it.
    reads_indexed: VecDeque<(u64, OpId)>,
    /// Messages that may leave only after the log write of their ready is durable.
    held: VecDeque<(u64, Vec<Message>)>,
    applied: u64,
    /// At or after the index of the configuration entry in force, at or before `applied`
    /// (the configuration does not change in between). Exact once a change is applied here;
    /// after a restart it starts at the applied index, as the entry itself may be compacted.
    /// The monitor fences reports by it and OSDs compare their logs with it
    /// (`retention`), for which any index in that range is as good as the exact one.
    conf_index: u64,
    observed: Observed,
    failed: Option<String>,
    /// The voter set the monitor wants (its `newosdlist`), if a change is pending.
    target: Option<BTreeSet<OsdId>>,
    /// Ticks until a finished change is reported again (0: report at the next chance).
    finished_report_in: u32,
    /// A received snapshot handed to the driver in ready `.0`, at index `.1`: the applied
    /// index jumps there once that ready is persisted (the store installed the objects).
    snapshot_pending: Option<(u64, u64)>,
    /// The configuration is joint (kept up to date as configurations are applied, so the
    /// tick need not rebuild the configuration to know).
    joint: bool,
    /// The leader lease (see [`crate::lease`]).
    lease: Lease,
    /// The driver's clock at the last `read` or `tick` (ms; only the lease uses it).
    now_ms: u64,
    /// Ticks until an idle learner may be nudged again (`nudge_idle_learners`).
    nudge_in: u32,
    /// Ticks since this replica was opened: it refuses votes until `election_ticks` have
    /// passed (a restarted follower forgot whom it followed, and may have confirmed a lease).
    ticks_since_open: usize,
    /// As leader: the index of the first entry of its term (raft-rs appends an empty one on
    /// election). Everything before it is applied once `applied` reaches it.
    term_start_index: u64,
}

fn to_osd(id: u64) -> Option<OsdId> {
    (id != 0).then(|| OsdId(u32::try_from(id).expect("raft ids are OSD ids")))
}

enum ConfChangeError {
    Undecodable(String),
    Refused(String),
}

/// Sends messages on, except `MsgSnapshot`s, which wait for the driver's object transfer.
fn route_messages(msgs: Vec<Message>, out: &mut Output) {
    for m in msgs {
        if m.get_msg_type() == MessageType::MsgSnapshot {
            out.snapshots.push(m);
        } else {
            out.messages.push(m);
        }
    }
}

fn sorted_osds(ids: &[u64]) -> Vec<OsdId> {
    let mut v: Vec<OsdId> = ids.iter().copied().filter_map(to_osd).collect();
    v.sort();
    v
}

impl<S: Storage> PgReplica<S> {
    /// Opens a replica over `storage` (which holds the persisted log, hard state and
    /// configuration). `applied` is the index up to which the object store already holds the
    /// effects of committed entries; later entries are applied again (apply is idempotent).
    pub fn new(
        pg: PgId,
        me: OsdId,
        storage: S,
        applied: u64,
        config: PgConfig,
        seed: u64,
    ) -> Result<Self, raft::Error> {
        config.validate().map_err(raft::Error::ConfigInvalid)?;
        let raft_config = raft::Config {
            id: u64::from(me.0),
            election_tick: config.election_ticks,
            heartbeat_tick: config.heartbeat_ticks,
            min_election_tick: config.election_ticks,
            max_election_tick: config.election_ticks * 2,
            applied,
            max_size_per_msg: config.append_bytes_max,
            max_inflight_msgs: config.inflight_appends_max,
            check_quorum: true,
            pre_vote: true,
            // Every read index is confirmed by a quorum's heartbeat responses. raft-rs's
            // LeaseBased option trusts check-quorum instead, which is no lease: a leader checks
            // its quorum only every `election_ticks`, so after it is cut off it keeps serving
            // for up to twice the election timeout, while the others may elect a new leader
            // after one timeout and acknowledge writes the old one never sees (a stale read;
            // found by the simulator, tests/scenarios.rs `isolated_leader_serves_no_stale_read`).
            // A stalled loop (a slow fdatasync) stretches that window further.
            read_only_option: ReadOnlyOption::Safe,
            skip_bcast_commit: !config.commit_broadcast,
            ..Default::default()
        };
        raft_config.validate()?;
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let overlay = Rc::new(RefCell::new(Overlay::default()));
        let storage = OverlayStorage {
            inner: storage,
            overlay: overlay.clone(),
        };
        let node = RawNode::new(&raft_config, storage, &logger)?;
        let observed = Observed {
            role: node.raft.state,
            leader: node.raft.leader_id,
            term: node.raft.term,
        };
        // Each replica of each PG draws its own sequence, so replicas do not time out together.
        let mix = (u64::from(pg.pool.0) << 40) ^ (u64::from(pg.seq) << 20) ^ u64::from(me.0);
        let mut replica = PgReplica {
            pg,
            me,
            node,
            overlay,
            config,
            rng: SplitMix64::new(seed ^ mix.wrapping_mul(0x2545_F491_4F6C_DD1D)),
            proposals: VecDeque::new(),
            completed: VecDeque::new(),
            reads_deferred: VecDeque::new(),
            term_start_index: u64::MAX,
            reads_waiting: VecDeque::new(),
            reads_indexed: VecDeque::new(),
            lease: Lease::new(config.lease_ms),
            now_ms: 0,
            ticks_since_open: 0,
            nudge_in: 0,
            held: VecDeque::new(),
            applied,
            conf_index: applied,
            observed,
            failed: None,
            target: None,
            finished_report_in: 0,
            snapshot_pending: None,
            joint: false,
        };
        replica.refresh_joint();
        replica.rejitter();
        Ok(replica)
    }

    pub fn pg(&self) -> PgId {
        self.pg
    }

    pub fn is_leader(&self) -> bool {
        self.node.raft.state == StateRole::Leader
    }

    pub fn leader(&self) -> Option<OsdId> {
        to_osd(self.node.raft.leader_id)
    }

    pub fn term(&self) -> Term {
        Term(self.node.raft.term)
    }

    pub fn applied(&self) -> LogIndex {
        LogIndex(self.applied)
    }

    /// Whether this replica leads and has applied every entry of the terms before its own
    /// (the log it inherited): what it decides from applied state (the shard's image fencing
    /// after a reclaim) is then as new as the log.
    pub fn applied_own_term(&self) -> bool {
        self.is_leader() && self.applied >= self.term_start_index
    }

    pub fn commit_index(&self) -> LogIndex {
        LogIndex(self.node.raft.raft_log.committed)
    }

    /// The report a leader sends the monitor (on election, and again if the monitor missed
    /// it); `None` on a follower.
    pub fn leader_report(&self) -> Option<LeaderReport> {
        if !self.is_leader() {
            return None;
        }
        let cs = self.node.raft.prs().conf().to_conf_state();
        Some(LeaderReport {
            term: self.term(),
            conf_index: LogIndex(self.conf_index),
            voters: sorted_osds(&cs.voters),
            voters_outgoing: sorted_osds(&cs.voters_outgoing),
            learners: sorted_osds(&cs.learners),
        })
    }

    /// Voters of the current configuration (incoming half while joint), sorted.
    pub fn voters(&self) -> Vec<OsdId> {
        let cs = self.node.raft.prs().conf().to_conf_state();
        sorted_osds(&cs.voters)
    }

    /// On a leader: the lowest log index every voter and learner has (entries above it may
    /// still have to be sent to someone). `None` on a follower.
    pub fn min_match_index(&self) -> Option<LogIndex> {
        if !self.is_leader() {
            return None;
        }
        self.node
            .raft
            .prs()
            .iter()
            .map(|(_, p)| p.matched)
            .min()
            .map(LogIndex)
    }

    pub fn pending_ops(&self) -> usize {
        self.proposals.len()
            + self.reads_deferred.len()
            + self.reads_waiting.len()
            + self.reads_indexed.len()
    }

    pub fn raw_node(&self) -> &RawNode<OverlayStorage<S>> {
        &self.node
    }

    /// The driver's storage (without the not-yet-persisted overlay).
    pub fn storage(&self) -> &S {
        &self.node.store().inner
    }

    /// Draws the next election timeout from our seeded generator, replacing raft-rs's
    /// thread-local draw.
    fn rejitter(&mut self) {
        let e = self.config.election_ticks as u64;
        let t = e + self.rng.below(e);
        self.node.raft.set_randomized_election_timeout(t as usize);
    }

    fn refuse(&self, op: OpId, out: &mut Output) -> bool {
        let error = if let Some(reason) = &self.failed {
            PgError::Failed(reason.clone())
        } else if !self.is_leader() {
            PgError::NotLeader {
                leader: self.leader(),
            }
        } else if self.pending_ops() >= self.config.pending_ops_max {
            PgError::Busy
        } else {
            return false;
        };
        out.replies.push((op, OpOutcome::Failed(error)));
        true
    }

    /// One tick; `now_ms` is the driver's clock (used by the lease only).
    pub fn tick(&mut self, now_ms: u64, out: &mut Output) {
        self.now_ms = self.now_ms.max(now_ms);
        self.ticks_since_open = self.ticks_since_open.saturating_add(1);
        // A follower whose received snapshot is not durable yet does not count down to an
        // election (see `installing_snapshot`); nothing else in a follower's tick matters.
        if self.failed.is_none() && !self.installing_snapshot() {
            self.node.tick();
            if self.is_leader() {
                self.drive_membership(out);
                self.maybe_renew_lease();
            }
        }
        self.after_input(out);
    }

    /// A learner counts as caught up only in raft-rs's `Replicate` state (its `matched` may
    /// be stale in `Probe`, after it rejected an append). A learner that reached the last
    /// entry in `Probe` (after a snapshot) leaves it only when an append response *advances*
    /// its `matched`, so in an idle PG it never would, and the membership change waited for
    /// good (found by the simulator, seeds 7880428463133722653 and 6815336312676948782,
    /// `--membership`). Appending an empty entry gives it one to acknowledge; at most once per
    /// election timeout while the change waits.
    fn nudge_idle_learners(&mut self) {
        if self.nudge_in > 0 {
            self.nudge_in -= 1;
            return;
        }
        let last = self.node.raft.raft_log.last_index();
        let me = u64::from(self.me.0);
        let stuck = self.node.raft.prs().iter().any(|(id, p)| {
            *id != me && p.state == ProgressState::Probe && p.matched == last && !p.is_paused()
        });
        if stuck && self.node.propose(Vec::new(), Vec::new()).is_ok() {
            self.nudge_in = self.config.election_ticks as u32;
        }
    }

    /// Asks a heartbeat round ahead of the lease's end while reads use it, so a steady read
    /// stream never waits for one.
    fn maybe_renew_lease(&mut self) {
        let term = self.node.raft.term;
        if self.node.raft.commit_to_current_term() && self.lease.wants_renewal(term, self.now_ms) {
            self.lease.renewal_asked(self.now_ms);
            self.node.read_index(RENEW_CTX.to_le_bytes().to_vec());
        }
    }

    /// Whether this leader may serve a read now without a heartbeat round.
    fn lease_holds(&self) -> bool {
        self.is_leader()
            && self.node.raft.lead_transferee.is_none()
            && self.node.raft.commit_to_current_term()
            && self.lease.holds(self.node.raft.term, self.now_ms)
    }

    /// Sets the voter set the monitor wants (`None`: no change pending). A leader walks the
    /// configuration there on its ticks (see [`membership`]).
    pub fn set_target(&mut self, target: Option<Vec<OsdId>>) {
        let target = target.map(|t| t.into_iter().collect::<BTreeSet<_>>());
        if target != self.target {
            self.finished_report_in = 0;
        }
        self.target = target;
    }

    pub fn target(&self) -> Option<&BTreeSet<OsdId>> {
        self.target.as_ref()
    }

    /// The configuration and replication progress, as the membership decision reads it.
    pub fn conf_view(&self) -> ConfView {
        let cs = self.node.raft.prs().conf().to_conf_state();
        let ids = |v: &[u64]| {
            v.iter()
                .copied()
                .filter_map(to_osd)
                .collect::<BTreeSet<_>>()
        };
        let progress = self
            .node
            .raft
            .prs()
            .iter()
            .filter_map(|(id, p)| {
                let osd = to_osd(*id)?;
                // The leader's own progress is its log.
                let me = *id == u64::from(self.me.0);
                Some((
                    osd,
                    MemberProgress {
                        matched: if me {
                            self.node.raft.raft_log.last_index()
                        } else {
                            p.matched
                        },
                        replicating: me || p.state == ProgressState::Replicate,
                    },
                ))
            })
            .collect();
        ConfView {
            voters: ids(&cs.voters),
            voters_outgoing: ids(&cs.voters_outgoing),
            learners: ids(&cs.learners),
            progress,
            last_index: self.node.raft.raft_log.last_index(),
        }
    }

    fn refresh_joint(&mut self) {
        self.joint = !self
            .node
            .raft
            .prs()
            .conf()
            .to_conf_state()
            .voters_outgoing
            .is_empty();
    }

    /// One step of a pending membership change, if Raft can take one now.
    fn drive_membership(&mut self, out: &mut Output) {
        // Raft accepts one configuration change at a time (a new leader also waits until it
        // has applied its whole log).
        if self.node.raft.has_pending_conf() {
            return;
        }
        if self.target.is_none() && !self.joint && self.node.raft.prs().conf().learners().is_empty()
        {
            return; // the common case, without building the view
        }
        let view = self.conf_view();
        let step = membership::next_step(self.me, &view, self.target.as_ref());
        let single = |change_type: ConfChangeType, osd: OsdId| {
            let mut c = ConfChangeSingle::default();
            c.set_change_type(change_type);
            c.node_id = u64::from(osd.0);
            c
        };
        let cc = match step {
            Step::Wait => {
                self.nudge_idle_learners();
                return;
            }
            Step::Done => {
                if self.finished_report_in == 0 {
                    if let Some(report) = self.leader_report() {
                        out.events.push(Event::MembershipFinished(report));
                    }
                    self.finished_report_in = FINISHED_REPORT_TICKS;
                } else {
                    self.finished_report_in -= 1;
                }
                return;
            }
            Step::TransferLeader(to) => {
                // The transferee campaigns with `force`, past the followers' refusal.
                self.lease.void_for_term(self.node.raft.term);
                self.node.transfer_leader(u64::from(to.0));
                return;
            }
            Step::AddLearner(osd) => {
                let mut cc = ConfChangeV2::default();
                cc.mut_changes()
                    .push(single(ConfChangeType::AddLearnerNode, osd));
                cc
            }
            Step::RemoveLearner(osd) => {
                let mut cc = ConfChangeV2::default();
                cc.mut_changes()
                    .push(single(ConfChangeType::RemoveNode, osd));
                cc
            }
            Step::EnterJoint { voters } => {
                let mut cc = ConfChangeV2::default();
                cc.set_transition(ConfChangeTransition::Explicit);
                for osd in &voters {
                    if !view.voters.contains(osd) {
                        cc.mut_changes().push(single(ConfChangeType::AddNode, *osd));
                    }
                }
                for osd in &view.voters {
                    if !voters.contains(osd) {
                        cc.mut_changes()
                            .push(single(ConfChangeType::RemoveNode, *osd));
                    }
                }
                cc
            }
            Step::LeaveJoint => ConfChangeV2::default(),
        };
        // Refused only when leadership was lost meanwhile; the next leader retries.
        let _ = self.node.propose_conf_change(Vec::new(), cc);
    }

    /// The driver's answer to a `MsgSnapshot` it took from [`Output::snapshots`]: the objects
    /// were staged at `to` and the message sent (`ok`), or the transfer failed and Raft
    /// should ask again later.
    pub fn report_snapshot(&mut self, to: OsdId, ok: bool, out: &mut Output) {
        let status = if ok {
            SnapshotStatus::Finish
        } else {
            SnapshotStatus::Failure
        };
        self.node.report_snapshot(u64::from(to.0), status);
        self.after_input(out);
    }

    /// Whether `osd` is a member (voter or learner) of the current configuration.
    pub fn has_member(&self, osd: OsdId) -> bool {
        self.node.raft.prs().get(u64::from(osd.0)).is_some()
    }

    /// A Raft message from a peer. Messages for another PG or from unknown peers are dropped
    /// by Raft itself.
    pub fn step(&mut self, msg: Message, out: &mut Output) {
        if self.failed.is_some() {
            return;
        }
        // A new member still waiting for its snapshot does not vote: its empty log is behind
        // everyone's, so it would grant any vote, in terms it may have voted in before it was
        // removed and its hard state deleted (two leaders in one term, found by the
        // simulator, seed 512441540235244796). raft-rs itself grants votes without looking at
        // membership.
        //
        // A removed member that still has its log (and so its hard state) votes, as in Raft:
        // the others may not have learned that its removal committed, and while they are
        // joint they need its vote. A leader that applies its own removal steps down and
        // hands over before its followers hear the commit; refusing then left the PG without
        // a leader for good (simulator, seed 3277779685366851248 with --membership).
        if matches!(
            msg.get_msg_type(),
            MessageType::MsgRequestVote | MessageType::MsgRequestPreVote
        ) && !self.has_member(self.me)
            && self.node.raft.raft_log.last_index() == 0
        {
            return;
        }
        // A replica just opened does not vote for an election timeout: before a restart it may
        // have confirmed a leader's lease, and raft-rs's refusal to vote while it hears from a
        // leader does not survive the restart (see `lease`). Whether this replica serves lease
        // reads itself does not matter: the other members' OSDs may (the monitor lets OSDs with
        // lease reads on and off share PGs, `fastblock_types::lease`).
        if self.ticks_since_open < self.config.election_ticks
            && matches!(
                msg.get_msg_type(),
                MessageType::MsgRequestVote | MessageType::MsgRequestPreVote
            )
        {
            return;
        }
        // A heartbeat that commits past this replica's log means the leader counts entries
        // this replica does not have: it deleted them while the leader still counted it (the
        // window described in `retention`). raft-rs would stop the replica (its commit index
        // may not pass its log), and committing only up to its log could commit a suffix
        // that differs from the leader's. So the heartbeat is not stepped; it is answered,
        // as raft-rs would answer it, so that the leader resumes sending to this replica:
        // its appends then fail the log-matching check, and it probes back to what this
        // replica has, or sends a snapshot. Silence left such a member stalled for good while
        // a target named it (simulator, seed 10816532062083025736 with --membership).
        if msg.get_msg_type() == MessageType::MsgHeartbeat
            && msg.commit > self.node.raft.raft_log.last_index()
        {
            if msg.term == self.node.raft.term {
                let mut reply = Message::default();
                reply.set_msg_type(MessageType::MsgHeartbeatResponse);
                reply.to = msg.from;
                reply.from = msg.to;
                reply.term = msg.term;
                reply.commit = self.node.raft.raft_log.committed;
                reply.context = msg.context;
                out.messages.push(reply);
            }
            return;
        }
        // A leader handing over to this replica while it installs a snapshot: campaigning
        // now would fail the same way a timed-out election would (`installing_snapshot`).
        // The leader's transfer times out and it keeps leading.
        if msg.get_msg_type() == MessageType::MsgTimeoutNow && self.installing_snapshot() {
            return;
        }
        // Errors here are stale or misdirected messages (for example from a removed peer);
        // Raft has already ignored them.
        let _ = self.node.step(msg);
        self.after_input(out);
    }

    /// Whether a snapshot this replica received is handed to the driver but not durable.
    ///
    /// Meanwhile the replica must not campaign. raft-rs takes the snapshot out of its unstable
    /// log when the ready is handed over (`advance_append_async`), so its log's first index
    /// is then the snapshot's, served by the overlay, while its applied index stays behind
    /// until the driver reports the ready persisted (`on_persisted`). A campaign reads the
    /// entries between the two to look for pending configuration changes, finds them
    /// compacted, and raft-rs panics ("unexpected error getting unapplied entries"). A slow
    /// disk stretches this window past an election timeout (found by the simulator, seed
    /// 11792110904029364411 with followers learning commits from the next append). Such a
    /// replica could not lead anyway before its objects are installed.
    pub fn installing_snapshot(&self) -> bool {
        self.snapshot_pending.is_some()
    }

    /// Starts an election now (tests and leader handoff); a no-op for a leader, and for a
    /// replica installing a snapshot (`installing_snapshot`).
    pub fn campaign(&mut self, out: &mut Output) {
        if self.failed.is_none() && !self.is_leader() && !self.installing_snapshot() {
            let _ = self.node.campaign();
        }
        self.after_input(out);
    }

    /// Proposes a mutation. Its outcome arrives in `Output::replies` once the entry is
    /// committed and applied, or as a failure.
    pub fn propose(&mut self, op: OpId, client_op: &ClientOp, out: &mut Output) {
        if self.refuse(op, out) {
            return;
        }
        let (context, data) = client_op.encode();
        let mut entry = Entry::default();
        entry.set_entry_type(EntryType::EntryNormal);
        entry.context = context;
        entry.data = data;
        let mut msg = Message::default();
        msg.set_msg_type(MessageType::MsgPropose);
        msg.from = u64::from(self.me.0);
        msg.mut_entries().push(entry);
        // RawNode::propose would need a Vec<u8>; stepping the proposal ourselves keeps the
        // payload's `Bytes` (no copy). This is what RawNode::propose does internally.
        match self.node.raft.step(msg) {
            Ok(()) => {
                let index = self.node.raft.raft_log.last_index();
                let term = self.node.raft.term;
                if let Some(&(last, _, _)) = self.proposals.back() {
                    assert!(index > last, "pg {} proposal indexes must grow", self.pg);
                }
                self.proposals.push_back((index, term, op));
            }
            Err(_) => out.replies.push((
                op,
                OpOutcome::Failed(PgError::NotLeader {
                    leader: self.leader(),
                }),
            )),
        }
        self.after_input(out);
    }

    /// Asks to read. `OpOutcome::ReadReady` arrives when a quorum has confirmed this replica
    /// still leads (a heartbeat round) and everything committed before this call is applied;
    /// the driver then reads the object store directly.
    ///
    /// Under a lease (`PgConfig::lease_ms`) the read index is the commit index at once, with
    /// no round; `now_ms` is the driver's clock.
    pub fn read(&mut self, op: OpId, now_ms: u64, out: &mut Output) {
        self.now_ms = self.now_ms.max(now_ms);
        if self.refuse(op, out) {
            return;
        }
        // Only here, with the caller's clock of this very moment: a read deferred and issued
        // later (after the driver's fdatasync of this round, which may stall for seconds)
        // would be judged against a clock that stood still meanwhile, so it asks a quorum.
        if self.reads_deferred.is_empty() && self.lease_holds() {
            // Nothing this leader has not committed can be committed by another before the
            // lease ends, so the commit index is a read index (read indexes only grow, so
            // `reads_indexed` stays in order).
            let index = self.node.raft.raft_log.committed;
            self.lease.used(self.now_ms);
            self.reads_indexed.push_back((index, op));
        } else {
            self.reads_deferred.push_back(op);
        }
        self.after_input(out);
    }

    /// Asks Raft for the read index of deferred reads once this leader has committed an entry
    /// of its term (before that, raft-rs drops the request without an answer). Returns whether
    /// it asked.
    fn maybe_issue_reads(&mut self) -> bool {
        if self.reads_deferred.is_empty()
            || !self.is_leader()
            || !self.node.raft.commit_to_current_term()
        {
            return false;
        }
        while let Some(op) = self.reads_deferred.pop_front() {
            self.node.read_index(op.0.to_le_bytes().to_vec());
            self.reads_waiting
                .push_back((op, self.now_ms, self.lease.generation()));
        }
        true
    }

    /// Log writes up to `ready_number` are durable.
    pub fn on_persisted(&mut self, ready_number: u64, out: &mut Output) {
        self.overlay.borrow_mut().persisted(ready_number);
        self.node.on_persist_ready(ready_number);
        if let Some((n, index)) = self.snapshot_pending {
            if n <= ready_number {
                // The store installed the snapshot's objects with this ready.
                self.snapshot_pending = None;
                if index > self.applied {
                    self.applied = index;
                    self.conf_index = self.conf_index.max(index);
                    self.node.advance_apply_to(index);
                    self.refresh_joint();
                }
            }
        }
        while let Some((n, _)) = self.held.front() {
            if *n > ready_number {
                break;
            }
            let (_, msgs) = self.held.pop_front().expect("front exists");
            route_messages(msgs, out);
        }
        self.after_input(out);
    }

    /// Committed entries up to `index` are applied to the object store.
    pub fn on_applied(&mut self, index: LogIndex, out: &mut Output) {
        assert!(
            index.0 >= self.applied,
            "pg {} osd {}: applied index went back from {} to {}",
            self.pg,
            self.me,
            self.applied,
            index
        );
        self.applied = index.0;
        self.node.advance_apply_to(index.0);
        self.after_input(out);
    }

    /// Releases outcomes whose index is applied: completed proposals and reads whose read
    /// index is reached (which may already be true when the read index arrives).
    fn release_applied(&mut self, out: &mut Output) {
        while let Some((i, _, _)) = self.completed.front() {
            if *i > self.applied {
                break;
            }
            let (_, op, outcome) = self.completed.pop_front().expect("front exists");
            out.replies.push((op, outcome));
        }
        while let Some((i, _)) = self.reads_indexed.front() {
            if *i > self.applied {
                break;
            }
            let (_, op) = self.reads_indexed.pop_front().expect("front exists");
            out.replies.push((op, OpOutcome::ReadReady));
        }
    }

    /// Collects everything Raft wants done, and reacts to role changes.
    fn after_input(&mut self, out: &mut Output) {
        loop {
            while self.failed.is_none() && self.node.has_ready() {
                self.handle_ready(out);
            }
            if self.failed.is_some() || !self.maybe_issue_reads() {
                break;
            }
        }
        self.release_applied(out);
        self.observe(out);
    }

    fn handle_ready(&mut self, out: &mut Output) {
        let mut rd = self.node.ready();
        let number = rd.number();
        route_messages(rd.take_messages(), out);
        let term = self.node.raft.term;
        for rs in rd.read_states() {
            let ctx = match <[u8; 8]>::try_from(rs.request_ctx.as_slice()) {
                Ok(b) => u64::from_le_bytes(b),
                Err(_) => continue,
            };
            if ctx == RENEW_CTX {
                self.lease.renewal_confirmed(term);
                continue;
            }
            let op = OpId(ctx);
            if let Some(pos) = self.reads_waiting.iter().position(|(o, _, _)| *o == op) {
                let (_, asked_ms, generation) =
                    self.reads_waiting.remove(pos).expect("position found");
                self.lease.confirmed(term, asked_ms, generation);
                self.reads_indexed.push_back((rs.index, op));
            }
        }
        let committed = rd.take_committed_entries();
        self.handle_committed(committed, out);
        let snapshot = (!rd.snapshot().is_empty()).then(|| rd.snapshot().clone());
        if let Some(snap) = &snapshot {
            let index = snap.get_metadata().index;
            self.snapshot_pending = Some((number, index));
            // Committed entries handed out earlier in this output, not applied yet, are
            // covered by the snapshot, whose objects replace the PG's when the driver
            // persists this ready, which it does before it applies: applied afterwards they
            // would roll those blocks back to older values (found by the simulator, seed
            // 3575269817622548287).
            out.apply.retain(|a| a.index().0 > index);
        }
        let write = LogWrite {
            ready_number: number,
            hard_state: rd.hs().cloned(),
            entries: rd.take_entries(),
            snapshot,
        };
        let persisted_msgs = rd.take_persisted_messages();
        // Raft reads these entries through storage from `advance_append_async` on; serve them
        // from the overlay until the driver has persisted them.
        self.overlay
            .borrow_mut()
            .push(number, write.snapshot.as_ref(), &write.entries);
        out.log_writes.push(write);
        self.held.push_back((number, persisted_msgs));
        self.node.advance_append_async(rd);
    }

    fn handle_committed(&mut self, entries: Vec<Entry>, out: &mut Output) {
        for entry in entries {
            let index = entry.index;
            // Resolve proposals this entry decides: ours if the term matches, otherwise ours
            // was overwritten by another leader's entry at that index.
            while let Some(&(pi, pt, op)) = self.proposals.front() {
                if pi > index {
                    break;
                }
                self.proposals.pop_front();
                let outcome = if pi == index && pt == entry.term {
                    OpOutcome::Applied
                } else {
                    OpOutcome::Failed(PgError::Dropped)
                };
                self.completed.push_back((index, op, outcome));
            }
            let apply = match entry.get_entry_type() {
                EntryType::EntryNormal if entry.data.is_empty() && entry.context.is_empty() => {
                    Apply::Noop {
                        index: LogIndex(index),
                        conf_state: None,
                    }
                }
                EntryType::EntryNormal => match ClientOp::decode(&entry.context, &entry.data) {
                    Ok(op) => Apply::Op {
                        index: LogIndex(index),
                        op,
                    },
                    Err(reason) => {
                        self.fail(LogIndex(index), reason, out);
                        return;
                    }
                },
                EntryType::EntryConfChange | EntryType::EntryConfChangeV2 => {
                    match self.apply_conf_change(&entry) {
                        Ok(cs) => {
                            self.conf_index = index;
                            self.lease.configuration_changed();
                            self.joint = !cs.voters_outgoing.is_empty();
                            self.step_down_if_removed(&cs);
                            if let Some(report) = self.leader_report() {
                                out.events.push(Event::ConfigurationChanged(report));
                            }
                            Apply::Noop {
                                index: LogIndex(index),
                                conf_state: Some(cs),
                            }
                        }
                        Err(ConfChangeError::Refused(reason)) => {
                            // Raft checks a change against the configuration it applies to,
                            // which every replica has identically at this index: all refuse
                            // alike and the configuration stays the same everywhere.
                            out.events.push(Event::ConfChangeRefused {
                                index: LogIndex(index),
                                reason,
                            });
                            Apply::Noop {
                                index: LogIndex(index),
                                conf_state: None,
                            }
                        }
                        Err(ConfChangeError::Undecodable(reason)) => {
                            self.fail(LogIndex(index), reason, out);
                            return;
                        }
                    }
                }
            };
            out.apply.push(apply);
        }
    }

    /// A leader that applied a configuration without itself as a voter steps down, handing
    /// over to the most advanced voter that is caught up. raft-rs leaves such a leader leading
    /// (its own progress is gone, and it stops on the next commit: found by the simulator,
    /// seed 14266428384146428012). The membership steps never remove their own leader, but a
    /// new leader elected while joint may commit a leave-joint entry its predecessor proposed.
    fn step_down_if_removed(&mut self, cs: &raft::eraftpb::ConfState) {
        let me = u64::from(self.me.0);
        if !self.is_leader() || cs.voters.contains(&me) || cs.voters_outgoing.contains(&me) {
            return;
        }
        let last = self.node.raft.raft_log.last_index();
        let successor = self
            .node
            .raft
            .prs()
            .iter()
            .filter(|(id, p)| **id != me && cs.voters.contains(id) && p.matched == last)
            .map(|(id, _)| *id)
            .min();
        if let Some(to) = successor {
            // Caught up: it may campaign at once instead of waiting out an election timeout.
            self.lease.void_for_term(self.node.raft.term);
            self.node.raft.send_timeout_now(to);
        }
        let term = self.node.raft.term;
        self.node.raft.become_follower(term, raft::INVALID_ID);
    }

    fn apply_conf_change(
        &mut self,
        entry: &Entry,
    ) -> Result<raft::eraftpb::ConfState, ConfChangeError> {
        let undecodable = |e: protobuf::ProtobufError| ConfChangeError::Undecodable(e.to_string());
        let result = if entry.get_entry_type() == EntryType::EntryConfChange {
            let cc = ConfChange::parse_from_bytes(&entry.data).map_err(undecodable)?;
            self.node.apply_conf_change(&cc)
        } else {
            let cc = ConfChangeV2::parse_from_bytes(&entry.data).map_err(undecodable)?;
            self.node.apply_conf_change(&cc)
        };
        result.map_err(|e| ConfChangeError::Refused(e.to_string()))
    }

    fn fail(&mut self, index: LogIndex, reason: String, out: &mut Output) {
        let reason = format!(
            "pg {} osd {}: committed entry {index}: {reason}",
            self.pg, self.me
        );
        self.failed = Some(reason.clone());
        out.events.push(Event::Failed {
            index,
            reason: reason.clone(),
        });
        // Nothing is processed after this: every op still waiting is answered now, or it
        // would wait forever (and the driver would track it forever). Outcomes of entries
        // before `index` stay: their applies are already handed out, and `on_applied`
        // still releases them. The failing entry's own outcome and later proposals never
        // would be, nor reads waiting for a read index (none is asked for any more); reads
        // holding one fail too rather than be served by a replica that stopped.
        let failed = || OpOutcome::Failed(PgError::Failed(reason.clone()));
        let mut doomed: Vec<OpId> = Vec::new();
        while let Some(&(i, op, _)) = self.completed.back() {
            if i < index.0 {
                break;
            }
            self.completed.pop_back();
            doomed.push(op);
        }
        doomed.reverse();
        doomed.extend(self.proposals.drain(..).map(|(_, _, op)| op));
        doomed.extend(self.reads_deferred.drain(..));
        doomed.extend(self.reads_waiting.drain(..).map(|(op, _, _)| op));
        doomed.extend(self.reads_indexed.drain(..).map(|(_, op)| op));
        out.replies
            .extend(doomed.into_iter().map(|op| (op, failed())));
    }

    fn observe(&mut self, out: &mut Output) {
        let now = Observed {
            role: self.node.raft.state,
            leader: self.node.raft.leader_id,
            term: self.node.raft.term,
        };
        if now == self.observed {
            return;
        }
        let was_leader = self.observed.role == StateRole::Leader;
        self.rejitter();
        if now.leader != self.observed.leader || now.term != self.observed.term {
            out.events.push(Event::LeaderChanged {
                leader: to_osd(now.leader),
                term: Term(now.term),
            });
        }
        if now.role == StateRole::Leader && !was_leader {
            self.term_start_index = self.node.raft.raft_log.last_index();
            let report = self.leader_report().expect("just became leader");
            out.events.push(Event::BecameLeader(report));
        }
        if was_leader && now.role != StateRole::Leader {
            // Lost leadership: pending work may or may not complete; the client retries at
            // the new leader (writes are idempotent, reads are re-issued).
            let hint = to_osd(now.leader);
            for (_, _, op) in self.proposals.drain(..) {
                out.replies.push((op, OpOutcome::Failed(PgError::Dropped)));
            }
            self.lease.lost_leadership();
            for op in self
                .reads_deferred
                .drain(..)
                .chain(self.reads_waiting.drain(..).map(|(op, _, _)| op))
            {
                out.replies
                    .push((op, OpOutcome::Failed(PgError::NotLeader { leader: hint })));
            }
            for (_, op) in self.reads_indexed.drain(..) {
                out.replies
                    .push((op, OpOutcome::Failed(PgError::NotLeader { leader: hint })));
            }
        }
        self.observed = now;
    }
}

#[cfg(test)]
#[path = "replica_fail_tests.rs"]
mod fail_tests;

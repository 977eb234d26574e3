//! The upkeep of the monitors' etcd, so that it can never stop the cluster: the leader compacts
//! etcd's history as it writes; the members are defragmented one at a time, past a share of
//! free pages and on a schedule; an out-of-space alarm (`NOSPACE`) is recovered from on its
//! own once room is made; and what the monitor sees of etcd is published for `status`,
//! `health`, `/metrics` and the status page. `docs/operations.md`, "Monitor database", is the
//! operator's side of this; [`policy`] holds the decisions, [`observe`] the looking.
//!
//! Who does what:
//! - **Compaction** (one call for the whole cluster): the leader, every
//!   `--etcd-compact-interval`, and at once when it wrote more than `history_bytes` since the
//!   last one. Off when the interval is 0 (a runtime setting: `etcd_compact_interval`).
//! - **Defragmentation** (per member; it blocks the member while it runs): with the monitors'
//!   own members, each monitor defragments its own, within its slot of a round shared by all
//!   (their order by name, [`DEFRAG_SLOT`] each): two members are never defragmented at once,
//!   so the quorum keeps serving, without any write to agree on it (writes fail under
//!   `NOSPACE`). With an external etcd the leader defragments every member, one after the
//!   other.
//! - **`NOSPACE`**: etcd refuses every write but deletes, compactions and defragmentations,
//!   and keeps leases alive, so the leader keeps leading: it compacts to the current revision,
//!   the members are defragmented, and the alarm is cleared once every member is below the
//!   nearfull share of the quota. If no monitor leads (a monitor that must campaign cannot,
//!   since campaigning writes), each monitor does the compaction itself.

pub mod observe;
pub mod policy;

use crate::election::Role;
use crate::etcd_auth::EtcdCredentials;
use crate::keys::Keyspace;
use crate::store::Fence;
use etcd_client::{AlarmAction, AlarmOptions, AlarmType, Client, CompactionOptions};
use fastblock_types::api::MonMember;
use fastblock_types::etcd::{EtcdMemberStatus, EtcdStatus};
use observe::{Member, MemberClients};
use policy::{CommitLog, DefragReason, UpkeepSettings};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

/// How often etcd is looked at (sizes, alarms) and the upkeep decided.
pub const UPKEEP_POLL: Duration = Duration::from_secs(2);
/// Each monitor's turn to defragment its own member, in a round of one slot per member; a
/// monitor defragments only in the first half of its slot, which leaves the other half for
/// the defragmentation to finish and for clocks that disagree by up to that much.
pub const DEFRAG_SLOT: Duration = Duration::from_secs(20);
/// Longest a defragmentation is waited for. etcd's own client waits without bound; a large
/// database takes seconds per GiB.
pub const DEFRAG_TIMEOUT: Duration = Duration::from_secs(120);
/// With no leader for this long while `NOSPACE` is raised, every monitor compacts itself.
pub const NO_LEADER_GRACE: Duration = Duration::from_secs(10);

/// The monitor's own etcd member (`None` with an external etcd).
#[derive(Clone, Debug)]
pub struct OwnMember {
    pub name: String,
    pub endpoint: String,
}

/// The upkeep's shared state: settings, the leader's commit log, and the published view.
pub struct EtcdUpkeep {
    pub settings: UpkeepSettings,
    /// `--etcd-compact-interval`; zero turns compaction off. Runtime-settable: the admin
    /// socket's setter sends on the other end.
    compact_interval: watch::Receiver<Duration>,
    own: Option<OwnMember>,
    /// What the upkeep's clients of each member log in with (`crate::etcd_auth`).
    credentials: Option<EtcdCredentials>,
    /// The commits of the current leadership (the fence they were made under).
    log: Mutex<(Option<Fence>, CommitLog)>,
    /// Starts a round now: a commit wrote past the budget.
    wake: Notify,
    view: watch::Sender<EtcdStatus>,
    own_status: Mutex<Option<EtcdMemberStatus>>,
    pub compactions_total: AtomicU64,
    pub defrags_total: AtomicU64,
    /// etcd transactions the leader's commits made (a large commit makes several:
    /// `crate::store`, "Large commits").
    commit_transactions_total: AtomicU64,
    /// Bytes put by the largest of those transactions.
    txn_bytes_max: AtomicU64,
}

/// The upkeep's counts since this monitor started, for `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UpkeepCounts {
    pub compactions: u64,
    pub defrags: u64,
    pub commit_transactions: u64,
    pub txn_bytes_max: u64,
}

impl EtcdUpkeep {
    pub fn new(
        settings: UpkeepSettings,
        compact_interval: watch::Receiver<Duration>,
        own: Option<OwnMember>,
        credentials: Option<EtcdCredentials>,
    ) -> Self {
        EtcdUpkeep {
            settings,
            compact_interval,
            own,
            credentials,
            log: Mutex::new((None, CommitLog::default())),
            wake: Notify::new(),
            view: watch::channel(EtcdStatus::default()).0,
            own_status: Mutex::new(None),
            compactions_total: AtomicU64::new(0),
            defrags_total: AtomicU64::new(0),
            commit_transactions_total: AtomicU64::new(0),
            txn_bytes_max: AtomicU64::new(0),
        }
    }

    pub fn counts(&self) -> UpkeepCounts {
        use std::sync::atomic::Ordering::Relaxed;
        UpkeepCounts {
            compactions: self.compactions_total.load(Relaxed),
            defrags: self.defrags_total.load(Relaxed),
            commit_transactions: self.commit_transactions_total.load(Relaxed),
            txn_bytes_max: self.txn_bytes_max.load(Relaxed),
        }
    }

    pub fn compact_interval(&self) -> Duration {
        *self.compact_interval.borrow()
    }

    /// Counts a commit of the leader's: the bytes of keys and values it wrote, in
    /// transactions up to `written.revision`.
    pub fn record_commit(&self, fence: Fence, written: &crate::store::Written) {
        use std::sync::atomic::Ordering::Relaxed;
        self.commit_transactions_total
            .fetch_add(u64::from(written.transactions), Relaxed);
        self.txn_bytes_max.fetch_max(written.txn_bytes_max, Relaxed);
        let mut log = self.log.lock().expect("commit log lock");
        if log.0 != Some(fence) {
            *log = (Some(fence), CommitLog::default());
        }
        log.1.record(written.revision, written.bytes);
        if log.1.compaction_due(self.settings.history_bytes) {
            self.wake.notify_one();
        }
    }

    /// What the monitor last saw of etcd.
    pub fn status(&self) -> EtcdStatus {
        self.view.borrow().clone()
    }

    /// The own member's last status, for `GET /v1/mon` (peers read it from there).
    pub fn own_member_status(&self) -> Option<EtcdMemberStatus> {
        self.own_status.lock().expect("own status lock").clone()
    }
}

/// What the loop remembers between rounds.
struct Rounds {
    /// When the upkeep started.
    started: Instant,
    clients: MemberClients,
    /// Last compaction by this monitor while leading: (fence, revision, Unix ms).
    compacted: Option<(Fence, u64, u64)>,
    last_compaction: Option<Instant>,
    /// Last defragmentation of each member by this monitor.
    defragged: BTreeMap<String, Instant>,
    last_defrag_unix_ms: Option<u64>,
    recovery: Option<String>,
    no_leader_since: Option<Instant>,
}

use crate::service::unix_now_ms as unix_ms;

/// Runs the upkeep until `shutdown`. Errors of one round are logged and the next round tries
/// again: etcd being away is what the rest of the monitor reports.
pub async fn run(
    upkeep: std::sync::Arc<EtcdUpkeep>,
    client: Client,
    keys: Keyspace,
    me: MonMember,
    role: watch::Receiver<Role>,
    mut shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let mut rounds = Rounds {
        started: Instant::now(),
        clients: MemberClients::new(upkeep.credentials.clone()),
        compacted: None,
        last_compaction: None,
        defragged: BTreeMap::new(),
        last_defrag_unix_ms: None,
        recovery: None,
        no_leader_since: None,
    };
    let mut interval = upkeep.compact_interval.clone();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(UPKEEP_POLL) => {}
            _ = upkeep.wake.notified() => {}
            // A changed interval (compaction turned on, say) acts at once.
            Ok(()) = interval.changed() => {}
            _ = shutdown.changed() => {}
        }
        if *shutdown.borrow() {
            return Ok(());
        }
        let role = role.borrow().clone();
        round(&upkeep, &mut rounds, client.clone(), &keys, &me, role).await;
    }
}

/// One round: look, compact, defragment, clear the alarm, publish.
async fn round(
    upkeep: &EtcdUpkeep,
    rounds: &mut Rounds,
    mut client: Client,
    keys: &Keyspace,
    me: &MonMember,
    role: Role,
) {
    let members = match observe::members(&mut client).await {
        Ok(m) => m,
        Err(e) => {
            tracing::debug!("etcd upkeep: {e}");
            return;
        }
    };
    let all = matches!(role, Role::Leader { .. });
    let (mut statuses, revision) = look(upkeep, rounds, &members, &mut client, keys, me, all).await;
    let alarms = observe::alarms(&mut client, &members)
        .await
        .unwrap_or_else(|e| {
            tracing::debug!("etcd upkeep: {e}");
            Vec::new()
        });
    let nospace = alarms
        .iter()
        .any(|(_, a)| a.alarm == fastblock_types::etcd::ETCD_ALARM_NOSPACE);
    let leader_fence = match &role {
        Role::Leader { fence } => Some(*fence),
        Role::Follower { .. } => None,
    };
    let leaderless = matches!(role, Role::Follower { leader: None });
    rounds.no_leader_since = match (leaderless, rounds.no_leader_since) {
        (true, None) => Some(Instant::now()),
        (true, since) => since,
        (false, _) => None,
    };
    let compacting = !upkeep.compact_interval().is_zero();
    let mut compacted_now = false;
    if compacting {
        if let Some(fence) = leader_fence {
            compacted_now =
                maybe_compact(upkeep, rounds, &mut client, fence, revision, nospace).await;
        } else if nospace
            && rounds
                .no_leader_since
                .is_some_and(|t| t.elapsed() >= NO_LEADER_GRACE)
        {
            compacted_now = compact(upkeep, &mut client, revision).await.is_ok();
        }
    }
    let all = leader_fence.is_some();
    // Out of space with compaction off, nothing a defragmentation could give back is free,
    // and it would block the member for as long as it takes to copy all of its data (seconds
    // per GiB: long enough for a lone member's monitor to lose its lease).
    let defragged = if nospace && !compacting {
        false
    } else {
        defragment(upkeep, rounds, &members, &statuses, leader_fence, nospace).await
    };
    if defragged {
        (statuses, _) = look(upkeep, rounds, &members, &mut client, keys, me, all).await;
    }
    if nospace && compacting && (leader_fence.is_some() || rounds.no_leader_since.is_some()) {
        let sizes: Vec<u64> = statuses
            .iter()
            .filter(|s| s.error.is_none())
            .map(|s| s.db_size_bytes)
            .collect();
        if policy::room_made(&sizes, &upkeep.settings) {
            disarm(rounds, &mut client, &alarms, &sizes).await;
        } else if compacted_now {
            rounds.recovery = Some(format!(
                "compacted to revision {revision}; the members are still at {} of the quota: \
                 waiting for their defragmentation",
                sizes
                    .iter()
                    .map(|b| fastblock_types::units::format_size(*b))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    let alarms = if nospace {
        observe::alarms(&mut client, &members)
            .await
            .unwrap_or_default()
    } else {
        alarms
    };
    let compaction = rounds
        .compacted
        .filter(|(f, _, _)| Some(*f) == leader_fence);
    upkeep.view.send_replace(EtcdStatus {
        members: statuses,
        quota_bytes: upkeep.settings.quota_bytes,
        nearfull_ratio_ppm: upkeep.settings.nearfull_ratio_ppm,
        revision,
        compacted_revision: compaction.map(|c| c.1),
        last_compaction_unix_ms: compaction.map(|c| c.2),
        compact_interval_ms: upkeep.compact_interval().as_millis() as u64,
        alarms: alarms.into_iter().map(|(_, a)| a).collect(),
        last_defrag_unix_ms: rounds.last_defrag_unix_ms,
        recovery: rounds.recovery.clone(),
        observed_unix_ms: unix_ms(),
    });
}

/// Each member's status and the store's revision: the members this monitor reaches, asked
/// directly; with own members, the others' from their monitors if `all` (the leader, whose
/// view health reads), else only its own.
#[allow(clippy::too_many_arguments)]
async fn look(
    upkeep: &EtcdUpkeep,
    rounds: &mut Rounds,
    members: &[Member],
    client: &mut Client,
    keys: &Keyspace,
    me: &MonMember,
    all: bool,
) -> (Vec<EtcdMemberStatus>, u64) {
    let mut statuses = Vec::new();
    let mut revision = 0;
    let peers = match &upkeep.own {
        Some(_) if all => peer_monitors(client, keys, me).await,
        _ => Vec::new(),
    };
    for member in members {
        let mine = upkeep
            .own
            .as_ref()
            .is_none_or(|own| own.name == member.name);
        if !mine && !all {
            continue;
        }
        let status = if mine {
            let endpoint = upkeep
                .own
                .as_ref()
                .map_or(&member.endpoint, |o| &o.endpoint);
            let asked = Member {
                endpoint: endpoint.clone(),
                ..member.clone()
            };
            let (status, rev) = observe::member_status(&mut rounds.clients, &asked).await;
            revision = revision.max(rev.unwrap_or(0));
            if upkeep.own.is_some() {
                *upkeep.own_status.lock().expect("own status lock") = Some(status.clone());
            }
            status
        } else {
            let peer = peers.iter().find(|p| p.name == member.name);
            let seen = match peer {
                Some(p) => observe::peer_member_status(p).await,
                None => None,
            };
            seen.unwrap_or_else(|| EtcdMemberStatus {
                name: member.name.clone(),
                endpoint: member.endpoint.clone(),
                error: Some(format!(
                    "its monitor did not answer for it (mon.{} at {})",
                    member.name,
                    peer.map_or("an unknown address", |p| p.api_addr.as_str())
                )),
                ..EtcdMemberStatus::default()
            })
        };
        statuses.push(status);
    }
    (statuses, revision)
}

/// The other monitors, from their member keys.
async fn peer_monitors(client: &mut Client, keys: &Keyspace, me: &MonMember) -> Vec<MonMember> {
    let opts = etcd_client::GetOptions::new().with_prefix();
    let Ok(Ok(resp)) = tokio::time::timeout(
        observe::ETCD_CALL_TIMEOUT,
        client.get(keys.members_prefix(), Some(opts)),
    )
    .await
    else {
        return Vec::new();
    };
    resp.kvs()
        .iter()
        .filter_map(|kv| serde_json::from_slice::<MonMember>(kv.value()).ok())
        .filter(|m| m.name != me.name)
        .collect()
}

/// The leader's compaction: when its interval came round, it wrote past the budget, or etcd is
/// out of space (then to the current revision: nothing of the history is worth a stopped
/// cluster). Returns whether it compacted.
async fn maybe_compact(
    upkeep: &EtcdUpkeep,
    rounds: &mut Rounds,
    client: &mut Client,
    fence: Fence,
    revision: u64,
    nospace: bool,
) -> bool {
    let interval_due = rounds
        .last_compaction
        .is_none_or(|t| t.elapsed() >= upkeep.compact_interval());
    let (target, due) = {
        let log = upkeep.log.lock().expect("commit log lock");
        let ours = if log.0 == Some(fence) {
            log.1.clone()
        } else {
            CommitLog::default()
        };
        let compacted = rounds
            .compacted
            .filter(|(f, _, _)| *f == fence)
            .map_or(0, |c| c.1);
        let target = if nospace {
            (revision > compacted).then_some(revision)
        } else {
            policy::compaction_target(&ours, revision, compacted, &upkeep.settings)
        };
        let due = nospace || interval_due || ours.compaction_due(upkeep.settings.history_bytes);
        (target, due)
    };
    let (Some(target), true) = (target, due) else {
        return false;
    };
    match compact(upkeep, client, target).await {
        Ok(()) => {
            rounds.compacted = Some((fence, target, unix_ms()));
            rounds.last_compaction = Some(Instant::now());
            let mut log = upkeep.log.lock().expect("commit log lock");
            if log.0 == Some(fence) {
                log.1.compacted(target);
            }
            true
        }
        Err(e) => {
            tracing::warn!(target, "etcd compaction: {e}");
            false
        }
    }
}

/// Compacts etcd's history to `revision` (physically: the call returns once the old
/// revisions' pages are free). A revision compacted already counts as done.
async fn compact(upkeep: &EtcdUpkeep, client: &mut Client, revision: u64) -> Result<(), String> {
    if revision == 0 {
        return Ok(());
    }
    let call = client.compact(
        revision as i64,
        Some(CompactionOptions::new().with_physical()),
    );
    match tokio::time::timeout(DEFRAG_TIMEOUT, call).await {
        Ok(Ok(_)) => {
            upkeep.compactions_total.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(revision, "etcd history compacted");
            Ok(())
        }
        Ok(Err(e))
            if e.to_string()
                .contains("required revision has been compacted") =>
        {
            Ok(())
        }
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {DEFRAG_TIMEOUT:?}")),
    }
}

/// Defragments the members this monitor looks after that need it, one at a time. Returns
/// whether any was.
async fn defragment(
    upkeep: &EtcdUpkeep,
    rounds: &mut Rounds,
    members: &[Member],
    statuses: &[EtcdMemberStatus],
    leader_fence: Option<Fence>,
    nospace: bool,
) -> bool {
    let mine: Vec<&Member> = match &upkeep.own {
        Some(own) => {
            // Own members: each monitor its own, in its slot.
            let Some(index) = members.iter().position(|m| m.name == own.name) else {
                return false;
            };
            if !in_own_slot(index, members.len(), unix_ms()) {
                return false;
            }
            members.iter().filter(|m| m.name == own.name).collect()
        }
        // An external etcd: the leader, every member in turn.
        None if leader_fence.is_some() => members.iter().collect(),
        None => return false,
    };
    let mut any = false;
    for member in mine {
        let Some(status) = statuses.iter().find(|s| s.name == member.name) else {
            continue;
        };
        if status.error.is_some() {
            continue;
        }
        // Never defragmented by this monitor: the schedule counts from its start.
        let since = Some(
            rounds
                .defragged
                .get(&member.name)
                .unwrap_or(&rounds.started)
                .elapsed(),
        );
        let reason = policy::defrag_reason(
            status.db_size_bytes,
            status.db_size_in_use_bytes,
            nospace,
            since,
            &upkeep.settings,
        );
        // Under NOSPACE, at most once a slot: pages free up as the compaction proceeds.
        let recent = rounds
            .defragged
            .get(&member.name)
            .is_some_and(|t| t.elapsed() < DEFRAG_SLOT);
        let Some(reason) = reason.filter(|r| *r != DefragReason::NoSpace || !recent) else {
            continue;
        };
        let endpoint = upkeep
            .own
            .as_ref()
            .map_or(member.endpoint.clone(), |o| o.endpoint.clone());
        let Ok(mut c) = rounds.clients.get(&endpoint).await else {
            continue;
        };
        let started = Instant::now();
        match tokio::time::timeout(DEFRAG_TIMEOUT, c.defragment()).await {
            Ok(Ok(_)) => {
                upkeep.defrags_total.fetch_add(1, Ordering::Relaxed);
                rounds.defragged.insert(member.name.clone(), Instant::now());
                rounds.last_defrag_unix_ms = Some(unix_ms());
                any = true;
                tracing::info!(
                    member = %member.name, ?reason, took = ?started.elapsed(),
                    db = status.db_size_bytes, in_use = status.db_size_in_use_bytes,
                    "etcd member defragmented"
                );
            }
            Ok(Err(e)) => tracing::warn!(member = %member.name, "etcd defragmentation: {e}"),
            Err(_) => tracing::warn!(
                member = %member.name,
                "etcd defragmentation: no answer within {DEFRAG_TIMEOUT:?}"
            ),
        }
    }
    any
}

/// Whether, at `now_unix_ms`, member `index` of `count` (ordered by name) is in the first half
/// of its defragmentation slot.
fn in_own_slot(index: usize, count: usize, now_unix_ms: u64) -> bool {
    let slot_ms = DEFRAG_SLOT.as_millis() as u64;
    let round_ms = slot_ms * count.max(1) as u64;
    let into_round = now_unix_ms % round_ms;
    let start = slot_ms * index as u64;
    into_round >= start && into_round < start + slot_ms / 2
}

/// Clears the `NOSPACE` alarms (room was made) and says so.
async fn disarm(
    rounds: &mut Rounds,
    client: &mut Client,
    alarms: &[(u64, fastblock_types::etcd::EtcdAlarm)],
    sizes: &[u64],
) {
    let mut cleared = Vec::new();
    for (member_id, alarm) in alarms {
        if alarm.alarm != fastblock_types::etcd::ETCD_ALARM_NOSPACE {
            continue;
        }
        let mut opts = AlarmOptions::new();
        opts.with_member(*member_id);
        let call = client.alarm(AlarmAction::Deactivate, AlarmType::Nospace, Some(opts));
        match tokio::time::timeout(observe::ETCD_CALL_TIMEOUT, call).await {
            Ok(Ok(_)) => cleared.push(alarm.member.clone()),
            Ok(Err(e)) => tracing::warn!(member = %alarm.member, "clearing etcd NOSPACE: {e}"),
            Err(_) => tracing::warn!(member = %alarm.member, "clearing etcd NOSPACE: no answer"),
        }
    }
    if !cleared.is_empty() {
        let message = format!(
            "etcd NOSPACE cleared on {}: the history was compacted and the members \
             defragmented (now {})",
            cleared.join(", "),
            sizes
                .iter()
                .map(|b| fastblock_types::units::format_size(*b))
                .collect::<Vec<_>>()
                .join(", ")
        );
        tracing::warn!("{message}");
        rounds.recovery = Some(message);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defragmentation_slots_never_overlap() {
        let slot = DEFRAG_SLOT.as_millis() as u64;
        for count in 1..=5usize {
            for t in (0..slot * count as u64 * 2).step_by(250) {
                let turns = (0..count).filter(|i| in_own_slot(*i, count, t)).count();
                assert!(turns <= 1, "count {count} at {t}: {turns} members at once");
            }
            // Every member gets a turn in a round.
            for i in 0..count {
                let start = slot * i as u64;
                assert!(in_own_slot(i, count, start), "member {i} of {count}");
                assert!(!in_own_slot(i, count, start + slot / 2));
            }
        }
    }
}

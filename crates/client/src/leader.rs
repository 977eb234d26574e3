//! Leader discovery: the cached leader of a PG, else `GetLeader` asked of the PG's members in
//! the order of `route::leader_candidates` (the map's recorded leader first, then the up
//! members). The first answer naming a leader wins and is cached.

use crate::cluster::{Cluster, Counters};
use crate::conn::ConnectError;
use crate::route::{self, Target};
use crate::ClientError;
use fastblock_types::PgId;
use fastblock_wire::Status;
use fastblock_wire::{LeaderHint, Reply, Request};
use std::time::Duration;

/// Why no leader target was found.
pub(crate) enum NoLeader {
    /// Retryable, as text for the eventual `ClientError::Timeout`.
    Retry(String),
    /// The data plane refused this client (authentication, caps): final.
    Final(ClientError),
}

/// Whether an OSD's error status refuses this client itself rather than this attempt.
pub(crate) fn is_auth_refusal(status: Status) -> bool {
    matches!(
        status,
        Status::AuthRequired | Status::AuthFailed | Status::PermissionDenied
    )
}

impl Cluster {
    /// Where to send `pg`'s next request.
    pub(crate) async fn leader_target(
        &self,
        pg: PgId,
        timeout: Duration,
    ) -> Result<Target, NoLeader> {
        if let Some(target) = self.cache.leader(pg) {
            return Ok(target);
        }
        self.discover_leader(pg, timeout).await
    }

    async fn discover_leader(&self, pg: PgId, timeout: Duration) -> Result<Target, NoLeader> {
        let mut map = self.cache.map();
        if map.pg(pg).is_none() {
            self.refresh_map("PG not in the map").await;
            map = self.cache.map();
        }
        let Some(info) = map.pg(pg) else {
            return Err(NoLeader::Retry(format!(
                "PG {pg} is not in the map of epoch {}",
                map.epoch
            )));
        };
        let candidates = route::leader_candidates(&map, pg);
        if candidates.is_empty() {
            return Err(NoLeader::Retry(format!(
                "no member of PG {pg} {:?} is up in the map of epoch {}",
                info.osdlist, map.epoch
            )));
        }
        let mut notes = Vec::with_capacity(candidates.len());
        for osd in candidates {
            let Some(target) = route::target_in_map(&map, osd, pg) else {
                notes.push(format!("osd.{osd}: no address in the map"));
                continue;
            };
            let mode = map.auth.mode;
            let (conn, fresh) = match self
                .pool
                .get(&target.address, target.port, target.osd, mode)
                .await
            {
                Ok(conn) => conn,
                Err(ConnectError::Refused { status, message }) => {
                    if self.refusal_may_pass(status).await {
                        return Err(NoLeader::Retry(format!(
                            "{target}: {message}; the monitor accepts this client's key: \
                             retrying with a new ticket"
                        )));
                    }
                    return Err(NoLeader::Final(ClientError::Auth {
                        target: target.to_string(),
                        status,
                        message,
                    }));
                }
                Err(why) => {
                    notes.push(format!("{target}: {why}"));
                    continue;
                }
            };
            if fresh {
                Counters::bump(&self.counters.connects);
            }
            let request = Request::GetLeader {
                pg,
                epoch: map.epoch,
            };
            match conn.call(&request, timeout).await {
                Ok(Reply::Leader(hint))
                | Ok(Reply::Error {
                    leader: Some(hint), ..
                }) => {
                    if let Some(leader) = self.maybe_learn_leader(pg, &hint) {
                        return Ok(leader);
                    }
                    notes.push(format!("{target}: leader unknown"));
                }
                Ok(Reply::Error {
                    status, message, ..
                }) if is_auth_refusal(status) => {
                    return Err(NoLeader::Final(ClientError::Auth {
                        target: target.to_string(),
                        status: Some(status),
                        message,
                    }))
                }
                Ok(Reply::Error {
                    status, message, ..
                }) => notes.push(format!("{target}: {status:?} {message}")),
                Ok(other) => notes.push(format!(
                    "{target}: unexpected {} reply to GetLeader",
                    reply_name(&other)
                )),
                Err(e) => notes.push(format!("{target}: {e}")),
            }
        }
        Err(NoLeader::Retry(format!(
            "no leader found for PG {pg}: {}",
            notes.join("; ")
        )))
    }

    /// Caches the leader a hint names, if it names one we can reach; returns its target. A
    /// leader the map does not know triggers a map refresh in the background (the hint's own
    /// address is used meanwhile).
    pub(crate) fn maybe_learn_leader(&self, pg: PgId, hint: &LeaderHint) -> Option<Target> {
        let map = self.cache.map();
        let target = route::target_from_hint(&map, hint, pg)?;
        if !map.osds.contains_key(&hint.osd) {
            self.spawn_refresh_map("a leader hint names an OSD the map does not know");
        }
        self.cache.set_leader(pg, target.clone());
        Some(target)
    }
}

/// A short name of a reply's kind, for messages (never the data).
pub(crate) fn reply_name(reply: &Reply) -> &'static str {
    match reply {
        Reply::Ok => "Ok",
        Reply::Data(_) => "Data",
        Reply::Leader(_) => "Leader",
        Reply::Digest { .. } => "Digest",
        Reply::Allocated(_) => "Allocated",
        Reply::Space { .. } => "Space",
        Reply::Usage { .. } => "Usage",
        Reply::Error { .. } => "Error",
    }
}

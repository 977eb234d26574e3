//! The tickets a client or an OSD holds for the OSDs it connects to (`docs/security.md`,
//! "Tickets"): fetched from the monitor when first needed, kept until half their life has
//! passed, asked for in one call for every OSD whose connection is waiting on one.
//!
//! Connections are made with a ticket and outlive it; only new connections need a fresh one.

use fastblock_auth::handshake::HeldTicket;
use fastblock_auth::ticket::TICKET_LIFETIME_SECS;
use fastblock_auth::EntityName;
use fastblock_monclient::{MonClient, MonError};
use fastblock_types::api::TICKETS_PER_CALL_MAX;
use fastblock_types::OsdId;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

/// Why no ticket could be had.
#[derive(Debug, thiserror::Error)]
pub enum TicketError {
    /// The monitor could not be asked, or refused (its error says whether to retry).
    #[error("asking the monitor for a ticket to osd.{osd}: {error}")]
    Monitor { osd: u32, error: MonError },
    /// The monitor has no key for this OSD (not created, or purged).
    #[error("the monitor issues no ticket for osd.{0}: it has no key for it (purged, or not of this cluster)")]
    UnknownOsd(u32),
    /// No monitor to ask (a client over an injected map) and no ticket was given.
    #[error("no ticket for osd.{0} and no monitor to ask for one")]
    NoMonitor(u32),
}

impl TicketError {
    /// Whether asking again later may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            TicketError::Monitor { error, .. } => match error {
                MonError::Api(e) => e.code.retryable(),
                MonError::Unreachable { .. } => true,
                MonError::Protocol { .. } => false,
            },
            // The map may be ahead of the key table (an OSD just created).
            TicketError::UnknownOsd(_) => true,
            TicketError::NoMonitor(_) => false,
        }
    }
}

/// Tickets of one entity, by target OSD.
pub struct Tickets {
    mon: Option<Arc<MonClient>>,
    entity: EntityName,
    held: Mutex<HashMap<OsdId, HeldTicket>>,
    /// OSDs someone is waiting for a ticket to: the next fetch asks for all of them.
    wanted: Mutex<BTreeSet<OsdId>>,
    /// One fetch at a time; a waiter that finds its ticket after taking it does not fetch.
    fetch: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Tickets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tickets")
            .field("entity", &self.entity)
            .field("held", &lock(&self.held).len())
            .finish_non_exhaustive()
    }
}

/// Whether a ticket is still good for a new connection: more than half its life left.
fn fresh(t: &HeldTicket, now: u64) -> bool {
    t.claims.expires_unix_s.saturating_sub(now) > TICKET_LIFETIME_SECS / 2
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Tickets {
    /// Tickets fetched through `mon`, which must hold the entity's credentials.
    pub fn from_monitor(mon: Arc<MonClient>) -> Option<Arc<Tickets>> {
        let entity = mon.credentials()?.0.clone();
        Some(Arc::new(Tickets {
            mon: Some(mon),
            entity,
            held: Mutex::default(),
            wanted: Mutex::default(),
            fetch: tokio::sync::Mutex::new(()),
        }))
    }

    /// Tickets given by the caller only (tests over an injected map; tools that issue their
    /// own): [`Tickets::insert`] them.
    pub fn given(entity: EntityName) -> Arc<Tickets> {
        Arc::new(Tickets {
            mon: None,
            entity,
            held: Mutex::default(),
            wanted: Mutex::default(),
            fetch: tokio::sync::Mutex::new(()),
        })
    }

    pub fn entity(&self) -> &EntityName {
        &self.entity
    }

    pub fn insert(&self, osd: OsdId, ticket: HeldTicket) {
        lock(&self.held).insert(osd, ticket);
    }

    /// Drops the ticket for `osd` (the OSD called it stale: a rotation or a change of caps
    /// since it was issued), so the next connection asks for a new one.
    pub fn forget(&self, osd: OsdId) {
        lock(&self.held).remove(&osd);
    }

    fn cached(&self, osd: OsdId, now: u64) -> Option<HeldTicket> {
        lock(&self.held)
            .get(&osd)
            .filter(|t| self.mon.is_none() || fresh(t, now))
            .cloned()
    }

    /// A ticket for a new connection to `osd`.
    pub async fn get(&self, osd: OsdId) -> Result<HeldTicket, TicketError> {
        if let Some(t) = self.cached(osd, fastblock_monclient::now_unix_s()) {
            return Ok(t);
        }
        let Some(mon) = &self.mon else {
            return Err(TicketError::NoMonitor(osd.0));
        };
        lock(&self.wanted).insert(osd);
        let _fetching = self.fetch.lock().await;
        if let Some(t) = self.cached(osd, fastblock_monclient::now_unix_s()) {
            return Ok(t);
        }
        // Everyone waiting so far, this OSD first (a fetch since may have taken it from the
        // set and come back without its ticket: asked again here).
        let batch: Vec<OsdId> = {
            let mut wanted = lock(&self.wanted);
            wanted.remove(&osd);
            let mut batch = vec![osd];
            while batch.len() < TICKETS_PER_CALL_MAX {
                let Some(next) = wanted.pop_first() else {
                    break;
                };
                batch.push(next);
            }
            batch
        };
        let got = match mon.tickets(&batch).await {
            Ok(got) => got,
            Err(error) => {
                // The others try again themselves.
                let mut wanted = lock(&self.wanted);
                wanted.extend(batch.iter().skip(1));
                return Err(TicketError::Monitor { osd: osd.0, error });
            }
        };
        // This OSD's ticket is returned as received, fresh or not by this host's clock (a
        // clock far ahead of the monitor's would otherwise never find one fresh).
        let mut mine = None;
        let mut held = lock(&self.held);
        for (id, t) in got {
            if id == osd {
                mine = Some(t.clone());
            }
            held.insert(id, t);
        }
        mine.ok_or(TicketError::UnknownOsd(osd.0))
    }
}

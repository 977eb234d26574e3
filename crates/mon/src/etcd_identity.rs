//! Is the etcd at the own member's addresses really this monitor's member?
//!
//! Something else may hold those addresses: on a Debian host the distribution's
//! `etcd.service` (package `etcd-server`, which fastblock's package recommends) listens on
//! `localhost:2379` and `:2380`, the monitor's defaults. The own member then cannot bind and
//! exits, while a client connected to the member's client URL gets answers from the other
//! etcd: three monitors would keep three independent cluster maps and hand out OSD ids twice.
//! So a monitor uses etcd only once the member answering at its client URL has its own
//! member name and peer URL ([`wait_own_member`]), and the member supervisor checks, after
//! each exit of the member, whether another process holds one of its addresses
//! ([`address_held`]). Either refusal is a [`crate::supervise::Misconfiguration`]: the monitor
//! exits with status 2, which its systemd unit does not restart.
//!
//! The cluster token cannot be checked: etcd's client API shows neither it nor anything
//! derived from it that this code could recompute without re-implementing etcd's member ids.

use crate::etcd_proc::EtcdMemberConfig;
use std::time::Duration;

/// What an operator can do about it, for every refusal.
const REMEDY: &str = "stop it (for the distribution's etcd: systemctl disable --now etcd) or \
                      give this monitor other --etcd-client-addr/--etcd-peer-addr; the monitor \
                      does not use an etcd that is not its own member";

/// Why the etcd at the own member's addresses is not the own member.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotOwnMember {
    #[error(
        "the etcd answering at {client_url} is not this monitor's own member: it is member \
         {answered_name:?} with peer URLs {answered_peer_urls:?}, while this monitor's is \
         {expected_name:?} with peer URL {expected_peer_url}. Another etcd (such as the \
         distribution's etcd.service) listens there: {REMEDY}"
    )]
    Foreign {
        client_url: String,
        answered_name: String,
        answered_peer_urls: Vec<String>,
        expected_name: String,
        expected_peer_url: String,
    },
    #[error(
        "the etcd answering at {client_url} has this monitor's member name {name:?} but peer \
         URLs {answered_peer_urls:?}, not {expected_peer_url}: either another etcd with the \
         same name listens there, or this member's data directory was made with another \
         --etcd-peer-addr (etcd keeps the peer URLs it was created with). For another etcd: \
         {REMEDY}"
    )]
    PeerUrlChanged {
        client_url: String,
        name: String,
        answered_peer_urls: Vec<String>,
        expected_peer_url: String,
    },
    #[error(
        "the etcd answering at {client_url} is member {member_id:x}, which its own member \
         list does not hold: not this monitor's member. {REMEDY}"
    )]
    Unlisted { client_url: String, member_id: u64 },
    #[error(
        "another process listens on {addr}, this monitor's etcd {role} address, so its own \
         etcd member cannot start there (it exited: {exit}). Such as the distribution's \
         etcd.service: {REMEDY}"
    )]
    AddressHeld {
        addr: String,
        role: &'static str,
        exit: String,
    },
}

/// One entry of etcd's member list, as far as the check needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedMember {
    pub id: u64,
    pub name: String,
    pub peer_urls: Vec<String>,
}

/// Whether `answering` (the id in the header of the answer at the member's client URL) is the
/// member `config` describes, given the member list that etcd returned.
pub fn judge(
    config: &EtcdMemberConfig,
    answering: u64,
    members: &[ListedMember],
) -> Result<(), NotOwnMember> {
    let client_url = config.client_url();
    let expected_peer_url = config.peer_url();
    let Some(member) = members.iter().find(|m| m.id == answering) else {
        return Err(NotOwnMember::Unlisted {
            client_url,
            member_id: answering,
        });
    };
    let peer_matches = member.peer_urls.contains(&expected_peer_url);
    match (member.name == config.name, peer_matches) {
        (true, true) => Ok(()),
        (true, false) => Err(NotOwnMember::PeerUrlChanged {
            client_url,
            name: member.name.clone(),
            answered_peer_urls: member.peer_urls.clone(),
            expected_peer_url,
        }),
        (false, _) => Err(NotOwnMember::Foreign {
            client_url,
            answered_name: member.name.clone(),
            answered_peer_urls: member.peer_urls.clone(),
            expected_name: config.name.clone(),
            expected_peer_url,
        }),
    }
}

/// One look at the etcd answering at the member's client URL: `None` if it does not answer
/// (yet), else the verdict.
async fn check_once(
    client: &mut etcd_client::Client,
    config: &EtcdMemberConfig,
) -> Option<Result<(), NotOwnMember>> {
    let status = client.status().await.ok()?;
    let answering = status.header()?.member_id();
    let list = client.member_list().await.ok()?;
    let members: Vec<ListedMember> = list
        .members()
        .iter()
        .map(|m| ListedMember {
            id: m.id(),
            name: m.name().to_string(),
            peer_urls: m.peer_urls().to_vec(),
        })
        .collect();
    Some(judge(config, answering, &members))
}

/// How often a monitor that waits for its member says so.
const WAITING_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Waits until the etcd at the member's client URL answers, then says whether it is the own
/// member. A member answers only once a majority of `--initial-cluster` runs, so there is no
/// deadline: the wait is logged every [`WAITING_LOG_INTERVAL`], and a member that cannot start
/// ends it through the member supervisor instead.
pub async fn wait_own_member(
    mut client: etcd_client::Client,
    config: &EtcdMemberConfig,
) -> Result<(), NotOwnMember> {
    let started = tokio::time::Instant::now();
    let mut next_log = started + WAITING_LOG_INTERVAL;
    loop {
        // The client's own request timeout bounds each call; this bounds the pair.
        let look = tokio::time::timeout(Duration::from_secs(10), check_once(&mut client, config));
        if let Ok(Some(verdict)) = look.await {
            if verdict.is_ok() {
                tracing::info!(client = %config.client_url(), "etcd member is this monitor's own");
            }
            return verdict;
        }
        if tokio::time::Instant::now() >= next_log {
            tracing::warn!(
                client = %config.client_url(),
                waited = ?started.elapsed(),
                "this monitor's etcd member does not answer yet (it answers once a majority of \
                 --initial-cluster runs); not campaigning until it does"
            );
            next_log += WAITING_LOG_INTERVAL;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// After the own member exited: whether another process listens on one of its addresses
/// (nothing of ours can: the member is gone). `exit` says how the member ended.
pub async fn address_held(config: &EtcdMemberConfig, exit: &str) -> Option<NotOwnMember> {
    for (role, addr) in [("client", &config.client_addr), ("peer", &config.peer_addr)] {
        let probe = tokio::net::TcpStream::connect(addr.as_str());
        if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(1), probe).await {
            return Some(NotOwnMember::AddressHeld {
                addr: addr.clone(),
                role,
                exit: exit.to_string(),
            });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> EtcdMemberConfig {
        EtcdMemberConfig {
            binary: "etcd".into(),
            name: "a".into(),
            data_dir: "/nonexistent".into(),
            client_addr: "127.0.0.1:2379".into(),
            peer_addr: "127.0.0.1:2380".into(),
            initial_cluster: "a=http://127.0.0.1:2380,b=http://10.0.0.2:2380".into(),
            cluster_token: "fastblock".into(),
            quota_bytes: 2 << 30,
            peer_tls: None,
        }
    }

    fn member(id: u64, name: &str, peer: &str) -> ListedMember {
        ListedMember {
            id,
            name: name.into(),
            peer_urls: vec![peer.into()],
        }
    }

    #[test]
    fn the_own_member_is_accepted_among_its_peers() {
        let members = [
            member(1, "b", "http://10.0.0.2:2380"),
            member(2, "a", "http://127.0.0.1:2380"),
        ];
        assert_eq!(judge(&config(), 2, &members), Ok(()));
    }

    #[test]
    fn the_distributions_etcd_is_refused() {
        // Debian's etcd.service: name "default", peer URL on localhost.
        let members = [member(7, "default", "http://localhost:2380")];
        let err = judge(&config(), 7, &members).unwrap_err();
        assert!(matches!(err, NotOwnMember::Foreign { .. }), "{err:?}");
        let text = err.to_string();
        assert!(text.contains("http://127.0.0.1:2379"), "{text}");
        assert!(text.contains("\"default\""), "{text}");
        assert!(text.contains("systemctl disable --now etcd"), "{text}");
    }

    #[test]
    fn another_member_of_the_same_cluster_answering_is_refused() {
        let members = [
            member(1, "b", "http://10.0.0.2:2380"),
            member(2, "a", "http://127.0.0.1:2380"),
        ];
        let err = judge(&config(), 1, &members).unwrap_err();
        assert!(matches!(err, NotOwnMember::Foreign { .. }), "{err:?}");
    }

    #[test]
    fn the_own_name_with_another_peer_url_is_refused() {
        let members = [member(2, "a", "http://127.0.0.1:2390")];
        let err = judge(&config(), 2, &members).unwrap_err();
        assert!(
            matches!(err, NotOwnMember::PeerUrlChanged { .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("--etcd-peer-addr"), "{err}");
    }

    #[test]
    fn an_answer_from_an_unlisted_member_is_refused() {
        let members = [member(2, "a", "http://127.0.0.1:2380")];
        let err = judge(&config(), 3, &members).unwrap_err();
        assert!(matches!(err, NotOwnMember::Unlisted { .. }), "{err:?}");
    }
}

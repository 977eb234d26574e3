//! Who may do what, sans IO: the TLS mode of the server (NBD's NOTLS, SELECTIVETLS and
//! FORCEDTLS), the gate that mode puts in front of every option, and the per-export allow
//! lists (`--allow EXPORT=ID[,ID...]`). The handshake driver asks these questions; the rules
//! are written down in `docs/nbd.md` ("TLS" and "Allow lists").

use crate::consts::*;
use std::net::IpAddr;

/// Whether the server offers TLS, and whether it insists on it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TlsMode {
    /// No TLS (NBD's NOTLS): `STARTTLS` is answered `NBD_REP_ERR_UNSUP`.
    #[default]
    Off,
    /// TLS is offered and optional (NBD's SELECTIVETLS with no TLS-only export).
    On,
    /// TLS before anything else (NBD's FORCEDTLS).
    Require,
}

impl std::str::FromStr for TlsMode {
    type Err = String;
    fn from_str(s: &str) -> Result<TlsMode, String> {
        match s {
            "off" => Ok(TlsMode::Off),
            "on" => Ok(TlsMode::On),
            "require" => Ok(TlsMode::Require),
            other => Err(format!("TLS mode {other:?} is not off, on or require")),
        }
    }
}

impl std::fmt::Display for TlsMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TlsMode::Off => "off",
            TlsMode::On => "on",
            TlsMode::Require => "require",
        })
    }
}

/// What the gate says about one option, before the option itself is looked at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// Handle the option.
    Proceed,
    /// Answer `NBD_REP_ERR_TLS_REQD` (FORCEDTLS, before TLS).
    TlsRequired,
    /// `EXPORT_NAME` before TLS under FORCEDTLS: it cannot carry an error, so disconnect.
    Disconnect,
    /// `STARTTLS`: acknowledge it and start the TLS handshake.
    StartTls,
    /// `STARTTLS` answered with this error (no TLS offered, or TLS already running).
    RefuseStartTls(u32),
}

/// The gate of NBD's "TLS support" section for option `code`, given the server's mode and
/// whether this connection already runs TLS.
pub fn gate(mode: TlsMode, tls_active: bool, code: u32) -> Gate {
    if code == OPT_STARTTLS {
        return match (mode, tls_active) {
            // NOTLS: ERR_UNSUP (the spec allows UNSUP or POLICY).
            (TlsMode::Off, _) => Gate::RefuseStartTls(REP_ERR_UNSUP),
            // "If the server receives NBD_OPT_STARTTLS when TLS has already been
            // negotiated, it MUST reply with NBD_REP_ERR_INVALID."
            (_, true) => Gate::RefuseStartTls(REP_ERR_INVALID),
            (_, false) => Gate::StartTls,
        };
    }
    if mode != TlsMode::Require || tls_active || code == OPT_ABORT {
        return Gate::Proceed;
    }
    if code == OPT_EXPORT_NAME {
        Gate::Disconnect
    } else {
        Gate::TlsRequired
    }
}

/// What the server knows of the client on one connection.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Peer {
    /// The TCP source address (`None` on the Unix socket).
    pub addr: Option<IpAddr>,
    /// The common name of the client certificate, once TLS verified it (`--tls-verify-peer`).
    pub common_name: Option<String>,
    /// Set for a connection from this host (the Unix socket, or TCP from a loopback address),
    /// which the local-users gate judges (`local_users`).
    pub local: Option<LocalPeer>,
}

/// A client on this host.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LocalPeer {
    /// Its user id, when the server could find it (`None`: unknown, which is refused).
    pub uid: Option<u32>,
}

/// One way to name a client in an allow list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientId {
    /// A source address range (a single address has the full prefix length).
    Net { addr: IpAddr, prefix_bits: u8 },
    /// A verified client certificate's common name.
    CommonName(String),
}

/// Which exports a rule covers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExportPattern {
    /// `pool/image`.
    Exact(String),
    /// `pool/*`: every image of the pool.
    Pool(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllowRule {
    pub exports: ExportPattern,
    pub clients: Vec<ClientId>,
}

/// Why an `--allow` rule was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("--allow {rule:?}: {why}")]
pub struct AllowParseError {
    pub rule: String,
    pub why: String,
}

/// The per-export allow lists. An export that no rule covers is open to every client (that
/// passed the TLS gate). An export covered by one or more rules is restricted: a client may
/// use it when it matches an ID of any rule covering it, and for every other client it is
/// absent from `LIST` and `INFO`/`GO`/meta-context options on it are answered
/// `NBD_REP_ERR_POLICY` (`EXPORT_NAME` disconnects).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllowList {
    rules: Vec<AllowRule>,
}

impl AllowList {
    pub fn new(rules: Vec<AllowRule>) -> AllowList {
        AllowList { rules }
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Whether some rule names a client by certificate common name (which can only match
    /// when the server verifies client certificates).
    pub fn names_common_names(&self) -> bool {
        self.rules.iter().any(|r| {
            r.clients
                .iter()
                .any(|c| matches!(c, ClientId::CommonName(_)))
        })
    }

    /// Whether `peer` may use `export`.
    pub fn allows(&self, export: &str, peer: &Peer) -> bool {
        let mut restricted = false;
        for rule in self.rules.iter().filter(|r| r.exports.covers(export)) {
            restricted = true;
            if rule.clients.iter().any(|c| c.matches(peer)) {
                return true;
            }
        }
        !restricted
    }
}

impl ExportPattern {
    pub fn covers(&self, export: &str) -> bool {
        match self {
            ExportPattern::Exact(name) => name == export,
            ExportPattern::Pool(pool) => export
                .split_once('/')
                .is_some_and(|(p, image)| p == pool && !image.is_empty()),
        }
    }
}

impl ClientId {
    pub fn matches(&self, peer: &Peer) -> bool {
        match self {
            ClientId::CommonName(name) => peer.common_name.as_deref() == Some(name.as_str()),
            ClientId::Net { addr, prefix_bits } => peer
                .addr
                .is_some_and(|a| in_net(a.to_canonical(), *addr, *prefix_bits)),
        }
    }
}

fn in_net(addr: IpAddr, net: IpAddr, prefix_bits: u8) -> bool {
    match (addr, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = u32::MAX
                .checked_shl(32 - u32::from(prefix_bits))
                .unwrap_or(0);
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = u128::MAX
                .checked_shl(128 - u32::from(prefix_bits))
                .unwrap_or(0);
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

/// Parses `EXPORT=ID[,ID...]`: EXPORT is `pool/image` or `pool/*`; an ID that parses as an
/// address (`10.0.0.7`, `::1`) or a CIDR range (`10.0.0.0/8`) names source addresses, any
/// other ID a certificate common name.
pub fn parse_allow_rule(rule: &str) -> Result<AllowRule, AllowParseError> {
    let fail = |why: &str| AllowParseError {
        rule: rule.to_owned(),
        why: why.to_owned(),
    };
    let (export, ids) = rule
        .split_once('=')
        .ok_or_else(|| fail("expected EXPORT=ID[,ID...]"))?;
    let exports = match export.split_once('/') {
        Some((pool, "*")) if !pool.is_empty() => ExportPattern::Pool(pool.to_owned()),
        Some((pool, image)) if !pool.is_empty() && !image.is_empty() && !image.contains('*') => {
            ExportPattern::Exact(export.to_owned())
        }
        _ => return Err(fail("EXPORT must be pool/image or pool/*")),
    };
    let clients = ids
        .split(',')
        .map(|id| parse_client_id(id.trim()).map_err(|why| fail(&why)))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(AllowRule { exports, clients })
}

fn parse_client_id(id: &str) -> Result<ClientId, String> {
    if id.is_empty() {
        return Err("an empty client ID".into());
    }
    if let Ok(addr) = id.parse::<IpAddr>() {
        let prefix_bits = if addr.is_ipv4() { 32 } else { 128 };
        return Ok(ClientId::Net { addr, prefix_bits });
    }
    if let Some((addr, bits)) = id.split_once('/') {
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("{id:?} is not an address range (a.b.c.d/n)"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix_bits = bits
            .parse::<u8>()
            .ok()
            .filter(|b| *b <= max)
            .ok_or_else(|| format!("{id:?}: the prefix length is not 0..={max}"))?;
        return Ok(ClientId::Net { addr, prefix_bits });
    }
    Ok(ClientId::CommonName(id.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(addr: &str, cn: Option<&str>) -> Peer {
        Peer {
            addr: Some(addr.parse().unwrap()),
            common_name: cn.map(str::to_owned),
            local: None,
        }
    }

    fn list(rules: &[&str]) -> AllowList {
        AllowList::new(rules.iter().map(|r| parse_allow_rule(r).unwrap()).collect())
    }

    /// FORCEDTLS: only STARTTLS and ABORT pass before TLS; EXPORT_NAME cannot be answered an
    /// error, so it disconnects; after TLS everything passes and a second STARTTLS is
    /// INVALID. NOTLS never says TLS_REQD; SELECTIVETLS offers STARTTLS and forces nothing.
    #[test]
    fn gate_follows_the_tls_section_of_the_spec() {
        use TlsMode::*;
        assert_eq!(gate(Require, false, OPT_GO), Gate::TlsRequired);
        assert_eq!(gate(Require, false, OPT_INFO), Gate::TlsRequired);
        assert_eq!(gate(Require, false, OPT_LIST), Gate::TlsRequired);
        assert_eq!(gate(Require, false, OPT_EXPORT_NAME), Gate::Disconnect);
        assert_eq!(gate(Require, false, OPT_ABORT), Gate::Proceed);
        assert_eq!(gate(Require, false, OPT_STARTTLS), Gate::StartTls);
        assert_eq!(gate(Require, true, OPT_GO), Gate::Proceed);
        assert_eq!(gate(Require, true, OPT_EXPORT_NAME), Gate::Proceed);
        assert_eq!(
            gate(Require, true, OPT_STARTTLS),
            Gate::RefuseStartTls(REP_ERR_INVALID)
        );
        assert_eq!(gate(On, false, OPT_GO), Gate::Proceed);
        assert_eq!(gate(On, false, OPT_STARTTLS), Gate::StartTls);
        assert_eq!(
            gate(On, true, OPT_STARTTLS),
            Gate::RefuseStartTls(REP_ERR_INVALID)
        );
        assert_eq!(gate(Off, false, OPT_GO), Gate::Proceed);
        assert_eq!(
            gate(Off, false, OPT_STARTTLS),
            Gate::RefuseStartTls(REP_ERR_UNSUP)
        );
    }

    #[test]
    fn exports_without_a_rule_stay_open() {
        let allow = list(&["fb/secret=10.0.0.0/8"]);
        assert!(allow.allows("fb/other", &peer("192.168.1.1", None)));
        assert!(allow.allows("fb/other", &Peer::default()));
    }

    #[test]
    fn addresses_and_ranges() {
        let allow = list(&["fb/a=10.0.0.0/8,192.168.1.7", "fb/b=::1", "fb/c=0.0.0.0/0"]);
        assert!(allow.allows("fb/a", &peer("10.200.3.4", None)));
        assert!(allow.allows("fb/a", &peer("192.168.1.7", None)));
        assert!(!allow.allows("fb/a", &peer("192.168.1.8", None)));
        assert!(!allow.allows("fb/a", &peer("11.0.0.1", None)));
        assert!(allow.allows("fb/b", &peer("::1", None)));
        assert!(!allow.allows("fb/b", &peer("127.0.0.1", None)));
        // An IPv4 client seen on an IPv6 socket (::ffff:a.b.c.d) is its IPv4 address.
        assert!(allow.allows("fb/a", &peer("::ffff:10.1.2.3", None)));
        assert!(allow.allows("fb/c", &peer("8.8.8.8", None)));
        // The Unix socket has no address: address rules never match it.
        assert!(!allow.allows("fb/a", &Peer::default()));
    }

    #[test]
    fn common_names_and_pool_patterns() {
        let allow = list(&["fb/*=alice", "fb/shared=bob"]);
        assert!(allow.names_common_names());
        assert!(allow.allows("fb/x", &peer("127.0.0.1", Some("alice"))));
        assert!(!allow.allows("fb/x", &peer("127.0.0.1", Some("bob"))));
        assert!(!allow.allows("fb/x", &peer("127.0.0.1", None)));
        // Two rules cover fb/shared: either one's clients may use it.
        assert!(allow.allows("fb/shared", &peer("127.0.0.1", Some("bob"))));
        assert!(allow.allows("fb/shared", &peer("127.0.0.1", Some("alice"))));
        // Another pool is not covered by fb/*.
        assert!(allow.allows("fbx/x", &peer("127.0.0.1", None)));
        assert!(!allow.allows("fb/x", &peer("127.0.0.1", Some("alice2"))));
    }

    #[test]
    fn bad_rules_are_refused_with_the_reason() {
        for bad in [
            "fb/a",
            "fb=alice",
            "/a=alice",
            "fb/=alice",
            "fb/a*=alice",
            "fb/a=",
            "fb/a=alice,",
            "fb/a=10.0.0.0/33",
            "fb/a=10.0.0/8",
            "fb/a=::/129",
        ] {
            let e = parse_allow_rule(bad).expect_err(bad);
            assert!(e.to_string().contains(bad), "{e}");
        }
        assert!(!list(&["fb/a=10.0.0.1"]).names_common_names());
    }

    #[test]
    fn tls_modes_parse() {
        assert_eq!("require".parse::<TlsMode>(), Ok(TlsMode::Require));
        assert_eq!("on".parse::<TlsMode>(), Ok(TlsMode::On));
        assert_eq!("off".parse::<TlsMode>(), Ok(TlsMode::Off));
        assert!("yes".parse::<TlsMode>().is_err());
    }
}

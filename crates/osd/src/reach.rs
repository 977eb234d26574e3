//! Whether the address an OSD registers can be reached by the rest of the cluster.
//!
//! Clients and other OSDs connect to the address an OSD sends in its boot (`--address`,
//! default `127.0.0.1`). On one host that is fine; an OSD on loopback that registers with a
//! monitor on another address is almost always a multi-host setup missing `--address`: every
//! client and peer elsewhere would connect to its own loopback. The boot still goes ahead (a
//! monitor reached through a non-loopback address of this very host is a legitimate one-host
//! setup), but the OSD warns. [`loopback_registration_warning`] decides; the control task
//! resolves the monitors' names and logs what it returns.

use std::net::IpAddr;

/// The warning to log when `address` (the address the OSD registers) is a loopback address
/// and some monitor, given as its endpoint and the addresses its host resolved to, is not on
/// loopback; `None` otherwise. A monitor whose name did not resolve is not counted: it says
/// nothing about where the monitor runs.
pub fn loopback_registration_warning(
    address: &str,
    monitors: &[(String, Vec<IpAddr>)],
) -> Option<String> {
    let registered: IpAddr = address.parse().ok()?;
    if !registered.is_loopback() {
        return None;
    }
    let (endpoint, ip) = monitors.iter().find_map(|(endpoint, ips)| {
        ips.iter()
            .find(|ip| !ip.is_loopback())
            .map(|ip| (endpoint, ip))
    })?;
    Some(format!(
        "this OSD registers the loopback address {registered} (--address) with monitor \
         {endpoint} ({ip}), which is not on loopback: clients and OSDs on other hosts would \
         connect to their own {registered}; start it with --address set to an address they \
         can reach (docs/operations.md, \"Multi-host setup\")"
    ))
}

/// The host part of a monitor endpoint (`host:port`, `[v6]:port`, an `http://` prefix
/// accepted), for resolving it.
pub fn endpoint_host_port(endpoint: &str) -> &str {
    endpoint
        .trim()
        .trim_start_matches("http://")
        .trim_end_matches('/')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mons(list: &[(&str, &[&str])]) -> Vec<(String, Vec<IpAddr>)> {
        list.iter()
            .map(|(e, ips)| {
                (
                    e.to_string(),
                    ips.iter().map(|ip| ip.parse().unwrap()).collect(),
                )
            })
            .collect()
    }

    #[test]
    fn warns_for_loopback_registered_with_a_remote_monitor() {
        let w = loopback_registration_warning("127.0.0.1", &mons(&[("mon1:3333", &["10.0.0.5"])]))
            .expect("a warning");
        assert!(w.contains("loopback address 127.0.0.1"), "{w}");
        assert!(w.contains("monitor mon1:3333 (10.0.0.5)"), "{w}");
        // Any loopback address, IPv6 too; one remote monitor among local ones is enough.
        let both = mons(&[
            ("127.0.0.1:3333", &["127.0.0.1"]),
            ("b:3333", &["192.168.1.2"]),
        ]);
        assert!(loopback_registration_warning("127.0.0.2", &both).is_some());
        assert!(loopback_registration_warning("::1", &both).is_some());
    }

    #[test]
    fn quiet_when_everything_is_local_or_the_osd_is_reachable() {
        let local = mons(&[
            ("127.0.0.1:3333", &["127.0.0.1"]),
            ("localhost:3334", &["::1"]),
        ]);
        assert_eq!(loopback_registration_warning("127.0.0.1", &local), None);
        let remote = mons(&[("10.0.0.5:3333", &["10.0.0.5"])]);
        assert_eq!(loopback_registration_warning("10.0.0.7", &remote), None);
        // A name that did not resolve says nothing.
        let unresolved = mons(&[("mon1:3333", &[])]);
        assert_eq!(
            loopback_registration_warning("127.0.0.1", &unresolved),
            None
        );
        // Not an IP address: the monitor refuses the boot itself.
        assert_eq!(loopback_registration_warning("localhost", &remote), None);
    }

    #[test]
    fn endpoints_lose_their_scheme() {
        assert_eq!(endpoint_host_port("http://10.0.0.5:3333/"), "10.0.0.5:3333");
        assert_eq!(endpoint_host_port("[::1]:3333"), "[::1]:3333");
    }
}

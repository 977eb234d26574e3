//! Which users of this host may use the server (`--local-users`, `docs/nbd.md`, "Local
//! users").
//!
//! A loopback port or a Unix socket is open to every account of the host, and an NBD export is
//! a whole disk: without a gate, any local user could read and write every image the server's
//! key reaches. So a connection from this host (the Unix socket, or TCP from a loopback
//! address) is let in only if it runs as root, as the server's own user, or as a user
//! `--local-users` names; `--local-users any` turns the gate off. A client that proves itself
//! with a verified certificate (`--tls-verify-peer`) passes whatever its user.
//!
//! How the server knows the user: on the Unix socket, the kernel's peer credentials
//! (`SO_PEERCRED`); over TCP, the owner of the client's socket in `/proc/net/tcp` (or `tcp6`),
//! the same table `ss -e` reads: a client whose end is in this host's table is local, whichever
//! address it connected to (loopback or the host's own external address). A loopback
//! connection whose user cannot be found is refused (never guessed).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The users of this host let in besides root and the server's own user.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum LocalUsers {
    /// Root and the server's own user only.
    #[default]
    Owner,
    /// Also these user ids.
    Also(Vec<u32>),
    /// Every local user (the gate is off).
    Any,
}

impl LocalUsers {
    /// Whether a local connection of `uid` (`None`: its user is unknown) may proceed, for a
    /// server running as `server_uid`.
    pub fn admits(&self, uid: Option<u32>, server_uid: u32) -> bool {
        match (self, uid) {
            (LocalUsers::Any, _) => true,
            (_, None) => false,
            (_, Some(0)) => true,
            (_, Some(u)) if u == server_uid => true,
            (LocalUsers::Also(list), Some(u)) => list.contains(&u),
            (LocalUsers::Owner, Some(_)) => false,
        }
    }
}

/// Parses `--local-users`: `any`, or a comma-separated list of user names and `uid:N`.
/// Names are resolved now (a user created later needs a restart, as for a file's owner).
pub fn parse_local_users(s: &str) -> Result<LocalUsers, String> {
    let s = s.trim();
    if s == "any" {
        return Ok(LocalUsers::Any);
    }
    let mut uids = Vec::new();
    for item in s.split(',').map(str::trim) {
        if item.is_empty() {
            return Err(format!("--local-users {s:?}: an empty entry"));
        }
        let uid = match item.strip_prefix("uid:") {
            Some(n) => n
                .parse::<u32>()
                .map_err(|e| format!("--local-users: {item:?}: {e}"))?,
            None => user_id(item).ok_or_else(|| {
                format!("--local-users: no user {item:?} on this host (or give uid:N)")
            })?,
        };
        uids.push(uid);
    }
    Ok(LocalUsers::Also(uids))
}

/// The id of user `name` (the password database, as `id -u NAME`).
fn user_id(name: &str) -> Option<u32> {
    let c = std::ffi::CString::new(name).ok()?;
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut buf = vec![0u8; 16 * 1024];
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call; `buf` outlives it and `result` points into
    // `pwd` or is null.
    let rc = unsafe {
        libc::getpwnam_r(
            c.as_ptr(),
            &mut pwd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut result,
        )
    };
    (rc == 0 && !result.is_null()).then_some(pwd.pw_uid)
}

/// The effective user id of this process.
pub fn server_uid() -> u32 {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() }
}

/// Whether a TCP peer is on this host by its address (a loopback address, IPv4-mapped
/// included).
pub fn is_loopback(ip: IpAddr) -> bool {
    ip.to_canonical().is_loopback()
}

/// The owner of the client end of the TCP connection `peer` → `local` (the server's end), from
/// `/proc/net/tcp` and `/proc/net/tcp6`; `None` if it is not there (a client on another host).
pub fn tcp_peer_uid(peer: SocketAddr, local: SocketAddr) -> Option<u32> {
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().find_map(|path| {
        let table = std::fs::read_to_string(path).ok()?;
        uid_in_table(&table, peer, local)
    })
}

/// In a `/proc/net/tcp{,6}` table, the uid of the socket whose local address is `peer` and
/// whose remote address is `local`.
pub fn uid_in_table(table: &str, peer: SocketAddr, local: SocketAddr) -> Option<u32> {
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid ...
        let (ours, theirs, uid) = (f.get(1)?, f.get(2)?, f.get(7)?);
        let matches =
            same_addr(parse_proc_addr(ours)?, peer) && same_addr(parse_proc_addr(theirs)?, local);
        matches.then(|| uid.parse().ok()).flatten()
    })
}

/// Two socket addresses equal once IPv4-mapped IPv6 addresses are read as IPv4.
fn same_addr(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() == b.port() && a.ip().to_canonical() == b.ip().to_canonical()
}

/// One `/proc/net/tcp` address: `HHHHHHHH:PPPP` (IPv4) or 32 hex digits and the port (IPv6).
/// The address words are printed as the kernel holds them (network order in memory, read as
/// native 32-bit words), the port in host order: the host's byte order is the format here.
#[allow(clippy::host_endian_bytes)]
fn parse_proc_addr(s: &str) -> Option<SocketAddr> {
    let (addr, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        let w = u32::from_str_radix(addr.get(i * 8..i * 8 + 8)?, 16).ok()?;
        Some(w.to_ne_bytes())
    };
    let ip = match addr.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut bytes = [0u8; 16];
            for i in 0..4 {
                bytes[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            IpAddr::V6(Ipv6Addr::from(bytes))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gate_lets_in_root_the_owner_and_the_named() {
        let owner = LocalUsers::Owner;
        assert!(owner.admits(Some(0), 1000));
        assert!(owner.admits(Some(1000), 1000));
        assert!(!owner.admits(Some(1001), 1000));
        assert!(!owner.admits(None, 0), "an unknown user is refused");
        let also = LocalUsers::Also(vec![1001]);
        assert!(also.admits(Some(1001), 0));
        assert!(!also.admits(Some(1002), 0));
        assert!(LocalUsers::Any.admits(None, 0));
    }

    #[test]
    fn parses_names_ids_and_any() {
        assert_eq!(parse_local_users("any"), Ok(LocalUsers::Any));
        assert_eq!(
            parse_local_users("uid:1000, root"),
            Ok(LocalUsers::Also(vec![1000, 0]))
        );
        for bad in ["", "uid:x", "a,,b", "no-such-user-here-fb"] {
            assert!(parse_local_users(bad).is_err(), "{bad:?}");
        }
    }

    /// Lines as a little-endian host prints them (`ss -e` shows the same sockets).
    #[cfg(target_endian = "little")]
    #[test]
    fn finds_the_owner_of_the_client_end() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:2A49 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0\n\
   1: 0100007F:D431 0100007F:2A49 01 00000000:00000000 00:00000000 00000000  1000        0 2 1 0 20 4 30 10 -1\n\
   2: 0100007F:2A49 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0 20 4 30 10 -1\n";
        let server: SocketAddr = "127.0.0.1:10825".parse().unwrap();
        let client: SocketAddr = "127.0.0.1:54321".parse().unwrap();
        assert_eq!(uid_in_table(table, client, server), Some(1000));
        assert_eq!(uid_in_table(table, server, client), Some(0));
        let other: SocketAddr = "127.0.0.1:54322".parse().unwrap();
        assert_eq!(uid_in_table(table, other, server), None);
        // An IPv4 client on an IPv6 listener appears in tcp6 as ::ffff:127.0.0.1.
        let v6 = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0000000000000000FFFF00000100007F:D431 0000000000000000FFFF00000100007F:2A49 01 00000000:00000000 00:00000000 00000000  1001        0 2 1 0 20 4 30 10 -1\n";
        let mapped_server: SocketAddr = "[::ffff:127.0.0.1]:10825".parse().unwrap();
        assert_eq!(uid_in_table(v6, client, mapped_server), Some(1001));
        assert!(is_loopback("::ffff:127.0.0.1".parse().unwrap()));
        assert!(!is_loopback("10.0.0.1".parse().unwrap()));
    }

    /// A real loopback connection of this process is found with this process's user.
    #[test]
    fn finds_this_process_as_the_owner_of_a_real_connection() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (_server_end, peer) = listener.accept().unwrap();
        assert_eq!(peer, client.local_addr().unwrap());
        assert_eq!(
            tcp_peer_uid(peer, listener.local_addr().unwrap()),
            Some(server_uid())
        );
    }
}

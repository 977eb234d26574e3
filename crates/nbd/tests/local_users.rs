//! The local-users gate against a real server on loopback TCP and on a Unix socket (in-memory
//! exports), with a client that really runs as another user: a Perl script under uid/gid 65534
//! (nobody) speaking the first bytes of the handshake. The server learns that user from
//! `/proc/net/tcp` and from the socket's peer credentials, as it does for qemu or nbdinfo run
//! by a local account (`docs/nbd.md`, "Local users"). Needs root, as the suite does.
// NBD fields are big-endian; the test reads them by hand.
#![allow(clippy::big_endian_bytes)]

use fastblock_nbd::consts::*;
use fastblock_nbd::local_users::LocalUsers;
use fastblock_nbd::memory::{MemoryExport, MemoryExports};
use fastblock_nbd::testing::*;
use fastblock_nbd::ServerConfig;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Duration;

const NOBODY: u32 = 65534;

/// The client: connects to ARGV[0] (`host:port`, or a Unix socket path), reads the greeting,
/// sends the client flags (fixed newstyle, no zeroes) and `NBD_OPT_LIST`, and prints the
/// first option reply's header in hex. Perl is in every Debian system (`perl-base`).
const CLIENT: &str = r#"
use IO::Socket::INET; use IO::Socket::UNIX;
my $s = $ARGV[0] =~ m{^/} ? IO::Socket::UNIX->new(Peer => $ARGV[0])
                         : IO::Socket::INET->new(PeerAddr => $ARGV[0]);
die "connect: $!\n" unless $s;
sub take { my ($len) = @_; my ($buf, $n) = ("", 0);
  while ($n < $len) { my $r = sysread($s, $buf, $len - $n, $n); die "end of stream after $n\n" unless $r; $n += $r; }
  return $buf; }
take(18);
syswrite($s, pack("N", 3) . "IHAVEOPT" . pack("NN", 3, 0));
print unpack("H*", take(20)), "\n";
"#;

/// As `uid` (and gid, no supplementary groups), the client against `to`; the first option
/// reply's (magic, option, type, length), or what went wrong.
async fn list_as(uid: u32, to: String) -> Result<(u64, u32, u32, u32), String> {
    let mut cmd = Command::new("perl");
    cmd.args(["-e", CLIENT, &to]);
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(uid) != 0
                || libc::setuid(uid) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = tokio::time::timeout(
        Duration::from_secs(20),
        tokio::task::spawn_blocking(move || cmd.output()),
    )
    .await
    .map_err(|_| "the client did not finish within 20 s".to_string())?
    .expect("joined")
    .map_err(|e| format!("running perl as uid {uid}: {e}"))?;
    let hex = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if hex.len() != 40 {
        return Err(format!(
            "reply {hex:?} ({:?}); stderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let bytes: Vec<u8> = (0..20)
        .map(|i| u8::from_str_radix(&hex[i * 2..i * 2 + 2], 16).expect("hex"))
        .collect();
    let be32 = |i: usize| u32::from_be_bytes(bytes[i..i + 4].try_into().unwrap());
    let magic = u64::from_be_bytes(bytes[0..8].try_into().unwrap());
    Ok((magic, be32(8), be32(12), be32(16)))
}

/// A server on loopback TCP and on a Unix socket anyone may open (mode 0777: the file's
/// permissions are not what is tested here).
async fn server(local_users: LocalUsers, dir: &TempDir) -> (TestServer, Vec<String>) {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::fs::create_dir_all(&dir.0).unwrap();
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = dir.0.join(format!("nbd-{n}.sock"));
    let exports = MemoryExports::new().with(MemoryExport::new("fb/disk", 1 << 20));
    let config = ServerConfig {
        local_users,
        unix: Some(socket.clone()),
        ..ServerConfig::default()
    };
    let s = TestServer::start_with(exports, config).await;
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o777)).unwrap();
    let ways = vec![s.addr.to_string(), socket.display().to_string()];
    (s, ways)
}

#[tokio::test]
async fn a_local_user_is_refused_unless_let_in() {
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "this test plays another user: run it as root, as the suite does"
    );
    let dir = TempDir::new("local-users");
    let (s, ways) = server(LocalUsers::default(), &dir).await;
    for to in &ways {
        let (magic, option, kind, len) = list_as(NOBODY, to.clone()).await.unwrap();
        assert_eq!((magic, option), (OPTION_REPLY_MAGIC, OPT_LIST), "{to}");
        assert_eq!(
            kind, REP_ERR_POLICY,
            "uid {NOBODY} must be refused by default on {to}"
        );
        assert!(len > 0, "the refusal says why");
        // Root (this process's user) is let in the same way.
        let (_, _, kind, _) = list_as(0, to.clone()).await.unwrap();
        assert_eq!(kind, REP_SERVER, "root on {to}");
    }
    drop(s);

    // Named with --local-users, the same user gets the list; `any` turns the gate off.
    for users in [LocalUsers::Also(vec![NOBODY]), LocalUsers::Any] {
        let (s, ways) = server(users.clone(), &dir).await;
        for to in &ways {
            let (_, _, kind, _) = list_as(NOBODY, to.clone()).await.unwrap();
            assert_eq!(kind, REP_SERVER, "uid {NOBODY} with {users:?} on {to}");
        }
        drop(s);
    }
}

/// An address of this host that is not loopback, on an interface made for the test (root),
/// removed on drop.
struct HostAddress {
    link: String,
    ip: String,
}

impl HostAddress {
    fn new() -> HostAddress {
        let pid = std::process::id();
        let link = format!("fbnbd{}", pid % 100_000);
        let ip = format!("10.254.{}.{}", (pid >> 8) & 0xff, (pid & 0xff).max(1));
        let ip_cmd = |args: &[&str]| {
            let out = Command::new("ip").args(args).output().expect("running ip");
            assert!(
                out.status.success(),
                "ip {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let _ = Command::new("ip").args(["link", "del", &link]).output();
        // A veth pair (the dummy driver is not in every kernel); one end holds the address.
        ip_cmd(&[
            "link",
            "add",
            &link,
            "type",
            "veth",
            "peer",
            "name",
            &format!("{link}p"),
        ]);
        let a = HostAddress { link, ip };
        ip_cmd(&["addr", "add", &format!("{}/32", a.ip), "dev", &a.link]);
        ip_cmd(&["link", "set", &a.link, "up"]);
        a
    }
}

impl Drop for HostAddress {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.link])
            .output();
    }
}

/// A local user who connects to one of the host's own external addresses instead of loopback
/// is still a local user: its socket is in this host's table, and it is refused the same way.
#[tokio::test]
async fn a_local_user_on_the_hosts_own_address_is_still_local() {
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "run it as root, as the suite does"
    );
    let host = HostAddress::new();
    let exports = MemoryExports::new().with(MemoryExport::new("fb/disk", 1 << 20));
    let config = ServerConfig {
        tcp: Some(format!("{}:0", host.ip).parse().unwrap()),
        ..ServerConfig::default()
    };
    let server = fastblock_nbd::Server::bind(config, exports).await.unwrap();
    let to = server.tcp_addr().unwrap().to_string();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.run(async move {
        let _ = stopped.await;
    }));
    let (_, _, kind, _) = list_as(NOBODY, to.clone()).await.unwrap();
    assert_eq!(kind, REP_ERR_POLICY, "uid {NOBODY} through {to}");
    let (_, _, kind, _) = list_as(0, to.clone()).await.unwrap();
    assert_eq!(kind, REP_SERVER, "root through {to}");
    let _ = stop.send(());
    task.await.unwrap();
}

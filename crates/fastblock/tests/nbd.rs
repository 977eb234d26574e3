//! `fastblock-nbd`, the real binary, serving a real cluster (etcd, monitor, 3 OSDs) to real
//! NBD clients from Debian: qemu-img, qemu-io, nbdinfo, nbdcopy (libnbd-bin) and fio's nbd
//! engine. Also: discards give space back on the OSDs, several connections share an export
//! (CAN_MULTI_CONN), a garbage-sending connection does not disturb the others, SIGTERM exits
//! cleanly, and the kernel attach (skipped, with a message, without the nbd module). TLS:
//! qemu-img and libnbd over STARTTLS with certificates from `gen-certs`, refusals without TLS,
//! with a foreign certificate and off the allow list.
//!
//! A test skips (printing why) only when a client tool is not installed;
//! `scripts/install-deps.sh` installs them all.

mod common;

use common::{
    bin, free_port, free_ports, start_osds, wait_all_active, wait_until, MonCluster, MonOptions,
    OsdProc, Proc, TempDir,
};
use fastblock_nbd::consts::*;
use fastblock_nbd::testing::{accepts, pattern, RawClient};
use fastblock_types::api::{CreateImageRequest, CreatePoolRequest};
use fastblock_types::map::FailureDomain;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const MIB: u64 = 1 << 20;

/// Whether every tool is on PATH; prints which one is missing otherwise.
fn have_tools(tools: &[&str]) -> bool {
    for tool in tools {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if !found {
            eprintln!("SKIPPED: {tool} is not installed (scripts/install-deps.sh installs it)");
            return false;
        }
    }
    true
}

/// A cluster of 3 OSDs with a 1-replica pool `fb1` and a 3-replica pool `fb3`, and an NBD
/// server serving it on TCP and a Unix socket.
struct Setup {
    mons: MonCluster,
    dir: TempDir,
    osds: Vec<OsdProc>,
    nbd: Proc,
    addr: SocketAddr,
}

impl Setup {
    async fn start() -> Setup {
        Setup::start_with(&[]).await
    }

    /// As `start`, with more arguments for `fastblock-nbd serve`.
    async fn start_with(serve_args: &[&str]) -> Setup {
        let mons = MonCluster::start(1, MonOptions::default()).await;
        let dir = TempDir::new("nbd");
        let osds = start_osds(&mons, dir.path(), 3, "512M", 1, Duration::from_secs(20)).await;
        let client = mons.client();
        for (name, size) in [("fb1", 1), ("fb3", 3)] {
            client
                .create_pool(&CreatePoolRequest {
                    name: name.into(),
                    pg_count: 8,
                    size,
                    failure_domain: FailureDomain::Osd,
                })
                .await
                .unwrap();
        }
        wait_all_active(&client, Duration::from_secs(30)).await;
        // The NBD port, and the next for its default `/metrics`.
        let port = free_ports(2);
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let mut cmd = Command::new(bin("fastblock-nbd"));
        cmd.arg("serve")
            .args(["--mon", &mons.endpoints().join(",")])
            .args(["--bind", &addr.to_string()])
            .arg("--socket")
            .arg(dir.path().join("nbd.sock"))
            .args(serve_args)
            .env("FASTBLOCK_KEYRING", mons.nbd_keyring(dir.path(), "pool=*"))
            .env("FASTBLOCK_RUN_DIR", dir.path().join("run"))
            .env("RUST_LOG", "info");
        let nbd = Proc::spawn("fastblock-nbd", cmd, dir.path().join("nbd.log"));
        wait_until(
            Duration::from_secs(20),
            "the NBD server listening",
            || async { accepts(addr).await.then_some(()) },
        )
        .await;
        Setup {
            mons,
            dir,
            osds,
            nbd,
            addr,
        }
    }

    async fn image(&self, pool: &str, name: &str, size: u64, object_size: u64) {
        self.mons
            .client()
            .create_image(&CreateImageRequest {
                pool: pool.into(),
                name: name.into(),
                size_bytes: size,
                object_size_bytes: Some(object_size),
            })
            .await
            .unwrap();
    }

    fn uri(&self, export: &str) -> String {
        format!("nbd://{}/{export}", self.addr)
    }

    fn unix_uri(&self, export: &str) -> String {
        format!(
            "nbd+unix:///{export}?socket={}",
            self.dir.path().join("nbd.sock").display()
        )
    }

    /// Free data bytes of every OSD, counting what their next flush gives back.
    async fn free_bytes(&self) -> Vec<u64> {
        common::free_bytes(&self.osds).await
    }
}

/// Runs a tool; panics with its output unless it exits 0; returns stdout + stderr.
fn run(tool: &str, args: &[&str]) -> String {
    let out = Command::new(tool)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {tool}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{tool} {args:?} failed:\n{text}");
    text
}

/// Runs a tool that must fail; returns stdout + stderr.
fn run_fails(tool: &str, args: &[&str]) -> String {
    let out = Command::new(tool)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {tool}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{tool} {args:?} succeeded:\n{text}");
    text
}

/// A raw file with data, zero stretches and unaligned edges.
fn source_file(path: &Path, len: usize) -> Vec<u8> {
    let mut data = pattern(len, 5);
    data[MIB as usize..2 * MIB as usize].fill(0);
    data[3 * MIB as usize + 100..3 * MIB as usize + 9000].fill(0);
    std::fs::write(path, &data).unwrap();
    data
}

fn qemu_io(uri: &str, commands: &[&str]) -> String {
    let mut args = vec!["-f", "raw"];
    for c in commands {
        args.extend(["-c", c]);
    }
    args.push(uri);
    let text = run("qemu-io", &args);
    assert!(
        !text.contains("Pattern verification failed") && !text.contains("failed:"),
        "qemu-io {commands:?}:\n{text}"
    );
    text
}

/// qemu-img info/convert, qemu-io patterns, nbdinfo (size, list, map), nbdcopy, discards
/// giving space back, multi-conn, a misbehaving connection, and SIGTERM, on one cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standard_clients_against_a_real_cluster() {
    if !have_tools(&["qemu-img", "qemu-io", "nbdinfo", "nbdcopy"]) {
        return;
    }
    let mut s = Setup::start().await;
    // 1 MiB objects, so that a few MiB of IO crosses object boundaries.
    s.image("fb3", "img", 16 * MIB, MIB).await;
    let uri = s.uri("fb3/img");

    // qemu-img info: the export's size.
    let info = run("qemu-img", &["info", "-f", "raw", &uri]);
    assert!(info.contains("16 MiB (16777216 bytes)"), "{info}");

    // qemu-img convert a raw file into the export and back out: byte-identical.
    let src = s.dir.path().join("src.raw");
    let data = source_file(&src, 6 * MIB as usize);
    run(
        "qemu-img",
        &[
            "convert",
            "-n",
            "-f",
            "raw",
            "-O",
            "raw",
            src.to_str().unwrap(),
            &uri,
        ],
    );
    let back = s.dir.path().join("back.raw");
    run(
        "qemu-img",
        &[
            "convert",
            "-f",
            "raw",
            "-O",
            "raw",
            &uri,
            back.to_str().unwrap(),
        ],
    );
    let back_data = std::fs::read(&back).unwrap();
    assert_eq!(back_data.len(), 16 * MIB as usize);
    assert!(
        back_data[..data.len()] == data[..],
        "qemu-img round trip differs"
    );
    assert!(back_data[data.len()..].iter().all(|b| *b == 0));

    // qemu-io patterns: unaligned, aligned, across an object boundary (1 MiB objects: 9 MiB
    // is one, 9434184 is 3000 bytes before it).
    qemu_io(
        &uri,
        &[
            "write -P 0x5a 1000 5000",
            "write -P 0xa5 8M 64k",
            "write -P 0x3c 9434184 7000",
            "read -P 0x5a 1000 5000",
            "read -P 0xa5 8M 64k",
            "read -P 0x3c 9434184 7000",
            "read -P 0 9441184 1000",
        ],
    );
    // The same bytes over the Unix socket.
    qemu_io(&s.unix_uri("fb3/img"), &["read -P 0xa5 8M 64k"]);

    // nbdinfo: size, the export list, block status with a hole after a trim.
    let size = run("nbdinfo", &["--size", &uri]);
    assert_eq!(size.trim(), "16777216");
    let list = run("nbdinfo", &["--list", &format!("nbd://{}", s.addr)]);
    assert!(list.contains("fb3/img"), "{list}");
    qemu_io(&uri, &["write -P 0x77 12M 2M", "discard 12M 1M"]);
    let map = run("nbdinfo", &["--map", &uri]);
    // The extent (lines "offset length type description") holding `offset`.
    let line = |offset: u64| {
        map.lines()
            .find(|l| {
                let f: Vec<u64> = l
                    .split_whitespace()
                    .take(2)
                    .filter_map(|x| x.parse().ok())
                    .collect();
                f.len() == 2 && f[0] <= offset && offset < f[0] + f[1]
            })
            .unwrap_or_else(|| panic!("no extent holds {offset}:\n{map}"))
            .to_owned()
    };
    assert!(line(12 * MIB).contains("hole,zero"), "{map}");
    assert!(line(13 * MIB).contains("data"), "{map}");
    qemu_io(&uri, &["read -P 0 12M 1M", "read -P 0x77 13M 1M"]);

    // nbdcopy round trip, into a 1-replica image (nbdcopy uses several connections when
    // the server says CAN_MULTI_CONN).
    s.image("fb1", "copy", 8 * MIB, 4 * MIB).await;
    let copy = s.dir.path().join("copy.raw");
    run("nbdcopy", &[src.to_str().unwrap(), &s.uri("fb1/copy")]);
    run("nbdcopy", &[&s.uri("fb1/copy"), copy.to_str().unwrap()]);
    let copied = std::fs::read(&copy).unwrap();
    assert_eq!(copied.len(), 8 * MIB as usize);
    assert!(
        copied[..data.len()] == data[..],
        "nbdcopy round trip differs"
    );

    multi_conn_write_flush_read(&s).await;
    discards_give_space_back(&s).await;
    misbehaving_connection_is_isolated(&s).await;

    // SIGTERM: an idle connection in transmission is closed and the server exits 0.
    let mut idle = RawClient::connect(s.addr).await;
    idle.go("fb3/img").await.unwrap();
    assert!(s.nbd.terminate(Duration::from_secs(20)), "exits on SIGTERM");
    assert!(idle.closed().await);
    let log = std::fs::read_to_string(s.dir.path().join("nbd.log")).unwrap();
    assert!(log.contains("all connections closed"), "{log}");
}

/// Several connections to one export: a write completed on one, a flush on another, and a
/// read on a third sees the data (what CAN_MULTI_CONN promises; `docs/nbd.md` says why it
/// holds).
async fn multi_conn_write_flush_read(s: &Setup) {
    let mut conns = Vec::new();
    for _ in 0..3 {
        let mut c = RawClient::connect(s.addr).await;
        let (_, flags) = c.go("fb3/img").await.unwrap();
        assert_ne!(flags & TFLAG_CAN_MULTI_CONN, 0);
        conns.push(c);
    }
    let data = pattern(12288, 42);
    let offset = 5 * MIB - 4096;
    conns[0]
        .request(0, CMD_WRITE, 1, offset, data.len() as u32, &data)
        .await;
    assert_eq!(conns[0].simple_reply().await, (0, 1));
    conns[1].request(0, CMD_FLUSH, 2, 0, 0, &[]).await;
    assert_eq!(conns[1].simple_reply().await, (0, 2));
    conns[2]
        .request(0, CMD_READ, 3, offset, data.len() as u32, &[])
        .await;
    assert_eq!(conns[2].simple_reply().await, (0, 3));
    assert_eq!(conns[2].read(data.len()).await, data);
}

/// TRIM and WRITE_ZEROES (may-unmap) make reads return zeros and give the blocks back on
/// every replica: each OSD's free data space returns to what it was before the write.
async fn discards_give_space_back(s: &Setup) {
    s.image("fb3", "space", 8 * MIB, 4 * MIB).await;
    let uri = s.uri("fb3/space");
    let before = s.free_bytes().await;
    qemu_io(&uri, &["write -P 0x11 0 4M"]);
    wait_until(
        Duration::from_secs(10),
        "4 MiB used on every OSD",
        || async {
            let now = s.free_bytes().await;
            let used: Vec<i64> = before
                .iter()
                .zip(&now)
                .map(|(b, n)| *b as i64 - *n as i64)
                .collect();
            used.iter().all(|u| *u == 4 * MIB as i64).then_some(())
        },
    )
    .await;
    qemu_io(
        &uri,
        &["discard 0 2M", "write -z -u 2M 2M", "read -P 0 0 4M"],
    );
    wait_until(
        Duration::from_secs(10),
        "space back on every OSD",
        || async { (s.free_bytes().await == before).then_some(()) },
    )
    .await;
    let map = run("nbdinfo", &["--map", &uri]);
    assert!(
        map.lines().count() == 1 && map.contains("hole,zero"),
        "all holes:\n{map}"
    );
}

/// A connection sending garbage is dropped; connections next to it keep working.
async fn misbehaving_connection_is_isolated(s: &Setup) {
    use tokio::io::AsyncWriteExt;
    let mut good = RawClient::connect(s.addr).await;
    good.go("fb3/img").await.unwrap();
    let mut bad = RawClient::connect(s.addr).await;
    bad.go("fb3/img").await.unwrap();
    bad.stream.write_all(&[0xff; 64]).await.unwrap();
    assert!(bad.closed().await);
    good.request(0, CMD_READ, 1, 8 * MIB, 16, &[]).await;
    assert_eq!(good.simple_reply().await, (0, 1));
    assert_eq!(good.read(16).await, vec![0xa5; 16]);
}

/// fio's nbd engine, random 4 KiB writes verified with crc32c, at queue depth 1 and 32, on a
/// 1-replica and a 3-replica pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fio_random_writes_verify_on_1_and_3_replicas() {
    if !have_tools(&["fio"]) {
        return;
    }
    let engines = run("fio", &["--enghelp"]);
    if !engines.lines().any(|l| l.trim() == "nbd") {
        eprintln!("SKIPPED: this fio has no nbd engine (fio --enghelp)");
        return;
    }
    let s = Setup::start().await;
    for pool in ["fb1", "fb3"] {
        s.image(pool, "fio", 16 * MIB, 4 * MIB).await;
        for (depth, size) in [("1", "4M"), ("32", "8M")] {
            let uri = format!("--uri={}", s.uri(&format!("{pool}/fio")));
            let text = run(
                "fio",
                &[
                    "--name=nbd",
                    "--ioengine=nbd",
                    &uri,
                    "--rw=randwrite",
                    "--bs=4k",
                    &format!("--size={size}"),
                    &format!("--iodepth={depth}"),
                    "--verify=crc32c",
                    "--verify_fatal=1",
                    // fio would leave a verify state file in the working directory.
                    "--verify_state_save=0",
                ],
            );
            // `run` already checked the exit status (verify_fatal makes a mismatch fail it).
            assert!(text.contains("err= 0"), "{pool} QD{depth}:\n{text}");
        }
    }
}

/// `fastblock-nbd map` attaches an image as /dev/nbdX (written and read back through the
/// kernel), `unmap` detaches it and the serving process exits. Needs the nbd module and
/// root; without the module, `map` must fail at once with a message saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_map_and_unmap() {
    if !Path::new("/sys/block/nbd0").exists() {
        eprintln!("SKIPPED: the nbd kernel module is not loaded (no /sys/block/nbd0)");
        let out = Command::new(bin("fastblock-nbd"))
            .args(["map", "fb3/img", "--mon", "127.0.0.1:1"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(stderr.contains("modprobe nbd"), "{stderr}");
        return;
    }
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: attaching an nbd device needs root");
        return;
    }
    let s = Setup::start().await;
    s.image("fb3", "kern", 16 * MIB, 4 * MIB).await;
    let out = Command::new(bin("fastblock-nbd"))
        .args(["map", "fb3/kern", "--mon", &s.mons.endpoints().join(",")])
        .env("FASTBLOCK_KEYRING", s.dir.path().join("nbd.keyring"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let device = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(device.starts_with("/dev/nbd"), "{device}");
    let data = pattern(1 << 20, 8);
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut dev = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&device)
            .unwrap();
        dev.seek(SeekFrom::Start(3 * MIB)).unwrap();
        dev.write_all(&data).unwrap();
        dev.sync_all().unwrap();
    }
    // Read it back through the NBD server rather than the page cache.
    qemu_io(&s.uri("fb3/kern"), &["read -P 0 0 3M"]);
    run(
        "nbdcopy",
        &[
            &s.uri("fb3/kern"),
            s.dir.path().join("k.raw").to_str().unwrap(),
        ],
    );
    let copied = std::fs::read(s.dir.path().join("k.raw")).unwrap();
    assert!(copied[3 * MIB as usize..4 * MIB as usize] == data[..]);
    let out = Command::new(bin("fastblock-nbd"))
        .args(["unmap", &device])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sys = format!("/sys/block/{}/pid", device.trim_start_matches("/dev/"));
    wait_until(Duration::from_secs(10), "the device detached", || async {
        (!Path::new(&sys).exists()).then_some(())
    })
    .await;
}

/// qemu's TLS options for the client directory `dir` and export `export` of `s`:
/// `--object tls-creds-x509,...` and the `--image-opts` string.
fn qemu_tls(s: &Setup, dir: &Path, export: &str) -> (String, String) {
    let object = format!(
        "tls-creds-x509,id=tls0,endpoint=client,dir={}",
        dir.display()
    );
    let opts = format!(
        "driver=nbd,server.type=inet,server.host={},server.port={},export={export},tls-creds=tls0",
        s.addr.ip(),
        s.addr.port()
    );
    (object, opts)
}

fn nbd_log(s: &Setup) -> String {
    std::fs::read_to_string(s.dir.path().join("nbd.log")).unwrap()
}

/// `--tls require --tls-verify-peer --allow fb3/secret=alice`, with certificates from
/// `fastblock-nbd gen-certs`: qemu-img (tls-creds-x509) reads and writes over TLS and gets
/// back what it wrote; without TLS it is refused (NBD_REP_ERR_TLS_REQD); a client certificate
/// of another CA fails the TLS handshake; mallory (valid certificate, not on the list) is
/// refused fb3/secret but may use fb3/img; libnbd's nbdinfo and nbdcopy over `nbds://`. Each
/// refusal leaves a log line naming its cause. Also: a non-loopback listener without
/// `--tls require` warns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_allow_lists_with_qemu_and_libnbd() {
    if !have_tools(&["qemu-img", "nbdinfo", "nbdcopy"]) {
        return;
    }
    let pki_dir = TempDir::new("nbd-pki");
    let pki = pki_dir.path().join("pki");
    let gen = |dir: &Path| {
        run(
            bin("fastblock-nbd").to_str().unwrap(),
            &[
                "gen-certs",
                "--dir",
                dir.to_str().unwrap(),
                "--host",
                "127.0.0.1",
                "--client",
                "alice",
                "--client",
                "mallory",
            ],
        )
    };
    gen(&pki);
    let pki_arg = pki.to_str().unwrap();
    let s = Setup::start_with(&[
        "--tls",
        "require",
        "--tls-creds",
        pki_arg,
        "--tls-verify-peer",
        "--allow",
        "fb3/secret=alice",
    ])
    .await;
    s.image("fb3", "img", 16 * MIB, MIB).await;
    s.image("fb3", "secret", 8 * MIB, MIB).await;
    let alice = pki.join("client-alice");
    let mallory = pki.join("client-mallory");

    // qemu-img over TLS: info, then a raw file in and back out, byte-identical.
    let (object, opts) = qemu_tls(&s, &alice, "fb3/img");
    let info = run(
        "qemu-img",
        &["info", "--object", &object, "--image-opts", &opts],
    );
    assert!(info.contains("16 MiB (16777216 bytes)"), "{info}");
    let src = s.dir.path().join("src.raw");
    let data = source_file(&src, 6 * MIB as usize);
    run(
        "qemu-img",
        &[
            "convert",
            "-n",
            "--object",
            &object,
            "-f",
            "raw",
            "--target-image-opts",
            src.to_str().unwrap(),
            &opts,
        ],
    );
    let back = s.dir.path().join("back.raw");
    run(
        "qemu-img",
        &[
            "convert",
            "--object",
            &object,
            "--image-opts",
            &opts,
            "-O",
            "raw",
            back.to_str().unwrap(),
        ],
    );
    let back_data = std::fs::read(&back).unwrap();
    assert_eq!(back_data.len(), 16 * MIB as usize);
    assert!(
        back_data[..data.len()] == data[..],
        "TLS round trip differs"
    );

    // Without TLS: refused, with the reason, and one log line naming it.
    let refused = run_fails("qemu-img", &["info", "-f", "raw", &s.uri("fb3/img")]);
    assert!(refused.contains("TLS"), "{refused}");
    assert!(nbd_log(&s).contains("replied NBD_REP_ERR_TLS_REQD"));

    // A client certificate signed by another CA (the client trusts our server's CA).
    let other = pki_dir.path().join("other");
    gen(&other);
    let foreign = other.join("client-alice");
    std::fs::remove_file(foreign.join("ca-cert.pem")).unwrap();
    std::fs::copy(pki.join("ca-cert.pem"), foreign.join("ca-cert.pem")).unwrap();
    // qemu checks its own certificate against its CA file before connecting, so this case
    // goes through libnbd, which presents the certificate as it is.
    let foreign_uri = format!(
        "nbds://{}/fb3/img?tls-certificates={}",
        s.addr,
        foreign.display()
    );
    run_fails("nbdinfo", &["--size", &foreign_uri]);
    wait_until(
        Duration::from_secs(10),
        "the handshake failure logged",
        || async {
            nbd_log(&s)
                .contains("TLS handshake failed after NBD_OPT_STARTTLS")
                .then_some(())
        },
    )
    .await;

    // The allow list: mallory may not use fb3/secret, but fb3/img has no list.
    let (object_m, opts_m) = qemu_tls(&s, &mallory, "fb3/secret");
    let refused = run_fails(
        "qemu-img",
        &["info", "--object", &object_m, "--image-opts", &opts_m],
    );
    assert!(refused.contains("allow list"), "{refused}");
    assert!(nbd_log(&s).contains("not on its allow list; replied NBD_REP_ERR_POLICY"));
    let (_, opts_m_img) = qemu_tls(&s, &mallory, "fb3/img");
    run(
        "qemu-img",
        &["info", "--object", &object_m, "--image-opts", &opts_m_img],
    );
    let (object_a, opts_a) = qemu_tls(&s, &alice, "fb3/secret");
    let info = run(
        "qemu-img",
        &["info", "--object", &object_a, "--image-opts", &opts_a],
    );
    assert!(info.contains("8 MiB"), "{info}");

    // libnbd: nbds:// with the client directory.
    let nbds = |export: &str, dir: &Path| {
        format!(
            "nbds://{}/{export}?tls-certificates={}",
            s.addr,
            dir.display()
        )
    };
    let size = run("nbdinfo", &["--size", &nbds("fb3/img", &alice)]);
    assert_eq!(size.trim(), "16777216");
    let list = run("nbdinfo", &["--list", &nbds("", &mallory)]);
    assert!(
        list.contains("fb3/img") && !list.contains("fb3/secret"),
        "{list}"
    );
    let list = run("nbdinfo", &["--list", &nbds("", &alice)]);
    assert!(list.contains("fb3/secret"), "{list}");
    run(
        "nbdcopy",
        &[src.to_str().unwrap(), &nbds("fb3/secret", &alice)],
    );
    let copy = s.dir.path().join("copy.raw");
    run(
        "nbdcopy",
        &[&nbds("fb3/secret", &alice), copy.to_str().unwrap()],
    );
    let copied = std::fs::read(&copy).unwrap();
    assert!(copied[..data.len()] == data[..], "nbdcopy over TLS differs");
    run_fails("nbdinfo", &["--size", &s.uri("fb3/img")]);

    // Listening on a non-loopback address without --tls require warns at start (the server
    // above, on 127.0.0.1 with require, did not).
    assert!(!nbd_log(&s).contains("not a loopback address"));
    let mut cmd = Command::new(bin("fastblock-nbd"));
    cmd.arg("serve")
        .args(["--mon", &s.mons.endpoints().join(",")])
        .env("FASTBLOCK_KEYRING", s.dir.path().join("nbd.keyring"))
        .env("FASTBLOCK_RUN_DIR", s.dir.path().join("run-wide"))
        .args(["--bind", &format!("0.0.0.0:{}", free_port())])
        .args(["--metrics-addr", "none"]);
    let log = s.dir.path().join("wide.log");
    let mut wide = Proc::spawn("fastblock-nbd", cmd, log.clone());
    wait_until(Duration::from_secs(20), "the warning", || async {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        text.contains("not a loopback address").then_some(())
    })
    .await;
    assert!(wide.terminate(Duration::from_secs(20)));
}

/// Image snapshots end to end, on real processes: a pattern written and acknowledged, a
/// snapshot, an overwrite (some of it racing the snapshot's creation: those writes wait and
/// all succeed), then `qemu-img compare` shows the snapshot's export equal to the first
/// pattern and the head equal to the second, and `qemu-img convert` and `nbdcopy` copy it
/// out whole; the snapshot's export is read-only (qemu-io's write fails, nothing changes); a
/// rollback restores the first pattern; removing the snapshot gives the blocks it kept back
/// on the OSDs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_export_rollback_and_removal() {
    if !have_tools(&["qemu-img", "qemu-io", "nbdinfo"]) {
        return;
    }
    let s = Setup::start().await;
    const SIZE: u64 = 8 * MIB;
    s.image("fb3", "snapimg", SIZE, MIB).await;
    let cluster = fastblock_client::Cluster::connect(s.mons.client_config())
        .await
        .unwrap();
    let image = cluster.open_image("fb3", "snapimg").await.unwrap();
    let first = stamped(0, SIZE, 1);
    image.write(0, first.clone().into()).await.unwrap();

    // Writes to the other half race the snapshot's creation: each one must succeed (a PG
    // that marked the snapshot holds them until it is complete).
    let racer = {
        let image = image.clone();
        tokio::spawn(async move {
            for i in 0..40u64 {
                let at = SIZE / 2 + (i % 16) * 4096;
                image
                    .write(at, common::stamped_block(at, 100 + i))
                    .await
                    .expect("a write racing the snapshot");
            }
        })
    };
    let mon = s.mons.client();
    let snap = mon.create_snap("fb3", "snapimg", "s1").await.unwrap();
    assert_eq!(snap.state, fastblock_types::map::SnapState::Created);
    assert_eq!(snap.size_bytes, SIZE);
    racer.await.unwrap();
    // What the snapshot holds: read through the client library, every byte of the first
    // half (untouched by the racer) is the first pattern.
    let view = cluster.open_snapshot("fb3", "snapimg", "s1").await.unwrap();
    let in_snap = view.read(0, SIZE).await.unwrap();
    assert!(in_snap[..(SIZE / 2) as usize] == first[..(SIZE / 2) as usize]);
    // Overwrite the first half now that the snapshot is complete.
    let second_half = stamped(0, SIZE / 2, 2);
    image.write(0, second_half.clone().into()).await.unwrap();
    let head_now = image.read(0, SIZE).await.unwrap();
    assert!(head_now[..(SIZE / 2) as usize] == second_half[..]);

    let snap_file = s.dir.path().join("snap.raw");
    std::fs::write(&snap_file, &in_snap).unwrap();
    let head_file = s.dir.path().join("head.raw");
    std::fs::write(&head_file, &head_now).unwrap();
    let snap_uri = s.uri("fb3/snapimg@s1");
    let head_uri = s.uri("fb3/snapimg");
    let snap_path = snap_file.to_str().unwrap();
    let head_path = head_file.to_str().unwrap();
    same_bytes(snap_path, &snap_uri);
    same_bytes(head_path, &head_uri);
    // The two differ: the snapshot did not follow the head.
    run_fails(
        "qemu-img",
        &["compare", "-f", "raw", "-F", "raw", head_path, &snap_uri],
    );
    // Read-only: the export says so and refuses a write.
    let info = run("nbdinfo", &[&snap_uri]);
    assert!(info.contains("is_read_only: true"), "{info}");
    run_fails(
        "qemu-io",
        &["-f", "raw", "-c", "write -P 7 0 4096", &snap_uri],
    );
    same_bytes(snap_path, &snap_uri);
    // Copied out as a backup tool would: qemu-img convert and nbdcopy of the snapshot's
    // export give the first pattern, byte for byte.
    let converted = s.dir.path().join("snap-converted.raw");
    let copied = s.dir.path().join("snap-nbdcopy.raw");
    run(
        "qemu-img",
        &[
            "convert",
            "-f",
            "raw",
            "-O",
            "raw",
            &snap_uri,
            converted.to_str().unwrap(),
        ],
    );
    if have_tools(&["nbdcopy"]) {
        run("nbdcopy", &[&snap_uri, copied.to_str().unwrap()]);
        assert!(std::fs::read(&copied).unwrap() == in_snap[..], "nbdcopy");
    }
    assert!(
        std::fs::read(&converted).unwrap() == in_snap[..],
        "qemu-img convert"
    );
    let list = run("nbdinfo", &["--list", &s.uri("")]);
    assert!(list.contains("fb3/snapimg@s1"), "{list}");

    // Rollback: the head holds the snapshot's data again.
    image
        .rollback_objects(snap.id.0, snap.size_bytes, 4, &|_, _| {})
        .await
        .unwrap();
    same_bytes(snap_path, &head_uri);

    // Removing the snapshot gives back the blocks it kept (half the image, on 3 replicas).
    let before: u64 = s.free_bytes().await.iter().sum();
    mon.remove_snap("fb3", "snapimg", "s1").await.unwrap();
    wait_until(
        Duration::from_secs(30),
        "the snapshot's blocks freed",
        || async {
            let now: u64 = s.free_bytes().await.iter().sum();
            (now >= before + 3 * SIZE / 2).then_some(())
        },
    )
    .await;
    // And the head still reads as the rollback left it.
    same_bytes(snap_path, &head_uri);
}

/// `qemu-img compare` of a raw file and a raw export (or two of either): panics unless they
/// hold the same bytes.
fn same_bytes(a: &str, b: &str) {
    run("qemu-img", &["compare", "-f", "raw", "-F", "raw", a, b]);
}

/// `len` bytes at `offset` of stamped blocks of `generation` (every 4 KiB differs, so a
/// misplaced block never passes for the right one).
fn stamped(offset: u64, len: u64, generation: u64) -> Vec<u8> {
    (offset / 4096..(offset + len) / 4096)
        .flat_map(|b| common::stamped_block(b * 4096, generation))
        .collect()
}

/// Clones end to end, on real processes: a clone (in another pool) of a protected snapshot
/// reads its parent's data, takes its own writes (a partial write of an object keeps the
/// parent's other bytes, a discard reads zeros), does not follow later writes to the
/// parent's head, exports over NBD like any image (`qemu-img compare`), survives `flatten`
/// and then the removal of the parent snapshot, and so does a snapshot of the clone; the
/// parent snapshot cannot be removed or unprotected while the clone depends on it, and
/// removing it afterwards frees its blocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clone_reads_through_takes_its_own_writes_and_survives_flatten() {
    if !have_tools(&["qemu-img"]) {
        return;
    }
    let s = Setup::start().await;
    const SIZE: u64 = 8 * MIB;
    s.image("fb3", "golden", SIZE, MIB).await;
    let mon = s.mons.client();
    let cluster = fastblock_client::Cluster::connect(s.mons.client_config())
        .await
        .unwrap();
    let golden = cluster.open_image("fb3", "golden").await.unwrap();
    // Objects 0..6 written, 6 and 7 never: the clone reads zeros there.
    golden
        .write(0, stamped(0, 6 * MIB, 1).into())
        .await
        .unwrap();
    mon.create_snap("fb3", "golden", "base").await.unwrap();
    mon.protect_snap("fb3", "golden", "base").await.unwrap();
    let kid_info = mon
        .clone_snap("fb3", "golden", "base", "fb1", "kid")
        .await
        .unwrap();
    assert!(kid_info.parent.is_some());
    let kid = cluster.open_image("fb1", "kid").await.unwrap();
    assert!(kid.is_clone());
    let mut want = stamped(0, 6 * MIB, 1);
    want.resize(SIZE as usize, 0);
    assert!(
        kid.read(0, SIZE).await.unwrap() == want[..],
        "reads through"
    );

    // Its own writes: a partial one inside object 1, a whole-object one on object 3, a
    // discard of object 2, a write into never-written object 7.
    let partial = stamped(0, 4096, 9);
    kid.write(MIB + 512, partial[..].to_vec().into())
        .await
        .unwrap();
    want[(MIB + 512) as usize..(MIB + 512 + 4096) as usize].copy_from_slice(&partial);
    let whole = stamped(3 * MIB, MIB, 9);
    kid.write(3 * MIB, whole.clone().into()).await.unwrap();
    want[3 * MIB as usize..4 * MIB as usize].copy_from_slice(&whole);
    kid.discard(2 * MIB, MIB).await.unwrap();
    want[2 * MIB as usize..3 * MIB as usize].fill(0);
    let tail = stamped(7 * MIB, 8192, 9);
    kid.write(7 * MIB, tail.clone().into()).await.unwrap();
    want[7 * MIB as usize..7 * MIB as usize + 8192].copy_from_slice(&tail);
    // The parent's head moves on; neither the snapshot nor the clone follows.
    golden.write(0, stamped(0, SIZE, 2).into()).await.unwrap();
    assert!(
        kid.read(0, SIZE).await.unwrap() == want[..],
        "its own writes"
    );
    let base = cluster
        .open_snapshot("fb3", "golden", "base")
        .await
        .unwrap();
    assert!(base.read(0, 6 * MIB).await.unwrap() == stamped(0, 6 * MIB, 1)[..]);
    // A fresh open (another client) sees the same: the copy-ups are on the OSDs.
    let again = fastblock_client::Cluster::connect(s.mons.client_config())
        .await
        .unwrap()
        .open_image("fb1", "kid")
        .await
        .unwrap();
    assert!(again.read(0, SIZE).await.unwrap() == want[..]);
    let want_file = s.dir.path().join("kid.raw");
    std::fs::write(&want_file, &want).unwrap();
    let want_path = want_file.to_str().unwrap();
    same_bytes(want_path, &s.uri("fb1/kid"));

    // The snapshot is in use: neither removed nor unprotected.
    assert!(mon.remove_snap("fb3", "golden", "base").await.is_err());
    assert!(mon.unprotect_snap("fb3", "golden", "base").await.is_err());
    // A snapshot of the clone, taken while most of it is still its parent's: exported over
    // NBD, it reads what the clone read then, before and after the flatten.
    mon.create_snap("fb1", "kid", "k1").await.unwrap();
    same_bytes(want_path, &s.uri("fb1/kid@k1"));

    kid.flatten(4, &|_, _| {}).await.unwrap();
    let flat = mon.flatten_done("fb1", "kid").await.unwrap();
    assert_eq!(flat.parent, None);
    let before: u64 = s.free_bytes().await.iter().sum();
    mon.unprotect_snap("fb3", "golden", "base").await.unwrap();
    mon.remove_snap("fb3", "golden", "base").await.unwrap();
    // The snapshot kept the 6 MiB the parent's head overwrote, on 3 replicas.
    wait_until(
        Duration::from_secs(30),
        "the snapshot's blocks freed",
        || async {
            let now: u64 = s.free_bytes().await.iter().sum();
            (now >= before + 3 * 6 * MIB).then_some(())
        },
    )
    .await;
    let flat_kid = cluster.open_image("fb1", "kid").await.unwrap();
    assert!(!flat_kid.is_clone());
    assert!(
        flat_kid.read(0, SIZE).await.unwrap() == want[..],
        "after flatten"
    );
    same_bytes(want_path, &s.uri("fb1/kid"));
    same_bytes(want_path, &s.uri("fb1/kid@k1"));
}

/// The NBD server acts as a key of its own (`client.nbd` by default, issue 37): without one in
/// its keyring it stops at start and says how to make it (the admin key in the keyring is not
/// taken instead), and with one limited to a pool it lists and opens that pool's images only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_acts_as_its_own_key_limited_to_its_pools() {
    let s = Setup::start().await;
    s.image("fb1", "mine", 4 * MIB, MIB).await;
    s.image("fb3", "other", 4 * MIB, MIB).await;
    let serve = |keyring: &Path, name: Option<&str>, port: u16, log: &str| {
        let mut cmd = Command::new(bin("fastblock-nbd"));
        cmd.arg("serve")
            .args(["--mon", &s.mons.endpoints().join(",")])
            .args(["--bind", &format!("127.0.0.1:{port}")])
            .args(["--metrics-addr", "none"])
            .env("FASTBLOCK_KEYRING", keyring)
            .env("FASTBLOCK_RUN_DIR", s.dir.path().join(format!("run-{log}")));
        if let Some(name) = name {
            cmd.args(["--name", name]);
        }
        Proc::spawn(
            "fastblock-nbd",
            cmd,
            s.dir.path().join(format!("{log}.log")),
        )
    };

    // Only the admin key at hand: the default entity has none, and the server says so.
    let mut admin_only = serve(&s.mons.keyring(), None, free_port(), "admin-only");
    let status = admin_only
        .wait_exit(Duration::from_secs(30))
        .expect("the server stops when its key is missing");
    assert!(!status.success());
    let log = std::fs::read_to_string(&admin_only.log).unwrap();
    assert!(
        log.contains("auth get-or-create client.nbd") && log.contains("has no key for client.nbd"),
        "{log}"
    );

    // A key limited to pool fb1: fb1's image is listed and opens; fb3's is neither.
    let out = s.mons.cli(&[
        "auth",
        "get-or-create",
        "client.nbd-fb1",
        "--caps",
        "pool=fb1",
        "-o",
        s.dir.path().join("fb1.keyring").to_str().unwrap(),
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let port = free_port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let _limited = serve(
        &s.dir.path().join("fb1.keyring"),
        Some("client.nbd-fb1"),
        port,
        "limited",
    );
    wait_until(Duration::from_secs(20), "the limited server", || async {
        accepts(addr).await.then_some(())
    })
    .await;
    let mut c = RawClient::connect(addr).await;
    let listed: Vec<String> = c
        .option(OPT_LIST, &[])
        .await
        .iter()
        .filter(|r| r.kind == REP_SERVER)
        .map(|r| String::from_utf8_lossy(&r.payload[4..]).into_owned())
        .collect();
    assert!(listed.contains(&"fb1/mine".to_string()), "{listed:?}");
    assert!(
        listed.iter().all(|n| n.starts_with("fb1/")),
        "a server limited to fb1 lists {listed:?}"
    );
    let (size, _) = c.go("fb1/mine").await.expect("fb1/mine opens");
    assert_eq!(size, 4 * MIB);
    let mut c = RawClient::connect(addr).await;
    let refused = c.go("fb3/other").await;
    assert!(refused.is_err(), "fb3/other opened: {refused:?}");
}

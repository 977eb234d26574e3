//! A full disk is an admission decision, never a crash (docs/design/osd.md, "Space"), on real
//! processes: an OSD whose data and metadata files live on a small ext4 file system of a loop
//! device. A client filling the OSD's data region gets `NoSpace`, reads what it wrote, and
//! writes again once it discards some; another file filling the file system makes the OSD
//! refuse writes (naming the file system) and serve reads, without ever exiting, and writes
//! resume once that file is gone. A data file left sparse is allocated when the OSD starts.
//!
//! The loop tests need root (losetup, mkfs.ext4, mount) and are skipped with a message
//! otherwise. The file system is unmounted and its loop device detached on drop, after the
//! processes are killed.

mod common;

use bytes::Bytes;
use common::{pool_with_image, stamped_block, wait_osds_up, wait_until, MonCluster, MonOptions};
use common::{OsdProc, TempDir, BLOCK};
use fastblock_client::{ClientError, Cluster, Image};
use fastblock_wire::Status;
use std::io::{Seek, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
/// The image's object size, and what one write covers.
const CHUNK_BYTES: u64 = 4 * MIB;
/// The loop file system: room for the 256 MiB data file, its metadata and the default host
/// reserve (64 MiB), and some left for another file to take.
const FS_BYTES: u64 = 512 * MIB;
const OSD_SIZE: &str = "256M";
const WAIT: Duration = Duration::from_secs(30);

/// Runs a command to completion; panics with its output if it fails.
fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// An ext4 file system on a loop device over an image file, mounted on a temporary
/// directory; unmounted and detached on drop.
struct LoopFs {
    dev: String,
    mnt: PathBuf,
    mounted: bool,
    /// Holds the image and the mount point; removed after the unmount.
    _dir: TempDir,
}

impl LoopFs {
    fn new(size_bytes: u64) -> LoopFs {
        let dir = TempDir::new("diskfull-fs");
        let image = dir.path().join("fs.img");
        std::fs::File::create(&image)
            .and_then(|f| f.set_len(size_bytes))
            .expect("creating the image file");
        let image = image.to_str().expect("utf-8 path").to_string();
        let dev = run("losetup", &["--find", "--show", &image]);
        let mut fs = LoopFs {
            dev,
            mnt: dir.path().join("mnt"),
            mounted: false,
            _dir: dir,
        };
        // No blocks kept for root (-m 0): the OSD (root here) and the filler see the same room.
        run("mkfs.ext4", &["-q", "-m", "0", "-E", "nodiscard", &fs.dev]);
        std::fs::create_dir(&fs.mnt).expect("creating the mount point");
        run("mount", &[&fs.dev, fs.mnt.to_str().expect("utf-8 path")]);
        fs.mounted = true;
        fs
    }

    fn path(&self) -> &Path {
        &self.mnt
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        if self.mounted {
            let mnt = self.mnt.to_str().unwrap_or_default().to_string();
            // The processes on it were killed just before; their files may take a moment.
            let unmounted = (0..20).any(|_| {
                let ok = Command::new("umount")
                    .arg(&mnt)
                    .status()
                    .is_ok_and(|s| s.success());
                if !ok {
                    std::thread::sleep(Duration::from_millis(100));
                }
                ok
            });
            if !unmounted {
                let _ = Command::new("umount").args(["-l", &mnt]).status();
            }
        }
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
    }
}

/// Free bytes of the file system holding `dir` (`statvfs`: `f_bavail * f_frsize`).
fn free_bytes(dir: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(dir.as_os_str().as_bytes()).expect("a path");
    // SAFETY: `statvfs` is a plain C struct: all-zero bytes are a valid value of it.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid NUL-terminated path and a statvfs buffer of the right type.
    let r = unsafe { libc::statvfs(c_path.as_ptr(), &mut st) };
    assert_eq!(r, 0, "statvfs: {}", std::io::Error::last_os_error());
    st.f_bavail * st.f_frsize
}

/// Whether this process may set up loop devices; says why not when it may not.
fn may_mount() -> bool {
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: a loop-mounted file system needs root");
        return false;
    }
    if !Path::new("/dev/loop-control").exists() {
        eprintln!("SKIPPED: no loop device support (/dev/loop-control)");
        return false;
    }
    true
}

/// One OSD with its files on a loop file system, a 1-replica pool and image `fb/img`. Fields
/// drop in order: the OSD is killed before its file system is unmounted.
struct Setup {
    osd: OsdProc,
    mons: MonCluster,
    fs: LoopFs,
    _logs: TempDir,
}

async fn setup(image_bytes: u64) -> Setup {
    let mons = MonCluster::start(1, MonOptions::default()).await;
    let fs = LoopFs::new(FS_BYTES);
    let logs = TempDir::new("diskfull-logs");
    let osd = OsdProc::create_in(&mons, (fs.path(), logs.path()), "h0", OSD_SIZE, 1, &[]);
    let client = mons.client();
    wait_osds_up(&client, &[osd.id], WAIT).await;
    pool_with_image(&client, ("fb", 8, 1), ("img", image_bytes, CHUNK_BYTES)).await;
    Setup {
        osd,
        mons,
        fs,
        _logs: logs,
    }
}

async fn open_image(s: &Setup) -> Image {
    let cluster: Arc<Cluster> = Cluster::connect(s.mons.client_config()).await.unwrap();
    cluster.open_image("fb", "img").await.unwrap()
}

/// `len` bytes of stamped blocks from image offset `offset` (generation `generation`).
fn stamped(offset: u64, len: u64, generation: u64) -> Bytes {
    let mut v = Vec::with_capacity(len as usize);
    for block in (offset..offset + len).step_by(BLOCK as usize) {
        v.extend_from_slice(&stamped_block(block, generation));
    }
    v.into()
}

/// The status and message of an OSD's refusal.
fn refusal(e: &ClientError) -> (Status, &str) {
    match e {
        ClientError::Io {
            status, message, ..
        } => (*status, message.as_str()),
        other => panic!("expected an OSD's refusal, got {other}"),
    }
}

fn assert_alive(s: &mut Setup) {
    let running = s.osd.is_running();
    assert!(running, "the OSD exited; its log:\n{}", s.osd.log_tail());
}

/// Goal: a client filling the OSD's data region gets `NoSpace` with a clear message before
/// anything breaks, reads all it wrote, and can write again at once after discarding some
/// (freed blocks count before the flush that returns them); and mkfs refuses an OSD larger
/// than the file system up front. Method: one OSD (256 MiB), a 512 MiB image written four
/// objects at a time until a write is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_filling_the_osd_is_refused_reads_back_and_writes_after_a_discard() {
    if !may_mount() {
        return;
    }
    let image_bytes = 512 * MIB;
    let mut s = setup(image_bytes).await;
    // An OSD that does not fit is refused before anything is created.
    let big = s.fs.path().join("big.img");
    let out = Command::new(common::bin("fastblock-osd"))
        .args(["--mkfs", "--size", "1G", "--data"])
        .arg(&big)
        .env("FASTBLOCK_MON", s.mons.endpoints().join(","))
        .env("FASTBLOCK_KEYRING", s.mons.keyring())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("bytes free") && stderr.contains("use a smaller --size"),
        "{stderr}"
    );
    assert!(!big.exists(), "a refused mkfs leaves no file");
    let image = open_image(&s).await;
    let mut written = Vec::new();
    let mut refused: Option<(u64, ClientError)> = None;
    let chunks = image_bytes / CHUNK_BYTES;
    for round in 0..chunks / 4 {
        let offsets: Vec<u64> = (0..4).map(|i| (round * 4 + i) * CHUNK_BYTES).collect();
        let tasks: Vec<_> = offsets
            .iter()
            .map(|o| {
                let (image, o) = (image.clone(), *o);
                tokio::spawn(async move { image.write(o, stamped(o, CHUNK_BYTES, 1)).await })
            })
            .collect();
        for (o, task) in offsets.into_iter().zip(tasks) {
            match task.await.expect("write task") {
                Ok(()) => written.push(o),
                Err(e) => {
                    refused.get_or_insert((o, e));
                }
            }
        }
        if refused.is_some() {
            break;
        }
    }
    let (refused_at, e) = refused.expect("the 256 MiB OSD refuses some of 512 MiB");
    let (status, message) = refusal(&e);
    assert_eq!(status, Status::NoSpace, "{e}");
    assert!(message.contains("data region"), "{e}");
    // 256 MiB: a 128 MiB WAL, the rest data less a 32 MiB reserve.
    assert!(
        written.len() as u64 * CHUNK_BYTES >= 64 * MIB,
        "only {} chunks written before {e}",
        written.len()
    );
    assert_alive(&mut s);
    for o in &written {
        let got = image.read(*o, CHUNK_BYTES).await.unwrap();
        assert!(
            got == stamped(*o, CHUNK_BYTES, 1),
            "chunk at {o} reads back"
        );
    }
    // Discard four chunks, then write at once: before the next flush gives their blocks back.
    for o in &written[..4] {
        image.discard(*o, CHUNK_BYTES).await.unwrap();
    }
    image
        .write(refused_at, stamped(refused_at, CHUNK_BYTES, 2))
        .await
        .unwrap_or_else(|e| panic!("writing after the discards: {e}"));
    let got = image.read(refused_at, CHUNK_BYTES).await.unwrap();
    assert!(got == stamped(refused_at, CHUNK_BYTES, 2));
    let zeros = image.read(written[0], CHUNK_BYTES).await.unwrap();
    assert!(
        zeros.iter().all(|b| *b == 0),
        "a discarded chunk reads zeros"
    );
    assert_alive(&mut s);
}

/// Fills the file system of `path` with a new file there: at once (allocating all but the
/// last 4 MiB, so the OSD's next sample is still the roomy one), then writing 1 MiB buffers
/// until ENOSPC. Returns the bytes it took.
fn fill_file_system(path: &Path) -> u64 {
    use std::os::fd::AsRawFd;
    let mut file = std::fs::File::create(path).expect("creating the filler");
    let free = free_bytes(path.parent().expect("a directory"));
    let quick = free.saturating_sub(4 * MIB) as libc::off_t;
    // SAFETY: fallocate(2) on a descriptor `file` owns.
    let r = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, quick) };
    assert_eq!(r, 0, "fallocate: {}", std::io::Error::last_os_error());
    let buf = vec![0x5Au8; MIB as usize];
    let mut written = quick as u64;
    file.seek(std::io::SeekFrom::End(0)).expect("seek");
    loop {
        match file.write(&buf) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(e) if e.kind() == std::io::ErrorKind::StorageFull => break,
            Err(e) => panic!("filling the file system: {e}"),
        }
    }
    written
}

/// Goal: another file filling the file system under the OSD's metadata makes the OSD refuse
/// writes (naming the file system) and serve reads, never exit (no crash loop), and take
/// writes again by itself once the file is gone. Method: write some data, let it flush, fill
/// the file system to ENOSPC at once with a filler file, write until a write is refused (the
/// OSD samples the file system once a second, so the writes admitted before that must flush
/// into a full file system), read, wait, remove the filler, write again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_system_filled_by_another_file_refuses_writes_and_recovers() {
    if !may_mount() {
        return;
    }
    let mut s = setup(64 * MIB).await;
    let image = open_image(&s).await;
    image.write(0, stamped(0, 8 * MIB, 1)).await.unwrap();
    // Flushed, and the metadata file's new pages allocated, before the filler comes.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let filler = s.fs.path().join("filler");
    let path = filler.clone();
    let filled = tokio::task::spawn_blocking(move || fill_file_system(&path))
        .await
        .unwrap();
    assert!(filled >= 64 * MIB, "the filler took {filled} bytes");
    // The writes admitted before the OSD's next sample shows the file system full must
    // be flushed into it.
    let mut next = 16 * MIB;
    let e = wait_until(Duration::from_secs(5), "a write refused", || {
        let image = image.clone();
        let offset = next;
        next += BLOCK;
        async move { image.write(offset, stamped(offset, BLOCK, 1)).await.err() }
    })
    .await;
    let (status, message) = refusal(&e);
    assert_eq!(status, Status::NoSpace, "{e}");
    assert!(message.contains("file system"), "{e}");
    println!(
        "{} writes admitted on a full file system before the refusal",
        (next - 16 * MIB) / BLOCK - 1
    );
    let got = image.read(0, 8 * MIB).await.unwrap();
    assert!(got == stamped(0, 8 * MIB, 1), "reads are served");
    // Two flush intervals: what was admitted before the refusal is flushed by now.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_alive(&mut s);
    let still = image.write(32 * MIB, stamped(32 * MIB, BLOCK, 1)).await;
    assert_eq!(
        still.as_ref().err().map(|e| refusal(e).0),
        Some(Status::NoSpace),
        "still full"
    );
    std::fs::remove_file(&filler).unwrap();
    let freed = Instant::now();
    wait_until(Duration::from_secs(10), "writes to resume", || {
        let image = image.clone();
        async move {
            image
                .write(32 * MIB, stamped(32 * MIB, BLOCK, 2))
                .await
                .ok()
        }
    })
    .await;
    println!("writes resumed {:?} after the filler went", freed.elapsed());
    let got = image.read(32 * MIB, BLOCK).await.unwrap();
    assert!(got == stamped(32 * MIB, BLOCK, 2));
    assert_alive(&mut s);
}

/// Goal: a data file an older mkfs left sparse (or one copied sparse) is allocated when the
/// OSD starts, so its data writes cannot meet ENOSPC later. Method: format an OSD, stop it,
/// punch a hole into the unused end of its data file, start it again and wait until the file
/// is allocated in full. Needs no root: a data file in a temporary directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sparse_data_file_is_allocated_when_the_osd_starts() {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;
    let mons = MonCluster::start(1, MonOptions::default()).await;
    let dir = TempDir::new("diskfull-sparse");
    let mut osd = OsdProc::create(&mons, dir.path(), "h0", "256M", 1);
    assert!(osd.stop(), "the OSD stops on SIGTERM");
    let allocated = |path: &Path| {
        let meta = std::fs::metadata(path).unwrap();
        (meta.blocks() * 512, meta.len())
    };
    let (before, len) = allocated(&osd.data);
    assert!(before >= len, "mkfs allocated the file: {before} of {len}");
    {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&osd.data)
            .unwrap();
        let hole = 8 * MIB as libc::off_t;
        // SAFETY: fallocate(2) on a descriptor `file` owns, inside the file.
        let r = unsafe {
            libc::fallocate(
                file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                len as libc::off_t - hole,
                hole,
            )
        };
        assert_eq!(r, 0, "punching a hole: {}", std::io::Error::last_os_error());
    }
    let (punched, _) = allocated(&osd.data);
    assert!(
        punched + 8 * MIB <= before,
        "the file is sparse now: {punched} of {len}"
    );
    osd.start();
    wait_until(WAIT, "the data file allocated again", || {
        let (now, _) = allocated(&osd.data);
        async move { (now >= len).then_some(()) }
    })
    .await;
    wait_osds_up(&mons.client(), &[osd.id], WAIT).await;
    assert!(osd.is_running());
}

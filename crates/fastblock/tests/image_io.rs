//! `fastblock-client image import|export|cp` (`docs/cli.md`, "Moving data in and out"), run
//! as the real binary against a real cluster: a monitor on etcd and three `fastblock-osd`
//! processes holding a 3-replica pool.
//!
//! Every copy is checked byte for byte (`cmp` on the files, reads through the client library
//! on the images), and its sparseness by what the cluster allocated (`allocated_ranges`) and
//! what the file system allocated (`st_blocks`, SEEK_DATA).

mod common;

use common::{
    stamped, start_osds, wait_all_active, CliOutput, MonCluster, MonOptions, OsdProc, TempDir,
};
use fastblock_client::{Cluster, Image};
use fastblock_types::api::CreatePoolRequest;
use fastblock_types::map::FailureDomain;
use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// Every CLI run is bounded: a hung copy fails the test instead of hanging it.
const CLI_TIMEOUT: Duration = Duration::from_secs(120);

/// A monitor, three OSDs and pool `fb` (8 PGs of 3 replicas), every PG active.
struct Setup {
    mons: MonCluster,
    dir: TempDir,
    _osds: Vec<OsdProc>,
}

impl Setup {
    async fn start() -> Setup {
        let mons = MonCluster::start(1, MonOptions::default()).await;
        let dir = TempDir::new("imageio");
        let osds = start_osds(&mons, dir.path(), 3, "512M", 1, Duration::from_secs(20)).await;
        let client = mons.client();
        client
            .create_pool(&CreatePoolRequest {
                name: "fb".into(),
                pg_count: 8,
                size: 3,
                failure_domain: FailureDomain::Osd,
            })
            .await
            .unwrap();
        wait_all_active(&client, Duration::from_secs(30)).await;
        Setup {
            mons,
            dir,
            _osds: osds,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Runs `fastblock-client ARGS` with `stdin` as its standard input (on a blocking
    /// thread: the test's client keeps running) and returns its output; `stdout` goes to
    /// `stdout_to` if given.
    async fn cli_io(&self, args: &[&str], stdin: Input<'_>, stdout_to: Option<&Path>) -> CliOutput {
        let mut cmd = Command::new(common::bin("fastblock-client"));
        cmd.args(args)
            .env("FASTBLOCK_MON", self.mons.endpoints().join(","))
            .env("FASTBLOCK_KEYRING", self.mons.keyring())
            .stderr(Stdio::piped());
        match stdout_to {
            Some(path) => cmd.stdout(File::create(path).unwrap()),
            None => cmd.stdout(Stdio::piped()),
        };
        let feed = match stdin {
            Input::Null => {
                cmd.stdin(Stdio::null());
                None
            }
            Input::File(path) => {
                cmd.stdin(File::open(path).unwrap());
                None
            }
            Input::Pipe(bytes) => {
                cmd.stdin(Stdio::piped());
                Some(bytes)
            }
        };
        tokio::task::block_in_place(|| {
            let mut child = cmd.spawn().expect("running fastblock-client");
            // A pipe is fed from another thread, as a producer process would.
            let writer = feed.map(|bytes| {
                let mut pipe = child.stdin.take().unwrap();
                std::thread::spawn(move || {
                    // The CLI may stop reading early (a refused import): not an error here.
                    let _ = pipe.write_all(&bytes);
                })
            });
            let deadline = Instant::now() + CLI_TIMEOUT;
            // Read stdout and stderr while it runs (a full pipe would block it).
            let out = std::thread::spawn(move || child.wait_with_output());
            while !out.is_finished() {
                assert!(Instant::now() < deadline, "fastblock-client {args:?} hung");
                std::thread::sleep(Duration::from_millis(20));
            }
            if let Some(w) = writer {
                w.join().unwrap();
            }
            CliOutput::from(out.join().unwrap().unwrap())
        })
    }

    async fn cli(&self, args: &[&str]) -> CliOutput {
        self.cli_io(args, Input::Null, None).await
    }

    async fn connect(&self) -> Arc<Cluster> {
        Cluster::connect(self.mons.client_config()).await.unwrap()
    }
}

enum Input<'a> {
    Null,
    File(&'a Path),
    Pipe(Vec<u8>),
}

/// Writes a raw disk image of `size` bytes (at least 11 MiB) to `path` with every kind of content an import
/// meets: data crossing object boundaries, holes (never written: the file is sparse),
/// written zeros, a piece of data not aligned to 4 KiB, and data or a hole at the end.
/// Returns the file's bytes.
fn disk_file(path: &Path, size: u64, data_at_end: bool) -> Vec<u8> {
    assert!(size >= 11 * MIB, "the pieces below end after 10 MiB");
    let f = File::create(path).unwrap();
    f.set_len(size).unwrap();
    let write = |offset: u64, bytes: &[u8]| f.write_all_at(bytes, offset).unwrap();
    write(0, &stamped(0, 1, MIB));
    // 1 MiB .. 3 MiB: a hole. Then 64 KiB of written zeros, then data across the 4 MiB
    // object boundary.
    write(3 * MIB, &vec![0u8; 64 * KIB as usize]);
    write(3 * MIB + 64 * KIB, &stamped(3 * MIB, 2, 2 * MIB - 60 * KIB));
    // Unaligned: 5000 bytes at 9 MiB + 104.
    write(9 * MIB + 104, &stamped(9 * MIB, 3, 5000));
    // Zeros inside data: one zero block between two data blocks.
    let mut mixed = stamped(10 * MIB, 4, 12 * KIB).to_vec();
    mixed[4096..8192].fill(0);
    write(10 * MIB, &mixed);
    if data_at_end {
        write(size - 20 * KIB, &stamped(size, 5, 20 * KIB));
    }
    f.sync_all().unwrap();
    std::fs::read(path).unwrap()
}

/// Bytes of `data` in 4 KiB blocks that are not all zeros: what a sparse copy moves.
fn nonzero_block_bytes(data: &[u8]) -> u64 {
    data.chunks(4096)
        .filter(|b| b.iter().any(|&x| x != 0))
        .map(|b| b.len() as u64)
        .sum()
}

#[track_caller]
fn assert_same_bytes(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if got != want {
        let first = got.iter().zip(want).position(|(a, b)| a != b).unwrap();
        panic!("{what}: differs from byte {first}");
    }
}

/// `cmp A B` succeeds: the files are equal byte for byte.
#[track_caller]
fn assert_cmp_equal(a: &Path, b: &Path) {
    let out = Command::new("cmp").arg(a).arg(b).output().expect("cmp");
    assert!(
        out.status.success(),
        "cmp {} {}: {}{}",
        a.display(),
        b.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn read_all(image: &Image) -> Vec<u8> {
    image.read(0, image.size_bytes()).await.unwrap().to_vec()
}

async fn allocated_bytes(image: &Image) -> u64 {
    let ranges = image.allocated_ranges(0, image.size_bytes()).await.unwrap();
    ranges.iter().map(|r| r.1).sum()
}

/// Fails with exit status `code` (`docs/cli.md`, "Exit status") and one line on stderr
/// holding `needle`.
#[track_caller]
fn fails(out: &CliOutput, code: i32, needle: &str) {
    out.fails_with(needle);
    assert_eq!(out.code, code, "{}", out.stderr);
}

const NOT_FOUND: i32 = 3;
const REFUSED: i32 = 4;

/// The JSON summary of a copy, checked for its sizes.
#[track_caller]
fn summary(out: &CliOutput, verb: &str, bytes: u64, data_bytes: u64) -> serde_json::Value {
    let s = out.json();
    assert_eq!(s["verb"], verb, "{s}");
    assert_eq!(s["bytes"], bytes, "{s}");
    assert_eq!(s["data_bytes"], data_bytes, "{s}");
    assert!(s["seconds"].as_f64().unwrap() > 0.0, "{s}");
    assert!(s["mb_per_s"].as_f64().is_some(), "{s}");
    s
}

/// Import, then export, through files and through stdin and stdout, of a file whose size
/// is not a multiple of the object size, with holes, written zeros and unaligned data:
/// every export is equal to the file (`cmp`), the image holds only the blocks that are not
/// zeros, and the exported file is sparse again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_and_export_round_trip_through_files_and_stdio() {
    let s = Setup::start().await;
    let cluster = s.connect().await;
    // 13 MiB + 20 KiB: three whole objects of 4 MiB and a partial one.
    let size = 13 * MIB + 20 * KIB;
    let raw = s.path("disk.raw");
    let bytes = disk_file(&raw, size, true);
    let data_bytes = nonzero_block_bytes(&bytes);
    assert!(data_bytes < size / 2, "the test file is mostly holes");

    // From a file, with the default object size (4 MiB).
    let raw_arg = raw.to_str().unwrap();
    let out = s
        .cli(&["--json", "image", "import", raw_arg, "fb/disk"])
        .await;
    summary(&out, "imported", size, data_bytes);
    let image = cluster.open_image("fb", "disk").await.unwrap();
    assert_eq!(image.info().object_size_bytes, 4 * MIB);
    assert_same_bytes(&read_all(&image).await, &bytes, "fb/disk");
    // Holes and zero blocks were not written: the cluster holds exactly the data blocks.
    assert_eq!(allocated_bytes(&image).await, data_bytes);
    // The marker snapshot is gone once the import is complete.
    let snaps = s
        .cli(&["--json", "image", "snap", "ls", "fb/disk"])
        .await
        .json();
    assert_eq!(snaps.as_array().unwrap().len(), 0, "{snaps}");

    // Export to a file: equal, sparse.
    let back = s.path("back.raw");
    let out = s
        .cli(&[
            "--json",
            "image",
            "export",
            "fb/disk",
            back.to_str().unwrap(),
        ])
        .await;
    summary(&out, "exported", size, data_bytes);
    assert_cmp_equal(&raw, &back);
    let allocated = std::fs::metadata(&back).unwrap().blocks() * 512;
    assert!(
        allocated <= data_bytes + 256 * KIB,
        "the export allocated {allocated} bytes for {data_bytes} bytes of data"
    );

    // The text summary: one line.
    let again = s.path("again.raw");
    let out = s
        .cli(&["image", "export", "fb/disk", again.to_str().unwrap()])
        .await;
    let line = out.ok();
    assert_eq!(line.lines().count(), 1, "{line}");
    assert!(line.starts_with("exported fb/disk into "), "{line}");
    assert!(
        line.contains("13.02 MiB") && line.contains("MB/s"),
        "{line}"
    );
    assert_cmp_equal(&raw, &again);

    // From a pipe (`-`, its size given), into 1 MiB objects; then to stdout (a file and a
    // pipe), which gets every byte, holes as zeros.
    let size_arg = size.to_string();
    let out = s
        .cli_io(
            &[
                "--json",
                "image",
                "import",
                "-",
                "fb/piped",
                "--size",
                &size_arg,
                "--object-size",
                "1M",
            ],
            Input::Pipe(bytes.clone()),
            None,
        )
        .await;
    summary(&out, "imported", size, data_bytes);
    let piped = cluster.open_image("fb", "piped").await.unwrap();
    assert_eq!(piped.info().object_size_bytes, MIB);
    assert_same_bytes(&read_all(&piped).await, &bytes, "fb/piped");
    assert_eq!(allocated_bytes(&piped).await, data_bytes);
    let streamed = s.path("streamed.raw");
    let out = s
        .cli_io(
            &["--json", "image", "export", "fb/piped", "-"],
            Input::Null,
            Some(&streamed),
        )
        .await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    // The summary goes to stderr when the data goes to stdout.
    let on_stderr: serde_json::Value = serde_json::from_str(&out.stderr).unwrap();
    assert_eq!(on_stderr["data_bytes"], data_bytes);
    assert_cmp_equal(&raw, &streamed);
    let out = s
        .cli_io(&["image", "export", "fb/piped", "-"], Input::Null, None)
        .await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stderr.starts_with("exported fb/piped into stdout"),
        "{}",
        out.stderr
    );

    // Stdin redirected from a file is read as a file (no --size needed); a file ending in a
    // hole comes back with that hole; a size that is not a multiple of 4 KiB is rounded up.
    let tail_hole = s.path("tail-hole.raw");
    let odd_size = 13 * MIB + 100;
    let odd = disk_file(&tail_hole, odd_size, false);
    let out = s
        .cli_io(
            &["--json", "image", "import", "-", "fb/odd"],
            Input::File(&tail_hole),
            None,
        )
        .await;
    let rounded = 13 * MIB + 4 * KIB;
    summary(&out, "imported", rounded, nonzero_block_bytes(&odd));
    let exported = s.path("odd.raw");
    s.cli(&["image", "export", "fb/odd", exported.to_str().unwrap()])
        .await
        .ok();
    let got = std::fs::read(&exported).unwrap();
    assert_eq!(got.len() as u64, rounded);
    assert_same_bytes(&got[..odd.len()], &odd, "fb/odd up to the file's end");
    assert!(got[odd.len()..].iter().all(|&b| b == 0), "padding is zeros");
}

/// `image cp` of a snapshot copies the snapshot, not the head; the refusals (an existing
/// image or file, a missing image or file, a pipe shorter than `--size`) exit non-zero with
/// one clear line and change nothing; an import cut short leaves its marker snapshot, which
/// `image rm` names and `--overwrite` clears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cp_of_a_snapshot_and_the_refusals() {
    let s = Setup::start().await;
    let cluster = s.connect().await;
    let size = 12 * MIB;
    let raw = s.path("first.raw");
    let first = disk_file(&raw, size, true);
    s.cli(&["image", "import", raw.to_str().unwrap(), "fb/src"])
        .await
        .ok();
    s.cli(&["image", "snap", "create", "fb/src@s1"]).await.ok();
    // The head changes after the snapshot.
    let src = cluster.open_image("fb", "src").await.unwrap();
    src.write(2 * MIB, stamped(2 * MIB, 9, MIB)).await.unwrap();
    let head = read_all(&src).await;
    assert_ne!(head, first);

    // The snapshot's copy is the first content (a snapshot is read whole: holes are found
    // by the zero test, and not written).
    let out = s
        .cli(&["--json", "image", "cp", "fb/src@s1", "fb/copy"])
        .await;
    summary(&out, "copied", size, nonzero_block_bytes(&first));
    let copy = cluster.open_image("fb", "copy").await.unwrap();
    assert_same_bytes(&read_all(&copy).await, &first, "fb/copy");
    assert_eq!(allocated_bytes(&copy).await, nonzero_block_bytes(&first));
    assert_eq!(copy.info().object_size_bytes, src.info().object_size_bytes);
    let exported = s.path("copy.raw");
    s.cli(&["image", "export", "fb/copy", exported.to_str().unwrap()])
        .await
        .ok();
    assert_cmp_equal(&raw, &exported);
    // A snapshot exports too (read whole: the OSDs answer block status for heads only).
    let snap_file = s.path("snap.raw");
    s.cli(&["image", "export", "fb/src@s1", snap_file.to_str().unwrap()])
        .await
        .ok();
    assert_cmp_equal(&raw, &snap_file);
    // Read whole, written sparse: the zero blocks read from the snapshot stay holes.
    let allocated = std::fs::metadata(&snap_file).unwrap().blocks() * 512;
    assert!(
        allocated <= nonzero_block_bytes(&first) + 256 * KIB,
        "the snapshot's export allocated {allocated} bytes for {} bytes of data",
        nonzero_block_bytes(&first)
    );

    // An existing target is refused, untouched; --overwrite replaces it with the head.
    fails(
        &s.cli(&["image", "cp", "fb/src", "fb/copy"]).await,
        REFUSED,
        "image fb/copy already exists: pass --overwrite",
    );
    assert_same_bytes(&read_all(&copy).await, &first, "fb/copy after a refused cp");
    s.cli(&["image", "cp", "fb/src", "fb/copy", "--overwrite"])
        .await
        .ok();
    let copy = cluster.open_image("fb", "copy").await.unwrap();
    assert_same_bytes(&read_all(&copy).await, &head, "fb/copy overwritten");
    fails(
        &s.cli(&["image", "cp", "fb/src@s1", "fb/src", "--overwrite"])
            .await,
        2,
        "cannot be copied onto its own image",
    );

    // Import onto an existing image: refused, the image unchanged.
    let other = s.path("other.raw");
    std::fs::write(&other, stamped(0, 7, MIB)).unwrap();
    fails(
        &s.cli(&["image", "import", other.to_str().unwrap(), "fb/src"])
            .await,
        REFUSED,
        "image fb/src already exists: pass --overwrite",
    );
    let src = cluster.open_image("fb", "src").await.unwrap();
    assert_same_bytes(
        &read_all(&src).await,
        &head,
        "fb/src after a refused import",
    );

    // A missing file or image: refused, nothing created.
    s.cli(&["image", "import", "/nonexistent/disk.raw", "fb/new"])
        .await
        .fails_with("cannot open /nonexistent/disk.raw");
    fails(
        &s.cli(&["image", "info", "fb/new"]).await,
        NOT_FOUND,
        "does not exist",
    );
    let nowhere = s.path("nowhere.raw");
    let nowhere_arg = nowhere.to_str().unwrap();
    fails(
        &s.cli(&["image", "export", "fb/missing", nowhere_arg]).await,
        NOT_FOUND,
        "image fb/missing does not exist",
    );
    assert!(!nowhere.exists(), "a failed export left a file");
    fails(
        &s.cli(&["image", "export", "nopool/src", nowhere_arg]).await,
        NOT_FOUND,
        "pool \"nopool\" does not exist",
    );
    fails(
        &s.cli(&["image", "export", "fb/src@nosuch", nowhere_arg])
            .await,
        NOT_FOUND,
        "no snapshot",
    );
    assert!(!nowhere.exists(), "a failed export left a file");
    fails(
        &s.cli(&["image", "cp", "fb/missing", "fb/new"]).await,
        NOT_FOUND,
        "image fb/missing does not exist",
    );
    // An existing file is not replaced unless asked.
    fails(
        &s.cli(&["image", "export", "fb/src", other.to_str().unwrap()])
            .await,
        REFUSED,
        "exists: pass --overwrite",
    );
    assert_eq!(std::fs::read(&other).unwrap(), stamped(0, 7, MIB).to_vec());
    // A pipe needs --size.
    s.cli_io(
        &["image", "import", "-", "fb/new"],
        Input::Pipe(vec![1; 4096]),
        None,
    )
    .await
    .fails_with("give the image's size with --size");

    // A pipe shorter than --size: a short read, the image marked incomplete.
    let out = s
        .cli_io(
            &["image", "import", "-", "fb/short", "--size", "8M"],
            Input::Pipe(stamped(0, 8, 5 * MIB).to_vec()),
            None,
        )
        .await;
    out.fails_with("short read: stdin ended after 5242880 bytes");
    assert!(
        out.stderr.contains("fb/short@import-incomplete"),
        "{}",
        out.stderr
    );
    let snaps = s
        .cli(&["--json", "image", "snap", "ls", "fb/short"])
        .await
        .json();
    assert_eq!(snaps[0]["name"], "import-incomplete", "{snaps}");
    fails(
        &s.cli(&["image", "rm", "fb/short"]).await,
        REFUSED,
        "import-incomplete",
    );
    // A partial image is not read as if it were complete: export and cp (of it, or of a
    // snapshot of it) are refused, naming the marker and both ways out; nothing is written.
    s.cli(&["image", "snap", "create", "fb/short@keep"])
        .await
        .ok();
    for source in ["fb/short", "fb/short@keep"] {
        let out = s.cli(&["image", "export", source, nowhere_arg]).await;
        fails(
            &out,
            REFUSED,
            "fb/short is incomplete: an import into it was interrupted",
        );
        assert!(
            out.stderr
                .contains("`image snap rm fb/short@import-incomplete`")
                && out.stderr.contains("--overwrite"),
            "{}",
            out.stderr
        );
        assert!(!nowhere.exists(), "a refused export left a file");
        fails(
            &s.cli(&["image", "cp", source, "fb/partial"]).await,
            REFUSED,
            "(its snapshot import-incomplete marks it)",
        );
        fails(
            &s.cli(&["image", "info", "fb/partial"]).await,
            NOT_FOUND,
            "does not exist",
        );
    }
    // --overwrite of an image with a snapshot besides its marker is refused before anything
    // is removed: the partial image keeps its marker.
    let out = s
        .cli_io(
            &[
                "image",
                "import",
                "-",
                "fb/short",
                "--size",
                "8M",
                "--overwrite",
            ],
            Input::Pipe(stamped(0, 8, 8 * MIB).to_vec()),
            None,
        )
        .await;
    fails(&out, REFUSED, "it has snapshot(s) keep");
    let snaps = s
        .cli(&["--json", "image", "snap", "ls", "fb/short"])
        .await
        .json();
    let names: Vec<&str> = snaps
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["import-incomplete", "keep"], "{snaps}");
    s.cli(&["image", "snap", "rm", "fb/short@keep"]).await.ok();
    // A longer pipe is refused too; then the whole input with --overwrite completes it.
    s.cli_io(
        &[
            "image",
            "import",
            "-",
            "fb/short",
            "--size",
            "4M",
            "--overwrite",
        ],
        Input::Pipe(stamped(0, 8, 5 * MIB).to_vec()),
        None,
    )
    .await
    .fails_with("holds more than --size");
    let whole = stamped(0, 8, 8 * MIB).to_vec();
    s.cli_io(
        &[
            "image",
            "import",
            "-",
            "fb/short",
            "--size",
            "8M",
            "--overwrite",
        ],
        Input::Pipe(whole.clone()),
        None,
    )
    .await
    .ok();
    let snaps = s
        .cli(&["--json", "image", "snap", "ls", "fb/short"])
        .await
        .json();
    assert_eq!(snaps.as_array().unwrap().len(), 0, "{snaps}");
    let short = cluster.open_image("fb", "short").await.unwrap();
    assert_same_bytes(&read_all(&short).await, &whole, "fb/short");
    s.cli(&["image", "rm", "fb/short"]).await.ok();

    // Killed in the middle (SIGKILL: no chance to clean up), an import leaves its marker.
    let mut child = Command::new(common::bin("fastblock-client"))
        .args(["image", "import", "-", "fb/killed", "--size", "64M"])
        .env("FASTBLOCK_MON", s.mons.endpoints().join(","))
        .env("FASTBLOCK_KEYRING", s.mons.keyring())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Half the data, and the pipe kept open: the import waits for the rest.
    let mut pipe = child.stdin.take().unwrap();
    pipe.write_all(&stamped(0, 12, 32 * MIB)).unwrap();
    let mon = s.mons.client();
    common::wait_until(Duration::from_secs(30), "the import to start", || async {
        let snaps = mon.snaps("fb", "killed").await.ok()?;
        snaps
            .iter()
            .any(|s| s.name == "import-incomplete")
            .then_some(())
    })
    .await;
    child.kill().unwrap();
    child.wait().unwrap();
    drop(pipe);
    let info = s
        .cli(&["--json", "image", "info", "fb/killed"])
        .await
        .json();
    assert_eq!(info["snapshot_count"], 1, "{info}");
    let snaps = s
        .cli(&["--json", "image", "snap", "ls", "fb/killed"])
        .await
        .json();
    assert_eq!(snaps[0]["name"], "import-incomplete", "{snaps}");
}

/// The file's data ranges (SEEK_DATA/SEEK_HOLE), as the kernel reports them.
fn file_data_ranges(f: &File) -> Vec<(u64, u64)> {
    let size = f.metadata().unwrap().len() as i64;
    let mut out = Vec::new();
    let mut at = 0i64;
    while at < size {
        // SAFETY: lseek on an open descriptor owned by `f`.
        let data = unsafe { libc::lseek(f.as_raw_fd(), at, libc::SEEK_DATA) };
        if data < 0 {
            break;
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(f.as_raw_fd(), data, libc::SEEK_HOLE) };
        assert!(hole > data, "SEEK_HOLE {hole} after data at {data}");
        out.push((data as u64, (hole - data) as u64));
        at = hole;
    }
    out
}

/// A sparse 10 GiB disk file with 1 MiB of data imports and exports in seconds: only the
/// data moves, and the exported file is sparse (its allocated blocks, its SEEK_DATA ranges)
/// with the same bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sparse_10_gib_image_exports_in_seconds_to_a_sparse_file() {
    let s = Setup::start().await;
    let size = 10 * GIB;
    let raw = s.path("sparse.raw");
    let f = File::create(&raw).unwrap();
    f.set_len(size).unwrap();
    // 1 MiB of data: 16 pieces of 64 KiB spread over the whole image.
    let pieces: Vec<(u64, Vec<u8>)> = (0..16u64)
        .map(|i| {
            let offset = i * (size / 16) + i * 12 * KIB;
            (offset, stamped(offset, 11, 64 * KIB).to_vec())
        })
        .collect();
    for (offset, data) in &pieces {
        f.write_all_at(data, *offset).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);

    let raw_arg = raw.to_str().unwrap();
    let started = Instant::now();
    let out = s
        .cli(&["--json", "image", "import", raw_arg, "fb/big"])
        .await;
    let import_secs = started.elapsed().as_secs_f64();
    summary(&out, "imported", size, MIB);

    let back = s.path("big.raw");
    let started = Instant::now();
    let out = s
        .cli(&[
            "--json",
            "image",
            "export",
            "fb/big",
            back.to_str().unwrap(),
        ])
        .await;
    let export_secs = started.elapsed().as_secs_f64();
    summary(&out, "exported", size, MIB);
    let meta = std::fs::metadata(&back).unwrap();
    let allocated = meta.blocks() * 512;
    println!(
        "sparse 10 GiB with 1 MiB of data: import {import_secs:.2} s, export {export_secs:.2} s, \
         exported file allocates {allocated} bytes"
    );
    assert!(export_secs < 60.0, "the export took {export_secs:.1} s");
    assert!(import_secs < 60.0, "the import took {import_secs:.1} s");
    assert_eq!(meta.len(), size);
    assert!(
        allocated <= 4 * MIB,
        "the exported file allocates {allocated} bytes for 1 MiB of data"
    );
    // Same bytes: each piece reads back, and the file holds data nowhere else (the rest
    // are holes, which read as zeros).
    let back = File::open(&back).unwrap();
    for (offset, data) in &pieces {
        let mut got = vec![0u8; data.len()];
        back.read_exact_at(&mut got, *offset).unwrap();
        assert_same_bytes(&got, data, &format!("piece at {offset}"));
    }
    for (start, len) in file_data_ranges(&back) {
        assert!(
            pieces
                .iter()
                .any(|(o, d)| start + len > *o && start < o + d.len() as u64),
            "data at {start}+{len} in the export, where the source has a hole"
        );
    }
}

#!/usr/bin/env bash
# Installs what fastblock needs on a Debian/Ubuntu machine that has the Rust toolchain.
# Idempotent: installs only what is missing, so it is cheap to run before every build or test.
set -euo pipefail

# package -> a command (or file) it provides, used to tell whether it is already installed.
declare -A PROVIDES=(
  [etcd-server]=etcd
  [etcd-client]=etcdctl
  [protobuf-compiler]=protoc
  [libprotobuf-dev]=/usr/include/google/protobuf/message.h
  [fio]=fio                  # with its nbd engine (NBD tests, benchmarks)
  [qemu-utils]=qemu-img      # qemu-img and qemu-io (NBD tests)
  [libnbd-bin]=nbdinfo       # nbdinfo and nbdcopy (NBD tests)
  [curl]=curl
  # The full-disk test (crates/fastblock/tests/disk_full.rs): an ext4 file system on a loop
  # device (losetup comes with `mount`).
  [e2fsprogs]=mkfs.ext4
  [mount]=losetup
  [uuid-runtime]=uuidgen
  # The network-partition tests (crates/fastblock/tests/partition.rs): network namespaces,
  # veth pairs and a bridge (ip), and DROP rules inside a namespace (nft).
  [iproute2]=ip
  [nftables]=nft
  # The deployment test (crates/fastblock/tests/deploy.rs): `systemd-analyze verify` of the
  # units (systemd need not run) and scripts/build-deb.sh (dpkg-deb).
  [systemd]=systemd-analyze
  [dpkg]=dpkg-deb
  # bench/run.sh: its report (python3, standard library only) and plots (gnuplot).
  [python3]=python3
  [gnuplot-nox]=gnuplot
  # promtool checks deploy/prometheus/alerts.yml (scripts/check-monitoring.sh, CI). Debian
  # ships it in the Prometheus server's package (about 100 MB installed); the server is not
  # started by it in a container without systemd, and nothing here runs it.
  [prometheus]=promtool
  # The status page test (crates/fastblock/tests/status_page.rs) renders the monitor's page in
  # headless Chromium, driven over the DevTools protocol (no WebDriver, so no chromium-driver).
  [chromium]=chromium
)

missing=()
for pkg in "${!PROVIDES[@]}"; do
  what=${PROVIDES[$pkg]}
  if [[ $what == /* ]]; then
    [[ -e $what ]] || missing+=("$pkg")
  else
    command -v "$what" >/dev/null 2>&1 || missing+=("$pkg")
  fi
done

# bench/run.sh counts system calls and io_uring submissions per IO with perf (kernel
# tracepoints); Debian packages it as linux-perf, Ubuntu per kernel (linux-tools-*), so it is
# installed where the archive has linux-perf and the kit reports those counts as not
# measured elsewhere.
if ! command -v perf >/dev/null 2>&1 && apt-cache show linux-perf >/dev/null 2>&1; then
  missing+=(linux-perf)
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  SUDO="sudo"
fi

if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "install-deps: cargo not found; install the Rust toolchain (https://rustup.rs) first" >&2
  exit 1
fi
if ! cargo nextest --version >/dev/null 2>&1; then
  echo "install-deps: cargo-nextest not found; scripts/test.sh falls back to cargo test"
fi
echo "install-deps: all dependencies present"

#!/usr/bin/env bash
# Builds the Debian package `fastblock` with dpkg-deb: the binaries in /usr/bin, the systemd
# units in /lib/systemd/system, the docs in /usr/share/doc/fastblock, and a postinst that
# creates the `fastblock` system user, /etc/fastblock and /var/lib/fastblock
# (docs/operations.md, "Installing from the package").
#
#   scripts/build-deb.sh                      release build, then the package in target/deb/
#   scripts/build-deb.sh --debug              debug build (faster to build, larger, slower)
#   scripts/build-deb.sh --bin-dir DIR        package the binaries already in DIR, no build
#   scripts/build-deb.sh --out DIR            write the .deb to DIR
#   scripts/build-deb.sh --compress none|gzip|xz   (default xz)
#
# Prints the path of the package on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."

BINARIES=(fastblock-mon fastblock-osd fastblock-client fastblock-nbd)
UNITS=(fastblock-mon@.service fastblock-osd@.service fastblock-nbd@.service)
DOCS=(README.md docs/operations.md docs/security.md docs/cli.md docs/mon-api.md docs/nbd.md
  docs/metrics.md docs/etcd-keys.md)

profile=release
bin_dir=""
out_dir=""
compress=xz
usage() {
  sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit "${1:-2}"
}
while (($#)); do
  case $1 in
    --debug) profile=debug ;;
    --release) profile=release ;;
    --bin-dir) bin_dir=${2:?--bin-dir needs a directory}; shift ;;
    --out) out_dir=${2:?--out needs a directory}; shift ;;
    --compress)
      compress=${2:?--compress needs none, gzip or xz}
      if [[ $compress != none && $compress != gzip && $compress != xz ]]; then
        echo "build-deb: --compress takes none, gzip or xz, not $compress" >&2
        exit 2
      fi
      shift
      ;;
    -h | --help) usage 0 ;;
    *) echo "build-deb: unknown argument $1" >&2; usage ;;
  esac
  shift
done

for tool in dpkg-deb dpkg; do
  command -v "$tool" >/dev/null || { echo "build-deb: $tool not found (Debian's dpkg)" >&2; exit 1; }
done

target_dir=${CARGO_TARGET_DIR:-target}
if [[ -z $bin_dir ]]; then
  flags=(--locked -p fastblock --bins)
  [[ $profile == release ]] && flags+=(--release)
  cargo build "${flags[@]}" >&2
  bin_dir=$target_dir/$profile
fi
out_dir=${out_dir:-$target_dir/deb}

version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
[[ -n $version ]] || { echo "build-deb: no version in Cargo.toml [workspace.package]" >&2; exit 1; }
arch=$(dpkg --print-architecture)

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root=$stage/fastblock_${version}_$arch
install -d "$root/DEBIAN" "$root/usr/bin" "$root/lib/systemd/system" \
  "$root/usr/share/doc/fastblock/examples"

glibc=""
for bin in "${BINARIES[@]}"; do
  [[ -x $bin_dir/$bin ]] || { echo "build-deb: $bin_dir/$bin is missing (build it first)" >&2; exit 1; }
  install -m 0755 "$bin_dir/$bin" "$root/usr/bin/$bin"
  # The newest glibc symbol version each binary links against: the package's libc6 floor.
  need=$(grep -aoE 'GLIBC_2\.[0-9]+(\.[0-9]+)?' "$bin_dir/$bin" | sort -uV | tail -n 1 || true)
  if [[ -n $need ]] && { [[ -z $glibc ]] || [[ $(printf '%s\n%s\n' "$glibc" "$need" | sort -V | tail -n 1) == "$need" ]]; }; then
    glibc=$need
  fi
done
for unit in "${UNITS[@]}"; do
  install -m 0644 "deploy/systemd/$unit" "$root/lib/systemd/system/$unit"
done
for doc in "${DOCS[@]}"; do
  install -m 0644 "$doc" "$root/usr/share/doc/fastblock/$(basename "$doc")"
done
install -m 0644 deploy/examples/*.env "$root/usr/share/doc/fastblock/examples/"
cat >"$root/usr/share/doc/fastblock/copyright" <<EOF
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: fastblock
License: Apache-2.0

Files: *
License: Apache-2.0
 On Debian systems the full text of the license is in /usr/share/common-licenses/Apache-2.0.
EOF

depends="adduser"
[[ -n $glibc ]] && depends="libc6 (>= ${glibc#GLIBC_}), $depends"
installed_kib=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
cat >"$root/DEBIAN/control" <<EOF
Package: fastblock
Version: $version
Architecture: $arch
Maintainer: fastblock developers <fastblock@fastblock.invalid>
Installed-Size: $installed_kib
Depends: $depends
Recommends: etcd-server
Suggests: qemu-utils, nbd-client
Section: admin
Priority: optional
Description: distributed block store: monitor, OSD, admin CLI and NBD server
 fastblock keeps a cluster map in etcd (fastblock-mon), replicates each placement
 group with its own Raft group on OSD daemons (fastblock-osd), and serves images
 over NBD (fastblock-nbd). fastblock-client administers the cluster.
 .
 systemd units: fastblock-mon@NAME, fastblock-osd@NAME and fastblock-nbd@NAME,
 configured in /etc/fastblock (see /usr/share/doc/fastblock/operations.md).
 fastblock-mon runs its own etcd member unless given --etcd-endpoints: it needs
 the etcd binary (etcd-server).
EOF

cat >"$root/DEBIAN/postinst" <<'EOF'
#!/bin/sh
# Creates the user the units run as and the directories they use; leaves existing ones as
# they are (a reinstall or upgrade changes nothing an operator set).
set -e
if [ "$1" = configure ]; then
  if ! getent group fastblock >/dev/null; then
    addgroup --system --quiet fastblock
  fi
  if ! getent passwd fastblock >/dev/null; then
    adduser --system --quiet --ingroup fastblock --home /var/lib/fastblock \
      --no-create-home --shell /usr/sbin/nologin --gecos "fastblock daemons" fastblock
  fi
  # The OSD unit opens block devices through group disk.
  adduser --quiet fastblock disk >/dev/null 2>&1 || true
  for dir in /etc/fastblock /var/lib/fastblock; do
    if [ ! -d "$dir" ]; then
      install -d -o fastblock -g fastblock -m 0750 "$dir"
    fi
  done
  if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || true
  fi
fi
exit 0
EOF
cat >"$root/DEBIAN/postrm" <<'EOF'
#!/bin/sh
# Keeps /etc/fastblock, /var/lib/fastblock and the user: they hold keys and data.
set -e
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload >/dev/null 2>&1 || true
fi
exit 0
EOF
chmod 0755 "$root/DEBIAN/postinst" "$root/DEBIAN/postrm"

mkdir -p "$out_dir"
deb=$out_dir/fastblock_${version}_$arch.deb
dpkg-deb --root-owner-group -Z"$compress" --build "$root" "$deb" >&2
echo "$deb"

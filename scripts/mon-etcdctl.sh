#!/usr/bin/env bash
# etcdctl against a monitor's own etcd member, logged in as its root user.
#
#   scripts/mon-etcdctl.sh SECRET_FILE ENDPOINT ETCDCTL_ARGS...
#   scripts/mon-etcdctl.sh .vstart/mon.a/mon.secret 127.0.0.1:2379 get --prefix /fastblock
#
# The password is derived from the monitor secret (--mon-secret-file) as the monitor derives
# it (crates/mon/src/secret.rs): HKDF-SHA256 (RFC 5869) with salt "fastblock monitor secret
# v1" and info "fastblock etcd root password v1", 32 bytes, in hex. Whoever can read the
# secret file can run this; nobody else can read or write the monitors' etcd
# (docs/security.md, "etcd"). Entity keys stay sealed in what etcdctl shows. Needs etcdctl and
# python3 (its standard library only).
set -euo pipefail
if [[ $# -lt 3 ]]; then
  sed -n '2,5p' "$0" >&2
  exit 2
fi
secret=$1 endpoint=$2
shift 2
password=$(python3 - "$secret" <<'PY'
import hashlib, hmac, sys
secret = open(sys.argv[1], "rb").read()
if len(secret) != 32:
    sys.exit(f"{sys.argv[1]}: not a monitor secret (32 bytes)")
prk = hmac.new(b"fastblock monitor secret v1", secret, hashlib.sha256).digest()
print(hmac.new(prk, b"fastblock etcd root password v1\x01", hashlib.sha256).hexdigest())
PY
)
ETCDCTL_API=3 exec etcdctl --endpoints "$endpoint" --user "root:$password" "$@"

#!/usr/bin/env bash
# Starts a local fastblock cluster under ./.vstart: installs what is missing, builds release
# binaries if needed, starts a monitor (with its own etcd member) and N OSDs on data files
# (allocated in full), creates a pool and an image, and waits until every PG is active.
#
#   ./vstart.sh            start (or report that it already runs)
#   ./vstart.sh --stop     stop everything started here
#   ./vstart.sh --clean    stop, wipe ./.vstart, start afresh
#
# Options: -c/--count N OSDs (3), -r/--replica N (3), -p/--pgcount N (8), --osd-size SIZE (4G,
# or $FASTBLOCK_VSTART_AIO_FILE_SIZE), --shards N per OSD (1), --mon-port N (3333),
# --osd-port N (6800; OSD i uses N + 10*i + shard for data, N + 10*i + 9 for /metrics),
# --etcd-port N (2379; peer N+1),
# --state-dir DIR (./.vstart or $FASTBLOCK_VSTART_STATE_ROOT), --preallocate reserve|wal|full
# (each OSD file is allocated in full; what mkfs also writes with zeros: nothing, the WAL or
# everything; wal), --no-build. $FASTBLOCK_VSTART_OSD_ARGS is added to every OSD's command
# line (e.g. "--flush-interval 1s").
set -euo pipefail
cd "$(dirname "$0")"

STATE=${FASTBLOCK_VSTART_STATE_ROOT:-$PWD/.vstart}
MON_PORT=3333
ETCD_PORT=2379
OSD_PORT=6800
COUNT=3
REPLICA=3
PGCOUNT=8
SHARDS=1
OSD_SIZE=${FASTBLOCK_VSTART_AIO_FILE_SIZE:-4G}
POOL=fb
IMAGE=dev-image
IMAGE_SIZE=64M
ACTION=start
BUILD=1
PREALLOCATE=wal

usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; }

while (($#)); do
  case $1 in
    --stop) ACTION=stop ;;
    --clean) ACTION=clean ;;
    --mon-port) MON_PORT=${2:?--mon-port needs a value}; shift ;;
    --osd-port) OSD_PORT=${2:?--osd-port needs a value}; shift ;;
    -c|--count) COUNT=${2:?--count needs a value}; shift ;;
    -r|--replica) REPLICA=${2:?--replica needs a value}; shift ;;
    -p|--pgcount) PGCOUNT=${2:?--pgcount needs a value}; shift ;;
    --shards) SHARDS=${2:?--shards needs a value}; shift ;;
    --osd-size) OSD_SIZE=${2:?--osd-size needs a value}; shift ;;
    --etcd-port) ETCD_PORT=${2:?--etcd-port needs a value}; shift ;;
    --state-dir) STATE=${2:?--state-dir needs a value}; shift ;;
    --no-build) BUILD=0 ;;
    --preallocate) PREALLOCATE=${2:?--preallocate needs reserve, wal or full}; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "vstart.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done

for v in COUNT REPLICA PGCOUNT SHARDS MON_PORT OSD_PORT ETCD_PORT; do
  [[ ${!v} =~ ^[0-9]+$ && ${!v} -gt 0 ]] || { echo "vstart.sh: $v must be a positive number" >&2; exit 2; }
done
if ((SHARDS > 9)); then
  echo "vstart.sh: at most 9 shards per OSD (port N + 10*i + 9 serves its /metrics)" >&2
  exit 2
fi
if ((REPLICA > COUNT)); then
  echo "vstart.sh: --replica $REPLICA needs at least that many OSDs (--count $COUNT)" >&2
  exit 2
fi

RUN=$STATE/run
BIN=${CARGO_TARGET_DIR:-$PWD/target}/release
[[ $BIN == /* ]] || BIN=$PWD/$BIN

pid_alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

stop_all() {
  local stopped=0
  # OSDs first, the monitor last, so OSDs never lose their monitor while stopping.
  for pidfile in "$RUN"/osd.*.pid "$RUN"/mon.*.pid; do
    [[ -e $pidfile ]] || continue
    if pid_alive "$pidfile"; then
      local pid; pid=$(cat "$pidfile")
      kill -TERM "$pid" 2>/dev/null || true
      for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
      echo "stopped $(basename "$pidfile" .pid) (pid $pid)"
      stopped=1
    fi
    rm -f "$pidfile"
  done
  ((stopped)) || echo "nothing was running"
}

case $ACTION in
  stop) stop_all; exit 0 ;;
  clean) stop_all; rm -rf "$STATE" ;;
esac

mkdir -p "$RUN" "$STATE/log" "$STATE/mon.a"
if pid_alive "$RUN/mon.a.pid"; then
  echo "a cluster already runs from $STATE (monitor pid $(cat "$RUN/mon.a.pid")); use --stop or --clean"
  exit 0
fi

./scripts/install-deps.sh
if ((BUILD)); then
  echo "building release binaries..."
  cargo build --release --locked --bins -q
fi
for b in fastblock-mon fastblock-client fastblock-osd block_bench; do
  [[ -x $BIN/$b ]] || { echo "vstart.sh: $BIN/$b missing; run without --no-build" >&2; exit 1; }
done

port_busy() { (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null; }
osd_ports=()
for i in $(seq 1 "$COUNT"); do
  for k in $(seq 0 $((SHARDS - 1))); do osd_ports+=($((OSD_PORT + 10 * i + k))); done
  osd_ports+=($((OSD_PORT + 10 * i + 9)))
done
for p in "$MON_PORT" "$ETCD_PORT" "$((ETCD_PORT + 1))" "${osd_ports[@]}"; do
  if port_busy "$p"; then
    echo "vstart.sh: port $p is in use; pick others with --mon-port/--etcd-port" >&2
    exit 1
  fi
done

MON=127.0.0.1:$MON_PORT
# The daemons' admin sockets (`fastblock-client config`, docs/operations.md "Configuration")
# go beside their pid files rather than in /run/fastblock.
export FASTBLOCK_RUN_DIR=$RUN
setsid "$BIN/fastblock-mon" --name a --data-dir "$STATE/mon.a" --api-addr "$MON" \
  --etcd-client-addr "127.0.0.1:$ETCD_PORT" --etcd-peer-addr "127.0.0.1:$((ETCD_PORT + 1))" \
  --auth-mode sign --keyring "$STATE/keyring" \
  >"$STATE/log/mon.a.log" 2>&1 < /dev/null &
echo $! > "$RUN/mon.a.pid"

echo -n "waiting for the monitor"
for _ in $(seq 1 300); do
  if "$BIN/fastblock-client" --mon "$MON" --timeout 1s health >/dev/null 2>&1; then
    echo " ready"
    break
  fi
  if ! pid_alive "$RUN/mon.a.pid"; then
    echo; echo "vstart.sh: the monitor exited; see $STATE/log/mon.a.log:" >&2
    tail -n 20 "$STATE/log/mon.a.log" >&2
    exit 1
  fi
  echo -n .; sleep 0.2
done
"$BIN/fastblock-client" --mon "$MON" --timeout 5s health >/dev/null
export FASTBLOCK_MON=$MON
# The monitor writes client.admin's key here when it creates the cluster (its first tick as
# leader); the CLI and mkfs sign with it, each OSD with its own <data>.keyring.
export FASTBLOCK_KEYRING=$STATE/keyring
for _ in $(seq 1 100); do [[ -e $FASTBLOCK_KEYRING ]] && break; sleep 0.1; done
[[ -e $FASTBLOCK_KEYRING ]] || { echo "vstart.sh: the monitor wrote no keyring at $FASTBLOCK_KEYRING; see $STATE/log/mon.a.log" >&2; exit 1; }

for i in $(seq 1 "$COUNT"); do
  data=$STATE/osd.$i.img
  if [[ ! -e $data.osd.json ]]; then
    "$BIN/fastblock-osd" --mkfs --data "$data" --size "$OSD_SIZE" --shards "$SHARDS" \
      --preallocate "$PREALLOCATE" >/dev/null
  fi
  setsid "$BIN/fastblock-osd" --data "$data" --port $((OSD_PORT + 10 * i)) --host "vstart-host$i" \
    --metrics-addr "127.0.0.1:$((OSD_PORT + 10 * i + 9))" ${FASTBLOCK_VSTART_OSD_ARGS:-} \
    >"$STATE/log/osd.$i.log" 2>&1 < /dev/null &
  echo $! > "$RUN/osd.$i.pid"
done

echo -n "waiting for $COUNT OSDs"
for _ in $(seq 1 300); do
  up=$("$BIN/fastblock-client" --json osd ls | grep -c '"up": true' || true)
  ((up >= COUNT)) && { echo " up"; break; }
  for i in $(seq 1 "$COUNT"); do
    pid_alive "$RUN/osd.$i.pid" || { echo; echo "vstart.sh: osd $i exited:" >&2; tail -n 20 "$STATE/log/osd.$i.log" >&2; exit 1; }
  done
  echo -n .; sleep 0.2
done

if ! "$BIN/fastblock-client" pool ls | grep -qw "$POOL"; then
  "$BIN/fastblock-client" pool create "$POOL" --pg-count "$PGCOUNT" --size "$REPLICA" --failure-domain osd
fi
if ! "$BIN/fastblock-client" image ls "$POOL" | grep -q "^$POOL/$IMAGE "; then
  "$BIN/fastblock-client" image create "$POOL/$IMAGE" --size "$IMAGE_SIZE"
fi
# The NBD server's own key (what `fastblock-nbd serve` acts as by default), beside the admin's
# in the same keyring; limited to images, not the cluster's administration.
"$BIN/fastblock-client" auth get-or-create client.nbd --caps 'pool=*' -o "$FASTBLOCK_KEYRING" >/dev/null

echo -n "waiting for all PGs to be active"
for _ in $(seq 1 600); do
  if "$BIN/fastblock-client" health | grep -q HEALTH_OK; then echo " done"; break; fi
  echo -n .; sleep 0.2
done
"$BIN/fastblock-client" health | grep -q HEALTH_OK || { echo; echo "vstart.sh: PGs did not become active:" >&2; "$BIN/fastblock-client" pg ls >&2; exit 1; }

cat > "$STATE/env" <<ENV
export FASTBLOCK_MON=$MON
export FASTBLOCK_KEYRING=$STATE/keyring
export FASTBLOCK_RUN_DIR=$RUN
export PATH=$BIN:\$PATH
ENV

cat <<MSG

fastblock is running from $STATE:
  monitor   http://$MON  (log: $STATE/log/mon.a.log)
  etcd      http://127.0.0.1:$ETCD_PORT  (authenticated; as its root user:
            scripts/mon-etcdctl.sh $STATE/mon.a/mon.secret 127.0.0.1:$ETCD_PORT get --prefix /fastblock)

  osds      $COUNT x $OSD_SIZE under $STATE (logs: $STATE/log/osd.N.log)
            metrics: curl http://127.0.0.1:$((OSD_PORT + 10 + 9))/metrics (osd N: port $OSD_PORT + 10*N + 9)
  pool      $POOL ($PGCOUNT PGs x $REPLICA replicas), image $POOL/$IMAGE ($IMAGE_SIZE)

Use it:
  source $STATE/env
  fastblock-client status
  block_bench -C block_bench.json          # write, then read back with verification

Stop it:   ./vstart.sh --stop        Start afresh:   ./vstart.sh --clean
MSG
"$BIN/fastblock-client" --mon "$MON" status

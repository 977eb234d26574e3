#!/usr/bin/env bash
# Starts a local fastblock cluster under ./.vstart: installs what is missing, builds release
# binaries if needed, starts a monitor (with its own etcd member) and waits until it leads.
#
#   ./vstart.sh            start (or report that it already runs)
#   ./vstart.sh --stop     stop everything started here
#   ./vstart.sh --clean    stop, wipe ./.vstart, start afresh
#
# Options: --mon-port N (API, default 3333), --etcd-port N (client; peer = N+1, default 2379),
# --state-dir DIR (default ./.vstart, or $FASTBLOCK_VSTART_STATE_ROOT), --no-build.
set -euo pipefail
cd "$(dirname "$0")"

STATE=${FASTBLOCK_VSTART_STATE_ROOT:-$PWD/.vstart}
MON_PORT=3333
ETCD_PORT=2379
ACTION=start
BUILD=1

usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; }

while (($#)); do
  case $1 in
    --stop) ACTION=stop ;;
    --clean) ACTION=clean ;;
    --mon-port) MON_PORT=${2:?--mon-port needs a value}; shift ;;
    --etcd-port) ETCD_PORT=${2:?--etcd-port needs a value}; shift ;;
    --state-dir) STATE=${2:?--state-dir needs a value}; shift ;;
    --no-build) BUILD=0 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "vstart.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done

RUN=$STATE/run
BIN=$PWD/target/release

pid_alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

stop_all() {
  local stopped=0
  for pidfile in "$RUN"/*.pid; do
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
for b in fastblock-mon fastblock-client; do
  [[ -x $BIN/$b ]] || { echo "vstart.sh: $BIN/$b missing; run without --no-build" >&2; exit 1; }
done

port_busy() { (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null; }
for p in "$MON_PORT" "$ETCD_PORT" "$((ETCD_PORT + 1))"; do
  if port_busy "$p"; then
    echo "vstart.sh: port $p is in use; pick others with --mon-port/--etcd-port" >&2
    exit 1
  fi
done

MON=127.0.0.1:$MON_PORT
setsid "$BIN/fastblock-mon" --name a --data-dir "$STATE/mon.a" --api-addr "$MON" \
  --etcd-client-addr "127.0.0.1:$ETCD_PORT" --etcd-peer-addr "127.0.0.1:$((ETCD_PORT + 1))" \
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

cat > "$STATE/env" <<ENV
export FASTBLOCK_MON=$MON
export PATH=$BIN:\$PATH
ENV

cat <<MSG

fastblock is running from $STATE:
  monitor   http://$MON  (log: $STATE/log/mon.a.log)
  etcd      http://127.0.0.1:$ETCD_PORT  (etcdctl --endpoints 127.0.0.1:$ETCD_PORT get --prefix /fastblock)

Use it:
  source $STATE/env
  fastblock-client status
  fastblock-client osd ls

Stop it:   ./vstart.sh --stop        Start afresh:   ./vstart.sh --clean
MSG
"$BIN/fastblock-client" --mon "$MON" status

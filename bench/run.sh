#!/usr/bin/env bash
# The benchmark kit: in one run, what this machine can physically do and what fastblock does
# on it, side by side, with the ratios of docs/benchmarks.md marked met or not met.
#
#   bench/run.sh [--seconds N] [--out DIR] [--port-base N] [--no-build] [--keep] [--quick]
#
# 1. builds release binaries and starts its own cluster with ./vstart.sh (3 OSDs, a 3-replica
#    and a 1-replica pool, OSD files of 1 GiB written in full) on ports from --port-base
#    (17300) and under the results folder, so it does not clash with a ./vstart.sh cluster;
# 2. baselines on the file system of the OSD data files: fio 4 KiB randwrite O_DIRECT at
#    iodepth 1 with fdatasync=1 and at iodepth 32, randread at iodepth 1 and 32; the loopback
#    TCP round trip of a 4 KiB request with a 16 B reply (rtt_bench); once before and once
#    after fastblock, the targets use the better of the two;
# 3. for each pool, through block_bench and through fio's nbd engine (fastblock-nbd; skipped
#    when it is not built): 1 MiB sequential write (a full pass, which also fills the image),
#    4 KiB randwrite and randread at QD1 and QD32, 1 MiB sequential read;
#    then the 3-replica pool's 4 KiB randwrite and randread at QD32 and QD1 once more each
#    under a system-wide sampling profile (perf record -a -g), sorted by bench/cpu_profile.py
#    into where the CPU went, per IO; then 3-replica block_bench write QD1 and QD32 and read
#    QD32 in each auth mode (none, sign, secure), side by side, with the overhead of each mode
#    against none; then 3-replica block_bench 4 KiB randwrite QD32 on the plain image, after
#    a snapshot (first writes of their blocks) and again (rewrites), side by side; then, with
#    the OSDs restarted in --wal-sync no-flush-benchmark-only (measurement only: no device
#    flush), the block_bench randwrite rows again, for the software's own cost;
# 4. around every run: CPU time of every fastblock process from /proc (OSDs, monitor, NBD
#    server; block_bench reports its own), the time the OSD threads waited for a CPU
#    (schedstat run_delay: other load on the machine) and the OSDs' per-stage latency; in a
#    window of every timed random-IO run, the machine's work per IO: context switches, system
#    calls, io_uring submissions and io-wq hand-offs of every fastblock process;
# 5. writes bench/results/<date-time>/{results.json,results.md,*.png} (bench/report.py, plots
#    with gnuplot), prints the Markdown table and stops the cluster.
#
# --seconds N: length of each timed run (10; the first second is warm-up). --keep: leave the
# cluster running and its data files in place. --quick: only what a change to the data path
# is judged by while it is being made (baselines once; the 3-replica pool's block_bench rows;
# no NBD, no auth modes, no snapshot rows; the profiles run); the targets it cannot judge show
# "not measured". Takes about 10 minutes with the defaults (3 with --quick), plus the build.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

SECS=${FASTBLOCK_BENCH_SECONDS:-10}
PORT_BASE=17300
BUILD=1
KEEP=0
QUICK=0
OUT=""
IMAGE_MIB=256
# Every OSD file is written in full at mkfs (--preallocate full), as fio's file is: blocks
# written for the first time cost a file-system journal commit on the next fdatasync, which a
# block device does not have.
OSD_SIZE=1G
PGS=32
SEQ_DEPTH=8

usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; }
while (($#)); do
  case $1 in
    --seconds) SECS=${2:?--seconds needs a value}; shift ;;
    --out) OUT=${2:?--out needs a value}; shift ;;
    --port-base) PORT_BASE=${2:?--port-base needs a value}; shift ;;
    --no-build) BUILD=0 ;;
    --keep) KEEP=1 ;;
    --quick) QUICK=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
[[ $SECS =~ ^[0-9]+$ && $SECS -ge 3 ]] || { echo "run.sh: --seconds must be a number >= 3" >&2; exit 2; }

STARTED=$(date +%s)
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
OUT=${OUT:-$ROOT/bench/results/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT/raw"
OUT=$(cd "$OUT" && pwd)
RAW=$OUT/raw
STATE=$OUT/cluster
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release
[[ $BIN == /* ]] || BIN=$ROOT/$BIN
MON_PORT=$PORT_BASE
ETCD_PORT=$((PORT_BASE + 10))
NBD_PORT=$((PORT_BASE + 90))
OSD_PORT=$((PORT_BASE + 100))
MON=127.0.0.1:$MON_PORT
POOLS=("bench1:1" "fb:3") # name:replicas; fb is the pool vstart.sh creates
((QUICK)) && POOLS=("fb:3")
IMAGE=bench

log() { printf '[%4ds] %s\n' $(($(date +%s) - STARTED)) "$*" >&2; }

./scripts/install-deps.sh >&2
if ((BUILD)); then
  log "building release binaries"
  cargo build --release --locked --bins -q
fi
for b in fastblock-mon fastblock-osd fastblock-client block_bench rtt_bench; do
  [[ -x $BIN/$b ]] || { echo "run.sh: $BIN/$b missing; run without --no-build" >&2; exit 1; }
done
NBD_BIN=$BIN/fastblock-nbd
HAVE_NBD=0
[[ -x $NBD_BIN ]] && HAVE_NBD=1

NBD_PID=""
cleanup() {
  local rc=$?
  if [[ -n $NBD_PID ]]; then kill -TERM "$NBD_PID" 2>/dev/null || true; wait "$NBD_PID" 2>/dev/null || true; fi
  if ((KEEP)); then
    log "cluster left running: ./vstart.sh --stop --state-dir $STATE"
  else
    ./vstart.sh --stop --state-dir "$STATE" >/dev/null 2>&1 || true
    rm -f "$STATE"/*.img "$STATE"/*.meta
    rm -rf "$STATE/mon.a"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Three OSD files written in full, fio's files, logs.
need_kib=$((4 << 20))
free_kib=$(df --output=avail -k "$OUT" | tail -n 1 | tr -d ' ')
if ((free_kib < need_kib)); then
  echo "run.sh: $((free_kib >> 20)) GiB free under $OUT; the run needs about 4 GiB" >&2
  exit 1
fi
log "starting a cluster under $STATE (monitor $MON)"
# The auth rows switch the cluster to mode none and back: every daemon and client of this run
# has its auth floor lowered to none on purpose, or it would refuse mode none as a downgrade
# (docs/security.md, "No downgrade"). Signatures are still checked wherever they are sent.
if ((!QUICK)); then
  export FASTBLOCK_OSD_AUTH_FLOOR=none FASTBLOCK_NBD_AUTH_FLOOR=none FASTBLOCK_AUTH_FLOOR=none
fi
./vstart.sh --no-build --state-dir "$STATE" --mon-port "$MON_PORT" --etcd-port "$ETCD_PORT" \
  --osd-port "$OSD_PORT" -c 3 -r 3 -p "$PGS" --osd-size "$OSD_SIZE" --preallocate full \
  >"$RAW/vstart.log" 2>&1 ||
  { tail -n 30 "$RAW/vstart.log" >&2; exit 1; }
# The cluster authenticates (vstart.sh creates it in auth mode sign): every client here signs
# with the admin key vstart.sh's monitor wrote.
export FASTBLOCK_KEYRING=$STATE/keyring
client() { "$BIN/fastblock-client" --mon "$MON" "$@"; }
client pool create bench1 --pg-count "$PGS" --size 1 --failure-domain osd >/dev/null
for _ in $(seq 1 300); do client health | grep -q HEALTH_OK && break; sleep 0.2; done
client health | grep -q HEALTH_OK || { echo "run.sh: the cluster did not become healthy" >&2; client pg ls >&2; exit 1; }
OSD_PIDS=()
METRICS_PORTS=()
for i in 1 2 3; do
  OSD_PIDS+=("$(cat "$STATE/run/osd.$i.pid")")
  METRICS_PORTS+=($((OSD_PORT + 10 * i + 9)))
done
MON_PID=$(cat "$STATE/run/mon.a.pid")

# --- helpers ---------------------------------------------------------------------------------

# utime + stime of a process, in clock ticks (0 once it is gone).
cpu_ticks() {
  local s
  s=$(cat "/proc/$1/stat" 2>/dev/null) || { echo 0; return; }
  s=${s##*) }
  # shellcheck disable=SC2086
  set -- $s
  echo $((${12} + ${13}))
}
sum_ticks() { local t=0 p; for p in "$@"; do t=$((t + $(cpu_ticks "$p"))); done; echo "$t"; }
# Per thread: "pid/tid run_delay_ns" (schedstat's second field: nanoseconds the thread was
# runnable but waiting for a CPU, i.e. how much other load on the machine delayed it).
run_delay_snapshot() {
  local p f
  for p in "$@"; do
    for f in /proc/"$p"/task/*/schedstat; do
      [[ -r $f ]] || continue
      awk -v t="${f%/schedstat}" '{ print t, $2 }' "$f" 2>/dev/null
    done
  done
}
# Run delay accrued between two snapshots, summed over threads. A thread that ended during
# the run (io_uring and tokio workers come and go) takes its delay with it, so only threads
# seen at the end count, each from 0 if it started during the run: summing the totals
# instead went negative when workers exited.
run_delay_between() { # before-file after-file
  awk 'NR == FNR { before[$1] = $2; next } { d += $2 - ($1 in before ? before[$1] : 0) }
       END { printf "%.0f\n", d }' "$1" "$2"
}
scrape() { # name suffix
  local i=0 p
  for p in "${METRICS_PORTS[@]}"; do
    i=$((i + 1))
    curl -fsS "http://127.0.0.1:$p/metrics" >"$RAW/$1.metrics.$2.osd$i.txt" 2>/dev/null || true
  done
}
# The machine's work per IO, counted in a window of the steady state of a timed run (after
# the warm-up, before the end): context switches of every thread of every fastblock process
# from /proc/<pid>/task/*/status (voluntary: the thread blocked, e.g. waiting for a socket or
# a completion; involuntary: it was preempted), and from kernel tracepoints counted by
# `perf stat` (counting only, no samples): system calls, io_uring submissions (SQEs), calls
# of io_uring_enter, and io_uring requests handed to an io-wq worker thread (a hop to another
# thread and back). Each process group (osd, mon, nbd, client) is counted separately; the
# report divides by the IOs of the window (the run's IOPS times the window's length).
PERF_EVENTS=raw_syscalls:sys_enter,io_uring:io_uring_submit_req,syscalls:sys_enter_io_uring_enter,io_uring:io_uring_queue_async_work
HAVE_PERF=0
if [[ ! -d /sys/kernel/tracing/events ]]; then
  mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
fi
if perf stat -x, -e "$PERF_EVENTS" -p $$ -- sleep 0.01 >/dev/null 2>&1; then
  HAVE_PERF=1
else
  log "perf cannot count tracepoints here: system calls and io_uring submissions per IO are not measured"
fi
# Per thread: "group pid/tid comm voluntary involuntary" of every thread of the given processes.
cswitch_snapshot() { # group pids...
  local group=$1 p f; shift
  for p in "$@"; do
    for f in /proc/"$p"/task/*; do
      [[ -r $f/status ]] || continue
      awk -v g="$group" -v t="${f#/proc/}" '
        /^Name:/ { n = $2 } /^voluntary_ctxt_switches:/ { v = $2 }
        /^nonvoluntary_ctxt_switches:/ { i = $2 }
        END { if (n != "") print g, t, n, v, i }' "$f/status" 2>/dev/null
    done
  done
}
# Counts the window for one run (the command's pid is the client when it is block_bench).
count_window() { # name client-pid|"" window-seconds
  local name=$1 client=$2 secs=$3 groups=() g
  groups+=("osd:$(IFS=,; echo "${OSD_PIDS[*]}")" "mon:$MON_PID")
  [[ -n $NBD_PID ]] && groups+=("nbd:$NBD_PID")
  [[ -n $client ]] && groups+=("client:$client")
  for g in "${groups[@]}"; do
    # shellcheck disable=SC2046
    cswitch_snapshot "${g%%:*}" $(tr , ' ' <<<"${g#*:}")
  done | sort -u >"$RAW/$name.cs.before"
  local perf_pids=()
  if ((HAVE_PERF)); then
    for g in "${groups[@]}"; do
      perf stat -x, -e "$PERF_EVENTS" -p "${g#*:}" -o "$RAW/$name.perf.${g%%:*}" -- sleep "$secs" \
        >/dev/null 2>&1 &
      perf_pids+=($!)
    done
  fi
  local w0 w1
  w0=$(date +%s.%N)
  sleep "$secs"
  w1=$(date +%s.%N)
  for g in "${groups[@]}"; do
    # shellcheck disable=SC2046
    cswitch_snapshot "${g%%:*}" $(tr , ' ' <<<"${g#*:}")
  done | sort -u >"$RAW/$name.cs.after"
  ((${#perf_pids[@]})) && wait "${perf_pids[@]}" 2>/dev/null || true
  echo "$w0 $w1" >"$RAW/$name.window"
}
# Runs a measured command: CPU of the fastblock processes and OSD metrics before and after,
# the command's JSON output in raw/NAME.json, one line in raw/runs.tsv. A timed random-IO run
# of fastblock is also counted in a window of its steady state (count_window).
measure() { # name frontend pool test -- command...
  local name=$1 frontend=$2 pool=$3 test=$4; shift 5
  local osd0 mon0 nbd0=0 osd1 mon1 nbd1=0 t0 t1 delay cmd client
  scrape "$name" before
  osd0=$(sum_ticks "${OSD_PIDS[@]}"); mon0=$(cpu_ticks "$MON_PID")
  run_delay_snapshot "${OSD_PIDS[@]}" >"$RAW/$name.delay.before"
  [[ -n $NBD_PID ]] && nbd0=$(cpu_ticks "$NBD_PID")
  t0=$(date +%s.%N)
  "$@" >"$RAW/$name.json" 2>"$RAW/$name.err" &
  cmd=$!
  if [[ $frontend != fio-file && $test == *rand*-qd* ]]; then
    client=""
    [[ $frontend == block_bench ]] && client=$cmd
    # The window: from 1 s after the warm-up second to 1 s before the end.
    sleep 2
    count_window "$name" "$client" $((SECS - 3))
  fi
  if ! wait "$cmd"; then
    log "$name failed: $(tail -n 3 "$RAW/$name.err" | tr '\n' ' ')"
  fi
  t1=$(date +%s.%N)
  osd1=$(sum_ticks "${OSD_PIDS[@]}"); mon1=$(cpu_ticks "$MON_PID")
  run_delay_snapshot "${OSD_PIDS[@]}" >"$RAW/$name.delay.after"
  delay=$(run_delay_between "$RAW/$name.delay.before" "$RAW/$name.delay.after")
  [[ -n $NBD_PID ]] && nbd1=$(cpu_ticks "$NBD_PID")
  scrape "$name" after
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$frontend" "$pool" "$test" \
    "$((osd1 - osd0))" "$((mon1 - mon0))" "$((nbd1 - nbd0))" "$t0" "$t1" \
    "$delay" >>"$RAW/runs.tsv"
  local all_up=1 p
  for p in "${OSD_PIDS[@]}"; do kill -0 "$p" 2>/dev/null || all_up=0; done
  ((all_up)) || { echo "run.sh: an OSD died during $name; see $STATE/log" >&2; exit 1; }
}

# fio's 4 KiB and 1 MiB shapes. The tail percentiles go into the latency plots.
# fio keeps at most 20 percentiles (FIO_IO_U_LIST_MAX_LEN) and silently drops the rest: a
# longer list lost p99 and p99.9 of every fio row.
PCTL=1:5:10:20:30:40:50:60:70:80:90:95:98:99:99.5:99.9:99.95:99.99
fio_common=(--output-format=json --lat_percentiles=1 --percentile_list="$PCTL" --time_based --runtime="$SECS" --ramp_time=1)

# --- baselines ---------------------------------------------------------------------------------

printf 'name\tfrontend\tpool\ttest\tosd_ticks\tmon_ticks\tnbd_ticks\tstart\tend\tosd_run_delay_ns\n' \
  >"$RAW/runs.tsv"
getconf CLK_TCK >"$RAW/clk_tck"
FIO_FILE=$STATE/fio.img
base() { # name rw iodepth extra...
  local name=$1 rw=$2 depth=$3; shift 3
  measure "$name" fio-file - "$rw-qd$depth" -- fio --name=fb --filename="$FIO_FILE" \
    --size="${IMAGE_MIB}M" --bs=4k --rw="$rw" --direct=1 --ioengine=io_uring --iodepth="$depth" \
    "${fio_common[@]}" "$@"
}
# The baselines run twice, before and after fastblock (suffix -a and -b); the report judges
# the targets against the better of the two, so a noisy minute never flatters fastblock.
baselines() { # suffix
  local x=$1
  log "baselines ($x): fio on $(df --output=source,fstype,target "$STATE" | tail -n 1 | tr -s ' ')"
  # Write the file in full first: otherwise fio measures ext4 converting unwritten extents.
  fio --name=layout --filename="$FIO_FILE" --size="${IMAGE_MIB}M" --bs=1M --rw=write --direct=1 \
    --ioengine=io_uring --iodepth=4 >/dev/null 2>&1
  base "base-randwrite-qd1-$x" randwrite 1 --fdatasync=1
  base "base-randwrite-qd32-$x" randwrite 32
  base "base-randread-qd1-$x" randread 1
  base "base-randread-qd32-$x" randread 32
  rm -f "$FIO_FILE"
  # What three OSDs on this one disk do at QD1: three writers, each with its own file and an
  # fdatasync after every write (not a target; it shows what sharing the device costs).
  local j
  for j in 0 1 2; do
    fio --name=layout --filename="$STATE/fio.$j.img" --size=256M --bs=1M --rw=write --direct=1 \
      --ioengine=io_uring --iodepth=4 >/dev/null 2>&1
  done
  measure "base-randwrite-qd1-x3-$x" fio-file - randwrite-qd1-x3 -- fio --name=fb --numjobs=3 \
    --group_reporting --directory="$STATE" --filename_format='fio.$jobnum.img' --size=256M \
    --bs=4k --rw=randwrite --direct=1 --ioengine=io_uring --iodepth=1 --fdatasync=1 "${fio_common[@]}"
  rm -f "$STATE"/fio.?.img
  measure "base-rtt-$x" rtt - rtt -- "$BIN/rtt_bench" --json
}
baselines a

# --- fastblock -------------------------------------------------------------------------------

bb() { # name pool test block_bench-args...
  local name=$1 pool=$2 test=$3; shift 3
  measure "$name" block_bench "$pool" "$test" -- "$BIN/block_bench" --mon "$MON" --pool "$pool" \
    --image "$IMAGE" --image-size "${IMAGE_MIB}M" --json "$@"
}
timed=(--infinity --runtime "$SECS" --deferred-time 1)
for entry in "${POOLS[@]}"; do
  pool=${entry%%:*}
  log "block_bench on pool $pool (${entry##*:} replica(s))"
  bb "bb-$pool-seqwrite" "$pool" seqwrite-1m --io-type write --io-size 1M --sequential \
    --io-depth "$SEQ_DEPTH" --io-count "$IMAGE_MIB" --deferred-time 0
  bb "bb-$pool-randwrite-qd1" "$pool" randwrite-qd1 --io-type write --io-depth 1 "${timed[@]}"
  bb "bb-$pool-randwrite-qd32" "$pool" randwrite-qd32 --io-type write --io-depth 32 "${timed[@]}"
  bb "bb-$pool-randread-qd1" "$pool" randread-qd1 --io-type read --io-depth 1 "${timed[@]}"
  bb "bb-$pool-randread-qd32" "$pool" randread-qd32 --io-type read --io-depth 32 "${timed[@]}"
  ((QUICK)) || bb "bb-$pool-seqread" "$pool" seqread-1m --io-type read --io-size 1M --sequential \
    --io-depth "$SEQ_DEPTH" "${timed[@]}"
done

# --- where the CPU goes ------------------------------------------------------------------------
# The 3-replica pool's 4 KiB write and read at QD32 and QD1 once more each, under a
# system-wide sampling profile (perf record -a -g, 999 Hz per CPU, in the same window as the
# counters), sorted by bench/cpu_profile.py into process groups and thread kinds, user space
# and kernel, and what the time went to (docs/benchmarks.md, "Where the CPU goes"). Runs of
# their own: sampling with call chains costs CPU, so the measured rows stay unsampled.
PROFILE_POOL=fb
if perf record -a -g -F 999 -o "$STATE/probe.perf" -- sleep 0.01 >/dev/null 2>&1; then
  rm -f "$STATE/probe.perf"
  log "profiles: block_bench on pool $PROFILE_POOL under perf record"
  profiled() { # name block_bench-args...
    local name=$1 cmd
    shift
    "$BIN/block_bench" --mon "$MON" --pool "$PROFILE_POOL" --image "$IMAGE" \
      --image-size "${IMAGE_MIB}M" --json "$@" "${timed[@]}" >"$RAW/$name.json" 2>"$RAW/$name.err" &
    cmd=$!
    # The counters' window: from 1 s after the warm-up second to 1 s before the end. The
    # report needs no timestamps: all samples together stand for the window.
    sleep 2
    perf record -a -g -F 999 -o "$STATE/$name.perf" -- sleep $((SECS - 3)) >/dev/null 2>&1 || true
    wait "$cmd" || log "$name failed: $(tail -n 3 "$RAW/$name.err" | tr '\n' ' ')"
    # A profile that could not be sorted is left out of the report, not the end of the kit.
    if ! perf script -F pid,tid,comm,ip,sym,dso -i "$STATE/$name.perf" 2>"$RAW/$name.perf.err" |
      python3 "$ROOT/bench/cpu_profile.py" --group "osd=$(IFS=,; echo "${OSD_PIDS[*]}")" \
        --group "mon=$MON_PID" --group "client=$cmd" >"$RAW/$name.profile.json"; then
      log "$name: the profile could not be sorted: $(tail -n 2 "$RAW/$name.perf.err" | tr '\n' ' ')"
      rm -f "$RAW/$name.profile.json"
    fi
    rm -f "$STATE/$name.perf"
  }
  profiled profile-randwrite-qd32 --io-type write --io-depth 32
  profiled profile-randread-qd32 --io-type read --io-depth 32
  profiled profile-randwrite-qd1 --io-type write --io-depth 1
  profiled profile-randread-qd1 --io-type read --io-depth 1
else
  echo "perf record -a -g cannot sample here" >"$RAW/profile.skipped"
  log "profiles: skipped (perf record -a -g cannot sample here)"
fi

# --- authentication modes ----------------------------------------------------------------------
# The 3-replica rows that show what authentication costs, once in each mode side by side
# (docs/security.md): the mode is switched with the CLI, and each mode's rows start once a
# client can write in it (the OSDs close their connections and peer links of the old mode).
AUTH_POOL=fb
AUTH_MODES=(none sign secure)
((QUICK)) && AUTH_MODES=()
for mode in "${AUTH_MODES[@]}"; do
  log "auth mode $mode: block_bench on pool $AUTH_POOL"
  client auth mode "$mode" >/dev/null
  ready=0
  for _ in $(seq 1 50); do
    if "$BIN/block_bench" --mon "$MON" --pool "$AUTH_POOL" --image "$IMAGE" --json --io-type write \
      --io-depth 1 --io-count 16 --deferred-time 0 >/dev/null 2>&1; then
      ready=1
      break
    fi
    sleep 0.2
  done
  ((ready)) || { echo "run.sh: no client could write within 10 s of auth mode $mode" >&2; exit 1; }
  bb "auth-$mode-randwrite-qd1" "$AUTH_POOL" "auth-$mode-randwrite-qd1" --io-type write --io-depth 1 "${timed[@]}"
  bb "auth-$mode-randwrite-qd32" "$AUTH_POOL" "auth-$mode-randwrite-qd32" --io-type write --io-depth 32 "${timed[@]}"
  bb "auth-$mode-randread-qd32" "$AUTH_POOL" "auth-$mode-randread-qd32" --io-type read --io-depth 32 "${timed[@]}"
done
client auth mode sign >/dev/null # the cluster's default again, for the NBD rows

# --- snapshots -------------------------------------------------------------------------------
# 3-replica 4 KiB random writes at QD32 on the kit's image with a snapshot
# (docs/design/snapshots.md), the same count each time (a quarter of the image's blocks):
# on the plain image; after a snapshot with a new seed (mostly the first writes of their
# blocks since it, each of which keeps the old block for the snapshot); and that seed again
# (the same blocks: every write a rewrite of a block already kept, which costs nothing more).
SNAP_POOL=fb
SNAP_IOS=$((IMAGE_MIB * 64))
if ! ((QUICK)); then
  log "snapshots: block_bench on pool $SNAP_POOL"
  snap_bb() { # name seed
    bb "$1" "$SNAP_POOL" "$1" --io-type write --io-depth 32 --io-count "$SNAP_IOS" --seed "$2" \
      --deferred-time 0
  }
  snap_bb snap-plain-randwrite-qd32 101
  client image snap create "$SNAP_POOL/$IMAGE@kit" >/dev/null
  snap_bb snap-first-randwrite-qd32 202
  snap_bb snap-rewrite-randwrite-qd32 202
  client image snap rm "$SNAP_POOL/$IMAGE@kit" >/dev/null
fi

NBD_SKIPPED="fastblock-nbd not built"
((QUICK)) && { HAVE_NBD=0; NBD_SKIPPED="--quick"; }
if ((HAVE_NBD)); then
  setsid "$NBD_BIN" serve --mon "$MON" --bind "127.0.0.1:$NBD_PORT" >"$RAW/nbd.log" 2>&1 </dev/null &
  NBD_PID=$!
  for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$NBD_PORT") 2>/dev/null && break; sleep 0.1; done
  nbd() { # name pool test fio-args...
    local name=$1 pool=$2 test=$3; shift 3
    measure "$name" nbd "$pool" "$test" -- fio --name=fb --ioengine=nbd \
      --uri="nbd://127.0.0.1:$NBD_PORT/$pool/$IMAGE" --size="${IMAGE_MIB}M" "${fio_common[@]}" "$@"
  }
  for entry in "${POOLS[@]}"; do
    pool=${entry%%:*}
    log "fio nbd engine on pool $pool"
    nbd "nbd-$pool-seqwrite" "$pool" seqwrite-1m --rw=write --bs=1M --iodepth="$SEQ_DEPTH"
    nbd "nbd-$pool-randwrite-qd1" "$pool" randwrite-qd1 --rw=randwrite --bs=4k --iodepth=1
    nbd "nbd-$pool-randwrite-qd32" "$pool" randwrite-qd32 --rw=randwrite --bs=4k --iodepth=32
    nbd "nbd-$pool-randread-qd1" "$pool" randread-qd1 --rw=randread --bs=4k --iodepth=1
    nbd "nbd-$pool-randread-qd32" "$pool" randread-qd32 --rw=randread --bs=4k --iodepth=32
    nbd "nbd-$pool-seqread" "$pool" seqread-1m --rw=read --bs=1M --iodepth="$SEQ_DEPTH"
  done
else
  echo "$NBD_SKIPPED" >"$RAW/nbd.skipped"
  log "nbd: skipped ($NBD_SKIPPED)"
fi

# --- without device flushes (measurement only) ---------------------------------------------------
# The same cluster restarted with its OSDs in --wal-sync no-flush-benchmark-only
# (docs/benchmarks.md): the software's own latency and CPU without this disk's flush, the
# row to hold against a peer that runs without flushes. Never a target. The OSDs go back to
# durable writes when the kit stops the cluster.
if [[ -n $NBD_PID ]]; then
  kill -TERM "$NBD_PID" 2>/dev/null || true
  wait "$NBD_PID" 2>/dev/null || true
  NBD_PID=""
fi
log "restarting the cluster's OSDs without device flushes (measurement only)"
./vstart.sh --stop --state-dir "$STATE" >>"$RAW/vstart.log" 2>&1
FASTBLOCK_BENCHMARK_ONLY_SKIP_FLUSH=acknowledged-writes-may-be-lost \
  FASTBLOCK_VSTART_OSD_ARGS="${FASTBLOCK_VSTART_OSD_ARGS:-} --wal-sync no-flush-benchmark-only" \
  ./vstart.sh --no-build --state-dir "$STATE" --mon-port "$MON_PORT" --etcd-port "$ETCD_PORT" \
  --osd-port "$OSD_PORT" -c 3 -r 3 -p "$PGS" --osd-size "$OSD_SIZE" --preallocate full \
  >>"$RAW/vstart.log" 2>&1 ||
  { tail -n 30 "$RAW/vstart.log" >&2; exit 1; }
for _ in $(seq 1 300); do client health | grep -q HEALTH_OK && break; sleep 0.2; done
OSD_PIDS=()
for i in 1 2 3; do OSD_PIDS+=("$(cat "$STATE/run/osd.$i.pid")"); done
MON_PID=$(cat "$STATE/run/mon.a.pid")
for entry in "${POOLS[@]}"; do
  pool=${entry%%:*}
  log "block_bench on pool $pool without device flushes"
  # Restarted OSDs start with cold caches (the block map's pages): their first seconds of
  # writes were ~1.5x slower than the same writes a minute later, so warm them first.
  "$BIN/block_bench" --mon "$MON" --pool "$pool" --image "$IMAGE" --image-size "${IMAGE_MIB}M" \
    --json --io-type write --io-depth 32 --infinity --runtime 4 --deferred-time 0 >/dev/null 2>&1 || true
  bb "noflush-$pool-randwrite-qd1" "$pool" noflush-randwrite-qd1 --io-type write --io-depth 1 "${timed[@]}"
  bb "noflush-$pool-randwrite-qd32" "$pool" noflush-randwrite-qd32 --io-type write --io-depth 32 "${timed[@]}"
done
if ((KEEP)); then
  # A cluster left running writes durably again.
  log "restarting the cluster's OSDs with durable writes"
  ./vstart.sh --stop --state-dir "$STATE" >>"$RAW/vstart.log" 2>&1
  ./vstart.sh --no-build --state-dir "$STATE" --mon-port "$MON_PORT" --etcd-port "$ETCD_PORT" \
    --osd-port "$OSD_PORT" -c 3 -r 3 -p "$PGS" --osd-size "$OSD_SIZE" --preallocate full \
    >>"$RAW/vstart.log" 2>&1 || { tail -n 30 "$RAW/vstart.log" >&2; exit 1; }
  OSD_PIDS=()
  for i in 1 2 3; do OSD_PIDS+=("$(cat "$STATE/run/osd.$i.pid")"); done
  MON_PID=$(cat "$STATE/run/mon.a.pid")
fi

((QUICK)) || baselines b

# --- report ----------------------------------------------------------------------------------

log "writing the report"
{
  echo "date=$(date -Iseconds)"
  echo "host=$(hostname)"
  echo "kernel=$(uname -r)"
  echo "cpus=$(nproc)"
  echo "cpu_model=$(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)"
  echo "commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo -dirty)"
  echo "filesystem=$(df --output=source,fstype,target "$STATE" | tail -n 1 | tr -s ' ')"
  echo "seconds=$SECS"
  echo "image_mib=$IMAGE_MIB"
  echo "seq_depth=$SEQ_DEPTH"
  echo "pgs=$PGS"
  echo "loadavg_start=$LOAD_START"
  echo "loadavg_end=$(cut -d' ' -f1-3 /proc/loadavg)"
} >"$RAW/env.txt"
python3 "$ROOT/bench/report.py" "$OUT"
log "done in $(($(date +%s) - STARTED)) s: $OUT"

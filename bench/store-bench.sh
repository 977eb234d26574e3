#!/usr/bin/env bash
# Storage engine vs fio, on the same file system, in one run.
#
#   bench/store-bench.sh [DIR] [SECONDS] [ROUNDS]
#
# DIR (default bench/results/store) must be on the file system to measure. Each round runs
# the engine (crates/store/src/bin/store_bench.rs, release build) and then fio with the same
# shapes; the median over ROUNDS (default 3) is reported, because a shared machine's disk is
# noisy. Shapes, all 4 KiB, O_DIRECT, io_uring:
#   write QD1 : engine 1 writer (append + commit(write+fdatasync) + apply)  vs fio randwrite iodepth=1 fdatasync=1
#   write QD32: engine 32 writers group-committed                             vs fio randwrite iodepth=32
#   read  QD1 / QD32: engine random object reads                              vs fio randread iodepth=1 / 32
# Targets: engine write QD32 IOPS >= 80 % of fio's; engine write QD1 time per op <= 1.3 x fio's
# (fio's time per op = 1 / IOPS, which includes its fdatasync).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DIR="${1:-$ROOT/bench/results/store}"
SECONDS_EACH="${2:-5}"
ROUNDS="${3:-3}"
DATASET_MIB="${DATASET_MIB:-256}"
SYNC="${SYNC:-dsync}"
FIO="${FIO:-/usr/bin/fio}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target-store}"

mkdir -p "$DIR"
echo "building store-bench (release)..." >&2
(cd "$ROOT" && cargo build --release -q -p fastblock-bench --bin store-bench)
BIN="$CARGO_TARGET_DIR/release/store-bench"

fio_run() { # name rw iodepth extra...
  local rw="$1" depth="$2"; shift 2
  "$FIO" --name=fb --filename="$DIR/fio.img" --size="${DATASET_MIB}M" --bs=4k --rw="$rw" \
    --direct=1 --ioengine=io_uring --iodepth="$depth" --runtime="$SECONDS_EACH" --time_based \
    --ramp_time=1 --output-format=json "$@" 2>/dev/null |
    python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; d=j["write"] if j["write"]["io_bytes"] else j["read"]; print(int(d["iops"]))'
}

# Write the fio file once in full, as the engine's mkfs does for its file: otherwise fio
# measures ext4 converting unwritten extents (a journal commit per fdatasync), not the disk.
"$FIO" --name=layout --filename="$DIR/fio.img" --size="${DATASET_MIB}M" --bs=1M --rw=write \
  --direct=1 --ioengine=io_uring --iodepth=4 >/dev/null 2>&1

RAW="$DIR/raw.txt"
: > "$RAW"
for round in $(seq 1 "$ROUNDS"); do
  echo "round $round/$ROUNDS: engine" >&2
  "$BIN" "$DIR/engine.img" --seconds "$SECONDS_EACH" --dataset-mib "$DATASET_MIB" --sync "$SYNC" |
    sed -E 's/^engine_([a-z0-9_]+) iops=([0-9]+).*/engine_\1 \2/' >> "$RAW"
  echo "round $round/$ROUNDS: fio" >&2
  echo "fio_write_qd1 $(fio_run randwrite 1 --fdatasync=1)" >> "$RAW"
  echo "fio_write_qd32 $(fio_run randwrite 32)" >> "$RAW"
  echo "fio_read_qd1 $(fio_run randread 1)" >> "$RAW"
  echo "fio_read_qd32 $(fio_run randread 32)" >> "$RAW"
done
rm -f "$DIR/engine.img" "$DIR/engine.img.meta" "$DIR/fio.img"

python3 - "$RAW" "$ROUNDS" "$SYNC" <<'PY'
import sys, statistics
raw, rounds, sync = sys.argv[1], sys.argv[2], sys.argv[3]
vals = {}
for line in open(raw):
    k, v = line.split()
    vals.setdefault(k, []).append(float(v))
med = {k: statistics.median(v) for k, v in vals.items()}
print(f"fastblock-store vs fio, 4 KiB, O_DIRECT, median of {rounds} rounds (engine sync mode: {sync})")
print(f"{'test':<12}{'engine IOPS':>13}{'fio IOPS':>11}{'ratio':>8}{'engine us/op':>14}{'fio us/op':>11}")
for t in ["write_qd1", "write_qd32", "read_qd1", "read_qd32"]:
    e, f = med[f"engine_{t}"], med[f"fio_{t}"]
    depth = 1 if t.endswith("qd1") else 32
    print(f"{t:<12}{e:>13.0f}{f:>11.0f}{e/f:>8.2f}{depth*1e6/e:>14.1f}{depth*1e6/f:>11.1f}")
w32 = med["engine_write_qd32"] / med["fio_write_qd32"]
w1 = (1 / med["engine_write_qd1"]) / (1 / med["fio_write_qd1"])
print(f"target write QD32 >= 0.80 x fio: {w32:.2f} -> {'met' if w32 >= 0.8 else 'NOT met'}")
print(f"target write QD1 latency <= 1.3 x fio: {w1:.2f} -> {'met' if w1 <= 1.3 else 'NOT met'}")
print("per-round raw values:", {k: [int(x) for x in v] for k, v in sorted(vals.items())})
PY

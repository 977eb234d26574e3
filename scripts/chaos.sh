#!/usr/bin/env bash
# The chaos run (docs/testing.md, "The chaos run"): a real cluster, each OSD in its own network
# namespace, under IO checked against a model of the writes, while OSDs, monitors, disks and the
# network fail and recover at random; then every PG must converge with identical replicas, read
# back whole and pass a deep scrub. Builds first, runs `crates/fastblock/tests/chaos.rs`, and
# prints the run's summary (also kept in the log it names).
#
#   scripts/chaos.sh [--minutes N] [--seed S] [--kinds LIST]
#
#   --minutes N    minutes of faults (default 2, what CI runs); the end adds a few minutes at most
#   --seed S       replay a run from its seed (printed first by every run), as far as real
#                  processes allow; default: a random seed
#   --kinds LIST   only these kinds of faults, comma-separated, to chase one kind's failure:
#                  kill-osd, kill-mon, isolate, cut-both, cut-one, slow-disk, failing-disk,
#                  corrupt-reads, bit-rot, out-in (default: all)
#
# Needs root, ip and nft (scripts/install-deps.sh). Keep the daemons' logs and data files of a
# run with FASTBLOCK_KEEP_TEST_DIRS=1 (the run prints where they are).
set -euo pipefail
cd "$(dirname "$0")/.."

minutes=2
seed=""
kinds=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --minutes) minutes="${2:?--minutes needs a number}"; shift 2 ;;
    --seed) seed="${2:?--seed needs a value}"; shift 2 ;;
    --kinds) kinds="${2:?--kinds needs a list}"; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "chaos.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if ! [[ "$minutes" =~ ^[0-9]+$ ]] || [[ "$minutes" -eq 0 ]]; then
  echo "chaos.sh: --minutes takes a whole number of minutes above 0, not $minutes" >&2
  exit 2
fi

export FASTBLOCK_CHAOS_SECS=$((minutes * 60))
if [[ -n "$seed" ]]; then
  export FASTBLOCK_CHAOS_SEED="$seed"
fi
if [[ -n "$kinds" ]]; then
  export FASTBLOCK_CHAOS_KINDS="$kinds"
fi

target="${CARGO_TARGET_DIR:-target}"
mkdir -p "$target"
log="$target/chaos-$(date +%Y%m%d-%H%M%S).log"

echo "== building"
cargo build -p fastblock --bins --test chaos --locked

echo "== chaos run: $minutes minute(s) of faults${seed:+, seed $seed}${kinds:+, only $kinds} (log: $log)"
status=0
if cargo nextest --version >/dev/null 2>&1; then
  # Profile `chaos` (.config/nextest.toml): no time limit but the test's own bounds.
  cargo nextest run -p fastblock --test chaos --locked --profile chaos --no-capture \
    -E 'test(=chaos_run)' >"$log" 2>&1 || status=$?
else
  cargo test -p fastblock --test chaos --locked -- --nocapture --exact chaos_run \
    >"$log" 2>&1 || status=$?
fi

echo
grep -E '^\[ *[0-9.]+s\] chaos: seed' "$log" || true
sed -n '/===== chaos summary/,/===== seed/p' "$log"
if [[ "$status" -ne 0 ]]; then
  echo
  echo "== FAILED (exit $status): the first lines of the failure, the whole story in $log"
  grep -E 'FINDING|VIOLATION|panicked at' "$log" | head -20 || true
  grep -E -A3 'panicked at' "$log" | head -20 || true
  exit "$status"
fi
echo "== passed"

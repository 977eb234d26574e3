#!/usr/bin/env bash
# Runs the deterministic simulator (crates/sim, docs/design/simulator.md).
#
#   scripts/sim.sh --seed S [--trace]      replay one seed exactly (--trace: every event)
#   scripts/sim.sh --seeds N [--base B]    N seeds derived from B (default 0): reproducible
#   scripts/sim.sh --seeds N --random      N fresh seeds (overnight runs); SIM_BASE=B to repeat
#   add --membership                       OSDs also go out and in (membership changes)
#
# Failing seeds are printed first as "SIM FAILED seed=<seed>" with the replay command; the
# exit status is 1 if any seed failed. Built with the dev profile (debug assertions on; the
# simulator's hot crates are optimized by the workspace profile).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --locked -q -p fastblock-sim --bin vopr
exec "${CARGO_TARGET_DIR:-target}/debug/vopr" "$@"

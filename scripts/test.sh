#!/usr/bin/env bash
# Runs the whole test suite: dependencies, formatting, lints, then every test of the workspace
# (unit, property and end-to-end tests on real etcd and monitor processes).
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/install-deps.sh

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== monitoring files (promtool check rules, dashboard JSON)"
./scripts/check-monitoring.sh

echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "== tests"
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --locked --no-fail-fast --profile ci
else
  cargo test --workspace --locked --no-fail-fast
fi

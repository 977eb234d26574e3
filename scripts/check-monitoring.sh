#!/usr/bin/env bash
# Checks the monitoring files shipped in deploy/: the Prometheus alert rules with promtool
# (installed by scripts/install-deps.sh): their syntax, and their unit tests on synthetic
# series (deploy/prometheus/alerts_test.yml); and the Grafana dashboard as JSON. Whether every
# metric they use is exported is checked against a running cluster by
# crates/fastblock/tests/monitoring.rs.
set -euo pipefail
cd "$(dirname "$0")/.."

promtool check rules deploy/prometheus/alerts.yml
promtool test rules deploy/prometheus/alerts_test.yml
python3 -m json.tool deploy/grafana/fastblock.json >/dev/null
echo "check-monitoring: deploy/grafana/fastblock.json is valid JSON"

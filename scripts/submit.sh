#!/usr/bin/env bash
# Submit a sweep to an existing Ray cluster as a Ray job.
#
#   scripts/submit.sh http://HEAD_IP:8265 -m model=llama,phi3 phase=prefill,decode
#
# The driver runs on the cluster with cluster=ray (joins it with address=auto). Point
# tracking at a server every node can reach (tracking=server tracking.uri=http://...),
# and cluster.export_cache at a path all nodes share.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 DASHBOARD_URL [sweep.py arguments...]" >&2; exit 2; }
address="$1"; shift
cd "$(dirname "$0")/.."
export RAY_AUTH_MODE=token
exec ray job submit --address="$address" --working-dir=. \
  --runtime-env-json='{"excludes": [".venv", "mlruns", "mlartifacts", "multirun", "outputs", ".phasesweep_cache", "mlflow.db", ".git"]}' \
  -- python sweep.py "$@" cluster=ray

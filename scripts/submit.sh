#!/usr/bin/env bash
# Submit a sweep to an existing Ray cluster as a Ray job.
#
#   scripts/submit.sh http://HEAD_IP:8265 -m model=llama,phi3 phase=prefill,decode
#
# The driver runs on the cluster's head with cluster=ray and cluster.address=<its GCS address>,
# asked of the cluster's dashboard (scripts/cluster_node.py gcs-address; PHASESWEEP_CLUSTER_ADDRESS
# gives it instead): never `auto`, which reads a machine-wide file another Ray may have
# overwritten. It runs in a working directory Ray deletes after the job: it must record to a tracking server
# (tracking=server tracking.uri=http://...; the sweep refuses to start otherwise). No
# filesystem has to be shared: exports travel through Ray's object store, and each node
# keeps them in its own cache (scripts/cluster.sh --cache DIR).
#
# Each submission packages a file of its own (.phasesweep_submission.*, removed when it ends):
# Ray skips uploading a package whose content it holds, but deletes a finished job's package
# soon after (Ray issue 46625), so an unchanged folder could find its package gone. The file
# is not in .gitignore: Ray leaves what .gitignore lists out of the package.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 DASHBOARD_URL [sweep.py arguments...]" >&2; exit 2; }
address="$1"; shift
cd "$(dirname "$0")/.."
export RAY_AUTH_MODE=token
gcs="${PHASESWEEP_CLUSTER_ADDRESS:-$("${PYTHON:-python}" scripts/cluster_node.py gcs-address "$address")}"
marker=$(mktemp .phasesweep_submission.XXXXXXXX)
trap 'rm -f "$marker"' EXIT
echo "submitted $(date -u +%Y-%m-%dT%H:%M:%SZ) from $(hostname) by pid $$" >"$marker"
ray job submit --address="$address" --working-dir=. \
  --runtime-env-json='{"excludes": [".venv", "mlruns", "mlartifacts", "multirun", "outputs", ".phasesweep_cache", "mlflow.db", ".git"]}' \
  -- python sweep.py "$@" cluster=ray "cluster.address=$gcs"

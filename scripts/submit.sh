#!/usr/bin/env bash
# Submit a sweep to an existing Ray cluster as a Ray job.
#
#   scripts/submit.sh http://HEAD_IP:8265 -m model=llama,phi3 phase=prefill,decode
#
# The driver runs on the cluster's head with cluster=ray (joins it with address=auto), in
# a working directory Ray deletes after the job: it must record to a tracking server
# (tracking=server tracking.uri=http://...; the sweep refuses to start otherwise). No
# filesystem has to be shared: exports travel through Ray's object store, and each node
# keeps them in its own cache (scripts/cluster.sh --cache DIR).
#
# Each submission's working directory holds a file of its own (.phasesweep_submission.*,
# removed when the submission ends): Ray names a working directory's package by its
# content and skips the upload when the cluster holds that name already, but it deletes a
# finished job's package shortly after the job, so a second submission of an unchanged
# folder could skip the upload and then find its package gone ("Failed to download
# runtime_env file package ... from the GCS", Ray issue 46625; seen here when the same
# folder was submitted again seconds after a job ended). A package of its own is always
# uploaded. (The file is not in .gitignore: Ray leaves what .gitignore lists out of the
# package.)
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 DASHBOARD_URL [sweep.py arguments...]" >&2; exit 2; }
address="$1"; shift
cd "$(dirname "$0")/.."
marker=$(mktemp .phasesweep_submission.XXXXXXXX)
trap 'rm -f "$marker"' EXIT
echo "submitted $(date -u +%Y-%m-%dT%H:%M:%SZ) from $(hostname) by pid $$" >"$marker"
export RAY_AUTH_MODE=token
ray job submit --address="$address" --working-dir=. \
  --runtime-env-json='{"excludes": [".venv", "mlruns", "mlartifacts", "multirun", "outputs", ".phasesweep_cache", "mlflow.db", ".git"]}' \
  -- python sweep.py "$@" cluster=ray

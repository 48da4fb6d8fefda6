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
# Ray is given a snapshot of the project, not the live folder: `ray job submit` hashes the
# folder twice (the URI the job names, then the package it uploads), so a file written in
# between (a log) made the job name a package never uploaded. The snapshot holds what git
# tracks or would track (every file, outside a git checkout), less EXCLUDES, plus a file of
# the submission's own: Ray skips uploading a package whose content it holds, but deletes a
# finished job's package soon after (Ray issue 46625), so equal content could find it gone.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 DASHBOARD_URL [sweep.py arguments...]" >&2; exit 2; }
address="$1"; shift
cd "$(dirname "$0")/.."
export RAY_AUTH_MODE=token
gcs="${PHASESWEEP_CLUSTER_ADDRESS:-$("${PYTHON:-python}" scripts/cluster_node.py gcs-address "$address")}"
EXCLUDES=(.venv mlruns mlartifacts multirun outputs .phasesweep_cache mlflow.db .git)
snap=$(mktemp -d "${TMPDIR:-/tmp}/phasesweep-submission.XXXXXXXX")
trap 'rm -rf "$snap"' EXIT
tar_excludes=()
for e in "${EXCLUDES[@]}"; do tar_excludes+=("--exclude=$e"); done
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git ls-files -z --cached --others --exclude-standard | tar "${tar_excludes[@]}" --ignore-failed-read --null -T - -cf -
else
  tar "${tar_excludes[@]}" -cf - .
fi | tar -xf - -C "$snap"
echo "submitted $(date -u +%Y-%m-%dT%H:%M:%SZ) from $(hostname) by pid $$" >"$snap/.phasesweep_submission"
ray job submit --address="$address" --working-dir="$snap" -- python sweep.py "$@" cluster=ray "cluster.address=$gcs"

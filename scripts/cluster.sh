#!/usr/bin/env bash
# Start or stop the Ray nodes of a phasesweep cluster (scripts/cluster_node.py does the work).
#
#   scripts/cluster.sh head [NODE_IP] [--bench] [--cache DIR] [--num-cpus N] [--port P] [--dashboard-port P] [-- RAY START ARGS]
#   scripts/cluster.sh worker HEAD_IP:PORT [--cache DIR] [--num-cpus N] [--node-ip IP] [-- RAY START ARGS]
#   scripts/cluster.sh stop [NAME|FOLDER]        # this user's nodes of this script on this machine, or the one named
#
# Each node gets a Ray temp folder of its own, ${TMPDIR:-/tmp}/psw-ray-<uid>/head-<GCS port> or
# worker-<random>, and free ports unless given (--port, --dashboard-port, or any `ray start` port
# flag after --, which wins). A start returns once the node is up (raylet registered, dashboard
# answering on the head, dashboard agent listening), else fails with one line, its processes
# ended and its folder removed. stop ends only the processes of those folders (never `ray stop`).
#
# Each worker offers one `phasesweep_bench` slot (one CPU benchmark per node at a time, on all
# its CPUs); the head offers none unless --bench (a one-machine cluster needs it): it runs the
# GCS, the dashboard and submitted drivers. Token auth is on: copy ~/.ray/auth_token from the
# head to each worker and submitting machine. --cache DIR: the node's own export cache
# (PHASESWEEP_NODE_CACHE); exports reach other nodes through Ray's object store. Submitted
# drivers run on the head with its environment: start it with the tracking server's
# credentials in it (set -a; . .mlflow_server/credentials; set +a).
set -euo pipefail
exec "${PYTHON:-python}" "$(dirname "$0")/cluster_node.py" "$@"

#!/usr/bin/env bash
# Start or stop the Ray nodes of a phasesweep cluster.
#
#   scripts/cluster.sh head [NODE_IP] [--bench]  # on the head node (default IP: 127.0.0.1)
#   scripts/cluster.sh worker HEAD_IP:6379       # on every other node
#   scripts/cluster.sh stop                      # on any node
#
# Every worker advertises one `phasesweep_bench` slot: phasesweep runs one CPU benchmark
# per node at a time on it, holding all the node's CPUs. The head advertises none unless
# started with --bench: it runs the GCS, the dashboard and the drivers of submitted jobs,
# which would share a benchmark's cores. A single-machine cluster needs --bench (the head is
# its only node). Token auth is on (Ray 2.60): copy ~/.ray/auth_token from the head to each
# worker and to every machine that submits jobs.
set -euo pipefail
export RAY_AUTH_MODE=token RAY_USAGE_STATS_ENABLED=0
BENCH='{"phasesweep_bench": 1}'
usage="usage: $0 head [NODE_IP] [--bench] | worker HEAD_IP:6379 | stop"

case "${1:-}" in
  head)
    shift
    ip=127.0.0.1
    resources=()
    for arg in "$@"; do
      case "$arg" in
        --bench) resources=(--resources="$BENCH") ;;
        -*) echo "$usage" >&2; exit 2 ;;
        *) ip="$arg" ;;
      esac
    done
    # a single-machine cluster on 127.0.0.1 stays on loopback (Ray otherwise binds every interface)
    [ "$ip" = 127.0.0.1 ] && export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
    ray start --head --node-ip-address="$ip" --port=6379 \
      --dashboard-host="$ip" --dashboard-port=8265 "${resources[@]}"
    [ ${#resources[@]} -gt 0 ] || echo "the head offers no benchmark slot: start workers, or restart it with --bench"
    echo "submit with: scripts/submit.sh http://$ip:8265 -m model=llama,phi3 phase=prefill,decode"
    ;;
  worker)
    [ -n "${2:-}" ] || { echo "usage: $0 worker HEAD_IP:6379" >&2; exit 2; }
    ray start --address="$2" --resources="$BENCH"
    ;;
  stop)
    ray stop
    ;;
  *)
    echo "$usage" >&2
    exit 2
    ;;
esac

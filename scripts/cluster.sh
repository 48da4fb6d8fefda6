#!/usr/bin/env bash
# Start or stop the Ray nodes of a phasesweep cluster.
#
#   scripts/cluster.sh head [NODE_IP]          # on the head node (default IP: 127.0.0.1)
#   scripts/cluster.sh worker HEAD_IP:6379     # on every other node
#   scripts/cluster.sh stop                    # on any node
#
# Every node advertises one `phasesweep_bench` slot: phasesweep runs one CPU benchmark
# per node at a time on it. Token auth is on (Ray 2.60): copy ~/.ray/auth_token from the
# head to each worker and to every machine that submits jobs.
set -euo pipefail
export RAY_AUTH_MODE=token RAY_USAGE_STATS_ENABLED=0
BENCH='{"phasesweep_bench": 1}'

case "${1:-}" in
  head)
    ip="${2:-127.0.0.1}"
    # a single-machine cluster on 127.0.0.1 stays on loopback (Ray otherwise binds every interface)
    [ "$ip" = 127.0.0.1 ] && export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
    ray start --head --node-ip-address="$ip" --port=6379 \
      --dashboard-host="$ip" --dashboard-port=8265 --resources="$BENCH"
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
    echo "usage: $0 head [NODE_IP] | worker HEAD_IP:6379 | stop" >&2
    exit 2
    ;;
esac

#!/usr/bin/env bash
# Start or stop the Ray nodes of a phasesweep cluster.
#
#   scripts/cluster.sh head [NODE_IP] [--bench] [--cache DIR] [--num-cpus N] [--port P] [--dashboard-port P] [-- RAY START ARGS]
#   scripts/cluster.sh worker HEAD_IP:PORT [--cache DIR] [--num-cpus N] [--node-ip IP] [-- RAY START ARGS]
#   scripts/cluster.sh stop                      # on any node: every Ray node of this machine
#
# Each worker offers one `phasesweep_bench` slot (one CPU benchmark per node at a time, on all
# its CPUs); the head offers none unless --bench (a one-machine cluster needs it): it runs the
# GCS, the dashboard and submitted drivers. Token auth is on: copy ~/.ray/auth_token from the
# head to each worker and submitting machine. --cache DIR: the node's own export cache
# (PHASESWEEP_NODE_CACHE); exports reach other nodes through Ray's object store. Submitted
# drivers run on the head with its environment: start it with the tracking server's
# credentials in it (set -a; . .mlflow_server/credentials; set +a).
set -euo pipefail
export RAY_AUTH_MODE=token RAY_USAGE_STATS_ENABLED=0
BENCH='{"phasesweep_bench": 1}'
usage="usage: $0 head [NODE_IP] [--bench] [--cache DIR] [--num-cpus N] [--port P] [--dashboard-port P] | worker HEAD_IP:PORT [--cache DIR] [--num-cpus N] [--node-ip IP] | stop"

cmd="${1:-}"
[ $# -gt 0 ] && shift
ip=127.0.0.1 head="" resources=() cpus=() port=6379 dash=8265 extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --) shift; extra=("$@"); break ;;  # the rest goes to `ray start` as it is
    --bench) resources=(--resources="$BENCH"); shift ;;
    --cache) mkdir -p "${2:?$usage}"; export PHASESWEEP_NODE_CACHE="$(cd "$2" && pwd)"; shift 2 ;;
    --num-cpus) cpus=(--num-cpus="${2:?$usage}"); shift 2 ;;
    --port) port="${2:?$usage}"; shift 2 ;;
    --dashboard-port) dash="${2:?$usage}"; shift 2 ;;
    --node-ip) ip="${2:?$usage}"; shift 2 ;;
    -*) echo "$usage" >&2; exit 2 ;;
    *) if [ "$cmd" = worker ] && [ -z "$head" ]; then head="$1"; else ip="$1"; fi; shift ;;
  esac
done

case "$cmd" in
  head)
    # a cluster on 127.0.0.1 stays on loopback (Ray otherwise binds every interface)
    [ "$ip" = 127.0.0.1 ] && export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
    ray get-auth-token --generate >/dev/null  # ~/.ray/auth_token, made once: the token every node and submitter needs
    ray start --head --node-ip-address="$ip" --port="$port" \
      --dashboard-host="$ip" --dashboard-port="$dash" "${resources[@]}" "${cpus[@]}" "${extra[@]}"
    [ ${#resources[@]} -gt 0 ] || echo "the head offers no benchmark slot: start workers, or restart it with --bench"
    echo "submit with: scripts/submit.sh http://$ip:$dash -m model=llama,phi3 phase=prefill,decode tracking=server tracking.uri=http://$ip:5000"
    ;;
  worker)
    [ -n "$head" ] || { echo "$usage" >&2; exit 2; }
    ray=(ray) own=()
    if [ "$ip" = 127.0.0.1 ]; then
      # beside a head at 127.0.0.1: every address kept on loopback (scripts/ray_loopback.py), and a temp
      # folder of its own (sharing the head's, it would unpack a job's working directory over its driver's)
      ray=("${PYTHON:-python}" "$(dirname "$0")/ray_loopback.py")
      [[ " ${extra[*]} " == *" --temp-dir"* ]] || own=(--temp-dir="$(mktemp -d /tmp/ray-node-XXXXXX)")
    fi
    "${ray[@]}" start "${own[@]}" --address="$head" --node-ip-address="$ip" --resources="$BENCH" "${cpus[@]}" "${extra[@]}"
    ;;
  stop)
    ray stop
    ;;
  *)
    echo "$usage" >&2
    exit 2
    ;;
esac

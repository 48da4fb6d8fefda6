#!/usr/bin/env bash
# An MLflow tracking server for cluster sweeps: sqlite backend, artifacts served by the
# server itself so workers and browsers need no shared filesystem.
#
#   scripts/mlflow_server.sh [HOST] [PORT]     # default 127.0.0.1 5000
#   python sweep.py -m ... tracking=server tracking.uri=http://HOST:PORT
set -euo pipefail
host="${1:-127.0.0.1}"; port="${2:-5000}"
cd "$(dirname "$0")/.."
exec mlflow server --host "$host" --port "$port" \
  --backend-store-uri "sqlite:///$PWD/mlflow.db" \
  --artifacts-destination "$PWD/mlartifacts" --serve-artifacts

#!/usr/bin/env bash
# A team MLflow tracking server: PostgreSQL for runs and users, artifacts served by the server
# itself (no shared filesystem needed), MLflow's basic-auth app on, bound to 127.0.0.1 unless
# told otherwise. sqlite (tracking.uri unset) stays the default for one machine.
#
#   scripts/mlflow_server.sh start  [--dir DIR] [--host HOST] [--port PORT] [--pg-port PORT] [--workers N]
#   scripts/mlflow_server.sh status [--dir DIR]    # exit 0 when both are up, 3 when not
#   scripts/mlflow_server.sh stop   [--dir DIR]
#
# DIR (default: $PHASESWEEP_SERVER_DIR, else .mlflow_server/ in the repo, git-ignored) holds
# everything: pgdata/ (a PostgreSQL cluster the script initialises on first start, listening
# on 127.0.0.1:PG_PORT only), artifacts/, the logs, and these files, each mode 600:
#   credentials  the admin account clients use: MLFLOW_TRACKING_USERNAME=... and
#                MLFLOW_TRACKING_PASSWORD=... lines (shell-sourceable)
#   secret_key   the Flask secret of the auth app;  pgpass: libpq's password of role mlflow
#   basic_auth.ini  MLflow's auth config (MLFLOW_AUTH_CONFIG_PATH; users kept in PostgreSQL)
#
# Credentials never appear on a command line. The admin account is created on first start
# from MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD when both are set in the
# environment, else from the file --credentials FILE names, else a random password is made
# and written to DIR/credentials. Clients pass the same two variables:
#
#   set -a; . DIR/credentials; set +a
#   python sweep.py -m ... tracking.uri=http://127.0.0.1:5000
#
# Run as root, PostgreSQL runs as the unprivileged user postgres ($PHASESWEEP_PG_USER); where it
# cannot reach DIR (a folder above is mode 700), its data lives in a folder of DIR's own under
# $PHASESWEEP_PG_DATA_ROOT (default /var/tmp), DIR/pgdata linking to it. MLflow runs as the caller. Needs Debian's `postgresql` package and
# the Python packages of `pip install -e '.[server]'` (psycopg, Flask-WTF).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python}"
usage="usage: $0 start|stop|status [--dir DIR] [--host HOST] [--port PORT] [--pg-port PORT] [--workers N] [--credentials FILE]"

die() { echo "mlflow_server: $*" >&2; exit 1; }
say() { echo "mlflow_server: $*"; }

cmd="${1:-}"
[ $# -gt 0 ] && shift
dir="${PHASESWEEP_SERVER_DIR:-$ROOT/.mlflow_server}"
host=127.0.0.1 port=5000 pg_port="" workers=4 cred_file=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) dir="${2:?$usage}"; shift 2 ;;
    --host) host="${2:?$usage}"; shift 2 ;;
    --port) port="${2:?$usage}"; shift 2 ;;
    --pg-port) pg_port="${2:?$usage}"; shift 2 ;;
    --workers) workers="${2:?$usage}"; shift 2 ;;
    --credentials) cred_file="${2:?$usage}"; shift 2 ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
case "$cmd" in start | stop | status) ;; *) echo "$usage" >&2; exit 2 ;; esac
for n in "$port" "$workers" ${pg_port:+"$pg_port"}; do
  [[ "$n" =~ ^[0-9]+$ ]] || die "not a number: '$n'"
done

mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
pgdata="$dir/pgdata" pglog="$dir/postgres.log" mllog="$dir/mlflow.log" pidfile="$dir/mlflow.pid"
state="$dir/server.env"  # HOST, PORT, PG_PORT of the last start (status and stop read it)
if [ -L "$pgdata" ]; then pgdata="$(readlink -f "$pgdata")" pglog="$pgdata.log"; fi  # kept outside DIR: see start

# -- PostgreSQL, as an unprivileged user -------------------------------------------------
pg_bin="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1 || true)"
if [ -z "$pg_bin" ] && command -v initdb >/dev/null; then pg_bin="$(dirname "$(command -v initdb)")"; fi
if [ "$(id -u)" = 0 ]; then
  pg_user="${PHASESWEEP_PG_USER:-postgres}"
  as_pg() { (cd / && runuser -u "$pg_user" -- "$@"); }  # from /: the caller's folder may be closed to it
else
  pg_user="$(id -un)"
  as_pg() { "$@"; }
fi
pg() { as_pg "$pg_bin/$1" "${@:2}"; }
pg_running() { [ -f "$pgdata/PG_VERSION" ] && pg pg_ctl status -D "$pgdata" >/dev/null 2>&1; }

read_state() { # HOST PORT PG_PORT from server.env, if any
  if [ -f "$state" ]; then
    while IFS='=' read -r k v; do
      case "$k" in HOST) s_host="$v" ;; PORT) s_port="$v" ;; PG_PORT) s_pg_port="$v" ;; esac
    done <"$state"
  fi
}
s_host="" s_port="" s_pg_port=""
read_state

mlflow_pid() { # the server's pid when it runs (the pid file's process, still an mlflow server)
  local pid
  [ -f "$pidfile" ] || return 1
  pid="$(cat "$pidfile")"
  [[ "$pid" =~ ^[0-9]+$ ]] && [ -r "/proc/$pid/cmdline" ] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q "mlflow server" || return 1
  echo "$pid"
}

in_session() { # pids of live processes in session $1
  local sid="$1" p stat rest
  for p in /proc/[0-9]*; do
    stat="$(cat "$p/stat" 2>/dev/null)" || continue
    rest="${stat##*) }"
    set -- $rest
    [ "${4:-}" = "$sid" ] && [ "$1" != Z ] && echo "${p#/proc/}"
  done
  return 0
}

healthy() { "$PYTHON" - "$1" <<'EOF'
import sys, urllib.request
try:
    urllib.request.urlopen(sys.argv[1] + "/health", timeout=3).read()
except Exception:
    sys.exit(1)
EOF
}

stop_mlflow() {
  local pid left i
  if ! pid="$(mlflow_pid)"; then
    rm -f "$pidfile"
    say "MLflow server: not running"
    return 0
  fi
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 1 100); do
    left="$(in_session "$pid")"
    [ -z "$left" ] && break
    sleep 0.2
  done
  left="$(in_session "$pid")"
  if [ -n "$left" ]; then kill -KILL $left 2>/dev/null || true; fi
  rm -f "$pidfile"
  say "MLflow server: stopped (pid $pid)"
}

stop_pg() {
  local pid i
  if pg_running; then
    pid="$(head -n 1 "$pgdata/postmaster.pid" 2>/dev/null)"
    pg pg_ctl stop -D "$pgdata" -m fast -w -t 60 >/dev/null
    # pg_ctl returns before the postmaster (a session leader) exits: wait for its session to
    # empty, so "stopped" means no process of PostgreSQL is left
    for ((i = 0; i < 100; i++)); do
      [ -z "$(in_session "${pid:-0}")" ] && break
      sleep 0.1
    done
    say "PostgreSQL: stopped"
  else
    say "PostgreSQL: not running"
  fi
}

status() {
  local ok=0 pid
  if pg_running; then
    say "PostgreSQL: running on 127.0.0.1:${s_pg_port:-?} (data $pgdata, user $pg_user)"
  else
    say "PostgreSQL: not running"; ok=3
  fi
  if pid="$(mlflow_pid)" && healthy "http://$s_host:$s_port"; then
    say "MLflow server: running at http://$s_host:$s_port (pid $pid, basic-auth, artifacts in $dir/artifacts)"
    say "credentials: $dir/credentials (or your own MLFLOW_TRACKING_USERNAME/PASSWORD)"
  elif pid="$(mlflow_pid)"; then
    say "MLflow server: pid $pid runs but http://$s_host:$s_port/health does not answer (see $mllog)"; ok=3
  else
    say "MLflow server: not running"; ok=3
  fi
  return $ok
}

case "$cmd" in
  stop) stop_mlflow; [ -n "$pg_bin" ] && stop_pg; exit 0 ;;
  status) [ -n "$pg_bin" ] || die "PostgreSQL is not installed (apt-get install postgresql)"; status; exit $? ;;
esac

# -- start ---------------------------------------------------------------------------------
[ -n "$pg_bin" ] && [ -x "$pg_bin/initdb" ] ||
  die "PostgreSQL is not installed: apt-get install postgresql (Debian's package; its binaries are looked for in /usr/lib/postgresql/*/bin)"
deps="$("$PYTHON" -c "import mlflow, psycopg, flask_wtf" 2>&1)" ||
  die "'$PYTHON' cannot import mlflow, psycopg and Flask-WTF ($(tail -n1 <<<"$deps")): activate the project's venv and pip install -e '.[server]'"
if [ "$(id -u)" = 0 ]; then
  id "$pg_user" >/dev/null 2>&1 || die "no user '$pg_user' to run PostgreSQL as (Debian's postgresql package makes it; or set PHASESWEEP_PG_USER)"
  # PostgreSQL runs as $pg_user and must pass through every folder above DIR (a `mktemp -d` is mode 700)
  # PostgreSQL runs as $pg_user: where it cannot pass through a folder above DIR (a `mktemp -d` is
  # mode 700), its data lives in a folder of DIR's own under /var/tmp, DIR/pgdata linking to it
  if [ ! -e "$pgdata" ] && ! as_pg test -x "$dir"; then
    up=""
    IFS=/ read -ra parts <<<"${dir#/}"
    for part in "${parts[@]}"; do up="$up/$part"; as_pg test -x "$up" || break; done
    alt="${PHASESWEEP_PG_DATA_ROOT:-/var/tmp}/phasesweep-pgdata-$(printf %s "$dir" | sha256sum | cut -c1-12)"
    as_pg test -x "$(dirname "$alt")" ||
      die "user '$pg_user' cannot enter $up nor $(dirname "$alt"): give --dir a folder it can reach, or set PHASESWEEP_PG_DATA_ROOT"
    mkdir -p "$alt" && ln -sfn "$alt" "$dir/pgdata" && pgdata="$alt" pglog="$alt.log"
    say "note: user '$pg_user' cannot pass through $up: PostgreSQL's data is kept in $alt ($dir/pgdata links to it)"
  fi
fi
umask 077
chmod 711 "$dir"  # the postgres user must pass through to pgdata/; nothing here is readable to it

secret() { od -An -tx1 -N24 /dev/urandom | tr -d ' \n'; }
free_port() { "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port_taken() { "$PYTHON" - "$1" "$2" <<'EOF'
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind: a port in TIME_WAIT is free
try:
    s.bind((sys.argv[1], int(sys.argv[2])))
except OSError:
    sys.exit(0)
sys.exit(1)
EOF
}

# the admin account: the environment, else --credentials FILE, else DIR/credentials, else new
user="" password=""
read_credentials() {
  local k v
  while IFS='=' read -r k v; do
    v="${v%\"}" v="${v#\"}" v="${v%\'}" v="${v#\'}"
    case "$k" in
      MLFLOW_TRACKING_USERNAME | export\ MLFLOW_TRACKING_USERNAME) user="$v" ;;
      MLFLOW_TRACKING_PASSWORD | export\ MLFLOW_TRACKING_PASSWORD) password="$v" ;;
    esac
  done <"$1"
  [ -n "$user" ] && [ -n "$password" ] || die "$1 has no MLFLOW_TRACKING_USERNAME=... and MLFLOW_TRACKING_PASSWORD=... lines"
}
if [ -n "${MLFLOW_TRACKING_USERNAME:-}" ] && [ -n "${MLFLOW_TRACKING_PASSWORD:-}" ]; then
  user="$MLFLOW_TRACKING_USERNAME" password="$MLFLOW_TRACKING_PASSWORD" cred_from="the environment"
elif [ -n "$cred_file" ]; then
  [ -r "$cred_file" ] || die "--credentials $cred_file: no such readable file"
  read_credentials "$cred_file"; cred_from="$cred_file"
elif [ -f "$dir/credentials" ]; then
  read_credentials "$dir/credentials"; cred_from="$dir/credentials"
else
  user=admin password="$(secret)" cred_from="$dir/credentials (new)"
  printf 'MLFLOW_TRACKING_USERNAME=%s\nMLFLOW_TRACKING_PASSWORD=%s\n' "$user" "$password" >"$dir/credentials"
fi
[ ${#password} -ge 12 ] || die "the admin password (from $cred_from) is shorter than 12 characters"
if ! mlflow_pid >/dev/null && port_taken "$host" "$port"; then
  die "$host:$port is in use: pick another --port"
fi
[ -f "$dir/secret_key" ] || secret >"$dir/secret_key"

# -- PostgreSQL: initialised once, started unless it runs ----------------------------------
if [ ! -f "$pgdata/PG_VERSION" ]; then
  pg_port="${pg_port:-$(free_port)}"
  mkdir -p "$pgdata"
  [ -z "$(ls -A "$pgdata")" ] || die "$pgdata is not empty and holds no PostgreSQL cluster: move it away"
  if [ "$(id -u)" = 0 ]; then chown "$pg_user": "$pgdata"; fi
  chmod 700 "$pgdata"
  as_pg test -w "$pgdata" ||
    die "user '$pg_user' cannot reach $pgdata (a parent folder is closed to other users?): choose a --dir it can reach"
  sock="$pgdata/.s.PGSQL.$pg_port"
  [ ${#sock} -lt 100 ] || die "--dir is too deep for PostgreSQL's socket path ($sock): choose a shorter one"
  pg initdb -D "$pgdata" --no-locale -E UTF8 --auth-local=peer --auth-host=scram-sha-256 >"$dir/initdb.log" 2>&1 ||
    die "initdb failed (see $dir/initdb.log)"
  cat >>"$pgdata/postgresql.conf" <<EOF

# phasesweep (scripts/mlflow_server.sh): loopback only, the socket inside the data folder
listen_addresses = '127.0.0.1'
port = $pg_port
unix_socket_directories = '$pgdata'
max_connections = 300
EOF
  printf 'HOST=%s\nPORT=%s\nPG_PORT=%s\n' "$host" "$port" "$pg_port" >"$state"
  say "PostgreSQL: initialised a cluster in $pgdata (port $pg_port)"
fi
asked_pg_port="$pg_port"
pg_port="$(sed -n 's/^port = \([0-9]*\)$/\1/p' "$pgdata/postgresql.conf" | tail -n1)"
[ -z "$asked_pg_port" ] || [ "$asked_pg_port" = "$pg_port" ] ||
  say "note: --pg-port $asked_pg_port ignored: the cluster in $pgdata keeps port $pg_port, set when it was made"
if ! pg_running; then
  touch "$pglog"
  if [ "$(id -u)" = 0 ]; then chown "$pg_user": "$pglog"; fi
  pg pg_ctl start -D "$pgdata" -l "$pglog" -w -t 60 >/dev/null 2>&1 || {
    tail -n 5 "$pglog" >&2
    die "PostgreSQL did not start on 127.0.0.1:$pg_port (see $pglog)"
  }
  say "PostgreSQL: started on 127.0.0.1:$pg_port"
else
  say "PostgreSQL: already running on 127.0.0.1:$pg_port"
fi

# role mlflow and its two databases (runs, users); the role's password lives in pgpass only
psql_su() { pg psql -X -q -v ON_ERROR_STOP=1 -h "$pgdata" -p "$pg_port" -d postgres "$@"; }
if [ ! -s "$dir/pgpass" ] || [ "$(psql_su -tAc "SELECT 1 FROM pg_roles WHERE rolname = 'mlflow'")" != 1 ]; then
  db_password="$(secret)"
  psql_su -f - >/dev/null <<EOF
SELECT 'CREATE ROLE mlflow LOGIN' WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'mlflow') \gexec
ALTER ROLE mlflow PASSWORD '$db_password';
EOF
  printf '127.0.0.1:%s:*:mlflow:%s\n' "$pg_port" "$db_password" >"$dir/pgpass"
fi
for db in mlflow mlflow_auth; do
  psql_su -f - >/dev/null <<EOF
SELECT 'CREATE DATABASE $db OWNER mlflow' WHERE NOT EXISTS (SELECT 1 FROM pg_database WHERE datname = '$db') \gexec
EOF
done
sed -i "s/^127\.0\.0\.1:[0-9]*:/127.0.0.1:$pg_port:/" "$dir/pgpass"

# -- MLflow ------------------------------------------------------------------------------------
url="http://$host:$port"
if pid="$(mlflow_pid)"; then
  [ "$s_host:$s_port" = "$host:$port" ] ||
    die "already running at http://$s_host:$s_port (pid $pid): stop it first to move it to $url"
  say "MLflow server: already running at $url (pid $pid)"
else
  cat >"$dir/basic_auth.ini" <<EOF
[mlflow]
default_permission = READ
database_uri = postgresql+psycopg://mlflow@127.0.0.1:$pg_port/mlflow_auth
admin_username = $user
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
grant_default_workspace_access = false
# each worker remembers a verified password this long: PBKDF2 once a minute, not per request
auth_cache_ttl_seconds = 60
EOF
  mkdir -p "$dir/artifacts"
  : >"$mllog"
  (
    # secrets reach the server through its environment (readable by its own user only)
    export MLFLOW_AUTH_CONFIG_PATH="$dir/basic_auth.ini" PGPASSFILE="$dir/pgpass"
    export MLFLOW_AUTH_ADMIN_USERNAME="$user" MLFLOW_AUTH_ADMIN_PASSWORD="$password"
    export MLFLOW_FLASK_SERVER_SECRET_KEY="$(cat "$dir/secret_key")"
    export MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false  # no job runner: nothing of ours uses it
    unset MLFLOW_TRACKING_USERNAME MLFLOW_TRACKING_PASSWORD MLFLOW_TRACKING_URI
    cd "$dir"
    exec setsid "$PYTHON" -m mlflow server --app-name basic-auth --host "$host" --port "$port" \
      --workers "$workers" --backend-store-uri "postgresql+psycopg://mlflow@127.0.0.1:$pg_port/mlflow" \
      --serve-artifacts --artifacts-destination "$dir/artifacts" </dev/null >>"$mllog" 2>&1
  ) &
  pid=$!
  echo "$pid" >"$pidfile"
  printf 'HOST=%s\nPORT=%s\nPG_PORT=%s\n' "$host" "$port" "$pg_port" >"$state"
  for _ in $(seq 1 ${PHASESWEEP_SERVER_START_S:-180}); do
    healthy "$url" && break
    if ! kill -0 "$pid" 2>/dev/null; then
      rm -f "$pidfile"
      grep -E "Error|error|Exception" "$mllog" | tail -n 3 >&2 || tail -n 5 "$mllog" >&2
      die "the MLflow server exited while starting (see $mllog)"
    fi
    sleep 1
  done
  healthy "$url" || die "the MLflow server (pid $pid) does not answer on $url/health (see $mllog; stop it with: $0 stop --dir $dir)"
  say "MLflow server: started at $url (pid $pid, basic-auth, artifacts in $dir/artifacts, log $mllog)"
fi

# the account must open the server: a stored admin keeps the password it was created with
code="$(MLFLOW_TRACKING_USERNAME="$user" MLFLOW_TRACKING_PASSWORD="$password" "$PYTHON" - "$url" <<'EOF'
import base64, os, sys, urllib.error, urllib.parse, urllib.request
user = os.environ["MLFLOW_TRACKING_USERNAME"]
token = base64.b64encode(f"{user}:{os.environ['MLFLOW_TRACKING_PASSWORD']}".encode()).decode()
url = sys.argv[1] + "/api/2.0/mlflow/users/get?" + urllib.parse.urlencode({"username": user})
req = urllib.request.Request(url, headers={"Authorization": "Basic " + token})
try:
    urllib.request.urlopen(req, timeout=10).read()
    print(200)
except urllib.error.HTTPError as e:
    print(e.code)
except Exception as e:
    print(e)
EOF
)"
[ "$code" = 200 ] ||
  die "the server runs, but it refuses user '$user' from $cred_from (answer: $code): the admin account keeps the password it was created with (see $dir/credentials)"
if [ "$cred_from" = "the environment" ]; then
  say "credentials: user '$user' from the environment; clients export the same MLFLOW_TRACKING_USERNAME/PASSWORD"
else
  say "credentials: user '$user' from $cred_from; clients: set -a; . ${cred_from% (new)}; set +a"
fi
say "use: python sweep.py -m ... tracking.uri=$url"

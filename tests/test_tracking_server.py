"""The team tracking server (scripts/mlflow_server.sh, issue 10): PostgreSQL, served artifacts,
basic auth, loopback only, and phasesweep recording through it.

One server for the module, started by the script on free ports in a folder of its own: the
folder is made under /tmp, not pytest's (mode 700: run as root, PostgreSQL runs as the user
postgres, which must reach its data folder). Two tiny sweeps at once of the test-only spin
backend (scripts/concurrency.py's, tests/spin_backend/), on one Ray head started for them,
record through it; what arrived is read back through MLflow's REST API with the credentials
the script wrote; a wrong password is refused in one line before any work; every listener of
the server is on 127.0.0.1; no password appears on any process's command line; `stop` leaves
no process behind.
"""

from __future__ import annotations

import base64
import glob
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "mlflow_server.sh"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        reason="needs Debian's postgresql package (apt-get install postgresql; .ci/run installs it)",
    ),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def script(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING_")}
    path = f"{Path(sys.executable).parent}{os.pathsep}{clean.get('PATH', '')}"  # the venv's python
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        env={**clean, "PATH": path, "PYTHON": sys.executable, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def credentials(folder: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in (folder / "credentials").read_text().split())


def rest(url: str, path: str, user: str | None = None, password: str | None = None, body: dict | None = None):
    """(status, parsed JSON or text) of a request to the server's REST API."""
    headers = {"Content-Type": "application/json"}
    if user is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def children(pid: int) -> set[int]:
    """pid and every process below it."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        parents.setdefault(int(text[text.rindex(")") + 2 :].split()[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        if p not in found:
            found.add(p)
            todo += parents.get(p, [])
    return found


def start_times(pids: set[int]) -> dict[int, str]:
    """pid -> its start time (/proc/<pid>/stat field 22): a pid reused later is another process."""
    out = {}
    for pid in pids:
        try:
            out[pid] = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
        except OSError:
            continue
    return out


def alive(procs: dict[int, str]) -> list[int]:
    """Those of `procs` (pid -> start time) still running."""
    out = []
    for pid, start in procs.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[19] == start and fields[0] not in ("Z", "X"):
            out.append(pid)
    return out


def in_session(sid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] not in ("Z", "X"):
            out.append(int(stat.parent.name))
    return out


def naming(folder: Path) -> list[int]:
    """Processes whose command line names `folder` (the postmaster's -D, the server's artifacts)."""
    out = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(folder).encode() in cmdline.read_bytes():
                out.append(int(cmdline.parent.name))
        except OSError:
            continue
    return out


def describe(pids: list[int]) -> list[str]:
    out = []
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            cmd, stat = "(gone)", ""
        out.append(f"{pid} {cmd[:200]!r} {stat[:120]!r}")
    return out


def listeners(pids: set[int]) -> list[tuple[str, int]]:
    """(address, port) of every listening TCP socket (v4 and v6) the processes hold."""
    inodes = set()
    for pid in pids:
        for fd in glob.glob(f"/proc/{pid}/fd/*"):
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            hexaddr, hexport = fields[1].split(":")
            raw = bytes.fromhex(hexaddr)
            if width == 8:
                addr = socket.inet_ntop(socket.AF_INET, raw[::-1])
            else:  # four little-endian 32-bit words
                addr = socket.inet_ntop(socket.AF_INET6, b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4)))
            found.append((addr, int(hexport, 16)))
    return found


@pytest.fixture(scope="module")
def server():
    """The script's server in a new folder on free ports: (url, folder, start's output, pids,
    listeners); stopped at the end, the processes it had checked gone."""
    folder = Path(tempfile.mkdtemp(prefix="psw-server-", dir="/tmp"))
    mlflow = 0
    port, pg_port = free_port(), free_port()
    t0 = time.monotonic()
    started = script("start", "--dir", str(folder), "--port", str(port), "--pg-port", str(pg_port), "--workers", "2")
    start_s = time.monotonic() - t0
    url = f"http://127.0.0.1:{port}"
    state: dict = {"url": url, "folder": folder, "start": started, "start_s": start_s, "port": port}
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        postmaster = int((folder / "pgdata" / "postmaster.pid").read_text().split()[0])
        mlflow = int((folder / "mlflow.pid").read_text())
        state["pids"] = children(postmaster) | children(mlflow)
        state["procs"] = start_times(state["pids"])
        state["pg_port"] = pg_port
        yield state
    finally:
        stopped = script("stop", "--dir", str(folder))
        state["stop"] = stopped

        def left() -> list[str]:  # what it had, and what started later: MLflow's session, the folder named
            pids = set(alive(state.get("procs", {})))
            if mlflow:
                pids |= set(in_session(mlflow)) | set(naming(folder))
            return describe(sorted(pids - {os.getpid()}))

        first = left()
        deadline = time.monotonic() + 10  # a process already ending may take a moment
        while (last := left()) and time.monotonic() < deadline:
            time.sleep(0.2)
        shutil.rmtree(folder, ignore_errors=True)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert last == [], f"processes of the server left after stop: {last} (right after stop: {first})"
        print(f"right after stop: {first}")


def test_start_is_idempotent_and_status_says_so(server):
    again = script("start", "--dir", str(server["folder"]), "--port", str(server["port"]))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "already running" in again.stdout
    status = script("status", "--dir", str(server["folder"]))
    assert status.returncode == 0 and f"running at {server['url']}" in status.stdout, status.stdout


def test_it_listens_on_loopback_only(server):
    found = listeners(server["pids"])
    ports = {p for _, p in found}
    assert {server["port"], server["pg_port"]} <= ports, found
    assert {a for a, _ in found} == {"127.0.0.1"}, found


def test_no_password_on_any_command_line(server):
    secrets = [credentials(server["folder"])["MLFLOW_TRACKING_PASSWORD"]]
    secrets += [(server["folder"] / "secret_key").read_text().strip()]
    secrets += [(server["folder"] / "pgpass").read_text().strip().rsplit(":", 1)[1]]
    for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            text = Path(cmdline).read_bytes().decode(errors="replace")
        except OSError:
            continue
        assert not any(s in text for s in secrets), f"a secret on the command line of {cmdline}"
    for name in ("credentials", "secret_key", "pgpass", "basic_auth.ini"):
        assert (server["folder"] / name).stat().st_mode & 0o077 == 0, name


def test_strangers_are_refused(server):
    url, cred = server["url"], credentials(server["folder"])
    user = cred["MLFLOW_TRACKING_USERNAME"]
    search = "/api/2.0/mlflow/experiments/search"
    assert rest(url, search, body={"max_results": 1})[0] == 401
    assert rest(url, search, user, "not-the-password", body={"max_results": 1})[0] == 401
    assert rest(url, search, user, cred["MLFLOW_TRACKING_PASSWORD"], body={"max_results": 1})[0] == 200


def test_a_wrong_password_is_one_line_before_any_work(server, tmp_path):
    t0 = time.monotonic()
    sweep = subprocess.run(
        [sys.executable, str(ROOT / "sweep.py"), "-m", "model=llama", "phase=decode", f"tracking.uri={server['url']}"],
        cwd=tmp_path,
        env={**os.environ, "MLFLOW_TRACKING_USERNAME": "admin", "MLFLOW_TRACKING_PASSWORD": "wrong-password-1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert sweep.returncode == 1
    assert "Traceback" not in sweep.stderr
    assert (
        sweep.stderr.strip()
        .splitlines()[-1]
        .startswith(f"phasesweep: tracking.uri='{server['url']}' refused user 'admin' (401 not authenticated)")
    ), sweep.stderr
    assert "variant(s)" not in sweep.stdout  # refused before planning, so before Ray started
    assert time.monotonic() - t0 < 60


def test_a_sweep_records_runs_and_artifacts_through_it(server, tmp_path, export_cache, exported, monkeypatch):
    exported("llama", "decode", "none")  # the spin backend's export, made once in the session's cache
    cred = credentials(server["folder"])
    for k, v in cred.items():
        monkeypatch.setenv(k, v)
    spec = importlib.util.spec_from_file_location("concurrency", ROOT / "scripts" / "concurrency.py")
    concurrency = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(concurrency)
    # two sweeps at once (scripts/concurrency.py's 32, in small), on one Ray started for them
    report = concurrency.run(
        2, 2, tmp_path, export_cache=export_cache, timeout_s=600, uri=server["url"], shared_ray=True
    )
    assert report["exit_codes"] == [0, 0], report["failed_sweeps"]
    assert report["lost"] == [] and report["running"] == [], report
    assert report["found"] == report["expected"]
    assert report["ray_left"] == [], "processes of the shared Ray outlived it"

    # read back over REST: the runs, and artifacts that the server stored in its own folder
    user, password = cred["MLFLOW_TRACKING_USERNAME"], cred["MLFLOW_TRACKING_PASSWORD"]
    status, exp = rest(
        server["url"], f"/api/2.0/mlflow/experiments/get-by-name?experiment_name={report['experiment']}", user, password
    )
    assert status == 200, exp
    experiment_id = exp["experiment"]["experiment_id"]
    assert exp["experiment"]["artifact_location"].startswith("mlflow-artifacts:")
    status, found = rest(
        server["url"], "/api/2.0/mlflow/runs/search", user, password, {"experiment_ids": [experiment_id]}
    )
    assert status == 200, found
    runs = found["runs"]
    assert len(runs) == 6 and {r["info"]["status"] for r in runs} == {"FINISHED"}
    for r in runs:
        run_id = r["info"]["run_id"]
        status, listed = rest(server["url"], f"/api/2.0/mlflow/artifacts/list?run_id={run_id}", user, password)
        assert status == 200 and listed.get("files"), listed
        stored = server["folder"] / "artifacts" / experiment_id / run_id / "artifacts"
        assert {f["path"] for f in listed["files"] if not f["is_dir"]} <= {p.name for p in stored.iterdir()}


def test_it_starts_under_a_folder_postgres_cannot_enter(tmp_path):
    """A project under a `mktemp -d` (mode 700): PostgreSQL's data goes to a folder of the
    server's own it can reach, DIR/pgdata linking to it; MLflow serves; stop ends both."""
    closed = Path(tempfile.mkdtemp(prefix="psw-closed-", dir="/tmp"))  # mode 700, as mktemp -d makes it
    reachable = Path(tempfile.mkdtemp(prefix="psw-pgroot-", dir="/tmp"))
    reachable.chmod(0o755)
    folder = closed / "project" / ".mlflow_server"
    env = {"PHASESWEEP_PG_DATA_ROOT": str(reachable)}
    try:
        started = script("start", "--dir", str(folder), "--port", str(free_port()), "--workers", "1", env=env)
        assert started.returncode == 0, started.stdout + started.stderr
        assert f"cannot pass through {closed}" in started.stdout + started.stderr
        link = folder / "pgdata"
        assert link.is_symlink() and Path(os.readlink(link)).parent == reachable
        assert (Path(os.readlink(link)) / "PG_VERSION").is_file()
        status = script("status", "--dir", str(folder), env=env)
        assert status.returncode == 0 and "PostgreSQL: running" in status.stdout + status.stderr
    finally:
        stopped = script("stop", "--dir", str(folder), env=env)
        shutil.rmtree(closed, ignore_errors=True)
        shutil.rmtree(reachable, ignore_errors=True)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr

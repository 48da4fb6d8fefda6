"""A tracking server that goes away mid-sweep (orchestrator/record/journal.py), on a real server
(scripts/mlflow_server.sh) and a real sweep of the test-only `spin` backend:

- stopped for 60 s after the first variant is measured, then started again: the sweep waits,
  says so, and every variant is recorded once, none left RUNNING;
- stopped for good: the sweep ends within tracking.outage_s naming its journal, and the replay
  (python -m orchestrator.replay) records every variant once; a second replay sends nothing.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.test_faults import SPIN_GRID, Sweep
from tests.test_tracking_server import credentials, free_port, rest, script
from tests.test_tracking_server import pytestmark as server_marks

pytestmark = server_marks  # slow, and Debian's postgresql
NAMES = [f"llama_decode_spin_cpu_spin_us{us}" for us in (0, 1, 2)]


@pytest.fixture
def server():
    folder = Path(tempfile.mkdtemp(prefix="psw-outage-", dir="/tmp"))
    args = ["--dir", str(folder), "--port", str(free_port()), "--pg-port", str(free_port()), "--workers", "1"]
    started = script("start", *args)
    assert started.returncode == 0, started.stdout + started.stderr
    url = re.search(r"started at (http://\S+)", started.stdout + started.stderr).group(1)
    yield {"url": url, "folder": folder, "start": lambda: script("start", *args), "stop": lambda: script("stop", "--dir", str(folder))}
    script("stop", "--dir", str(folder))
    shutil.rmtree(folder, ignore_errors=True)


def variant_runs(server) -> list[dict]:
    cred = credentials(server["folder"])
    user, password = cred["MLFLOW_TRACKING_USERNAME"], cred["MLFLOW_TRACKING_PASSWORD"]
    status, exp = rest(server["url"], "/api/2.0/mlflow/experiments/get-by-name?experiment_name=outage", user, password)
    assert status == 200, exp
    body = {"experiment_ids": [exp["experiment"]["experiment_id"]], "max_results": 1000}
    status, found = rest(server["url"], "/api/2.0/mlflow/runs/search", user, password, body)
    assert status == 200, found
    runs = found.get("runs", [])
    role = {r["info"]["run_id"]: {t["key"]: t["value"] for t in r["data"].get("tags", [])} for r in runs}
    return [r for r in runs if role[r["info"]["run_id"]].get("phasesweep.role") == "variant"]


def sweep(server, folder: Path, cache_override: str, *extra: str) -> Sweep:
    args = ["-m", *SPIN_GRID, cache_override, "backend.options.spin_us=0,1,2", "tracking=server"]
    args += [f"tracking.uri={server['url']}", "tracking.experiment=outage", f"tracking.journal_dir={folder / 'journal'}", *extra]
    return Sweep(folder, *args, env=credentials(server["folder"]))


def test_a_server_back_within_the_limit_loses_nothing(server, tmp_path, cache_override, exported):
    exported("llama", "decode", "none")
    run = sweep(server, tmp_path, cache_override)
    run.wait_for(r"^  measured  ")
    stopped = server["stop"]()
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    time.sleep(60)
    started = server["start"]()
    assert started.returncode == 0, started.stdout + started.stderr
    assert run.finish() == 0, run.text()[-6000:]
    assert "unreachable: waiting up to 600 s" in run.stdout and "back after" in run.stdout, run.stdout
    runs = variant_runs(server)
    assert sorted(r["info"]["run_name"] for r in runs) == sorted(NAMES)  # each once
    assert {r["info"]["status"] for r in runs} == {"FINISHED"}


def test_a_server_that_never_returns_is_replayed_later(server, tmp_path, cache_override, exported):
    exported("llama", "decode", "none")
    run = sweep(server, tmp_path, cache_override, "tracking.outage_s=20")
    run.wait_for(r"^  measured  ")
    assert server["stop"]().returncode == 0
    t0 = time.monotonic()
    assert run.finish() != 0
    assert time.monotonic() - t0 < 20 + 120, "the sweep did not end within its outage limit"
    line = run.text()
    assert "python -m orchestrator.replay" in line and "tracking.outage_s" in line, line[-3000:]
    journal = re.search(r"python -m orchestrator\.replay (\S+)", line).group(1)
    assert server["start"]().returncode == 0
    env = {**credentials(server["folder"])}
    replay = subprocess.run([sys.executable, "-m", "orchestrator.replay", journal], capture_output=True, text=True, env={**os.environ, **env}, timeout=300)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    runs = variant_runs(server)
    assert {r["info"]["status"] for r in runs} <= {"FINISHED", "KILLED"}  # none RUNNING
    assert len({r["info"]["run_name"] for r in runs}) == len(runs)  # nothing twice
    again = subprocess.run([sys.executable, "-m", "orchestrator.replay", journal], capture_output=True, text=True, env={**os.environ, **env}, timeout=300)
    assert again.returncode == 0 and "nothing to send" in again.stdout


def test_a_driver_killed_during_an_outage_loses_nothing_the_replay_sends(server, tmp_path, cache_override, exported):
    """SIGKILL while the driver waits for the server: its journal still holds every result it
    had; the replay records each variant measured before the kill as ok."""
    import signal

    exported("llama", "decode", "none")
    run = sweep(server, tmp_path, cache_override)
    run.wait_for(r"^  measured  ")
    assert server["stop"]().returncode == 0
    run.wait_for(r"^  tracking  server .* unreachable: waiting", timeout=300)
    os.killpg(run.proc.pid, signal.SIGKILL)
    run.finish(timeout=60)
    measured = set(re.findall(r"^  measured  (\S+)", run.stdout, flags=re.M))
    (journal,) = (tmp_path / "journal").glob("*.jsonl")
    assert server["start"]().returncode == 0
    env = {**os.environ, **credentials(server["folder"])}
    replay = subprocess.run([sys.executable, "-m", "orchestrator.replay", str(journal)], capture_output=True, text=True, env=env, timeout=300)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    ok = {r["info"]["run_name"] for r in variant_runs(server) if {t["key"]: t["value"] for t in r["data"]["tags"]}.get("status") == "ok"}
    assert measured and measured <= ok, (measured, ok)

"""kill -9 of the driver mid-sweep, then the same command again (issue 9): nothing lost,
nothing duplicated, nothing left RUNNING.

    1. a 4-variant spin sweep (spin_us=0,1,2,3); once its first variant is measured the
       driver is killed with SIGKILL: its sweep run and the unfinished variants stay RUNNING;
    2. the same command again: it closes those runs KILLED (the error names the dead driver's
       pid), links the variants measured ok (reused.json of the new sweep run, no new run for
       them) and measures only the rest;
    3. afterwards every variant name has exactly one run with status ok; none is RUNNING;
    4. `tracking.resume=false` measures again what was measured ok.
"""

from __future__ import annotations

import json
import os
import signal
import socket
from pathlib import Path

import pytest

from tests.test_faults import SPIN_GRID, Sweep, all_runs

pytestmark = pytest.mark.slow
NAMES = [f"llama_decode_spin_cpu_spin_us{us}" for us in range(4)]


def ok_runs(uri: str) -> dict[str, list]:
    found: dict[str, list] = {}
    for run in variant_runs_all(uri):
        if run.data.tags.get("status") == "ok" and run.info.status == "FINISHED":
            found.setdefault(run.info.run_name, []).append(run)
    return found


def variant_runs_all(uri: str) -> list:
    return [r for r in all_runs(uri) if r.data.tags.get("phasesweep.role") == "variant"]


@pytest.fixture(scope="module")
def resumed(tmp_path_factory, mlflow_db, cache_override, exported):
    exported("llama", "decode", "none")  # the spin backend's export, in the session's cache
    folder = tmp_path_factory.mktemp("resume")
    uri = mlflow_db(folder)
    args = ["-m", *SPIN_GRID, cache_override, "backend.options.spin_us=0,1,2,3"]

    first = Sweep(folder, *args)
    try:
        first.wait_for(r"^  measured  ")
        os.kill(first.proc.pid, signal.SIGKILL)
        first.finish(timeout=60)
    finally:
        first_left = first.leftovers(30)
    killed = {r.info.run_id: r for r in all_runs(uri)}

    second = Sweep(folder, *args)
    second.finish()
    second_left = second.leftovers()
    return {
        "uri": uri,
        "folder": folder,
        "args": args,
        "first": first,
        "killed": killed,
        "first_left": first_left,
        "second": second,
        "second_left": second_left,
    }


def test_the_kill_landed_mid_sweep(resumed):
    first, killed = resumed["first"], resumed["killed"]
    assert first.proc.returncode == -signal.SIGKILL
    ok = [r for r in killed.values() if r.data.tags.get("status") == "ok"]
    running = [r for r in killed.values() if r.info.status == "RUNNING"]
    assert 1 <= len(ok) < len(NAMES), [(r.info.run_name, r.info.status) for r in killed.values()]
    assert len(running) == 1 + len(NAMES) - len(ok)  # the sweep's run and every unfinished variant


def test_the_rerun_closes_what_the_dead_driver_left_running(resumed):
    first, second, killed = resumed["first"], resumed["second"], resumed["killed"]
    assert second.proc.returncode == 0, second.text()[-6000:]
    left_running = {r.info.run_id for r in killed.values() if r.info.status == "RUNNING"}
    now = {r.info.run_id: r for r in all_runs(resumed["uri"])}
    reason = f"its driver (pid {first.proc.pid} on {socket.gethostname()}) is gone"
    for run_id in left_running:
        run = now[run_id]
        assert run.info.status == "KILLED" and run.data.tags["status"] == "aborted", run.data.tags
        assert reason in run.data.tags["error"], run.data.tags["error"]
        assert f"  closed    {run.info.run_name}: left RUNNING" in second.stdout
    assert second.stdout.count("  closed    ") == len(left_running)


def test_the_rerun_reuses_what_ended_ok_and_measures_the_rest(resumed):
    from mlflow.tracking import MlflowClient

    second, killed, uri = resumed["second"], resumed["killed"], resumed["uri"]
    before_ok = {r.info.run_name: r.info.run_id for r in killed.values() if r.data.tags.get("status") == "ok"}
    client = MlflowClient(tracking_uri=uri)
    new = [r for r in all_runs(uri) if r.info.run_id not in killed]
    (parent,) = [r for r in new if r.data.tags.get("phasesweep.role") == "sweep"]
    assert parent.info.status == "FINISHED" and parent.data.params["reused"] == str(len(before_ok))
    path = client.download_artifacts(parent.info.run_id, "reused.json", str(resumed["folder"]))
    assert json.loads(Path(path).read_text()) == before_ok
    children = [r for r in new if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(r.info.run_name for r in children) == sorted(set(NAMES) - set(before_ok))  # no run for the reused
    for name in before_ok:
        assert f"  measured  {name} " not in second.stdout
    for name in set(NAMES) - set(before_ok):
        assert f"  measured  {name} " in second.stdout


def test_nothing_lost_nothing_duplicated_nothing_running(resumed):
    uri = resumed["uri"]
    ok = ok_runs(uri)
    assert sorted(ok) == sorted(NAMES)
    assert {name: len(runs) for name, runs in ok.items()} == dict.fromkeys(NAMES, 1)
    assert [r.info.run_name for r in all_runs(uri) if r.info.status == "RUNNING"] == []
    assert resumed["second_left"] == []


def test_a_driver_killed_with_sigkill_leaves_no_process(resumed):
    """Ray's dashboard and runtime-env agents used to outlive it by a minute (raylet and GCS
    die with it): the driver's watchdog, orchestrator/run/reaper.py, ends them."""
    assert resumed["first_left"] == [], f"processes of the killed driver's session outlived it: {resumed['first_left']}"


def test_resume_false_measures_again(resumed):
    """`tracking.resume=false`: variants measured ok are measured again, in new runs (two of
    the four, to keep it short: the same names, the same bench keys)."""
    uri, folder = resumed["uri"], resumed["folder"]
    args = [
        a if not a.startswith("backend.options.spin_us=") else "backend.options.spin_us=0,1" for a in resumed["args"]
    ]
    sweep = Sweep(folder, *args, "tracking.resume=false")
    assert sweep.finish() == 0, sweep.text()[-6000:]
    assert sweep.leftovers() == []
    assert "reused" not in sweep.stdout
    for name in NAMES[:2]:
        assert f"  measured  {name} " in sweep.stdout
        assert len(ok_runs(uri)[name]) == 2


def test_a_sweep_whose_every_variant_is_reused_starts_no_ray(resumed, tmp_path):
    """The same command a third time: every variant ended ok before, so the sweep records its
    reuse and ends without Ray (here `import ray` fails, so a Ray start would fail the sweep)."""
    blocker = tmp_path / "no_ray" / "ray"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('this sweep should not need Ray')\n")
    path = [str(blocker.parent), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    from tests.test_faults import ROOT, SPIN

    before = {name: len(runs) for name, runs in ok_runs(resumed["uri"]).items()}
    sweep = Sweep(resumed["folder"], *resumed["args"], env={"PYTHONPATH": os.pathsep.join([*path[:1], str(SPIN), str(ROOT), *path[1:]])})
    assert sweep.finish() == 0, sweep.text()[-6000:]
    assert f"reused    {len(NAMES)} variant(s)" in sweep.stdout, sweep.stdout
    after = {name: len(runs) for name, runs in ok_runs(resumed["uri"]).items()}
    assert after == before and set(after) == set(NAMES)  # linked, not measured again
    # nothing new was measured: no plots drawn (most of such a sweep's time), the report's command instead
    parent = sweep.stdout.split("plots: python -m orchestrator.report ", 1)[1].split()[0]
    from mlflow.tracking import MlflowClient

    logged = {a.path for a in MlflowClient(tracking_uri=resumed["uri"]).list_artifacts(parent)}
    assert "summary.txt" in logged and "latency.png" not in logged, logged

"""Fault injection: what a sweep leaves behind when things break (issue 9).

Every sweep here is `python sweep.py` in a session of its own (start_new_session=True), so
"no process left" is checked on that session, Ray's processes included, not on the machine.
Faults come from the test-only `spin` backend (tests/spin_backend/: `backend.options.fault`
makes its load() raise, hang, os._exit, segfault or run out of memory), and from signals and
kill -9 sent by the tests, each when the driver's output says the moment has come (never
after a fixed sleep). Afterwards MLflow must hold every variant FINISHED, FAILED with its
cause, or KILLED, and none RUNNING.

- one sweep, one variant per fault, plus kill -9 of the healthy variant's Ray worker mid-run;
- SIGINT / SIGTERM of the driver just after Ray started and during a benchmark;
- bad input refused before any work, in one line, writing nothing outside its folder;
- two sweeps at once on one store and one export cache lose nothing (scripts/concurrency.py).
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, SHRINK, in_session, interruptible

SPIN = ROOT / "tests" / "spin_backend"
SPIN_GRID = ["model=llama", "phase=decode", "backend=spin", f"hydra.searchpath=[file://{SPIN / 'conf'}]", *SHRINK]
# The benchmark process's own clock (from its fork, or its spawn). Long enough for the healthy
# variant's benchmark on a loaded 2-core CI machine (forked from the spin runtime's server, it
# takes about a second; spawned, a Python start and numpy more), short enough for the hang to
# cost little. The hang is the sweep's longest variant: this bounds the module's duration.
TIMEOUT_S = 20
FAULTS = ("none", "raise", "hang", "exit", "segv", "oom")


# -- a sweep in a session of its own ----------------------------------------------------


def parent_of(pid: int) -> int:
    text = Path(f"/proc/{pid}/stat").read_text()
    return int(text[text.rindex(")") + 2 :].split()[1])


def cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def bench_worker(bench_pid: int) -> int:
    """The Ray worker running the benchmark whose process is `bench_pid`: its parent when
    spawned; when forked by the node's fork server (its parent then), the one worker whose
    title says it runs the bench task (one benchmark runs at a time on the node)."""
    parent = parent_of(bench_pid)
    if "tasks.worker.forks" not in cmdline(parent):
        assert "ray" in cmdline(parent).lower(), f"the benchmark's parent is not a Ray worker: {cmdline(parent)!r}"
        return parent
    session = os.getsid(bench_pid)
    workers = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if cmdline(int(proc.name)).startswith("ray::bench_entry") and os.getsid(int(proc.name)) == session:
                    workers.append(int(proc.name))
            except (OSError, ProcessLookupError):
                pass
    assert len(workers) == 1, f"not one Ray worker running the bench task: {workers}"
    return workers[0]


class Sweep:
    """`python sweep.py *args` in `cwd`, leading a session of its own; its stdout and stderr
    read line by line as they come, so a test can wait for a line (`wait_for`)."""

    def __init__(self, cwd: Path, *args: str, env: dict[str, str] | None = None, watchdog_s: float = 600):
        path = [str(SPIN), str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "sweep.py"), *args],
            cwd=cwd,
            env={**os.environ, "PWD": str(cwd), "PYTHONPATH": os.pathsep.join(path), **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # Ray's processes, its workers and the benchmarks' join this session
            preexec_fn=interruptible,  # tests send it SIGINT
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self.changed = threading.Condition()
        self.readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self.out), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True),
        ]
        for t in self.readers:
            t.start()
        self.watchdog = threading.Timer(watchdog_s, self.proc.kill)
        self.watchdog.start()

    def _read(self, stream, lines: list[str]) -> None:
        for line in stream:
            with self.changed:
                lines.append(line)
                self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    def wait_for(self, pattern: str, timeout: float = 300) -> re.Match:
        """The first stdout line matching `pattern` (re.match), waiting for it to come."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                for line in self.out:
                    if m := re.match(pattern, line):
                        return m
                if self.proc.poll() is not None and not any(t.is_alive() for t in self.readers):
                    raise AssertionError(f"the sweep ended without printing {pattern!r}:\n{self.text()[-4000:]}")
                if time.monotonic() > deadline:
                    raise AssertionError(f"no line {pattern!r} within {timeout}s:\n{self.text()[-4000:]}")
                self.changed.wait(1.0)

    def finish(self, timeout: float = 600) -> int:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:  # stuck: every thread's stack (sweep.py's SIGUSR1) in the failure
            self.proc.send_signal(signal.SIGUSR1)
            time.sleep(3)
            self.proc.kill()
            for t in self.readers:
                t.join(10)
            raise AssertionError(f"the sweep did not end within {timeout}s; its stacks then:\n{self.text()[-12000:]}") from None
        finally:
            self.watchdog.cancel()
        for t in self.readers:
            t.join(10)
        return self.proc.returncode

    def leftovers(self, grace_s: float = 20) -> list[str]:
        """What of the sweep's session outlives it, given `grace_s` to go; killed afterwards,
        so a failing test leaves nothing behind either."""
        deadline = time.monotonic() + grace_s
        while (left := in_session(self.proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.5)
        for entry in left:
            try:
                os.kill(int(entry.split()[0]), signal.SIGKILL)
            except OSError:
                pass
        return left

    @property
    def stdout(self) -> str:
        return "".join(self.out)

    @property
    def stderr(self) -> str:
        return "".join(self.err)

    def text(self) -> str:
        return self.stdout + "\n--- stderr ---\n" + self.stderr


def message(stderr: str) -> str:
    """The driver's closing message: stderr from its last line that starts with 'phasesweep:'
    (a bad config's message names each bad key on a line of its own below it)."""
    lines = stderr.rstrip().splitlines()
    starts = [i for i, ln in enumerate(lines) if ln.startswith("phasesweep: ")]
    assert starts, f"no 'phasesweep:' line on stderr:\n{stderr[-3000:]}"
    return "\n".join(lines[starts[-1] :])


def all_runs(uri: str) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    ids = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(ids, max_results=5000) if ids else []


def variant_runs(uri: str) -> dict[str, object]:
    return {r.info.run_name: r for r in all_runs(uri) if r.data.tags.get("phasesweep.role") == "variant"}


@pytest.fixture(scope="module")
def spin_export(exported):
    """The spin backend's export (format none: eager's entry) made once in the session's
    cache, before any sweep here: a sweep finds it there (a cold export under a short
    cluster.task_timeout_s would time out on a loaded machine)."""
    return exported("llama", "decode", "none")


# -- one sweep, one variant per fault -----------------------------------------------------


@pytest.fixture(scope="module")
def fault_sweep(tmp_path_factory, mlflow_db, cache_override, spin_export):
    """The sweep over every fault; while the healthy variant's benchmark loads, its Ray
    worker is killed with SIGKILL (the benchmark's process dies with it: the fork server
    kills a child whose worker hung up, a spawned one has PR_SET_PDEATHSIG), so the task is
    retried (cluster.max_retries=1). Returns (sweep, uri, killed worker pid)."""
    folder = tmp_path_factory.mktemp("faults")
    uri = mlflow_db(folder)
    pids = folder / "bench_pids.txt"
    sweep = Sweep(
        folder,
        "-m",
        *SPIN_GRID,
        cache_override,
        f"cluster.task_timeout_s={TIMEOUT_S}",
        "cluster.max_retries=1",
        f"backend.options.fault={','.join(FAULTS)}",
        env={"SPIN_PID_FILE": str(pids)},
    )
    killed: list[int] = []

    def kill_the_healthy_worker():  # polls the file spin_runtime.load() writes "pid variant" to
        while sweep.proc.poll() is None:
            lines = pids.read_text().splitlines() if pids.exists() else []
            found = [int(ln.split()[0]) for ln in lines if ln.endswith("_faultnone")]
            if found:
                worker = bench_worker(found[0])
                os.kill(worker, signal.SIGKILL)
                killed.append(worker)
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_the_healthy_worker, daemon=True)
    killer.start()
    sweep.finish()
    killer.join(5)
    left = sweep.leftovers()
    return sweep, uri, killed, left


@pytest.mark.slow
def test_every_fault_ends_its_variant_with_its_cause(fault_sweep):
    sweep, uri, _, _ = fault_sweep
    assert sweep.proc.returncode == 1, sweep.text()[-6000:]
    runs = variant_runs(uri)
    name = "llama_decode_spin_cpu_fault{}".format
    assert set(runs) == {name(f) for f in FAULTS}
    ok = runs[name("none")]
    assert ok.info.status == "FINISHED" and ok.data.tags["status"] == "ok", ok.data.tags.get("error")
    expected = {  # fault -> (failure stage, what the error tag says)
        "raise": ("load", "RuntimeError: injected fault"),
        "hang": ("benchmark", f"timed out after {TIMEOUT_S}s of its own run"),
        "exit": ("benchmark", "exited with status 3"),
        "segv": ("benchmark", "killed by SIGSEGV"),
        "oom": ("load", "MemoryError"),
    }
    for fault, (stage, says) in expected.items():
        tags = runs[name(fault)].data.tags
        assert runs[name(fault)].info.status == "FAILED", (fault, tags)
        assert tags["status"] == "failed" and tags["failure_stage"] == stage, (fault, tags)
        assert says in tags["error"] and "\n" not in tags["error"], (fault, tags["error"])
    # the sweep ends with status 1 and one line naming the failed variants
    last = sweep.stderr.strip().splitlines()[-1]
    assert last.startswith("phasesweep: 5 variant(s) failed: "), sweep.stderr[-3000:]
    assert all(name(f) in last for f in expected)
    assert "Traceback" not in sweep.stderr


@pytest.mark.slow
def test_a_fault_leaves_nothing_running(fault_sweep):
    sweep, uri, _, left = fault_sweep
    running = [r.info.run_name for r in all_runs(uri) if r.info.status == "RUNNING"]
    assert running == []
    (parent,) = [r for r in all_runs(uri) if r.data.tags.get("phasesweep.role") == "sweep"]
    assert parent.info.status == "FAILED"
    assert left == [], f"processes of the sweep's session outlived it: {left}"


@pytest.mark.slow
def test_a_killed_ray_worker_is_retried_and_recorded(fault_sweep):
    sweep, uri, killed, _ = fault_sweep
    assert killed, "the healthy variant's benchmark process was never seen"
    run = variant_runs(uri)["llama_decode_spin_cpu_faultnone"]
    assert run.data.metrics.get("retries") == 1, (run.data.metrics, run.data.tags.get("retry_causes"))
    assert run.data.tags["retry_causes"].startswith("bench: "), run.data.tags["retry_causes"]
    assert "WorkerCrashedError" in run.data.tags["retry_causes"], run.data.tags["retry_causes"]
    assert "  retry     llama_decode_spin_cpu_faultnone: bench WorkerCrashedError" in sweep.stdout
    assert run.data.tags["status"] == "ok" and run.info.status == "FINISHED"


# -- SIGINT and SIGTERM of the driver ----------------------------------------------------

STARTED = r"^phasesweep: \d+ variant\(s\)"  # the first line: Ray is up, the grid planned
EXPORTED = r"^  exported  "  # a benchmark is queued or running


@pytest.mark.slow
@pytest.mark.parametrize(
    "sig, when",
    [
        (signal.SIGINT, STARTED),
        (signal.SIGTERM, STARTED),
        (signal.SIGINT, EXPORTED),
        (signal.SIGTERM, EXPORTED),
    ],
    ids=["sigint-started", "sigterm-started", "sigint-benchmark", "sigterm-benchmark"],
)
def test_a_signal_closes_every_run_in_one_line(tmp_path, mlflow_db, cache_override, spin_export, sig, when):
    uri = mlflow_db(tmp_path)
    slow = ["bench.min_seconds=120", "bench.max_seconds=240", "bench.target_ci=0.0001"]  # never ends on its own
    sweep = Sweep(tmp_path, "-m", *SPIN_GRID, cache_override, *slow, "backend.options.spin_us=0,1")
    try:
        sweep.wait_for(when)
        assert sweep.proc.poll() is None, "the sweep ended before the signal"
        sweep.proc.send_signal(sig)
        code = sweep.finish(timeout=60)
    finally:
        left = sweep.leftovers()
    assert code == 128 + sig, sweep.text()[-4000:]
    name = "SIGINT" if sig == signal.SIGINT else "SIGTERM"
    last = sweep.stderr.strip().splitlines()[-1]
    assert last.startswith("phasesweep: ") and name in last, sweep.stderr[-3000:]
    assert "Traceback" not in sweep.stderr, sweep.stderr[-3000:]
    assert "measured" not in sweep.stdout
    runs = all_runs(uri)
    assert [r.info.run_name for r in runs if r.info.status == "RUNNING"] == []
    assert {r.info.status for r in runs} <= {"FINISHED", "FAILED", "KILLED"}
    if when == EXPORTED:  # the runs existed: both variants and their sweep end KILLED with the reason
        assert len(runs) == 3 and all(r.info.status == "KILLED" for r in runs), [
            (r.info.run_name, r.info.status) for r in runs
        ]
        assert all(r.data.tags["status"] == "aborted" for r in runs)
    assert left == [], f"processes of the signalled sweep outlived it: {left}"


@pytest.mark.slow
def test_a_dead_raylet_fails_its_variants_and_the_sweep_ends_in_one_line(tmp_path, mlflow_db):
    """The local Ray's raylet killed (as an out-of-memory kill would) while an export runs:
    every variant fails with its cause, the sweep's run ends FAILED, the driver's last line is
    its own, and nothing of the sweep is left. (Ray's core worker ends its process at its next
    call once its raylet has died: the driver, mid summary, makes none.)"""
    uri = mlflow_db(tmp_path)
    cache = f"cluster.export_cache={tmp_path / 'cache'}"  # an export of its own, to be killed during
    sweep = Sweep(tmp_path, "-m", *SPIN_GRID, cache, "backend.options.spin_us=0,1")
    try:
        raylet = None
        while sweep.proc.poll() is None and raylet is None:  # the moment a Ray worker runs the export
            session = [(int(e.split()[0]), e.split(None, 1)[1]) for e in in_session(sweep.proc.pid)]
            if any(cmdline(pid).startswith("ray::export_entry") for pid, _ in session):
                raylet = next(pid for pid, comm in session if comm == "raylet")
            time.sleep(0.02)
        assert raylet is not None, sweep.text()[-4000:]
        os.kill(raylet, signal.SIGKILL)
        code = sweep.finish(timeout=180)
    finally:
        left = sweep.leftovers()
    assert code == 1, sweep.text()[-4000:]
    assert message(sweep.stderr).startswith("phasesweep: 2 variant(s) failed"), sweep.text()[-4000:]
    assert "core worker has already been shutdown" not in sweep.stderr
    runs = all_runs(uri)
    assert {r.info.status for r in runs} == {"FAILED"}, [(r.info.run_name, r.info.status) for r in runs]
    assert all("LocalRayletDiedError" in r.data.tags["error"] for r in variant_runs(uri).values())
    assert left == [], f"processes of the sweep outlived it: {left}"


# -- bad input, refused before any work ----------------------------------------------------

BAD = {  # case -> (overrides, what the one line names)
    "dotdot-name": (["model.name=../evil"], "model.name"),
    "long-name": ([f"model.name={'x' * 300}"], "model.name"),
    "missing-checkpoint": (["model.checkpoint=/nonexistent"], "model.checkpoint"),
    "artifact-root": (["tracking.artifact_root=/proc/x"], "tracking.artifact_root"),
    "ray-address": (["cluster=ray", "cluster.address=127.0.0.1:1"], "cluster.address"),
    "tracking-server": (["tracking=server", "tracking.uri=http://127.0.0.1:1"], "tracking.uri"),
}


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory, export_cache, cache_override):
    """Every BAD case at once, each in a folder of its own inside an otherwise empty parent:
    {case: (sweep, its folder, seconds, what of its session was left)}, and under "written":
    what appeared beside those folders and beside the export cache meanwhile."""
    parent = tmp_path_factory.mktemp("bad_inputs")
    beside_cache = set(export_cache.parent.iterdir())
    started = {}
    for case, (overrides, _) in BAD.items():
        cwd = parent / case
        cwd.mkdir()
        args = [*SHRINK, cache_override, *overrides]
        if not any(o.startswith("tracking=") for o in overrides):
            args.append(f"tracking.uri=sqlite:///{cwd / 'mlflow.db'}")
        started[case] = (Sweep(cwd, *args, watchdog_s=120), cwd, time.monotonic())
    out: dict = {}
    for case, (sweep, cwd, t0) in started.items():
        sweep.finish(timeout=120)
        out[case] = (sweep, cwd, time.monotonic() - t0, sweep.leftovers(5))
    written = {p for p in parent.iterdir() if p.name not in BAD} | (set(export_cache.parent.iterdir()) - beside_cache)
    out["written"] = sorted(map(str, written))
    return out


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_line_before_any_work(bad_inputs, case):
    sweep, cwd, seconds, left = bad_inputs[case]
    assert sweep.proc.returncode not in (0, None), sweep.text()[-3000:]
    # the bound is 30 s of waiting on an address; this allows for six Pythons
    # starting at once on a loaded 2-core machine as well
    assert seconds < 60, f"{case} took {seconds:.0f}s"
    said = message(sweep.stderr)
    assert BAD[case][1] in said and len(said.splitlines()) <= 3, sweep.stderr[-3000:]
    assert "Traceback" not in sweep.stderr, sweep.stderr[-3000:]
    assert "variant(s)" not in sweep.stdout  # refused before the plan: no Ray, no run
    db = cwd / "mlflow.db"
    if case == "ray-address":  # the store is opened before Ray is joined, but no run is made
        assert not db.exists() or sqlite3.connect(db).execute("select count(*) from runs").fetchone() == (0,)
    else:
        assert not db.exists(), f"{case}: the tracking store was created before the input was refused"
    assert left == []


def test_bad_input_writes_nothing_outside_its_folder(bad_inputs):
    assert bad_inputs["written"] == []


# -- sweeps at once ----------------------------------------------------------------------


@pytest.mark.slow
def test_two_sweeps_at_once_on_one_store_lose_nothing(tmp_path, export_cache, spin_export):
    """scripts/concurrency.py with 2 sweeps: one new sqlite store (both create it and the
    experiment at once), the session's export cache, every run, metric and artifact there."""
    spec = importlib.util.spec_from_file_location("concurrency", ROOT / "scripts" / "concurrency.py")
    concurrency = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(concurrency)
    report = concurrency.run(2, 2, tmp_path, export_cache=export_cache, timeout_s=600)
    assert report["exit_codes"] == [0, 0], report["failed_sweeps"]
    assert report["lost"] == [] and report["running"] == [], report
    assert report["found"] == report["expected"]

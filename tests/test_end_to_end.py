"""The whole path: configs -> plan -> Ray (local, loopback) -> MLflow (sqlite).

- One sweep in this process (lightning-hydra-template style: configs composed with Hydra's
  compose API, `orchestrator.run.sweep.run_sweep` called directly): llama on onnxruntime and the
  executorch / torch.compile / cuda combinations, read back from MLflow.
- Process-level behaviour through `python sweep.py`: the README's grid with `-m` (exit
  status, printed summary, what MLflow holds, no process of it left behind), a failing
  single run's exit status, and Ctrl-C.

Every sweep shares the test session's export cache (conftest `cache_override`), so each
export is made once a session, and starts from an MLflow store whose tables exist.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, SHRINK, compose_jobs, in_session, interruptible

pytestmark = pytest.mark.slow
ORT = {f"{m}_{p}_onnxruntime_cpu" for m in ("llama", "phi3") for p in ("prefill", "decode")}
README_GRID = ["-m", "model=llama,phi3", "phase=prefill,decode"]
# the README grid's exports the in-process sweep does not make (its llama decode is there)
README_EXPORTS = [["model=phi3", "phase=prefill"], ["model=phi3", "phase=decode"], ["model=llama", "phase=prefill"]]
GPU = shutil.which("nvidia-smi") is not None


def runs(client):
    exp = client.get_experiment_by_name("phasesweep")
    return client.search_runs([exp.experiment_id], max_results=100)


def children(client, parent_id):
    return {r.info.run_name: r for r in runs(client) if r.data.tags.get("mlflow.parentRunId") == parent_id}


def parents(client):
    return [r for r in runs(client) if r.data.tags.get("phasesweep.role") == "sweep"]


def artifact_json(client, run_id, name):
    return json.loads(Path(client.download_artifacts(run_id, name)).read_text())


# -- in this process ------------------------------------------------------------------

INPROC = {
    "llama_decode_onnxruntime_cpu",
    "llama_decode_compile_cpu",
    "llama_decode_compile_cuda",
    "llama_decode_executorch_cpu",
    "llama_decode_executorch_cuda",
}


# torch.compile here with inductor's caches on: a cold compile in a benchmark process pinned
# to one core takes over a minute; test_executorch_compile.py compiles cold, in this process
COMPILE = ["backend=compile", "model.kv_cache=dynamic", "backend.options.cold_cache=false"]


@pytest.fixture(scope="module")
def inproc(tmp_path_factory, mlflow_db, cache_override, planned_variant):
    """One sweep run by run_sweep in this process; returns (MlflowClient, outcomes by job).
    Its jobs need not be a grid: llama decode on onnxruntime (the README sweep below has
    the whole grid), and llama decode x {compile (its cache dynamic), executorch} x {cpu,
    cuda}; its exports are made in its own Ray workers. ray is imported first, as a notebook
    may have: the scheduler must still start its local Ray, and stop it."""
    import ray
    from mlflow.tracking import MlflowClient

    from orchestrator.run.sweep import run_sweep

    # meanwhile, the README sweep's other exports in a background process: it finds them made
    planned_variant.prefetch(*README_EXPORTS)
    folder = tmp_path_factory.mktemp("inproc")
    uri = mlflow_db(folder)
    common = [cache_override, f"tracking.uri={uri}", f"tracking.artifact_root={folder / 'mlartifacts'}"]
    jobs = [["model=llama", "phase=decode", *common]]
    for device in ("cpu", "cuda"):
        jobs.append(["phase=decode", *COMPILE, f"device={device}", *common])
        jobs.append(["phase=decode", "backend=executorch", f"device={device}", *common])
    configs, overrides = compose_jobs(*jobs)
    assert not ray.is_initialized()
    try:
        outcomes = run_sweep(configs, overrides, folder / "out", "pytest: run_sweep in-process")
    finally:
        stopped = not ray.is_initialized()
        if not stopped:
            ray.shutdown()
    assert stopped, "run_sweep's Scheduler left Ray running in this process"
    # the local Ray's fork servers were this process's children, ended and removed at its stop
    left = subprocess.run(["pgrep", "-P", str(os.getpid()), "-f", "tasks.worker.forks"], capture_output=True, text=True)
    assert not left.stdout.split(), f"run_sweep left its fork servers running: {left.stdout}"
    forks_root = Path(tempfile.gettempdir()) / f"phasesweep-forks-{os.getuid()}"
    assert not list(forks_root.glob(f"driver-{os.getpid()}-*")), "run_sweep left its fork servers' folders"
    return MlflowClient(tracking_uri=uri), outcomes


@pytest.fixture(scope="module")
def inproc_runs(inproc):
    client, _ = inproc
    (parent,) = parents(client)
    return client, parent, children(client, parent.info.run_id)


def test_every_job_has_an_outcome_and_a_named_child_run(inproc_runs, inproc):
    client, parent, kids = inproc_runs
    _, outcomes = inproc
    assert set(kids) == INPROC and [outcomes[j].name for j in range(5)] == [
        "llama_decode_onnxruntime_cpu",
        "llama_decode_compile_cpu",
        "llama_decode_executorch_cpu",
        "llama_decode_compile_cuda",
        "llama_decode_executorch_cuda",
    ]
    files = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"summary.txt", "summary.json", "latency.png"} <= files
    assert parent.data.params["variants"] == "4" and parent.data.params["exports"] == "3"
    # without a GPU the compile-on-cuda variant fails (see below): the sweep's run says so
    assert parent.info.status == ("FINISHED" if GPU else "FAILED")
    assert parent.data.metrics["variants_skipped"] == 1 and parent.data.metrics["variants_ok"] == (4 if GPU else 3)
    for name, run in kids.items():
        check_child_tags(run, name)
        if not name.endswith("_cuda"):
            assert run.data.tags["status"] == "ok" and run.data.tags["parity"] == "passed"
            assert run.info.status == "FINISHED"


def check_child_tags(run, name):
    model, phase, backend, device = name.split("_")
    tags = run.data.tags
    assert (tags["model"], tags["phase"], tags["backend"], tags["device"]) == (model, phase, backend, device)
    assert tags["phasesweep.role"] == "variant" and tags["variant"] == name
    assert len(tags["code.commit"]) == 40 and tags["code.dirty"] in ("True", "False")  # run from this git checkout


def stored_model(client, run) -> str:
    """The variant's model: stored once on its sweep's run, under exports/<entry>/, where the
    variant's `model_artifact` tag points (the run holds no copy). Returns its file name."""
    parent = run.data.tags["mlflow.parentRunId"]
    uri = run.data.tags["model_artifact"]
    prefix = client.get_run(parent).info.artifact_uri + "/"
    assert uri.startswith(prefix), (uri, prefix)
    path = uri.removeprefix(prefix)
    folder, name = path.rsplit("/", 1)
    assert folder.startswith("exports/") and path in {a.path for a in client.list_artifacts(parent, folder)}
    assert not client.list_artifacts(run.info.run_id, "model")
    return name


def check_onnxruntime_child(client, run):
    """Everything an onnxruntime variant's run holds: params, metrics, tags, artifacts."""
    name = run.info.run_name
    p, m, tags = run.data.params, run.data.metrics, run.data.tags
    check_child_tags(run, name)
    assert tags["status"] == "ok" and tags["parity"] == "passed" and run.info.status == "FINISHED"
    assert p["model.kv_cache"] == "static" and p["phase.name"] == tags["phase"]
    assert p["runtime.ort_intra_op_threads"] == "1" and p["bench.threads"] == "1"
    assert "shape.input_ids" in p
    for key in (
        "latency_ms_median",
        "latency_ms_p90",
        "latency_ms_p99",
        "latency_ms_mean",
        "latency_ms_std",
        "latency_ms_min",
        "latency_ms_iqr",
        "latency_iqr_rel",
        "latency_ms_median_ci_low",
        "latency_ms_median_ci_high",
        "latency_cv",
        "iterations",
        "tokens_per_s",
        "export_seconds",
        "artifact_mb",
        "parity_max_abs_diff",
        "first_call_ms",
        "warmup_iters",
        "load_seconds",
        "peak_rss_load_mb",
        "peak_rss_mb",
    ):
        assert key in m, (name, key)
    assert m["latency_ms_median_ci_low"] <= m["latency_ms_median"] <= m["latency_ms_median_ci_high"]
    assert m["parity_max_abs_diff"] < 1e-4 and m["first_call_ms"] > 0 and m["peak_rss_load_mb"] > 0
    assert tags["unstable"] in ("True", "False") and m["unstable"] == (tags["unstable"] == "True")
    if phase_of(name) == "decode":
        assert m["achieved_bandwidth_gbs"] > 0 and m["decode_bytes_per_step"] > 0
    assert tags["env.cpu_count"] and tags["env.cpu_model"] and tags["env.version.onnxruntime"]
    assert m["parity_steps"] == (8 if phase_of(name) == "decode" else 1)
    files = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "latency_samples.json", "parity.json", "anatomy.json", "anatomy_ops.json"} <= files
    assert stored_model(client, run) == "model.onnx"
    check_anatomy(client, run)
    samples = artifact_json(client, run.info.run_id, "latency_samples.json")
    assert len(samples["samples"]) == m["iterations"] and samples["unit"] == "ns" and samples["variant"] == name
    assert samples["first_call_ns"] == pytest.approx(m["first_call_ms"] * 1e6, abs=1)
    parity = artifact_json(client, run.info.run_id, "parity.json")
    assert parity["passed"] and parity["steps"] == m["parity_steps"]
    config = Path(client.download_artifacts(run.info.run_id, "config.yaml")).read_text()
    assert f"name: {tags['model']}" in config and "hydra" not in config


def check_anatomy(client, run):
    """The artifact's anatomy on its run: headline metrics, the whole record, the op table."""
    m = run.data.metrics
    anatomy = artifact_json(client, run.info.run_id, "anatomy.json")
    assert m["anatomy_nodes"] == anatomy["nodes"] == sum(anatomy["ops"].values()) > 0
    assert m["anatomy_transposes"] == anatomy["transposes"] and m["anatomy_constant_bytes"] > 0
    table = artifact_json(client, run.info.run_id, "anatomy_ops.json")  # MLflow's table: columns and rows
    ops = {row[0]: int(row[1]) for row in table["data"]}
    assert table["columns"][:2] == ["op", "count"] and ops == anatomy["ops"]
    return anatomy


def phase_of(name: str) -> str:
    return name.split("_")[1]


def check_fresh_processes(kids, count):
    """Each benchmark ran in a process of its own that never ran an export or another benchmark,
    forked by its node's fork server (which had imported torch & co. and run no job)."""
    measured = {n: r for n, r in kids.items() if "latency_ms_median" in r.data.metrics}
    assert len(measured) == count
    assert [r.data.params["runtime.process_ran_before"] for r in measured.values()] == ["nothing"] * count
    assert [r.data.params["runtime.process_start"] for r in measured.values()] == ["forked"] * count
    assert [r.data.params["runtime.niceness"] for r in measured.values()] == ["0"] * count  # not Ray's 15
    # its server had imported every library it uses: none imported inside the job (scipy.stats
    # for the median's interval, onnx for ORT's graph were 1.5 s of each benchmark); torch.compile
    # imports its compiler's modules as it compiles, counted in its compile time
    late = {n: r.data.params["runtime.imports_after_fork"] for n, r in measured.items() if "_compile_" not in n}
    assert late and set(late.values()) == {"none"}, late
    pids = [r.data.params["runtime.pid"] for r in measured.values()]
    assert len(set(pids)) == len(pids)


def test_onnxruntime_params_metrics_and_artifacts(inproc_runs):
    client, _, kids = inproc_runs
    check_onnxruntime_child(client, kids["llama_decode_onnxruntime_cpu"])  # the README sweep: all four


def test_each_benchmark_ran_in_a_fresh_process_of_its_own(inproc_runs):
    _, _, kids = inproc_runs
    check_fresh_processes(kids, 4 if GPU else 3)


def test_executorch_through_the_whole_path(inproc_runs):
    client, _, kids = inproc_runs
    pte = kids["llama_decode_executorch_cpu"]
    assert stored_model(client, pte) == "model.pte"
    p = pte.data.params
    assert int(p["export.delegated_ops"]) > 0 and 0 < float(p["export.delegated_fraction"]) < 1
    assert p["export.delegate"] == "xnnpack" and p["runtime.xnnpack_threads"] == "1"
    assert pte.data.metrics["parity_steps"] == 8 and pte.data.tags["parity"] == "passed"
    anatomy = check_anatomy(client, pte)  # delegated and portable ops, per partition
    assert len(anatomy["partitions"]) == pte.data.metrics["anatomy_partitions"] == int(p["export.delegated_subgraphs"])
    assert 0 < pte.data.metrics["anatomy_ops_outside_delegates"] < anatomy["nodes"]  # index_put stays portable
    skipped = kids["llama_decode_executorch_cuda"]
    assert skipped.info.status == "FINISHED"
    assert skipped.data.tags["status"] == "skipped" and "device=cuda" in skipped.data.tags["skip_reason"]


def test_compile_reports_compile_time_apart_from_latency(inproc_runs):
    """torch.compile on a growing (dynamic) decode cache, inductor's caches on: the compile
    is reported on its own and no timed sample contains it (test_executorch_compile.py
    compiles prefill cold)."""
    client, _, kids = inproc_runs
    compiled = kids["llama_decode_compile_cpu"]
    m, p = compiled.data.metrics, compiled.data.params
    assert p["model.kv_cache"] == "dynamic" and m["parity_steps"] == 8 and compiled.data.tags["parity"] == "passed"
    assert m["compile_seconds"] > 0 and m["latency_ms_median"] < 1000 * m["compile_seconds"]
    assert p["runtime.compile_cold_cache"] == "False" and p["runtime.compile_dynamic_cache"] == "True"
    samples = artifact_json(client, compiled.info.run_id, "latency_samples.json")["samples"]
    assert max(samples) / 1e9 < m["compile_seconds"]  # no sample contains the compile
    assert "model_artifact" not in compiled.data.tags  # no artifact: it runs the graph module


def test_a_variant_needing_a_gpu_fails_at_once_without_one(inproc_runs, inproc):
    """compile supports cuda, so it is planned; without a GPU it fails at once, never waits."""
    _, _, kids = inproc_runs
    _, outcomes = inproc
    on_cuda = kids["llama_decode_compile_cuda"]
    if GPU:
        assert on_cuda.info.status == "FINISHED"
        return
    assert on_cuda.info.status == "FAILED" and on_cuda.data.tags["failure_stage"] == "schedule"
    assert "no node of this Ray cluster has one" in on_cuda.data.tags["error"]
    assert "export_seconds" not in on_cuda.data.metrics
    assert [o.name for o in outcomes.values() if o.status == "failed"] == ["llama_decode_compile_cuda"]


# -- through `python sweep.py` ---------------------------------------------------------


def sweep_process(cwd: Path, *args: str, **popen) -> subprocess.Popen:
    """`python sweep.py *args` in `cwd` (Hydra's run and sweep dirs follow $PWD: set it too)."""
    return subprocess.Popen(
        [sys.executable, str(ROOT / "sweep.py"), *args],
        cwd=cwd,
        env={**os.environ, "PWD": str(cwd)},
        text=True,
        **popen,
    )


def sweep(cwd: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    proc = sweep_process(cwd, *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, mlflow_db):
    folder = tmp_path_factory.mktemp("sweep")
    mlflow_db(folder)  # the default tracking store of a sweep run there: <cwd>/mlflow.db
    return folder


@pytest.fixture(scope="module")
def readme_sweep(workdir, cache_override, planned_variant):
    """`python sweep.py -m model=llama,phi3 phase=prefill,decode`, shrunk, leading a session
    of its own. Returns (the finished process with its output, what its session held while
    it ran, what of it is still alive afterwards, given a few seconds to go)."""
    for job in README_EXPORTS:  # made meanwhile in the background (or now): all its exports are cache hits
        planned_variant(*job)
    proc = sweep_process(
        workdir,
        *README_GRID,
        *SHRINK,
        cache_override,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # Ray's processes, its workers and the benchmarks' join this session
    )
    watchdog = threading.Timer(600, proc.kill)
    watchdog.start()
    lines, during = [], []
    try:
        for line in proc.stdout:
            lines.append(line)
            if not during and line.startswith("  exported  "):  # Ray is up, an export returned
                during = in_session(proc.pid)
        proc.wait()
    finally:
        watchdog.cancel()
    deadline = time.monotonic() + 15
    while (left := in_session(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "".join(lines)), during, left


@pytest.fixture(scope="module")
def client(workdir, readme_sweep):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{workdir / 'mlflow.db'}")


def test_the_readme_grid_prints_its_summary_and_ui_command(readme_sweep, workdir):
    proc, _, _ = readme_sweep
    assert proc.returncode == 0, proc.stdout[-6000:]
    out = proc.stdout
    for name in ORT:
        assert re.search(rf"^  measured  {name} ", out, re.M) and re.search(rf"^{name} ", out, re.M)
    for column in ("variant", "inputs", "median_ms", "tokens_per_s", "parity_max_diff", "status"):
        assert column in out
    assert "input_ids[2,1] pos[1] kv 4x[2,2,32,16]" in out  # SHRINK's decode: batch 2, 24 + 8 slots
    assert f"mlflow ui --backend-store-uri sqlite:///{workdir / 'mlflow.db'}" in out
    assert (workdir / "multirun").is_dir()  # Hydra's sweep dir follows $PWD: the test's folder, not the repo


def test_the_readme_grid_is_one_parent_and_a_child_per_variant(client):
    (parent,) = parents(client)
    assert parent.info.status == "FINISHED" and parent.data.tags["status"] == "ok"
    assert {"summary.txt", "summary.json", "latency.png"} <= {a.path for a in client.list_artifacts(parent.info.run_id)}
    kids = children(client, parent.info.run_id)
    assert set(kids) == ORT
    for run in kids.values():
        check_onnxruntime_child(client, run)
    check_fresh_processes(kids, 4)


def test_ray_left_nothing_running(readme_sweep):
    """Nothing the sweep started (Ray's GCS, raylet, workers, benchmark processes) outlives it:
    its own session is checked, not the machine, where other sweeps may run."""
    _, during, left = readme_sweep
    held = {p.split(" ", 1)[1] for p in during}
    assert {"gcs_server", "raylet"} <= held, f"the check would see nothing: the session held {during}"
    assert left == [], f"processes of the sweep's session outlived it: {left}"


def test_a_failing_single_run_is_recorded_and_exits_nonzero(workdir, client, readme_sweep, cache_override):
    before = {r.info.run_id for r in runs(client)}
    # no -m: a sweep of one (overrides after SHRINK win)
    proc = sweep(workdir, *SHRINK, cache_override, "phase=decode", "bench.parity_atol=0")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "1 variant(s) failed: llama_decode_onnxruntime_cpu" in proc.stderr
    assert "FAILED    llama_decode_onnxruntime_cpu" in proc.stdout and "(cache hit)" in proc.stdout
    assert "Traceback" not in proc.stderr  # one line, not Hydra's traceback of a job
    new = [r for r in runs(client) if r.info.run_id not in before]
    (parent,) = [r for r in new if r.data.tags.get("phasesweep.role") == "sweep"]
    (run,) = children(client, parent.info.run_id).values()
    assert parent.info.status == "FAILED" and run.info.status == "FAILED"
    assert run.data.tags["status"] == "failed" and run.data.tags["failure_stage"] == "parity"
    assert run.data.tags["parity"] == "failed" and run.data.tags["export_cache_hit"] == "True"
    assert "atol 0" in run.data.tags["error"]
    assert before <= {r.info.run_id for r in runs(client)}  # the first sweep's runs are all still there


def test_ctrl_c_closes_every_open_run_and_keeps_what_was_logged(tmp_path, mlflow_db, cache_override):
    """Interrupted mid-sweep: runs already ended keep their results, open ones end KILLED
    with the reason, none is left RUNNING. Each benchmark takes >= 30 s, so the sweep cannot
    end on its own before the interrupt; the interrupt is sent once both exports are in."""
    from mlflow.tracking import MlflowClient

    uri = mlflow_db(tmp_path)
    names = ["llama_prefill_onnxruntime_cpu", "llama_decode_onnxruntime_cpu"]
    slow = ["bench.min_seconds=30", "bench.max_seconds=60"]
    proc = sweep_process(
        tmp_path,
        "-m",
        *SHRINK,
        cache_override,
        "phase=prefill,decode",
        *slow,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=interruptible,  # it gets SIGINT
    )
    try:
        waiting, seen = set(names), []
        for line in proc.stdout:  # the driver's progress lines, as they come
            seen.append(line)
            match = re.match(r"^  exported  (\S+)", line)
            if match:
                waiting.discard(match.group(1))
                if not waiting:
                    break
        assert not waiting, "".join(seen)[-3000:]
        assert proc.poll() is None, "the sweep ended before the interrupt"
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the driver leads its session: it and its Ray
            proc.wait()
    assert proc.returncode == 130, "".join(seen)[-3000:] + rest[-3000:]  # != 0, and the exit of an interrupt
    assert "phasesweep: interrupted (SIGINT)" in rest
    assert "measured" not in "".join(seen) + rest  # it was interrupted, not finished
    deadline = time.monotonic() + 15
    while (left := in_session(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == [], f"processes of the interrupted sweep outlived it: {left}"
    client = MlflowClient(tracking_uri=uri)
    all_runs = runs(client)
    assert len(all_runs) == 3  # the sweep and its two variants
    assert not [r for r in all_runs if r.info.status == "RUNNING"]
    killed = [r for r in all_runs if r.info.status == "KILLED"]
    assert len(killed) == 3 and all(r.data.tags["status"] == "aborted" for r in killed)
    assert all("KeyboardInterrupt" in r.data.tags["error"] for r in killed)
    exported = [r for r in all_runs if "export_seconds" in r.data.metrics]
    assert {r.info.run_name for r in exported} == set(names)  # what was logged before the interrupt stays

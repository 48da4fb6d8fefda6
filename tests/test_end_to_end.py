"""The whole path: Hydra -> our launcher -> Ray (local, loopback) -> MLflow (sqlite).

One module-scoped sweep of the README's grid on tiny models; the tests read back what
MLflow holds. A second, single run (no -m) in the same folder fails parity on purpose:
it must exit non-zero, record the failure, reuse the export cache and lose nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow
FAST = ["bench.min_iters=10", "bench.min_seconds=0.1", "bench.warmup_max_seconds=1", "bench.threads=1"]
NAMES = {
    "llama_prefill_onnxruntime_cpu",
    "llama_decode_onnxruntime_cpu",
    "phi3_prefill_onnxruntime_cpu",
    "phi3_decode_onnxruntime_cpu",
}


def sweep(cwd, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "sweep.py"), *args], cwd=cwd, capture_output=True, text=True, timeout=900
    )


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("sweep")


@pytest.fixture(scope="module")
def first_sweep(workdir):
    proc = sweep(workdir, "-m", "model=llama,phi3", "phase=prefill,decode", *FAST)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def client(workdir, first_sweep):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{workdir / 'mlflow.db'}")


def runs(client):
    exp = client.get_experiment_by_name("phasesweep")
    return client.search_runs([exp.experiment_id], max_results=100)


def children(client, parent_id):
    return {r.info.run_name: r for r in runs(client) if r.data.tags.get("mlflow.parentRunId") == parent_id}


def test_summary_table_and_ui_command_are_printed(first_sweep, workdir):
    out = first_sweep.stdout
    for name in NAMES:
        assert name in out
    for column in ("variant", "inputs", "median_ms", "tokens_per_s", "parity_max_diff", "status"):
        assert column in out
    assert "input_ids[1,1] pos[1] kv 4x[1,2,136,16]" in out
    assert f"mlflow ui --backend-store-uri sqlite:///{workdir / 'mlflow.db'}" in out


def test_one_parent_and_a_named_child_per_variant(client):
    parents = [r for r in runs(client) if r.data.tags.get("phasesweep.role") == "sweep"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    files = {a.path for a in client.list_artifacts(parents[0].info.run_id)}
    assert {"summary.txt", "summary.json", "latency.png"} <= files
    kids = children(client, parents[0].info.run_id)
    assert set(kids) == NAMES
    for name, run in kids.items():
        model, phase, backend, device = name.split("_")
        tags = run.data.tags
        assert (tags["model"], tags["phase"], tags["backend"], tags["device"]) == (model, phase, backend, device)
        assert tags["status"] == "ok" and tags["parity"] == "passed" and run.info.status == "FINISHED"


def test_child_params_metrics_and_artifacts(client):
    parent = next(r for r in runs(client) if r.data.tags.get("phasesweep.role") == "sweep")
    for name, run in children(client, parent.info.run_id).items():
        p, m = run.data.params, run.data.metrics
        assert p["model.kv_cache"] == "static" and p["phase.name"] == run.data.tags["phase"]
        assert p["runtime.ort_intra_op_threads"] == "1"
        assert "shape.input_ids" in p
        for key in (
            "latency_ms_median",
            "latency_ms_p90",
            "latency_ms_p99",
            "latency_ms_mean",
            "latency_ms_std",
            "tokens_per_s",
            "export_seconds",
            "artifact_mb",
            "parity_max_abs_diff",
        ):
            assert key in m, (name, key)
        assert m["parity_max_abs_diff"] < 1e-4
        for key in ("latency_ms_min", "latency_cv", "first_call_ms", "warmup_iters", "load_seconds", "peak_rss_mb"):
            assert key in m, (name, key)
        assert run.data.tags["unstable"] in ("True", "False") and m["unstable"] == (run.data.tags["unstable"] == "True")
        if "decode" in name:
            assert m["achieved_bandwidth_gbs"] > 0 and m["decode_bytes_per_step"] > 0
        tags = run.data.tags
        assert tags["env.cpu_count"] and tags["env.cpu_model"] and tags["env.version.onnxruntime"]
        assert len(tags["git_commit"]) in (40, 7) or tags["git_commit"] == "unknown"
        assert m["parity_steps"] == (8 if "decode" in name else 1)
        files = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"config.yaml", "latency_samples.json", "parity.json", "model"} <= files
        assert [a.path for a in client.list_artifacts(run.info.run_id, "model")] == ["model/model.onnx"]
        samples = json.loads(open(client.download_artifacts(run.info.run_id, "latency_samples.json")).read())
        assert len(samples["samples"]) == m["iterations"]
        config = open(client.download_artifacts(run.info.run_id, "config.yaml")).read()
        assert f"name: {run.data.tags['model']}" in config and "hydra" not in config


def test_each_benchmark_ran_in_its_own_worker_process(client):
    parent = next(r for r in runs(client) if r.data.tags.get("phasesweep.role") == "sweep")
    pids = [r.data.params["runtime.pid"] for r in children(client, parent.info.run_id).values()]
    assert len(set(pids)) == len(pids) == 4


def test_ray_left_nothing_running(first_sweep):
    leftover = subprocess.run(["pgrep", "-f", "gcs_server|raylet"], capture_output=True, text=True)
    assert leftover.stdout.strip() == "", "Ray processes outlived the sweep"


def test_a_failing_single_run_is_recorded_and_exits_nonzero(workdir, client, first_sweep):
    before = {r.info.run_id for r in runs(client)}
    proc = sweep(workdir, "phase=decode", "bench.parity_atol=0", *FAST)  # no -m: a sweep of one
    assert proc.returncode == 1
    assert "1 variant(s) failed: llama_decode_onnxruntime_cpu" in proc.stderr
    assert "FAILED parity" in proc.stdout and "(cache hit)" in proc.stdout
    new = [r for r in runs(client) if r.info.run_id not in before]
    parent = next(r for r in new if r.data.tags.get("phasesweep.role") == "sweep")
    (run,) = children(client, parent.info.run_id).values()
    assert parent.info.status == "FAILED" and run.info.status == "FAILED"
    assert run.data.tags["status"] == "failed" and run.data.tags["failure_stage"] == "parity"
    assert run.data.tags["export_cache_hit"] == "True"
    assert "atol 0" in run.data.tags["error"]
    assert before <= {r.info.run_id for r in runs(client)}  # the first sweep's runs are all still there


def test_ctrl_c_closes_every_open_run_and_keeps_what_was_logged(tmp_path):
    """Interrupted mid-sweep: runs already ended keep their results, open ones end KILLED
    with the reason, none is left RUNNING."""
    import signal

    from mlflow.tracking import MlflowClient

    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "sweep.py"),
            "-m",
            "model=llama,phi3",
            "phase=prefill,decode",
            *FAST,
            "bench.min_seconds=30",
            "bench.max_seconds=30",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    for line in proc.stdout:  # wait until a benchmark is under way
        if "exported" in line:
            break
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=300)
    assert proc.returncode != 0
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    all_runs = runs(client)
    assert len(all_runs) == 5
    assert not [r for r in all_runs if r.info.status == "RUNNING"]
    killed = [r for r in all_runs if r.info.status == "KILLED"]
    assert killed and all(r.data.tags["status"] == "aborted" for r in killed)
    assert all("KeyboardInterrupt" in r.data.tags["error"] for r in killed)
    exported = [r for r in all_runs if "export_seconds" in r.data.metrics]
    assert exported  # what was logged before the interrupt is still there


def test_executorch_and_compile_through_the_whole_path(tmp_path):
    import shutil

    from mlflow.tracking import MlflowClient

    proc = sweep(tmp_path, "-m", "model=llama", "phase=decode", "backend=compile,executorch", "device=cpu,cuda", *FAST)
    gpu = shutil.which("nvidia-smi") is not None
    assert proc.returncode == (0 if gpu else 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "skipped   llama_decode_executorch_cuda: backend executorch does not run on device=cuda" in proc.stdout
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    by_name = {r.info.run_name: r for r in runs(client)}
    pte = by_name["llama_decode_executorch_cpu"]
    assert [a.path for a in client.list_artifacts(pte.info.run_id, "model")] == ["model/model.pte"]
    assert int(pte.data.params["export.delegated_ops"]) > 0 and "export.delegated_fraction" in pte.data.params
    assert pte.data.metrics["parity_steps"] == 8 and pte.data.tags["parity"] == "passed"
    compiled = by_name["llama_decode_compile_cpu"]
    assert compiled.data.metrics["compile_seconds"] > 1.0
    assert compiled.data.params["runtime.compile_cold_cache"] == "True"
    skipped = by_name["llama_decode_executorch_cuda"]
    assert skipped.data.tags["status"] == "skipped" and "device=cuda" in skipped.data.tags["skip_reason"]
    # compile supports cuda, so it is planned; without a GPU it fails at once, never waits
    on_cuda = by_name["llama_decode_compile_cuda"]
    if not gpu:
        assert on_cuda.info.status == "FAILED" and on_cuda.data.tags["failure_stage"] == "schedule"
        assert "no node of this Ray cluster has one" in on_cuda.data.tags["error"]
        assert "1 variant(s) failed: llama_decode_compile_cuda" in proc.stderr


def test_a_benchmark_no_node_can_host_is_refused_before_any_run(tmp_path):
    import os

    too_many = (os.cpu_count() or 1) * 8
    proc = sweep(tmp_path, f"bench.threads={too_many}")
    assert proc.returncode != 0
    assert f"bench.threads={too_many} exceeds the" in proc.stderr
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("phasesweep")
    assert exp is None or not client.search_runs([exp.experiment_id])

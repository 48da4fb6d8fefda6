"""A sweep's state transitions, without Ray or MLflow: orchestrator.run.sweep_run.SweepRun driven by
hand (and run_sweep with a scripted scheduler) against a tracker that keeps every run in
memory and refuses what MLflow would refuse or what the driver must never do (logging into
an ended run, ending a run twice, changing a param)."""

from __future__ import annotations

import json
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator.common.outcome import Status
from orchestrator.run.sweep_run import SweepRun
from tasks.specs import BenchResult, ExportResult, Failure
from tests.conftest import capacity, compose_jobs, plan_jobs

A = "llama_prefill_onnxruntime_cpu"
B = "llama_decode_onnxruntime_cpu"
EAGER = "llama_decode_eager_cpu"
COMPILE = "llama_decode_compile_cpu"
COMPILE_CUDA = "llama_decode_compile_cuda"  # planned, but no node has a GPU: fails at start
SKIPPED = "llama_decode_executorch_cuda"  # executorch does not run on cuda: skipped when planned
JOBS = [
    ["phase=prefill"],
    ["phase=decode"],
    ["phase=decode", "backend=eager"],
    ["phase=decode", "backend=compile"],
    ["phase=decode", "backend=compile", "device=cuda"],
    ["phase=decode", "backend=executorch", "device=cuda"],
]


@dataclass
class FakeRun:
    name: str
    parent: str | None
    tags: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    files: dict[str, Any] = field(default_factory=dict)  # logged text/dicts by name
    artifacts: list[tuple[str, str | None]] = field(default_factory=list)  # (file name, artifact_path)
    series: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # step metrics: name -> (step, value)
    status: str = "RUNNING"


class FakeTracker:
    """orchestrator.record.tracking.Tracker's interface, in memory. `earlier`: what finished_ok()
    finds (bench key -> an earlier sweep's run); `orphan_ids`: runs orphans() reports."""

    uri = "fake://tracker"
    experiment_id = "0"

    def __init__(self, earlier=None):
        self.runs: dict[str, FakeRun] = {}
        self.earlier = earlier or {}
        self.orphan_ids: list[str] = []

    def connected(self):
        return self

    def _new(self, name: str, parent: str | None) -> str:
        run_id = f"run{len(self.runs)}"
        self.runs[run_id] = FakeRun(name, parent)
        return run_id

    def _open(self, run_id: str) -> FakeRun:
        run = self.runs[run_id]
        assert run.status == "RUNNING", f"{run.name}: written after it ended {run.status}"
        return run

    def start_sweep(self, name, params, tags):
        run_id = self._new(name, None)
        self.log(run_id, params=params, tags=tags)
        return run_id

    def start_variant(self, parent, name, tags, params, config_yaml):
        assert parent in self.runs
        run_id = self._new(name, parent)
        self.log(run_id, params=params, tags=tags)
        self.log_text(run_id, config_yaml, "config.yaml")
        return run_id

    def log(self, run_id, metrics=None, params=None, tags=None, series=None):
        run = self._open(run_id)
        for k, points in (series or {}).items():
            run.series.setdefault(k, []).extend(points)
        run.metrics.update({k: float(v) for k, v in (metrics or {}).items() if v is not None})
        for k, v in (params or {}).items():  # MLflow refuses to change a logged param
            assert run.params.setdefault(k, str(v)) == str(v), f"{run.name}: param {k} changed"
        run.tags.update({k: str(v) for k, v in (tags or {}).items()})

    def log_dict(self, run_id, obj, name, indent=1):
        self._open(run_id).files[name] = json.loads(json.dumps(obj, default=str))

    def log_text(self, run_id, text, name):
        self._open(run_id).files[name] = text

    def log_table(self, run_id, rows, name):
        self._open(run_id).files[name] = rows

    def artifact(self, run_id, path, artifact_path=None, link=False):
        assert Path(path).is_file()
        self._open(run_id).artifacts.append((Path(path).name, artifact_path))

    def artifact_uri(self, run_id):
        return f"fake://{run_id}/artifacts"

    def end(self, run_id, status):
        self._open(run_id).status = status

    def log_failure(self, run_id, stage, error, traceback):
        self.log(run_id, tags={"status": "failed", "failure_stage": stage, "error": error})
        if traceback:
            self.log_text(run_id, traceback, "error.txt")

    def series(self, run):
        return {}  # the earlier runs these tests reuse logged no depth series

    def finished_ok(self):
        return self.earlier

    def orphans(self, heartbeat_timeout_s):
        return [
            (mlflow_run(run_id, self.runs[run_id].name), "its driver (pid 1 on elsewhere) is gone")
            for run_id in self.orphan_ids
        ]

    # -- reading back -------------------------------------------------------------------
    def parent(self) -> FakeRun:
        (run,) = [r for r in self.runs.values() if r.parent is None]
        return run

    def by_name(self) -> dict[str, FakeRun]:
        return {r.name: r for r in self.runs.values() if r.parent is not None}


class FakeScheduler:
    """orchestrator.run.scheduler.Scheduler's interface: records submissions; `results()`
    answers each queued task with `respond(kind, key, spec)`."""

    seed = 1234  # the benchmarks' random order, recorded on the sweep's run
    own_local = False  # as a joined cluster: a fully reused sweep still runs here

    def __init__(self, respond=None, cap=None):
        self.capacity = cap or capacity()
        self.respond = respond
        self.submitted: list[tuple[str, str, Any, Any]] = []
        self.queue: list[tuple[str, str, Any]] = []
        self.started = self.stopped = False
        self.running: dict[Any, Any] = {}  # tasks Ray holds now: none, every result is answered at once
        self.servers: dict[str, tuple[str, ...]] | None = None

    def start(self):
        self.started = True

    def stop(self):
        self.stopped = True

    @contextmanager
    def stopping(self):
        self.stop()
        yield

    def holds(self, spec):
        return False  # no export in its cache: the plan's every format gets the export server

    def reserve(self, export_dir):
        pass

    def release(self, export_dir):
        pass

    def start_fork_servers(self, servers):
        assert not self.started, "a local Ray's fork servers start before Ray does"
        self.servers = servers

    def export_folder(self, planned, made):
        return Path(made)  # a local Ray: the entry where the export made it

    def submit(self, kind, key, spec, request):
        self.submitted.append((kind, key, spec, request))
        self.queue.append((kind, key, spec))

    def results(self):
        while self.queue:
            kind, key, spec = self.queue.pop(0)
            yield kind, key, self.respond(kind, key, spec)


def mlflow_run(run_id: str, name: str, **metrics):
    """What MlflowClient.search_runs returns of a run, as far as the driver reads it."""
    return SimpleNamespace(
        info=SimpleNamespace(run_id=run_id, run_name=name),
        data=SimpleNamespace(metrics=metrics, params={"shape.input_ids": "[2, 16]"}, tags={"unstable": "False"}),
    )


def export_ok(key: str, out: Path, artifact: bool = True) -> ExportResult:
    out.mkdir(parents=True, exist_ok=True)
    path = None
    if artifact:
        path = out / "model.onnx"
        path.write_bytes(b"graph")
        (out / "model.onnx.data").write_bytes(b"weights")
    return ExportResult(
        key=key,
        out_dir=str(out),
        ok=True,
        cache_hit=False,
        artifact=str(path) if path else None,
        export_seconds=1.5,
        artifact_mb=0.5,
        input_shapes={"input_ids": [2, 16]},
        details={"opset": 18},
    )


def bench_ok(name: str, unstable: bool = False) -> BenchResult:
    samples = [1_000_000 + 1000 * i for i in range(7)]
    return BenchResult(
        variant=name,
        ok=True,
        metrics={
            "latency_ms_median": 1.003,
            "latency_ms_p90": 1.005,
            "latency_iqr_rel": 0.3 if unstable else 0.01,
            "iterations": len(samples),
            "parity_max_abs_diff": 1e-6,
            "parity_steps": 1,
            "unstable": float(unstable),
        },
        params={"pid": 4242, "process_ran_before": "nothing", "ort_intra_op_threads": 1},
        parity={"steps": 1, "max_abs_diff": 1e-6, "passed": True},
        samples_ns=samples,
        first_call_ns=5_000_000,
        env={"cpu_count": "2"},
    )


def parity_failed(name: str) -> BenchResult:
    result = bench_ok(name)
    result.ok = False
    result.metrics = {"parity_max_abs_diff": 0.5, "parity_steps": 8, "load_seconds": 0.1}
    result.parity = {"steps": 8, "max_abs_diff": 0.5, "passed": False}
    result.samples_ns, result.first_call_ns = [], 0
    result.failure = Failure("parity", "logits differ from eager by 0.5 (atol 0)")
    return result


@pytest.fixture(scope="module")
def plan():
    return plan_jobs(*JOBS)  # final when made: the tests share it


@pytest.fixture
def sweep(plan, tmp_path):
    tracker, sched = FakeTracker(), FakeScheduler()
    run = SweepRun(plan, tmp_path / "out", tracker, sched)
    run.record_plan("python sweep.py -m ...")
    return run, tracker, sched


def key_of(plan, name: str) -> str:
    return plan.variant(name).export_key


def test_the_plan_under_test(plan):
    assert [pv.name for pv in plan.variants] == [A, B, EAGER, COMPILE, COMPILE_CUDA]
    assert [s.name for s in plan.skipped] == [SKIPPED]
    assert len(plan.exports) == 3 and key_of(plan, EAGER) == key_of(plan, COMPILE) == key_of(plan, COMPILE_CUDA)


def test_record_plan_opens_a_run_per_variant_and_ends_skipped_ones(sweep, plan):
    run, tracker, _ = sweep
    parent = tracker.parent()
    assert parent.name.startswith("sweep_") and parent.status == "RUNNING"
    assert parent.params == {
        "command": "python sweep.py -m ...",
        "variants": "5",
        "skipped": "1",
        "exports": "3",
        "bench_order_seed": "1234",
    }
    assert {"code.commit", "code.dirty", "host", "out_dir"} <= set(parent.tags)  # the worktree is a git checkout
    kids = tracker.by_name()
    assert set(kids) == {A, B, EAGER, COMPILE, COMPILE_CUDA, SKIPPED}
    for pv in plan.variants:
        child = kids[pv.name]
        model, phase, backend, device = pv.name.split("_")
        assert child.parent == run.parent and child.status == "RUNNING"
        assert (child.tags["model"], child.tags["phase"], child.tags["backend"], child.tags["device"]) == (
            model,
            phase,
            backend,
            device,
        )
        assert child.tags["status"] == "planned"
        assert child.tags["export_key"] == pv.export_key and child.tags["bench_key"] == pv.variant.bench_key
        assert (
            child.tags["overrides"] == " ".join(pv.variant.overrides) and "bench.threads=1" in child.tags["overrides"]
        )
        assert child.tags["code.commit"] == parent.tags["code.commit"]
        assert child.params["phase.name"] == phase and child.params["bench.min_iters"] == "5"
        assert f"name: {model}" in child.files["config.yaml"] and "hydra" not in child.files["config.yaml"]
        assert run.outcomes[pv.name].status == Status.PLANNED
    skipped = kids[SKIPPED]
    assert skipped.status == "FINISHED" and skipped.tags["status"] == "skipped"
    assert "does not run on device=cuda" in skipped.tags["skip_reason"]
    (outcome,) = [o for o in run.outcomes.values() if o.name == SKIPPED]
    assert outcome.status == Status.SKIPPED and outcome.ended


def test_start_fails_what_no_node_can_run_and_queues_each_export_once(sweep, plan):
    run, tracker, sched = sweep
    run.start()
    cuda = tracker.by_name()[COMPILE_CUDA]
    assert cuda.status == "FAILED" and cuda.tags["status"] == "failed"
    assert cuda.tags["failure_stage"] == "schedule" and "needs a GPU" in cuda.tags["error"]
    assert [(kind, key) for kind, key, _, _ in sched.submitted] == [("export", k) for k in plan.exports]
    for _, key, spec, request in sched.submitted:
        assert spec is plan.exports[key].spec and request is plan.exports[key].request


def test_an_export_whose_variants_all_ended_is_not_queued(tmp_path):
    plan = plan_jobs(JOBS[4])  # compile on cuda, no GPU: it fails at start, nobody needs its export
    tracker, sched = FakeTracker(), FakeScheduler()
    run = SweepRun(plan, tmp_path, tracker, sched)
    run.record_plan("cmd")
    run.start()
    assert sched.submitted == [] and tracker.by_name()[COMPILE_CUDA].status == "FAILED"


def test_an_export_logs_shapes_and_model_and_queues_the_benchmark(sweep, plan, tmp_path):
    run, tracker, sched = sweep
    run.start()
    run.on_export(key_of(plan, A), export_ok(key_of(plan, A), tmp_path / "a"))
    child = tracker.by_name()[A]
    assert child.status == "RUNNING" and child.tags["status"] == "running"
    assert child.metrics == {"export_seconds": 1.5, "artifact_mb": 0.5}
    assert child.params["shape.input_ids"] == "[2, 16]" and child.params["export.opset"] == "18"
    assert child.tags["export_cache_hit"] == "False" and child.tags["export_dir"] == str(tmp_path / "a")
    assert child.artifacts == []  # the model is stored once, on the sweep's run
    entry = f"exports/{Path(plan.exports[key_of(plan, A)].spec.out_dir).name}"
    assert tracker.parent().artifacts == [("model.onnx", entry), ("model.onnx.data", entry)]
    assert child.tags["model_artifact"] == f"fake://{run.parent}/artifacts/{entry}/model.onnx"
    assert run.outcomes[A].status == Status.RUNNING and run.outcomes[A].shapes == {"input_ids": [2, 16]}
    kind, key, spec, request = sched.submitted[-1]
    assert (kind, key) == ("bench", f"{A}#0") and spec is plan.variant(A).bench and request is plan.variant(A).request


def test_an_exports_anatomy_goes_to_its_variant_as_metrics_a_record_and_a_table(sweep, plan, tmp_path):
    from tasks.export._anatomy import summary

    run, tracker, _ = sweep
    run.start()
    result = export_ok(key_of(plan, A), tmp_path / "a")
    result.anatomy = summary(Counter({"Transpose": 2, "MatMul": 3}), Counter(), [], 1024, 5)
    run.on_export(key_of(plan, A), result)
    child = tracker.by_name()[A]
    assert child.metrics["anatomy_nodes"] == 5 and child.metrics["anatomy_transposes"] == 2
    assert child.metrics["anatomy_constant_bytes"] == 1024 and child.metrics["anatomy_partitions"] == 0
    assert child.files["anatomy.json"] == result.anatomy
    assert child.files["anatomy_ops.json"] == [{"op": "MatMul", "count": 3}, {"op": "Transpose", "count": 2}]


def test_variants_sharing_an_export_reference_the_one_stored_model(tmp_path):
    """The cpu and cuda variants of one ONNX file: it is stored once, both runs point at it."""
    plan = plan_jobs(["phase=decode"], ["phase=decode", "device=cuda"], cap=capacity(gpus=1))
    ((key, job),) = plan.exports.items()
    assert len(job.variants) == 2
    tracker = FakeTracker()
    run = SweepRun(plan, tmp_path, tracker, FakeScheduler())
    run.record_plan("cmd")
    run.start()
    run.on_export(key, export_ok(key, tmp_path / "a"))
    assert [name for name, _ in tracker.parent().artifacts] == ["model.onnx", "model.onnx.data"]
    tags = [tracker.by_name()[name].tags for name in job.variants]
    assert all(not tracker.by_name()[name].artifacts for name in job.variants)
    assert tags[0]["model_artifact"] == tags[1]["model_artifact"]
    assert tags[0]["model_artifact"].endswith(f"/exports/{Path(job.spec.out_dir).name}/model.onnx")


def test_a_model_larger_than_max_model_mb_is_named_not_copied(tmp_path):
    plan = plan_jobs([*JOBS[0], "tracking.max_model_mb=0.1"])
    tracker = FakeTracker()
    run = SweepRun(plan, tmp_path, tracker, FakeScheduler())
    run.record_plan("cmd")
    run.start()
    run.on_export(key_of(plan, A), export_ok(key_of(plan, A), tmp_path / "a"))
    child = tracker.by_name()[A]
    assert child.artifacts == [] and tracker.parent().artifacts == []
    assert " MB > tracking.max_model_mb=0.1; the model is in " in child.tags["model_not_logged"]
    assert str(tmp_path / "a") in child.tags["model_not_logged"]


@pytest.mark.parametrize("as_result", [False, True], ids=["failure", "failed-result"])
def test_a_failed_export_fails_every_variant_sharing_it(sweep, plan, as_result):
    run, tracker, sched = sweep
    run.start()
    failure = Failure("export", "RuntimeError: boom", "Traceback (most recent call last): ...")
    key = key_of(plan, EAGER)
    result = ExportResult(key, "/nowhere", ok=False, failure=failure) if as_result else failure
    run.on_export(key, result)
    kids = tracker.by_name()
    for name in (EAGER, COMPILE):
        assert kids[name].status == "FAILED" and run.outcomes[name].status == Status.FAILED
        assert kids[name].tags["failure_stage"] == "export" and kids[name].tags["error"] == "RuntimeError: boom"
        assert kids[name].files["error.txt"].startswith("Traceback")
    assert kids[COMPILE_CUDA].tags["failure_stage"] == "schedule"  # failed before; not failed twice
    assert not [s for s in sched.submitted if s[0] == "bench"]
    assert kids[A].status == kids[B].status == "RUNNING"  # other exports' variants carry on


def test_benchmarks_end_finished_or_failed_and_the_summary_is_logged(sweep, plan, tmp_path):
    run, tracker, _ = sweep
    run.start()
    for name in (A, B, EAGER):
        key = key_of(plan, name)
        run.on_export(key, export_ok(key, tmp_path / key[:8], artifact=name != EAGER))
    run.on_bench(f"{A}#0", bench_ok(A))
    run.on_bench(f"{B}#0", parity_failed(B))
    run.on_bench(f"{EAGER}#0", Failure("benchmark", "benchmark process died: ...", ""))
    run.on_bench(f"{COMPILE}#0", bench_ok(COMPILE, unstable=True))
    kids = tracker.by_name()

    ok = kids[A]
    assert ok.status == "FINISHED" and run.outcomes[A].status == Status.OK
    assert (ok.tags["status"], ok.tags["parity"], ok.tags["unstable"]) == ("ok", "passed", "False")
    assert ok.metrics["latency_ms_median"] == 1.003 and ok.metrics["export_seconds"] == 1.5
    assert ok.params["runtime.pid"] == "4242" and ok.params["runtime.process_ran_before"] == "nothing"
    assert ok.tags["env.cpu_count"] == "2"
    samples = ok.files["latency_samples.json"]
    assert samples["variant"] == A and samples["unit"] == "ns" and samples["first_call_ns"] == 5_000_000
    assert len(samples["samples"]) == ok.metrics["iterations"]
    assert ok.files["parity.json"]["passed"] is True

    parity = kids[B]
    assert parity.status == "FAILED" and parity.tags["status"] == "failed"
    assert parity.tags["failure_stage"] == "parity" and parity.tags["parity"] == "failed"
    assert "atol 0" in parity.tags["error"]
    assert parity.files["parity.json"]["passed"] is False  # what parity found is kept
    assert parity.metrics["parity_max_abs_diff"] == 0.5 and "latency_samples.json" not in parity.files

    crashed = kids[EAGER]
    assert crashed.status == "FAILED" and crashed.tags["failure_stage"] == "benchmark"
    assert "error.txt" not in crashed.files  # no traceback, no file
    assert kids[COMPILE].tags["unstable"] == "True" and run.outcomes[COMPILE].unstable

    text = run.finish(12.5)
    parent = tracker.parent()
    assert parent.status == "FAILED" and parent.tags["status"] == "failed"
    assert parent.metrics == {
        "variants_ok": 2,
        "variants_failed": 3,
        "variants_skipped": 1,
        "sweep_seconds": 12.5,
    }
    for name in (A, B, EAGER, COMPILE, COMPILE_CUDA, SKIPPED):
        assert name in text and name in parent.files["summary.txt"]
    rows = {r["variant"]: r for r in parent.files["summary.json"]}
    assert rows[A]["status"] == "ok" and rows[COMPILE]["status"].startswith("ok, unstable")
    assert rows[B]["status"].startswith("FAILED parity") and rows[SKIPPED]["status"].startswith("skipped")
    plots = [a for a in parent.artifacts if not a[1] or not a[1].startswith("exports/")]
    assert plots == [("latency.png", None)] and (tmp_path / "out" / "latency.png").is_file()
    assert all(r.status != "RUNNING" for r in tracker.runs.values())
    by_job = {j: o.name for j, o in run.by_job().items()}
    assert by_job == dict(enumerate([A, B, EAGER, COMPILE, COMPILE_CUDA, SKIPPED]))


def test_a_sweep_without_failures_finishes(tmp_path):
    plan = plan_jobs(JOBS[0], JOBS[1])
    tracker = FakeTracker()
    run = SweepRun(plan, tmp_path, tracker, FakeScheduler())
    run.record_plan("cmd")
    run.start()
    for name in (A, B):
        run.on_export(key_of(plan, name), export_ok(key_of(plan, name), tmp_path / name))
        run.on_bench(f"{name}#0", bench_ok(name))
    run.finish(1.0)
    parent = tracker.parent()
    assert parent.status == "FINISHED" and parent.tags["status"] == "ok"
    assert parent.metrics["variants_ok"] == 2 and parent.metrics["variants_failed"] == 0


def test_abort_closes_every_open_run_and_only_those(sweep, plan, tmp_path):
    run, tracker, _ = sweep
    run.start()
    run.on_export(key_of(plan, A), export_ok(key_of(plan, A), tmp_path / "a"))
    run.on_bench(f"{A}#0", bench_ok(A))
    run.on_export(key_of(plan, B), export_ok(key_of(plan, B), tmp_path / "b"))  # B is benchmarking
    run.abort("KeyboardInterrupt: ")
    kids = tracker.by_name()
    assert {n: r.status for n, r in kids.items()} == {
        A: "FINISHED",
        B: "KILLED",
        EAGER: "KILLED",
        COMPILE: "KILLED",
        COMPILE_CUDA: "FAILED",
        SKIPPED: "FINISHED",
    }
    for name in (B, EAGER, COMPILE):
        assert kids[name].tags["status"] == "aborted" and kids[name].tags["error"] == "KeyboardInterrupt: "
        assert run.outcomes[name].status == Status.ABORTED
    assert kids[B].metrics["export_seconds"] == 1.5  # what was logged before stays
    assert kids[A].tags["status"] == "ok" and kids[COMPILE_CUDA].tags["status"] == "failed"
    parent = tracker.parent()
    assert parent.status == "KILLED" and parent.tags["status"] == "aborted"


def test_repeats_record_a_variant_once_all_its_processes_ended(tmp_path):
    """bench.repeats=3: three fresh processes, the run stays open until the last, then one
    record of the pooled samples; a failed process fails the variant, later ones are ignored."""
    plan = plan_jobs([*JOBS[0], "bench.repeats=3"], [*JOBS[1], "bench.repeats=3"])
    tracker, sched = FakeTracker(), FakeScheduler()
    run = SweepRun(plan, tmp_path, tracker, sched)
    run.record_plan("cmd")
    run.start()
    for name in (A, B):
        run.on_export(key_of(plan, name), export_ok(key_of(plan, name), tmp_path / name))
    benches = [key for kind, key, _, _ in sched.submitted if kind == "bench"]
    assert benches == [f"{A}#0", f"{A}#1", f"{A}#2", f"{B}#0", f"{B}#1", f"{B}#2"]
    kids = tracker.by_name()

    run.on_bench(f"{A}#1", bench_ok(A))
    run.on_bench(f"{A}#0", bench_ok(A))
    assert kids[A].status == "RUNNING" and "latency_ms_median" not in kids[A].metrics
    run.on_bench(f"{A}#2", bench_ok(A))
    assert kids[A].status == "FINISHED" and kids[A].tags["status"] == "ok"
    assert kids[A].metrics["repeats"] == 3 and len(kids[A].files["latency_samples.json"]["samples"]) == 3 * 7

    run.on_bench(f"{B}#0", bench_ok(B))
    run.on_bench(f"{B}#2", Failure("benchmark", "benchmark process died: ..."))
    assert kids[B].status == "FAILED" and kids[B].tags["failure_stage"] == "benchmark"
    run.on_bench(f"{B}#1", bench_ok(B))  # after the variant ended: nothing more is written
    assert kids[B].status == "FAILED" and "latency_ms_median" not in kids[B].metrics


@pytest.mark.parametrize("resume", [True, False])
def test_resume_links_a_variant_measured_ok_before_instead_of_measuring_it(tmp_path, resume):
    flag = f"tracking.resume={str(resume).lower()}"
    plan = plan_jobs([*JOBS[0], flag], [*JOBS[1], flag])
    earlier = mlflow_run("earlier-run", A, latency_ms_median=1.0)
    tracker, sched = FakeTracker({plan.variant(A).variant.bench_key: earlier}), FakeScheduler()
    run = SweepRun(plan, tmp_path, tracker, sched)
    run.record_plan("cmd")
    run.start()
    exports = [key for kind, key, _, _ in sched.submitted if kind == "export"]
    if not resume:  # tracking.resume=false: measured again
        assert set(tracker.by_name()) == {A, B} and exports == [key_of(plan, A), key_of(plan, B)]
        return
    assert set(tracker.by_name()) == {B}  # no new run for A: the earlier one is linked
    o = run.outcomes[A]
    assert o.status == Status.OK and o.reused_from == "earlier-run" and o.metrics == {"latency_ms_median": 1.0}
    assert o.shapes == {"input_ids": [2, 16]}
    parent = tracker.parent()
    assert parent.params["reused"] == "1" and parent.files["reused.json"] == {A: "earlier-run"}
    assert exports == [key_of(plan, B)]  # A's export is not needed
    run.on_export(key_of(plan, B), export_ok(key_of(plan, B), tmp_path / "b"))
    run.on_bench(f"{B}#0", bench_ok(B))
    run.finish(1.0)
    assert parent.status == "FINISHED" and parent.metrics["variants_ok"] == 2


def test_runs_a_dead_driver_left_open_are_closed_killed(tmp_path, plan):
    tracker = FakeTracker()
    old_sweep = tracker.start_sweep("sweep_old", {}, {})
    left = tracker.start_variant(old_sweep, A, {"status": "running"}, {}, "")
    tracker.orphan_ids = [old_sweep, left]
    SweepRun(plan, tmp_path, tracker, FakeScheduler()).record_plan("cmd")
    for run_id in (old_sweep, left):
        closed = tracker.runs[run_id]
        assert closed.status == "KILLED" and closed.tags["status"] == "aborted"
        assert closed.tags["error"] == "closed by a later sweep: its driver (pid 1 on elsewhere) is gone"


def test_a_retry_is_recorded_on_the_open_variants_it_concerns(sweep, plan):
    run, tracker, _ = sweep
    run.start()  # COMPILE_CUDA fails at once: it shares the export but never needs it
    run.on_retry(f"export:{key_of(plan, EAGER)}", "worker died (OOM)")
    run.on_retry(f"bench:{A}#0", "worker died")
    kids = tracker.by_name()
    for name, cause in (
        (EAGER, "export: worker died (OOM)"),
        (COMPILE, "export: worker died (OOM)"),
        (A, "bench: worker died"),
    ):
        assert kids[name].metrics["retries"] == 1 and kids[name].tags["retry_causes"] == cause
    assert "retries" not in kids[COMPILE_CUDA].metrics and kids[COMPILE_CUDA].status == "FAILED"


# -- run_sweep, with the fakes in place of Ray and MLflow ------------------------------


def _install(monkeypatch, tracker, sched):
    import orchestrator.run.sweep

    monkeypatch.setattr(orchestrator.run.sweep, "Tracker", lambda cfg, background=False: tracker)
    monkeypatch.setattr(orchestrator.run.sweep, "Scheduler", lambda cluster, forks=None: sched)


def answer(tmp_path):
    def respond(kind, key, spec):
        if kind == "export":
            return export_ok(key, tmp_path / key[:8])
        return bench_ok(key.rsplit("#", 1)[0])

    return respond


def test_run_sweep_runs_the_plan_and_returns_each_jobs_outcome(monkeypatch, tmp_path):
    from orchestrator.run.sweep import run_sweep

    tracker, sched = FakeTracker(), FakeScheduler(answer(tmp_path))
    _install(monkeypatch, tracker, sched)
    configs, overrides = compose_jobs(JOBS[0], JOBS[1], JOBS[5])
    outcomes = run_sweep(configs, overrides, tmp_path / "out", "cmd")
    assert {j: (o.name, o.status) for j, o in outcomes.items()} == {
        0: (A, Status.OK),
        1: (B, Status.OK),
        2: (SKIPPED, Status.SKIPPED),
    }
    assert sched.started and sched.stopped
    assert tracker.parent().status == "FINISHED"
    plan = plan_jobs(JOBS[0], JOBS[1])
    exports = [("export", key_of(plan, A)), ("export", key_of(plan, B))]
    assert [s[:2] for s in sched.submitted] == [*exports, ("bench", f"{A}#0"), ("bench", f"{B}#0")]
    assert sched.servers == plan.fork_servers()  # each node's fork servers import what the plan runs


def test_an_interrupt_mid_sweep_aborts_open_runs_and_stops_the_scheduler(monkeypatch, tmp_path):
    """Ctrl-C while results are awaited: every open run ends KILLED, the interrupt goes on."""
    from orchestrator.run.sweep import run_sweep

    def respond(kind, key, spec):
        if kind == "bench" and key == f"{B}#0":
            raise KeyboardInterrupt
        return answer(tmp_path)(kind, key, spec)

    tracker, sched = FakeTracker(), FakeScheduler(respond)
    _install(monkeypatch, tracker, sched)
    configs, overrides = compose_jobs(JOBS[0], JOBS[1])
    with pytest.raises(KeyboardInterrupt):
        run_sweep(configs, overrides, tmp_path / "out", "cmd")
    assert sched.stopped
    kids = tracker.by_name()
    assert kids[A].status == "FINISHED" and kids[B].status == "KILLED"
    assert kids[B].tags["error"] == "KeyboardInterrupt: " and tracker.parent().status == "KILLED"


def test_a_benchmark_no_node_can_host_is_refused_before_any_run(monkeypatch, tmp_path):
    """The exit path a user sees: one line naming the key and the limit, and no run recorded."""
    from orchestrator.entry import run_or_exit

    tracker, sched = FakeTracker(), FakeScheduler(answer(tmp_path), cap=capacity(cpus=2))
    _install(monkeypatch, tracker, sched)
    configs, overrides = compose_jobs([*JOBS[0], "bench.threads=16"])
    with pytest.raises(SystemExit) as exit_:
        run_or_exit(configs, overrides, tmp_path / "out", "cmd")
    assert str(exit_.value.code).startswith("phasesweep: bench.threads=16 exceeds the 2 CPUs")
    assert tracker.runs == {} and sched.submitted == [] and sched.stopped


def test_failed_variants_end_the_process_with_their_names(monkeypatch, tmp_path):
    from orchestrator.entry import run_or_exit

    def respond(kind, key, spec):
        return parity_failed(key.rsplit("#", 1)[0]) if kind == "bench" else answer(tmp_path)(kind, key, spec)

    tracker, sched = FakeTracker(), FakeScheduler(respond)
    _install(monkeypatch, tracker, sched)
    configs, overrides = compose_jobs(JOBS[1])
    with pytest.raises(SystemExit) as exit_:
        run_or_exit(configs, overrides, tmp_path / "out", "cmd")
    assert exit_.value.code == f"phasesweep: 1 variant(s) failed: {B}"
    assert tracker.by_name()[B].status == "FAILED" and tracker.parent().status == "FAILED"


def test_a_captured_job_stands_for_its_kept_calls_and_its_failure_tells(tmp_path):
    """A phase=captured job planned from a capture's result (the capture itself: test_capture.py):
    one variant per kept call, the application's figures on the sweep's run, its variants
    beside the application's loop at the end, and a failure of any of them is the job's."""
    from orchestrator.plan.config import validate_all
    from orchestrator.plan.planner import make_plan
    from tasks.specs import PhaseSpec
    from tests.conftest import CaptureRunner

    app = "examples.generate_app:run"
    configs, overrides = compose_jobs(["phase=captured", f"phase.app={app}"], shrink=False)
    points = validate_all(configs, overrides)
    kept = [
        PhaseSpec("captured", 1, prompt_len=128, parity_steps=1, app=app, kind="prefill", call=0, inputs="p.npz"),
        PhaseSpec("captured", 1, context_len=128, app=app, kind="decode", call=1, inputs="d1.npz"),
        PhaseSpec("captured", 1, context_len=426, app=app, kind="decode", call=299, inputs="d2.npz"),
    ]
    runner = CaptureRunner(
        total_calls=300, kept=kept, timings={"app_runs": 3.0, "app_ttft_ms": 5.0, "app_inter_token_ms_median": 2.0, "app_inter_token_ms_p90": 2.5, "app_outside_forward_share": 0.2},
        inter_token_ns=[2_000_000] * 3, at_calls={0: {"app_forward_ms": 3.0}, 1: {"app_forward_ms": 1.5, "app_inter_token_ms": 2.0}},
    )
    plan = make_plan(points, configs, overrides, capacity(), runner=runner)
    assert len(runner.specs) == 1  # one application, captured once before its variants were made
    names = [pv.name for pv in plan.variants]
    assert names == ["llama_prefill_onnxruntime_cpu", "llama_decode_onnxruntime_cpu_ctx128", "llama_decode_onnxruntime_cpu_ctx426"]
    assert [pv.jobs for pv in plan.variants] == [(0,), (0,), (0,)] and len(plan.exports) == 3
    assert plan.variant(names[2]).variant.phase.cache_len == 434  # normalised as decode: context + 8

    tracker = FakeTracker()
    run = SweepRun(plan, tmp_path, tracker, FakeScheduler())
    run.record_plan("cmd")
    parent = tracker.parent()
    assert parent.metrics["llama.app_ttft_ms"] == 5.0 and parent.params["capture.llama.kept"] == "3"
    assert parent.files["captures/llama.json"]["variants"] == sorted(names)
    assert parent.files["captures/llama_inter_token_ns.json"]["samples"] == [2_000_000] * 3
    run.start()
    for name in names:
        k = plan.variant(name).export_key
        run.on_export(k, export_ok(k, tmp_path / name))
    run.on_bench(f"{names[0]}#0", bench_ok(names[0]))
    run.on_bench(f"{names[1]}#0", parity_failed(names[1]))
    run.on_bench(f"{names[2]}#0", bench_ok(names[2]))
    text = run.finish(1.0)
    assert run.by_job()[0].name == names[1]  # the job failed: one of its variants did
    beside = {r["variant"]: r for r in parent.files["captures/benchmark_vs_app.json"]}
    assert set(beside) == {names[0], names[2]}  # measured ones only
    assert beside[names[0]]["app_forward_ms"] == "3.000" and beside[names[2]]["app_forward_ms"] == "-"
    assert "beside the application's own loop" in text

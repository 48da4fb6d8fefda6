"""Per-op profiles (bench.profile=true, tasks/measure/profiles.py): one table for every runtime, built
from each profiler's own records; then a real profile per backend, and the timed numbers left
as they were."""

from __future__ import annotations

import dataclasses

import pytest

from orchestrator.plan.config import ConfigError
from tasks.measure import profiles
from tasks.runtimes import executorch as executorch_runtime
from tasks.runtimes import onnxruntime as onnxruntime_runtime
from tests.conftest import CONF, FAST_BENCH, backend_yaml, plan_jobs


def test_top_ops_ranks_sums_the_rest_and_names_the_time_outside_ops():
    per_op = {"MatMul": (40, 400.0), "Add": (20, 100.0), "Cast": (10, 50.0), "Mul": (10, 30.0)}
    rows = profiles.top_ops(per_op, calls=10, call_us=1000.0, top=2)
    assert rows == [
        {"op": "MatMul", "per_call": 4.0, "us_per_call": 40.0, "share": 0.4},
        {"op": "Add", "per_call": 2.0, "us_per_call": 10.0, "share": 0.1},
        {"op": "(other ops)", "per_call": 2.0, "us_per_call": 8.0, "share": 0.08},
        {"op": "(outside ops)", "per_call": 0.0, "us_per_call": 42.0, "share": 0.42},
    ]
    assert sum(r["share"] for r in rows) == pytest.approx(1.0)


def test_onnxruntime_trace_counts_only_the_runs_after_warmup():
    def run(ts, dur):
        return {"cat": "Session", "name": "model_run", "ts": ts, "dur": dur}

    def node(ts, op, dur):
        return {"cat": "Node", "name": f"n_{op}_kernel_time", "ts": ts, "dur": dur, "args": {"op_name": op}}

    trace = [run(0, 100), node(10, "MatMul", 90), run(200, 50), node(210, "MatMul", 30), node(240, "Add", 10)]
    trace += [run(300, 50), node(310, "MatMul", 30), node(340, "Add", 10)]
    rows = onnxruntime_runtime.profile_rows(trace, warmup=1)  # the first run (a slow first call) is left out
    assert rows == [
        {"op": "MatMul", "per_call": 1.0, "us_per_call": 30.0, "share": 0.6},
        {"op": "Add", "per_call": 1.0, "us_per_call": 10.0, "share": 0.2},
        {"op": "(outside ops)", "per_call": 0.0, "us_per_call": 10.0, "share": 0.2},
    ]


def test_executorch_events_drop_the_wrappers_and_name_portable_and_xnnpack_ops():
    events = [
        ("Method::execute", [99.0, 10.0, 10.0]),
        ("DELEGATE_CALL", [50.0, 6.0, 6.0]),  # spans the XNNPACK operators below
        ("OPERATOR_CALL", [9.0, 2.0, 2.0]),  # spans the portable kernel below
        ("native_call_index_put.out", [9.0, 2.0, 2.0]),
        ("Fully Connected (NC, F32) GEMM #1", [40.0, 4.0, 4.0]),
        ("Fully Connected (NC, F32) GEMM #2", [1.0, 1.0, 1.0]),
    ]
    assert executorch_runtime.op_name("native_call_arange.start_out") == "arange (portable)"
    assert executorch_runtime.op_name("llama::custom_sdpa.out") == "llama::custom_sdpa (custom op)"
    rows = executorch_runtime.profile_rows(events, warmup=1)
    assert rows == [
        {"op": "Fully Connected (NC, F32) GEMM (xnnpack)", "per_call": 2.0, "us_per_call": 5.0, "share": 0.5},
        {"op": "index_put (portable)", "per_call": 1.0, "us_per_call": 2.0, "share": 0.2},
        {"op": "(outside ops)", "per_call": 0.0, "us_per_call": 3.0, "share": 0.3},
    ]


def test_a_runtime_without_a_profiler_is_refused_before_any_work(monkeypatch):
    from tasks.runtimes.eager import EagerRuntime

    monkeypatch.setattr(EagerRuntime, "PROFILER", None)  # the contract's default: no profiler
    with pytest.raises(ConfigError, match=r"bench.profile=true: backend.runtime='eager' has no profiler.*compile"):
        plan_jobs(["backend=eager", "bench.profile=true"])


def _profiled_backends() -> list[str]:
    """Every backend in conf/ whose runtime has a profiler."""

    from tasks.runtimes import profiled_runtimes

    return [p.stem for p in sorted((CONF / "backend").glob("*.yaml")) if backend_yaml(p.stem)["runtime"] in profiled_runtimes()]


BACKENDS = _profiled_backends()


@pytest.fixture(scope="module")
def profiled(planned_variant):
    """Each backend's tiny decode benchmarked with bench.profile=true, in this process."""
    from tasks.jobs import bench_job

    out = {}
    for backend in BACKENDS:
        extra = ["model.kv_cache=dynamic"] if backend == "compile" else []
        _, bench = planned_variant("model=llama", "phase=decode", f"backend={backend}", *extra)
        spec = dataclasses.replace(bench, bench=dataclasses.replace(FAST_BENCH, profile=True))
        out[backend] = bench_job(spec)
        if backend == "onnxruntime":  # the same benchmark without a profile, for its metrics' kinds
            out["unprofiled"] = bench_job(dataclasses.replace(spec, bench=FAST_BENCH))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_backend_profiles_its_call_after_timing_it(profiled, backend):
    result = profiled[backend]
    assert result.ok, result.failure and result.failure.traceback
    rows = result.profile
    ops = [r for r in rows if not r["op"].startswith("(")]
    assert len(ops) >= 3 and all(r["us_per_call"] > 0 for r in ops), rows
    shares = sum(r["share"] for r in rows)  # the time outside ops fills the call; none when ops overlap it
    assert shares == pytest.approx(1.0, abs=0.02) or not any(r["op"] == "(outside ops)" for r in rows)
    assert [r["us_per_call"] for r in ops] == sorted((r["us_per_call"] for r in ops), reverse=True)
    # the timed numbers are the harness's own, taken before: present and plausible as ever
    assert result.samples_ns and result.metrics["latency_ms_median"] > 0
    assert result.metrics["iterations"] == len(result.samples_ns)
    if backend == "onnxruntime":
        assert set(result.metrics) == set(profiled["unprofiled"].metrics) and not profiled["unprofiled"].profile

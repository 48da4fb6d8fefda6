"""ExecuTorch (.pte, XNNPACK) and torch.compile backends: parity one step and many,
delegation report, compile time apart from steady-state latency."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tasks.jobs import bench_job
from tasks.specs import BenchOptions, BenchSpec
from tests.conftest import PHASES, model_spec

pytestmark = pytest.mark.slow
FAST = BenchOptions(warmup_iters=2, warmup_max_seconds=1, min_iters=5, min_seconds=0.05, threads=1)


def bench(exported, tmp_path, model, phase, backend, fmt, kv_cache="static"):
    export = exported(model, phase, fmt, kv_cache)
    spec = BenchSpec(
        f"{model}_{phase}_{backend}",
        backend,
        "cpu",
        model_spec(model, kv_cache=kv_cache),
        PHASES[phase],
        export.out_dir,
        str(tmp_path),
        FAST,
        {"cold_cache": True} if backend == "compile" else {},
    )
    result = bench_job(spec)
    assert result.ok, result.failure and (result.failure.error + result.failure.traceback)
    return export, result


@pytest.mark.parametrize(
    "model,phase,kv_cache",
    [
        ("llama", "prefill", "static"),
        ("llama", "decode", "static"),
        ("phi3", "decode", "static"),
        ("llama", "decode", "dynamic"),  # the cache grows by one position a step: dynamic shapes in the .pte
    ],
)
def test_executorch_parity_and_delegation(exported, tmp_path, model, phase, kv_cache):
    export, result = bench(exported, tmp_path, model, phase, "executorch", "executorch", kv_cache)
    assert Path(export.artifact).suffix == ".pte" and export.artifact_mb > 0
    d = export.details
    assert d["delegated_ops"] > 0 and d["delegated_ops"] + d["non_delegated_ops"] > d["delegated_ops"]
    assert 0 < d["delegated_fraction"] < 1
    assert result.parity["passed"] and result.parity["steps"] == (8 if phase == "decode" else 1)
    assert result.params["xnnpack_threads"] == 1


def test_executorch_without_delegate_runs_portable_kernels(tmp_path):
    from tasks.jobs import export_job
    from tasks.specs import ExportSpec

    export = export_job(
        ExportSpec("k", model_spec("llama"), PHASES["decode"], "executorch", str(tmp_path / "e"), {"delegate": "none"})
    )
    assert export.ok and export.details["delegated_ops"] == 0
    spec = BenchSpec(
        "v", "executorch", "cpu", model_spec("llama"), PHASES["decode"], export.out_dir, str(tmp_path), FAST
    )
    assert bench_job(spec).parity["passed"]


@pytest.mark.parametrize("phase,kv_cache", [("prefill", "static"), ("decode", "dynamic")])
def test_compile_reports_compile_time_apart_from_latency(exported, tmp_path, phase, kv_cache):
    _, result = bench(exported, tmp_path, "llama", phase, "compile", "none", kv_cache)
    m = result.metrics
    assert result.parity["passed"]
    # compiling takes seconds; a steady-state call of the tiny model takes well under one
    assert m["compile_seconds"] > 1.0 and m["latency_ms_median"] < 1000 * m["compile_seconds"]
    assert result.params["compile_cold_cache"] is True
    samples = json.loads(Path(result.files["latency_samples.json"]).read_text())["samples"]
    assert max(samples) / 1e9 < m["compile_seconds"]  # no sample contains the compile


def test_executorch_on_cuda_is_a_clear_error(exported, tmp_path):
    export = exported("llama", "decode", "executorch")
    spec = BenchSpec(
        "v", "executorch", "cuda", model_spec("llama"), PHASES["decode"], export.out_dir, str(tmp_path), FAST
    )
    result = bench_job(spec)
    assert not result.ok and result.failure.stage == "load"
    assert "device=cuda: the executorch backend runs on cpu only" in result.failure.error

"""The contract of formats and runtimes (tasks/contract.py): a runtime from outside the
repository, for the existing format onnx, refuses a configuration by itself and the planner
skips that point with the runtime's own reason; what a part needs installed is asked the same
way; the registry takes only objects of the contract."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.contract import Point, Refusal, Runtime
from tasks.registry import load_object
from tasks.specs import ConfigError, ModelSpec, PhaseSpec
from tests.conftest import plan_jobs

# the test-only backend `ort_static` (tests/ort_static_backend/): ONNX Runtime, fixed-size caches only
BACKEND = Path(__file__).resolve().parent / "ort_static_backend"
SEARCHPATH = f"hydra.searchpath=[file://{BACKEND / 'conf'}]"
REFUSED = "backend ort_static binds fixed-size cache buffers only: model.kv_cache=dynamic grows them"


@pytest.fixture
def ort_static(monkeypatch):
    """The backend's module importable by name, as PYTHONPATH makes it for a sweep."""
    monkeypatch.syspath_prepend(str(BACKEND))
    from ort_static_runtime import OrtStaticRuntime

    return OrtStaticRuntime


def plan_of(*overrides: str, cap=None):
    jobs = [[SEARCHPATH, "backend=ort_static", "phase=decode", f"model={m}", f"model.kv_cache={kv}", *overrides]
            for m in ("llama", "phi3") for kv in ("static", "dynamic")]
    return plan_jobs(*jobs, cap=cap)


def test_the_backend_is_one_module_and_one_yaml():
    files = sorted(str(p.relative_to(BACKEND)) for p in BACKEND.rglob("*.*") if "__pycache__" not in p.parts)
    assert files == ["conf/backend/ort_static.yaml", "ort_static_runtime.py"]


def test_a_runtime_refuses_a_point_by_itself_and_the_plan_skips_it(ort_static):
    plan = plan_of()
    assert [pv.name for pv in plan.variants] == ["llama_decode_ort_static_cpu_kvstatic", "phi3_decode_ort_static_cpu_kvstatic"]
    assert {pv.bench.runtime for pv in plan.variants} == {"ort_static_runtime"}
    assert {job.spec.export_format for job in plan.exports.values()} == {"onnx"}
    assert [(s.name, s.reason) for s in plan.skipped] == [
        ("llama_decode_ort_static_cpu_kvdynamic", REFUSED),
        ("phi3_decode_ort_static_cpu_kvdynamic", REFUSED),
    ]


def test_the_format_is_asked_too_and_its_tables_read_the_same(ort_static):
    """The onnx format refuses llama's custom ops whatever the runtime; the runtime's DTYPES
    refuse bfloat16 with the contract's own words."""
    plan = plan_jobs(
        [SEARCHPATH, "backend=ort_static", "phase=decode", "model.kv_cache=update_cache"],
        [SEARCHPATH, "backend=ort_static", "phase=decode", "model.dtype=bfloat16"],
    )
    assert not plan.variants
    reasons = [s.reason for s in plan.skipped]
    assert reasons[0].startswith("backend ort_static cannot run model.kv_cache=update_cache: ONNX has no llama::update_cache")
    assert reasons[1] == "backend ort_static does not run model.dtype=bfloat16 on device=cpu (runs: float32, float16)"


def test_a_missing_distribution_skips_the_point_with_its_install(ort_static, monkeypatch):
    monkeypatch.setattr(ort_static, "REQUIRES", ("phasesweep-no-such-distribution",))
    plan = plan_of()
    assert not plan.variants
    assert {s.reason for s in plan.skipped} == {
        "backend ort_static needs phasesweep-no-such-distribution, not installed: pip install phasesweep-no-such-distribution"
    }


def test_a_refusal_names_one_choice_on_some_devices():
    refusal = Refusal("model.attention", "custom_sdpa", "CPU kernels only", devices=("cuda",))
    model = ModelSpec("llama", "llama", "tiny", {}, attention="custom_sdpa")
    on = Point("eager", "cuda", model, PhaseSpec("decode", 1))
    assert refusal.reason(on) == "backend eager cannot run model.attention=custom_sdpa on device=cuda: CPU kernels only"
    assert refusal.reason(Point("eager", "cpu", model, PhaseSpec("decode", 1))) is None


def test_the_registry_takes_only_the_contracts_objects():
    with pytest.raises(ConfigError, match=r"backend.runtime='tasks.contract'.*defines no RUNTIME"):
        load_object("backend.runtime", "tasks.contract", "tasks.runtimes", "RUNTIME", Runtime)


@pytest.mark.slow
def test_the_out_of_tree_runtime_runs_its_planned_variant(ort_static, cache_override):
    """Its variant exported by the onnx format and measured by its own load(), parity passed."""
    from tasks.jobs import bench_job, export_job

    plan = plan_jobs([SEARCHPATH, "backend=ort_static", "phase=decode", cache_override])
    (pv,) = plan.variants
    export = export_job(plan.exports[pv.export_key].spec)
    assert export.ok, export.failure and export.failure.traceback
    result = bench_job(pv.bench)
    assert result.ok, result.failure and result.failure.traceback
    assert result.parity["passed"] and result.metrics["latency_ms_median"] > 0
    assert result.params["ort_providers"] == "CPUExecutionProvider"

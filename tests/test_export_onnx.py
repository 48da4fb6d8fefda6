"""ONNX export of both phases on both models: named I/O, parity one step and many.

Every export comes from the session's shared cache (conftest `planned_variant`), planned
as a sweep plans it; the graph maths is checked on a loaded session, without jobs."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
import pytest

from tasks.jobs import bench_job
from tasks.measure.session import Session
from tasks.phases import phase_module
from tasks.runtimes import onnxruntime as ort_runtime
from tasks.worker.entries import load_export
from tests.conftest import DECODE, FAST_BENCH, PREFILL, model_spec, plan_jobs

pytestmark = pytest.mark.slow
CASES = [(m, p) for m in ("llama", "phi3") for p in ("prefill", "decode")]


@pytest.fixture(scope="module")
def onnx_variant(planned_variant):
    """`onnx_variant(model, phase, runtime="onnxruntime", **bench)` -> (ExportResult, BenchSpec):
    the planned onnxruntime variant, run by `runtime` on the same export entry."""

    def get(model, phase, runtime="onnxruntime", **bench):
        export, spec = planned_variant(f"model={model}", f"phase={phase}", "backend=onnxruntime")
        if runtime != spec.runtime:  # eager on the ONNX export's inputs and reference
            spec = replace(spec, runtime=runtime, runtime_options={})
        return export, replace(spec, bench=replace(spec.bench, **bench))

    return get


def session_of(onnx_variant, model, phase):
    export, spec = onnx_variant(model, phase)
    meta, feeds, parity = load_export(export.out_dir)
    return ort_runtime.RUNTIME.load(spec, meta, feeds), feeds, parity


def test_planned_specs_are_the_shared_test_settings(onnx_variant):
    """The sweeps of test_end_to_end.py plan exactly these: the same shapes, the same bench."""
    _, spec = onnx_variant("llama", "decode")
    assert spec.bench == FAST_BENCH
    assert (spec.phase.batch, spec.phase.context_len, spec.phase.parity_steps) == (
        DECODE.batch,
        DECODE.context_len,
        DECODE.parity_steps,
    )
    _, spec = onnx_variant("phi3", "prefill")
    assert (spec.phase.batch, spec.phase.prompt_len) == (PREFILL.batch, PREFILL.prompt_len)
    assert spec.model == model_spec("phi3")


@pytest.mark.parametrize("model,phase", CASES)
def test_onnx_graph_has_named_inputs_and_outputs(onnx_exports, model, phase):
    result = onnx_exports[(model, phase)]
    proto = onnx.load(result.artifact)
    inputs = [i.name for i in proto.graph.input]
    outputs = [o.name for o in proto.graph.output]
    if phase == "prefill":
        assert inputs == ["input_ids"]
    else:
        assert inputs[:2] == ["input_ids", "cache_position"]
        assert inputs[2:6] == [
            "past_key_values.0.key",
            "past_key_values.0.value",
            "past_key_values.1.key",
            "past_key_values.1.value",
        ]
    assert outputs == ["logits", "present.0.key", "present.0.value", "present.1.key", "present.1.value"]
    assert result.artifact_mb > 0 and result.export_seconds > 0


@pytest.mark.parametrize("model,phase", CASES)
@pytest.mark.parametrize("runtime", ["onnxruntime", "eager"])
def test_parity_and_benchmark(onnx_variant, model, phase, runtime):
    _, spec = onnx_variant(model, phase, runtime)
    result = bench_job(spec)
    assert result.ok, result.failure
    assert result.parity["passed"] and result.parity["max_abs_diff"] < 1e-4
    assert result.parity["top1_agreement"] == 1.0
    assert result.parity["steps"] == (1 if phase == "prefill" else DECODE.parity_steps)
    m = result.metrics
    assert m["iterations"] >= 5 and m["latency_ms_min"] <= m["latency_ms_median"] <= m["latency_ms_p99"]
    tokens = PREFILL.batch * (PREFILL.prompt_len if phase == "prefill" else 1)
    assert m["tokens_per_s"] == pytest.approx(tokens / (m["latency_ms_median"] / 1e3))
    assert len(result.samples_ns) == m["iterations"] and all(s > 0 for s in result.samples_ns)
    assert result.first_call_ns == int(m["first_call_ms"] * 1e6) > 0


def test_decode_step_updates_only_its_slot(onnx_variant):
    """The exported static cache writes the new key at cache_position and nowhere else."""
    session, feeds, _ = session_of(onnx_variant, "llama", "decode")
    _, k0, *_ = session.run(feeds)
    past = feeds["past_key_values.0.key"]
    ctx = DECODE.context_len
    np.testing.assert_array_equal(k0[:, :, :ctx], past[:, :, :ctx])
    assert np.abs(k0[:, :, ctx]).sum() > 0 and not k0[:, :, ctx + 1 :].any()


class HostLoop(Session):
    """The base session's decode loop: every present cache back through numpy and run()."""

    def __init__(self, inner):
        self.run, self.output_names = inner.run, inner.output_names


def test_device_side_decode_loop_matches_the_host_loop(onnx_variant):
    """ORT's multi-step decode keeps the cache as OrtValues between steps; same logits as
    the plain loop that copies every present cache back through numpy."""
    session, feeds, parity = session_of(onnx_variant, "phi3", "decode")
    tokens = parity["step_tokens"]
    on_device = session.run_steps(feeds, tokens, DECODE.context_len)
    on_host = HostLoop(session).run_steps(feeds, tokens, DECODE.context_len)
    assert len(on_device) == len(on_host) == DECODE.parity_steps
    for a, b in zip(on_device, on_host, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)


class DropsCache(Session):
    """A session that ignores the cache it is given after the first step: the known trap of
    exported decode graphs that run but silently lose their KV cache."""

    def __init__(self, inner, first_past):
        self.inner, self.first_past, self.output_names, self.info = inner, first_past, inner.output_names, {}

    def run(self, feeds):
        feeds = {**feeds, **self.first_past}  # always the original cache: the step's keys are lost
        return self.inner.run(feeds)


def test_multi_step_parity_catches_a_dropped_cache(onnx_variant):
    session, feeds, parity = session_of(onnx_variant, "llama", "decode")
    past = {n: a for n, a in feeds.items() if n.startswith("past_")}
    report = phase_module("decode").check_parity(DropsCache(session, past), DECODE, feeds, parity, atol=1e-4)
    assert report["per_step_max_abs_diff"][0] < 1e-4  # the first step looks fine ...
    assert not report["passed"] and report["max_abs_diff"] > 1e-3  # ... the following ones do not


def test_parity_failure_is_a_failed_result_not_an_exception(onnx_variant):
    _, spec = onnx_variant("phi3", "decode", parity_atol=0.0)
    result = bench_job(spec)
    assert not result.ok and result.failure.stage == "parity"
    assert "atol 0" in result.failure.error and "latency_ms_median" not in result.metrics
    assert result.samples_ns == [] and not result.parity["passed"]


def test_export_cache_hit_reuses_the_entry(onnx_exports, cache_override):
    from tasks.jobs import export_job

    first = onnx_exports[("llama", "prefill")]
    (job,) = plan_jobs(["model=llama", "phase=prefill", cache_override]).exports.values()
    again = export_job(job.spec)
    assert again.ok and again.cache_hit and again.artifact == first.artifact and again.out_dir == first.out_dir


def test_export_failure_is_recorded_with_traceback(tmp_path):
    from tasks.jobs import export_job
    from tasks.specs import ExportSpec, PhaseSpec

    too_long = PhaseSpec("prefill", 1, prompt_len=10_000)
    result = export_job(ExportSpec("k", model_spec("llama"), too_long, "onnx", str(tmp_path / "x")))
    assert not result.ok and result.failure.stage == "export"
    assert "phase.prompt_len=10000" in result.failure.error and "Traceback" in result.failure.traceback
    assert not (tmp_path / "x").exists()  # no half-written cache entry


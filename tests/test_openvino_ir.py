"""backend=openvino_optimum: the stateful IR optimum-intel's exporter makes in its own environment
(tasks/export/openvino_ir.py) run by OpenVINO with its KV cache as state
(tasks/runtimes/openvino_stateful.py). The plan (names, what it refuses, the quant mapping, the
environment's pins) is fast; the exports (they install the exporter's environment from the
package registry once per export cache), benchmarks with parity, quality and a profile are slow."""

from __future__ import annotations

import dataclasses

import pytest

from tasks.contract import installed
from tasks.export import openvino_ir
from tasks.specs import PIN, ConfigError, dist_name
from tests.conftest import DECODE, FAST_BENCH, plan_jobs

needs_openvino = pytest.mark.skipif(not installed("openvino"), reason="pip install -e '.[openvino]'")


@needs_openvino
def test_it_plans_an_ir_per_model_phase_and_quant_and_names_its_variants():
    jobs = [["backend=openvino_optimum", f"model={m}", f"phase={p}", f"model.quant={q}"]
            for m in ("llama", "qwen2") for p in ("prefill", "decode") for q in ("none", "int8", "int4", "8da4w")]  # fmt: skip
    plan = plan_jobs(*jobs)
    assert not plan.skipped, plan.skipped
    names = {pv.name for pv in plan.variants}
    assert "qwen2_prefill_openvino_optimum_cpu_int8" in names and len(names) == 16 and len(plan.exports) == 16
    assert {pv.bench.runtime for pv in plan.variants} == {"openvino_stateful"}


@needs_openvino
@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        (["model.kv_cache=dynamic"], "backend openvino_optimum cannot run model.kv_cache=dynamic: the IR keeps its KV cache as OpenVINO state"),
        (["model.dtype=float16"], "backend openvino_optimum does not run model.dtype=float16 on device=cpu (runs: float32)"),
        (["model.quant=q4_k_m"], "backend openvino_optimum cannot run model.quant=q4_k_m on device=cpu"),
        (["device=cuda"], "backend openvino_optimum does not run on device=cuda (backend.devices: cpu)"),
        (["model=gemma2"], "backend openvino_optimum cannot make model.family=gemma2: optimum-intel 2.2.0 exports it with transformers 5.0 at most"),
    ],
)
def test_what_it_cannot_make_or_run_is_planned_as_skipped_with_the_reason(overrides, reason):
    plan = plan_jobs(["backend=openvino_optimum", "phase=decode", *overrides])
    assert not plan.variants and plan.skipped[0].reason.startswith(reason), plan.skipped


def test_a_family_it_does_not_admit_is_skipped_with_the_reason(monkeypatch):
    monkeypatch.setattr(openvino_ir, "FAMILIES", ("qwen2",))
    monkeypatch.setattr("tasks.contract.installed", lambda distribution: True)
    plan = plan_jobs(["backend=openvino_optimum", "phase=decode"])
    assert plan.skipped[0].reason.startswith("backend openvino_optimum: optimum-intel's exporter is not admitted for model.family=llama")


def test_a_bad_kv_cache_precision_names_the_key_the_value_and_what_is_allowed():
    from tasks.runtimes.openvino_stateful import Options

    with pytest.raises(ConfigError, match=r"backend.options.kv_cache_precision.*'i8'.*auto, f32, f16, u8"):
        Options(kv_cache_precision="i8")


def test_the_exporters_environment_is_exact_pins_of_distinct_libraries_with_its_waiver_named():
    names = [dist_name(PIN.match(p).group(1)) for p in openvino_ir.ENV.pip]
    assert len(set(names)) == len(names) and {"optimum-intel", "transformers", "nncf"} <= set(names)
    assert "openvino" not in names and "torch" not in names  # the driver's: the runtime reads the IR with the same openvino
    assert set(openvino_ir.WAIVED) == {"torchvision"}


def test_model_quant_is_nncf_weight_compression_with_the_models_group():
    assert openvino_ir.quant_args("none", 32) == ["--weight-format", "fp32"]  # never optimum-intel's own int8 for 1B+
    assert openvino_ir.quant_args("int8", 32) == ["--weight-format", "int8", "--sym", "--group-size", "-1"]
    assert openvino_ir.quant_args("int4", 64) == ["--weight-format", "int4", "--sym", "--ratio", "1.0", "--group-size", "64"]
    assert openvino_ir.quant_args("8da4w", 32)[:2] == ["--weight-format", "int4"]


def test_a_waived_requirement_is_met_by_its_absence_only(tmp_path):
    from tasks.worker.envs import unmet

    dist = tmp_path / "demo-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: demo\nVersion: 1.0\nRequires-Dist: not-a-real-dist\nRequires-Dist: numpy<1\n")
    assert len(unmet(tmp_path)) == 2
    assert unmet(tmp_path, ("not-a-real-dist",)) == [unmet(tmp_path)[1]]  # a wrong version is never waived


def _head(extra_op: bool):
    """A model whose `logits` are a MatMul of its hidden states [B, S, 8] by a [5, 8] head (and a soft-cap)."""
    import numpy as np
    import openvino as ov
    import openvino.opset13 as ops

    hidden = ops.parameter(ov.PartialShape([-1, -1, 8]), ov.Type.f32, name="hidden")
    weight = np.arange(40, dtype=np.float32).reshape(5, 8) / 40
    out = ops.matmul(hidden, ops.constant(weight), False, True)
    if extra_op:
        out = ops.multiply(ops.tanh(out), ops.constant(np.float32(2.0)))
    out.output(0).set_names({"logits"})
    return ov.Model([out], [hidden]), weight


@needs_openvino
@pytest.mark.parametrize("extra_op", [False, True])
def test_the_output_head_runs_on_the_last_position_only_as_openvino_genai_slices_it(extra_op):
    import numpy as np
    import openvino as ov

    from tasks.runtimes.openvino_stateful import last_position_logits

    model, weight = _head(extra_op)
    x = np.random.default_rng(0).standard_normal((2, 3, 8)).astype(np.float32)
    compiled = ov.Core().compile_model(last_position_logits(model), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    out = compiled.create_infer_request().infer({"hidden": x})
    logits = next(iter(out.values()))
    want = x[:, -1:] @ weight.T
    assert logits.shape == (2, 1, 5)
    np.testing.assert_allclose(logits, 2 * np.tanh(want) if extra_op else want, rtol=1e-5, atol=1e-6)


@needs_openvino
def test_an_ir_without_an_output_head_fails_loudly():
    import numpy as np
    import openvino as ov
    import openvino.opset13 as ops

    from tasks.runtimes.openvino_stateful import last_position_logits

    x = ops.parameter(ov.PartialShape([-1, -1, 8]), ov.Type.f32)
    out = ops.relu(ops.add(x, ops.constant(np.float32(1.0))))
    out.output(0).set_names({"logits"})
    with pytest.raises(RuntimeError, match="output head was not found"):
        last_position_logits(ov.Model([out], [x]))


# -- slow: the environment, exports, benchmarks --------------------------------------------------
@pytest.mark.slow
@needs_openvino
@pytest.mark.parametrize(("quant", "constant"), [("none", None), ("int8", "const.i8"), ("int4", "const.i4")])
def test_the_ir_is_stateful_and_compressed_as_model_quant_says(planned_variant, quant, constant):
    result, _ = planned_variant("backend=openvino_optimum", "phase=decode", f"model.quant={quant}")
    assert result.ok, result.failure and result.failure.traceback
    ops = result.anatomy["ops"]
    assert ops.get("ReadValue", 0) > 0 and ops.get("Assign", 0) == ops["ReadValue"], ops  # the cache is state
    assert ops.get("ScaledDotProductAttention", 0) > 0, ops
    details = result.details
    assert details["exporter"] == "optimum-intel" and details["ov_exporter_versions"]["transformers"] == "5.5.4"
    assert details["ov_tokenizer_ir"] is True
    if constant is None:
        assert details["ov_weight_options"] == "--weight-format fp32" and not any(k in ops for k in ("const.i8", "const.i4", "const.u4"))
    else:
        assert ops.get(constant, 0) > 0, ops


@pytest.mark.slow
@needs_openvino
@pytest.mark.parametrize(
    ("model", "phase", "quant"),
    [("llama", "prefill", "none"), ("llama", "decode", "none"), ("qwen2", "decode", "int8"), ("llama", "decode", "int4")],
)
def test_it_runs_the_ir_with_parity_through_its_own_state_quality_and_a_profile(planned_variant, model, phase, quant):
    from tasks.jobs import bench_job

    _, spec = planned_variant(f"model={model}", "backend=openvino_optimum", f"phase={phase}", f"model.quant={quant}")
    bench = dataclasses.replace(spec.bench, quality=True, profile=True)
    result = bench_job(dataclasses.replace(spec, bench=bench))
    assert result.ok, result.failure and result.failure.traceback
    assert result.parity["passed"] and result.metrics["parity_steps"] == (1 if phase == "prefill" else DECODE.parity_steps)
    assert result.params["ov_inference_num_threads"] == FAST_BENCH.threads and result.params["ov_kv_cache_precision"] == "f32"
    assert result.metrics["latency_ms_median"] > 0 and result.metrics["ov_graph_ScaledDotProductAttention"] > 0
    assert result.params["ov_logits"].startswith("last position")
    if quant == "none":  # float32: transformers' own logits, to OpenVINO's float arithmetic
        assert result.metrics["parity_max_abs_diff"] < 1e-4 and result.metrics["quality_reference"] == 1.0
    else:  # measured against float32 eager
        assert 0 <= result.metrics["quality_kl"] and 0 <= result.metrics["quality_top1"] <= 1
    assert result.profile and all(row["us_per_call"] >= 0 for row in result.profile)


@pytest.mark.slow
@needs_openvino
@pytest.mark.parametrize("family", openvino_ir.FAMILIES)
def test_every_admitted_family_gives_transformers_logits_through_the_irs_state(planned_variant, family):
    from tasks.jobs import bench_job

    _, spec = planned_variant(f"model={family}", "backend=openvino_optimum", "phase=decode")
    result = bench_job(spec)
    assert result.ok, result.failure and result.failure.traceback
    assert result.metrics["parity_max_abs_diff"] < 1e-4 and result.metrics["parity_steps"] == DECODE.parity_steps


@pytest.mark.slow
@needs_openvino
def test_timed_decode_calls_run_from_the_contexts_depth_and_refill_the_state_after_each_run(planned_variant):
    import numpy as np

    from tasks.runtimes import runtime_module
    from tasks.runtimes.openvino_stateful import REFILL
    from tasks.worker.entries import load_export

    _, spec = planned_variant("backend=openvino_optimum", "phase=decode")
    meta, feeds, parity = load_export(spec.export_dir)
    session = runtime_module("openvino_stateful").load(spec, meta, feeds)
    call, timed = session.bind(feeds), session.timer()
    engine, context = session.engine, DECODE.context_len
    logits = []
    for k in range(REFILL + 1):
        assert timed(call) > 0 and engine.depth == context + (k % REFILL) + 1
        logits.append(engine.request.get_tensor("logits").data.copy())
    np.testing.assert_array_equal(logits[REFILL], logits[0])  # the same state again: the same call
    assert not np.array_equal(logits[1], logits[0])  # one position deeper
    np.testing.assert_allclose(logits[0][:, -1], parity["ref_logits"][0][:, -1], atol=1e-4)  # the reference's first step
    session.run_steps(feeds, parity["step_tokens"], context)  # moves the state: the next call starts over
    timed(call)
    np.testing.assert_array_equal(engine.request.get_tensor("logits").data, logits[0])

"""backend=llamacpp: the GGUF format (tasks/export/gguf.py, llama.cpp's converter and quantiser)
run by llama.cpp through llama-cpp-python (tasks/runtimes/llamacpp.py). The plan (names, the
quant mapping, what it refuses, a missing extra) is fast; the exports, the benchmarks with their
parity and quality, and a small sweep are slow."""

from __future__ import annotations

import dataclasses

import pytest

from tasks.contract import installed
from tasks.export.gguf import row_sizes
from tests.conftest import DECODE, FAST_BENCH, compose_jobs, plan_jobs

needs_llamacpp = pytest.mark.skipif(not installed("llama-cpp-python"), reason="pip install -e '.[llamacpp]'")
WIDE = ["model.sizes.tiny.hidden_size=256", "model.sizes.tiny.intermediate_size=512", "model.sizes.tiny.head_dim=64"]  # rows k-quants take


@needs_llamacpp
def test_it_plans_a_gguf_per_model_phase_and_quant_and_names_its_variants():
    jobs = [[f"model={m}", "backend=llamacpp", f"phase={p}", f"model.quant={q}"]
            for m in ("llama", "qwen2") for p in ("prefill", "decode") for q in ("none", "int8", "int4")]  # fmt: skip
    plan = plan_jobs(*jobs)
    assert not plan.skipped, plan.skipped
    names = {pv.name for pv in plan.variants}
    assert {"llama_decode_llamacpp_cpu_int4", "qwen2_prefill_llamacpp_cpu", "qwen2_decode_llamacpp_cpu_int8"} <= names
    assert len(names) == 12 and len(plan.exports) == 12
    assert {pv.bench.runtime for pv in plan.variants} == {"llamacpp"}


@needs_llamacpp
@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        (["model.quant=q4_k_m"], "backend llamacpp cannot make model.quant=q4_k_m (Q4_K_M) of this model: its blocks hold 256 weights of a row, and hidden_size=64"),
        (["model.quant=8da4w"], "backend llamacpp cannot run model.quant=8da4w on device=cpu (runs: none, int8, int4, q4_k_m): llama.cpp's own types"),
        (["model.quant=int4", "model.quant_group=64"], "backend llamacpp: llama.cpp's Q4_0 has blocks of 32 weights, not model.quant_group=64"),
        (["model.kv_cache=dynamic"], "backend llamacpp cannot run model.kv_cache=dynamic: llama.cpp keeps its KV cache in its context"),
        (["device=cuda"], "backend llamacpp does not run on device=cuda (backend.devices: cpu)"),
        (["model=gemma2"], "backend llamacpp does not run model.family=gemma2 yet: its logits came out 0.24 off"),
        (["model=mistral"], "backend llamacpp: llama.cpp runs model.family=mistral as its llama architecture, which attends to the whole cache, and the model's sliding_window=8 is shorter than the 32 positions"),
    ],
)
def test_what_it_cannot_make_or_run_is_planned_as_skipped_with_the_reason(overrides, reason):
    plan = plan_jobs(["backend=llamacpp", "phase=decode", *overrides])
    assert not plan.variants and plan.skipped[0].reason.startswith(reason), plan.skipped


@needs_llamacpp
def test_a_window_llamacpp_ignores_is_planned_where_the_calls_fit_in_it():
    plan = plan_jobs(["backend=llamacpp", "model=mistral", "phase=prefill", "phase.prompt_len=8"])
    assert [pv.name for pv in plan.variants] == ["mistral_prefill_llamacpp_cpu"], plan.skipped


@needs_llamacpp
def test_q4_k_m_is_planned_where_every_row_holds_whole_blocks():
    plan = plan_jobs(["backend=llamacpp", "phase=prefill", "model.quant=q4_k_m", *WIDE])
    assert [pv.name for pv in plan.variants] == ["llama_prefill_llamacpp_cpu_q4_k_m"], plan.skipped


def test_every_other_backend_refuses_q4_k_m_with_a_reason():
    others = ("eager", "compile", "onnxruntime", "onnxruntime_genai", "openvino", "executorch")
    plan = plan_jobs(*[["phase=decode", f"backend={b}", "model.quant=q4_k_m"] for b in others])
    assert not plan.variants and len(plan.skipped) == len(others)
    for s in plan.skipped:
        b = s.variant.backend.name
        assert s.reason.startswith((f"backend {b} cannot run model.quant=q4_k_m", f"backend {b} needs")), s.reason


def test_without_its_extra_the_point_is_skipped_with_the_install(monkeypatch):
    monkeypatch.setattr("tasks.contract.installed", lambda distribution: distribution != "llama-cpp-python")
    plan = plan_jobs(["backend=llamacpp", "phase=prefill"], ["backend=llamacpp", "phase=decode"])
    assert not plan.variants
    assert {s.reason for s in plan.skipped} == {"backend llamacpp needs llama-cpp-python, not installed: pip install llama-cpp-python"}


def test_row_sizes_are_the_quantised_layers_input_widths():
    assert row_sizes({"hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9}) == {
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_attention_heads * head_dim": 576,
    }
    assert row_sizes({"hidden_size": 64, "num_attention_heads": 4, "head_dim": 32})["num_attention_heads * head_dim"] == 128


# -- slow: exports, benchmarks, a sweep ------------------------------------------------------------
@pytest.mark.slow
@needs_llamacpp
@pytest.mark.parametrize(
    ("quant", "tensor_type", "extra"),
    [("none", "F32", []), ("int8", "Q8_0", []), ("int4", "Q4_0", []), ("q4_k_m", "Q4_K", WIDE)],
)
def test_each_quant_is_llamacpps_own_type_in_the_file(planned_variant, quant, tensor_type, extra):
    result, _ = planned_variant("backend=llamacpp", "phase=decode", f"model.quant={quant}", *extra)
    meta = result.details
    assert result.artifact.endswith("model.gguf")
    ops = result.anatomy["ops"]
    assert ops.get(f"tensor.{tensor_type}", 0) > 0, ops
    assert result.anatomy["constant_bytes"] <= result.anatomy["artifact_bytes"]
    assert meta["gguf_vocab"] == "placeholder" and meta["gguf_outtype"] == "ALL_F32"
    assert meta.get("gguf_quant_type") == (None if quant == "none" else tensor_type.replace("Q4_K", "Q4_K_M"))


@pytest.mark.slow
@needs_llamacpp
@pytest.mark.parametrize(("model", "phase", "quant"), [("llama", "prefill", "none"), ("llama", "decode", "none"),
                                                       ("qwen2", "decode", "int8"), ("llama", "decode", "int4")])  # fmt: skip
def test_it_runs_the_gguf_with_parity_through_its_own_cache_and_quality(planned_variant, model, phase, quant):
    from tasks.jobs import bench_job

    _, spec = planned_variant(f"model={model}", "backend=llamacpp", f"phase={phase}", f"model.quant={quant}")
    result = bench_job(dataclasses.replace(spec, bench=dataclasses.replace(spec.bench, quality=True)))
    assert result.ok, result.failure and result.failure.traceback
    assert result.parity["passed"] and result.metrics["parity_steps"] == (1 if phase == "prefill" else DECODE.parity_steps)
    assert result.params["llamacpp_n_threads"] == result.params["llamacpp_n_threads_batch"] == FAST_BENCH.threads
    assert result.metrics["latency_ms_median"] > 0
    if quant == "none":  # float32: the reference itself, to llama.cpp's float arithmetic
        assert result.metrics["parity_max_abs_diff"] < 1e-4 and result.metrics["quality_reference"] == 1.0
    else:  # measured against float32 eager
        assert 0 <= result.metrics["quality_kl"] and 0 <= result.metrics["quality_top1"] <= 1


@pytest.mark.slow
@needs_llamacpp
def test_a_small_sweep_runs_every_point_or_skips_it_with_a_reason(tmp_path, mlflow_db, cache_override):
    from orchestrator.run.sweep import run_sweep

    uri = mlflow_db(tmp_path)
    common = [cache_override, f"tracking.uri={uri}", f"tracking.artifact_root={tmp_path / 'mlartifacts'}", "backend=llamacpp"]
    jobs = [[f"model={m}", f"phase={p}", f"model.quant={q}", *common]
            for m in ("llama", "qwen2") for p in ("prefill", "decode") for q in ("none", "int8", "int4", "q4_k_m")]  # fmt: skip
    configs, overrides = compose_jobs(*jobs)
    outcomes = run_sweep(configs, overrides, tmp_path / "out", "pytest: llamacpp")
    by_name = {o.name: o for o in outcomes.values()}
    assert len(by_name) == 16, sorted(by_name)
    for name, o in by_name.items():
        if name.endswith("_q4_k_m"):  # the tiny presets' rows (64) hold no whole 256-weight block
            assert o.status == "skipped" and "(Q4_K_M)" in o.error, (name, o)
        else:
            assert o.status == "ok", (name, o.error)
            assert o.metrics["parity_max_rel_error"] <= (1e-3 if name.endswith("_cpu") else 0.7), (name, o.metrics)


def test_a_cache_type_it_does_not_know_is_refused_before_any_work():
    from orchestrator.plan.config import ConfigError, validate_all

    configs, overrides = compose_jobs(["backend=llamacpp", "backend.options.cache_type=q8"])
    with pytest.raises(ConfigError, match=r"backend.options.cache_type='q8' is not allowed; choose one of: auto, f32, f16"):
        validate_all(configs, overrides)


def test_repack_auto_is_llamacpps_default_but_off_on_a_build_that_runs_amx():
    from types import SimpleNamespace

    from tasks.runtimes.llamacpp import repack

    def built(info: str) -> SimpleNamespace:
        return SimpleNamespace(llama_print_system_info=lambda: info.encode())

    plain = built("CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 1 | REPACK = 1 |")
    amx = built("CPU : SSE3 = 1 | AVX512_VNNI = 1 | AMX_INT8 = 1 | REPACK = 1 |")
    assert repack(plain, "auto") and not repack(amx, "auto")
    assert repack(amx, "true") and not repack(plain, "false")


def test_a_repack_value_it_does_not_know_is_refused_before_any_work():
    from orchestrator.plan.config import ConfigError, validate_all

    configs, overrides = compose_jobs(["backend=llamacpp", "backend.options.repack=maybe"])
    with pytest.raises(ConfigError, match=r"backend.options.repack='maybe' is not allowed; choose one of: auto, true, false"):
        validate_all(configs, overrides)

"""model.kv_cache=update_cache with model.attention=custom_sdpa: the KV cache inside the
graph, written and read by ExecuTorch's llama custom ops. Multi-step parity through the
program's own cache (filled with the context first) on ExecuTorch, eager and compile; the
.pte's anatomy names the custom ops; the pair is refused apart, and ONNX is skipped."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.plan.config import ConfigError
from tasks.jobs import bench_in_fresh_process, bench_job, export_job
from tasks.specs import CONTEXT, BenchSpec, ExportSpec, PhaseSpec, check_model_choices
from tests.conftest import FAST_BENCH, model_spec
from tests.test_plan import names, plan_of

PAIR = {"kv_cache": "update_cache", "attention": "custom_sdpa"}
DECODE = PhaseSpec("decode", batch=2, context_len=24, cache_len=40, parity_steps=8)
PREFILL = PhaseSpec("prefill", batch=2, prompt_len=16)


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """One export per (model, phase, format), made when a test first asks for it."""
    made = {}

    def get(model: str, phase: PhaseSpec, fmt: str):
        key = (model, phase.name, fmt)
        if key not in made:
            out = tmp_path_factory.mktemp(f"{model}-{phase.name}-{fmt}") / "entry"
            made[key] = export_job(ExportSpec("k", model_spec(model, **PAIR), phase, fmt, str(out)))
            assert made[key].ok, made[key].failure and made[key].failure.traceback
        return made[key]

    return get


def bench(export, model: str, phase: PhaseSpec, runtime: str, fresh: bool = False):
    """`fresh`: in a spawned process, where nothing loaded the custom ops before the session."""
    spec = BenchSpec("v", runtime, "cpu", model_spec(model, **PAIR), phase, export.out_dir, bench=FAST_BENCH)
    result = bench_in_fresh_process(spec, timeout_s=600) if fresh else bench_job(spec)
    assert result.ok, result.failure and (result.failure.error + result.failure.traceback)
    return result


@pytest.mark.slow  # XNNPACK lowering of two models: the fast tier checks the graph in test_graphs.py
@pytest.mark.parametrize("model", ["llama", "phi3"])
def test_executorch_decodes_through_its_own_cache(exports, model):
    """Context filled through the program, then 8 steps each against what the last wrote."""
    export = exports(model, DECODE, "executorch")
    result = bench(export, model, DECODE, "executorch", fresh=model == "llama")
    assert result.parity["steps"] == 8 and result.parity["passed"], result.parity
    assert result.parity["max_abs_diff"] < 1e-4 and result.parity["top1_agreement"] == 1.0
    assert export.input_shapes == {"input_ids": [2, 1], "cache_position": [1], CONTEXT: [2, 24]}
    # per layer one custom_sdpa and two update_cache, none in the delegate; the caches are the program's
    layers = export.details["layers"]
    assert export.details["custom_ops"] == f"llama.custom_sdpa x{layers}, llama.update_cache x{2 * layers}"
    assert export.details["mutable_buffers"] == 2 * layers
    outside = export.anatomy["outside_delegates"]
    assert outside["llama.update_cache"] == 2 * layers and outside["llama.custom_sdpa"] == layers
    assert "aten.index_put" not in export.anatomy["ops"] and export.anatomy["partitions"]
    # the cache is read where it is, not repeated for GQA: custom_sdpa reads C + 1 slots per layer
    cache_bytes = 2 * layers * 2 * 25 * export.details["kv_heads"] * export.details["head_dim"] * 4
    assert result.metrics["decode_cache_bytes_per_step"] == cache_bytes


@pytest.mark.slow  # an XNNPACK lowering
def test_linear_only_delegation_decodes_with_parity(tmp_path):
    """delegate=xnnpack_linear (export_llama -X's partitioning): only linear layers in XNNPACK,
    the rest on portable kernels; 8 steps through the program's own cache."""
    spec = ExportSpec(
        "k", model_spec("llama", **PAIR), DECODE, "executorch", str(tmp_path / "e"), {"delegate": "xnnpack_linear"}
    )
    export = export_job(spec)
    assert export.ok, export.failure and export.failure.traceback
    assert export.details["delegate"] == "xnnpack_linear"
    parts = export.anatomy["partitions"]
    assert parts and all(set(p["ops"]) == {"aten.linear"} for p in parts), parts
    assert "aten.mul" in export.anatomy["outside_delegates"]  # elementwise ops run portable
    result = bench(export, "llama", DECODE, "executorch")
    assert result.parity["steps"] == 8 and result.parity["passed"], result.parity
    assert result.parity["max_abs_diff"] < 1e-4 and result.parity["top1_agreement"] == 1.0


@pytest.mark.slow
def test_a_repeated_decode_step_is_idempotent(exports):
    """The timed call, repeated at one position, returns the first step's reference each time."""
    from tasks.runtimes import runtime_module
    from tasks.worker.entries import load_export

    export = exports("llama", DECODE, "executorch")
    meta, feeds, parity = load_export(export.out_dir)
    spec = BenchSpec("v", "executorch", "cpu", model_spec("llama", **PAIR), DECODE, export.out_dir, bench=FAST_BENCH)
    session = runtime_module("executorch").load(spec, meta, feeds)
    call = session.bind(feeds)
    for _ in range(3):
        (logits,) = call()
        np.testing.assert_allclose(logits.numpy(), parity["ref_logits"][0], atol=1e-4)


@pytest.mark.parametrize("model", ["llama", "phi3"])
def test_eager_runs_the_custom_ops_with_parity(exports, model):
    result = bench(exports(model, DECODE, "none"), model, DECODE, "eager")
    assert result.parity["steps"] == 8 and result.parity["passed"] and result.parity["max_abs_diff"] < 1e-4


@pytest.mark.slow  # two cold compiles (the context's length, then one token): minutes on a shared machine
def test_compile_runs_the_custom_ops_with_parity(exports):
    result = bench(exports("llama", DECODE, "none"), "llama", DECODE, "compile")
    assert result.parity["steps"] == 8 and result.parity["passed"] and result.parity["max_abs_diff"] < 1e-4


def test_eager_prefill_compares_logits(exports):
    export = exports("phi3", PREFILL, "none")
    assert export.input_shapes == {"input_ids": [2, 16], "cache_position": [16]}
    result = bench(export, "phi3", PREFILL, "eager")
    assert result.parity["passed"] and "cache_max_abs_diff" not in result.parity  # no cache comes out


@pytest.mark.slow
@pytest.mark.parametrize("model", ["llama", "phi3"])
def test_executorch_prefill(exports, model):
    result = bench(exports(model, PREFILL, "executorch"), model, PREFILL, "executorch")
    assert result.parity["passed"] and result.parity["max_abs_diff"] < 1e-4


@pytest.mark.parametrize(
    "kv_cache,attention,message",
    [
        ("update_cache", "sdpa", "model.kv_cache='update_cache' needs model.attention='custom_sdpa' (got model.attention='sdpa')"),
        ("static", "custom_sdpa", "model.attention='custom_sdpa' needs model.kv_cache='update_cache' (got model.kv_cache='static')"),
    ],
)
def test_the_custom_ops_come_as_a_pair(kv_cache, attention, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_model_choices(kv_cache, attention)
    check_model_choices("update_cache", "custom_sdpa")
    check_model_choices("dynamic", "math")


def test_a_lone_custom_op_is_refused_when_planning():
    with pytest.raises(ConfigError, match="model.attention='custom_sdpa' needs model.kv_cache='update_cache'"):
        plan_of(**{"model.attention": "custom_sdpa"})


def test_onnxruntime_is_planned_as_skipped_with_its_reason():
    plan = plan_of(
        phase="decode", backend="onnxruntime,executorch,eager", **{"model.kv_cache": "update_cache", "model.attention": "custom_sdpa"}
    )
    assert names(plan) == ["llama_decode_executorch_cpu", "llama_decode_eager_cpu"]
    assert [(s.name, s.reason) for s in plan.skipped] == [
        (
            "llama_decode_onnxruntime_cpu",
            "backend onnxruntime cannot run model.kv_cache=update_cache: ONNX has no llama::update_cache / "
            "custom_sdpa (ExecuTorch's LLM custom ops)",
        )
    ]
    (ours,) = [pv for pv in plan.variants if pv.bench.runtime == "executorch"]
    assert ours.bench.phase.cache_len == ours.bench.phase.context_len + decode_headroom()


def decode_headroom() -> int:
    from tasks.phases.decode import HEADROOM

    return HEADROOM


def test_a_captured_phase_refuses_an_in_graph_cache():
    from tasks.phases import captured

    with pytest.raises(ConfigError, match="an in-graph cache takes none"):
        captured.normalize(PhaseSpec("captured", batch=1, app="examples.generate_app:run"), "update_cache")


def test_the_custom_ops_match_the_masked_modules():
    """update_cache writes its slots only; custom_sdpa over the first start + S slots, GQA
    inside, equals sdpa over the same keys with the causal mask from the positions."""
    import torch

    from tasks.model import kv_cache, sdpa

    b, h, hkv, d, s, start = 2, 4, 2, 16, 5, 7
    g = torch.Generator().manual_seed(0)
    cache = kv_cache.make_kv_cache("update_cache")
    cache.allocate(b, 20, hkv, d, torch.float32)
    k0, v0 = torch.randn(b, start, hkv, d, generator=g), torch.randn(b, start, hkv, d, generator=g)
    cache.update(k0, v0, 0)
    k1, v1 = torch.randn(b, s, hkv, d, generator=g), torch.randn(b, s, hkv, d, generator=g)
    k_all, v_all = cache.update(k1, v1, start)
    torch.testing.assert_close(k_all[:, start : start + s], k1)
    assert not k_all[:, start + s :].any()
    q = torch.randn(b, s, h, d, generator=g)
    out = sdpa.make_attention("custom_sdpa")(q, k_all, v_all, start, 0.3)  # [B, S, H, D]
    n = start + s
    mask = torch.arange(n)[None, :] <= torch.arange(start, n)[:, None]
    ref = sdpa.make_attention("sdpa")(q.transpose(1, 2), k_all[:, :n].transpose(1, 2), v_all[:, :n].transpose(1, 2), mask, 0.3)
    torch.testing.assert_close(out, ref.transpose(1, 2), atol=1e-5, rtol=1e-5)


def test_eager_on_cuda_is_planned_as_skipped():
    plan = plan_of(
        phase="decode", backend="eager", device="cpu,cuda", **{"model.kv_cache": "update_cache", "model.attention": "custom_sdpa"}
    )
    assert names(plan) == ["llama_decode_eager_cpu"]
    assert [(s.name, s.reason) for s in plan.skipped] == [
        (
            "llama_decode_eager_cuda",
            "backend eager cannot run model.kv_cache=update_cache on device=cuda: ExecuTorch's "
            "llama::update_cache / custom_sdpa have CPU kernels only",
        )
    ]

"""backend.export_options.exporter=genai: onnxruntime-genai's model builder as the ONNX exporter,
timed and checked by the same harness as torch.onnx (tasks/export/_genai.py, tasks/export/onnx_io.py)."""

from __future__ import annotations

import dataclasses

import pytest

from tasks.export._genai import available
from tests.conftest import FAST_BENCH, plan_jobs

GENAI = "backend.export_options.exporter=genai"
DYNAMIC = "model.kv_cache=dynamic"
needs_genai = pytest.mark.skipif(not available(), reason="pip install 'phasesweep[genai]'")
builds = pytest.mark.slow  # the builder makes an ONNX model: an export (planning and refusals stay fast)


@needs_genai
def test_the_exporter_axis_plans_two_readably_named_variants():
    jobs = [["phase=decode", DYNAMIC, f"backend.export_options.exporter={e}"] for e in ("torch", "genai")]
    plan = plan_jobs(*jobs)
    assert not plan.skipped
    names = {pv.name: pv for pv in plan.variants}
    assert set(names) == {"llama_decode_onnxruntime_cpu", "llama_decode_onnxruntime_genai_cpu"}
    torch_, genai = names["llama_decode_onnxruntime_cpu"], names["llama_decode_onnxruntime_genai_cpu"]
    assert torch_.export_key != genai.export_key  # two artifacts, two cache entries
    assert genai.variant.params["backend.export_options.exporter"] == "genai"
    assert torch_.variant.params["backend.export_options.exporter"] == "torch"


def test_a_bad_exporter_is_refused_naming_the_key_and_the_choices():
    from tasks.specs import ConfigError

    with pytest.raises(ConfigError, match=r"backend.export_options.exporter='tvm' is not allowed; choose one of: torch, genai"):
        plan_jobs(["backend.export_options.exporter=tvm"])


@needs_genai
@pytest.mark.parametrize(
    "overrides, why",
    [
        (["phase=decode", DYNAMIC, "model.dtype=float16"], "builds model.dtype in float32"),
        (["phase=prefill", "model.attention=math"], "the builder chooses its own attention"),
        (["phase=prefill", "device=cuda"], "CPU execution provider only"),
    ],
)
def test_points_the_builder_cannot_make_are_planned_as_skipped_with_the_reason(overrides, why):
    plan = plan_jobs([*overrides, GENAI])
    assert not plan.variants and len(plan.skipped) == 1
    assert why in plan.skipped[0].reason
    assert "_onnxruntime_genai_" in plan.skipped[0].name


def test_without_onnxruntime_genai_or_for_a_family_the_builder_lacks_the_point_is_skipped(monkeypatch):
    from tasks.export import _genai

    monkeypatch.setattr(_genai, "available", lambda: False)
    (skipped,) = plan_jobs(["phase=prefill", GENAI]).skipped
    assert "pip install 'phasesweep[genai]'" in skipped.reason
    monkeypatch.setattr(_genai, "available", lambda: True)  # planning never imports it
    monkeypatch.delitem(_genai.ARCHITECTURES, "phi3")
    plan = plan_jobs(["phase=prefill", "model=phi3", GENAI], ["phase=prefill", "model=phi3"])
    assert [pv.name for pv in plan.variants] == ["phi3_prefill_onnxruntime_cpu"]  # exporter=torch still runs
    assert "builds model.family in llama" in plan.skipped[0].reason


@builds
@needs_genai
@pytest.mark.parametrize(
    "model, phase, kv_cache",
    [
        ("llama", "prefill", "static"),
        ("llama", "decode", "dynamic"),
        ("llama", "decode", "static"),
        ("phi3", "prefill", "static"),
        ("phi3", "decode", "dynamic"),
        ("phi3", "decode", "static"),
        ("llama-tied", "decode", "static"),
    ],
)
def test_the_builders_model_matches_transformers(planned_variant, model, phase, kv_cache):
    """Decode: 8 steps, each fed the present cache the step before returned (static: the same
    buffers, written in place); prefill: the logits and every present.* against the cache
    transformers filled. llama-tied: one table for the embeddings and the output head, as
    Llama-3.2-1B has."""
    from tasks.jobs import bench_job

    model, tied = model.removesuffix("-tied"), model.endswith("-tied")
    extra = ["+model.sizes.tiny.tie_word_embeddings=true"] if tied else []
    export, bench = planned_variant(f"model={model}", f"phase={phase}", f"model.kv_cache={kv_cache}", GENAI, *extra)
    assert export.details["tied_embeddings"] == int(tied)
    assert export.details["exporter"] == "genai" and export.details["genai_precision"] == "fp32"
    result = bench_job(dataclasses.replace(bench, bench=FAST_BENCH))
    assert result.ok and result.parity["passed"], result.failure
    if phase == "decode":
        assert result.parity["steps"] == 8
    else:
        assert result.parity["cache_max_abs_diff"] <= result.parity["atol"]
    assert result.metrics["latency_ms_median"] > 0


@builds
@needs_genai
def test_the_anatomy_shows_what_the_builder_fused_and_torch_did_not(exported, planned_variant):
    from tasks.export.onnx import fused_counts, read_metadata
    from tasks.runtimes import runtime_module
    from tasks.worker.entries import load_export

    genai = exported("llama", "decode", "onnx", kv_cache="dynamic", exporter="genai")
    torch_ = exported("llama", "decode", "onnx", ort_fusions=False)  # standard ops only
    layers = genai.details["layers"]
    ours, theirs = fused_counts(torch_.anatomy), fused_counts(genai.anatomy)
    assert theirs["GroupQueryAttention"] == layers and ours["GroupQueryAttention"] == 0
    fused = fused_counts(exported("llama", "decode", "onnx").anatomy)  # backend.export_options.ort_fusions
    assert fused["GroupQueryAttention"] == layers and fused["SkipSimplifiedLayerNormalization"] == 2 * layers
    assert theirs["SkipSimplifiedLayerNormalization"] == 2 * layers
    assert genai.anatomy["transposes"] == 0 < torch_.anatomy["transposes"]
    assert 0 < theirs["MatMul"] <= ours["MatMul"]  # q, k, v fused into one projection

    export, bench = planned_variant("model=llama", "phase=decode", DYNAMIC, GENAI)
    meta, feeds, _ = load_export(export.out_dir)
    session = runtime_module("onnxruntime").load(bench, meta, feeds)
    assert session.metrics["ort_graph_GroupQueryAttention"] == layers
    assert session.metrics["ort_graph_transposes"] == 0
    import onnxruntime as ort

    props = ort.InferenceSession(f"{export.out_dir}/{meta['artifact']}").get_modelmeta().custom_metadata_map
    described = read_metadata(props)
    assert described["exporter"] == "genai" and "attention_mask" in described["inputs"]


@builds
@needs_genai
def test_a_static_cache_takes_the_new_position_in_place_and_a_dynamic_one_grows(planned_variant):
    """GroupQueryAttention writes into the bound past buffer when it has a free slot at
    cache_position: no copy of the cache per step, as onnxruntime-genai's shared buffer."""
    import numpy as np

    from tasks.runtimes import runtime_module
    from tasks.specs import PAST
    from tasks.worker.entries import load_export

    for kv_cache in ("static", "dynamic"):
        export, bench = planned_variant("model=llama", "phase=decode", f"model.kv_cache={kv_cache}", GENAI)
        meta, feeds, _ = load_export(export.out_dir)
        session = runtime_module("onnxruntime").load(bench, meta, feeds)
        inputs = session.place(feeds)
        first = f"{PAST}0.key"
        ctx, slots = int(feeds["cache_position"][0]), feeds[first].shape[2]
        before = inputs[first].numpy().copy()
        _, key, *_ = session.step(inputs)
        after = inputs[first].numpy()
        if kv_cache == "static":
            assert slots > ctx and key.shape() == list(feeds[first].shape)
            assert np.abs(after[:, :, ctx]).max() > 0 == np.abs(before[:, :, ctx]).max()  # written in place
            np.testing.assert_array_equal(after[:, :, :ctx], before[:, :, :ctx])
        else:
            assert slots == ctx and key.shape()[2] == ctx + 1
            np.testing.assert_array_equal(after, before)

"""backend.export_options.ort_fusions: the torch exporter's attention and cache update as
ONNX Runtime's com.microsoft.GroupQueryAttention (tasks/model/cached_attention.py,
tasks/export/_ort_attention.py), its static buffer written in place (tasks/export/onnx_io.py)."""

from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import onnx
import pytest
import torch

from tasks.model.cached_attention import fused_attention, unfusable
from tasks.model.graphs import DecodeGraph, PrefillGraph, swap_attention
from tasks.model.models import build_model
from tests.conftest import DECODE, model_spec


def _graphs(family: str, kv_cache: str, window: int = 0):
    spec = model_spec(family, kv_cache=kv_cache)
    if window:
        spec = replace(spec, arch={**spec.arch, "sliding_window": window})
    model = build_model(spec)
    swapped = swap_attention(copy.deepcopy(model), family, kv_cache, spec.attention)
    return PrefillGraph(swapped), DecodeGraph(swapped)


@pytest.mark.parametrize("kv_cache", ["static", "dynamic"])
@pytest.mark.parametrize("family,window", [("llama", 0), ("mistral", 6), ("gemma2", 0)])
def test_the_fused_op_computes_what_the_unfused_graph_does(family, window, kv_cache):
    """The op's eager kernel: a prompt, then three decode steps (past a window of 6), fused
    against unfused, logits and every present cache (gemma2: its soft-capped attention)."""
    prefill, decode = _graphs(family, kv_cache, window)
    ids = torch.randint(0, 100, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        runs = []
        for fused in (False, True):
            with fused_attention(decode) if fused else torch.no_grad():
                logits, *present = prefill(ids[:, :9])
                out = [logits, *present]
                if kv_cache == "static":
                    present = [torch.nn.functional.pad(t, (0, 0, 0, 3)) for t in present]
                for t in range(9, 12):
                    logits, *present = decode(ids[:, t : t + 1], torch.tensor([t]), *present)
                    out += [logits, *present]
            runs.append(out)
    assert unfusable(decode) is None and not any(layer.self_attn.fused for layer in decode.lm.model.layers)
    for a, b in zip(*runs, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_a_graph_without_the_swapped_attention_is_not_fused():
    model = build_model(model_spec("llama"))
    graph = DecodeGraph(model)  # transformers' own attention
    assert "not phasesweep's swapped attention" in unfusable(graph)


def _decode(planned_variant, *overrides: str):
    return planned_variant("model=llama", "phase=decode", "backend=onnxruntime", *overrides)


@pytest.mark.slow
@pytest.mark.parametrize("kv_cache", ["static", "dynamic"])
def test_the_decode_graph_is_group_query_attention_and_matches_transformers(planned_variant, kv_cache):
    """One GroupQueryAttention per layer, no cache copies (ScatterND); parity over the decode
    steps on the session's own loop (a static buffer shared in place)."""
    from tasks.jobs import bench_job

    result, bench = _decode(planned_variant, f"model.kv_cache={kv_cache}")
    ops = [n.op_type for n in onnx.load(result.artifact, load_external_data=False).graph.node]
    layers = result.details["onnx_fused_attention_layers"]
    assert layers == ops.count("GroupQueryAttention") > 0 and "ScatterND" not in ops
    run = bench_job(bench)
    assert run.ok, run.failure
    assert run.parity["passed"] and run.parity["steps"] == DECODE.parity_steps >= 8, run.parity


@pytest.mark.slow
def test_the_static_buffer_is_written_in_place_at_its_slot_only(planned_variant):
    """present.i is past_key_values.i's own buffer: the step writes slot cache_position and
    leaves every other slot as it was."""
    from tasks.runtimes import onnxruntime as ort_runtime
    from tasks.worker.entries import load_export

    result, bench = _decode(planned_variant)
    meta, feeds, _ = load_export(result.out_dir)
    session = ort_runtime.RUNTIME.load(bench, meta, feeds)
    inputs = session.place({n: a.copy() for n, a in feeds.items()})
    before = inputs["past_key_values.0.key"].numpy().copy()
    _, k0, *_ = session.step(inputs)
    assert k0.data_ptr() == inputs["past_key_values.0.key"].data_ptr()  # the same buffer
    after, ctx = k0.numpy(), DECODE.context_len
    np.testing.assert_array_equal(np.delete(after, ctx, axis=2), np.delete(before, ctx, axis=2))
    assert np.abs(after[:, :, ctx]).sum() > 0 and not before[:, :, ctx].any()


@pytest.mark.slow
def test_ort_fusions_false_exports_the_unfused_graph(planned_variant):
    result, _ = _decode(planned_variant, "backend.export_options.ort_fusions=false")
    ops = [n.op_type for n in onnx.load(result.artifact, load_external_data=False).graph.node]
    assert "GroupQueryAttention" not in ops and "ScatterND" in ops
    assert result.details["onnx_ort_fusions_skip"] == "backend.export_options.ort_fusions=false"

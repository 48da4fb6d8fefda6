"""The swapped prefill/decode graphs against the unmodified transformers model, eagerly:
every KV cache x attention implementation, GQA/MQA/MHA, head dims other than 64, batch
above one, and a context at the model's maximum length."""

from __future__ import annotations

import itertools

import pytest

from tasks.jobs import bench_job, export_job
from tasks.specs import (
    ATTENTIONS,
    KV_CACHES,
    BenchOptions,
    BenchSpec,
    ConfigError,
    ExportSpec,
    PhaseSpec,
    check_model_choices,
)
from tests.conftest import model_spec

FAST = BenchOptions(
    warmup_iters=1, warmup_max_seconds=0.2, min_iters=2, min_seconds=0.0, max_seconds=1.0, target_ci=10.0, threads=1
)  # parity is what these tests check; the timing loop stops at once
SHAPES = {
    "gqa_hd16": {},  # the tiny preset: 4 heads sharing 2 kv heads, head_dim 16
    "mqa_hd32": {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32},
    "mha_hd8": {"num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 8},
}


def eager_parity(tmp_path, model, phase, **arch):
    base = model_spec(model)
    if arch and model == "phi3":  # Phi-3 derives head_dim from hidden_size / heads
        arch = {k: v for k, v in arch.items() if k != "head_dim"}
        arch["hidden_size"] = 64
    spec = base.__class__(**{**base.__dict__, "arch": {**base.arch, **arch}})
    export = export_job(ExportSpec("k", spec, phase, "none", str(tmp_path / "export")))
    assert export.ok, export.failure and export.failure.traceback
    result = bench_job(BenchSpec("v", "eager", "cpu", spec, phase, export.out_dir, bench=FAST))
    assert result.ok, result.failure and (result.failure.error + result.failure.traceback)
    return result.parity


def _runs(kv_cache: str, attention: str) -> bool:
    try:
        check_model_choices(kv_cache, attention)
    except ConfigError:
        return False
    return True


@pytest.mark.parametrize(
    "model,kv_cache,attention",
    [c for c in itertools.product(["llama", "phi3"], KV_CACHES, ATTENTIONS) if _runs(*c[1:])],
)
def test_decode_steps_match_transformers(tmp_path, model, kv_cache, attention):
    base = model_spec(model, kv_cache=kv_cache, attention=attention)
    phase = PhaseSpec("decode", batch=3, context_len=20, parity_steps=8)
    export = export_job(ExportSpec("k", base, phase, "none", str(tmp_path / "export")))
    result = bench_job(BenchSpec("v", "eager", "cpu", base, phase, export.out_dir, bench=FAST))
    assert result.ok, result.failure
    assert result.parity["steps"] == 8 and result.parity["max_abs_diff"] < 1e-4
    assert result.parity["top1_agreement"] == 1.0


@pytest.mark.parametrize("model", ["llama", "phi3"])
@pytest.mark.parametrize("shape", SHAPES)
def test_head_layouts_and_dims(tmp_path, model, shape):
    for phase in (PhaseSpec("prefill", 2, prompt_len=12), PhaseSpec("decode", 2, context_len=12)):
        parity = eager_parity(tmp_path / phase.name, model, phase, **SHAPES[shape])
        assert parity["passed"], parity


@pytest.mark.slow
def test_context_at_the_model_maximum(tmp_path):
    """Decode at position 4088 of a 4096-position model, 8 steps up to the last slot."""
    phase = PhaseSpec("decode", batch=1, context_len=4088, parity_steps=8)
    parity = eager_parity(tmp_path, "llama", phase)
    assert parity["passed"] and parity["steps"] == 8

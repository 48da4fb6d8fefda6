"""Inputs of every phase, generated from the model config, on both model families."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tasks.models import build_model, model_dims
from tasks.phases import check_phase, make_phase_data
from tasks.specs import PhaseSpec
from tests.conftest import DECODE, PREFILL, model_spec


@pytest.fixture(scope="module", params=["llama", "phi3"])
def model(request):
    return build_model(model_spec(request.param))


def test_prefill_inputs_and_reference(model):
    dims = model_dims(model)
    data = make_phase_data(model, PREFILL, "static")
    assert data.shapes() == {"input_ids": [2, 16]}
    ids = data.feeds["input_ids"]
    assert ids.dtype == np.int64 and 0 <= ids.min() and ids.max() < dims["vocab"]
    assert data.parity["ref_logits"].shape == (1, 2, 1, dims["vocab"])
    # the reference is the transformers model's own last-position logits
    with torch.no_grad():
        expected = model(input_ids=torch.from_numpy(ids)).logits[:, -1:]
    np.testing.assert_allclose(data.parity["ref_logits"][0], expected.numpy(), atol=1e-6)


@pytest.mark.parametrize("kv_cache,cache_len", [("static", 32), ("dynamic", 24)])
def test_decode_inputs_static_and_dynamic(model, kv_cache, cache_len):
    dims = model_dims(model)
    data = make_phase_data(model, DECODE, kv_cache)
    names = list(data.feeds)
    assert names[:2] == ["input_ids", "cache_position"]
    assert len(names) == 2 + 2 * dims["layers"]
    assert data.feeds["input_ids"].shape == (2, 1)
    assert data.feeds["cache_position"].tolist() == [24]  # the new token lands after the context
    kv_shape = (2, dims["kv_heads"], cache_len, dims["head_dim"])  # [B, H_kv, S, D]
    for name in names[2:]:
        assert data.feeds[name].shape == kv_shape
    if kv_cache == "static":  # positions past the context are empty in a fixed-size buffer
        assert not data.feeds["past_key_values.0.key"][:, :, 24:].any()
        assert data.feeds["past_key_values.0.key"][:, :, :24].any()
    assert data.parity["step_tokens"].shape == (2, 8)
    assert data.parity["ref_logits"].shape == (8, 2, 1, dims["vocab"])


def test_inputs_are_deterministic_per_seed(model):
    a = make_phase_data(model, PREFILL, "static").feeds["input_ids"]
    b = make_phase_data(model, PREFILL, "static").feeds["input_ids"]
    c = make_phase_data(model, PhaseSpec("prefill", 2, prompt_len=16, seed=1), "static").feeds["input_ids"]
    assert (a == b).all() and not (a == c).all()


@pytest.mark.parametrize(
    "phase,message",
    [
        (PhaseSpec("prefill", 1, prompt_len=5000), "phase.prompt_len=5000 must be in [1, 4096]"),
        (PhaseSpec("decode", 1, context_len=4090, parity_steps=8), "exceeds the model's max_position_embeddings=4096"),
        (PhaseSpec("decode", 1, context_len=100, cache_len=104, parity_steps=8), "phase.cache_len=104 cannot hold"),
    ],
)
def test_phase_that_does_not_fit_the_model_is_refused(model, phase, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        check_phase(phase, model_dims(model))


def test_sliding_window_models_refuse_spans_past_the_window():
    dims = {"max_positions": 4096, "sliding_window": 2047}
    check_phase(PhaseSpec("decode", 1, context_len=2039, parity_steps=8), dims)  # 2047 positions: fine
    with pytest.raises(ValueError, match="sliding_window=2047, and phase needs 2048 positions"):
        check_phase(PhaseSpec("decode", 1, context_len=2040, parity_steps=8), dims)
    with pytest.raises(ValueError, match="phase.prompt_len"):
        check_phase(PhaseSpec("prefill", 1, prompt_len=3000), dims)

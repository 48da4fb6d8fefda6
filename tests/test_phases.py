"""The phase modules: inputs generated from the model config (both families), their
normalisation, and the checks against the model's dimensions."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from tasks.model.models import build_model, model_dims
from tasks.phases import decode, phase_module
from tasks.specs import ConfigError, PhaseSpec
from tests.conftest import DECODE, PREFILL, model_spec


def make_data(model, phase: PhaseSpec, kv_cache: str = "static"):
    return phase_module(phase.name).make_data(model, phase, kv_cache, model_dims(model))


def check(phase: PhaseSpec, dims: dict[str, int] | None = None, kv_cache: str = "static") -> None:
    """What the driver does: normalise, then check (with the model's dimensions if given)."""
    module = phase_module(phase.name)
    module.check(module.normalize(phase, kv_cache), dims)


@pytest.fixture(scope="module", params=["llama", "phi3"])
def model(request):
    return build_model(model_spec(request.param))


def test_prefill_inputs_and_reference(model):
    dims = model_dims(model)
    data = make_data(model, PREFILL)
    assert data.shapes() == {"input_ids": [2, 16]}
    ids = data.feeds["input_ids"]
    assert ids.dtype == np.int64 and 0 <= ids.min() and ids.max() < dims["vocab"]
    assert data.parity["ref_logits"].shape == (1, 2, 1, dims["vocab"])
    # the reference is the transformers model's own last-position logits
    with torch.no_grad():
        expected = model(input_ids=torch.from_numpy(ids)).logits[:, -1:]
    np.testing.assert_allclose(data.parity["ref_logits"][0], expected.numpy(), atol=1e-6)
    assert list(data.feeds) == phase_module("prefill").io_names(PREFILL, dims["layers"])[0]


@pytest.mark.parametrize("kv_cache,cache_len", [("static", 24 + decode.HEADROOM), ("dynamic", 24)])
def test_decode_inputs_static_and_dynamic(model, kv_cache, cache_len):
    dims = model_dims(model)
    data = make_data(model, DECODE, kv_cache)
    names = list(data.feeds)
    assert names == decode.io_names(DECODE, dims["layers"])[0]
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
    a = make_data(model, PREFILL).feeds["input_ids"]
    b = make_data(model, PREFILL).feeds["input_ids"]
    c = make_data(model, replace(PREFILL, seed=1)).feeds["input_ids"]
    assert (a == b).all() and not (a == c).all()


def test_tokens_per_call():
    assert phase_module("prefill").tokens_per_call(PREFILL) == 16
    assert phase_module("decode").tokens_per_call(DECODE) == 1


# -- normalisation: equal work, equal spec -------------------------------------------------


def test_parity_steps_do_not_change_the_static_cache():
    """The timed shape is the context plus a fixed headroom, whatever parity checks."""
    base = PhaseSpec("decode", 1, context_len=128, parity_steps=8)
    lens = {decode.normalize(replace(base, parity_steps=n), "static").cache_len for n in (1, 2, 5, 8)}
    assert lens == {128 + decode.HEADROOM}


def test_parity_steps_do_not_change_the_decode_inputs(model):
    a = make_data(model, replace(DECODE, parity_steps=2))
    b = make_data(model, replace(DECODE, parity_steps=8))
    assert a.shapes() == b.shapes()
    for name in list(a.feeds)[1:]:  # the same context in the same cache (the step tokens are drawn per step count)
        np.testing.assert_array_equal(a.feeds[name], b.feeds[name])
    assert a.parity["ref_logits"].shape[0] == 2 and b.parity["ref_logits"].shape[0] == 8


def test_parity_steps_past_the_headroom_need_an_explicit_cache_len():
    steps = decode.HEADROOM + 4
    phase = PhaseSpec("decode", 1, context_len=128, parity_steps=steps)
    with pytest.raises(ConfigError, match=r"phase\.cache_len=136 \(the default: context_len \+ 8\) cannot hold") as err:
        check(phase)
    assert f"parity_steps={steps} = {128 + steps} positions" in str(err.value)
    check(replace(phase, cache_len=128 + steps))  # room made explicitly: fine
    check(phase, kv_cache="dynamic")  # a growing cache has no capacity to exceed


def test_normalize_drops_what_a_phase_does_not_use():
    p = phase_module("prefill").normalize(
        PhaseSpec("prefill", 2, prompt_len=16, context_len=512, cache_len=9), "static"
    )
    assert (p.context_len, p.cache_len, p.parity_steps) == (None, None, 1)
    d = decode.normalize(PhaseSpec("decode", 2, prompt_len=16, context_len=24), "dynamic")
    assert (d.prompt_len, d.cache_len) == (None, None)
    assert decode.normalize(PhaseSpec("decode", 2, context_len=24, cache_len=64), "static").cache_len == 64


def test_unknown_phase_names_the_choices():
    with pytest.raises(ConfigError, match="phase.name='verify' is not allowed; choose one of: captured, decode, prefill"):
        phase_module("verify")


# -- checks against the model --------------------------------------------------------------


@pytest.mark.parametrize(
    "phase,message",
    [
        (
            PhaseSpec("prefill", 1, prompt_len=5000),
            "phase.prompt_len=5000 exceeds the model's max_position_embeddings=4096",
        ),
        (
            PhaseSpec("decode", 1, context_len=4090, parity_steps=8),
            "phase.context_len + phase.parity_steps=4098 exceeds the model's max_position_embeddings=4096",
        ),
        (
            PhaseSpec("decode", 1, context_len=4000, cache_len=5000, parity_steps=8),
            "phase.cache_len=5000 exceeds the model's max_position_embeddings=4096",
        ),
        (PhaseSpec("decode", 1, context_len=100, cache_len=104, parity_steps=8), "phase.cache_len=104 cannot hold"),
        (PhaseSpec("prefill", 0, prompt_len=16), "phase.batch=0 must be >= 1"),
        (PhaseSpec("decode", 1, context_len=16, parity_steps=0), "phase.parity_steps=0 must be >= 1"),
    ],
)
def test_phase_that_does_not_fit_the_model_is_refused(model, phase, message):
    with pytest.raises(ConfigError) as err:
        check(phase, model_dims(model))
    assert message in str(err.value)


def test_spans_past_a_sliding_window_are_planned():
    """Sliding layers mask keys older than their window, so only max_positions limits a span."""
    dims = {"max_positions": 4096}
    check(PhaseSpec("decode", 1, context_len=4000, parity_steps=8), dims)
    check(PhaseSpec("prefill", 1, prompt_len=3000), dims)
    with pytest.raises(ConfigError, match="phase.prompt_len=5000 exceeds the model's max_position_embeddings=4096"):
        check(PhaseSpec("prefill", 1, prompt_len=5000), dims)

"""Quality beside speed: the metrics' math, the text split, and a broken model caught through
a real session (tasks/measure/quality.py, tasks/quality_windows.py)."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.measure.quality import corpus, log_softmax, metrics, split
from tests.conftest import model_spec


def test_identical_distributions_have_zero_kl_full_agreement_and_no_increase():
    logits = np.random.default_rng(0).normal(size=(50, 40)).astype(np.float32)
    targets = np.arange(50) % 40
    got = metrics(logits, log_softmax(logits).astype(np.float32), targets)
    assert got["quality_kl"] == pytest.approx(0.0, abs=1e-6)
    assert got["quality_top1"] == 1.0
    assert got["quality_ppl"] == pytest.approx(got["quality_ppl_ref"], rel=1e-5)
    assert got["quality_ppl_increase"] == pytest.approx(0.0, abs=1e-5)
    assert got["quality_tokens"] == 50


def test_kl_matches_its_definition_and_is_not_symmetric():
    p = np.array([[0.7, 0.2, 0.1]])
    q = np.array([[0.1, 0.3, 0.6]])
    want = float(np.sum(p * np.log(p / q)))
    got = metrics(np.log(q), np.log(p), None)
    assert got["quality_kl"] == pytest.approx(want, rel=1e-9)
    assert metrics(np.log(p), np.log(q), None)["quality_kl"] != pytest.approx(want, rel=1e-3)
    assert got["quality_top1"] == 0.0  # 2 against 0
    assert "quality_ppl" not in got  # synthetic tokens: no perplexity


def test_logits_shift_does_not_matter_and_perplexity_is_exp_mean_nll():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(30, 8))
    targets = rng.integers(0, 8, 30)
    ref = log_softmax(rng.normal(size=(30, 8)))
    a, b = metrics(logits, ref, targets), metrics(logits + 123.0, ref, targets)
    assert a == pytest.approx(b)
    nll = -log_softmax(logits)[np.arange(30), targets].mean()
    assert a["quality_ppl"] == pytest.approx(np.exp(nll))
    assert a["quality_ppl_increase"] == pytest.approx(a["quality_ppl"] / a["quality_ppl_ref"] - 1)


def test_uniform_logits_against_a_confident_reference():
    ref = np.log(np.full((10, 4), 0.01))
    ref[:, 0] = np.log(0.97)
    got = metrics(np.zeros((10, 4)), ref, np.zeros(10, dtype=int))
    assert got["quality_ppl"] == pytest.approx(4.0)
    assert got["quality_ppl_ref"] == pytest.approx(1 / 0.97)
    assert got["quality_kl"] == pytest.approx(0.97 * np.log(0.97 * 4) + 3 * 0.01 * np.log(0.04))


def test_shapes_must_agree():
    with pytest.raises(ValueError, match="differ"):
        metrics(np.zeros((3, 4)), np.zeros((3, 5)), None)


def test_held_out_split_is_the_last_tenth_at_a_paragraph():
    text = corpus()
    train, held = split(text)
    assert 400_000 < len(text) < 600_000
    assert 0.08 < len(held) / len(text) < 0.12
    assert text.startswith(train) and text.endswith(held)
    assert split(text) == (train, held)  # one definition, deterministic


def _memorising_model(vocab: int):
    """A tiny Llama trained until it predicts a cycle through its vocabulary (each token fixes
    the next, from any position): a model that learned something."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=128, attn_implementation="eager",
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    seq = torch.randperm(vocab, generator=torch.Generator().manual_seed(0)).repeat(3)[None]
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(80):
        loss = model(input_ids=seq[:, :96], labels=seq[:, :96]).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval(), seq[0]


@pytest.mark.parametrize("zeroed", [False, True])
def test_a_broken_model_is_caught_through_its_session(zeroed):
    """The decode windows of a model that learned a sequence, run through the eager runtime's
    session: itself agrees with its reference; with its Linear weights zeroed (a broken
    quantisation), perplexity rises many-fold and top-1 agreement collapses."""
    import copy

    import torch

    from tasks.phases import decode
    from tasks.phases._quality import reference_logprobs
    from tasks.runtimes.eager import TorchSession
    from tasks.specs import BenchSpec, PhaseSpec

    ref, seq = _memorising_model(vocab=48)
    variant = copy.deepcopy(ref)
    if zeroed:
        for module in variant.modules():
            if isinstance(module, torch.nn.Linear):
                torch.nn.init.zeros_(module.weight)
    phase = decode.normalize(PhaseSpec("decode", batch=1, context_len=24, parity_steps=2), "static")
    dims = {"layers": 1, "vocab": 48, "max_positions": 128}
    arrays, why = decode.quality_inputs(variant, ref, phase, "static", dims, lambda n: seq[:n], 40)
    assert arrays is not None, why
    assert arrays["q_ref_logprobs"].shape == (40, 48)
    assert np.allclose(
        arrays["q_ref_logprobs"][:2], reference_logprobs(ref, torch.as_tensor(arrays["q_tokens"][0]), 21)[0, :2]
    )
    graph = decode.build_graph(variant, phase, "llama", "static", "sdpa")
    spec = BenchSpec("v", "eager", "cpu", model_spec("llama"), phase, "")
    session = TorchSession(graph, spec, {"output_names": ["logits", "present.0.key", "present.0.value"]})
    feeds = {"input_ids": 0, "cache_position": 0, "past_key_values.0.key": 0, "past_key_values.0.value": 0}
    got = metrics(decode.quality_logits(session, phase, feeds, arrays), arrays["q_ref_logprobs"], arrays["q_targets"])
    assert got["quality_ppl_ref"] < 2.0  # the reference learned the sequence
    if zeroed:
        assert got["quality_ppl_increase"] > 10 and got["quality_top1"] < 0.2 and got["quality_kl"] > 1.0
    else:
        assert abs(got["quality_ppl_increase"]) < 1e-3 and got["quality_top1"] == 1.0 and got["quality_kl"] < 1e-6


class _Run:
    def __init__(self, **metrics):
        self.data = type("Data", (), {"metrics": metrics})()


def test_compare_flags_a_faster_variant_that_lost_quality():
    from orchestrator.read.quality_compare import PPL_LOSS, quality_cell, quality_changes, quality_summary

    base = {
        "a": _Run(quality_top1=0.99, quality_kl=1e-4, quality_ppl_increase=0.002),
        "b": _Run(quality_top1=1.0, quality_kl=1e-12),
        "c": _Run(quality_top1=0.99, quality_kl=1e-4, quality_ppl_increase=0.002),
        "d": _Run(latency_ms_median=1.0),  # no quality in one sweep: not compared
    }
    cand = {
        "a": _Run(quality_top1=0.80, quality_kl=0.2, quality_ppl_increase=0.002 + 3 * PPL_LOSS),
        "b": _Run(quality_top1=0.90, quality_kl=1e-2),
        "c": _Run(quality_top1=0.99, quality_kl=1e-4, quality_ppl_increase=0.002 + PPL_LOSS / 2),
        "d": _Run(quality_top1=1.0, quality_kl=0.0),
    }
    changes = quality_changes(base, cand)
    assert sorted(changes) == ["a", "b", "c"]
    assert changes["a"]["lost"] and changes["b"]["lost"] and not changes["c"]["lost"]
    assert changes["a"]["ppl_increase_change"] == pytest.approx(3 * PPL_LOSS)
    assert changes["b"]["top1_change"] == pytest.approx(-0.1)
    assert "LOST QUALITY (faster, not a win)" in quality_cell(changes["a"], "faster")
    assert quality_cell(changes["c"], "faster") == "ppl +0.20% -> +0.70%"
    assert quality_cell(None, "same") == "-"
    assert "2 lost quality: a, b" in quality_summary(changes)[0]


@pytest.mark.parametrize("kind", ["prefill", "decode"])
def test_a_captured_call_is_measured_as_its_kind(kind):
    """phase=captured's quality windows and logits are its kind's, at the kept call's shape."""
    from dataclasses import replace

    from tasks.phases import captured, phase_module
    from tasks.runtimes.eager import TorchSession
    from tasks.specs import BenchSpec, PhaseSpec
    from tests.conftest import model_spec

    model, seq = _memorising_model(vocab=48)
    mod = phase_module(kind)
    shape = {"prompt_len": 16} if kind == "prefill" else {"context_len": 24}
    phase = mod.normalize(PhaseSpec(kind, batch=1, parity_steps=2, **shape), "static")
    kept = replace(phase, name="captured", kind=kind, app="examples.generate_app:run")
    dims = {"layers": 1, "vocab": 48, "max_positions": 128}
    want, _ = mod.quality_inputs(model, model, phase, "static", dims, lambda n: seq[:n], 8)
    got, why = captured.quality_inputs(model, model, kept, "static", dims, lambda n: seq[:n], 8)
    assert got is not None and got.keys() == want.keys(), why
    assert all(np.array_equal(got[k], want[k]) for k in want)
    graph = mod.build_graph(model, phase, "llama", "static", "sdpa")
    cache = ["present.0.key", "present.0.value"] if kind == "decode" else []
    session = TorchSession(graph, BenchSpec("v", "eager", "cpu", model_spec("llama"), phase, ""), {"output_names": ["logits", *cache]})
    feeds = {"input_ids": 0, **({"cache_position": 0, "past_key_values.0.key": 0, "past_key_values.0.value": 0} if cache else {})}
    assert np.allclose(captured.quality_logits(session, kept, feeds, got), mod.quality_logits(session, phase, feeds, want))


def test_a_float32_unquantised_variant_is_the_reference_and_measures_nothing(tmp_path):
    """Its export stores only the mark, makes no reference model; its benchmark reports the mark."""
    from types import SimpleNamespace

    from tasks import quality_windows as _quality
    from tasks.measure.quality import QUALITY
    from tasks.specs import QualitySpec

    spec = SimpleNamespace(quality=QualitySpec(text=None, tokens=8), model=model_spec("llama"))
    arrays, note = _quality.make_quality(None, None, spec, {})
    assert note == "not measured: float32 and unquantised, the reference itself" and set(arrays) == {_quality.REFERENCE}
    np.savez(tmp_path / QUALITY, **arrays)
    assert _quality.measure(None, None, None, {}, str(tmp_path)) == {"quality_reference": 1.0}
    for changed in ({"dtype": "float16"}, {"quant": "int8"}):
        assert not _quality.is_reference(model_spec("llama", **changed))

"""Every model family of tasks/model/families.py against transformers: eager parity of both
phases with both caches (fast), sliding windows past the window, layers without RoPE,
soft-capping, the torch-free parameter estimate against the meta-device count and the
published figure, and the one-line refusals of architectures the swap cannot take. The
exported backends (onnxruntime, executorch, compile) per family are the slow tests at the end."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import yaml

from tasks.jobs import bench_job, export_job
from tasks.model import families
from tasks.model.graphs import DecodeGraph, PrefillGraph, swap_attention
from tasks.model.models import _classes, build_model
from tasks.specs import BenchSpec, ConfigError, ExportSpec, PhaseSpec
from tests.conftest import BACKEND_NAMES, CONF, PHASES, backend_yaml, model_spec, plan_jobs
from tests.test_graphs import FAST

NEW = [f for f in families.FAMILIES if f not in ("llama", "phi3")]  # those two: tests/test_graphs.py


def preset(family: str) -> dict:
    return yaml.safe_load((CONF / "model" / f"{family}.yaml").read_text())


def eager(tmp_path, spec, phase):
    export = export_job(ExportSpec("k", spec, phase, "none", str(tmp_path / "export")))
    assert export.ok, export.failure and export.failure.traceback
    result = bench_job(BenchSpec("v", "eager", "cpu", spec, phase, export.out_dir, bench=FAST))
    assert result.ok, result.failure and (result.failure.error + result.failure.traceback)
    return result.parity


@pytest.mark.parametrize("kv_cache,attention", [("static", "sdpa"), ("dynamic", "math")])
@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.parametrize("family", NEW)
def test_eager_parity_of_every_family(tmp_path, family, phase, kv_cache, attention):
    """The tiny preset (its windows of 8 below the prompt of 16 and the context of 24) through
    the export and benchmark jobs: logits and caches against transformers, decode 8 steps."""
    if preset(family)["attention"] == "math":  # soft-capped scores (Gemma 2): math only
        attention = "math"
    parity = eager(tmp_path, model_spec(family, kv_cache=kv_cache, attention=attention), PHASES[phase])
    assert parity["passed"] and parity["max_abs_diff"] < 1e-4, parity
    assert parity["steps"] == (8 if phase == "decode" else 1) and parity["top1_agreement"] == 1.0


def full_forward_parity(model, family, kv_cache, attention, prompt=40, steps=8):
    """Prefill `prompt` tokens, then decode `steps` feeding each returned cache back; every
    logit against transformers' own forward over the whole sequence (no cache at all)."""
    ids = torch.randint(0, 512, (2, prompt + steps), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(input_ids=ids).logits  # [B, P+N, V]
        graph = swap_attention(copy.deepcopy(model), family, kv_cache, attention)
        logits, *present = PrefillGraph(graph)(ids[:, :prompt])
        diffs = [(logits - ref[:, prompt - 1 : prompt]).abs().max().item()]
        if kv_cache == "static":  # room for the steps
            present = [torch.nn.functional.pad(t, (0, 0, 0, steps)) for t in present]
        decode = DecodeGraph(graph)
        for t in range(prompt, prompt + steps):
            logits, *present = decode(ids[:, t : t + 1], torch.tensor([t]), *present)
            diffs.append((logits - ref[:, t : t + 1]).abs().max().item())
    return max(diffs)


@pytest.mark.parametrize("kv_cache", ["static", "dynamic"])
@pytest.mark.parametrize("family", ["mistral", "gemma3", "gemma2", "phi3"])
def test_decode_past_the_sliding_window_matches_transformers(tmp_path, family, kv_cache):
    """sliding_window 16, context 40, 8 decode steps: the graph against transformers' full
    forward, and the decode job's parity against its reference past the window."""
    spec = model_spec(family, kv_cache=kv_cache)
    spec = spec.__class__(**{**spec.__dict__, "arch": {**spec.arch, "sliding_window": 16}})
    model = build_model(spec)
    assert max(p.window for p in families.layer_plans(family, model.config.to_dict())) == 16
    assert full_forward_parity(model, family, kv_cache, spec.attention) < 1e-4
    parity = eager(tmp_path, spec, PhaseSpec("decode", batch=2, context_len=40, parity_steps=8))
    assert parity["passed"] and parity["steps"] == 8 and parity["max_abs_diff"] < 1e-4, parity


def test_without_the_window_a_sliding_model_differs():
    """The check above can fail: the same graph with its window removed misses transformers."""
    model = build_model(model_spec("mistral"))
    with torch.no_grad():
        ids = torch.randint(0, 512, (1, 30), generator=torch.Generator().manual_seed(0))
        ref = model(input_ids=ids).logits[:, -1:]
        graph = swap_attention(copy.deepcopy(model), "mistral", "static", "sdpa")
        for layer in graph.model.layers:
            layer.self_attn.window = 0
        assert (PrefillGraph(graph)(ids)[0] - ref).abs().max() > 1e-2


def test_layer_plans_follow_the_configs():
    """Per layer: Gemma 3's 5 sliding : 1 global with its rotary per type, SmolLM3's NoPE every
    4th layer, Mistral's window on every layer, Qwen2's sliding layers from max_window_layers."""
    def plans(family, size, **arch):
        config_cls, _ = _classes(family)
        return families.layer_plans(family, config_cls(**{**preset(family)["sizes"][size], **arch}).to_dict())

    gemma = plans("gemma3", "270m")
    assert [p.window for p in gemma[:6]] == [512] * 5 + [0] and len(gemma) == 18
    assert [p.rotary for p in gemma[4:6]] == ["sliding_attention", "full_attention"]
    assert [p.rope for p in plans("smollm3", "3b")[:8]] == [True, True, True, False] * 2
    assert {p.window for p in plans("mistral", "7b")} == {4096}
    assert {p.window for p in plans("llama", "1b", sliding_window=16)} == {0}  # Llama ignores the key
    qwen = plans("qwen2", "tiny", use_sliding_window=True, sliding_window=8, max_window_layers=1)
    assert [p.window for p in qwen] == [0, 8]
    assert {p.window for p in plans("qwen2", "0.5b")} == {0}  # Qwen2.5 turns its window off


def test_attention_softcapping_runs_in_math_and_is_refused_for_sdpa_before_any_work():
    """Gemma 2's soft-capped scores (cap 1.0 in the tiny preset): math matches transformers,
    a graph without the cap does not, and sdpa is refused by the swap and by the plan."""
    from tests.conftest import plan_jobs

    model = build_model(model_spec("gemma2"))
    assert full_forward_parity(model, "gemma2", "static", "math", prompt=12, steps=8) < 1e-4
    model.config.attn_logit_softcapping = None  # the swap reads the cap from the config: none now
    uncapped = swap_attention(copy.deepcopy(model), "gemma2", "static", "math")
    model.config.attn_logit_softcapping = 1.0
    ids = torch.randint(0, 512, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (PrefillGraph(uncapped)(ids)[0] - model(input_ids=ids).logits[:, -1:]).abs().max() > 1e-2
    with pytest.raises(ValueError, match=r"model.attention='sdpa' cannot soft-cap .* attn_logit_softcapping=1.0"):
        swap_attention(model, "gemma2", "static", "sdpa")
    with pytest.raises(ConfigError, match=r"model.attention='sdpa' cannot soft-cap .* choose model.attention=math"):
        plan_jobs(["model=gemma2", "model.attention=sdpa"])


# name, size, the figure the model card (or the Hub's safetensors count) publishes
PUBLISHED = [
    ("llama", "smollm2-135m", 134.5e6),
    ("llama", "smollm2-360m", 362e6),
    ("llama", "1b", 1.23e9),
    ("llama", "3b", 3.21e9),
    ("phi3", "mini", 3.82e9),
    ("mistral", "7b", 7.24e9),
    ("qwen2", "0.5b", 0.494e9),
    ("qwen3", "0.6b", 0.596e9),
    ("gemma3", "270m", 268e6),
    ("gemma3", "1b", 1.0e9),
    ("gemma2", "2b", 2.61e9),
    ("smollm3", "3b", 3.08e9),
    ("olmo2", "1b", 1.48e9),
    ("granite", "2b", 2.53e9),
]


def test_every_real_size_preset_has_a_published_figure():
    real = {(f, s) for f in families.FAMILIES for s in preset(f)["sizes"] if s != "tiny"}
    assert real == {(f, s) for f, s, _ in PUBLISHED}


@pytest.mark.parametrize("family,size,published", PUBLISHED)
def test_the_torch_free_estimate_is_the_built_models_count(family, size, published):
    """Biases, q/k norms, Gemma's four norms a layer, tied embeddings, Phi-3's fused
    projections: the estimate equals the model built on the meta device (no memory), which is
    within 1% of the published figure; the dims agree too."""
    arch = preset(family)["sizes"][size]
    config_cls, model_cls = _classes(family)
    with torch.device("meta"):
        model = model_cls(config_cls(**arch))
    count = sum(p.numel() for p in model.parameters())
    assert families.estimated_parameters(family, arch) == count
    assert count == pytest.approx(published, rel=0.01)
    assert families.model_dims(family, arch) == families.model_dims(family, model.config.to_dict())


@pytest.mark.parametrize("family", families.FAMILIES)
def test_tiny_presets_stay_tiny_and_their_saved_configs_are_taken(tmp_path, family):
    arch = preset(family)["sizes"]["tiny"]
    assert arch["hidden_size"] == 64 and 2 <= arch["num_hidden_layers"] <= 4 and arch["vocab_size"] == 512
    build_model(model_spec(family)).config.save_pretrained(tmp_path)
    families.check_architecture(json.loads((tmp_path / "config.json").read_text()))


@pytest.mark.parametrize(
    "config,message",
    [
        ({"model_type": "mixtral", "num_local_experts": 8}, "has mixture-of-experts MLPs (num_local_experts)"),
        ({"model_type": "qwen3_moe", "num_experts": 128}, "has mixture-of-experts MLPs (num_experts)"),
        ({"model_type": "mllama", "cross_attention_layers": [3, 8]}, "has cross-attention (cross_attention_layers)"),
        ({"model_type": "t5", "is_encoder_decoder": True}, "has cross-attention (is_encoder_decoder)"),
        ({"model_type": "gemma3", "vision_config": {}, "text_config": {}}, "has multimodal towers"),
        (
            {"model_type": "qwen3_next", "layer_types": ["linear_attention", "full_attention"]},
            "has linear/recurrent attention layers (linear_attention)",
        ),
        ({"model_type": "gpt2"}, "model_type='gpt2' belongs to no model.family; known: llama, phi3"),
        ({"model_type": "gemma3_text", "use_bidirectional_attention": True}, "use_bidirectional_attention=True"),
    ],
)
def test_architectures_the_swap_cannot_take_are_refused_in_one_line(config, message):
    with pytest.raises(ValueError) as err:
        families.check_architecture(config)
    assert message in str(err.value) and "\n" not in str(err.value)


# -- the exported backends, per family (slow) ------------------------------------------------

# every backend against eager's transformers reference; the genai builder's families: tests/test_genai.py
BACKENDS = [b for b in BACKEND_NAMES if b != "eager" and backend_yaml(b)["export_options"].get("exporter") != "genai"]


@pytest.mark.slow
@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", NEW)
def test_every_family_through_every_backend(planned_variant, family, backend, phase):
    """The planned tiny variant (its sliding window, NoPE layer, ... below the test shapes):
    exported, run by the backend's runtime, parity against transformers (decode: 8 steps). A family
    a backend's format plans as skipped (llama.cpp's, tasks/export/gguf.py) is skipped with its reason."""
    (skipped, *_) = plan_jobs([f"model={family}", f"phase={phase}", f"backend={backend}"]).skipped or [None]
    if skipped is not None:
        assert f"model.family={family}" in skipped.reason, skipped.reason
        pytest.skip(skipped.reason)
    _, spec = planned_variant(f"model={family}", f"phase={phase}", f"backend={backend}")
    result = bench_job(spec)
    assert result.ok, result.failure and (result.failure.error + result.failure.traceback)
    assert result.parity["passed"] and result.parity["top1_agreement"] == 1.0, result.parity
    assert result.parity["steps"] == (8 if phase == "decode" else 1)


@pytest.mark.slow  # two ExecuTorch lowerings
def test_a_tanh_gelu_keeps_its_function_through_xnnpack():
    """XNNPACK lowers aten.gelu as the exact GELU whatever `approximate` says (Gemma's MLP is a
    tanh GELU): written out before lowering, the .pte matches eager; an exact GELU stays one op.
    Without the rewrite the delegate is off by ~3e-4: when ExecuTorch honours `approximate`,
    the first assertion below fails and tasks/export/_gelu_tanh.py can go."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    from tasks.export._gelu_tanh import write_out_tanh_gelu

    class Gelus(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.gelu(x, approximate="tanh") + torch.nn.functional.gelu(x)

    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0)) * 3
    program = torch.export.export(Gelus(), (x,), strict=False)

    def through_xnnpack(prog):
        pte = to_edge_transform_and_lower(prog, partitioner=[XnnpackPartitioner()]).to_executorch().buffer
        return Runtime.get().load_program(pte).load_method("forward").execute([x])[0]

    assert (through_xnnpack(program) - Gelus()(x)).abs().max() > 1e-4  # the lowering's own error
    written = write_out_tanh_gelu(program)
    gelus = [n.kwargs for n in written.graph.nodes if n.target is torch.ops.aten.gelu.default]
    assert gelus == [{}]  # the exact GELU, untouched
    assert (through_xnnpack(written) - Gelus()(x)).abs().max() < 1e-5


@pytest.mark.slow  # a generate() run of the bundled example
def test_a_capture_past_a_sliding_window_is_refused_by_its_cause(tmp_path):
    """generate()'s cache keeps a sliding layer's last positions only: the capture says so."""
    from tasks.phases import captured
    from tasks.specs import CaptureOptions, CaptureSpec
    from tests.conftest import ROOT

    spec = CaptureSpec(
        key="t", model=model_spec("mistral"), app="examples.generate_app:run", options=CaptureOptions(),
        parity_steps=8, store=str(tmp_path), app_path=str(ROOT), threads=1,
    )  # fmt: skip
    result = captured.capture_job(spec)
    assert not result.ok and "layer 0's cache keeps only its sliding window's last positions" in result.failure.error

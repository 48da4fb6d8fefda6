"""Models from presets (seeded random weights) and from a local safetensors checkpoint."""

from __future__ import annotations

import dataclasses
import importlib

import pytest
import torch
import yaml

from tasks.model import families
from tasks.model.models import _classes, build_model, model_dims
from tasks.specs import ConfigError
from tests.conftest import CONF, model_spec


def preset(name: str) -> dict:
    return yaml.safe_load((CONF / "model" / f"{name}.yaml").read_text())


@pytest.mark.parametrize("name", families.FAMILIES)
def test_tiny_preset_dims(name):
    model = build_model(model_spec(name))
    dims = model_dims(model)
    assert dims["kv_heads"] < dims["heads"]  # grouped-query attention
    assert dims["head_dim"] == 16


def test_same_seed_same_weights_other_seed_other_weights():
    a = build_model(model_spec("llama")).state_dict()
    b = build_model(model_spec("llama")).state_dict()
    c = build_model(model_spec("llama", seed=1)).state_dict()
    key = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(a[key], b[key]) and not torch.equal(a[key], c[key])


@pytest.mark.parametrize("name", families.FAMILIES)
def test_checkpoint_loads_the_saved_weights(tmp_path, name):
    original = build_model(model_spec(name, seed=7))
    original.save_pretrained(tmp_path, safe_serialization=True)
    loaded = build_model(model_spec(name, checkpoint=str(tmp_path)))
    ids = torch.tensor([[1, 5, 9, 3]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, original(ids).logits)
    # and not the preset's seed-0 random weights
    with torch.no_grad():
        assert not torch.allclose(build_model(model_spec(name)).forward(ids).logits, original(ids).logits)


def test_checkpoint_without_safetensors_is_refused(tmp_path):
    build_model(model_spec("llama")).config.save_pretrained(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(ConfigError, match=r"no \*.safetensors weights \(found pytorch_model.bin: pickle"):
        build_model(model_spec("llama", checkpoint=str(tmp_path)))


def test_missing_checkpoint_names_the_key(tmp_path):
    with pytest.raises(ConfigError, match="model.checkpoint=.*no such folder"):
        build_model(model_spec("llama", checkpoint=str(tmp_path / "nope")))
    with pytest.raises(ConfigError, match="model.checkpoint=.*no config.json"):
        build_model(model_spec("llama", checkpoint=str(tmp_path)))


@pytest.mark.parametrize("name,size,params", [("llama", "1b", 1_235_814_400), ("phi3", "mini", 3_821_079_552)])
def test_real_size_presets_match_the_published_architectures(name, size, params):
    """Built on the meta device (no memory): the parameter count of Llama-3.2-1B / Phi-3-mini."""
    cfg = preset(name)
    config_cls, model_cls = _classes(cfg["family"])
    with torch.device("meta"):
        model = model_cls(config_cls(**cfg["sizes"][size]))
    assert sum(p.numel() for p in model.parameters()) == params


@pytest.mark.parametrize("name", families.FAMILIES)
def test_adapter_table_agrees_with_transformers(name):
    """Every submodule the adapter names is a child of layer 0's self_attn, it owns all of its
    parameters, and the named rotary function and classes exist where the table says."""
    from tasks.model.graphs import check_adapter

    fam = families.FAMILIES[name]
    model = build_model(model_spec(name))
    assert model.config.model_type == fam.model_type and families.family_of(fam.model_type) == name
    assert type(model).__name__ == fam.model_class and type(model.config).__name__ == fam.config_class
    attn = model.model.layers[0].self_attn
    children = dict(attn.named_children())
    for sub in fam.attention.submodules():
        assert isinstance(children.get(sub), torch.nn.Module), f"{name}: self_attn has no {sub}"
    check_adapter(attn, fam.attention, name, 0)
    assert callable(getattr(importlib.import_module(fam.rotary_module), fam.rotary_function))
    # the defaults of the table are transformers' own for the config class
    cls_defaults = _classes(name)[0]()
    for key, default in fam.defaults.items():
        if default is not None:
            assert getattr(cls_defaults, key) == default, (name, key)


@pytest.mark.parametrize("name,size", [("llama", "tiny"), ("llama", "1b"), ("phi3", "tiny"), ("phi3", "mini")])
def test_torch_free_dims_from_the_config_match_the_built_model(name, size):
    """tasks.model.families.model_dims of a preset's config dict == model_dims of the model built
    from it (real sizes on the meta device), and of its saved config.json's contents."""
    arch = preset(name)["sizes"][size]
    config_cls, model_cls = _classes(name)
    with torch.device("meta"):
        model = model_cls(config_cls(**arch))
    dims = families.model_dims(name, arch)
    assert dims == model_dims(model)
    assert dims == families.model_dims(name, model.config.to_dict())
    assert set(dims) == {"layers", "heads", "kv_heads", "head_dim", "vocab", "max_positions"}


def test_torch_free_dims_apply_the_family_defaults():
    assert families.model_dims("llama", {}) == {
        "layers": 32, "heads": 32, "kv_heads": 32, "head_dim": 128,
        "vocab": 32000, "max_positions": 2048,
    }  # fmt: skip
    phi3 = families.model_dims("phi3", {"num_key_value_heads": 8})
    assert (phi3["head_dim"], phi3["kv_heads"]) == (96, 8)


def test_unknown_family_is_refused_with_the_choices():
    with pytest.raises(ValueError, match=r"model.family='mamba' is unknown; choose one of llama, phi3, mistral"):
        families.model_dims("mamba", {})
    with pytest.raises(ValueError, match=r"model.family='mamba' is unknown"):
        build_model(model_spec("llama", family="mamba"))
    with pytest.raises(ValueError, match=r"model_type='mamba' belongs to no model.family"):
        families.family_of("mamba")


def test_families_import_no_torch():
    import subprocess
    import sys

    code = "import sys, tasks.model.families; assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=CONF.parent)


def test_a_parameter_the_adapter_does_not_name_is_refused_at_swap():
    """A family whose attention has q/k norms the table forgot fails at swap time."""
    from tasks.model.graphs import swap_attention

    model = build_model(model_spec("llama"))
    model.model.layers[1].self_attn.q_norm = torch.nn.LayerNorm(16)
    with pytest.raises(ValueError, match=r"model.family='llama', layer 1: .*q_norm\.weight, q_norm\.bias"):
        swap_attention(model, "llama", "static", "sdpa")


def test_an_adapter_naming_a_missing_submodule_is_refused(monkeypatch):
    from tasks.model.graphs import swap_attention

    llama = families.FAMILIES["llama"]
    adapter = families.AttentionAdapter(llama.attention.projections, q_norm="q_norm", k_norm="k_norm")
    monkeypatch.setitem(families.FAMILIES, "llama", dataclasses.replace(llama, attention=adapter))
    with pytest.raises(ValueError, match=r"layer 0: the adapter names q_norm, k_norm, which LlamaAttention"):
        swap_attention(build_model(model_spec("llama")), "llama", "static", "sdpa")

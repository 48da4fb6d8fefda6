"""Models from presets (seeded random weights) and from a local safetensors checkpoint."""

from __future__ import annotations

import pytest
import torch

from tasks.models import build_model, model_dims
from tests.conftest import model_spec


@pytest.mark.parametrize("name", ["llama", "phi3"])
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


@pytest.mark.parametrize("name", ["llama", "phi3"])
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
    with pytest.raises(FileNotFoundError, match=r"no \*.safetensors weights \(found pytorch_model.bin: pickle"):
        build_model(model_spec("llama", checkpoint=str(tmp_path)))


def test_missing_checkpoint_names_the_key(tmp_path):
    with pytest.raises(FileNotFoundError, match="model.checkpoint=.*no config.json"):
        build_model(model_spec("llama", checkpoint=str(tmp_path / "nope")))


@pytest.mark.parametrize("name,size,params", [("llama", "1b", 1_235_814_400), ("phi3", "mini", 3_821_079_552)])
def test_real_size_presets_match_the_published_architectures(name, size, params):
    """Built on the meta device (no memory): the parameter count of Llama-3.2-1B / Phi-3-mini."""
    import yaml

    from tasks.models import _classes
    from tests.conftest import CONF

    cfg = yaml.safe_load((CONF / "model" / f"{name}.yaml").read_text())
    config_cls, model_cls = _classes(cfg["family"])
    with torch.device("meta"):
        model = model_cls(config_cls(**cfg["sizes"][size]))
    assert sum(p.numel() for p in model.parameters()) == params

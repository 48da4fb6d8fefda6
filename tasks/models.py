"""Build a causal LM from a preset (seeded random weights) or a local checkpoint."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

from tasks.specs import DTYPES, ModelSpec

if TYPE_CHECKING:
    import torch

# family -> (config class, model class), both in the top-level transformers namespace
FAMILIES: dict[str, tuple[str, str]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "phi3": ("Phi3Config", "Phi3ForCausalLM"),
}


def torch_dtype(name: str) -> torch.dtype:
    import torch

    if name not in DTYPES:
        raise ValueError(f"model.dtype={name!r} is not supported; choose one of {', '.join(DTYPES)}")
    return getattr(torch, name)


def _classes(family: str):
    if family not in FAMILIES:
        raise ValueError(f"model.family={family!r} is unknown; choose one of {', '.join(FAMILIES)}")
    transformers = importlib.import_module("transformers")
    config_cls, model_cls = FAMILIES[family]
    return getattr(transformers, config_cls), getattr(transformers, model_cls)


def check_checkpoint(path: str) -> Path:
    """A checkpoint is a local Hugging Face directory with config.json and safetensors."""
    root = Path(path).expanduser()
    if not (root / "config.json").is_file():
        raise FileNotFoundError(
            f"model.checkpoint={path!r}: no config.json there; expected a local Hugging Face "
            "model directory (save_pretrained output)"
        )
    if not any(root.glob("*.safetensors")):
        found = sorted(p.name for p in root.iterdir() if p.suffix in {".bin", ".pt", ".pth", ".ckpt"})
        hint = f" (found {', '.join(found)}: pickle weights are never loaded)" if found else ""
        raise FileNotFoundError(f"model.checkpoint={path!r}: no *.safetensors weights{hint}")
    return root


def build_model(spec: ModelSpec) -> torch.nn.Module:
    """The reference transformers model, in eval mode, on CPU."""
    import torch

    config_cls, model_cls = _classes(spec.family)
    dtype = torch_dtype(spec.dtype)
    if spec.checkpoint:
        root = check_checkpoint(spec.checkpoint)
        model = model_cls.from_pretrained(str(root), use_safetensors=True, dtype=dtype, attn_implementation="eager")
    else:
        config = config_cls(**spec.arch)
        config._attn_implementation = "eager"  # the reference: plain softmax attention
        torch.manual_seed(spec.seed)
        model = model_cls(config).to(dtype)
    return model.eval()


def model_dims(model: torch.nn.Module) -> dict[str, int]:
    """Sizes the phase inputs are generated from: layers, heads, head_dim, vocab."""
    cfg = model.config
    heads = cfg.num_attention_heads
    return {
        "layers": cfg.num_hidden_layers,
        "heads": heads,
        "kv_heads": getattr(cfg, "num_key_value_heads", None) or heads,
        "head_dim": getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
        "vocab": cfg.vocab_size,
        "max_positions": cfg.max_position_embeddings,
        "sliding_window": getattr(cfg, "sliding_window", None) or 0,  # 0: full attention
    }


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())

"""The one table of model families: transformers classes, attention adapter, config defaults.

Stdlib only: the driver imports this module to validate `model.family` and to size phases
from a config dict, so it never pulls in torch or transformers. The torch side
(tasks/model/models.py builds the model, tasks/model/graphs.py swaps its attention) reads the same
table, so adding a family is one entry here (and one yaml under conf/model/).

An adapter names every attention submodule the swap keeps (torchtune style): the swap
refuses a layer holding a parameter outside them, so a family whose attention has more
(q/k norms, sinks, biases in another module) fails at swap time instead of at parity.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class AttentionAdapter:
    """The attribute names of a decoder layer's `self_attn` submodules the swap uses."""

    projections: tuple[str, ...]  # 3 names: separate q, k, v; 1 name: fused, split [q | k | v]
    o_proj: str = "o_proj"  # [B, S, H*D] -> [B, S, hidden]
    q_norm: str | None = None  # per-head norm of q over head_dim, before RoPE (Qwen3 style)
    k_norm: str | None = None  # per-head norm of k over head_dim, before RoPE

    def __post_init__(self):
        if len(self.projections) not in (1, 3):
            raise ValueError(f"projections={self.projections!r}: name q, k, v (3) or one fused qkv (1)")
        if (self.q_norm is None) != (self.k_norm is None):
            raise ValueError(f"q_norm={self.q_norm!r}, k_norm={self.k_norm!r}: name both or neither")

    @property
    def fused(self) -> bool:
        return len(self.projections) == 1

    def submodules(self) -> tuple[str, ...]:
        """Every submodule the swap keeps, hence the only owners of the attention's parameters."""
        names = (*self.projections, self.o_proj, self.q_norm, self.k_norm)
        return tuple(n for n in names if n is not None)


@dataclass(frozen=True)
class Family:
    model_type: str  # transformers' config.model_type, found in a checkpoint's config.json
    config_class: str  # both in the top-level transformers namespace
    model_class: str
    rotary_module: str  # the modeling module that holds the family's rotary function
    rotary_function: str  # (q, k, cos, sin) -> (q, k), both [B, H, S, D]
    attention: AttentionAdapter
    # transformers' defaults of the config class for the keys model_dims reads; None where
    # transformers derives the value (head_dim: hidden_size // heads, kv heads: heads)
    defaults: dict[str, Any] = field(default_factory=dict)


FAMILIES: dict[str, Family] = {
    "llama": Family(
        model_type="llama",
        config_class="LlamaConfig",
        model_class="LlamaForCausalLM",
        rotary_module="transformers.models.llama.modeling_llama",
        rotary_function="apply_rotary_pos_emb",
        attention=AttentionAdapter(projections=("q_proj", "k_proj", "v_proj"), o_proj="o_proj"),
        defaults={  # transformers LlamaConfig (5.x)
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": None,
            "hidden_size": 4096,
            "head_dim": None,
            "vocab_size": 32000,
            "max_position_embeddings": 2048,
            "sliding_window": None,  # not a LlamaConfig key: full attention
        },
    ),
    "phi3": Family(
        model_type="phi3",
        config_class="Phi3Config",
        model_class="Phi3ForCausalLM",
        rotary_module="transformers.models.phi3.modeling_phi3",
        rotary_function="apply_rotary_pos_emb",  # rotates the first partial_rotary_factor of D
        attention=AttentionAdapter(projections=("qkv_proj",), o_proj="o_proj"),
        defaults={  # transformers Phi3Config (5.x); head_dim is not a key: hidden_size // heads
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": None,
            "hidden_size": 3072,
            "head_dim": None,
            "vocab_size": 32064,
            "max_position_embeddings": 4096,
            "sliding_window": None,
        },
    ),
}


def get_family(name: str) -> Family:
    """The table entry of `model.family`; an unknown name is refused with the choices."""
    if name not in FAMILIES:
        raise ValueError(f"model.family={name!r} is unknown; choose one of {', '.join(FAMILIES)}")
    return FAMILIES[name]


def family_of(model_type: str) -> str:
    """The family whose transformers config has this `model_type` (a built model's config)."""
    for name, fam in FAMILIES.items():
        if fam.model_type == model_type:
            return name
    known = ", ".join(f.model_type for f in FAMILIES.values())
    raise ValueError(f"config model_type={model_type!r} belongs to no model.family; known: {known}")


def model_dims(family: str, config: dict[str, Any]) -> dict[str, int]:
    """Sizes the phase inputs are generated from, from a config dict (a preset's `arch` or a
    checkpoint's config.json), with the family's transformers defaults for missing keys."""
    defaults = get_family(family).defaults

    def get(key: str) -> Any:  # a key the config sets wins, even when null (as in transformers)
        return config[key] if key in config else defaults[key]

    heads = get("num_attention_heads")
    return {
        "layers": get("num_hidden_layers"),
        "heads": heads,
        "kv_heads": get("num_key_value_heads") or heads,
        "head_dim": get("head_dim") or get("hidden_size") // heads,
        "vocab": get("vocab_size"),
        "max_positions": get("max_position_embeddings"),
        "sliding_window": get("sliding_window") or 0,  # 0: full attention
    }


# config keys of architectures the module swap does not cover, whatever their model_type
_UNSUPPORTED = {
    "num_experts": "mixture-of-experts",
    "num_local_experts": "mixture-of-experts",
    "n_routed_experts": "mixture-of-experts",
    "cross_attention_layers": "cross-attention",
    "vision_config": "multimodal",
    "audio_config": "multimodal",
}


def check_architecture(config: dict[str, Any]) -> None:
    """Refuse, in one line, a config whose architecture the attention swap does not cover:
    mixture-of-experts, cross-attention, linear attention, multimodal."""
    for key, kind in _UNSUPPORTED.items():
        if config.get(key):
            raise ValueError(f"config {key}={config[key]!r}: {kind} models are not supported (dense decoders only)")
    if config.get("is_encoder_decoder") or config.get("add_cross_attention"):
        raise ValueError("config is_encoder_decoder/add_cross_attention: cross-attention models are not supported")
    linear = sorted({t for t in config.get("layer_types") or () if isinstance(t, str) and "linear" in t})
    if linear:
        raise ValueError(f"config layer_types has {', '.join(linear)}: linear-attention layers are not supported")

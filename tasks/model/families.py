"""The one table of model families: transformers classes, attention adapter, config defaults.

Stdlib only: the driver imports this module to validate `model.family`, to size phases and
to estimate a model's parameters from a config dict, so it never pulls in torch or
transformers. The torch side (tasks/model/models.py builds the model, tasks/model/graphs.py
swaps its attention) reads the same table, so adding a family is one entry here (and one
yaml under conf/model/).

An adapter names every attention submodule the swap keeps (torchtune style): the swap
refuses a layer holding a parameter outside them, so a family whose attention has more
(q/k norms, sinks, biases in another module) fails at swap time instead of at parity.
What differs between families beyond that (sliding windows, layers without RoPE, a rotary
per layer type, scalings, soft-capping) is a named field of Family, resolved per layer once
at swap time (layer_plans) from the model's config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class AttentionAdapter:
    """The attribute names of a decoder layer's `self_attn` submodules the swap uses."""

    projections: tuple[str, ...]  # 3 names: separate q, k, v; 1 name: fused, split [q | k | v]
    o_proj: str = "o_proj"  # [B, S, H*D] -> [B, S, hidden]
    q_norm: str | None = None  # norm of q before RoPE (Qwen3, Gemma 3, OLMo 2)
    k_norm: str | None = None  # norm of k before RoPE
    qk_norm_scope: str = "head"  # "head": over D of each head (Qwen3); "all": over the whole H*D projection (OLMo 2)

    def __post_init__(self):
        if len(self.projections) not in (1, 3):
            raise ValueError(f"projections={self.projections!r}: name q, k, v (3) or one fused qkv (1)")
        if (self.q_norm is None) != (self.k_norm is None):
            raise ValueError(f"q_norm={self.q_norm!r}, k_norm={self.k_norm!r}: name both or neither")
        if self.qk_norm_scope not in ("head", "all"):
            raise ValueError(f"qk_norm_scope={self.qk_norm_scope!r}: choose head or all")

    @property
    def fused(self) -> bool:
        return len(self.projections) == 1

    def submodules(self) -> tuple[str, ...]:
        """Every submodule the swap keeps, hence the only owners of the attention's parameters."""
        names = (*self.projections, self.o_proj, self.q_norm, self.k_norm)
        return tuple(n for n in names if n is not None)


QKV = ("q_proj", "k_proj", "v_proj")


@dataclass(frozen=True)
class Family:
    model_type: str  # transformers' config.model_type, found in a checkpoint's config.json
    config_class: str  # both in the top-level transformers namespace
    model_class: str
    rotary_module: str  # the modeling module that holds the family's rotary function
    rotary_function: str  # (q, k, cos, sin) -> (q, k), both [B, H, S, D]
    attention: AttentionAdapter
    # transformers' defaults of the config class for the keys read here; None where
    # transformers derives the value (head_dim: hidden_size // heads, kv heads: heads)
    defaults: dict[str, Any] = field(default_factory=dict)
    # which layers attend within config.sliding_window: "none" (the family ignores it),
    # "all" (every layer when it is set: Mistral, Phi-3), "layer_types" (the layers
    # config.layer_types marks "sliding_attention": Qwen2/3, Gemma 2/3, SmolLM3)
    sliding: str = "none"
    no_rope_key: str | None = None  # config key: per layer 1 = RoPE, 0 = none (SmolLM3's no_rope_layers)
    rotary_per_layer_type: bool = False  # rotary_emb(x, pos, layer_type): local vs global bases (Gemma 3)
    embedding_multiplier: str | None = None  # config key scaling the embeddings (Granite)
    logits_divisor: str | None = None  # config key dividing the logits (Granite's logits_scaling)
    final_softcap: str | None = None  # config key: logits = cap * tanh(logits / cap) (Gemma 2 and 3)
    attention_softcap: str | None = None  # config key: scores = cap * tanh(scores / cap) (Gemma 2)
    # for estimated_parameters: biases and norms transformers builds
    qkv_bias: bool = False  # q, k, v always carry biases (Qwen2)
    attention_bias_key: str | None = None  # config key giving q, k, v and o biases
    mlp_bias_key: str | None = None  # config key giving gate, up and down biases
    norms_per_layer: int = 2  # hidden-size norms in a decoder layer (Gemma 3: 4)
    refuse: tuple[str, ...] = ()  # config keys that must be false: modes the swap does not model

    def __post_init__(self):
        if self.sliding not in ("none", "all", "layer_types"):
            raise ValueError(f"{self.model_type}: sliding={self.sliding!r}; choose none, all or layer_types")


def _llama_like(**overrides: Any) -> dict[str, Any]:
    """LlamaConfig's defaults (5.x) for the keys read here, with a family's differences."""
    base = {
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": None,
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "head_dim": None,
        "vocab_size": 32000,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
    }
    return {**base, **overrides}


def _family(name: str, config: str, model: str, adapter: AttentionAdapter, defaults: dict, **kw: Any) -> Family:
    module = f"transformers.models.{name}.modeling_{name}"
    return Family(name, config, model, module, "apply_rotary_pos_emb", adapter, defaults, **kw)


FAMILIES: dict[str, Family] = {
    "llama": _family(
        "llama", "LlamaConfig", "LlamaForCausalLM", AttentionAdapter(QKV),
        _llama_like(attention_bias=False, mlp_bias=False),
        attention_bias_key="attention_bias", mlp_bias_key="mlp_bias",
    ),
    "phi3": _family(  # fused qkv and gate_up projections; rotates partial_rotary_factor of D
        "phi3", "Phi3Config", "Phi3ForCausalLM", AttentionAdapter(("qkv_proj",)),
        _llama_like(hidden_size=3072, intermediate_size=8192, vocab_size=32064, max_position_embeddings=4096,
                    sliding_window=None),
        sliding="all",
    ),
    "mistral": _family(
        "mistral", "MistralConfig", "MistralForCausalLM", AttentionAdapter(QKV),
        _llama_like(num_key_value_heads=8, intermediate_size=14336, max_position_embeddings=131072,
                    sliding_window=4096),
        sliding="all",
    ),
    "qwen2": _family(  # q, k and v Linear modules carry biases
        "qwen2", "Qwen2Config", "Qwen2ForCausalLM", AttentionAdapter(QKV),
        _llama_like(num_key_value_heads=32, intermediate_size=22016, vocab_size=151936,
                    max_position_embeddings=32768),
        sliding="layer_types", qkv_bias=True,
    ),
    "qwen3": _family(
        "qwen3", "Qwen3Config", "Qwen3ForCausalLM", AttentionAdapter(QKV, q_norm="q_norm", k_norm="k_norm"),
        _llama_like(num_key_value_heads=32, intermediate_size=22016, head_dim=128, vocab_size=151936,
                    max_position_embeddings=32768, attention_bias=False),
        sliding="layer_types", attention_bias_key="attention_bias",
    ),
    "gemma3": Family(  # text-only Gemma 3: scaled embeddings (in embed_tokens), query_pre_attn_scalar
        model_type="gemma3_text",
        config_class="Gemma3TextConfig",
        model_class="Gemma3ForCausalLM",
        rotary_module="transformers.models.gemma3.modeling_gemma3",
        rotary_function="apply_rotary_pos_emb",
        attention=AttentionAdapter(QKV, q_norm="q_norm", k_norm="k_norm"),
        defaults=_llama_like(num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4, hidden_size=2304,
                             intermediate_size=9216, head_dim=256, vocab_size=262208,
                             max_position_embeddings=131072, tie_word_embeddings=True, attention_bias=False),
        sliding="layer_types",
        rotary_per_layer_type=True,
        final_softcap="final_logit_softcapping",  # transformers' Gemma 3 attention ignores attn_logit_softcapping
        attention_bias_key="attention_bias",
        norms_per_layer=4,  # input, post_attention, pre_feedforward, post_feedforward
        refuse=("use_bidirectional_attention",),
    ),
    "gemma2": _family(  # Gemma 2: Gemma 3's layout without q/k norms, one rotary, soft-capped scores
        "gemma2", "Gemma2Config", "Gemma2ForCausalLM", AttentionAdapter(QKV),
        _llama_like(num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4, hidden_size=2304,
                    intermediate_size=9216, head_dim=256, vocab_size=256000, max_position_embeddings=8192,
                    tie_word_embeddings=True, attention_bias=False),
        sliding="layer_types", final_softcap="final_logit_softcapping", attention_softcap="attn_logit_softcapping",
        attention_bias_key="attention_bias", norms_per_layer=4, refuse=("use_bidirectional_attention",),
    ),
    "smollm3": _family(
        "smollm3", "SmolLM3Config", "SmolLM3ForCausalLM", AttentionAdapter(QKV),
        _llama_like(num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=4, hidden_size=2048,
                    max_position_embeddings=32768, vocab_size=128256, tie_word_embeddings=True,
                    attention_bias=False, mlp_bias=False),
        sliding="layer_types", no_rope_key="no_rope_layers",
        attention_bias_key="attention_bias", mlp_bias_key="mlp_bias",
    ),
    "olmo2": _family(  # q/k norms over the whole projection; norms after attention and MLP
        "olmo2", "Olmo2Config", "Olmo2ForCausalLM",
        AttentionAdapter(QKV, q_norm="q_norm", k_norm="k_norm", qk_norm_scope="all"),
        _llama_like(vocab_size=50304, attention_bias=False),
        attention_bias_key="attention_bias",
    ),
    "granite": _family(  # attention_multiplier is the attention's scaling; residual_multiplier in its layer
        "granite", "GraniteConfig", "GraniteForCausalLM", AttentionAdapter(QKV),
        _llama_like(attention_bias=False, mlp_bias=False, embedding_multiplier=1.0, logits_scaling=1.0),
        embedding_multiplier="embedding_multiplier", logits_divisor="logits_scaling",
        attention_bias_key="attention_bias", mlp_bias_key="mlp_bias",
    ),
}  # fmt: skip


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


# What the swap cannot take, by the config keys that reveal it (any of them set and truthy).
_UNSUPPORTED: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("mixture-of-experts MLPs", ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")),
    ("cross-attention", ("is_encoder_decoder", "add_cross_attention", "cross_attention_layers")),
    ("multimodal towers", ("vision_config", "audio_config", "text_config")),
)
_LINEAR_LAYERS = ("linear_attention", "mamba", "conv", "recurrent")  # layer_types of non-softmax attention


def check_architecture(config: dict[str, Any]) -> None:
    """A checkpoint's config.json the swap can take, or ValueError with one line naming what
    it has that the swap lacks (or its unknown model_type)."""
    model_type = config.get("model_type")
    for what, keys in _UNSUPPORTED:
        found = [k for k in keys if config.get(k) not in (None, False, 0, "", [])]  # an empty tower is one too
        if found:
            raise ValueError(
                f"config model_type={model_type!r} has {what} ({', '.join(found)}); phasesweep swaps "
                "the self-attention of dense decoder-only text models only"
            )
    linear = sorted({t for t in config.get("layer_types") or () if any(w in t for w in _LINEAR_LAYERS)})
    if linear:
        raise ValueError(
            f"config model_type={model_type!r} has linear/recurrent attention layers ({', '.join(linear)}); "
            "phasesweep swaps softmax self-attention only"
        )
    family = family_of(str(model_type))
    for key in get_family(family).refuse:
        if config.get(key):
            raise ValueError(f"config {key}={config[key]!r} ({family}): phasesweep models causal attention only")


def _getter(family: str, config: dict[str, Any]):
    defaults = get_family(family).defaults

    def get(key: str) -> Any:  # a key the config sets wins, even when null (as in transformers)
        return config[key] if key in config else defaults[key]

    return get


def model_dims(family: str, config: dict[str, Any]) -> dict[str, int]:
    """Sizes the phase inputs are generated from, from a config dict (a preset's `arch` or a
    checkpoint's config.json), with the family's transformers defaults for missing keys."""
    get = _getter(family, config)
    heads = get("num_attention_heads")
    return {
        "layers": get("num_hidden_layers"),
        "heads": heads,
        "kv_heads": get("num_key_value_heads") or heads,
        "head_dim": get("head_dim") or get("hidden_size") // heads,
        "vocab": get("vocab_size"),
        "max_positions": get("max_position_embeddings"),
    }


def estimated_parameters(family: str, config: dict[str, Any]) -> int:
    """Parameters of the family's model from its config alone (transformers' layout: biases,
    q/k norms, the family's norms, tied embeddings): the driver sizes memory requests with it
    and never builds the model."""
    fam, get = get_family(family), _getter(family, config)
    dims = model_dims(family, config)
    h, q, kv = get("hidden_size"), dims["heads"] * dims["head_dim"], dims["kv_heads"] * dims["head_dim"]
    bias = bool(fam.attention_bias_key and get(fam.attention_bias_key))
    attention = h * q + 2 * h * kv + q * h + (q + 2 * kv) * (bias or fam.qkv_bias) + h * bias
    if fam.attention.q_norm:
        attention += 2 * dims["head_dim"] if fam.attention.qk_norm_scope == "head" else q + kv
    inter = get("intermediate_size")
    mlp = 3 * h * inter + (2 * inter + h) * bool(fam.mlp_bias_key and get(fam.mlp_bias_key))  # gate, up, down
    embeddings = dims["vocab"] * h * (1 if get("tie_word_embeddings") else 2)
    return dims["layers"] * (attention + mlp + fam.norms_per_layer * h) + embeddings + h  # + the final norm


@dataclass(frozen=True)
class LayerPlan:
    """What one decoder layer's attention does beyond the adapter, decided at swap time."""

    window: int  # 0: full causal; else a query at p sees keys p-window+1 .. p (transformers' sliding_window_overlay)
    rope: bool  # False: the layer's q, k are not rotated (SmolLM3's NoPE layers)
    rotary: str | None  # the layer type whose rotary the layer takes (Gemma 3); None: the model's one rotary


def layer_plans(family: str, config: dict[str, Any]) -> list[LayerPlan]:
    """Per layer: its window, RoPE on/off and rotary, from a built model's config dict (with
    the layer_types, no_rope_layers, ... transformers derives)."""
    fam = get_family(family)
    layers = config["num_hidden_layers"]
    types = config.get("layer_types") or ["full_attention"] * layers
    window = config.get("sliding_window") or 0
    if fam.sliding == "none":
        windows = [0] * layers
    elif fam.sliding == "all":
        windows = [window] * layers
    else:
        windows = [window if t == "sliding_attention" else 0 for t in types]
    if any(windows) and not window:
        raise ValueError(f"model.family={family!r}: layer_types name sliding layers, but sliding_window is {window!r}")
    rope = config[fam.no_rope_key] if fam.no_rope_key else [1] * layers
    rotary = types if fam.rotary_per_layer_type else [None] * layers
    return [LayerPlan(w, bool(r), t) for w, r, t in zip(windows, rope, rotary, strict=True)]


def graph_scalings(family: str, config: dict[str, Any]) -> dict[str, float | None]:
    """The model-level factors the phase graphs apply outside the decoder layers (None: none)."""
    fam = get_family(family)

    def value(key: str | None) -> float | None:
        return None if key is None or config.get(key) is None else float(config[key])

    return {
        "embedding_multiplier": value(fam.embedding_multiplier),
        "logits_divisor": value(fam.logits_divisor),
        "final_softcap": value(fam.final_softcap),
        "attention_softcap": value(fam.attention_softcap),
    }


def check_attention(family: str, config: dict[str, Any], attention: str, kv_cache: str = "static") -> None:
    """model.attention against what the config asks of the scores: sdpa cannot soft-cap them;
    ExecuTorch's custom_sdpa attends to the whole in-graph cache, so no sliding window either."""
    fam = get_family(family)
    if kv_cache == "update_cache" and fam.sliding != "none" and config.get("sliding_window"):
        raise ValueError(
            f"model.kv_cache={kv_cache!r} with model.attention={attention!r} attends to the whole cache, and the "
            f"model's layers slide a window of {config['sliding_window']}; choose model.kv_cache=static or dynamic"
        )
    cap = graph_scalings(family, config)["attention_softcap"]
    if cap is not None and attention != "math":
        key = get_family(family).attention_softcap
        raise ValueError(
            f"model.attention={attention!r} cannot soft-cap attention scores, and the model's {key}={cap}; "
            "choose model.attention=math"
        )

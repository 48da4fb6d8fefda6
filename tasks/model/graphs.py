"""The prefill and decode graphs: a transformers model with its attention swapped out.

Each decoder layer's `self_attn` is replaced (module swap) by PhaseAttention, which keeps
the submodules the family's adapter names (tasks/model/families.py: q/k/v or fused qkv
projections, o_proj, optional q/k norms) and the family's named rotary function, but hands
the KV-cache update to a tasks/model/kv_cache.py module and the attention itself to a
tasks/model/sdpa.py module. The rest of the layer (norms, MLP, residuals) runs as transformers
wrote it. The swap refuses an attention holding a parameter the adapter does not name. What
differs per layer (a sliding window, no RoPE, which rotary) is fixed at swap time from the
config (tasks.model.families.layer_plans); the model-level scalings (embedding multiplier,
logits divisor, final soft-cap) when the graph is built.

The cache is functional: tensors in, tensors out, threaded through one forward by a
StepState. Graph signatures (all caches [B, H_kv, S, D]):

  prefill: input_ids [B, P]
           -> logits [B, 1, V] (last position), present.{i}.key/value [B, H_kv, P, D]
  decode:  input_ids [B, 1], cache_position [1], past_key_values.{i}.key/value [B, H_kv, S, D]
           -> logits [B, 1, V], present.{i}.key/value (static: [B, H_kv, S, D], dynamic: S + 1)

With model.kv_cache=update_cache the cache lives in the graph (InGraphCacheGraph): one
graph for both phases, input_ids [B, S], cache_position [S] (S dynamic) -> logits [B, 1, V].
"""

from __future__ import annotations

import importlib

import torch
from torch import nn

from tasks.model import families
from tasks.model.cached_attention import cached_attention
from tasks.model.families import AttentionAdapter, LayerPlan
from tasks.model.kv_cache import make_kv_cache
from tasks.model.sdpa import make_attention


class StepState:
    """One forward's cache: the past of every layer in, the present of every layer out."""

    def __init__(
        self, cache_position: torch.Tensor, past: list[tuple[torch.Tensor, torch.Tensor]] | None, layers: int, start=None
    ):
        self.cache_position = cache_position  # [S_new] int64
        self.past = past  # None: empty cache (prefill), or a cache in the graph
        self.start = start  # an in-graph cache: cache_position[0] as an int (SymInt when exported)
        self.present: list[tuple[torch.Tensor, torch.Tensor]] = [None] * layers  # type: ignore[list-item]


class PhaseAttention(nn.Module):
    """Drop-in for a transformers attention module: the submodules its adapter names, kept
    with their weights, and the family's rotary function; cache and attention swapped."""

    def __init__(
        self,
        original: nn.Module,
        adapter: AttentionAdapter,
        rotary,  # the family's (q, k, cos, sin) -> (q, k) on [B, H, S, D]
        dims: dict[str, int],
        layer_idx: int,
        kv_cache: nn.Module,
        attention: nn.Module,
        plan: LayerPlan | None = None,  # None: full causal attention with RoPE
        softcap: float | None = None,  # attention logits soft-capping (Gemma 3's attn_logit_softcapping)
    ):
        super().__init__()
        plan = plan or LayerPlan(window=0, rope=True, rotary=None)
        self.original = original  # owns the submodules the adapter names, and their weights
        self.layer_idx = layer_idx
        self.kv_cache = kv_cache
        self.attention = attention
        self.heads, self.kv_heads, self.head_dim = dims["heads"], dims["kv_heads"], dims["head_dim"]
        self.scale = original.scaling  # the family's own (query_pre_attn_scalar, attention_multiplier, ...)
        self.apply_rope = rotary if plan.rope else None
        self.window = plan.window  # 0: full causal attention
        self.softcap = softcap
        self.adapter = adapter  # names of the original's submodules this forward calls
        self.fused = False  # cache update and attention as one op (tasks/model/cached_attention.py)

    def _sub(self, name: str) -> nn.Module:
        return getattr(self.original, name)

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        names = self.adapter.projections
        if self.adapter.fused:  # one projection (Phi-3's qkv_proj): [q | k | v] along the features
            qkv = self._sub(names[0])(x)
            q_size, kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
            return qkv[..., :q_size], qkv[..., q_size : q_size + kv_size], qkv[..., q_size + kv_size :]
        q_proj, k_proj, v_proj = (self._sub(n) for n in names)
        return q_proj(x), k_proj(x), v_proj(x)

    def _norm_qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._sub(self.adapter.q_norm)(q), self._sub(self.adapter.k_norm)(k)

    def forward(self, hidden_states, position_embeddings=None, cache: StepState | None = None, **_):
        b, s, _h = hidden_states.shape
        q, k, v = self._project(hidden_states)  # [B, S, H*D], [B, S, H_kv*D] x2
        norm = self.adapter.q_norm is not None
        if norm and self.adapter.qk_norm_scope == "all":  # over the whole projection (OLMo 2)
            q, k = self._norm_qk(q, k)
        q = q.view(b, s, -1, self.head_dim)  # [B, S, H, D]
        k = k.view(b, s, -1, self.head_dim)  # [B, S, H_kv, D]
        if norm and self.adapter.qk_norm_scope == "head":  # per head over D, before RoPE (Qwen3, Gemma 3)
            q, k = self._norm_qk(q, k)
        q = q.transpose(1, 2)  # [B, H, S, D]
        k = k.transpose(1, 2)  # [B, H_kv, S, D]
        v = v.view(b, s, -1, self.head_dim).transpose(1, 2)  # [B, H_kv, S, D]
        if self.apply_rope is not None:  # None: a layer without positions (SmolLM3's NoPE layers)
            cos, sin = position_embeddings
            q, k = self.apply_rope(q, k, cos, sin)
        if cache.start is not None:  # the cache in the graph, [B, S_max, H_kv, D]: custom ops (full causal only)
            k_all, v_all = self.kv_cache.update(k.transpose(1, 2), v.transpose(1, 2), cache.start)
            out = self.attention(q.transpose(1, 2), k_all, v_all, cache.start, self.scale)  # [B, S, H, D]
            return self._sub(self.adapter.o_proj)(out.reshape(b, s, self.heads * self.head_dim)), None

        if self.fused:
            return self._fused(q, k, v, cache)
        if cache.past is None:  # prefill: the cache starts empty, keys are the prompt's own
            k_all, v_all = k, v
        else:
            k_past, v_past = cache.past[self.layer_idx]
            k_all, v_all = self.kv_cache.update(k_past, v_past, k, v, cache.cache_position)
        cache.present[self.layer_idx] = (k_all, v_all)

        # query i (at cache_position[i]) may see key j iff j <= cache_position[i]; this is
        # causal for prefill and hides unfilled slots of a static cache. A sliding layer also
        # hides keys at or before cache_position[i] - window (transformers' sliding_window_overlay)
        key_pos = torch.arange(k_all.shape[2], device=q.device)
        mask = key_pos[None, :] <= cache.cache_position[:, None]  # [S_q, S_kv]
        if self.window:
            mask = mask & (key_pos[None, :] > cache.cache_position[:, None] - self.window)
        out = self.attention(q, k_all, v_all, mask, self.scale, self.softcap)  # [B, H, S, D]
        out = out.transpose(1, 2).reshape(b, s, self.heads * self.head_dim)  # [B, S, H*D]
        return self._sub(self.adapter.o_proj)(out), None

    def _fused(self, q, k, v, cache: StepState):
        """The cache update and attention as phasesweep::cached_attention: [B, S, H * D] through o_proj."""
        past = cache.past[self.layer_idx] if cache.past is not None else (None, None)
        kind = self.kv_cache.name if cache.past is not None else "none"
        args = (cache.cache_position, kind, self.scale, self.softcap or 0.0, self.window)
        out, k_all, v_all = cached_attention(q, k, v, *past, *args)
        cache.present[self.layer_idx] = (k_all, v_all)
        return self._sub(self.adapter.o_proj)(out), None


def check_adapter(original: nn.Module, adapter: AttentionAdapter, family: str, layer_idx: int) -> None:
    """Every parameter of the attention must live in a submodule the adapter names."""
    kept = adapter.submodules()
    children = dict(original.named_children())
    missing = [n for n in kept if n not in children]
    if missing:
        raise ValueError(
            f"model.family={family!r}, layer {layer_idx}: the adapter names {', '.join(missing)}, "
            f"which {type(original).__name__} does not have"
        )
    unexpected = [n for n, _ in original.named_parameters() if n.split(".", 1)[0] not in kept]
    if unexpected:
        raise ValueError(
            f"model.family={family!r}, layer {layer_idx}: {type(original).__name__} has parameters "
            f"{', '.join(unexpected)} outside the adapter's submodules ({', '.join(kept)}); "
            "name them in tasks/model/families.py and apply them in PhaseAttention"
        )


def swap_attention(model: nn.Module, family: str, kv_cache: str, attention: str) -> nn.Module:
    """Replace every layer's self_attn by PhaseAttention, in place, after checking that the
    family's adapter names every parameter the original attention holds. Each layer's window,
    RoPE and rotary come from the config here, once (tasks.model.families.layer_plans)."""
    fam = families.get_family(family)
    rotary = getattr(importlib.import_module(fam.rotary_module), fam.rotary_function)
    config = model.config.to_dict()
    families.check_architecture(config)
    families.check_attention(family, config, attention, kv_cache)
    dims = families.model_dims(family, config)
    plans = families.layer_plans(family, config)
    softcap = families.graph_scalings(family, config)["attention_softcap"]
    for idx, layer in enumerate(model.model.layers):
        original = layer.self_attn
        if isinstance(original, PhaseAttention):
            original = original.original
        check_adapter(original, fam.attention, family, idx)
        layer.self_attn = PhaseAttention(
            original, fam.attention, rotary, dims, idx, make_kv_cache(kv_cache), make_attention(attention),
            plans[idx], softcap,
        )  # fmt: skip
    return model


class _PhaseGraph(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.lm = model
        self.layers = model.config.num_hidden_layers
        config = model.config.to_dict()
        family = families.family_of(model.config.model_type)
        self.scalings = families.graph_scalings(family, config)  # floats or None, fixed at build time
        self.rotary_types = [p.rotary for p in families.layer_plans(family, config)]

    def _step(self, input_ids, cache_position, past, start=None) -> tuple[torch.Tensor, ...]:
        inner = self.lm.model
        h = inner.embed_tokens(input_ids)  # [B, S, hidden] (Gemma 3's module scales it itself)
        if self.scalings["embedding_multiplier"] is not None:  # Granite
            h = h * self.scalings["embedding_multiplier"]
        position_ids = cache_position.unsqueeze(0).expand(input_ids.shape[0], -1)  # [B, S]
        if self.rotary_types[0] is None:  # one rotary for every layer
            pos_emb = [inner.rotary_emb(h, position_ids=position_ids)] * self.layers
        else:  # a rotary per layer type (Gemma 3: local and global bases), each computed once
            by_type = {t: inner.rotary_emb(h, position_ids, t) for t in dict.fromkeys(self.rotary_types)}
            pos_emb = [by_type[t] for t in self.rotary_types]
        state = StepState(cache_position, past, self.layers, start)
        for layer, emb in zip(inner.layers[: self.layers], pos_emb, strict=True):
            h = layer(h, position_embeddings=emb, position_ids=position_ids, cache=state)
        h = inner.norm(h[:, -1:])  # [B, 1, hidden]: only the last position's logits are used
        logits = self.lm.lm_head(h)  # [B, 1, V]
        if self.scalings["logits_divisor"] is not None:  # Granite's logits_scaling
            logits = logits / self.scalings["logits_divisor"]
        if (cap := self.scalings["final_softcap"]) is not None:  # Gemma 3's final_logit_softcapping
            logits = torch.tanh(logits / cap) * cap
        return (logits, *[t for kv in state.present if kv is not None for t in kv])


class PrefillGraph(_PhaseGraph):
    """Whole prompt, empty cache."""

    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        cache_position = torch.arange(input_ids.shape[1], device=input_ids.device)  # [P]
        return self._step(input_ids, cache_position, None)


class DecodeGraph(_PhaseGraph):
    """One new token per sequence against a filled cache."""

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor, *past_kv: torch.Tensor):
        past = list(zip(past_kv[0::2], past_kv[1::2], strict=True))
        return self._step(input_ids, cache_position, past)


class InGraphCacheGraph(_PhaseGraph):
    """The cache inside the graph (model.kv_cache=update_cache): `capacity` slots per layer,
    filled and read in place. input_ids [B, S], cache_position [S] (S dynamic: the same graph
    fills a context and decodes) -> logits [B, 1, V]. A call at cache_position rewrites those
    slots and attends to nothing past them, so repeating a call is idempotent."""

    def __init__(self, model: nn.Module, batch: int, capacity: int):
        super().__init__(model)
        self.capacity = capacity
        dims = families.model_dims(families.family_of(model.config.model_type), model.config.to_dict())
        dtype = next(model.parameters()).dtype
        for layer in model.model.layers:
            layer.self_attn.kv_cache.allocate(batch, capacity, dims["kv_heads"], dims["head_dim"], dtype)

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> tuple[torch.Tensor, ...]:
        start = cache_position[0].item()
        torch._check(start >= 0)  # bounds of export's unbacked start position
        torch._check(start + input_ids.shape[1] <= self.capacity)
        return self._step(input_ids, cache_position, None, start)

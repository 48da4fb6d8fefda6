"""The prefill and decode graphs: a transformers model with its attention swapped out.

Each decoder layer's `self_attn` is replaced (module swap) by PhaseAttention, which keeps
the layer's own projections and rotary embedding but hands the KV-cache update to a
tasks/kv_cache.py module and the attention itself to a tasks/sdpa.py module. The rest
of the layer (norms, MLP, residuals) runs as transformers wrote it, so any family whose
layers follow the Llama layout works unchanged.

The cache is functional: tensors in, tensors out, threaded through one forward by a
StepState. Graph signatures (all caches [B, H_kv, S, D]):

  prefill: input_ids [B, P]
           -> logits [B, 1, V] (last position), present.{i}.key/value [B, H_kv, P, D]
  decode:  input_ids [B, 1], cache_position [1], past_key_values.{i}.key/value [B, H_kv, S, D]
           -> logits [B, 1, V], present.{i}.key/value (static: [B, H_kv, S, D], dynamic: S + 1)
"""

from __future__ import annotations

import sys

import torch
from torch import nn

from tasks.kv_cache import make_kv_cache
from tasks.sdpa import make_attention


class StepState:
    """One forward's cache: the past of every layer in, the present of every layer out."""

    def __init__(self, cache_position: torch.Tensor, past: list[tuple[torch.Tensor, torch.Tensor]] | None, layers: int):
        self.cache_position = cache_position  # [S_new] int64
        self.past = past  # None: empty cache (prefill)
        self.present: list[tuple[torch.Tensor, torch.Tensor]] = [None] * layers  # type: ignore[list-item]


class PhaseAttention(nn.Module):
    """Drop-in for a transformers attention module: projections and RoPE from the original."""

    def __init__(self, original: nn.Module, layer_idx: int, kv_cache: nn.Module, attention: nn.Module):
        super().__init__()
        self.original = original  # keeps q/k/v/o (or fused qkv) projections and their weights
        self.layer_idx = layer_idx
        self.kv_cache = kv_cache
        self.attention = attention
        self.head_dim = original.head_dim
        self.scale = original.scaling
        cfg = original.config
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        # the family's own rotary function (handles partial rotary dims, e.g. Phi-3)
        self.apply_rope = sys.modules[type(original).__module__].apply_rotary_pos_emb

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        o = self.original
        if hasattr(o, "qkv_proj"):  # fused projection (Phi-3): [q | k | v]
            qkv = o.qkv_proj(x)
            q_size, kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
            return qkv[..., :q_size], qkv[..., q_size : q_size + kv_size], qkv[..., q_size + kv_size :]
        return o.q_proj(x), o.k_proj(x), o.v_proj(x)

    def forward(self, hidden_states, position_embeddings=None, cache: StepState | None = None, **_):
        b, s, _h = hidden_states.shape
        q, k, v = self._project(hidden_states)  # [B, S, H*D], [B, S, H_kv*D] x2
        q = q.view(b, s, -1, self.head_dim).transpose(1, 2)  # [B, H, S, D]
        k = k.view(b, s, -1, self.head_dim).transpose(1, 2)  # [B, H_kv, S, D]
        v = v.view(b, s, -1, self.head_dim).transpose(1, 2)  # [B, H_kv, S, D]
        cos, sin = position_embeddings
        q, k = self.apply_rope(q, k, cos, sin)

        if cache.past is None:  # prefill: the cache starts empty, keys are the prompt's own
            k_all, v_all = k, v
        else:
            k_past, v_past = cache.past[self.layer_idx]
            k_all, v_all = self.kv_cache.update(k_past, v_past, k, v, cache.cache_position)
        cache.present[self.layer_idx] = (k_all, v_all)

        # query i (at cache_position[i]) may see key j iff j <= cache_position[i]; this is
        # causal for prefill and hides unfilled slots of a static cache
        key_pos = torch.arange(k_all.shape[2], device=q.device)
        mask = key_pos[None, :] <= cache.cache_position[:, None]  # [S_q, S_kv]
        out = self.attention(q, k_all, v_all, mask, self.scale)  # [B, H, S, D]
        out = out.transpose(1, 2).reshape(b, s, self.heads * self.head_dim)
        return self.original.o_proj(out), None


def swap_attention(model: nn.Module, kv_cache: str, attention: str) -> nn.Module:
    """Replace every layer's self_attn by PhaseAttention, in place."""
    for idx, layer in enumerate(model.model.layers):
        original = layer.self_attn
        if isinstance(original, PhaseAttention):
            original = original.original
        layer.self_attn = PhaseAttention(original, idx, make_kv_cache(kv_cache), make_attention(attention))
    return model


class _PhaseGraph(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.lm = model
        self.layers = model.config.num_hidden_layers

    def _step(self, input_ids, cache_position, past) -> tuple[torch.Tensor, ...]:
        inner = self.lm.model
        h = inner.embed_tokens(input_ids)  # [B, S, hidden]
        position_ids = cache_position.unsqueeze(0).expand(input_ids.shape[0], -1)  # [B, S]
        pos_emb = inner.rotary_emb(h, position_ids=position_ids)
        state = StepState(cache_position, past, self.layers)
        for layer in inner.layers[: self.layers]:
            h = layer(h, position_embeddings=pos_emb, position_ids=position_ids, cache=state)
        h = inner.norm(h[:, -1:])  # [B, 1, hidden]: only the last position's logits are used
        logits = self.lm.lm_head(h)  # [B, 1, V]
        return (logits, *[t for kv in state.present for t in kv])


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


def build_graph(model: nn.Module, phase: str, kv_cache: str, attention: str) -> nn.Module:
    swap_attention(model, kv_cache, attention)
    graph = PrefillGraph(model) if phase == "prefill" else DecodeGraph(model)
    graph.kv_cache = kv_cache  # exporters read it: a dynamic cache has a dynamic sequence dim
    return graph.eval()


def io_names(phase: str, layers: int) -> tuple[list[str], list[str]]:
    """Input and output names of a phase's graph, in call order."""
    present = [f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    if phase == "prefill":
        return ["input_ids"], ["logits", *present]
    past = [f"past_key_values.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    return ["input_ids", "cache_position", *past], ["logits", *present]

"""Attention with its cache update as one op, for an ONNX export that fuses them.

`phasesweep::cached_attention` is the work PhaseAttention does after RoPE, as a single torch
custom op (torch.library): write the step's keys and values into the cache (static: at
cache_position in the fixed buffer; dynamic: appended; none: a prompt's own keys), then
attend from cache_position on, causally. Its eager kernel is the same KV-cache and attention
modules the swapped graph uses, so any backend that runs it agrees with the unfused graph; it
exists so that tasks/export/_ort_attention.py can translate it into ONNX Runtime's
com.microsoft.GroupQueryAttention, which updates a static buffer in place (past and present
bound to one buffer) and reads only the filled slots.

PhaseAttention calls it only while `fused_attention(graph)` holds (the torch exporter's ONNX
export, backend.export_options.fuse_attention): every other export traces the unfused graph.
"""

import contextlib
from collections.abc import Iterator
from typing import Optional

import torch

from tasks.model.kv_cache import make_kv_cache
from tasks.model.sdpa import make_attention

# model.kv_cache values the op covers ("none": a prompt, no past)
CACHES = ("static", "dynamic", "none")


@torch.library.custom_op("phasesweep::cached_attention", mutates_args=())
def cached_attention(
    q: torch.Tensor,  # [B, H, S, D], RoPE applied
    k: torch.Tensor,  # [B, H_kv, S, D]
    v: torch.Tensor,
    k_past: Optional[torch.Tensor],  # noqa: UP045 - [B, H_kv, S_past, D]; None: a prompt (torch.library reads Optional)
    v_past: Optional[torch.Tensor],  # noqa: UP045
    cache_position: torch.Tensor,  # [S] int64, contiguous: the new tokens' positions
    cache: str,  # static | dynamic | none
    scale: float,
    softcap: float,  # 0: none
    window: int,  # 0: full causal; else a query at p sees keys p - window + 1 .. p
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out [B, S, H * D], present key, present value)."""
    b, h, s, d = q.shape
    if cache == "none":
        k_all, v_all = k.clone(), v.clone()
    else:
        k_all, v_all = make_kv_cache(cache).update(k_past, v_past, k, v, cache_position)
    key_pos = torch.arange(k_all.shape[2], device=q.device)
    mask = key_pos[None, :] <= cache_position[:, None]  # [S, S_kv]: causal, unfilled slots hidden
    if window:
        mask = mask & (key_pos[None, :] > cache_position[:, None] - window)
    attention = make_attention("math" if softcap else "sdpa")
    out = attention(q, k_all, v_all, mask, scale, softcap or None)  # [B, H, S, D]
    return out.transpose(1, 2).reshape(b, s, h * d), k_all, v_all


@cached_attention.register_fake
def _(q, k, v, k_past, v_past, cache_position, cache, scale, softcap, window):
    b, h, s, d = q.shape
    if cache == "static":
        k_all, v_all = torch.empty_like(k_past), torch.empty_like(v_past)
    elif cache == "dynamic":
        k_all, v_all = torch.cat([k_past, k], dim=2), torch.cat([v_past, v], dim=2)
    else:
        k_all, v_all = torch.empty_like(k), torch.empty_like(v)
    return q.new_empty(b, s, h * d), k_all, v_all


def unfusable(graph: torch.nn.Module) -> str | None:
    """Why the graph's attention cannot become cached_attention, or None: another cache or
    attention (the in-graph cache, ExecuTorch's custom ops)."""
    if not hasattr(graph, "lm"):
        return f"{type(graph).__name__} is not a phase graph"
    for idx, layer in enumerate(graph.lm.model.layers):
        attn = layer.self_attn
        if not hasattr(attn, "fused"):
            return f"layer {idx}: {type(attn).__name__} is not phasesweep's swapped attention"
        if attn.kv_cache.name not in CACHES:
            return f"layer {idx}: model.kv_cache={attn.kv_cache.name} is not fused"
        if attn.attention.name not in ("sdpa", "math"):
            return f"layer {idx}: model.attention={attn.attention.name} is not fused"
    return None


@contextlib.contextmanager
def fused_attention(graph: torch.nn.Module) -> Iterator[int]:
    """Every layer's attention and cache update as cached_attention while it holds; yields
    the layers fused."""
    layers = [layer.self_attn for layer in graph.lm.model.layers]
    for attn in layers:
        attn.fused = True
    try:
        yield len(layers)
    finally:
        for attn in layers:
            attn.fused = False

"""Attention, swappable by config.

sdpa and math take q [B, H, S_q, D], k, v [B, H_kv, S_kv, D] and a boolean mask [S_q, S_kv]
(True = may attend), and handle grouped-query attention (H a multiple of H_kv) by folding
the query heads of each key/value head into its rows: the cache is read once per kv head,
never copied per query head (an exported graph would otherwise copy it on every call). Soft-capping of the scores (cap * tanh(scores / cap), Gemma's
attn_logit_softcapping) needs the scores written out: math applies it, sdpa and custom_sdpa
refuse it (tasks.model.families.check_attention says so at plan time).

custom_sdpa is ExecuTorch's llama::custom_sdpa on q [B, S_q, H, D] and the in-graph cache
[B, S_max, H_kv, D] (model.kv_cache=update_cache): it handles GQA and the causal mask from
the start position itself, and reads only the first start + S_q slots.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def fold_groups(q: torch.Tensor, mask: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, H_kv * groups, S_q, D] -> [B, H_kv, groups * S_q, D] and the mask tiled to match:
    query head h reads kv head h // groups, as transformers' repeat_kv pairs them."""
    if groups == 1:
        return q, mask
    b, h, s, d = q.shape
    return q.reshape(b, h // groups, groups * s, d), mask.repeat(groups, 1)


def unfold_groups(out: torch.Tensor, groups: int) -> torch.Tensor:
    """[B, H_kv, groups * S_q, D] -> [B, H_kv * groups, S_q, D]: fold_groups undone."""
    if groups == 1:
        return out
    b, h, gs, d = out.shape
    # a copy in row-major order first: a fused kernel's output may be strided, and the
    # exported program's view of it is checked again when decomposed (contiguous() is traced away)
    return out.clone(memory_format=torch.contiguous_format).reshape(b, h * groups, gs // groups, d)


class SDPA(nn.Module):
    """torch.nn.functional.scaled_dot_product_attention (fused kernels where available)."""

    name = "sdpa"

    def forward(self, q, k, v, mask: torch.Tensor, scale: float, softcap: float | None = None) -> torch.Tensor:
        if softcap is not None:
            raise ValueError(f"model.attention='sdpa' cannot soft-cap attention scores (cap {softcap}); choose math")
        groups = q.shape[1] // k.shape[1]
        q, mask = fold_groups(q, mask, groups)  # [B, H_kv, G * S_q, D]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        return unfold_groups(out, groups)  # [B, H, S_q, D]


class MathAttention(nn.Module):
    """softmax(q k^T * scale + mask) v, written out; softmax in float32."""

    name = "math"

    def forward(self, q, k, v, mask: torch.Tensor, scale: float, softcap: float | None = None) -> torch.Tensor:
        groups = q.shape[1] // k.shape[1]
        q, mask = fold_groups(q, mask, groups)  # [B, H_kv, G * S_q, D]
        scores = torch.matmul(q, k.transpose(2, 3)) * scale  # [B, H_kv, G * S_q, S_kv]
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        return unfold_groups(torch.matmul(probs, v), groups)  # [B, H, S_q, D]


def load_llama_ops() -> None:
    """Register llama::update_cache and llama::custom_sdpa with torch (their CPU kernels and
    export meta functions) and with the ExecuTorch runtime that loads a program using them."""
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401 - lazy: executorch, only when the ops are used


class CustomSDPA(nn.Module):
    """llama::custom_sdpa: causal from start_pos, GQA inside the kernel; [B, S_q, H, D] out."""

    name = "custom_sdpa"

    def __init__(self):
        super().__init__()
        load_llama_ops()

    def forward(self, q, k_cache, v_cache, start: int, scale: float) -> torch.Tensor:
        return torch.ops.llama.custom_sdpa(q, k_cache, v_cache, start, None, 0.0, True, scale)


ATTENTIONS: dict[str, type[nn.Module]] = {a.name: a for a in (SDPA, MathAttention, CustomSDPA)}


def make_attention(name: str) -> nn.Module:
    if name not in ATTENTIONS:
        raise ValueError(f"model.attention={name!r} is unknown; choose one of {', '.join(ATTENTIONS)}")
    return ATTENTIONS[name]()

"""Attention over q [B, H, S_q, D] and k, v [B, H_kv, S_kv, D], swappable by config.

Both implementations take a boolean mask [S_q, S_kv] (True = may attend) and handle
grouped-query attention (H a multiple of H_kv) by repeating key/value heads. Soft-capping
of the scores (cap * tanh(scores / cap), Gemma's attn_logit_softcapping) needs the scores
written out: math applies it, sdpa refuses it (tasks.model.families.check_attention says so
at plan time).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """[B, H_kv, S, D] -> [B, H_kv * groups, S, D], each kv head serving `groups` q heads."""
    if groups == 1:
        return x
    b, h, s, d = x.shape
    return x[:, :, None].expand(b, h, groups, s, d).reshape(b, h * groups, s, d)


class SDPA(nn.Module):
    """torch.nn.functional.scaled_dot_product_attention (fused kernels where available)."""

    name = "sdpa"

    def forward(self, q, k, v, mask: torch.Tensor, scale: float, softcap: float | None = None) -> torch.Tensor:
        if softcap is not None:
            raise ValueError(f"model.attention='sdpa' cannot soft-cap attention scores (cap {softcap}); choose math")
        groups = q.shape[1] // k.shape[1]
        k, v = repeat_kv(k, groups), repeat_kv(v, groups)  # [B, H, S_kv, D]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)  # [B, H, S_q, D]


class MathAttention(nn.Module):
    """softmax(q k^T * scale + mask) v, written out; softmax in float32."""

    name = "math"

    def forward(self, q, k, v, mask: torch.Tensor, scale: float, softcap: float | None = None) -> torch.Tensor:
        groups = q.shape[1] // k.shape[1]
        k, v = repeat_kv(k, groups), repeat_kv(v, groups)
        scores = torch.matmul(q, k.transpose(2, 3)) * scale  # [B, H, S_q, S_kv]
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        return torch.matmul(probs, v)  # [B, H, S_q, D]


ATTENTIONS: dict[str, type[nn.Module]] = {a.name: a for a in (SDPA, MathAttention)}


def make_attention(name: str) -> nn.Module:
    if name not in ATTENTIONS:
        raise ValueError(f"model.attention={name!r} is unknown; choose one of {', '.join(ATTENTIONS)}")
    return ATTENTIONS[name]()

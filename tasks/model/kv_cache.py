"""Export-friendly KV caches.

static and dynamic are stateless, laid out [batch, kv_heads, seq, head_dim]: the cache
tensors are graph inputs and outputs, so the same graph exports to ONNX (no mutable state)
and ExecuTorch alike, and a runtime feeds each step's output cache back as the next
step's input.

update_cache keeps the cache inside the graph, as buffers [batch, seq, kv_heads, head_dim]
written in place by ExecuTorch's llama::update_cache (ExecuTorch's own LLM export does the
same): the program owns it as mutable buffers, and the graph takes and returns no cache.
"""

from __future__ import annotations

import torch
from torch import nn

from tasks.model.sdpa import load_llama_ops


class StaticKVCache(nn.Module):
    """Fixed capacity: buffers [B, H_kv, S_max, D]; a step writes its keys at cache_position.

    Slots past the current position hold zeros (or stale values) and are masked out by
    the attention mask built from key positions, so the graph's shapes never change.
    """

    name = "static"

    def update(
        self,
        k_cache: torch.Tensor,  # [B, H_kv, S_max, D]
        v_cache: torch.Tensor,  # [B, H_kv, S_max, D]
        k_new: torch.Tensor,  # [B, H_kv, S_new, D]
        v_new: torch.Tensor,  # [B, H_kv, S_new, D]
        cache_position: torch.Tensor,  # [S_new] int64, positions of the new tokens
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return k_cache.index_copy(2, cache_position, k_new), v_cache.index_copy(2, cache_position, v_new)

    @staticmethod
    def from_prefix(prefix: torch.Tensor, cache_len: int) -> torch.Tensor:
        """Lay out a filled prefix [B, H_kv, C, D] as a fixed buffer [B, H_kv, S_max, D]."""
        b, h, c, d = prefix.shape
        if c > cache_len:
            raise ValueError(f"context of {c} positions does not fit a cache of {cache_len}")
        buf = prefix.new_zeros(b, h, cache_len, d)
        buf[:, :, :c] = prefix
        return buf


class DynamicKVCache(nn.Module):
    """Growing cache: [B, H_kv, S_past, D] in, [B, H_kv, S_past + S_new, D] out."""

    name = "dynamic"

    def update(
        self,
        k_cache: torch.Tensor,  # [B, H_kv, S_past, D]
        v_cache: torch.Tensor,
        k_new: torch.Tensor,  # [B, H_kv, S_new, D]
        v_new: torch.Tensor,
        cache_position: torch.Tensor,  # [S_new]; the new keys land at S_past..S_past+S_new-1
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.cat([k_cache, k_new], dim=2), torch.cat([v_cache, v_new], dim=2)

    @staticmethod
    def from_prefix(prefix: torch.Tensor, cache_len: int) -> torch.Tensor:
        return prefix


class UpdateCacheKVCache(nn.Module):
    """In the graph: buffers k_cache, v_cache [B, S_max, H_kv, D], sized by allocate()."""

    name = "update_cache"
    in_graph = True

    def __init__(self):
        super().__init__()
        load_llama_ops()

    def allocate(self, batch: int, capacity: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> None:
        for name in ("k_cache", "v_cache"):  # persistent, as ExecuTorch's export_llama keeps them
            self.register_buffer(name, torch.zeros(batch, capacity, kv_heads, head_dim, dtype=dtype))

    def update(self, k_new: torch.Tensor, v_new: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """k_new, v_new [B, S_new, H_kv, D] written at start..start+S_new-1, in place; the caches."""
        torch.ops.llama.update_cache(k_new, self.k_cache, start)
        torch.ops.llama.update_cache(v_new, self.v_cache, start)
        return self.k_cache, self.v_cache


KV_CACHES: dict[str, type[nn.Module]] = {c.name: c for c in (StaticKVCache, DynamicKVCache, UpdateCacheKVCache)}


def make_kv_cache(name: str) -> nn.Module:
    if name not in KV_CACHES:
        raise ValueError(f"model.kv_cache={name!r} is unknown; choose one of {', '.join(KV_CACHES)}")
    return KV_CACHES[name]()
